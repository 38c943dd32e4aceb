"""Issue 24 items 1-3: the Proxmox VE client and provider (MACH-18) against the fake Proxmox
(FAKE-05), over real HTTPS. The lifecycle's promises are the conformance suite's
(test_conformance.py runs it against this provider); these are Proxmox's own hazards.
After every provider test the fake's log must hold no request the schema refused."""

from __future__ import annotations

import base64
import ssl
import threading
import uuid
from urllib.parse import unquote

import httpx
import pytest

from fleet.providers.contract import (
    MachineSpec,
    Mark,
    NotFound,
    OutcomeUnknown,
    Power,
    ProviderDown,
    Refused,
)
from fleet.providers.proxmox.client import Endpoint
from fleet.providers.proxmox.fake import make_certificates
from fleet.providers.proxmox.provider import PRIVILEGES, PRIVILEGES_PVE8
from tests.fleet.providers import pve

OURS = Mark("zoomies-test-controller")


def spec(identity: str = "zm-one", code: str = "claim-code-1") -> MachineSpec:
    return MachineSpec(
        identity=identity,
        mark=OURS,
        bootstrap={"controller_url": "https://ctl.example:8443", "claim_code": code},
    )


@pytest.fixture
def strict(server):
    """The server, and afterwards: the provider sent nothing the API would refuse."""
    yield server
    assert server.fake.refused_requests() == []


def raw(server, method: str, path: str, **kwargs) -> httpx.Response:
    with httpx.Client(
        verify=ssl.create_default_context(cafile=server.certificates.ca_file)
    ) as http:
        return http.request(
            method,
            f"{server.url}/api2/json{path}",
            headers={"Authorization": f"PVEAPIToken={pve.TOKEN}"},
            **kwargs,
        )


# -- the fake (FAKE-05) ---------------------------------------------------------------------


def test_fake05_a_request_the_schema_refuses_is_400_with_proxmoxs_errors_and_logged(server):
    answer = raw(
        server, "POST", "/nodes/pve/qemu/9000/clone",
        data={"newid": "42", "name": "not_a_dns_name", "full": "maybe", "colour": "blue"},
    )  # fmt: skip
    assert answer.status_code == 400
    assert answer.reason_phrase == "Parameter verification failed."
    errors = answer.json()["errors"]
    assert answer.json()["data"] is None
    assert errors["newid"] == "value must have a minimum value of 100"
    assert errors["full"] == "type check ('boolean') failed - got 'maybe'"
    assert errors["colour"].startswith("property is not defined in schema")
    assert "DNS name" in errors["name"]
    assert server.fake.vm_named("not_a_dns_name") is None  # nothing was done
    assert [r["path"] for r in server.fake.refused_requests()] == [
        "/api2/json/nodes/pve/qemu/9000/clone"
    ]
    # A property string is checked key by key, and a missing required parameter named.
    wrong = {"net0": "virtio,bridge=vmbr0,colour=blue", "ipconfig0": "ip=10.0.0.5"}
    bad = raw(server, "POST", "/nodes/pve/qemu/9000/config", data=wrong)
    assert bad.status_code == 400
    assert set(bad.json()["errors"]) == {"net0", "ipconfig0"}
    assert raw(server, "POST", "/nodes/pve/qemu/9000/clone").json()["errors"] == {
        "newid": "property is missing and it is not optional"
    }


def test_fake05_a_bad_token_is_401_and_a_missing_privilege_is_403_by_name(server):
    with httpx.Client(
        verify=ssl.create_default_context(cafile=server.certificates.ca_file)
    ) as http:
        answer = http.get(
            f"{server.url}/api2/json/cluster/resources",
            headers={"Authorization": "PVEAPIToken=zoomies@pve!ctl=wrong"},
        )
    assert answer.status_code == 401
    server.fake.refuse_privilege("VM.Clone")
    answer = raw(server, "POST", "/nodes/pve/qemu/9000/clone", data={"newid": "100"})
    assert answer.status_code == 403
    assert answer.reason_phrase == "Permission check failed (/vms/9000, VM.Clone)"


