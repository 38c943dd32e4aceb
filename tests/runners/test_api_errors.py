"""The API's answers to bad requests (issue 8 item 4): clear 4xx, no 500, no traceback.

`/api/v1/problems` under the browsable renderer answered 500; a bearer token that is not
an API token was answered "credentials were not provided"; a body over
DATA_UPLOAD_MAX_MEMORY_SIZE was a 400 HTML page and an ERROR traceback in the log; and
under daphne every line of the "zoomies" loggers, webhook failures included, was printed
twice.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from accounts.tokens import create_api_token
from runners.models import Pool
from tests.runners.test_webhook_input import post_asgi, signed_headers

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secret(db):
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, value = create_api_token(
        user=user, name="rw", scopes=["fleet:read", "fleet:write"], actor="test"
    )
    return value


def test_the_problems_list_renders_in_the_browsable_api(client, secret):
    answer = client.get(
        "/api/v1/problems", headers={"Authorization": f"Bearer {secret}", "Accept": "text/html"}
    )
    assert answer.status_code == 200
    assert b"Problem List" in answer.content or b"problems" in answer.content


@pytest.mark.parametrize("token", ["wrong", "zpt_wrong", "zat_an-agent-token", ""])
def test_auth04_a_wrong_bearer_token_is_an_invalid_token_401(client, db, token):
    answer = client.get("/api/v1/pools", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 401
    detail = answer.json()["detail"]
    assert "invalid" in detail and "not provided" not in detail, detail


def test_no_credential_at_all_still_says_so(client, db):
    answer = client.get("/api/v1/pools")
    assert answer.status_code in (401, 403)
    assert "not provided" in answer.json()["detail"]


def test_a_body_over_the_upload_limit_is_a_413_without_a_traceback(secret, settings, caplog):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = json.dumps({"name": "zoomies-big", "labels": ["x" * 50] * 40})
    with caplog.at_level(logging.INFO):
        answer = api.post("/api/v1/pools", body, content_type="application/json")
    assert answer.status_code == 413, answer.content
    assert "too large" in answer.json()["detail"]
    assert not Pool.objects.exists()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.django_db(transaction=True)
def test_hook01_a_too_large_delivery_is_a_413_without_a_traceback(github_settings, caplog):
    github_settings.set(webhook_secrets="s", webhook_max_body=65536)
    body = b'{"action": "queued", "pad": "' + b"x" * 70_000 + b'"}'
    with caplog.at_level(logging.INFO):
        status, answer = post_asgi(body, headers=signed_headers(body))
    assert status == 413, answer
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_under_daphne_a_webhook_failure_is_logged_once():
    """daphne's CLI puts a handler on the root logger before Django starts (as here)."""
    script = (
        "import logging, django\n"
        "logging.basicConfig(level=logging.INFO, format='ROOT %(message)s')\n"
        "django.setup()\n"
        "try:\n"
        "    raise RuntimeError('boom')\n"
        "except RuntimeError:\n"
        "    logging.getLogger('zoomies.webhooks').exception('webhook delivery D1 failed')\n"
        "logging.getLogger('daphne.server').info('daphne says hello')\n"
        "logging.getLogger('django.request').error('Internal Server Error: /x')\n"
        "logging.getLogger('httpx').info('an HTTP request')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "zoomies_site.settings"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("webhook delivery D1 failed") == 1, done.stderr
    assert done.stderr.count("RuntimeError: boom") == 1, done.stderr
    assert done.stderr.count("daphne says hello") == 1, done.stderr
    # Django's own errors are still printed (its console handler is for DEBUG only).
    assert done.stderr.count("Internal Server Error: /x") == 1, done.stderr
    assert "an HTTP request" not in done.stderr
