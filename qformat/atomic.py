"""Atomic file replacement: write a temporary file beside the target, sync it, rename it.

Temporary files and folders are created private (0600 / 0700, so nobody reads a half-written
file); before the rename they get the permissions an ordinary ``open()`` or ``mkdir()`` would
have given under the current umask (or, when replacing a file, that file's own), so a model
written by one user or job can be read by a server running as another.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


def current_umask() -> int:
    """The process umask, read without changing it where the system allows (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (the only portable way to read it)
    os.umask(mask)
    return mask


def default_mode(folder: bool = False) -> int:
    """Permission bits ``open()`` (0666) or ``mkdir()`` (0777) would give under the umask."""
    return (0o777 if folder else 0o666) & ~current_umask()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb", *, sync: bool = True, **open_kw: object) -> Iterator[IO]:
    """Open a temporary file in ``path``'s folder; on success it replaces ``path`` in one rename.

    If the body raises (or the process is interrupted), ``path`` keeps its previous content and
    the temporary file is removed.  An existing file's permission bits are kept.  ``sync``
    False leaves the fsync to the caller (files inside a temporary folder that is itself
    renamed into place only after :func:`fsync_path` of each).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".qformat-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **open_kw) as f:  # type: ignore[call-overload]
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o777 if os.path.exists(path) else default_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a written file's data to the device (through a read-only descriptor: Linux and
    the BSDs sync the file, not the descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
