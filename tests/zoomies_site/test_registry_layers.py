"""CONF-02: defaults < zoomies.yaml < database < ZOOMIES_* environment, and how each is read."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.zoomies_site.layers import only
from zoomies_site.core import registry
from zoomies_site.core.models import SettingValue
from zoomies_site.core.registry import layers

KEY = "scheduler.provision_timeout"
ENV = "ZOOMIES_SCHEDULER_PROVISION_TIMEOUT"


def test_conf_02_each_layer_overrides_the_one_below():
    yaml_text = "scheduler.provision_timeout: 14m\n"
    db = {KEY: "16m"}
    env = {ENV: "18m"}

    assert only()[KEY] == timedelta(minutes=20)
    assert only().source(KEY) == "default"

    values = only(yaml_text=yaml_text)
    assert (values[KEY], values.source(KEY)) == (timedelta(minutes=14), "file")

    values = only(yaml_text=yaml_text, db_values=db)
    assert (values[KEY], values.source(KEY)) == (timedelta(minutes=16), "database")

    values = only(yaml_text=yaml_text, db_values=db, env=env)
    assert (values[KEY], values.source(KEY)) == (timedelta(minutes=18), "env")

    # A higher layer that leaves a key alone does not hide a lower one.
    values = only(db_values=db, env={"ZOOMIES_AGENT_STOP_MARGIN": "2m"})
    assert values.source(KEY) == "database"


def test_conf_02_defaults_only_ignores_every_other_layer(monkeypatch):
    monkeypatch.setenv(ENV, "18m")
    values = registry.layered(defaults_only=True)
    assert values[KEY] == timedelta(minutes=20)
    assert values.problems == ()


def test_conf_02_yaml_accepts_nested_mappings_and_dotted_keys_together():
    values = only(
        yaml_text="""
scheduler:
  provision_timeout: 15m
  start_backoff: 30s
agent.heartbeat_interval: 20s
github:
  webhook_secrets: [one, two]
  poll_fallback: yes
