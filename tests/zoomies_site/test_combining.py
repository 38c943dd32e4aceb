"""zoomies_site.core.combining: callers that arrive while a group is written are written
together by the next of them, each gets its own outcome, and nobody waits for ever."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.waiting import wait_until
from zoomies_site.core.combining import Combiner


class Refused(Exception):
    pass


class Recorder:
    """A write that records its groups; the first group waits until `release` is set."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.writers: list[str] = []
        self.first_started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[int]) -> list[object]:
        self.groups.append(list(items))
        self.writers.append(threading.current_thread().name)
        if len(self.groups) == 1:
            self.first_started.set()
            assert self.release.wait(10)
        if 666 in items:
            raise OSError("the disk went away")  # the whole group's
        return [Refused(f"no {i}") if i % 7 == 0 else i * 10 for i in items]


def test_one_caller_at_a_time_writes_its_own_alone():
    write = Recorder()
    write.release.set()
    combine = Combiner(write, most=50)
    assert [combine(i) for i in (1, 2, 3)] == [10, 20, 30]
    assert write.groups == [[1], [2], [3]]
    with pytest.raises(Refused, match="no 7"):
        combine(7)


def test_callers_that_arrive_during_a_write_are_written_together_next():
    write = Recorder()
    combine = Combiner(write, most=50)
    with ThreadPoolExecutor(12) as pool:
        first = pool.submit(combine, 1)
        assert write.first_started.wait(10)
        rest = {i: pool.submit(combine, i) for i in range(2, 12)}
        wait_until(lambda: combine.waiting() == 10, 10, "ten callers queued")
        write.release.set()
        assert first.result(10) == 10
        for i, future in rest.items():
            if i == 7:
                with pytest.raises(Refused, match="no 7"):  # its own refusal, nobody else's
                    future.result(10)
            else:
                assert future.result(10) == i * 10
    assert write.groups[0] == [1]
    assert sorted(write.groups[1]) == list(range(2, 12)) and len(write.groups) == 2
    assert combine.waiting() == 0


def test_a_group_larger_than_the_cap_is_written_in_several_and_all_are_answered():
    write = Recorder()
    combine = Combiner(write, most=4)
    with ThreadPoolExecutor(11) as pool:
        first = pool.submit(combine, 1)
        assert write.first_started.wait(10)
        rest = [pool.submit(combine, i) for i in range(2, 12)]
        wait_until(lambda: combine.waiting() == 10, 10, "ten callers queued")
        write.release.set()
        answers = [first.result(10)] + [f.result(10) if f.exception(10) is None else "refused"
                                        for f in rest]  # fmt: skip
    assert answers == [10, 20, 30, 40, 50, 60, "refused", 80, 90, 100, 110]
    assert [len(g) for g in write.groups] == [1, 4, 4, 2]


def test_a_failure_of_the_write_itself_reaches_every_caller_of_its_group_and_no_other():
    write = Recorder()
    combine = Combiner(write, most=50)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(combine, 1)
        assert write.first_started.wait(10)
        doomed = [pool.submit(combine, i) for i in (665, 666, 667)]
        wait_until(lambda: combine.waiting() == 3, 10, "three callers queued")
        write.release.set()
        assert first.result(10) == 10
        errors = [f.exception(10) for f in doomed]
    assert all(isinstance(e, OSError) and "the disk went away" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == 3  # each its own copy, chained to the one raised
    assert all(isinstance(e.__cause__, OSError) for e in errors)
    assert combine(4) == 40  # and the next caller writes as ever


def test_an_answer_count_that_does_not_match_fails_the_group_rather_than_misanswering():
    combine = Combiner(lambda items: [1], most=50)
    assert combine(5) == 1
    with ThreadPoolExecutor(3) as pool:
        gate = threading.Event()

        def slow(items):
            gate.wait(10)
            return [1] if len(items) == 1 else [1]  # one answer for a group of two

        combine = Combiner(slow, most=50)
        first = pool.submit(combine, 1)
        wait_until(lambda: combine.waiting() == 0 and not first.done(), 10, "the first write")
        others = [pool.submit(combine, i) for i in (2, 3)]
        wait_until(lambda: combine.waiting() == 2, 10, "two callers queued")
        gate.set()
        assert first.result(10) == 1
        for future in others:
            with pytest.raises(RuntimeError, match="1 outcomes for 2 items"):
                future.result(10)
