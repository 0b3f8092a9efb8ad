#!/usr/bin/env bash
# Set up ./.venv and bring up the embedded default, showing it working.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec minibroker cluster up --demo "$@"
