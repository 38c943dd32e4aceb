"""A Proxmox VE API client on httpx (issue 24 item 1, MACH-18).

API-token auth (`PVEAPIToken=USER@REALM!TOKENID=SECRET`: no ticket, no CSRF header), TLS
always verified (against the cluster's CA file, or a pinned SHA-256 fingerprint of the
node's certificate, or the system's trust store; never off), every long operation followed
to its task's end through its UPID, and every failure turned into the contract's terms:

- an answer that says no (400 with the schema's errors, 401, 403, a 500 whose reason names
  what went wrong, a task that ended in error) is `Refused`: the outcome is known;
- no answer (a timeout, a dropped connection, a gateway's 5xx, a task still running when
  we stop waiting) is `OutcomeUnknown`, and a cluster that cannot be reached at all is
  `ProviderDown`.

Calls in flight are bounded per cluster, and clones per template (many parallel clones of
one template end in "can't lock file ... got timeout").
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from fleet.providers.contract import NotFound, OutcomeUnknown, ProviderDown, Refused

TOKEN = re.compile(r"^(?P<user>[^\s:/]+@[A-Za-z][\w.-]+)!(?P<id>[A-Za-z][\w.-]*)=(?P<secret>\S+)$")
FINGERPRINT = re.compile(r"^([0-9a-f]{2}:?){31}[0-9a-f]{2}$", re.IGNORECASE)
# pveproxy answers 595/596 when it could not reach the node it proxies to: no answer either.
NO_ANSWER_STATUSES = frozenset({502, 503, 504, 595, 596, 599})
# A task not finished within this long is an unknown outcome, not a failure.
TASK_WAIT = 600.0


class ApiError(Refused):
    """Proxmox answered with an error status: nothing was done (the outcome is known)."""

    def __init__(self, status: int, message: str, errors: Mapping[str, str] | None = None):
        self.status = status
        self.message = message
        self.errors = dict(errors or {})
        detail = "; ".join(f"{k}: {v}" for k, v in sorted(self.errors.items()))
        super().__init__(f"{status} {message}" + (f" ({detail})" if detail else ""))


class TaskFailed(Refused):
    """A task ran to its end with an error; `exitstatus` is Proxmox's text for it."""

    def __init__(self, upid: str, exitstatus: str) -> None:
        self.upid = upid
        self.exitstatus = exitstatus
        super().__init__(f"task {upid} failed: {exitstatus}")


class CertificateRefused(Refused):
    """The server's certificate is not the one we trust (CA or pin): no request was sent."""


def _missing(error: Exception) -> bool:
    return "does not exist" in str(error)


@dataclass(frozen=True)
class Endpoint:
    """Where a cluster answers and how to trust it. `fingerprint` pins the SHA-256 of the
    certificate the node serves (what `pvenode cert info` prints); `ca_file` is the
    cluster's CA (`/etc/pve/pve-root-ca.pem`), or `ca_pem` the same CA as text (what
    onboarding enrolled); with none of them, the system's trust store."""

    url: str
    token: str = field(repr=False)
    ca_file: str = ""
    ca_pem: str = field(default="", repr=False)
    fingerprint: str = ""
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if not self.url.startswith("https://"):
            raise ValueError(f"a Proxmox endpoint is https:// (TLS is never off), not {self.url!r}")
        if not TOKEN.match(self.token):
            raise ValueError("an API token is USER@REALM!TOKENID=SECRET")
        if self.fingerprint and not FINGERPRINT.match(self.fingerprint):
            raise ValueError("a fingerprint is 32 bytes of SHA-256 in hex")

    @property
    def token_id(self) -> str:
        return self.token.partition("=")[0]  # USER@REALM!TOKENID, checked in __post_init__


class _PinnedContext(ssl.SSLContext):
    """Trusts exactly one certificate, by the SHA-256 of its DER form. The check runs in
    wrap_socket, after the handshake and before a byte of the request (or the token) is
    written, so a different certificate never sees the credential."""

    pin: bytes = b""

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        sock = super().wrap_socket(*args, **kwargs)
        der = sock.getpeercert(binary_form=True) or b""
        if hashlib.sha256(der).digest() != self.pin:
            sock.close()
            raise ssl.SSLCertVerificationError(
                "the certificate's SHA-256 fingerprint is not the pinned one"
            )
        return sock


def ssl_context(endpoint: Endpoint) -> ssl.SSLContext:
    if endpoint.fingerprint:
        pinned = _PinnedContext(ssl.PROTOCOL_TLS_CLIENT)
        pinned.check_hostname = False  # the pin names the certificate itself
        pinned.verify_mode = ssl.CERT_NONE
        pinned.pin = bytes.fromhex(endpoint.fingerprint.replace(":", ""))
        return pinned
    if endpoint.ca_pem:
        return ssl.create_default_context(cadata=endpoint.ca_pem)
    if endpoint.ca_file:
        return ssl.create_default_context(cafile=endpoint.ca_file)
    return ssl.create_default_context()


_slots_lock = threading.Lock()
_slots: dict[tuple[str, ...], threading.BoundedSemaphore] = {}


