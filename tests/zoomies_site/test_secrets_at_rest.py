"""AUTH-07: secret settings are sealed in their SettingValue rows, and opened when layered.

`github.private_key` and `github.webhook_secrets` go through `actions.set_setting`, which
seals them (AES-256-GCM, core.sealing); the database layer opens them. A row that cannot
be opened is an error finding naming where the key came from, never a crash, and the layer
below stays in force. The admin never shows one, and `manage.py set_secret` stores one from a
file or stdin without it touching argv.
"""

from __future__ import annotations

import io
import secrets

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from accounts.models import AuditLog
from zoomies_site.actions import InvalidSetting, reset_setting, set_setting
from zoomies_site.core import registry, sealing
from zoomies_site.core.models import SettingValue
from zoomies_site.problems import config_findings

pytestmark = pytest.mark.django_db

# Not a usable RSA key: the registry only checks the PEM armour, and this is easy to grep for.
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAzoomiesPlaintextMarkerQ1xG7vbnW\n"
    "-----END RSA PRIVATE KEY-----\n"
)
MARKER = "zoomiesPlaintextMarker"
HOOK_SECRET = "hunter2-webhook-secret"


@pytest.fixture
def sealing_key(monkeypatch):
    """A fixed sealing key from ZOOMIES_SECRET_KEY; returns a function that switches it."""

    def use(value: str | None = None) -> str:
        value = value or secrets.token_hex(32)
        monkeypatch.setenv(sealing.KEY_ENV, value)
        sealing.clear_key_cache()
        registry.reload()
        return value

    use()
    return use


def raw_column(key: str) -> str:
    """The value column exactly as the database holds it, for grepping."""
    table, column = (connection.ops.quote_name(n) for n in (SettingValue._meta.db_table, "key"))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT value FROM {table} WHERE {column} = %s", [key])
        (value,) = cursor.fetchone()
    return value if isinstance(value, str) else str(value)


def finding(key: str, values: registry.Values | None = None):
    found = [f for f in registry.validate(values or registry.layered()) if f.key == key]
    assert found, f"no finding {key}"
    return found[0]


# --- sealed in the row, plain from get() ------------------------------------------------------


def test_auth07_the_app_private_key_row_holds_no_plaintext_and_get_returns_the_pem(sealing_key):
    set_setting("github.private_key", PEM, actor="user:ada")
    registry.reload()

    raw = raw_column("github.private_key")
    assert MARKER not in raw and "PRIVATE KEY" not in raw
    stored = SettingValue.objects.get(key="github.private_key").value
    assert registry.is_sealed(stored) and stored["sealed"].startswith("v1:")

    assert registry.get("github.private_key") == PEM
    row = {r["key"]: r for r in registry.describe()}["github.private_key"]
    assert row["value"] == registry.MASK and row["source"] == "database" and row["secret"]
    assert MARKER not in repr(registry.describe())


def test_auth07_webhook_secrets_stored_through_set_setting_are_sealed(sealing_key):
    set_setting("github.webhook_secrets", [HOOK_SECRET, "second-one"], actor="user:ada")
    registry.reload()
    raw = raw_column("github.webhook_secrets")
    assert HOOK_SECRET not in raw and "second-one" not in raw
    assert registry.get("github.webhook_secrets") == [HOOK_SECRET, "second-one"]
    audit = AuditLog.objects.get(action="setting.set")
    assert HOOK_SECRET not in repr(audit.detail)


def test_auth07_a_non_secret_setting_stays_plain_json(sealing_key):
    set_setting("github.app_id", 4242, actor="user:ada")
    assert SettingValue.objects.get(key="github.app_id").value == 4242


def test_auth07_each_seal_is_fresh_and_the_old_value_is_audited_masked(sealing_key):
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    first = SettingValue.objects.get(key="github.webhook_secrets").value
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    second = SettingValue.objects.get(key="github.webhook_secrets").value
    assert first != second  # a random nonce per seal: equal secrets do not look equal
    latest = AuditLog.objects.filter(action="setting.set").order_by("-id").first()
    assert latest.detail == {
        "key": "github.webhook_secrets",
        "old": [registry.MASK],
        "new": [registry.MASK],
    }


# --- what cannot be opened is a finding, not a crash -------------------------------------------


