"""The Django route's cancel wrapper (zoomies_site.asgi.django_until_cancelled) leaves no task
behind once a request has been answered.

Django's ASGI handler listens for the disconnect in a task of its own and cancels it when the
response is sent. The wrapper's receive waited on two futures, the client's next message and
its own "gone" event, and a cancel left both pending: every request answered through Django
left a task on `gone.wait()` for the garbage collector, which logged "Task was destroyed but
it is pending!" in the web server's log, one per request.
"""

from __future__ import annotations

import asyncio

import pytest

from zoomies_site.asgi import django_until_cancelled


def scope(path: str) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def still_pending() -> list[str]:
    """Tasks other than this one that have not ended: the wrapper's waits on its "gone"
    event and on the client's next message."""
    return [
        repr(task.get_coro())
        for task in asyncio.all_tasks()
        if task is not asyncio.current_task() and not task.done()
    ]


@pytest.mark.django_db(transaction=True)
def test_an_answered_request_leaves_no_task_waiting():
    async def run() -> tuple[list[dict], list[str]]:
        sent: list[dict] = []
        client_gone = asyncio.Event()  # the client stays connected: receive never ends
        messages: list[dict] = []

        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            await client_gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        for _ in range(3):
            messages[:] = [{"type": "http.request", "body": b"", "more_body": False}]
            await django_until_cancelled(scope("/healthz"), receive, send)
        await asyncio.sleep(0)  # let cancelled tasks finish cancelling
        leftover = still_pending()
        client_gone.set()
        return sent, leftover

    sent, leftover = asyncio.run(run())
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 3 and all(m["status"] in (200, 503) for m in starts)
    assert leftover == [], leftover
