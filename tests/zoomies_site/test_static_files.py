"""A cancelled request reaches its view (zoomies_site/asgi.py), and the middleware chain is
async all the way down (zoomies_site/static_files.py).

A sync-only middleware made Django run the rest of the chain through async_to_sync on a
thread: every long-poll and SSE viewer held a thread, and a cancelled request (the client
gone, the server stopping) never reached its view, which ran its wait out. The web server's
SIGTERM then waited out the 25 s long-poll and was killed at 15 s."""

import asyncio

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import path
from django.utils.module_loading import import_string

from zoomies_site.asgi import http_application
from zoomies_site.static_files import StaticFilesMiddleware

pytestmark = pytest.mark.django_db

STATE: dict[str, asyncio.Event] = {}


async def waiting_view(request):
    STATE["started"].set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        STATE["cancelled"].set()
        raise


urlpatterns = [path("wait", waiting_view)]


def test_no_middleware_is_sync_only():
    sync_only = [
        name for name in settings.MIDDLEWARE
        if not getattr(import_string(name), "async_capable", True)
    ]  # fmt: skip
    assert sync_only == []


def scope(path_: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path_, "raw_path": path_.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 5),
        "server": ("testserver", 80),
    }  # fmt: skip


@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"])
def test_a_request_cancelled_as_the_server_stops_reaches_its_async_view():
    async def run() -> None:
        STATE["started"], STATE["cancelled"] = asyncio.Event(), asyncio.Event()
        never = asyncio.Event()
        body_sent = False

        async def receive():
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await never.wait()  # the client neither sends more nor goes away
            return {"type": "http.disconnect"}

        async def send(message):
            pass

        request = asyncio.ensure_future(http_application(scope("/wait"), receive, send))
        await asyncio.wait_for(STATE["started"].wait(), 30)
        request.cancel()  # what daphne does to every open request on SIGTERM
        await asyncio.wait_for(STATE["cancelled"].wait(), 30)
        with pytest.raises(asyncio.CancelledError):
            await request

    asyncio.run(run())


def test_a_static_file_is_still_served_on_both_paths(tmp_path):
    (tmp_path / "site.css").write_text("body{}")

    async def inner(request):
        raise AssertionError("a static file went past the middleware")

    def inner_sync(request):
        raise AssertionError("a static file went past the middleware")

    class Request:
        path_info = "/static/site.css"
        method = "GET"
        META: dict = {}

    with override_settings(STATIC_ROOT=tmp_path, STATIC_URL="/static/"):
        on_loop = StaticFilesMiddleware(inner)
        on_thread = StaticFilesMiddleware(inner_sync)
    response = asyncio.run(on_loop(Request()))
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"body{}"
    assert on_thread(Request()).status_code == 200