def test_auth07_a_wrong_sealing_key_is_an_error_finding_and_the_layer_below_stays(
    sealing_key, settings, tmp_path
):
    config_file = tmp_path / "zoomies.yaml"
    config_file.write_text("github:\n  webhook_secrets: [from-the-file]\n")
    settings.ZOOMIES_CONFIG_FILE = str(config_file)
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    set_setting("github.private_key", PEM, actor="user:ada")

    sealing_key()  # another key: as a database restored without its key
    values = registry.layered()  # no crash
    assert values["github.webhook_secrets"] == ["from-the-file"]
    assert values.source("github.webhook_secrets") == "file"
    assert values["github.private_key"] == ""
    assert registry.get("github.webhook_secrets") == ["from-the-file"]

    found = finding("config.secret_unreadable:github.webhook_secrets", values)
    assert found.is_error
    assert "environment variable ZOOMIES_SECRET_KEY" in found.why  # names the key source
    assert "from the file layer" in found.why
    assert "ZOOMIES_SECRET_KEY" in found.fix and "set_secret" in found.fix
    assert HOOK_SECRET not in repr(found) and MARKER not in repr(registry.validate(values))
    assert finding("config.secret_unreadable:github.private_key", values).is_error

    # CONF-04: an error finding stops startup.
    with pytest.raises(registry.ConfigError, match="secret_unreadable:github.private_key"):
        registry.raise_for_errors(config_findings(fresh=True))


def test_auth07_a_tampered_row_is_an_error_finding(sealing_key):
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    row = SettingValue.objects.get(key="github.webhook_secrets")
    sealed = row.value["sealed"]
    flipped = "A" if sealed[-5] != "A" else "B"
    row.value = {"sealed": sealed[:-5] + flipped + sealed[-4:]}
    row.save()
    SettingValue.objects.create(key="github.private_key", value={"sealed": "v1:not-base64!"})

    values = registry.layered()
    assert values["github.webhook_secrets"] == []
    assert finding("config.secret_unreadable:github.webhook_secrets", values).is_error
    unreadable = finding("config.secret_unreadable:github.private_key", values)
    assert "not base64" in unreadable.why
    assert "the key in use is from environment variable ZOOMIES_SECRET_KEY" in unreadable.why


def test_auth07_storing_again_replaces_an_unreadable_row_and_reset_removes_one(sealing_key):
    set_setting("github.webhook_secrets", ["old-secret"], actor="user:ada")
    sealing_key()
    # The unreadable row's error is already there, so it does not block replacing it.
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    registry.reload()
    assert registry.get("github.webhook_secrets") == [HOOK_SECRET]
    assert not [f for f in registry.validate() if "secret_unreadable" in f.key]
    old = AuditLog.objects.filter(action="setting.set").order_by("-id").first().detail["old"]
    assert old is None  # what could not be opened is not shown

    set_setting("github.private_key", PEM, actor="user:ada")
    sealing_key()
    assert reset_setting("github.private_key", actor="user:ada") is True
    assert not SettingValue.objects.filter(key="github.private_key").exists()


def test_auth07_a_secret_row_stored_in_the_clear_is_named_by_a_warning(sealing_key):
    SettingValue.objects.create(key="github.webhook_secrets", value=[HOOK_SECRET])
    values = registry.layered()
    assert values["github.webhook_secrets"] == [HOOK_SECRET]  # still read, from before sealing
    found = finding("config.secret_not_sealed:github.webhook_secrets", values)
    assert not found.is_error and "set_secret" in found.fix
    assert HOOK_SECRET not in repr(found)


