"""The `zoomies-*` naming grammar and the runner image catalogue (SCHED-13, SCHED-14).

Pure: no I/O, no clock, no Django. The scheduler imports it, so it must stay that way
(tests/runners/scheduler/test_purity.py holds it to the same import allow-list).

The grammar: lowercase ASCII, the prefix ``zoomies-``, then one or more segments of
``[a-z0-9]`` joined by single hyphens, so ``zoomies-linux-x64`` is a name and
``zoomies--x``, ``zoomies-x-`` and ``Zoomies-x`` are not.

Length limits:

* pool and host names: at most ``MAX_POOL_NAME`` / ``MAX_HOST_NAME`` (40) characters, so
  that a runner name built from a pool name still has room for ``-<id>-<suffix>`` under
  GitHub's limit without cutting the pool name in the common case;
* runner names: at most ``MAX_RUNNER_NAME`` (64), GitHub's limit on a runner's name, which
  is also the ``max_length`` of ``Runner.name``.
"""

from __future__ import annotations

import re

PREFIX = "zoomies-"
MAX_RUNNER_NAME = 64  # GitHub's limit on a self-hosted runner's name.
MAX_POOL_NAME = 40  # Leaves 24 characters under MAX_RUNNER_NAME for "-<id>-<suffix>".
MAX_HOST_NAME = 40

_GRAMMAR = re.compile(r"zoomies(?:-[a-z0-9]+)+")
_NOT_ALLOWED = re.compile(r"[^a-z0-9]+")

# The runner image catalogue. docker/runner/Dockerfile builds the stock image, multi-arch,
# under every tag in STOCK_TAGS for each platform in STOCK_PLATFORMS, and beside each its
# Docker variant (the same image with a Docker client) under the tag plus DOCKER_SUFFIX.
# BUILD_VERSION is this build's version: pyproject.toml's and the agent's (a test holds the
# three together), so a pin from another build is a tag this catalogue does not list.
# The process backend runs the actions runner unpacked on the host, and the catalogue
# answer for it is the runner's directory name.
BUILD_VERSION = "0.1.0"
STOCK_REPOSITORY = "ghcr.io/zoomies/runner"
STOCK_TAGS = ("latest", BUILD_VERSION)
STOCK_PLATFORMS = ("linux/x64", "linux/arm64")
DOCKER_SUFFIX = "-docker"
LINUX_RUNNER_IMAGE = f"{STOCK_REPOSITORY}:latest"
PROCESS_RUNNER = "actions-runner"
CONTAINER_BACKENDS = ("docker", "podman")
# What the kernel and Docker call the architectures the catalogue's platforms name.
_ARCH_ALIASES = {"amd64": "x64", "x86_64": "x64", "aarch64": "arm64"}


def _check(kind: str, name: object, limit: int) -> None:
    """Raise ValueError saying exactly what is wrong with `name` as a `kind` name."""
    if not isinstance(name, str):
        raise ValueError(f"{kind} name must be a string, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{kind} name is empty; it must look like 'zoomies-linux-x64'")
    if len(name) > limit:
        raise ValueError(
            f"{kind} name {name!r} is {len(name)} characters long; the limit is {limit}"
        )
    if name != name.lower():
        raise ValueError(f"{kind} name {name!r} must be lowercase")
    if not name.startswith(PREFIX):
        raise ValueError(f"{kind} name {name!r} must start with {PREFIX!r}")
    if re.search(r"[^a-z0-9-]", name):
        raise ValueError(f"{kind} name {name!r} may contain only a-z, 0-9 and hyphens between them")
    if not _GRAMMAR.fullmatch(name):
        raise ValueError(
            f"{kind} name {name!r} must be 'zoomies-' followed by letters and digits in "
            "segments joined by single hyphens (no double, leading or trailing hyphen)"
        )


def validate_pool_name(name: str) -> None:
    """Raise ValueError unless `name` is a valid pool name (grammar, at most 40 chars)."""
    _check("pool", name, MAX_POOL_NAME)


def validate_host_name(name: str) -> None:
    """Raise ValueError unless `name` is a valid host name (grammar, at most 40 chars)."""
    _check("host", name, MAX_HOST_NAME)


def is_zoomies_name(name: object) -> bool:
    """True when `name` follows the grammar and fits GitHub's 64-character limit.

    This is the test for "a name Zoomies could have given": pool, host and runner names
    all pass it.
    """
    return isinstance(name, str) and len(name) <= MAX_RUNNER_NAME and bool(_GRAMMAR.fullmatch(name))


def _segments(text: str) -> str:
    """Lowercase `text` and turn every run of disallowed characters into one hyphen."""
    return _NOT_ALLOWED.sub("-", text.lower()).strip("-")


