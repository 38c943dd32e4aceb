"""SCHED-04, SCHED-06: label matching and platform fit, table-driven."""

from __future__ import annotations

import pytest

from runners.scheduler import (
    assign_jobs,
    decide,
    host_offers_pool,
    job_matches_pool,
    platforms_fit,
    pool_for_job,
)
from runners.scheduler.matching import normalise_platform

from .builders import host, job, jobs, pool, snapshot

LINUX_X64 = pool(1, "zoomies-linux-x64", platform="linux/x64")


@pytest.mark.parametrize(
    "labels,pool_kwargs,matches",
    [
        # The implied labels: self-hosted, and the platform's OS and arch.
        (("self-hosted",), {}, True),
        (("self-hosted", "linux", "x64"), {}, True),
        (("Self-Hosted", "Linux", "X64"), {}, True),
        (("linux",), {}, True),
        (("self-hosted", "linux", "ARM64"), {}, False),
        (("self-hosted", "linux", "arm64"), {"platform": "linux/arm64"}, True),
        (("self-hosted", "Linux", "ARM64"), {"platform": "linux/aarch64"}, True),
        (("self-hosted", "x64"), {"platform": "linux/amd64"}, True),
        (("self-hosted", "windows"), {}, False),
        (("self-hosted", "macOS", "ARM64"), {"platform": "macos/arm64"}, True),
        (("self-hosted", "macos"), {"platform": "darwin/arm64"}, True),
        # A pool that names no platform implies no OS or arch label.
        (("self-hosted", "linux"), {"platform": None}, False),
        (("self-hosted", "linux"), {"platform": None, "labels": ("Linux",)}, True),
        # The pool's own labels, case-insensitively.
        (("self-hosted", "gpu"), {"labels": ("GPU",)}, True),
        (("self-hosted", "gpu", "big"), {"labels": ("gpu",)}, False),
        (("gpu",), {"labels": (" gpu ",)}, True),
        # GitHub-hosted labels never match.
        (("ubuntu-latest",), {}, False),
        # No labels at all: nothing to route.
        ((), {}, False),
    ],
)
def test_sched04_label_matching_table(
    labels: tuple[str, ...], pool_kwargs: dict[str, object], matches: bool
) -> None:
    assert job_matches_pool(job(labels=labels), pool(**pool_kwargs)) is matches  # type: ignore[arg-type]


def test_sched04_a_pool_bound_to_an_installation_takes_only_its_jobs() -> None:
    bound = pool(installation_id=7)
    assert job_matches_pool(job(installation_id=7), bound)
    assert not job_matches_pool(job(installation_id=8), bound)
    assert job_matches_pool(job(installation_id=None), bound)
    assert job_matches_pool(job(installation_id=8), pool(installation_id=None))


def test_sched04_a_job_matching_two_pools_is_counted_for_the_most_specific_one() -> None:
    general = pool(1, "zoomies-linux-x64")
    gpu = pool(2, "zoomies-gpu", labels=("gpu",))
    plain = job(labels=("self-hosted", "linux"))
    assert pool_for_job(plain, (gpu, general)) == general
    wants_gpu = job(labels=("self-hosted", "gpu"))
    assert pool_for_job(wants_gpu, (gpu, general)) == gpu


def test_sched04_equal_fits_go_to_the_lowest_pool_id() -> None:
    first, second = pool(5, "zoomies-b"), pool(3, "zoomies-a")
    assert pool_for_job(job(), (first, second)) == second


def test_sched04_an_unpaused_pool_is_preferred_over_a_paused_one() -> None:
    paused = pool(1, "zoomies-a", paused=True)
    open_pool = pool(2, "zoomies-b", labels=("extra",))
    assert pool_for_job(job(), (paused, open_pool)) == open_pool
    assert pool_for_job(job(), (paused,)) == paused


def test_sched04_a_job_seen_twice_is_counted_once() -> None:
    one = job(id=42)
    assigned = assign_jobs((one, one), (LINUX_X64,))
    assert assigned == {LINUX_X64.id: (one,)}


def test_sched04_a_job_matching_two_pools_creates_runners_in_one() -> None:
    pools = (pool(1, "zoomies-a"), pool(2, "zoomies-b"))
    plan = decide(snapshot(pools, (host(capacity=10),), queued=jobs(3)))
    assert {c.pool_id for c in plan.creates} == {1}
    assert len(plan.creates) == 3


@pytest.mark.parametrize(
    "pool_platform,host_platform,fits",
    [
        (None, None, True),
        (None, "linux/arm64", True),
        ("linux/arm64", None, True),
        ("linux/x64", "linux/x64", True),
        ("linux/x64", "Linux/AMD64", True),
        ("linux/x64", "linux/arm64", False),
        ("linux/x64", "windows/x64", False),
        ("linux", "linux/arm64", True),
        ("linux/arm64", "linux", True),
        ("windows", "linux", False),
        ("", "linux/x64", True),
    ],
)
def test_sched06_platform_fit(
    pool_platform: str | None, host_platform: str | None, fits: bool
) -> None:
    assert platforms_fit(pool_platform, host_platform) is fits


@pytest.mark.parametrize(
    "platform,canonical",
    [
        ("linux/x64", "linux/x64"),
        ("Linux/X86_64", "linux/x64"),
        ("darwin/aarch64", "macos/arm64"),
        ("linux", "linux"),
        ("", None),
        (None, None),
    ],
)
def test_sched06_platforms_are_normalised(platform: str | None, canonical: str | None) -> None:
    assert normalise_platform(platform) == canonical


@pytest.mark.parametrize(
    "host_kwargs,offers",
    [
        ({}, True),
        ({"backends": ("podman",)}, False),
        ({"backends": ("Podman", "Docker")}, True),
        ({"platform": "linux/arm64"}, False),
        ({"platform": None}, True),
        ({"labels": (("gpu", "a100"),)}, True),
        ({"labels": (("gpu", "a100"), ("zone", "b"))}, True),
    ],
)
def test_sched05_host_offers_pool(host_kwargs: dict[str, object], offers: bool) -> None:
    assert host_offers_pool(host(**host_kwargs), pool()) is offers  # type: ignore[arg-type]


def test_sched05_a_host_selector_needs_every_pair() -> None:
    selective = pool(host_selector=(("gpu", "a100"), ("zone", "b")))
    assert not host_offers_pool(host(labels=(("gpu", "a100"),)), selective)
    assert not host_offers_pool(host(labels=(("gpu", "h100"), ("zone", "b"))), selective)
    assert host_offers_pool(host(labels=(("zone", "b"), ("gpu", "a100"), ("x", "y"))), selective)
