"""The Docker and Podman backends on real engines (BACK-01..05, BACK-13/14, AGENT-10/13/23/24).

Every test runs twice, on a private dockerd and on a private Podman service (conftest.py),
with the locally built test image: busybox, a Python, the fake runner and the production
entrypoint. Containers use network "none", or "host" to reach a fake GitHub on 127.0.0.1.
"""

from __future__ import annotations

import math
import threading

import pytest

from fleet.agent.backends.base import BackendError, RunnerSpec, WorkloadExists, WorkloadStatus
from fleet.agent.backends.container import (
    CPUS_FROM_LABEL,
    CPUS_LABEL,
    DIND_SOCKET_DIR,
    HOST_LABEL,
    MANAGED_LABEL,
    MEMORY_FROM_LABEL,
    MEMORY_LABEL,
    POOL_LABEL,
    ROLE_LABEL,
    RUNNER_ID_LABEL,
    RUNNER_NAME_LABEL,
    CreateTimedOut,
    EngineUnavailable,
    container_name,
    exit_sentence,
    sidecar_name,
)
from fleet.agent.backends.resources import MB, MIN_RESERVE_CPU_FRACTION, MIN_RESERVE_CPUS
from runners.github.fake import FakeGitHub
from tests.fleet.backends.conftest import ROOT, Engine, wait_for
from tests.runners.github.conftest import GitHubClient

# Exits 0 on SIGTERM like the runner does; busybox sh checks its traps between sleeps.
IDLE = ["sh", "-c", "trap 'echo stopping; exit 0' TERM; echo hello from the runner; "
        "while :; do sleep 0.1; done"]  # fmt: skip
# What the container's cgroup says it may use, cgroup v1 or v2.
CGROUP_LIMITS = [
    "sh",
    "-c",
    "if [ -f /sys/fs/cgroup/cpu.max ]; then cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max;"
    " else cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
    " /sys/fs/cgroup/memory/memory.limit_in_bytes; fi",
]


def spec(engine: Engine, runner_id: int, **fields: object) -> RunnerSpec:
    payload = {
        "runner_id": runner_id,
        "runner_name": f"zoomies-test-{runner_id}",
        "pool": "zoomies-linux-x64",
        "backend": engine.kind,
        "image": engine.image,
        "env": {"ACTIONS_RUNNER_INPUT_JITCONFIG": "not-a-real-config"},
        **fields,
    }
    return RunnerSpec.from_payload(payload)


def attrs(engine: Engine, runner_id: int) -> dict:
    client = engine.client()
    try:
        return client.api.inspect_container(container_name(runner_id))
    finally:
        client.close()


def exited(backend, runner_id: int) -> bool:
    return backend.inspect(runner_id).status == WorkloadStatus.EXITED


def test_back01_back02_create_inspect_list_logs_stop_remove(engine: Engine):
    """BACK-01, BACK-02: one interface; the workload labelled with its runner id, pool, host
    and the managed marker; the task's env (the JIT config) in its environment."""
    backend = engine.backend()
    handle = backend.create(spec(engine, 7, command=IDLE))
    assert handle.runner_id == 7 and handle.ref

    seen = attrs(engine, 7)
    labels = seen["Config"]["Labels"]
    assert labels[MANAGED_LABEL] == "true"
    assert labels[RUNNER_ID_LABEL] == "7"
    assert labels[RUNNER_NAME_LABEL] == "zoomies-test-7"
    assert labels[POOL_LABEL] == "zoomies-linux-x64"
    assert labels[HOST_LABEL] == "test-host"
    assert "ACTIONS_RUNNER_INPUT_JITCONFIG=not-a-real-config" in seen["Config"]["Env"]
    # Nothing of the agent's own environment rides along (SEC-05 for containers).
    assert not any(e.startswith("ZOOMIES_") for e in seen["Config"]["Env"])

    workload = backend.inspect(7)
    assert workload.status == WorkloadStatus.RUNNING
    assert (workload.runner_name, workload.pool) == ("zoomies-test-7", "zoomies-linux-x64")
    assert workload.started_at and workload.started_at > 1.7e9
    assert workload.log_ref == f"`{engine.kind} logs zoomies-runner-7` on test-host"
    assert [w.runner_id for w in backend.list()] == [7]
    wait_for(lambda: b"hello from the runner" in backend.logs(7), 10, "the runner's output")

    backend.stop(7, timeout=10)
    workload = backend.inspect(7)
    assert (workload.status, workload.exit_code) == (WorkloadStatus.EXITED, 0)
    assert b"stopping" in backend.logs(7)
    # A finished runner's log is all there to follow until the workload is deleted.
    assert b"hello from the runner" in b"".join(backend.follow_logs(7))
    assert [w.status for w in backend.list()] == [WorkloadStatus.EXITED]

    backend.remove(7)
    assert backend.inspect(7).status == WorkloadStatus.MISSING
    assert backend.list() == []
    assert backend.logs(7) == b""
    backend.remove(7)  # a missing workload is fine
    backend.stop(7, timeout=1)


