"""Capacity delivery state, claim codes and spawn records: all in the database (CAP-17, ESC-08).

Nothing about an attempt lives only in memory: a controller killed between two tries comes
back, finds the attempt with its tries and its next-try time in these rows, and carries on
under the same event id.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class AttemptState(models.TextChoices):
    PENDING = "pending", "waiting for its next try"
    SENDING = "sending", "a try is in flight"
    DELIVERED = "delivered", "accepted by the receiver"
    FAILED = "failed", "all tries failed"


class TryOutcome(models.TextChoices):
    ACCEPTED = "accepted", "2xx"
    REFUSED = "refused", "answered, not 2xx"
    UNANSWERED = "unanswered", "no answer (connection error, timeout, or the controller stopped)"


class Attempt(models.Model):
    """One attempt to deliver one event: one event id, one body, up to three tries.

    `started_at` is what the cooldown keys on (CAP-13), whatever the outcome. `body` is the
    exact bytes every try sends and signs (CAP-14).
    """

    event_id = models.CharField(max_length=64, unique=True)
    type = models.CharField(max_length=32)
    pool = models.ForeignKey(
        "runners.Pool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The cooldown key survives a deleted pool: str(pool id), and for a teardown the host.
    pool_key = models.CharField(max_length=64)
    subject = models.CharField(max_length=64, blank=True)
    destination_url = models.CharField(max_length=500)
    body = models.TextField()
    stamp = models.CharField(max_length=32, help_text="X-Zoomies-Timestamp")
    reason = models.TextField(blank=True)
    reading = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.PENDING
    )
    tries = models.PositiveSmallIntegerField(default=0)
    started_at = models.DateTimeField()
    next_try_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=AttemptState.values), name="capacity_attempt_state_valid"
            ),
            models.CheckConstraint(condition=Q(tries__lte=3), name="capacity_attempt_max_3_tries"),
        ]
        indexes = [
            models.Index(fields=["pool_key", "type", "started_at"]),
            models.Index(fields=["state", "next_try_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id} ({self.state})"


class Try(models.Model):
    """One HTTP request of an attempt, and what came of it."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="try_rows")
    number = models.PositiveSmallIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=TryOutcome.choices, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["attempt", "number"], name="capacity_try_unique"),
            models.CheckConstraint(
                condition=Q(number__gte=1, number__lte=3), name="capacity_try_number_1_to_3"
            ),
        ]

    def __str__(self) -> str:
        return f"try {self.number} of {self.attempt.event_id}: {self.outcome or 'in flight'}"


class ExcessClock(models.Model):
    """Since when a pool's excess idle capacity has been visible without a break (CAP-07)."""

    pool = models.OneToOneField("runners.Pool", on_delete=models.CASCADE, related_name="+")
    since = models.DateTimeField()
    slots = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.pool_id}: {self.slots} since {self.since:%H:%M:%S}"


class SpawnState(models.TextChoices):
    PROVISIONING = "provisioning", "asked for, not joined"
    ACTIVE = "active", "joined"
    TIMED_OUT = "timed_out", "never joined within the spawn timeout"
    STRANDED = "stranded", "joined, then unseen past the stranded window"


class Spawn(models.Model):
    """A provision asked of an external autoscaler: which event, which destination, which host.

    The destination is recorded at spawn time, so a teardown goes where the scale-up went
    (ESC-07, ESC-10).
    """

    host_name = models.CharField(max_length=64, unique=True)
    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="spawns")
    pool = models.ForeignKey(
        "runners.Pool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    destination_url = models.CharField(max_length=500, blank=True)
    state = models.CharField(
        max_length=16, choices=SpawnState.choices, default=SpawnState.PROVISIONING
    )
    created_at = models.DateTimeField()
    joined_at = models.DateTimeField(null=True, blank=True)
    host = models.ForeignKey(
        "fleet.Host", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When a sweep first read the host as unseen; the absence itself counts from the host's
    # last heartbeat (capacity.backstop._time_absence).
    unseen_since = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    teardown = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.SET_NULL, related_name="teardowns"
    )
    reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=SpawnState.values), name="capacity_spawn_state_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.host_name} ({self.state})"


class ClaimCode(models.Model):
    """A single-use code a new machine exchanges for its agent credential (ESC-01..05).

    Only the SHA-256 of the code is stored; the code itself is in the event body alone.
    """

    code_hash = models.CharField(max_length=64, unique=True)
    spawn = models.OneToOneField(Spawn, on_delete=models.CASCADE, related_name="claim")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    redeemed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"claim for {self.spawn.host_name}"


class ProvisionFailures(models.Model):
    """Consecutive provision failures per destination and the deferral they armed (ESC-22)."""

    destination_url = models.CharField(max_length=500, unique=True)
    consecutive = models.PositiveIntegerField(default=0)
    deferred_until = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_cause = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.destination_url}: {self.consecutive}"


class ProvisionOutcome(models.Model):
    """What became of one provision, kept after its spawn record is gone (ESC-21, ESC-27).

    Reporting a failure checks it first, so a provision that joined is never counted as one.
    """

    class Outcome(models.TextChoices):
        JOINED = "joined"
        TIMED_OUT = "timed_out"
        STRANDED = "stranded"

    host_name = models.CharField(max_length=64, unique=True)
    event_id = models.CharField(max_length=64)
    destination_url = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    recorded_at = models.DateTimeField()
    spawn_gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=["joined", "timed_out", "stranded"]),
                name="capacity_outcome_valid",
            )
        ]

    def __str__(self) -> str:
        return f"{self.host_name}: {self.outcome}"
