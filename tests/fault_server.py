"""A fault-injecting HTTP server for fuzzing the remote reader (qformat.remote; issue 40).

One server (tests/range_server.py) on 127.0.0.1 serves a folder, and a second one on 127.0.0.2
(another host, by the reader's rules) is where the redirect mode points.  Each fuzz iteration
turns the fuzzer's bytes into a fault (:func:`faults_from_bytes`), installs it
(:meth:`FaultServer.use`: the request count starts again at 0), reads a URL with short
deadlines (:func:`fuzz_options`) and checks the outcome (:meth:`FaultServer.read`): the same
tensors as the local file, or a qformat error code; never another exception, never a request
to the other host, never longer than the deadlines allow.

    with FaultServer(folder) as fs:
        for data in inputs:
            fs.use(faults_from_bytes(data))
            outcome = fs.read("m.safetensors")   # "ok" or the error code; raises on a defect

Modes (byte 0 of the input, modulo their count; the next bytes are the mode's parameters):
``ok``, ``drip`` (body, 1-8 byte pieces at 20-275 bytes/s), ``drip_headers`` (status line and
headers too), ``wrong_range`` (Content-Range shifted by -4..+3), ``short_body`` (0-255 bytes, then
close), ``reset`` (TCP RST after 0-255 bytes), ``redirect`` (302 to the other host),
``huge_total`` (a Content-Range total of 2^40..2^69 bytes), ``negative_total``, ``bad_total``
(not a number), ``ignore_range`` (200 with the whole file), ``status`` (an error status),
``drop`` / ``fail_5xx`` (the first 1-4 requests), ``change`` (the file changes after request
1-4), ``wrong_length``, ``huge_length``, ``delay`` (0-0.5 s before answering).
Byte 1's top bit adds one dropped first request to any mode (a transient fault before it).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from .range_server import Faults, ServedURL, serve_ranges

__all__ = ["MODES", "FaultServer", "faults_from_bytes", "fuzz_options"]

MODES = ("ok", "drip", "drip_headers", "wrong_range", "short_body", "reset", "redirect", "huge_total", "negative_total",
         "bad_total", "ignore_range", "status", "drop", "fail_5xx", "change", "wrong_length", "huge_length", "delay")
_BAD_TOTALS = ("", "*", "x", "+5", "0x10", "1_0", "5 ", "\u00b2", "1e3", "-0", "18446744073709551616", "9" * 25)
_STATUSES = (301, 400, 401, 403, 404, 410, 416, 429, 500, 503, 999)
#: The codes of refusing what a server does (the header parser's own codes also end an
#: iteration when a server's claimed size makes the file inconsistent: TRAILING_BYTES, ...).
REMOTE_CODES = ("REMOTE_UNREACHABLE", "REMOTE_HTTP_ERROR", "REMOTE_RANGE_IGNORED", "REMOTE_RANGE_INVALID", "REMOTE_CHANGED",
                "REMOTE_REDIRECT_REFUSED", "FILE_UNREADABLE")


def faults_from_bytes(data: bytes, redirect_to: str | None = None) -> tuple[str, Faults]:
    """(mode name, Faults) that the fuzzer's ``data`` selects (see the module docstring);
    ``redirect_to``: the other host's base URL (:attr:`FaultServer.other`)."""
    b = bytes(data[:8]).ljust(8, b"\0")
    mode = MODES[b[0] % len(MODES)]
    p1, p2, p3 = b[1] & 0x7F, b[2], b[3]
    f = Faults(drop_first=1 if b[1] & 0x80 else 0)
    if mode == "drip" or mode == "drip_headers":
        f.drip_bytes_per_s, f.drip_piece, f.drip_headers = 20.0 + p2, 1 + p3 % 8, mode == "drip_headers"
    elif mode == "wrong_range":
        f.range_shift = (p2 % 8) - 4 or 1
    elif mode == "short_body":
        f.short_body = p2
    elif mode == "reset":
        f.reset_after = p2
    elif mode == "redirect":
        f.redirect_to = redirect_to
    elif mode == "huge_total":
        f.total = str((1 << (40 + p2 % 30)) + p3)
    elif mode == "negative_total":
        f.total = str(-1 - p2)
    elif mode == "bad_total":
        f.total = _BAD_TOTALS[p2 % len(_BAD_TOTALS)]
    elif mode == "ignore_range":
        f.ignore_range = True
    elif mode == "status":
        f.status = _STATUSES[p2 % len(_STATUSES)]
    elif mode == "drop":
        f.drop_first += 1 + p2 % 4
    elif mode == "fail_5xx":
        f.fail_5xx_first = 1 + p2 % 4
    elif mode == "change":
        f.change_after = 1 + p2 % 4  # after a first answer (from request 0 on, the server just serves another file)
    elif mode == "wrong_length":
        f.wrong_length = True
    elif mode == "huge_length":
        f.huge_length = True
    elif mode == "delay":
        f.delay_s, f.delay_first = (p2 % 6) / 10, 1 + p1 % 3
    return mode, f


