"""How a container backend makes a runner's image present: the pull policy each create
applies, and the background prewarm (AGENT-14, AGENT-15).

A mixin of `ContainerBackend` (container.py), which supplies the engine's client, its
error sentences, the pull policy, the dind image and the clock named below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import docker
import docker.errors
import requests.exceptions
from docker.utils import parse_repository_tag

from fleet.agent.backends.base import BackendError

PULL_ALWAYS = "always"
PULL_MISSING = "missing"
PULL_NEVER = "never"
PULL_POLICIES = (PULL_ALWAYS, PULL_MISSING, PULL_NEVER)
# AGENT-15: a successful background preparation of an image stands for this long, for
# every pool that asks; a failed one is never remembered.
PREWARM_REUSE = 60.0


class ImagePreparation:
    """prepare_image (a create's pull policy) and prewarm (a background refresh)."""

    engine: str
    pull_policy: str
    dind_image: str | None
    _clock: Callable[[], float]
    _prepared: dict[str, float]  # image -> when a prewarm last prepared it
    _prepared_lock: threading.Lock

    # ContainerBackend's: the engine's SDK client, and its sentence for a failure.
    client: Callable[[], docker.DockerClient]
    _error: Callable[[str, Exception], BackendError]

    def prepare_image(self, image: str, policy: str | None = None) -> None:
        """Make `image` present as the pull policy says: `always` pulls, `missing` pulls
        only an image the engine lacks, `never` refuses a missing one."""
        policy = policy or self.pull_policy
        api = self.client().api
        if policy != PULL_ALWAYS:
            try:
                api.inspect_image(image)  # type: ignore[no-untyped-call]  # unannotated in the stubs
                return
            except docker.errors.ImageNotFound:
                if policy == PULL_NEVER:
                    raise BackendError(
                        f"the image {image} is not on this host and the pull policy is "
                        f"'{PULL_NEVER}'"
                    ) from None
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                raise self._error(f"looking up the image {image}", exc) from exc
        repository, tag = parse_repository_tag(image)
        # A tag is always named: without one the SDK would pull every tag there is.
        if tag is None and "@" not in repository:
            tag = "latest"
        try:
            # A failure can come as an HTTP error or, once the stream started, as a line.
            for line in api.pull(repository, tag=tag, stream=True, decode=True):
                if isinstance(line, dict) and line.get("error"):
                    raise BackendError(
                        f"{self.engine} could not pull the image {image}: {line['error']}"
                    )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._error(f"pulling the image {image}", exc) from exc

    def prewarm(self, image: str | None, *, dind: bool = False) -> list[str]:
        """AGENT-14: the runner's image and, for a pool that provides Docker, this agent's
        sidecar image, each refreshed (pulled, unless the pull policy is `never`, which
        only checks it is here). AGENT-15: one prepared in the last minute, for whichever
        pool, is not asked for again; a failure is raised and not remembered. Creates do
        not read this: they apply their own pull policy whatever a prewarm did."""
        images = [image] if image else []
        if dind and self.dind_image:
            images.append(self.dind_image)
        policy = PULL_NEVER if self.pull_policy == PULL_NEVER else PULL_ALWAYS
        prepared = []
        for name in images:
            with self._prepared_lock:
                at = self._prepared.get(name)
            if at is not None and self._clock() - at < PREWARM_REUSE:
                continue
            self.prepare_image(name, policy)
            with self._prepared_lock:
                self._prepared[name] = self._clock()
            prepared.append(name)
        return prepared
