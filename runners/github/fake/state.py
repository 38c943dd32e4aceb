"""The fake GitHub's state: its records and `FakeState`, the one object every section's
functions read and change, under its lock.

It imports no other part of the fake, so every section can import it and none is imported
back.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass
class Installation:
    id: int
    account: str
    account_type: str
    account_id: int
    repositories: list[str]
    created_at: float


@dataclass
class Repo:
    id: int
    owner: str
    name: str
    installation_id: int
    created_at: float

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class Token:
    token: str
    installation_id: int
    expires_at: float
    repositories: set[str] | None  # lower-case full names when the token was narrowed
    permissions: dict[str, str]
    revoked: bool = False


@dataclass
class Runner:
    id: int
    name: str
    installation_id: int
    scope: tuple[str, str]  # ("org", "acme") or ("repo", "acme/app"), lower-case
    labels: list[dict[str, Any]]
    secret: str
    ephemeral: bool = True
    os: str = "unknown"
    version: str | None = None
    session: str | None = None
    session_used: bool = False
    polling: int = 0
    last_seen: float | None = None
    job_id: int | None = None
    job_handed: bool = False
    waiting_since: float = 0.0


@dataclass
class Run:
    id: int
    repo: str
    installation_id: int
    name: str
    run_number: int
    head_sha: str
    created_at: float
    job_ids: list[int] = field(default_factory=list)
    updated_at: float = 0.0


@dataclass
class Job:
    id: int
    run_id: int
    repo: str
    installation_id: int
    name: str
    labels: list[str]
    duration: float
    wanted_conclusion: str
    created_at: float
    status: str = "queued"
    conclusion: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    runner_id: int | None = None
    runner_name: str | None = None


@dataclass
class Limit:
    until: float | None
    retry_after: int | None


@dataclass
class Quota:
    limit: int
    reset: float
    used: int = 0


@dataclass(order=True)
class Outgoing:
    due: float
    seq: int
    delivery_id: str = field(compare=False)
    job_id: int = field(compare=False)
    action: str = field(compare=False)
    url: str = field(compare=False)
    body: bytes = field(compare=False)
    headers: dict[str, str] = field(compare=False)
    lag: float = field(default=0.0, compare=False)  # extra seconds after the others it goes with
    redelivery: bool = field(default=False, compare=False)  # asked for by .../attempts


class Observer:
    """Told when the moments a benchmark times happen (bench/marks.py); does nothing here.

    Each is called as the thing happens (`jit_minted` and `session_opened` only when they
    succeed), some under the lock: an observer notes the time and returns.
    """

    def jit_minted(self, runner: Runner) -> None:
        pass

    def session_opened(self, runner: Runner) -> None:
        pass

    def job_started(self, job: Job) -> None:
        pass

    def job_finished(self, job: Job) -> None:
        pass

    def delivery_recorded(self, item: Outgoing, status: int | None) -> None:
        pass


class FakeState:
    """Everything the fake knows: its settings, its records and the locks that guard them.

    The settings a test may change while it runs (`webhook_url`, `webhook_secret`, `clock`)
    are read at each use. Records are changed only under `lock`; `changed` is notified on
    every change a waiter may be waiting for. `outbox_cv` guards the outbox and the sending
    slots, and is taken after `lock` when both are.
    """

    def __init__(
        self,
        *,
        webhook_url: str | None,
        webhook_secret: str | None,
        clock: Callable[[], float],
        token_lifetime: float,
        offline_after: float,
        app_id: int,
        client_id: str,
        app_slug: str,
        hook_id: int,
        public_key: rsa.RSAPublicKey,
        id_base: int,
    ):
        self.url = ""  # the API base URL, once serving
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.clock = clock
        self.token_lifetime = token_lifetime
        self.offline_after = offline_after
        self.app_id = app_id
        self.client_id = client_id
        self.app_slug = app_slug
        self.hook_id = hook_id
        self.public_key = public_key
        self.created_at = clock()
        self.observer = Observer()

        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.ids = {
            name: itertools.count(start)
            for name, start in {
                "installation": 41_000_001,
                "account": 7_100_001,
                "repo": 880_000_001,
                "runner": 1 + id_base,
                "run": 9_000_000_001 + id_base,
                "job": 25_000_000_001 + id_base,
                "label": 1,
                "hook_delivery": 30_000_000_001 + id_base,
            }.items()
        }
        self.installations: dict[int, Installation] = {}
        self.repos: dict[str, Repo] = {}  # by lower-case full name
        self.tokens: dict[str, Token] = {}
        self.runners: dict[int, Runner] = {}
        self.sessions: dict[str, int] = {}
        # Registration tokens handed out, for config.sh: token -> (scope, expires at, the
        # installation whose token asked).
        self.registration_tokens: dict[str, tuple[tuple[str, str], float, int]] = {}
        # hold_runners_offline: runners that cannot reach GitHub (their sessions answer 503),
        # by name; ALL_RUNNERS holds every one.
        self.held_offline: set[str] = set()
        self.label_ids: dict[str, int] = {}
        self.runs: dict[int, Run] = {}
        self.jobs: dict[int, Job] = {}
        self.queued: dict[int, None] = {}  # queued job ids in arrival order
        self.limits: dict[int | str, Limit] = {}  # by installation id, and auth.APP_KEY
        self.quotas: dict[tuple[Any, ...], Quota] = {}
        self.calls: list[tuple[str, str, int | None]] = []
        self.answers: list[tuple[str, str, int | None, int]] = []
        self.deliveries: list[dict[str, Any]] = []
        # GitHub's record of each attempt (GET /app/hook/deliveries), oldest first.
        self.hook_deliveries: list[dict[str, Any]] = []
        self.delivery_mode: dict[str, Any] = {
            "drop": False,
            "duplicate": False,
            "new_ids": False,
            "reorder": False,
            "early_progress": False,
            "queued_lag": 0.0,
            "delay": 0.0,
            "concurrency": 1,
            "seed": None,
        }
        # The draws of the modes set to a share (set_delivery's seed makes them repeatable).
        self.delivery_rng = random.Random()  # noqa: S311  # a fault pattern, not a secret
        self.reorder_choice: dict[int, bool] = {}  # reorder at a share: drawn once per job
        self.faults = {"dropped": 0, "redeliveries_dropped": 0, "duplicated": 0}
        self.reordered_jobs: set[int] = set()
        self.held: dict[int, list[Outgoing]] = {}  # reorder: all of a job's, until completed
        self.late: dict[int, list[Outgoing]] = {}  # early_progress: its queued, until started
        self.outbox: list[Outgoing] = []
        self.outbox_seq = itertools.count()
        self.outbox_cv = threading.Condition(threading.Lock())
        # Deliveries in flight at once, and the most allowed (set_delivery's concurrency);
        # both guarded by outbox_cv.
        self.sending = 0
        # The manifest flow (manifests.py): its codes, the key it hands out as the App's,
        # and what a converted manifest asked for.
        self.manifest_codes: dict[str, dict[str, Any]] = {}
        self.private_key_pem = ""
        self.app_permissions: dict[str, str] = {}
        self.app_events: list[str] = []
        self.concurrency = 1
        self.stopping = False