def test_fake05_nextid_reserves_nothing_and_a_clone_is_a_task_holding_the_lock(server):
    server.fake.clone_seconds = 0.5
    first = raw(server, "GET", "/cluster/nextid").json()["data"]
    assert raw(server, "GET", "/cluster/nextid").json()["data"] == first  # not reserved
    upid = raw(server, "POST", "/nodes/pve/qemu/9000/clone",
               data={"newid": str(first), "name": "zm-a"}).json()["data"]  # fmt: skip
    assert upid.startswith("UPID:pve:") and ":qmclone:9000:zoomies@pve!ctl:" in upid
    config = raw(server, "GET", f"/nodes/pve/qemu/{first}/config").json()["data"]
    assert config["lock"] == "clone"
    refused = raw(server, "POST", f"/nodes/pve/qemu/{first}/status/start")
    assert (refused.status_code, refused.reason_phrase) == (500, "VM is locked (clone)")
    taken = raw(server, "GET", "/cluster/nextid", params={"vmid": str(first)})
    assert taken.status_code == 400 and "already exists" in taken.json()["errors"]["vmid"]
    again = raw(server, "POST", "/nodes/pve/qemu/9000/clone",
                data={"newid": str(first), "name": "zm-b"})  # fmt: skip
    assert again.status_code == 500 and "already exists" in again.reason_phrase
    server.fake.wait_task(upid)
    status = raw(server, "GET", f"/nodes/pve/tasks/{upid}/status").json()["data"]
    assert (status["status"], status["exitstatus"]) == ("stopped", "OK")
    assert "lock" not in raw(server, "GET", f"/nodes/pve/qemu/{first}/config").json()["data"]
    missing = raw(server, "GET", "/nodes/pve/qemu/4242/config")
    assert missing.status_code == 500
    assert (
        missing.reason_phrase
        == "Configuration file 'nodes/pve/qemu-server/4242.conf' does not exist"
    )


# -- the client (MACH-18) -------------------------------------------------------------------


def test_mach18_tls_is_verified_by_the_clusters_ca_or_a_pinned_fingerprint_never_off(
    strict, tmp_path
):
    other = make_certificates(tmp_path / "other")
    with pytest.raises(Refused, match="TLS verification failed"):
        pve.provider(strict, ca_file=str(other.ca_file)).inspect("zm-x")
    with pytest.raises(Refused, match="TLS verification failed"):
        pve.provider(strict, ca_file="", fingerprint=other.fingerprint).inspect("zm-x")
    assert (
        pve.provider(strict, ca_file="", fingerprint=strict.certificates.fingerprint).inspect(
            "zm-x"
        )
        is None
    )
    assert pve.provider(strict).inspect("zm-x") is None  # the cluster's CA
    # A refused certificate never saw the token: no request reached the API.
    assert len(strict.fake.requests) == 2
    with pytest.raises(ValueError, match="never off"):
        Endpoint(url=strict.url.replace("https", "http"), token=pve.TOKEN)


def test_mach18_a_timeout_is_an_unknown_outcome_and_a_closed_port_is_down(strict):
    provider = pve.provider(strict, timeout=0.5)
    strict.fake.hang_next("GET", r"/cluster/resources$", 1.5)
    with pytest.raises(OutcomeUnknown) as unknown:
        provider.inspect("zm-x")
    assert not isinstance(unknown.value, ProviderDown)
    strict.pause()
    with pytest.raises(ProviderDown, match="cannot be reached"):
        provider.inspect("zm-x")
    strict.resume()
    assert provider.inspect("zm-x") is None


