"""The fake GitHub's workflow run and job routes (`/repos/{owner}/{repo}/actions/runs`, a
run's jobs, a job) and their JSON shapes."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.app_api import int_param, paginate, repo_json, repo_scope, sender
from runners.github.fake.core import HttpError, Request, Response
from runners.github.fake.shapes import DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME, iso
from runners.github.fake.state import FakeState, Job, Run


def run_status(state: FakeState, run: Run) -> tuple[str, str | None]:
    jobs = [state.jobs[j] for j in run.job_ids]
    if all(j.status == "completed" for j in jobs):
        conclusions = [j.conclusion for j in jobs]
        for worst in ("failure", "cancelled", "timed_out", "action_required"):
            if worst in conclusions:
                return "completed", worst
        return "completed", conclusions[0]
    if any(j.status != "queued" for j in jobs):
        return "in_progress", None
    return "queued", None


def run_json(state: FakeState, run: Run) -> dict[str, Any]:
    url = state.url
    repo = state.repos[run.repo.lower()]
    repo_shape = repo_json(state, repo)
    actor = sender(state)
    status, conclusion = run_status(state, run)
    api = f"{url}/repos/{run.repo}/actions/runs/{run.id}"
    workflow_id = 100_000 + sum(ord(c) for c in run.name)
    return {
        "id": run.id,
        "name": run.name,
        "node_id": shapes.node_id("WorkflowRun", run.id),
        "check_suite_id": run.id + 1,
        "check_suite_node_id": shapes.node_id("CheckSuite", run.id + 1),
        "head_branch": "main",
        "head_sha": run.head_sha,
        "path": ".github/workflows/ci.yml",
        "run_number": run.run_number,
        "event": "push",
        "display_title": f"{run.name} #{run.run_number}",
        "status": status,
        "conclusion": conclusion,
        "workflow_id": workflow_id,
        "url": api,
        "html_url": f"{url}/{run.repo}/actions/runs/{run.id}",
        "pull_requests": [],
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "actor": actor,
        "run_attempt": 1,
        "referenced_workflows": [],
        "run_started_at": iso(run.created_at),
        "triggering_actor": actor,
        "jobs_url": f"{api}/jobs",
        "logs_url": f"{api}/logs",
        "check_suite_url": f"{url}/repos/{run.repo}/check-suites/{run.id + 1}",
        "artifacts_url": f"{api}/artifacts",
        "cancel_url": f"{api}/cancel",
        "rerun_url": f"{api}/rerun",
        "previous_attempt_url": None,
        "workflow_url": f"{url}/repos/{run.repo}/actions/workflows/{workflow_id}",
        "head_commit": {
            "id": run.head_sha,
            "tree_id": hashlib.sha1(run.head_sha.encode(), usedforsecurity=False).hexdigest(),
            "message": "Update the fake",
            "timestamp": iso(run.created_at),
            "author": {"name": "Mona Lisa", "email": "monalisa@example.com"},
            "committer": {"name": "GitHub", "email": "noreply@github.com"},
        },
        "repository": repo_shape,
        "head_repository": repo_shape,
    }


def job_json(state: FakeState, job: Job) -> dict[str, Any]:
    run = state.runs[job.run_id]
    repo_api = f"{state.url}/repos/{job.repo}"
    ran = job.runner_id is not None
    return {
        "id": job.id,
        "run_id": job.run_id,
        "workflow_name": run.name,
        "head_branch": "main",
        "run_url": f"{repo_api}/actions/runs/{job.run_id}",
        "run_attempt": 1,
        "node_id": shapes.node_id("CheckRun", job.id),
        "head_sha": run.head_sha,
        "url": f"{repo_api}/actions/jobs/{job.id}",
        "html_url": f"{state.url}/{job.repo}/actions/runs/{job.run_id}/job/{job.id}",
        "status": job.status,
        "conclusion": job.conclusion,
        "created_at": iso(job.created_at),
        # GitHub reports a queued job's started_at as its creation time.
        "started_at": iso(job.started_at if job.started_at is not None else job.created_at),
        "completed_at": iso(job.completed_at),
        "name": job.name,
        "steps": shapes.job_steps(
            job.status if ran else "queued",
            job.conclusion,
            job.started_at or job.created_at,
            job.completed_at,
        ),
        "check_run_url": f"{repo_api}/check-runs/{job.id}",
        "labels": list(job.labels),
        "runner_id": job.runner_id,
        "runner_name": job.runner_name,
        "runner_group_id": DEFAULT_GROUP_ID if ran else None,
        "runner_group_name": DEFAULT_GROUP_NAME if ran else None,
    }


def list_runs(state: FakeState, req: Request) -> Response:
    repo = repo_scope(state, req)
    wanted = req.q("status")
    runs = sorted(
        (r for r in state.runs.values() if r.repo == repo.full_name),
        key=lambda r: r.id,
        reverse=True,
    )
    if wanted:
        runs = [r for r in runs if wanted in run_status(state, r)]
    created = req.q("created")
    if created is not None:
        low, high = created_range(created)
        runs = [r for r in runs if low <= r.created_at < high]
    # GitHub caps searches filtered by status or created (among others) at 1,000 results.
    runs = runs[:1000] if wanted or created is not None else runs
    chunk, headers = paginate(state, req, runs)
    body = {"total_count": len(runs), "workflow_runs": [run_json(state, r) for r in chunk]}
    return Response(200, body, headers)


def created_range(value: str) -> tuple[float, float]:
    """The `created` filter in GitHub's search syntax as [low, high) epoch seconds:
    `>=T`, `>T`, `<=T`, `<T`, `A..B` (either side may be `*`) or a bare `T`, where each is a
    date (`2026-12-06`, the whole day) or a date-time with its offset
    (`2026-12-06T03:00:00+00:00` or `...Z`). Anything else is a 422, not an empty list."""
    value = value.strip()
    for op in (">=", "<=", ">", "<"):
        if value.startswith(op):
            start, end = _instant(value[len(op) :])
            return {
                ">=": (start, INF), ">": (end, INF), "<=": (-INF, end), "<": (-INF, start)
            }[op]  # fmt: skip
    if ".." in value:
        left, right = value.split("..", 1)
        low = -INF if left == "*" else _instant(left)[0]
        high = INF if right == "*" else _instant(right)[1]
        return low, high
    return _instant(value)


INF = float("inf")


def _instant(text: str) -> tuple[float, float]:
    """A date's whole day, or a date-time's one second, as [start, end) epoch seconds."""
    try:
        if len(text) == 10:
            day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
            return day.timestamp(), (day + timedelta(days=1)).timestamp()
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None or "T" not in text:
        raise HttpError(422, f"Validation Failed: created {text!r} is not a date or date-time")
    return moment.timestamp(), moment.timestamp() + 1


def _scoped_run(state: FakeState, req: Request) -> Run:
    repo = repo_scope(state, req)
    run = state.runs.get(int_param(req, "run_id"))
    if run is None or run.repo != repo.full_name:
        raise HttpError(404, "Not Found")
    return run


def get_run(state: FakeState, req: Request) -> Response:
    return Response(200, run_json(state, _scoped_run(state, req)))


def list_run_jobs(state: FakeState, req: Request) -> Response:
    run = _scoped_run(state, req)
    chunk, headers = paginate(state, req, [state.jobs[j] for j in run.job_ids])
    body = {"total_count": len(run.job_ids), "jobs": [job_json(state, j) for j in chunk]}
    return Response(200, body, headers)


def get_job(state: FakeState, req: Request) -> Response:
    repo = repo_scope(state, req)
    job = state.jobs.get(int_param(req, "job_id"))
    if job is None or job.repo != repo.full_name:
        raise HttpError(404, "Not Found")
    return Response(200, job_json(state, job))
