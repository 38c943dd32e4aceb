"""CONF-03/04/05, HOST-02, SEC-01/02/04: what validation finds, and what stops startup."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.core import checks

from tests.zoomies_site.layers import only
from zoomies_site import registry
from zoomies_site.checks import settings_findings
from zoomies_site.findings import Finding

NOT_CONFIGURED = {"config.no_webhook_secret", "config.github_app_not_configured"}
CONFIGURED = {
    "github.webhook_secrets": ["hook-secret"],
    "github.app_id": 1234,
    "github.private_key_file": "/etc/zoomies/app.pem",
}


@dataclass
class FakePool:
    name: str
    ephemeral: bool = True
    dind: bool = False


def keys(findings: list[Finding]) -> set[str]:
    return {f.key for f in findings}


def test_sec_04_the_safe_defaults_warn_only_about_what_is_not_configured():
    findings = registry.validate(only())
    assert keys(findings) == NOT_CONFIGURED
    assert all(f.severity == "warning" for f in findings)


def test_a_configured_install_on_the_defaults_has_no_findings():
    assert registry.validate(CONFIGURED, pools=[FakePool("linux")]) == []


def test_sec_01_and_sec_02_the_defaults_are_loopback_and_authenticated(defaults):
    assert defaults["server.bind"].startswith("127.0.0.1:")
    assert registry.is_loopback(registry._split_bind(defaults["server.bind"])[0])
    assert defaults["auth.enabled"] is True


def test_conf_03_every_finding_has_a_severity_title_why_and_fix():
    bad = {
        **CONFIGURED,
        "server.bind": "0.0.0.0:8080",
        "auth.enabled": False,
        "tasks.create_lease": "5m",
    }
    findings = registry.validate(bad, pools=[FakePool("a", ephemeral=False)])
    assert findings
    for finding in findings:
        assert finding.severity in ("error", "warning")
        assert finding.key and finding.title and finding.why and finding.fix
        assert finding.as_dict().keys() == {"severity", "key", "title", "why", "fix"}
    assert findings[0].is_error, "errors come first"


# --- each warning fires -------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"agent.heartbeat_interval": "46s"}, "config.heartbeat_interval_above_half"),
        ({"server.bind": "0.0.0.0:8080"}, "config.bind_without_tls"),
        ({"server.bind": ":8080"}, "config.bind_without_tls"),
        ({"server.bind": "10.0.0.5:8080"}, "config.bind_without_tls"),
        ({"auth.enabled": False}, "config.auth_disabled"),
        ({"github.poll_fallback": False}, "config.poll_fallback_off"),
        ({"github.webhook_secrets": []}, "config.no_webhook_secret"),
        ({"github.app_id": 0}, "config.github_app_not_configured"),
        ({"github.private_key_file": ""}, "config.github_app_not_configured"),
        ({"github.api_url": "http://ghe.internal/api/v3"}, "config.github_api_not_https"),
        ({"runners.docker_wait": "600s"}, "config.not_progressing_during_docker_wait"),
        ({"store.host_usage_max_age": "10s"}, "config.host_usage_max_age_below_heartbeat"),
        ({"housekeeping.tick": "60s"}, "config.housekeeping_tick_slow"),
    ],
)
def test_sec_04_each_departure_from_the_safe_defaults_is_a_named_warning(overrides, key):
    findings = registry.validate({**CONFIGURED, **overrides})
    assert key in keys(findings)
    assert all(f.severity == "warning" for f in findings if f.key == key)


def test_host_02_a_heartbeat_interval_of_exactly_half_the_timeout_is_fine():
    findings = registry.validate({**CONFIGURED, "agent.heartbeat_interval": "45s"})
    assert "config.heartbeat_interval_above_half" not in keys(findings)


@pytest.mark.parametrize("bind", ["127.0.0.1:8080", "localhost:80", "[::1]:8080", "127.8.9.1:1"])
def test_sec_01_a_loopback_bind_needs_no_tls(bind):
    assert "config.bind_without_tls" not in keys(
        registry.validate({**CONFIGURED, "server.bind": bind})
    )


def test_a_public_bind_with_tls_is_not_a_warning():
    config = {
        **CONFIGURED,
        "server.bind": "0.0.0.0:443",
        "server.tls_cert": "/etc/zoomies/cert.pem",
        "server.tls_key": "/etc/zoomies/key.pem",
    }
    assert registry.validate(config) == []


def test_sec_04_each_non_ephemeral_pool_is_named_in_its_own_warning():
    pools = [FakePool("linux"), FakePool("long-a", ephemeral=False), FakePool("long-b", False)]
    findings = registry.validate(CONFIGURED, pools=pools)
    assert keys(findings) == {
        "config.pool_not_ephemeral:long-a",
        "config.pool_not_ephemeral:long-b",
    }
    assert all("long-" in f.title for f in findings)


def test_sec_04_a_pool_that_gives_jobs_docker_is_a_warning():
    findings = registry.validate(CONFIGURED, pools=[FakePool("builds", dind=True)])
    assert keys(findings) == {"config.pool_docker_exposed:builds"}


# --- each relationship error fires --------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"scheduler.provision_timeout": "13m"}, "config.provision_timeout_too_short"),
        ({"agent.create_timeout": "17m"}, "config.provision_timeout_too_short"),
        ({"runners.docker_wait": "3600"}, "config.provision_timeout_too_short"),
        ({"scheduler.provision_timeout": "21m"}, "config.provision_timeout_exceeds_create_lease"),
        ({"tasks.create_lease": "10m"}, "config.create_lease_too_short"),
        ({"tasks.stop_lease": "6m"}, "config.stop_lease_too_short"),
        ({"runners.drain_grace": "9m"}, "config.stop_lease_too_short"),
        ({"tasks.remove_lease": "2m"}, "config.remove_lease_too_short"),
        ({"host.lost_after": "90s"}, "config.host_lost_before_unhealthy"),
        ({"agent.heartbeat_interval": "90s"}, "config.heartbeat_interval_not_below_timeout"),
        ({"tasks.host_check_lease": "45s"}, "config.host_check_lease_too_short"),
        ({"controller.lease_renew": "15s"}, "config.controller_lease_renew_too_slow"),
        ({"scheduler.start_backoff": "6m"}, "config.start_backoff_above_max"),
        ({"scheduler.max_start_backoff": "11m"}, "config.start_backoff_outlasts_retention"),
        ({"scheduler.throttle_recovery": "1m"}, "config.throttle_recovery_too_short"),
        ({"scheduler.throttle_step": "29s"}, "config.throttle_step_too_short"),
        ({"scheduler.stale_throttle_reset": "5m"}, "config.stale_throttle_reset_too_early"),
        ({"scheduler.load_per_cpu_calm": 2.0}, "config.load_thresholds_inverted"),
        ({"scheduler.auto_pools_host_grace": "5m"}, "config.auto_pools_host_grace_too_short"),
        ({"github.rate_limit_fallback": "1h", "github.rate_limit_cap": "30m"},
         "config.rate_limit_fallback_above_cap"),
        ({"agent.start_hold": "2m"}, "config.start_hold_above_max"),
        ({"server.tls_cert": "/c.pem"}, "config.tls_incomplete"),
    ],
)  # fmt: skip
def test_each_broken_relationship_is_an_error_finding(overrides, key):
    findings = registry.validate({**CONFIGURED, **overrides})
    matching = [f for f in findings if f.key == key]
    assert matching, keys(findings)
    assert all(f.is_error for f in matching)


def test_conf_07_the_provision_finding_says_what_the_bound_is():
    (finding,) = [
        f
        for f in registry.validate({"scheduler.provision_timeout": "12m"})
        if f.key == "config.provision_timeout_too_short"
    ]
    assert "13m" in finding.fix and "10m" in finding.why and "3m" in finding.why


def test_a_bad_value_given_to_validate_is_an_error_finding():
    (finding,) = [f for f in registry.validate({"runners.docker_wait": 0}) if f.is_error]
    assert finding.key == "config.invalid_value:runners.docker_wait"
    assert "below the minimum of 1s" in finding.why


# --- CONF-04: errors stop startup -----------------------------------------------------------


def test_conf_04_raise_for_errors_lists_every_error():
    findings = registry.validate({"tasks.create_lease": "5m", "auth.enabled": False})
    errors = [f for f in findings if f.is_error]
    assert len(errors) >= 2
    with pytest.raises(registry.ConfigError) as raised:
        registry.raise_for_errors(findings)
    message = str(raised.value)
    assert f"{len(errors)} configuration errors" in message
    for finding in errors:
        assert finding.key in message and finding.title in message
    assert "config.auth_disabled" not in message
    assert raised.value.findings == errors


def test_conf_04_warnings_alone_do_not_stop_startup():
    registry.raise_for_errors(registry.validate({"auth.enabled": False}))


@pytest.mark.django_db
def test_conf_05_startup_findings_read_the_live_values_and_pools(monkeypatch):
    from runners.models import Pool

    Pool.objects.create(name="zoomies-long", ephemeral=False)
    Pool.objects.create(name="zoomies-short")
    monkeypatch.setenv("ZOOMIES_AUTH_ENABLED", "false")
    found = keys(registry.startup_findings())
    assert found == NOT_CONFIGURED | {
        "config.auth_disabled",
        "config.pool_not_ephemeral:zoomies-long",
    }


@pytest.mark.django_db
def test_conf_04_the_system_check_reports_error_findings_only(monkeypatch):
    monkeypatch.setenv("ZOOMIES_AUTH_ENABLED", "false")
    assert settings_findings() == []
    monkeypatch.setenv("ZOOMIES_TASKS_CREATE_LEASE", "5m")
    messages = settings_findings()
    assert {m.id for m in messages} >= {"zoomies.config.create_lease_too_short"}
    assert all(m.level == checks.ERROR for m in messages)
    assert all(m.hint for m in messages)


def test_the_system_check_is_registered():
    assert settings_findings in checks.registry.registry.get_checks()
