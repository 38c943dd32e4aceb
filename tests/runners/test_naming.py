"""SCHED-13, SCHED-14: the zoomies-* naming grammar and the runner image catalogue."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.naming import (
    BUILD_VERSION,
    DOCKER_SUFFIX,
    LINUX_RUNNER_IMAGE,
    MAX_POOL_NAME,
    MAX_RUNNER_NAME,
    STOCK_PLATFORMS,
    STOCK_REPOSITORY,
    STOCK_TAGS,
    default_image,
    docker_client_missing,
    docker_variant,
    is_zoomies_name,
    runner_name,
    validate_host_name,
    validate_pool_name,
)


@pytest.mark.parametrize(
    "name",
    ["zoomies-linux-x64", "zoomies-a", "zoomies-0", "zoomies-gpu-a100-2", "zoomies-" + "a" * 32],
)
def test_sched14_valid_pool_and_host_names_pass(name: str) -> None:
    validate_pool_name(name)
    validate_host_name(name)
    assert is_zoomies_name(name)


@pytest.mark.parametrize(
    "name,message",
    [
        ("", "empty"),
        ("linux-x64", "must start with 'zoomies-'"),
        ("zoomies", "must start with 'zoomies-'"),
        ("zoomies-", "segments"),
        ("Zoomies-linux", "lowercase"),
        ("zoomies-Linux", "lowercase"),
        ("zoomies--linux", "segments"),
        ("zoomies-linux-", "segments"),
        ("zoomies-linux_x64", "a-z, 0-9"),
        ("zoomies-linux x64", "a-z, 0-9"),
        ("zoomies-" + "a" * 33, "the limit is 40"),
    ],
)
def test_sched14_invalid_names_are_refused_with_a_clear_message(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        validate_pool_name(name)
    with pytest.raises(ValueError, match="host name"):
        validate_host_name(name)


def test_sched14_a_non_string_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        validate_pool_name(42)  # type: ignore[arg-type]
    assert not is_zoomies_name(None)


def test_sched14_runner_name_joins_pool_id_and_suffix() -> None:
    assert runner_name("zoomies-linux-x64", 17, "a1b2c3") == "zoomies-linux-x64-17-a1b2c3"
    assert runner_name("zoomies-linux-x64", 17, "") == "zoomies-linux-x64-17"


def test_sched14_runner_name_cuts_the_pool_part_to_stay_within_64() -> None:
    name = runner_name("zoomies-" + "x" * 40 + "-" + "y" * 20, 123456, "deadbeef")
    assert len(name) <= MAX_RUNNER_NAME
    assert name.endswith("-123456-deadbeef")
    assert is_zoomies_name(name)


def test_sched14_runner_name_normalises_a_bad_suffix_and_pool() -> None:
    assert runner_name("Linux_X64", 3, "AB/cd") == "zoomies-linux-x64-3-ab-cd"
    assert runner_name("", 3, "--") == "zoomies-3"


def test_sched14_runner_name_refuses_a_negative_id() -> None:
    with pytest.raises(ValueError):
        runner_name("zoomies-a", -1, "x")


@settings(max_examples=200, deadline=None)
@given(
    pool=st.text(max_size=80),
    runner_id=st.integers(min_value=0, max_value=10**15),
    suffix=st.text(max_size=80),
)
def test_sched14_runner_name_is_always_a_valid_name(pool: str, runner_id: int, suffix: str) -> None:
    name = runner_name(pool, runner_id, suffix)
    assert is_zoomies_name(name)
    assert len(name) <= MAX_RUNNER_NAME
    assert f"-{runner_id}" in name


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abz019-_Z ", max_size=MAX_POOL_NAME + 5))
def test_sched14_validate_and_is_zoomies_name_agree(name: str) -> None:
    try:
        validate_pool_name(name)
    except ValueError:
        assert not is_zoomies_name(name) or len(name) > MAX_POOL_NAME
    else:
        assert is_zoomies_name(name)


@pytest.mark.parametrize(
    "platform,backend,image",
    [
        ("linux/x64", "docker", LINUX_RUNNER_IMAGE),
        ("linux/arm64", "podman", LINUX_RUNNER_IMAGE),
        ("linux/aarch64", "docker", LINUX_RUNNER_IMAGE),
        ("linux", "docker", LINUX_RUNNER_IMAGE),
        (None, "docker", LINUX_RUNNER_IMAGE),
        ("linux/x64", "process", "actions-runner"),
        ("macos/arm64", "process", "actions-runner"),
        ("windows/x64", "process", "actions-runner"),
    ],
)
def test_sched13_catalogue_images(platform: str | None, backend: str, image: str) -> None:
    assert default_image(platform, backend) == image


@pytest.mark.parametrize(
    "platform,backend",
    [
        ("macos/arm64", "docker"),
        ("windows/x64", "podman"),
        (None, "lxc"),
        ("linux/s390x", "docker"),
    ],
)
def test_sched13_no_catalogue_image_is_a_clear_error(platform: str | None, backend: str) -> None:
    with pytest.raises(ValueError, match="image|backend"):
        default_image(platform, backend)


ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "runner" / "Dockerfile"


@pytest.mark.parametrize(
    "image,variant",
    [
        (f"{STOCK_REPOSITORY}:latest", f"{STOCK_REPOSITORY}:latest-docker"),
        (STOCK_REPOSITORY, f"{STOCK_REPOSITORY}:latest-docker"),  # no tag is latest
        (f"{STOCK_REPOSITORY}:{BUILD_VERSION}", f"{STOCK_REPOSITORY}:{BUILD_VERSION}-docker"),
        (f"{STOCK_REPOSITORY}:latest-docker", f"{STOCK_REPOSITORY}:latest-docker"),
        (f"{STOCK_REPOSITORY}:0.0.9", None),  # another build's pin
        (f"{STOCK_REPOSITORY}:0.0.9-docker", None),
        (f"{STOCK_REPOSITORY}@sha256:{'a' * 64}", None),
        (f"{STOCK_REPOSITORY}:latest@sha256:{'a' * 64}", None),
        ("ghcr.io/zoomies/runner-fork:latest", None),
        ("localhost:5000/runner", None),
    ],
)
def test_back16_the_docker_variant_of_each_stock_tag_this_build_publishes(image, variant):
    """BACK-16: a stock tag of this build has a Docker variant under the tag plus -docker;
    BACK-17: a digest, another build's pin or another image has none that can be known."""
    assert docker_variant(image) == variant


