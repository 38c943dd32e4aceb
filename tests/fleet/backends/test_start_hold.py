"""The start hold after a transport failure (AGENT-09, AGENT-10): time moved by hand."""

from __future__ import annotations

from fleet.agent.admission import StartHold
from fleet.agent.backends.base import BackendError
from fleet.agent.backends.container import CreateTimedOut, EngineUnavailable
from tests.fleet.agent.fakes import FakeClock


def test_agent09_the_hold_is_5_s_doubling_to_a_minute_and_a_success_clears_it():
    clock = FakeClock()
    hold = StartHold(clock)
    assert hold.remaining() == 0
    assert [hold.failed() for _ in range(6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert hold.remaining() == 60.0
    clock.advance(59)
    assert hold.remaining() == 1.0
    clock.advance(1)
    assert hold.remaining() == 0
    hold.failed()
    hold.succeeded()
    assert hold.remaining() == 0
    assert hold.failed() == 5.0  # cleared: the next failure starts from five seconds again


def test_agent10_only_a_silent_engine_is_a_transport_failure():
    """AGENT-10: a create that outran its budget, or an engine's refusal, opens no hold."""
    assert EngineUnavailable("x").transport_failure is True
    assert CreateTimedOut("x").transport_failure is False
    assert getattr(BackendError("refused"), "transport_failure", False) is False
