"""A rented Proxmox VM, end to end, on one box (issue 24's acceptance): a queued job on an
empty fleet with a Proxmox provider configured clones a VM from the template in the fake
cluster over HTTPS, starts it, and the fake boots its guest: a local agent process given the
claim code the provider put in the VM's NoCloud seed (its SMBIOS serial, no snippet storage).
That agent joins as the machine's host, the job runs on it, the machine idles, drains, and
its VM is stopped and purged. The fake checked every request against the API description:
none was one Proxmox would refuse."""

from __future__ import annotations

import json

import pytest

from fleet.providers.local import LocalProvider
from fleet.providers.proxmox.fake import FakeProxmox, FakeProxmoxServer
from tests.e2e.harness import wait_for
from tests.e2e.test_first_job import LABELS, POOL, setup_fleet
from tests.e2e.test_machines import MACHINE_ENV, agents_running, machines
from tests.fleet.providers import pve

# What it proves is the provider and the loop, the same on either database: one pass is enough.
# Over 20 s of a worker: .ci/run's slow pass runs it, after the test command.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.slow]


@pytest.fixture
def cluster(e2e):
    controller, _fake = e2e
    # The guests are the VMs' insides: agent processes under the controller's data dir, so
    # the harness's leftover sweep finds any that outlive the test.
    guests = LocalProvider("pve-guests", root=controller.data_dir / "machines", capacity=2)
    fake = FakeProxmox(token=pve.TOKEN_ID, secret=pve.SECRET, guests=guests, **pve.FAST)
    server = FakeProxmoxServer(fake, certificates=pve.certificates()).start()
    yield server
    server.stop()


def test_mach18_a_job_on_an_empty_fleet_rents_a_proxmox_vm_whose_guest_joins_and_runs_it(
    e2e, cluster
):
    """MACH-18, FAKE-05 end to end: clone, configure (the seed), start; the guest's agent
    joins with its claim code as the machine's host; the job runs there; idle, the machine
    drains and its VM is deleted with purge; no request the schema refuses."""
    controller, fake = e2e
    config = pve.config(cluster, poll_interval=0.05, timeout=10.0)
    controller.env.update(MACHINE_ENV)
    setup_fleet(controller, fake)
    controller.manage(
        "shell",
        "-c",
        "import json; from django.utils import timezone; "
        "from fleet.models import MachineProvider; "
        "MachineProvider.objects.create(name='pve', kind='proxmox', pools=['zoomies-e2e'], "
        "max_machines=1, max_per_pool=1, slots_per_machine=2, "
        f"config=json.loads({json.dumps(json.dumps(config))}), created_at=timezone.now())",
    )
    controller.start("--no-agent")
    controller.api("pools", method="POST", json=POOL)
    job = fake.queue_job(repo="acme/app", labels=LABELS, duration=2)

    wait_for(lambda: fake.job(job)["status"] == "completed", 180, "the job to run on a VM")
    ((name, _state),) = machines(controller)
    vm = cluster.fake.vm_named(name)
    assert vm is not None and vm.config.get("tags") and vm.pool == "zoomies", vm  # ours
    assert name in {h["name"] for h in controller.api("hosts")}  # joined as the machine
    assert fake.job(job)["runner_name"], "the job ran on a runner"

    wait_for(lambda: machines(controller) == [(name, "deleted")], 120, "the VM given back")
    assert cluster.fake.vm_named(name) is None, "the VM is still in the cluster"
    assert [v.vmid for v in cluster.fake.vms.values()] == [9000], "only the template is left"
    wait_for(lambda: agents_running(controller) == 0, 30, "no guest agent left")
    assert cluster.fake.refused_requests() == [], cluster.fake.refused_requests()
    deletes = [r for r in cluster.fake.requests if r["method"] == "DELETE"]
    assert deletes and all(r["params"].get("purge") == "1" for r in deletes), deletes
    log = controller.log()
    assert "Traceback" not in log, log