def test_auth07_with_no_usable_sealing_key_a_secret_is_refused_not_stored_in_clear(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(sealing.KEY_FILE_ENV, str(tmp_path / "missing-key"))
    sealing.clear_key_cache()
    with pytest.raises(InvalidSetting, match="cannot be sealed") as caught:
        set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    assert HOOK_SECRET not in str(caught.value)
    assert not SettingValue.objects.exists()
    assert registry.key_source().startswith("nowhere usable")


def test_auth07_a_bad_private_key_is_refused_without_echoing_it(sealing_key):
    with pytest.raises(InvalidSetting, match="not a PEM private key") as caught:
        set_setting("github.private_key", f"not a key {MARKER}", actor="user:ada")
    assert MARKER not in str(caught.value)
    with pytest.raises(ValueError) as parsed:
        registry.SETTINGS["github.private_key"].parse({"oops": MARKER})
    assert MARKER not in str(parsed.value)
    assert not SettingValue.objects.exists()


def test_the_key_file_variable_is_the_key_file_settings_not_read_as_the_key(tmp_path):
    """ZOOMIES_GITHUB_PRIVATE_KEY_FILE is github.private_key_file's own variable: a path."""
    path = str(tmp_path / "absent.pem")
    values = registry.layered(env={"ZOOMIES_GITHUB_PRIVATE_KEY_FILE": path}, db_values={})
    assert values["github.private_key_file"] == path
    assert values["github.private_key"] == "" and values.source("github.private_key") == "default"
    assert values.problems == ()
    env = {"ZOOMIES_GITHUB_PRIVATE_KEY": PEM}
    assert registry.layered(env=env, db_values={}).source("github.private_key") == "env"


def test_the_app_counts_as_configured_with_the_key_itself(sealing_key):
    keys = {
        f.key
        for f in registry.validate({"github.app_id": 7, "github.private_key": PEM})
        if not f.is_error
    }
    assert "config.github_app_not_configured" not in keys
    assert "config.github_app_not_configured" in {
        f.key for f in registry.validate({"github.app_id": 7})
    }


def test_a_retired_key_row_can_be_reset_without_a_raw_delete(sealing_key):
    SettingValue.objects.create(key="github.retired_knob", value={"sealed": "v1:whatever"})
    assert reset_setting("github.retired_knob", actor="user:ada") is True
    assert not SettingValue.objects.exists()
    assert AuditLog.objects.get(action="setting.reset").detail == {
        "key": "github.retired_knob",
        "old": None,
    }
    with pytest.raises(InvalidSetting, match="no setting called"):
        reset_setting("github.retired_knob", actor="user:ada")


# --- manage.py set_secret ----------------------------------------------------------------------


def run_set_secret(*args: str, stdin: str | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    kwargs = {"stdout": out, "stderr": err}
    if stdin is not None:
        kwargs["input_stream"] = io.StringIO(stdin)
    call_command("set_secret", *args, **kwargs)
    return out.getvalue(), err.getvalue()


def test_auth07_set_secret_stores_the_app_key_from_a_file(sealing_key, tmp_path):
    pem_file = tmp_path / "app.pem"
    pem_file.write_text(PEM)
    out, _ = run_set_secret("github.private_key", "--from-file", str(pem_file))
    assert out.strip() == (
        "github.private_key: stored sealed; the sealing key is from "
        "environment variable ZOOMIES_SECRET_KEY (hex)"
    )
    registry.reload()
    assert registry.get("github.private_key") == PEM.strip()
    assert MARKER not in raw_column("github.private_key")
    assert AuditLog.objects.get(action="setting.set").actor == "cli:set_secret"
    assert SettingValue.objects.get(key="github.private_key").updated_by == "cli:set_secret"


def test_auth07_set_secret_reads_webhook_secrets_from_stdin_one_per_line(sealing_key):
    out, err = run_set_secret("github.webhook_secrets", "--stdin", stdin=f"{HOOK_SECRET}\nnew\n\n")
    assert HOOK_SECRET not in out + err
    assert out.startswith("github.webhook_secrets: stored sealed; the sealing key is from ")
    registry.reload()
    assert registry.get("github.webhook_secrets") == [HOOK_SECRET, "new"]
    assert HOOK_SECRET not in raw_column("github.webhook_secrets")


def test_set_secret_says_when_the_environment_overrides_what_it_stored(sealing_key, monkeypatch):
    monkeypatch.setenv("ZOOMIES_GITHUB_WEBHOOK_SECRETS", "from-env")
    _, err = run_set_secret("github.webhook_secrets", "--stdin", stdin=HOOK_SECRET)
    assert "ZOOMIES_GITHUB_WEBHOOK_SECRETS" in err and "overrides" in err
    assert HOOK_SECRET not in err


def test_set_secret_says_when_a_key_file_in_the_environment_is_used_instead(
    sealing_key, monkeypatch, tmp_path
):
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(tmp_path / "app.pem"))
    _, err = run_set_secret("github.private_key", "--stdin", stdin=PEM)
    assert "ZOOMIES_GITHUB_PRIVATE_KEY_FILE is set" in err and MARKER not in err


def test_set_secret_refuses_what_it_should_not_store(sealing_key, tmp_path):
    with pytest.raises(CommandError, match="not a secret setting"):
        run_set_secret("github.app_id", "--stdin", stdin="5")
    with pytest.raises(CommandError, match="input is empty"):
        run_set_secret("github.webhook_secrets", "--stdin", stdin="\n \n")
    with pytest.raises(CommandError, match="cannot read"):
        run_set_secret("github.private_key", "--from-file", str(tmp_path / "absent.pem"))
    with pytest.raises(CommandError, match="not a PEM private key") as caught:
        run_set_secret("github.private_key", "--stdin", stdin=f"garbage {MARKER}")
    assert MARKER not in str(caught.value)
    with pytest.raises(CommandError):  # one source, and one is required
        run_set_secret("github.private_key")
    assert not SettingValue.objects.exists()


def test_set_secret_reset_removes_the_stored_secret(sealing_key):
    run_set_secret("github.webhook_secrets", "--stdin", stdin=HOOK_SECRET)
    out, _ = run_set_secret("github.webhook_secrets", "--reset")
    assert out.strip() == "github.webhook_secrets: removed"
    assert not SettingValue.objects.exists()
    assert AuditLog.objects.get(action="setting.reset").actor == "cli:set_secret"


# --- the admin -----------------------------------------------------------------------------------


@pytest.fixture
def admin_client_logged_in(client, admin):
    client.force_login(admin)
    return client


def test_auth07_the_admin_never_shows_a_secret_and_cannot_edit_rows(
    sealing_key, admin_client_logged_in
):
    client = admin_client_logged_in
    set_setting("github.private_key", PEM, actor="user:ada")
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    SettingValue.objects.create(key="github.api_url", value="https://ghe.example/api/v3")
    sealed_blob = SettingValue.objects.get(key="github.private_key").value["sealed"]

    listing = client.get(reverse("admin:zoomies_site_settingvalue_changelist"))
    assert listing.status_code == 200
    page = listing.content.decode()
    assert "••• sealed" in page
    assert "https://ghe.example/api/v3" in page  # a plain setting is still shown
    for leak in (MARKER, "PRIVATE KEY", HOOK_SECRET, sealed_blob, "v1:"):
        assert leak not in page

    row = SettingValue.objects.get(key="github.private_key")
    change_url = reverse("admin:zoomies_site_settingvalue_change", args=[row.pk])
    detail = client.get(change_url)
    assert detail.status_code == 200  # view only
    for leak in (MARKER, "PRIVATE KEY", sealed_blob, "v1:"):
        assert leak not in detail.content.decode()
    assert "••• sealed" in detail.content.decode()
    history = client.get(reverse("admin:zoomies_site_settingvalue_history", args=[row.pk]))
    assert history.status_code == 200
    for leak in (MARKER, "PRIVATE KEY", sealed_blob, "v1:"):
        assert leak not in history.content.decode()

    # A secret row from before sealing is not shown either, in the list or on its page.
    legacy = SettingValue.objects.get(key="github.webhook_secrets")
    SettingValue.objects.filter(pk=legacy.pk).update(value=[HOOK_SECRET])
    legacy_url = reverse("admin:zoomies_site_settingvalue_change", args=[legacy.pk])
    for url in (reverse("admin:zoomies_site_settingvalue_changelist"), legacy_url):
        page = client.get(url).content.decode()
        assert HOOK_SECRET not in page and "••• secret, not sealed" in page

    # No add, no change, no delete: those would skip validation, sealing and the audit row.
    assert client.get(reverse("admin:zoomies_site_settingvalue_add")).status_code == 403
    edited = client.post(change_url, {"key": row.key, "value": '"plaintext"'})
    assert edited.status_code == 403
    delete_url = reverse("admin:zoomies_site_settingvalue_delete", args=[row.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert SettingValue.objects.get(pk=row.pk).value == row.value


def test_the_admin_reset_action_goes_through_reset_setting(sealing_key, admin_client_logged_in):
    client = admin_client_logged_in
    set_setting("github.webhook_secrets", [HOOK_SECRET], actor="user:ada")
    row = SettingValue.objects.get()
    url = reverse("admin:zoomies_site_settingvalue_changelist")
    assert "delete_selected" not in client.get(url).content.decode()
    answer = client.post(
        url, {"action": "reset_to_lower_layers", "_selected_action": [str(row.pk)]}
    )
    assert answer.status_code == 302
    assert not SettingValue.objects.exists()
    audit = AuditLog.objects.get(action="setting.reset")
    assert audit.actor == "user:ada"
    assert audit.detail == {"key": "github.webhook_secrets", "old": [registry.MASK]}
