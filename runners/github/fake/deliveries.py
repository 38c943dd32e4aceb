"""The fake GitHub's signed `workflow_job` deliveries, their delivery modes, and the record
of every attempt GitHub keeps for the App's webhook (`GET /app/hook/deliveries`).

Every attempt is recorded twice: in the control record (`FakeGitHub.deliveries`, with
`status_code` None when nothing answered) and as GitHub's own delivery item, with the
`status` text and `status_code` GitHub shows: "OK" for a 2xx, "Invalid HTTP Response: N"
for any other answer, and status_code 0 when nothing answered, "timed out" after GitHub's
10 s (a dropped delivery is one that never arrived, which GitHub sees as a timeout) or
"failed to connect to host". GitHub documents only that "OK" means success; the other
texts are what its delivery log shows and are not to be matched on.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import http.client
import json
import threading
import time
import urllib.parse
import uuid
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.app_api import repo_json, sender
from runners.github.fake.core import DELIVERY_TIMEOUT
from runners.github.fake.runs_api import job_json
from runners.github.fake.state import FakeState, Job, Outgoing


def send_event(state: FakeState, event: str, payload: dict[str, Any]) -> str:
    """Send any signed delivery through the outbox; its delivery id (FakeGitHub.send_event)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    delivery_id = str(uuid.uuid4())
    action = str(payload.get("action") or "")
    with state.lock:
        item = Outgoing(0.0, 0, delivery_id, 0, action, state.webhook_url or "", body,
                        signed_headers(state, delivery_id, body, event))  # fmt: skip
        if state.webhook_url is None or _draw(state, state.delivery_mode["drop"]):
            record(state, item, None, "dropped", started=state.clock(), timed_out=True)
            return delivery_id
        with state.outbox_cv:
            item.due = time.monotonic() + state.delivery_mode["delay"]
            item.seq = next(state.outbox_seq)
            heapq.heappush(state.outbox, item)
            state.outbox_cv.notify_all()
    return delivery_id


def emit(state: FakeState, job: Job, action: str) -> None:
    """Build one `workflow_job` delivery now and route it through the delivery modes."""
    inst = state.installations.get(job.installation_id)
    if inst is None:
        return  # uninstalled: GitHub sends the App nothing more for it
    payload: dict[str, Any] = {
        "action": action,
        "workflow_job": job_json(state, job),
        "repository": repo_json(state, state.repos[job.repo.lower()]),
    }
    if inst.account_type == "Organization":
        payload["organization"] = shapes.organization_simple(
            state.url, state.url, inst.account, inst.account_id
        )
    payload["sender"] = sender(state)
    payload["installation"] = {
        "id": inst.id,
        "node_id": shapes.node_id("Installation", inst.id),
    }
    body = json.dumps(payload, separators=(",", ":")).encode()
    delivery_id = str(uuid.uuid4())
    headers = signed_headers(state, delivery_id, body)
    mode = state.delivery_mode
    # Drawn first, so that whether a job is reordered does not hang on its drops.
    reordered = state.webhook_url is not None and _reorders(state, job.id, mode["reorder"])
    if state.webhook_url is None or _draw(state, mode["drop"]):
        lost = Outgoing(0.0, 0, delivery_id, job.id, action, state.webhook_url or "", body, headers)
        if state.webhook_url is not None:
            state.faults["dropped"] += 1
        record(state, lost, None, "dropped", started=state.clock(), timed_out=True)
        return
    copies = [Outgoing(0.0, 0, delivery_id, job.id, action, state.webhook_url, body, headers)]
    if _draw(state, mode["duplicate"]):
        state.faults["duplicated"] += 1
        again_id = str(uuid.uuid4()) if mode["new_ids"] else delivery_id
        again = {**headers, "X-GitHub-Delivery": again_id}
        copies.append(Outgoing(0.0, 0, again_id, job.id, action, state.webhook_url, body, again))
    if action == "queued" and job.status == "queued" and mode["early_progress"]:
        # Its in_progress (or, for a job cancelled while queued, its completed) lets it go.
        for item in copies:
            item.lag = mode["queued_lag"]
        state.late.setdefault(job.id, []).extend(copies)
        return
    if action != "queued" and job.id in state.late:
        # Held by early_progress even if the mode was switched off since.
        copies += state.late.pop(job.id)
    if reordered or job.id in state.held:
        state.reordered_jobs.add(job.id)
        held = state.held.setdefault(job.id, [])
        held.extend(copies)
        if action != "completed":
            return
        # Release the job's deliveries newest first, so `completed` arrives before the rest.
        copies = list(reversed(state.held.pop(job.id)))
        for item in copies:
            item.lag = 0.0
    due = time.monotonic() + mode["delay"]
    with state.outbox_cv:
        for item in copies:
            item.due, item.seq = due + item.lag, next(state.outbox_seq)
            heapq.heappush(state.outbox, item)
        state.outbox_cv.notify_all()


