"""CONF-01 and CONF-06: every setting is a typed entry with a sound default, range and help."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from zoomies_site.core import registry
from zoomies_site.core.registry import DURATION, SETTINGS

REQUIREMENTS = Path(__file__).resolve().parents[2] / "docs" / "requirements.md"

MIN, S = timedelta(minutes=1), timedelta(seconds=1)

# The defaults the requirements name (docs/requirements.md): the ID, the words of its line
# that give the value, and the value they mean. The registry is checked against these, and
# each line of docs/requirements.md is checked to still say them: a default changed in one
# place and not the other fails here. A registry entry whose default no requirement states
# is checked by its own behaviour's tests, not against a copy of the registry's table.
REQUIRED_DEFAULTS = [
    ("POLL-01", "poll fallback is on by default", "github.poll_fallback", True),
    ("SCHED-17", "`scheduler.provision_timeout` (20 min", "scheduler.provision_timeout", 20 * MIN),
    ("SCHED-22", "10 s, doubling", "scheduler.start_backoff", 10 * S),
    ("SCHED-22", "at most 5 min", "scheduler.max_start_backoff", 5 * MIN),
    ("RUN-10", "for 10 min after `finished_at`", "scheduler.failed_retention", 10 * MIN),
    ("RUN-11", "gets 5 min to finish its job", "runners.drain_grace", 5 * MIN),
    ("TASK-03", "20 min for a create", "tasks.create_lease", 20 * MIN),
    ("TASK-03", "10 min for a stop", "tasks.stop_lease", 10 * MIN),
    ("TASK-03", "5 min for a remove", "tasks.remove_lease", 5 * MIN),
    ("TASK-04", "offered at most 3 times", "tasks.max_attempts", 3),
    ("HOST-01", "(`agent.heartbeat_interval`, 30 s)", "agent.heartbeat_interval", 30 * S),
    ("HOST-03", "silent for 90 s", "agent.heartbeat_timeout", 90 * S),
    ("HOST-03", "the 30 s housekeeping tick", "housekeeping.tick", 30 * S),
    ("HOST-04", "silent for 5 min is lost", "host.lost_after", 5 * MIN),
    ("BACK-11", "`runners.docker_wait` (180 s)", "runners.docker_wait", 180 * S),
    ("AGENT-16", "removed 2 min after first seen", "agent.orphan_grace", 2 * MIN),
    ("AGENT-19", "waits up to 30 s", "agent.shutdown_grace", 30 * S),
    ("ESC-02", "valid 300 s by default", "capacity_demand.claim_ttl", 300 * S),
    ("ESC-06", "valid 600 s by default", "capacity_demand.agent_token_ttl", 600 * S),
    ("ESC-15", "spawn timeout (5 min)", "capacity_demand.spawn_timeout", 5 * MIN),
    ("ESC-16", "stranded window (30 min)", "capacity_demand.stranded_window", 30 * MIN),
    ("ESC-18", "flap grace (2 min)", "capacity_demand.flap_grace", 2 * MIN),
    ("ESC-22", "30 s after the first", "capacity_demand.provision_backoff_base", 30 * S),
    ("ESC-22", "doubling to 15 min", "capacity_demand.provision_backoff_max", 15 * MIN),
]


def requirement_line(requirement: str) -> str:
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith(f"- **{requirement}**"):
            return line
    raise AssertionError(f"{requirement} is not in docs/requirements.md")


@pytest.mark.parametrize(
    "requirement, words, key, expected",
    REQUIRED_DEFAULTS,
    ids=[f"{r}-{k}" for r, _w, k, _e in REQUIRED_DEFAULTS],
)
def test_each_default_a_requirement_names_is_that_requirements_value(
    defaults, requirement, words, key, expected
):
    assert words in requirement_line(requirement), (
        f"{requirement} no longer says {words!r}: update the value here from the requirement"
    )
    assert defaults[key] == expected, f"{key}: {requirement} says {words!r}"


PYTHON_TYPES = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "duration": timedelta,
    "list[str]": list,
    "choice": str,
}


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


# Variables older than the registry, kept under their first name.
OWN_ENV_NAMES = {"runners.actions_runner_dir": "ZOOMIES_ACTIONS_RUNNER_DIR"}


def test_conf_01_env_names_are_derived_from_the_key():
    assert SETTINGS["scheduler.provision_timeout"].env == "ZOOMIES_SCHEDULER_PROVISION_TIMEOUT"
    derived = {key: s.env for key, s in SETTINGS.items() if key not in OWN_ENV_NAMES}
    assert all(env == registry.env_name(key) for key, env in derived.items())
    assert {key: SETTINGS[key].env for key in OWN_ENV_NAMES} == OWN_ENV_NAMES
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
        "ZOOMIES_REDIS_PREFIX",
        "ZOOMIES_Q_WORKERS",
        "ZOOMIES_Q_CLUSTER",
        "ZOOMIES_WEBHOOK_INBOX",
        "ZOOMIES_LOG_LEVEL",
        "ZOOMIES_ALLOWED_HOSTS",
        "ZOOMIES_DJANGO_SECRET",
        "ZOOMIES_TEST_DB",
        "ZOOMIES_TEST_DATABASE_NAME",
        # The runner image's own variable (BACK-10).
        "ZOOMIES_DOCKER_WAIT",
    }
    assert not process_level & {s.env for s in SETTINGS.values()}


def test_conf_01_every_type_is_known_and_only_the_app_key_and_webhook_secrets_are_secret():
    assert {s.type for s in SETTINGS.values()} <= set(registry.TYPES)
    secret = [k for k, s in SETTINGS.items() if s.secret]
    assert secret == [
        "github.private_key",
        "github.webhook_secrets",
        "github.webhook_secret",
        "capacity_demand.signing_secret",
        "auth.oidc_client_secret",
        "backup.passphrase",
        "backup.s3_secret_access_key",
    ]


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
        ("tasks.max_attempts", ["1", "3"], ["0"]),
        ("scheduler.unlinked_exit_grace", ["0", "10m", "90s"], ["10m1s", "-1"]),
        ("github.sweep_budget", ["0.05", "1"], ["0.04", "1.1"]),
        ("server.request_timeout", ["1s", "10m"], ["0s", "11m"]),
        ("server.max_connections_per_client", ["4", "100000"], ["3", "100001"]),
        ("github.rate_limit_cap", ["1h", "30m"], ["61m"]),
        ("server.bind", ["0.0.0.0:443", "[::1]:8080", ":8080"], ["localhost", "host:0"]),
        ("github.api_url", ["https://ghe.example/api/v3"], ["api.github.com"]),
        ("github.webhook_secrets", ["a,b"], ['["a", " "]']),
        # BACK-10, BACK-11: the stock image takes whole seconds from 1 to 3600.
        ("runners.docker_wait", ["1", "180s", "1h"], ["0s", "61m", "1.5s"]),
        # BACK-12: KEY=VALUE; never the runner's credential, nor the wait's own setting.
        (
            "runners.env",
            ['["HTTP_PROXY=http://proxy:3128", "EMPTY="]', "A=1,B=2"],
            ["A", "1A=x", "ACTIONS_RUNNER_INPUT_JITCONFIG=x", "ZOOMIES_DOCKER_WAIT=60"],
        ),
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
    assert rows["scheduler.unlinked_exit_grace"]["range"] == "from 0s to 10m"
    assert rows["server.request_timeout"]["range"] == "from 1s to 10m"


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


def test_a_choice_setting_takes_only_its_choices():
    """No entry is a choice today; the type stays for the next one (CONF-06)."""
    mode = registry.Setting("x.mode", registry.CHOICE, "lend", "A mode.", choices=("lend", "off"))
    assert mode.parse(" lend ") == "lend"
    for raw in ("all", False, 3):
        with pytest.raises(ValueError):
            mode.parse(raw)
    with pytest.raises(ValueError, match="quote it"):
        mode.parse(False)  # YAML reads a bare off as a boolean
