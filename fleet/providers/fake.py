"""A provider that obeys the contract in memory, and misbehaves on request (MACH-17).

The machine loop's tests and the conformance suite run against it. Each misbehaviour is one
a real provider has been seen to show: a create whose answer is lost although the machine
exists, a create that times out and appears later, a delete that answers OK while the
machine lives on, a stranger's machine carrying one of our identities but not our mark, and
a provider that is down. `creates` counts the create calls that reached it, so a test can
prove a lost answer was never followed by a second create.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from fleet.providers.contract import (
    MachineSpec,
    Mark,
    NotFound,
    Observed,
    OutcomeUnknown,
    Power,
    ProviderDown,
    Refused,
)


@dataclass
class _Held:
    observed: Observed
    bootstrap: dict[str, str]
    hidden_for: int = 0  # inspects and lists still to answer "not found" (a slow create)
    survives_deletes: int = 0  # deletes still to answer OK without deleting


class FakeProvider:
    """The contract in memory. Thread-safe: the loop and a test may call it at once."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self._machines: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self.down = False
        self.creates = 0
        self.deletes = 0
        self._lose_answers = 0
        self._slow_creates: list[int] = []
        self._lying_deletes = 0
        self.refusing = ""  # every create is refused with this, while it is set
        self.boot_as = Power.RUNNING

    # -- misbehaviour, on request -------------------------------------------------------

    def lose_next_create_answer(self) -> None:
        """The next create builds the machine, then its answer is lost."""
        self._lose_answers += 1

    def slow_next_create(self, looks: int) -> None:
        """The next create times out; the machine shows up only after `looks` inspects."""
        self._slow_creates.append(looks)

    def next_delete_lies(self, times: int = 1) -> None:
        """The next delete answers OK and the machine lives on (`times` deletes in a row)."""
        self._lying_deletes += times

    def add_foreign(self, identity: str, mark: Mark | None = None) -> None:
        """Somebody else's machine answering to `identity`, without our mark."""
        with self._lock:
            observed = Observed(identity=identity, power=Power.RUNNING, mark=mark)
            self._machines[identity] = _Held(observed, {})

    def remove_behind_our_back(self, identity: str) -> None:
        with self._lock:
            self._machines.pop(identity, None)

    def bootstrap_of(self, identity: str) -> dict[str, str]:
        with self._lock:
            return dict(self._machines[identity].bootstrap)

    def set_power(self, identity: str, power: Power) -> None:
        with self._lock:
            held = self._machines[identity]
            held.observed = replace(held.observed, power=power)

    # -- the contract --------------------------------------------------------------------

    def _check_up(self) -> None:
        if self.down:
            raise ProviderDown(f"{self.name} cannot be reached")

    def create(self, spec: MachineSpec) -> Observed:
        with self._lock:
            self._check_up()
            self.creates += 1
            if self.refusing:  # a template gone, a full cluster: it answers, and says no
                raise Refused(self.refusing)
            if spec.identity in self._machines:
                raise Refused(f"{spec.identity} exists already")
            observed = Observed(identity=spec.identity, power=self.boot_as, mark=spec.mark)
            held = _Held(observed, dict(spec.bootstrap))
            self._machines[spec.identity] = held
            if self._slow_creates:
                held.hidden_for = self._slow_creates.pop(0)
                raise OutcomeUnknown(f"the create of {spec.identity} timed out")
            if self._lose_answers:
                self._lose_answers -= 1
                raise OutcomeUnknown(f"the answer to the create of {spec.identity} was lost")
            return observed

    def inspect(self, identity: str) -> Observed | None:
        with self._lock:
            self._check_up()
            held = self._machines.get(identity)
            if held is None:
                return None
            if held.hidden_for:
                held.hidden_for -= 1
                return None
            return held.observed

    def list(self) -> list[Observed]:
        with self._lock:
            self._check_up()
            return [h.observed for h in self._machines.values() if not h.hidden_for]

    def start(self, identity: str) -> None:
        self.set_power_checked(identity, Power.RUNNING)

    def stop(self, identity: str) -> None:
        self.set_power_checked(identity, Power.STOPPED)

    def set_power_checked(self, identity: str, power: Power) -> None:
        with self._lock:
            self._check_up()
            held = self._machines.get(identity)
            if held is None:
                raise NotFound(f"no machine {identity}")
            held.observed = replace(held.observed, power=power)

    def delete(self, identity: str) -> None:
        with self._lock:
            self._check_up()
            self.deletes += 1
            if identity not in self._machines:
                raise NotFound(f"no machine {identity}")
            if self._lying_deletes:
                self._lying_deletes -= 1
                return
            del self._machines[identity]
