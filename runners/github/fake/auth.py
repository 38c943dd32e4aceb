"""The fake GitHub's authentication (App JWTs, installation tokens) and rate limits: who is
calling, and what their quota says, as GitHub's App auth and rate limits do."""

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
    HttpError,
    Request,
    Response,
)
from runners.github.fake.state import FakeState, Limit, Quota

APP_KEY = "app"  # the App's own limit in `FakeState.limits`, beside the installations' (by id)


def credentials(req: Request) -> tuple[str, str]:
    """The Authorization header's scheme (lower-case) and value."""
    scheme, _, value = (req.headers.get("Authorization") or "").strip().partition(" ")
    return scheme.lower(), value.strip()


def check_jwt(state: FakeState, req: Request) -> None:
    scheme, value = credentials(req)
    if scheme != "bearer" or value.count(".") != 2:
        raise HttpError(401, "A JSON web token could not be decoded")
    try:
        claims = jwt.decode(
            value,
            state.public_key,
            algorithms=["RS256"],
            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
        )
    except jwt.PyJWTError:
        raise HttpError(401, "A JSON web token could not be decoded") from None
    now = state.clock()
    iat, exp, iss = claims.get("iat"), claims.get("exp"), claims.get("iss")
    if str(iss) not in (str(state.app_id), state.client_id):
        raise HttpError(401, "'Issuer' claim ('iss') must be an Integer")
    if not isinstance(iat, int | float) or isinstance(iat, bool) or iat > now + JWT_IAT_LEEWAY:
        raise HttpError(
            401,
            "'Issued at' claim ('iat') must be an Integer representing the time that the "
            "assertion was issued",
        )
    if not isinstance(exp, int | float) or isinstance(exp, bool) or exp <= now:
        raise HttpError(
            401,
            "'Expiration time' claim ('exp') must be a numeric value representing the future "
            "time at which the assertion expires",
        )
    if exp - iat > JWT_MAX_LIFETIME or exp > now + JWT_MAX_LIFETIME:
        raise HttpError(401, "'Expiration time' claim ('exp') is too far in the future")
    req.principal = ("app",)


def check_token(state: FakeState, req: Request) -> None:
    scheme, value = credentials(req)
    if not value or scheme not in ("token", "bearer"):
        raise HttpError(401, "Requires authentication")
    token = state.tokens.get(value)
    if token is None or token.revoked or token.expires_at <= state.clock():
        raise HttpError(401, "Bad credentials")
    req.token = token
    req.installation_id = token.installation_id
    req.principal = ("installation", token.installation_id)


def optional_auth(state: FakeState, req: Request) -> None:
    scheme, value = credentials(req)
    if not value:
        return
    if value.count(".") == 2:
        check_jwt(state, req)
    else:
        check_token(state, req)


def limit_from_now(state: FakeState, reset_in: float | None, retry_after: int | None) -> Limit:
    """A limit from now: to the reset, else for retry-after, else until cleared."""
    now = state.clock()
    if reset_in is not None:
        return Limit(until=now + reset_in, retry_after=retry_after)
    if retry_after is not None:
        return Limit(until=now + retry_after, retry_after=retry_after)
    return Limit(until=None, retry_after=retry_after)


def active_limit(state: FakeState, key: int | str | None) -> Limit | None:
    """The limit set on an installation (by id) or on the App's JWT (APP_KEY), if live."""
    if key is None:
        return None
    limit = state.limits.get(key)
    if limit is not None and limit.until is not None and state.clock() >= limit.until:
        del state.limits[key]  # the window has passed on the fake's clock
        return None
    return limit


def check_rate(state: FakeState, req: Request) -> None:
    """Refuse a call over its quota or under a set limit: the installation's token's, or
    (on a JWT route) the App's own, which GitHub counts apart from its installations'."""
    as_app = req.principal[0] == "app"
    inst_id = req.installation_id
    limit = active_limit(state, APP_KEY if as_app else inst_id)
    hour = quota(state, ("app",) if as_app else ("installation", inst_id))
    who = f"app ID {state.app_id}" if as_app else f"installation ID {inst_id}"
    if limit is not None and limit.retry_after is not None:
        raise HttpError(
            429,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you "
            "try again.",
            headers={"Retry-After": str(int(limit.retry_after))},
            documentation_url=SECONDARY_DOCS,
        )
    if limit is not None and limit.until is None:
        # GitHub's "said nothing" answer: no retry-after, remaining not 0, no reset.
        raise HttpError(
            403,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you "
            "try again.",
            documentation_url=SECONDARY_DOCS,
        )
    if limit is not None or hour.used >= hour.limit:
        raise HttpError(
            403,
            f"API rate limit exceeded for {who}.",
            documentation_url=RATE_DOCS,
        )


def quota(state: FakeState, principal: tuple[Any, ...]) -> Quota:
    """The caller's hourly quota, a new one once the window has passed."""
    now = state.clock()
    current = state.quotas.get(principal)
    if current is None or now >= current.reset:
        limit = {"installation": INSTALLATION_LIMIT, "app": APP_LIMIT}.get(principal[0], ANON_LIMIT)
        current = Quota(limit=limit, reset=now + RATE_WINDOW)
        state.quotas[principal] = current
    return current


def rate_numbers(state: FakeState, principal: tuple[Any, ...]) -> tuple[int, int, int, int | None]:
    """(limit, remaining, used, reset) as GitHub would report them for this caller.

    The reset is None while an installation is under a limit that gives no timing.
    """
    current = quota(state, principal)
    key: int | str | None = None
    if principal[0] == "installation":
        key = principal[1]
    elif principal[0] == "app":
        key = APP_KEY
    limit = active_limit(state, key)
    if limit is not None and limit.until is None and limit.retry_after is None:
        used = min(current.used, current.limit - 1)
        return current.limit, current.limit - used, used, None
    if limit is not None and limit.until is not None and limit.retry_after is None:
        return current.limit, 0, current.limit, math.ceil(limit.until)
    used = min(current.used, current.limit)
    return current.limit, current.limit - used, used, math.ceil(current.reset)


def add_rate_headers(state: FakeState, response: Response, principal: tuple[Any, ...]) -> None:
    limit, remaining, used, reset = rate_numbers(state, principal)
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
