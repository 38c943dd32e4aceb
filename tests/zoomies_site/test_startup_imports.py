"""What a Django process of ours loads at start: the web server's stack only in the web server.

`daphne` as an installed app imported daphne.server, and with it Twisted, Autobahn and
pyOpenSSL, into every process: the controller, each django-q2 process and every management
command paid about 0.4 s of CPU and 15 MB of memory for a server they never run
(docs/performance.md, Memory). The web server (`zoomies_site.server`) imports daphne itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, django
django.setup()
from django.urls import get_resolver
get_resolver().url_patterns  # the whole URL conf, as a request or `check` loads it
print(sorted(m for m in ("twisted", "autobahn", "daphne", "OpenSSL") if m in sys.modules))
"""


def test_a_django_process_that_is_not_the_web_server_loads_no_twisted_or_daphne(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "zoomies_site.settings"}
    env["ZOOMIES_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr
