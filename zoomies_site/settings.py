"""Django settings for Zoomies.

Process-level settings only (database, apps, secrets). The operator-facing tunables live in
the settings registry (`zoomies_site.registry`), which layers defaults, `zoomies.yaml`, the
database and `ZOOMIES_*` environment variables.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_or_file(name: str, default: str = "") -> str:
    """A secret from `NAME`, or from the file `NAME_FILE` names."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text().strip()
    return default


DATA_DIR = Path(os.environ.get("ZOOMIES_DATA_DIR", BASE_DIR / "var"))

# Django's own signing key. Generated per data dir when not given, so a fresh clone runs.
SECRET_KEY = _env_or_file("ZOOMIES_DJANGO_SECRET")
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

DEBUG = os.environ.get("ZOOMIES_DEBUG", "") == "1"
ALLOWED_HOSTS = [h for h in os.environ.get("ZOOMIES_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_q",
    "channels",
    "accounts",
    "zoomies_site",
    "runners",
    "fleet",
    "capacity",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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
        "DIRS": [BASE_DIR / "templates"],
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
        # Persistent connections leak under ASGI (DESIGN.md pitfalls).
        "CONN_MAX_AGE": 0,
        "TEST": {"NAME": os.environ.get("ZOOMIES_TEST_DATABASE_NAME", "test_zoomies")},
    }


if os.environ.get("ZOOMIES_DATABASE_URL"):
    DATABASES = {"default": _database_from_url(os.environ["ZOOMIES_DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("ZOOMIES_DB", str(DATA_DIR / "zoomies.db")),
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
                "NAME": os.environ.get(
                    "ZOOMIES_TEST_DB", str(DATA_DIR / f"test-zoomies-{os.getpid()}.db")
                )
            },
        }
    }

AUTH_USER_MODEL = "accounts.User"
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.api_auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

# django-q2: `retry` must exceed `timeout` and the longest task, or tasks run twice.
Q_CLUSTER = {
    "name": "zoomies",
    "orm": "default",
    "workers": int(os.environ.get("ZOOMIES_Q_WORKERS", "2")),
    "timeout": 300,
    "retry": 360,
    "max_attempts": 1,
    "catch_up": False,
    "poll": 0.2,
    "ack_failures": True,
    "save_limit": 200,
    "label": "Background tasks",
}

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
if os.environ.get("ZOOMIES_REDIS_URL"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["ZOOMIES_REDIS_URL"]]},
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "zoomies": {"handlers": ["console"], "level": os.environ.get("ZOOMIES_LOG_LEVEL", "INFO")},
    },
}

# The zoomies.yaml the settings registry reads (layer 2).
ZOOMIES_CONFIG_FILE = os.environ.get("ZOOMIES_CONFIG", str(BASE_DIR / "zoomies.yaml"))
