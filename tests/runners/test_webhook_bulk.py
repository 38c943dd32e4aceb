"""runners.webhooks.record writes a burst's new queued jobs together (issue 28 item 1): one
INSERT each for their deliveries, jobs, audit rows and events, where one by one each delivery
cost about ten statements. What it writes is exactly what the one-by-one path writes, and
anything that is not a new queued job still goes one by one."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import IntegrityError
from django.utils import timezone

from accounts.models import AuditLog
from runners import webhook_writer, webhooks
from runners.models import Job, WebhookDelivery
from tests.runners.conftest import WEBHOOK_SECRET, acme_installation, wakes_asked
from tests.runners.test_webhook_writer import request_for
from tests.runners.test_webhooks import job_payload
from zoomies_site.core.models import Event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _setup(db, github_settings):
    acme_installation()
    github_settings.set(webhook_secrets=WEBHOOK_SECRET)


def checked(job_id: int, action: str = "queued", installation: int = 77) -> webhooks.Delivery:
    payload = job_payload(action, job_id=job_id)
    payload["installation"] = {"id": installation}
    result = webhooks.check(
        body=_body(payload), event="workflow_job", delivery_id=f"d-{action}-{job_id}",
        signature=webhooks.sign(_body(payload), WEBHOOK_SECRET), secrets=[WEBHOOK_SECRET],
        now=timezone.now(),
    )  # fmt: skip
    assert isinstance(result, webhooks.Delivery), result
    return result


def _body(payload: dict) -> bytes:
    import json  # noqa: PLC0415

    return json.dumps(payload, sort_keys=True).encode()


def a_mixed_burst(base: int) -> list[webhooks.Delivery]:
    """New queued jobs among everything that must go one by one."""
    known = checked(base + 90)
    webhooks.record([known])  # a job already known before the burst
    return [
        checked(base + 1),
        checked(base + 2),
        checked(base + 3),
        checked(base + 1),  # a redelivery of the first, in the same burst
        checked(base + 4),
        checked(base + 4, "in_progress"),  # two deliveries for one job
        checked(base + 90, "in_progress"),  # a job known before
        checked(base + 5, installation=999),  # an installation not configured here
        checked(base + 6),
    ]


def state(base: int) -> dict:
    """What the burst wrote, with its ids made relative so two bursts compare."""
    jobs = {
        j.github_id - base: (
            j.status,
            j.installation_id,
            j.repository,
            j.name,
            j.labels,
            j.run_id,
            j.source,
            j.created_at,
        )  # fmt: skip
        for j in Job.objects.filter(github_id__range=(base, base + 99))
    }
    pks = {
        str(j.pk): j.github_id - base
        for j in Job.objects.filter(github_id__range=(base, base + 99))
    }
    audits = Counter(
        (a.actor, a.action, pks[a.target_id], tuple(sorted(a.detail.items())))
        for a in AuditLog.objects.filter(target_type="job", target_id__in=pks)
    )
    events = Counter(
        (e.kind, pks[e.resource_id])
        for e in Event.objects.filter(resource="job", resource_id__in=pks)
    )
    deliveries = sorted(
        (relative(d.delivery_id, base), d.event, d.action, d.repository, d.installation_id)
        for d in WebhookDelivery.objects.all()
        if base <= int(d.delivery_id.rsplit("-", 1)[1]) < base + 100
    )
    return {"jobs": jobs, "audits": audits, "events": events, "deliveries": deliveries}


def relative(delivery_id: str, base: int) -> str:
    prefix, number = delivery_id.rsplit("-", 1)
    return f"{prefix}-{int(number) - base}"


def answers_of(answers: list, base: int) -> list:
    return [
        {k: (relative(v, base) if k == "delivery" else v) for k, v in a.body.items()}
        | {"status": a.status}
        for a in answers
    ]


def test_hook02_a_bursts_new_queued_jobs_are_written_together_as_one_by_one_would(monkeypatch):
    burst = a_mixed_burst(7_100_000)
    # Not the first (its redelivery is in the burst too), nor the rest but the last.
    assert webhooks._new_queued_jobs(burst, webhooks._Burst()) == [1, 2, 8]
    together = webhooks.record(burst)

    monkeypatch.setattr(webhooks, "BULK_FROM", 10**6)  # the one-by-one path alone
    alone_burst = a_mixed_burst(7_200_000)
    assert webhooks._new_queued_jobs(alone_burst, webhooks._Burst()) == []
    alone = webhooks.record(alone_burst)

    assert answers_of(together, 7_100_000) == answers_of(alone, 7_200_000)
    first, second = state(7_100_000), state(7_200_000)
    # created_at comes from each payload; the rest must match row for row.
    assert first == second
    assert set(first["jobs"]) == {1, 2, 3, 4, 6, 90}
    assert first["jobs"][4][0] == "in_progress" and first["jobs"][1][0] == "queued"


def test_hook04_a_burst_of_new_jobs_costs_a_handful_of_statements_and_one_wake(
    django_assert_max_num_queries,
):
    burst = [checked(7_300_000 + i) for i in range(40)]
    asked = wakes_asked()
    with django_assert_max_num_queries(20):  # one by one: about 400
        answers = webhooks.record(burst)
    assert [a.status for a in answers] == [200] * 40
    assert (
        Job.objects.filter(github_id__range=(7_300_000, 7_300_039), status="queued").count() == 40
    )
    assert WebhookDelivery.objects.filter(delivery_id__startswith="d-queued-73").count() == 40
    assert AuditLog.objects.filter(action="job.queued", target_type="job").count() >= 40
    assert wakes_asked() == asked + 1  # HOOK-04: one wake for the burst


def test_hook02_a_job_another_process_wrote_meanwhile_sends_the_group_one_by_one(monkeypatch):
    """Between the look and the INSERT another web process recorded one of the burst's
    deliveries: the group's INSERT fails, its savepoint takes the whole group back, and each
    delivery goes one by one: that one is a duplicate, the rest are recorded, none twice."""
    burst = [checked(7_400_000 + i) for i in range(5)]
    webhooks.record([burst[2]])  # "the other process"
    real = webhooks._new_queued_jobs

    def blind_to_the_race(deliveries, b):
        found = real(deliveries, b)
        return sorted({*found, 2})  # as if the look ran before the other process's commit

    monkeypatch.setattr(webhooks, "_new_queued_jobs", blind_to_the_race)
    answers = webhooks.record(burst)
    assert [a.body.get("duplicate", False) for a in answers] == [False, False, True, False, False]
    assert all(a.status == 200 for a in answers)
    assert Job.objects.filter(github_id__range=(7_400_000, 7_400_004)).count() == 5
    assert WebhookDelivery.objects.filter(delivery_id__startswith="d-queued-74").count() == 5


def test_a_row_that_breaks_the_group_fails_alone(monkeypatch):
    """A failure inside the group's write (here the jobs' INSERT) takes none of the burst
    with it: the group goes one by one, where the failing delivery fails alone."""
    burst = [checked(7_500_000 + i) for i in range(4)]
    real_one = webhooks.apply_job_update

    def broken_group(*args, **kwargs):
        raise IntegrityError("a broken row")

    def failing_for_one(update, **kwargs):
        if update.github_id == 7_500_001:
            raise ValueError("this one breaks")
        return real_one(update, **kwargs)

    monkeypatch.setattr(webhooks, "record_new_queued_jobs", broken_group)
    monkeypatch.setattr(webhooks, "apply_job_update", failing_for_one)
    answers = webhooks.record(burst)
    assert isinstance(answers[1], ValueError)
    assert [a.status for i, a in enumerate(answers) if i != 1] == [200, 200, 200]
    assert set(Job.objects.filter(github_id__range=(7_500_000, 7_500_003)).values_list(
        "github_id", flat=True)) == {7_500_000, 7_500_002, 7_500_003}  # fmt: skip
    assert not WebhookDelivery.objects.filter(delivery_id="d-queued-7500001").exists()


def test_the_writer_answers_a_burst_of_new_jobs_only_once_all_are_written():
    """Through the writer thread, as both routes record: every answer a 200, every job there."""
    futures = [webhook_writer.submit(request_for(7_600_000 + i)) for i in range(12)]
    assert [f.result(timeout=30).status for f in futures] == [200] * 12
    assert Job.objects.filter(github_id__range=(7_600_000, 7_600_011)).count() == 12
