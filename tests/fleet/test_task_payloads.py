"""Issue 22 item 3: every agent task the controller enqueues is one the agent reads, field by
field, through the message's one definition in fleet.protocol. The controller writes
create_runner through `protocol.CreateRunnerPayload` (it was a dict literal, and the agent's
hand parser was the only place `dind` was known), and this walk fails on any key the agent's
definition does not have, as it goes over the wire (the sealed env opened)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from fleet import protocol
from fleet.agent.backends.base import RunnerSpec
from fleet.api import task_wire
from fleet.models import AgentTask, Host
from fleet.states import OPEN_TASK_STATES, TaskKind
from runners import actions
from runners.actions import pools as pool_actions
from runners.actions.lifecycle import NewRunner
from runners.models import Installation, Pool, Runner

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
# Each kind's definition on the agent's side, and how the agent reads it.
DEFINITIONS = {
    TaskKind.CREATE_RUNNER: protocol.CreateRunnerPayload,
    TaskKind.STOP_RUNNER: protocol.StopRunnerPayload,
    TaskKind.REMOVE_RUNNER: protocol.RemoveRunnerPayload,
    TaskKind.IMAGE_PREWARM: protocol.ImagePrewarmPayload,
}


def rent_runner(pool: Pool, host: Host, **given) -> Runner:
    installation, _ = Installation.objects.get_or_create(github_id=1, account="acme")
    values = dict(
        name=f"{pool.name}-{Runner.objects.count() + 1}-abc", pool=pool, host_id=host.pk,
        installation=installation, image="ghcr.io/acme/runner:1", cpus=2.0, memory_mb=2048,
        github_runner_id=7, env={"ACTIONS_RUNNER_INPUT_JITCONFIG": "c2VjcmV0"}, command=None,
        reason="a queued job",
    )  # fmt: skip
    values.update(given)
    return actions.create_runner(NewRunner(**values), now=T0, actor="test")


def test_every_payload_the_controller_enqueues_parses_strictly_on_the_agent():
    host = Host.objects.create(name="zoomies-h1", capacity=4, backends=["docker", "process"])
    dind = pool_actions.create_pool(
        {"name": "zoomies-dind", "labels": ["dind"], "backend": "docker", "dind": True},
        actor="t", now=T0,
    )  # fmt: skip
    process = pool_actions.create_pool(
        {"name": "zoomies-proc", "labels": ["proc"], "backend": "process"}, actor="t", now=T0
    )
    rent_runner(dind, host)
    rent_runner(process, host, image="actions-runner", command=["/opt/actions-runner/run.sh"])
    ended = rent_runner(dind, host)
    # Its create is cancelled (never delivered); a stop and a remove are enqueued.
    Runner.objects.filter(pk=ended.pk).update(state="idle")
    actions.drain_runner(ended, now=T0, actor="test", reason="scale down")
    actions.fail_runner(ended, now=T0, actor="test", message="its host was lost")
    pool_actions.prewarm_pool(dind, actor="t", now=T0)

    seen = set()
    for task in AgentTask.objects.filter(state__in=OPEN_TASK_STATES).order_by("pk"):
        wire = protocol.Task.from_json(task_wire(task))
        definition = DEFINITIONS[wire.kind]
        known = {f.name for f in dataclasses.fields(definition)}
        assert set(wire.payload) <= known, (wire.kind, set(wire.payload) - known)
        seen.add(wire.kind)
        if wire.kind == TaskKind.CREATE_RUNNER:
            read = protocol.CreateRunnerPayload.from_json(wire.payload, strict=True)
            assert read.to_json() == dict(wire.payload)  # nothing lost or changed
            spec = RunnerSpec.from_payload(dict(wire.payload), runner_id=wire.runner_id)
            assert spec.dind == (read.pool == "zoomies-dind")
            assert spec.env == {"ACTIONS_RUNNER_INPUT_JITCONFIG": "c2VjcmV0"}
        elif wire.kind == TaskKind.STOP_RUNNER:
            protocol.StopRunnerPayload.from_json(wire.payload, runner_id=wire.runner_id)
        elif wire.kind == TaskKind.IMAGE_PREWARM:
            assert protocol.ImagePrewarmPayload.from_json(wire.payload).dind
    assert seen == set(DEFINITIONS)


def test_a_create_with_a_field_of_the_wrong_type_is_refused_by_name():
    good = protocol.CreateRunnerPayload(
        runner_id=3, runner_name="zoomies-a-3-x", pool="zoomies-a", backend="docker"
    ).to_json()
    for field, bad in (("dind", "yes"), ("command", "run.sh"), ("env", {"A": 1}),
                       ("cpus_from", "someone"), ("memory_mb", -1)):  # fmt: skip
        with pytest.raises(protocol.ProtocolError, match=f"payload.{field}"):
            protocol.CreateRunnerPayload.from_json({**good, field: bad})
    with pytest.raises(protocol.ProtocolError, match="not a field"):
        protocol.CreateRunnerPayload.from_json({**good, "sidecar": True}, strict=True)
    assert protocol.CreateRunnerPayload.from_json({**good, "sidecar": True}).pool == "zoomies-a"
