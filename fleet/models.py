"""Hosts, join tokens, the agent task queue, and rented machines."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.states import HostHealth, MachineState, TaskKind, TaskState


class Host(models.Model):
    """A machine an agent runs on. Free capacity is always recounted from runner rows."""

    name = models.CharField(max_length=64, unique=True)
    health = models.CharField(max_length=16, choices=HostHealth.choices, default=HostHealth.HEALTHY)
    cordoned = models.BooleanField(default=False)
    capacity = models.PositiveIntegerField(default=1, help_text="runner slots")
    backends = models.JSONField(default=list, blank=True)
    # BACK-05: per backend, the limits ("cpus", "memory") its engine says it can apply.
    backend_limits = models.JSONField(default=dict, blank=True)
    platform = models.CharField(max_length=32, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    cpus = models.FloatField(null=True, blank=True)
    memory_mb = models.IntegerField(null=True, blank=True)
    disk_total_mb = models.IntegerField(null=True, blank=True)
    disk_free_mb = models.IntegerField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    usage_at = models.DateTimeField(null=True, blank=True)
    version = models.CharField(max_length=64, blank=True)
    agent_token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    agent_token_prefix = models.CharField(max_length=16, blank=True)
    # ESC-06: a credential minted from a claim code expires (null: an ordinary agent token,
    # which does not). The token a renewal replaced stays valid until its own expiry, so a
    # request already sent with it, or a renewal whose answer was lost, is not refused.
    agent_token_expires_at = models.DateTimeField(null=True, blank=True)
    previous_agent_token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    previous_agent_token_expires_at = models.DateTimeField(null=True, blank=True)
    embedded = models.BooleanField(default=False, help_text="the controller's own agent")
    joined_at = models.DateTimeField(null=True, blank=True)
    agent_started_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when its agent last reported its inventory at start (issue 11 item 3)",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(health__in=HostHealth.values), name="host_health_valid"
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def actor(self) -> str:
        """Who its agent is in the audit trail."""
        return f"agent:{self.name}"


class JoinToken(models.Model):
    """A short-lived, single-use credential that a new agent exchanges for its own token."""

    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL)
    created_by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}…"


class AgentTask(models.Model):
    """A unit of work for one host's agent, delivered at least once under a lease."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="tasks")
    runner = models.ForeignKey(
        "runners.Runner", null=True, blank=True, on_delete=models.CASCADE, related_name="tasks"
    )
    kind = models.CharField(max_length=32, choices=TaskKind.choices)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.PENDING)
    attempt = models.PositiveIntegerField(default=0, help_text="deliveries so far")
    max_attempts = models.PositiveIntegerField(default=3)
    lease_seconds = models.PositiveIntegerField()
    lease_deadline = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    taken_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=TaskState.values), name="task_state_valid")
        ]
        indexes = [models.Index(fields=["host", "state"])]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.state})"


class Machine(models.Model):
    """A host Zoomies rented. Its row exists before the resource and outlives it.

    `state` moves only through `fleet.transitions.transition_machine`.
    """

    name = models.CharField(max_length=64, unique=True)
    provider = models.CharField(max_length=64)
    identity = models.CharField(max_length=200, blank=True, help_text="chosen before the create")
    state = models.CharField(
        max_length=16, choices=MachineState.choices, default=MachineState.PLANNED
    )
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=MachineState.values), name="machine_state_valid"
            )
        ]

    def __str__(self) -> str:
        return self.name
