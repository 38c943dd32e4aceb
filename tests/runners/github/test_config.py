"""AUTH-07: the App's private key and the webhook secrets, sealed at rest, as config reads them.

`github.private_key` (the PEM itself, sealed in its SettingValue row, or from
ZOOMIES_GITHUB_PRIVATE_KEY) is used in preference to `github.private_key_file`; the cached
App is rebuilt when it changes, and the cache key holds its hash, never the PEM. Against a
real fake GitHub over HTTP.
"""

from __future__ import annotations

import secrets

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from runners.github import config
from runners.github.errors import GitHubError
from runners.github.fake import FakeGitHub
from zoomies_site.actions import set_setting
from zoomies_site.core import registry, sealing
from zoomies_site.core.models import SettingValue

pytestmark = pytest.mark.django_db


def _new_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


@pytest.fixture(scope="module")
def other_pem() -> str:
    """An RSA key the fake GitHub does not know."""
    return _new_pem()


@pytest.fixture(autouse=True)
def isolated(registry_defaults, monkeypatch):
    """The registry's defaults (the root `registry_defaults`) and a sealing key of the test's
    own, given through the environment."""
    monkeypatch.setenv(sealing.KEY_ENV, secrets.token_hex(32))
    sealing.clear_key_cache()
    yield
    sealing.clear_key_cache()


@pytest.fixture
def fake():
    gh = FakeGitHub(webhook_url=None, webhook_secret=None).start()
    yield gh
    gh.stop()


def store(key: str, value) -> None:
    """Store through the action, as the Settings page and set_secret do; then read anew."""
    set_setting(key, value, actor="user:ada")
    registry.reload()  # the on-commit reload does not run inside the test's transaction


def point_at(fake: FakeGitHub) -> None:
    store("github.app_id", fake.app_id)
    store("github.api_url", fake.url)


def verify(token: str, pem: str, app_id: int) -> dict:
    public = serialization.load_pem_private_key(pem.encode(), password=None).public_key()
    return jwt.decode(token, public, algorithms=["RS256"], options={"verify_iat": False})


def test_auth07_the_private_key_stored_sealed_in_the_database_is_used_by_get_app(
    fake, tmp_path, other_pem
):
    point_at(fake)
    wrong_file = tmp_path / "other-app.pem"
    wrong_file.write_text(other_pem)
    store("github.private_key_file", str(wrong_file))
    store("github.private_key", fake.private_key_pem)

    body = fake.private_key_pem.splitlines()[1]
    stored = SettingValue.objects.get(key="github.private_key").value
    assert registry.is_sealed(stored) and body not in repr(stored)

    app = config.get_app()
    assert app is not None
    assert verify(app.jwt(), fake.private_key_pem, fake.app_id)["iss"] == str(fake.app_id)
    installation = fake.add_installation("acme", "Organization", ["acme/widgets"])
    assert app.installation_token(installation)  # the fake accepted the App's JWT
    assert config.get_app() is app  # cached while nothing changes
    app.close()


def test_auth07_the_cached_app_changes_with_the_key_and_its_fingerprint_holds_no_pem(
    fake, other_pem
):
    point_at(fake)
    store("github.private_key", fake.private_key_pem)
    first = config.get_app()
    fingerprint, _read = config._fingerprint()
    for line in fake.private_key_pem.splitlines():
        assert line not in repr(fingerprint)

    store("github.private_key", other_pem)
    second = config.get_app()
    assert second is not None and second is not first
    assert verify(second.jwt(), other_pem, fake.app_id)["iss"] == str(fake.app_id)
    installation = fake.add_installation("acme", "Organization", ["acme/widgets"])
    with pytest.raises(GitHubError):
        second.installation_token(installation)  # the fake does not know this key
    assert config._fingerprint()[0] != fingerprint
    first.close()
    second.close()


def test_auth07_the_environment_key_is_preferred_to_the_key_file(
    fake, tmp_path, other_pem, monkeypatch
):
    point_at(fake)
    wrong_file = tmp_path / "other-app.pem"
    wrong_file.write_text(other_pem)
    store("github.private_key_file", str(wrong_file))
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY", fake.private_key_pem)
    registry.reload()
    app = config.get_app()
    installation = fake.add_installation("acme", "Organization", ["acme/widgets"])
    assert app.installation_token(installation)
    app.close()


def test_a_key_file_in_the_environment_overrides_a_key_in_the_database(
    fake, tmp_path, other_pem, monkeypatch
):
    """CONF-02: ZOOMIES_GITHUB_PRIVATE_KEY_FILE is a later layer than the stored PEM."""
    point_at(fake)
    store("github.private_key", other_pem)
    key_file = tmp_path / "app.pem"
    key_file.write_text(fake.private_key_pem)
    monkeypatch.setenv("ZOOMIES_GITHUB_PRIVATE_KEY_FILE", str(key_file))
    registry.reload()
    assert config.private_key_file() == str(key_file)
    app = config.get_app()
    installation = fake.add_installation("acme", "Organization", ["acme/widgets"])
    assert app.installation_token(installation)
    app.close()


def test_with_only_a_key_file_the_app_is_built_from_the_file(fake, tmp_path):
    point_at(fake)
    key_file = tmp_path / "app.pem"
    key_file.write_text(fake.private_key_pem)
    store("github.private_key_file", str(key_file))
    app = config.get_app()
    assert verify(app.jwt(), fake.private_key_pem, fake.app_id)
    app.close()


def test_auth07_webhook_secrets_stored_sealed_are_read_plain(fake):
    store("github.webhook_secrets", ["first-secret", "second-secret"])
    stored = SettingValue.objects.get(key="github.webhook_secrets").value
    assert registry.is_sealed(stored) and "first-secret" not in repr(stored)
    assert config.webhook_secrets() == ["first-secret", "second-secret"]


def test_auth07_a_wrong_sealing_key_leaves_no_app_key_and_no_crash(fake, monkeypatch, tmp_path):
    point_at(fake)
    store("github.private_key", fake.private_key_pem)
    store("github.webhook_secrets", ["first-secret"])
    monkeypatch.setenv(sealing.KEY_ENV, secrets.token_hex(32))
    sealing.clear_key_cache()
    registry.reload()
    config.clear_cache()

    assert config.private_key_pem() == ""
    assert config.get_app() is None  # no key: no App, and no exception
    assert config.webhook_secrets() == []
    keys = {f.key for f in registry.validate() if f.is_error}
    assert {
        "config.secret_unreadable:github.private_key",
        "config.secret_unreadable:github.webhook_secrets",
    } <= keys

    # The layer below stays in force: a key file still configures the App.
    key_file = tmp_path / "app.pem"
    key_file.write_text(fake.private_key_pem)
    store("github.private_key_file", str(key_file))
    app = config.get_app()
    assert app is not None and verify(app.jwt(), fake.private_key_pem, fake.app_id)
    app.close()
