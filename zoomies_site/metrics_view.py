"""`GET /metrics`: every Prometheus series in the text format (issue 10 item 9).

The counters (zoomies_site/core/metrics.py, capacity/metrics.py) come from this process, or, under
the controller, from every process through PROMETHEUS_MULTIPROC_DIR; the gauges are read from
the database at scrape time by `DatabaseCollector` with a handful of GROUP BY queries.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django_q.models import OrmQ
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from rest_framework.exceptions import AuthenticationFailed

from accounts.api_auth import ApiTokenAuthentication
from accounts.roles import Level, effective_level
from fleet.models import AgentTask, Host, Machine
from fleet.rest_api import host_queryset
from fleet.states import OPEN_TASK_STATES, MachineState
from fleet.throttle import cpu_factor
from runners import webhook_inbox
from runners.models import Installation, Job, Runner
from zoomies_site.core import environment
from zoomies_site.core.metrics import MULTIPROC_ENV


class DatabaseCollector:
    """Gauges read from the database at scrape time."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "zoomies_jobs", "Jobs the controller holds, by status.", labels=["status"]
        )
        for row in Job.objects.values("status").annotate(n=Count("id")).order_by():
            jobs.add_metric([row["status"]], row["n"])
        yield jobs

        runners = GaugeMetricFamily(
            "zoomies_runners", "Runners by state and pool.", labels=["state", "pool"]
        )
        for row in Runner.objects.values("state", "pool__name").annotate(n=Count("id")).order_by():
            runners.add_metric([row["state"], row["pool__name"] or ""], row["n"])
        yield runners

        hosts = GaugeMetricFamily(
            "zoomies_hosts", "Hosts by health and whether cordoned.", labels=["health", "cordoned"]
        )
        for row in Host.objects.values("health", "cordoned").annotate(n=Count("id")).order_by():
            hosts.add_metric([row["health"], str(row["cordoned"]).lower()], row["n"])
        yield hosts

        # Issue 25 item 5 (HOST-14..20): each throttled host's level and CPU factor; a host
        # at level 0 is not listed, so a fleet at rest adds no series.
        levels = GaugeMetricFamily(
            "zoomies_host_throttle_level", "A throttled host's level, 1 to 3.", labels=["host"]
        )
        factors = GaugeMetricFamily(
            "zoomies_host_cpu_factor",
            "The CPU factor a throttled host's runners run at.",
            labels=["host"],
        )
        throttled = Host.objects.filter(throttle_level__gt=0).order_by("name")
        for name, level in throttled.values_list("name", "throttle_level"):
            levels.add_metric([name], level)
            factors.add_metric([name], cpu_factor(level))
        yield levels
        yield factors

        # HOST-29: memory the valve has lent a host's live runners; hosts with none unlisted.
        lent = GaugeMetricFamily(
            "zoomies_host_memory_lent_mb",
            "Memory a host's agent has lent its live runners above what each was given, in MB.",
            labels=["host"],
        )
        for name, mb in (
            host_queryset()
            .filter(lent_memory__gt=0)
            .order_by("name")
            .values_list("name", "lent_memory")
        ):
            lent.add_metric([name], mb)
        yield lent

        machines = GaugeMetricFamily(
            "zoomies_machines",
            "Rented machines not yet deleted, by state and provider.",
            labels=["state", "provider"],
        )
        kept = Machine.objects.exclude(state=MachineState.DELETED)
        for row in kept.values("state", "provider").annotate(n=Count("id")).order_by():
            machines.add_metric([row["state"], row["provider"]], row["n"])
        yield machines

        tasks = GaugeMetricFamily(
            "zoomies_agent_tasks_open",
            "Agent tasks not yet finished (the hosts' queue), by kind and state.",
            labels=["kind", "state"],
        )
        open_tasks = AgentTask.objects.filter(state__in=list(OPEN_TASK_STATES))
        for row in open_tasks.values("kind", "state").annotate(n=Count("id")).order_by():
            tasks.add_metric([row["kind"], row["state"]], row["n"])
        yield tasks

        yield GaugeMetricFamily(
            "zoomies_task_queue_depth",
            "Background tasks waiting in the django-q2 queue.",
            value=OrmQ.objects.count(),
        )
        # On SQLite: deliveries answered and not yet recorded (runners/webhook_inbox.py). A
        # waiting count that stays up means the database is not taking the applier's writes;
        # one set aside is a delivery whose recording failed, tried again at the next start.
        inbox = webhook_inbox.counts_now()
        if inbox is not None:
            kept = GaugeMetricFamily(
                "zoomies_webhook_inbox_deliveries",
                "Webhook deliveries answered and kept in the inbox, not yet recorded.",
                labels=["state"],
            )
            kept.add_metric(["waiting"], inbox[0])
            kept.add_metric(["set_aside"], inbox[1])
            yield kept
        yield GaugeMetricFamily(
            "zoomies_installations_standing_down",
            "Installations standing down now because GitHub rate limited them.",
            value=Installation.objects.filter(standdown_until__gt=timezone.now()).count(),
        )


def exposition() -> bytes:
    """Every series, in Prometheus's text format."""
    database = CollectorRegistry(auto_describe=False)
    database.register(DatabaseCollector())
    if environment.read(MULTIPROC_ENV):
        counted = CollectorRegistry()
        MultiProcessCollector(counted)
    else:
        counted = REGISTRY
    return generate_latest(counted) + generate_latest(database)


def _allowed(request: HttpRequest) -> tuple[bool, int, str]:
    """A viewer session or a token with fleet:read may scrape (the API's own rule)."""
    try:
        found = ApiTokenAuthentication().authenticate(request)
    except AuthenticationFailed as exc:
        return False, 401, str(exc.detail)
    user, token = found if found else (request.user, None)
    if not user.is_authenticated:
        return False, 401, "authentication required: a session or a Bearer API token"
    if effective_level(user, token) < Level.READ:
        return False, 403, "this needs the viewer role and, with a token, fleet:read"
    return True, 200, ""


def metrics_view(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return JsonResponse({"detail": "GET only"}, status=405)
    ok, status, why = _allowed(request)
    if not ok:
        response = JsonResponse({"detail": why}, status=status)
        if status == 401:
            response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
