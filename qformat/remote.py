"""Reading http(s):// files by byte ranges, into a sparse local mirror the file reader maps.

A remote file is read as the local reader reads a file, through the same header parser
(:func:`qformat.container.parse_header`) and the same :class:`~qformat.sources.FileSource`: the
only difference is where the bytes come from.  :class:`HttpRangeReader` fetches byte ranges
with HTTP ``Range`` requests; :class:`RemoteFile` keeps the bytes fetched so far in a sparse
temporary file of the remote file's size (bytes never fetched take no disk and no memory) and
memory-maps it, and fetches the ranges a reader needs before the reader looks at them
(:meth:`RemoteFile.ensure`).

What is refused, each with a coded error (never a traceback, never a token in a message):
a connection that fails or times out on every retry, or a read that outlasts its total deadline
(REMOTE_UNREACHABLE; see :class:`HttpOptions`), 404/401/403/416 or a
5xx that outlasts the retries (REMOTE_HTTP_ERROR), a server that ignores ``Range``
(REMOTE_RANGE_IGNORED, the body is not read), a range answer of the wrong bytes or length
(REMOTE_RANGE_INVALID, nothing allocated from the server's lengths; a Content-Range must be
``bytes A-B/SIZE`` in ASCII digits with A <= B < SIZE), a file whose ETag or Last-Modified
changes between answers (REMOTE_CHANGED: sent as ``If-Range``, compared on every answer), a
redirect to another host unless allowed (REMOTE_REDIRECT_REFUSED), and a file larger than the
local mirror can hold (FILE_UNREADABLE: the filesystem's largest file, 16 TiB on ext4).

Every URL in a message is shown by :func:`qformat.redact.shown` (no user-info, no query).

Environment: ``QFORMAT_HTTP_TOKEN`` (bearer token; ``HF_TOKEN`` for huggingface.co hosts),
``QFORMAT_HTTP_ALLOW_REDIRECTS=1`` (follow redirects to other hosts, as the Hugging Face hub
sends to its CDN; the Authorization header stays with the first host),
``QFORMAT_HTTP_TIMEOUT`` (``connect,read`` seconds), ``QFORMAT_HTTP_DEADLINE`` (seconds: the
total deadline of one read, see :class:`HttpOptions`), ``QFORMAT_HTTP_RETRIES``,
``QFORMAT_HTTP_WORKERS`` (parallel range requests).

Other URL schemes (``s3://``, ``gs://``, ``hf://`` ...) are read the same way through fsspec
when it is installed (:mod:`qformat.remote_fsspec`).
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import re
import socket
import struct
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable
from urllib.parse import urljoin, urlsplit

from . import tables
from .container import Header, parse_header
from .container import read_header as _read_local_header
from .errors import QFormatError, error
from .redact import shown as _shown_text
from .remote_deadline import Budget, deadline_seconds

__all__ = ["DEFAULT_OPTIONS", "HttpOptions", "HttpRangeReader", "RemoteFile", "fetch_bytes", "fetched_total", "forget_opened",
           "hash_remote_range", "is_url", "open_remote", "read_header", "read_remote_header", "sibling_url", "take_remote",
           "url_basename", "url_folder", "url_join"]

_HF_HOSTS = ("huggingface.co", "hf.co")
_REDIRECTS = (301, 302, 303, 307, 308)
_RETRY_STATUS = (429, 500, 502, 503, 504)


def is_url(path: Any) -> bool:
    """True for an ``http://`` or ``https://`` URL, or one of the schemes read through fsspec
    (``s3://``, ``gs://``, ``hf://``, ...: :mod:`qformat.remote_fsspec`).  A string; paths
    (``os.PathLike``) are never URLs."""
    if not isinstance(path, str) or "://" not in path[:12]:
        return False
    scheme = path.split("://", 1)[0].lower()
    return scheme in ("http", "https") or scheme in _fsspec_schemes()


def _fsspec_schemes() -> tuple[str, ...]:
    from .remote_fsspec import SCHEMES

    return SCHEMES


def _reader(url: str, options: HttpOptions | None) -> Any:
    """The range reader for ``url``: HTTP, or fsspec for its other schemes."""
    if url[:8].lower().startswith(("http://", "https://")):
        return HttpRangeReader(url, options)
    from .remote_fsspec import FsspecRangeReader

    return FsspecRangeReader(url, _options(options), _shown(url), _count)


def url_basename(url: str) -> str:
    """The last segment of ``url``'s path (its file name; never its query or fragment)."""
    return urlsplit(url).path.rsplit("/", 1)[-1]


def url_folder(url: str) -> str:
    """``url`` up to and including the last ``/`` of its path: the folder its siblings (an
    index's shards, a model's side files) are in.  The query and fragment are dropped: a query
    applies to the URL that carries it alone (a signature signs one object), so siblings are
    fetched without it; private files take a token (QFORMAT_HTTP_TOKEN)."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{p.path.rsplit('/', 1)[0]}/"


def sibling_url(base: str, name: str, field: str | None = "weight_map") -> str:
    """The URL of file ``name`` in the folder of ``base`` (a shard named by a remote index, a side
    file beside a remote model): always on ``base``'s origin and directly inside its folder.

    ``name`` is a plain file name: one that is empty, ``.`` or ``..``, holds ``/``, ``\\`` or NUL,
    or could name another origin (``http://other/x``, ``//other/x``, ``/abs``, ``../../x``) is
    refused with INDEX_INVALID, before anything is fetched (so no token goes anywhere else).
    The name is percent-encoded whole, so ``%2e%2e``, ``?`` or ``#`` in it are its own
    characters, never a dot-segment, a query or a fragment."""
    from urllib.parse import quote

    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise error("INDEX_INVALID", f"shard name {str(name)[:200]!r} must be a plain file name inside the index's folder "
                                     f"({_shown(url_folder(base))})", field=field)
    folder = url_folder(base)
    url = folder + quote(name, safe="")
    # the same origin and folder, whatever the name held (a guard on the rule above)
    if urlsplit(url).netloc != urlsplit(base).netloc or url_folder(url) != folder:  # pragma: no cover - quote() makes it so
        raise error("INDEX_INVALID", f"shard name {name[:200]!r} leaves the index's folder", field=field)
    return url


def url_join(base: str, name: str) -> str:
    """:func:`sibling_url`: ``name`` as a plain file name in ``base``'s folder (a shard next to
    its index).  Never a general URL join: a name that would leave the folder or the origin is
    refused (INDEX_INVALID)."""
    return sibling_url(base, name)


def _env_float_pair(name: str, default: tuple[float, float]) -> tuple[float, float]:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        parts = [float(x) for x in raw.split(",")]
    except ValueError:
        raise error("REMOTE_UNREACHABLE", f"{name}={raw!r}: expected seconds as 'connect,read' or one number") from None
    return (parts[0], parts[-1])


@dataclass
class HttpOptions:
    """How remote files are read.  :meth:`from_env` reads the ``QFORMAT_HTTP_*`` variables.

    Every remote read (a header, an index or side JSON, a byte range; all its tries, redirects
    and backoff included) has a total deadline: it ends with REMOTE_UNREACHABLE once its time
    exceeds ``deadline_s + received / min_bytes_per_s``, ``received`` being the most bytes one
    try of it has received so far.  A read of ``n`` bytes so takes at most
    ``deadline_s + n / min_bytes_per_s`` seconds (60 s + 1 s per 64 KiB by default), however
    slowly a server drips, and a server that sends nothing gets ``deadline_s``.  The connect
    and read timeouts bound each wait within that (a socket's read timeout restarts with every
    byte, so it alone bounds nothing)."""

    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retries: int = 4  # extra tries after the first, for connection errors, timeouts and 5xx/429
    backoff_s: float = 0.25  # sleep backoff_s * 2**try between tries
    workers: int = 4  # range requests in flight at once (a small, bounded pool)
    allow_cross_host: bool = False  # follow redirects to another host (never sending Authorization there)
    coalesce_gap: int = 4096  # ranges closer than this are fetched as one (fewer requests, a few bytes more)
    max_request_bytes: int = 64 << 20  # one request's body at most: bounds memory per request
    # the slowest body accepted: a try past read_timeout + size / this is cut off and retried,
    # a read past deadline_s + received / this ends (see above)
    min_bytes_per_s: float = 64 << 10
    deadline_s: float = 60.0  # the total deadline of one read, plus received / min_bytes_per_s (see above)
    token: str | None = field(default=None, repr=False)  # bearer token; None: from the environment

    @classmethod
    def from_env(cls) -> "HttpOptions":
        connect, read = _env_float_pair("QFORMAT_HTTP_TIMEOUT", (cls.connect_timeout, cls.read_timeout))
        opts = cls(connect_timeout=connect, read_timeout=read)
        for name, attr in (("QFORMAT_HTTP_RETRIES", "retries"), ("QFORMAT_HTTP_WORKERS", "workers")):
            if os.environ.get(name, "").strip().isdigit():
                setattr(opts, attr, max(int(os.environ[name]), 1 if attr == "workers" else 0))
        if os.environ.get("QFORMAT_HTTP_DEADLINE", "").strip():
            opts.deadline_s = deadline_seconds(os.environ["QFORMAT_HTTP_DEADLINE"].strip())
        opts.allow_cross_host = os.environ.get("QFORMAT_HTTP_ALLOW_REDIRECTS", "") in ("1", "true", "yes")
        return opts


#: The options every URL opened without explicit options uses (tests and the CLI may replace it).
DEFAULT_OPTIONS: HttpOptions | None = None


def _options(opts: HttpOptions | None) -> HttpOptions:
    return opts or DEFAULT_OPTIONS or HttpOptions.from_env()


def _token_for(url: str, opts: HttpOptions) -> str | None:
    if opts.token:
        return opts.token
    host = (urlsplit(url).hostname or "").lower()
    if any(host == h or host.endswith("." + h) for h in _HF_HOSTS) and os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    return os.environ.get("QFORMAT_HTTP_TOKEN") or None


def _shown(url: str) -> str:
    """``url`` as messages show it (:func:`qformat.redact.shown`: no user-info, no query)."""
    return _shown_text(url)


# -- the total deadline of one read (qformat.remote_deadline) ------------------------------
_LOCAL = threading.local()  # the Budget of the read the current thread is doing (for the watchdog)


class _Watchdog:
    """Ends a request whose read's deadline passed, by shutting its socket down.

    A blocking socket read waits at most the read timeout, but a server dripping a byte just
    before each timeout (in the status line, the headers or the body) keeps it alive forever;
    the one way to stop it from outside is to shut the socket down, which makes the blocked
    read return.  Sockets are armed by the connections of :func:`_session` (on connect and on
    every request) while a read holds a :class:`Budget` in this thread, and disarmed when it ends.
    One daemon thread watches them all."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._armed: dict[int, tuple[Budget, socket.socket]] = {}
        self._thread: threading.Thread | None = None

    def arm(self, sock: Any) -> None:
        budget = getattr(_LOCAL, "budget", None)
        if budget is None or sock is None:
            return
        with self._cv:
            self._armed[id(sock)] = (budget, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qformat-http-deadline", daemon=True)
                self._thread.start()
            self._cv.notify()

    def disarm(self, budget: Budget) -> None:
        with self._cv:
            for k in [k for k, (b, _) in self._armed.items() if b is budget]:
                del self._armed[k]

    def _run(self) -> None:
        with self._cv:
            while True:
                now, wait = time.monotonic(), None
                for k, (b, sock) in list(self._armed.items()):
                    left = b.end() - now  # grows as bytes arrive: re-read on every wake
                    if left > 0:
                        wait = left if wait is None else min(wait, left)
                        continue
                    del self._armed[k]
                    b.expired = True
                    try:  # the plain socket's shutdown (an SSLSocket's own would drop its state under a reader)
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                    except (OSError, TypeError, ValueError):
                        pass
                self._cv.wait(wait)


_WATCHDOG = _Watchdog()
_POOL_CLASSES: dict[str, Any] = {}


def _watched_pools() -> dict[str, Any]:
    """urllib3 connection pools whose connections arm :data:`_WATCHDOG` on connect and on every
    request (both urllib3 1.26 and 2.x name these hooks so)."""
    if not _POOL_CLASSES:
        import urllib3
        from urllib3.connection import HTTPConnection, HTTPSConnection

        class _Watched:
            sock: Any

            def _new_conn(self) -> Any:
                sock = super()._new_conn()  # type: ignore[misc]
                _WATCHDOG.arm(sock)
                return sock

            def request(self, *args: Any, **kwargs: Any) -> Any:
                _WATCHDOG.arm(self.sock)  # a kept-alive connection: armed for this read
                return super().request(*args, **kwargs)  # type: ignore[misc]

        class _Conn(_Watched, HTTPConnection):
            pass

        class _SConn(_Watched, HTTPSConnection):
            pass

        class _Pool(urllib3.HTTPConnectionPool):
            ConnectionCls = _Conn

        class _SPool(urllib3.HTTPSConnectionPool):
            ConnectionCls = _SConn

        _POOL_CLASSES.update(http=_Pool, https=_SPool)
    return _POOL_CLASSES


def _session() -> Any:
    try:
        import requests
        from requests.adapters import HTTPAdapter
    except ImportError:  # pragma: no cover - requests is a dependency
        raise error("DEPENDENCY_MISSING", "reading http(s):// files needs the 'requests' package: pip install requests") from None
    s = requests.Session()
    s.trust_env = False  # no .netrc credentials or proxies picked up behind the caller's back
    adapter = HTTPAdapter()
    adapter.poolmanager.pool_classes_by_scheme = _watched_pools()
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


_TOTAL = [0, 0]  # bytes and requests of every reader of the process (the CLI reports them)
_TOTAL_LOCK = threading.Lock()


def _count(nbytes: int, requests: int = 0) -> None:
    with _TOTAL_LOCK:
        _TOTAL[0] += nbytes
        _TOTAL[1] += requests


def fetched_total() -> tuple[int, int]:
    """(bytes, requests) fetched over HTTP by this process so far."""
    with _TOTAL_LOCK:
        return _TOTAL[0], _TOTAL[1]


# Content-Range: ASCII digits only (int() would take '-5', '+5', ' 5', '5_0' and other scripts'
# digits); 20 digits reach past 2**64, and a size the local mirror cannot hold is refused there.
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20})")
_UNSATISFIED = re.compile(r"bytes \*/([0-9]{1,20})")


