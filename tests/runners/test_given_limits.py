"""A runner is given a slot share only where its host's engine said it can apply it (BACK-03,
BACK-05): the agent says so at join and heartbeat, the host row keeps it, and the reconcile
pass gives (and writes on the row) only what binds."""

from __future__ import annotations

import pytest

from fleet import actions as fleet_actions
from fleet import protocol
from fleet.models import AgentTask
from runners import reconcile
from runners.github.programs import FAKE_RUNNER
from runners.models import Installation, Job, Pool, Runner
from tests.runners.test_reconcile import T0, fake_gh  # noqa: F401  # the fixture

FACTS = {
    "platform": "linux/x64",
    "backends": ["docker", "process"],
    "capacity": 4,
    "cpus": 8.5,
    "memory_mb": 16000,
}


def test_back03_the_limits_each_backend_can_apply_travel_with_the_hosts_facts():
    """BACK-03: a join or heartbeat names, per backend, the limits its engine can apply;
    anything but cpus and memory is refused naming the field."""
    body = {**FACTS, "backend_limits": {"docker": ["memory", "cpus"], "process": []}}
    facts = protocol.HeartbeatRequest.from_json(body).facts
    assert facts.backend_limits == {"docker": ("cpus", "memory"), "process": ()}
    assert facts.to_json()["backend_limits"] == {"docker": ["cpus", "memory"], "process": []}
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.HeartbeatRequest.from_json({"backend_limits": {"docker": ["swap"]}})
    assert caught.value.path == "backend_limits.docker[0]"
    assert protocol.HeartbeatRequest.from_json(FACTS).facts.backend_limits is None


@pytest.fixture
def fleet(registry_defaults, fake_gh):  # noqa: F811  # the fixture imported above
    inst_id = fake_gh.add_installation(
        account="acme", account_type="Organization", repositories=["acme/app"]
    )
    installation = Installation.objects.create(
        github_id=inst_id, account="acme", kind="org", repositories=["acme/app"]
    )
    _, secret = fleet_actions.create_join_token(now=T0, actor="user:test")
    # The engine under docker applies memory limits but not CPU ones (no CFS quota).
    host, _token = fleet_actions.join_host(
        join_token=secret,
        name="zoomies-host-1",
        facts={**FACTS, "backend_limits": {"docker": ["memory"], "process": []}},
        now=T0,
    )
    return installation, host


def runner_for(installation: Installation, made: Pool, github_id: int) -> Runner:
    Job.objects.create(
        github_id=github_id, repository="acme/app", labels=["self-hosted", made.name],
        status="queued", installation=installation, created_at=T0, updated_at=T0,
    )  # fmt: skip
    reconcile.reconcile_now(now_fn=lambda: T0)
    return Runner.objects.filter(pool=made).latest("pk")


def pool(installation: Installation, name: str, **fields) -> Pool:
    return Pool.objects.create(
        name=name, installation=installation, labels=[name], platform="linux/x64",
        max_runners=5, **fields,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_back05_a_share_is_given_only_where_the_hosts_engine_can_apply_it(fleet):
    """BACK-05: an unset field gets the slot share only on a container backend whose engine
    said it can apply that limit, never on the process backend; a figure the pool typed is
    given as typed (BACK-04); the row and the create task say the same (BACK-09)."""
    installation, host = fleet
    assert host.backend_limits == {"docker": ["memory"], "process": []}
    bare = pool(installation, "zoomies-bare", backend="docker")
    typed = pool(installation, "zoomies-typed", backend="docker", cpus=1.5)
    process = pool(installation, "zoomies-proc", backend="process", image=FAKE_RUNNER)

    # Allocatable: 8.5 CPUs less the 0.5 reserve, 16000 MB; four slots.
    runner = runner_for(installation, bare, 1)
    assert (runner.cpus, runner.cpus_from) == (None, "")
    assert (runner.memory_mb, runner.memory_from) == (4000, "host")
    payload = AgentTask.objects.get(runner=runner, kind="create_runner").payload
    assert (payload["cpus"], payload["memory_mb"]) == (None, 4000)

    runner = runner_for(installation, typed, 2)
    assert (runner.cpus, runner.cpus_from) == (1.5, "pool")
    assert (runner.memory_mb, runner.memory_from) == (4000, "host")

    runner = runner_for(installation, process, 3)
    assert (runner.cpus, runner.memory_mb, runner.cpus_from, runner.memory_from) == (
        None, None, "", "",
    )  # fmt: skip

    # The engine now says it applies CPU limits too: the next runner gets both shares.
    fleet_actions.record_heartbeat(
        host=host, facts={**FACTS, "backend_limits": {"docker": ["cpus", "memory"]}}, now=T0
    )
    host.refresh_from_db()
    assert host.backend_limits == {"docker": ["cpus", "memory"]}
    runner = runner_for(installation, bare, 4)
    assert (runner.cpus, runner.cpus_from, runner.memory_mb) == (2.0, "host", 4000)
