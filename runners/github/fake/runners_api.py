"""The fake GitHub's self-hosted runner routes and the JIT configuration it issues."""

from __future__ import annotations

import json
import secrets
import string
import uuid
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.core import (
    RUNNER_NAME_MAX,
    _b64,
    _Error,
    _Request,
    _Response,
    _Runner,
)
from runners.github.fake.shapes import DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME, iso


class RunnersApiMixin:
    """`.../actions/runners`: generate-jitconfig, tokens, list, get, delete, groups."""

    def _runner_online(self, runner: _Runner) -> bool:
        if runner.session is None:
            return False
        if runner.job_id is not None or runner.polling > 0:
            return True
        seen = runner.last_seen
        return seen is not None and self.clock() - seen <= self.offline_after

    def _runner_json(self, runner: _Runner) -> dict[str, Any]:
        return {
            "id": runner.id,
            "name": runner.name,
            "os": runner.os,
            "status": "online" if self._runner_online(runner) else "offline",
            "busy": runner.job_id is not None,
            "ephemeral": runner.ephemeral,
            "runner_group_id": DEFAULT_GROUP_ID,
            "version": runner.version,
            "labels": [dict(label) for label in runner.labels],
        }

    def _label_id(self, name: str) -> int:
        return self._label_ids.setdefault(name.lower(), next(self._ids["label"]))

    def _generate_jitconfig(self, req: _Request) -> _Response:
        scope = self._runner_scope(req)
        body = req.json()
        problems = _jit_problems(body)
        if problems:
            raise _Error(422, "Invalid request.\n\n" + " ".join(problems), errors=problems)
        if body["runner_group_id"] != DEFAULT_GROUP_ID:
            raise _Error(404, "Not Found")
        name = body["name"]
        if any(r.scope == scope and r.name.lower() == name.lower() for r in self._runners.values()):
            raise _Error(409, f"Already exists - A runner with the name {name} already exists.")
        runner = _Runner(
            id=next(self._ids["runner"]),
            name=name,
            installation_id=req.installation_id or 0,
            scope=scope,
            labels=shapes.runner_labels(body["labels"], self._label_id),
            secret=secrets.token_urlsafe(24),
        )
        self._runners[runner.id] = runner
        self._changed.notify_all()
        encoded = self._encode_jit_config(runner, body.get("work_folder") or "_work")
        return _Response(201, {"runner": self._runner_json(runner), "encoded_jit_config": encoded})

    def _encode_jit_config(self, runner: _Runner, work_folder: str) -> str:
        """As actions/runner reads it: base64 of a JSON object of file name -> base64 file content.

        `.runner` carries the runner's `RunnerSettings` under their own member names
        (shapes.RUNNER_SETTINGS_KEYS, from actions/runner ConfigurationStore.cs), as the
        JIT configuration GitHub issues does; AgentId is the runner's id.
        """
        owner = runner.scope[1]
        settings = {
            "AgentId": runner.id,
            "AgentName": runner.name,
            "PoolId": DEFAULT_GROUP_ID,
            "PoolName": DEFAULT_GROUP_NAME,
            "ServerUrl": self.url,
            "GitHubUrl": f"{self.url}/{owner}",
            "WorkFolder": work_folder,
            "Ephemeral": runner.ephemeral,
            "DisableUpdate": True,
        }
        assert set(settings) <= set(shapes.RUNNER_SETTINGS_KEYS), settings  # noqa: S101  # narrows the type; the code above guarantees it
        credentials = {
            "scheme": "OAuth",
            "data": {
                "clientId": str(uuid.uuid4()),
                "authorizationUrl": f"{self.url}/_runner/sessions",
                "requireFipsCryptography": "False",
                "secret": runner.secret,
            },
        }
        files = {
            ".runner": _b64(json.dumps(settings, indent=2).encode()),
            ".credentials": _b64(json.dumps(credentials, indent=2).encode()),
        }
        return _b64(json.dumps(files).encode())

    def _registration_token(self, req: _Request) -> _Response:
        self._runner_scope(req)
        token = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(29))
        # Registration and remove tokens live one hour (spec description).
        return _Response(201, {"token": token, "expires_at": iso(self.clock() + 3600)})

    def _scoped_runners(self, req: _Request) -> list[_Runner]:
        scope = self._runner_scope(req)
        return [r for r in sorted(self._runners.values(), key=lambda r: r.id) if r.scope == scope]

    def _list_runners(self, req: _Request) -> _Response:
        runners = self._scoped_runners(req)
        name = req.q("name")
        if name is not None:
            runners = [r for r in runners if r.name == name]
        chunk, headers = self._paginate(req, [self._runner_json(r) for r in runners])
        return _Response(200, {"total_count": len(runners), "runners": chunk}, headers)

    def _scoped_runner(self, req: _Request) -> _Runner:
        ident = self._int_param(req, "runner_id")
        for runner in self._scoped_runners(req):
            if runner.id == ident:
                return runner
        raise _Error(404, "Not Found")

    def _get_runner(self, req: _Request) -> _Response:
        return _Response(200, self._runner_json(self._scoped_runner(req)))

    def _get_runner_labels(self, req: _Request) -> _Response:
        labels = self._scoped_runner(req).labels
        return _Response(200, {"total_count": len(labels), "labels": [dict(x) for x in labels]})

    def _delete_runner(self, req: _Request) -> _Response:
        runner = self._scoped_runner(req)
        if runner.job_id is not None:
            raise _Error(422, f'Bad request - Runner "{runner.name}" is still running a job')
        self._remove_runner(runner)
        return _Response(204)

    def _remove_runner(self, runner: _Runner) -> None:
        self._runners.pop(runner.id, None)
        if runner.session is not None:
            self._sessions.pop(runner.session, None)
            runner.session = None
        self._changed.notify_all()  # wakes its long-poll, which then answers 404

    def _list_runner_groups(self, req: _Request) -> _Response:
        inst = self._org_scope(req)
        chunk, headers = self._paginate(req, [shapes.runner_group(self.url, inst.account)])
        return _Response(200, {"total_count": 1, "runner_groups": chunk}, headers)


def _jit_problems(body: Any) -> list[str]:
    """Why a generate-jitconfig body breaks GitHub's request schema (empty when it doesn't)."""
    if not isinstance(body, dict):
        return ["The body must be an object."]
    problems = []
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append('"name" is required and must be a non-empty string.')
    elif len(name) > RUNNER_NAME_MAX:
        problems.append(f'"name" must be at most {RUNNER_NAME_MAX} characters.')
    group = body.get("runner_group_id")
    if not isinstance(group, int) or isinstance(group, bool):
        problems.append('"runner_group_id" is required and must be an integer.')
    labels = body.get("labels")
    if (
        not isinstance(labels, list)
        or not 1 <= len(labels) <= 100
        or not all(isinstance(x, str) and x.strip() for x in labels)
    ):
        problems.append('"labels" must be an array of 1 to 100 non-empty strings.')
    if "work_folder" in body and not isinstance(body["work_folder"], str):
        problems.append('"work_folder" must be a string.')
    return problems
