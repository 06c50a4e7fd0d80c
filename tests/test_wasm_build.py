"""readers/js/wasm/qformat.wasm is libqformat's C built as WebAssembly by
libqformat/scripts/build_wasm.py (issue 41): the committed module must be what today's sources
build.  The record (build.json) lists the SHA-256 of every source and of the output, so a source
changed without a rebuild fails here on any machine; where the pinned compiler (the ``ziglang``
wheel, part of the test extra) is installed, the module is rebuilt and compared byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "libqformat" / "scripts"))
import build_wasm  # noqa: E402


def test_the_record_names_todays_sources_and_the_committed_module() -> None:
    rec = json.loads(build_wasm.RECORD.read_text())
    lib = ROOT / "libqformat"
    assert sorted(rec["sources"]) == sorted(build_wasm.sources()), "a source was added or removed: rebuild (build_wasm.py)"
    stale = [s for s, h in rec["sources"].items() if hashlib.sha256((lib / s).read_bytes()).hexdigest() != h]
    assert not stale, f"changed since the module was built: {stale}; run python libqformat/scripts/build_wasm.py"
    assert hashlib.sha256(build_wasm.OUT.read_bytes()).hexdigest() == rec["output"]["sha256"]
    assert rec["flags"] == build_wasm.FLAGS + build_wasm.LIBS


@pytest.mark.skipif(os.environ.get("QF_SLOW_TESTS") != "1",
                    reason="a first zig build compiles wasi-libc (about 50 s): set QF_SLOW_TESTS=1")
def test_the_sources_build_the_committed_module_byte_for_byte() -> None:
    if build_wasm.zig_version() != build_wasm.ZIG_VERSION:
        pytest.skip(f"the pinned compiler is not installed (pip install ziglang=={build_wasm.ZIG_VERSION})")
    p = subprocess.run([sys.executable, str(ROOT / "libqformat" / "scripts" / "build_wasm.py"), "--check"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
