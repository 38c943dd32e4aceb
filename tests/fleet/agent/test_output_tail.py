"""A finished runner's end report carries the end of its output (issue 8 item 14, RUN-15;
issue 9 for a clean exit, LOG-06).

Before, the message pointed at `<work_dir>/runners/<id>/output.log`, a directory the agent
deletes as soon as the controller has the end report: the operator found nothing there.
"""

from __future__ import annotations

import sys

from fleet import protocol
from fleet.agent.backends.base import RunnerSpec, WorkloadStatus
from fleet.agent.backends.process import OUTPUT_TAIL_BYTES, ProcessBackend, read_tail
from tests.waiting import wait_until

PY = sys.executable
# 200,000 bytes of numbered lines, then a last line that says why it failed, exit 3.
NOISY_FAILURE = [
    PY,
    "-c",
    "import sys\n"
    "for i in range(20000): print(f'line {i:05d}')\n"
    "print('FATAL: the runner could not reach GitHub', flush=True)\n"
    "sys.exit(3)\n",
]


def test_run15_a_failed_end_report_carries_the_bounded_end_of_the_output(
    make_agent, controller, clock, dirs
):
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(7, NOISY_FAILURE)
    agent.poll_once(wait=0)
    backend = agent.backends["process"]
    wait_until(lambda: backend.inspect(7).status == WorkloadStatus.EXITED)
    run_dir = dirs[1] / "runners" / "7"

    agent.reconcile_once(clock())
    agent.reconcile_once(clock())

    end = controller.reports_for(7)[-1]
    assert (end["state"], end["exit_code"]) == ("failed", 3)
    tail = end["output_tail"]
    assert tail.endswith("FATAL: the runner could not reach GitHub\n")
    assert "line 19999" in tail and "line 00000" not in tail
    assert len(tail.encode()) <= OUTPUT_TAIL_BYTES
    # The message no longer sends the operator to a file that is about to go.
    assert "output.log" not in end["message"] and "kept with the runner" in end["message"]
    assert not run_dir.exists()


def test_log06_a_clean_exit_carries_the_end_of_its_output_too(make_agent, controller, clock):
    """LOG-06: a runner that exited 0 is reported removed with the end of its output, since
    its workload (and the log in it) is deleted once the controller has the report."""
    agent = make_agent()
    agent.connect()
    controller.enqueue_create(8, [PY, "-c", "print('job 8 finished: success')"])
    agent.poll_once(wait=0)
    wait_until(lambda: agent.backends["process"].inspect(8).status == WorkloadStatus.EXITED)
    agent.reconcile_once(clock())
    end = controller.reports_for(8)[-1]
    assert (end["state"], end["exit_code"]) == ("removed", 0)
    assert end["output_tail"] == "job 8 finished: success\n"


def test_read_tail_is_valid_text_whatever_the_bytes(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(b"\xff\xfe bad \x00 nul " + "é".encode() * 10)
    text = read_tail(log, limit=15)
    assert "\x00" not in text and text.endswith("é")
    assert protocol.RunnerReport.from_json({"runner_id": 1, "output_tail": text}).output_tail
    assert read_tail(tmp_path / "missing.log") is None


def test_the_protocol_bounds_the_tail():
    ok = "x" * protocol.MAX_OUTPUT_TAIL
    assert protocol.RunnerReport.from_json({"runner_id": 1, "output_tail": ok}).output_tail == ok
    for bad in ("x" * (protocol.MAX_OUTPUT_TAIL + 1), "a\x00b", 5):
        try:
            protocol.RunnerReport.from_json({"runner_id": 1, "output_tail": bad})
        except protocol.ProtocolError as exc:
            assert "output_tail" in str(exc)
        else:
            raise AssertionError(f"{bad!r:.20} was accepted")


def test_the_backend_reads_the_tail_only_once_the_runner_exited(tmp_path):
    backend = ProcessBackend(tmp_path / "work")

    backend.create(
        RunnerSpec(7, "zoomies-t-7", "zoomies-p", "process",
                   command=[PY, "-c", "import time; print('hi', flush=True); time.sleep(30)"])
    )  # fmt: skip
    try:
        assert backend.inspect(7).output_tail is None
    finally:
        backend.remove(7)
