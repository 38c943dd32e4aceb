"""The production GitHub client: a GitHub App and its installations (ARCH-10).

`GitHubApp` holds the App's identity, one `httpx.Client` (so connections are reused), the
JWT and the installation-token cache; `InstallationClient` (installation.py) is the
per-installation view the controller uses for runners, registrations and job listings.

What every call does:

* sends `Accept: application/vnd.github+json`, `X-GitHub-Api-Version: 2022-11-28` and
  `User-Agent: zoomies`;
* counts itself, and the rate-limit headers it saw, against its installation (App-level
  calls made with the JWT count under `None`), so the controller can expose the remaining
  quota (20 to 100 runners can use up an installation's 5,000 calls an hour);
* on a 401 with an installation token, mints a new token and retries once;
* turns a rate-limit refusal into `RateLimited` carrying `retry_at` as a number (POLL-06),
  or None when GitHub gave no time (POLL-07: the caller's fallback);
* never puts a token or the JWT into a message or a log line;
* asks for every page of a list with `If-None-Match` and the ETag GitHub gave for it last
  time, and takes a 304 as "the page you have": GitHub does not count a 304 against the
  rate limit, so listing something that has not changed costs nothing (`Listing.changed`
  says whether anything did).

Base URLs: `https://api.github.com`, or `https://<host>/api/v3` for GHES; paths are
appended to it as they are, so a path prefix needs nothing special.

No Django here: the controller builds a `GitHubApp` from the settings registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from runners.github.auth import (
    AppJwt,
    Clock,
    InstallationToken,
    InstallationTokenCache,
    parse_github_time,
)
from runners.github.calls import CallStats, Listing
from runners.github.errors import Conflict, GitHubError, NotFound, RateLimited, TransportError
from runners.github.installation import InstallationClient, JitConfig
from zoomies_site.core import metrics

__all__ = [
    "DEFAULT_BASE_URL",
    "CallStats",
    "GitHubApp",
    "InstallationClient",
    "JitConfig",
    "Listing",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
USER_AGENT = "zoomies"
PER_PAGE = 100  # GitHub's maximum page size.
MAX_PAGES = 1000  # A guard against a Link header that never ends, not a real limit.
# The App's webhook deliveries listed in one call of `hook_deliveries`, at most: 1,000.
HOOK_DELIVERY_PAGES = 10
# Below GitHub's secondary limit of 100 concurrent requests, leaving room for other tools.
MAX_CONNECTIONS = 50
# Pages remembered with their ETag for conditional requests, least recently used dropped.
ETAG_CACHE_PAGES = 4096
# A conditional page's cache key: (installation, URL, sorted query parameters).
_PageKey = tuple[int | None, str, tuple[tuple[str, Any], ...]]
_RATE_LIMIT_WORDS = ("rate limit", "abuse detection")


def _header_int(headers: httpx.Headers, name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def _retry_after_seconds(value: str, now: float) -> float | None:
    """`retry-after` as seconds from now: GitHub sends seconds; HTTP also allows a date."""
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _github_message(response: httpx.Response) -> str:
    """GitHub's own `message` from an error body, trimmed; never the headers."""
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase or ""
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(message, str):
        return message[:300]
    return response.reason_phrase or ""


