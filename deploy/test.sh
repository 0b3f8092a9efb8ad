#!/usr/bin/env bash
# Set up ./.venv (test + spark extras) and run the whole test suite, lint included.
MINIBROKER_EXTRAS=test,spark source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ruff check .
ruff format --check .
exec python -m pytest "$@"
