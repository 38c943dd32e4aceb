"""Views of the capacity app outside the API: a rented guest's NoCloud seed."""

from __future__ import annotations

from django.http import HttpResponse

from capacity import seed

# What NoCloud asks a seed URL for that this serves; network-config is left to the image.
SEED_ITEMS = ("meta-data", "user-data", "vendor-data")


def machine_seed(request, code: str, item: str):
    """GET /machines/seed/<claim code>/<item>: a rented guest's NoCloud seed (capacity.seed).
    No session or token: the guest has only its claim code. Unknown codes are 404."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    machine = seed.machine_for_seed(code)
    if machine is None or item not in SEED_ITEMS:
        return HttpResponse("no seed here\n", status=404, content_type="text/plain")
    if item == "meta-data":
        body = seed.meta_data(machine)
    elif item == "user-data":
        body = seed.user_data(machine, code)
    else:
        body = ""  # vendor-data: nothing beyond the user's
    return HttpResponse(body, content_type="text/plain; charset=utf-8")
