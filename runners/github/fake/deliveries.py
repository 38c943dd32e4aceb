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
from runners.github.fake.core import (
    DELIVERY_TIMEOUT,
    _Job,
    _Outgoing,
)


class DeliveriesMixin:
    """Build each delivery, route it through the modes, send it from one thread."""

    def _sender(self) -> dict[str, Any]:
        return shapes.simple_user(self.url, self.url, "monalisa", 7_000_002)

    def _emit(self, job: _Job, action: str) -> None:
        """Build one `workflow_job` delivery now and route it through the delivery modes."""
        inst = self._installations[job.installation_id]
        payload: dict[str, Any] = {
            "action": action,
            "workflow_job": self._job_json(job),
            "repository": self._repo_json(self._repos[job.repo.lower()]),
        }
        if inst.account_type == "Organization":
            payload["organization"] = shapes.organization_simple(
                self.url, self.url, inst.account, inst.account_id
            )
        payload["sender"] = self._sender()
        payload["installation"] = {
            "id": inst.id,
            "node_id": shapes.node_id("Installation", inst.id),
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        delivery_id = str(uuid.uuid4())
        headers = self._signed_headers(delivery_id, body)
        mode = self._delivery_mode
        # Drawn first, so that whether a job is reordered does not hang on its drops.
        reordered = self.webhook_url is not None and self._reorders(job.id, mode["reorder"])
        if self.webhook_url is None or self._draw(mode["drop"]):
            lost = _Outgoing(
                0.0, 0, delivery_id, job.id, action, self.webhook_url or "", body, headers
            )
            if self.webhook_url is not None:
                self._faults["dropped"] += 1
            self._record(lost, None, "dropped", started=self.clock(), timed_out=True)
            return
        copies = [_Outgoing(0.0, 0, delivery_id, job.id, action, self.webhook_url, body, headers)]
        if self._draw(mode["duplicate"]):
            self._faults["duplicated"] += 1
            again_id = str(uuid.uuid4()) if mode["new_ids"] else delivery_id
            again = {**headers, "X-GitHub-Delivery": again_id}
            copies.append(
                _Outgoing(0.0, 0, again_id, job.id, action, self.webhook_url, body, again)
            )
        if action == "queued" and job.status == "queued" and mode["early_progress"]:
            # Its in_progress (or, for a job cancelled while queued, its completed) lets it go.
            for item in copies:
                item.lag = mode["queued_lag"]
            self._late.setdefault(job.id, []).extend(copies)
            return
        if action != "queued" and job.id in self._late:
            # Held by early_progress even if the mode was switched off since.
            copies += self._late.pop(job.id)
        if reordered or job.id in self._held:
            self._reordered_jobs.add(job.id)
            held = self._held.setdefault(job.id, [])
            held.extend(copies)
            if action != "completed":
                return
            # Release the job's deliveries newest first, so `completed` arrives before the rest.
            copies = list(reversed(self._held.pop(job.id)))
            for item in copies:
                item.lag = 0.0
        due = time.monotonic() + mode["delay"]
        with self._outbox_cv:
            for item in copies:
                item.due, item.seq = due + item.lag, next(self._outbox_seq)
                heapq.heappush(self._outbox, item)
            self._outbox_cv.notify_all()

    def _draw(self, share: bool | float) -> bool:
        """Whether a mode set to `share` applies to this delivery (lock held). A switch, and
        the shares 0 and 1, draw nothing, so they never move a seeded pattern."""
        if share is True or share >= 1.0:
            return True
        if not share:
            return False
        return self._delivery_rng.random() < share

    def _reorders(self, job_id: int, share: bool | float) -> bool:
        """Whether this job's deliveries are held and sent newest first (lock held): every
        job's under the switch, and under a share a draw made once, at its first delivery."""
        if share is True or share >= 1.0 or not share:
            return bool(share)
        if job_id not in self._reorder_choice:
            self._reorder_choice[job_id] = self._delivery_rng.random() < share
        return self._reorder_choice[job_id]

    def _signed_headers(self, delivery_id: str, body: bytes) -> dict[str, str]:
        """The headers of a delivery, signed with the webhook secret as it is now."""
        headers = {
            "Accept": "*/*",
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/9f2c1d7",
            "X-GitHub-Event": "workflow_job",
            "X-GitHub-Delivery": delivery_id,
            "X-GitHub-Hook-ID": str(self.hook_id),
            "X-GitHub-Hook-Installation-Target-ID": str(self.app_id),
            "X-GitHub-Hook-Installation-Target-Type": "integration",
        }
        if self.webhook_secret:
            key = self.webhook_secret.encode()
            headers["X-Hub-Signature"] = "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest()
            headers["X-Hub-Signature-256"] = (
                "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
            )
        return headers

    def _record(
        self,
        item: _Outgoing,
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
        with self._lock:
            hook_id = next(self._ids["hook_delivery"])
            self._hook_deliveries.append(
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
                    "job_id": item.job_id,
                    "body": item.body,
                    "request_headers": dict(item.headers),
                    "answer": answer,
                }
            )
            self._deliveries.append(
                {
                    "id": item.delivery_id,
                    "event": "workflow_job",
                    "action": item.action,
                    "job_id": item.job_id,
                    "status_code": status,
                    "error": error,
                    "hook_delivery_id": hook_id,
                    "redelivery": item.redelivery,
                }
            )
            self._changed.notify_all()

    def _redeliver(self, hook: dict[str, Any]) -> None:
        """Send a recorded delivery again, under its guid, as a new attempt (lock held).

        A redelivery goes to the hook's URL as it is now, signed with the secret as it is
        now; the drop mode (at its share) and the delay apply to it, the per-job modes
        (duplicate, reorder, early_progress) do not: GitHub sends a redelivery on its own.
        """
        guid, body = hook["guid"], hook["body"]
        item = _Outgoing(
            0.0,
            0,
            guid,
            hook["job_id"],
            str(hook["action"]),
            self.webhook_url or "",
            body,
            self._signed_headers(guid, body),
            redelivery=True,
        )
        mode = self._delivery_mode
        if self.webhook_url is None or self._draw(mode["drop"]):
            if self.webhook_url is not None:
                self._faults["redeliveries_dropped"] += 1
            self._record(item, None, "dropped", started=self.clock(), timed_out=True)
            return
        with self._outbox_cv:
            item.due, item.seq = time.monotonic() + mode["delay"], next(self._outbox_seq)
            heapq.heappush(self._outbox, item)
            self._outbox_cv.notify_all()

    def _send_loop(self) -> None:
        """The sender thread: POST each due delivery, once, never from a request handler.

        At the default concurrency of 1 it sends them one after another, in order; above 1
        each goes on a thread of its own, that many in flight at once, as GitHub sends
        (so a receiver that is slow to answer holds up only its share of them).
        """
        while True:
            with self._outbox_cv:
                while not self._stopping:
                    due = self._outbox and self._outbox[0].due <= time.monotonic()
                    if due and self._sending < self._concurrency:
                        break
                    wait = (
                        self._outbox[0].due - time.monotonic()
                        if self._outbox and not due
                        else None  # nothing due, or every slot taken: woken by a change
                    )
                    self._outbox_cv.wait(wait)
                if self._stopping:
                    return
                item = heapq.heappop(self._outbox)
                self._sending += 1
                alone = self._concurrency == 1
            if alone:
                self._send(item)
            else:
                threading.Thread(target=self._send, args=(item,), daemon=True).start()

    def _send(self, item: _Outgoing) -> None:
        """POST one delivery, record the attempt and free its slot."""
        try:
            started, began = self.clock(), time.monotonic()
            status, error, answer = _post(item.url, item.body, item.headers)
            # GitHub records a failed delivery and does not retry it.
            self._record(
                item,
                status,
                error,
                started=started,
                duration=time.monotonic() - began,
                timed_out=error is not None and error.startswith(_TIMEOUT_NAMES),
                answer=answer,
            )
        finally:
            with self._outbox_cv:
                self._sending -= 1
                self._outbox_cv.notify_all()


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
