"""The fake GitHub's self-hosted runner routes (`.../actions/runners`: generate-jitconfig,
tokens, list, get, delete, groups) and the JIT configuration it issues."""

from __future__ import annotations

import json
import secrets
import string
import urllib.parse
import uuid
from typing import Any

from runners.github.fake import shapes
from runners.github.fake.app_api import int_param, org_scope, paginate, runner_scope
from runners.github.fake.core import RUNNER_NAME_MAX, HttpError, Request, Response, b64
from runners.github.fake.shapes import DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME, iso
from runners.github.fake.state import FakeState, Runner


def runner_online(state: FakeState, runner: Runner) -> bool:
    if runner.session is None:
        return False
    if runner.job_id is not None or runner.polling > 0:
        return True
    seen = runner.last_seen
    return seen is not None and state.clock() - seen <= state.offline_after


def runner_json(state: FakeState, runner: Runner) -> dict[str, Any]:
    return {
        "id": runner.id,
        "name": runner.name,
        "os": runner.os,
        "status": "online" if runner_online(state, runner) else "offline",
        "busy": runner.job_id is not None,
        "ephemeral": runner.ephemeral,
        "runner_group_id": DEFAULT_GROUP_ID,
        "version": runner.version,
        "labels": [dict(label) for label in runner.labels],
    }


def generate_jitconfig(state: FakeState, req: Request) -> Response:
    scope = runner_scope(state, req)
    body = req.json()
    problems = _jit_problems(body)
    if problems:
        raise HttpError(422, "Invalid request.\n\n" + " ".join(problems), errors=problems)
    if body["runner_group_id"] != DEFAULT_GROUP_ID:
        raise HttpError(404, "Not Found")
    name = body["name"]
    if any(r.scope == scope and r.name.lower() == name.lower() for r in state.runners.values()):
        raise HttpError(409, f"Already exists - A runner with the name {name} already exists.")

    def label_id(label: str) -> int:
        return state.label_ids.setdefault(label.lower(), next(state.ids["label"]))

    runner = Runner(
        id=next(state.ids["runner"]),
        name=name,
        installation_id=req.installation_id or 0,
        scope=scope,
        labels=shapes.runner_labels(body["labels"], label_id),
        secret=secrets.token_urlsafe(24),
    )
    state.runners[runner.id] = runner
    state.changed.notify_all()
    encoded = _encode_jit_config(state, runner, body.get("work_folder") or "_work")
    response = Response(201, {"runner": runner_json(state, runner), "encoded_jit_config": encoded})
    state.observer.jit_minted(runner)
    return response


def _encode_jit_config(state: FakeState, runner: Runner, work_folder: str) -> str:
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
        "ServerUrl": state.url,
        "GitHubUrl": f"{state.url}/{owner}",
        "WorkFolder": work_folder,
        "Ephemeral": runner.ephemeral,
        "DisableUpdate": True,
    }
    assert set(settings) <= set(shapes.RUNNER_SETTINGS_KEYS), settings  # noqa: S101  # narrows the type; the code above guarantees it
    credentials = {
        "scheme": "OAuth",
        "data": {
            "clientId": str(uuid.uuid4()),
            "authorizationUrl": f"{state.url}/_runner/sessions",
            "requireFipsCryptography": "False",
            "secret": runner.secret,
        },
    }
    files = {
        ".runner": b64(json.dumps(settings, indent=2).encode()),
        ".credentials": b64(json.dumps(credentials, indent=2).encode()),
    }
    return b64(json.dumps(files).encode())


def registration_token(state: FakeState, req: Request) -> Response:
    scope = runner_scope(state, req)
    token = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(29))
    # Registration and remove tokens live one hour (spec description); config.sh spends one
    # at /_runner/register (runner_protocol.py), for this scope only.
    expires = state.clock() + 3600
    state.registration_tokens[token] = (scope, expires, req.installation_id or 0)
    return Response(201, {"token": token, "expires_at": iso(expires)})


