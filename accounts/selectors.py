"""Reads for accounts, each fetching and checking access in one call."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.http import Http404

from accounts.models import ApiToken, AuditLog, User
from accounts.roles import Level, role_level


def tokens_for(user: User) -> QuerySet[ApiToken]:
    """A user's own tokens; an admin's view is every token."""
    tokens = ApiToken.objects.select_related("user").order_by("-created_at", "-pk")
    return tokens if role_level(user.role) >= Level.ADMIN else tokens.filter(user=user)


def access_token_for_user(user: User, token_id: int) -> ApiToken:
    """The token if `user` may manage it; 404 otherwise, so ids of others' tokens leak nothing."""
    token = tokens_for(user).filter(pk=token_id).first()
    if token is None:
        raise Http404("no such token")
    return token


# Who made an audit row, as the Audit page's "Who" filter groups them (issue 21 item 15):
# people (users, their tokens, anonymous sign-in attempts), the hosts' agents, and the
# controller's own loops, which write most rows and bury the rest.
WHO = {
    "people": "people and their tokens",
    "agents": "the hosts' agents",
    "controller": "the controller itself",
    "all": "everyone",
}
_MACHINE_PREFIXES = ("system:", "agent:", "host:")


def audit_rows(
    *,
    actor: str | None = None,
    action: str | None = None,
    target_type: str | None = None,
    target_id: str | None = None,
    since=None,
    until=None,
    who: str = "all",
) -> QuerySet[AuditLog]:
    rows = AuditLog.objects.all()
    if who == "people":
        for prefix in _MACHINE_PREFIXES:
            rows = rows.exclude(actor__startswith=prefix)
    elif who == "agents":
        rows = rows.filter(Q(actor__startswith="agent:") | Q(actor__startswith="host:"))
    elif who == "controller":
        rows = rows.filter(actor__startswith="system:")
    if actor:
        rows = rows.filter(actor__icontains=actor)
    if action:
        rows = rows.filter(action__startswith=action)
    if target_type:
        rows = rows.filter(target_type=target_type)
    if target_id:
        rows = rows.filter(target_id=target_id)
    if since is not None:
        rows = rows.filter(at__gte=since)
    if until is not None:
        rows = rows.filter(at__lt=until)
    return rows