def test_back01_the_fake_runner_takes_a_job_with_the_jit_config_from_its_environment(
    engine: Engine,
):
    """BACK-01, FAKE-04: the image's own command, a real JIT config minted by the fake
    GitHub in the environment: the runner comes online, runs one job and exits 0; LOG-06:
    the end of its output is read for its end report."""
    with FakeGitHub() as fake:
        inst = fake.add_installation("acme", repositories=["acme/app"])

        gh = GitHubClient(fake)
        try:
            minted = gh.post(
                "/orgs/acme/actions/runners/generate-jitconfig",
                headers=gh.inst(inst),
                json={"name": "zoomies-c-1", "runner_group_id": 1, "labels": ["self-hosted"]},
            ).json()
        finally:
            gh.close()
        backend = engine.backend(network_mode="host")
        backend.create(
            spec(engine, 11, env={"ACTIONS_RUNNER_INPUT_JITCONFIG": minted["encoded_jit_config"]})
        )
        wait_for(lambda: fake.runners(inst) and fake.runners(inst)[0]["status"] == "online",
                 20, "the runner online")  # fmt: skip
        job = fake.queue_job(repo="acme/app", labels=["self-hosted"], duration=0.1)
        wait_for(lambda: exited(backend, 11), 20, "the runner to exit after its job")
        assert backend.inspect(11).exit_code == 0
        assert fake.job(job)["conclusion"] == "success"
        assert f"job {job} finished: success".encode() in backend.logs(11)
        # LOG-06: the end report of a clean exit carries the end of its output too.
        tail = backend.inspect(11).output_tail
        assert tail and f"job {job} finished: success" in tail


@pytest.mark.parametrize(
    ("env", "code", "said"),
    [
        ({"DOCKER_HOST": "unix:///nowhere.sock", "ZOOMIES_DOCKER_WAIT": "1"}, 69, "never answered"),
        ({"DOCKER_HOST": "unix:///nowhere.sock", "ZOOMIES_DOCKER_WAIT": "0"}, 78, "1 to 3600"),
        ({"DOCKER_HOST": "unix:///nowhere.sock", "ZOOMIES_DOCKER_WAIT": "2m"}, 78, "1 to 3600"),
    ],
)
def test_back13_back14_exit_codes_69_and_78_become_a_sentence_that_points_at_the_log(
    engine: Engine, env, code, said
):
    """BACK-13: the image's entrypoint exits 69 when the pool's daemon never answers, 78 on
    an unusable ZOOMIES_DOCKER_WAIT; BACK-14: the sentence names the container's log."""
    backend = engine.backend()
    backend.create(spec(engine, 21, env=env))
    wait_for(lambda: exited(backend, 21), 20, "the runner to give up")
    workload = backend.inspect(21)
    assert workload.exit_code == code
    sentence = exit_sentence(workload.exit_code, workload.log_ref)
    assert sentence is not None and said in sentence and f"(code {code})" in sentence
    assert f"{engine.kind} logs zoomies-runner-21" in sentence
    assert b"zoomies-entrypoint:" in backend.logs(21)
    # The end of the output travels in the end report: the container goes with the workload.
    assert workload.output_tail and "zoomies-entrypoint:" in workload.output_tail
    assert exit_sentence(1, workload.log_ref) is None


