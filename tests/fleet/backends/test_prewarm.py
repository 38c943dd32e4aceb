"""Background image preparation on real engines (AGENT-14, AGENT-15).

No registry is reachable here, so the backends run with the pull policy `never`, under which
preparing an image is asking the engine whether it has it. Each engine call is counted on
the SDK client, so "not asked again" is what the engine saw, not what the agent says.
"""

from __future__ import annotations

from collections import Counter

import docker
import pytest

from fleet.agent.backends.base import BackendError, RunnerSpec, WorkloadStatus
from fleet.agent.backends.images import PREWARM_REUSE
from tests.fleet.backends.conftest import Engine, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counting_backend(engine: Engine, clock: Clock, **options: object):
    """A backend whose engine calls to look up or pull an image are counted."""
    calls: Counter[str] = Counter()

    def client() -> docker.DockerClient:
        made = docker.DockerClient(base_url=engine.url, version="auto", timeout=30)
        for name in ("inspect_image", "pull"):
            real = getattr(made.api, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                calls[_name] += 1
                return _real(*args, **kwargs)

            setattr(made.api, name, counted)
        return made

    return engine.backend(client_factory=client, clock=clock, **options), calls


@pytest.fixture
def sidecar_image(engine: Engine):
    """The agent's dind image: the test image under a name of its own."""
    client = engine.client()
    repository, tag = "zoomies-dind-standin", engine.image.rsplit(":", 1)[-1]
    client.api.tag(engine.image, repository, tag)
    client.close()
    return f"{repository}:{tag}"


def test_agent14_agent15_a_prewarm_prepares_both_images_and_is_reused_for_a_minute(
    engine: Engine, sidecar_image: str
):
    """AGENT-14: prewarming a pool that provides Docker prepares its runner image and the
    agent's sidecar image; AGENT-15: another pool's prewarm of the same image within the
    minute asks the engine nothing, and after it the engine is asked again."""
    clock = Clock()
    backend, calls = counting_backend(engine, clock, dind_image=sidecar_image)
    assert backend.prewarm(engine.image, dind=True) == [engine.image, sidecar_image]
    assert calls["inspect_image"] == 2

    clock.now += PREWARM_REUSE - 1
    assert backend.prewarm(engine.image) == []  # another pool, the same image
    assert backend.prewarm(engine.image, dind=True) == []
    assert calls["inspect_image"] == 2

    clock.now += 2
    assert backend.prewarm(engine.image) == [engine.image]
    assert calls["inspect_image"] == 3


def test_agent15_a_failed_preparation_is_never_cached(engine: Engine):
    """AGENT-15: a prewarm that failed is asked of the engine again at once, and succeeds
    as soon as the image is there."""
    clock = Clock()
    backend, calls = counting_backend(engine, clock)
    absent = f"zoomies-not-here:{engine.image.rsplit(':', 1)[-1]}"
    for expected in (1, 2):
        with pytest.raises(BackendError, match="not on this host"):
            backend.prewarm(absent)
        assert calls["inspect_image"] == expected
    client = engine.client()
    repository, tag = absent.split(":")
    client.api.tag(engine.image, repository, tag)
    client.close()
    assert backend.prewarm(absent) == [absent]


def test_agent15_a_create_applies_its_pull_policy_whatever_a_prewarm_did(engine: Engine):
    """AGENT-15: a create right after a successful prewarm still asks the engine for its
    image under its own pull policy; it does not lean on the prewarm."""
    clock = Clock()
    backend, calls = counting_backend(engine, clock)
    assert backend.prewarm(engine.image) == [engine.image]
    asked = calls["inspect_image"]
    spec = RunnerSpec.from_payload(
        {"runner_id": 51, "runner_name": "zoomies-test-51", "pool": "zoomies-p",
         "backend": engine.kind, "image": engine.image, "command": ["true"]}
    )  # fmt: skip
    backend.create(spec)
    assert calls["inspect_image"] == asked + 1
    wait_for(lambda: backend.inspect(51).status == WorkloadStatus.EXITED, 30, "the runner")
    backend.remove(51)