def fuzz_options(deadline_s: float = 0.3) -> Any:
    """HttpOptions for one fuzz iteration: short timeouts and deadline, one retry, no backoff,
    ranges fetched as asked (so a drip or a silence costs a fraction of a second)."""
    from qformat.remote import HttpOptions

    return HttpOptions(connect_timeout=deadline_s, read_timeout=deadline_s, retries=1, backoff_s=0.0, coalesce_gap=0,
                       deadline_s=deadline_s, workers=1)


class FaultServer:
    """The two loopback servers of a fuzz run (a context manager): :attr:`url` serves
    ``folder`` with the faults :meth:`use` installs; :attr:`other` (127.0.0.2) is the other
    host a ``redirect`` points to, and must never see a request."""

    url: ServedURL
    other: ServedURL

    def __init__(self, folder: Path, deadline_s: float = 0.3):
        self.folder = Path(folder)
        self.options = fuzz_options(deadline_s)
        self._stack = ExitStack()

    def __enter__(self) -> "FaultServer":
        self.other = self._stack.enter_context(serve_ranges(self.folder, host="127.0.0.2"))
        self.url = self._stack.enter_context(serve_ranges(self.folder))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    def use(self, faults: Faults) -> None:
        """Serve with ``faults`` from the next request on (counted from 0, logs emptied)."""
        self.url.set_faults(faults)
        self.other.log.reset()

    def use_bytes(self, data: bytes) -> str:
        """:meth:`use` the faults ``data`` selects; the mode's name."""
        mode, f = faults_from_bytes(data, self.other)
        self.use(f)
        return mode

    def read(self, name: str, max_reads: int = 16) -> str:
        """Read every tensor of file ``name`` over HTTP: ``"ok"`` (the values equal the local
        file's) or the qformat error code (one of errors.json's).  Raises AssertionError for a defect: a value that
        differs, a request to the other host, an iteration past ``max_reads`` deadlines; any
        exception other than :class:`~qformat.errors.QFormatError` propagates."""
        import qformat
        from qformat import remote
        from qformat.errors import QFormatError

        remote.forget_opened()
        t = time.monotonic()
        try:
            with qformat.safe_open(self.url + name) as r:
                got = {n: r.get_tensor(n) for n in r.keys()}
            outcome = "ok"
        except QFormatError as e:
            outcome, got = e.code, None
            from qformat import tables

            assert outcome in tables.errors(), f"{outcome}: not a code of qformat/tables/errors.json"
        finally:
            elapsed = time.monotonic() - t
        assert self.other.log.requests == [], f"a request reached the other host: {self.other.log.requests}"
        bound = max_reads * (self.options.deadline_s + 1.0)  # each read: its deadline (+ scheduling slack)
        assert elapsed < bound, f"{elapsed:.1f} s, more than {max_reads} reads' deadlines"
        if got is not None:
            with qformat.safe_open(self.folder / name) as f:
                want = {n: f.get_tensor(n) for n in f.keys()}
            assert got.keys() == want.keys(), (sorted(got), sorted(want))
            for n in want:
                a, b = np.asarray(got[n]), np.asarray(want[n])
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), n
        return outcome
