"""Issue 24 item 4: Proxmox onboarding (MACH-20..24). A setup is started through the API,
its enrollment script runs with `sh` against shims of `pveum`, `hostname` and `curl`, what it
sends is replayed to the enroll route, discovery asks the fake Proxmox over real HTTPS with
the staged token, and the save makes the provider and spends the setup."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import AuditLog
from capacity import machines
from fleet.models import AgentTask, Host, JoinToken, Machine, MachineProvider, ProviderSetup
from fleet.providers.proxmox.fake import make_certificates
from fleet.providers.proxmox.provider import PRIVILEGES, PRIVILEGES_PVE8, ProxmoxProvider
from runners.housekeeping import housekeeping_step
from tests.accounts.conftest import client_for
from tests.fleet.providers import pve
from zoomies_site.core import sealing

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("registry_defaults")]


@pytest.fixture
def api(admin):
    return client_for(admin)


def start(api, name: str = "pve-a") -> dict:
    answer = api.post("/api/v1/provider-setups", {"name": name}, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


def enrollment(server, **overrides) -> dict:
    return {
        "endpoint": server.url,
        "ca_pem": server.certificates.ca_file.read_text(),
        "token_id": pve.TOKEN_ID,
        "secret": pve.SECRET,
        **overrides,
    }


def enroll(capability: str, body, *, raw: bytes | None = None):
    """The hypervisor's POST: no session, and CSRF checks on (the route must not need one)."""
    data = raw if raw is not None else json.dumps(body).encode()
    return Client(enforce_csrf_checks=True).post(
        f"/machines/setup/{capability}/enroll", data, content_type="application/json"
    )


def enrolled(api, server, name: str = "pve-a", **overrides) -> dict:
    started = start(api, name)
    answer = enroll(started["capability"], enrollment(server, **overrides))
    assert answer.status_code == 200, answer.content
    return started


# -- MACH-20: a staged connection behind a short-lived capability --------------------------


def test_mach20_a_setup_keeps_only_its_capabilitys_hash_and_lives_thirty_minutes(
    api, registry_defaults
):
    registry_defaults.set("server.public_url", "https://zoomies.example:8443")
    before = timezone.now()
    started = start(api)
    assert set(started) == {"id", "name", "capability", "expires_at", "command"}
    capability = started["capability"]
    assert started["command"] == (
        f"curl -fsS https://zoomies.example:8443/machines/setup/{capability}/script | sh"
    )
    row = ProviderSetup.objects.get(pk=started["id"])
    assert row.name == "pve-a" and not row.ready
    assert row.capability_hash == hashlib.sha256(capability.encode()).hexdigest()
    assert capability not in json.dumps(list(ProviderSetup.objects.values()), default=str)
    assert (
        before + timedelta(minutes=30) <= row.expires_at <= timezone.now() + timedelta(minutes=30)
    )
    shown = api.get(f"/api/v1/provider-setups/{row.pk}").json()
    assert capability not in json.dumps(shown)
    (audited,) = AuditLog.objects.filter(action="provider_setup.start")
    assert audited.actor == "user:ada" and capability not in json.dumps(audited.detail)


def test_mach20_a_setup_is_named_as_a_new_provider_would_be(api):
    MachineProvider.objects.create(name="taken", kind="fake", created_at=timezone.now())
    for name in ("taken", "Not_A_Label", ""):
        answer = api.post("/api/v1/provider-setups", {"name": name}, format="json")
        assert answer.status_code == 400 and "name" in answer.json(), answer.content
    assert not ProviderSetup.objects.exists()


def test_mach20_the_token_secret_is_sealed_at_rest(api, server):
    started = enrolled(api, server)
    row = ProviderSetup.objects.get(pk=started["id"])
    assert row.ready and row.token_id == pve.TOKEN_ID and row.endpoint == server.url
    assert row.token_sealed.startswith("v1:")
    assert sealing.unseal_text(row.token_sealed) == pve.SECRET
    assert pve.SECRET not in json.dumps(list(ProviderSetup.objects.values()), default=str)


