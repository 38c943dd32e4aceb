"""Fixtures for end-to-end tests: a fake GitHub in this process, a controller in a child."""

from __future__ import annotations

import shutil

import pytest
from playwright.sync_api import sync_playwright

from runners.github.fake import FakeGitHub
from tests.e2e.browsing import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.harness import Controller, free_port, kill_leftovers


@pytest.fixture
def controller_port():
    return free_port()


@pytest.fixture
def e2e(tmp_path, request):
    """A controller plus a fake GitHub wired to each other; call `.start()` to run them."""
    fake = FakeGitHub(webhook_url=None, webhook_secret="e2e-secret").start()
    key = tmp_path / "app.pem"
    key.write_text(fake.private_key_pem)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    controller = Controller(
        data_dir,
        env={
            "ZOOMIES_GITHUB_API_URL": fake.url,
            "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
            "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(key),
            "ZOOMIES_GITHUB_WEBHOOK_SECRETS": "e2e-secret",
        },
    )
    fake.webhook_url = f"{controller.url}/webhooks/github"
    yield controller, fake
    controller.drop_database()  # stops it first
    fake.stop()
    kill_leftovers(str(data_dir))
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(controller.log())


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def browser():
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()
