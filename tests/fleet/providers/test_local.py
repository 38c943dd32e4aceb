"""The local provider (a machine is an agent process on this host): a create cut short by a
killed controller leaves a machine that boots and joins, as a VM with its user data would."""

from __future__ import annotations

import os
import stat

import pytest

from fleet.providers import local
from fleet.providers.contract import MachineSpec, Mark, Power, Refused
from fleet.providers.local import LocalProvider

SPEC = MachineSpec(
    identity="zm-cut-short",
    mark=Mark("ctl-a"),
    bootstrap={"controller_url": "http://127.0.0.1:1", "claim_code": "zcc_one_use"},
)


@pytest.fixture
def spawned(monkeypatch) -> list[tuple[str, str]]:
    """The agent processes the provider would start, as (identity, claim code): no process."""
    calls: list[tuple[str, str]] = []

    def spawn(self, where, identity, *, claim_code):
        calls.append((identity, claim_code))

    monkeypatch.setattr(LocalProvider, "_spawn", spawn)
    return calls


def test_mach05_a_create_cut_short_before_its_agent_started_boots_with_the_claim_code(
    tmp_path, spawned
):
    """Killed between the machine's files and its agent: the loop finds it ours and stopped,
    starts it, and the agent that never joined gets the claim code it was created with."""
    provider = LocalProvider("local", root=tmp_path)
    provider.create(SPEC)
    where = tmp_path / SPEC.identity
    assert stat.S_IMODE(os.stat(where / local.USER_DATA).st_mode) == 0o600
    observed = provider.inspect(SPEC.identity)
    assert observed is not None and observed.mark == SPEC.mark
    assert observed.power is Power.STOPPED  # no process was started here
    provider.start(SPEC.identity)
    assert spawned == [(SPEC.identity, "zcc_one_use"), (SPEC.identity, "zcc_one_use")]


def test_an_agent_that_joined_starts_again_without_the_claim_code(tmp_path, spawned):
    provider = LocalProvider("local", root=tmp_path)
    provider.create(SPEC)
    (tmp_path / SPEC.identity / "agent").mkdir()
    (tmp_path / SPEC.identity / "agent" / "agent.json").write_text("{}")
    provider.start(SPEC.identity)
    assert spawned[-1] == (SPEC.identity, "")


def test_a_create_cut_short_while_its_files_were_written_leaves_no_machine(tmp_path, spawned):
    """The files are written beside the machine and renamed into place: a create killed
    half-way leaves nothing the loop would take for a machine, and the next create of that
    identity goes through."""
    provider = LocalProvider("local", root=tmp_path)
    half = tmp_path / f".{SPEC.identity}.creating"
    half.mkdir()
    (half / local.USER_DATA).write_text("zcc_stale")
    assert provider.inspect(SPEC.identity) is None and provider.list() == []
    provider.create(SPEC)
    assert not half.exists()
    assert (tmp_path / SPEC.identity / local.USER_DATA).read_text() == "zcc_one_use"
    with pytest.raises(Refused, match="exists already"):
        provider.create(SPEC)
    provider.delete(SPEC.identity)
    assert list(tmp_path.iterdir()) == []
