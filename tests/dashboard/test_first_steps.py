"""Issue 21 item 14: what a newcomer is told to type works as told. The Hosts page's join
line parses under the agent's own command line, the Settings page shows the address the
controller serves on, and the README's first steps run in the order it gives them."""

from __future__ import annotations

import argparse
import re
import shlex
from html import unescape
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from accounts.management.commands.create_admin import PASSWORD_ENV
from accounts.models import ApiToken, User
from fleet.agent.cli import add_arguments
from fleet.agent.joining import JOIN_TOKEN_ENV
from zoomies_site.management.commands.controller import bind_in_use

pytestmark = pytest.mark.django_db
README = Path(__file__).resolve().parents[2] / "README.md"


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_hosts_page_join_line_is_one_the_agent_takes(cast):
    """It printed `manage.py agent --controller URL --join-token TOKEN`; no such flag."""
    text = signed_in(cast["operator"]).get("/hosts", HTTP_HOST="ci.example:8443").content
    line = unescape(re.search(r'<code id="join-command"[^>]*>([^<]+)</code>', text.decode())[1])
    words = shlex.split(line)
    assert words[0] == f"{JOIN_TOKEN_ENV}=JOIN_TOKEN" and words[1] == "zoomies-agent"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    assert parser.parse_args(words[2:]).controller == "http://ci.example:8443"


def test_the_join_line_names_the_public_url_when_one_is_set(cast, registry_defaults):
    """Behind a proxy the page's own URL may be one a new host cannot dial."""
    registry_defaults.set("server.public_url", "https://zoomies.example/")
    text = signed_in(cast["operator"]).get("/hosts").content.decode()
    assert "zoomies-agent --controller https://zoomies.example</code>" in text


def test_the_settings_page_shows_the_address_a_bind_flag_gave(cast, monkeypatch):
    """`controller --bind 0.0.0.0:9090` served there while Settings said 127.0.0.1:8080
    (default): the flag is the environment's server.bind for this process and its children."""
    # Set first, so the undo removes what bind_in_use writes (a delenv of an unset name
    # records nothing, and the write would leak into the rest of the run).
    monkeypatch.setenv("ZOOMIES_SERVER_BIND", "127.0.0.1:8080")
    monkeypatch.delenv("ZOOMIES_SERVER_BIND")
    assert bind_in_use(None) == ("127.0.0.1", 8080)
    assert bind_in_use("0.0.0.0:9090") == ("0.0.0.0", 9090)  # noqa: S104  # the test's bind
    text = signed_in(cast["admin"]).get("/settings").content.decode()
    row = re.search(r'<tr id="server.bind">(.*?)</tr>', text, re.S)[1]
    assert "0.0.0.0:9090" in row and '<td data-label="Source">env</td>' in row


def test_the_readmes_first_steps_run_in_the_order_given(monkeypatch, capsys):
    """`create_token --user me --create-user` made `me` an operator, then `create_admin me`
    failed: every `manage.py create_admin`/`create_token` line of the README, in order."""
    lines = [
        shlex.split(line.split("#", 1)[0])
        for line in README.read_text().splitlines()
        if line.strip().startswith(".venv/bin/python manage.py create_")
    ]
    assert lines, "the README names no first steps"
    monkeypatch.setenv(PASSWORD_ENV, "a long enough passphrase 7")
    for words in lines:
        call_command(*words[2:])
    me = User.objects.get(username="me")
    assert me.role == User.Role.ADMIN
    assert ApiToken.objects.filter(user=me).exists()
    assert "zpt_" in capsys.readouterr().out