def _when(retry_at: float | None, now: float) -> str:
    """For a message only: the caller reads `RateLimited.retry_at`, never this text."""
    if retry_at is None:
        return "GitHub gave no time"
    try:
        instant = datetime.fromtimestamp(retry_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # A reset no clock can show.
        instant = f"epoch {retry_at:.0f}"
    return f"quota returns at {instant} (in {retry_at - now:.0f} s)"


class GitHubApp:
    """A GitHub App: its JWT, its installation tokens and one HTTP connection pool.

    Thread-safe: the controller's loops and its concurrent JIT minting share one instance.
    """

    def __init__(
        self,
        app_id: int,
        private_key_pem: str,
        base_url: str = DEFAULT_BASE_URL,
        clock: Clock = time.time,
        timeout: float = 10.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base = httpx.URL(base_url.rstrip("/"))
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"the GitHub API URL must be http(s)://host[/path], not {base_url!r}")
        self.app_id = int(app_id)
        self.base_url = str(base).rstrip("/")
        self._base = httpx.URL(self.base_url)
        self._clock = clock
        self._timeout = timeout
        self._jwt = AppJwt(self.app_id, private_key_pem, clock)
        self._tokens = InstallationTokenCache(self._mint_installation_token, clock)
        self._stats: dict[int | None, CallStats] = {}
        # (installation, URL, query) -> (ETag, page body, next URL): conditional list calls.
        self._etags: OrderedDict[_PageKey, tuple[str, Any, str | None]] = OrderedDict()
        self._etags_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._http = httpx.Client(
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": USER_AGENT,
            },
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
            ),
            # Renamed repositories answer with a redirect; httpx drops Authorization when a
            # redirect leaves the origin, so following them cannot leak a token.
            follow_redirects=True,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"<GitHubApp app_id={self.app_id} base_url={self.base_url!r}>"

    def close(self) -> None:
        self._http.close()

    def now(self) -> float:
        """Epoch seconds on this App's clock (the one rate-limit resets are compared with)."""
        return self._clock()

    def __enter__(self) -> GitHubApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- credentials -------------------------------------------------------------------

    def jwt(self) -> str:
        """The App JWT (RS256; iat a minute ago, exp in nine minutes), cached."""
        return self._jwt.get()

    def installation_token(self, installation_id: int) -> str:
        """A token for the installation with at least five minutes left, cached."""
        return self._tokens.get(int(installation_id))

    @property
    def token_mints(self) -> int:
        """How many installation tokens this App has minted (for tests and metrics)."""
        return self._tokens.mints

    def _mint_installation_token(self, installation_id: int) -> InstallationToken:
        path = f"/app/installations/{installation_id}/access_tokens"
        response = self._app_request("POST", path, context_installation=installation_id)
        self._expect(response, "POST", path, installation_id, 201)
        body = self._body(response, "POST", path, installation_id)
        try:
            token = body["token"]
            expires_at = parse_github_time(body["expires_at"]).timestamp()
            if not isinstance(token, str) or not token:
                raise TypeError("token")
        except (KeyError, TypeError, ValueError):
            raise self._shape_error("POST", path, installation_id) from None
        return InstallationToken(token=token, expires_at=expires_at)

    # -- App-level calls (JWT) -----------------------------------------------------------

    def installations(self) -> list[dict[str, Any]]:
        """Every installation of this App (`GET /app/installations`, all pages)."""
        return self._paginate(
            lambda url, params: self._app_request("GET", url, params=params),
            "/app/installations",
            {},
            key=None,
            installation_id=None,
        )

    def installation(self, installation_id: int) -> dict[str, Any]:
        path = f"/app/installations/{int(installation_id)}"
        response = self._app_request("GET", path, context_installation=int(installation_id))
        self._expect(response, "GET", path, int(installation_id), 200)
        body = self._body(response, "GET", path, int(installation_id))
        if not isinstance(body, dict):
            raise self._shape_error("GET", path, int(installation_id))
        return body

    def for_installation(self, installation_id: int) -> InstallationClient:
        return InstallationClient(self, int(installation_id))

    # -- the App's webhook deliveries (JWT) ----------------------------------------------

    def hook_deliveries(
        self,
        *,
        until: Callable[[list[Any]], bool] | None = None,
        max_pages: int = HOOK_DELIVERY_PAGES,
    ) -> Listing:
        """The App webhook's deliveries, newest first (`GET /app/hook/deliveries`).

        Follows the `Link` header's cursor at 100 a page, each page asked for with its
        last ETag, and stops after a page for which `until(page)` is true, at the list's
        end, or after `max_pages` pages (`Listing.truncated`). No `status` filter: GitHub's
        `failure` is status codes 400-599, and a delivery nothing answered (a timeout, no
        connection) has status_code 0, in neither range.
        """
        return self._listing(
            lambda url, page_params, headers: self._app_request(
                "GET", url, params=page_params, headers=headers
            ),
            "/app/hook/deliveries",
            {},
            key=None,
            installation_id=None,
            conditional=True,
            until=until,
            page_limit=max_pages,
        )

    def redeliver_hook_delivery(self, delivery_id: int) -> None:
        """Ask GitHub to send a delivery again (`POST .../attempts`, 202).

        GitHub sends it under the same `X-GitHub-Delivery` and lists it as a new delivery
        with `redelivery: true`. NotFound for an unknown id; GitHubError (422) for one
        GitHub will not redeliver, such as one older than its redelivery window.
        """
        path = f"/app/hook/deliveries/{int(delivery_id)}/attempts"
        response = self._app_request("POST", path)
        self._expect(response, "POST", path, None, 202)

    # -- stats ---------------------------------------------------------------------------

    def stats(self, installation_id: int | None) -> CallStats:
        """Calls and last-seen quota for one installation (None: the App's JWT calls)."""
        with self._stats_lock:
            return self._stats.get(installation_id, CallStats())

    def all_stats(self) -> dict[int | None, CallStats]:
        with self._stats_lock:
            return dict(self._stats)

    def _record(self, key: int | None, response: httpx.Response | None, now: float) -> None:
        with self._stats_lock:
            current = self._stats.get(key, CallStats())
            if response is None:
                self._stats[key] = replace(current, transport_errors=current.transport_errors + 1)
                return
            headers = response.headers
            changes: dict[str, Any] = {
                "calls": current.calls + 1,
                "last_status": response.status_code,
                "last_call_at": now,
            }
            if response.status_code == 304:
                changes["not_modified"] = current.not_modified + 1
            for attr, header in (
                ("rate_limit_limit", "x-ratelimit-limit"),
                ("rate_limit_remaining", "x-ratelimit-remaining"),
                ("rate_limit_used", "x-ratelimit-used"),
            ):
                value = _header_int(headers, header)
                if value is not None:
                    changes[attr] = value
            reset = _header_int(headers, "x-ratelimit-reset")
            if reset is not None:
                changes["rate_limit_reset"] = float(reset)
            if "x-ratelimit-resource" in headers:
                changes["rate_limit_resource"] = headers["x-ratelimit-resource"]
            self._stats[key] = replace(current, **changes)

    def _count_rate_limited(self, key: int | None) -> None:
        with self._stats_lock:
            current = self._stats.get(key, CallStats())
            self._stats[key] = replace(current, rate_limited=current.rate_limited + 1)

    # -- HTTP ----------------------------------------------------------------------------

    def _url(self, path_or_url: str) -> str:
        """Join a path onto the base URL; a full URL (a Link header's) must stay on its origin."""
        if path_or_url.startswith("/"):
            return self.base_url + path_or_url
        url = httpx.URL(path_or_url)
        base = self._base
        if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
            # Our credential goes wherever this points; a foreign origin gets nothing.
            raise GitHubError(f"GitHub pointed at another origin ({url.scheme}://{url.host})")
        return str(url)

    def _send(
        self,
        method: str,
        path_or_url: str,
        *,
        credential: str,
        stats_key: int | None,
        error_installation: int | None,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        url = self._url(path_or_url)
        path = httpx.URL(url).path
        started = self._clock()
        failure: str | None = None
        try:
            response = self._http.request(
                method,
                url,
                params=params,
                json=json,
                headers={**(headers or {}), "Authorization": f"Bearer {credential}"},
            )
        except httpx.TimeoutException as exc:
            failure = (
                f"{method} {path}: GitHub at {self._base.host} did not answer within "
                f"{self._timeout:g} s ({type(exc).__name__})"
            )
        except httpx.TransportError as exc:
            failure = (
                f"{method} {path}: could not reach GitHub at {self._base.scheme}://"
                f"{self._base.netloc.decode()}: {type(exc).__name__}: {exc}"
            )
        if failure is not None:
            # Raised outside the except block so the error keeps no __context__: httpx's
            # exception holds the request, and the request holds the credential.
            self._record(stats_key, None, started)
            metrics.github_call(method, path, None)
            raise TransportError(
                failure, installation_id=error_installation, method=method, path=path
            )
        self._record(stats_key, response, self._clock())
        metrics.github_call(method, path, response.status_code)
        log.debug(
            "github %s %s -> %s (installation %s)",
            method,
            path,
            response.status_code,
            error_installation,
        )
        return response

    def _app_request(
        self,
        method: str,
        path_or_url: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        context_installation: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """A call made as the App itself, with the JWT; counted under `None`."""
        return self._send(
            method,
            path_or_url,
            credential=self.jwt(),
            stats_key=None,
            error_installation=context_installation,
            params=params,
            json=json,
            headers=headers,
        )

    def _installation_request(
        self,
        installation_id: int,
        method: str,
        path_or_url: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """A call made with the installation's token; a 401 earns one fresh token and retry."""
        token = self._tokens.get(installation_id)
        response = self._send(
            method,
            path_or_url,
            credential=token,
            stats_key=installation_id,
            error_installation=installation_id,
            params=params,
            json=json,
            headers=headers,
        )
        if response.status_code != 401:
            return response
        log.info("github installation %s: token refused (401), minting a new one", installation_id)
        token = self._tokens.refresh(installation_id, token)
        # A second 401 falls through to the caller's status check and becomes a GitHubError.
        return self._send(
            method,
            path_or_url,
            credential=token,
            stats_key=installation_id,
            error_installation=installation_id,
            params=params,
            json=json,
            headers=headers,
        )

    # -- answers -------------------------------------------------------------------------

    def _expect(
        self,
        response: httpx.Response,
        method: str,
        path: str,
        installation_id: int | None,
        *ok: int,
    ) -> None:
        if response.status_code not in ok:
            raise self._error(response, method, path, installation_id)

    def _error(
        self, response: httpx.Response, method: str, path: str, installation_id: int | None
    ) -> GitHubError:
        """The exception for a response that was not the answer asked for."""
        status = response.status_code
        message = _github_message(response)
        path = httpx.URL(self._url(path)).path
        who = f" for installation {installation_id}" if installation_id is not None else ""
        where = f"{method} {path}{who}"
        kwargs: dict[str, Any] = {
            "installation_id": installation_id,
            "method": method,
            "path": path,
        }
        if status in (403, 429):
            limited, retry_at = self._rate_limit(response, message)
            if limited:
                self._count_rate_limited(installation_id)
                when = _when(retry_at, self._clock())
                return RateLimited(
                    f"GitHub rate limit on {where} ({status}): {when}. {message}".rstrip(),
                    retry_at=retry_at,
                    status=status,
                    **kwargs,
                )
        text = f"GitHub answered {status} to {where}: {message}".rstrip(": ")
        if status == 401:
            text += " (the credential was refused)"
        if status == 404:
            return NotFound(text, status=status, **kwargs)
        if status == 409:
            return Conflict(text, status=status, **kwargs)
        return GitHubError(text, status=status, **kwargs)

    def _rate_limit(self, response: httpx.Response, message: str) -> tuple[bool, float | None]:
        """Whether a 403/429 is a rate limit, and when the quota returns, by GitHub's rules.

        In GitHub's order: `retry-after` seconds; else `x-ratelimit-remaining: 0` with
        `x-ratelimit-reset`; else a message that says so (or any 429) with no time at all.
        """
        headers = response.headers
        now = self._clock()
        if "retry-after" in headers:
            seconds = _retry_after_seconds(headers["retry-after"], now)
            if seconds is not None:
                return True, now + seconds
        if _header_int(headers, "x-ratelimit-remaining") == 0:
            reset = _header_int(headers, "x-ratelimit-reset")
            return True, (float(reset) if reset is not None else None)
        lowered = message.lower()
        if response.status_code == 429 or any(word in lowered for word in _RATE_LIMIT_WORDS):
            return True, None
        return False, None

    def _body(
        self, response: httpx.Response, method: str, path: str, installation_id: int | None
    ) -> Any:
        try:
            return response.json()
        except ValueError:
            raise self._shape_error(method, path, installation_id) from None

    def _shape_error(self, method: str, path: str, installation_id: int | None) -> GitHubError:
        who = f" for installation {installation_id}" if installation_id is not None else ""
        path = httpx.URL(self._url(path)).path
        return GitHubError(
            f"GitHub's answer to {method} {path}{who} was not the shape expected",
            installation_id=installation_id,
            method=method,
            path=path,
        )

    def _paginate(
        self,
        call: Callable[[str, dict[str, Any] | None], httpx.Response],
        path: str,
        params: dict[str, Any],
        *,
        key: str | None,
        installation_id: int | None,
    ) -> list[Any]:
        """Every item of a list endpoint, following `Link: rel="next"` at 100 a page.

        `key` names the array in a wrapped body (`runners`, `jobs`...); None for a bare array.
        """
        return self._listing(
            lambda url, page_params, _headers: call(url, page_params),
            path,
            params,
            key=key,
            installation_id=installation_id,
            conditional=False,
        ).items

    def _listing(
        self,
        call: Callable[[str, dict[str, Any] | None, dict[str, str]], httpx.Response],
        path: str,
        params: dict[str, Any],
        *,
        key: str | None,
        installation_id: int | None,
        conditional: bool,
        until: Callable[[list[Any]], bool] | None = None,
        page_limit: int | None = None,
    ) -> Listing:
        """`_paginate`, each page asked for conditionally when `conditional` (see Listing).

        With `until`, no page is asked for after one for which `until(page)` is true; with
        `page_limit`, none after that many, and the listing says it was cut short.
        """
        items: list[Any] = []
        url: str | None = path
        page_params: dict[str, Any] | None = {**params, "per_page": PER_PAGE}
        seen: set[str] = set()
        changed = not conditional
        charged = 0
        while url is not None:
            if page_limit is not None and len(seen) >= page_limit:
                return Listing(items=items, changed=changed, charged_calls=charged, truncated=True)
            if url in seen or len(seen) >= MAX_PAGES:
                raise GitHubError(
                    f"GitHub's pages for GET {path} do not end",
                    installation_id=installation_id,
                    method="GET",
                    path=path,
                )
            seen.add(url)
            cache_key = (installation_id, url, tuple(sorted((page_params or {}).items())))
            cached = self._etag_get(cache_key) if conditional else None
            headers = {"If-None-Match": cached[0]} if cached else {}
            response = call(url, page_params, headers)
            if cached is not None and response.status_code == 304:
                body, following_url = cached[1], cached[2]
            else:
                charged += 1
                changed = True
                self._expect(response, "GET", url, installation_id, 200)
                body = self._body(response, "GET", url, installation_id)
                following = response.links.get("next")
                # The next link already carries per_page and the filters; not sent twice.
                following_url = str(response.url.join(following["url"])) if following else None
                etag = response.headers.get("etag")
                if conditional and etag:
                    self._etag_put(cache_key, (etag, body, following_url))
            page = body if key is None else (body.get(key) if isinstance(body, dict) else None)
            if not isinstance(page, list):
                raise self._shape_error("GET", path, installation_id)
            items.extend(page)
            url = None if until is not None and until(page) else following_url
            page_params = None
        return Listing(items=items, changed=changed, charged_calls=charged)

    def _etag_get(self, key: _PageKey) -> tuple[str, Any, str | None] | None:
        with self._etags_lock:
            entry = self._etags.get(key)
            if entry is not None:
                self._etags.move_to_end(key)
            return entry

    def _etag_put(self, key: _PageKey, entry: tuple[str, Any, str | None]) -> None:
        with self._etags_lock:
            self._etags[key] = entry
            self._etags.move_to_end(key)
            while len(self._etags) > ETAG_CACHE_PAGES:
                self._etags.popitem(last=False)
