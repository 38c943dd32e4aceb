"""The capacity_demand.* settings as one typed value, read live from the registry (CAP-01).

The entropy rule for the signing secret (CAP-02) lives on the ground floor with the
registry's validators, which import nothing above them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from zoomies_site.core import registry
from zoomies_site.core.registry.types import secret_weakness

__all__ = ["CapacityConfig", "load", "secret_weakness"]


@dataclass(frozen=True)
class CapacityConfig:
    destination_url: str
    signing_secret: str
    pools: tuple[str, ...]
    cooldown: timedelta
    interval: timedelta
    retry_backoff: timedelta
    timeout: timedelta
    claim_codes: bool
    claim_ttl: timedelta
    controller_url: str
    spawn_timeout: timedelta
    stranded_window: timedelta
    flap_grace: timedelta
    # agent.heartbeat_timeout: the silence after which the backstop reads a host as unseen,
    # as the scheduler reads it as unhealthy (ESC-18).
    heartbeat_timeout: timedelta
    provision_backoff_base: timedelta
    provision_backoff_max: timedelta
    max_consecutive_failures: int
    max_provisions: int

    @property
    def enabled(self) -> bool:
        """Publishing needs a destination and a secret that passed validation."""
        return bool(self.destination_url and self.signing_secret) and (
            secret_weakness(self.signing_secret) is None
        )


def load() -> CapacityConfig:
    def get(name: str):
        return registry.get(f"capacity_demand.{name}")

    return CapacityConfig(
        destination_url=get("destination_url"),
        signing_secret=get("signing_secret"),
        pools=tuple(get("pools") or ()),
        cooldown=get("cooldown"),
        interval=get("interval"),
        retry_backoff=get("retry_backoff"),
        timeout=get("timeout"),
        claim_codes=get("claim_codes"),
        claim_ttl=get("claim_ttl"),
        controller_url=get("controller_url"),
        spawn_timeout=get("spawn_timeout"),
        stranded_window=get("stranded_window"),
        flap_grace=get("flap_grace"),
        heartbeat_timeout=registry.get("agent.heartbeat_timeout"),
        provision_backoff_base=get("provision_backoff_base"),
        provision_backoff_max=get("provision_backoff_max"),
        max_consecutive_failures=get("max_consecutive_failures"),
        max_provisions=get("max_provisions"),
    )
