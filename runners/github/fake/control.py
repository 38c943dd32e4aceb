"""The fake GitHub's control surface: what FakeGitHub's Python methods do, and the `/_fake/`
routes that do the same over HTTP. Each function takes the lock itself."""

from __future__ import annotations

import random
import re
import secrets
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.app_api import installation_json, sender
from runners.github.fake.auth import APP_KEY, limit_from_now, quota
from runners.github.fake.core import (
    ALL_RUNNERS,
    CONCLUSIONS,
    HttpError,
    Request,
    Response,
    json_object,
)
from runners.github.fake.deliveries import emit, send_event
from runners.github.fake.hooks_api import hook_item
from runners.github.fake.runner_protocol import assign_job, finish
from runners.github.fake.runners_api import runner_json
from runners.github.fake.runs_api import job_json
from runners.github.fake.state import FakeState, Installation, Job, Repo, Run

# ---- installations -----------------------------------------------------------------------


def add_installation(
    state: FakeState, account: str, account_type: str, repositories: list[str] | tuple[str, ...]
) -> int:
    if account_type not in ("Organization", "User"):
        raise ValueError("account_type must be 'Organization' or 'User'")
    with state.lock:
        if any(i.account.lower() == account.lower() for i in state.installations.values()):
            raise ValueError(f"the App is already installed on {account}")
        inst = Installation(
            id=next(state.ids["installation"]),
            account=account,
            account_type=account_type,
            account_id=next(state.ids["account"]),
            repositories=[],
            created_at=state.clock(),
        )
        state.installations[inst.id] = inst
        for full_name in repositories:
            add_repository(state, inst.id, full_name)
        return inst.id


def add_repository(state: FakeState, installation_id: int, repo: str) -> int:
    with state.lock:
        inst = state.installations[installation_id]
        owner, _, name = repo.partition("/")
        if not name or "/" in name:
            raise ValueError(f"{repo!r} is not owner/name")
        if owner.lower() != inst.account.lower():
            raise ValueError(f"{repo} is not owned by {inst.account}")
        if repo.lower() in state.repos:
            raise ValueError(f"{repo} already belongs to an installation")
        record = Repo(next(state.ids["repo"]), inst.account, name, inst.id, state.clock())
        state.repos[repo.lower()] = record
        inst.repositories.append(record.full_name)
        return record.id


def uninstall(state: FakeState, installation_id: int) -> str:
    with state.lock:
        inst = state.installations.pop(installation_id)
        for token in state.tokens.values():
            if token.installation_id == installation_id:
                token.revoked = True
        for name in [k for k, r in state.repos.items() if r.installation_id == inst.id]:
            del state.repos[name]
        payload = {
            "action": "deleted",
            "installation": installation_json(state, inst),
            "repositories": [],
            "sender": sender(state),
        }
    return send_event(state, "installation", payload)


def remove_repositories(state: FakeState, installation_id: int, repos: list[str]) -> str:
    with state.lock:
        inst = state.installations[installation_id]
        gone = [state.repos.pop(r.lower()) for r in repos]
        wanted = {r.lower() for r in repos}
        inst.repositories = [r for r in inst.repositories if r.lower() not in wanted]
        payload = {
            "action": "removed",
            "installation": installation_json(state, inst),
            "repository_selection": "selected",
            "repositories_added": [],
            "repositories_removed": [
                {
                    "id": r.id,
                    "node_id": shapes.node_id("Repository", r.id),
                    "name": r.name,
                    "full_name": r.full_name,
                    "private": True,
                }
                for r in gone
            ],
            "requester": None,  # GitHub names one only when a request was approved
            "sender": sender(state),
        }
    return send_event(state, "installation_repositories", payload)


# ---- runners and jobs --------------------------------------------------------------------


def hold_runners_offline(state: FakeState, hold: bool, names: list[str] | None) -> None:
    with state.lock:
        chosen = {ALL_RUNNERS} if names is None else set(names)
        if hold:
            state.held_offline |= chosen
        elif names is None:
            state.held_offline.clear()
        else:
            state.held_offline -= chosen


