"""Runner output relayed on request (LOG-01..05): the two log task payloads and the
chunks the agent posts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fleet.protocol.core import (
    MAX_MESSAGE,
    JsonObject,
    ProtocolError,
    present,
)

# -- runner logs (LOG-01..05) -------------------------------------------------------------

MAX_LOG_CHUNK = 64 * 1024  # characters of output in one chunk the agent posts
STREAM_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _stream_id(obj: JsonObject) -> str:
    value = obj.string("stream_id", required=True, max_length=64)
    if value is None or not STREAM_ID.match(value):
        raise ProtocolError(obj.at("stream_id"), "must be 16-64 letters, digits, - or _")
    return value


@dataclass(frozen=True)
class StreamLogsPayload:
    """`stream_logs`: follow the runner's output from its start and POST it, chunk by chunk,
    to `logs/{stream_id}` until it ends or the stream is cancelled (LOG-01, LOG-02)."""

    runner_id: int
    stream_id: str

    @classmethod
    def from_json(cls, data: Any, *, runner_id: int) -> StreamLogsPayload:
        return cls(runner_id=runner_id, stream_id=_stream_id(JsonObject(data, "payload")))

    def to_json(self) -> dict[str, Any]:
        return {"runner_id": self.runner_id, "stream_id": self.stream_id}


@dataclass(frozen=True)
class CancelLogsPayload:
    """`cancel_logs`: the stream's last viewer left; stop reading (LOG-04)."""

    runner_id: int
    stream_id: str

    @classmethod
    def from_json(cls, data: Any, *, runner_id: int) -> CancelLogsPayload:
        return cls(runner_id=runner_id, stream_id=_stream_id(JsonObject(data, "payload")))

    def to_json(self) -> dict[str, Any]:
        return {"runner_id": self.runner_id, "stream_id": self.stream_id}


@dataclass(frozen=True)
class LogChunk:
    """`POST logs/{stream_id}`: the next piece of the runner's output as text (LOG-02).
    `eof` ends the stream: the output ended, or the agent could not read it (`error`)."""

    data: str = ""
    eof: bool = False
    error: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> LogChunk:
        obj = JsonObject(data)
        return cls(
            data=obj.string("data", max_length=MAX_LOG_CHUNK) or "",
            eof=bool(obj.boolean("eof")),
            error=obj.string("error", max_length=MAX_MESSAGE),
        )

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data, "eof": self.eof, **present(error=self.error)}


@dataclass(frozen=True)
class LogChunkAnswer:
    """Whether anyone still watches: `open` false tells the agent to stop reading."""

    open: bool = True

    @classmethod
    def from_json(cls, data: Any) -> LogChunkAnswer:
        value = JsonObject(data).boolean("open")
        return cls(open=True if value is None else value)

    def to_json(self) -> dict[str, Any]:
        return {"open": self.open}
