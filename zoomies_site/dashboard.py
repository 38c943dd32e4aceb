"""The dashboard at / (issue 10 item 8): server-rendered pages over the API's own shapes.

Each page renders its rows from the same serializers as the API and hands them to its
script as JSON; the script keeps them current from GET /api/v1/events, and when the
stream drops, by polling the API. Changes go through the API (the scripts POST with the
session's CSRF token) or, for settings, a form here; both call the same actions.
"""

from __future__ import annotations

import json
from functools import wraps

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from accounts.actors import actor_for
from accounts.api import AuditFilters
from accounts.roles import Level, role_level
from accounts.selectors import WHO, audit_rows
from capacity import actions as capacity_actions
from capacity import selectors as capacity_selectors
from capacity.api import AttemptSerializer, ProvisionFailuresSerializer, SpawnSerializer
from capacity.machines_api import MachineSerializer, ProviderSerializer, machine_queryset
from fleet.agent.joining import JOIN_TOKEN_PLACEHOLDER, join_command
from fleet.models import JoinToken, Machine, MachineProvider
from fleet.rest_api import HostSerializer, host_queryset
from fleet.states import MachineState
from runners.api import JobSerializer, PoolSerializer, RunnerSerializer, runner_queryset
from runners.models import Job, Pool
from runners.states import LIVE_STATES, JobStatus
from zoomies_site import actions
from zoomies_site.backup import service as backup
from zoomies_site.backup.api import BackupSerializer
from zoomies_site.core import registry
from zoomies_site.core.events import latest_id
from zoomies_site.overview import overview
from zoomies_site.problems import problems

PAGES = [
    ("overview", "Overview"),
    ("pools", "Pools"),
    ("runners", "Runners"),
    ("jobs", "Jobs"),
    ("hosts", "Hosts"),
    ("machines", "Machines"),
    ("capacity", "Capacity"),
    ("audit", "Audit"),
    ("settings", "Settings"),
]
# Pages only an admin sees in the tabs (and may open).
ADMIN_PAGES = [("users", "Users")]
# How many rows a page shows at first; the API pages further.
ROWS = 200


def viewer_required(view):
    """Signed in with at least the viewer role; otherwise the login page or a 403."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if role_level(getattr(request.user, "role", None)) < Level.READ:
            raise PermissionDenied("your account has no Zoomies role")
        return view(request, *args, **kwargs)

    return wrapped


def _page(request, name: str, context: dict):
    level = role_level(request.user.role)
    now = timezone.now()
    return render(
        request,
        f"dashboard/{name}.html",
        {
            "page": name,
            "pages": PAGES + (ADMIN_PAGES if level >= Level.ADMIN else []),
            "can_operate": level >= Level.WRITE,
            "is_admin": level >= Level.ADMIN,
            "after": latest_id(),
            "problems": problems(now),
            **context,
        },
    )


def _queue_svg(points: list[float | None], width: int = 240, height: int = 48) -> str:
    """The last hour's longest queue time per bucket as an SVG polyline's points."""
    top = max((p for p in points if p is not None), default=0) or 1
    step = width / max(len(points) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{height - (p or 0) / top * (height - 4) - 2:.1f}"
        for i, p in enumerate(points)
    )


@viewer_required
def overview_page(request):
    stats = overview(timezone.now())
    return _page(
        request,
        "overview",
        {
            "stats": stats,
            "chart": _queue_svg(stats["queue_time"]["points"]),
            "data": {"overview": stats},
        },
    )


@viewer_required
def pools_page(request):
    rows = PoolSerializer(Pool.objects.order_by("name")[:ROWS], many=True).data
    saved = request.GET.get("saved", "")
    return _page(request, "pools", {"rows": rows, "saved": saved, "data": {"pools": rows}})


@viewer_required
def runners_page(request):
    live = runner_queryset().filter(state__in=list(LIVE_STATES)).order_by("-pk")[:ROWS]
    finished = runner_queryset().exclude(state__in=list(LIVE_STATES)).order_by("-pk")[:50]
    rows = RunnerSerializer(live, many=True).data
    done = RunnerSerializer(finished, many=True).data
    return _page(
        request,
        "runners",
        {"rows": rows, "finished": done, "data": {"runners": rows, "finished": done}},
    )


@viewer_required
def jobs_page(request):
    queued = Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.WAITING])
    rest = Job.objects.exclude(status__in=[JobStatus.QUEUED, JobStatus.WAITING])
    rows = JobSerializer(
        list(queued.order_by("-pk")[:ROWS]) + list(rest.order_by("-pk")[:100]), many=True
    ).data
    return _page(request, "jobs", {"rows": rows, "data": {"jobs": rows}})


@viewer_required
def hosts_page(request):
    rows = HostSerializer(host_queryset().order_by("name")[:ROWS], many=True).data
    tokens = JoinToken.objects.select_related("host").order_by("-pk")[:10]
    context = {
        "rows": rows,
        "tokens": tokens,
        "data": {"hosts": rows},
        # server.public_url, else the URL this page was reached by (most likely one a new
        # host can reach too).
        "join_command": join_command(
            (registry.get("server.public_url") or request.build_absolute_uri("/")).rstrip("/")
        ),
        "join_placeholder": JOIN_TOKEN_PLACEHOLDER,
    }
    return _page(request, "hosts", context)


@viewer_required
def capacity_page(request):
    """The capacity layer's last events, their tries, and what each pool waits for (ESC-29)."""
    publishing, pools = capacity_selectors.pool_waits(timezone.now())
    data = {
        "publishing": publishing,
        "pools": pools,
        "attempts": AttemptSerializer(capacity_selectors.recent_attempts(), many=True).data,
        "spawns": SpawnSerializer(
            capacity_selectors.recent_spawns().select_related("teardown"), many=True
        ).data,
        "provision_failures": ProvisionFailuresSerializer(
            capacity_selectors.provision_failures(), many=True
        ).data,
    }
    # The page renders the rows itself and does not hand them to a script: no live updates.
    return _page(request, "capacity", {**data, "data": {}})


