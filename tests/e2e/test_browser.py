"""The dashboard in a real browser (issue 10 acceptance; EVT-01): headless Chromium signs
in, opens the Runners page, a job is queued at the fake GitHub, and the runner appears, goes
busy and disappears without a reload. Then every dashboard page, a pool's forms, the admin
and the browsable API are opened and photographed into a stable folder
($ZOOMIES_SCREENSHOT_DIR, default test-output/screenshots in the repository, git-ignored);
a console error, an uncaught page error, or a stylesheet that answers other than 200 or
holds no rules fails the test, named with the page it happened on.

Real processes: the controller is the README's `scripts/run.sh` (collectstatic, then the
controller: daphne, the django-q2 cluster, the embedded agent) over its own SQLite file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.browsing import PASSWORD, Watch
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, setup_fleet
from zoomies_site import dashboard

# The HTTP layer and the browser: the same on either database, so the SQLite pass runs it.
# Over 20 s of a worker: .ci/run's slow pass runs it, after the test command.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.slow]
# Every page of the dashboard (zoomies_site/dashboard_urls.py) by its screenshot's name;
# {pool} is the test pool's id. The admin and the browsable API follow them.
PAGES = {
    "overview": "", "pools": "pools", "pool-new": "pools/new", "pool-edit": "pools/{pool}/edit",
    "runners": "runners", "jobs": "jobs", "hosts": "hosts", "capacity": "capacity",
    "audit": "audit", "settings": "settings", "users": "users", "machines": "machines",
}  # fmt: skip
OTHER_SHOTS = ["runners-busy", "problems-drawer", "admin", "api-pools", "jobs-phone"]
RUNNER_ROW = '#runners tbody tr[data-name^="zoomies-e2e-"]'
SHOTS_ENV = "ZOOMIES_SCREENSHOT_DIR"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shots() -> Path:
    """The screenshot folder, kept after the run; this test's own files are cleared first so
    what is there afterwards was taken by this run."""
    folder = Path(os.environ.get(SHOTS_ENV) or REPO / "test-output" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    for name in [*PAGES, *OTHER_SHOTS]:
        (folder / f"{name}.png").unlink(missing_ok=True)
    return folder


def test_evt01_a_runner_appears_goes_busy_and_leaves_the_runners_page_without_a_reload(
    e2e, browser, shots
):
    # Every tab the dashboard shows (an admin's too) is among the pages photographed.
    assert set(dict(dashboard.PAGES + dashboard.ADMIN_PAGES)) <= set(PAGES)
    controller, fake = e2e
    setup_fleet(controller, fake)
    controller.env["ZOOMIES_ADMIN_PASSWORD"] = PASSWORD
    controller.manage("create_admin", "ada")
    controller.start(run_script=True)
    pool = controller.api("pools", method="POST", json=POOL)
    wait_for(lambda: controller.api("hosts"), 30, "the embedded agent to join")

    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    watch = Watch(page)
    page.set_default_timeout(30_000)

    page.goto(f"{controller.url}/runners")
    assert "/admin/login/" in page.url  # not signed in: sent to sign in, then back
    watch.check("login")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{controller.url}/runners")
    page.wait_for_selector('#live[data-state="live"]')
    # A marker that a reload would wipe.
    page.evaluate("window.__sameDocument = true")

    job_id = fake.queue_job(repo="acme/app", labels=LABELS, duration=6, conclusion="success")
    row = page.wait_for_selector(RUNNER_ROW, timeout=60_000)
    name = row.get_attribute("data-name")
    page.wait_for_selector(f'{RUNNER_ROW}[data-state="busy"]', timeout=60_000)
    watch.shoot(shots, "runners-busy")
    page.wait_for_selector(f'#runners tbody tr[data-name="{name}"]', state="detached",
                           timeout=90_000)  # fmt: skip
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    assert fake.job(job_id)["status"] == "completed"
    assert fake.job(job_id)["runner_name"] == name

    for shot, path in PAGES.items():
        page.goto(f"{controller.url}/{path.format(pool=pool['id'])}")
        page.wait_for_load_state("load")
        page.wait_for_selector("#live[data-state]")
        assert page.locator("main h1").inner_text().strip(), shot
        watch.shoot(shots, shot)
    # Issue 21 item 14: the minted token lands in the join line a host can run as it is.
    page.goto(f"{controller.url}/hosts")
    page.click("#mint-join-token")
    page.wait_for_function("document.getElementById('join-token-secret').textContent !== ''")
    secret = page.locator("#join-token-secret").inner_text().strip()
    assert page.locator("#join-command").inner_text().strip() == (
        f"ZOOMIES_JOIN_TOKEN={secret} zoomies-agent --controller {controller.url}"
    )
    page.click("#problems-toggle")
    page.wait_for_selector("#problems:not([hidden])")
    watch.shoot(shots, "problems-drawer", full_page=False)
    page.goto(f"{controller.url}/admin/")
    # The admin's live line: the same frames over the Channels websocket.
    page.wait_for_selector('#zoomies-live[data-state="live"]')
    watch.shoot(shots, "admin")
    # A browser asks for text/html: the browsable API, with its own stylesheets.
    answer = page.goto(f"{controller.url}/api/v1/pools")
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/html")
    page.wait_for_selector(f"text={POOL['name']}")
    watch.shoot(shots, "api-pools")

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.add_cookies(context.cookies())
    small = phone.new_page()
    phone_watch = Watch(small)
    small.goto(f"{controller.url}/jobs")
    small.wait_for_selector("#live[data-state]")
    phone_watch.shoot(shots, "jobs-phone")
    # A phone shows each row as a card: the table's head is hidden, the cells labelled.
    assert small.evaluate("getComputedStyle(document.querySelector('#jobs thead')).display") == (
        "none"
    )
    phone.close()
    context.close()

    taken = {n: shots / f"{n}.png" for n in [*PAGES, *OTHER_SHOTS]}
    assert [n for n, f in taken.items() if not (f.exists() and f.stat().st_size)] == []
