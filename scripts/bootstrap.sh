#!/usr/bin/env bash
# Create or refresh the project's virtualenv (.venv) from requirements.txt.
# Re-installs only when requirements.txt changed since the last install.
#
# The packages go in with uv when it can be had (pip installs it into the venv): on a fresh
# clone here pip took 49 s for the 138 pinned packages and uv 21 s with an empty cache, a
# good part of the test command's 8 minutes. Where uv cannot be installed or fails (no
# PyPI, only a mirror pip is configured for), pip installs them as before. Both compile
# the bytecode at install, as pip always did: where PYTHONDONTWRITEBYTECODE is set (this
# machine, many images) a module without it is compiled again in every process that
# imports it, which cost the idle controller 17 MB of PSS and every start its CPU.
#
# ZOOMIES_BYTECODE=lazy (the test command, scripts/test.sh) leaves the compiling to the
# processes that import a module, which write its bytecode once (the test command turns
# writing on): of about 34 CPU-s to compile every installed package, the suite needs a
# fraction, and on a fresh clone that was 15 to 20 s of the test command's 8 minutes. The
# next bootstrap without it (scripts/run.sh, make bench) compiles the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
UV_VERSION=0.13.9
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
compiled=.venv/.bytecode.sha256  # the requirements whose bytecode is all compiled
compile=(--compile-bytecode)
if [ "${ZOOMIES_BYTECODE:-}" = "lazy" ]; then compile=(); fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    rm -f "$compiled"
    if .venv/bin/python -m pip install --quiet "uv==$UV_VERSION" >/dev/null 2>&1 \
        && .venv/bin/uv pip install --quiet "${compile[@]}" --python .venv/bin/python \
            -r requirements.txt; then
        if [ ${#compile[@]} -gt 0 ]; then echo "$want" > "$compiled"; fi
    else
        echo "bootstrap: uv could not install the requirements; pip installs them" >&2
        .venv/bin/python -m pip install --quiet --upgrade pip
        .venv/bin/python -m pip install --quiet -r requirements.txt  # pip always compiles
        echo "$want" > "$compiled"
    fi
    echo "$want" > "$stamp"
fi
if [ "${ZOOMIES_BYTECODE:-}" != "lazy" ] \
    && { [ ! -f "$compiled" ] || [ "$(cat "$compiled")" != "$want" ]; }; then
    # What a lazy install left: compileall skips every module whose bytecode is current (a
    # module that does not compile, some packages ship one, is the interpreter's to refuse).
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null || true
    echo "$want" > "$compiled"
fi
