"""fleet/protocol/: the agent protocol's one schema, read strictly and written back whole.

Pure: no database, no HTTP. The API-level behaviour (clean 400s on the wire) is in
test_agent_api_input.py.
"""

from __future__ import annotations

import json

import pytest

from fleet import protocol
from fleet.protocol import ProtocolError

FACTS = {
    "platform": "linux/x64",
    "backends": ["process"],
    "capacity": 4,
    "cpus": 8.0,
    "memory_mb": 16000,
    "labels": {"zone": "a", "gpu": True, "slots": 2},
    "version": "0.1.0",
    "disk_total_mb": 100_000,
    "disk_free_mb": 50_000,
}


def refused(shape, body) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        shape(protocol.loads(json.dumps(body)) if not isinstance(body, bytes) else body)
    return caught.value


def test_arch07_every_shape_reads_back_what_it_writes():
    """ARCH-07: the one schema both sides use; to_json then from_json is the identity."""
    join = protocol.JoinRequest.from_json({**FACTS, "name": "h1", "join_token": "zjt_x"})
    assert protocol.JoinRequest.from_json(join.to_json()) == join
    assert join.facts.to_json() == FACTS
    beat = protocol.HeartbeatRequest.from_json({**FACTS, "usage": {"load1": 0.5}})
    assert protocol.HeartbeatRequest.from_json(beat.to_json()) == beat
    tunables = protocol.AgentTunables(heartbeat_interval=20, orphan_grace=300)
    for shape, value in [
        (protocol.JoinAnswer, protocol.JoinAnswer(7, "zat_x", tunables)),
        (protocol.JoinAnswer, protocol.JoinAnswer(7, "zat_x", tunables, 600.0)),
        (protocol.TokenAnswer, protocol.TokenAnswer("zat_y", 600.0)),
        (protocol.HeartbeatAnswer, protocol.HeartbeatAnswer(True, tunables)),
        (protocol.TaskResult, protocol.TaskResult(False, "no room", 2)),
        (protocol.ReportsAnswer, protocol.ReportsAnswer((1, 2), (3,))),
        (
            protocol.ReportsRequest,
            protocol.ReportsRequest((protocol.RunnerReport(5, "failed", "exited", -9, "killed"),)),
        ),
        (
            protocol.TaskList,
            protocol.TaskList(
                (protocol.Task(1, "stop_runner", 1, 5, {"runner_id": 5, "grace": 3}),)
            ),
        ),
        (protocol.ErrorAnswer, protocol.ErrorAnswer("bad", "reports[0].runner_id")),
    ]:
        assert shape.from_json(protocol.loads(protocol.dumps(value.to_json()))) == value


def test_a_join_request_may_carry_a_claim_code_instead_of_a_join_token():
    join = protocol.JoinRequest.from_json({"name": "vm-1", "claim_code": "zcc_abc"})
    assert (join.join_token, join.claim_code) == (None, "zcc_abc")
    assert join.to_json() == {"name": "vm-1", "claim_code": "zcc_abc"}


