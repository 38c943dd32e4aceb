"""Runner backends: the shape of a runner on a host the agent already has."""

from fleet.agent.backends.base import (
    Backend,
    BackendError,
    Handle,
    HostSize,
    LogFollow,
    RunnerSpec,
    Workload,
    WorkloadExists,
    WorkloadStatus,
)

__all__ = [
    "Backend",
    "BackendError",
    "Handle",
    "HostSize",
    "LogFollow",
    "RunnerSpec",
    "Workload",
    "WorkloadExists",
    "WorkloadStatus",
]
