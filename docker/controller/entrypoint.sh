#!/bin/sh
# The controller image's entrypoint: `zoomies ARGS...` (any management command), after
# collecting the static files into the data directory (what the systemd unit's ExecStartPre
# does): a volume made by an older image holds that image's files.
set -eu
zoomies collectstatic --noinput --verbosity 0
exec zoomies "$@"
