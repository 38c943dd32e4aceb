"""Admin for installations, pools, runners, jobs and deliveries.

Lifecycle fields are read-only here: state changes go through actions, which
write the audit row with each change.
"""

from django.contrib import admin

from runners.models import Installation, Job, Pool, RedeliveryRequest, Runner, WebhookDelivery
from runners.states import JobStatus
from zoomies_site.core.events import AdminEvents


@admin.register(Installation)
class InstallationAdmin(admin.ModelAdmin):
    list_display = ["account", "github_id", "kind", "active", "last_webhook_at", "standdown_until"]
    # What the controller writes (health, stand-downs, failing mints, where runners
    # registered) is shown, never edited here.
    readonly_fields = [
        "last_webhook_at", "last_polled_at", "last_reaped_at", "standdown_until",
        "standdown_reason", "created_at", "registered_repositories", "mint_failures",
        "mint_failing_since", "mint_error", "mint_retry_at",
    ]  # fmt: skip


@admin.register(Pool)
class PoolAdmin(AdminEvents, admin.ModelAdmin):
    list_display = ["name", "backend", "platform", "warm", "max_runners", "paused", "ephemeral"]
    list_filter = ["backend", "paused", "ephemeral"]
    search_fields = ["name"]


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "host", "state", "phase", "created_at", "message"]
    list_filter = ["state", "pool"]
    search_fields = ["name"]
    readonly_fields = [
        "name", "pool", "host", "installation", "state", "created_at", "state_changed_at",
        "finished_at", "message", "phase", "github_runner_id", "image", "cpus", "memory_mb",
        "ephemeral", "exit_code", "output_tail",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False  # runners are created by the reconcile pass only


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "github_id", "repository", "status", "conclusion", "runner_name", "created_at",
        "waiting_because",
    ]  # fmt: skip
    list_filter = ["status", "source"]
    search_fields = ["repository", "runner_name", "github_id"]
    readonly_fields = [
        "github_id", "run_id", "installation", "repository", "name", "labels", "status",
        "conclusion", "runner", "runner_name", "fleet_failure", "created_at", "started_at",
        "completed_at", "updated_at", "source", "wait_reason", "wait_reason_at",
    ]  # fmt: skip

    @admin.display(description="waiting because")
    def waiting_because(self, job: Job) -> str:
        return job.wait_reason if job.status == JobStatus.QUEUED else ""

    def has_add_permission(self, request):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["delivery_id", "event", "action", "installation", "received_at"]
    list_filter = ["event"]
    readonly_fields = [
        "delivery_id", "event", "action", "installation", "repository", "received_at",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False


@admin.register(RedeliveryRequest)
class RedeliveryRequestAdmin(admin.ModelAdmin):
    """What the redelivery pass asked GitHub to send again; written by the pass only."""

    list_display = ["guid", "event", "action", "failed_status", "outcome", "asked_at"]
    list_filter = ["outcome", "event"]
    readonly_fields = [
        "guid", "github_delivery_id", "event", "action", "delivered_at", "failed_status",
        "reason", "outcome", "message", "asked_at",
    ]  # fmt: skip

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a deleted row would let the pass ask for that guid a second time
