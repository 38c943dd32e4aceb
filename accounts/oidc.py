"""OIDC single sign-on (AUTH-02) through mozilla-django-oidc, configured from the registry.

`auth.oidc_issuer` turns it on: the provider's endpoints are read from its discovery document
(`<issuer>/.well-known/openid-configuration`). A user is matched by issuer and subject, created
on a first sign-in and updated on every later one from the claims. The role comes from the
claim `auth.oidc_role_claim` (a list of groups, or one string): a value in
`auth.oidc_admin_groups` makes an admin, then operator, then viewer; the strongest wins. A
user with no mapped group is refused, and an existing one is not let in on old rights.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import jwt
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import transaction
from django.http import Http404
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from accounts import actions
from accounts.models import User
from zoomies_site.core import registry

log = logging.getLogger("zoomies.accounts")

ACTOR = "system:oidc"
DISCOVERY_TTL = 300.0  # seconds a provider's discovery document is reused
_discovery: dict[str, tuple[float, dict[str, Any]]] = {}
_discovery_lock = threading.Lock()

# What the library reads, and where each comes from here.
_FROM_DISCOVERY = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
_FIXED = {
    "OIDC_RP_SIGN_ALGO": "RS256",
    "OIDC_RP_SCOPES": "openid email profile",
    "OIDC_USE_PKCE": True,
    "OIDC_TIMEOUT": 10,
    "LOGIN_REDIRECT_URL_FAILURE": "/admin/login/?sso=refused",
}


def enabled() -> bool:
    return bool(registry.get("auth.oidc_issuer"))


def issuer() -> str:
    return registry.get("auth.oidc_issuer").rstrip("/")


def discovery(now: float | None = None) -> dict[str, Any]:
    """The provider's discovery document, fetched at most every DISCOVERY_TTL seconds."""
    now = time.monotonic() if now is None else now
    base = issuer()
    with _discovery_lock:
        cached = _discovery.get(base)
        if cached and now - cached[0] < DISCOVERY_TTL:
            return cached[1]
    url = f"{base}/.well-known/openid-configuration"
    try:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ImproperlyConfigured(f"cannot read the OIDC discovery document {url}: {exc}") from exc
    with _discovery_lock:
        _discovery[base] = (now, document)
    return document


def clear_discovery_cache() -> None:
    with _discovery_lock:
        _discovery.clear()


def setting(attr: str, *default):
    """The library's settings, from the registry and the discovery document."""
    if attr == "OIDC_RP_CLIENT_ID":
        return registry.get("auth.oidc_client_id")
    if attr == "OIDC_RP_CLIENT_SECRET":
        return registry.get("auth.oidc_client_secret")
    if attr in _FROM_DISCOVERY:
        return discovery().get(_FROM_DISCOVERY[attr], "") if enabled() else ""
    if attr in _FIXED:
        return _FIXED[attr]
    return import_from_settings(attr, *default)


def role_for(claims: dict[str, Any]) -> str | None:
    """The strongest role the claims' groups map to, or None when none is mapped."""
    raw = claims.get(registry.get("auth.oidc_role_claim"))
    groups = {raw} if isinstance(raw, str) else set(raw) if isinstance(raw, list) else set()
    groups = {g for g in groups if isinstance(g, str)}
    for role, key in (
        (User.Role.ADMIN, "auth.oidc_admin_groups"),
        (User.Role.OPERATOR, "auth.oidc_operator_groups"),
        (User.Role.VIEWER, "auth.oidc_viewer_groups"),
    ):
        if groups & set(registry.get(key)):
            return role
    return None


def _subject(claims: dict[str, Any]) -> str:
    return f"{issuer()} {claims.get('sub', '')}"


def _free_username(wanted: str) -> str:
    """`wanted`, or `wanted-2`, `-3`...: an SSO user never takes over a local account's name."""
    base = (wanted or "sso-user")[:140]
    name, n = base, 1
    while User.objects.filter(username=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


class ZoomiesOIDCBackend(OIDCAuthenticationBackend):
    """Users from an OpenID provider's claims, their role from its groups."""

    get_settings = staticmethod(setting)

    def authenticate(self, request, **kwargs):
        if not enabled():
            return None
        return super().authenticate(request, **kwargs)

    def retrieve_matching_jwk(self, token):
        """The provider's signing key for `token`.

        The library insists on a `kid` in the token's header; the JWS spec leaves it optional,
        and a provider with one key often sends none. Then the one key that could have signed
        it (its alg, use "sig") is taken, and more than one is refused as ambiguous.
        """
        answer = httpx.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=10)
        answer.raise_for_status()
        header = jwt.get_unverified_header(token)
        keys = [
            key
            for key in answer.json().get("keys", [])
            if key.get("alg", header.get("alg")) == header.get("alg")
            and key.get("use", "sig") == "sig"
            and ("kid" not in header or key.get("kid") == header["kid"])
        ]
        if len(keys) != 1:
            raise SuspiciousOperation(
                f"{len(keys)} keys of the provider's JWKS match the ID token's header"
            )
        return jwt.PyJWK(keys[0])

    def verify_token(self, token, **kwargs):
        """The library checks the signature and nonce; the issuer and audience are checked
        here, so an ID token the provider minted for another client is not taken."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if str(payload.get("iss", "")).rstrip("/") != issuer():
            raise SuspiciousOperation(f"the ID token was issued by {payload.get('iss')!r}")
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token was issued for another client")
        return payload

    def verify_claims(self, claims) -> bool:
        if not claims.get("sub"):
            log.warning("OIDC sign-in refused: the provider sent no subject")
            return False
        if role_for(claims) is None:
            log.warning(
                "OIDC sign-in refused for %s: no group in claim %r maps to a role",
                claims.get("sub"),
                registry.get("auth.oidc_role_claim"),
            )
            return False
        return True

    def filter_users_by_claims(self, claims):
        return User.objects.filter(oidc_subject=_subject(claims))

    def create_user(self, claims):
        wanted = claims.get("preferred_username") or claims.get("email") or claims["sub"]
        with transaction.atomic():
            username = _free_username(str(wanted))
        return actions.create_user(
            username=username,
            role=role_for(claims),
            email=claims.get("email") or "",
            oidc_subject=_subject(claims),
            actor=ACTOR,
        )

    def update_user(self, user, claims):
        changes = {"role": role_for(claims)}
        if claims.get("email"):
            changes["email"] = claims["email"]
        actions.update_user(user, actor=ACTOR, **changes)
        return user


class SignInView(OIDCAuthenticationRequestView):
    """GET /oidc/authenticate/: off the site to the provider (404 when OIDC is off)."""

    get_settings = staticmethod(setting)

    def __init__(self, *args, **kwargs):
        # The parent reads the endpoint at construction, which needs OIDC on.
        if enabled():
            super().__init__(*args, **kwargs)
        else:
            super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        if not enabled():
            raise Http404("single sign-on is not configured (auth.oidc_issuer)")
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """GET /oidc/callback/: the provider sends the browser back here with a code."""

    get_settings = staticmethod(setting)
