"""What every test area shares: the settings registry at its defaults, and a small named cast.

`registry_defaults` is the one way a test gets the registry's own defaults (no zoomies.yaml,
no ZOOMIES_* or *_FILE from the caller's machine, a private data directory and sealing key);
areas that want it for every test wrap it in an autouse fixture of their own.

The cast, one small set of named objects every area shares: `admin`, `operator`, `viewer`
(a user per role), `outsider` (an account that was switched off: it exists and must be
refused everywhere), `anonymous` (no one), and `token_for[scope]`, one API token per scope
minted by the admin. All are made through
`accounts.actions`, as an operator would make them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings

from accounts import actions as account_actions
from accounts.roles import ALL_SCOPES
from fleet import api as agent_api
from runners import webhook_inbox, webhook_writer
from runners.github import config  # the cached App is built from registry values
from tests import leftovers, postgres_databases
from zoomies_site.core import registry, sealing, wakebus

PASSWORD = "correct horse battery"


# -- the registry ------------------------------------------------------------------------


class RegistryValues:
    """Set registry values for one test through the environment layer; undone afterwards."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def set(self, key: str, value: object | None) -> None:
        """`set("scheduler.reconcile_interval", "5s")`; None removes the value again."""
        name = registry.env_name(key)
        if value is None:
            self._monkeypatch.delenv(name, raising=False)
        else:
            self._monkeypatch.setenv(name, str(value))
        registry.reload()


@pytest.fixture
def registry_defaults(settings, tmp_path, monkeypatch) -> Iterator[RegistryValues]:
    """The registry's defaults and nothing else, re-read before and after the test."""
    settings.ZOOMIES_CONFIG_FILE = str(tmp_path / "absent-zoomies.yaml")
    settings.DATA_DIR = tmp_path / "data"
    for setting in registry.SETTINGS.values():
        monkeypatch.delenv(setting.env, raising=False)
        monkeypatch.delenv(f"{setting.env}_FILE", raising=False)
    monkeypatch.delenv(sealing.KEY_ENV, raising=False)
    monkeypatch.delenv(sealing.KEY_FILE_ENV, raising=False)
    sealing.clear_key_cache()
    registry.reload()
    config.clear_cache()
    yield RegistryValues(monkeypatch)
    registry.reload()
    config.clear_cache()
    sealing.clear_key_cache()


@pytest.fixture(autouse=True)
def _webhook_writer_stopped() -> Iterator[None]:
    """The webhook writer's thread keeps its database connection between deliveries: it is
    ended after each test that started it, so no connection outlives the test's database.
    So is the webhook inbox's applier, after recording what the inbox keeps; then the inbox
    file goes, so nothing a test kept there meets the next test's database."""
    yield
    webhook_writer.writer.stop()
    for inbox in webhook_inbox.stop_appliers():
        for suffix in ("", "-wal", "-shm"):
            Path(f"{inbox}{suffix}").unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _agent_poll_threads(monkeypatch) -> Iterator[None]:
    """The long-poll's threads keep their connections between calls (fleet/api.py): each test
    gets a pool of its own, whose connections are closed when it ends, so none outlives the
    test's database or carries one test's state into the next."""
    pool = ThreadPoolExecutor(
        agent_api.POLL_THREADS, thread_name_prefix=agent_api.POLL_THREAD_PREFIX
    )
    monkeypatch.setattr(agent_api, "_poll_pool", pool)
    yield
    agent_api.close_poll_connections(pool)
    pool.shutdown(wait=True)


# -- the cast ----------------------------------------------------------------------------


def _user(username: str, role: str, **extra):
    return account_actions.create_user(
        username=username, role=role, password=PASSWORD, actor="test", **extra
    )


@pytest.fixture
def admin(db):
    return _user("ada", "admin")


@pytest.fixture
def operator(db):
    return _user("otto", "operator")


@pytest.fixture
def viewer(db):
    return _user("vera", "viewer")


@pytest.fixture
def outsider(db):
    """An account that was switched off: it must be refused wherever it turns up."""
    user = _user("olga", "viewer")
    account_actions.update_user(user, actor="test", is_active=False)
    return user


@pytest.fixture
def token_for(admin) -> dict[str, str]:
    """One API token per scope, each minted by the admin (who may hold them all)."""
    return {
        scope: account_actions.create_api_token(
            user=admin, name=f"cast {scope}", scopes=[scope], actor="test"
        )[1]
        for scope in ALL_SCOPES
    }


# -- spreading the suite over xdist workers (scripts/test.sh: -n N --dist loadgroup) ------

# Tests that share one expensive session fixture run on one worker together: a private
# dockerd and Podman service per worker would cost more than the spread gains.
SHARED_ENGINES = "tests/fleet/backends/"


# scripts/test.sh sets this for its PostgreSQL pass: a test that touches no database runs
# the same code on either, so the SQLite pass alone runs it.
DATABASE_ONLY = "ZOOMIES_TEST_DATABASE_ONLY"
DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_setup"}


