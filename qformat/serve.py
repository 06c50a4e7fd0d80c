"""``qformat serve DIR``: a small static file server for remote reads and the viewer page.

qformat reads remote files by byte ranges only (:mod:`qformat.remote`, the JavaScript reader's
``openUrl``), so a server that ignores ``Range`` (Python's ``http.server``) cannot serve them.
This one answers what those readers send:

* ``GET``/``HEAD`` of regular files under DIR, a single ``Range: bytes=A-B`` / ``A-`` / ``-N``
  as ``206`` with ``Content-Range``, an unsatisfiable one as ``416 bytes */SIZE``; several
  ranges in one request are answered with the whole file (a server may, and the readers never
  ask for several);
* validators: a strong ``ETag`` (size and modification time) and ``Last-Modified``;
  ``If-Range`` (a range only while the file is unchanged), ``If-None-Match`` and
  ``If-Modified-Since`` (``304``); ``Cache-Control: no-cache`` so a browser revalidates;
* CORS for any origin (``GET``, ``HEAD``, the ``Range`` and validator request headers; the
  response headers a reader needs exposed), so a page on another origin can read files;
* paths by qformat's path policy (:mod:`qformat.paths`): no ``..``, no absolute or odd names, no
  link out of DIR, regular files only; a folder is answered by its ``index.html`` if it has one,
  else ``404`` (no listings).

It binds 127.0.0.1 unless told otherwise: it is for a user's own machine and tests, not the
open internet (no TLS, no authentication).
"""

from __future__ import annotations

import mimetypes
import os
import re
import sys
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from . import paths
from .errors import QFormatError

#: Bytes per write of a body.
CHUNK = 1 << 20
#: Media types the standard table may lack (a browser compiles WebAssembly only as application/wasm).
TYPES = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript", ".json": "application/json",
         ".safetensors": "application/octet-stream", ".gguf": "application/octet-stream"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Expose-Headers": "Content-Range, Content-Length, Accept-Ranges, ETag, Last-Modified",
}


def _media_type(path: Path) -> str:
    return TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def resolve(root: str, url_path: str) -> Path | None:
    """The regular file under ``root`` that ``url_path`` names, or None (not there, a name the
    path policy refuses, a link out of ``root``).  A folder names its ``index.html``."""
    rel = unquote(urlsplit(url_path).path).strip("/")
    try:
        segs = paths.parts(rel, code="FILE_UNREADABLE", root=root, what="requested path") if rel else []
    except QFormatError:
        return None
    p = os.path.join(root, *segs)
    if os.path.isdir(p):
        p = os.path.join(p, "index.html")
    real = os.path.realpath(p)  # a link is followed only where it stays inside root
    if not paths.within(real, root) or not os.path.isfile(real):
        return None
    return Path(real)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """``[start, stop)`` of a single ``Range`` header; None for no (or an unusable or multiple)
    range: the whole file; ``"unsatisfiable"`` where it starts at or past the end."""
    if not header:
        return None
    m = _RANGE.fullmatch(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        return None
    a, b = m.group(1), m.group(2)
    if not a:  # the last N bytes
        n = int(b)
        return (max(size - n, 0), size) if n else "unsatisfiable"
    start = int(a)
    stop = min(int(b) + 1, size) if b else size
    if b and int(b) < start:
        return None
    return "unsatisfiable" if start >= size else (start, stop)


class Handler(BaseHTTPRequestHandler):
    """One request; ``root`` and ``quiet`` come from :func:`make_server`."""

    server_version = "qformat-serve"
    protocol_version = "HTTP/1.1"
    root = "."
    quiet = False

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        if not self.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in {**_CORS, **headers}.items():
            self.send_header(k, v)
        self.end_headers()

    def do_OPTIONS(self) -> None:  # noqa: N802 (http.server's naming)
        self._head(204, {"Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
                         "Access-Control-Allow-Headers": "Range, If-Range, If-None-Match, If-Modified-Since",
                         "Access-Control-Max-Age": "600", "Content-Length": "0"})

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = resolve(self.root, self.path)
        if path is None:
            self._head(404, {"Content-Length": "0"})
            return
        try:
            f = open(path, "rb")
        except OSError:
            self._head(404, {"Content-Length": "0"})
            return
        with f:
            st = os.fstat(f.fileno())
            size = st.st_size
            etag = f'"{size:x}-{st.st_mtime_ns:x}"'
            modified = formatdate(st.st_mtime, usegmt=True)
            common = {"ETag": etag, "Last-Modified": modified, "Accept-Ranges": "bytes", "Cache-Control": "no-cache",
                      "Content-Type": _media_type(path)}
            if self._not_modified(etag, st.st_mtime):
                self._head(304, {k: common[k] for k in ("ETag", "Last-Modified", "Cache-Control")})
                return
            want = byte_range(self.headers.get("Range"), size)
            if_range = self.headers.get("If-Range")
            if want is not None and if_range is not None and if_range.strip() not in (etag, modified):
                want = None  # the file changed since the reader's first answer: the whole file, now
            if want == "unsatisfiable":
                self._head(416, {**common, "Content-Range": f"bytes */{size}", "Content-Length": "0"})
                return
            if want is None:
                start, stop, status, extra = 0, size, 200, {}
            else:
                start, stop = want  # type: ignore[misc]
                status, extra = 206, {"Content-Range": f"bytes {start}-{stop - 1}/{size}"}
            self._head(status, {**common, **extra, "Content-Length": str(stop - start)})
            if not body:
                return
            f.seek(start)
            left = stop - start
            try:
                while left > 0:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:  # the file shrank while it was sent: end the connection short
                        self.close_connection = True
                        return
                    self.wfile.write(chunk)
                    left -= len(chunk)
            except (BrokenPipeError, ConnectionResetError):  # the reader went away
                self.close_connection = True

    def _not_modified(self, etag: str, mtime: float) -> bool:
        inm = self.headers.get("If-None-Match")
        if inm is not None:
            tags = [t.strip() for t in inm.split(",")]
            return "*" in tags or etag in tags or f"W/{etag}" in tags
        ims = self.headers.get("If-Modified-Since")
        if ims:
            try:
                return int(mtime) <= parsedate_to_datetime(ims).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                return False
        return False


def make_server(root: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 8000, quiet: bool = False) -> ThreadingHTTPServer:
    """A threading server for the files under ``root`` (call ``serve_forever()``); port 0 picks a free one."""
    handler = type("BoundHandler", (Handler,), {"root": os.path.realpath(os.fspath(root)), "quiet": quiet})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