def queue_job(
    state: FakeState,
    repo: str,
    labels: list[str] | tuple[str, ...],
    duration: float,
    conclusion: str,
    *,
    name: str,
    workflow: str,
    run_id: int | None,
) -> int:
    if conclusion not in CONCLUSIONS:
        raise ValueError(f"conclusion must be one of {CONCLUSIONS}")
    if not labels or not all(isinstance(x, str) and x for x in labels):
        raise ValueError("labels must be a non-empty list of strings")
    with state.lock:
        record = state.repos.get(repo.lower())
        if record is None:
            raise ValueError(f"{repo} is not in any installation")
        now = state.clock()
        if run_id is not None:
            joined = state.runs.get(run_id)
            if joined is None or joined.repo != record.full_name:
                raise ValueError(f"run {run_id} is not a run of {repo}")
        run = (
            joined
            if run_id is not None
            else Run(
                id=next(state.ids["run"]),
                repo=record.full_name,
                installation_id=record.installation_id,
                name=workflow,
                run_number=sum(1 for r in state.runs.values() if r.repo == record.full_name) + 1,
                head_sha=secrets.token_hex(20),
                created_at=now,
                updated_at=now,
            )
        )
        job = Job(
            id=next(state.ids["job"]),
            run_id=run.id,
            repo=record.full_name,
            installation_id=record.installation_id,
            name=name,
            labels=list(labels),
            duration=float(duration),
            wanted_conclusion=conclusion,
            created_at=now,
        )
        run.job_ids.append(job.id)
        run.updated_at = now
        state.runs[run.id] = run
        state.jobs[job.id] = job
        state.queued[job.id] = None
        emit(state, job, "queued")
        assign_job(state, job)
        state.changed.notify_all()
        return job.id


def cancel_job(state: FakeState, job_id: int) -> dict[str, Any]:
    with state.lock:
        job = state.jobs[job_id]
        if job.status != "queued":
            raise ValueError(f"job {job_id} is {job.status}, not queued")
        state.queued.pop(job.id, None)
        finish(state, job, "cancelled")
        return job_json(state, job)


def job_shape(state: FakeState, job_id: int) -> dict[str, Any]:
    with state.lock:
        return job_json(state, state.jobs[job_id])


def runner_shapes(state: FakeState, installation_id: int) -> list[dict[str, Any]]:
    with state.lock:
        return [
            runner_json(state, r)
            for r in sorted(state.runners.values(), key=lambda r: r.id)
            if r.installation_id == installation_id
        ]


def wait_job(state: FakeState, job_id: int, status: str, timeout: float) -> dict[str, Any]:
    with state.lock:
        if not state.changed.wait_for(lambda: state.jobs[job_id].status == status, timeout):
            raise TimeoutError(f"job {job_id} is {state.jobs[job_id].status}, not {status}")
        return job_json(state, state.jobs[job_id])


# ---- rate limits and tokens --------------------------------------------------------------


def rate_limit(
    state: FakeState, installation_id: int, reset_in: float | None, retry_after: int | None
) -> None:
    with state.lock:
        state.limits[installation_id] = limit_from_now(state, reset_in, retry_after)


def clear_rate_limit(state: FakeState, installation_id: int) -> None:
    with state.lock:
        state.limits.pop(installation_id, None)


def rate_limit_app(state: FakeState, reset_in: float | None, retry_after: int | None) -> None:
    with state.lock:
        state.limits[APP_KEY] = limit_from_now(state, reset_in, retry_after)


def clear_rate_limit_app(state: FakeState) -> None:
    with state.lock:
        state.limits.pop(APP_KEY, None)


def quota_used(state: FakeState, installation_id: int) -> int:
    with state.lock:
        return quota(state, ("installation", installation_id)).used


def spend_quota(state: FakeState, installation_id: int, calls: int) -> None:
    with state.lock:
        quota(state, ("installation", installation_id)).used += calls