@pytest.mark.parametrize(
    "image,dind,said",
    [
        ("", True, ""),
        (f"{STOCK_REPOSITORY}:{BUILD_VERSION}", True, ""),
        ("registry.local/runner:7", True, ""),  # the operator's own image: not judged
        (f"{STOCK_REPOSITORY}:0.0.9", False, ""),  # no Docker to need a client for
        (f"{STOCK_REPOSITORY}:0.0.9", True, "0.0.9 is not a tag this build (0.1.0) publishes"),
        (f"{STOCK_REPOSITORY}@sha256:{'b' * 64}", True, "by digest"),
    ],
)
def test_back17_a_stock_image_whose_variant_cannot_be_known_is_said(image, dind, said):
    why = docker_client_missing(image, "linux/x64", "docker", dind)
    assert (said in why) if said else why == ""
    assert bool(why) == bool(said)


def test_back16_the_catalogue_is_what_the_recipe_builds_for_this_build():
    """BACK-16: the runner recipe builds the stock image and its Docker variant as targets,
    the variant with the Docker client the stock image drops, for the catalogue's platforms
    and tags; this build's version is the project's and the agent's."""
    from fleet.agent import AGENT_VERSION  # noqa: PLC0415  # the agent's own constant

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert BUILD_VERSION == project == AGENT_VERSION
    assert STOCK_TAGS == ("latest", BUILD_VERSION)
    assert LINUX_RUNNER_IMAGE == f"{STOCK_REPOSITORY}:latest"
    recipe = DOCKERFILE.read_text()
    targets = re.findall(r"^FROM \S+ AS (\S+)$", recipe, re.MULTILINE)
    assert targets == ["runner-docker", "runner"]
    stock = recipe.split("AS runner\n", 1)[1]
    assert "rm -f /usr/bin/docker " in stock
    assert "linux/amd64,linux/arm64" in recipe and set(STOCK_PLATFORMS) == {
        "linux/x64",
        "linux/arm64",
    }
    for tag in STOCK_TAGS:
        assert f"-t {STOCK_REPOSITORY}:{tag} " in recipe
        assert f"-t {STOCK_REPOSITORY}:{tag}{DOCKER_SUFFIX} " in recipe
