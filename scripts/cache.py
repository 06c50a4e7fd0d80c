#!/usr/bin/env python3
"""Show or clear qformat's cache: ``$QFORMAT_CACHE``, else ``~/.cache/qformat``.

    python scripts/cache.py            # what is there, entry by entry, and the total
    python scripts/cache.py --clear    # remove it all (it is rebuilt on demand)

Only the test suite and bench/ write there (the qformat package never does): the llama-cpp-python
sdist and its extracted tree (``sdist/``), llama.cpp builds (``llama-cpp-build/``: minutes to
rebuild, one per set of compiler flags), and vocabularies converted by transformers for the GGUF
tokenizer tests (``hf-vocab/``).  Everything in it is rebuilt from PyPI when missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path


def root() -> Path:
    env = os.environ.get("QFORMAT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qformat"


def size(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    total = 0
    for dirpath, _, names in os.walk(p, followlinks=False):
        for n in names:
            try:
                total += (Path(dirpath) / n).lstat().st_size
            except OSError:
                pass
    return total


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clear", action="store_true", help="remove the whole cache")
    a = ap.parse_args(argv)
    r = root()
    if not r.exists():
        print(f"{r}: no cache")
        return 0
    if a.clear:
        freed = size(r)
        shutil.rmtree(r)
        print(f"{r}: removed ({human(freed)})")
        return 0
    total = 0
    for e in sorted(r.iterdir()):
        n = size(e)
        total += n
        print(f"{human(n):>10}  {e.name}{'/' if e.is_dir() else ''}")
    print(f"{human(total):>10}  total in {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
