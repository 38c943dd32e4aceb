"""HTTP views of the runners app. Thin: parse the request, call one function, render."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from runners import webhook_writer
from runners.github import config


def _content_length(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None


@csrf_exempt
@require_POST
def github_webhook(request: HttpRequest) -> JsonResponse:
    """`POST /webhooks/github` (HOOK-01..07): the one inbound call GitHub makes (ARCH-06).

    The body is read from the stream, at most one byte past the cap, rather than through
    `request.body`: that one refuses anything over DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB),
    and GitHub sends deliveries of up to 25 MB. Then the same writer as the ASGI route
    records it (runners.webhook_writer): recorded within its answer budget, or a 503.
    """
    max_body = config.webhook_max_body()
    length = _content_length(request)
    if length is None:
        return JsonResponse({"error": "Content-Length is not a number"}, status=400)
    if length > max_body:
        return JsonResponse({"error": f"the delivery is larger than {max_body} bytes"}, status=413)
    outcome = webhook_writer.answer(
        webhook_writer.Request(
            body=request.read(max_body + 1),
            event=request.headers.get("X-GitHub-Event"),
            delivery_id=request.headers.get("X-GitHub-Delivery"),
            signature=request.headers.get("X-Hub-Signature-256"),
            received_at=timezone.now(),
            max_body=max_body,
        )
    )
    response = JsonResponse(outcome.body, status=outcome.status)
    if outcome.status == webhook_writer.BUSY.status:
        response["Retry-After"] = "60"
    return response
