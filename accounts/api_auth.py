"""DRF authentication by `Authorization: Bearer zpt_…` API tokens, and the API's error shape."""

from __future__ import annotations

import logging

from rest_framework import authentication, exceptions

from accounts.tokens import TOKEN_PREFIX, token_for_secret, touch

log = logging.getLogger("zoomies.api")


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Authenticates API tokens; `request.auth` is the ApiToken row (for scope checks).

    Any bearer credential is this class's to judge: one that is not a live API token is
    refused as invalid, never passed over as if no credential had been sent.
    """

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        secret = secret.strip()
        if not secret:
            raise exceptions.AuthenticationFailed("invalid API token: the Bearer token is empty")
        if not secret.startswith(TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed(
                f"invalid API token: API tokens start with {TOKEN_PREFIX} "
                "(manage.py token create mints one)"
            )
        token = token_for_secret(secret)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked API token")
        touch(token)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword
