#!/usr/bin/env bash
# The whole test suite (sets up .venv first when needed).
source "$(dirname "$0")/scripts/env.sh"
exec python -m pytest -n 2 -p no:cacheprovider "$@"
