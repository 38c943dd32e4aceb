"""The dashboard's Users page (issue 10 items 2, 3 and 8): admins only.

Lists the users and every API token; creates a local user with a role, changes a role,
deactivates a user, revokes a token. Each change is one of the accounts actions, which write
the audit row; the input is read by the API's own serializers, so the page and
/api/v1/users accept and refuse the same things. The last active admin stays, as over the API.
"""

from __future__ import annotations

from functools import wraps

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from accounts import actions, selectors
from accounts.actors import actor_for
from accounts.api import NewUserSerializer, UserChangeSerializer
from accounts.models import User
from accounts.roles import Level, role_level
from zoomies_site.dashboard import _page, sentences, viewer_required


def admin_required(view):
    @wraps(view)
    @viewer_required
    def wrapped(request, *args, **kwargs):
        if role_level(request.user.role) < Level.ADMIN:
            raise PermissionDenied("only an admin manages users and tokens")
        return view(request, *args, **kwargs)

    return wrapped


def _back():
    return redirect("dashboard:users")


@admin_required
def users_page(request):
    return _page(
        request,
        "users",
        {
            "users": User.objects.order_by("username"),
            "tokens": selectors.tokens_for(request.user)[:200],
            "roles": User.Role.values,
            "data": {},
        },
    )


@require_POST
@admin_required
def user_create(request):
    body = NewUserSerializer(data={k: v for k, v in request.POST.items() if v != ""})
    if not body.is_valid():
        messages.error(request, f"The user was not created: {sentences(body.errors)}")
        return _back()
    try:
        user = actions.create_user(
            username=body.validated_data["username"],
            role=body.validated_data["role"],
            email=body.validated_data["email"],
            password=body.validated_data.get("password"),
            actor=actor_for(request),
        )
    except actions.AccountError as exc:
        messages.error(request, f"The user was not created: {exc}")
    else:
        messages.success(request, f"{user.username} created as {user.role}.")
    return _back()


@require_POST
@admin_required
def user_role(request, pk: int):
    user = get_object_or_404(User, pk=pk)
    body = UserChangeSerializer(data={"role": request.POST.get("role", "")})
    if not body.is_valid():
        messages.error(request, f"The role was not changed: {sentences(body.errors)}")
        return _back()
    try:
        actions.update_user(
            user, actor=actor_for(request), keep_an_admin=True, **body.validated_data
        )
    except actions.AccountError as exc:
        messages.error(request, f"The role was not changed: {exc}")
    else:
        messages.success(request, f"{user.username} is now {user.role}.")
    return _back()


@require_POST
@admin_required
def user_deactivate(request, pk: int):
    user = get_object_or_404(User, pk=pk)
    try:
        actions.deactivate_user(user, actor=actor_for(request))
    except actions.AccountError as exc:
        messages.error(request, f"{user.username} was not deactivated: {exc}")
    else:
        messages.success(request, f"{user.username} is deactivated.")
    return _back()


@require_POST
@admin_required
def token_revoke(request, pk: int):
    token = selectors.access_token_for_user(request.user, pk)
    actions.revoke_api_token(token, actor=actor_for(request))
    messages.success(request, f"Token {token} is revoked.")
    return _back()
