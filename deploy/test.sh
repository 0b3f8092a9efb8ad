#!/usr/bin/env bash
# Set up ./.venv (test + spark extras) and run the whole test suite, lint included.
MINIBROKER_EXTRAS=test,spark source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ruff check .
ruff format --check .
# Tests in parallel, one worker per CPU: the suite mostly waits (on elections, timeouts,
# long polls), and each worker has its own share of the test ports (launcher.worker_ports).
exec python -m pytest -n auto "$@"
