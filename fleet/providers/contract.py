"""The provider contract: what renting a machine asks of an infrastructure provider (MACH-17).

A provider creates a machine under an identity the caller chose in advance (and wrote down
before the call: MACH-04), inspects it by that identity, lists what it holds with the marks
that say who owns each, and starts, stops and deletes. That is all: no SQL, no HTTP here and
no fleet policy (how many machines, when to delete one) -- those are the machine loop's.

Ownership is proved, never assumed (MACH-16): every machine Zoomies creates carries the
controller's mark (`Mark`), set by the create itself, and a machine that answers to one of
our identities without our mark is somebody else's. `Observed.ours` says which.

Errors say whether the outcome is known (`ProviderError.outcome_known`). A refusal is known:
nothing happened, and the caller may try again later. A timeout, a dropped connection or a
provider that is down is not: the create may have happened. After an unknown outcome the
caller asks `inspect` (who owns the identity?) and never creates a second time (MACH-05, 06).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

# An identity is a provider-neutral name: lowercase letters, digits and hyphens, starting
# with a letter, at most 63 characters (a DNS label, which every provider accepts as a name).
IDENTITY = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class Power(StrEnum):
    """What the provider says a machine is doing."""

    RUNNING = "running"
    STOPPED = "stopped"
    BUSY = "busy"  # being built, cloned, started or deleted: wait and look again


@dataclass(frozen=True)
class Mark:
    """The ownership mark a provider sets on each machine Zoomies creates: this controller's
    id (one per data directory), so two controllers sharing a provider never touch each
    other's machines."""

    controller: str

    def __post_init__(self) -> None:
        if not IDENTITY.match(self.controller):
            raise ValueError(f"a mark is a lowercase DNS label, not {self.controller!r}")


@dataclass(frozen=True)
class MachineSpec:
    """What to create. `identity` is chosen by the caller before the call and is the name the
    machine is known by at the provider; `bootstrap` is what the guest's agent needs to join
    (the controller URL and a single-use claim code), handed to the guest by the provider's
    own means and never logged."""

    identity: str
    mark: Mark
    bootstrap: dict[str, str] = field(default_factory=dict, repr=False)
    size: dict[str, int] = field(default_factory=dict)  # cpus, memory_mb, disk_gb, if given

    def __post_init__(self) -> None:
        if not IDENTITY.match(self.identity):
            raise ValueError(f"an identity is a lowercase DNS label, not {self.identity!r}")


@dataclass(frozen=True)
class Observed:
    """One machine as the provider reports it now."""

    identity: str
    power: Power
    mark: Mark | None  # None: the machine carries no mark of any controller
    address: str = ""
    detail: str = ""

    def ours(self, mark: Mark) -> bool:
        return self.mark == mark


class ProviderError(Exception):
    """A call that did not do what was asked. `outcome_known` False means it may have."""

    outcome_known = True


class Refused(ProviderError):
    """The provider answered no: nothing happened (bad request, no room, no permission)."""


class OutcomeUnknown(ProviderError):
    """No answer, or one that cannot be trusted: the call may or may not have taken effect."""

    outcome_known = False


class ProviderDown(OutcomeUnknown):
    """The provider cannot be reached at all."""


class NotFound(Refused):
    """No machine answers to this identity (for start, stop and delete)."""


@runtime_checkable
class Provider(Protocol):
    """A configured provider. Every method may raise a ProviderError."""

    name: str

    def create(self, spec: MachineSpec) -> Observed:
        """Build (and start) a machine under `spec.identity`, carrying `spec.mark`.
        Refused if the identity is taken; OutcomeUnknown if the answer was lost."""
        ...

    def inspect(self, identity: str) -> Observed | None:
        """The machine answering to `identity`, ours or not; None if there is none."""
        ...

    def list(self) -> list[Observed]:
        """Every machine the provider holds that carries a mark of any controller or a
        name in our identity space, so a sweep can find what a lost create left behind."""
        ...

    def start(self, identity: str) -> None: ...

    def stop(self, identity: str) -> None: ...

    def delete(self, identity: str) -> None:
        """Ask for the machine to go. Returning is not proof that it went: only an inspect
        that cannot find it is (MACH-09)."""
        ...
