"""Whether browsers reach the controller over HTTPS, and the cookie settings that follow.

The controller serves HTTPS itself when `server.tls_cert` and `server.tls_key` are both set,
or sits behind a proxy that terminates TLS when `server.tls_proxy` says so. Either way the
session and CSRF cookies are marked Secure, so a browser never sends them over plain HTTP.
On plain HTTP they cannot be: the browser would drop them and nobody could sign in, which
is why the default (a loopback bind) leaves them off.

Pure over the registry's values: no Django import (zoomies_site.server applies the result).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The header a TLS-terminating proxy sets; trusted only when server.tls_proxy says one is
# in front (a client reaching the controller directly could send it too).
PROXY_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


def serves_tls(values: Mapping[str, Any]) -> bool:
    return bool(values["server.tls_cert"] and values["server.tls_key"])


def browsers_use_https(values: Mapping[str, Any]) -> bool:
    return serves_tls(values) or bool(values["server.tls_proxy"])


def cookie_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The Django settings the web server runs with, from the registry's values."""
    https = browsers_use_https(values)
    return {
        "SESSION_COOKIE_SECURE": https,
        "CSRF_COOKIE_SECURE": https,
        "SECURE_PROXY_SSL_HEADER": PROXY_HEADER if values["server.tls_proxy"] else None,
    }
