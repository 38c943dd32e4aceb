"""Issue 24's acceptance, walked in a real browser (MACH-20..24): an admin names a Proxmox
provider on the Settings page, the page prints one command, that command is run as root on
the "cluster" exactly as printed (real curl and sh against the controller; `pveum` shimmed,
the fake Proxmox's CA where /etc/pve holds it), the page sees the enrollment, shows what the
cluster holds as the staged token sees it, and saves the provider; then the saved provider's
connection test and an in-place change of its settings, from the same page.

Real processes: the README's `scripts/run.sh` over its own SQLite file, headless Chromium,
and the fake Proxmox over HTTPS on loopback.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.browsing import PASSWORD, Watch
from tests.e2e.test_first_job import POOL
from tests.fleet.providers import pve

# Over 20 s of a worker: .ci/run's slow pass runs it, after the test command.
pytestmark = [pytest.mark.e2e, pytest.mark.any_database, pytest.mark.slow]

# pveum as a node answers it: the token it makes is the one the fake cluster holds.
PVEUM = f"""#!/bin/sh
{{ printf '%s\\t' "$@"; printf '\\n'; }} >> "$SHIM_LOG"
case "$1 $2" in
  "user list"|"role list") echo '[]' ;;
  "user token") printf '{{"full-tokenid":"%s","info":{{"privsep":1}},"value":"%s"}}\\n' \\
    "{pve.TOKEN_ID}" "{pve.SECRET}" ;;
esac
"""


def run_on_the_node(command: str, tmp_path, server) -> str:
    """The printed line, run by `sh -c` as root would paste it: its curl fetches the script
    from the controller and its script's curl posts the enrollment back."""
    bin_dir, pve_dir = tmp_path / "bin", tmp_path / "etc-pve"
    bin_dir.mkdir()
    pve_dir.mkdir()
    (bin_dir / "pveum").write_text(PVEUM)
    (bin_dir / "pveum").chmod(0o755)
    (pve_dir / "pve-root-ca.pem").write_bytes(server.certificates.ca_file.read_bytes())
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=60,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SHIM_LOG": str(tmp_path / "pveum.log"),
             "ZOOMIES_PVE_DIR": str(pve_dir), "ZOOMIES_PVE_ENDPOINT": server.url},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_mach20_mach24_a_proxmox_cluster_is_onboarded_from_the_settings_page(
    e2e, browser, tmp_path
):
    controller, _github = e2e
    server = pve.serve()
    try:
        controller.env["ZOOMIES_ADMIN_PASSWORD"] = PASSWORD
        controller.prepare()
        controller.manage("create_admin", "ada")
        controller.start(run_script=True)
        controller.api("pools", method="POST", json=POOL)

        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        page = context.new_page()
        watch = Watch(page)
        page.set_default_timeout(30_000)
        page.goto(f"{controller.url}/settings")
        page.fill("#id_username", "ada")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_url(f"{controller.url}/settings")
        page.wait_for_selector("#provider-list tbody tr td.muted >> text=No provider yet")

        page.fill("#proxmox-start input[name=name]", "pve-main")
        page.click("#proxmox-start button[type=submit]")
        page.wait_for_selector("#proxmox-enroll:not([hidden])")
        command = page.locator("#proxmox-command").inner_text().strip()
        assert command.startswith(f"curl -fsS {controller.url}/machines/setup/"), command
        assert command.endswith("/script | sh")

        said = run_on_the_node(command, tmp_path, server)
        assert f"{server.url} enrolled with token {pve.TOKEN_ID}" in said
        pveum = (tmp_path / "pveum.log").read_text()
        assert "--privsep\t1" in pveum and pve.SECRET not in pveum  # never on a command line

        # The page sees the enrollment by itself, and what the cluster holds.
        page.wait_for_selector("#proxmox-settings:not([hidden])", timeout=60_000)
        assert "Enrolled from " + server.url in page.locator("#proxmox-status").inner_text()
        assert page.locator("#proxmox-templates option[value='9000']").count() == 1
        assert page.input_value("#proxmox-settings input[name=template]") == "9000"
        assert page.input_value("#proxmox-settings input[name=pool]") == "zoomies"
        assert page.locator("#proxmox-settings select[name=nodes] option").all_inner_texts()[0]
        assert page.locator("#proxmox-privileges").is_hidden()
        page.select_option("#proxmox-settings select[name=pools]", POOL["name"])
        page.fill("#proxmox-settings input[name=bridge]", "vmbr0")
        page.fill("#proxmox-settings input[name=nameserver]", "192.0.2.53")
        page.fill("#proxmox-settings input[name=max_machines]", "3")
        page.click("#proxmox-settings button[type=submit]")
        page.wait_for_selector("#provider-test >> text=pve-main saved")
        page.wait_for_selector("#provider-list tbody tr >> text=pve-main")
        watch.check("settings, provider saved")

        (saved,) = controller.api("providers")
        assert saved["kind"] == "proxmox" and saved["pools"] == [POOL["name"]]
        assert saved["max_machines"] == 3 and saved["config"]["template"] == 9000
        assert saved["config"]["endpoint"] == server.url and saved["config"]["bridge"] == "vmbr0"
        assert saved["config"]["ipconfig"] == "ip=dhcp"
        assert saved["config"]["nameserver"] == "192.0.2.53"
        assert "token_sealed" not in saved["config"] and "token" not in saved["config"]
        page_text = page.content()
        assert pve.SECRET not in page_text

        # The saved provider's connection test, then its settings changed in place.
        page.click("#provider-list tbody tr:has-text('pve-main') button[data-act=test]")
        page.wait_for_selector("#provider-test >> text=pve-main: ready to rent a machine.")
        page.click("#provider-list tbody tr:has-text('pve-main') button[data-act=edit]")
        page.wait_for_selector("#proxmox-settings:not([hidden])")
        assert page.input_value("#proxmox-settings input[name=template]") == "9000"
        page.fill("#proxmox-settings input[name=cores]", "4")
        page.click("#proxmox-settings button[type=submit]")
        page.wait_for_selector("#provider-test >> text=pve-main: settings saved.")
        (changed,) = controller.api("providers")
        assert changed["config"]["cores"] == 4 and changed["config"]["endpoint"] == server.url
        assert changed["config"]["bridge"] == "vmbr0" and changed["pools"] == [POOL["name"]]
        assert changed["config"]["nameserver"] == "192.0.2.53"

        server.fake.refuse_privilege("VM.Allocate")
        page.click("#provider-list tbody tr:has-text('pve-main') button[data-act=test]")
        page.wait_for_selector("#provider-test >> text=the token lacks VM.Allocate")
        watch.check("settings, provider tested")
        context.close()
    finally:
        server.stop()
