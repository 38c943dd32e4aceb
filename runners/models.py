"""Installations, pools, runners, jobs and webhook deliveries."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from runners.states import JobStatus, RunnerState


class Installation(models.Model):
    """A GitHub App installation: the account whose runners and jobs Zoomies manages."""

    class Kind(models.TextChoices):
        ORG = "org"
        REPO = "repo"
        ENTERPRISE = "enterprise"

    github_id = models.BigIntegerField(unique=True)
    account = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ORG)
    repositories = models.JSONField(
        default=list, blank=True, help_text="owner/name of the repositories it covers"
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # POLL-03/POLL-06: webhook health and the rate-limit stand-down belong to the installation.
    last_webhook_at = models.DateTimeField(null=True, blank=True)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_reaped_at = models.DateTimeField(null=True, blank=True)
    standdown_until = models.DateTimeField(null=True, blank=True)
    standdown_reason = models.CharField(max_length=300, blank=True)

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
    ephemeral = models.BooleanField(default=True)
    warm = models.PositiveIntegerField(default=0)
    max_runners = models.PositiveIntegerField(default=10)
    paused = models.BooleanField(default=False)
    idle_timeout = models.DurationField(null=True, blank=True)
    runner_group_id = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


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
    ephemeral = models.BooleanField(default=True)
    exit_code = models.IntegerField(null=True, blank=True)

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
