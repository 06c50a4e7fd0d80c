"""Section ``gguf_quantize``: ``qformat quantize --preset`` against ``llama-quantize`` on the same
model, the same threads, side by side in one run.

``python -m bench --only gguf_quantize [--gguf-quantize-layers 2] [--gguf-quantize-presets Q4_K_M,Q6_K,...]``.
Needs llama.cpp's tools as the llama_cpp tests build them (docs/llama-cpp.md;
the section says so and is skipped without them).  The model is Llama-shaped like the ``llama``
section (hidden 2048, intermediate 5632, vocabulary 32000, untied head) with seeded random
float16 weights: a Hugging Face folder for qformat, and the F32 GGUF of the same values (gguf-py,
llama.cpp's names and q/k row order) for llama-quantize, which reads F32 as its converter
writes it for a float32 export.  Each preset runs:

- ``llama-quantize model-F32.gguf out.gguf PRESET 2`` (2 threads), wall seconds of the process;
- ``qformat quantize folder out --preset PRESET`` in a child interpreter (its own seconds,
  imports excluded; qformat's threads: one per CPU, at most 8, i.e. 2 on the 2-CPU machine the
  figures in docs/quantizing.md come from), peak resident set;
- ``PRESET+imatrix``: both with ``--imatrix`` of one written importance matrix (ggml's weighted
  quantizers, a much longer search than the reference ones).

Row ``x_llama_quantize`` is llama-quantize's seconds over qformat's (above 1: qformat is faster).
Both write their whole output file(s); every tensor whose rows both keep in place (all but the
permuted q/k) is checked equal: qformat's decoded weight against gguf-py's dequantize of
llama-quantize's blocks cast to the same dtype (the source's float16), bit for bit; the
marker tests compare the bytes themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .llama import HIDDEN, INTER, VOCAB

HEADS = 16
#: --quick: a model small enough for the test suite's smoke run.
QUICK_DIMS = (256, 512, 512, 4)
DEFAULT_PRESETS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_M", "Q4_K_M+imatrix")
#: A preset named ``P+imatrix`` runs both tools with ``--imatrix`` (a written importance matrix
#: for every 2-D weight but the embedding and head, as llama-imatrix makes them).
IMATRIX = "+imatrix"


def llama_quantize_tool() -> Path | None:
    """The cached llama-quantize build (tests/llama_cpp.py), or None when there is none (the rows that
    need it are skipped); shared by the bench sections that time llama-quantize."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import llama_cpp as L

    try:
        d = L.build_dir()
        t = d / "bin" / "llama-quantize"
        return t if t.is_file() and (d / L.BUILD_RECORD).is_file() else None
    except Exception:  # noqa: BLE001 - no source, no build: the section is skipped
        return None


def _names(layers: int, hidden: int, inter: int, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{k}_proj.weight", (hidden, hidden)) for k in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter)), (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    return out + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def build(folder: Path, layers: int, quick: bool = False) -> tuple[Path, Path]:
    """(Hugging Face folder, F32 GGUF of the same values)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from qformat.container import write_file
    from tests.gguf_models import tokenizer, write_gguf_from

    hidden, inter, vocab, heads = QUICK_DIMS if quick else (HIDDEN, INTER, VOCAB, HEADS)
    rng = np.random.default_rng(11)
    hf = folder / "hf"
    hf.mkdir(parents=True)
    names = _names(layers, hidden, inter, vocab)
    values = {n: (np.ones(s, np.float16) if n.endswith("norm.weight") else (rng.standard_normal(s, np.float32) * 0.02).astype(np.float16))
              for n, s in names}
    write_file(str(hf / "model.safetensors"), values, {"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
           "torch_dtype": "float16"}
    (hf / "config.json").write_text(json.dumps(cfg, indent=1))
    tok = folder / "tokenizer"
    tokenizer(tok)
    tj = json.loads((tok / "tokenizer.json").read_text())
    g = write_gguf_from(folder / "model-F32.gguf", "llama", cfg, tj, ((n, values[n].astype(np.float32)) for n, _ in names), qtype="F32")
    return hf, g


def _imatrix(base: Path, hf: Path) -> Path:
    """A GGUF importance matrix for the model's 2-D weights but the embedding and head (seeded)."""
    from qformat.gguf_presets import gguf_names
    from tests.imatrix_files import write_gguf

    cfg = json.loads((hf / "config.json").read_text())
    rng = np.random.default_rng(12)
    shapes = dict(_names(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]))
    entries = {g: (rng.gamma(1.0, 4.0, shapes[n][-1]).astype(np.float32), np.array([100.0]))
               for n, g in gguf_names(list(shapes), cfg).items()
               if g is not None and len(shapes[n]) == 2 and g not in ("token_embd.weight", "output.weight")}
    return write_gguf(base / "imatrix.gguf", entries)


