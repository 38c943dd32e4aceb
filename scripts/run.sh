#!/usr/bin/env bash
# Run the Zoomies controller: SQLite in ./var, bound to 127.0.0.1, with its embedded agent.
# Extra arguments go to `manage.py controller` (for example --sandbox, --bind 127.0.0.1:9000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# The admin's and the browsable API's stylesheets, served by the controller (WhiteNoise).
.venv/bin/python manage.py collectstatic --noinput --verbosity 0
exec .venv/bin/python manage.py controller "$@"
