"""The fake GitHub's workflow run and job routes and their JSON shapes."""

from __future__ import annotations

import hashlib
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.core import (
    _Error,
    _Job,
    _Repo,
    _Request,
    _Response,
    _Run,
)
from runners.github.fake.shapes import DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME, iso


class RunsApiMixin:
    """`/repos/{owner}/{repo}/actions/runs`, a run's jobs, a job."""

    def _repo_json(self, repo: _Repo) -> dict[str, Any]:
        inst = self._installations[repo.installation_id]
        owner = shapes.simple_user(
            self.url, self.url, inst.account, inst.account_id, inst.account_type
        )
        return shapes.repository(
            self.url,
            self.url,
            ident=repo.id,
            name=repo.name,
            owner=owner,
            created_at=repo.created_at,
        )

    def _run_status(self, run: _Run) -> tuple[str, str | None]:
        jobs = [self._jobs[j] for j in run.job_ids]
        if all(j.status == "completed" for j in jobs):
            conclusions = [j.conclusion for j in jobs]
            for worst in ("failure", "cancelled", "timed_out", "action_required"):
                if worst in conclusions:
                    return "completed", worst
            return "completed", conclusions[0]
        if any(j.status != "queued" for j in jobs):
            return "in_progress", None
        return "queued", None

    def _run_json(self, run: _Run) -> dict[str, Any]:
        repo = self._repos[run.repo.lower()]
        repo_json = self._repo_json(repo)
        actor = self._sender()
        status, conclusion = self._run_status(run)
        api = f"{self.url}/repos/{run.repo}/actions/runs/{run.id}"
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
            "html_url": f"{self.url}/{run.repo}/actions/runs/{run.id}",
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
            "check_suite_url": f"{self.url}/repos/{run.repo}/check-suites/{run.id + 1}",
            "artifacts_url": f"{api}/artifacts",
            "cancel_url": f"{api}/cancel",
            "rerun_url": f"{api}/rerun",
            "previous_attempt_url": None,
            "workflow_url": f"{self.url}/repos/{run.repo}/actions/workflows/{workflow_id}",
            "head_commit": {
                "id": run.head_sha,
                "tree_id": hashlib.sha1(run.head_sha.encode(), usedforsecurity=False).hexdigest(),
                "message": "Update the fake",
                "timestamp": iso(run.created_at),
                "author": {"name": "Mona Lisa", "email": "monalisa@example.com"},
                "committer": {"name": "GitHub", "email": "noreply@github.com"},
            },
            "repository": repo_json,
            "head_repository": repo_json,
        }

    def _job_json(self, job: _Job) -> dict[str, Any]:
        run = self._runs[job.run_id]
        repo_api = f"{self.url}/repos/{job.repo}"
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
            "html_url": f"{self.url}/{job.repo}/actions/runs/{job.run_id}/job/{job.id}",
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

    def _list_runs(self, req: _Request) -> _Response:
        repo = self._repo_scope(req)
        wanted = req.q("status")
        runs = sorted(
            (r for r in self._runs.values() if r.repo == repo.full_name),
            key=lambda r: r.id,
            reverse=True,
        )
        if wanted:
            runs = [r for r in runs if wanted in self._run_status(r)]
        runs = runs[:1000] if wanted else runs  # GitHub caps filtered searches at 1,000
        chunk, headers = self._paginate(req, runs)
        body = {"total_count": len(runs), "workflow_runs": [self._run_json(r) for r in chunk]}
        return _Response(200, body, headers)

    def _scoped_run(self, req: _Request) -> _Run:
        repo = self._repo_scope(req)
        run = self._runs.get(self._int_param(req, "run_id"))
        if run is None or run.repo != repo.full_name:
            raise _Error(404, "Not Found")
        return run

    def _get_run(self, req: _Request) -> _Response:
        return _Response(200, self._run_json(self._scoped_run(req)))

    def _list_run_jobs(self, req: _Request) -> _Response:
        run = self._scoped_run(req)
        chunk, headers = self._paginate(req, [self._jobs[j] for j in run.job_ids])
        body = {"total_count": len(run.job_ids), "jobs": [self._job_json(j) for j in chunk]}
        return _Response(200, body, headers)

    def _get_job(self, req: _Request) -> _Response:
        repo = self._repo_scope(req)
        job = self._jobs.get(self._int_param(req, "job_id"))
        if job is None or job.repo != repo.full_name:
            raise _Error(404, "Not Found")
        return _Response(200, self._job_json(job))
