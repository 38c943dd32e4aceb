"""Proxmox onboarding (issue 24 item 4, MACH-20..24): a connection staged behind a
short-lived capability, enrolled from the hypervisor, looked at from the server, and spent
when the provider is saved (fleet.provider_actions.create_provider).

1. An admin starts a setup: a name, and a capability (a random secret, shown once; only its
   hash is kept) that expires after SETUP_TTL.
2. Root on the hypervisor runs `enrollment_script`, fetched with the capability: it makes a
   privilege-separated API token and POSTs the endpoint, the cluster CA (or a pinned
   fingerprint) and the token here (`enroll_setup`). The secret is sealed before it reaches
   the row; the capability is then spent.
3. `discover_setup` uses the staged token, on the server, against the enrolled endpoint
   verified by the enrolled CA: the browser never holds a credential (MACH-22).

Expired setups are purged by the housekeeping tick (runners.housekeeping) and ignored by
every read here before that. Nothing in this module touches a host, a join token or a
claim code (MACH-24).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
import ssl
from collections.abc import Mapping
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet

from accounts import audit
from fleet.models import MachineProvider, ProviderSetup
from fleet.providers.contract import OutcomeUnknown, ProviderDown, ProviderError
from fleet.providers.proxmox.client import (
    FINGERPRINT,
    ApiError,
    CertificateRefused,
    Client,
    Endpoint,
)
from fleet.providers.proxmox.discovery import Discovery, discover
from fleet.providers.proxmox.provider import PRIVILEGES, PRIVILEGES_PVE8
from zoomies_site.core import sealing

SETUP_TTL = timedelta(minutes=30)
HOUSEKEEPING = "system:housekeeping"
# A provider's name is a DNS label (RFC 1123): it appears in machine names, logs and metric
# labels. Here, below fleet.provider_actions, which checks a name made without a setup too.
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TOKEN_ID = re.compile(r"^[^\s:/!]+@[A-Za-z][\w.-]+![A-Za-z][\w.-]*$")
SECRET = re.compile(r"^[A-Za-z0-9-]{8,128}$")  # Proxmox's token secrets are UUIDs
ENROLL_FIELDS = ("endpoint", "ca_pem", "fingerprint", "token_id", "secret")
MAX_CA_PEM = 16_384
# The connection keys a saved provider's config holds; nothing else may set them.
CONNECTION_KEYS = ("endpoint", "ca_pem", "fingerprint", "token_id", "token_sealed")


class SetupGone(Exception):
    """No such setup, or it expired, or (for the capability) it was enrolled already."""


class AlreadyEnrolled(Exception):
    """The capability was spent: the setup holds its connection already."""


class NotEnrolled(Exception):
    """The setup has no connection yet: its command has not been run."""


class DiscoveryFailed(Exception):
    """The cluster could not be asked: `reason` is unreachable, certificate, token_refused,
    no_answer or refused; `detail` is the sentence."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def capability_hash(capability: str) -> str:
    return hashlib.sha256(capability.encode()).hexdigest()


def live_setups(now: datetime) -> QuerySet[ProviderSetup]:
    """Setups not yet expired (an expired one may wait for the housekeeping tick)."""
    return ProviderSetup.objects.filter(expires_at__gt=now)


def provider_name_errors(name: Any) -> list[str]:
    """What is wrong with `name` as a new provider's (or a setup's, which becomes one)."""
    if not isinstance(name, str) or not DNS_LABEL.match(name):
        return ["a DNS label: lowercase letters, digits and hyphens, at most 63"]
    if MachineProvider.objects.filter(name=name).exists():
        return [f"a provider named {name} exists already"]
    return []


# -- 1. start -----------------------------------------------------------------------------


def start_setup(*, name: str, actor: str, now: datetime) -> tuple[ProviderSetup, str]:
    """A new setup and its capability, which exists only in this answer."""
    errors = provider_name_errors(name)
    if errors:
        raise ValidationError({"name": errors})
    capability = secrets.token_urlsafe(32)
    with transaction.atomic(durable=True):
        setup = ProviderSetup.objects.create(
            name=name, capability_hash=capability_hash(capability), created_at=now,
            created_by=actor, expires_at=now + SETUP_TTL,
        )  # fmt: skip
        audit.record(
            actor=actor, action="provider_setup.start", target=setup,
            detail={"name": name, "expires_at": setup.expires_at.isoformat()}, at=now,
        )  # fmt: skip
    return setup, capability


def setup_for_capability(capability: str, *, now: datetime) -> ProviderSetup | None:
    """The unexpired, not yet enrolled setup this capability opens; else None."""
    if not capability or len(capability) > 100:
        return None
    return (
        live_setups(now)
        .filter(capability_hash=capability_hash(capability), enrolled_at__isnull=True)
        .first()
    )


