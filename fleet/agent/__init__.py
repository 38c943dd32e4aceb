"""The Zoomies agent: starts runners on one host and answers to the controller over HTTP.

Installable on a host alone: nothing here imports Django, a model or another app
(ARCH-05), so a host needs neither the controller's database settings nor its secret key;
tests/fleet/agent/test_import_guard.py holds it.
"""

AGENT_VERSION = "0.1.0"
