"""Byte ranges of ``s3://``, ``gs://``, ``hf://`` ... files through fsspec, when it is installed.

:class:`FsspecRangeReader` has the interface of :class:`qformat.remote.HttpRangeReader`
(``read``, ``size``, ``bytes_fetched``, ``requests``, ``changed``, ``shown``, ``options``), so a
:class:`~qformat.remote.RemoteFile` reads these files exactly as it reads http(s) ones: the
header first (bounded by ``max_header_bytes``), then only the ranges asked for.  fsspec has no
conditional range read, so the file's size, ETag or modification time is taken once, when it is
opened; a later read that finds the file shorter than that is REMOTE_CHANGED.

Each read has the total deadline of :class:`qformat.remote.HttpOptions` for its size
(``deadline_s + length / min_bytes_per_s``: fsspec shows no bytes arriving, so the allowance is
fixed when the read starts).  A backend call runs on a daemon thread the read waits on for what
is left of it; past it the read ends with REMOTE_UNREACHABLE and the call is left to the
backend's own timeouts (its result is dropped).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .errors import error
from .remote_deadline import Budget

#: URL schemes read through fsspec (each needs its fsspec backend: s3fs, gcsfs, adlfs,
#: huggingface_hub); ``memory://`` is fsspec's in-process file system (the tests use it).
SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "hf", "memory")


class FsspecRangeReader:
    """Ranges of one fsspec URL (``fs.cat_file(path, start, end)``), retried on OSError."""

    def __init__(self, url: str, options: Any, shown: str, count: Any = None):
        self.url, self.options, self.shown = url, options, shown
        self._count = count or (lambda nbytes, requests=0: None)  # the process-wide counter (qformat.remote)
        self.size: int | None = None
        self.validator: Any = None
        self.bytes_fetched = 0
        self.requests = 0
        self.changed = False
        self._lock = threading.Lock()
        scheme = url.split("://", 1)[0]
        try:
            import fsspec

            self._fs, self._path = fsspec.core.url_to_fs(url)
        except ImportError as e:
            raise error("DEPENDENCY_MISSING", f"reading {scheme}:// files needs fsspec and its {scheme} backend "
                                              f"({str(e)[:120]})") from None
        except ValueError as e:
            raise error("FILE_UNREADABLE", f"{shown}: {str(e)[:200]}") from None

    def _call(self, what: str, fn: Any, nbytes: int = 0) -> Any:
        budget = Budget(self.options, nbytes)
        last = ""
        for attempt in range(self.options.retries + 1):
            if attempt:
                pause = self.options.backoff_s * 2 ** (attempt - 1)
                if pause >= budget.left():
                    break
                time.sleep(pause)
            with self._lock:
                self.requests += 1
            self._count(0, 1)
            try:
                return _within(fn, budget.left())
            except _Late:
                break
            except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                raise error("FILE_UNREADABLE", f"{self.shown}: {type(e).__name__}") from None
            except OSError as e:  # connection problems and the backends' transient errors
                last = type(e).__name__
        else:
            raise error("REMOTE_UNREACHABLE", f"{self.shown}: {what} could not be read in {self.options.retries + 1} tries ({last})")
        raise error("REMOTE_UNREACHABLE", f"{self.shown}: {what} did not arrive in time: {budget.describe()}"
                                          + (f"; last try: {last}" if last else ""))

    def read(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` (the first read, and only it, may be cut at the
        file's end: a file shorter than the 8-byte prefix)."""
        first = self.size is None
        if first:
            info = self._call("its size", lambda: self._fs.info(self._path))
            size = info.get("size") if isinstance(info, dict) else None
            if size is None:
                size = 0
            if isinstance(size, float) and size.is_integer():
                size = int(size)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise error("REMOTE_RANGE_INVALID", f"{self.shown}: the file system gives its size as {str(size)[:40]!r}, "
                                                    "not a number of bytes")
            self.size = size
            self.validator = next((info[k] for k in ("ETag", "etag", "LastModified", "mtime", "updated") if k in info), None)
        assert self.size is not None
        stop = min(start + length, self.size) if first else start + length
        if stop <= start:
            return b""
        data = self._call(f"bytes {start}-{stop - 1}", lambda: self._fs.cat_file(self._path, start=start, end=stop), stop - start)
        if len(data) != stop - start:
            self.changed = True
            raise error("REMOTE_CHANGED" if len(data) < stop - start else "REMOTE_RANGE_INVALID",
                        f"{self.shown}: asked for bytes {start}-{stop - 1} ({stop - start} bytes), got {len(data)}")
        with self._lock:
            self.bytes_fetched += len(data)
        self._count(len(data))
        return bytes(data)


class _Late(Exception):
    pass


def _within(fn: Any, seconds: float) -> Any:
    """``fn()``, or :class:`_Late` when it has not returned within ``seconds`` (it goes on, on
    its daemon thread, and its result is dropped)."""
    if seconds <= 0:
        raise _Late()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e

    t = threading.Thread(target=run, name="qformat-fsspec", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise _Late()
    if "error" in box:
        raise box["error"]
    return box["value"]
