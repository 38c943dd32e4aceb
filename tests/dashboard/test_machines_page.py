"""Issue 23 item 7, the dashboard's Machines page: rented machines with their state, provider,
age, host and why; the providers with their limits; and a quarantined machine's release,
which asks first and goes through the API's own action (MACH-08)."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import AuditLog
from capacity import machines
from fleet import provider_actions
from fleet.states import MachineState as M
from tests.capacity.machine_cast import (
    T0,
    configure,
    machine_loop,  # noqa: F401  # the fixture
    rent,
    the_fake,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("machine_loop")]


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_viewer_sees_each_machine_with_its_state_provider_age_host_and_why(viewer):
    row = configure(max_machines=4, max_per_pool=3, slots_per_machine=2)
    ready = rent(row, M.READY)
    quarantined = rent(configure("spare", pools=["zoomies-spare"], max_per_pool=1), M.QUARANTINED)
    gone = rent(configure("gone", pools=["zoomies-gone"], max_per_pool=1), M.QUARANTINED)
    machines.release(gone, now=T0, actor="test")
    html = signed_in(viewer).get("/machines").content.decode()

    assert f'data-name="{ready.name}"' in html and f'data-name="{quarantined.name}"' in html
    assert gone.name not in html  # deleted rows are history, not the fleet
    assert '<span class="badge ready">ready</span>' in html
    assert '<span class="badge quarantined">quarantined</span>' in html
    assert f'<td data-label="Host">{ready.name}</td>' in html  # its host is named after it
    assert f"its agent joined as host {ready.name}" in html
    assert f"{quarantined.name} no longer carries our mark" in html
    assert '<td data-label="Age">' in html and " d</td>" in html  # rented in January
    assert "Release" not in html.split('id="providers"')[0]  # only an admin releases
    assert "A quarantined machine is released by an admin." in html
    providers = html.split('id="providers"')[1]
    assert '<td data-label="Name">fake</td>' in providers
    for limit in ('Machines at most">4', 'Per pool">3', 'Slots per machine">2'):
        assert limit in providers
    assert "zoomies-linux-x64" in providers and 'badge healthy">enabled' in providers


def test_a_provider_that_is_down_or_disabled_says_so(viewer):
    row = configure()
    rent(row, M.PLANNED)  # the loop found it down
    provider_actions.update_provider(configure("off"), {"enabled": False}, actor="test", now=T0)
    providers = signed_in(viewer).get("/machines").content.decode().split('id="providers"')[1]
    assert '<span class="badge failed">unreachable</span>' in providers
    assert "fake cannot be reached" in providers
    assert '<span class="badge paused">disabled</span>' in providers


def test_mach08_an_admin_releases_a_quarantined_machine_after_confirming(admin):
    row = configure()
    machine = rent(row, M.QUARANTINED)
    client = signed_in(admin)
    page = client.get("/machines").content.decode()
    assert f'action="/machines/{machine.pk}/release"' in page and "Release…" in page
    assert 'id="confirm-release"' not in page

    # The button asks first: nothing is released until the confirmation is posted.
    asked = client.post(f"/machines/{machine.pk}/release")
    assert asked.status_code == 302 and asked["Location"] == f"/machines?release={machine.pk}"
    machine.refresh_from_db()
    assert machine.state == M.QUARANTINED
    confirm = client.get(asked["Location"]).content.decode()
    assert 'id="confirm-release"' in confirm and f"Release {machine.name}?" in confirm
    assert "left where it is" in confirm
    assert 'name="confirmed" value="yes"' in confirm

    done = client.post(f"/machines/{machine.pk}/release", {"confirmed": "yes"}, follow=True)
    assert f"{machine.name} is released" in done.content.decode()
    machine.refresh_from_db()
    assert machine.state == M.DELETED
    assert the_fake(row).inspect(machine.name) is not None  # its resource left alone
    audit = AuditLog.objects.get(action="machine.deleted", target_id=str(machine.pk))
    assert audit.actor == "user:ada"


def test_only_a_quarantined_machine_is_released_from_the_page_too(admin):
    machine = rent(configure(), M.READY)
    client = signed_in(admin)
    assert (
        'id="confirm-release"' not in client.get(f"/machines?release={machine.pk}").content.decode()
    )
    done = client.post(f"/machines/{machine.pk}/release", {"confirmed": "yes"}, follow=True)
    assert "only a quarantined machine is released" in done.content.decode()
    machine.refresh_from_db()
    assert machine.state == M.READY
    assert client.post("/machines/999999/release", {"confirmed": "yes"}).status_code == 404


def test_an_operator_cannot_release_a_machine(operator):
    machine = rent(configure(), M.QUARANTINED)
    client = signed_in(operator)
    assert "Release…" not in client.get("/machines").content.decode()
    refused = client.post(f"/machines/{machine.pk}/release", {"confirmed": "yes"})
    assert refused.status_code == 403
    machine.refresh_from_db()
    assert machine.state == M.QUARANTINED
    assert client.get("/machines?release=1").status_code == 200  # reading is allowed


def test_the_page_lists_no_machines_and_no_providers_plainly(viewer):
    html = signed_in(viewer).get("/machines").content.decode()
    assert "No machines." in html and "No provider is configured" in html
