"""A module fixture's expensive step run once per test run, shared by pytest-xdist's workers.

xdist hands a module's tests out in chunks, so a module's tests can be split between the two
workers, and a module-scoped fixture then runs in each: for the process groups of
test_jax_multiprocess*.py and test_torch_tp.py (several processes, each importing jax or torch)
that was up to minutes of the run spent twice.  Here the first worker to need a step runs it
under a file lock in the run's temporary folder (the one above each worker's own) and leaves
its folder and JSON result there; the other worker waits for the lock and takes them.  Without
xdist (or without ``fcntl``'s locks) it is the session's (or the worker's) temporary folder, and
the step runs there as before.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: every worker runs the step in its own folder
    fcntl = None  # type: ignore[assignment]


def run_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``build(folder)`` in a fresh ``folder``, once per test run; returns the folder and
    ``build``'s result after a JSON round trip (the same types in every worker).  A ``build``
    that raises (a failure, a skip) leaves no result: the next caller runs it again, and fails or
    skips the same way."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER") and fcntl is not None:
        root = root.parent  # the run's folder, above each worker's own
    folder = root / name
    done = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not done.is_file():
            if folder.exists():
                shutil.rmtree(folder)  # what a failed try left
            folder.mkdir()
            result = build(folder)
            tmp = root / f"{name}.json.tmp"
            tmp.write_text(json.dumps({"result": result}))
            tmp.replace(done)
        return folder, json.loads(done.read_text())["result"]
