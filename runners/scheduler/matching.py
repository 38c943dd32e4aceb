"""Label matching and platform fit: which pool a queued job is for, which hosts fit a pool.

This is the only place these judgements are made (SCHED-04); the reconcile pass, the UI
and the capacity planner ask here rather than comparing labels themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from runners.scheduler.model import HostView, JobView, PoolView

# Spellings a platform may arrive in (Docker's, uname's, GitHub's) mapped to ours.
_OS_ALIASES = {"darwin": "macos", "osx": "macos", "mac": "macos", "win": "windows"}
_ARCH_ALIASES = {
    "amd64": "x64",
    "x86_64": "x64",
    "x86-64": "x64",
    "aarch64": "arm64",
    "arm64v8": "arm64",
    "armv7": "arm",
    "armv7l": "arm",
}


def parse_platform(platform: str | None) -> tuple[str | None, str | None]:
    """Split "linux/x64" into ("linux", "x64"), normalising aliases and case.

    None or "" gives (None, None); "linux" alone gives ("linux", None).
    """
    if not platform or not platform.strip():
        return None, None
    os_part, _, arch_part = platform.strip().lower().partition("/")
    os_name = _OS_ALIASES.get(os_part.strip(), os_part.strip()) or None
    arch = _ARCH_ALIASES.get(arch_part.strip(), arch_part.strip()) or None
    return os_name, arch


def normalise_platform(platform: str | None) -> str | None:
    """The canonical spelling of a platform, e.g. "Linux/AMD64" -> "linux/x64"."""
    os_name, arch = parse_platform(platform)
    if os_name is None:
        return None
    return f"{os_name}/{arch}" if arch else os_name


def platforms_fit(pool_platform: str | None, host_platform: str | None) -> bool:
    """True unless both name a platform and they differ (SCHED-06).

    A side that names nothing, or names an OS without an architecture, constrains nothing
    it did not name, so giving either side a platform can only narrow placement.
    """
    return parsed_platforms_fit(parse_platform(pool_platform), parse_platform(host_platform))


def parsed_platforms_fit(
    pool_platform: tuple[str | None, str | None], host_platform: tuple[str | None, str | None]
) -> bool:
    """`platforms_fit` on platforms already split by `parse_platform`."""
    pool_os, pool_arch = pool_platform
    host_os, host_arch = host_platform
    if pool_os and host_os and pool_os != host_os:
        return False
    return not (pool_arch and host_arch and pool_arch != host_arch)


def pool_label_set(pool: PoolView) -> frozenset[str]:
    """The labels a pool's runners answer to, lowercased.

    Its own labels, "self-hosted", and the OS and architecture of its platform, as GitHub
    gives every self-hosted runner ("Linux"/"X64" match case-insensitively).
    """
    labels = {label.strip().lower() for label in pool.labels if label.strip()}
    labels.add("self-hosted")
    os_name, arch = parse_platform(pool.platform)
    labels.update(part for part in (os_name, arch) if part)
    return frozenset(labels)


def job_label_set(job: JobView) -> frozenset[str]:
    """A job's runs-on labels, lowercased."""
    return frozenset(label.strip().lower() for label in job.labels if label.strip())


def job_matches_pool(job: JobView, pool: PoolView) -> bool:
    """True when the pool's runners could take the job.

    Every runs-on label must be among the pool's labels, and a pool bound to an
    installation takes only that installation's jobs (a runner registered in one account
    cannot run another's). A job with no labels matches nothing: there is nothing to route.
    """
    wanted = job_label_set(job)
    if not wanted:
        return False
    if (
        pool.installation_id is not None
        and job.installation_id is not None
        and pool.installation_id != job.installation_id
    ):
        return False
    return wanted <= pool_label_set(pool)


def pool_for_job(job: JobView, pools: Iterable[PoolView]) -> PoolView | None:
    """The one pool a job is counted for, or None.

    A job matching several pools is counted once, so it never brings runners up in two.
    Preference: a pool that is not paused, then the fewest labels beyond what the job
    asked for (the most specific fit), then the lowest id.
    """
    wanted = job_label_set(job)
    candidates = [pool for pool in pools if job_matches_pool(job, pool)]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda pool: (pool.paused, len(pool_label_set(pool) - wanted), pool.id),
    )


