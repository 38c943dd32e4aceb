"""What an agent reports about its runners: the reports, a restarted agent's inventory,
and the answer that says which runners the host should hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.protocol.core import (
    INT32_MAX,
    INT64_MAX,
    MAX_MESSAGE,
    MAX_OUTPUT_TAIL,
    MAX_REPORTS,
    JsonObject,
    ProtocolError,
    is_int,
    join_path,
    present,
)

# -- runner reports -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerReport:
    """What the agent saw of one runner (RUN-15..17). A `state` outside REPORT_STATES is
    the protocol's shape but the controller refuses that report alone (RUN-18)."""

    runner_id: int
    state: str | None = None
    phase: str | None = None
    exit_code: int | None = None
    message: str | None = None
    # The end of a failed runner's output, read before its workload is deleted (optional).
    output_tail: str | None = None

    @classmethod
    def from_json(cls, data: Any, path: str = "$") -> RunnerReport:
        obj = JsonObject(data, path)
        runner_id = obj.integer("runner_id", required=True, minimum=1)
        assert runner_id is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            runner_id=runner_id,
            state=obj.string("state", max_length=32),
            phase=obj.string("phase", max_length=32),
            exit_code=obj.integer("exit_code", minimum=-INT32_MAX - 1, maximum=INT32_MAX),
            message=obj.string("message", max_length=MAX_MESSAGE),
            output_tail=obj.string("output_tail", max_length=MAX_OUTPUT_TAIL),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "state": self.state,
            "phase": self.phase,
            "exit_code": self.exit_code,
            "message": self.message,
            **present(output_tail=self.output_tail),
        }


@dataclass(frozen=True)
class ReportsRequest:
    """`POST reports`: a batch of runner reports."""

    reports: tuple[RunnerReport, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> ReportsRequest:
        obj = JsonObject(data)
        return cls(reports=read_reports(obj.raw("reports", required=True), "reports"))

    def to_json(self) -> dict[str, Any]:
        return {"reports": [r.to_json() for r in self.reports]}


def read_reports(value: Any, path: str = "reports") -> tuple[RunnerReport, ...]:
    if not isinstance(value, list):
        raise ProtocolError(path, "must be an array")
    if len(value) > MAX_REPORTS:
        raise ProtocolError(path, f"must have at most {MAX_REPORTS} items")
    return tuple(RunnerReport.from_json(r, join_path(path, i)) for i, r in enumerate(value))


@dataclass(frozen=True)
class ReportsAnswer:
    """Which runners' reports were accepted, and which refused (RUN-18). Accepted is the
    acknowledgement the agent waits for before deleting a finished workload (AGENT-18)."""

    accepted: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> ReportsAnswer:
        obj = JsonObject(data)
        return cls(
            accepted=_ids(obj, "accepted"),
            refused=_ids(obj, "refused"),
        )

    def to_json(self) -> dict[str, Any]:
        return {"accepted": list(self.accepted), "refused": list(self.refused)}


@dataclass(frozen=True)
class InventoryRequest:
    """`POST inventory`: what a starting agent found on its host, sent before its first task
    poll (issue 11 item 3). `runners` are the runner ids with a workload here; `complete` is
    false when a backend could not be listed, so an absence proves nothing."""

    runners: tuple[int, ...] = ()
    complete: bool = True

    @classmethod
    def from_json(cls, data: Any) -> InventoryRequest:
        obj = JsonObject(data)
        complete = obj.boolean("complete")
        return cls(runners=_ids(obj, "runners"), complete=complete is not False)

    def to_json(self) -> dict[str, Any]:
        return {"runners": list(self.runners), "complete": self.complete}


@dataclass(frozen=True)
class ExpectedRunner:
    """A live runner the controller records on the host and no open create will start:
    the agent watches it as its own. `age` is how long ago its workload was made at the
    latest, in seconds, so the agent's minute for a new workload (AGENT-17) counts from then."""

    runner_id: int
    backend: str
    state: str
    age: float

    @classmethod
    def from_json(cls, data: Any, path: str) -> ExpectedRunner:
        obj = JsonObject(data, path)
        runner_id = obj.integer("runner_id", required=True, minimum=1)
        assert runner_id is not None  # noqa: S101  # narrows the type; the code above guarantees it
        return cls(
            runner_id=runner_id,
            backend=obj.string("backend", max_length=32) or "",
            state=obj.string("state", max_length=32) or "",
            age=obj.number("age", maximum=float(INT64_MAX)) or 0.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "runner_id": self.runner_id,
            "backend": self.backend,
            "state": self.state,
            "age": self.age,
        }


@dataclass(frozen=True)
class InventoryAnswer:
    """200 to an inventory: how many of the tasks the host had in flight were settled from
    it, and the runners the host should hold (`ExpectedRunner`)."""

    settled: int = 0
    runners: tuple[ExpectedRunner, ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> InventoryAnswer:
        obj = JsonObject(data)
        items = obj.array("runners", max_items=MAX_REPORTS) or []
        return cls(
            settled=obj.integer("settled", maximum=INT32_MAX) or 0,
            runners=tuple(
                ExpectedRunner.from_json(r, join_path(obj.at("runners"), i))
                for i, r in enumerate(items)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {"settled": self.settled, "runners": [r.to_json() for r in self.runners]}


def _ids(obj: JsonObject, key: str) -> tuple[int, ...]:
    items = obj.array(key, max_items=MAX_REPORTS) or []
    out = []
    for i, value in enumerate(items):
        if not is_int(value) or not 1 <= value <= INT64_MAX:
            raise ProtocolError(join_path(obj.at(key), i), "must be a runner id")
        out.append(value)
    return tuple(out)