@pytest.mark.parametrize(
    ("shape", "body", "path"),
    [
        (protocol.JoinRequest.from_json, {"name": "bad name/.."}, "name"),
        (protocol.JoinRequest.from_json, {}, "name"),
        (protocol.JoinRequest.from_json, {"name": "h", "capacity": "4"}, "capacity"),
        (protocol.JoinRequest.from_json, {"name": "h", "join_token": 5}, "join_token"),
        (protocol.HeartbeatRequest.from_json, {"capacity": 2**63}, "capacity"),
        (protocol.HeartbeatRequest.from_json, {"memory_mb": 2**31}, "memory_mb"),
        (protocol.HeartbeatRequest.from_json, {"cpus": 1e300}, "cpus"),
        (protocol.HeartbeatRequest.from_json, {"cpus": True}, "cpus"),
        (protocol.HeartbeatRequest.from_json, {"disk_free_mb": -1}, "disk_free_mb"),
        (protocol.HeartbeatRequest.from_json, {"backends": "process"}, "backends"),
        (protocol.HeartbeatRequest.from_json, {"backends": ["ok", 7]}, "backends[1]"),
        (protocol.HeartbeatRequest.from_json, {"labels": ["a"]}, "labels"),
        (protocol.HeartbeatRequest.from_json, {"labels": {"a": {"b": 1}}}, "labels.a"),
        (protocol.HeartbeatRequest.from_json, {"labels": {"a": 2**64}}, "labels.a"),
        (protocol.HeartbeatRequest.from_json, {"platform": "x\u0000"}, "platform"),
        (protocol.HeartbeatRequest.from_json, {"version": "\ud800"}, "version"),
        (protocol.TaskResult.from_json, {}, "ok"),
        (protocol.TaskResult.from_json, {"ok": 1}, "ok"),
        (protocol.TaskResult.from_json, {"ok": True, "attempt": 2**63}, "attempt"),
        (protocol.TaskResult.from_json, {"ok": False, "error": ["x"]}, "error"),
        (protocol.ReportsRequest.from_json, {}, "reports"),
        (protocol.ReportsRequest.from_json, {"reports": {}}, "reports"),
        (protocol.ReportsRequest.from_json, {"reports": [5]}, "reports[0]"),
        (
            protocol.ReportsRequest.from_json,
            {"reports": [{"runner_id": 1}, {}]},
            "reports[1].runner_id",
        ),
        (
            protocol.ReportsRequest.from_json,
            {"reports": [{"runner_id": 2**63}]},
            "reports[0].runner_id",
        ),
        (
            protocol.ReportsRequest.from_json,
            {"reports": [{"runner_id": 1, "exit_code": 2**40}]},
            "reports[0].exit_code",
        ),
        (
            protocol.ReportsRequest.from_json,
            {"reports": [{"runner_id": 1, "state": 3}]},
            "reports[0].state",
        ),
        (protocol.JoinAnswer.from_json, {"agent_token": "zat_x"}, "host_id"),
        (
            protocol.JoinAnswer.from_json,
            {"host_id": 1, "agent_token": "zat_x", "agent_token_expires_in": 0},
            "agent_token_expires_in",
        ),
        (protocol.TokenAnswer.from_json, {"agent_token": "zat_x"}, "agent_token_expires_in"),
        (protocol.TokenAnswer.from_json, {"agent_token_expires_in": 600}, "agent_token"),
        (protocol.HeartbeatAnswer.from_json, {"cordoned": False}, "heartbeat_interval"),
        (protocol.TaskList.from_json, {"tasks": [{"id": 1}]}, "tasks[0].kind"),
    ],
)
def test_arch07_a_body_out_of_shape_names_the_field_and_the_reason(shape, body, path):
    error = refused(shape, body)
    assert error.path == path
    assert error.reason and str(error) == f"{path}: {error.reason}"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"cpus": NaN}', "NaN is not a JSON number"),
        (b'{"cpus": Infinity}', "Infinity is not a JSON number"),
        (b'{"cpus": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"cpus": 1e400}', "out of range"),
        (b"[" * 1000 + b"]" * 1000, "nests deeper"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests deeper"),
        (b"{" * 5000, "nests deeper"),
        (b'{"capacity": 1' + b"0" * 5000 + b"}", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"a": ', "not valid JSON"),
    ],
)
def test_loads_refuses_what_the_database_or_the_parser_would_choke_on(body, reason):
    """Issue 8 item 3: NaN, infinities, huge numbers and deep nesting are shape errors."""
    with pytest.raises(ProtocolError, match=reason) as caught:
        protocol.loads(body)
    assert caught.value.path == "$"


def test_loads_accepts_brackets_inside_strings_and_an_empty_body():
    assert protocol.loads(json.dumps({"message": "[" * 5000 + '\\"{'})) == {
        "message": "[" * 5000 + '\\"{'
    }
    assert protocol.loads(b"") == {}
    assert protocol.nesting_depth('{"a": [[1]], "b": "]]]]"}') == 3


def test_host11_a_bad_usage_sample_is_dropped_with_a_reason_not_refused():
    for usage in ({"cpu": -1}, {"cpu": "x"}, [], {}, {"k" * 65: 1}, {str(i): 1 for i in range(40)}):
        beat = protocol.HeartbeatRequest.from_json({"capacity": 2, "usage": usage})
        assert beat.usage is None and beat.usage_problem
        assert beat.facts.capacity == 2


def test_the_agent_reads_odd_timings_leniently_into_their_bounds():
    """A controller's odd setting never stops an agent: clamped, or the default."""
    answer = protocol.HeartbeatAnswer.from_json(
        {"heartbeat_interval": 0, "long_poll_wait": 90, "orphan_grace": "soon"}
    )
    assert answer.tunables.heartbeat_interval == 1.0
    assert answer.tunables.long_poll_wait == 30.0
    assert answer.tunables.orphan_grace == protocol.AgentTunables().orphan_grace


def test_a_stop_payload_falls_back_to_its_defaults_for_nonsense():
    stop = protocol.StopRunnerPayload.from_json({"grace": "x", "timeout": 1e9}, runner_id=3)
    assert (stop.grace, stop.timeout) == (0.0, 30.0)
    stop = protocol.StopRunnerPayload.from_json({"grace": 300, "timeout": 60}, runner_id=3)
    assert (stop.grace, stop.timeout) == (300.0, 60.0)


def test_parse_wait_caps_at_thirty_seconds_and_refuses_nonsense():
    assert protocol.parse_wait(None, 25.0) == 25.0
    assert protocol.parse_wait("99", 25.0) == 30.0
    for raw in ("nan", "inf", "-1", "soon"):
        with pytest.raises(ProtocolError) as caught:
            protocol.parse_wait(raw, 25.0)
        assert caught.value.path == "wait"
