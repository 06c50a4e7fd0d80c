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
  # pip's and the build backend's output goes to a log, shown only when a step fails.
  LOG="$VENV/install.log"
  : > "$LOG"
  step() {
    echo "[setup] $1" >&2
    shift
    "$VENV/bin/python" -m pip install --quiet "$@" >>"$LOG" 2>&1 || { cat "$LOG" >&2; echo "[setup] failed; log: $LOG" >&2; exit 1; }
  }
  echo "[setup] installing qformat and its test oracles into $VENV (a few minutes; log: $LOG)" >&2
  step "pip" --upgrade pip
  step "torch 2.13.0 (CPU build)" "torch==2.13.0"
  step "qformat (editable) with extras test, torch, jax, transformers, oracles, demo, plot" -e "$ROOT[test,torch,jax,transformers,oracles,demo,plot]"
  rm -f "$VENV"/.qformat-installed-*
  touch "$STAMP"
  echo "[setup] done" >&2
fi
# The native decode kernel (qformat/kernels/_native.c, an optional extension that pip's
# editable install builds in place): rebuilt here when its source or setup.py is newer than the
# built module, so a changed kernel never runs stale.  A failed build only warns: qformat then
# decodes with its NumPy path (qformat.kernels.info() says which).
SO="$(ls "$ROOT"/qformat/kernels/_native.*.so 2>/dev/null | head -n1 || true)"
if [ -z "$SO" ] || [ "$ROOT/qformat/kernels/_native.c" -nt "$SO" ] || [ "$ROOT/setup.py" -nt "$SO" ]; then
  echo "[setup] building the native decode kernel" >&2
  # pip's isolated build (setuptools>=77, as pyproject.toml asks), not the venv's own setuptools
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT" >"$VENV/build_ext.log" 2>&1 \
    || echo "[setup] the native kernel did not build (log: $VENV/build_ext.log); decoding uses the NumPy path" >&2
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