def _slot(key: tuple[str, ...], size: int) -> threading.BoundedSemaphore:
    """One semaphore per cluster (or per cluster and template) in this process, shared by
    every client of it, so two providers on one cluster share its bound."""
    with _slots_lock:
        found = _slots.get(key)
        if found is None:
            found = _slots[key] = threading.BoundedSemaphore(size)
        return found


def parse_upid(upid: str) -> dict[str, str]:
    """`UPID:node:pid:pstart:starttime:type:id:user:` -> its fields."""
    parts = upid.split(":")
    if len(parts) < 9 or parts[0] != "UPID":
        raise OutcomeUnknown(f"not a task id: {upid!r}")
    return {"node": parts[1], "type": parts[5], "id": parts[6], "user": parts[7]}


class Client:
    """One cluster's API. Thread-safe: httpx.Client is, and the bounds are semaphores."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        name: str = "proxmox",
        max_in_flight: int = 4,
        clones_per_template: int = 2,
        task_wait: float = TASK_WAIT,
        poll_interval: float = 0.25,
    ) -> None:
        self.endpoint = endpoint
        self.name = name
        self.task_wait = task_wait
        self.poll_interval = poll_interval
        self.clones_per_template = clones_per_template
        self._in_flight = _slot(("cluster", endpoint.url), max_in_flight)
        self._http = httpx.Client(
            base_url=endpoint.url.rstrip("/") + "/api2/json",
            verify=ssl_context(endpoint),
            timeout=endpoint.timeout,
            headers={"Authorization": f"PVEAPIToken={endpoint.token}"},
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment sees the token
        )

    def close(self) -> None:
        self._http.close()

    # -- calls ---------------------------------------------------------------------------

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params)

    def post(self, path: str, **params: Any) -> Any:
        return self.call("POST", path, params)

    def put(self, path: str, **params: Any) -> Any:
        return self.call("PUT", path, params)

    def delete(self, path: str, **params: Any) -> Any:
        return self.call("DELETE", path, params)

    def call(self, method: str, path: str, params: Mapping[str, Any]) -> Any:
        wire = {k: _wire(v) for k, v in params.items() if v is not None}
        # Writes send a form body, as Proxmox's own clients do; reads and deletes a query.
        body = method in ("POST", "PUT")
        with self._in_flight:
            try:
                answer = self._http.request(
                    method, path, data=wire if body else None, params=None if body else wire
                )
            except httpx.ConnectError as exc:
                if _tls_failure(exc):
                    raise CertificateRefused(
                        f"{self.name}: TLS verification failed: {exc}"
                    ) from exc
                raise ProviderDown(f"{self.name} cannot be reached: {exc}") from exc
            except httpx.ConnectTimeout as exc:
                raise ProviderDown(f"{self.name} cannot be reached: {exc!r}") from exc
            except httpx.TransportError as exc:  # read/write timeouts, dropped connections
                raise OutcomeUnknown(f"{self.name}: no answer to {method} {path}: {exc!r}") from exc
        return self._data(method, path, answer)

    def _data(self, method: str, path: str, answer: httpx.Response) -> Any:
        status = answer.status_code
        if status == 200:
            try:
                return answer.json()["data"]
            except (ValueError, KeyError, TypeError) as exc:
                raise OutcomeUnknown(f"{self.name}: {method} {path}: not an answer") from exc
        if status in NO_ANSWER_STATUSES:
            raise OutcomeUnknown(f"{self.name}: {method} {path}: {status} {answer.reason_phrase}")
        errors: dict[str, str] = {}
        try:
            errors = dict(answer.json().get("errors") or {})
        except (ValueError, AttributeError):
            pass
        message = answer.reason_phrase or "error"
        if status == 401:
            message = f"authentication failed ({message}): is the API token still valid?"
        error = ApiError(status, message, errors)
        if status == 500 and _missing(error):
            raise NotFound(str(error)) from error
        raise error

    # -- tasks and bounds -----------------------------------------------------------------

    def wait_task(self, upid: str, *, wait: float | None = None) -> str:
        """Follow a task to its end: its exit status when it succeeded (`OK`, or `WARNINGS:
        n`), TaskFailed when it ended in error, OutcomeUnknown while it is still running
        after `wait` seconds."""
        node = parse_upid(upid)["node"]
        deadline = time.monotonic() + (self.task_wait if wait is None else wait)
        pause = self.poll_interval
        while True:
            status = self.get(f"/nodes/{node}/tasks/{upid}/status")
            if status.get("status") == "stopped":
                exitstatus = str(status.get("exitstatus", ""))
                if exitstatus == "OK" or exitstatus.startswith("WARNINGS"):
                    return exitstatus
                raise TaskFailed(upid, exitstatus or "no exit status")
            if time.monotonic() >= deadline:
                raise OutcomeUnknown(f"{self.name}: task {upid} still running")
            time.sleep(pause)
            pause = min(pause * 1.5, 2.0)

    @contextmanager
    def clone_slot(self, template: int) -> Iterator[None]:
        """At most `clones_per_template` clones of one template at once, in this process."""
        slot = _slot(("template", self.endpoint.url, str(template)), self.clones_per_template)
        with slot:
            yield


def _wire(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError | ssl.CertificateError):
            return True
        if isinstance(seen, socket.gaierror):
            return False
        seen = seen.__cause__ or seen.__context__
    return "CERTIFICATE" in str(exc).upper()