class HttpRangeReader:
    """Byte ranges of one http(s) URL, read with ``Range`` requests.

    The first request (:meth:`read`) fixes the file's size (from ``Content-Range``) and its
    validator (ETag, else Last-Modified); every later request sends it as ``If-Range`` and every
    answer is compared with it.  :attr:`bytes_fetched` and :attr:`requests` count what was read.
    Every read has a total deadline (:class:`HttpOptions`).  Thread-safe: one ``requests``
    session per thread.
    """

    def __init__(self, url: str, options: HttpOptions | None = None):
        self.url = url
        self.options = _options(options)
        self.size: int | None = None
        self.etag: str | None = None
        self.last_modified: str | None = None
        self.bytes_fetched = 0
        self.requests = 0
        #: set when an answer showed the file changed (REMOTE_CHANGED): never reused after that
        self.changed = False
        self._lock = threading.Lock()
        self._local = threading.local()
        #: the URL as messages show it: no user:password and no query (signed URLs carry secrets there)
        self.shown = _shown(url)
        self._token = _token_for(url, self.options)
        self._origin = urlsplit(url).netloc.lower()
        self._scheme = urlsplit(url).scheme.lower()

    # -- one request ---------------------------------------------------------------------------
    def _sess(self) -> Any:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = _session()
        return s

    def _headers(self, url: str, start: int, stop: int) -> dict[str, str]:
        h = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
        # If-Range needs a strong validator; a weak ETag is compared on the answer instead.
        if self.etag and not self.etag.startswith("W/"):
            h["If-Range"] = self.etag
        elif self.last_modified:
            h["If-Range"] = self.last_modified
        p = urlsplit(url)
        if self._token and p.netloc.lower() == self._origin and p.scheme.lower() == self._scheme:
            # only ever to the host the caller named, and never after a downgrade to plain http
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _get(self, start: int, stop: int, budget: Budget | None = None) -> Any:
        """The 206 answer to ``Range: bytes=start-(stop-1)``, redirects followed by the rules;
        each request's timeouts are cut to what is left of ``budget``."""
        url = self.url
        for _ in range(10):
            left = budget.left() if budget is not None else float("inf")
            if left <= 0:
                raise _Deadline()
            timeout = (max(min(self.options.connect_timeout, left), 0.001), max(min(self.options.read_timeout, left), 0.001))
            r = self._sess().get(url, headers=self._headers(url, start, stop), stream=True, allow_redirects=False,
                                 timeout=timeout)
            with self._lock:
                self.requests += 1
            _count(0, 1)
            if r.status_code not in _REDIRECTS:
                return r
            target = urljoin(url, r.headers.get("Location", ""))
            r.close()
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https"):
                raise error("REMOTE_REDIRECT_REFUSED", f"{self.shown} redirects to a {parts.scheme or 'relative'}: URL, only http(s) is read")
            if parts.netloc.lower() != self._origin and not self.options.allow_cross_host:
                raise error("REMOTE_REDIRECT_REFUSED", f"{self.shown} redirects to another host ({parts.hostname}); set "
                                                       "QFORMAT_HTTP_ALLOW_REDIRECTS=1 to follow (no token is sent there)")
            url = target
        raise error("REMOTE_HTTP_ERROR", f"{self.shown}: more than 10 redirects")

    def _validate(self, r: Any, start: int, stop: int) -> int:
        """Refuse an answer that is not exactly the asked bytes of the same file version; the
        end of the bytes it holds (``stop``, or the file's end when the first request reaches
        past it: a file shorter than 8 bytes, which the header parser then names)."""
        etag, lm = r.headers.get("ETag"), r.headers.get("Last-Modified")
        if self.size is not None and ((self.etag and etag != self.etag) or (not self.etag and self.last_modified and lm != self.last_modified)):
            self.changed = True
            raise error("REMOTE_CHANGED", f"{self.shown} changed while being read: the first answer had "
                                          f"{self.etag or self.last_modified!r}, a later one {etag or lm!r}")
        status = r.status_code
        if status == 200:
            raise error("REMOTE_RANGE_IGNORED", f"{self.shown}: the server answered a range request for bytes {start}-{stop - 1} with the "
                                                "whole file (status 200, no range support); remote files are read only by ranges (a folder served "
                                                "with `qformat serve DIR` answers them; python -m http.server does not)")
        first = self.size is None
        if first and status == 416:  # the first request starts past the end: an empty file
            m = _UNSATISFIED.fullmatch(r.headers.get("Content-Range", "").strip())
            if m and int(m.group(1)) <= start:
                self.size, self.etag, self.last_modified = int(m.group(1)), etag, lm
                return start
        if status != 206:
            hint = {404: " (not found)", 401: " (unauthorized: set QFORMAT_HTTP_TOKEN, or HF_TOKEN for huggingface.co)",
                    403: " (forbidden: set QFORMAT_HTTP_TOKEN, or HF_TOKEN for huggingface.co)",
                    416: " (range not satisfiable: the file is shorter than its header says)"}.get(status, "")
            raise error("REMOTE_HTTP_ERROR", f"{self.shown}: expected status 206 for bytes {start}-{stop - 1}, found {status}{hint}")
        cr = r.headers.get("Content-Range", "")
        m = _CONTENT_RANGE.fullmatch(cr.strip())
        if m is None:
            raise error("REMOTE_RANGE_INVALID", f"{self.shown}: expected 'Content-Range: bytes {start}-{stop - 1}/SIZE' (SIZE a "
                                                f"number of bytes), found {cr[:120]!r}")
        a_i, b_i, total_i = (int(g) for g in m.groups())
        if b_i >= total_i:
            raise error("REMOTE_RANGE_INVALID", f"{self.shown}: the answer's Content-Range {cr[:120]!r} ends past the file size it states")
        if first and a_i == start and b_i + 1 == total_i < stop:
            stop = total_i  # the first request reached past the end: the server cut it there (RFC 9110 14.1.2)
        if (a_i, b_i + 1) != (start, stop):
            raise error("REMOTE_RANGE_INVALID", f"{self.shown}: asked for bytes {start}-{stop - 1}, the answer's Content-Range is {cr[:120]!r}")
        if self.size is not None and total_i != self.size:
            self.changed = True
            raise error("REMOTE_CHANGED", f"{self.shown} changed while being read: its size was {self.size} bytes, now {total_i}")
        cl = r.headers.get("Content-Length")
        if cl is not None and cl.strip() != str(stop - start):
            raise error("REMOTE_RANGE_INVALID", f"{self.shown}: asked for {stop - start} bytes, the answer's Content-Length is {cl[:40]!r}")
        if self.size is None:
            self.size, self.etag, self.last_modified = total_i, etag, lm
        return stop

    def _body(self, r: Any, start: int, stop: int, budget: Budget, exact: bool = True) -> bytes:
        """The body: exactly ``stop - start`` bytes (``exact``), else at most that many (a whole
        small file answered with 200), read in pieces.  The read timeout bounds each wait; this
        try is cut off past ``read_timeout + size / min_bytes_per_s`` (retried), and the read's
        ``budget`` bounds all its tries."""
        n = stop - start
        cutoff = time.monotonic() + self.options.read_timeout + n / self.options.min_bytes_per_s
        parts, got = [], 0
        cap = n + 1 if exact else n  # exact: one byte more than asked, so a body that runs long is seen
        # read1 (urllib3 2): what has arrived, so the deadlines are checked as a body drips in
        read = getattr(r.raw, "read1", r.raw.read)
        try:
            while got < cap:
                piece = read(min(1 << 20, cap - got), decode_content=not exact)
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
                budget.received(got)
                if budget.passed():
                    raise _Deadline()
                if time.monotonic() > cutoff:
                    raise _Retry(f"the body came slower than {self.options.min_bytes_per_s:.0f} bytes/s")
        except (_Retry, _Deadline):
            raise
        except Exception as e:  # urllib3's ProtocolError/ReadTimeoutError: retried by the caller
            if budget.passed():
                raise _Deadline() from None
            raise _Retry(f"{type(e).__name__}: {e}") from None
        if budget.passed():  # the watchdog ended the body: it looks cut short, but the deadline ended it
            raise _Deadline()
        data = b"".join(parts)
        if exact and len(data) != n:
            raise error("REMOTE_RANGE_INVALID", f"{self.shown}: asked for bytes {start}-{stop - 1} ({n} bytes), the body "
                                                f"{'ended after' if len(data) < n else 'ran past'} {min(len(data), n)} bytes")
        return data

    def read(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)``, retried with backoff on connection errors,
        timeouts and 5xx/429 answers, within the read's total deadline; every other failure is
        a coded error at once."""
        return self._read(start, start + length, whole_ok=False)

    def _read(self, start: int, stop: int, whole_ok: bool) -> bytes:
        """:meth:`read`; ``whole_ok``: a small file's fetch (:func:`fetch_bytes`), where a 200
        answer (the whole file, at most ``stop`` bytes kept) and a 416 (an empty file) are
        answers too."""
        import requests

        budget = Budget(self.options)
        what = "the file" if whole_ok else f"bytes {start}-{stop - 1}"
        last = ""
        _LOCAL.budget = budget
        try:
            for attempt in range(self.options.retries + 1):
                if attempt:
                    pause = self.options.backoff_s * 2 ** (attempt - 1)
                    if pause >= budget.left():
                        break
                    time.sleep(pause)
                try:
                    r = self._get(start, stop, budget)
                except _Deadline:
                    break
                except (requests.ConnectionError, requests.Timeout) as e:
                    last = "timed out" if isinstance(e, requests.Timeout) else "connection failed or was dropped"
                    if budget.passed():
                        break
                    continue
                except requests.RequestException as e:  # a malformed URL or answer: no retry helps
                    if budget.passed():
                        break
                    raise error("REMOTE_UNREACHABLE", f"{self.shown}: {type(e).__name__}") from None
                try:
                    if r.status_code in _RETRY_STATUS:
                        last = f"status {r.status_code}"
                        continue
                    if whole_ok and r.status_code == 416:  # an empty file: no byte satisfies the range
                        return b""
                    if whole_ok and r.status_code == 200:
                        data = self._body(r, start, stop, budget, exact=False)
                    else:
                        end = self._validate(r, start, stop)
                        data = self._body(r, start, end, budget) if end > start else b""
                except _Retry as e:
                    last = str(e)[:200]
                    continue
                except _Deadline:
                    break
                except QFormatError:
                    if budget.expired:  # the watchdog cut the answer (its headers, say): what is wrong with it is the deadline's doing
                        break
                    raise
                finally:
                    r.close()  # an unread body (a refused 200) is dropped with the connection, never read
                with self._lock:
                    self.bytes_fetched += len(data)
                _count(len(data))
                return data
            else:
                code = "REMOTE_HTTP_ERROR" if last.startswith("status") else "REMOTE_UNREACHABLE"
                raise error(code, f"{self.shown}: {what} could not be read in {self.options.retries + 1} "
                                  f"tries ({last}; timeouts {self.options.connect_timeout}s connect, {self.options.read_timeout}s read)")
        finally:
            _LOCAL.budget = None
            _WATCHDOG.disarm(budget)
        raise error("REMOTE_UNREACHABLE", f"{self.shown}: {what} did not arrive in time: {budget.describe()}"
                                          + (f"; last try: {last}" if last else ""))


class _Retry(Exception):
    pass


class _Deadline(Exception):
    """The read's total deadline passed (its coded error is raised by the read)."""


