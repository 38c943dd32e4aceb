"""The fake GitHub's App webhook delivery log: list, get one, and ask for a redelivery.

`GET /app/hook/deliveries` (newest first; `per_page` up to 100; `cursor` pagination through
the `Link` header's `rel="next"`; the `status` filter by status_code range),
`GET /app/hook/deliveries/{delivery_id}` and `POST /app/hook/deliveries/{delivery_id}/attempts`
(202, and the delivery is sent again under its guid and recorded as a new item with
`redelivery: true`). All three take the App's JWT only, as GitHub's do: they are routed as
"jwt", so an installation token is refused 401.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

from runners.github.fake.core import REDELIVERY_WINDOW, HttpError, Request, Response, positive_int
from runners.github.fake.deliveries import redeliver
from runners.github.fake.shapes import iso
from runners.github.fake.state import FakeState

HOOK_DOCS = "https://docs.github.com/rest/apps/webhooks"
# The cursor is opaque to clients; here it names the last item of the page before.
_CURSOR = re.compile(r"v1_(\d+)")
# The `status` filter by status_code range, as the spec describes it. A delivery nothing
# answered (status_code 0) is in neither: only an unfiltered listing shows every failure.
_STATUS_RANGES = {"success": range(200, 400), "failure": range(400, 600)}


def hook_item(hook: dict[str, Any]) -> dict[str, Any]:
    """GitHub's `hook-delivery-item` (the list's shape)."""
    return {
        "id": hook["id"],
        "guid": hook["guid"],
        "delivered_at": iso(hook["delivered_at"]),
        "redelivery": hook["redelivery"],
        "duration": hook["duration"],
        "status": hook["status"],
        "status_code": hook["status_code"],
        "event": hook["event"],
        "action": hook["action"],
        "installation_id": hook["installation_id"],
        "repository_id": hook["repository_id"],
        "throttled_at": None,
    }


def _hook_by_param(state: FakeState, req: Request) -> dict[str, Any]:
    try:
        wanted = int(req.params["delivery_id"])
    except ValueError:
        raise HttpError(404, "Not Found") from None
    for hook in state.hook_deliveries:
        if hook["id"] == wanted:
            return hook
    raise HttpError(404, "Not Found")


def list_hook_deliveries(state: FakeState, req: Request) -> Response:
    per_page = min(positive_int(req.q("per_page"), 30), 100)
    status = req.q("status")
    if status is not None and status not in _STATUS_RANGES:
        raise HttpError(
            422,
            "Validation Failed",
            documentation_url=HOOK_DOCS,
            errors=[{"resource": "HookDelivery", "field": "status", "code": "invalid"}],
        )
    cursor = req.q("cursor")
    before: int | None = None
    if cursor:
        match = _CURSOR.fullmatch(cursor)
        if match is None:
            raise HttpError(
                422,
                "Validation Failed",
                documentation_url=HOOK_DOCS,
                errors=[{"resource": "HookDelivery", "field": "cursor", "code": "invalid"}],
            )
        before = int(match.group(1))
    newest_first = sorted(state.hook_deliveries, key=lambda h: h["id"], reverse=True)
    chosen = [
        h
        for h in newest_first
        if (before is None or h["id"] < before)
        and (status is None or h["status_code"] in _STATUS_RANGES[status])
    ]
    page, rest = chosen[:per_page], chosen[per_page:]
    headers: dict[str, str] = {}
    if rest:
        params = {"per_page": str(per_page), "cursor": f"v1_{page[-1]['id']}"}
        if status is not None:
            params["status"] = status
        query = urllib.parse.urlencode(params)
        headers["Link"] = f'<{state.url}/app/hook/deliveries?{query}>; rel="next"'
    return Response(200, [hook_item(h) for h in page], headers)


def get_hook_delivery(state: FakeState, req: Request) -> Response:
    hook = _hook_by_param(state, req)
    answer = hook["answer"]
    body = hook_item(hook)
    body["url"] = hook["url"]
    body["request"] = {"headers": hook["request_headers"], "payload": json.loads(hook["body"])}
    body["response"] = {
        "headers": answer[0] if answer else None,
        "payload": answer[1] if answer else None,
    }
    return Response(200, body)


def redeliver_hook_delivery(state: FakeState, req: Request) -> Response:
    hook = _hook_by_param(state, req)
    if state.clock() - hook["delivered_at"] > REDELIVERY_WINDOW:
        raise HttpError(
            422,
            "Validation Failed",
            documentation_url=HOOK_DOCS,
            errors=[
                {
                    "resource": "HookDelivery",
                    "field": "delivered_at",
                    "code": "invalid",
                    "message": "the delivery is older than the redelivery window",
                }
            ],
        )
    redeliver(state, hook)
    return Response(202, {})
