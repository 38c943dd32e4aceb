"""How the fake GitHub gives queued jobs to runners, and the private `/_runner/` protocol."""

from __future__ import annotations

import hmac
import re
import secrets
import time
from typing import Any

from runners.github.fake.core import (
    CONCLUSIONS,
    LONG_POLL_MAX,
    _Error,
    _Job,
    _Request,
    _Response,
    _Runner,
)


class RunnerProtocolMixin:
    """Assignment (a runner takes a job only with all its labels) and the runner's session."""

    def _can_take(self, runner: _Runner, job: _Job) -> bool:
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

    def _assign_job(self, job: _Job) -> None:
        """Give a queued job to the longest-waiting online idle runner that matches."""
        candidates = [
            r for r in self._runners.values() if self._runner_online(r) and self._can_take(r, job)
        ]
        if candidates:
            self._start(job, min(candidates, key=lambda r: (r.waiting_since, r.id)))

    def _assign_runner(self, runner: _Runner) -> None:
        """Give an idle runner the oldest queued job it can take."""
        if not self._runner_online(runner) or runner.job_id is not None:
            return
        for job_id in self._queued:
            job = self._jobs[job_id]
            if self._can_take(runner, job):
                self._start(job, runner)
                return

    def _start(self, job: _Job, runner: _Runner) -> None:
        self._queued.pop(job.id, None)
        now = self.clock()
        job.status = "in_progress"
        job.started_at = now
        job.runner_id = runner.id
        job.runner_name = runner.name
        runner.job_id = job.id
        runner.job_handed = False
        self._runs[job.run_id].updated_at = now
        self._emit(job, "in_progress")
        self._changed.notify_all()

    def _finish(self, job: _Job, conclusion: str) -> None:
        now = self.clock()
        job.status = "completed"
        job.conclusion = conclusion
        job.completed_at = now
        self._runs[job.run_id].updated_at = now
        self._emit(job, "completed")
        self._changed.notify_all()

    # ---- the runner protocol -----------------------------------------------------------

    def _runner_protocol(self, req: _Request) -> _Response:
        path, method = req.path, req.method
        if path == "/_runner/sessions" and method == "POST":
            return self._open_session(req)
        if path == "/_runner/sessions" and method == "DELETE":
            with self._lock:
                runner = self._session_runner(req)
                self._sessions.pop(runner.session or "", None)
                runner.session = None
                self._changed.notify_all()
            return _Response(204)
        if path == "/_runner/jobs" and method == "GET":
            return self._poll(req)
        match = re.fullmatch(r"/_runner/jobs/(\d+)/complete", path)
        if match and method == "POST":
            return self._complete(req, int(match.group(1)))
        raise _Error(404, "Not Found")

    def _open_session(self, req: _Request) -> _Response:
        body = req.json()
        with self._lock:
            ident = body.get("runner_id") if isinstance(body, dict) else None
            runner = self._runners.get(ident) if isinstance(ident, int) else None
            if runner is None:
                raise _Error(404, "Runner not found: it was removed or never registered")
            if not hmac.compare_digest(str(body.get("secret", "")), runner.secret):
                raise _Error(401, "Bad credentials")
            if runner.session_used:
                # A JIT config is single-use: its runner may open one session, ever.
                raise _Error(409, "This JIT configuration has already been used")
            runner.session = secrets.token_urlsafe(24)
            runner.session_used = True
            runner.os = str(body.get("os") or "linux")
            runner.version = str(body.get("version") or "") or None
            runner.last_seen = self.clock()
            runner.waiting_since = time.monotonic()
            self._sessions[runner.session] = runner.id
            self._assign_runner(runner)
            self._changed.notify_all()
            return _Response(201, {"session": runner.session, "runner": self._runner_json(runner)})

    def _session_runner(self, req: _Request) -> _Runner:
        scheme, value = self._credentials(req)
        runner_id = self._sessions.get(value) if scheme == "bearer" else None
        runner = self._runners.get(runner_id) if runner_id is not None else None
        if runner is None:
            raise _Error(404, "Session not found: the runner was removed or its session closed")
        return runner

    def _poll(self, req: _Request) -> _Response:
        try:
            wait = min(max(float(req.q("wait") or 0), 0.0), LONG_POLL_MAX)
        except ValueError:
            wait = 0.0
        deadline = time.monotonic() + wait
        with self._lock:
            runner = self._session_runner(req)
            runner.polling += 1
            try:
                self._assign_runner(runner)
                while True:
                    if self._runners.get(runner.id) is not runner or runner.session is None:
                        raise _Error(404, "Session not found: the runner was removed")
                    if runner.job_id is not None and not runner.job_handed:
                        runner.job_handed = True
                        return _Response(200, {"job": self._job_message(self._jobs[runner.job_id])})
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopping:
                        return _Response(204)
                    self._changed.wait(left)
            finally:
                runner.polling -= 1
                runner.last_seen = self.clock()

    def _job_message(self, job: _Job) -> dict[str, Any]:
        return {
            "id": job.id,
            "run_id": job.run_id,
            "repository": job.repo,
            "name": job.name,
            "labels": list(job.labels),
            "duration": job.duration,
            "conclusion": job.wanted_conclusion,
        }

    def _complete(self, req: _Request, job_id: int) -> _Response:
        body = req.json()
        conclusion = body.get("conclusion") if isinstance(body, dict) else None
        if conclusion not in CONCLUSIONS:
            raise _Error(422, f"conclusion must be one of {', '.join(CONCLUSIONS)}")
        with self._lock:
            runner = self._session_runner(req)
            if runner.job_id != job_id:
                raise _Error(409, f"runner {runner.name} is not running job {job_id}")
            job = self._jobs[job_id]
            self._finish(job, conclusion)
            runner.job_id = None
            runner.last_seen = self.clock()
            runner.waiting_since = time.monotonic()
            if runner.ephemeral:
                # GitHub de-registers an ephemeral runner once its job is done.
                self._remove_runner(runner)
            else:
                self._assign_runner(runner)
            return _Response(200, {"runner_removed": runner.ephemeral})