def register_runner(state: FakeState, body: dict[str, Any]) -> str:
    """What config.sh does with a registration token (SCHED-15), the fake's way: the web URL
    names where the runner registers (github.com/ORG or /OWNER/REPO, never an API path),
    which must be the token's scope; the runner is made non-ephemeral unless asked, and its
    settings come back as a JIT configuration's would (the fake runner reads either)."""
    token = str(body.get("token") or "")
    held = state.registration_tokens.get(token)
    if held is None or held[1] <= state.clock():
        raise HttpError(404, "Not Found: the registration token is unknown or expired")
    scope, _expires, installation_id = held
    path = urllib.parse.urlsplit(str(body.get("url") or "")).path.strip("/").lower()
    parts = path.split("/")
    asked = ("org", parts[0]) if len(parts) == 1 else ("repo", path) if len(parts) == 2 else None
    if asked != scope:
        raise HttpError(400, f"The URL {body.get('url')!r} is not where this token registers")
    name = str(body.get("name") or "")
    labels = body.get("labels")
    if not name or not isinstance(labels, list):
        raise HttpError(422, "Invalid request: name and labels are required")
    if any(r.scope == scope and r.name.lower() == name.lower() for r in state.runners.values()):
        raise HttpError(409, f"Already exists - A runner with the name {name} already exists.")

    def label_id(label: str) -> int:
        return state.label_ids.setdefault(label.lower(), next(state.ids["label"]))

    runner = Runner(
        id=next(state.ids["runner"]), name=name, installation_id=installation_id, scope=scope,
        # config.sh --no-default-labels --labels: exactly those, as a JIT runner gets.
        labels=shapes.runner_labels([str(label) for label in labels], label_id),
        secret=secrets.token_urlsafe(24), ephemeral=bool(body.get("ephemeral", False)),
    )  # fmt: skip
    state.runners[runner.id] = runner
    state.changed.notify_all()
    return _encode_jit_config(state, runner, "_work")


def _scoped_runners(state: FakeState, req: Request) -> list[Runner]:
    scope = runner_scope(state, req)
    return [r for r in sorted(state.runners.values(), key=lambda r: r.id) if r.scope == scope]


def list_runners(state: FakeState, req: Request) -> Response:
    runners = _scoped_runners(state, req)
    name = req.q("name")
    if name is not None:
        runners = [r for r in runners if r.name == name]
    chunk, headers = paginate(state, req, [runner_json(state, r) for r in runners])
    return Response(200, {"total_count": len(runners), "runners": chunk}, headers)


def _scoped_runner(state: FakeState, req: Request) -> Runner:
    ident = int_param(req, "runner_id")
    for runner in _scoped_runners(state, req):
        if runner.id == ident:
            return runner
    raise HttpError(404, "Not Found")


def get_runner(state: FakeState, req: Request) -> Response:
    return Response(200, runner_json(state, _scoped_runner(state, req)))


def get_runner_labels(state: FakeState, req: Request) -> Response:
    labels = _scoped_runner(state, req).labels
    return Response(200, {"total_count": len(labels), "labels": [dict(x) for x in labels]})


def delete_runner(state: FakeState, req: Request) -> Response:
    runner = _scoped_runner(state, req)
    if runner.job_id is not None:
        raise HttpError(422, f'Bad request - Runner "{runner.name}" is still running a job')
    remove_runner(state, runner)
    return Response(204)


def remove_runner(state: FakeState, runner: Runner) -> None:
    state.runners.pop(runner.id, None)
    if runner.session is not None:
        state.sessions.pop(runner.session, None)
        runner.session = None
    state.changed.notify_all()  # wakes its long-poll, which then answers 404


def list_runner_groups(state: FakeState, req: Request) -> Response:
    inst = org_scope(state, req)
    chunk, headers = paginate(state, req, [shapes.runner_group(state.url, inst.account)])
    return Response(200, {"total_count": 1, "runner_groups": chunk}, headers)


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
