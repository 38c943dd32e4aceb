"""What the Docker and Podman backends share: one container per runner, over the Docker API.

Podman serves the Docker API on its own socket, so both backends are this class talking to
a different address through the docker SDK; `docker.py` and `podman.py` name where the two
engines differ (the default socket, the CLI an operator types, how a name clash is said).

Every workload is found again by its labels, never by memory (AGENT-23):

    io.zoomies.managed=true        the agent made it; adoption and orphan reaping look only here
    io.zoomies.runner-id           the runner row it runs
    io.zoomies.runner-name, io.zoomies.pool, io.zoomies.host
    io.zoomies.cpus, io.zoomies.memory-mb   what it was given (BACK-02), and
    io.zoomies.cpus-from, io.zoomies.memory-from   who gave it: "pool" or "host" (a slot
        share), as the controller wrote it on the runner's row; "task" when it did not say

The container is named zoomies-runner-<id>, so the engine itself refuses a second workload
for one runner (AGENT-24). The runner's credential (the JIT configuration) reaches it only in
its environment; nothing of the agent's own environment does.

A create runs on a thread of its own under `create_timeout`: an engine that hangs ends the
create with CreateTimedOut and frees the host's admission slot; the abandoned thread removes
whatever it made once the engine answers again, and anything left is an orphan to reap.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import docker
import docker.errors
import requests.exceptions

from fleet.agent.backends import memory
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
from fleet.agent.backends.exits import exit_sentence
from fleet.agent.backends.images import (
    PULL_ALWAYS,
    PULL_MISSING,
    PULL_NEVER,
    PULL_POLICIES,
    ImagePreparation,
)
from fleet.agent.backends.process import OUTPUT_TAIL_BYTES
from fleet.agent.backends.resources import (
    FROM_HOST,
    MB,
    Allocation,
    allocatable,
    allocation,
    floor_hundredth,
    slot_share,
)
from fleet.agent.host import platform_name
from fleet.agent.memory_valve import MemoryUse

log = logging.getLogger("fleet.agent.backends")

__all__ = [
    "PULL_ALWAYS",
    "PULL_MISSING",
    "PULL_NEVER",
    "PULL_POLICIES",
    "ContainerBackend",
    "CreateTimedOut",
    "EngineSize",
    "EngineUnavailable",
    "exit_sentence",
]

LABEL_PREFIX = "io.zoomies."
MANAGED_LABEL = LABEL_PREFIX + "managed"
RUNNER_ID_LABEL = LABEL_PREFIX + "runner-id"
RUNNER_NAME_LABEL = LABEL_PREFIX + "runner-name"
POOL_LABEL = LABEL_PREFIX + "pool"
HOST_LABEL = LABEL_PREFIX + "host"
CPUS_LABEL = LABEL_PREFIX + "cpus"
CPUS_FROM_LABEL = LABEL_PREFIX + "cpus-from"
MEMORY_LABEL = LABEL_PREFIX + "memory-mb"
MEMORY_FROM_LABEL = LABEL_PREFIX + "memory-from"
FROM_TASK = "task"

NAME_PREFIX = "zoomies-runner-"
# BACK-18: a dind pool's runner gets a Docker daemon of its own in a sidecar container. The
# two share only a volume holding the daemon's socket: nothing else mounts it, and the
# sidecar joins no network of the runner's, so no other workload can reach that daemon.
# (A per-runner bridge network would do the same with addresses these hosts must not use.)
ROLE_LABEL = LABEL_PREFIX + "role"
DIND_ROLE = "dind"
DIND_PREFIX = "zoomies-dind-"
DIND_SOCKET_DIR = "/run/zoomies-dind"  # in the runner
DIND_RUN_DIR = "/var/run"  # in the sidecar: where a dind image's daemon puts docker.sock
# The probe: `docker info` inside the sidecar, each try bounded to 5 s (as the runner
# image's own wait is), again every half second until `dind_wait` has passed.
DIND_PROBE = ["timeout", "5", "docker", "info"]
DIND_PROBE_PAUSE = 0.5
DEFAULT_DIND_WAIT = 120.0
TAIL_LINES = 5000  # asked of the engine, then cut to OUTPUT_TAIL_BYTES

DEFAULT_CREATE_TIMEOUT = 600.0  # agent.create_timeout
DEFAULT_REQUEST_TIMEOUT = 60.0
INSPECT_ATTEMPTS = 3
_RUNNING_STATES = frozenset({"running", "paused", "restarting"})


class EngineUnavailable(BackendError):
    """The engine did not answer at all: a transport failure, which holds further starts."""

    transport_failure = True


class CreateTimedOut(BackendError):
    """A create that outran its own budget: not a transport failure (AGENT-10)."""

    transport_failure = False


@dataclass(frozen=True)
class EngineSize(HostSize):
    """The host's size as the engine sees it, and which limits it can apply (BACK-03)."""

    can_limit_cpus: bool = False
    can_limit_memory: bool = False

    @property
    def limits(self) -> tuple[str, ...]:
        return tuple(
            kind
            for kind, can in (("cpus", self.can_limit_cpus), ("memory", self.can_limit_memory))
            if can
        )


def container_name(runner_id: int) -> str:
    return f"{NAME_PREFIX}{int(runner_id)}"


def halved(given: Allocation) -> Allocation:
    """One container's part of a dind pair's allocation: CPU floored to the hundredth."""
    return replace(
        given,
        cpus=None if given.cpus is None else floor_hundredth(given.cpus / 2),
        memory_mb=None if given.memory_mb is None else given.memory_mb // 2,
    )


def _quota_cpus(host_config: dict[str, Any]) -> float:
    """The CPUs a container may use, as its engine says (Docker: NanoCpus; Podman may
    answer a quota and period instead); 0 for none."""
    if host_config.get("NanoCpus"):
        return float(host_config["NanoCpus"]) / 1e9
    quota, period = host_config.get("CpuQuota") or 0, host_config.get("CpuPeriod") or 0
    return quota / period if quota > 0 and period > 0 else 0.0


def sidecar_name(runner_id: int) -> str:
    """The runner's Docker sidecar and the volume it shares with the runner (BACK-18)."""
    return f"{DIND_PREFIX}{int(runner_id)}"


def _parse_time(value: Any) -> float | None:
    """An engine timestamp ("2026-12-01T04:21:21.622990143Z") as epoch seconds."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?", value)
    if match is None:
        return None
    base, fraction, zone = match.groups()
    text = base + (f".{fraction[:6]}" if fraction else "")
    zone = "+00:00" if zone in (None, "Z") else zone
    try:
        return dt.datetime.fromisoformat(text + zone).timestamp()
    except ValueError:
        return None


class ContainerBackend(ImagePreparation, Backend):
    """A runner is a container on a Docker-API engine, labelled so it can be found again."""

    name = "container"
    engine = "the container engine"  # in sentences: "Docker", "Podman"
    cli = "docker"  # what an operator types to read a log
    default_url = "unix:///var/run/docker.sock"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        host: str = "",
        slots: int | None = None,
        network_mode: str | None = None,
        pull_policy: str = PULL_MISSING,
        create_timeout: float = DEFAULT_CREATE_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        reserve_cpus: float = 0.0,
        reserve_memory_mb: int = 0,
        dind_image: str | None = None,
        dind_command: list[str] | None = None,
        dind_wait: float = DEFAULT_DIND_WAIT,
        dind_privileged: bool = True,
        client_factory: Callable[[], docker.DockerClient] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pull_policy not in PULL_POLICIES:
            raise BackendError(
                f"the pull policy {pull_policy!r} is not one of {', '.join(PULL_POLICIES)}"
            )
        self.base_url = base_url or self.default_url
        self.host = host
        self.slots = slots
        self.network_mode = network_mode
        self.pull_policy = pull_policy
        self.create_timeout = float(create_timeout)
        self.request_timeout = float(request_timeout)
        self.reserve_cpus = reserve_cpus
        self.reserve_memory_mb = reserve_memory_mb
        self.dind_image = dind_image
        self.dind_command = list(dind_command) if dind_command else None
        self.dind_wait = float(dind_wait)
        # A Docker daemon in a container needs it; a host that refuses privileged containers
        # (a nested engine) can run only a sidecar image that does without.
        self.dind_privileged = dind_privileged
        self._client_factory = client_factory or self._default_client
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self._size: EngineSize | None = None
        self._clock = clock
        self._prepared: dict[str, float] = {}  # image -> when a prewarm last prepared it
        self._prepared_lock = threading.Lock()

    # -- the engine -----------------------------------------------------------------------

    def _default_client(self) -> docker.DockerClient:
        # "auto" asks the engine its API version: a pinned one would be refused by an engine
        # newer than it (Docker 29 dropped everything under 1.44) or older (Podman 4: 1.41).
        return docker.DockerClient(
            base_url=self.base_url,
            version="auto",
            # The stubs say int; the SDK hands it to requests, which takes a float.
            timeout=self.request_timeout,  # type: ignore[arg-type]
        )

    def client(self) -> docker.DockerClient:
        """The SDK client, made on first use so an engine that is down at start costs nothing."""
        with self._client_lock:
            if self._client is None:
                try:
                    self._client = self._client_factory()
                except docker.errors.DockerException as exc:
                    raise EngineUnavailable(
                        f"{self.engine} at {self.base_url} does not answer: {exc}"
                    ) from exc
            return self._client

    def _error(self, doing: str, exc: Exception) -> BackendError:
        """The operator's sentence for an engine failure while `doing` ("creating X"); a
        transport failure (no answer at all) is the kind that holds further starts."""
        if isinstance(exc, BackendError):
            return exc
        # APIError is an HTTPError too: an answer, not a silence, so it is looked at first.
        if isinstance(exc, docker.errors.APIError):
            detail = exc.explanation or str(exc)
            if isinstance(detail, bytes):
                detail = detail.decode(errors="replace")
            return BackendError(f"{self.engine} answered an error while {doing}: {detail}")
        if isinstance(exc, requests.exceptions.RequestException):
            return EngineUnavailable(
                f"{self.engine} at {self.base_url} did not answer while {doing}: {exc}"
            )
        return BackendError(f"{self.engine} failed while {doing}: {exc}")

    def _is_name_clash(self, exc: docker.errors.APIError) -> bool:
        """Docker answers 409 for a container name already in use."""
        return bool(exc.status_code == 409)

    def _gone(self, exc: Exception) -> bool:
        """A container that is not there (any more). Docker says 404; Podman, asked about
        one it is removing that very moment, says 500 "no such container"."""
        if not isinstance(exc, docker.errors.APIError):
            return False
        detail = exc.explanation or ""
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        return exc.status_code == 404 or "no such container" in str(detail).lower()

    def _inspect_raw(self, ref: str) -> dict[str, Any] | None:
        for attempt in range(INSPECT_ATTEMPTS):
            try:
                attrs: dict[str, Any] = self.client().api.inspect_container(ref)
                return attrs
            except docker.errors.NotFound:
                return None
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                if self._gone(exc):
                    return None
                # Podman, asked about a container whose process is exiting that moment,
                # says 500 "read /proc/<pid>/cgroup: no such process": ask again.
                if attempt + 1 < INSPECT_ATTEMPTS and "no such process" in str(exc).lower():
                    time.sleep(0.1)
                    continue
                raise self._error(f"inspecting {ref}", exc) from exc
        return None  # not reached: the last attempt returns or raises

    # -- the interface --------------------------------------------------------------------

    def create(self, spec: RunnerSpec) -> Handle:
        """Prepare the image (its pull policy), create and start the container, all within
        `create_timeout` (AGENT-13: the budget starts now, after admission)."""
        if not spec.image:
            raise BackendError(
                f"the {self.name} backend runs an image, and the create_runner payload names none"
            )
        lock = threading.Lock()
        outcome: dict[str, Any] = {}
        abandoned = threading.Event()
        finished = threading.Event()

        def work() -> None:
            try:
                handle = self._create(spec)
            except BaseException as exc:  # handed to the caller below
                with lock:
                    outcome["error"] = exc
                    late = abandoned.is_set()
                finished.set()
                if late:
                    # The engine may have made it after all before it failed: clean up.
                    self._remove_quietly(spec.runner_id)
                return
            with lock:
                outcome["handle"] = handle
                late = abandoned.is_set()
            finished.set()
            if late:
                log.warning(
                    "runner %s's create finished after its timeout; removing what it made",
                    spec.runner_id,
                )
                self._remove_quietly(spec.runner_id)

        worker = threading.Thread(
            target=work, name=f"{self.name}-create-{spec.runner_id}", daemon=True
        )
        worker.start()
        finished.wait(self.create_timeout)
        with lock:
            if "handle" not in outcome and "error" not in outcome:
                abandoned.set()
                raise CreateTimedOut(
                    f"{self.engine} did not finish creating runner {spec.runner_id}'s container "
                    f"within the create timeout ({self.create_timeout:g} s); what it made "
                    "will be removed"
                )
        if "error" in outcome:
            raise outcome["error"]
        handle: Handle = outcome["handle"]
        return handle

    def _create(self, spec: RunnerSpec) -> Handle:
        client = self.client()
        name = container_name(spec.runner_id)
        self.prepare_image(spec.image or "", self.pull_policy)
        given = self.allocation_for(spec)
        if spec.dind:
            # BACK-08: the pair was charged these figures; each container gets half (the
            # typed figure each when the pool's was charged twice, else half a slot share).
            given = halved(given)
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "name": name,
            "labels": self.labels_for(spec, given),
            "environment": dict(spec.env),
            "detach": True,
            # SEC-03: nothing in a job gains root through a setuid binary (sudo, su); the
            # runner runs as its image's user (the stock image's is not root), with no
            # engine socket mounted and no capability added.
            "security_opt": ["no-new-privileges:true"],
        }
        if spec.dind:
            # The runner is created only once its daemon answers (BACK-18).
            volume = self._start_sidecar(spec, given)
            kwargs["volumes"] = {volume: {"bind": DIND_SOCKET_DIR, "mode": "rw"}}
            kwargs["environment"].setdefault("DOCKER_HOST", f"unix://{DIND_SOCKET_DIR}/docker.sock")
        if spec.command:
            kwargs["command"] = list(spec.command)
        if self.network_mode:
            kwargs["network_mode"] = self.network_mode
        if given.nano_cpus is not None:
            kwargs["nano_cpus"] = given.nano_cpus
        if given.memory_bytes is not None:
            kwargs["mem_limit"] = given.memory_bytes
        try:
            container = client.containers.create(**kwargs)
        except docker.errors.APIError as exc:
            if self._is_name_clash(exc):
                raise WorkloadExists(
                    f"runner {spec.runner_id} already has a container ({name})"
                ) from exc
            raise self._error(f"creating {name}", exc) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error(f"creating {name}", exc) from exc
        try:
            container.start()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            # Failure clean-up is part of the create: no half-made workload is left behind.
            self._remove_quietly(spec.runner_id)
            raise self._error(f"starting {name}", exc) from exc
        # The stubs allow an id of None; a created container has one, and its name is a ref too.
        return Handle(runner_id=spec.runner_id, ref=container.id or name)

    def apply_cpu_factor(self, runner_id: int, factor: float) -> int:
        """HOST-20, HOST-23: each container of the runner (its sidecar too) at `factor`
        times the CPUs its label says it was given (a DinD pair's halves each keep their
        own half as the base), so restoring the factor restores exactly that. A container
        already at its figure is not touched; one with no CPU figure is left unlimited."""
        changed = 0
        for name in (container_name(runner_id), sidecar_name(runner_id)):
            attrs = self._inspect_raw(name)
            if attrs is None or not (attrs.get("State") or {}).get("Running"):
                continue
            given = (attrs.get("Config") or {}).get("Labels", {}).get(CPUS_LABEL)
            try:
                base = float(given)
            except (TypeError, ValueError):
                continue
            nano = int(round(base * min(max(factor, 0.5), 1.0) * 1e9))
            if abs(_quota_cpus(attrs.get("HostConfig") or {}) - nano / 1e9) < 0.005:
                continue
            try:
                self._update_cpus(name, nano)
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                raise self._error(f"updating {name}'s CPU quota", exc) from exc
            changed += 1
        return changed

    def memory_use(self, runner_id: int) -> MemoryUse | None:
        """HOST-12: one non-streaming stats call (5 s at most); a container not running, or
        one given no memory limit, has nothing for the valve."""
        try:
            return memory.container_use(self.client().api, container_name(runner_id))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error(f"reading runner {runner_id}'s memory", exc) from exc

    def raise_memory(self, runner_id: int, limit_mb: int) -> None:
        try:
            memory.raise_limit(self.client().api, container_name(runner_id), limit_mb)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error(f"raising runner {runner_id}'s memory limit", exc) from exc

    def _update_cpus(self, name: str, nano_cpus: int) -> None:
        """Docker's update of a running container's CPU limit, in place."""
        api = self.client().api
        url = f"{api.base_url}/v{api.api_version}/containers/{quote(name, safe='')}/update"
        api.post(url, json={"NanoCpus": nano_cpus}, timeout=30).raise_for_status()

    def inspect(self, runner_id: int) -> Workload:
        attrs = self._inspect_raw(container_name(runner_id))
        workload = self._workload(attrs) if attrs is not None else None
        if workload is None or workload.runner_id != runner_id:
            return Workload(runner_id=runner_id, status=WorkloadStatus.MISSING)
        if workload.status == WorkloadStatus.EXITED:
            # The container and its log go with the workload: the end report keeps the end,
            # a clean exit's as a failure's (issue 9: a finished runner's log stays readable).
            workload = replace(workload, output_tail=self._output_tail(runner_id))
        return workload

    def _output_tail(self, runner_id: int) -> str | None:
        """The last OUTPUT_TAIL_BYTES of the runner's output as text, as the process
        backend reads its file; None when the engine cannot say."""
        try:
            raw = self.client().api.logs(
                container_name(runner_id), stdout=True, stderr=True, tail=TAIL_LINES
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return None
        data = bytes(raw)[-OUTPUT_TAIL_BYTES:]
        return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")

    def list(self) -> list[Workload]:
        try:
            # Label filters are ANDed by Docker but were ORed by older Podman: filter by the
            # one marker on the engine and by host here.
            summaries = self.client().api.containers(
                all=True, filters={"label": f"{MANAGED_LABEL}=true"}
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error("listing containers", exc) from exc
        workloads = []
        runners = {
            (s.get("Labels") or {}).get(RUNNER_ID_LABEL)
            for s in summaries
            if (s.get("Labels") or {}).get(ROLE_LABEL) != DIND_ROLE
        }
        for summary in summaries:
            labels = summary.get("Labels") or {}
            if self.host and labels.get(HOST_LABEL) != self.host:
                continue
            if labels.get(ROLE_LABEL) == DIND_ROLE and labels.get(RUNNER_ID_LABEL) in runners:
                continue  # the runner's own listing stands for the pair
            # A sidecar alone (a create that died between the two) is listed as the
            # runner's workload, so orphan reaping finds it and `remove` takes it away.
            attrs = self._inspect_raw(summary["Id"])  # None: removed since the listing
            workload = self._workload(attrs) if attrs is not None else None
            if workload is not None:
                workloads.append(workload)
        return sorted(workloads, key=lambda w: w.runner_id)

    def stop(self, runner_id: int, timeout: float, grace: float = 0.0) -> None:
        name = container_name(runner_id)
        if self.inspect(runner_id).status != WorkloadStatus.RUNNING:
            return
        api = self.client().api
        if grace > 0:
            # RUN-11: the grace, unsignalled, for a draining runner to finish by itself.
            with contextlib.suppress(requests.exceptions.RequestException):
                api.wait(name, timeout=grace)  # type: ignore[arg-type]  # a float, as for the client
            if self.inspect(runner_id).status != WorkloadStatus.RUNNING:
                return
        try:
            # The engine sends the image's stop signal, then SIGKILL `timeout` later.
            api.stop(name, timeout=max(0, math.ceil(timeout)))
        except docker.errors.NotFound:
            return
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if self._gone(exc):
                return
            raise self._error(f"stopping {name}", exc) from exc

    def remove(self, runner_id: int) -> None:
        """The runner's container, then its sidecar and their volume, if it had one."""
        self._remove_container(container_name(runner_id), runner_id)
        self._remove_sidecar(runner_id)

    def _remove_container(self, name: str, runner_id: int) -> None:
        try:
            self.client().api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if self._gone(exc):
                return
            # Another remove got there first (an abandoned create cleaning up): done when
            # that one is.
            if exc.status_code == 409 and "in progress" in str(exc.explanation or ""):
                if self._wait_missing(name, self.request_timeout):
                    return
            raise self._error(f"removing {name}", exc) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error(f"removing {name}", exc) from exc

    def _wait_missing(self, name: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._inspect_raw(name) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    # -- docker-in-docker (BACK-18) --------------------------------------------------------

    def _start_sidecar(self, spec: RunnerSpec, given: Allocation) -> str:
        """The runner's own Docker daemon, answering `docker info`, and the volume holding
        its socket; everything made is removed again if it never answers."""
        if not self.dind_image:
            raise BackendError(
                f"pool {spec.pool} provides Docker (dind), and this host has no dind image "
                "configured (the agent's --dind-image)"
            )
        rid = spec.runner_id
        name = sidecar_name(rid)
        labels = {
            MANAGED_LABEL: "true",
            RUNNER_ID_LABEL: str(rid),
            RUNNER_NAME_LABEL: spec.runner_name,
            POOL_LABEL: spec.pool,
            HOST_LABEL: self.host,
            ROLE_LABEL: DIND_ROLE,
        }
        if given.cpus is not None:
            labels[CPUS_LABEL] = f"{given.cpus:.2f}"  # HOST-23: its half, the throttle's base
        api = self.client().api
        self.prepare_image(self.dind_image, self.pull_policy)
        try:
            api.create_volume(name=name, labels=labels)
            host_config = api.create_host_config(
                privileged=self.dind_privileged,  # never the runner's
                binds={name: {"bind": DIND_RUN_DIR, "mode": "rw"}},
                network_mode=self.network_mode or None,
                nano_cpus=given.nano_cpus,
                mem_limit=given.memory_bytes,
            )
            created = api.create_container(
                self.dind_image,
                command=self.dind_command,
                name=name,
                labels=labels,
                host_config=host_config,
                detach=True,
            )
            api.start(created["Id"])
        except docker.errors.APIError as exc:
            self._remove_sidecar(rid)
            if self._is_name_clash(exc):
                raise WorkloadExists(f"runner {rid} already has a Docker sidecar ({name})") from exc
            raise self._error(f"starting {name}", exc) from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            self._remove_sidecar(rid)
            raise self._error(f"starting {name}", exc) from exc
        if not self._probe_sidecar(name):
            self._remove_sidecar(rid)
            raise BackendError(
                f"runner {rid}'s Docker daemon ({name}) did not answer `docker info` within "
                f"{self.dind_wait:g} s, so the runner was not created; `{self.cli} logs {name}` "
                "says why"
            )
        return name

    def _probe_sidecar(self, name: str) -> bool:
        """`docker info` in the sidecar until it answers or `dind_wait` has passed."""
        api = self.client().api
        deadline = time.monotonic() + self.dind_wait
        while True:
            try:
                exec_id = api.exec_create(name, DIND_PROBE, stdout=True, stderr=True)
                api.exec_start(exec_id["Id"])
                if api.exec_inspect(exec_id["Id"]).get("ExitCode") == 0:
                    return True
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                log.info("%s: probe failed: %s", name, exc)
            if time.monotonic() + DIND_PROBE_PAUSE >= deadline:
                return False
            time.sleep(DIND_PROBE_PAUSE)

    def _remove_sidecar(self, runner_id: int) -> None:
        name = sidecar_name(runner_id)
        self._remove_container(name, runner_id)
        try:
            self.client().api.remove_volume(name, force=True)
        except docker.errors.NotFound:
            return
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if self._gone(exc) or "no such volume" in str(exc).lower():
                return
            raise self._error(f"removing the volume {name}", exc) from exc

    def logs(self, runner_id: int) -> bytes:
        name = container_name(runner_id)
        try:
            output: bytes = self.client().api.logs(name, stdout=True, stderr=True)
            return output
        except docker.errors.NotFound:
            return b""
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if self._gone(exc):
                return b""
            raise self._error(f"reading {name}'s log", exc) from exc

    def follow_logs(self, runner_id: int) -> LogFollow:
        """The runner's output from the start, then as it comes, until it ends (LOG-02);
        `close` from another thread shuts the engine's stream, so the reader stops at once."""
        name = container_name(runner_id)
        try:
            stream = self.client().api.logs(
                name, stdout=True, stderr=True, stream=True, follow=True
            )
        except docker.errors.NotFound:
            return LogFollow([])
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if self._gone(exc):
                return LogFollow([])
            raise self._error(f"following {name}'s log", exc) from exc
        follow: LogFollow

        def pieces() -> Iterator[bytes]:
            try:
                yield from stream
            except (docker.errors.DockerException, requests.exceptions.RequestException,
                    OSError, ValueError, AttributeError) as exc:  # fmt: skip
                # Closing the stream under the reader surfaces as one of these: that is
                # the end asked for; anything else is the engine's failure.
                if follow.closed.is_set() or self._gone(exc):
                    return
                raise self._error(f"following {name}'s log", exc) from exc

        follow = LogFollow(pieces(), on_close=stream.close)
        return follow

    def probe(self) -> EngineSize:
        """The engine's view of the host (BACK-03): a runner is a sibling of the agent on the
        host, outside any cgroup the agent is in, so the daemon's size is the honest one."""
        try:
            info = self.client().info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error("describing the host", exc) from exc
        size = EngineSize(
            cpus=float(info.get("NCPU") or 0),
            memory_mb=int(info.get("MemTotal") or 0) // MB,
            platform=platform_name(str(info.get("Architecture") or "")),
            can_limit_cpus=bool(info.get("CpuCfsQuota")),
            can_limit_memory=bool(info.get("MemoryLimit")),
        )
        self._size = size
        return size

    # -- resources ------------------------------------------------------------------------

    def allocation_for(self, spec: RunnerSpec) -> Allocation:
        """The task's figures where it gave them; else one slot's share of this host's
        allocatable machine, where the engine can apply that limit (BACK-04, BACK-05)."""
        share = None
        if (spec.cpus is None or spec.memory_mb is None) and self.slots:
            size = self._size or self.probe()
            if size.cpus > 0 and size.memory_mb > 0:
                share = slot_share(
                    allocatable(
                        size.cpus,
                        size.memory_mb,
                        reserve_cpus=self.reserve_cpus,
                        reserve_memory_mb=self.reserve_memory_mb,
                    ),
                    self.slots,
                )
            can_cpus, can_memory = size.can_limit_cpus, size.can_limit_memory
        else:
            can_cpus = can_memory = True
        return allocation(
            spec.cpus,
            spec.memory_mb,
            share,
            can_limit_cpus=can_cpus,
            can_limit_memory=can_memory,
        )

    def labels_for(self, spec: RunnerSpec, given: Allocation) -> dict[str, str]:
        labels = {
            MANAGED_LABEL: "true",
            RUNNER_ID_LABEL: str(spec.runner_id),
            RUNNER_NAME_LABEL: spec.runner_name,
            POOL_LABEL: spec.pool,
            HOST_LABEL: self.host,
        }
        # A figure this agent worked out is the host's; one the task gave is whoever the
        # controller says gave it (BACK-09), "task" when it does not say.
        if given.cpus is not None:
            labels[CPUS_LABEL] = f"{given.cpus:.2f}"
            labels[CPUS_FROM_LABEL] = (
                FROM_HOST if given.cpus_from == FROM_HOST else spec.cpus_from or FROM_TASK
            )
        if given.memory_mb is not None:
            labels[MEMORY_LABEL] = str(given.memory_mb)
            labels[MEMORY_FROM_LABEL] = (
                FROM_HOST if given.memory_from == FROM_HOST else spec.memory_from or FROM_TASK
            )
        return labels

    # -- helpers --------------------------------------------------------------------------

    def log_ref(self, runner_id: int) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"`{self.cli} logs {container_name(runner_id)}`{where}"

    def _workload(self, attrs: dict[str, Any]) -> Workload | None:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(MANAGED_LABEL) != "true":
            return None
        try:
            runner_id = int(labels.get(RUNNER_ID_LABEL, ""))
        except ValueError:
            return None
        state = attrs.get("State") or {}
        status_text = str(state.get("Status") or "").lower()
        running = bool(state.get("Running")) or status_text in _RUNNING_STATES
        exit_code = None
        if not running and status_text in ("exited", "stopped", "dead"):
            code = state.get("ExitCode")
            exit_code = int(code) if isinstance(code, int) else None
        return Workload(
            runner_id=runner_id,
            status=WorkloadStatus.RUNNING if running else WorkloadStatus.EXITED,
            exit_code=exit_code,
            runner_name=labels.get(RUNNER_NAME_LABEL),
            pool=labels.get(POOL_LABEL),
            started_at=_parse_time(state.get("StartedAt")) or _parse_time(attrs.get("Created")),
            log_ref=self.log_ref(runner_id),
        )

    def _remove_quietly(self, runner_id: int) -> None:
        try:
            self.remove(runner_id)
        except BackendError as exc:
            log.warning("could not remove runner %s's container: %s", runner_id, exc)
