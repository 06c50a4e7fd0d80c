"""Section ``gguf_hf``: a GGUF model loaded by transformers' own GGUF loader against the same
file converted by ``qformat convert model.gguf out/`` and loaded packed with ``from_pretrained(out)``.

``python -m bench --only gguf_hf [--gguf-hf-layers 4] [--gguf-hf-type Q4_0]``.  The model is
Llama-shaped (hidden 2048, intermediate 5632, vocabulary 32000, untied head, as the ``llama``
section), with seeded random weights quantized by gguf-py (``Q4_0``/``Q8_0``; K-quants as random
blocks) and the tokenizer of tests/gguf_models.py padded to the vocabulary.  Each step runs in a
child interpreter of its own, reporting its seconds (imports excluded) and its peak resident
set (VmHWM, reset before the step):

- ``transformers gguf_file=``: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which
  dequantizes every tensor to float32 (transformers 5's legacy GGUF path for llama);
- ``qformat convert``: the command itself (GGUF -> Hugging Face folder, nothing decoded);
- ``from_pretrained(out)``: the converted folder, weights packed in QLinear.

Both loaders then run the same prompt; the row records whether the logits are bit-identical
(they must be: both decode exactly as gguf-py does) and the file sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN, INTER, VOCAB, HEADS = 2048, 5632, 32000, 16

CHILD = r"""
import json, sys, time
import numpy as np
import torch, transformers
import qformat.transformers, qformat.cli
def hwm():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
step, a, b, out = sys.argv[1:5]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
t0 = time.perf_counter()
if step == "convert":
    rc = qformat.cli.main(["convert", "--quiet", a, b])
    assert rc == 0
    model = None
elif step == "gguf":
    model = transformers.AutoModelForCausalLM.from_pretrained(a, gguf_file=b)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(a)
dt = time.perf_counter() - t0
peak = hwm()
if model is not None:
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 42, 100, 7, 300, 12]])).logits
    np.save(out, logits.numpy())
print(json.dumps({"seconds": dt, "maxrss_kb": peak}), flush=True)
"""


def _tensors(layers: int, rng: np.random.Generator) -> Any:
    """(HF name, float32 array) pairs of the Llama-shaped model, one at a time."""
    shapes = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + f"self_attn.{k}_proj.weight", (HIDDEN, HIDDEN)) for k in "qkvo"]
        shapes += [(p + "mlp.gate_proj.weight", (INTER, HIDDEN)), (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
                   (p + "mlp.down_proj.weight", (HIDDEN, INTER)), (p + "input_layernorm.weight", (HIDDEN,)),
                   (p + "post_attention_layernorm.weight", (HIDDEN,))]
    shapes += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    for name, shape in shapes:
        if len(shape) == 1:
            yield name, np.ones(shape, np.float32)
        else:
            yield name, (rng.standard_normal(shape, np.float32) * np.float32(0.02))


def build(folder: Path, layers: int, qtype: str, quick: bool) -> Path:
    """The GGUF file (and nothing else) in ``folder``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.gguf_models import tokenizer, write_gguf_from

    global HIDDEN, INTER, VOCAB, HEADS
    if quick:
        HIDDEN, INTER, VOCAB, HEADS = 256, 512, 512, 4
    folder.mkdir(parents=True, exist_ok=True)
    tok_dir = folder / "tokenizer"
    tokenizer(tok_dir)
    tj = json.loads((tok_dir / "tokenizer.json").read_text())
    cfg = {"num_hidden_layers": layers, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
           "num_key_value_heads": HEADS, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "vocab_size": VOCAB, "tie_word_embeddings": False}
    return write_gguf_from(folder / f"llama-{qtype}.gguf", "llama", cfg, tj, _tensors(layers, np.random.default_rng(3)),
                           qtype=qtype, types={"token_embd": "Q8_0", "output": "Q8_0"} if qtype != "Q8_0" else None)


def _child(step: str, a: str, b: str, out: str) -> dict[str, Any]:
    from .common import _require

    r = subprocess.run([sys.executable, "-c", CHILD, step, a, b, out], capture_output=True, text=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    _require(r.returncode == 0, r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_gguf_hf(run: Any, tmp: str, layers: int, qtype: str) -> None:
    """Rows in section ``gguf_hf`` (see the module docstring)."""
    from .common import MB, _require

    base = Path(tmp) / "gguf_hf"
    src = build(base, 2 if run.quick else layers, qtype, run.quick)
    out = base / "hf"
    gguf_mb = src.stat().st_size / MB
    print(f"\n[gguf_hf] {src.name}: {gguf_mb:.0f} MB, {2 if run.quick else layers} layers", flush=True)
    ref = _child("gguf", str(src.parent), src.name, str(base / "ref.npy"))
    conv = _child("convert", str(src), str(out), "")
    got = _child("hf", str(out), "", str(base / "got.npy"))
    a, b = np.load(base / "ref.npy"), np.load(base / "got.npy")
    exact = bool(a.shape == b.shape and (a.view(np.uint32) == b.view(np.uint32)).all())
    _require(exact, f"logits differ: max abs {float(np.abs(a - b).max())}")
    out_mb = sum(f.stat().st_size for f in out.iterdir() if f.name.endswith(".safetensors")) / MB
    for name, r in (("transformers from_pretrained(gguf_file=)", ref), ("qformat convert (GGUF -> HF folder)", conv),
                    ("from_pretrained(converted folder), packed", got)):
        row = {"section": "gguf_hf", "name": f"{name}, {qtype}", "seconds": r["seconds"], "peak_rss_MB": r["maxrss_kb"] / 1024,
               "gguf_MB": gguf_mb, "safetensors_MB": out_mb, "logits_bit_identical": exact}
        run.rows.append(row)
        print(f"  {row['name']:<52} {r['seconds']:7.2f} s  peak RSS {row['peak_rss_MB']:7.0f} MB", flush=True)
    first = next(x for x in run.rows if x["section"] == "gguf_hf" and x["name"].startswith("transformers"))
    last = run.rows[-1]
    last["x_faster_than_transformers_gguf"] = first["seconds"] / last["seconds"]
    last["x_memory_of_transformers_gguf"] = last["peak_rss_MB"] / first["peak_rss_MB"]
    print(f"  load {last['x_faster_than_transformers_gguf']:.1f}x faster, peak RSS {last['x_memory_of_transformers_gguf']:.2f}x "
          f"of transformers' GGUF loader; logits bit-identical: {exact}", flush=True)
    os.sync()