def spend_app_quota(state: FakeState, calls: int) -> None:
    with state.lock:
        quota(state, ("app",)).used += calls


def expire_tokens(state: FakeState) -> None:
    with state.lock:
        for token in state.tokens.values():
            token.revoked = True


# ---- deliveries and records --------------------------------------------------------------


def set_delivery(
    state: FakeState,
    drop: bool | float,
    duplicate: bool | float,
    reorder: bool | float,
    delay: float,
    *,
    early_progress: bool,
    queued_lag: float,
    new_ids: bool,
    concurrency: int,
    seed: int | None,
) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be a whole number from 1, not {concurrency!r}")
    shares = {
        "drop": _share("drop", drop),
        "duplicate": _share("duplicate", duplicate),
        "reorder": _share("reorder", reorder),
    }
    with state.lock:
        state.delivery_mode = {
            "drop": shares["drop"],
            "duplicate": shares["duplicate"],
            "new_ids": bool(new_ids),
            "reorder": shares["reorder"],
            "early_progress": bool(early_progress),
            "queued_lag": max(0.0, float(queued_lag)),
            "delay": max(0.0, float(delay)),
            "concurrency": concurrency,
            "seed": seed,
        }
        state.delivery_rng = random.Random(seed)  # noqa: S311  # a fault pattern
        state.reorder_choice.clear()
        with state.outbox_cv:
            state.concurrency = concurrency
            state.outbox_cv.notify_all()


