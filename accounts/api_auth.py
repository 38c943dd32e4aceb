"""DRF authentication by `Authorization: Bearer zpt_…` API tokens."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import ApiToken
from accounts.tokens import TOKEN_PREFIX, token_for_secret


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates API tokens; `request.auth` is the ApiToken row (for scope checks)."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header.startswith(self.keyword + " "):
            return None
        secret = header[len(self.keyword) + 1 :].strip()
        if not secret.startswith(TOKEN_PREFIX):
            return None
        token = token_for_secret(secret)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or expired API token")
        # last_used_at is a hint, not an audit record: one cheap UPDATE without a read.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword
