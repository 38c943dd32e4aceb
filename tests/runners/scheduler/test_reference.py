"""The indexed scheduler decides exactly as the straightforward scans do (SCHED-02..12).

`decide` matches jobs through an index of pools by label and places runners from heaps of
hosts; `reference.decide_reference` is the same decision with a scan of every pool per job
and of every host per runner. On random fleets (small, and larger ones where many pools
share hosts and sizes, so heap entries go stale and hosts fill up) the plans must be equal,
reasons and placement notes included: the speed-up cannot change a decision unseen.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.scheduler import make_snapshot
from runners.scheduler import HostView, JobView, PoolView, RunnerView, Snapshot, decide

from .builders import NOW
from .reference import decide_reference
from .test_properties import PROPERTY, fleets

BACKENDS = ("docker", "Docker", "podman")
PLATFORMS = (None, "linux/x64", "Linux/AMD64", "linux", "linux/arm64", "windows/x64")
SELECTORS = ((), (("zone", "a"),), (("zone", "b"),), (("zone", "a"), ("gpu", "a100")))
# A negative figure is a mistyped pool, but the decision must stay the scan's even then.
SIZES = (
    (None, None, False),
    (1.0, 1024, False),
    (0.5, None, True),
    (2.0, 4096, False),
    (-0.5, None, False),
    (None, -512, False),
)


@st.composite
def crowded_fleets(draw: st.DrawFn) -> Snapshot:
    """Up to 16 hosts and 8 pools of few shapes and sizes, with more jobs than room."""
    pools = []
    for i in range(draw(st.integers(1, 8))):
        cpus, memory, dind = draw(st.sampled_from(SIZES))
        pools.append(
            PoolView(
                id=i + 1,
                name=draw(st.sampled_from(("p-a", "p-b", "p-c"))) + f"-{i}",
                labels=(f"l{draw(st.integers(0, 3))}",),
                backend=draw(st.sampled_from(BACKENDS)),
                platform=draw(st.sampled_from(PLATFORMS)),
                host_selector=draw(st.sampled_from(SELECTORS)),
                image="",
                cpus=cpus,
                memory_mb=memory,
                dind=dind,
                warm=draw(st.integers(0, 2)),
                max_runners=draw(st.sampled_from((2, 5, 40))),
                paused=draw(st.sampled_from((False,) * 5 + (True,))),
                installation_id=draw(st.sampled_from((None, None, 1))),
            )
        )
    hosts = [
        HostView(
            id=i + 1,
            name=draw(st.sampled_from(("h-a", "h-b"))) + f"-{i}",
            healthy=draw(st.sampled_from((True,) * 5 + (False,))),
            cordoned=draw(st.sampled_from((False,) * 5 + (True,))),
            backends=draw(st.sampled_from((("docker",), ("podman",), ("docker", "podman")))),
            platform=draw(st.sampled_from(PLATFORMS)),
            labels=draw(st.sampled_from(SELECTORS)),
            capacity=draw(st.integers(0, 6)),
            cpus=draw(st.sampled_from((None, 1.0, 2.0, 3.0, 8.0))),
            memory_mb=draw(st.sampled_from((None, 2048, 8192))),
            pressure_hold=draw(st.sampled_from((False,) * 7 + (True,))),
        )
        for i in range(draw(st.integers(0, 16)))
    ]
    runners = [
        RunnerView(
            id=i + 1,
            pool_id=draw(st.integers(1, len(pools) + 1)),
            host_id=draw(st.sampled_from([None, *range(1, len(hosts) + 2)])),
            state=draw(st.sampled_from(("idle", "busy", "provisioning", "failed", "draining"))),
            created_at=NOW - timedelta(seconds=draw(st.integers(0, 1800))),
            state_changed_at=NOW - timedelta(seconds=draw(st.integers(0, 60))),
            finished_at=NOW - timedelta(seconds=draw(st.integers(0, 900))),
            cpus=draw(st.sampled_from((None, 0.5, 1.0))),
            memory_mb=draw(st.sampled_from((None, 512))),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    jobs = [
        JobView(
            id=draw(st.integers(1, 60)),
            labels=draw(
                st.sampled_from(
                    (("self-hosted", "l0"), ("l1",), ("LINUX", "l2"), ("l3", "x64"), ("gpu",))
                )
            ),
            repository="octo/app",
            installation_id=draw(st.sampled_from((None, 1, 2))),
            created_at=NOW - timedelta(seconds=draw(st.integers(1, 60))),
        )
        for _ in range(draw(st.integers(0, 60)))
    ]
    return Snapshot(
        now=NOW,
        pools=tuple(pools),
        hosts=tuple(hosts),
        runners=tuple(runners),
        queued_jobs=tuple(jobs),
    )


@PROPERTY
@given(fleets())
def test_sched02_the_indexed_decision_equals_the_scan_on_random_fleets(snap: Snapshot) -> None:
    assert decide(snap) == decide_reference(snap)


@PROPERTY
@given(crowded_fleets())
def test_sched07_08_the_indexed_placement_equals_the_scan_on_crowded_fleets(
    snap: Snapshot,
) -> None:
    plan = decide(snap)
    assert plan == decide_reference(snap)


@pytest.mark.parametrize("layout", ["uniform", "partitioned"])
def test_sched07_08_the_benchmark_fleets_get_the_scan_plan(layout: str) -> None:
    """The bench's synthetic fleets, small: hundreds of placements over shared heaps."""
    snap = make_snapshot(60, 12, 600, layout)
    plan = decide(snap)
    assert len(plan.creates) > 50 and plan.blocked  # Placement and a full fleet both seen.
    assert plan == decide_reference(snap)


def test_sched07_a_charge_that_frees_cpu_reranks_the_host_for_every_kind_of_pool() -> None:
    """A mistyped pool (negative CPUs) makes its host rank better, not worse: a pool placed
    after it must see that, as the scan does. p1 takes h1; p2 (only h2 offers it) frees
    3 CPUs on h2; p3, of p1's kind, must now prefer h2 over h1."""
    hosts = tuple(
        HostView(
            id=i,
            name=f"h{i}",
            healthy=True,
            cordoned=False,
            backends=("docker",),
            platform="linux/x64",
            labels=labels,
            capacity=10,
            cpus=4.0,
            memory_mb=None,
        )  # fmt: skip
        for i, labels in ((1, ()), (2, (("zone", "b"),)))
    )

    def warm_pool(pool_id: int, cpus: float, selector: tuple[tuple[str, str], ...]) -> PoolView:
        return PoolView(
            id=pool_id, name=f"p{pool_id}", labels=(f"l{pool_id}",), backend="docker",
            platform="linux/x64", host_selector=selector, image="", cpus=cpus,
            memory_mb=None, warm=1,
        )  # fmt: skip

    busy = tuple(
        RunnerView(
            id=i,
            pool_id=99,
            host_id=2,
            state="busy",
            created_at=NOW,
            state_changed_at=NOW,
            cpus=1.0,
        )  # fmt: skip
        for i in (1, 2)
    )
    snap = Snapshot(
        now=NOW,
        pools=(warm_pool(1, 1.0, ()), warm_pool(2, -3.0, (("zone", "b"),)), warm_pool(3, 1.0, ())),
        hosts=hosts,
        runners=busy,
        queued_jobs=(),
    )
    plan = decide(snap)
    assert [(c.pool_id, c.host_id) for c in plan.creates] == [(1, 1), (2, 2), (3, 2)]
    assert plan == decide_reference(snap)
