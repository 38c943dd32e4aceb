"""The agent: joins, heartbeats, long-polls for tasks, runs them, and reports its runners.

Each loop is a `*_once` step plus a thin loop around it, so tests drive the steps with a
chosen clock and never sleep through a grace period.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet import protocol
from fleet.agent import AGENT_VERSION
from fleet.agent.admission import FifoSlot, StartHold
from fleet.agent.backends.base import Backend, BackendError
from fleet.agent.client import (
    ControllerClient,
    ControllerError,
    ControllerUnavailable,
    Unauthorized,
)
from fleet.agent.errors import AgentError
from fleet.agent.host import UsageSampler, work_dir_space
from fleet.agent.logs import LogRelay
from fleet.agent.memory_guard import MemoryGuard
from fleet.agent.reconcile import ReconcileLoop
from fleet.agent.results import ResultPoster
from fleet.agent.state import AgentState, JoinTokenSpent, StateError, StateStore
from fleet.agent.tasks import MAX_BACKOFF, TaskLoop
from fleet.agent.tracking import Clock, TrackedRunner, Wait

log = logging.getLogger("fleet.agent")

# ESC-06: a short-lived token is renewed once this fraction of its life has passed, leaving
# the rest for tries against a controller that does not answer for a while.
RENEW_AT_FRACTION = 0.5

__all__ = ["Agent", "AgentError", "TrackedRunner"]


class Agent(TaskLoop, ReconcileLoop):
    """One host's agent: a plain HTTP client of the controller (ARCH-05, ARCH-07).

    `run()` starts the heartbeat, task and reconcile loops; tests call `connect`,
    `adopt_existing`, `heartbeat_once`, `poll_once` and `reconcile_once` directly. The
    task loop lives in fleet/agent/tasks.py, the reconcile loop in fleet/agent/reconcile.py,
    what they share in fleet/agent/tracking.py.

    Its timings (`tunables`) come from the controller's join and heartbeat answers; until
    the first answer they are the protocol's defaults. `finished_retention`, when given,
    is the operator's and outranks the controller's.
    """

    def __init__(
        self,
        controller_url: str,
        state_dir: Path | str,
        work_dir: Path | str,
        backends: Sequence[Backend] | Mapping[str, Backend],
        name: str,
        capacity: int,
        *,
        clock: Clock = time.time,
        join_token: str | None = None,
        claim_code: str | None = None,
        labels: Mapping[str, str] | None = None,
        finished_retention: float | None = None,
        client: ControllerClient | None = None,
        ca_file: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.controller_url = controller_url.rstrip("/")
        self.state_dir = Path(state_dir)
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if isinstance(backends, Mapping):
            self.backends: dict[str, Backend] = dict(backends)
        else:
            self.backends = {b.name: b for b in backends}
        if not self.backends:
            raise AgentError("the agent needs at least one backend")
        self.name = name
        self.capacity = int(capacity)
        self.labels = dict(labels or {})
        self._finished_retention = finished_retention
        self.join_token = join_token or None
        # A provisioned machine's one-time credential (issue 13 item 4): used like a join
        # token, spent once, and its hash kept so a restart never offers it again.
        self.claim_code = None if self.join_token else (claim_code or None)
        self.store = StateStore(self.state_dir)
        self.client = client or ControllerClient(self.controller_url, ca_file=ca_file)
        self._clock = clock
        self._sleep = sleep
        self._usage = UsageSampler()
        self._backend_limits: dict[str, list[str]] = {}  # BACK-03: each backend's last answer

        self.host_id: int | None = None
        self.tunables = protocol.AgentTunables()
        self.cordoned = False
        self.cpu_factor = 1.0  # HOST-20: the controller's, from the last heartbeat answer
        self.cordon_from_tasks_at = None
        self.polls_completed = 0
        self.fatal_error: str | None = None

        self._lock = threading.RLock()
        self._tracked: dict[int, TrackedRunner] = {}
        self._first_seen: dict[tuple[str, int], float] = {}  # orphans, by (backend, runner)
        self._orphans_listed_at: float | None = None  # the last listing for orphans
        self._waiting_creates: set[int] = set()
        self._superseded: set[int] = set()
        self._inflight: set[threading.Thread] = set()
        self._admission = FifoSlot()
        self._start_hold = StartHold(clock)  # AGENT-09
        self._stopping = threading.Event()
        self._pause: Wait = self._stopping.wait  # answers True when the agent is stopping
        self._wake_reconcile = threading.Event()
        self._shut_down = False
        self._log_relay = LogRelay(self.client)  # LOG-02
        self._results = ResultPoster(clock)  # a burst's results posted in groups (issue 28)
        self._memory = MemoryGuard(self.backends, clock=clock)  # HOST-24..32
        self._token_renew_at: float | None = None  # ESC-06, on self._clock

    # -- credentials ----------------------------------------------------------------------

    def connect(self) -> None:
        """Use agent.json's credentials, or join with the join token or claim code (AGENT-21,
        AGENT-22)."""
        try:
            state = self.store.load()
        except StateError as exc:
            raise AgentError(str(exc)) from exc
        if state.has_credentials_for(self.controller_url):
            if state.token_expired(self._clock()):
                raise AgentError(
                    f"the short-lived agent token in {self.store.path} (minted from a claim "
                    "code) has expired and cannot be renewed; this machine needs a new claim "
                    "code from a new scale-up"
                )
            self._use_credentials(state)
            return
        credential = self.join_token or self.claim_code
        if not credential:
            if state.host_id is not None and state.agent_token:
                raise AgentError(
                    f"{self.store.path} holds credentials for {state.controller_url}, not "
                    f"{self.controller_url}; set ZOOMIES_JOIN_TOKEN to join {self.controller_url}"
                )
            raise AgentError(
                "this host has not joined a controller yet: set ZOOMIES_JOIN_TOKEN to a join "
                "token from the controller's Hosts page (or ZOOMIES_CLAIM_CODE to the claim "
                "code of the scale-up event that provisioned it)"
            )
        what = "join token" if self.join_token else "claim code"
        if state.is_spent(credential):
            raise JoinTokenSpent(
                f"the {what} given is one this host has already spent (its hash is in "
                f"{self.store.path}); it is single-use, so ask the controller for a new one"
            )
        info = {"name": self.name, **self.host_info()}
        try:
            answer = self.client.join(self.join_token, info, claim_code=self.claim_code)
        except Unauthorized as exc:
            raise AgentError(
                f"the controller refused the {what} (unknown, expired or spent): {exc}"
            ) from exc
        state.host_id = answer.host_id
        state.agent_token = answer.agent_token
        state.controller_url = self.controller_url
        self._set_token_life(state, answer.agent_token_expires_in)
        state.spend(credential)
        self.store.save(state)
        self._use_tunables(answer.tunables)
        log.info("joined %s as host %s", self.controller_url, answer.host_id)
        self._use_credentials(state)

    def _use_credentials(self, state: AgentState) -> None:
        with self._lock:
            self.host_id = state.host_id
            self.client.agent_token = state.agent_token
            self._token_renew_at = state.agent_token_renew_at

    # -- a short-lived credential (ESC-06) ------------------------------------------------

    def _set_token_life(self, state: AgentState, expires_in: float | None) -> None:
        """When the token just received expires and is due for renewal, on the agent's clock
        (the controller says seconds from its answer, so the two clocks need not agree)."""
        if expires_in is None:
            state.agent_token_expires_at = state.agent_token_renew_at = None
            return
        now = self._clock()
        state.agent_token_expires_at = now + expires_in
        state.agent_token_renew_at = now + expires_in * RENEW_AT_FRACTION

    def renew_token_if_due(self) -> float | None:
        """Trade a short-lived agent token for the next one once half its life has passed;
        answer the seconds until the next renewal is due, or None for a token that does not
        expire. The new token is written to agent.json before it is used, so a restart never
        holds one the controller has replaced; the old one stays valid until its own expiry.
        """
        with self._lock:
            renew_at = self._token_renew_at
        if renew_at is None:
            return None
        now = self._clock()
        if now < renew_at:
            return renew_at - now
        answer = self.client.renew_token()
        state = self.store.load()
        state.agent_token = answer.agent_token
        self._set_token_life(state, answer.agent_token_expires_in)
        self.store.save(state)  # if this fails, the old token still works until it expires
        self._use_credentials(state)
        log.info("renewed the agent token; it expires in %.0f s", answer.agent_token_expires_in)
        assert state.agent_token_renew_at is not None  # noqa: S101  # set from expires_in above
        return max(state.agent_token_renew_at - self._clock(), 0.0)

    # -- the controller's timings ---------------------------------------------------------

    def _use_tunables(self, tunables: protocol.AgentTunables) -> None:
        with self._lock:
            if tunables != self.tunables:
                log.info("the controller's timings: %s", tunables.to_json())
            self.tunables = tunables

    @property
    def heartbeat_interval(self) -> float:
        return self.tunables.heartbeat_interval

    # -- what the host is -----------------------------------------------------------------

    def host_info(self) -> dict[str, Any]:
        """The join/heartbeat fields describing this host (HOST-07, HOST-08)."""
        info: dict[str, Any] = {
            "backends": list(self.backends),
            "capacity": self.capacity,
            "labels": dict(self.labels),
            "version": AGENT_VERSION,
        }
        # The first backend's answer is the host's size: a daemon's view beats our cgroup's.
        # Every backend says which limits it can apply (BACK-03); one that cannot be asked
        # now keeps its last answer, so a daemon restarting does not take its shares away.
        for index, (name, backend) in enumerate(self.backends.items()):
            try:
                size = backend.probe()
            except (BackendError, OSError) as exc:
                log.warning("cannot probe the %s backend: %s", name, exc)
                continue
            if index == 0:
                info.update(platform=size.platform, cpus=size.cpus, memory_mb=size.memory_mb)
            self._backend_limits[name] = list(size.limits)
        if self._backend_limits:
            info["backend_limits"] = dict(self._backend_limits)
        space = work_dir_space(self.work_dir)
        if space is not None:
            info.update(disk_total_mb=space.total_mb, disk_free_mb=space.free_mb)
        return info

    # -- heartbeat (HOST-01) --------------------------------------------------------------

    def heartbeat_once(self) -> float:
        """Send one heartbeat; answer the interval to sleep before the next."""
        body = self.host_info()
        body["usage"] = self._usage.sample()
        body.update(self._memory.report())  # HOST-29, HOST-32
        sent_at = self._clock()
        answer = self.client.heartbeat(body)
        self._use_tunables(answer.tunables)
        self._memory.use(answer.memory)
        with self._lock:
            # A task list that arrived while this heartbeat was out carried a newer cordon
            # than its answer, which the controller read before (issue 21 item 6).
            if self.cordon_from_tasks_at is None or sent_at > self.cordon_from_tasks_at:
                self.cordoned = answer.cordoned
            self.cpu_factor = answer.cpu_factor
        self.apply_cpu_factor()
        with self._lock:
            return self.heartbeat_interval

    def apply_cpu_factor(self) -> int:
        """HOST-20: the controller's CPU factor on every runner tracked here, on each
        heartbeat, idempotently (a runner already at it is not touched); HOST-22: a runner
        keeps its full quota for the bootstrap grace, counted from when this agent first
        saw it. A backend that fails is logged and asked again next time."""
        now = self._clock()
        with self._lock:
            factor, grace = self.cpu_factor, self.tunables.bootstrap_cpu_grace
            due = [
                (t.runner_id, t.backend, now - t.created_at >= grace)
                for t in self._tracked.values()
                if t.end is None
            ]
        changed = 0
        for runner_id, backend_name, past_grace in due:
            backend = self.backends.get(backend_name)
            if backend is None:
                continue
            try:
                changed += backend.apply_cpu_factor(runner_id, factor if past_grace else 1.0)
            except BackendError as exc:
                log.warning("runner %s: CPU factor %.2f not applied: %s", runner_id, factor, exc)
        if changed:
            log.info("CPU factor %.2f applied to %d container(s)", factor, changed)
        return changed

    def heartbeat_loop(self, wait: Wait | None = None) -> None:
        wait = wait or self._stopping.wait
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                renew_in = self.renew_token_if_due()
                interval = self.heartbeat_once()
                if renew_in is not None:  # a heartbeat interval may outlast the token
                    interval = min(interval, renew_in)
                backoff = 1.0
            except Unauthorized as exc:
                self._fatal(exc)
                return
            except Exception as exc:  # a bug must not end the heartbeat for good
                log.warning(
                    "heartbeat failed: %s", exc, exc_info=not isinstance(exc, ControllerError)
                )
                interval = min(backoff, self.heartbeat_interval)
                backoff = min(backoff * 2, MAX_BACKOFF)
            if wait(interval):
                return

    def memory_loop(self, wait: Wait | None = None) -> None:
        """The memory valve, apart from lifecycle work (HOST-12, HOST-26): each tracked
        runner when it is due, until the agent stops."""
        wait = wait or self._stopping.wait
        while not self._stopping.is_set():
            with self._lock:
                runners = [
                    (t.runner_id, t.backend) for t in self._tracked.values() if t.end is None
                ]
            try:
                pause = self._memory.step(runners)
            except Exception:  # a bug must not end the guard for good
                log.exception("the memory valve's look failed")
                pause = 5.0
            if wait(pause):
                return

    # -- running and stopping -------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> None:
        """Join (or reuse agent.json), adopt, run the loops until stopped, then shut down.

        Raises AgentError for what the operator must fix (a spent join token, a 401).
        """
        if install_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.request_stop())
        self._connect_with_retry()
        if self._stopping.is_set():
            self._raise_if_fatal()
            return
        self.report_inventory()  # AGENT-23 and issue 11 item 3: before any loop runs
        if self._stopping.is_set():
            self._raise_if_fatal()
            return
        loops = [
            threading.Thread(target=self.heartbeat_loop, name="agent-heartbeat", daemon=True),
            threading.Thread(target=self.poll_loop, name="agent-tasks", daemon=True),
            threading.Thread(target=self.reconcile_loop, name="agent-reconcile", daemon=True),
            threading.Thread(target=self.memory_loop, name="agent-memory", daemon=True),
        ]
        for thread in loops:
            thread.start()
        while not self._stopping.wait(1.0):
            pass
        if self.fatal_error is None:
            self.stop()
        self._memory.close()
        for backend in self.backends.values():
            backend.close()
        self.client.close()
        self._raise_if_fatal()

    def _connect_with_retry(self) -> None:
        backoff = 1.0
        while not self._stopping.is_set():
            try:
                self.connect()
                return
            except ControllerError as exc:
                if isinstance(exc, Unauthorized):
                    raise AgentError(str(exc)) from exc
                log.warning("cannot reach the controller to join: %s", exc)
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF)

    def report_inventory(self) -> protocol.InventoryAnswer | None:
        """Adopt every workload the backends hold (AGENT-23), tell the controller, and watch
        the runners it answers this host should hold; retried until it gets through.

        Sent before the first task poll, so the controller may settle every task still in
        flight to this host (its dead predecessor took them) from it at once instead of
        waiting out their leases. A controller that does not know the call (an older one)
        answers 404: the agent carries on without, as before.
        """
        backoff = 1.0
        while not self._stopping.is_set():
            adopted, complete = self.take_inventory()
            try:
                answer = self.client.post_inventory(sorted(adopted), complete=complete)
            except Unauthorized as exc:
                self._fatal(exc)
                return None
            except ControllerUnavailable as exc:
                log.warning("cannot send the inventory: %s", exc)
                if self._stopping.wait(backoff):
                    return None
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            except ControllerError as exc:
                log.warning("the controller took no inventory (%s); carrying on without", exc)
                return None
            self.expect(answer.runners)
            log.info(
                "inventory: %d workloads here, %d tasks settled, %d runners expected",
                len(adopted),
                answer.settled,
                len(answer.runners),
            )
            return answer
        return None

    def _raise_if_fatal(self) -> None:
        if self.fatal_error is not None:
            raise AgentError(self.fatal_error)

    def stop(self, grace: float | None = None) -> None:
        """AGENT-19: start no new task, wait up to `grace` (agent.shutdown_grace) for those in
        flight, send one last report, and never stop or remove a runner."""
        if grace is None:
            grace = self.tunables.shutdown_grace
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.request_stop()
        self._admission.wake()  # AGENT-07: creates waiting for the slot give up now
        self._log_relay.cancel_all()  # a relay is tied to viewers, not to the runners
        if not self.wait_for_tasks(grace):
            log.warning("shutting down with tasks still in flight after %.0f s", grace)
        if self.fatal_error is None:
            try:
                self.reconcile_once(final=True)
            except ControllerError as exc:
                log.warning("the last report did not reach the controller: %s", exc)
        log.info("agent stopped; its runners carry on")
