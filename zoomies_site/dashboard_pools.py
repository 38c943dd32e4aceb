"""The dashboard's pool forms: create and edit a pool (issue 10 item 8), for operators.

A form's text is read into the API's body (`PoolSerializer`), so a pool is judged by the one
validation the API and the admin use (`runners.models.pool_errors`), and saved by the same
actions (`runners.actions.pools`: one writer, its audit row and its event). Pause, resume
and delete are the API's verbs, called from the Pools page's script.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError as DRFValidationError

from accounts.actors import actor_for
from accounts.roles import Level, role_level
from fleet.selectors import offered_backends
from runners.actions import pools as pool_actions
from runners.api import PoolSerializer
from runners.models import Installation, Pool, pool_errors
from zoomies_site.dashboard import _page, viewer_required

# The form's text fields, each read as the API reads its JSON field of the same name.
TEXT_FIELDS = (
    "name", "repository", "backend", "platform", "image", "cpus", "memory_mb", "warm",
    "max_runners", "idle_timeout", "runner_group_id",
)  # fmt: skip
OPTIONAL_NUMBERS = ("cpus", "memory_mb", "idle_timeout")


def _split(text: str, sep: str = ",") -> list[str]:
    return [part.strip() for part in text.split(sep) if part.strip()]


def body_from_form(form) -> dict:
    """The API body the form stands for: labels as a comma list, the host selector as
    `key=value` pairs, blanks of optional figures as null, the checkbox as a boolean."""
    body: dict = {field: form.get(field, "").strip() for field in TEXT_FIELDS}
    for field in OPTIONAL_NUMBERS:
        body[field] = body[field] or None
    body["installation"] = form.get("installation") or None
    body["labels"] = _split(form.get("labels", ""))
    selector: dict[str, str] = {}
    for pair in _split(form.get("host_selector", "")):
        key, eq, value = pair.partition("=")
        # A pair without "=" is kept whole so the validation names it rather than dropping it.
        selector[key.strip()] = value.strip() if eq else ""
    body["host_selector"] = selector
    body["dind"] = form.get("dind") == "on"
    return body


def form_from_pool(pool: Pool | None) -> dict:
    """A pool's values as the form shows them. A new pool's backend is one a healthy host
    offers (issue 21 item 14: docker was shown where no host offered it)."""
    if pool is None:
        offered = [b for b in offered_backends() if b in Pool.Backend.values]
        backend = offered[0] if offered else Pool.Backend.PROCESS
        return {"backend": backend, "warm": 0, "max_runners": 10,
                "runner_group_id": 1}  # fmt: skip
    shown = {field: getattr(pool, field) for field in TEXT_FIELDS}
    for field in OPTIONAL_NUMBERS:
        shown[field] = "" if shown[field] is None else shown[field]
    if pool.idle_timeout is not None:
        shown["idle_timeout"] = (
            PoolSerializer().fields["idle_timeout"].to_representation(pool.idle_timeout)
        )
    shown["installation"] = pool.installation_id or ""
    shown["labels"] = ", ".join(pool.labels or [])
    shown["host_selector"] = ", ".join(f"{k}={v}" for k, v in (pool.host_selector or {}).items())
    shown["dind"] = pool.dind
    return shown


def _save(pool: Pool | None, body: dict, actor: str) -> tuple[Pool | None, dict]:
    """The pool created or changed, or None and the errors by field, the API's words."""
    serializer = PoolSerializer(pool, data=body)
    if not serializer.is_valid():
        return None, _every_error(serializer, body)
    now = timezone.now()
    try:
        if pool is None:
            return pool_actions.create_pool(
                dict(serializer.validated_data), actor=actor, now=now
            ), {}
        changes = dict(serializer.validated_data)
        return pool_actions.update_pool(pool, changes, actor=actor, now=now), {}
    except DjangoValidationError as exc:
        return None, exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}


def _every_error(serializer: PoolSerializer, body: dict) -> dict:
    """The serializer's field errors and, for the fields it could read, the pool's own
    validation (`pool_errors`), which DRF runs only once every field reads: a form with
    a bad number and a bad name is told both at once, not in two submits (issue 21 item
    14)."""
    errors = dict(serializer.errors)
    read: dict = {}
    for name, field in serializer.fields.items():
        if field.read_only or name in errors or name not in body:
            continue
        try:
            read[field.source] = field.run_validation(body[name])
        except (DRFValidationError, DjangoValidationError):
            continue
    if serializer.instance is not None:
        current = {f: getattr(serializer.instance, f) for f in TEXT_FIELDS if f not in read}
        read = {**current, **read}
    for name, found in pool_errors(read).items():
        # A check that reads a field which did not read would judge a default in its place
        # (an image checked as docker's when the backend was bad): left for the resubmit.
        if name in body and name not in errors and not CHECKED_WITH.get(name, set()) & set(errors):
            errors[name] = found
    return errors


# The fields each of the pool's checks also reads (runners.models.pool_errors).
CHECKED_WITH = {
    "image": {"backend", "platform"},
    "warm": {"max_runners"},
    "max_runners": {"warm"},
}


@viewer_required
@require_http_methods(["GET", "POST"])
def pool_form_page(request, pk: int | None = None):
    """GET the form (new, or a pool's values); POST saves it through the pool actions."""
    if role_level(request.user.role) < Level.WRITE:
        raise PermissionDenied("only an operator or an admin changes pools")
    pool = get_object_or_404(Pool, pk=pk) if pk is not None else None
    values, errors = form_from_pool(pool), {}
    if request.method == "POST":
        saved, errors = _save(pool, body_from_form(request.POST), actor_for(request))
        if saved is not None:
            return redirect(f"{reverse('dashboard:pools')}?saved={saved.name}")
        values = {**request.POST.dict(), "dind": request.POST.get("dind") == "on"}
    return _page(
        request,
        "pool_form",
        {
            "pool": pool,
            "values": values,
            "errors": errors,
            "installations": Installation.objects.filter(active=True).order_by("account"),
            "backends": Pool.Backend.values,
            "data": {},
        },
    )
