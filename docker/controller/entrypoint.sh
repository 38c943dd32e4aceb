#!/bin/sh
# The controller image's entrypoint: `zoomies ARGS...` (any management command), after
# collecting the static files into the data directory, which is a volume (what the systemd
# unit's ExecStartPre does).
set -eu
zoomies collectstatic --noinput --verbosity 0
exec zoomies "$@"
