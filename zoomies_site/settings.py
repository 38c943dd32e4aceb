"""Django settings for Zoomies.

Process-level settings only (database, apps, secrets). The operator-facing tunables live in
the settings registry (`zoomies_site.core.registry`), which layers defaults, `zoomies.yaml`, the
database and `ZOOMIES_*` environment variables.
"""

from __future__ import annotations

import logging
import os
import sysconfig
from pathlib import Path
from urllib.parse import unquote, urlparse

from zoomies_site.core.environment import read as env

BASE_DIR = Path(__file__).resolve().parent.parent


def _shared_files_dir() -> Path:
    """Where templates/ and static/ are: the top of a checkout (the design keeps them there),
    or, installed from a wheel, <prefix>/share/zoomies, where pyproject.toml's data-files put
    them (`pip install --user`: the user's prefix)."""
    if (BASE_DIR / "templates").is_dir():
        return BASE_DIR
    for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user"):
        installed = Path(sysconfig.get_path("data", scheme)) / "share" / "zoomies"
        if (installed / "templates").is_dir():
            return installed
    return BASE_DIR


SHARED_FILES_DIR = _shared_files_dir()

DATA_DIR = Path(env("ZOOMIES_DATA_DIR") or BASE_DIR / "var")

# Django's own signing key. Generated per data dir when not given, so a fresh clone runs.
SECRET_KEY = env("ZOOMIES_DJANGO_SECRET", file=True)
if not SECRET_KEY:
    _key_file = DATA_DIR / "django-secret"
    try:
        SECRET_KEY = _key_file.read_text().strip()
    except FileNotFoundError:
        import secrets

        DATA_DIR.mkdir(parents=True, exist_ok=True)
        SECRET_KEY = secrets.token_urlsafe(50)
        _key_file.write_text(SECRET_KEY)
        _key_file.chmod(0o600)