def _cgroup_limits(output: bytes) -> tuple[float, int]:
    """(cpus, memory bytes) from the container's own cgroup files."""
    # v1: quota, period, bytes on three lines; v2: "quota period" then bytes.
    quota, period, memory = output.split()
    return int(quota) / int(period), int(memory)


def _engine_cpus(seen: dict) -> float:
    host_config = seen["HostConfig"]
    if host_config.get("NanoCpus"):
        return host_config["NanoCpus"] / 1e9
    return host_config["CpuQuota"] / host_config["CpuPeriod"]


def test_back02_back04_a_pools_figures_become_the_containers_limits(engine: Engine):
    """BACK-04: to the byte and the hundredth of a core, as the engine and the container's
    own cgroup both say; BACK-02: the labels say what it was given, and by whom."""
    backend = engine.backend(slots=4)
    backend.create(spec(engine, 31, cpus=0.37, memory_mb=96, command=CGROUP_LIMITS))
    wait_for(lambda: exited(backend, 31), 20, "the limits to be read")
    seen = attrs(engine, 31)
    assert seen["HostConfig"]["Memory"] == 96 * MB
    assert _engine_cpus(seen) == pytest.approx(0.37, abs=1e-9)
    cpus, memory = _cgroup_limits(backend.logs(31))
    assert (round(cpus, 2), memory) == (0.37, 96 * MB)
    labels = seen["Config"]["Labels"]
    assert (labels[CPUS_LABEL], labels[CPUS_FROM_LABEL]) == ("0.37", "task")
    assert (labels[MEMORY_LABEL], labels[MEMORY_FROM_LABEL]) == ("96", "task")


