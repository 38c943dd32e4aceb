"""One validation for a pool, wherever it is written, and a bad row never stops the fleet.

Issue 8 item 1: the API took `host_selector` as a list (after which every reconcile pass
raised and no job anywhere got a runner), the admin took the name `admin pool/../x` and a
process image `/bin/sh`, and the API took negative memory, cpus 1e300, warm above
max_runners and empty labels. `runners.models.pool_errors` is now the one validation:
`Pool.clean()` runs it for the admin, the API's serializer calls `Pool.clean()`.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from accounts.tokens import create_api_token
from fleet.models import Host
from runners import reconcile
from runners.github import programs
from runners.models import PROCESS_IMAGES, Job, Pool, pool_errors
from runners.pool_views import read_pools
from tests.runners.test_reconcile import T0, fake_gh, fleet_rows  # noqa: F401  (fixtures)

GOOD = {"name": "zoomies-gpu", "labels": ["gpu"], "backend": "docker"}

BAD = {
    "host_selector a list": ({"host_selector": ["gpu"]}, "host_selector"),
    "host_selector a string": ({"host_selector": "gpu=a100"}, "host_selector"),
    "host_selector nested": ({"host_selector": {"gpu": {"a": 1}}}, "host_selector"),
    "name with a path": ({"name": "admin pool/../x"}, "name"),
    "process image /bin/sh": ({"backend": "process", "image": "/bin/sh"}, "image"),
    "process image a command": ({"backend": "process", "image": "rm -rf /"}, "image"),
    "container image with spaces": ({"image": "ubuntu; rm -rf /"}, "image"),
    "windows docker pool without an image": ({"platform": "windows/x64"}, "image"),
    "negative memory": ({"memory_mb": -1}, "memory_mb"),
    "cpus 1e300": ({"cpus": 1e300}, "cpus"),
    "cpus 0": ({"cpus": 0}, "cpus"),
    "warm above max_runners": ({"warm": 5, "max_runners": 2}, "warm"),
    "an empty label": ({"labels": [""]}, "labels"),
    "a blank label": ({"labels": ["  "]}, "labels"),
    "labels a string": ({"labels": "gpu"}, "labels"),
    "a label with a comma": ({"labels": ["a,b"]}, "labels"),
    "runner group 0": ({"runner_group_id": 0}, "runner_group_id"),
    "repository not owner/name": ({"repository": "../etc"}, "repository"),
    "dind on a process pool": ({"backend": "process", "dind": True}, "dind"),
}


@pytest.mark.django_db
def test_the_validation_and_the_reconcile_pass_know_the_same_process_programs():

    # Both read the one catalogue (runners.github.programs): every image the validation
    # accepts, the reconcile pass can run, and it runs nothing else.
    assert PROCESS_IMAGES == programs.PROCESS_IMAGES
    process_pool = Pool(name="zoomies-p", backend="process")
    for image in PROCESS_IMAGES:
        assert reconcile.runner_command(process_pool, image)
    with pytest.raises(ValueError):
        reconcile.runner_command(process_pool, "/bin/sh")


def test_a_good_pool_has_no_errors_and_a_blank_process_image_means_the_actions_runner():
    assert pool_errors(GOOD) == {}
    # The process backend runs a program this codebase knows, chosen by name; blank is
    # the catalogue's actions-runner (SCHED-13), never a path on the host.
    assert pool_errors({**GOOD, "backend": "process", "image": ""}) == {}
    assert pool_errors({**GOOD, "backend": "process", "image": "zoomies/fake-runner"}) == {}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_each_bad_value_is_named_by_the_one_validation(case):
    change, field = BAD[case]
    errors = pool_errors({**GOOD, **change})
    assert field in errors, errors


# -- the API ---------------------------------------------------------------------------------


@pytest.fixture
def api(db):
    user = User.objects.create_user(username="ops", role=User.Role.OPERATOR)
    _row, secret = create_api_token(user=user, name="w", scopes=["fleet:write"], actor="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_the_api_refuses_each_bad_pool_with_a_400_naming_the_field(api, case):
    change, field = BAD[case]
    answer = api.post("/api/v1/pools", {**GOOD, **change}, format="json")
    assert answer.status_code == 400, answer.content
    assert field in answer.json(), answer.json()
    assert not Pool.objects.exists()


def test_the_api_still_creates_a_good_pool(api):
    answer = api.post(
        "/api/v1/pools",
        {**GOOD, "host_selector": {"gpu": "a100"}, "warm": 1, "max_runners": 2, "cpus": 2},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    assert Pool.objects.get().host_selector == {"gpu": "a100"}


# -- the admin -------------------------------------------------------------------------------


def _admin_form(**change) -> dict:
    form = {
        "name": "zoomies-admin", "repository": "", "labels": '["gpu"]', "backend": "docker",
        "platform": "", "host_selector": "{}", "image": "", "cpus": "", "memory_mb": "",
        "ephemeral": "on", "warm": "0", "max_runners": "10", "idle_timeout": "",
        "runner_group_id": "1", "installation": "",
    }  # fmt: skip
    form.update(change)
    return form


@pytest.mark.parametrize(
    "change",
    [
        {"name": "admin pool/../x"},
        {"backend": "process", "image": "/bin/sh"},
        {"host_selector": '["gpu"]'},
        {"warm": "11"},
        {"memory_mb": "-5"},
    ],
    ids=["name", "process-image", "host-selector", "warm", "memory"],
)
def test_the_admin_refuses_what_the_api_refuses(client, admin, change):
    client.force_login(admin)
    answer = client.post("/admin/runners/pool/add/", _admin_form(**change))
    assert answer.status_code == 200  # the form again, with its errors
    assert answer.context["adminform"].form.errors
    assert not Pool.objects.exists()


def test_the_admin_saves_a_good_pool(client, admin):
    client.force_login(admin)
    answer = client.post("/admin/runners/pool/add/", _admin_form())
    assert answer.status_code == 302, answer.context and answer.context["adminform"].form.errors
    assert Pool.objects.get().name == "zoomies-admin"


# -- a bad row already in the database -------------------------------------------------------


def test_read_pools_skips_each_unreadable_row_and_says_why(db):
    good = Pool.objects.create(name="zoomies-good", labels=["a"], host_selector={"gpus": 2})
    Pool.objects.create(name="zoomies-list", host_selector=["gpu"])
    Pool.objects.create(name="zoomies-str", host_selector="gpu")
    Pool.objects.create(name="zoomies-labels", labels="gpu")
    Pool.objects.create(name="zoomies-cpus", cpus=-1.0)
    views, skipped = read_pools(Pool.objects.order_by("name"))
    assert [v.id for v in views] == [good.pk]
    assert views[0].host_selector == (("gpus", "2"),)
    assert sorted(s.name for s in skipped) == [
        "zoomies-cpus", "zoomies-labels", "zoomies-list", "zoomies-str",
    ]  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_pool_with_a_list_host_selector_is_skipped_named_and_the_rest_still_scale(
    fake_gh,  # noqa: F811
    fleet_rows,  # noqa: F811
    api,
):
    """EVT-07: a stored pool the pass cannot read is a configuration problem in the
    problems list under a stable key (pool.unreadable:<name>)."""
    installation, pool, host = fleet_rows
    # Written around the validation, as the old API let it be.
    Pool.objects.create(
        name="zoomies-broken", labels=["linux", "x64"], backend="process", host_selector=["x"]
    )
    Job.objects.create(
        github_id=1, repository="acme/app", labels=["self-hosted", "linux"], status="queued",
        installation=installation, created_at=T0, updated_at=T0,
    )  # fmt: skip
    reports = reconcile.reconcile_now(now_fn=lambda: T0)
    assert reports and reports[0].created, reports
    assert pool.runners.count() == 1
    problems = api.get("/api/v1/problems").json()["results"]
    broken = [p for p in problems if p["key"] == "pool.unreadable:zoomies-broken"]
    assert broken and "host_selector is a list" in broken[0]["detail"], problems
    assert broken[0]["severity"] == "error"
    assert Host.objects.get(pk=host.pk)  # the pass touched nothing else


@pytest.mark.django_db
def test_back17_a_docker_pool_on_a_stock_image_of_unknowable_variant_raises_a_problem(
    api, registry_defaults
):
    """BACK-17: a pool that provides Docker, pinned to another build's stock tag or to a
    digest, is left on it (its runners run it unchanged) and raises
    pool.docker_client_missing; a pool on this build's tag or without Docker raises none."""
    stock = "ghcr.io/zoomies/runner"
    for name, image, dind in [
        ("zoomies-old-pin", f"{stock}:0.0.9", True),
        ("zoomies-digest", f"{stock}@sha256:{'c' * 64}", True),
        ("zoomies-this-build", f"{stock}:0.1.0", True),
        ("zoomies-no-docker", f"{stock}:0.0.9", False),
    ]:
        answer = api.post(
            "/api/v1/pools",
            {"name": name, "backend": "docker", "image": image, "dind": dind, "labels": ["x"]},
            format="json",
        )
        assert answer.status_code == 201, answer.content
    problems = {p["key"]: p for p in api.get("/api/v1/problems").json()["results"]}
    raised = sorted(k for k in problems if k.startswith("pool.docker_client_missing:"))
    assert raised == [
        "pool.docker_client_missing:zoomies-digest",
        "pool.docker_client_missing:zoomies-old-pin",
    ]
    detail = problems["pool.docker_client_missing:zoomies-old-pin"]["detail"]
    assert "0.0.9 is not a tag this build (0.1.0) publishes" in detail
    assert Pool.objects.get(name="zoomies-old-pin").image == f"{stock}:0.0.9"  # left alone
