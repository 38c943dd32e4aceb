"""What the problems drawer says about GitHub (POLL-04, POLL-06).

A fleet that silently stopped receiving webhooks looks exactly like a quiet fleet, so when
the poller is doing the work webhooks should, the drawer says so in plain words; and each
installation GitHub has rate-limited is listed with when it will be asked again.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max

from runners.models import Installation

WARNING = "warning"
# Polls count as happening while the latest is within this many poll intervals.
RECENT_POLL_INTERVALS = 3


def _registry(key: str):
    from zoomies_site import registry

    return registry.get(key)


def _when(at: datetime, now: datetime) -> str:
    minutes = int((now - at).total_seconds() // 60)
    ago = "less than a minute ago" if minutes < 1 else f"{minutes} min ago"
    return f"{at:%Y-%m-%d %H:%M:%S} UTC ({ago})"


def _polling_only(now: datetime) -> dict | None:
    """POLL-04: the poller has polled recently and no installation's webhooks are arriving."""
    from runners.poller import webhook_fresh_window

    active = Installation.objects.filter(active=True)
    seen = active.aggregate(polled=Max("last_polled_at"), hooked=Max("last_webhook_at"))
    polled, hooked = seen["polled"], seen["hooked"]
    if polled is None or now - polled > RECENT_POLL_INTERVALS * _registry("github.poll_interval"):
        return None
    window = webhook_fresh_window()
    if hooked is not None and now - hooked < window:
        return None
    if hooked is None:
        title = "Running on polling alone: no webhook from GitHub has ever arrived"
    else:
        title = (
            "Running on polling alone: no webhook from GitHub has arrived since "
            f"{_when(hooked, now)}"
        )
    interval = int(_registry("github.poll_interval").total_seconds())
    return {
        "key": "github.polling_only",
        "severity": WARNING,
        "title": title,
        "detail": (
            f"Jobs are being found by the poll fallback every {interval} s instead, so each "
            "one waits up to that long before a runner is started for it, and every poll "
            "spends API quota. Check the GitHub App's webhook URL, that it reaches this "
            "controller, and that its secret matches github.webhook_secrets (the App's "
            "Advanced page lists recent deliveries and their answers)."
        ),
    }


def _standdowns(now: datetime) -> list[dict]:
    problems = []
    held = Installation.objects.filter(active=True, standdown_until__gt=now).order_by("pk")
    for inst in held:
        problems.append(
            {
                "key": "github.standdown",
                "severity": WARNING,
                "title": (
                    f"GitHub is rate-limiting {inst.account}: not asked again until "
                    f"{inst.standdown_until:%Y-%m-%d %H:%M:%S} UTC"
                ),
                "detail": (
                    f"Installation {inst.github_id}. {inst.standdown_reason or 'Rate limited.'} "
                    "Until then the poller and the registration reap leave this installation "
                    "alone; the other installations carry on."
                ),
            }
        )
    return problems


def github_problems(now: datetime) -> list[dict]:
    """Problems about GitHub, each a dict of key, severity, title and detail."""
    problems = []
    polling = _polling_only(now) if _registry("github.poll_fallback") else None
    if polling is not None:
        problems.append(polling)
    problems.extend(_standdowns(now))
    return problems
