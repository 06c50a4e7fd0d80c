"""Atomic file replacement: write a temporary file beside the target, sync it, rename it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb", **open_kw: object) -> Iterator[IO]:
    """Open a temporary file in ``path``'s folder; on success it replaces ``path`` in one rename.

    If the body raises (or the process is interrupted), ``path`` keeps its previous content and
    the temporary file is removed.  An existing file's permission bits are kept.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".qformat-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **open_kw) as f:  # type: ignore[call-overload]
            yield f
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