def read_remote_header(reader: HttpRangeReader) -> Header:
    """The validated header of a remote file: 8 bytes, then the header bytes (at most
    ``max_header_bytes``, checked before anything is fetched or allocated), parsed by the same
    :func:`~qformat.container.parse_header` as a local file."""
    prefix = reader.read(0, 8)  # fewer for a file under 8 bytes: HEADER_TOO_SMALL below
    if len(prefix) < 8:
        return parse_header(io.BytesIO(prefix), reader.size or 0)
    size = reader.size or 0
    (n,) = struct.unpack("<Q", prefix)
    head = prefix
    if 0 < n <= tables.limits()["max_header_bytes"] and 8 + n <= size:
        head += reader.read(8, n)
    # parse_header refuses a bad length (too large, zero, past the end) from the prefix alone.
    return parse_header(io.BytesIO(head), size)


class RemoteFile:
    """A remote safetensors file: its validated header and a sparse local mirror of its bytes.

    :attr:`mm` maps a temporary file of the remote size; :meth:`ensure` fetches the ranges not
    yet fetched (coalesced, in parallel on a small pool) and writes them there, so arrays viewed
    in :attr:`mm` see the remote bytes.  Bytes never fetched use no disk or memory.
    """

    def __init__(self, url: str, options: HttpOptions | None = None):
        self.url = url
        self.reader = _reader(url, options)
        self.header = read_remote_header(self.reader)
        self._have: list[tuple[int, int]] = [(0, self.header.data_start)]
        self._lock = threading.Lock()
        self._ensuring = threading.Lock()
        self._file = tempfile.TemporaryFile(prefix="qformat-remote-")
        # closed with the last reference (arrays keep the map, which holds its own descriptor)
        weakref.finalize(self, self._file.close)
        size = self.header.file_size
        try:
            self._file.truncate(size)  # sparse: no blocks until written
            self.mm = mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_READ) if size else None
        except (OSError, OverflowError, ValueError) as e:  # EFBIG past the filesystem's largest file; ENOMEM past the address space
            self._file.close()
            why = getattr(e, "strerror", None) or type(e).__name__
            raise error("FILE_UNREADABLE", f"{self.reader.shown} is {size:,} bytes, larger than the local mirror it is read into "
                                           f"(a sparse temporary file in {tempfile.gettempdir()}) can hold: {why}") from None

    @property
    def bytes_fetched(self) -> int:
        """Bytes read from the server so far (header included)."""
        return self.reader.bytes_fetched

    def missing(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The parts of ``(offset, length)`` ranges not fetched yet, as (start, stop) pairs."""
        out = []
        with self._lock:
            have = list(self._have)
        for off, length in ranges:
            lo, hi = off, off + length
            for a, b in have:
                if b <= lo or a >= hi:
                    continue
                if a > lo:
                    out.append((lo, a))
                lo = max(lo, b)
                if lo >= hi:
                    break
            if lo < hi:
                out.append((lo, hi))
        return out

    def ensure(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch whatever of the ``(offset, length)`` ranges is not fetched yet.  One call at a
        time (a decoder's worker threads asking for the same component wait, then find it
        fetched, instead of fetching it twice); each call fetches on the pool."""
        ranges = list(ranges)
        with self._ensuring:
            self._ensure(ranges)

    def _ensure(self, ranges: list[tuple[int, int]]) -> None:
        todo = _coalesce(self.missing(ranges), self.reader.options.coalesce_gap, self.reader.options.max_request_bytes)
        if not todo:
            return
        workers = max(1, min(self.reader.options.workers, len(todo)))
        if workers == 1:
            for a, b in todo:
                self._fetch(a, b)
            return
        pool = _pool(workers)
        futures = [pool.submit(self._fetch, a, b) for a, b in todo]
        try:
            for fut in futures:
                fut.result()  # the first failure is raised (its coded error) ...
        finally:
            for fut in futures:  # ... once no fetch of this call still runs
                fut.cancel()
            for fut in futures:
                if not fut.cancelled():
                    fut.exception()

    def _fetch(self, a: int, b: int) -> None:
        data = self.reader.read(a, b - a)
        os.pwrite(self._file.fileno(), data, a)
        with self._lock:
            self._have = _merge(self._have + [(a, b)])

    def close(self) -> None:
        self.mm = None
        self._file.close()


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads: threads (and so their sessions' open
    connections, TLS included) live on between calls instead of being set up for each."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="qformat-http")
        return pool


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _coalesce(iv: list[tuple[int, int]], gap: int, limit: int) -> list[tuple[int, int]]:
    """Merge (start, stop) ranges closer than ``gap``, then cut any longer than ``limit``."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(iv):
        if merged and a - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    out = []
    for a, b in merged:
        while b - a > limit:
            out.append((a, a + limit))
            a += limit
        out.append((a, b))
    return out


# Open remote files by URL, so one URL is opened once while it is in use (one validator for its
# header and its data; `qformat check` then a reader share the fetched bytes).  Weak: a file
# nobody uses any more is dropped with its mirror (a check of many shards keeps one shard's
# bytes on local disk, not the checkpoint's); the last few opened are also held strongly, for
# the FileSource that maps a file right after read_header(url) read it.
_OPENED: "weakref.WeakValueDictionary[str, RemoteFile]" = weakref.WeakValueDictionary()
_RECENT: "collections.deque[RemoteFile]" = collections.deque(maxlen=2)
_OPENED_LOCK = threading.Lock()


def open_remote(url: str, options: HttpOptions | None = None) -> RemoteFile:
    """``url`` opened (its header read and validated), or the open file of that URL still in
    use: reused with its header, validator and fetched bytes, unless it was seen to change
    (then it is read anew)."""
    with _OPENED_LOCK:
        old = _OPENED.get(url)
    if old is not None and not old.reader.changed and options in (None, old.reader.options):
        return old
    rf = RemoteFile(url, options)
    with _OPENED_LOCK:
        _OPENED[url] = rf
        _RECENT.append(rf)
    return rf


def forget_opened() -> None:
    """Drop every remembered open file: the next open of any URL reads it anew."""
    with _OPENED_LOCK:
        _OPENED.clear()
        _RECENT.clear()


def take_remote(url: str, header: Header) -> RemoteFile:
    """The :class:`RemoteFile` whose header is ``header`` (opened by :func:`open_remote`), or
    ``url`` opened again (REMOTE_CHANGED if its header is no longer ``header``)."""
    with _OPENED_LOCK:
        rf = _OPENED.get(url)
    if rf is not None and rf.header is header:
        return rf
    rf = open_remote(url)
    if (rf.header.data_start, rf.header.file_size, rf.header.entries) != (header.data_start, header.file_size, header.entries):
        raise error("REMOTE_CHANGED", f"{_shown(url)} changed between reading its header and its data")
    return rf


def read_header(path: Any, null_metadata_ok: bool = False) -> Header:
    """:func:`qformat.container.read_header`, or for an http(s) URL the header read by ranges
    (the file stays open for the :class:`~qformat.sources.FileSource` that maps it)."""
    if is_url(path):
        return open_remote(path).header
    return _read_local_header(path, null_metadata_ok)


def hash_remote_range(url: str, offset: int, nbytes: int, h: Any, chunk: int) -> None:
    """Feed bytes ``[offset, offset + nbytes)`` of ``url`` to hash ``h``, fetched (once, into
    the mirror of the open file) ``chunk`` bytes at a time."""
    with _OPENED_LOCK:
        rf = _OPENED.get(url)
    rf = rf or open_remote(url)
    done = 0
    while done < nbytes:
        n = min(chunk, nbytes - done)
        rf.ensure([(offset + done, n)])
        assert rf.mm is not None
        h.update(rf.mm[offset + done : offset + done + n])
        done += n


def fetch_bytes(url: str, limit: int, options: HttpOptions | None = None) -> bytes:
    """A small whole file (an index, a side JSON): at most ``limit + 1`` bytes are kept (one
    more than allowed, so the caller sees a file that is too large), whatever Content-Length
    says.  A range request: a 206 answer is validated as :meth:`HttpRangeReader.read`'s are
    (it must start at byte 0), a server without ranges may answer 200 with the whole file.
    Retried, and bounded by the total deadline, as :meth:`HttpRangeReader.read`."""
    opts = _options(options)
    if not url[:8].lower().startswith(("http://", "https://")):
        reader_ = _reader(url, opts)  # fsspec: its first read may stop at the file's end
        return reader_.read(0, limit + 1)
    return HttpRangeReader(url, opts)._read(0, limit + 1, whole_ok=True)


from . import digests as _digests  # noqa: E402 - after hash_remote_range is defined

_digests.register_remote_hasher(hash_remote_range)
