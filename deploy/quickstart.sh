#!/usr/bin/env bash
# Set up ./.venv and bring up the embedded default, showing it working.
# The data goes to the repository's minibroker-data wherever this runs from, and the
# cluster command runs in the caller's directory: a --data-dir given here, and the
# paths `cluster up` prints, are relative to where the caller is.
CALLER="$PWD"
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"  # cds to the repository
cd "$CALLER"
DATA=(--data-dir "$ROOT/minibroker-data")
for arg in "$@"; do
    case "$arg" in --data-dir | --data-dir=*) DATA=() ;; esac
done
exec minibroker cluster up --demo ${DATA[@]+"${DATA[@]}"} "$@"
