"""CONF-03/04/05, HOST-02, SEC-01/02/04: what validation finds, and what stops startup."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.core import checks

from runners.findings import pool_findings
from runners.models import Pool
from tests.zoomies_site.layers import only
from zoomies_site.checks import settings_findings
from zoomies_site.core import registry
from zoomies_site.core.findings import Finding
from zoomies_site.problems import config_findings

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
    assert registry.validate(CONFIGURED) == []
    assert pool_findings([FakePool("linux")]) == []


def test_sec_01_the_default_bind_is_loopback(defaults):
    assert defaults["server.bind"].startswith("127.0.0.1:")
    assert registry.is_loopback(registry.split_bind(defaults["server.bind"])[0])


def test_conf_03_every_finding_has_a_severity_title_why_and_fix():
    bad = {
        **CONFIGURED,
        "server.bind": "0.0.0.0:8080",
        "github.poll_fallback": False,
        "tasks.create_lease": "5m",
    }
    findings = registry.validate(bad) + pool_findings([FakePool("a", ephemeral=False)])
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
        ({"github.poll_fallback": False}, "config.poll_fallback_off"),
        ({"github.webhook_secrets": []}, "config.no_webhook_secret"),
        ({"github.app_id": 0}, "config.github_app_not_configured"),
        ({"github.private_key_file": ""}, "config.github_app_not_configured"),
        ({"github.api_url": "http://ghe.internal/api/v3"}, "config.github_api_not_https"),
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
    findings = pool_findings(pools)
    assert keys(findings) == {
        "config.pool_not_ephemeral:long-a",
        "config.pool_not_ephemeral:long-b",
    }
    assert all("long-" in f.title for f in findings)


def test_sec_04_a_pool_that_gives_jobs_docker_is_a_warning():
    findings = pool_findings([FakePool("builds", dind=True)])
    assert keys(findings) == {"config.pool_docker_exposed:builds"}


# --- each relationship error fires --------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"scheduler.provision_timeout": "21m"}, "config.provision_timeout_exceeds_create_lease"),
        ({"tasks.create_lease": "10m"}, "config.provision_timeout_exceeds_create_lease"),
        ({"tasks.stop_lease": "6m"}, "config.stop_lease_too_short"),
        ({"runners.drain_grace": "9m"}, "config.stop_lease_too_short"),
        ({"host.lost_after": "90s"}, "config.host_lost_before_unhealthy"),
        ({"agent.heartbeat_interval": "90s"}, "config.heartbeat_interval_not_below_timeout"),
        ({"controller.lease_renew": "15s"}, "config.controller_lease_renew_too_slow"),
        ({"scheduler.start_backoff": "6m"}, "config.start_backoff_above_max"),
        ({"scheduler.max_start_backoff": "11m"}, "config.start_backoff_outlasts_retention"),
        ({"github.rate_limit_fallback": "1h", "github.rate_limit_cap": "30m"},
         "config.rate_limit_fallback_above_cap"),
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
        for f in registry.validate({"tasks.create_lease": "15m"})
        if f.key == "config.provision_timeout_exceeds_create_lease"
    ]
    assert "15m" in finding.fix and "20m" in finding.why


def test_a_bad_value_given_to_validate_is_an_error_finding():
    (finding,) = [f for f in registry.validate({"github.poll_interval": 0}) if f.is_error]
    assert finding.key == "config.invalid_value:github.poll_interval"
    assert "below the minimum of 5s" in finding.why


# --- CONF-04: errors stop startup -----------------------------------------------------------


def test_conf_04_raise_for_errors_lists_every_error():
    findings = registry.validate(
        {"tasks.create_lease": "5m", "controller.lease_renew": "15s", "github.poll_fallback": False}
    )
    errors = [f for f in findings if f.is_error]
    assert len(errors) >= 2
    with pytest.raises(registry.ConfigError) as raised:
        registry.raise_for_errors(findings)
    message = str(raised.value)
    assert f"{len(errors)} configuration errors" in message
    for finding in errors:
        assert finding.key in message and finding.title in message
    assert "config.poll_fallback_off" not in message
    assert raised.value.findings == errors


def test_conf_04_warnings_alone_do_not_stop_startup():
    registry.raise_for_errors(registry.validate({"github.poll_fallback": False}))


@pytest.mark.django_db
def test_conf_05_startup_findings_read_the_live_values_and_pools(monkeypatch):

    Pool.objects.create(name="zoomies-long", ephemeral=False)
    Pool.objects.create(name="zoomies-short")
    monkeypatch.setenv("ZOOMIES_GITHUB_POLL_FALLBACK", "false")
    found = keys(config_findings(fresh=True))
    assert found == NOT_CONFIGURED | {
        "config.poll_fallback_off",
        "config.pool_not_ephemeral:zoomies-long",
    }


@pytest.mark.django_db
def test_conf_04_the_system_check_reports_error_findings_only(monkeypatch):
    monkeypatch.setenv("ZOOMIES_GITHUB_POLL_FALLBACK", "false")
    assert settings_findings() == []
    monkeypatch.setenv("ZOOMIES_TASKS_CREATE_LEASE", "5m")
    messages = settings_findings()
    assert {m.id for m in messages} >= {"zoomies.config.provision_timeout_exceeds_create_lease"}
    assert all(m.level == checks.ERROR for m in messages)
    assert all(m.hint for m in messages)


def test_the_system_check_is_registered():
    assert settings_findings in checks.registry.registry.get_checks()


# --- findings are true (issue 8, item 11) --------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"ZOOMIES_GITHUB_WEBHOOK_SECRET": "hook-secret"},
        {"ZOOMIES_GITHUB_WEBHOOK_SECRETS": "old,new"},
    ],
)
def test_sec_04_a_webhook_secret_in_either_variable_is_a_configured_secret(env):
    values = registry.layered(env=env, yaml_text="", db_values={})
    assert "config.no_webhook_secret" not in keys(registry.validate(values))


def test_sec_04_a_webhook_secret_file_is_a_configured_secret(tmp_path):
    secret = tmp_path / "hook"
    secret.write_text("hook-secret\n")
    env = {"ZOOMIES_GITHUB_WEBHOOK_SECRET_FILE": str(secret)}
    values = registry.layered(env=env, yaml_text="", db_values={})
    assert values["github.webhook_secret"] == "hook-secret"
    assert "config.no_webhook_secret" not in keys(registry.validate(values))


def test_no_finding_points_at_a_flow_that_does_not_exist():
    findings = registry.validate(only()) + registry.validate({"server.bind": "0.0.0.0:80"})
    assert findings
    assert not [f.key for f in findings if "manifest" in f"{f.why} {f.fix}".lower()]


def test_esc09_scale_up_events_without_a_reachable_controller_url_are_a_finding():
    """Issue 27 item 6: publishing capacity events while the controller listens on loopback
    and no public URL is set would tell every new machine to dial 127.0.0.1."""
    publishing = {
        **CONFIGURED,
        "capacity_demand.destination_url": "https://scaler.example/hook",
        "capacity_demand.signing_secret": "a" * 64,
    }
    assert "config.no_public_url" in keys(registry.validate(publishing))
    for fixed in (
        {"server.public_url": "https://zoomies.example"},
        {"capacity_demand.controller_url": "https://zoomies.example"},
    ):
        assert "config.no_public_url" not in keys(registry.validate({**publishing, **fixed}))
    assert "config.no_public_url" not in keys(registry.validate(CONFIGURED))  # not publishing