def test_back04_back05_back07_unset_fields_get_one_slots_share_of_the_allocatable_host(
    engine: Engine,
):
    """BACK-04/05/07: three slots on this machine: each runner gets a third of the machine
    less its reserve (half a core or a twentieth), CPU floored to the hundredth."""
    client = engine.client()
    info = client.info()
    client.close()
    machine = float(info["NCPU"])
    reserve = max(MIN_RESERVE_CPUS, machine * MIN_RESERVE_CPU_FRACTION)
    want_cpus = math.floor((machine - reserve) / 3 * 100 + 1e-9) / 100
    want_memory = (int(info["MemTotal"]) // MB) // 3

    backend = engine.backend(slots=3)
    size = backend.probe()
    assert (size.cpus, size.memory_mb, size.platform) == (
        machine,
        int(info["MemTotal"]) // MB,
        "linux/x64",
    )
    assert size.can_limit_cpus and size.can_limit_memory  # BACK-03
    backend.create(spec(engine, 32, memory_mb=64, command=CGROUP_LIMITS))
    backend.create(spec(engine, 33, command=CGROUP_LIMITS))
    wait_for(lambda: exited(backend, 32) and exited(backend, 33), 20, "the limits to be read")

    cpus, memory = _cgroup_limits(backend.logs(32))
    assert (round(cpus, 2), memory) == (want_cpus, 64 * MB)
    labels = attrs(engine, 32)["Config"]["Labels"]
    assert (labels[CPUS_LABEL], labels[CPUS_FROM_LABEL]) == (f"{want_cpus:.2f}", "host")
    assert labels[MEMORY_FROM_LABEL] == "task"

    seen = attrs(engine, 33)
    assert _engine_cpus(seen) == pytest.approx(want_cpus, abs=1e-9)
    assert seen["HostConfig"]["Memory"] == want_memory * MB
    cpus, memory = _cgroup_limits(backend.logs(33))
    assert (round(cpus, 2), memory) == (want_cpus, want_memory * MB)
    assert seen["Config"]["Labels"][MEMORY_FROM_LABEL] == "host"


def test_back05_no_slots_known_means_no_share_and_no_limit(engine: Engine):
    """BACK-05: an agent that does not know its slots gives no share: the container runs
    unlimited rather than on a made-up figure."""
    backend = engine.backend(slots=None)
    backend.create(spec(engine, 34, command=IDLE))
    seen = attrs(engine, 34)
    assert not seen["HostConfig"].get("NanoCpus") and not seen["HostConfig"].get("CpuQuota")
    assert not seen["HostConfig"]["Memory"]
    assert CPUS_LABEL not in seen["Config"]["Labels"]


def test_agent23_agent24_a_container_left_by_a_previous_agent_is_listed_with_its_runner_id(
    engine: Engine,
):
    """AGENT-23: a fresh backend (a restarted agent) lists what the last one made, by its
    labels; only this host's managed containers. AGENT-24: a second create for the same
    runner is refused, so a redelivered create never builds a second workload."""
    before = engine.backend()
    before.create(spec(engine, 41, command=IDLE))
    engine.backend(host="another-host").create(spec(engine, 42, command=IDLE))
    client = engine.client()
    try:  # not ours: no managed marker
        client.containers.create(engine.image, ["sleep", "30"], name="someone-else",
                                 network_mode="none", labels={RUNNER_ID_LABEL: "43"})  # fmt: skip
    finally:
        client.close()

    after = engine.backend()  # a new agent process: its own client, no memory
    listed = after.list()
    assert [(w.runner_id, w.status, w.runner_name, w.pool) for w in listed] == [
        (41, WorkloadStatus.RUNNING, "zoomies-test-41", "zoomies-linux-x64")
    ]
    with pytest.raises(WorkloadExists):
        after.create(spec(engine, 41, command=IDLE))
    assert after.inspect(41).status == WorkloadStatus.RUNNING
    assert after.inspect(43).status == WorkloadStatus.MISSING


def test_agent13_agent10_a_create_that_hangs_in_the_engine_is_ended_by_the_create_timeout(
    engine: Engine,
):
    """AGENT-13: the engine is frozen mid-create; the create ends at its timeout with a
    sentence, and it is not a transport failure (AGENT-10). Once the engine answers again,
    what the abandoned create made is removed and the next create works."""
    backend = engine.backend(create_timeout=1.5)
    engine.pause()
    try:
        with pytest.raises(CreateTimedOut) as caught:
            backend.create(spec(engine, 51, command=IDLE))
    finally:
        engine.resume()
    assert "within the create timeout (1.5 s)" in str(caught.value)
    assert caught.value.transport_failure is False
    wait_for(
        lambda: backend.inspect(51).status == WorkloadStatus.MISSING and backend.list() == [],
        40,
        "the abandoned create's container to be removed",
    )
    backend.create_timeout = 60
    backend.create(spec(engine, 52, command=IDLE))
    assert backend.inspect(52).status == WorkloadStatus.RUNNING


def test_agent09_an_engine_that_does_not_answer_is_a_transport_failure(engine: Engine):
    """AGENT-09: nobody listening on the socket is the failure that holds further starts."""
    backend = engine.backend_class(f"unix://{engine.root}/nobody-here.sock", host="test-host")
    with pytest.raises(EngineUnavailable) as caught:
        backend.create(spec(engine, 61, command=IDLE))
    assert caught.value.transport_failure is True
    assert engine.backend_class.engine in str(caught.value)
    with pytest.raises(EngineUnavailable):
        backend.list()


def test_pull_policy_never_and_missing(engine: Engine):
    """A pool's image under the pull policy: `never` refuses an image the host lacks;
    `missing` uses a present one without pulling, and pulls an absent one (here from a
    registry address nobody serves, so the create fails with the engine's sentence)."""
    absent = "127.0.0.1:9/zoomies/absent:1"
    with pytest.raises(BackendError, match="not on this host and the pull policy is 'never'"):
        engine.backend(pull_policy="never").create(spec(engine, 71, image=absent))
    missing = engine.backend(pull_policy="missing")
    with pytest.raises(BackendError, match="pull.* the image 127.0.0.1:9/zoomies/absent:1"):
        missing.create(spec(engine, 72, image=absent))
    missing.create(spec(engine, 73, command=IDLE))
    assert [w.runner_id for w in missing.list()] == [73]
    with pytest.raises(BackendError, match="runs an image"):
        missing.create(spec(engine, 74, image=None))


# Prints a numbered line every tenth of a second until it is stopped.
COUNTER = ["sh", "-c", "n=0; while :; do echo line $n; n=$((n+1)); sleep 0.1; done"]


def test_log02_log04_a_followed_log_comes_as_it_is_written_and_closing_stops_the_reader(
    engine: Engine,
):
    """LOG-02: follow_logs yields the container's output as it is written, from its start;
    LOG-04: closing it from another thread (a cancel_logs) ends the reader's iteration."""
    backend = engine.backend()
    backend.create(spec(engine, 11, command=COUNTER))
    follow = backend.follow_logs(11)
    seen: list[bytes] = []
    finished = threading.Event()

    def read() -> None:
        try:
            for piece in follow:
                seen.append(piece)
        finally:
            finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: b"line 5\n" in b"".join(seen), 30, "five lines followed")
    assert b"".join(seen).startswith(b"line 0\nline 1\n")
    assert not finished.is_set()  # the container still runs: the follow is still open
    follow.close()
    reader.join(15)
    assert finished.is_set() and not reader.is_alive()
    backend.remove(11)


