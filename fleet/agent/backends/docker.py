"""The Docker backend: each runner is a container on the host's Docker daemon.

Everything but the engine's name and address is the shared ContainerBackend (container.py):
labels, limits, the create timeout, adoption and the exit-code sentences.
"""

from __future__ import annotations

from fleet.agent.backends.container import ContainerBackend


class DockerBackend(ContainerBackend):
    name = "docker"
    engine = "Docker"
    cli = "docker"
    default_url = "unix:///var/run/docker.sock"
