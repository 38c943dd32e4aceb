"""What the registry says about a set of values: relationships and posture (CONF-03, SEC-04).

Pure over a `Values`: no database, no clock. Findings about pools live with the pools
(`runners.findings`); the top floor joins the two (`zoomies_site.problems`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from zoomies_site.core.findings import Finding, error, errors, warning
from zoomies_site.core.registry.layers import Values, _defaults, current
from zoomies_site.core.registry.types import (
    ConfigError,
    _valid_bind,
    format_duration,
    is_loopback,
    split_bind,
)
from zoomies_site.core.transport import serves_tls

# --- validation ----------------------------------------------------------------------------


def validate(values: Mapping[str, Any] | None = None) -> list[Finding]:
    """Every finding about a configuration, errors first (CONF-03, CONF-04, SEC-04).

    `values` is a `Values` (None: the live ones) or a plain mapping of key to value, layered
    over the defaults. Pools have their own findings (`runners.findings`).
    """
    if values is None:
        vals = current()
    elif isinstance(values, Values):
        vals = values
    else:
        vals = _defaults().overlay(values, source="given", where="the values given")
    found = list(vals.problems)
    found += _relationship_findings(vals)
    found += _posture_findings(vals)
    return sorted(found, key=lambda f: not f.is_error)


def _fmt(value: Any) -> str:
    return format_duration(value) if isinstance(value, timedelta) else str(value)


def _relationship_findings(v: Values) -> list[Finding]:
    out: list[Finding] = []

    def need(ok: bool, key: str, title: str, why: str, fix: str, *, severe: bool = True) -> None:
        if not ok:
            out.append((error if severe else warning)(f"config.{key}", title, why, fix))

    pt, cl, sl = v["scheduler.provision_timeout"], v["tasks.create_lease"], v["tasks.stop_lease"]
    hi, ht, lost = v["agent.heartbeat_interval"], v["agent.heartbeat_timeout"], v["host.lost_after"]

    # CONF-07: a create still inside its runner's provision timeout is never abandoned.
    need(
        pt <= cl,
        "provision_timeout_exceeds_create_lease",
        "scheduler.provision_timeout is longer than tasks.create_lease",
        f"A create lost after {_fmt(cl)} is offered again while the runner is still within its "
        f"{_fmt(pt)} provision timeout, so a runner can fail with its create neither "
        "redelivered nor abandoned.",
        f"Lower scheduler.provision_timeout to {_fmt(cl)} or less, or raise tasks.create_lease.",
    )
    # TASK-12: the stop lease outlasts the stop it covers.
    stop_work = v["runners.drain_grace"] + v["agent.stop_margin"]
    need(
        sl > stop_work,
        "stop_lease_too_short",
        "tasks.stop_lease is not longer than runners.drain_grace plus agent.stop_margin",
        f"A stop may rightly take {_fmt(stop_work)}, so at {_fmt(sl)} it is offered again "
        "while the first attempt is still stopping the runner.",
        f"Raise tasks.stop_lease above {_fmt(stop_work)}, or lower runners.drain_grace.",
    )
    # The silence ladder (HOST-05): late, then unhealthy, then lost.
    need(
        hi < ht,
        "heartbeat_interval_not_below_timeout",
        "agent.heartbeat_interval is not shorter than agent.heartbeat_timeout",
        "Every host would count as unhealthy between two heartbeats, so nothing is placed.",
        f"Lower agent.heartbeat_interval to {_fmt(ht / 2)} or less.",
    )
    need(
        lost > ht,
        "host_lost_before_unhealthy",
        "host.lost_after is not later than agent.heartbeat_timeout",
        "Runners would be failed on a host the scheduler is still placing new ones on.",
        f"Raise host.lost_after above {_fmt(ht)}, or lower agent.heartbeat_timeout.",
    )
    # SCHED-32: a host's silence reshapes an automatic pool only after it is lost.
    grace = v["scheduler.auto_pools_host_grace"]
    need(
        grace > lost,
        "auto_pools_grace_not_above_host_lost",
        "scheduler.auto_pools_host_grace is not longer than host.lost_after",
        "An automatic pool would be reshaped for a host the fleet has not yet given up on, so "
        "a brief network drop would reshuffle the pools.",
        f"Raise scheduler.auto_pools_host_grace above {_fmt(lost)}.",
    )
    # One controller per database: one missed renewal must not lose the lease.
    ttl, renew = v["controller.lease_ttl"], v["controller.lease_renew"]
    need(
        renew < ttl / 2,
        "controller_lease_renew_too_slow",
        "controller.lease_renew is not under half of controller.lease_ttl",
        "One late renewal would let the lease lapse, and a second controller could take the "
        "database while this one still runs.",
        f"Lower controller.lease_renew below {_fmt(ttl / 2)}, or raise controller.lease_ttl.",
    )
    # SCHED-22: the backoff is computed from failures still inside the retention.
    need(
        v["scheduler.start_backoff"] <= v["scheduler.max_start_backoff"],
        "start_backoff_above_max",
        "scheduler.start_backoff is longer than scheduler.max_start_backoff",
        "The first wait after a failure would already be past the cap meant to bound it.",
        "Lower scheduler.start_backoff or raise scheduler.max_start_backoff.",
    )
    need(
        v["scheduler.max_start_backoff"] <= v["scheduler.failed_retention"],
        "start_backoff_outlasts_retention",
        "scheduler.max_start_backoff is longer than scheduler.failed_retention",
        "The failures the wait is computed from are gone before the wait ends.",
        f"Lower scheduler.max_start_backoff to {_fmt(v['scheduler.failed_retention'])} or less.",
    )
    need(
        v["github.rate_limit_fallback"] <= v["github.rate_limit_cap"],
        "rate_limit_fallback_above_cap",
        "github.rate_limit_fallback is longer than github.rate_limit_cap",
        "The stand-down for a silent rate limit would be longer than any GitHub may ask for.",
        "Lower github.rate_limit_fallback to github.rate_limit_cap or less.",
    )
    cert, key = v["server.tls_cert"], v["server.tls_key"]
    need(
        bool(cert) == bool(key),
        "tls_incomplete",
        "Only one of server.tls_cert and server.tls_key is set",
        "TLS needs both the certificate and its key, so the controller cannot serve it.",
        "Set both server.tls_cert and server.tls_key, or neither.",
    )
    # Consequences that do not break anything but mislead an operator: warnings.
    need(
        v["housekeeping.tick"] <= ht / 2,
        "housekeeping_tick_slow",
        "housekeeping.tick is more than half of agent.heartbeat_timeout",
        "Host health is judged on the tick, so a silent host is noticed long after the timeout.",
        f"Lower housekeeping.tick to {_fmt(ht / 2)} or less.",
        severe=False,
    )
    # CAP-02: a destination is never sent unsigned or signed with a guessable key.
    need(
        not v["capacity_demand.destination_url"] or bool(v["capacity_demand.signing_secret"]),
        "capacity_demand_secret_missing",
        "capacity_demand.destination_url is set but capacity_demand.signing_secret is not",
        "The receiver could not tell Zoomies' events from anyone else's.",
        "Set capacity_demand.signing_secret to the output of `openssl rand -hex 32`.",
    )
    return out


def _posture_findings(v: Values) -> list[Finding]:
    """Departures from the safe defaults, each a named warning (SEC-04, HOST-02)."""
    out: list[Finding] = []
    # The longest interval that one late heartbeat never counts against.
    quiet = v["agent.heartbeat_timeout"] / 2
    if quiet < v["agent.heartbeat_interval"] < v["agent.heartbeat_timeout"]:
        out.append(
            warning(
                "config.heartbeat_interval_above_half",
                "agent.heartbeat_interval is more than half of agent.heartbeat_timeout",
                "One late heartbeat is enough to mark a healthy host unhealthy, and the "
                "scheduler stops placing runners on it.",
                f"Lower agent.heartbeat_interval to {_fmt(quiet)} or less.",
            )
        )
    bind = v["server.bind"]
    host = split_bind(bind)[0] if _valid_bind(bind) is None else ""
    if not is_loopback(host) and not serves_tls(v):
        why = (
            "Passwords, session cookies, API tokens and agent credentials cross the network "
            "in plain text."
        )
        if v["server.tls_proxy"]:
            # The proxy's side is encrypted; the controller's own listener still is not.
            why = (
                "server.tls_proxy says a proxy terminates TLS, but anyone who reaches this "
                "address directly bypasses it: their passwords, session cookies and tokens "
                "cross the network in plain text, and their X-Forwarded-Proto is believed."
            )
        out.append(
            warning(
                "config.bind_without_tls",
                f"The controller listens on {bind} without TLS",
                why,
                "Set server.tls_cert and server.tls_key, put a TLS proxy in front and bind "
                "to 127.0.0.1 (with server.tls_proxy on), or bind to loopback.",
            )
        )
    if (
        v["capacity_demand.destination_url"]
        and not v["capacity_demand.controller_url"]
        and not v["server.public_url"]
        and is_loopback(host)
    ):
        out.append(
            warning(
                "config.no_public_url",
                "Scale-up events would tell new machines to dial a loopback address",
                f"No server.public_url is set and the controller listens on {bind}: a machine "
                "an autoscaler starts cannot reach that, so it never joins.",
                "Set server.public_url to the address machines reach this controller at (or "
                "capacity_demand.controller_url for the autoscaler's machines alone).",
            )
        )
    api = urlparse(v["github.api_url"])
    if api.scheme == "http" and not is_loopback(api.hostname or ""):
        out.append(
            warning(
                "config.github_api_not_https",
                "github.api_url is plain HTTP",
                "App tokens and JIT runner credentials would cross the network unencrypted.",
                "Use the https:// address of the GitHub API.",
            )
        )
    if not v["github.poll_fallback"]:
        out.append(
            warning(
                "config.poll_fallback_off",
                "The fallback poller is off",
                "If webhooks stop arriving, queued jobs wait for ever and the fleet looks "
                "exactly like a quiet one.",
                "Set github.poll_fallback to true.",
            )
        )
    if not (v["github.webhook_secrets"] or v["github.webhook_secret"]):
        out.append(
            warning(
                "config.no_webhook_secret",
                "No webhook secret is configured",
                "Webhook deliveries cannot be verified, so jobs are only found by polling.",
                "Set github.webhook_secret (ZOOMIES_GITHUB_WEBHOOK_SECRET) to the secret "
                "configured on the GitHub App.",
            )
        )
    if not v["github.app_id"] or not (v["github.private_key"] or v["github.private_key_file"]):
        out.append(
            warning(
                "config.github_app_not_configured",
                "No GitHub App is configured",
                "Without App credentials Zoomies cannot see jobs or register runners.",
                "Set github.app_id and the App's key (manage.py set_secret github.private_key "
                "--from-file app.pem, or github.private_key_file); or run controller --sandbox "
                "to try Zoomies against its fake GitHub.",
            )
        )
    return out


def raise_for_errors(findings: Iterable[Finding]) -> None:
    """Raise ConfigError listing every error finding, if there is one (CONF-04)."""
    found = errors(findings)
    if found:
        raise ConfigError(found)