def test_mach20_an_expired_setup_is_refused_everywhere_and_purged_by_housekeeping(api, server):
    started = start(api)
    ready = enrolled(api, server, name="pve-b")
    ProviderSetup.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    capability = started["capability"]
    assert api.get(f"/machines/setup/{capability}/script").status_code == 404
    assert enroll(capability, enrollment(server)).status_code == 404
    assert api.get(f"/api/v1/provider-setups/{started['id']}").status_code == 404
    assert api.post(f"/api/v1/provider-setups/{ready['id']}/discover").status_code == 404

    lines = housekeeping_step(timezone.now()).lines
    assert not ProviderSetup.objects.exists()
    assert any(f"its token {pve.TOKEN_ID} is left on the cluster" in line for line in lines)
    assert AuditLog.objects.filter(action="provider_setup.expired").count() == 2


# -- MACH-21: the command on the hypervisor ------------------------------------------------

PVEUM = r"""#!/bin/sh
{ printf '%s\t' "$@"; printf '\n'; } >> "$SHIM_LOG/pveum.log"
case "$1 $2" in
  "user list") [ -n "${SHIM_EXISTING:-}" ] && echo '[{"userid":"zoomies@pve"}]' || echo '[]' ;;
  "role list") [ -n "${SHIM_EXISTING:-}" ] && echo '[{"roleid":"ZoomiesProvider"}]' || echo '[]' ;;
  "user token")
    printf '{"full-tokenid":"%s!%s","info":{"privsep":1},"value":"%s"}\n' \
      "$4" "$5" "$SHIM_SECRET" ;;
esac
"""
HOSTNAME = '#!/bin/sh\n[ "$1" = -f ] && echo pve1.example.com || echo pve1\n'
CURL = r"""#!/bin/sh
printf '%s\n' "$@" > "$SHIM_LOG/curl.args"
cat > "$SHIM_LOG/curl.body"
echo '{"detail": "enrolled"}'
"""
SHIM_SECRET = "0b6c3e1a-5f0e-4c9e-9b7d-2a4f6d8e1c35"