def _draw(state: FakeState, share: bool | float) -> bool:
    """Whether a mode set to `share` applies to this delivery (lock held). A switch, and
    the shares 0 and 1, draw nothing, so they never move a seeded pattern."""
    if share is True or share >= 1.0:
        return True
    if not share:
        return False
    return state.delivery_rng.random() < share


def _reorders(state: FakeState, job_id: int, share: bool | float) -> bool:
    """Whether this job's deliveries are held and sent newest first (lock held): every
    job's under the switch, and under a share a draw made once, at its first delivery."""
    if share is True or share >= 1.0 or not share:
        return bool(share)
    if job_id not in state.reorder_choice:
        state.reorder_choice[job_id] = state.delivery_rng.random() < share
    return state.reorder_choice[job_id]


def signed_headers(
    state: FakeState, delivery_id: str, body: bytes, event: str = "workflow_job"
) -> dict[str, str]:
    """The headers of a delivery, signed with the webhook secret as it is now."""
    headers = {
        "Accept": "*/*",
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/9f2c1d7",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery_id,
        "X-GitHub-Hook-ID": str(state.hook_id),
        "X-GitHub-Hook-Installation-Target-ID": str(state.app_id),
        "X-GitHub-Hook-Installation-Target-Type": "integration",
    }
    if state.webhook_secret:
        key = state.webhook_secret.encode()
        headers["X-Hub-Signature"] = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
        headers["X-Hub-Signature-256"] = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
    return headers


def record(
    state: FakeState,
    item: Outgoing,
    status: int | None,
    error: str | None,
    *,
    started: float,
    duration: float = DELIVERY_TIMEOUT,
    timed_out: bool = False,
    answer: tuple[dict[str, str], str] | None = None,
) -> None:
    """Record one attempt: the control record, and GitHub's delivery item for it.

    `started` is the fake's clock when the attempt began, `duration` the real seconds
    it took (a dropped one: GitHub's whole timeout); `answer` the receiver's response
    headers and body, when it answered at all.
    """
    if status is not None and 200 <= status < 300:
        text = "OK"
    elif status is not None:
        text = f"Invalid HTTP Response: {status}"
    else:
        text = "timed out" if timed_out else "failed to connect to host"
    payload = json.loads(item.body)
    with state.lock:
        hook_id = next(state.ids["hook_delivery"])
        state.hook_deliveries.append(
            {
                "id": hook_id,
                "guid": item.delivery_id,
                "delivered_at": started,
                "redelivery": item.redelivery,
                "duration": round(duration, 3),
                "status": text,
                "status_code": status or 0,
                "event": item.headers.get("X-GitHub-Event", "workflow_job"),
                "action": payload.get("action"),
                "installation_id": (payload.get("installation") or {}).get("id"),
                "repository_id": (payload.get("repository") or {}).get("id"),
                "url": item.url,
                "job_id": item.job_id or None,
                "body": item.body,
                "request_headers": dict(item.headers),
                "answer": answer,
            }
        )
        state.deliveries.append(
            {
                "id": item.delivery_id,
                "event": item.headers.get("X-GitHub-Event", "workflow_job"),
                "action": item.action,
                "job_id": item.job_id or None,
                "status_code": status,
                "error": error,
                "hook_delivery_id": hook_id,
                "redelivery": item.redelivery,
            }
        )
        state.changed.notify_all()
    state.observer.delivery_recorded(item, status)