def _age(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return "under a minute"
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} d"


@viewer_required
def machines_page(request):
    """Rented machines (state, provider, age, host, why) and the providers with their
    limits (issue 23 item 7), from the API's shapes. No machine events exist to follow, so
    the page is rendered once, as the capacity page is. `?release=<id>` asks an admin to
    confirm a quarantined machine's release before the form posts it."""
    now = timezone.now()
    kept = machine_queryset().exclude(state=MachineState.DELETED).order_by("-pk")[:ROWS]
    rows = MachineSerializer(kept, many=True, context={"now": now}).data
    for row in rows:
        row["age"] = _age(row["age_seconds"])
    providers = ProviderSerializer(MachineProvider.objects.order_by("name"), many=True).data
    confirming = next(
        (
            row for row in rows
            if str(row["id"]) == request.GET.get("release")
            and row["state"] == MachineState.QUARANTINED
        ),
        None,
    )  # fmt: skip
    context = {"rows": rows, "providers": providers, "confirming": confirming, "data": {}}
    return _page(request, "machines", context)


@require_POST
@viewer_required
def machine_release(request, pk: int):
    """Release a quarantined machine through the action POST /api/v1/machines/<id>/release
    calls (admins only); without `confirmed` it asks first."""
    _admin_only(request, "only an admin releases a machine")
    if request.POST.get("confirmed") != "yes":
        return redirect(f"{reverse('dashboard:machines')}?release={pk}")
    try:
        machine = capacity_actions.release_quarantined(
            pk, now=timezone.now(), actor=actor_for(request)
        )
    except Machine.DoesNotExist:
        raise Http404(f"no machine {pk}") from None
    except capacity_actions.NotQuarantined as exc:
        messages.error(request, f"Nothing was released: {exc}.")
    else:
        messages.success(
            request,
            f"{machine.name} is released: its row is deleted and its resource was left at "
            f"provider {machine.provider}.",
        )
    return redirect("dashboard:machines")


def sentences(errors: dict) -> str:
    """A serializer's errors as one line: `field: message; field: message`."""
    return "; ".join(f"{field}: {' '.join(map(str, ms))}" for field, ms in errors.items())