"""
    )
    assert values[KEY] == timedelta(minutes=15)
    assert values["scheduler.start_backoff"] == timedelta(seconds=30)
    assert values["agent.heartbeat_interval"] == timedelta(seconds=20)
    assert values["github.webhook_secrets"] == ["one", "two"]
    assert values["github.poll_fallback"] is True
    assert values.problems == ()


def test_yaml_numbers_are_seconds_for_durations():
    values = only(yaml_text="runners:\n  drain_grace: 240\n")
    assert values["runners.drain_grace"] == timedelta(seconds=240)


def test_an_unknown_yaml_key_is_a_warning_that_suggests_the_right_name():
    values = only(yaml_text="scheduler:\n  provison_timeout: 15m\n")
    (finding,) = values.problems
    assert finding.severity == "warning"
    assert finding.key == "config.unknown_key:scheduler.provison_timeout"
    assert "scheduler.provision_timeout" in finding.fix
    assert values[KEY] == timedelta(minutes=20)


def test_a_derived_key_in_yaml_is_a_warning_naming_what_to_change():
    (finding,) = only(yaml_text="runners.not_progressing: 5m\n").problems
    assert finding.key == "config.derived_key:runners.not_progressing"
    assert "scheduler.provision_timeout" in finding.fix


def test_a_key_set_twice_in_yaml_is_a_warning():
    values = only(
        yaml_text="scheduler:\n  provision_timeout: 15m\nscheduler.provision_timeout: 16m\n"
    )
    assert [f.key for f in values.problems] == ["config.duplicate_key:scheduler.provision_timeout"]


@pytest.mark.parametrize("text", ["scheduler: [provision_timeout\n", "- a\n- b\n"])
def test_a_broken_yaml_file_is_an_error_finding_not_a_crash(text):
    values = only(yaml_text=text)
    assert [f.key for f in values.problems] == ["config.file_unreadable"]
    assert values.problems[0].is_error
    assert values[KEY] == timedelta(minutes=20)


def test_the_yaml_file_is_read_from_zoomies_config_file(settings, tmp_path):
    path = tmp_path / "zoomies.yaml"
    path.write_text("scheduler:\n  provision_timeout: 17m\n")
    settings.ZOOMIES_CONFIG_FILE = str(path)
    values = registry.layered(env={}, db_values={})
    assert (values[KEY], values.source(KEY)) == (timedelta(minutes=17), "file")


def test_a_missing_yaml_file_is_fine(settings, tmp_path):
    settings.ZOOMIES_CONFIG_FILE = str(tmp_path / "nowhere.yaml")
    assert registry.layered(env={}, db_values={}).problems == ()


@pytest.mark.django_db
def test_conf_02_the_database_layer_is_read_from_setting_values():
    SettingValue.objects.create(key=KEY, value="19m", updated_by="test")
    values = registry.layered(env={}, yaml_text="scheduler.provision_timeout: 14m")
    assert (values[KEY], values.source(KEY)) == (timedelta(minutes=19), "database")


@pytest.mark.django_db
def test_an_unknown_database_key_is_a_warning():
    SettingValue.objects.create(key="scheduler.retired_knob", value=1)
    values = registry.layered(env={}, yaml_text="")
    assert [f.key for f in values.problems] == ["config.unknown_key:scheduler.retired_knob"]


# --- the environment: one parse per type ---------------------------------------------------


@pytest.mark.parametrize(
    "key, raw, expected",
    [
        ("github.poll_fallback", "false", False),
        ("github.poll_fallback", "0", False),
        ("github.poll_fallback", "Yes", True),
        ("github.poll_fallback", "on", True),
        ("github.app_id", "12345", 12345),
        ("github.sweep_budget", "0.5", 0.5),
        ("server.bind", "0.0.0.0:8443", "0.0.0.0:8443"),
        ("scheduler.provision_timeout", "90s", timedelta(seconds=90)),
        ("scheduler.provision_timeout", "20m", timedelta(minutes=20)),
        ("scheduler.provision_timeout", "1h", timedelta(hours=1)),
        ("scheduler.provision_timeout", "1h30m", timedelta(minutes=90)),
        ("scheduler.provision_timeout", "1500", timedelta(seconds=1500)),
        ("github.webhook_secrets", "a, b,,c", ["a", "b", "c"]),
        ("github.webhook_secrets", '["with,comma", "b"]', ["with,comma", "b"]),
    ],
)
def test_env_values_parse_into_their_type(key, raw, expected):
    values = only(env={registry.env_name(key): raw})
    assert values[key] == expected
    assert values.source(key) == "env"
    assert [f for f in values.problems if f.is_error] == []


def test_an_empty_env_variable_counts_as_unset():
    values = only(db_values={KEY: "16m"}, env={ENV: ""})
    assert values.source(KEY) == "database"


def test_a_secret_is_read_from_its_file_variable(tmp_path):
    path = tmp_path / "secrets"
    path.write_text("first,with-comma\nsecond\n\n")
    values = only(env={"ZOOMIES_GITHUB_WEBHOOK_SECRETS_FILE": str(path)})
    assert values["github.webhook_secrets"] == ["first,with-comma", "second"]
    assert values.source("github.webhook_secrets") == "env"


def test_a_secret_variable_wins_over_its_file(tmp_path):
    path = tmp_path / "secrets"
    path.write_text("from-file\n")
    values = only(
        env={
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS": "direct",
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS_FILE": str(path),
        }
    )
    assert values["github.webhook_secrets"] == ["direct"]


def test_a_secret_file_that_cannot_be_read_is_an_error(tmp_path):
    values = only(env={"ZOOMIES_GITHUB_WEBHOOK_SECRETS_FILE": str(tmp_path / "missing")})
    (finding,) = values.problems
    assert finding.is_error
    assert finding.key == "config.secret_file_unreadable:github.webhook_secrets"
    assert values["github.webhook_secrets"] == []


def test_only_secret_entries_read_a_file_variable(tmp_path):
    path = tmp_path / "bind"
    path.write_text("0.0.0.0:1\n")
    values = only(env={"ZOOMIES_SERVER_BIND_FILE": str(path)})
    assert values.source("server.bind") == "default"


# --- a bad value is a finding, not a crash -------------------------------------------------


@pytest.mark.parametrize(
    "key, raw, says",
    [
        ("scheduler.provision_timeout", "forever", "'forever' is not a duration"),
        ("github.poll_fallback", "maybe", "'maybe' is not true or false"),
        ("github.app_id", "twelve", "'twelve' is not a whole number"),
        ("github.sweep_budget", "0.01", "0.01 is below the minimum of 0.05"),
        ("scheduler.unlinked_exit_grace", "2h", "2h is above the maximum of 10m"),
    ],
)
def test_a_bad_env_value_is_an_error_finding_that_keeps_the_layer_below(key, raw, says):
    env = registry.env_name(key)
    values = only(env={env: raw})
    (finding,) = values.problems
    assert finding.is_error
    assert finding.key == f"config.invalid_value:{key}"
    assert env in finding.title and key in finding.title
    assert says.lower() in finding.why.lower()
    assert key in finding.fix
    assert values[key] == registry.SETTINGS[key].default
    assert values.source(key) == "default"


def test_a_bad_database_value_keeps_the_file_value():
    values = only(yaml_text=f"{KEY}: 15m", db_values={KEY: "soon"})
    (finding,) = values.problems
    assert "the database" in finding.title
    assert "15m" in finding.why and "file" in finding.why
    assert values[KEY] == timedelta(minutes=15)


# --- the cache -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_get_reads_the_database_once_and_then_serves_the_cache(
    django_assert_max_num_queries, django_assert_num_queries
):
    # Inside the test's transaction the read runs in a savepoint, hence up to three queries.
    with django_assert_max_num_queries(3) as ctx:
        registry.get(KEY)
    selects = [q for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert len(selects) == 1
    with django_assert_num_queries(0):
        for _ in range(50):
            registry.get(KEY)
            registry.get_all()


@pytest.mark.django_db
def test_reload_drops_the_cache():
    assert registry.get(KEY) == timedelta(minutes=20)
    SettingValue.objects.create(key=KEY, value="19m")
    assert registry.get(KEY) == timedelta(minutes=20)
    registry.reload()
    assert registry.get(KEY) == timedelta(minutes=19)


@pytest.mark.django_db
def test_the_cache_expires_by_itself(monkeypatch):
    registry.get(KEY)
    SettingValue.objects.create(key=KEY, value="19m")
    now = layers.time.monotonic()
    monkeypatch.setattr(layers.time, "monotonic", lambda: now + registry.CACHE_SECONDS + 1)
    assert registry.get(KEY) == timedelta(minutes=19)


@pytest.mark.django_db
def test_get_all_has_every_key_typed(monkeypatch):
    monkeypatch.setenv("ZOOMIES_GITHUB_WEBHOOK_SECRETS", "abc")
    registry.reload()
    everything = registry.get_all()
    assert list(everything) == list(registry.KEYS)
    assert everything["runners.not_progressing"] == timedelta(minutes=10)
    assert everything["github.webhook_secrets"] == ["abc"]
    everything["github.webhook_secrets"].append("mutated")
    assert registry.get("github.webhook_secrets") == ["abc"]
