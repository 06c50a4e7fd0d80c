#!/usr/bin/env python3
"""Build libqformat as WebAssembly for the JavaScript reader: readers/js/wasm/qformat.wasm.

    python libqformat/scripts/build_wasm.py           # (re)build it
    python libqformat/scripts/build_wasm.py --check   # exit 1 when the committed file is not what the sources build

The compiler is zig's clang from the ``ziglang`` wheel on PyPI (``pip install ziglang==0.17.1``),
pinned so that the same sources give the same bytes on any machine: the build runs inside
libqformat/ with relative paths, strips debug information, and lists its sources in sorted
order.  readers/js/wasm/build.json records the compiler, the flags and the SHA-256 of every
source and of the output, so a reader of the repository can see what the binary was built from.

The module targets wasm32-wasi as a reactor (no main): wasi-libc gives malloc and the string
functions; the three WASI imports it keeps (environ_get, environ_sizes_get, proc_exit) are
stubbed by readers/js/src/wasm.js.  SIMD128 is on: every current browser and Node >= 16 has it,
and where a runtime lacks it the module fails to compile and the JavaScript path decodes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ZIG_VERSION = "0.17.1"
HERE = Path(__file__).resolve().parent
LIB = HERE.parent
ROOT = LIB.parent
OUT = ROOT / "readers" / "js" / "wasm" / "qformat.wasm"
RECORD = OUT.with_name("build.json")
FLAGS = ["--target=wasm32-wasi", "-std=c11", "-O2", "-ffp-contract=off", "-msimd128", "-s", "-DNDEBUG", "-D_WASI_EMULATED_MMAN",
         "-mexec-model=reactor", "-Iinclude", "-Isrc"]
LIBS = ["-lwasi-emulated-mman"]


def sources() -> list[str]:
    """Every C source of the library, then the WebAssembly glue, relative to libqformat/."""
    return sorted(p.relative_to(LIB).as_posix() for p in (LIB / "src").glob("*.c")) + ["wasm/qformat_wasm.c"]


def zig_version() -> str | None:
    try:
        p = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def build(out: Path) -> dict:
    """Compile to ``out``; return the build record."""
    found = zig_version()
    if found is None:
        raise SystemExit(f"build_wasm: the ziglang wheel is not installed here: pip install ziglang=={ZIG_VERSION}")
    if found != ZIG_VERSION:
        raise SystemExit(f"build_wasm: zig {found} found, {ZIG_VERSION} pinned (other versions give other bytes): "
                         f"pip install ziglang=={ZIG_VERSION}")
    srcs = sources()
    cmd = [sys.executable, "-m", "ziglang", "cc", *FLAGS, *srcs, *LIBS, "-o", str(out)]
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": os.environ.get("ZIG_GLOBAL_CACHE_DIR", str(Path(tempfile.gettempdir()) / "qformat-zig-cache"))}
    p = subprocess.run(cmd, cwd=LIB, capture_output=True, text=True, timeout=900, env=env)
    if p.returncode != 0:
        raise SystemExit(f"build_wasm: the compiler failed:\n{p.stderr[-4000:]}")
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    return {"compiler": f"zig cc {ZIG_VERSION} (PyPI ziglang)", "flags": FLAGS + LIBS,
            "sources": {s: digest((LIB / s).read_bytes()) for s in srcs},
            "output": {"path": OUT.relative_to(ROOT).as_posix(), "bytes": out.stat().st_size, "sha256": digest(out.read_bytes())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="build into a temporary folder and compare with the committed file")
    a = ap.parse_args(argv)
    if a.check:
        with tempfile.TemporaryDirectory() as tmp:
            rec = build(Path(tmp) / "qformat.wasm")
            same = OUT.is_file() and OUT.read_bytes() == (Path(tmp) / "qformat.wasm").read_bytes()
        committed = json.loads(RECORD.read_text()) if RECORD.is_file() else None
        if not same or committed != rec:
            print(f"build_wasm: {OUT.relative_to(ROOT)} is stale: the sources build {rec['output']['sha256']}; "
                  f"run python libqformat/scripts/build_wasm.py")
            return 1
        print(f"build_wasm: {OUT.relative_to(ROOT)} is what the sources build ({rec['output']['sha256']})")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = OUT.with_name(OUT.name + ".tmp")
    rec = build(tmp_out)
    os.replace(tmp_out, OUT)
    tmp_rec = RECORD.with_name(RECORD.name + ".tmp")
    tmp_rec.write_text(json.dumps(rec, indent=1) + "\n")
    os.replace(tmp_rec, RECORD)
    print(f"build_wasm: wrote {OUT.relative_to(ROOT)} ({rec['output']['bytes']:,} bytes, sha256 {rec['output']['sha256']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