@viewer_required
def audit_page(request):
    """The audit rows, newest first, filtered as GET /api/v1/audit filters them (the same
    serializer reads the query, the same selector picks the rows)."""
    filters = {k: request.GET.get(k, "").strip() for k in AuditFilters().fields}
    # Issue 21 item 15: people and their tokens first; the controller's own rows, most of
    # the log, behind the "Who" filter.
    filters["who"] = filters["who"] or "people"
    given = AuditFilters(data={k: v for k, v in filters.items() if v})
    if given.is_valid():
        rows, error = list(audit_rows(**given.validated_data)[:ROWS]), ""
    else:
        rows, error = [], f"Nothing is shown: {sentences(given.errors)}"
    for row in rows:
        row.fields = detail_fields(row.detail)
    context = {"rows": rows, "filters": filters, "who": WHO, "error": error, "data": {}}
    return _page(request, "audit", context)


def detail_fields(detail: object) -> list[tuple[str, str]]:
    """An audit row's detail as (field, value) pairs to show, not Python's dict text: a
    nested value is shown as JSON."""
    if not isinstance(detail, dict):
        return [("", json.dumps(detail))]
    return [
        (str(key), value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        for key, value in detail.items()
    ]


@viewer_required
@require_http_methods(["GET", "POST"])
def settings_page(request):
    error = ""
    if request.method == "POST":
        if role_level(request.user.role) < Level.ADMIN:
            raise PermissionDenied("only an admin changes settings")
        key = request.POST.get("key", "")
        try:
            if request.POST.get("reset"):
                actions.reset_setting(key, actor=actor_for(request))
            else:
                actions.set_setting(key, request.POST.get("value", ""), actor=actor_for(request))
        except actions.InvalidSetting as exc:
            error = str(exc)
        else:
            registry.reload()
            return redirect(f"{reverse('dashboard:settings')}?changed={key}#{key}")
    context = {
        "rows": registry.describe(),
        "error": error,
        "changed": request.GET.get("changed", ""),
    }
    if role_level(request.user.role) >= Level.ADMIN:
        # ARCH-11: the GitHub App, or the form that creates one from a manifest.
        context["github_app_id"] = registry.get("github.app_id")
        context["public_url"] = registry.get("server.public_url")
        # The backups as GET /api/v1/backups lists them, each to verify, and one to take.
        context["backups"] = BackupSerializer(backup.list_backups(), many=True).data
        context["backup_dir"] = backup.backup_dir()
        context["backup_remotes"] = registry.get("backup.remotes")
        context["backup_encrypted"] = bool(registry.get("backup.passphrase"))
    return _page(request, "settings", {**context, "data": {}})


def _admin_only(request, why: str) -> None:
    if role_level(request.user.role) < Level.ADMIN:
        raise PermissionDenied(why)


def _to_backups():
    # The page's messages are at its top, above the backups.
    return redirect("dashboard:settings")


@require_POST
@viewer_required
def backup_take(request):
    """Queue a backup through the service POST /api/v1/backups calls (admins only)."""
    _admin_only(request, "only an admin takes backups")
    upload = request.POST.get("upload") == "1"
    try:
        queued = backup.request_backup(actor=actor_for(request), upload=upload)
    except backup.BackupError as exc:
        messages.error(request, f"No backup was queued: {exc}.")
    else:
        how = "encrypted with backup.passphrase" if queued["encrypted"] else "not encrypted"
        where = ", then copied to backup.remotes" if upload else ""
        messages.success(
            request,
            f"A backup is queued ({how}{where}); it is listed here once a worker has taken it.",
        )
    return _to_backups()


@require_POST
@viewer_required
def backup_verify(request, name: str):
    """Verify one backup through the service POST /api/v1/backups/<file>/verify calls."""
    _admin_only(request, "only an admin verifies backups")
    try:
        report = backup.verify_named(name, actor=actor_for(request))
    except backup.NoSuchBackup as exc:
        raise Http404(str(exc)) from None
    except backup.BackupError as exc:
        messages.error(request, f"{name} was not verified: {exc}.")
        return _to_backups()
    checks = "; ".join(f"{c.name} {'ok' if c.ok else 'FAILED'}: {c.detail}" for c in report.checks)
    if report.ok:
        messages.success(request, f"{name} passed every check ({checks}).")
    else:
        messages.error(request, f"{name} failed its checks ({checks}).")
    return _to_backups()