def _check_same(ref: Path, q: Path) -> int:
    """Tensors of llama-quantize's file and qformat's output compared (decoded bits); q/k skipped."""
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize

    import qformat
    from qformat.gguf_presets import gguf_names

    cfg = json.loads((q / "config.json").read_text())
    got = qformat.load_file(str(q / "model.safetensors"))
    to_gguf = {g: n for n, g in gguf_names(list(got), cfg).items() if g is not None}
    n = 0
    for t in GGUFReader(str(ref)).tensors:
        if ".attn_q." in t.name or ".attn_k." in t.name:
            continue
        mine = got[to_gguf[t.name]]
        # gguf-py's binary32 values, cast as qformat's descriptor casts them (to the source's dtype)
        want = dequantize(np.asarray(t.data), gguf.GGMLQuantizationType[t.tensor_type.name]).astype(np.float32).astype(mine.dtype)
        mine = mine.reshape(want.shape)
        if want.tobytes() != mine.tobytes():
            raise AssertionError(f"{t.name}: qformat's {t.tensor_type.name} differs from llama-quantize's")
        n += 1
    return n


def bench_gguf_quantize(run: Any, tmp: str, layers: int, presets: list[str] | None = None) -> None:
    """Rows in section ``gguf_quantize`` (see the module docstring); ``presets`` default
    :data:`DEFAULT_PRESETS`."""
    presets = list(presets or DEFAULT_PRESETS)
    from .common import MB, _ckpt_children

    tool = llama_quantize_tool()
    if tool is None:
        print("\n[gguf_quantize] skipped: llama-quantize is not built (./test.sh -m llama_cpp builds it)", flush=True)
        return
    base = Path(tmp) / "gguf_quantize"
    t0 = time.perf_counter()
    hf, g32 = build(base, 1 if run.quick else layers, run.quick)
    print(f"\n[gguf_quantize] {1 if run.quick else layers} layers, F32 GGUF {g32.stat().st_size / MB:.0f} MB "
          f"(built in {time.perf_counter() - t0:.0f} s)", flush=True)
    im: Path | None = None
    # --quick: the first preset and the first with an importance matrix
    chosen = (presets[:1] + [p for p in presets[1:] if p.endswith(IMATRIX)][:1]) if run.quick else presets
    for name in chosen:
        preset = name.removesuffix(IMATRIX)
        extra: list[str] = []
        if name.endswith(IMATRIX):
            im = im or _imatrix(base, hf)
            extra = ["--imatrix", str(im)]
        ref = base / f"llama-{name}.gguf"
        os.sync()
        t0 = time.perf_counter()
        r = subprocess.run([str(tool), *extra, str(g32), str(ref), preset, "2"], capture_output=True, text=True)
        llama_s = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        out = base / f"qformat-{name}"
        os.sync()
        q = _ckpt_children([["quantize", "--quiet", str(hf), str(out), "--preset", preset, *extra]], one_each=True)[0]
        checked = _check_same(ref, out)
        row = {"section": "gguf_quantize", "name": name, "llama_quantize_s": llama_s, "qformat_s": q["seconds"],
               "x_llama_quantize": llama_s / q["seconds"], "qformat_peak_rss_MB": q["maxrss_kb"] / 1024,
               "tensors_checked_equal": checked, "threads": {"llama-quantize": 2, "qformat": min(os.cpu_count() or 1, 8)}}
        run.rows.append(row)
        print(f"  {name:<8} llama-quantize {llama_s:6.2f} s   qformat quantize --preset {q['seconds']:6.2f} s   "
              f"{row['x_llama_quantize']:5.2f}x   peak RSS {row['qformat_peak_rss_MB']:5.0f} MB   {checked} tensors equal", flush=True)
        if not run.quick:
            run.target(f"gguf_quantize {name}: llama-quantize seconds / qformat seconds", row["x_llama_quantize"], 1.0)
        for p in (ref,):
            p.unlink()
