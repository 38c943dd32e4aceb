"""Delivering an attempt: one signed HTTP POST per try, with no transaction open (CAP-18).

`deliver(attempt_id)` runs the attempt's due tries. With a `sleep` it waits out the backoff
between tries itself; without one it makes the one due try and the next loop step picks up
the next when it is due. Either way every try's state is in the database before and after
it is sent, so a process killed anywhere leaves an attempt the next step carries on (CAP-17).
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from datetime import datetime

import httpx

from capacity import actions, events
from capacity.claims import render_body
from capacity.config import CapacityConfig
from capacity.config import load as load_config
from capacity.models import Attempt, AttemptState, TryOutcome

Clock = Callable[[], datetime]


@functools.cache
def trust() -> ssl.SSLContext:
    """httpx's default trust (SSL_CERT_FILE, SSL_CERT_DIR, else certifi's bundle), built once
    a process: `httpx.post` builds it afresh on every call, reading the whole CA bundle, about
    27 ms of CPU a try here."""
    return httpx.create_ssl_context()


def send(claimed: actions.ClaimedTry, config: CapacityConfig) -> tuple[str, int | None, str]:
    """POST the attempt's body once: (outcome, status code, error)."""
    body = render_body(claimed.body.decode(), claimed.event_id)
    hdrs = events.headers(
        event_id=claimed.event_id,
        stamp=claimed.stamp,
        body=body,
        secret=config.signing_secret,
    )
    hdrs["User-Agent"] = "zoomies-capacity/1"
    try:
        response = httpx.post(
            claimed.destination_url,
            content=body,
            headers=hdrs,
            timeout=config.timeout.total_seconds(),
            follow_redirects=False,
            verify=trust(),
        )
    except httpx.HTTPError as exc:
        return TryOutcome.UNANSWERED, None, f"{type(exc).__name__}: {exc}"[:500]
    if 200 <= response.status_code < 300:
        return TryOutcome.ACCEPTED, response.status_code, ""
    return (
        TryOutcome.REFUSED,
        response.status_code,
        f"HTTP {response.status_code}: {response.text[:300]}",
    )


def deliver(
    attempt_id: int,
    *,
    clock: Clock,
    sleep: Callable[[float], None] | None = None,
    config: CapacityConfig | None = None,
) -> str | None:
    """Run the attempt's due tries; the attempt's state afterwards (None if not found)."""
    config = config or load_config()
    while True:
        claimed = actions.claim_try(attempt_id, now=clock(), timeout=config.timeout)
        if claimed is None:
            break
        outcome, status, error = send(claimed, config)
        attempt = actions.record_try(
            attempt_id,
            claimed.number,
            outcome=outcome,
            status_code=status,
            error=error,
            now=clock(),
            backoff=config.retry_backoff,
        )
        if attempt is None or attempt.state != AttemptState.PENDING or sleep is None:
            break
        wait = (attempt.next_try_at - clock()).total_seconds()
        if wait > 0:
            sleep(wait)
    return Attempt.objects.filter(pk=attempt_id).values_list("state", flat=True).first()
