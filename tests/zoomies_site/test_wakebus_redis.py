"""The wake bus across machines: Redis pub/sub when ZOOMIES_REDIS_URL is set (issue 26 item
4). The real Redis server of the test machine; every test names a database of its own, so
two runs sharing the server never wake each other."""

from __future__ import annotations

import select
import subprocess
import sys
import uuid

import pytest

from zoomies_site.core import wakebus

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def database():
    return {"ENGINE": "django.db.backends.postgresql", "NAME": f"zoomies-{uuid.uuid4().hex}"}


@pytest.fixture
def redis_bus(monkeypatch, database):
    monkeypatch.setenv(wakebus.REDIS_ENV, REDIS)
    monkeypatch.setattr(wakebus, "_default_database", lambda: database)
    listeners = []

    def listen(topic):
        listener = wakebus.listen_or_none(topic)
        assert isinstance(listener, wakebus.RedisListener)
        listeners.append(listener)
        return listener

    yield listen
    for listener in listeners:
        listener.close()


def test_a_wake_from_another_process_reaches_every_redis_listener_of_its_topic_only(
    redis_bus, database
):
    """What a web process on another machine would see: a wake published by a separate
    process (no shared socket directory) reaches both listeners of the topic, readable on
    their file descriptor as the event relay waits, and not the other topic's."""
    first, second, other = redis_bus("agent"), redis_bus("agent"), redis_bus("events")
    channel = wakebus.redis_channel("agent", database)
    publisher = (
        "import redis, sys; print(redis.Redis.from_url(sys.argv[1]).publish(sys.argv[2], b'!'))"
    )
    sent = subprocess.run([sys.executable, "-c", publisher, REDIS, channel],
                          capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    assert sent.stdout.strip() == "2"
    readable, _, _ = select.select([first.fileno()], [], [], 5)
    assert readable
    assert first.wait(5) and second.wait(5)
    assert not other.wait(0.2)
    assert not first.wait(0.2)  # drained: one wake, one look


def test_notify_publishes_on_redis_and_another_database_hears_nothing(
    redis_bus, monkeypatch, database
):
    mine = redis_bus("events")
    stranger = wakebus.RedisListener(
        "events", REDIS, channel=wakebus.redis_channel("events", {"NAME": "someone-else"})
    )
    try:
        assert wakebus.notify("events") == 1
        assert mine.wait(5)
        assert not stranger.wait(0.2)
    finally:
        stranger.close()


def test_a_redis_that_cannot_be_reached_is_polling_only_not_an_error(monkeypatch, database):
    monkeypatch.setenv(wakebus.REDIS_ENV, "redis://127.0.0.1:1/0")
    monkeypatch.setattr(wakebus, "_default_database", lambda: database)
    assert wakebus.listen_or_none("agent") is None
    assert wakebus.notify("agent") == 0
