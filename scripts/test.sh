#!/usr/bin/env bash
# The whole test suite: lint, format, Django checks, migrations, then pytest on SQLite and
# again on PostgreSQL. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
PY=.venv/bin/python
if [ -z "${ZOOMIES_DATA_DIR:-}" ]; then
    ZOOMIES_DATA_DIR="$(mktemp -d /tmp/zoomies-test.XXXXXX)"
    trap 'rm -rf "$ZOOMIES_DATA_DIR"' EXIT  # ours: gone with the run
fi
export ZOOMIES_DATA_DIR
# The suite starts hundreds of Python processes, and each xdist worker rewrites the asserts
# of every test module: with bytecode cached (__pycache__, ignored by git) that is done once
# rather than in every process, about 11 s of CPU per worker here. Some machines turn the
# cache off for everything (PYTHONDONTWRITEBYTECODE); the suite turns it back on.
unset PYTHONDONTWRITEBYTECODE

# The static checks (about 14 s on one core) run beside the passes, logged and shown when
# they end; their status counts like a pass's. First one collection fills the bytecode cache
# for the five workers below, which would otherwise each rewrite every test module at the
# same moment (13 s cold, 4 s warm, each).
STATIC_LOG="$(mktemp /tmp/zoomies-test-static.XXXXXX.log)"
(
    set -e
    echo "== ruff"
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .
    echo "== mypy --strict on the pure modules ([tool.mypy] in pyproject.toml)"
    .venv/bin/mypy
    echo "== mypy with django-stubs on the actions, both state writers and the views (mypy-django.ini)"
    .venv/bin/mypy --config-file mypy-django.ini
    echo "== import contracts: the floors, the roof, the agent ([tool.importlinter])"
    .venv/bin/lint-imports
    echo "== django checks"
    $PY manage.py check
    $PY manage.py makemigrations --check --dry-run
    $PY scripts/spec_coverage.py --check
) >"$STATIC_LOG" 2>&1 &
static_pid=$!
trap 'kill "$static_pid" 2>/dev/null || true' INT TERM
echo "== static checks (ruff, mypy, import contracts, django checks), in the background: $STATIC_LOG"
$PY -m pytest -p no:cacheprovider -q --collect-only >/dev/null 2>&1 || true  # errors: the passes say

# Both passes at once, each spread over xdist workers (one group per test file, the container
# engine tests one group: tests/conftest.py): most of a pass is waiting on child processes
# and sockets, so the two overlap well on 2 cores. The SQLite pass streams; the PostgreSQL
# pass is logged and shown when it ends. `slow` drills are left to .ci/run.
# Three workers for SQLite: about a third of a pass is waiting, so on 2 cores a third worker
# fills it (7:17 -> 6:20 for the SQLite pass here); the PostgreSQL pass is the shorter and
# keeps two, so it takes less of the cores from the other (whole command 7:29 -> 6:32 here).
WORKERS="${ZOOMIES_TEST_WORKERS:-3}"
PG_WORKERS="${ZOOMIES_TEST_PG_WORKERS:-2}"
MARKS="${ZOOMIES_TEST_MARKS:-not slow}"
PYTEST=($PY -m pytest -p no:cacheprovider -n "$WORKERS" --dist loadgroup -m "$MARKS")
# The PostgreSQL pass leaves out the end-to-end tests (controllers in child processes, whose
# database code is the same actions the pass runs in-process): .ci/run runs them on
# PostgreSQL after this command, with the slow drills. ZOOMIES_TEST_FULL_POSTGRES=1 keeps them.
PG_MARKS="${ZOOMIES_TEST_PG_MARKS:-$MARKS and not e2e}"
PG_PYTEST=($PY -m pytest -p no:cacheprovider -n "$PG_WORKERS" --dist loadgroup)
PG_URL="${ZOOMIES_TEST_POSTGRES_URL:-postgres://root@127.0.0.1:5432/test}"
pg_status=0
DATABASE_ONLY=1  # ZOOMIES_TEST_FULL_POSTGRES=1: every test on PostgreSQL too
if [ -n "${ZOOMIES_TEST_FULL_POSTGRES:-}" ]; then DATABASE_ONLY=0; PG_MARKS="$MARKS"; fi
if [ "${ZOOMIES_SKIP_POSTGRES:-}" != "1" ]; then
    PG_LOG="$(mktemp /tmp/zoomies-test-postgres.XXXXXX.log)"
    echo "== pytest on PostgreSQL ($PG_URL), in the background: $PG_LOG"
    # Only the tests that touch a database: the rest run the same code on either (conftest).
    ZOOMIES_DATABASE_URL="$PG_URL" ZOOMIES_TEST_DATABASE_ONLY="$DATABASE_ONLY" "${PG_PYTEST[@]}" -m "$PG_MARKS" "$@" >"$PG_LOG" 2>&1 &
    pg_pid=$!
    trap 'kill "$pg_pid" "$static_pid" 2>/dev/null || true' INT TERM
fi
echo "== pytest on SQLite"
sqlite_status=0
"${PYTEST[@]}" "$@" || sqlite_status=$?
if [ "${ZOOMIES_SKIP_POSTGRES:-}" = "1" ]; then
    echo "== PostgreSQL run NOT done: ZOOMIES_SKIP_POSTGRES=1" >&2
else
    wait "$pg_pid" || pg_status=$?
    echo "== pytest on PostgreSQL ($PG_URL)"
    cat "$PG_LOG"
    rm -f "$PG_LOG"
fi
static_status=0
wait "$static_pid" || static_status=$?
cat "$STATIC_LOG"
rm -f "$STATIC_LOG"
# Exit 5 (nothing collected) is a failure like any other.
echo "== exit status: static checks $static_status, pytest on SQLite $sqlite_status, PostgreSQL $pg_status"
[ "$static_status" -eq 0 ] && [ "$sqlite_status" -eq 0 ] && [ "$pg_status" -eq 0 ]
