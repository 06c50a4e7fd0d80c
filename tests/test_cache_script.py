"""scripts/cache.py shows and clears the test and bench cache (issue 44)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "cache.py"


def _run(cache: Path, *args: str) -> str:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                       env={"QFORMAT_CACHE": str(cache), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_show_and_clear(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "sdist").mkdir(parents=True)
    (cache / "sdist" / "a").write_bytes(b"x" * 2500)
    (cache / "f.tar.gz").write_bytes(b"y" * 10)
    out = _run(cache)
    assert "2.5 KB  sdist/" in out and "10 B  f.tar.gz" in out and f"2.5 KB  total in {cache}" in out, out
    assert "removed" in _run(cache, "--clear") and not cache.exists()
    assert "no cache" in _run(cache)