def run_script(api, capability: str, tmp_path: Path, server, shims=(), **env: str):
    """Fetch the script as `curl | sh` would and run it with `sh` in a temp dir, shims
    first on PATH and the fake's CA where /etc/pve would hold it."""
    fetched = Client().get(f"/machines/setup/{capability}/script")
    assert fetched.status_code == 200, fetched.content
    assert fetched["Content-Type"].startswith("text/x-shellscript")
    bin_dir, log, pve_dir = tmp_path / "bin", tmp_path / "log", tmp_path / "etc-pve"
    for path in (bin_dir, log, pve_dir):
        path.mkdir(exist_ok=True)
    for name, body in (("pveum", PVEUM), ("hostname", HOSTNAME), ("curl", CURL), *shims):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (pve_dir / "pve-root-ca.pem").write_bytes(server.certificates.ca_file.read_bytes())
    script = tmp_path / "enroll.sh"
    script.write_bytes(fetched.content)
    done = subprocess.run(
        ["sh", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_LOG": str(log),
             "SHIM_SECRET": SHIM_SECRET, "ZOOMIES_PVE_DIR": str(pve_dir), **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = (log / "pveum.log").read_text().splitlines()
    commands = [line.rstrip("\t").split("\t") for line in lines]
    curl = (log / "curl.args").read_text().splitlines()
    return commands, curl, (log / "curl.body").read_bytes(), done.stdout


def test_mach21_the_script_makes_a_privsep_token_with_exactly_the_providers_privileges(
    api, server, tmp_path
):
    started = start(api)
    commands, curl, body, stdout = run_script(
        api, started["capability"], tmp_path, server, ZOOMIES_PVE_ENDPOINT=server.url
    )
    assert commands[0][:2] == ["user", "list"]
    assert commands[1][:3] == ["user", "add", "zoomies@pve"]
    assert commands[2][:2] == ["role", "list"]
    (role_add,) = [c for c in commands if c[:2] == ["role", "add"]]
    assert role_add[2] == "ZoomiesProvider" and role_add[3] == "--privs"
    granted = role_add[4].split()
    assert sorted(granted) == sorted(PRIVILEGES) and len(granted) == len(set(granted))
    (token_add,) = [c for c in commands if c[:3] == ["user", "token", "add"]]
    assert token_add[3] == "zoomies@pve" and token_add[4].startswith("zoomies-pve-a-")
    assert token_add[token_add.index("--privsep") + 1] == "1"
    assert token_add[token_add.index("--output-format") + 1] == "json"
    token_id = f"zoomies@pve!{token_add[4]}"
    acls = [c for c in commands if c[:2] == ["acl", "modify"]]
    assert acls == [
        ["acl", "modify", "/", "--users", "zoomies@pve", "--roles", "ZoomiesProvider"],
        ["acl", "modify", "/", "--tokens", token_id, "--roles", "ZoomiesProvider"],
    ]
    # The secret is never on a command line: only in curl's stdin.
    assert not any(SHIM_SECRET in " ".join(c) for c in commands) and SHIM_SECRET not in curl
    url = curl[-1]
    assert url == f"http://testserver/machines/setup/{started['capability']}/enroll"
    assert ["-X", "POST"] == curl[curl.index("-X") : curl.index("-X") + 2]
    assert "Content-Type: application/json" in curl
    sent = json.loads(body)
    assert sent == {
        "endpoint": server.url, "ca_pem": server.certificates.ca_file.read_text(),
        "fingerprint": "", "token_id": token_id, "secret": SHIM_SECRET,
    }  # fmt: skip
    assert f"enrolled with token {token_id}" in stdout

    # What curl would have posted, replayed to the route it names: the setup is ready, and
    # the token (as the cluster now holds it, with the role's privileges) discovers cleanly.
    answer = enroll(urlsplit(url).path.split("/")[3], None, raw=body)
    assert answer.status_code == 200, answer.content
    server.fake.add_token(token_id, SHIM_SECRET, set(granted))
    discovered = api.post(f"/api/v1/provider-setups/{started['id']}/discover")
    assert discovered.status_code == 200, discovered.content
    assert discovered.json()["missing_privileges"] == []
    assert discovered.json()["nodes"][0]["maxmem"] > 0  # Sys.Audit: a node's memory shows
    # Spent: the script is not served again, and a second enrollment is a conflict.
    assert Client().get(f"/machines/setup/{started['capability']}/script").status_code == 404
    assert enroll(started["capability"], None, raw=body).status_code == 409


def test_mach21_a_rerun_keeps_the_user_and_role_and_defaults_to_the_nodes_name(
    api, server, tmp_path
):
    started = start(api)
    commands, _curl, body, _ = run_script(api, started["capability"], tmp_path, server,
                                          SHIM_EXISTING="1")  # fmt: skip
    assert not [c for c in commands if c[:2] in (["user", "add"], ["role", "add"])]
    (modify,) = [c for c in commands if c[:2] == ["role", "modify"]]
    assert sorted(modify[4].split()) == sorted(PRIVILEGES)
    assert json.loads(body)["endpoint"] == "https://pve1.example.com:8006"


def test_mach21_on_pve8_the_role_names_vm_monitor_where_pve9_names_the_guest_agents(
    api, server, tmp_path
):
    """PVE 8 has no VM.GuestAgent.Audit and refuses a role naming it; PVE 9 has no
    VM.Monitor. The script asks `pveversion` which it is on."""
    started = start(api)
    pve8 = (
        "pveversion",
        "#!/bin/sh\necho 'pve-manager/8.3.0/c1689ccb1065a83b (running kernel: 6.8.12-4-pve)'\n",
    )
    commands, *_ = run_script(api, started["capability"], tmp_path, server, shims=[pve8])
    (added,) = [c for c in commands if c[:2] == ["role", "add"]]
    assert sorted(added[4].split()) == sorted(PRIVILEGES_PVE8)
    assert "VM.Monitor" in added[4] and "VM.GuestAgent.Audit" not in added[4]


def test_mach21_the_enroll_route_says_what_is_wrong_and_never_answers_500(api, server):
    capability = start(api)["capability"]
    assert enroll(capability, None, raw=b"{not json").status_code == 400
    good = enrollment(server)
    for body, field in (
        ([1, 2], "detail"),
        ({**good, "endpoint": "http://pve:8006"}, "endpoint"),
        ({**good, "endpoint": "https://pve:8006/api2/json"}, "endpoint"),
        ({**good, "endpoint": "https://pve:99999"}, "endpoint"),
        ({**good, "ca_pem": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"},
         "ca_pem"),
        ({**good, "ca_pem": ""}, "ca_pem"),
        ({**good, "fingerprint": "12:34"}, "fingerprint"),
        ({**good, "token_id": "zoomies@pve"}, "token_id"),
        ({**good, "secret": 42}, "secret"),
        ({**good, "secret": "has space in it"}, "secret"),
        ({**good, "colour": "blue"}, "colour"),
    ):  # fmt: skip
        answer = enroll(capability, body)
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json() and answer.json()["detail"], answer.content
    assert not ProviderSetup.objects.get().ready
    assert enroll("no-such-capability", good).status_code == 404
    assert Client().get("/machines/setup/no-such-capability/script").status_code == 404
    assert Client().get(f"/machines/setup/{capability}/enroll").status_code == 405
    assert enroll(capability, good).status_code == 200
    assert enroll(capability, good).status_code == 409
    (audited,) = AuditLog.objects.filter(action="provider_setup.enroll")
    assert audited.actor == f"enrollment:{pve.TOKEN_ID}" and pve.SECRET not in str(audited.detail)


# -- MACH-22: the browser polls name, endpoint, readiness; the server discovers ----------


def test_mach22_the_browser_sees_only_name_endpoint_and_readiness(api, server):
    started = start(api)
    path = f"/api/v1/provider-setups/{started['id']}"
    waiting = api.get(path).json()
    assert waiting == {"id": started["id"], "name": "pve-a", "endpoint": "", "ready": False,
                       "expires_at": waiting["expires_at"]}  # fmt: skip
    assert enroll(started["capability"], enrollment(server)).status_code == 200
    answer = api.get(path)
    assert answer.json()["ready"] is True and answer.json()["endpoint"] == server.url
    assert set(answer.json()) == {"id", "name", "endpoint", "ready", "expires_at"}
    for secret in (started["capability"], pve.SECRET, pve.TOKEN_ID):
        assert secret not in answer.content.decode()


def test_mach22_discovery_runs_on_the_server_with_the_staged_token_and_ca(api, server):
    started = enrolled(api, server)
    answer = api.post(f"/api/v1/provider-setups/{started['id']}/discover")
    assert answer.status_code == 200, answer.content
    found = answer.json()
    assert [n["node"] for n in found["nodes"]] == ["pve"]
    assert found["templates"] == [{"vmid": 9000, "name": "runner-template", "node": "pve"}]
    assert {s["storage"] for s in found["storages"]} == {"local", "local-lvm"}
    assert found["pools"] == [{"pool": "zoomies", "comment": "runner hosts"}]
    assert found["missing_privileges"] == []
    assert server.fake.refused_requests() == []
    assert pve.SECRET not in answer.content.decode()
    (audited,) = AuditLog.objects.filter(action="provider_setup.discover")
    assert audited.detail == {"endpoint": server.url, "outcome": "ok"}

    server.fake.refuse_privilege("Datastore.Audit")
    again = api.post(f"/api/v1/provider-setups/{started['id']}/discover").json()
    assert again["missing_privileges"] == ["Datastore.Audit"] and again["storages"] == []


def test_mach22_a_pinned_fingerprint_is_enough(api, server):
    started = enrolled(api, server, ca_pem="", fingerprint=server.certificates.fingerprint)
    assert api.post(f"/api/v1/provider-setups/{started['id']}/discover").status_code == 200


def test_mach22_discovery_failures_are_a_502_with_the_reason_never_a_500(api, server, tmp_path):
    waiting = start(api, "pve-w")
    assert api.post(f"/api/v1/provider-setups/{waiting['id']}/discover").status_code == 409
    other_ca = make_certificates(tmp_path / "other").ca_file.read_text()
    cases = (
        ("pve-c", {"ca_pem": other_ca}, "certificate"),
        ("pve-t", {"secret": "11111111-2222-3333-4444-555555555555"}, "token_refused"),
    )
    for name, overrides, reason in cases:
        started = enrolled(api, server, name=name, **overrides)
        seen = len(server.fake.requests)
        answer = api.post(f"/api/v1/provider-setups/{started['id']}/discover")
        assert answer.status_code == 502, answer.content
        assert answer.json()["reason"] == reason and answer.json()["detail"]
        if reason == "certificate":  # the token never reached a server we do not trust
            assert len(server.fake.requests) == seen
    down = enrolled(api, server, name="pve-d")
    server.stop()
    answer = api.post(f"/api/v1/provider-setups/{down['id']}/discover")
    assert answer.status_code == 502 and answer.json()["reason"] == "unreachable"
    outcomes = AuditLog.objects.filter(action="provider_setup.discover").values_list(
        "detail__outcome", flat=True
    )
    assert sorted(outcomes) == ["certificate", "token_refused", "unreachable"]


# -- MACH-23: saving the provider spends the setup ------------------------------------------

SAVE = {
    "kind": "proxmox", "pools": ["zoomies-linux-x64"], "max_machines": 3, "max_per_pool": 2,
    "slots_per_machine": 1, "config": {"template": 9000, "pool": "zoomies", "bridge": "vmbr0"},
}  # fmt: skip


def test_mach23_saving_seals_the_token_in_the_provider_and_deletes_the_setup(api, server):
    started = enrolled(api, server)
    answer = api.post("/api/v1/providers", {**SAVE, "name": "pve-a", "setup": started["id"]},
                      format="json")  # fmt: skip
    assert answer.status_code == 201, answer.content
    assert not ProviderSetup.objects.exists()
    shown = answer.json()
    assert shown["kind"] == "proxmox" and "setup" not in shown
    assert shown["config"]["template"] == 9000 and shown["config"]["endpoint"] == server.url
    assert "token_sealed" not in shown["config"] and "token" not in shown["config"]
    row = MachineProvider.objects.get(name="pve-a")
    assert row.config["token_sealed"].startswith("v1:")
    assert pve.SECRET not in json.dumps(row.config)
    for text in (answer.content.decode(), api.get(f"/api/v1/providers/{row.pk}").content.decode(),
                 api.get("/api/v1/providers").content.decode()):  # fmt: skip
        assert pve.SECRET not in text and row.config["token_sealed"] not in text
    (audited,) = AuditLog.objects.filter(action="provider.create")
    assert audited.detail["setup"] == started["id"] and pve.SECRET not in str(audited.detail)

    # The machine loop's provider opens the sealed token in memory and reaches the cluster.
    built = machines._build(row)
    assert isinstance(built, ProxmoxProvider)
    try:
        assert built.missing_privileges() == []
    finally:
        built.client.close()
    again = api.post("/api/v1/providers", {**SAVE, "name": "pve-b", "setup": started["id"]},
                     format="json")  # fmt: skip
    assert again.status_code == 400 and "setup" in again.json()


def test_mach23_a_proxmox_provider_needs_its_ready_setup_or_a_token_file(api, server, tmp_path):
    waiting = start(api, "pve-w")
    ready = enrolled(api, server, name="pve-r")
    for body, field in (
        ({**SAVE, "name": "pve-x"}, "config"),  # neither a setup nor a token_file
        ({**SAVE, "name": "pve-w", "setup": waiting["id"]}, "setup"),  # not enrolled
        ({**SAVE, "name": "pve-other", "setup": ready["id"]}, "setup"),  # another's
        ({**SAVE, "name": "pve-r", "setup": ready["id"],
          "config": {"template": 9000, "token": pve.TOKEN}}, "config"),
        ({**SAVE, "name": "pve-r", "setup": ready["id"],
          "config": {"template": 9000, "endpoint": "https://elsewhere:8006"}}, "config"),
        ({**SAVE, "name": "pve-r", "setup": ready["id"], "config": {"template": "9000"}},
         "config"),
        ({**SAVE, "name": "pve-r", "setup": ready["id"],
          "config": {"template": 9000, "mark_prefix": "x"}}, "config"),
        ({**SAVE, "kind": "fake", "config": {}, "name": "f", "setup": ready["id"]}, "setup"),
    ):  # fmt: skip
        answer = api.post("/api/v1/providers", body, format="json")
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json(), answer.content
    assert ProviderSetup.objects.count() == 2 and not MachineProvider.objects.exists()

    token_file = tmp_path / "pve-token"
    token_file.write_text(pve.TOKEN + "\n")
    by_hand = {**SAVE, "name": "pve-h", "config": {
        "template": 9000, "endpoint": server.url, "token_file": str(token_file),
        "ca_file": str(server.certificates.ca_file),
    }}  # fmt: skip
    answer = api.post("/api/v1/providers", by_hand, format="json")
    assert answer.status_code == 201, answer.content
    row = MachineProvider.objects.get(name="pve-h")
    built = machines._build(row)
    try:
        assert built.missing_privileges() == []
    finally:
        built.client.close()
    assert api.patch(f"/api/v1/providers/{row.pk}", {"max_machines": 5},
                     format="json").status_code == 200  # fmt: skip


def test_issue24_a_saved_proxmox_providers_settings_change_in_place_and_keep_its_connection(
    api, server
):
    """A PATCH's config replaces the settings and keeps the sealed connection: before, any
    change of template or sizes meant deleting the provider and enrolling the cluster again.
    What GET shows of the connection may be sent back; a changed endpoint or a token never."""
    started = enrolled(api, server)
    made = api.post("/api/v1/providers", {**SAVE, "name": "pve-a", "setup": started["id"]},
                    format="json").json()  # fmt: skip
    sealed = MachineProvider.objects.get(name="pve-a").config["token_sealed"]
    before = machines.provider_for(MachineProvider.objects.get(name="pve-a"))

    shown = api.get(f"/api/v1/providers/{made['id']}").json()["config"]
    edited = {**shown, "template": 9001, "cores": 4, "memory_mb": 4096}
    del edited["bridge"]  # the settings are replaced as a whole: a setting left out goes
    patched = api.patch(f"/api/v1/providers/{made['id']}", {"config": edited}, format="json")
    assert patched.status_code == 200, patched.content
    row = MachineProvider.objects.get(name="pve-a")
    assert row.config["token_sealed"] == sealed and row.config["endpoint"] == server.url
    assert row.config["template"] == 9001 and row.config["cores"] == 4
    assert "bridge" not in row.config and "token_sealed" not in patched.json()["config"]
    (audited,) = AuditLog.objects.filter(action="provider.update")
    assert "token_sealed" in audited.detail["after"]["config"]  # the keys, never the values
    assert sealed not in json.dumps(audited.detail)

    # The machine loop's provider is built again from the new settings, the token still opens.
    after = machines.provider_for(row)
    assert after is not before and isinstance(after, ProxmoxProvider)
    assert after.config.template == 9001 and machines.provider_for(row) is after
    try:
        assert after.missing_privileges() == []
    finally:
        after.client.close()
        before.client.close()

    for config, named in (
        ({**edited, "endpoint": "https://elsewhere:8006"}, "endpoint"),
        ({"template": 9001, "token": pve.TOKEN}, "token"),
        ({"template": 9001, "token_sealed": sealed}, "token_sealed"),
        ({"template": 9001, "token_file": "/etc/passwd"}, "token_file"),
        ({"template": 9001, "mark_prefix": "x"}, "mark_prefix"),
        ({"cores": 4}, "template"),
    ):
        answer = api.patch(f"/api/v1/providers/{made['id']}", {"config": config}, format="json")
        assert answer.status_code == 400, (config, answer.content)
        assert named in " ".join(answer.json()["config"]), answer.content
    assert MachineProvider.objects.get(name="pve-a").config == row.config


# -- MACH-24: setup never touches a host -----------------------------------------------------


def test_mach24_a_whole_setup_joins_no_agent_and_changes_no_host(api, server, tmp_path):
    now = timezone.now()
    Host.objects.create(name="zoomies-h", capacity=2, cordoned=True, health="unhealthy")
    Machine.objects.create(name="zm-1", provider="other", state="creating", created_at=now,
                           state_changed_at=now, claim_hash="c" * 64)  # fmt: skip
    hosts = list(Host.objects.values())
    claims = list(Machine.objects.values_list("name", "state", "claim_hash"))

    started = start(api)
    _, _, body, _ = run_script(api, started["capability"], tmp_path, server,
                               ZOOMIES_PVE_ENDPOINT=server.url)  # fmt: skip
    assert enroll(started["capability"], None, raw=body).status_code == 200
    token_id = json.loads(body)["token_id"]
    server.fake.add_token(token_id, SHIM_SECRET, set(PRIVILEGES))
    assert api.post(f"/api/v1/provider-setups/{started['id']}/discover").status_code == 200
    saved = api.post("/api/v1/providers", {**SAVE, "name": "pve-a", "setup": started["id"]},
                     format="json")  # fmt: skip
    assert saved.status_code == 201, saved.content

    assert list(Host.objects.values()) == hosts
    assert not JoinToken.objects.exists() and not AgentTask.objects.exists()
    assert list(Machine.objects.values_list("name", "state", "claim_hash")) == claims
    assert server.fake.count("POST", r"/clone$") == 0 and len(server.fake.vms) == 1
    actions = set(AuditLog.objects.values_list("action", flat=True))
    assert actions == {
        "user.create", "provider_setup.start", "provider_setup.enroll",
        "provider_setup.discover", "provider.create",
    }  # fmt: skip


def test_the_script_template_has_no_placeholder_left(api):
    capability = start(api)["capability"]
    text = Client().get(f"/machines/setup/{capability}/script").content.decode()
    assert not re.search(r"@[A-Z_]+@", text)
    assert text.startswith("#!/bin/sh\n") and "set -eu" in text


def test_issue24_item5_test_connection_names_a_missing_privilege_template_and_room(
    api, server, viewer
):
    """A saved provider's "Test connection" (POST /api/v1/providers/<id>/test) asks the
    cluster with the saved connection what would stop a create, each audited; a token the
    cluster no longer takes is a 502 with the reason, never a 500."""
    started = enrolled(api, server)
    made = api.post("/api/v1/providers", {**SAVE, "name": "pve-a", "setup": started["id"]},
                    format="json").json()  # fmt: skip
    route = f"/api/v1/providers/{made['id']}/test"
    assert api.post(route).json() == {"ok": True, "findings": []}

    server.fake.refuse_privilege("VM.Clone")
    server.fake.remove_named("runner-template")
    server.fake.nodes["pve"] = 1024  # below one machine's 2048 MiB
    answer = api.post(route).json()
    assert answer["ok"] is False
    assert answer["findings"][0] == "the token lacks VM.Clone"
    assert any("template 9000 not found" in f for f in answer["findings"])
    assert any(f.startswith("the cluster is full: no node has room for 2048 MiB")
               for f in answer["findings"])  # fmt: skip

    server.fake.tokens.clear()  # the token was removed on the cluster
    refused = api.post(route)
    assert refused.status_code == 502 and refused.json()["reason"] == "token_refused"
    outcomes = [a.detail["outcome"] for a in AuditLog.objects.filter(action="provider.test")
                .order_by("pk")]  # fmt: skip
    assert outcomes == ["ok", "findings", "token_refused"]

    server.stop()
    assert api.post(route).json()["reason"] == "unreachable"
    assert api.post("/api/v1/providers/999999/test").status_code == 404
    assert client_for(viewer).post(route).status_code == 403