# A stand-in for a dind image's daemon (no Docker daemon runs inside a container here): it
# puts a `docker` ahead of the real client on PATH that answers `info` once the "daemon"
# has written its socket, and never otherwise.
FAKE_DAEMON = ["sh", "-c", "printf '#!/bin/sh\\ntest -e /var/run/docker.sock\\n' "
               "> /usr/local/bin/docker && chmod +x /usr/local/bin/docker && "
               "sleep 1 && touch /var/run/docker.sock && while :; do sleep 1; done"]  # fmt: skip
SILENT_DAEMON = ["sh", "-c", "printf '#!/bin/sh\\nexit 1\\n' > /usr/local/bin/docker && "
                 "chmod +x /usr/local/bin/docker && while :; do sleep 1; done"]  # fmt: skip


def test_host20_a_cpu_factor_scales_the_given_cpus_idempotently_and_restores_them(
    engine: Engine,
):
    """HOST-20: the throttle's factor takes the container to factor x what it was given
    (its label), at once and without a restart; the same factor again changes nothing; a
    factor of 1 gives back exactly the figure it was given."""
    backend = engine.backend()
    backend.create(spec(engine, 41, command=IDLE, cpus=1.0, memory_mb=64))
    started = attrs(engine, 41)["State"]["StartedAt"]
    if engine.kind == "podman":
        # Not applied on Podman (PodmanBackend.apply_cpu_factor says why): nothing changes.
        assert backend.apply_cpu_factor(41, 0.5) == 0
        assert _engine_cpus(attrs(engine, 41)) == pytest.approx(1.0)
        backend.remove(41)
        return
    assert backend.apply_cpu_factor(41, 0.5) == 1
    assert _engine_cpus(attrs(engine, 41)) == pytest.approx(0.5)
    assert backend.apply_cpu_factor(41, 0.5) == 0  # already there: not touched
    assert backend.apply_cpu_factor(41, 0.25) == 0  # never below half: already there
    assert backend.apply_cpu_factor(41, 1.0) == 1
    seen = attrs(engine, 41)
    assert _engine_cpus(seen) == pytest.approx(1.0)
    assert seen["State"]["Running"] and seen["State"]["StartedAt"] == started
    backend.remove(41)