def assign_jobs(
    jobs: Iterable[JobView], pools: Iterable[PoolView]
) -> Mapping[int, tuple[JobView, ...]]:
    """Queued jobs by the id of the pool each is counted for; unmatched jobs are left out.

    A job id seen twice in the snapshot is counted once.
    """
    pool_list = tuple(pools)
    by_pool: dict[int, list[JobView]] = {}
    seen: set[int] = set()
    # A total order, so which copy of a repeated id wins never depends on input order.
    ordered = sorted(
        jobs,
        key=lambda j: (
            j.id,
            j.created_at,
            j.labels,
            j.repository,
            j.installation_id is None,
            j.installation_id or 0,
        ),
    )
    index = PoolIndex(pool_list)
    label_sets: dict[tuple[str, ...], frozenset[str]] = {}
    for job in ordered:
        if job.id in seen:
            continue
        seen.add(job.id)
        wanted = label_sets.get(job.labels)
        if wanted is None:
            wanted = label_sets[job.labels] = job_label_set(job)
        pool = index.pool_for(wanted, job.installation_id)
        if pool is not None:
            by_pool.setdefault(pool.id, []).append(job)
    return {pool_id: tuple(found) for pool_id, found in by_pool.items()}


class PoolIndex:
    """`pool_for_job` for many jobs: pools by label, answers cached by label set.

    A job is looked up among the pools that carry its rarest label, not all of them, and
    jobs asking for the same labels from the same installation share one answer, so
    assigning J jobs to P pools costs about J, not J * P.
    """

    def __init__(self, pools: Sequence[PoolView]) -> None:
        self._labels = [(pool, pool_label_set(pool)) for pool in pools]
        self._by_label: dict[str, list[tuple[PoolView, frozenset[str]]]] = {}
        for entry in self._labels:
            for label in entry[1]:
                self._by_label.setdefault(label, []).append(entry)
        self._answers: dict[tuple[frozenset[str], int | None], PoolView | None] = {}

    def pool_for(self, wanted: frozenset[str], installation_id: int | None) -> PoolView | None:
        """What `pool_for_job` answers for a job with these labels and installation."""
        key = (wanted, installation_id)
        if key not in self._answers:
            self._answers[key] = self._find(wanted, installation_id)
        return self._answers[key]

    def _find(self, wanted: frozenset[str], installation_id: int | None) -> PoolView | None:
        if not wanted:
            return None
        postings = [self._by_label.get(label, []) for label in wanted]
        best: tuple[tuple[bool, int, int], PoolView] | None = None
        for pool, labels in min(postings, key=len):
            if not wanted <= labels:
                continue
            if (
                pool.installation_id is not None
                and installation_id is not None
                and pool.installation_id != installation_id
            ):
                continue
            key = (pool.paused, len(labels - wanted), pool.id)
            if best is None or key < best[0]:
                best = (key, pool)
        return best[1] if best is not None else None


def host_offers_pool(host: HostView, pool: PoolView) -> bool:
    """What a host is, regardless of its health or room: backend, platform, selector."""
    if pool.backend.lower() not in {backend.lower() for backend in host.backends}:
        return False
    if not platforms_fit(pool.platform, host.platform):
        return False
    return set(pool.host_selector) <= set(host.labels)


def host_accepts_work(host: HostView) -> bool:
    """Whether a host takes new runners at all right now (SCHED-05)."""
    return host.healthy and not host.cordoned and not host.pressure_hold


def describe_requirements(pool: PoolView) -> str:
    """What a host needs to run the pool, e.g. "backend docker on linux/arm64 with labels
    gpu=a100"."""
    text = f"backend {pool.backend}"
    platform = normalise_platform(pool.platform)
    if platform:
        text += f" on {platform}"
    if pool.host_selector:
        pairs = ", ".join(f"{key}={value}" for key, value in sorted(pool.host_selector))
        text += f" with labels {pairs}"
    return text
