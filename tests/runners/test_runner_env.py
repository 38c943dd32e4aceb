"""What the operator puts in a runner's environment: runners.env, runners.docker_wait and a
pool's own env (BACK-11, BACK-12), as the create task carries it to the agent."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleet.models import AgentTask, Host
from fleet.taskqueue import wire_payload
from runners import reconcile
from runners.models import Installation, Job, Pool, Runner
from tests.runners.test_reconcile import T0, fake_gh  # noqa: F401  # the fixture

JIT = "ACTIONS_RUNNER_INPUT_JITCONFIG"


@pytest.fixture
def fleet(registry_defaults, fake_gh):  # noqa: F811  # the fixture imported above
    inst_id = fake_gh.add_installation(
        account="acme", account_type="Organization", repositories=["acme/app"]
    )
    installation = Installation.objects.create(
        github_id=inst_id, account="acme", kind="org", repositories=["acme/app"]
    )
    Host.objects.create(
        name="zoomies-host-1", capacity=8, backends=["docker"], platform="linux/x64",
        last_heartbeat_at=T0,
    )  # fmt: skip
    return installation, registry_defaults


def pool(installation: Installation, name: str, **fields) -> Pool:
    made = Pool(
        name=name, installation=installation, labels=[name], backend="docker",
        platform="linux/x64", max_runners=5, **fields,
    )  # fmt: skip
    made.full_clean()
    made.save()
    return made


def runner_env_of(installation: Installation, made: Pool, github_id: int) -> dict[str, str]:
    """Queue one job for `made`, run a pass, and read the env its create task carries."""
    Job.objects.create(
        github_id=github_id, repository="acme/app", labels=["self-hosted", made.name],
        status="queued", installation=installation, created_at=T0, updated_at=T0,
    )  # fmt: skip
    reconcile.reconcile_now(now_fn=lambda: T0)
    runner = Runner.objects.filter(pool=made).latest("pk")
    task = AgentTask.objects.get(runner=runner, kind="create_runner")
    return wire_payload(task)["env"]


@pytest.mark.django_db(transaction=True)
def test_back11_back12_the_fleets_env_the_docker_wait_and_the_pools_own_env_key_by_key(fleet):
    """BACK-12: runners.env reaches every runner and a pool's env overrides it key by key;
    BACK-11: runners.docker_wait (180 s) is rendered into a Docker pool's runners as
    ZOOMIES_DOCKER_WAIT unless the pool's env names it; the credential is the minted one."""
    installation, values = fleet
    values.set("runners.env", '["HTTP_PROXY=http://proxy:3128", "SHARED=fleet"]')
    docker = pool(installation, "zoomies-dind", dind=True)
    own_wait = pool(
        installation, "zoomies-dind-slow", dind=True,
        env={"SHARED": "pool", "ZOOMIES_DOCKER_WAIT": "600"},
    )  # fmt: skip
    plain = pool(installation, "zoomies-plain")

    env = runner_env_of(installation, docker, 1)
    assert env["ZOOMIES_DOCKER_WAIT"] == "180"
    assert (env["HTTP_PROXY"], env["SHARED"]) == ("http://proxy:3128", "fleet")
    assert env[JIT] and not env[JIT].startswith("sealed:")

    env = runner_env_of(installation, own_wait, 2)
    assert (env["ZOOMIES_DOCKER_WAIT"], env["SHARED"]) == ("600", "pool")
    assert env["HTTP_PROXY"] == "http://proxy:3128"

    # A pool that provides no Docker daemon has no wait to run.
    env = runner_env_of(installation, plain, 3)
    assert "ZOOMIES_DOCKER_WAIT" not in env
    assert (env["HTTP_PROXY"], env["SHARED"]) == ("http://proxy:3128", "fleet")

    # The setting is read at each create: the next Docker runner gets the new figure.
    values.set("runners.docker_wait", "4m")
    assert runner_env_of(installation, docker, 4)["ZOOMIES_DOCKER_WAIT"] == "240"


@pytest.mark.django_db
def test_back12_a_pools_env_is_names_and_strings_and_never_the_credential(registry_defaults):
    """BACK-12: a pool's env is validated where every pool is (the admin and the API)."""
    for env, said in [
        ({JIT: "x"}, "the runner's credential"),
        ({"1BAD": "x"}, "not an environment variable name"),
        ({"GOOD": 3}, "must be a string"),
        (["A=1"], "must be a mapping"),
    ]:
        with pytest.raises(ValidationError) as caught:
            Pool(name="zoomies-env", backend="docker", env=env).full_clean()
        assert said in str(caught.value.message_dict["env"])
    Pool(name="zoomies-env", backend="docker", env={"GOOD": "", "_X1": "y"}).full_clean()
