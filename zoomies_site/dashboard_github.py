"""The Settings page's GitHub App setup (ARCH-11): send the admin to GitHub with the
manifest, take them back with the code, store the App. Thin: zoomies_site/github_app.py
does the work."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_POST

from accounts.actors import actor_for
from zoomies_site import github_app
from zoomies_site.dashboard import _admin_only, viewer_required

BACK = "/settings#github-app"


@require_POST
@viewer_required
def github_app_start(request):
    """A page that posts the manifest to GitHub's new-App page (the browser must do it:
    GitHub shows the admin what the App will be allowed to do, and they confirm it)."""
    _admin_only(request, "only an admin creates the GitHub App")
    try:
        begin = github_app.start(
            name=request.POST.get("name", ""),
            organization=request.POST.get("organization", ""),
            session=request.session,
            now=timezone.now(),
        )
    except github_app.AppSetupRefused as exc:
        messages.error(request, f"The GitHub App was not started: {exc}.")
        return redirect(BACK)
    return render(request, "dashboard/github_app_post.html", {"start": begin})


@require_GET
@viewer_required
def github_app_created(request):
    """Where GitHub sends the admin back with the code (the manifest's redirect_url)."""
    _admin_only(request, "only an admin creates the GitHub App")
    try:
        app = github_app.complete(
            code=request.GET.get("code", ""),
            state=request.GET.get("state", ""),
            session=request.session,
            actor=actor_for(request),
            now=timezone.now(),
        )
    except github_app.AppSetupRefused as exc:
        messages.error(request, f"The GitHub App was not stored: {exc}.")
        return redirect(BACK)
    messages.success(
        request,
        format_html(
            "GitHub App {} (id {}) is set up: its key and webhook secret are stored sealed. "
            'Now <a href="{}">install it</a> on the accounts whose jobs it should run.',
            app.slug, app.app_id, app.install_url,
        ),
    )  # fmt: skip
    return redirect(BACK)