def runner_name(pool_name: str, runner_id: int, suffix: str = "") -> str:
    """The GitHub name of a runner: ``<pool>-<runner_id>-<suffix>``, always valid.

    `suffix` is whatever the caller chose to make the name unguessable (this module draws
    no randomness); it is normalised to the grammar and may be empty. When the result would
    exceed 64 characters the pool part is cut first (never below ``zoomies``), then the
    suffix; the runner id is never cut, because it is what keeps names unique.
    """
    if isinstance(runner_id, bool) or not isinstance(runner_id, int) or runner_id < 0:
        raise ValueError(f"runner id must be a non-negative integer, not {runner_id!r}")
    pool = _segments(pool_name)
    if pool in ("", "zoomies"):
        pool = "zoomies"
    elif not pool.startswith(PREFIX):
        pool = PREFIX + pool
    tail = f"-{runner_id}"
    if len("zoomies") + len(tail) > MAX_RUNNER_NAME:
        raise ValueError(f"runner id {runner_id} is too long for a {MAX_RUNNER_NAME}-char name")
    clean_suffix = _segments(suffix)
    room_for_suffix = max(0, MAX_RUNNER_NAME - len("zoomies") - len(tail) - 1)
    if clean_suffix:
        clean_suffix = clean_suffix[:room_for_suffix].strip("-")
    if clean_suffix:
        tail += f"-{clean_suffix}"
    # Cutting may leave a trailing hyphen; strip it so the segments stay well formed.
    pool = pool[: MAX_RUNNER_NAME - len(tail)].rstrip("-")
    name = pool + tail
    assert is_zoomies_name(name), name  # noqa: S101  # The construction above guarantees it.
    return name


def default_image(platform: str | None, backend: str) -> str:
    """The catalogue image for a pool that names none of its own (SCHED-13).

    * process backend, any platform: ``actions-runner`` (the runner unpacked on the host);
    * docker or podman on linux, or on no stated platform: the stock multi-arch image;
    * anything else (a container backend on windows or macos): ValueError, because the
      catalogue has no image for it and the pool must name one.
    """
    backend_key = (backend or "").lower()
    if backend_key == "process":
        return PROCESS_RUNNER
    if backend_key not in CONTAINER_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected docker, podman or process")
    os_name, _, arch = (platform or "").strip().lower().partition("/")
    arch = _ARCH_ALIASES.get(arch, arch)
    if os_name in ("", "linux") and (not arch or f"linux/{arch}" in STOCK_PLATFORMS):
        return LINUX_RUNNER_IMAGE
    raise ValueError(
        f"the image catalogue has no {backend_key} image for {platform}; set the pool's image"
    )


def _stock_tag(image: str) -> str | None:
    """The tag of a reference to the stock repository ("latest" when it names none); "@"
    for a digest; None for any other repository."""
    name, at, _digest = image.partition("@")
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag: the colon, if any, was a registry's port
        repository, tag = name, "latest"
    if repository != STOCK_REPOSITORY:
        return None
    return "@" if at else tag


def docker_variant(image: str) -> str | None:
    """BACK-16: the Docker variant of a stock image tag this build publishes (itself if it
    already is one); None when the variant cannot be known: another repository, a digest,
    or a tag from another build."""
    tag = _stock_tag(image)
    if tag in STOCK_TAGS:
        return f"{STOCK_REPOSITORY}:{tag}{DOCKER_SUFFIX}"
    if tag and tag.endswith(DOCKER_SUFFIX) and tag[: -len(DOCKER_SUFFIX)] in STOCK_TAGS:
        return image
    return None


def runner_image(image: str, platform: str | None, backend: str, *, dind: bool = False) -> str:
    """The image a pool's new runner runs (SCHED-13): the pool's own, or else the catalogue's;
    for a pool that provides Docker, a stock tag of this build becomes its Docker variant
    (BACK-16) and any other reference is left as it is (BACK-17). ValueError as
    `default_image` raises it."""
    chosen = image or default_image(platform, backend)
    if dind:
        return docker_variant(chosen) or chosen
    return chosen


def docker_client_missing(image: str, platform: str | None, backend: str, dind: bool) -> str:
    """BACK-17: why a pool that provides Docker runs a stock image that may lack a Docker
    client, or "" when it does not. Only the stock repository is judged: another image is
    the operator's, and the runner's log says if it has no client (BACK-15)."""
    if not dind:
        return ""
    try:
        chosen = runner_image(image, platform, backend, dind=True)
    except ValueError:
        return ""  # no image at all: the pool's own validation says so
    tag = _stock_tag(chosen)
    if tag is None or docker_variant(chosen) is not None:
        return ""
    if tag == "@":
        return (
            f"{chosen} names one build of the stock image by digest, and whether that build "
            "has a Docker variant cannot be known"
        )
    return (
        f"{tag} is not a tag this build ({BUILD_VERSION}) publishes, so its Docker variant "
        "may not exist"
    )
