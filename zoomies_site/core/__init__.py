"""The ground floor: the settings registry, findings, leases and the controller lock.

`runners`, `fleet` and `capacity` build on these; nothing here imports those apps (a test
holds it). The composition parts (URLs, ASGI, the controller command, the sandbox, the
problems list) live one floor up, in `zoomies_site` itself.
"""
