"""Whole-model run of issue 11's "done when": a Llama-shaped fp16 checkpoint in two shards,
``qformat quantize`` (int4 g32, the default selection), ``qformat check`` of the result,
``qformat dequantize`` back to fp16 and ``qformat check`` of that, each command in a child
interpreter with its own peak RSS (VmHWM) and seconds, plus a plain copy of the source in the
same run for scale.

``python -m bench --only llama [--llama-gb 1.5]``.  The model has real Llama tensor names and
shapes (hidden 2048, intermediate 5632, vocabulary 32000, untied head), as many layers as make
the requested size; the weights are seeded random (speed does not depend on the values).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN, INTER, VOCAB = 2048, 5632, 32000


def _layer(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    return [(p + f"self_attn.{k}_proj.weight", (HIDDEN, HIDDEN)) for k in "qkvo"] + [
        (p + "mlp.gate_proj.weight", (INTER, HIDDEN)), (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
        (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
        (p + "input_layernorm.weight", (HIDDEN,)), (p + "post_attention_layernorm.weight", (HIDDEN,))]


def build(folder: str, nbytes: int) -> dict[str, Any]:
    """Write the checkpoint (two shards, index, config.json, a tokenizer side file); one
    tensor's worth of random values per shape, written shard by shard."""
    from qformat.container import write_file

    per_layer = sum(int(np.prod(s)) for _, s in _layer(0)) * 2
    layers = max(2, round((nbytes - 2 * VOCAB * HIDDEN * 2) / per_layer))
    rng = np.random.default_rng(5)
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def value(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float16)
        if shape not in cache:
            cache[shape] = (rng.standard_normal(shape, np.float32) * 0.02).astype(np.float16)
        return cache[shape]

    os.makedirs(folder)
    first = [("model.embed_tokens.weight", (VOCAB, HIDDEN))] + [t for i in range(layers // 2) for t in _layer(i)]
    second = [t for i in range(layers // 2, layers) for t in _layer(i)] + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    wm: dict[str, str] = {}
    for s, names in enumerate((first, second)):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        write_file(os.path.join(folder, fname), {n: value(n, shp) for n, shp in names}, {"format": "pt"})
        wm.update({n: fname for n, _ in names})
    Path(folder, "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
           "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": VOCAB,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float16"}
    Path(folder, "config.json").write_text(json.dumps(cfg, indent=1))
    Path(folder, "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    return {"layers": layers, "tensors": len(wm)}


def bench_llama(run: Any, tmp: str, gb: float) -> None:
    """The four commands on a ``gb`` GiB checkpoint; rows in section ``llama`` and the target
    "peak RSS under 1 GB" for quantize and dequantize."""
    from .common import MB, _ckpt_children, _copy_seconds, _tree_bytes

    base = os.path.join(tmp, "llama")
    os.makedirs(base)
    src, q4, dq = (os.path.join(base, n) for n in ("fp16", "int4", "dequantized"))
    t0 = time.perf_counter()
    shape = build(src, int(gb * 2**30))
    print(f"\n[llama {gb:g} GB] {shape['layers']} layers, {shape['tensors']} tensors, {_tree_bytes(src) / MB:.0f} MB "
          f"(built in {time.perf_counter() - t0:.0f} s)", flush=True)
    copy_s = _copy_seconds(src, base, 1)
    shards = lambda d: sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".safetensors"))  # noqa: E731
    steps: list[tuple[str, Any]] = [
        ("quantize int4 g32", lambda: ["quantize", "--quiet", src, q4, "--scheme", "int", "--bits", "4", "--group-size", "32"]),
        ("check the int4 checkpoint", lambda: ["check", *shards(q4)]),
        ("dequantize -> fp16", lambda: ["dequantize", "--quiet", q4, dq, "--dtype", "float16"]),
        ("check the dequantized checkpoint", lambda: ["check", *shards(dq)]),
    ]
    for name, cmd in steps:
        os.sync()
        r = _ckpt_children([cmd()], one_each=True)[0]
        nbytes = _tree_bytes(src if name.startswith("quantize") else (q4 if "int4" in name or name.startswith("dequantize") else dq))
        row = {"section": "llama", "name": f"{name}, {gb:g} GB", "op": name, "size_GB": gb, "in_MB": nbytes / MB,
               "seconds": r["seconds"], "MBps": nbytes / MB / r["seconds"], "copy_seconds": copy_s,
               "x_copy_of_source": copy_s / r["seconds"], "peak_rss_MB": r["maxrss_kb"] / 1024,
               "out_MB": _tree_bytes(q4 if name.startswith("quantize") else dq) if not name.startswith("check") else None}
        run.rows.append(row)
        print(f"  {row['name']:<40} {nbytes / MB:7.0f} MB in {r['seconds']:7.2f} s {row['MBps']:7.1f} MB/s  "
              f"peak RSS {row['peak_rss_MB']:5.0f} MB", flush=True)
        if not name.startswith("check") and not run.quick:
            run.target(f"llama {gb:g} GB {name}: peak RSS MB", -row["peak_rss_MB"], -1024.0, unit="-MB")
