"""The sandbox restarted on one data directory numbers its fake GitHub afresh (issue 21 item
4): the second start's first job is not any job the first start made."""

from __future__ import annotations

from zoomies_site import sandbox


def test_issue21_item4_a_restarted_sandbox_never_reuses_a_job_id(tmp_path):
    seen = []
    for _start in range(3):
        box = sandbox.start_fake_github(webhook_url="http://127.0.0.1:9/hook", data_dir=tmp_path)
        try:
            jobs = [box.fake.queue_job(repo=sandbox.SANDBOX_REPO, labels=["x"]) for _ in range(3)]
        finally:
            box.fake.stop()
        assert not set(jobs) & set(seen), (jobs, seen)
        seen += jobs
    assert (tmp_path / "sandbox" / "starts").read_text().strip() == "3"


def test_the_id_base_moves_every_id_a_job_names(tmp_path):
    from runners.github.fake import FakeGitHub  # noqa: PLC0415  # the fake: tests only

    fake = FakeGitHub(webhook_url=None, id_base=sandbox.ID_RANGE).start()
    try:
        installation = fake.add_installation(account="acme", repositories=["acme/app"])
        assert installation
        job = fake.queue_job(repo="acme/app", labels=["x"])
        assert job > 25_000_000_000 + sandbox.ID_RANGE
        assert fake.job(job)["run_id"] > 9_000_000_000 + sandbox.ID_RANGE
    finally:
        fake.stop()
