"""The registration reap lists every scope a pool registers in (issue 8 item 8; POLL-11)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runners.github.scopes import registration_scopes
from runners.models import Installation, Pool
from runners.reap import reap_step
from tests.runners.conftest import install, make_runner, register


def test_an_org_installation_has_its_org_and_each_of_its_pools_repositories():
    assert registration_scopes("org", "acme", [], ["acme/app", "ACME/App", "beta/x", "bad"]) == [
        {"org": "acme"},
        {"repo": "acme/app"},
    ]
    assert registration_scopes("repo", "mona", ["mona/a"], ["mona/b", "mona/A", "x/y"]) == [
        {"repo": "mona/a"},
        {"repo": "mona/b"},
    ]
    assert registration_scopes("enterprise", "big", [], ["big/x"]) == []


@pytest.mark.django_db
def test_poll11_an_orphan_of_a_repository_pool_under_an_org_installation_is_deleted(
    silent_github, github_app, github_clock, github_settings
):
    """POLL-11: a repository pool registers at its repository; its orphan is found there."""
    fake, app, clock = silent_github, github_app, github_clock
    acme = install(fake, "acme", ("app", "lib"))
    Pool.objects.create(name="zoomies-app", repository="acme/app", installation=acme)
    Pool.objects.create(name="zoomies-any", repository="acme/lib")  # no installation: any
    register(app, acme, "zoomies-app-1-orphan", repo="acme/app")
    register(app, acme, "zoomies-any-2-orphan", repo="acme/lib")
    live = register(app, acme, "zoomies-app-3-live", repo="acme/app")
    make_runner(name="zoomies-app-3-live", installation=acme, github_runner_id=live.runner_id)
    register(app, acme, "zoomies-org-4-orphan")

    report = reap_step(
        clock.now(), started_at=clock.now() - timedelta(minutes=2), app=app, clock=clock
    )

    assert sorted(report.deleted) == [
        "acme/app:zoomies-app-1-orphan",
        "acme/lib:zoomies-any-2-orphan",
        "acme:zoomies-org-4-orphan",
    ]
    assert [r["name"] for r in fake.runners(acme.github_id)] == ["zoomies-app-3-live"]
    assert Installation.objects.get().last_reaped_at == clock.now()
