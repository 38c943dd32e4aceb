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
    # TASK-09..11: where the latest host check stands (fleet.host_checks.note_host_check).
    last_check = models.JSONField(default=dict, blank=True)
    # HOST-14..19: written only by fleet.throttling.throttle_step, from the samples above.
    throttle_level = models.PositiveSmallIntegerField(default=0)
    throttle_changed_at = models.DateTimeField(null=True, blank=True)
    throttle_calm_since = models.DateTimeField(null=True, blank=True)
    throttle_reason = models.CharField(max_length=300, blank=True)
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
    # The pool whose demand planned it (its id; pools are the runners app's), for the limits.
    pool_id = models.BigIntegerField(null=True, blank=True)
    # When the create call was first issued (None: never, so planned->failed is safe), and
    # when a delete was last asked for: the loop's clocks for its timeouts.
    create_issued_at = models.DateTimeField(null=True, blank=True)
    delete_issued_at = models.DateTimeField(null=True, blank=True)
    delete_asked_at = models.DateTimeField(null=True, blank=True)  # the latest ask
    # SHA-256 of the single-use claim code the machine's agent joins with (never the code).
    claim_hash = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=MachineState.values), name="machine_state_valid"
            )
        ]

    def __str__(self) -> str:
        return self.name


class MachineProvider(models.Model):
    """A provider an operator configured (MACH-15): only these are ever asked for machines,
    and only within their limits. `kind` picks the implementation (fleet.providers);
    `config` is its settings (secrets sealed by the provider's own code)."""

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=32)
    config = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    # The pools (by name) whose demand this provider may answer with machines.
    pools = models.JSONField(default=list, blank=True)
    max_machines = models.PositiveIntegerField(default=2)
    max_per_pool = models.PositiveIntegerField(default=2)
    # Runner slots each machine offers; the planner divides demand by it.
    slots_per_machine = models.PositiveIntegerField(default=2)
    created_at = models.DateTimeField()
    # The machine loop's last word on reaching it (issue 23 item 7): since when it has been
    # unreachable and why, both cleared once it answers again; empty while it is up.
    down_since = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.name


class ProviderSetup(models.Model):
    """A Proxmox connection being onboarded (MACH-20, the spec's provider_setups): what the
    hypervisor's enrollment sent, staged here until the provider is saved (which deletes
    it, MACH-23) or it expires (fleet.provider_setups purges it). Only the capability's hash
    is kept, and the token secret only sealed; the browser sees name, endpoint, readiness."""

    name = models.CharField(max_length=64, help_text="the provider's name, chosen at the start")
    capability_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(db_index=True)
    # Filled in by the enrollment, once: where the cluster answers and how to trust it.
    endpoint = models.CharField(max_length=300, blank=True)
    ca_pem = models.TextField(blank=True)
    fingerprint = models.CharField(max_length=95, blank=True)
    token_id = models.CharField(max_length=200, blank=True, help_text="USER@REALM!TOKENID")
    token_sealed = models.TextField(blank=True)
    enrolled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"setup of {self.name}"

    @property
    def ready(self) -> bool:
        return self.enrolled_at is not None
