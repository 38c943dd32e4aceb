"""SCHED-13, SCHED-14: the zoomies-* naming grammar and the runner image catalogue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners.naming import (
    LINUX_RUNNER_IMAGE,
    MAX_POOL_NAME,
    MAX_RUNNER_NAME,
    default_image,
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
        (None, "docker", LINUX_RUNNER_IMAGE),
        ("linux/x64", "process", "actions-runner"),
        ("macos/arm64", "process", "actions-runner"),
        ("windows/x64", "process", "actions-runner"),
    ],
)
def test_sched13_catalogue_images(platform: str | None, backend: str, image: str) -> None:
    assert default_image(platform, backend) == image


@pytest.mark.parametrize(
    "platform,backend", [("macos/arm64", "docker"), ("windows/x64", "podman"), (None, "lxc")]
)
def test_sched13_no_catalogue_image_is_a_clear_error(platform: str | None, backend: str) -> None:
    with pytest.raises(ValueError, match="image|backend"):
        default_image(platform, backend)
