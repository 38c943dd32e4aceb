"""The agent protocol's ground: its constants, `ProtocolError`, the JSON reader and writer
(bounded, no NaN, no deep nesting), and `JsonObject`, which reads one object's fields and
names each field's path in an error. Every message module builds on it."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

VERSION = 1
API_PREFIX = "/api/v1/agent"
MAX_BODY_BYTES = 1024 * 1024  # a report batch for a few hundred runners fits many times over
MAX_WAIT_SECONDS = 30  # the cap on a task long-poll's `wait`

INT32_MAX = 2**31 - 1  # an IntegerField on PostgreSQL
INT64_MAX = 2**63 - 1  # a BigAutoField, and SQLite's integer
MAX_CPUS = 1_000_000.0
MAX_MEMORY_MB = INT32_MAX  # a machine or a loan, in MB: an IntegerField
MAX_SECONDS = 86_400.0  # a day: no tunable or task duration is longer
MAX_NESTING = 64  # far more than any shape here has; a deeper body is refused before parsing

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_BACKENDS = 16
MAX_LABELS = 64
MAX_USAGE_KEYS = 32
MAX_MESSAGE = 4096  # a task error or a report's message
MAX_OUTPUT_TAIL = 64 * 1024  # the end of a failed runner's output, in characters
MAX_REPORTS = 10_000
TASK_KINDS = (
    "create_runner",
    "stop_runner",
    "remove_runner",
    "stream_logs",
    "cancel_logs",
    "image_prewarm",
)
REPORT_STATES = ("registering", "removed", "failed")
# BACK-03, BACK-05: the resource limits a backend's engine says it can apply.
LIMIT_KINDS = ("cpus", "memory")
REPORT_PHASES = ("running", "exited", "missing")


class ProtocolError(ValueError):
    """A body that is not the protocol's shape: `path` is the field (`reports[3].runner_id`,
    `$` for the body itself) and `reason` what is wrong with it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# -- JSON ---------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ProtocolError("$", f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("$", f"the number {text[:40]} is out of range")
    return value


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in a JSON text, counted without parsing it (so a
    body nested a million levels deep costs one linear scan, not a RecursionError)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads(body: bytes | str) -> dict[str, Any]:
    """A request or answer body: a JSON object, or ProtocolError (never RecursionError,
    never NaN or an infinity, never a number Python would refuse to print)."""
    if isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("$", "the body is not UTF-8") from None
    else:
        text = body
    if not text.strip():
        return {}
    # The scan only runs when there are enough brackets for the depth to matter.
    if text.count("[") + text.count("{") > MAX_NESTING and nesting_depth(text) > MAX_NESTING:
        raise ProtocolError("$", f"the body nests deeper than {MAX_NESTING} levels")
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("$", f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError("$", "the body must be a JSON object")
    return data


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, allow_nan=False, separators=(",", ":"))


# -- fields -------------------------------------------------------------------------------


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return key if path in ("", "$") else f"{path}.{key}"


def clean_text(value: str, path: str) -> str:
    if "\x00" in value:
        raise ProtocolError(path, "must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(path, "must be valid Unicode (no lone surrogates)") from None
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class JsonObject:
    """Reads one JSON object's fields, naming each field's path in an error."""

    def __init__(self, data: Any, path: str = "$") -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(path, "must be a JSON object")
        self.data = data
        self.path = path

    def at(self, key: str) -> str:
        return join_path(self.path, key)

    def raw(self, key: str, *, required: bool = False) -> Any:
        value = self.data.get(key)
        if value is None and required:
            raise ProtocolError(self.at(key), "is required")
        return value

    def integer(
        self, key: str, *, required: bool = False, minimum: int = 0, maximum: int = INT64_MAX
    ) -> int | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 4.0 from a JSON encoder that writes every number as a float
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(self.at(key), "must be an integer")
        if not minimum <= value <= maximum:
            raise ProtocolError(self.at(key), f"must be between {minimum} and {maximum}")
        return value

    def number(
        self, key: str, *, required: bool = False, minimum: float = 0.0, maximum: float
    ) -> float | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not is_number(value) or not math.isfinite(value):
            raise ProtocolError(self.at(key), "must be a number")
        if not minimum <= value <= maximum:
            raise ProtocolError(self.at(key), f"must be between {minimum:g} and {maximum:g}")
        return float(value)

    def string(
        self,
        key: str,
        *,
        required: bool = False,
        max_length: int,
        choices: tuple[str, ...] | None = None,
    ) -> str | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ProtocolError(self.at(key), "must be a string")
        if len(value) > max_length:
            raise ProtocolError(self.at(key), f"must be at most {max_length} characters")
        if choices is not None and value not in choices:
            raise ProtocolError(self.at(key), f"must be one of {', '.join(choices)}")
        return clean_text(value, self.at(key))

    def boolean(self, key: str, *, required: bool = False) -> bool | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise ProtocolError(self.at(key), "must be true or false")
        return value

    def array(self, key: str, *, required: bool = False, max_items: int) -> list[Any] | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ProtocolError(self.at(key), "must be an array")
        if len(value) > max_items:
            raise ProtocolError(self.at(key), f"must have at most {max_items} items")
        return value

    def object(self, key: str, *, required: bool = False) -> JsonObject | None:
        value = self.raw(key, required=required)
        if value is None:
            return None
        return JsonObject(value, self.at(key))


def present(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# -- errors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorAnswer:
    """Every 4xx and 5xx: one sentence, and for a shape error the field it is about."""

    error: str
    field: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> ErrorAnswer:
        obj = JsonObject(data)
        return cls(
            error=obj.string("error", required=True, max_length=100_000) or "",
            field=obj.string("field", max_length=1000),
        )

    def to_json(self) -> dict[str, Any]:
        return present(error=self.error, field=self.field)


def parse(shape: Callable[[Any], Any], body: bytes | str) -> Any:
    """`loads` then `shape`: one call for a view or a client."""
    return shape(loads(body))
