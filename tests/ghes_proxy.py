"""GitHub Enterprise Server's shape in front of the fake GitHub: its API under `/api/v3` on
the same host as its web side (tests of GHES base URLs; NOTES "GHES")."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from runners.github.fake import FakeGitHub


class PrefixProxy:
    """The fake behind `/api/v3`, as GHES serves its API; Link headers rewritten to match.
    The host's other paths are GHES's web side: the fake runner's registration
    (`/_runner/register`, config.sh's) is passed on as it is, anything else is a 404."""

    HOP = {"connection", "transfer-encoding", "content-length", "keep-alive", "host"}

    def __init__(self, fake: FakeGitHub, prefix: str = "/api/v3") -> None:
        self.paths: list[str] = []
        upstream = httpx.Client(base_url=fake.url, timeout=10)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                proxy.paths.append(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.HOP}
                if self.path.startswith(prefix + "/"):
                    answer = upstream.request(
                        self.command, self.path[len(prefix) :], headers=headers, content=body
                    )
                elif self.path.startswith("/_runner/"):
                    answer = upstream.request(self.command, self.path, headers=headers,
                                              content=body)  # fmt: skip
                else:
                    answer = httpx.Response(404, json={"message": "Not Found"})
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() in proxy.HOP or key.lower() == "content-encoding":
                        continue
                    if key.lower() == "link":
                        value = value.replace(fake.url, proxy.url)
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{prefix}"
        self._upstream = upstream
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._upstream.close()
