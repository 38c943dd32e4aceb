"""The hypervisor's side of Proxmox onboarding (MACH-21): the enrollment script and the route
it answers to. No session or token: the setup's capability in the path is the credential,
good for one enrollment until the setup expires; anything else is a 404 (fleet.provider_setups).
"""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from fleet import provider_setups
from zoomies_site.core import registry

# An enrollment is a CA certificate and a few short strings: far below this.
MAX_ENROLL_BODY = 64 * 1024


def public_base(request) -> str:
    """Where the hypervisor reaches this controller: server.public_url, else the address
    this request came in by."""
    return (registry.get("server.public_url") or request.build_absolute_uri("/")).rstrip("/")


def setup_script(request, capability: str):
    """GET /machines/setup/<capability>/script: the POSIX sh that enrolls the cluster."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    setup = provider_setups.setup_for_capability(capability, now=timezone.now())
    if setup is None:
        return HttpResponse(
            "echo 'zoomies: this setup is unknown, expired or enrolled already' >&2; exit 1\n",
            status=404, content_type="text/plain; charset=utf-8",
        )  # fmt: skip
    body = provider_setups.enrollment_script(setup, capability, base_url=public_base(request))
    return HttpResponse(body, content_type="text/x-shellscript; charset=utf-8")


@csrf_exempt  # curl on a hypervisor has no session to forge; the capability is the key
def setup_enroll(request, capability: str):
    """POST /machines/setup/<capability>/enroll {endpoint, ca_pem | fingerprint, token_id,
    secret}: 200 once, then 409; 404 for an unknown or expired setup; 400 names the field."""
    if request.method != "POST":
        return JsonResponse({"detail": "POST only"}, status=405, headers={"Allow": "POST"})
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not length.isdigit() or int(length) > MAX_ENROLL_BODY:
        return JsonResponse({"detail": "the body is too large for an enrollment"}, status=413)
    try:
        body = json.loads(request.body[: MAX_ENROLL_BODY + 1] or b"null")
    except (ValueError, UnicodeDecodeError):
        return JsonResponse({"detail": "the body is not JSON"}, status=400)
    try:
        setup = provider_setups.enroll_setup(capability, body, now=timezone.now())
    except provider_setups.SetupGone as exc:
        return JsonResponse({"detail": str(exc)}, status=404)
    except provider_setups.AlreadyEnrolled as exc:
        return JsonResponse({"detail": str(exc)}, status=409)
    except ValidationError as exc:
        fields = exc.message_dict
        summary = "invalid enrollment: " + "; ".join(
            f"{field}: {' '.join(messages)}" for field, messages in sorted(fields.items())
        )
        return JsonResponse({"detail": summary, **fields}, status=400)
    return JsonResponse({"detail": f"enrolled: {setup.name} at {setup.endpoint}"})