def test_mach18_calls_in_flight_are_bounded_per_cluster(strict):
    provider = pve.provider(strict, max_in_flight=2)
    for _ in range(6):
        strict.fake.hang_next("GET", r"/cluster/resources$", 0.2)
    threads = [threading.Thread(target=provider.inspect, args=("zm-x",)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert strict.fake.most_at_once == 2


# -- the provider (MACH-18) -----------------------------------------------------------------


def test_mach18_a_machine_is_a_tagged_clone_in_our_pool_with_cloud_init_and_its_seed(strict):
    provider = pve.provider(strict, full_clone=True, storage="local-lvm", cores=4)
    observed = provider.create(spec())
    assert (observed.power, observed.mark) == (Power.RUNNING, OURS)
    assert observed.address.startswith("10.0.") and "guest agent up" in observed.detail
    vm = strict.fake.vm_named("zm-one")
    assert (vm.pool, vm.status, vm.config["tags"]) == ("zoomies", "running", OURS.controller)
    assert vm.config["cores"] == "4" and vm.config["ciuser"] == "runner"
    assert vm.config["ipconfig0"] == "ip=dhcp" and vm.config["net0"] == "virtio,bridge=vmbr0"
    assert unquote(vm.config["sshkeys"]).startswith("ssh-ed25519 AAAA")
    assert "%20" in vm.config["sshkeys"]
    # The claim code reaches the guest without snippet storage: a NoCloud seed URL, beside
    # the system UUID PVE gave the clone (smbios1 is one value: a write must keep it).
    assert "base64=1" in vm.config["smbios1"]
    assert vm.config["smbios1"].startswith(f"uuid={uuid.UUID(int=vm.vmid)},serial=")
    assert strict.fake.seed_of(vm) == "https://ctl.example:8443/machines/seed/claim-code-1/"
    clone = next(r for r in strict.fake.requests if r["path"].endswith("/clone"))
    assert (
        clone["params"] | {"full": "1", "storage": "local-lvm", "pool": "zoomies"}
        == (clone["params"])
    )
    provider.stop("zm-one")
    assert provider.inspect("zm-one").power == Power.STOPPED
    provider.start("zm-one")
    assert provider.inspect("zm-one").power == Power.RUNNING
    provider.delete("zm-one")
    assert provider.inspect("zm-one") is None
    delete = next(r for r in strict.fake.requests if r["method"] == "DELETE")
    assert delete["params"] == {"purge": "1", "destroy-unreferenced-disks": "1"}


def test_mach18_the_vm_goes_on_the_node_with_room_and_a_full_cluster_refuses(strict):
    strict.fake.nodes.update({"pve": 1024, "pve2": 65536})  # the template's node is small
    provider = pve.provider(strict, memory_mb=2048)
    provider.create(spec())
    assert strict.fake.vm_named("zm-one").node == "pve2"
    with pytest.raises(Refused, match="no node has room for 262144 MiB"):
        pve.provider(strict, memory_mb=262144).create(spec("zm-two"))
    assert strict.fake.vm_named("zm-two") is None


def test_mach18_a_lost_clone_answer_is_finished_by_its_id_never_cloned_again(strict):
    strict.fake.clone_seconds = 0.6
    strict.fake.lose_next("POST", r"/clone$")  # the clone runs; its answer never comes
    provider = pve.provider(strict)
    with pytest.raises(OutcomeUnknown):
        provider.create(spec())
    busy = provider.inspect("zm-one")  # still cloning, untagged: ours by the id we asked for
    assert (busy.power, busy.mark) == (Power.BUSY, OURS)
    strict.fake.wait_task(next(iter(t for t in strict.fake.tasks if ":qmclone:" in t)))
    done = provider.inspect("zm-one")  # the configuration the create never applied
    assert (done.power, done.mark) == (Power.RUNNING, OURS)
    assert strict.fake.vm_named("zm-one").config["tags"] == OURS.controller
    assert strict.fake.count("POST", r"/clone$") == 1


def test_mach18_two_callers_given_the_same_nextid_each_end_with_their_own_vm(strict):
    provider = pve.provider(strict)
    strict.fake.faults.nextid_repeats = 1  # the second caller is proposed the first's id
    provider.create(spec("zm-one"))
    provider.create(spec("zm-two"))
    one, two = strict.fake.vm_named("zm-one"), strict.fake.vm_named("zm-two")
    assert one.vmid != two.vmid and one.config["tags"] == two.config["tags"] == OURS.controller
    clones = [r for r in strict.fake.requests if r["path"].endswith("/clone")]
    assert [c["params"]["newid"] for c in clones] == [str(one.vmid)] * 2 + [str(two.vmid)]
    assert [c["status"] for c in clones] == [200, 500, 200]


def test_mach18_a_lock_timeout_on_parallel_clones_of_one_template_is_retried(strict):
    strict.fake.clone_seconds = 1.3  # each clone holds the template's lock this long
    provider = pve.provider(strict, clones_per_template=2)
    errors: list[Exception] = []

    def create(identity: str) -> None:
        try:
            provider.create(spec(identity))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in ("zm-one", "zm-two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    clones = [r for r in strict.fake.requests if r["path"].endswith("/clone")]
    assert [c["status"] for c in clones].count(500) >= 1  # one waited out the lock and lost
    assert all(strict.fake.vm_named(n).status == "running" for n in ("zm-one", "zm-two"))


def test_mach18_one_clone_per_template_at_a_time_never_meets_the_lock(strict):
    strict.fake.clone_seconds = 1.3
    provider = pve.provider(strict, clones_per_template=1)
    threads = [
        threading.Thread(target=provider.create, args=(spec(n),)) for n in ("zm-one", "zm-two")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    clones = [r for r in strict.fake.requests if r["path"].endswith("/clone")]
    assert [c["status"] for c in clones] == [200, 200]


def test_mach18_a_delete_answered_ok_while_the_vm_remains_is_not_proof(strict):
    provider = pve.provider(strict)
    provider.create(spec())
    strict.fake.faults.lying_deletes = 1
    provider.delete("zm-one")  # the task ends OK
    assert provider.inspect("zm-one") is not None  # and the VM is still there
    provider.delete("zm-one")
    assert provider.inspect("zm-one") is None


def test_mach18_a_foreign_vm_with_our_name_but_not_our_tag_is_never_touched(strict):
    strict.fake.add_vm(5000, name="zm-one", status="running", pool="zoomies", tags="ci")
    provider = pve.provider(strict)
    observed = provider.inspect("zm-one")
    assert observed.mark is None and observed.power == Power.RUNNING
    for act in (provider.delete, provider.stop, provider.start):
        with pytest.raises(Refused, match="carries no mark of ours"):
            act("zm-one")
    with pytest.raises(Refused, match="exists already"):
        provider.create(spec("zm-one"))
    # Our tag outside our pool is not ours either; another controller's mark is reported.
    strict.fake.add_vm(5001, name="zm-two", tags=OURS.controller)
    strict.fake.add_vm(5002, name="zm-three", pool="zoomies", tags="zoomies-someone-else")
    assert provider.inspect("zm-two").mark is None
    assert provider.inspect("zm-three").mark == Mark("zoomies-someone-else")
    writes = [r for r in strict.fake.requests if r["method"] != "GET"]
    assert writes == []
    assert strict.fake.vm_named("zm-one").status == "running"


def test_mach18_a_missing_privilege_is_named_and_nothing_is_left_behind(strict):
    provider = pve.provider(strict)
    assert provider.missing_privileges() == []
    strict.fake.refuse_privilege("VM.Config.HWType")  # the smbios1 seed cannot be set
    assert provider.missing_privileges() == ["VM.Config.HWType"]
    with pytest.raises(Refused, match="VM.Config.HWType"):
        provider.create(spec())
    assert strict.fake.vm_named("zm-one") is None  # the untagged clone was removed


def test_mach18_a_failed_clone_task_is_refused_and_leaves_no_vm(strict):
    strict.fake.faults.failing_tasks.append(("qmclone", "clone failed: storage full"))
    with pytest.raises(Refused, match="storage full"):
        pve.provider(strict).create(spec())
    assert strict.fake.vm_named("zm-one") is None
    with pytest.raises(NotFound):
        pve.provider(strict).delete("zm-one")


def test_mach18_the_seed_url_carries_the_code_percent_encoded():
    """The serial is base64 (smbios1 base64=1) of `ds=nocloud;s=<controller>/machines/seed/
    <code>/`; a code with URL-special characters stays one path segment."""
    from fleet.providers.proxmox.provider import ProxmoxConfig, ProxmoxProvider  # noqa: PLC0415

    provider = ProxmoxProvider("x", client=None, config=ProxmoxConfig(template=9000))  # type: ignore[arg-type]
    url = provider.seed_url(spec(code="a/b+c"))
    assert url == "https://ctl.example:8443/machines/seed/a%2Fb%2Bc/"
    assert base64.b64decode(base64.b64encode(url.encode())).decode() == url


# -- issue 24: what the fakepve cross-check found (scripts/fakepve_crosscheck.py) -----------


def test_mach18_pve9s_guest_agent_privilege_is_asked_for_and_pve8s_counts_the_same(strict):
    """PVE 9 dropped VM.Monitor for VM.GuestAgent.Audit: the provider asks for the new
    name, and a PVE 8 token holding the old one lacks nothing."""
    provider = pve.provider(strict)
    assert "VM.GuestAgent.Audit" in PRIVILEGES and "VM.Monitor" not in PRIVILEGES
    assert "VM.Monitor" in PRIVILEGES_PVE8 and "VM.GuestAgent.Audit" not in PRIVILEGES_PVE8
    strict.fake.refuse_privilege("VM.GuestAgent.Audit")
    strict.fake.refuse_privilege("VM.GuestAgent.Unrestricted")
    assert provider.missing_privileges() == ["VM.GuestAgent.Audit"]
    strict.fake.tokens[pve.TOKEN_ID][1].add("VM.Monitor")  # as a PVE 8 role grants it
    assert provider.missing_privileges() == []


def test_mach18_a_guest_agent_the_token_may_not_ask_is_said_not_booting(strict):
    """A 403 from the guest agent is a missing privilege, not a guest still booting."""
    strict.fake.refuse_privilege("VM.GuestAgent.Audit")
    strict.fake.refuse_privilege("VM.GuestAgent.Unrestricted")
    observed = pve.provider(strict).create(spec())
    assert observed.address == "" and "guest agent not asked" in observed.detail
    assert "VM.GuestAgent.Audit" in observed.detail and "not up yet" not in observed.detail


def test_mach18_a_clone_joins_its_pool_only_as_it_ends_and_is_ours_meanwhile(strict):
    """PVE adds a clone to its pool when the clone worker ends: a lost clone answer's VM
    is in no pool while it copies, and is still recognised as ours by the id asked for."""
    strict.fake.clone_seconds = 0.6
    strict.fake.lose_next("POST", r"/clone$")
    provider = pve.provider(strict)
    with pytest.raises(OutcomeUnknown):
        provider.create(spec())
    assert strict.fake.vm_named("zm-one").pool == ""  # copying: in no pool yet
    busy = provider.inspect("zm-one")
    assert (busy.power, busy.mark) == (Power.BUSY, OURS)
    assert [o.identity for o in provider.list()] == []  # list() claims nothing unproved


def test_mach18_a_token_that_cannot_see_node_memory_is_told_so(strict):
    strict.fake.refuse_privilege("Sys.Audit")
    with pytest.raises(Refused, match=r"memory not visible \(does the token lack Sys.Audit\?\)"):
        pve.provider(strict).create(spec())
