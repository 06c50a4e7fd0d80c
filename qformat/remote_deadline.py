"""The total deadline of one remote read (qformat.remote, qformat.remote_fsspec; issue 40).

A read ends once its time exceeds ``deadline_s + received / min_bytes_per_s``
(:class:`~qformat.remote.HttpOptions`), ``received`` being the most bytes one try of it has
received so far: a read of ``n`` bytes takes at most ``deadline_s + n / min_bytes_per_s``.
"""

from __future__ import annotations

import time
from typing import Any

from .errors import error

__all__ = ["Budget", "deadline_seconds"]


def deadline_seconds(text: str, where: str = "QFORMAT_HTTP_DEADLINE") -> float:
    """``text`` as a deadline: a positive, finite number of seconds (REMOTE_UNREACHABLE, naming
    ``where``, otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise error("REMOTE_UNREACHABLE", f"{where}={text[:40]!r}: expected the deadline of one remote read as a positive number "
                                          "of seconds")
    return value


class Budget:
    """The time one remote read may take (``opts``: its :class:`~qformat.remote.HttpOptions`): ``deadline_s`` plus
    ``received / min_bytes_per_s``, from its start, over all its tries."""

    def __init__(self, opts: Any, nbytes: int | None = None):
        self.start = time.monotonic()
        self.fixed, self.rate = opts.deadline_s, max(opts.min_bytes_per_s, 1.0)
        #: None: the allowance grows with the bytes received; an int: fixed for that many bytes
        #: (a reader that cannot watch bytes arrive, fsspec's)
        self.best = 0 if nbytes is None else nbytes
        self.expired = False  # set by the watchdog when it ended a request of this read

    def received(self, nbytes: int) -> None:
        """One try has received ``nbytes`` so far."""
        if nbytes > self.best:
            self.best = nbytes

    def end(self) -> float:
        return self.start + self.fixed + self.best / self.rate

    def left(self) -> float:
        return self.end() - time.monotonic()

    def passed(self) -> bool:
        return self.expired or self.left() <= 0

    def describe(self) -> str:
        return (f"the deadline of {self.fixed:g} s + {self.best:,} bytes at {self.rate:,.0f} bytes/s passed "
                f"(set QFORMAT_HTTP_DEADLINE or --deadline)")
