"""The neutral core never imports a framework."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "tensorflow", "mlx")


def test_import_qformat_leaves_frameworks_out():
    code = (
        "import sys, qformat, qformat.check, qformat.cli, qformat.schemes\n"
        "import numpy as np\n"
        "q = qformat.quantize(np.ones((4, 64), np.float32), 'nf4')\n"
        "q.dequantize()\n"
        f"bad = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"qformat imported {out.stdout.strip()}"
