"""The fake GitHub's authentication (App JWTs, installation tokens) and rate limits."""

from __future__ import annotations

import math
from typing import Any

import jwt

from runners.github.fake.core import (
    ANON_LIMIT,
    APP_LIMIT,
    INSTALLATION_LIMIT,
    JWT_IAT_LEEWAY,
    JWT_MAX_LIFETIME,
    RATE_DOCS,
    RATE_WINDOW,
    SECONDARY_DOCS,
    _Error,
    _Limit,
    _Quota,
    _Request,
    _Response,
)

APP_KEY = "app"  # the App's own limit in `_limits`, beside the installations' (by id)


class AuthMixin:
    """Who is calling, and what their quota says, as GitHub's App auth and rate limits do."""

    def _credentials(self, req: _Request) -> tuple[str, str]:
        scheme, _, value = (req.headers.get("Authorization") or "").strip().partition(" ")
        return scheme.lower(), value.strip()

    def _check_jwt(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if scheme != "bearer" or value.count(".") != 2:
            raise _Error(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(
                value,
                self._public_key,
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
        except jwt.PyJWTError:
            raise _Error(401, "A JSON web token could not be decoded") from None
        now = self.clock()
        iat, exp, iss = claims.get("iat"), claims.get("exp"), claims.get("iss")
        if str(iss) not in (str(self.app_id), self.client_id):
            raise _Error(401, "'Issuer' claim ('iss') must be an Integer")
        if not isinstance(iat, int | float) or isinstance(iat, bool) or iat > now + JWT_IAT_LEEWAY:
            raise _Error(
                401,
                "'Issued at' claim ('iat') must be an Integer representing the time that the "
                "assertion was issued",
            )
        if not isinstance(exp, int | float) or isinstance(exp, bool) or exp <= now:
            raise _Error(
                401,
                "'Expiration time' claim ('exp') must be a numeric value representing the future "
                "time at which the assertion expires",
            )
        if exp - iat > JWT_MAX_LIFETIME or exp > now + JWT_MAX_LIFETIME:
            raise _Error(401, "'Expiration time' claim ('exp') is too far in the future")
        req.principal = ("app",)

    def _check_token(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if not value or scheme not in ("token", "bearer"):
            raise _Error(401, "Requires authentication")
        token = self._tokens.get(value)
        if token is None or token.revoked or token.expires_at <= self.clock():
            raise _Error(401, "Bad credentials")
        req.token = token
        req.installation_id = token.installation_id
        req.principal = ("installation", token.installation_id)

    def _optional_auth(self, req: _Request) -> None:
        scheme, value = self._credentials(req)
        if not value:
            return
        if value.count(".") == 2:
            self._check_jwt(req)
        else:
            self._check_token(req)

    def _active_limit(self, key: int | str | None) -> _Limit | None:
        """The limit set on an installation (by id) or on the App's JWT (APP_KEY), if live."""
        if key is None:
            return None
        limit = self._limits.get(key)
        if limit is not None and limit.until is not None and self.clock() >= limit.until:
            del self._limits[key]  # the window has passed on the fake's clock
            return None
        return limit

    def _check_rate(self, req: _Request) -> None:
        """Refuse a call over its quota or under a set limit: the installation's token's, or
        (on a JWT route) the App's own, which GitHub counts apart from its installations'."""
        as_app = req.principal[0] == "app"
        inst_id = req.installation_id
        limit = self._active_limit(APP_KEY if as_app else inst_id)
        quota = self._quota(("app",) if as_app else ("installation", inst_id))
        who = f"app ID {self.app_id}" if as_app else f"installation ID {inst_id}"
        if limit is not None and limit.retry_after is not None:
            raise _Error(
                429,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you "
                "try again.",
                headers={"Retry-After": str(int(limit.retry_after))},
                documentation_url=SECONDARY_DOCS,
            )
        if limit is not None and limit.until is None:
            # GitHub's "said nothing" answer: no retry-after, remaining not 0, no reset.
            raise _Error(
                403,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you "
                "try again.",
                documentation_url=SECONDARY_DOCS,
            )
        if limit is not None or quota.used >= quota.limit:
            raise _Error(
                403,
                f"API rate limit exceeded for {who}.",
                documentation_url=RATE_DOCS,
            )

    def _quota(self, principal: tuple[Any, ...]) -> _Quota:
        now = self.clock()
        quota = self._quotas.get(principal)
        if quota is None or now >= quota.reset:
            limit = {"installation": INSTALLATION_LIMIT, "app": APP_LIMIT}.get(
                principal[0], ANON_LIMIT
            )
            quota = _Quota(limit=limit, reset=now + RATE_WINDOW)
            self._quotas[principal] = quota
        return quota

    def _rate_numbers(self, principal: tuple[Any, ...]) -> tuple[int, int, int, int | None]:
        """(limit, remaining, used, reset) as GitHub would report them for this caller.

        The reset is None while an installation is under a limit that gives no timing.
        """
        quota = self._quota(principal)
        key: int | str | None = None
        if principal[0] == "installation":
            key = principal[1]
        elif principal[0] == "app":
            key = APP_KEY
        limit = self._active_limit(key)
        if limit is not None and limit.until is None and limit.retry_after is None:
            used = min(quota.used, quota.limit - 1)
            return quota.limit, quota.limit - used, used, None
        if limit is not None and limit.until is not None and limit.retry_after is None:
            return quota.limit, 0, quota.limit, math.ceil(limit.until)
        used = min(quota.used, quota.limit)
        return quota.limit, quota.limit - used, used, math.ceil(quota.reset)

    def _add_rate_headers(self, response: _Response, principal: tuple[Any, ...]) -> None:
        limit, remaining, used, reset = self._rate_numbers(principal)
        headers = {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(remaining),
            "x-ratelimit-used": str(used),
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": "core",
        }
        if reset is None:
            del headers["x-ratelimit-reset"]
        headers.update(response.headers)
        response.headers = headers
