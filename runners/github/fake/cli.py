"""Run the fake GitHub in the foreground: shared by `manage.py fake_github` and
`python -m runners.github.fake` (which needs no Django settings)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from runners.github.fake.server import FakeGitHub


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line options, for argparse and for Django's command parser alike."""
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--webhook-url", default=None, help="where to POST deliveries")
    parser.add_argument("--webhook-secret", default="secret", help="HMAC key for deliveries")
    parser.add_argument(
        "--installation",
        action="append",
        default=[],
        metavar="ORG",
        help="install the App on this organization (repeatable)",
    )
    parser.add_argument(
        "--user-installation",
        action="append",
        default=[],
        metavar="USER",
        help="install the App on this user account (repeatable)",
    )
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="OWNER/NAME",
        help="add a repository; its owner gets an organization installation if it has none",
    )
    parser.add_argument("--app-id", type=int, default=None, help="use this App id")
    parser.add_argument("--app-id-file", default=None, help="write the App id to this file")
    parser.add_argument(
        "--private-key-file", default=None, help="write the App's private key (PEM) to this file"
    )
    parser.add_argument("--token-lifetime", type=float, default=3600.0)
    for mode, what in (
        ("drop", "dropped (recorded as timed out, never sent)"),
        ("duplicate", "sent twice"),
        ("reorder", "held per job and sent newest first once the job completes (of jobs)"),
    ):
        parser.add_argument(
            f"--{mode}",
            type=_share,
            default=0.0,
            metavar="SHARE",
            help=f"the share of deliveries {what}, from 0 to 1",
        )
    parser.add_argument(
        "--new-ids", action="store_true", help="a duplicate gets its own X-GitHub-Delivery"
    )
    parser.add_argument(
        "--delivery-seed", type=int, default=None, help="seed the draws of the shares"
    )


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share from 0 to 1")
    return value


def build(options: dict[str, Any]) -> FakeGitHub:
    """A started fake with the installations and repositories the options ask for."""
    fake = FakeGitHub(
        webhook_url=options.get("webhook_url"),
        webhook_secret=options.get("webhook_secret", "secret"),
        token_lifetime=options.get("token_lifetime", 3600.0),
        port=options.get("port") or 0,
        app_id=options.get("app_id"),
    ).start()
    accounts: dict[str, int] = {}
    for org in options.get("installation") or []:
        accounts[org.lower()] = fake.add_installation(org, "Organization")
    for user in options.get("user_installation") or []:
        accounts[user.lower()] = fake.add_installation(user, "User")
    for repo in options.get("repo") or []:
        owner = repo.split("/", 1)[0]
        if owner.lower() not in accounts:
            accounts[owner.lower()] = fake.add_installation(owner, "Organization")
        fake.add_repository(accounts[owner.lower()], repo)
    fake.set_delivery(
        drop=options.get("drop") or 0.0,
        duplicate=options.get("duplicate") or 0.0,
        reorder=options.get("reorder") or 0.0,
        new_ids=bool(options.get("new_ids")),
        seed=options.get("delivery_seed"),
    )
    if options.get("app_id_file"):
        with open(options["app_id_file"], "w") as fh:
            fh.write(f"{fake.app_id}\n")
    if options.get("private_key_file"):
        # The key is a secret: create the file private to its owner.
        fd = os.open(options["private_key_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(fake.private_key_pem)
    return fake


def serve(
    options: dict[str, Any],
    *,
    out: Callable[[str], Any] = print,
    stop: threading.Event | None = None,
) -> int:
    """Serve until SIGINT/SIGTERM (or `stop` is set); returns the exit code."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
    fake = build(options)
    try:
        info = fake.info()
        out(f"fake GitHub listening on {fake.url}")
        out(f"app id: {fake.app_id}")
        for inst in info["installations"]:
            repos = ", ".join(inst["repositories"]) or "no repositories"
            out(f"installation {inst['id']}: {inst['account']} ({inst['account_type']}): {repos}")
        out(f"webhooks: {fake.webhook_url or 'none (every delivery is recorded as dropped)'}")
        mode = fake.delivery_mode
        if mode["drop"] or mode["duplicate"] or mode["reorder"]:
            out(
                f"delivery faults: drop {mode['drop']}, duplicate {mode['duplicate']}, "
                f"reorder {mode['reorder']}, seed {mode['seed']}"
            )
        stop.wait()
        out("fake GitHub stopping")
    finally:
        fake.stop()
    return 0
