"""How the fake GitHub gives queued jobs to runners (a runner takes a job only with all its
labels), and the private `/_runner/` protocol a runner's session speaks."""

from __future__ import annotations

import hmac
import re
import secrets
import time
from typing import Any

from runners.github.fake.auth import credentials
from runners.github.fake.core import (
    ALL_RUNNERS,
    CONCLUSIONS,
    LONG_POLL_MAX,
    HttpError,
    Request,
    Response,
)
from runners.github.fake.deliveries import emit
from runners.github.fake.runners_api import (
    register_runner,
    remove_runner,
    runner_json,
    runner_online,
)
from runners.github.fake.state import FakeState, Job, Runner


def _can_take(runner: Runner, job: Job) -> bool:
    if runner.installation_id != job.installation_id or runner.job_id is not None:
        return False
    kind, where = runner.scope
    # An org runner serves the org's repositories; a repo runner only its own repository.
    if kind == "org" and job.repo.split("/")[0].lower() != where:
        return False
    if kind == "repo" and job.repo.lower() != where:
        return False
    names = {label["name"].lower() for label in runner.labels}
    return all(label.lower() in names for label in job.labels)


def assign_job(state: FakeState, job: Job) -> None:
    """Give a queued job to the longest-waiting online idle runner that matches."""
    candidates = [
        r for r in state.runners.values() if runner_online(state, r) and _can_take(r, job)
    ]
    if candidates:
        _start(state, job, min(candidates, key=lambda r: (r.waiting_since, r.id)))


def _assign_runner(state: FakeState, runner: Runner) -> None:
    """Give an idle runner the oldest queued job it can take."""
    if not runner_online(state, runner) or runner.job_id is not None:
        return
    for job_id in state.queued:
        job = state.jobs[job_id]
        if _can_take(runner, job):
            _start(state, job, runner)
            return


def _start(state: FakeState, job: Job, runner: Runner) -> None:
    state.queued.pop(job.id, None)
    now = state.clock()
    job.status = "in_progress"
    job.started_at = now
    job.runner_id = runner.id
    job.runner_name = runner.name
    runner.job_id = job.id
    runner.job_handed = False
    state.runs[job.run_id].updated_at = now
    emit(state, job, "in_progress")
    state.changed.notify_all()
    state.observer.job_started(job)


def finish(state: FakeState, job: Job, conclusion: str) -> None:
    """Complete a job with this conclusion and send `completed`."""
    now = state.clock()
    job.status = "completed"
    job.conclusion = conclusion
    job.completed_at = now
    state.runs[job.run_id].updated_at = now
    emit(state, job, "completed")
    state.changed.notify_all()
    state.observer.job_finished(job)


# ---- the runner protocol ---------------------------------------------------------------


def runner_route(state: FakeState, req: Request) -> Response:
    """Answer a `/_runner/` request."""
    path, method = req.path, req.method
    if path == "/_runner/register" and method == "POST":
        body = req.json()
        with state.lock:
            encoded = register_runner(state, body if isinstance(body, dict) else {})
        return Response(201, {"encoded_jit_config": encoded})
    if path == "/_runner/sessions" and method == "POST":
        return _open_session(state, req)
    if path == "/_runner/sessions" and method == "DELETE":
        with state.lock:
            runner = _session_runner(state, req)
            state.sessions.pop(runner.session or "", None)
            runner.session = None
            state.changed.notify_all()
        return Response(204)
    if path == "/_runner/jobs" and method == "GET":
        return _poll(state, req)
    match = re.fullmatch(r"/_runner/jobs/(\d+)/complete", path)
    if match and method == "POST":
        return _complete(state, req, int(match.group(1)))
    raise HttpError(404, "Not Found")


def _open_session(state: FakeState, req: Request) -> Response:
    body = req.json()
    with state.lock:
        ident = body.get("runner_id") if isinstance(body, dict) else None
        runner = state.runners.get(ident) if isinstance(ident, int) else None
        if runner is None:
            raise HttpError(404, "Runner not found: it was removed or never registered")
        if not hmac.compare_digest(str(body.get("secret", "")), runner.secret):
            raise HttpError(401, "Bad credentials")
        if ALL_RUNNERS in state.held_offline or runner.name in state.held_offline:
            # It cannot reach GitHub: the registration stays offline, nothing is used up.
            raise HttpError(503, "Service Unavailable")
        if runner.session_used and runner.ephemeral:
            # A JIT config is single-use: its runner may open one session, ever (a config.sh
            # runner keeps its credentials and opens one again after a restart).
            raise HttpError(409, "This JIT configuration has already been used")
        runner.session = secrets.token_urlsafe(24)
        runner.session_used = True
        runner.os = str(body.get("os") or "linux")
        runner.version = str(body.get("version") or "") or None
        runner.last_seen = state.clock()
        runner.waiting_since = time.monotonic()
        state.sessions[runner.session] = runner.id
        _assign_runner(state, runner)
        state.changed.notify_all()
        response = Response(201, {"session": runner.session, "runner": runner_json(state, runner)})
    state.observer.session_opened(runner)
    return response


def _session_runner(state: FakeState, req: Request) -> Runner:
    scheme, value = credentials(req)
    runner_id = state.sessions.get(value) if scheme == "bearer" else None
    runner = state.runners.get(runner_id) if runner_id is not None else None
    if runner is None:
        raise HttpError(404, "Session not found: the runner was removed or its session closed")
    return runner


def _poll(state: FakeState, req: Request) -> Response:
    try:
        wait = min(max(float(req.q("wait") or 0), 0.0), LONG_POLL_MAX)
    except ValueError:
        wait = 0.0
    deadline = time.monotonic() + wait
    with state.lock:
        runner = _session_runner(state, req)
        runner.polling += 1
        try:
            _assign_runner(state, runner)
            while True:
                if state.runners.get(runner.id) is not runner or runner.session is None:
                    raise HttpError(404, "Session not found: the runner was removed")
                if runner.job_id is not None and not runner.job_handed:
                    runner.job_handed = True
                    return Response(200, {"job": _job_message(state.jobs[runner.job_id])})
                left = deadline - time.monotonic()
                if left <= 0 or state.stopping:
                    return Response(204)
                state.changed.wait(left)
        finally:
            runner.polling -= 1
            runner.last_seen = state.clock()


def _job_message(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "run_id": job.run_id,
        "repository": job.repo,
        "name": job.name,
        "labels": list(job.labels),
        "duration": job.duration,
        "conclusion": job.wanted_conclusion,
    }


def _complete(state: FakeState, req: Request, job_id: int) -> Response:
    body = req.json()
    conclusion = body.get("conclusion") if isinstance(body, dict) else None
    if conclusion not in CONCLUSIONS:
        raise HttpError(422, f"conclusion must be one of {', '.join(CONCLUSIONS)}")
    with state.lock:
        runner = _session_runner(state, req)
        if runner.job_id != job_id:
            raise HttpError(409, f"runner {runner.name} is not running job {job_id}")
        job = state.jobs[job_id]
        finish(state, job, conclusion)
        runner.job_id = None
        runner.last_seen = state.clock()
        runner.waiting_since = time.monotonic()
        if runner.ephemeral:
            # GitHub de-registers an ephemeral runner once its job is done.
            remove_runner(state, runner)
        else:
            _assign_runner(state, runner)
        return Response(200, {"runner_removed": runner.ephemeral})
