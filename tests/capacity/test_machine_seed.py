"""Issue 24 item 2: the NoCloud seed a rented guest reads from the controller, behind its
single-use claim code (the Proxmox provider puts the URL in the VM's SMBIOS serial)."""

from __future__ import annotations

import argparse
import json
import shlex
from datetime import timedelta

import pytest
import yaml
from django.test import Client

from capacity import machines
from fleet.actions import join_host
from fleet.agent.cli import add_arguments
from fleet.states import MachineState as M
from tests.capacity.machine_cast import (
    FACTS,
    T0,
    configure,
    machine_loop,  # noqa: F401  # the fixture
    rent,
    the_fake,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("machine_loop")]


def seed(code: str, item: str):
    return Client().get(f"/machines/seed/{code}/{item}")


def test_a_booting_guest_reads_its_seed_and_its_agent_joins_with_the_code():
    row = configure()
    machine = rent(row, M.BOOTSTRAPPING)
    code = the_fake(row).bootstrap_of(machine.name)["claim_code"]

    meta = seed(code, "meta-data")
    assert meta.status_code == 200
    assert yaml.safe_load(meta.content) == {
        "instance-id": machine.name,
        "local-hostname": machine.name,
    }
    user = seed(code, "user-data")
    text = user.content.decode()
    assert text.startswith("#cloud-config\n")
    config = yaml.safe_load(text)
    assert config == json.loads(text.split("\n", 1)[1])  # the JSON is the YAML
    (env_file,) = config["write_files"]
    assert (env_file["permissions"], env_file["content"]) == (
        "0600",
        f"ZOOMIES_CLAIM_CODE={code}\n",
    )
    (command,) = config["runcmd"]
    assert code not in " ".join(command)  # never on a command line
    agent = command[command.index("zoomies-agent") + 1 :]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(agent)
    assert (args.controller, args.name, args.backend) == (
        machines.controller_url(),
        machine.name,
        ["docker"],  # its pool's backend
    )
    assert f"--property=EnvironmentFile={env_file['path']}" in command
    assert seed(code, "vendor-data").status_code == 200
    assert shlex.join(command)  # a command a shell could run as it stands


def test_no_seed_for_an_unknown_code_another_item_or_a_machine_whose_agent_joined():
    row = configure()
    machine = rent(row, M.BOOTSTRAPPING)
    code = the_fake(row).bootstrap_of(machine.name)["claim_code"]
    assert seed("not-a-code", "meta-data").status_code == 404
    for item in ("network-config", "..%2Fetc%2Fpasswd", "user-data.bak"):
        assert seed(code, item).status_code == 404, item
    assert Client().post(f"/machines/seed/{code}/user-data").status_code == 405
    assert seed(code, "user-data").status_code == 200
    join_host(join_token=None, claim_code=code, name=machine.name, facts=FACTS,
              now=T0 + timedelta(seconds=6))  # fmt: skip
    assert seed(code, "user-data").status_code == 404  # spent with the join
