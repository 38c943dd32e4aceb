"""The runner image's own exit codes, and the sentence the Runners page shows for each.

docker/runner/zoomies-entrypoint.sh exits 69 when the pool's Docker daemon never answered
and 78 on an unusable ZOOMIES_DOCKER_WAIT (BACK-13); the agent says so in a sentence that
names the container's log (BACK-14). Only a container backend runs that entrypoint, so only
its runners' codes are read this way. No imports: the agent's end report uses it.
"""

from __future__ import annotations

EXIT_DAEMON_UNAVAILABLE = 69  # EX_UNAVAILABLE
EXIT_BAD_SETTING = 78  # EX_CONFIG
CONTAINER_BACKENDS = frozenset({"docker", "podman"})


def exit_sentence(code: int | None, log_ref: str | None) -> str | None:
    """The Runners page's sentence for the runner image's own exit codes, else None."""
    where = f"; its log says more: {log_ref}" if log_ref else ""
    if code == EXIT_DAEMON_UNAVAILABLE:
        return (
            "the runner's Docker daemon never answered, so the runner exited (code 69) "
            f"before it could take a job{where}"
        )
    if code == EXIT_BAD_SETTING:
        return (
            "the runner exited (code 78) on an unusable setting: ZOOMIES_DOCKER_WAIT (from "
            "runners.docker_wait or the pool's env) must be whole seconds from 1 to 3600"
            f"{where}"
        )
    return None
