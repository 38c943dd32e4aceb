"""The fake GitHub's control surface: the Python methods tests call and the `/_fake/` routes."""

from __future__ import annotations

import random
import re
import secrets
from typing import Any

from runners.github.fake.auth import APP_KEY
from runners.github.fake.core import (
    CONCLUSIONS,
    _Error,
    _Installation,
    _Job,
    _Limit,
    _object,
    _Repo,
    _Request,
    _Response,
    _Run,
)


class ControlMixin:
    """Install, queue, cancel, rate-limit, steer deliveries, and wait for things to happen."""

    def add_installation(
        self,
        account: str,
        account_type: str = "Organization",
        repositories: list[str] | tuple[str, ...] = (),
    ) -> int:
        """Install the App on an account with these repositories; returns the installation id."""
        if account_type not in ("Organization", "User"):
            raise ValueError("account_type must be 'Organization' or 'User'")
        with self._lock:
            if any(i.account.lower() == account.lower() for i in self._installations.values()):
                raise ValueError(f"the App is already installed on {account}")
            inst = _Installation(
                id=next(self._ids["installation"]),
                account=account,
                account_type=account_type,
                account_id=next(self._ids["account"]),
                repositories=[],
                created_at=self.clock(),
            )
            self._installations[inst.id] = inst
            for full_name in repositories:
                self.add_repository(inst.id, full_name)
            return inst.id

    def add_repository(self, installation_id: int, repo: str) -> int:
        """Add a repository (`owner/name`, owned by the installation's account); its id."""
        with self._lock:
            inst = self._installations[installation_id]
            owner, _, name = repo.partition("/")
            if not name or "/" in name:
                raise ValueError(f"{repo!r} is not owner/name")
            if owner.lower() != inst.account.lower():
                raise ValueError(f"{repo} is not owned by {inst.account}")
            if repo.lower() in self._repos:
                raise ValueError(f"{repo} already belongs to an installation")
            record = _Repo(next(self._ids["repo"]), inst.account, name, inst.id, self.clock())
            self._repos[repo.lower()] = record
            inst.repositories.append(record.full_name)
            return record.id

    def queue_job(
        self,
        repo: str,
        labels: list[str] | tuple[str, ...],
        duration: float = 0.0,
        conclusion: str = "success",
        *,
        name: str = "build",
        workflow: str = "CI",
        run_id: int | None = None,
    ) -> int:
        """Start a workflow run with one queued job, send `queued`; returns the job id.

        With `run_id`, the job joins that run of the same repository instead (a matrix or a
        later job of one workflow run).
        """
        if conclusion not in CONCLUSIONS:
            raise ValueError(f"conclusion must be one of {CONCLUSIONS}")
        if not labels or not all(isinstance(x, str) and x for x in labels):
            raise ValueError("labels must be a non-empty list of strings")
        with self._lock:
            record = self._repos.get(repo.lower())
            if record is None:
                raise ValueError(f"{repo} is not in any installation")
            now = self.clock()
            if run_id is not None:
                joined = self._runs.get(run_id)
                if joined is None or joined.repo != record.full_name:
                    raise ValueError(f"run {run_id} is not a run of {repo}")
            run = (
                joined
                if run_id is not None
                else _Run(
                    id=next(self._ids["run"]),
                    repo=record.full_name,
                    installation_id=record.installation_id,
                    name=workflow,
                    run_number=sum(1 for r in self._runs.values() if r.repo == record.full_name)
                    + 1,
                    head_sha=secrets.token_hex(20),
                    created_at=now,
                    updated_at=now,
                )
            )
            job = _Job(
                id=next(self._ids["job"]),
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
            self._runs[run.id] = run
            self._jobs[job.id] = job
            self._queued[job.id] = None
            self._emit(job, "queued")
            self._assign_job(job)
            self._changed.notify_all()
            return job.id

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        """Cancel a queued job (it completes as cancelled, with no runner); returns the job."""
        with self._lock:
            job = self._jobs[job_id]
            if job.status != "queued":
                raise ValueError(f"job {job_id} is {job.status}, not queued")
            self._queued.pop(job.id, None)
            self._finish(job, "cancelled")
            return self._job_json(job)

    def job(self, job_id: int) -> dict[str, Any]:
        """The job in GitHub's `job` shape."""
        with self._lock:
            return self._job_json(self._jobs[job_id])

    def runners(self, installation_id: int) -> list[dict[str, Any]]:
        """The installation's registered runners in GitHub's `runner` shape, by id."""
        with self._lock:
            return [
                self._runner_json(r)
                for r in sorted(self._runners.values(), key=lambda r: r.id)
                if r.installation_id == installation_id
            ]

    def rate_limit(
        self, installation_id: int, reset_in: float | None = 60.0, retry_after: int | None = None
    ) -> None:
        """Rate-limit every call made with the installation's tokens from now on.

        403 with x-ratelimit-remaining 0 and the reset (primary) until `reset_in` seconds of
        `clock` have passed; with `retry_after`, 429 with retry-after instead (secondary).
        Both None: 403 that says nothing usable about when, until `clear_rate_limit`.
        """
        with self._lock:
            self._limits[installation_id] = self._limit(reset_in, retry_after)

    def clear_rate_limit(self, installation_id: int) -> None:
        with self._lock:
            self._limits.pop(installation_id, None)

    def rate_limit_app(self, reset_in: float | None = 60.0, retry_after: int | None = None) -> None:
        """Rate-limit every call made with the App's JWT from now on, as `rate_limit` does an
        installation's: GitHub counts the App's own calls apart from its installations'."""
        with self._lock:
            self._limits[APP_KEY] = self._limit(reset_in, retry_after)

    def _limit(self, reset_in: float | None, retry_after: int | None) -> _Limit:
        """A limit from now: to the reset, else for retry-after, else until cleared."""
        now = self.clock()
        if reset_in is not None:
            return _Limit(until=now + reset_in, retry_after=retry_after)
        if retry_after is not None:
            return _Limit(until=now + retry_after, retry_after=retry_after)
        return _Limit(until=None, retry_after=retry_after)

    def clear_rate_limit_app(self) -> None:
        with self._lock:
            self._limits.pop(APP_KEY, None)

    def set_delivery(
        self,
        drop: bool | float = False,
        duplicate: bool | float = False,
        reorder: bool | float = False,
        delay: float = 0.0,
        *,
        early_progress: bool = False,
        queued_lag: float = 0.0,
        new_ids: bool = False,
        concurrency: int = 1,
        seed: int | None = None,
    ) -> None:
        """How deliveries made from now on behave.

        drop, duplicate and reorder are each a switch (True: every delivery, or every job)
        or a share from 0 to 1 (True is 1.0): at a share each delivery is dropped, and each
        one sent is duplicated, with that probability, and that share of jobs is reordered
        (drawn once per job, at its first delivery made under the share; the rest go in
        order). The draws come from a generator seeded with `seed` by this call (None: an
        unpredictable seed), so one seed and one sequence of jobs give the same faults.

        drop: record each as attempted with status_code None and send nothing (GitHub's
        delivery log lists it as "timed out", status_code 0: it never arrived). duplicate:
        send each twice, back to back and at once (a `queued` copy lands while the job is
        still queued), with the same X-GitHub-Delivery (a redelivery); with new_ids the
        second copy has its own X-GitHub-Delivery instead (the same event sent again, which
        deduplicating on the delivery id cannot catch). reorder: hold a job's deliveries
        and send them newest first once it completes (so `completed` arrives first).
        early_progress: hold a job's `queued` until its `in_progress` is sent, then send it
        `queued_lag` seconds (real time) after that, so `in_progress` arrives first and
        `queued` late, while the job runs or after it (a job cancelled while queued sends
        it after `completed`); the other deliveries go out as they happen. reorder, when
        also on, holds whatever early_progress lets go and ignores the lag.
        delay: wait this many seconds (real time, it stands for latency) before sending.
        concurrency: how many deliveries are in flight at once (GitHub does not wait for
        one answer before it sends the next); at 1, the default, they go one after another
        in the order they were made, above 1 that order is not kept between those in flight.
        """
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a whole number from 1, not {concurrency!r}")
        shares = {
            "drop": _share("drop", drop),
            "duplicate": _share("duplicate", duplicate),
            "reorder": _share("reorder", reorder),
        }
        with self._lock:
            self._delivery_mode = {
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
            self._delivery_rng = random.Random(seed)  # noqa: S311  # a fault pattern
            self._reorder_choice.clear()
            with self._outbox_cv:
                self._concurrency = concurrency
                self._outbox_cv.notify_all()

    @property
    def delivery_mode(self) -> dict[str, Any]:
        """The delivery modes as set_delivery() last set them."""
        with self._lock:
            return dict(self._delivery_mode)

    @property
    def delivery_faults(self) -> dict[str, int]:
        """The faults the delivery modes made so far: deliveries dropped (first attempts),
        redeliveries dropped, deliveries duplicated (each one sent twice counts once), and
        jobs whose deliveries were held and sent newest first."""
        with self._lock:
            return {**self._faults, "reordered_jobs": len(self._reordered_jobs)}

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        """Every delivery attempted: id, event, action, job_id, status_code (None if dropped),
        error, hook_delivery_id (its id in GET /app/hook/deliveries) and redelivery."""
        with self._lock:
            return [dict(d) for d in self._deliveries]

    @property
    def hook_deliveries(self) -> list[dict[str, Any]]:
        """GitHub's delivery log of the App's webhook, oldest first, each attempt in the
        shape `GET /app/hook/deliveries` lists it (`delivered_at` an ISO timestamp)."""
        with self._lock:
            return [
                self._hook_item(h) for h in sorted(self._hook_deliveries, key=lambda h: h["id"])
            ]

    @property
    def calls(self) -> list[tuple[str, str, int | None]]:
        """GitHub API calls made: (method, path, installation id of the token or None)."""
        with self._lock:
            return list(self._calls)

    @property
    def answers(self) -> list[tuple[str, str, int | None, int]]:
        """GitHub API calls made and their status: (method, path, installation id, status)."""
        with self._lock:
            return list(self._answers)

    def quota_used(self, installation_id: int) -> int:
        """Calls counted against the installation's hourly limit in the current window."""
        with self._lock:
            return self._quota(("installation", installation_id)).used

    def spend_quota(self, installation_id: int, calls: int) -> None:
        """Count `calls` more against the installation's hour, as if someone else made them."""
        with self._lock:
            self._quota(("installation", installation_id)).used += calls

    def spend_app_quota(self, calls: int) -> None:
        """Count `calls` more against the App's own hour (its JWT calls)."""
        with self._lock:
            self._quota(("app",)).used += calls

    def expire_tokens(self) -> None:
        """Every installation token issued so far stops working (401 Bad credentials)."""
        with self._lock:
            for token in self._tokens.values():
                token.revoked = True

    def wait_deliveries(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least `count` deliveries were attempted; returns them."""
        with self._lock:
            if not self._changed.wait_for(lambda: len(self._deliveries) >= count, timeout):
                got = len(self._deliveries)
                raise TimeoutError(f"{got} of {count} deliveries after {timeout}s")
            return [dict(d) for d in self._deliveries]

    def wait_job(self, job_id: int, status: str, timeout: float = 5.0) -> dict[str, Any]:
        """Block until the job reaches `status`; returns it."""
        with self._lock:
            if not self._changed.wait_for(lambda: self._jobs[job_id].status == status, timeout):
                raise TimeoutError(f"job {job_id} is {self._jobs[job_id].status}, not {status}")
            return self._job_json(self._jobs[job_id])

    def _control(self, req: _Request) -> _Response:
        path, method = req.path, req.method
        try:
            if path == "/_fake/installations" and method == "POST":
                body = _object(req)
                inst_id = self.add_installation(
                    account=str(body["account"]),
                    account_type=str(body.get("account_type", "Organization")),
                    repositories=list(body.get("repositories", [])),
                )
                return _Response(201, {"id": inst_id})
            if path == "/_fake/jobs" and method == "POST":
                body = _object(req)
                job_id = self.queue_job(
                    repo=str(body["repo"]),
                    labels=list(body["labels"]),
                    duration=float(body.get("duration", 0.0)),
                    conclusion=str(body.get("conclusion", "success")),
                    name=str(body.get("name", "build")),
                )
                return _Response(201, self.job(job_id))
            match = re.fullmatch(r"/_fake/jobs/(\d+)(/cancel)?", path)
            if match and method == "GET" and not match.group(2):
                return _Response(200, self.job(int(match.group(1))))
            if match and method == "POST" and match.group(2):
                return _Response(200, self.cancel_job(int(match.group(1))))
            if path == "/_fake/rate_limit" and method == "POST":
                body = _object(req)
                inst_id = int(body["installation_id"])
                if body.get("clear"):
                    self.clear_rate_limit(inst_id)
                else:
                    retry = body.get("retry_after")
                    self.rate_limit(
                        inst_id,
                        reset_in=body.get("reset_in", 60.0),
                        retry_after=None if retry is None else int(retry),
                    )
                return _Response(200, {"installation_id": inst_id})
            if path == "/_fake/delivery" and method == "POST":
                body = _object(req)
                seed = body.get("seed")
                if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                    raise ValueError("seed must be an integer")
                self.set_delivery(
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
                return _Response(200, self.delivery_mode)
            if path == "/_fake/delivery" and method == "GET":
                return _Response(200, {**self.delivery_mode, "faults": self.delivery_faults})
            if path == "/_fake/expire_tokens" and method == "POST":
                self.expire_tokens()
                return _Response(200, {})
            if path == "/_fake/deliveries" and method == "GET":
                return _Response(200, self.deliveries)
            if path == "/_fake/calls" and method == "GET":
                return _Response(200, [list(c) for c in self.calls])
            if path == "/_fake/runners" and method == "GET":
                return _Response(200, self.runners(int(req.q("installation_id") or 0)))
            if path == "/_fake/info" and method == "GET":
                return _Response(200, self.info())
        except KeyError as exc:
            raise _Error(404 if "jobs/" in path else 422, f"Unknown or missing {exc}") from None
        except (ValueError, TypeError) as exc:
            raise _Error(422, str(exc)) from None
        raise _Error(404, "Not Found")

    def info(self) -> dict[str, Any]:
        """The fake's identity and installations, for people and the management command."""
        with self._lock:
            return {
                "url": self.url,
                "app_id": self.app_id,
                "client_id": self.client_id,
                "webhook_url": self.webhook_url,
                "installations": [
                    {
                        "id": i.id,
                        "account": i.account,
                        "account_type": i.account_type,
                        "repositories": list(i.repositories),
                    }
                    for i in self._installations.values()
                ],
            }


def _share(name: str, value: object) -> bool | float:
    """A delivery mode's setting: a switch stays a switch (True means every one), a number
    is a share from 0 to 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and 0.0 <= value <= 1.0:
        return float(value)
    raise ValueError(f"{name} must be true, false or a share from 0 to 1, not {value!r}")
