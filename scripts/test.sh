#!/usr/bin/env bash
# The whole test suite: lint, format, Django checks, migrations, then pytest on SQLite and
# again on PostgreSQL. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
PY=.venv/bin/python
export ZOOMIES_DATA_DIR="${ZOOMIES_DATA_DIR:-$(mktemp -d /tmp/zoomies-test.XXXXXX)}"

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== django checks"
$PY manage.py check
$PY manage.py makemigrations --check --dry-run
if [ -f ../shared/spec/CHECKLIST.md ]; then
    $PY scripts/spec_coverage.py --check
fi

echo "== pytest on SQLite"
$PY -m pytest "$@"

PG_URL="${ZOOMIES_TEST_POSTGRES_URL:-postgres://root@127.0.0.1:5432/test}"
if [ "${ZOOMIES_SKIP_POSTGRES:-}" = "1" ]; then
    echo "== PostgreSQL run NOT done: ZOOMIES_SKIP_POSTGRES=1" >&2
    exit 0
fi
echo "== pytest on PostgreSQL ($PG_URL)"
ZOOMIES_DATABASE_URL="$PG_URL" $PY -m pytest "$@"
