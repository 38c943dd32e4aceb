"""`controller --sandbox`: the fake GitHub beside the controller, so a newcomer can watch the
fleet work with no GitHub App. It seeds an installation and a process-backend pool whose
runners are the fake runner, and queues a trickle of jobs.
"""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from django.utils import timezone

from runners.actions import installations as installation_actions
from runners.github.programs import FAKE_RUNNER as FAKE_RUNNER_IMAGE
from runners.models import Installation, Pool

ACTOR = "system:sandbox"

log = logging.getLogger("zoomies.sandbox")

SANDBOX_ACCOUNT = "sandbox"
SANDBOX_REPO = "sandbox/hello"
SANDBOX_POOL = "zoomies-sandbox"
SANDBOX_LABELS = ["self-hosted", "sandbox"]


@dataclass
class Sandbox:
    """The running fake GitHub and the environment that points Zoomies at it."""

    fake: object
    env: dict[str, str]
    installation_id: int
    stop_event: threading.Event = field(default_factory=threading.Event)
    queued: list[int] = field(default_factory=list)

    def queue_job(self, duration: float = 3.0) -> int:
        job_id = self.fake.queue_job(
            repo=SANDBOX_REPO, labels=SANDBOX_LABELS, duration=duration, conclusion="success"
        )
        self.queued.append(job_id)
        log.info("sandbox: queued job %s", job_id)
        return job_id

    def trickle(self, every: float, duration: float = 3.0) -> threading.Thread:
        def run() -> None:
            while not self.stop_event.is_set():
                try:
                    self.queue_job(duration)
                except Exception:
                    log.exception("sandbox: could not queue a job")
                self.stop_event.wait(every)

        thread = threading.Thread(target=run, name="sandbox-trickle", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stop_event.set()
        self.fake.stop()


# Each start of the sandbox numbers its fake GitHub's jobs, runs and runners from a fresh
# range this wide, so a restart on the same data directory never reuses an id (issue 21
# item 4: the new fake's job 25000000001 was an old completed row, and new jobs stayed
# queued while runners took stale ones).
ID_RANGE = 100_000_000


def next_id_base(data_dir: Path) -> int:
    """The id base of this start: one range past the last start's, remembered on disk."""
    counter = data_dir / "sandbox" / "starts"
    counter.parent.mkdir(parents=True, exist_ok=True)
    try:
        starts = int(counter.read_text())
    except (OSError, ValueError):
        starts = 0
    tmp = counter.with_suffix(".tmp")
    tmp.write_text(f"{starts + 1}\n")
    tmp.replace(counter)
    return starts * ID_RANGE


def start_fake_github(*, webhook_url: str, data_dir: Path) -> Sandbox:
    # Only with --sandbox: the fake GitHub is a test double the controller otherwise never loads.
    from runners.github.fake import FakeGitHub  # noqa: PLC0415

    secret = secrets.token_hex(16)
    fake = FakeGitHub(
        webhook_url=webhook_url, webhook_secret=secret, id_base=next_id_base(data_dir)
    ).start()
    key_file = data_dir / "sandbox" / "app.pem"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(fake.private_key_pem)
    key_file.chmod(0o600)
    installation_id = fake.add_installation(
        account=SANDBOX_ACCOUNT, account_type="Organization", repositories=[SANDBOX_REPO]
    )
    env = {
        "ZOOMIES_GITHUB_API_URL": fake.url,
        "ZOOMIES_GITHUB_APP_ID": str(fake.app_id),
        "ZOOMIES_GITHUB_PRIVATE_KEY_FILE": str(key_file),
        "ZOOMIES_GITHUB_WEBHOOK_SECRET": secret,
        "ZOOMIES_GITHUB_WEBHOOK_SECRETS": secret,
    }
    return Sandbox(fake=fake, env=env, installation_id=installation_id)


def seed(sandbox: Sandbox) -> None:
    """The sandbox's installation and pool, pointed at this run's fake (ids change per run)."""
    now = timezone.now()
    earlier = Installation.objects.filter(account=SANDBOX_ACCOUNT).exclude(
        github_id=sandbox.installation_id
    )
    installation_actions.forget_installations(
        list(earlier), actor=ACTOR, now=now, why="an earlier sandbox run's fake GitHub"
    )
    installation, _ = installation_actions.add_installation(
        github_id=sandbox.installation_id, account=SANDBOX_ACCOUNT,
        kind=Installation.Kind.ORG, repositories=[SANDBOX_REPO], actor=ACTOR, now=now,
    )  # fmt: skip
    Pool.objects.update_or_create(
        name=SANDBOX_POOL,
        defaults={
            "installation": installation,
            "labels": ["sandbox"],
            "backend": Pool.Backend.PROCESS,
            "image": FAKE_RUNNER_IMAGE,
            "ephemeral": True,
            "max_runners": 4,
        },
    )
