"""Run Python code in a child process for which file permissions hold, even under root.

CI runs as root, and root reads a chmod-000 file anyway (the CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH capabilities).  The child drops exactly those two capabilities first
(Linux ``capset``), so a file or folder the test makes unreadable is unreadable to it, as it is
to an ordinary user; run by an ordinary user the child has nothing to drop.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: Prepended to the child's code: drop the capabilities that bypass read and search permissions.
DROP_DAC = r"""
import ctypes, os, sys
if os.geteuid() == 0:
    class _Hdr(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    _libc = ctypes.CDLL(None, use_errno=True)
    _h, _d = _Hdr(0x20080522, 0), (_Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    if _libc.capget(ctypes.byref(_h), _d) != 0:
        sys.exit(77)
    _keep = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    _d[0].effective &= _keep; _d[0].permitted &= _keep; _d[0].inheritable &= _keep
    if _libc.capset(ctypes.byref(_h), _d) != 0:
        sys.exit(77)
"""

#: The child prints the outcome of ``run()`` on one line: OK, CODED <code> <message>, or RAW <type> <message>.
_REPORT = r"""
from qformat.errors import QFormatError
try:
    run()
    print("OK")
except QFormatError as e:
    print("CODED", e.code, e.message)
except BaseException as e:
    print("RAW", type(e).__name__, e)
"""


def outcome(body: str, *args: str) -> tuple[str, str]:
    """Run ``body`` (Python defining ``run()``, reading ``sys.argv[1:]``) without the permission
    bypass; returns (OK | CODED <code> | RAW <type>, the rest of the line).  Skips the test where
    the platform has no capabilities to drop (not Linux) or refuses to drop them."""
    if not sys.platform.startswith("linux") and os.geteuid() == 0:
        pytest.skip("root reads unreadable files, and dropping its capabilities needs Linux")
    r = subprocess.run([sys.executable, "-c", DROP_DAC + body + _REPORT, *args], capture_output=True, text=True, timeout=300)
    if r.returncode == 77:
        pytest.skip("could not drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH in the child (capset refused)")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip().splitlines()[-1]
    kind, _, rest = line.partition(" ")
    if kind == "CODED":
        code, _, msg = rest.partition(" ")
        return f"CODED {code}", msg
    return kind if kind == "OK" else f"RAW {rest.split(' ', 1)[0]}", rest
