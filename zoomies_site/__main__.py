"""`python -m zoomies_site COMMAND`: the `zoomies` command, as the installed systemd unit runs it
(the interpreter that ran `install`, so the unit needs no PATH and no console script)."""

import sys

from zoomies_site.cli import main

# Usage and errors name the console script, not this file.
main(["zoomies", *sys.argv[1:]])
