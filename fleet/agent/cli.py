"""Building an Agent from command-line options: shared by `manage.py agent` (on the
controller's own machine) and `zoomies-agent` / `python -m fleet.agent`, the way to run a
remote host: it needs the agent's few dependencies (fleet/agent/requirements.txt), a join
token, and nothing of the controller (no Django, no database, no secret key)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleet.agent.agent import Agent, AgentError
from fleet.agent.backends.base import Backend
from fleet.agent.backends.container import (
    DEFAULT_CREATE_TIMEOUT,
    PULL_MISSING,
    PULL_POLICIES,
    ContainerBackend,
)
from fleet.agent.backends.docker import DockerBackend
from fleet.agent.backends.podman import PodmanBackend
from fleet.agent.backends.process import ProcessBackend
from fleet.agent.client import ControllerError
from fleet.agent.joining import JOIN_TOKEN_ENV

CLAIM_CODE_ENV = "ZOOMIES_CLAIM_CODE"
STATE_DIR_ENV = "ZOOMIES_AGENT_STATE_DIR"
CA_FILE_ENV = "ZOOMIES_AGENT_CA_FILE"
DEFAULT_STATE_DIR = "/var/lib/zoomies/agent"
BACKEND_NAMES = ("process", "docker", "podman")


def parse_labels(values: Sequence[str]) -> dict[str, str]:
    labels = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise ValueError(f"a label is KEY=VALUE, not {value!r}")
        labels[key.strip()] = label.strip()
    return labels


def default_capacity(cpus: float) -> int:
    """Two CPUs a runner, at least one runner: the operator's --capacity overrides it."""
    return max(1, int(cpus // 2))


def build_agent(
    *,
    controller_url: str,
    state_dir: Path | str | None = None,
    work_dir: Path | str | None = None,
    name: str | None = None,
    capacity: int | None = None,
    labels: Mapping[str, str] | None = None,
    finished_retention: float | None = None,
    ca_file: str | None = None,
    environ: Mapping[str, str] = os.environ,
    backends: Sequence[str] = ("process",),
    docker_url: str | None = None,
    podman_url: str | None = None,
    pull_policy: str = PULL_MISSING,
    runner_network: str | None = None,
    create_timeout: float = DEFAULT_CREATE_TIMEOUT,
    claim_code: str | None = None,
    dind_image: str | None = None,
) -> Agent:
    """The process-backend agent the management command runs; the join token comes from
    ZOOMIES_JOIN_TOKEN and is never written anywhere (AGENT-21). `ca_file` (or
    ZOOMIES_AGENT_CA_FILE) is the PEM bundle the controller's HTTPS certificate is checked
    against, for a controller whose certificate a private CA signed.

    A machine an autoscaler provisioned joins with the claim code its scale-up event
    carried (`claim_code`, or ZOOMIES_CLAIM_CODE) under the event's `host_name`, which must
    then be given as `name`: the controller refuses the code for any other name."""
    claim_code = claim_code or environ.get(CLAIM_CODE_ENV) or None
    if claim_code and not environ.get(JOIN_TOKEN_ENV) and not name:
        raise ValueError(
            "a claim code joins under the host name its scale-up event named: pass --name"
        )
    state = Path(state_dir or environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
    ca_file = ca_file or environ.get(CA_FILE_ENV) or None
    if ca_file is not None and not Path(ca_file).is_file():
        raise ValueError(f"the CA bundle {ca_file} is not a readable file")
    work = Path(work_dir) if work_dir else state / "work"
    made = _backends(
        backends,
        work,
        name=name or socket.gethostname(),
        docker_url=docker_url or environ.get("DOCKER_HOST") or None,
        podman_url=podman_url,
        pull_policy=pull_policy,
        runner_network=runner_network,
        create_timeout=create_timeout,
        dind_image=dind_image,
    )
    if capacity is None:
        capacity = default_capacity(made[0].probe().cpus)
    for backend in made:
        if isinstance(backend, ContainerBackend):
            backend.slots = capacity  # a field the pool leaves unset is one slot's share
    return Agent(
        controller_url,
        state,
        work,
        made,
        name=name or socket.gethostname(),
        capacity=capacity,
        join_token=environ.get(JOIN_TOKEN_ENV) or None,
        claim_code=claim_code,
        labels=labels,
        finished_retention=finished_retention,
        ca_file=ca_file,
    )


def _backends(
    names: Sequence[str],
    work: Path,
    *,
    name: str,
    docker_url: str | None,
    podman_url: str | None,
    pull_policy: str,
    runner_network: str | None,
    create_timeout: float,
    dind_image: str | None = None,
) -> list[Backend]:
    """The backends this host offers, container engines first: the host's size is the first
    backend's answer, and a daemon's view of the machine beats the agent's own cgroup."""
    unknown = [n for n in names if n not in BACKEND_NAMES]
    if unknown or not names:
        raise ValueError(f"a backend is one of {', '.join(BACKEND_NAMES)}, not {unknown}")
    options = {
        "host": name,
        "pull_policy": pull_policy,
        "network_mode": runner_network,
        "create_timeout": create_timeout,
        # BACK-18, AGENT-14: the sidecar a pool that provides Docker gets, and prewarms.
        "dind_image": dind_image or None,
    }
    made: list[Backend] = []
    if "docker" in names:
        made.append(DockerBackend(docker_url, **options))  # type: ignore[arg-type]
    if "podman" in names:
        made.append(PodmanBackend(podman_url, **options))  # type: ignore[arg-type]
    if "process" in names:
        made.append(ProcessBackend(work))
    return made


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controller", required=True, help="the controller's base URL")
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"where agent.json lives (default ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    parser.add_argument("--work-dir", default=None, help="runner directories (default STATE/work)")
    parser.add_argument("--name", default=None, help="the host's name (default: the hostname)")
    parser.add_argument(
        "--claim-code",
        default=None,
        help=f"join with a scale-up event's claim code instead of a join token (default "
        f"${CLAIM_CODE_ENV}; prefer the variable, arguments show in ps); needs --name set to "
        "the event's host_name",
    )
    parser.add_argument("--capacity", type=int, default=None, help="runner slots on this host")
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a host label"
    )
    parser.add_argument(
        "--finished-retention",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep a finished runner's directory this long after its end was acknowledged "
        "(default: the controller's agent.finished_retention)",
    )
    parser.add_argument(
        "--ca-file",
        default=None,
        metavar="PEM",
        help=f"verify the controller's HTTPS certificate against this CA bundle "
        f"(default ${CA_FILE_ENV}, else the usual public CAs)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        choices=BACKEND_NAMES,
        default=None,
        help="a runner backend this host offers; repeat for several (default: process)",
    )
    parser.add_argument(
        "--docker-url", default=None, help="Docker's API (default $DOCKER_HOST or its socket)"
    )
    parser.add_argument("--podman-url", default=None, help="Podman's Docker-compatible API")
    parser.add_argument(
        "--pull-policy",
        choices=PULL_POLICIES,
        default=PULL_MISSING,
        help="when a container backend pulls a runner's image (default: missing)",
    )
    parser.add_argument(
        "--runner-network",
        default=None,
        help="the network mode runner containers join (default: the engine's own)",
    )
    parser.add_argument(
        "--create-timeout",
        type=float,
        default=DEFAULT_CREATE_TIMEOUT,
        metavar="SECONDS",
        help="how long a container create (pull included) may take once admitted",
    )
    parser.add_argument(
        "--dind-image",
        default=None,
        help="the Docker daemon image a pool that provides Docker gets as each runner's "
        "sidecar, and that prewarming such a pool prepares (default: none, no dind pools)",
    )


def agent_from_options(options: Mapping[str, object]) -> Agent:
    labels = parse_labels(options.get("label") or [])  # type: ignore[arg-type]
    return build_agent(
        controller_url=str(options["controller"]),
        state_dir=options.get("state_dir"),  # type: ignore[arg-type]
        work_dir=options.get("work_dir"),  # type: ignore[arg-type]
        name=options.get("name"),  # type: ignore[arg-type]
        capacity=options.get("capacity"),  # type: ignore[arg-type]
        labels=labels,
        finished_retention=_optional_float(options.get("finished_retention")),
        ca_file=options.get("ca_file"),  # type: ignore[arg-type]
        backends=options.get("backend") or ("process",),  # type: ignore[arg-type]
        docker_url=options.get("docker_url"),  # type: ignore[arg-type]
        podman_url=options.get("podman_url"),  # type: ignore[arg-type]
        pull_policy=str(options.get("pull_policy") or PULL_MISSING),
        runner_network=options.get("runner_network"),  # type: ignore[arg-type]
        create_timeout=float(options.get("create_timeout") or DEFAULT_CREATE_TIMEOUT),  # type: ignore[arg-type]
        claim_code=options.get("claim_code"),  # type: ignore[arg-type]
        dind_image=options.get("dind_image"),  # type: ignore[arg-type]
    )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="zoomies-agent",
        description="Run this host's Zoomies agent: it joins the controller with the join "
        f"token in ${JOIN_TOKEN_ENV} or the claim code in ${CLAIM_CODE_ENV} (once; the agent "
        "token it gets is kept in the state directory), then starts and stops runners as the "
        "controller asks.",
    )
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        agent_from_options(options).run()
    except (AgentError, ControllerError, ValueError) as exc:
        print(f"zoomies agent: {exc}", file=sys.stderr)
        return 1
    return 0
