"""What a runner is registered with: the labels its jobs ask for (issue 8 item 6)."""

from __future__ import annotations

from datetime import UTC, datetime

from runners.github.labels import runner_labels
from runners.scheduler import JobView, PoolView
from runners.scheduler.matching import job_matches_pool


def test_sched04_a_jit_runner_carries_self_hosted_its_os_and_arch_and_the_pools_labels():
    """SCHED-04: the body carries self-hosted, the platform's OS and arch, the labels, the name."""
    assert runner_labels(["gpu", "e2e"], "zoomies-gpu", "linux/x64") == [
        "self-hosted", "Linux", "X64", "gpu", "e2e", "zoomies-gpu",
    ]  # fmt: skip
    assert runner_labels(["GPU"], "zoomies-mac", "darwin/aarch64") == [
        "self-hosted", "macOS", "ARM64", "GPU", "zoomies-mac",
    ]  # fmt: skip


def test_a_pool_without_a_platform_claims_no_os_or_arch_and_duplicates_go():
    assert runner_labels(["Self-Hosted", "linux", "gpu", "gpu"], "zoomies-x", "") == [
        "self-hosted", "linux", "gpu", "zoomies-x",
    ]  # fmt: skip
    assert runner_labels(None, "zoomies-x", None) == ["self-hosted", "zoomies-x"]


def test_every_label_the_scheduler_matches_a_job_on_is_in_the_registration():
    """SCHED-04: a job the scheduler gives a pool finds all its labels on the pool's runner."""

    pool = PoolView(
        id=1, name="zoomies-gpu", labels=("gpu",), backend="process", platform="linux/amd64",
        host_selector=(), image="", cpus=None, memory_mb=None,
    )  # fmt: skip
    job = JobView(
        id=1, labels=("self-hosted", "Linux", "X64", "gpu"), repository="acme/app",
        installation_id=None, created_at=datetime.now(UTC),
    )  # fmt: skip
    assert job_matches_pool(job, pool)
    registered = {label.lower() for label in runner_labels(pool.labels, pool.name, pool.platform)}
    assert {label.lower() for label in job.labels} <= registered