def touches_a_database(item: pytest.Item) -> bool:
    if item.get_closest_marker("any_database") is not None:
        return False  # it starts a controller, but what it tests is the same on either engine
    return (
        item.get_closest_marker("django_db") is not None
        or item.get_closest_marker("e2e") is not None
        or bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Each file is one xdist group (a file's tests may lean on the order they are written
    in, as they did when the suite ran serially), and the container-engine tests are one
    group together (one dockerd and one Podman per run). With ZOOMIES_TEST_DATABASE_ONLY=1,
    only the tests that touch a database are kept."""
    if os.environ.get(DATABASE_ONLY) == "1":
        kept = [item for item in items if touches_a_database(item)]
        config.hook.pytest_deselected(items=[i for i in items if not touches_a_database(i)])
        items[:] = kept
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        path = item.nodeid.split("::", 1)[0]
        group = "container-engines" if path.startswith(SHARED_ENGINES) else path
        item.add_marker(pytest.mark.xdist_group(group))


class LongGroupsFirst:
    """Longest first: xdist hands groups out in collection order, so a long group collected
    last (the e2e files, the engines) kept one worker busy while the other sat idle. The
    sort is stable: within a file, and among the rest, the order stays what it was."""

    @pytest.hookimpl(trylast=True)  # after pytest-django's own reordering
    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: 0 if in_a_long_group(item) else 1)


def pytest_configure(config):
    config.pluginmanager.register(LongGroupsFirst(), "zoomies-long-groups-first")
    config.pluginmanager.register(leftovers, "zoomies-leftovers")  # issue 21 item 1
    # Argon2id at its least cost for the suite's users (tests/hashers.py); processes the
    # tests start (controllers, `manage.py`) keep production's.
    settings.PASSWORD_HASHERS = [
        QUICK_ARGON2 if hasher.endswith(".Argon2PasswordHasher") else hasher
        for hasher in settings.PASSWORD_HASHERS
    ]
    # The suite's own tests read the database right after a delivery's answer, so in this
    # process deliveries are recorded before they are answered (the direct path, as on
    # PostgreSQL). The inbox that production uses on SQLite is tested in tests/runners/
    # test_webhook_inbox.py, and by every controller the suite starts (their own settings).
    settings.WEBHOOK_INBOX = False


QUICK_ARGON2 = "tests.hashers.QuickArgon2PasswordHasher"


def in_a_long_group(item: pytest.Item) -> bool:
    """A test whose file starts controllers or container engines: seconds per test."""
    path = item.nodeid.split("::", 1)[0]
    return path.startswith(SHARED_ENGINES) or item.get_closest_marker("e2e") is not None


# Earlier names of the fixtures above, for tests written against them.
@pytest.fixture
def fleet_registry(registry_defaults):
    return registry_defaults


@pytest.fixture
def clean_registry(registry_defaults):
    return registry_defaults


@pytest.fixture
def admin_user(admin):
    return admin


def child_database_env() -> dict[str, str]:
    """Environment that points a child process at this run's test database, on either engine.

    On PostgreSQL the child reads ZOOMIES_DATABASE_URL, which names the server's base
    database, not the test database the rows are in; on SQLite it reads ZOOMIES_DB."""
    from django.db import connection  # noqa: PLC0415  # only once Django is set up

    db = connection.settings_dict
    if connection.vendor != "postgresql":
        return {"ZOOMIES_DB": str(db["NAME"])}
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return {"ZOOMIES_DATABASE_URL": f"postgres://{auth}@{host}:{port}/{db['NAME']}"}


# -- PostgreSQL databases: none outlives its run (issue 8 item 15, tests/postgres_databases.py)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request) -> None:
    """pytest-django's test database is named for the process that makes it (its owner),
    so the next run on this host can tell a killed run's from a live one's; then the xdist
    worker's suffix, as pytest-django would add it."""
    from django.conf import settings  # noqa: PLC0415  # only once Django is set up

    default = settings.DATABASES["default"]
    if default["ENGINE"].endswith("postgresql") and not os.environ.get(
        "ZOOMIES_TEST_DATABASE_NAME"
    ):
        default["TEST"]["NAME"] = postgres_databases.run_database_name()
    request.getfixturevalue("django_db_modify_db_settings_parallel_suffix")


@pytest.fixture(scope="session", autouse=True)
def _postgres_flush_by_delete() -> Iterator[None]:
    """PostgreSQL's flush for the tests: DELETE FROM every table, its foreign keys checked
    at the commit (Django makes them deferrable), where Django's is one TRUNCATE of all of
    them. A TRUNCATE makes each table, index and TOAST file anew: 0.12 s for our 39 tables
    on a quiet server and 0.7 s in the loaded test command, after each of about 350
    transactional tests (a quarter of the PostgreSQL pass); the DELETEs take 6 ms. Both
    leave every table empty and the sequences where they were. A sequence reset or a
    cascade (a flush of some apps only) stays Django's own TRUNCATE."""
    from django.db.backends.postgresql import operations  # noqa: PLC0415  # Django is set up

    truncate = operations.DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)  # fmt: skip
        delete_from = f"{style.SQL_KEYWORD('DELETE')} {style.SQL_KEYWORD('FROM')}"
        return ["SET CONSTRAINTS ALL DEFERRED"] + [
            f"{delete_from} {style.SQL_FIELD(self.quote_name(table))}" for table in tables
        ]

    operations.DatabaseOperations.sql_flush = sql_flush
    yield
    operations.DatabaseOperations.sql_flush = truncate


def pytest_sessionstart(session: pytest.Session) -> None:
    """Once per run (not per xdist worker): drop what killed runs on this host left."""
    url = os.environ.get("ZOOMIES_DATABASE_URL")
    if url and not hasattr(session.config, "workerinput"):
        postgres_databases.drop_stale(url)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In every process that ran tests: drop each e2e database it made, whichever test (and
    whichever worker) made it; their controllers were stopped by their tests' teardowns."""
    url = os.environ.get("ZOOMIES_DATABASE_URL")
    if url:
        postgres_databases.drop_created(url)
        if not os.environ.get("ZOOMIES_TEST_DATABASE_NAME"):
            worker = getattr(session.config, "workerinput", {}).get("workerid")
            postgres_databases.drop_own_test_database(url, worker)
    wakebus.sweep_stale()  # the wake sockets of the controllers the tests killed
