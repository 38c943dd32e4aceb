"""Installations, pools, runners, jobs and webhook deliveries."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from runners import naming
from runners.github.programs import PROCESS_IMAGES
from runners.states import JobStatus, RunnerState
from zoomies_site.core.registry.types import env_var_problem

# Bounds of a pool's figures: wide enough for any real machine, narrow enough that a typo
# (cpus 1e300, memory -1) is refused rather than stored and scheduled against.
MAX_POOL_CPUS = 1024.0
MIN_POOL_MEMORY_MB, MAX_POOL_MEMORY_MB = 16, 16 * 1024 * 1024
MAX_POOL_RUNNERS = 10_000
MAX_LABELS, MAX_LABEL_LENGTH = 100, 100
MAX_SELECTOR_PAIRS, MAX_SELECTOR_TEXT = 50, 200
MAX_IDLE_TIMEOUT = timedelta(days=30)
MAX_RUNNER_GROUP_ID = 2**31 - 1
MAX_ENV_VARS = 100
MAX_ENV_VALUE = 4096
# SCHED-15: a non-ephemeral runner runs `config.sh` with a registration token, and config.sh
# names a runner group by name, not by the id a pool keeps: such pools use the default group.
NON_EPHEMERAL_DEFAULT_GROUP = (
    "a non-ephemeral pool's runners join the default runner group (config.sh names a group, "
    "the pool keeps its id): set runner_group_id to 1"
)
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/(?!\.\.?$)[A-Za-z0-9_.-]+")
_PLATFORM = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]*")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text_problem(value: Any, what: str, limit: int) -> str | None:
    if not isinstance(value, str):
        return f"{what} must be a string, not {type(value).__name__}"
    if not value.strip():
        return f"{what} must not be empty"
    if len(value) > limit:
        return f"{what} is {len(value)} characters long; the limit is {limit}"
    if any(ord(c) < 32 for c in value):
        return f"{what} must not contain control characters"
    return None


def _label_errors(labels: Any) -> list[str]:
    if not isinstance(labels, list):
        return [f"labels must be a list of strings, not {type(labels).__name__}"]
    if len(labels) > MAX_LABELS:
        return [f"a pool has at most {MAX_LABELS} labels; this one has {len(labels)}"]
    errors = []
    for label in labels:
        problem = _text_problem(label, f"label {label!r}", MAX_LABEL_LENGTH)
        if problem is None and "," in label:
            problem = f"label {label!r} contains a comma, which GitHub's runner cannot take"
        if problem is not None:
            errors.append(problem)
    return errors


def _selector_errors(selector: Any) -> list[str]:
    if not isinstance(selector, dict):
        return [
            "host_selector must be a mapping of host label to value, like "
            f'{{"gpu": "a100"}}, not {type(selector).__name__}'
        ]
    if len(selector) > MAX_SELECTOR_PAIRS:
        return [f"host_selector has at most {MAX_SELECTOR_PAIRS} entries"]
    errors = []
    for key, value in selector.items():
        problem = _text_problem(key, f"host_selector key {key!r}", MAX_SELECTOR_TEXT)
        problem = problem or _text_problem(
            value, f"host_selector value for {key!r}", MAX_SELECTOR_TEXT
        )
        if problem is not None:
            errors.append(problem)
    return errors


def _env_errors(env: Any) -> list[str]:
    if not isinstance(env, dict):
        return ['env must be a mapping of name to value, like {"HTTP_PROXY": "..."}']
    if len(env) > MAX_ENV_VARS:
        return [f"env has at most {MAX_ENV_VARS} variables"]
    errors = []
    for name, value in env.items():
        problem = env_var_problem(name)
        if problem is None and not isinstance(value, str):
            problem = f"env {name}'s value must be a string, not {type(value).__name__}"
        if problem is None and (len(value) > MAX_ENV_VALUE or "\x00" in value):
            problem = f"env {name}'s value must be at most {MAX_ENV_VALUE} characters, no NUL"
        if problem is not None:
            errors.append(problem)
    return errors


def _image_errors(backend: Any, image: Any, platform: Any) -> list[str]:
    if not isinstance(image, str):
        return [f"image must be a string, not {type(image).__name__}"]
    if backend == Pool.Backend.PROCESS:
        # A process runner runs as the agent's user on the host: the image names one of
        # the programs this codebase knows, never a path or a command of the operator's.
        if image and image not in PROCESS_IMAGES:
            return [
                f"the process backend runs only {' or '.join(PROCESS_IMAGES)} (blank: "
                f"{naming.PROCESS_RUNNER}), not {image!r}: never a path or a command"
            ]
        return []
    if not image:
        try:
            naming.default_image(platform if isinstance(platform, str) else "", str(backend))
        except ValueError as exc:
            return [str(exc)]
        return []
    if len(image) > 300 or not _IMAGE.fullmatch(image):
        return [f"image {image[:80]!r} is not a container image reference"]
    return []


def _bounded(value: Any, what: str, low: float, high: float, *, integer: bool) -> list[str]:
    if value is None:
        return []
    if not _is_number(value) or (integer and not isinstance(value, int)):
        kind = "a whole number" if integer else "a number"
        return [f"{what} must be {kind}"]
    if not math.isfinite(value) or not low <= value <= high:
        return [f"{what} must be between {_figure(low)} and {_figure(high)}, not {value:g}"]
    return []


def _figure(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def pool_errors(values: Mapping[str, Any]) -> dict[str, list[str]]:
    """Everything wrong with a pool's values, by field; {} when it is a pool we can run.

    The one validation of a pool: `Pool.clean()` (the admin's forms), the API's serializer
    and any other source of pools call this, so they accept and refuse the same pools.
    Absent keys take the model's defaults.
    """
    get = values.get
    backend = get("backend", Pool.Backend.DOCKER)
    errors: dict[str, list[str]] = {}

    def add(field: str, found: list[str]) -> None:
        if found:
            errors.setdefault(field, []).extend(found)

    try:
        naming.validate_pool_name(get("name"))
    except ValueError as exc:
        add("name", [str(exc)])
    add("labels", _label_errors(get("labels", [])))
    add("host_selector", _selector_errors(get("host_selector", {})))
    add("env", _env_errors(get("env", {})))
    if backend not in Pool.Backend.values:
        add("backend", [f"backend must be one of {', '.join(Pool.Backend.values)}"])
    else:
        add("image", _image_errors(backend, get("image", ""), get("platform", "")))
    platform = get("platform", "")
    if platform and (not isinstance(platform, str) or not _PLATFORM.fullmatch(platform)):
        add("platform", ["platform must look like linux/x64 (or name just the OS)"])
    repository = get("repository", "")
    if repository and (
        not isinstance(repository, str)
        or len(repository) > 200
        or not _REPOSITORY.fullmatch(repository)
    ):
        add("repository", ["repository must be owner/name, or blank for the organisation"])
    add("cpus", _bounded(get("cpus"), "cpus", 0.01, MAX_POOL_CPUS, integer=False))
    add(
        "memory_mb",
        _bounded(
            get("memory_mb"), "memory_mb", MIN_POOL_MEMORY_MB, MAX_POOL_MEMORY_MB, integer=True
        ),
    )
    max_runners = get("max_runners", 10)
    warm = get("warm", 0)
    add("max_runners", _bounded(max_runners, "max_runners", 0, MAX_POOL_RUNNERS, integer=True))
    add("warm", _bounded(warm, "warm", 0, MAX_POOL_RUNNERS, integer=True))
    if "warm" not in errors and "max_runners" not in errors and warm > max_runners:
        add("warm", [f"warm ({warm}) must not be above max_runners ({max_runners})"])
    add(
        "runner_group_id",
        _bounded(
            get("runner_group_id", 1), "runner_group_id", 1, MAX_RUNNER_GROUP_ID, integer=True
        ),
    )
    idle = get("idle_timeout")
    if idle is not None and (
        not isinstance(idle, timedelta) or not timedelta(0) <= idle <= MAX_IDLE_TIMEOUT
    ):
        add("idle_timeout", ["idle_timeout must be between 0 and 30 days (0 or blank: never)"])
    if get("ephemeral", True) is False and get("runner_group_id", 1) != 1:
        add("runner_group_id", [NON_EPHEMERAL_DEFAULT_GROUP])
    if get("dind", False) and backend not in naming.CONTAINER_BACKENDS:
        add("dind", ["dind needs a container backend (docker or podman)"])
    return errors


def validate_repository_names(value: object) -> None:
    """An installation's repositories: a list of owner/name strings (API, command, admin)."""
    if not isinstance(value, list) or not all(
        isinstance(r, str) and r.count("/") == 1 and all(r.split("/")) for r in value
    ):
        raise ValidationError("a list of owner/name strings")


class Installation(models.Model):
    """A GitHub App installation: the account whose runners and jobs Zoomies manages."""

    class Kind(models.TextChoices):
        ORG = "org"
        REPO = "repo"
        ENTERPRISE = "enterprise"

    github_id = models.BigIntegerField(unique=True, validators=[MinValueValidator(1)])
    account = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ORG)
    repositories = models.JSONField(
        default=list,
        blank=True,
        help_text="owner/name of the repositories it covers",
        validators=[validate_repository_names],
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # POLL-03/POLL-06: webhook health and the rate-limit stand-down belong to the installation.
    last_webhook_at = models.DateTimeField(null=True, blank=True)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_reaped_at = models.DateTimeField(null=True, blank=True)
    standdown_until = models.DateTimeField(null=True, blank=True)
    standdown_reason = models.CharField(max_length=300, blank=True)
    # Every repository a runner of this installation was registered at, so the reap keeps
    # listing it after the pool moved elsewhere or was deleted (issue 21 item 7); a reap that
    # finds nothing of ours there any more forgets it.
    registered_repositories = models.JSONField(default=list, blank=True)
    # Issue 21 item 5: credential mints that keep failing (a 404 for an installation GitHub
    # no longer knows): how many in a row, since when, the last error, and when to try again.
    mint_failures = models.PositiveIntegerField(default=0)
    mint_failing_since = models.DateTimeField(null=True, blank=True)
    mint_error = models.CharField(max_length=300, blank=True)
    mint_retry_at = models.DateTimeField(null=True, blank=True)
    # Issue 29 item 1: when the reconcile pass last listed this installation's registrations
    # to see which new runners GitHub shows online (at most every runners.ONLINE_CHECK_EVERY).
    online_checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.account} ({self.github_id})"


