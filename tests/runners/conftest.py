"""Fixtures for the webhook, poller and reap tests: settings, a fake GitHub, rows.

Nothing here is autouse: a test module asks for `github_settings` (isolated registry) and
for the fake GitHub explicitly, so other tests under tests/runners are left as they are.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from itertools import count

import httpx
import pytest
from django.utils import timezone

from fleet.models import Host
from runners.github.client import GitHubApp
from runners.github.fake.server import FakeGitHub
from runners.models import Installation, Pool, Runner
from zoomies_site.core import registry
from zoomies_site.core.metrics import RECONCILE_WAKES

WEBHOOK_SECRET = "It's a Secret to Everybody"
_names = count(1)


class GitHubSettings:
    """Set registry values for a test through the environment layer; undone afterwards."""

    def __init__(self, monkeypatch):
        self._monkeypatch = monkeypatch

    def set(self, **values) -> None:
        """`set(webhook_secrets="a,b", poll_interval="60s")`: keys are under `github.`."""
        for key, value in values.items():
            name = registry.env_name(f"github.{key}")
            if value is None:
                self._monkeypatch.delenv(name, raising=False)
            else:
                self._monkeypatch.setenv(name, str(value))
        registry.reload()

    def setenv(self, name: str, value: str | None) -> None:
        if value is None:
            self._monkeypatch.delenv(name, raising=False)
        else:
            self._monkeypatch.setenv(name, value)
        registry.reload()


@pytest.fixture
def github_settings(registry_defaults, monkeypatch):
    """The registry's defaults (the root `registry_defaults`), with a `github.*` setter."""
    return GitHubSettings(monkeypatch)


class FakeClock:
    """The one clock a test shares between the fake GitHub, the client and `now`."""

    def __init__(self, start: float | None = None):
        self.t = float(start if start is not None else int(time.time()))

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


@pytest.fixture
def github_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def silent_github(github_clock):
    """A fake GitHub whose webhooks reach nobody (webhook_url=None): polling alone."""
    gh = FakeGitHub(webhook_url=None, webhook_secret=None, clock=github_clock).start()
    yield gh
    gh.stop()


@pytest.fixture
def github_app(silent_github, github_clock):
    """A GitHubApp talking to `silent_github`, on the same clock."""
    app = GitHubApp(
        silent_github.app_id, silent_github.private_key_pem, silent_github.url, clock=github_clock
    )
    yield app
    app.close()


def install(
    fake: FakeGitHub,
    account: str,
    repos: tuple[str, ...] = (),
    *,
    kind: str = Installation.Kind.ORG,
    list_repos: bool = True,
) -> Installation:
    """Install the App on `account` at the fake and write the matching Installation row."""
    account_type = "Organization" if kind == Installation.Kind.ORG else "User"
    github_id = fake.add_installation(account, account_type, [f"{account}/{r}" for r in repos])
    return Installation.objects.create(
        github_id=github_id,
        account=account,
        kind=kind,
        repositories=[f"{account}/{r}" for r in repos] if list_repos else [],
    )


def make_runner(
    *,
    name: str | None = None,
    state: str = "idle",
    host: Host | None = None,
    installation: Installation | None = None,
    github_runner_id: int | None = None,
    ephemeral: bool = True,
) -> Runner:
    """A runner row as the reconcile pass would have left it (state set for the test)."""
    now = timezone.now()
    pool, _ = Pool.objects.get_or_create(
        name="zoomies-linux-x64", defaults={"labels": ["self-hosted", "linux"]}
    )
    return Runner.objects.create(
        name=name or f"zoomies-linux-x64-{next(_names)}",
        pool=pool,
        host=host,
        installation=installation,
        state=state,
        created_at=now - timedelta(minutes=5),
        state_changed_at=now - timedelta(minutes=1),
        github_runner_id=github_runner_id,
        ephemeral=ephemeral,
    )


def make_host(name: str = "zoomies-host-1") -> Host:
    host, _ = Host.objects.get_or_create(name=name, defaults={"capacity": 4})
    return host


def register(app: GitHubApp, installation: Installation, name: str, *, repo: str | None = None):
    """A registration at the fake, made the way the controller makes one (a JIT config)."""
    scope = {"repo": repo} if repo else {"org": installation.account}
    return app.for_installation(installation.github_id).generate_jitconfig(
        name=name, labels=["self-hosted", "linux"], **scope
    )


def go_online(fake: FakeGitHub, jit) -> str:
    """Consume a JIT config the way the fake runner does: open its one session.

    An online runner is handed the oldest queued job it matches, so a job queued after
    this (or before it) makes the registration busy for the job's whole duration.
    """
    files = json.loads(base64.b64decode(jit.encoded_jit_config))
    creds = json.loads(base64.b64decode(files[".credentials"]))
    answer = httpx.post(
        f"{fake.url}/_runner/sessions",
        json={
            "runner_id": jit.runner_id,
            "secret": creds["data"]["secret"],
            "os": "linux",
            "version": "2.329.0",
        },
        timeout=5,
    )
    answer.raise_for_status()
    return answer.json()["session"]


def finish_job(fake: FakeGitHub, session: str, job_id: int, conclusion: str = "success") -> None:
    """The runner holding `session` reports its job done, as the fake runner would."""
    answer = httpx.post(
        f"{fake.url}/_runner/jobs/{job_id}/complete",
        json={"conclusion": conclusion},
        headers={"Authorization": f"Bearer {session}"},
        timeout=5,
    )
    answer.raise_for_status()


def wakes_asked() -> float:
    """How many times the reconcile pass has been asked to wake (its Prometheus counter)."""
    return RECONCILE_WAKES.labels("asked")._value.get()


def acme_installation():
    """The installation the example App deliveries name (id 77, `job_payload`): configured,
    as an App delivery's installation must be for its job to be ours (issue 29 item 2)."""
    from runners.models import Installation  # noqa: PLC0415  # once Django is set up

    return Installation.objects.get_or_create(
        github_id=77, defaults={"account": "acme", "kind": "org", "repositories": ["acme/app"]}
    )[0]


def uses_a_database(request) -> bool:
    names = set(request.fixturenames)
    return request.node.get_closest_marker("django_db") is not None or bool(
        names & {"db", "transactional_db", "live_server"}
    )


@pytest.fixture
def acme(db):
    """The example App deliveries' installation (id 77, account acme), configured."""
    return acme_installation()
