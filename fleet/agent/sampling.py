"""Sampling the runners' resource use apart from lifecycle work (HOST-12).

A container engine's non-streaming stats call can take over a second by design, so one
pass asks for at most four at once, gives each five seconds and the pass twenty: on a
loaded host a tighter budget made every sample fail together. A sample that fails or is
not back in time keeps the previous value, with the time it was taken, so a reader can
tell how old it is. The clock is a parameter: tests move it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger("zoomies.agent")

MAX_IN_FLIGHT = 4
SAMPLE_SECONDS = 5.0
PASS_SECONDS = 20.0

T = TypeVar("T")


@dataclass(frozen=True)
class Sampled(Generic[T]):
    """A runner's last good sample, when it was taken, and whether this pass renewed it."""

    value: T
    at: float
    fresh: bool


class RunnerSampler(Generic[T]):
    """`read(runner_id)` answers one runner's sample (None: nothing to sample, such as a
    runner with no container); it may raise or hang, and neither stops the pass."""

    def __init__(
        self,
        read: Callable[[int], T | None],
        *,
        clock: Callable[[], float],
        max_in_flight: int = MAX_IN_FLIGHT,
        sample_seconds: float = SAMPLE_SECONDS,
        pass_seconds: float = PASS_SECONDS,
    ) -> None:
        self.read = read
        self.clock = clock
        self.sample_seconds = sample_seconds
        self.pass_seconds = pass_seconds
        self.max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="zoomies-sample")
        self._last: dict[int, Sampled[T]] = {}
        self.failures = 0  # samples that failed or timed out, for the operator's log

    def sample(self, runner_ids: Iterable[int]) -> dict[int, Sampled[T]]:
        """One pass over `runner_ids`; each answered with its new sample or its last good
        one (fresh=False). A runner never sampled well is left out until it is."""
        ids = list(dict.fromkeys(runner_ids))
        started = self.clock()
        futures: dict[Future[T | None], tuple[int, float]] = {}
        pending = list(ids)
        results: dict[int, Sampled[T]] = {}
        while pending or futures:
            while pending and len(futures) < self.max_in_flight:
                runner_id = pending.pop(0)
                futures[self._pool.submit(self.read, runner_id)] = (runner_id, self.clock())
            left = self.pass_seconds - (self.clock() - started)
            if left <= 0:
                break
            done, _ = wait(list(futures), timeout=min(left, self._soonest_due(futures)),
                           return_when=FIRST_COMPLETED)  # fmt: skip
            now = self.clock()
            for future in done:
                runner_id, _asked = futures.pop(future)
                self._take(runner_id, future, now, results)
            for future, (runner_id, asked) in list(futures.items()):
                if now - asked >= self.sample_seconds:  # given up on; the thread ends alone
                    futures.pop(future)
                    self._failed(runner_id, "no answer within the sample's 5 s")
        for future, (runner_id, _asked) in futures.items():
            future.cancel()
            self._failed(runner_id, "the pass's 20 s ran out")
        for runner_id in pending:
            self._failed(runner_id, "the pass's 20 s ran out before it was asked")
        for runner_id in ids:
            if runner_id not in results and runner_id in self._last:
                last = self._last[runner_id]
                results[runner_id] = Sampled(last.value, last.at, fresh=False)
        for gone in set(self._last) - set(ids):
            del self._last[gone]
        return results

    def _soonest_due(self, futures: dict[Future[T | None], tuple[int, float]]) -> float:
        now = self.clock()
        return max(0.01, min(self.sample_seconds - (now - a) for _, a in futures.values()))

    def _take(self, runner_id: int, future: Future[T | None], now: float,
              results: dict[int, Sampled[T]]) -> None:  # fmt: skip
        try:
            value = future.result()
        except Exception as exc:  # one runner's sample must not fail the pass
            self._failed(runner_id, str(exc))
            return
        if value is None:
            return
        self._last[runner_id] = results[runner_id] = Sampled(value, now, fresh=True)

    def _failed(self, runner_id: int, why: str) -> None:
        self.failures += 1
        log.debug("sampling runner %s failed (%s); its last sample stands", runner_id, why)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