class Pool(models.Model):
    """A kind of runner: labels, where it may run, what it runs, and how many."""

    class Backend(models.TextChoices):
        DOCKER = "docker"
        PODMAN = "podman"
        PROCESS = "process"

    name = models.CharField(max_length=64, unique=True)
    installation = models.ForeignKey(
        Installation, null=True, blank=True, on_delete=models.SET_NULL, related_name="pools"
    )
    repository = models.CharField(
        max_length=200, blank=True, help_text="owner/name for repository-level runners; blank: org"
    )
    labels = models.JSONField(default=list, blank=True)
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.DOCKER)
    platform = models.CharField(max_length=32, blank=True, help_text="e.g. linux/x64; blank: any")
    host_selector = models.JSONField(default=dict, blank=True)
    image = models.CharField(max_length=300, blank=True)
    cpus = models.FloatField(null=True, blank=True)
    memory_mb = models.IntegerField(null=True, blank=True)
    dind = models.BooleanField(default=False)
    # BACK-12: variables for this pool's runners, over runners.env key by key (BACK-11: it
    # may name ZOOMIES_DOCKER_WAIT to say otherwise than runners.docker_wait).
    env = models.JSONField(default=dict, blank=True)
    ephemeral = models.BooleanField(default=True)
    warm = models.PositiveIntegerField(default=0)
    max_runners = models.PositiveIntegerField(default=10)
    paused = models.BooleanField(default=False)
    idle_timeout = models.DurationField(null=True, blank=True)
    runner_group_id = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    # SCHED-29..33: a pool the controller keeps from the hosts has an auto_key; its labels,
    # platform, backend, cpus, memory_mb and the three below are then the controller's
    # (runners.auto_pools writes them), everything else the operator's.
    auto_key = models.CharField(max_length=80, null=True, blank=True, unique=True)
    size_class = models.CharField(max_length=16, blank=True)
    size_class_since = models.DateTimeField(null=True, blank=True)
    auto_active = models.BooleanField(
        default=True, help_text="an automatic pool with no host left is kept but given no runner"
    )

    # The fields `pool_errors` judges.
    VALIDATED_FIELDS = (
        "name", "repository", "labels", "backend", "platform", "host_selector", "image",
        "cpus", "memory_mb", "dind", "warm", "max_runners", "idle_timeout", "runner_group_id",
        "ephemeral", "env",
    )  # fmt: skip

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The one pool validation (`pool_errors`), for the admin and the API alike."""
        super().clean()
        errors = pool_errors({f: getattr(self, f) for f in self.VALIDATED_FIELDS})
        if errors:
            raise ValidationError(errors)


class Runner(models.Model):
    """One runner: a row written before the workload exists, reaped once it is gone.

    `state` moves only through `runners.transitions.transition_runner`.
    """

    name = models.CharField(max_length=64, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="runners")
    host = models.ForeignKey(
        "fleet.Host", null=True, blank=True, on_delete=models.SET_NULL, related_name="runners"
    )
    installation = models.ForeignKey(
        Installation, null=True, blank=True, on_delete=models.SET_NULL, related_name="runners"
    )
    state = models.CharField(
        max_length=16, choices=RunnerState.choices, default=RunnerState.PROVISIONING
    )
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)
    phase = models.CharField(max_length=32, blank=True)
    github_runner_id = models.BigIntegerField(null=True, blank=True)
    image = models.CharField(max_length=300, blank=True)
    cpus = models.FloatField(null=True, blank=True)
    memory_mb = models.IntegerField(null=True, blank=True)
    # BACK-09: who gave each figure above, "pool" (typed on it) or "host" (one slot's share
    # of its allocatable machine), written at create and never recomputed, so an OOM kill
    # can say which limit it was. Blank: no figure.
    cpus_from = models.CharField(max_length=8, blank=True)
    memory_from = models.CharField(max_length=8, blank=True)
    # HOST-29: MB its agent's memory valve lent it above `memory_mb` (only ever rises; a
    # loan is never taken back), charged to its host by the placement ledger until it ends.
    lent_memory_mb = models.PositiveIntegerField(default=0)
    # HOST-31: what the valve in observe mode would have lent it; recorded, never charged.
    would_lend_memory_mb = models.PositiveIntegerField(default=0)
    # HOST-32: why its agent's valve could not raise a limit it needed, and when (shown for
    # 15 min: runners.host_facts.MEMORY_BLOCKED_FOR).
    memory_blocked = models.CharField(max_length=300, blank=True)
    memory_blocked_at = models.DateTimeField(null=True, blank=True)
    ephemeral = models.BooleanField(default=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # Issue 8 item 7: when GitHub confirmed the idle drain's deregistration (or a failed
    # runner's, issue 29 item 4). A runner with no registration takes no job, so its clean
    # exit stands for none (unlinked_exits).
    deregistered_at = models.DateTimeField(null=True, blank=True)
    # Issue 8 item 7: GitHub answered the idle drain "busy" (422); not asked again before this.
    # A failed runner's deregistration waits on it the same way (runners.registrations).
    drain_deferred_until = models.DateTimeField(null=True, blank=True)
    # Issue 29 item 1: when GitHub first showed the registration online (or gave it a job).
    # Until then the runner is still starting, whatever its process says, and the provision
    # timeout applies to it.
    online_at = models.DateTimeField(null=True, blank=True)
    # When it entered failed (kept after the failed retention moves it to removed), so a
    # pool's failed starts can be counted (issue 21 item 5, issue 29 item 4).
    failed_at = models.DateTimeField(null=True, blank=True)
    # The end of a failed runner's output, as its agent read it before deleting the workload
    # (issue 8 item 14): the output file itself is gone with the runner's directory.
    output_tail = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=RunnerState.values), name="runner_state_valid"
            )
        ]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    """A GitHub workflow job as the controller last heard of it; it never moves backwards."""

    github_id = models.BigIntegerField(unique=True)
    run_id = models.BigIntegerField(null=True, blank=True)
    installation = models.ForeignKey(
        Installation, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    repository = models.CharField(max_length=200)
    name = models.CharField(max_length=300, blank=True)
    labels = models.JSONField(default=list)
    status = models.CharField(max_length=16, choices=JobStatus.choices)
    conclusion = models.CharField(max_length=32, blank=True)
    runner = models.ForeignKey(
        Runner, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    runner_name = models.CharField(max_length=200, blank=True)
    fleet_failure = models.CharField(
        max_length=300, blank=True, help_text="why the fleet, not the workflow, failed this job"
    )
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField()
    source = models.CharField(max_length=16, default="webhook", help_text="webhook or poll")
    # Written by the reconcile pass only (runners.waits): why a queued job has no runner yet,
    # as the latest plan saw it. Meaningful while the job is queued.
    wait_reason = models.CharField(max_length=500, blank=True)
    wait_reason_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="job_status_valid"
            )
        ]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"job {self.github_id} ({self.status})"


class WebhookDelivery(models.Model):
    """One accepted delivery, unique on X-GitHub-Delivery so a redelivery changes nothing."""

    delivery_id = models.CharField(max_length=100, unique=True)
    event = models.CharField(max_length=64)
    action = models.CharField(max_length=64, blank=True)
    installation = models.ForeignKey(
        Installation, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    repository = models.CharField(max_length=200, blank=True)
    received_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.event}.{self.action} {self.delivery_id}"


class SweptRun(models.Model):
    """A workflow run the poller has met, with its status and `updated_at` then (`stamp`).

    The poller's memory of what it already knows, kept in the database so that it outlives
    the process: every django-q worker shares it, and a restarted controller lists only the
    runs that changed while it was down, not every queued run again. Losing a row costs one
    call, never a job: a run with no row is listed.
    """

    installation = models.ForeignKey(Installation, on_delete=models.CASCADE)
    repository = models.CharField(max_length=200, help_text="owner/name, lower case")
    run_id = models.BigIntegerField()
    stamp = models.CharField(max_length=100)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["installation", "repository", "run_id"], name="swept_run_unique"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} of {self.repository}: {self.stamp}"


class RedeliveryState(models.Model):
    """How far the redelivery pass has read the App webhook's deliveries at GitHub, and the
    hold a rate limit put on it; one row, named "app" (an App has one webhook)."""

    name = models.CharField(max_length=32, unique=True)
    # The next pass reads back to this, less runners.redelivery_plan.OVERLAP.
    seen_until = models.DateTimeField(null=True, blank=True)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    held_reason = models.CharField(max_length=300, blank=True)

    def __str__(self) -> str:
        return f"redelivery {self.name}: seen until {self.seen_until}"


class RedeliveryOutcome(models.TextChoices):
    ASKING = "asking"  # claimed; the call is being made (left so if the process died)
    ASKED = "asked"  # GitHub answered 202
    REFUSED = "refused"  # GitHub said no (unknown, or past its window)


class RedeliveryRequest(models.Model):
    """A failed delivery the redelivery pass asked GitHub to send again, unique on its guid
    (X-GitHub-Delivery): a guid is asked for once, whatever restarts happen in between."""

    Outcome = RedeliveryOutcome

    guid = models.CharField(max_length=100, unique=True)
    github_delivery_id = models.BigIntegerField()
    event = models.CharField(max_length=64)
    action = models.CharField(max_length=64, blank=True)
    delivered_at = models.DateTimeField(db_index=True)
    failed_status = models.CharField(max_length=200)
    reason = models.CharField(max_length=300)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    message = models.CharField(max_length=300, blank=True)
    asked_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=RedeliveryOutcome.values),
                name="redelivery_outcome_valid",
            )
        ]

    def __str__(self) -> str:
        return f"redelivery of {self.guid} ({self.outcome})"