def redeliver(state: FakeState, hook: dict[str, Any]) -> None:
    """Send a recorded delivery again, under its guid, as a new attempt (lock held).

    A redelivery goes to the hook's URL as it is now, signed with the secret as it is
    now; the drop mode (at its share) and the delay apply to it, the per-job modes
    (duplicate, reorder, early_progress) do not: GitHub sends a redelivery on its own.
    """
    guid, body = hook["guid"], hook["body"]
    item = Outgoing(
        0.0,
        0,
        guid,
        hook["job_id"],
        str(hook["action"]),
        state.webhook_url or "",
        body,
        signed_headers(state, guid, body, str(hook.get("event") or "workflow_job")),
        redelivery=True,
    )
    mode = state.delivery_mode
    if state.webhook_url is None or _draw(state, mode["drop"]):
        if state.webhook_url is not None:
            state.faults["redeliveries_dropped"] += 1
        record(state, item, None, "dropped", started=state.clock(), timed_out=True)
        return
    with state.outbox_cv:
        item.due, item.seq = time.monotonic() + mode["delay"], next(state.outbox_seq)
        heapq.heappush(state.outbox, item)
        state.outbox_cv.notify_all()


def send_loop(state: FakeState) -> None:
    """The sender thread: POST each due delivery, once, never from a request handler.

    At the default concurrency of 1 it sends them one after another, in order; above 1
    each goes on a thread of its own, that many in flight at once, as GitHub sends
    (so a receiver that is slow to answer holds up only its share of them).
    """
    while True:
        with state.outbox_cv:
            while not state.stopping:
                due = state.outbox and state.outbox[0].due <= time.monotonic()
                if due and state.sending < state.concurrency:
                    break
                wait = (
                    state.outbox[0].due - time.monotonic()
                    if state.outbox and not due
                    else None  # nothing due, or every slot taken: woken by a change
                )
                state.outbox_cv.wait(wait)
            if state.stopping:
                return
            item = heapq.heappop(state.outbox)
            state.sending += 1
            state.outbox_cv.notify_all()  # wait_sending reads the counters
            alone = state.concurrency == 1
        if alone:
            _send(state, item)
        else:
            threading.Thread(target=_send, args=(state, item), daemon=True).start()


def _send(state: FakeState, item: Outgoing) -> None:
    """POST one delivery, record the attempt and free its slot."""
    try:
        started, began = state.clock(), time.monotonic()
        status, error, answer = _post(item.url, item.body, item.headers)
        # GitHub records a failed delivery and does not retry it.
        record(
            state,
            item,
            status,
            error,
            started=started,
            duration=time.monotonic() - began,
            timed_out=error is not None and error.startswith(_TIMEOUT_NAMES),
            answer=answer,
        )
    finally:
        with state.outbox_cv:
            state.sending -= 1
            state.outbox_cv.notify_all()


# What a socket timeout is called when raised (`socket.timeout` is TimeoutError's alias).
_TIMEOUT_NAMES = ("TimeoutError", "timeout")


def _post(
    url: str, body: bytes, headers: dict[str, str]
) -> tuple[int | None, str | None, tuple[dict[str, str], str] | None]:
    """POST one delivery with GitHub's 10 s timeout: (status or None, error or None, and the
    response's headers and body when there was one)."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    conn = cls(parts.netloc, timeout=DELIVERY_TIMEOUT)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        return response.status, None, (dict(response.getheaders()), text)
    except (OSError, http.client.HTTPException) as exc:
        return None, f"{exc.__class__.__name__}: {exc}", None
    finally:
        conn.close()
