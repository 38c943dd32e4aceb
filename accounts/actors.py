"""How the audit log names whoever made a change: a user, a token, an agent or `system:<loop>`."""

from __future__ import annotations

from accounts.models import ApiToken


def actor_for(request) -> str:
    """`token:zpt_abcd1234(ci) of user:ada` for a token, `user:ada` for a session."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        return auth.actor
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.get_username()}"
    return "anonymous"


def system(loop: str) -> str:
    return f"system:{loop}"
