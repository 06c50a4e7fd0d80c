"""A loopback HTTP server with byte-range support and selectable faults, for the remote tests.

``with serve_ranges(folder, faults) as base_url:`` serves the files under ``folder`` at
``base_url`` ('http://127.0.0.1:PORT/'), with single and multiple ``Range: bytes=`` ranges,
``If-Range``, ``ETag``/``Last-Modified``, ``HEAD`` and CORS (so a browser page can read from it
too). ``base_url`` is a ``str`` that also carries the server's record: ``base_url.log.requests``
(a list of ``(method, path, range header or None)``), ``base_url.log.headers`` (each request's
headers, in the same order) and ``base_url.log.bytes_sent`` (body bytes written).

Fault modes (``Faults``) are counted over GET and HEAD requests in arrival order (OPTIONS
preflights are never faulted or counted): the first ``drop_first`` requests are dropped (the
connection closes with no answer), the next ``fail_5xx_first`` answer 503, and so on; see the
field comments. The Python tests import this module and so does the JavaScript side's test.
"""

from __future__ import annotations

import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

__all__ = ["Faults", "ServerLog", "ServedURL", "serve_ranges"]

_CHUNK = 1 << 16
HUGE = 1 << 50  # the Content-Length a ``huge_length`` server claims (1 PiB)


@dataclass
class Faults:
    """What the server does wrong. Requests are numbered from 0 over GET and HEAD only."""

    drop_first: int = 0  # requests 0..drop_first-1: close the connection without an answer
    fail_5xx_first: int = 0  # the next fail_5xx_first requests: 503 Service Unavailable
    ignore_range: bool = False  # answer 200 with the whole body, whatever Range asked
    change_after: int | None = None  # requests >= change_after see a changed file (new bytes, ETag, date)
    delay_s: float = 0.0  # sleep this long before answering ...
    delay_first: int | None = None  # ... only the first delay_first requests (None: every request)
    wrong_length: bool = False  # a range answer one byte short (Content-Range still claims the asked range)
    redirect_to: str | None = None  # answer 302 to redirect_to + path (e.g. another server's base URL) ...
    redirect_from: str | None = None  # ... only for paths under this prefix (then cut from the path), else every path
    huge_length: bool = False  # claim a 1 PiB Content-Length (and Content-Range) on every answer
    status: int | None = None  # answer every GET/HEAD with this status (e.g. 403), no body
    no_cors: bool = False  # send no CORS headers: a browser page on another origin cannot read the answers
    many_headers: int = 0  # add this many junk header lines to every answer (clients cap the count)
    drip_bytes_per_s: float | None = None  # send bodies in drip_piece-byte pieces at about this rate (a slow drip)
    drip_piece: int = 256  # the drip's piece size (1: a byte at a time)
    drip_headers: bool = False  # drip the status line and headers too (at drip_bytes_per_s, drip_piece at a time)
    total: str | None = None  # the size part of every Content-Range ('-5', a 16 TiB total, 'x'), whatever the file's size
    range_shift: int = 0  # a range answer whose Content-Range claims bytes shifted by this much (the body is the asked bytes)
    short_body: int | None = None  # send only this many body bytes (the headers claim them all), then close the connection
    reset_after: int | None = None  # send this many body bytes, then reset the connection (TCP RST)
    etag: bool = True  # send an ETag
    last_modified: bool = True  # send a Last-Modified
    require_token: str | None = None  # answer 401 unless "Authorization: Bearer <token>"


@dataclass
class ServerLog:
    """What the server saw and sent (appended from the handler threads under ``lock``)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bytes_sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def gets(self) -> list[tuple[str, str, str | None]]:
        """The GET requests only."""
        with self.lock:
            return [r for r in self.requests if r[0] == "GET"]

    def reset(self) -> None:
        """Forget the requests and bytes so far (to measure one operation)."""
        with self.lock:
            self.requests.clear()
            self.headers.clear()
            self.bytes_sent = 0


class ServedURL(str):
    """The server's base URL; ``.log`` is its ServerLog, ``.faults`` its Faults, ``.port``."""

    log: ServerLog
    faults: Faults
    port: int
    _counter: list[int]

    def set_faults(self, faults: Faults) -> None:
        """Serve with ``faults`` from now on, counting requests from 0 again and with an empty
        log (a fuzz harness reuses one server for many iterations)."""
        for f in fields(Faults):
            setattr(self.faults, f.name, getattr(faults, f.name))
        with self.log.lock:
            self._counter[0] = 0
        self.log.reset()


