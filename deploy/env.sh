# Sourced by the quickstart scripts: create or refresh ./.venv with minibroker installed.
# Idempotent: pip runs only when pyproject.toml changed or new extras are asked for.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${MINIBROKER_EXTRAS:-}"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: minibroker needs Python 3.11+ ($PY is $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.minibroker-installed"
# sha256sum is GNU coreutils; macOS has shasum.
# The C extension (setup.py, protocol/kafka/*.c) is built at install: a change to it reinstalls.
HASH="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/protocol/kafka/*.c \
    | (sha256sum 2>/dev/null || shasum -a 256) | cut -d' ' -f1)"
NEED=1
if [ -f "$STAMP" ] && [ "$(head -1 "$STAMP")" = "$HASH" ]; then
    NEED=0
    for extra in ${EXTRAS//,/ }; do
        grep -qx "$extra" "$STAMP" || NEED=1
    done
fi
if [ "$NEED" = 1 ]; then
    SPEC="$ROOT"
    [ -n "$EXTRAS" ] && SPEC="$ROOT[$EXTRAS]"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$SPEC"
    { echo "$HASH"; for extra in ${EXTRAS//,/ }; do echo "$extra"; done; } > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