DEBUG = env("ZOOMIES_DEBUG") == "1"
ALLOWED_HOSTS = [h for h in env("ZOOMIES_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "accounts.apps.ZoomiesAdminConfig",  # django.contrib.admin, gated by the Zoomies role
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_q",
    "channels",
    "accounts.apps.AccountsConfig",
    "zoomies_site",
    "runners",
    "fleet",
    "capacity",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from STATIC_ROOT (scripts/run.sh runs collectstatic), before any app work;
    # WhiteNoise made async-capable, so that no middleware here is sync-only (static_files.py).
    "zoomies_site.static_files.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "zoomies_site.urls"
WSGI_APPLICATION = "zoomies_site.wsgi.application"
ASGI_APPLICATION = "zoomies_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [SHARED_FILES_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"ZOOMIES_DATABASE_URL: unsupported scheme {parsed.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.path.lstrip("/") or "zoomies",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
        # Persistent connections leak under ASGI: each request's thread would keep its own.
        "CONN_MAX_AGE": 0,
        # One per test run (the pid), so two runs sharing a server never share a database;
        # pytest-django drops it at the end (and adds _gwN per xdist worker).
        "TEST": {"NAME": env("ZOOMIES_TEST_DATABASE_NAME", f"test_zoomies_{os.getpid()}")},
    }


if env("ZOOMIES_DATABASE_URL"):
    DATABASES = {"default": _database_from_url(env("ZOOMIES_DATABASE_URL"))}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env("ZOOMIES_DB", str(DATA_DIR / "zoomies.db")),
            "CONN_MAX_AGE": 0,
            "OPTIONS": {
                # Several writer processes (daphne, django-q2 workers): deferred transactions
                # gave hundreds of lock errors here, IMMEDIATE + WAL + a busy timeout none.
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not SQLite's shared-cache memory database: live-server threads and
            # child processes then share it the way production's processes do (WAL, busy
            # timeout) instead of failing on shared-cache table locks.
            # One per test run (the pid), so concurrent runs in one checkout never share it.
            "TEST": {
                "NAME": env("ZOOMIES_TEST_DB", str(DATA_DIR / f"test-zoomies-{os.getpid()}.db"))
            },
        }
    }

# On SQLite, webhook deliveries are kept in a file of their own before they are recorded, so
# GitHub is answered without waiting for the database's one write lock (runners/
# webhook_inbox.py). ZOOMIES_WEBHOOK_INBOX=0 records each burst before answering it instead.
WEBHOOK_INBOX = env("ZOOMIES_WEBHOOK_INBOX", "1") != "0"

AUTH_USER_MODEL = "accounts.User"
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
# Passwords behind the failure counts (accounts/login.py), then OIDC sign-in (accounts/oidc.py).
AUTHENTICATION_BACKENDS = [
    "accounts.login.RateLimitedModelBackend",
    "accounts.oidc.ZoomiesOIDCBackend",
]
LOGIN_URL = "admin:login"
LOGIN_REDIRECT_URL = "/admin/"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [SHARED_FILES_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The web server refuses a body over server.max_request_body (32 MiB by default) before any
# route reads it (zoomies_site/server.py), and each route bounds its own below that; Django's
# own 2.5 MiB cap answered first, so the README's figure was not the one that held (issue 21
# item 11). One cap, the server's.
DATA_UPLOAD_MAX_MEMORY_SIZE = None

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.api_auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Every route checks the caller's role and a token's scopes (AUTH-03, AUTH-04).
    "DEFAULT_PERMISSION_CLASSES": ["accounts.permissions.RoleAccess"],
    # One error shape for every route: a `detail` sentence, and bad fields by name.
    "EXCEPTION_HANDLER": "zoomies_site.core.api_common.exception_handler",
    # JSON bounded as the webhook and agent routes bound it (issue 21 items 8, 9).
    "DEFAULT_PARSER_CLASSES": [
        "zoomies_site.core.api_parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Zoomies API",
    "DESCRIPTION": "Pools, runners, jobs, hosts, settings and the event stream.",
    "VERSION": "1",
    # The schema is read like any other route: a viewer's session or a fleet:read token.
    "SERVE_PERMISSIONS": ["accounts.permissions.RoleAccess"],
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "zoomies_site.schema_fixes.add_event_stream",
        "zoomies_site.core.api_common.add_error_responses",
    ],
}

# How the django-q2 cluster runs: "threads" (its pusher, monitor and workers as threads of
# one process, zoomies_site/thread_cluster.py) or "processes" (django-q2's own cluster).
TASK_CLUSTER = env("ZOOMIES_Q_CLUSTER", "threads")
if TASK_CLUSTER not in ("threads", "processes"):
    raise ValueError(f"ZOOMIES_Q_CLUSTER is {TASK_CLUSTER!r}: it must be threads or processes")

# django-q2: `retry` must exceed `timeout` and the longest task, or tasks run twice.
Q_CLUSTER = {
    "name": "zoomies",
    "orm": "default",
    "workers": int(env("ZOOMIES_Q_WORKERS", "2")),
    "timeout": 300,
    "retry": 360,
    "max_attempts": 1,
    "catch_up": False,
    # Woken by the wake bus on every enqueue (zoomies_site/qbroker.py); `poll` is only the
    # safety net for a lost wake, so it can be long enough to cost nothing idle.
    "broker_class": "zoomies_site.qbroker.WakeableORM",
    "poll": 0.5,
    "ack_failures": True,
    "save_limit": 200,
    "label": "Background tasks",
}

if env("ZOOMIES_REDIS_URL"):
    # Scale-out (issue 26 item 4): with Redis, django-q2's queue is a Redis list that its
    # pusher blocks on (a task is taken at once, on every machine), not an ORM table polled
    # and woken through a local socket; the wake bus goes through Redis too (core/wakebus).
    # Several installations may share one Redis: each names its own queue and channels.
    REDIS_PREFIX = env("ZOOMIES_REDIS_PREFIX", "zoomies")
    for key in ("orm", "broker_class", "poll"):
        Q_CLUSTER.pop(key)
    Q_CLUSTER["redis"] = env("ZOOMIES_REDIS_URL")
    Q_CLUSTER["name"] = REDIS_PREFIX

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
if env("ZOOMIES_REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [env("ZOOMIES_REDIS_URL")], "prefix": f"{REDIS_PREFIX}:asgi"},
        }
    }


class _NotPrintedBelow:
    """Passes a record only if no stream handler between its logger and the root prints it.

    daphne's CLI gives the root logger a handler before Django starts, and "zoomies" (and
    the agent command's "fleet.agent") print through their own: without this filter on
    the root's handler every such line, tracebacks included, was printed twice. Django's
    own console handler prints only under DEBUG, so its records still reach the root's.
    """

    def filter(self, record):
        logger = logging.getLogger(record.name)
        while logger is not None and logger.parent is not None:
            for handler in logger.handlers:
                if (
                    isinstance(handler, logging.StreamHandler)
                    and record.levelno >= handler.level
                    and handler.filter(record)
                ):
                    return False
            logger = logger.parent if logger.propagate else None
        return True


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"not_printed_below": {"()": _NotPrintedBelow}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        "root_console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["not_printed_below"],
        },
    },
    # Replaces the handler daphne's CLI put on the root: one line per record.
    "root": {"handlers": ["root_console"], "level": "WARNING"},
    "loggers": {
        "daphne": {"level": "INFO"},
        "zoomies": {"handlers": ["console"], "level": env("ZOOMIES_LOG_LEVEL", "INFO")},
    },
}

# The zoomies.yaml the settings registry reads (layer 2).
ZOOMIES_CONFIG_FILE = env("ZOOMIES_CONFIG", str(BASE_DIR / "zoomies.yaml"))