def _changed_part(data: bytes, offset: int, size: int) -> bytes:
    """Bytes ``offset..`` of the "changed file": the file with its second half's bits flipped,
    so a reader that mixed the two versions would decode wrong values (the header, in the first
    half for small files, stays parseable: the dangerous case a validator must catch)."""
    cut = max(0, min(len(data), size // 2 - offset))
    return data[:cut] + bytes(b ^ 0xFF for b in data[cut:])


_RANGE = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")


def _parse_ranges(header: str, size: int) -> list[tuple[int, int]] | None:
    """``bytes=a-b,c-,-n`` -> inclusive (start, end) pairs clipped to size; [] when none is
    satisfiable; None when the header is malformed (then the server ignores it, as RFC 9110 says)."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or not spec:
        return None
    out = []
    for part in spec.split(","):
        m = _RANGE.match(part)
        if not m or (m.group(1) == "" and m.group(2) == ""):
            return None
        a, b = m.group(1), m.group(2)
        if a == "":  # suffix range: the last n bytes
            n = int(b)
            if n == 0:
                continue
            out.append((max(0, size - n), size - 1))
            continue
        start = int(a)
        end = size - 1 if b == "" else min(int(b), size - 1)
        if b != "" and int(b) < start:
            return None
        if start < size:
            out.append((start, end))
    return out


def _make_handler(folder: Path, live: Faults, log: ServerLog, counter: list[int]):
    root = folder.resolve()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers (and clients' pools) use
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

        @property
        def fx(self) -> Faults:
            """The faults of the answer being sent: ``live`` as it was when its request came (a
            test or a fuzz harness may change ``live`` between requests, never within one)."""
            return self.__dict__.get("_fx", live)

        def log_message(self, format, *args):  # noqa: A002 - silence the stderr access log
            pass

        # -- helpers --------------------------------------------------------------------
        def _cors(self) -> None:
            if self.fx.no_cors:
                return
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header(
                "Access-Control-Expose-Headers", "Content-Range, Content-Length, ETag, Last-Modified, Accept-Ranges"
            )
            self.send_header("Access-Control-Allow-Headers", "Range, If-Range, Authorization")
            self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")

        def _empty(self, status: int, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self._cors()
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def flush_headers(self) -> None:
            if self.fx.drip_headers and self.fx.drip_bytes_per_s and getattr(self, "_headers_buffer", None):
                data = b"".join(self._headers_buffer)
                self._headers_buffer = []
                self._drip(data)
                return
            super().flush_headers()

        def _drip(self, data: bytes) -> None:
            step = max(1, self.fx.drip_piece)
            for i in range(0, len(data), step):
                time.sleep(step / self.fx.drip_bytes_per_s)
                try:
                    self.wfile.write(data[i : i + step])
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True
                    return

        def _reset(self) -> None:
            """Abort the connection: a TCP RST instead of an orderly close."""
            import socket
            import struct

            try:
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass
            self.close_connection = True

        def _write(self, data: bytes) -> None:
            if self.fx.reset_after is not None or self.fx.short_body is not None:
                cut = self.fx.reset_after if self.fx.reset_after is not None else self.fx.short_body
                data = data[: max(0, cut - self._sent)]
            view = memoryview(data)
            step = max(1, self.fx.drip_piece) if self.fx.drip_bytes_per_s else _CHUNK
            for i in range(0, len(view), step):
                if self.fx.drip_bytes_per_s:
                    time.sleep(step / self.fx.drip_bytes_per_s)
                piece = view[i : i + step]
                # counted before the write: once the client has the bytes, the count includes them
                with log.lock:
                    log.bytes_sent += len(piece)
                try:
                    self.wfile.write(piece)
                    if self.fx.drip_bytes_per_s:
                        self.wfile.flush()
                except OSError:  # the client hung up (it refused a 200, say): stop sending
                    with log.lock:
                        log.bytes_sent -= len(piece)
                    self.close_connection = True
                    return
                self._sent += len(piece)

        def _file(self) -> Path | None:
            rel = unquote(urlsplit(self.path).path).lstrip("/")
            p = (root / rel).resolve()
            if p != root and root not in p.parents:
                return None
            return p if p.is_file() else None

        # -- methods --------------------------------------------------------------------
        def do_OPTIONS(self) -> None:  # noqa: N802 - the CORS preflight
            with log.lock:
                log.requests.append(("OPTIONS", self.path, self.headers.get("Range")))
                log.headers.append(dict(self.headers.items()))
            self._empty(204, {"Access-Control-Max-Age": "600"})

        def do_HEAD(self) -> None:  # noqa: N802
            self._serve(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(head=False)

        def _serve(self, head: bool) -> None:
            self._fx = replace(live)
            self._sent = 0  # body bytes of this answer written so far (short_body, reset_after)
            with log.lock:
                n = counter[0]
                counter[0] += 1
                log.requests.append(("HEAD" if head else "GET", self.path, self.headers.get("Range")))
                log.headers.append(dict(self.headers.items()))
            if self.fx.delay_s and (self.fx.delay_first is None or n < self.fx.delay_first):
                time.sleep(self.fx.delay_s)
            if n < self.fx.drop_first:
                self.close_connection = True  # no status line at all: the client sees a reset/EOF
                return
            if n < self.fx.drop_first + self.fx.fail_5xx_first:
                return self._empty(503)
            if self.fx.status is not None:
                return self._empty(self.fx.status)
            if self.fx.require_token is not None:
                if self.headers.get("Authorization") != f"Bearer {self.fx.require_token}":
                    return self._empty(401)
            path_part = urlsplit(self.path).path
            if self.fx.redirect_to is not None and (self.fx.redirect_from is None or path_part.startswith(self.fx.redirect_from)):
                rest = path_part[len(self.fx.redirect_from):] if self.fx.redirect_from else path_part
                target = self.fx.redirect_to.rstrip("/") + "/" + rest.lstrip("/")
                return self._empty(302, {"Location": target})
            path = self._file()
            if path is None:
                return self._empty(404)
            st = path.stat()
            size, mtime = st.st_size, st.st_mtime
            changed = self.fx.change_after is not None and n >= self.fx.change_after
            if changed:
                mtime += 3600

            def read(a: int, b: int) -> bytes:
                """Bytes a..b (inclusive) of the served version: only those are read from disk."""
                with open(path, "rb") as fh:
                    fh.seek(a)
                    data = fh.read(b + 1 - a)
                return _changed_part(data, a, size) if changed else data

            validators = {}
            if self.fx.etag:  # from size and date (hashing a large file per request would be the bottleneck)
                validators["ETag"] = f'"{size:x}-{int(st.st_mtime * 1e6):x}{"-changed" if changed else ""}"'
            if self.fx.last_modified:
                validators["Last-Modified"] = formatdate(mtime, usegmt=True)

            ranges = None
            rng = self.headers.get("Range")
            if rng is not None and not self.fx.ignore_range:
                if_range = self.headers.get("If-Range")
                # If-Range: the range applies only when the validator still matches (else the
                # whole, current file: RFC 9110 13.1.5).
                if if_range is None or if_range in (validators.get("ETag"), validators.get("Last-Modified")):
                    ranges = _parse_ranges(rng, size)
            if ranges == []:
                return self._empty(416, {"Content-Range": f"bytes */{size if self.fx.total is None else self.fx.total}", **validators})

            self.send_response(200 if ranges is None else 206)
            self._cors()
            for i in range(self.fx.many_headers):
                self.send_header(f"X-Junk-{i}", "x" * 64)
            self.send_header("Accept-Ranges", "bytes")
            for k, v in validators.items():
                self.send_header(k, v)
            if ranges is None:
                body = None  # the whole file, streamed below
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(HUGE if self.fx.huge_length else size))
            elif len(ranges) == 1:
                a, b = ranges[0]
                body = read(a, b)
                if self.fx.wrong_length and body:
                    body = body[:-1]
                claimed = HUGE if self.fx.huge_length else len(body)
                end = a + HUGE - 1 if self.fx.huge_length else b
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Range", f"bytes {a + self.fx.range_shift}-{end + self.fx.range_shift}/{size if self.fx.total is None else self.fx.total}")
                self.send_header("Content-Length", str(claimed))
            else:
                boundary = "qformat-" + os.urandom(8).hex()
                parts = []
                for a, b in ranges:
                    chunk = read(a, b)
                    if self.fx.wrong_length and chunk:
                        chunk = chunk[:-1]
                    parts.append(
                        f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n"
                        f"Content-Range: bytes {a}-{b}/{size}\r\n\r\n".encode() + chunk
                    )
                body = b"".join(parts) + f"\r\n--{boundary}--\r\n".encode()
                self.send_header("Content-Type", f"multipart/byteranges; boundary={boundary}")
                self.send_header("Content-Length", str(HUGE if self.fx.huge_length else len(body)))
            self.end_headers()
            if head:
                return
            if body is None:
                for a in range(0, size, 1 << 20):
                    self._write(read(a, min(size, a + (1 << 20)) - 1))
                    if self.close_connection:
                        break
            else:
                self._write(body)
            if self.fx.reset_after is not None:
                self._reset()
            elif self.fx.huge_length or self.fx.short_body is not None:
                self.close_connection = True  # the claimed length was never sent: end the stream

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler sleeping in delay_s must not hold up shutdown

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that hung up is no server error
            super().handle_error(request, client_address)


@contextmanager
def serve_ranges(folder: Path, faults: Faults | None = None, host: str = "127.0.0.1") -> Iterator[ServedURL]:
    """Serve ``folder`` over HTTP on ``host`` (an ephemeral port) for the ``with`` block.

    Yields the base URL ('http://127.0.0.1:PORT/'), a ``str`` with ``.log`` (ServerLog),
    ``.faults`` (the Faults in effect; a test may change its fields between requests) and
    ``.port``."""
    faults = faults if faults is not None else Faults()
    log = ServerLog()
    counter = [0]
    server = _Server((host, 0), _make_handler(Path(folder), faults, log, counter))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]
    url = ServedURL(f"http://{host}:{port}/")
    url.log, url.faults, url.port, url._counter = log, faults, port, counter
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
