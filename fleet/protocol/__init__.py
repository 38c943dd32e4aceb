"""The agent protocol (docs/agent-protocol.md) as one schema: every request and answer shape.

Pure Python: no Django, no HTTP library, nothing of the controller. The controller's views
(fleet/api.py) and actions parse requests with it, the agent's client (fleet/agent/client.py)
builds requests and parses answers with it, and the fake controller the agent's tests run
against (tests/fleet/agent/fakes.py) does both. It ships with the agent, so a host runs
it without the controller.

Each shape is a frozen dataclass with `from_json` (which raises `ProtocolError` naming the
field's path and what is wrong with it) and `to_json`. Unknown fields are ignored, so either
side may add a field before the other knows it; an absent or null optional field is None.
Numbers are bounded by the columns they land in, strings hold no NUL and no lone surrogate
(neither PostgreSQL nor UTF-8 can store them), and `loads` refuses NaN, infinities and
nesting too deep to parse, so no body the agent or anyone else sends can reach the database
in a shape it would refuse with a 500.

The shapes live by family: `core` (constants, errors, the JSON reader), `hosts` (join,
heartbeat, tokens, the memory valve's rules), `tasks` (tasks, payloads, results), `logs`
(runner output) and `reports` (runner reports, inventory); this package names them all.
"""

from __future__ import annotations

from fleet.protocol.core import (
    API_PREFIX,
    HOST_NAME,
    INT32_MAX,
    INT64_MAX,
    LIMIT_KINDS,
    MAX_BACKENDS,
    MAX_BODY_BYTES,
    MAX_CPUS,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_MESSAGE,
    MAX_NESTING,
    MAX_OUTPUT_TAIL,
    MAX_REPORTS,
    MAX_SECONDS,
    MAX_USAGE_KEYS,
    MAX_WAIT_SECONDS,
    REPORT_PHASES,
    REPORT_STATES,
    TASK_KINDS,
    VERSION,
    ErrorAnswer,
    JsonObject,
    ProtocolError,
    clean_text,
    dumps,
    is_int,
    is_number,
    join_path,
    loads,
    nesting_depth,
    parse,
    present,
)
from fleet.protocol.hosts import (
    DEFAULT_CEILING_FACTOR,
    MAX_RUNNER_ENTRIES,
    AgentTunables,
    HeartbeatAnswer,
    HeartbeatRequest,
    HostFacts,
    JoinAnswer,
    JoinRequest,
    MemoryRules,
    RunnerMemoryRule,
    TokenAnswer,
    read_usage,
)
from fleet.protocol.logs import (
    MAX_LOG_CHUNK,
    STREAM_ID,
    CancelLogsPayload,
    LogChunk,
    LogChunkAnswer,
    StreamLogsPayload,
)
from fleet.protocol.reports import (
    ExpectedRunner,
    InventoryAnswer,
    InventoryRequest,
    ReportsAnswer,
    ReportsRequest,
    RunnerReport,
    read_reports,
)
from fleet.protocol.tasks import (
    CreateRunnerPayload,
    ImagePrewarmPayload,
    RemoveRunnerPayload,
    StopRunnerPayload,
    Task,
    TaskList,
    TaskResult,
    TaskResultAnswer,
    parse_wait,
)

__all__ = [
    "API_PREFIX",
    "AgentTunables",
    "CancelLogsPayload",
    "CreateRunnerPayload",
    "DEFAULT_CEILING_FACTOR",
    "ErrorAnswer",
    "ExpectedRunner",
    "HOST_NAME",
    "HeartbeatAnswer",
    "HeartbeatRequest",
    "HostFacts",
    "INT32_MAX",
    "INT64_MAX",
    "ImagePrewarmPayload",
    "InventoryAnswer",
    "InventoryRequest",
    "JoinAnswer",
    "JoinRequest",
    "JsonObject",
    "LIMIT_KINDS",
    "LogChunk",
    "LogChunkAnswer",
    "MAX_BACKENDS",
    "MAX_BODY_BYTES",
    "MAX_CPUS",
    "MAX_LABELS",
    "MAX_LOG_CHUNK",
    "MAX_MEMORY_MB",
    "MAX_MESSAGE",
    "MAX_NESTING",
    "MAX_OUTPUT_TAIL",
    "MAX_REPORTS",
    "MAX_RUNNER_ENTRIES",
    "MAX_SECONDS",
    "MAX_USAGE_KEYS",
    "MAX_WAIT_SECONDS",
    "MemoryRules",
    "ProtocolError",
    "REPORT_PHASES",
    "REPORT_STATES",
    "RemoveRunnerPayload",
    "ReportsAnswer",
    "ReportsRequest",
    "RunnerMemoryRule",
    "RunnerReport",
    "STREAM_ID",
    "StopRunnerPayload",
    "StreamLogsPayload",
    "TASK_KINDS",
    "Task",
    "TaskList",
    "TaskResult",
    "TaskResultAnswer",
    "TokenAnswer",
    "VERSION",
    "clean_text",
    "dumps",
    "is_int",
    "is_number",
    "join_path",
    "loads",
    "nesting_depth",
    "parse",
    "parse_wait",
    "present",
    "read_reports",
    "read_usage",
]
