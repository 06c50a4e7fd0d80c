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


def test_framework_readers_import_both_spellings():
    """``from qformat.torch import load_file`` (as ``safetensors.torch``) and the attribute
    ``qformat.torch`` name the same module as ``qformat_torch``; likewise for JAX.  Neither is
    imported by ``import qformat`` alone."""
    code = (
        "import sys, qformat\n"
        "assert 'torch' not in sys.modules and 'jax' not in sys.modules\n"
        "from qformat.torch import load_file, save_file, safe_open\n"
        "import qformat_torch\n"
        "assert qformat.torch is qformat_torch and load_file is qformat_torch.load_file\n"
        "assert sys.modules['qformat.torch'] is qformat_torch\n"
        "from qformat.jax import load_file as jload\n"
        "import qformat_jax\n"
        "assert qformat.jax is qformat_jax and jload is qformat_jax.load_file\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