def enroll_command(base_url: str, capability: str) -> str:
    return f"curl -fsS {shlex.quote(script_url(base_url, capability))} | sh"


def script_url(base_url: str, capability: str) -> str:
    return f"{base_url.rstrip('/')}/machines/setup/{capability}/script"


def enrollment_script(setup: ProviderSetup, capability: str, *, base_url: str) -> str:
    """The POSIX sh the operator runs as root on the hypervisor (MACH-21); every value put
    in is shell-quoted."""
    template = resources.files("fleet.providers.proxmox").joinpath("enroll.sh").read_text()
    enroll_url = f"{base_url.rstrip('/')}/machines/setup/{capability}/enroll"
    values = {
        "@NAME@": setup.name,  # a DNS label: nothing to quote
        "@PRIVILEGES@": shlex.quote(" ".join(PRIVILEGES)),
        "@PRIVILEGES_PVE8@": shlex.quote(" ".join(PRIVILEGES_PVE8)),
        "@TOKEN_PREFIX@": f"zoomies-{setup.name}",
        "@ENROLL_URL@": shlex.quote(enroll_url),
    }
    for placeholder, value in values.items():
        template = template.replace(placeholder, value)
    return template


# -- 2. enroll ----------------------------------------------------------------------------


def enrollment_errors(body: Any) -> dict[str, list[str]]:
    """What is wrong with an enrollment's body, by field; empty: it may be stored."""
    if not isinstance(body, dict):
        return {"detail": ["a JSON object: endpoint, ca_pem, fingerprint, token_id, secret"]}
    errors: dict[str, list[str]] = {}
    for key in sorted(set(body) - set(ENROLL_FIELDS)):
        errors[str(key)] = ["this field does not exist here"]
    for key in ENROLL_FIELDS:
        if not isinstance(body.get(key, ""), str):
            errors[key] = ["a string"]
    if errors:
        return errors
    endpoint = body.get("endpoint", "")
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018  # raises on a port out of range
    except ValueError:
        parts = None
    if (
        parts is None or parts.scheme != "https" or not parts.hostname or parts.username
        or parts.path not in ("", "/") or parts.query or parts.fragment or len(endpoint) > 300
    ):  # fmt: skip
        errors["endpoint"] = ["https://HOST:PORT of a node, nothing after it"]
    ca_pem, fingerprint = body.get("ca_pem", ""), body.get("fingerprint", "")
    if not ca_pem and not fingerprint:
        errors["ca_pem"] = ["the cluster CA (pve-root-ca.pem), or a fingerprint to pin"]
    if ca_pem:
        try:
            if len(ca_pem) > MAX_CA_PEM or "BEGIN CERTIFICATE" not in ca_pem:
                raise ssl.SSLError("not a PEM certificate")
            ssl.create_default_context(cadata=ca_pem)
        except (ssl.SSLError, ValueError):
            errors["ca_pem"] = ["not a PEM certificate"]
    if fingerprint and not FINGERPRINT.match(fingerprint):
        errors["fingerprint"] = ["SHA-256 in hex, 32 bytes, colons allowed"]
    if not TOKEN_ID.match(body.get("token_id", "")):
        errors["token_id"] = ["USER@REALM!TOKENID, as pveum prints full-tokenid"]
    if not SECRET.match(body.get("secret", "")):
        errors["secret"] = ["the token's value, as pveum prints it"]
    return errors


def enroll_setup(capability: str, body: Any, *, now: datetime) -> ProviderSetup:
    """Store what the hypervisor sent, the secret sealed, and spend the capability. An
    enrolled setup lives SETUP_TTL from now (time to look and save), not past that."""
    hashed = capability_hash(capability) if capability and len(capability) <= 100 else ""
    setup = live_setups(now).filter(capability_hash=hashed).first() if hashed else None
    if setup is None:
        raise SetupGone("no setup is waiting for this command (unknown or expired)")
    if setup.enrolled_at is not None:
        raise AlreadyEnrolled(f"setup {setup.name} was enrolled already")
    errors = enrollment_errors(body)
    if errors:
        raise ValidationError(errors)
    token_id = body["token_id"]
    # The fingerprint pins the served certificate; with one, the CA is not needed.
    fingerprint = body.get("fingerprint", "")
    ca_pem = "" if fingerprint else body["ca_pem"]
    with transaction.atomic(durable=True):
        # Compare-and-set: of two enrollments racing on one capability, one wins.
        won = ProviderSetup.objects.filter(
            pk=setup.pk, enrolled_at__isnull=True, expires_at__gt=now
        ).update(
            endpoint=body["endpoint"].rstrip("/"), ca_pem=ca_pem, fingerprint=fingerprint,
            token_id=token_id, token_sealed=sealing.seal(body["secret"]), enrolled_at=now,
            expires_at=max(setup.expires_at, now + SETUP_TTL),
        )  # fmt: skip
        if not won:
            raise AlreadyEnrolled(f"setup {setup.name} was enrolled already")
        audit.record(
            actor=f"enrollment:{token_id}", action="provider_setup.enroll", target=setup,
            detail={"endpoint": body["endpoint"], "token_id": token_id,
                    "trust": "fingerprint" if fingerprint else "ca"}, at=now,
        )  # fmt: skip
    setup.refresh_from_db()
    return setup