def _share(name: str, value: object) -> bool | float:
    """A delivery mode's setting: a switch stays a switch (True means every one), a number
    is a share from 0 to 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and 0.0 <= value <= 1.0:
        return float(value)
    raise ValueError(f"{name} must be true, false or a share from 0 to 1, not {value!r}")


def delivery_mode(state: FakeState) -> dict[str, Any]:
    with state.lock:
        return dict(state.delivery_mode)


def delivery_faults(state: FakeState) -> dict[str, int]:
    with state.lock:
        return {**state.faults, "reordered_jobs": len(state.reordered_jobs)}


def delivery_records(state: FakeState) -> list[dict[str, Any]]:
    with state.lock:
        return [dict(d) for d in state.deliveries]


def hook_delivery_items(state: FakeState) -> list[dict[str, Any]]:
    with state.lock:
        return [hook_item(h) for h in sorted(state.hook_deliveries, key=lambda h: h["id"])]


def api_calls(state: FakeState) -> list[tuple[str, str, int | None]]:
    with state.lock:
        return list(state.calls)


def api_answers(state: FakeState) -> list[tuple[str, str, int | None, int]]:
    with state.lock:
        return list(state.answers)


def wait_sending(state: FakeState, in_flight: int, waiting: int, timeout: float) -> None:
    with state.outbox_cv:
        if not state.outbox_cv.wait_for(
            lambda: (state.sending, len(state.outbox)) == (in_flight, waiting), timeout
        ):
            now = (state.sending, len(state.outbox))
            raise TimeoutError(f"(in flight, waiting) is {now}, not {(in_flight, waiting)}")


def wait_deliveries(state: FakeState, count: int, timeout: float) -> list[dict[str, Any]]:
    with state.lock:
        if not state.changed.wait_for(lambda: len(state.deliveries) >= count, timeout):
            got = len(state.deliveries)
            raise TimeoutError(f"{got} of {count} deliveries after {timeout}s")
        return [dict(d) for d in state.deliveries]


def info(state: FakeState) -> dict[str, Any]:
    with state.lock:
        return {
            "url": state.url,
            "app_id": state.app_id,
            "client_id": state.client_id,
            "webhook_url": state.webhook_url,
            "installations": [
                {
                    "id": i.id,
                    "account": i.account,
                    "account_type": i.account_type,
                    "repositories": list(i.repositories),
                }
                for i in state.installations.values()
            ],
        }


# ---- the /_fake/ routes ------------------------------------------------------------------


def control_route(state: FakeState, req: Request) -> Response:
    """Answer a `/_fake/` request with the function above that does what it asks."""
    path, method = req.path, req.method
    try:
        if path == "/_fake/installations" and method == "POST":
            body = json_object(req)
            inst_id = add_installation(
                state,
                account=str(body["account"]),
                account_type=str(body.get("account_type", "Organization")),
                repositories=list(body.get("repositories", [])),
            )
            return Response(201, {"id": inst_id})
        if path == "/_fake/jobs" and method == "POST":
            body = json_object(req)
            job_id = queue_job(
                state,
                repo=str(body["repo"]),
                labels=list(body["labels"]),
                duration=float(body.get("duration", 0.0)),
                conclusion=str(body.get("conclusion", "success")),
                name=str(body.get("name", "build")),
                workflow="CI",
                run_id=None,
            )
            return Response(201, job_shape(state, job_id))
        match = re.fullmatch(r"/_fake/jobs/(\d+)(/cancel)?", path)
        if match and method == "GET" and not match.group(2):
            return Response(200, job_shape(state, int(match.group(1))))
        if match and method == "POST" and match.group(2):
            return Response(200, cancel_job(state, int(match.group(1))))
        if path == "/_fake/rate_limit" and method == "POST":
            body = json_object(req)
            inst_id = int(body["installation_id"])
            if body.get("clear"):
                clear_rate_limit(state, inst_id)
            else:
                retry = body.get("retry_after")
                rate_limit(
                    state,
                    inst_id,
                    reset_in=body.get("reset_in", 60.0),
                    retry_after=None if retry is None else int(retry),
                )
            return Response(200, {"installation_id": inst_id})
        if path == "/_fake/delivery" and method == "POST":
            body = json_object(req)
            seed = body.get("seed")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise ValueError("seed must be an integer")
            set_delivery(
                state,
                drop=body.get("drop", False),
                duplicate=body.get("duplicate", False),
                reorder=body.get("reorder", False),
                delay=float(body.get("delay", 0.0)),
                early_progress=bool(body.get("early_progress", False)),
                queued_lag=float(body.get("queued_lag", 0.0)),
                new_ids=bool(body.get("new_ids", False)),
                concurrency=body.get("concurrency", 1),
                seed=seed,
            )
            return Response(200, delivery_mode(state))
        if path == "/_fake/delivery" and method == "GET":
            return Response(200, {**delivery_mode(state), "faults": delivery_faults(state)})
        if path == "/_fake/expire_tokens" and method == "POST":
            expire_tokens(state)
            return Response(200, {})
        if path == "/_fake/deliveries" and method == "GET":
            return Response(200, delivery_records(state))
        if path == "/_fake/calls" and method == "GET":
            return Response(200, [list(c) for c in api_calls(state)])
        if path == "/_fake/runners" and method == "GET":
            return Response(200, runner_shapes(state, int(req.q("installation_id") or 0)))
        if path == "/_fake/runners/offline" and method == "POST":
            body = json_object(req)
            names = body.get("names")
            if names is not None and not (
                isinstance(names, list) and all(isinstance(n, str) for n in names)
            ):
                raise ValueError("names must be a list of runner names")
            hold_runners_offline(state, bool(body.get("hold", True)), names)
            return Response(200, {"held": sorted(state.held_offline)})
        if path == "/_fake/uninstall" and method == "POST":
            body = json_object(req)
            return Response(200, {"delivery": uninstall(state, int(body["installation_id"]))})
        if path == "/_fake/event" and method == "POST":
            body = json_object(req)
            if not isinstance(body.get("payload"), dict):
                raise ValueError("payload must be an object")
            delivery = send_event(state, str(body["event"]), body["payload"])
            return Response(200, {"delivery": delivery})
        if path == "/_fake/info" and method == "GET":
            return Response(200, info(state))
    except KeyError as exc:
        raise HttpError(404 if "jobs/" in path else 422, f"Unknown or missing {exc}") from None
    except (ValueError, TypeError) as exc:
        raise HttpError(422, str(exc)) from None
    raise HttpError(404, "Not Found")
