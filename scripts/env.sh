# Sourced by demo.sh and test.sh: create .venv when missing and install what the project
# needs, again only when pyproject.toml changed.  torch is pinned to the CPU build this kind
# of machine offers (an unpinned torch pulls a multi-GB CUDA build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${QFORMAT_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.qformat-installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing qformat and its test oracles into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet "torch==2.13.0" >&2
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test,torch,jax,oracles,demo]" >&2
  rm -f "$VENV"/.qformat-installed-*
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
