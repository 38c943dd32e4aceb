"""The wire form of a capacity event: its JSON body, its headers, its signature (CAP-09..12).

Pure: the caller supplies the event id and the time. The body is rendered once and its
exact bytes are stored, signed and sent on every try of an attempt, so a retry can never
differ from the first try by a byte (CAP-14).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from capacity.planner import Reading

# Adding a field never raises this; a change a version-1 receiver would misread does (CAP-11).
SCHEMA_VERSION = 1

EVENT_ID_HEADER = "X-Zoomies-Event-ID"
TIMESTAMP_HEADER = "X-Zoomies-Timestamp"
SIGNATURE_HEADER = "X-Zoomies-Signature-256"
SIGNATURE_PREFIX = "sha256="


def timestamp(at: datetime) -> str:
    """RFC 3339 in UTC with a Z, whole seconds: `2026-09-05T12:00:00Z`."""
    if at.tzinfo is None:
        raise ValueError("an event timestamp must be an aware datetime")
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plain(value: object) -> object:
    """Pairs tuples become objects; everything else is already JSON."""
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {str(k): plain(v) for k, v in value}
    return value


def event_document(
    *,
    event_id: str,
    type: str,
    at: datetime,
    reading: Reading,
    detail: str,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The event as a dict, in the contract's field order, then our additions."""
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "event_id": event_id,
        "type": type,
        "timestamp": timestamp(at),
        # A string, as the contract's example and its Go receiver read it.
        "pool_id": str(reading.pool_id),
        "host_selector": dict(reading.host_selector),
        "backend": reading.backend,
        "required_runner_slots": reading.required_runner_slots,
        "current_capacity": reading.current_capacity,
        "queued_job_count": reading.queued_job_count,
        "oldest_queue_age_seconds": reading.oldest_queue_age_seconds,
        # Additions (CAP-11: they leave schema_version at 1).
        "pool_name": reading.pool_name,
        "platform": reading.platform,
        "target_runner_slots": reading.current_capacity + reading.required_runner_slots,
        "detail": detail,
    }
    if reading.missing:
        document["missing"] = {key: plain(value) for key, value in reading.missing}
    for key, value in (extra or {}).items():
        if key in document:
            raise ValueError(f"{key} is a field of the event itself")
        document[key] = value
    return document


def render(document: Mapping[str, Any]) -> bytes:
    """The exact body bytes: compact UTF-8 JSON, no NaN."""
    for value in document.values():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("an event holds no NaN or infinity")
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def signature(body: bytes, secret: str | bytes) -> str:
    """`sha256=<lowercase hex HMAC-SHA256 of the exact body>` (CAP-12)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return SIGNATURE_PREFIX + hmac.new(key, body, hashlib.sha256).hexdigest()


def headers(*, event_id: str, stamp: str, body: bytes, secret: str | bytes) -> dict[str, str]:
    """The request headers for one try."""
    return {
        "Content-Type": "application/json",
        EVENT_ID_HEADER: event_id,
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: signature(body, secret),
    }


def verify(body: bytes, given: str | None, secret: str | bytes) -> bool:
    """Constant-time check of a signature header against the body."""
    if not given:
        return False
    return hmac.compare_digest(signature(body, secret).encode(), given.encode())
