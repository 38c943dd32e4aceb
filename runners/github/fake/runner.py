"""The fake GitHub Actions runner: consumes a JIT config from the fake GitHub and runs one job.

Run it as `python -m runners.github.fake.runner [--jitconfig X]`, or with the config in
ACTIONS_RUNNER_INPUT_JITCONFIG (read, then removed from the environment, as actions/runner
does). Standard library only and self-contained, so this one file can be copied into a test
image and run as `python runner.py`.

Protocol with the fake (private, under /_runner/, see server.py): open a session with the
runner id and secret from the config, long-poll for a job, run it for its duration, report
its conclusion. Exit codes follow the real listener's
(actions/runner Constants.cs): 0 after the one job (ephemeral) or on SIGTERM/SIGINT,
1 (TerminatedError) for a garbage or refused config or a registration removed under it,
2 (RetryableError) when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import http.client
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

ENV_JITCONFIG = "ACTIONS_RUNNER_INPUT_JITCONFIG"
# A non-ephemeral pool's runner: what the production entrypoint hands config.sh.
ENV_RUNNER_URL, ENV_RUNNER_TOKEN = "ZOOMIES_RUNNER_URL", "ZOOMIES_RUNNER_TOKEN"
ENV_RUNNER_NAME, ENV_RUNNER_LABELS = "ZOOMIES_RUNNER_NAME", "ZOOMIES_RUNNER_LABELS"
VERSION = "2.329.0"

EXIT_SUCCESS = 0
EXIT_TERMINATED = 1
EXIT_RETRYABLE = 2

# How long to keep trying an unreachable server before giving up with EXIT_RETRYABLE.
UNREACHABLE_GIVE_UP = 15.0
# The waits between session tries while GitHub answers a server error (doubling).
SESSION_RETRY_FIRST, SESSION_RETRY_MAX = 0.2, 5.0


class ConfigError(Exception):
    """The JIT config is not one this runner can use."""


class Refused(Exception):
    """The fake answered with a refusal that ends this runner (exit 1)."""


@dataclass(frozen=True)
class JitConfig:
    """What a runner needs from its encoded JIT config (the `.runner` and `.credentials`)."""

    runner_id: int
    name: str
    server_url: str
    secret: str
    ephemeral: bool
    files: dict[str, bytes]


def decode_jit_config(encoded: str) -> JitConfig:
    """Decode `encoded_jit_config`: base64 of a JSON object of file name -> base64 content."""
    try:
        files_b64 = json.loads(base64.b64decode(encoded.strip(), validate=True))
        if not isinstance(files_b64, dict):
            raise ConfigError("the config is not a JSON object of files")
        files = {name: base64.b64decode(body, validate=True) for name, body in files_b64.items()}
        settings = _case_insensitive(json.loads(files[".runner"]))
        credentials = json.loads(files[".credentials"])
        ephemeral = settings.get("ephemeral", False)
        if not isinstance(ephemeral, bool):
            ephemeral = str(ephemeral).strip().lower() == "true"
        return JitConfig(
            runner_id=int(settings["agentid"]),
            name=str(settings["agentname"]),
            server_url=str(settings["serverurl"]).rstrip("/"),
            secret=str(credentials["data"]["secret"]),
            ephemeral=ephemeral,
            files=files,
        )
    except ConfigError:
        raise
    except (binascii.Error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"unreadable JIT config ({exc.__class__.__name__}: {exc})") from None


def _case_insensitive(settings: Any) -> dict[str, Any]:
    """`.runner`'s keys as the runner reads them: RunnerSettings member names, any case.

    GitHub's JIT configuration spells them as the members are named (`AgentId`); the file
    `config.sh` writes camel-cases them (`agentId`); Newtonsoft.Json reads both.
    """
    if not isinstance(settings, dict):
        raise ConfigError("the .runner file is not a JSON object")
    return {str(key).lower(): value for key, value in settings.items()}


def read_jit_config(argv: Sequence[str], environ: MutableMapping[str, str]) -> str | None:
    """The encoded config from `--jitconfig` or the environment, which loses the variable."""
    parser = argparse.ArgumentParser(prog="fake-runner", description=__doc__.split("\n")[0])
    parser.add_argument("--jitconfig", help="the encoded JIT config")
    args = parser.parse_args(list(argv))
    from_env = environ.pop(ENV_JITCONFIG, None)
    return args.jitconfig or from_env


def _os_name() -> str:
    return {"darwin": "macos"}.get(platform.system().lower(), platform.system().lower())


def _arch_name() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}.get(machine, machine)


class FakeRunner:
    """One ephemeral runner: open a session, long-poll, run the job it is handed, exit."""

    def __init__(self, config: JitConfig, *, out: TextIO | None = None, poll_wait: float = 20.0):
        self.config = config
        self.out = out if out is not None else sys.stdout
        self.poll_wait = poll_wait
        self._stop = threading.Event()
        self._session: str | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._in_poll = False
        self._lock = threading.Lock()
        parts = urllib.parse.urlsplit(config.server_url)
        self._scheme = parts.scheme
        self._netloc = parts.netloc
        self._base_path = parts.path.rstrip("/")

    def log(self, message: str) -> None:
        print(f"[fake-runner {self.config.name}] {message}", file=self.out, flush=True)

    def stop(self) -> None:
        """Ask the runner to stop; safe from a signal handler or another thread."""
        self._stop.set()
        with self._lock:
            conn = self._conn if self._in_poll else None
        # Shutting the socket wakes a long-poll blocked in recv; other calls may finish.
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self) -> int:
        """The runner's whole life; returns the process exit code."""
        try:
            return self._run()
        except Refused as exc:
            self.log(f"refused: {exc}; exiting")
            return EXIT_TERMINATED
        except OSError as exc:
            self.log(f"cannot reach {self.config.server_url}: {exc}; exiting")
            return EXIT_RETRYABLE
        finally:
            self._close()

    def _run(self) -> int:
        self.log(f"runner id {self.config.runner_id} at {self.config.server_url}")
        hello = {
            "runner_id": self.config.runner_id,
            "secret": self.config.secret,
            "os": _os_name(),
            "arch": _arch_name(),
            "version": VERSION,
        }
        status, body = self._call_retrying("POST", "/_runner/sessions", hello)
        delay = SESSION_RETRY_FIRST
        while status >= 500 and not self._stop.is_set():
            # A server error is retried for as long as it lasts, as the listener does: the
            # runner stays alive and its registration offline (the fake's held runners).
            if delay == SESSION_RETRY_FIRST:
                self.log(f"session answered {status}; retrying until GitHub can be reached")
            self._stop.wait(delay)
            delay = min(delay * 2, SESSION_RETRY_MAX)
            status, body = self._call_retrying("POST", "/_runner/sessions", hello)
        if self._stop.is_set() and status != 201:
            self.log("stopped before GitHub could be reached")
            return EXIT_SUCCESS
        if status != 201:
            raise Refused(f"session refused ({status}: {body.get('message', '')})")
        self._session = body["session"]
        self.log("session open; online and listening for a job")
        while not self._stop.is_set():
            with self._lock:
                self._in_poll = True
            try:
                status, body = self._call_retrying("GET", f"/_runner/jobs?wait={self.poll_wait:g}")
            except OSError:
                if self._stop.is_set():
                    break
                raise
            finally:
                with self._lock:
                    self._in_poll = False
            if status == 204:
                continue
            if status != 200:
                raise Refused(f"job poll refused ({status}: {body.get('message', '')})")
            conclusion = self._run_job(body["job"])
            if self.config.ephemeral or conclusion == "cancelled":
                self.log("ephemeral runner finished its one job; exiting")
                return EXIT_SUCCESS
        self.log("stopping: closing the session")
        self._end_session()
        return EXIT_SUCCESS

    def _run_job(self, job: dict[str, Any]) -> str:
        job_id = job["id"]
        self.log(f"got job {job_id} ({job['repository']}, runs-on {job['labels']})")
        # The job "runs" for its duration; a stop request cancels it like SIGTERM would.
        conclusion = job["conclusion"]
        if self._stop.wait(float(job["duration"])):
            conclusion = "cancelled"
        status, body = self._call_retrying(
            "POST", f"/_runner/jobs/{job_id}/complete", {"conclusion": conclusion}
        )
        if status != 200:
            raise Refused(f"job completion refused ({status}: {body.get('message', '')})")
        self.log(f"job {job_id} finished: {conclusion}")
        return conclusion

    def _end_session(self) -> None:
        try:
            self._call("DELETE", "/_runner/sessions")
        except OSError:
            pass

    def _connection(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._conn is None:
                cls = (
                    http.client.HTTPSConnection
                    if self._scheme == "https"
                    else http.client.HTTPConnection
                )
                self._conn = cls(self._netloc, timeout=self.poll_wait + 10)
            return self._conn

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _call(self, method: str, path: str, payload: Any = None) -> tuple[int, dict[str, Any]]:
        headers = {"User-Agent": f"GitHubActionsRunner-fake/{VERSION}"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if self._session is not None:
            headers["Authorization"] = f"Bearer {self._session}"
        for attempt in (1, 2):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request(method, self._base_path + path, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                # A kept-alive connection the server has since closed gets one fresh retry.
                if attempt == 1 and reused and not self._stop.is_set():
                    continue
                raise OSError(str(exc) or exc.__class__.__name__) from None
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        return response.status, data if isinstance(data, dict) else {}

    def _call_retrying(self, method: str, path: str, payload: Any = None) -> tuple[int, dict]:
        """A call that rides out a short outage of the server, like the listener does."""
        deadline = time.monotonic() + UNREACHABLE_GIVE_UP
        delay = 0.1
        while True:
            try:
                return self._call(method, path, payload)
            except OSError:
                if self._stop.is_set() or time.monotonic() >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)


def configure(environ: MutableMapping[str, str]) -> str | None:
    """config.sh, the fake's way (a non-ephemeral pool, SCHED-15): register with the token
    at the web URL's host and get this runner's settings, encoded as a JIT config is. None
    when the environment carries no registration token."""
    token = environ.pop(ENV_RUNNER_TOKEN, "")
    if not token:
        return None
    url = environ.get(ENV_RUNNER_URL, "")
    parts = urllib.parse.urlsplit(url)
    body = json.dumps({
        "url": url, "token": token, "name": environ.get(ENV_RUNNER_NAME, ""),
        "labels": [x for x in environ.get(ENV_RUNNER_LABELS, "").split(",") if x],
        "ephemeral": False,
    }).encode()  # fmt: skip
    conn_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_class(parts.netloc, timeout=30)
    try:
        conn.request("POST", "/_runner/register", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        payload = json.loads(answer.read() or b"{}")
    finally:
        conn.close()
    if answer.status != 201:
        raise ConfigError(f"config.sh: {url} refused the registration ({answer.status}: "
                          f"{payload.get('message', '')})")  # fmt: skip
    print(f"[fake-runner] configured at {url} as {environ.get(ENV_RUNNER_NAME, '')}", flush=True)
    return str(payload["encoded_jit_config"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: read the config (or configure with a registration token), run until the
    one job is done (ephemeral) or until stopped, return the exit code."""
    encoded = read_jit_config(sys.argv[1:] if argv is None else argv, os.environ)
    try:
        encoded = encoded or configure(os.environ)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"[fake-runner] {exc}; exiting", flush=True)
        return EXIT_TERMINATED
    if not encoded:
        print("[fake-runner] no JIT config (--jitconfig or ACTIONS_RUNNER_INPUT_JITCONFIG) "
              "and no registration token (ZOOMIES_RUNNER_TOKEN)")  # fmt: skip
        return EXIT_TERMINATED
    try:
        config = decode_jit_config(encoded)
    except ConfigError as exc:
        print(f"[fake-runner] {exc}; exiting", flush=True)
        return EXIT_TERMINATED
    runner = FakeRunner(config)

    def on_signal(signum: int, frame: object) -> None:
        runner.log(f"received signal {signum}")
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
