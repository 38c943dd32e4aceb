"""Building an Agent from command-line options: shared by `manage.py agent` and
`python -m fleet.agent` (the latter for a host that has the agent and nothing else)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleet.agent.agent import Agent, AgentError
from fleet.agent.backends.process import ProcessBackend

JOIN_TOKEN_ENV = "ZOOMIES_JOIN_TOKEN"
STATE_DIR_ENV = "ZOOMIES_AGENT_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/zoomies/agent"


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
    finished_retention: float = 0.0,
    environ: Mapping[str, str] = os.environ,
) -> Agent:
    """The process-backend agent the management command runs; the join token comes from
    ZOOMIES_JOIN_TOKEN and is never written anywhere (AGENT-21)."""
    state = Path(state_dir or environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
    work = Path(work_dir) if work_dir else state / "work"
    backend = ProcessBackend(work)
    if capacity is None:
        capacity = default_capacity(backend.probe().cpus)
    return Agent(
        controller_url,
        state,
        work,
        [backend],
        name=name or socket.gethostname(),
        capacity=capacity,
        join_token=environ.get(JOIN_TOKEN_ENV) or None,
        labels=labels,
        finished_retention=finished_retention,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--controller", required=True, help="the controller's base URL")
    parser.add_argument(
        "--state-dir",
        default=None,
        help=f"where agent.json lives (default ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    parser.add_argument("--work-dir", default=None, help="runner directories (default STATE/work)")
    parser.add_argument("--name", default=None, help="the host's name (default: the hostname)")
    parser.add_argument("--capacity", type=int, default=None, help="runner slots on this host")
    parser.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a host label"
    )
    parser.add_argument(
        "--finished-retention",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep a finished runner's directory this long after its end was acknowledged",
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
        finished_retention=float(options.get("finished_retention") or 0.0),  # type: ignore[arg-type]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet.agent", description=__doc__)
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        agent_from_options(options).run()
    except (AgentError, ValueError) as exc:
        print(f"zoomies agent: {exc}", file=sys.stderr)
        return 1
    return 0
