#!/usr/bin/env bash
# Set up ./.venv (test + spark extras) and run the whole test suite, lint included.
# With no arguments (the whole suite, as CI runs it) the network tests then run once more
# on the plain poll backend: Linux uses epoll, macOS kqueue, and this keeps a non-epoll
# path exercised here (brokers started by the tests inherit MINIBROKER_POLLER; ~25 s).
MINIBROKER_EXTRAS=test,spark source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# kcat (librdkafka's CLI) for the Kafka listener's tests: a Debian package, not a wheel.
# Installed quietly when we may (root with apt-get); otherwise its test fails and says so.
if ! command -v kcat >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat) >/dev/null 2>&1 \
        || echo "test.sh: could not install kcat; tests/integration/test_kafka_clients.py will say so" >&2
fi
ruff check .
ruff format --check .
# Tests in parallel, one worker more than pytest-xdist's `-n auto` (a worker per core):
# the suite mostly waits (on elections, timeouts, long polls). On a 2-core machine with
# two workers it was 67 % busy and the integration tests took 413 s; with three, 306 s.
# Each worker has its own share of the test ports (launcher.worker_ports).
# PYTEST_XDIST_AUTO_NUM_WORKERS set by the caller wins.
: "${PYTEST_XDIST_AUTO_NUM_WORKERS:=$(python -c 'import os, psutil
print((psutil.cpu_count(logical=False) or os.cpu_count() or 1) + 1)')}"
export PYTEST_XDIST_AUTO_NUM_WORKERS
if [ $# -gt 0 ]; then
    exec python -m pytest -n auto "$@"
fi
python -m pytest -n auto || exit $?
cd "$ROOT"
MINIBROKER_POLLER=poll exec python -m pytest -n auto -q \
    tests/unit/test_poller.py tests/unit/test_network_limits.py \
    tests/integration/test_network_limits.py tests/integration/test_long_poll.py \
    tests/integration/test_broker_robustness.py tests/integration/test_bench_longpoll.py
