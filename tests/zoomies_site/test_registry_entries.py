"""CONF-01 and CONF-06: every setting is a typed entry with a sound default, range and help."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from zoomies_site import registry
from zoomies_site.registry import DURATION, SETTINGS

SPEC_DEFAULTS = {
    # The spec's constants, as the brief and architecture.txt name them.
    "server.bind": "127.0.0.1:8080",
    "server.tls_cert": "",
    "server.tls_key": "",
    "auth.enabled": True,
    "github.api_url": "https://api.github.com",
    "github.app_id": 0,
    "github.private_key_file": "",
    "github.private_key": "",
    "github.webhook_secrets": [],
    "github.poll_fallback": True,
    "github.poll_interval": timedelta(seconds=60),
    "github.reap_first_after": timedelta(minutes=1),
    "github.reap_interval": timedelta(minutes=10),
    "github.rate_limit_fallback": timedelta(minutes=15),
    "github.rate_limit_cap": timedelta(hours=1),
    "github.webhook_max_body": 25 * 1024 * 1024,
    "scheduler.provision_timeout": timedelta(minutes=20),
    "scheduler.max_runner_lifetime": timedelta(0),
    "scheduler.idle_timeout": timedelta(0),
    "scheduler.unlinked_exit_grace": timedelta(minutes=1),
    "scheduler.failed_retention": timedelta(minutes=10),
    "scheduler.start_backoff": timedelta(seconds=10),
    "scheduler.max_start_backoff": timedelta(minutes=5),
    "scheduler.reconcile_interval": timedelta(seconds=5),
    "scheduler.host_throttling": True,
    "scheduler.throttle_step": timedelta(minutes=2),
    "scheduler.throttle_recovery": timedelta(minutes=5),
    "scheduler.stale_throttle_reset": timedelta(minutes=10),
    "scheduler.auto_pools_host_grace": timedelta(minutes=10),
    "scheduler.size_class_hold": timedelta(minutes=10),
    "scheduler.auto_pool_interval": timedelta(minutes=1),
    "scheduler.load_per_cpu_overwhelmed": 2.0,
    "scheduler.load_per_cpu_calm": 1.0,
    "scheduler.default_memory_ceiling_factor": 1.5,
    "scheduler.memory_pool_safety_share": 0.05,
    "agent.heartbeat_interval": timedelta(seconds=30),
    "agent.heartbeat_timeout": timedelta(seconds=90),
    "agent.max_quiet_heartbeat_interval": timedelta(seconds=45),
    "host.lost_after": timedelta(minutes=5),
    "housekeeping.tick": timedelta(seconds=30),
    "agent.finished_retention": timedelta(0),
    "agent.bootstrap_cpu_grace": timedelta(minutes=2),
    "agent.create_timeout": timedelta(minutes=10),
    "agent.stop_margin": timedelta(minutes=1),
    "agent.remove_timeout": timedelta(minutes=2),
    "agent.orphan_grace": timedelta(minutes=2),
    "agent.missing_grace": timedelta(minutes=1),
    "agent.shutdown_grace": timedelta(seconds=30),
    "agent.long_poll_wait": timedelta(seconds=25),
    "agent.start_hold": timedelta(seconds=5),
    "agent.max_start_hold": timedelta(minutes=1),
    "runners.docker_wait": timedelta(seconds=180),
    "runners.drain_grace": timedelta(minutes=5),
    "runners.not_progressing": timedelta(minutes=10),
    "tasks.create_lease": timedelta(minutes=20),
    "tasks.stop_lease": timedelta(minutes=10),
    "tasks.remove_lease": timedelta(minutes=5),
    "tasks.max_attempts": 3,
    "tasks.host_check_lease": timedelta(seconds=90),
    "tasks.host_check_pending_ttl": timedelta(seconds=20),
    "tasks.host_check_cooldown": timedelta(seconds=15),
    "agent.host_check_run_timeout": timedelta(seconds=45),
    "store.host_usage_max_age": timedelta(minutes=1),
    "store.cpu_hold_window": timedelta(seconds=30),
    "store.min_cpu_factor": 0.5,
    "store.max_throttle_level": 3,
    "store.min_host_reserve_cpus": 0.5,
    "store.min_host_reserve_cpu_fraction": 0.05,
    "controller.lease_ttl": timedelta(seconds=30),
    "controller.lease_renew": timedelta(seconds=10),
    "scheduler.default_runner_limits": "host_share",
    "agent.memory_valve": "lend",
}

PYTHON_TYPES = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "duration": timedelta,
    "list[str]": list,
    "choice": str,
}


def test_the_table_above_covers_every_entry():
    assert set(SPEC_DEFAULTS) == set(registry.KEYS)


@pytest.mark.parametrize("key, expected", sorted(SPEC_DEFAULTS.items()))
def test_each_spec_constant_has_its_spec_default(defaults, key, expected):
    assert defaults[key] == expected


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_conf_01_every_default_passes_its_own_validator_and_type(key):
    setting = SETTINGS[key]
    assert type(setting.default) is PYTHON_TYPES[setting.type]
    assert setting.problem(setting.default) is None
    assert setting.parse(setting.default) == setting.default
    assert setting.parse(setting.to_json(setting.default)) == setting.default


@pytest.mark.parametrize("key", registry.KEYS)
def test_conf_01_every_entry_has_exactly_one_sentence_of_help(key):
    text = registry.ENTRIES[key].help
    assert text[0].isupper() and text.endswith(".")
    assert len(re.split(r"(?<=[.!?])\s+", text.strip())) == 1, text
    assert len(text) <= 100, "the Settings page shows help on one line"


def test_conf_01_env_names_are_derived_from_the_key():
    assert SETTINGS["scheduler.provision_timeout"].env == "ZOOMIES_SCHEDULER_PROVISION_TIMEOUT"
    assert all(s.env == registry.env_name(key) for key, s in SETTINGS.items())
    names = [s.env for s in SETTINGS.values()]
    assert len(set(names)) == len(names)


def test_env_names_do_not_collide_with_the_process_settings():
    process_level = {
        "ZOOMIES_CONFIG",
        "ZOOMIES_DATA_DIR",
        "ZOOMIES_DEBUG",
        "ZOOMIES_DB",
        "ZOOMIES_DATABASE_URL",
        "ZOOMIES_REDIS_URL",
        "ZOOMIES_Q_WORKERS",
        "ZOOMIES_LOG_LEVEL",
        "ZOOMIES_ALLOWED_HOSTS",
        "ZOOMIES_DJANGO_SECRET",
        "ZOOMIES_TEST_DB",
        "ZOOMIES_TEST_DATABASE_NAME",
        # The runner image's own variable, which runners.docker_wait is rendered into.
        "ZOOMIES_DOCKER_WAIT",
    }
    assert not process_level & {s.env for s in SETTINGS.values()}


def test_conf_01_every_type_is_used_and_only_the_app_key_and_webhook_secrets_are_secret():
    assert {s.type for s in SETTINGS.values()} == set(registry.TYPES)
    secret = [k for k, s in SETTINGS.items() if s.secret]
    assert secret == ["github.private_key", "github.webhook_secrets"]


def test_describe_lists_every_entry_with_its_source_and_masks_secrets():
    values = registry.layered(
        env={"ZOOMIES_GITHUB_WEBHOOK_SECRETS": "s3cret,other"},
        yaml_text="scheduler:\n  provision_timeout: 15m\n",
        db_values={"agent.heartbeat_interval": "20s"},
    )
    rows = {row["key"]: row for row in registry.describe(values)}
    assert list(rows) == list(registry.KEYS)
    for row in rows.values():
        assert set(row) >= {"key", "value", "default", "source", "help", "type", "secret"}
    assert rows["github.webhook_secrets"]["value"] == [registry.MASK] * 2
    assert "s3cret" not in repr(registry.describe(values))
    assert rows["github.webhook_secrets"]["source"] == "env"
    assert rows["scheduler.provision_timeout"].items() >= {"value": "15m", "source": "file"}.items()
    assert rows["scheduler.provision_timeout"]["default"] == "20m"
    assert rows["agent.heartbeat_interval"]["source"] == "database"
    assert rows["server.bind"]["source"] == "default"
    assert (
        rows["runners.not_progressing"].items() >= {"value": "7m30s", "source": "derived"}.items()
    )
    assert rows["runners.not_progressing"]["editable"] is False


# --- CONF-06: ranges ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, good, bad",
    [
        ("runners.docker_wait", ["1", "3600", "1s", "1h"], ["0", "3601", "1h1s", "1.5"]),
        ("agent.bootstrap_cpu_grace", ["0s", "10m", "0"], ["10m1s", "-1"]),
        ("store.min_cpu_factor", ["0.5", "1"], ["0.49", "1.1"]),
        ("store.max_throttle_level", ["0", "3"], ["4", "-1"]),
        ("tasks.max_attempts", ["1", "3"], ["0"]),
        ("github.rate_limit_cap", ["1h", "30m"], ["61m"]),
        ("scheduler.default_runner_limits", ["host_share", "none"], ["all"]),
        ("agent.memory_valve", ["lend", "observe", "disabled"], ["on"]),
        ("server.bind", ["0.0.0.0:443", "[::1]:8080", ":8080"], ["localhost", "host:0"]),
        ("github.api_url", ["https://ghe.example/api/v3"], ["api.github.com"]),
        ("github.webhook_secrets", ["a,b"], ['["a", " "]']),
    ],
)
def test_conf_06_each_validator_enforces_its_documented_range(key, good, bad):
    setting = SETTINGS[key]
    for raw in good:
        setting.parse(raw)
    for raw in bad:
        with pytest.raises(ValueError):
            setting.parse(raw)


def test_conf_06_ranges_are_described_for_the_settings_page():
    rows = {row["key"]: row for row in registry.describe(registry.layered(defaults_only=True))}
    assert rows["runners.docker_wait"]["range"] == "from 1s to 1h"
    assert rows["agent.bootstrap_cpu_grace"]["range"] == "from 0s to 10m"


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90s", 90),
        ("20m", 1200),
        ("1h", 3600),
        ("1h30m", 5400),
        ("90", 90),
        ("1.5", 1.5),
        ("500ms", 0.5),
        (" 2m 30s ", 150),
        ("1d", 86400),
    ],
)
def test_durations_accept_units_and_plain_seconds(text, seconds):
    assert registry.parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "forever", "1m30", "m", "10 minutes", "1h-5m", "nan"])
def test_a_duration_that_does_not_parse_says_how_to_write_one(text):
    with pytest.raises(ValueError, match="write it like 90s, 20m, 1h or 1h30m"):
        registry.parse_duration(text)


@pytest.mark.parametrize("seconds", [0, 0.25, 1, 59, 60, 90, 3600, 5400, 86400 + 61])
def test_durations_round_trip_through_their_rendering(seconds):
    value = timedelta(seconds=seconds)
    assert registry.parse_duration(registry.format_duration(value)) == value


def test_duration_entries_render_as_operators_write_them():
    assert SETTINGS["scheduler.provision_timeout"].type == DURATION
    assert registry.format_duration(timedelta(minutes=90)) == "1h30m"
    assert registry.format_duration(timedelta(seconds=180)) == "3m"


def test_an_unknown_key_is_refused_by_get():
    with pytest.raises(registry.UnknownSetting):
        registry.get("scheduler.no_such_thing")
