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
  T0=$SECONDS
  step "pip" --upgrade pip
  # torch 2.13.0: from QFORMAT_TORCH_INDEX when set (https://download.pytorch.org/whl/cpu gives the
  # CPU build anywhere), else from pip's own sources (PyPI's torch is a CUDA build of several GB
  # unless pip is pointed at a CPU wheel, as on this project's build machines); what was installed
  # is read back and said, not assumed.
  if [ -n "${QFORMAT_TORCH_INDEX:-}" ]; then
    step "torch 2.13.0 from $QFORMAT_TORCH_INDEX" "torch==2.13.0" --index-url "$QFORMAT_TORCH_INDEX" --extra-index-url https://pypi.org/simple
  else
    step "torch 2.13.0" "torch==2.13.0"
  fi
  TORCH_BUILD="$("$VENV/bin/python" -c 'import torch; c = torch.version.cuda; print(f"torch {torch.__version__}: " + (f"a CUDA {c} build" if c else "the CPU build"))' 2>>"$LOG" || echo "torch did not import")"
  echo "[setup] installed $TORCH_BUILD" >&2
  case "$TORCH_BUILD" in
    *CUDA*) command -v nvidia-smi >/dev/null || echo "[setup] this machine has no NVIDIA GPU: QFORMAT_TORCH_INDEX=https://download.pytorch.org/whl/cpu (then rm -rf $VENV and run again) installs the CPU build, several GB smaller" >&2 ;;
  esac
  step "qformat (editable) with extras test, torch, jax, transformers, oracles, demo, plot" -e "$ROOT[test,torch,jax,transformers,oracles,demo,plot]"
  rm -f "$VENV"/.qformat-installed-*
  touch "$STAMP"
  echo "[setup] done in $((SECONDS - T0)) s: $VENV holds $(du -sh "$VENV" 2>/dev/null | cut -f1) ($TORCH_BUILD)" >&2
fi
# The native kernels (qformat/kernels/_native.c: decode, _matmul.c: matmul, _ggml.c: GGUF quantizers, _encode.c: int encoders; optional extensions
# that pip's editable install builds in place): rebuilt here when a source or setup.py is newer
# than its built module, so a changed kernel never runs stale.  A failed build only warns:
# qformat then decodes with its NumPy path and QLinear decodes per forward
# (qformat.kernels.info() says which).
STALE=""
for NAME in _native _matmul _ggml _encode; do
  SO="$(ls "$ROOT"/qformat/kernels/$NAME.*.so 2>/dev/null | head -n1 || true)"
  if [ -z "$SO" ] || [ "$ROOT/qformat/kernels/$NAME.c" -nt "$SO" ] || [ "$ROOT/setup.py" -nt "$SO" ]; then STALE=1; fi
  # and the headers a kernel includes (qformat/kernels/_matmul_tiles.h)
  for H in "$ROOT"/qformat/kernels/"$NAME"_*.h; do
    if [ -n "$SO" ] && [ -f "$H" ] && [ "$H" -nt "$SO" ]; then STALE=1; fi
  done
  # _native compiles libqformat's fused kernel too (one decoder source for both)
  if [ "$NAME" = _native ] && [ -n "$SO" ] && { [ "$ROOT/libqformat/src/kernel.c" -nt "$SO" ] || [ "$ROOT/libqformat/src/kernel.h" -nt "$SO" ]; }; then STALE=1; fi
done
if [ -n "$STALE" ]; then
  echo "[setup] building the native kernels" >&2
  # pip's isolated build (setuptools>=77, as pyproject.toml asks), not the venv's own setuptools
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT" >"$VENV/build_ext.log" 2>&1 \
    || echo "[setup] the native kernels did not build (log: $VENV/build_ext.log); qformat uses its NumPy paths" >&2
fi
# Known console noise of torchao, torch's pytree and bitsandbytes (readers/qformat_quiet: one
# logging filter per known message, nothing else) is dropped in every interpreter of this
# environment, so plain transformers imports are quiet here too (issue 24).
for SITE in "$VENV"/lib/python3*/site-packages; do
  [ -f "$SITE/qformat_quiet.pth" ] || echo "import qformat_quiet; qformat_quiet.install()" > "$SITE/qformat_quiet.pth"
done
# playwright-core (npm) drives Debian's chromium in the browser tests (tests/browser.py); it goes
# to .tools/node, not into the JavaScript reader, which has no dependencies.  Without npm or
# chromium those tests skip and say why.
PW_VERSION=1.65.2
# A failed install is not retried on every run (it cost about 70 s each): .tools/npm-failed-vX
# remembers it for a day; its log is kept (npm's own error output, not --silent).
PW_FAILED="$ROOT/.tools/npm-failed-v$PW_VERSION"
if command -v npm >/dev/null && [ ! -f "$ROOT/.tools/node/node_modules/playwright-core/.v$PW_VERSION" ] \
   && ! { [ -f "$PW_FAILED" ] && [ -z "$(find "$PW_FAILED" -mmin +1440 2>/dev/null)" ]; }; then
  echo "[setup] playwright-core $PW_VERSION (npm) for the browser tests" >&2
  mkdir -p "$ROOT/.tools"
  if npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$ROOT/.tools/node" "playwright-core@$PW_VERSION" >"$ROOT/.tools-npm.log" 2>&1; then
    touch "$ROOT/.tools/node/node_modules/playwright-core/.v$PW_VERSION"; rm -f "$ROOT/.tools-npm.log" "$PW_FAILED"
  else
    touch "$PW_FAILED"
    echo "[setup] npm could not install playwright-core (log: $ROOT/.tools-npm.log; retried after a day, or at once after rm $PW_FAILED); the browser tests will skip" >&2
  fi
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
