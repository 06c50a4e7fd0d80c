"""Section ``generate``: greedy generation on the CPU with a Llama-shaped model, bf16 against QLinear.

A seeded ``transformers.LlamaConfig`` with random weights (hidden 1024, 20 layers, intermediate
2816, vocab 32000: 322M parameters; ``--quick``: a tiny one) in bfloat16 is the baseline.  Each
variant quantizes every ``nn.Linear`` (lm_head included) with ``qformat.quantize`` through
``qformat_torch.quantize_model``, is written with ``save_model``, and is then timed in a child
process of its own: load (``load_model`` into an empty skeleton, including the kernels' repack),
resident memory after the load and at its peak, and greedy generation (``model.generate``,
``max_new_tokens`` new tokens after a short prompt, median of the repetitions).  Rows give
tokens/s and its ratio against bf16 in the same run.  ``QFORMAT_BENCH_THREADS=n`` sets the
children's torch threads (default: torch's); on a machine whose cores are shared with other
jobs, one thread avoids OpenMP barrier stalls that otherwise dominate every timing.
``QFORMAT_BENCH_VARIANTS=int4,int8`` runs only the variants whose names start so (bf16 always).

Variants: int4 g32 and int8 per channel with bfloat16 scales and a float32 logical dtype (the
native kernels' exact mapping, taken by the default policy), int4 g32 with float16 scales under
the opt-in ``kernel="native"`` policy (its max logit difference against the exact decode path is
reported), and nf4, mxfp4, nvfp4, fp8 e4m3 (bfloat16 logical dtype, decoded in every forward).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: name -> (scheme, quantize parameters, kernel policy in the child)
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "int4 g32 (native)": ("int", {"bits": 4, "group_size": 32, "scale_dtype": "bfloat16", "dtype": "float32"}, "auto"),
    "int8 per channel (native)": ("int", {"bits": 8, "group_size": None, "scale_dtype": "bfloat16", "dtype": "float32"}, "auto"),
    "int4 g32 fp16 scales (native opt-in)": ("int", {"bits": 4, "group_size": 32, "dtype": "float32"}, "native"),
    "nf4 (decode)": ("nf4", {"dtype": "bfloat16"}, "auto"),
    "mxfp4 (decode)": ("mxfp4", {"dtype": "bfloat16"}, "auto"),
    "nvfp4 (decode)": ("nvfp4", {"dtype": "bfloat16"}, "auto"),
    "fp8 e4m3 (decode)": ("fp8_e4m3", {"granularity": "channel", "dtype": "bfloat16"}, "auto"),
}

FULL = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 20, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 32000, "max_position_embeddings": 512}
QUICK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 64}


def build(cfg: dict[str, Any], meta: bool = False) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**cfg, tie_word_embeddings=False)
    if meta:
        with torch.device("meta"):
            m = LlamaForCausalLM(config)
        m = m.to_empty(device="cpu")  # uninitialized: pages are touched only by the load
    else:
        torch.manual_seed(0)
        m = LlamaForCausalLM(config)
    return m.to(torch.bfloat16).eval()


def _rss_kb(field: str = "VmRSS") -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])


def child(argv: list[str]) -> None:
    """``python -m bench.generate child PATH CFG_JSON POLICY NEW_TOKENS REPS [COMPARE_LOGITS]``: one variant."""
    path, cfg, policy, new, reps = argv[0], json.loads(argv[1]), argv[2], int(argv[3]), int(argv[4])
    compare = len(argv) > 5 and argv[5] == "1"
    import torch

    import qformat_torch as qt
    from qformat_torch import kernels

    kernels.set_kernel_policy(policy)
    if os.environ.get("QFORMAT_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["QFORMAT_BENCH_THREADS"]))
    rss0 = _rss_kb()  # imports only: the skeleton's pages are not touched before the load
    skeleton = build(cfg, meta=True)
    t0 = time.perf_counter()
    model = qt.load_model(skeleton, path)
    load_s = time.perf_counter() - t0
    rss_load = _rss_kb()
    held = 0  # bytes the modules hold: parameters, buffers and the kernels' repacked copies
    for mod in model.modules():
        held += sum(t.numel() * t.element_size() for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)))
        if isinstance(mod, qt.QLinear):
            held += mod.kernel_nbytes
    paths: dict[str, int] = {}
    for mod in model.modules():
        if isinstance(mod, qt.QLinear):
            paths[mod.kernel_path] = paths.get(mod.kernel_path, 0) + 1
    prompt = torch.randint(0, cfg["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
    ts, out = [], None
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up
        for _ in range(reps):
            t1 = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            ts.append(time.perf_counter() - t1)
        extra: dict[str, Any] = {}
        if compare:  # the opt-in native mapping against the exact decode path, same model
            native = model(out).logits.float()
            kernels.set_kernel_policy("decode")
            exact = model(out).logits.float()
            kernels.set_kernel_policy(policy)
            extra = {"logit_max_abs_diff": float((native - exact).abs().max()), "logit_max_abs": float(exact.abs().max()),
                     "argmax_agree": float((native.argmax(-1) == exact.argmax(-1)).float().mean())}
    ts.sort()
    print(json.dumps({"load_s": load_s, "held_MB": held / 2**20, "rss_before_MB": rss0 / 1024, "rss_after_load_MB": rss_load / 1024,
                      "peak_rss_MB": _rss_kb("VmHWM") / 1024, "gen_s": ts[len(ts) // 2], "new_tokens": new,
                      "tokens": out[0].tolist() if out is not None else [], "paths": paths,
                      "threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(), **extra}))


def _run_child(*args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "bench.generate", "child", *args], capture_output=True, text=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    if r.returncode:
        raise RuntimeError(f"generate child failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_generate(run: Any, tmp: str) -> None:
    """bf16 baseline and each QLinear variant: tokens/s (ratio vs bf16), load time, the bytes the
    modules hold (parameters, buffers, kernel copies) and RSS."""
    import torch

    import qformat_torch as qt

    cfg = QUICK if run.quick else FULL
    new = 4 if run.quick else 16
    reps = 1 if run.quick else 3
    base = build(cfg)
    nparams = sum(p.numel() for p in base.parameters())
    threads = os.environ.get("QFORMAT_BENCH_THREADS") or str(torch.get_num_threads())
    print(f"\n[generate] Llama-shaped, {nparams / 1e6:.0f}M parameters ({json.dumps(cfg)}), bf16 activations, "
          f"greedy, prompt 8 tokens + {new} new, median of {reps}; torch threads {threads}", flush=True)
    files: dict[str, tuple[str, str, float]] = {}
    path = os.path.join(tmp, "gen-bf16.safetensors")
    qt.save_model(base, path)
    files["bf16"] = (path, "auto", 0.0)
    only = [v for v in os.environ.get("QFORMAT_BENCH_VARIANTS", "").split(",") if v]  # name prefixes, e.g. "int4,int8"
    for name, (scheme, params, policy) in VARIANTS.items():
        if only and not any(name.startswith(v) for v in only):
            continue
        m = build(cfg)
        t0 = time.perf_counter()
        m = qt.quantize_model(m, scheme, min_numel=0, **params)
        qsec = time.perf_counter() - t0
        path = os.path.join(tmp, f"gen-{len(files)}.safetensors")
        qt.save_model(m, path)
        del m
        files[name] = (path, policy, qsec)
    del base
    base_row: dict[str, Any] | None = None
    for name, (path, policy, qsec) in files.items():
        r = _run_child(path, json.dumps(cfg), policy, str(new), str(reps), "1" if "opt-in" in name else "0")
        tps = r["new_tokens"] / r["gen_s"]
        row = {"section": "generate", "name": name, "ms": r["gen_s"] * 1e3 / r["new_tokens"], "tokens_per_s": tps,
               "load_s": r["load_s"], "rss_after_load_MB": r["rss_after_load_MB"], "model_MB": r["rss_after_load_MB"] - r["rss_before_MB"], "held_MB": r["held_MB"],
               "peak_rss_MB": r["peak_rss_MB"], "file_MB": os.path.getsize(path) / 2**20, "quantize_s": qsec,
               "kernel_paths": r["paths"], "params_M": nparams / 1e6, "cpu": r["cpu"], "threads": r["threads"]}
        for k in ("logit_max_abs_diff", "logit_max_abs", "argmax_agree"):
            if k in r:
                row[k] = r[k]
        if base_row is None:
            base_row = row | {"tokens": r["tokens"]}
        else:
            row["vs"] = "bf16"
            row["x_vs"] = tps / base_row["tokens_per_s"]
            row["same_tokens_as_bf16"] = sum(a == b for a, b in zip(r["tokens"], base_row["tokens"])) - 8
        run.rows.append(row)
        vs = f"  {row['x_vs']:5.2f}x bf16" if "x_vs" in row else ""
        logit = f"  logits vs exact path: max |d| {row['logit_max_abs_diff']:.4f} of {row['logit_max_abs']:.2f}, argmax agree {row['argmax_agree']:.3f}" if "logit_max_abs_diff" in row else ""
        print(f"  {name:<38} {tps:7.2f} tok/s{vs}  load {r['load_s']:6.2f} s  held {row['held_MB']:6.1f} MB  model RSS {row['model_MB']:7.1f} MB  peak RSS {r['peak_rss_MB']:7.1f} MB  "
              f"paths {r['paths']}{logit}", flush=True)
        os.remove(path)
    if not run.quick:
        for name in ("int4 g32 (native)", "int8 per channel (native)"):
            row = next((x for x in run.rows if x["section"] == "generate" and x["name"] == name), None)
            if row is not None:
                run.target(f"generate {name}: tokens/s vs bf16", row["x_vs"], 1.5)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2:])
    else:
        from .harness import main

        sys.exit(main(["--only", "generate", *sys.argv[1:]]))