# -- 3. look --------------------------------------------------------------------------------


def enrolled_setup(pk: int, *, now: datetime) -> ProviderSetup:
    setup = live_setups(now).filter(pk=pk).first()
    if setup is None:
        raise SetupGone(f"no setup {pk} (or it expired)")
    if setup.enrolled_at is None:
        raise NotEnrolled(f"setup {setup.name} is not enrolled yet: run its command first")
    return setup


def connection_config(setup: ProviderSetup) -> dict[str, str]:
    """What a saved provider's config holds of the setup: the endpoint, how to trust it,
    and the token, still sealed."""
    trust = {"fingerprint": setup.fingerprint} if setup.fingerprint else {"ca_pem": setup.ca_pem}
    return {"endpoint": setup.endpoint, **trust, "token_id": setup.token_id,
            "token_sealed": setup.token_sealed}  # fmt: skip


def unsealed_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A provider's config as ProxmoxProvider.from_config takes it: a sealed token opened
    (USER@REALM!TOKENID=SECRET), anything else (`token`, `token_file`) as it was."""
    opened = dict(config)
    if opened.get("token_sealed"):
        secret = sealing.unseal_text(opened.pop("token_sealed"))
        opened["token"] = f"{opened.pop('token_id')}={secret}"
    return opened


def discover_setup(pk: int, *, actor: str, now: datetime, timeout: float = 15.0) -> Discovery:
    """The cluster as the staged token sees it, asked from here over TLS verified by the
    enrolled CA or fingerprint (MACH-22). The audit row says who looked, and the outcome."""
    setup = enrolled_setup(pk, now=now)
    failure: DiscoveryFailed | None = None
    found: Discovery | None = None
    try:
        settings = unsealed_config(connection_config(setup))
        endpoint = Endpoint(
            url=settings["endpoint"], token=settings["token"], ca_pem=settings.get("ca_pem", ""),
            fingerprint=settings.get("fingerprint", ""), timeout=timeout,
        )  # fmt: skip
        client = Client(endpoint, name=f"setup {setup.name}", task_wait=timeout)
    except (sealing.SealError, ValueError, ssl.SSLError) as exc:
        failure = DiscoveryFailed("refused", f"the staged connection cannot be used: {exc}")
    else:
        try:
            found = discover(client)
        except ProviderError as exc:
            failure = DiscoveryFailed(failure_reason(exc), str(exc))
        finally:
            client.close()
    with transaction.atomic(durable=True):
        audit.record(
            actor=actor, action="provider_setup.discover", target=setup,
            detail={"endpoint": setup.endpoint, "outcome": failure.reason if failure else "ok"},
            at=now,
        )  # fmt: skip
    if failure is not None:
        raise failure
    assert found is not None  # noqa: S101  # one of the two is set above
    return found


def failure_reason(exc: ProviderError) -> str:
    """Why the cluster could not be asked, as the Settings page names it."""
    if isinstance(exc, CertificateRefused):
        return "certificate"
    if isinstance(exc, ProviderDown):
        return "unreachable"
    if isinstance(exc, OutcomeUnknown):
        return "no_answer"
    if isinstance(exc, ApiError) and exc.status in (401, 403):
        return "token_refused"
    return "refused"


# -- expiry ---------------------------------------------------------------------------------


def purge_expired_setups(now: datetime) -> list[str]:
    """Delete the setups past their time, with their sealed tokens (the housekeeping tick).
    The token stays on the cluster: the line says which one to remove there."""
    lines = []
    for setup in ProviderSetup.objects.filter(expires_at__lte=now):
        with transaction.atomic():
            gone, _ = ProviderSetup.objects.filter(pk=setup.pk, expires_at__lte=now).delete()
            if not gone:
                continue
            audit.record(
                actor=HOUSEKEEPING, action="provider_setup.expired", target=setup,
                detail={"name": setup.name, "token_id": setup.token_id}, at=now,
            )  # fmt: skip
        token = f"; its token {setup.token_id} is left on the cluster" if setup.token_id else ""
        lines.append(f"provider setup {setup.name} expired{token}")
    return lines
