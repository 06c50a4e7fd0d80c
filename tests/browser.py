"""Pages in a real browser: headless Chromium on a folder served over HTTP on loopback.

Needs Debian's chromium (``/usr/bin/chromium``, or ``QFORMAT_CHROMIUM``) and playwright-core
from npm, which scripts/env.sh installs into ``.tools/node`` (not into the JavaScript reader:
it has no dependencies).  :func:`available` says why a test must skip where either is missing.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterator
import contextlib

ROOT = Path(__file__).resolve().parent.parent
PLAYWRIGHT = ROOT / ".tools" / "node" / "node_modules" / "playwright-core"
DRIVER = Path(__file__).resolve().parent / "browser_page.mjs"


def chromium() -> str | None:
    exe = os.environ.get("QFORMAT_CHROMIUM") or shutil.which("chromium")
    return exe if exe and os.access(exe, os.X_OK) else None


def available() -> str | None:
    """None when a page can be run here, else the reason it cannot."""
    if shutil.which("node") is None:
        return "node is not installed"
    if chromium() is None:
        return "chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
    if not PLAYWRIGHT.is_dir():
        return f"playwright-core is not installed in {PLAYWRIGHT.parent} (scripts/env.sh installs it)"
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript", ".js": "text/javascript"}

    def log_message(self, *args: Any) -> None:  # the test reads the page's output, not the access log
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (a free port); yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def run_page(url: str, expect: int = 1, timeout_ms: int = 20000, screenshot: Path | None = None) -> dict[str, list[str]]:
    """Open ``url`` in headless Chromium; returns ``{"console": [...], "errors": [...]}`` once the
    page has logged ``expect`` lines, raised an error, or ``timeout_ms`` passed."""
    args = ["node", str(DRIVER), str(PLAYWRIGHT.parent), url, str(expect), str(timeout_ms)] + ([str(screenshot)] if screenshot else [])
    env = dict(os.environ, QFORMAT_CHROMIUM=chromium() or "")
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout_ms / 1000 + 60, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])