def test_back08_back18_host23_a_dind_runner_gets_its_own_daemon_reachable_only_through_their_volume(
    engine: Engine,
):
    """BACK-18: a dind pool's runner is created only after its sidecar answers `docker
    info`; the two share one volume (the daemon's socket) that nothing else mounts, the
    runner's DOCKER_HOST names that socket, the pair lists as one workload, and `remove`
    takes both and the volume. BACK-08: the pair's charge (0.5 CPU and 96 MB, a typed
    0.25 and 48 charged twice) gives each container half of it: the typed figure."""

    # Unprivileged: this engine runs inside a container that may not grant the capabilities
    # a privileged one asks for (runc: "unable to apply caps"), and the stand-in needs none.
    backend = engine.backend(
        dind_image=engine.image, dind_command=FAKE_DAEMON, dind_wait=30, dind_privileged=False
    )
    env = {"ACTIONS_RUNNER_INPUT_JITCONFIG": "x", "ZOOMIES_DOCKER_WAIT": "1"}
    backend.create(spec(engine, 21, command=IDLE, dind=True, env=env, cpus=0.5, memory_mb=96))
    api = engine.client().api
    runner, sidecar = attrs(engine, 21), api.inspect_container(sidecar_name(21))
    assert sidecar["Config"]["Labels"][ROLE_LABEL] == "dind"
    assert runner["HostConfig"]["Privileged"] is False
    # BACK-08: the pair was charged 0.5 CPU and 96 MB; each container is given half.
    for container in (runner, sidecar):
        assert container["HostConfig"]["NanoCpus"] == 250_000_000
        assert container["HostConfig"]["Memory"] == 48 * MB
    # HOST-23: the sidecar keeps its half as its throttle base: halved, then given back
    # (Docker; Podman does not apply the factor, see the test above).
    assert sidecar["Config"]["Labels"][CPUS_LABEL] == "0.25"
    if engine.kind == "docker":
        backend.apply_cpu_factor(21, 0.5)
        assert _engine_cpus(api.inspect_container(sidecar_name(21))) == pytest.approx(0.125)
        backend.apply_cpu_factor(21, 1.0)
        assert _engine_cpus(api.inspect_container(sidecar_name(21))) == pytest.approx(0.25)
    socket = f"unix://{DIND_SOCKET_DIR}/docker.sock"
    assert f"DOCKER_HOST={socket}" in runner["Config"]["Env"]
    holders = sorted(
        c["Name"]
        for c in (api.inspect_container(s["Id"]) for s in api.containers(all=True))
        if any(m.get("Name") == sidecar_name(21) for m in c["Mounts"])
    )
    assert holders == sorted([f"/{container_name(21)}", f"/{sidecar_name(21)}"])
    # The runner image's own wait asked the daemon through the socket in the volume (the
    # stand-in's socket is a plain file, so the real client gets no answer: exit 69).
    wait_for(lambda: exited(backend, 21), 30, "the runner's daemon wait to end")
    assert socket.encode() in backend.logs(21)
    assert [(w.runner_id, w.status) for w in backend.list()] == [(21, WorkloadStatus.EXITED)]

    backend.remove(21)
    client = engine.client()
    assert client.api.containers(all=True) == []
    assert sidecar_name(21) not in [v["Name"] for v in client.api.volumes()["Volumes"] or []]


def test_back18_a_sidecar_that_never_answers_means_no_runner_and_nothing_left(engine: Engine):
    """BACK-18: the bounded probe gives up, the runner is never created, and the sidecar
    and its volume are removed; the error names the sidecar's log."""

    backend = engine.backend(
        dind_image=engine.image, dind_command=SILENT_DAEMON, dind_wait=2, dind_privileged=False
    )
    with pytest.raises(BackendError, match="did not answer `docker info` within 2 s"):
        backend.create(spec(engine, 22, command=IDLE, dind=True))
    client = engine.client()
    assert client.api.containers(all=True) == []
    assert sidecar_name(22) not in [v["Name"] for v in client.api.volumes()["Volumes"] or []]
    no_image = engine.backend()
    with pytest.raises(BackendError, match="no dind image"):
        no_image.create(spec(engine, 23, command=IDLE, dind=True))


def test_sec03_a_runner_container_by_default_reaches_no_engine_and_gains_no_root(engine: Engine):
    """SEC-03 on each engine: the runner's container is not privileged, adds no capability,
    mounts no engine socket, and cannot gain privileges through a setuid binary."""
    backend = engine.backend()
    backend.create(spec(engine, 43, command=IDLE))
    try:
        host = attrs(engine, 43)["HostConfig"]
        assert not host.get("Privileged")
        assert not host.get("CapAdd")
        assert not [b for b in host.get("Binds") or [] if "sock" in b]
        assert any(o.startswith("no-new-privileges") for o in host.get("SecurityOpt") or [])
    finally:
        backend.remove(43)


def test_sec03_the_stock_runner_image_runs_as_a_user_that_is_not_root():
    """The image the catalogue names: its last USER is the runner's own account."""
    users = [
        line.split()[1]
        for line in (ROOT / "docker" / "runner" / "Dockerfile").read_text().splitlines()
        if line.startswith("USER ")
    ]
    assert users and users[-1] not in ("root", "0")
