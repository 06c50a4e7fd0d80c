"""Section ``generate``: greedy generation on the CPU with a Llama-shaped model, bf16 against qformat.

A seeded ``transformers.LlamaConfig`` with random weights (hidden 1024, 20 layers, intermediate
2816, vocab 32000: 322M parameters; ``--quick``: a tiny one) in bfloat16, written with
``save_pretrained``, is the baseline.  Each variant is what a user types: the bf16 folder
loaded with ``from_pretrained(src, quantization_config=QFormatConfig(scheme, **params))``
(quantize on load, qformat's defaults otherwise: the default selection rule, so embeddings and
``lm_head`` stay bf16) and written with ``save_pretrained``; the written folder is then timed in
a child process of its own with a plain ``from_pretrained(folder)``: load seconds, resident
memory, greedy generation (``model.generate``, ``max_new_tokens`` new tokens after an 8-token
prompt, one token per forward: the "1 token" figure) and one forward of the 8-token prompt
alone (the "8-token prompt" figure), medians of the repetitions.  Rows give tokens/s and their
ratio against bf16 in the same run; bf16 is timed first and again last (``bf16 (again)``), and
the spread of those two says how noisy the machine was.  A variant whose layers run a native
kernel also reports its logits against the exact decode path (``kernel="decode"``) on the same
model.  ``QFORMAT_BENCH_THREADS=n`` sets the children's torch threads (default: torch's); on a
machine whose cores are shared with other jobs, one thread avoids OpenMP barrier stalls that
otherwise dominate every timing.  ``QFORMAT_BENCH_VARIANTS=int4,int8`` runs only the variants
whose names start so (bf16 always).

``python -m bench.generate profile [OUT.json] [variant,...]`` (issue 45 item 6): where one
decoding step's time goes, per module kind, and what a QLinear call costs around its kernel
(:func:`profile_step`; one thread, thread CPU time; written to bench/results_generate_profile.json).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: name -> (QFormatConfig scheme, its parameters, kernel policy in the child).  Only the first
#: two parameters a user would give; the rest are qformat's defaults (bfloat16 scales for a
#: bfloat16 model, the default kernel policy "auto").
VARIANTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "int4 g32": ("int", {"bits": 4, "group_size": 32}, "auto"),
    "int8 per channel": ("int", {"bits": 8, "group_size": None}, "auto"),
    "int4 g32, fp16 scales (older files)": ("int", {"bits": 4, "group_size": 32, "scale_dtype": "float16"}, "auto"),
    "int4 g32, kernel=\"decode\"": ("int", {"bits": 4, "group_size": 32}, "decode"),
    "int4 g128": ("int", {"bits": 4, "group_size": 128}, "auto"),
    "nf4": ("nf4", {}, "auto"),
    "mxfp4": ("mxfp4", {}, "auto"),
    "nvfp4": ("nvfp4", {}, "auto"),
    "fp8 e4m3": ("fp8_e4m3", {}, "auto"),
    "int4 g32 asym": ("int", {"bits": 4, "group_size": 32, "symmetric": False}, "auto"),
    "mxfp8 e4m3": ("mxfp8_e4m3", {}, "auto"),
}
#: Issue 23's targets at one token (tokens/s vs bf16) by the weight's bits; every variant also
#: has "no slower than bf16" for the 8-token prompt.
TARGETS_1TOKEN = {4: 2.0, 8: 1.4}
BITS = {"int4 g32": 4, "int8 per channel": 8, "int4 g32, fp16 scales (older files)": 4, "int4 g128": 4, "nf4": 4, "mxfp4": 4,
        "nvfp4": 4, "fp8 e4m3": 8, "int4 g32 asym": 4, "mxfp8 e4m3": 8}

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
    """``python -m bench.generate child FOLDER CFG_JSON POLICY NEW_TOKENS REPS``: one variant."""
    folder, cfg, policy, new, reps = argv[0], json.loads(argv[1]), argv[2], int(argv[3]), int(argv[4])
    import torch
    from transformers import AutoModelForCausalLM

    import qformat.transformers  # noqa: F401  (registers quant_method "qformat")
    import qformat_torch as qt
    from qformat_torch import kernels

    kernels.set_kernel_policy(policy)
    if os.environ.get("QFORMAT_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["QFORMAT_BENCH_THREADS"]))
    rss0 = _rss_kb()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - t0
    rss_load = _rss_kb()
    held = 0  # bytes the modules hold: parameters, buffers and the kernels' repacked copies
    paths: dict[str, int] = {}
    for mod in model.modules():
        held += sum(t.numel() * t.element_size() for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)))
        if isinstance(mod, qt.QLinear):
            held += mod.kernel_nbytes
            paths[mod.kernel_path] = paths.get(mod.kernel_path, 0) + 1
    prompt = torch.randint(0, cfg["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
    ts, ps, out = [], [], None
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up
        for _ in range(reps):
            t1 = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            ts.append(time.perf_counter() - t1)
        for _ in range(max(3, reps)):  # the prompt alone: one forward of 8 tokens
            t1 = time.perf_counter()
            model(prompt)
            ps.append(time.perf_counter() - t1)
        extra: dict[str, Any] = {}
        if paths and set(paths) != {"decode"} and out is not None:  # a native kernel against the exact decode path
            native = model(out).logits.float()
            kernels.set_kernel_policy("decode")
            exact = model(out).logits.float()
            kernels.set_kernel_policy(policy)
            extra = {"logit_max_abs_diff": float((native - exact).abs().max()), "logit_max_abs": float(exact.abs().max()),
                     "argmax_agree": float((native.argmax(-1) == exact.argmax(-1)).float().mean())}
    print(json.dumps({"load_s": load_s, "held_MB": held / 2**20, "rss_before_MB": rss0 / 1024, "rss_after_load_MB": rss_load / 1024,
                      "peak_rss_MB": _rss_kb("VmHWM") / 1024, "gen_s": statistics.median(ts), "gen_s_all": ts,
                      "prompt_s": statistics.median(ps), "prompt_s_all": ps, "new_tokens": new,
                      "tokens": out[0].tolist() if out is not None else [], "paths": paths,
                      "threads": torch.get_num_threads(), "cpu": torch.backends.cpu.get_cpu_capability(), **extra}))


def _run_child(*args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "bench.generate", "child", *args], capture_output=True, text=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    if r.returncode:
        raise RuntimeError(f"generate child failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _spread(xs: list[float]) -> float:
    """(max - min) / median of a list of timings."""
    return (max(xs) - min(xs)) / statistics.median(xs) if xs else 0.0


def bench_generate(run: Any, tmp: str) -> None:
    """bf16 baseline and each variant through from_pretrained: tokens/s at one token per forward
    and for an 8-token prompt (ratios vs bf16), load time, the bytes the modules hold
    (parameters, buffers, kernel copies) and RSS."""
    import torch
    from transformers import AutoModelForCausalLM

    from qformat.transformers import QFormatConfig

    cfg = QUICK if run.quick else FULL
    new = 4 if run.quick else 16
    reps = 1 if run.quick else 3
    base = build(cfg)
    nparams = sum(p.numel() for p in base.parameters())
    threads = os.environ.get("QFORMAT_BENCH_THREADS") or str(torch.get_num_threads())
    print(f"\n[generate] Llama-shaped, {nparams / 1e6:.0f}M parameters ({json.dumps(cfg)}), bf16 activations, "
          f"greedy, prompt 8 tokens + {new} new, median of {reps}; torch threads {threads}", flush=True)
    src = os.path.join(tmp, "gen-bf16")
    base.save_pretrained(src)
    del base
    folders: dict[str, tuple[str, str, float]] = {"bf16": (src, "auto", 0.0)}
    only = [v for v in os.environ.get("QFORMAT_BENCH_VARIANTS", "").split(",") if v]  # name prefixes, e.g. "int4,int8"
    for name, (scheme, params, policy) in VARIANTS.items():
        if only and not any(name.startswith(v) for v in only):
            continue
        t0 = time.perf_counter()
        m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, quantization_config=QFormatConfig(scheme=scheme, **params))
        qsec = time.perf_counter() - t0
        folder = os.path.join(tmp, f"gen-{len(folders)}")
        m.save_pretrained(folder)
        del m
        folders[name] = (folder, policy, qsec)
    folders["bf16 (again)"] = (src, "auto", 0.0)
    base_row: dict[str, Any] | None = None
    for name, (folder, policy, qsec) in folders.items():
        r = _run_child(folder, json.dumps(cfg), policy, str(new), str(reps))
        tps = r["new_tokens"] / r["gen_s"]
        pps = 8 / r["prompt_s"]
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        row = {"section": "generate", "name": name, "ms": r["gen_s"] * 1e3 / r["new_tokens"], "tokens_per_s": tps,
               "prompt8_ms": r["prompt_s"] * 1e3, "prompt8_tokens_per_s": pps, "spread_gen": _spread(r["gen_s_all"]),
               "spread_prompt8": _spread(r["prompt_s_all"]), "policy": policy,
               "load_s": r["load_s"], "rss_after_load_MB": r["rss_after_load_MB"], "model_MB": r["rss_after_load_MB"] - r["rss_before_MB"], "held_MB": r["held_MB"],
               "peak_rss_MB": r["peak_rss_MB"], "file_MB": size / 2**20, "quantize_on_load_s": qsec,
               "kernel_paths": r["paths"], "params_M": nparams / 1e6, "cpu": r["cpu"], "threads": r["threads"]}
        for k in ("logit_max_abs_diff", "logit_max_abs", "argmax_agree"):
            if k in r:
                row[k] = r[k]
        if base_row is None:
            base_row = row | {"tokens": r["tokens"]}
        else:
            row["vs"] = "bf16"
            row["x_vs"] = tps / base_row["tokens_per_s"]
            row["prompt8_x_vs"] = pps / base_row["prompt8_tokens_per_s"]
            row["same_tokens_as_bf16"] = sum(a == b for a, b in zip(r["tokens"], base_row["tokens"])) - 8
        run.rows.append(row)
        vs = f" {row['x_vs']:5.2f}x" if "x_vs" in row else "       "
        pvs = f" {row['prompt8_x_vs']:5.2f}x" if "prompt8_x_vs" in row else "       "
        logit = f"  logits vs decode: max |d| {row['logit_max_abs_diff']:.4f} of {row['logit_max_abs']:.2f}, argmax agree {row['argmax_agree']:.3f}" if "logit_max_abs_diff" in row else ""
        print(f"  {name:<36} 1 token {tps:7.2f} tok/s{vs}  8-token prompt {pps:8.1f} tok/s{pvs}  load {r['load_s']:6.2f} s  "
              f"held {row['held_MB']:6.1f} MB  peak RSS {r['peak_rss_MB']:7.1f} MB  paths {r['paths']}{logit}", flush=True)
    if not run.quick:
        for name, bits in BITS.items():
            row = next((x for x in run.rows if x["section"] == "generate" and x["name"] == name), None)
            if row is not None:
                run.target(f"generate {name}: 1-token tokens/s vs bf16", row["x_vs"], TARGETS_1TOKEN[bits])
                run.target(f"generate {name}: 8-token prompt tokens/s vs bf16", row["prompt8_x_vs"], 1.0)


# -- issue 45 item 6: where a one-token decoding step's time goes --------------------------------------
def profile_step(variants: list[str], steps: int = 12, folder: str | None = None) -> list[dict[str, Any]]:
    """One-token decoding steps of the README's model (:data:`FULL`, bf16 and each variant of
    :data:`VARIANTS` named, quantized on load with the default ``QFormatConfig``), one torch
    thread, timed by the thread's CPU time: the whole step without hooks, then per module kind
    with forward hooks (``QLinear`` / ``Linear``: the matrix products, ``lm_head`` apart; norms,
    rotary, embedding; "rest": attention, activations, residual adds, the model's Python).  Plus
    the cost of one ``QLinear`` call around its kernel on a tiny layer (the Python qformat adds
    per matrix product).  Medians over ``steps`` (the first two of the hooked ones dropped)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    import qformat_torch as qt
    from qformat.transformers import QFormatConfig

    torch.set_num_threads(1)
    clk = time.thread_time
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        src = folder or os.path.join(tmp, "bf16")
        if not os.path.exists(os.path.join(src, "config.json")):
            build(FULL).save_pretrained(src)
        for v in ["bf16", *variants]:
            kw = {} if v == "bf16" else {"quantization_config": QFormatConfig(scheme=VARIANTS[v][0], **VARIANTS[v][1])}
            m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, **kw).eval()
            acc: dict[str, float] = {}
            starts: dict[int, float] = {}

            def pre(mod: Any, inp: Any) -> None:
                starts[id(mod)] = clk()

            def post(mod: Any, inp: Any, out: Any) -> None:
                k = "lm_head" if getattr(mod, "out_features", 0) == FULL["vocab_size"] else type(mod).__name__
                acc[k] = acc.get(k, 0.0) + clk() - starts[id(mod)]

            leaf = [mod for mod in m.modules() if isinstance(mod, (qt.QLinear, torch.nn.Linear, torch.nn.Embedding))
                    or type(mod).__name__.endswith(("RMSNorm", "RotaryEmbedding"))]
            prompt = torch.randint(0, FULL["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1))
            with torch.inference_mode():
                out = m(prompt, use_cache=True)
                cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)

                def step() -> float:
                    nonlocal cache, tok
                    t0 = clk()
                    o = m(tok, past_key_values=cache, use_cache=True)
                    t = clk() - t0
                    cache, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
                    return t

                plain = [step() for _ in range(steps)]
                hooks = [mod.register_forward_pre_hook(pre) for mod in leaf] + [mod.register_forward_hook(post) for mod in leaf]
                hooked: list[tuple[float, dict[str, float]]] = []
                for _ in range(steps):
                    acc.clear()
                    hooked.append((step(), dict(acc)))
                for h in hooks:
                    h.remove()
            hooked = hooked[2:]
            parts = {k: statistics.median(a.get(k, 0.0) for _, a in hooked) * 1e3 for k in sorted({k for _, a in hooked for k in a})}
            tot = statistics.median(t for t, _ in hooked) * 1e3
            row = {"section": "generate profile", "name": v, "step_ms": statistics.median(plain[2:]) * 1e3, "hooked_step_ms": tot,
                   **{f"{k}_ms": x for k, x in parts.items()}, "rest_ms": tot - sum(parts.values()),
                   "clock": "thread CPU time, 1 torch thread"}
            rows.append(row)
            print(f"  {v:<20} step {row['step_ms']:7.2f} ms; hooked {tot:7.2f} ms: "
                  + ", ".join(f"{k} {x:.2f}" for k, x in parts.items()) + f", rest {row['rest_ms']:.2f}", flush=True)
            del m
    rows.append(_qlinear_overhead())
    base = rows[0]["step_ms"]
    for r in rows[1:-1]:
        r["x_bf16_step"] = base / r["step_ms"]
    return rows


def _qlinear_overhead(reps: int = 2000) -> dict[str, Any]:
    """Microseconds per call (thread CPU time) on a 64 x 256 int4 g32 layer, one bfloat16 row:
    QLinear's forward, its prepared kernel call, qformat.kernels.matmul, the C entry point alone,
    and torch's bf16 F.linear on the same shape for scale."""
    import ml_dtypes
    import numpy as np
    import torch

    import qformat
    from qformat import kernels as qk
    from qformat_torch.nn import QLinear

    w = (np.random.default_rng(0).standard_normal((64, 256)) * 0.02).astype(ml_dtypes.bfloat16)
    ql = QLinear(qformat.quantize(w, "int", bits=4, group_size=32))
    x = torch.randn(1, 1, 256).to(torch.bfloat16)
    wt = torch.from_numpy(w.view(np.uint16)).view(torch.bfloat16)

    def us(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(reps):
                fn()
            ts.append((time.thread_time() - t0) / reps * 1e6)
        return statistics.median(ts)

    with torch.inference_mode():
        ql(x)
        p = ql._native
        a = p.meta["args"]
        xf = x.reshape(1, 256).float().numpy()
        out = np.empty((1, 64), np.float32)
        return {"section": "generate profile", "name": "per-call cost (us), 64x256 int4 g32, 1 row", "qlinear_forward_us": us(lambda: ql(x)),
                "prepared_call_us": us(lambda: p(x.reshape(-1, 256))), "qk_matmul_us": us(lambda: qk.matmul(xf, *a, out, threads=1)),
                "torch_bf16_linear_us": us(lambda: torch.nn.functional.linear(x, wt)), "clock": "thread CPU time"}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "profile":  # python -m bench.generate profile [OUT.json] [variant,...]
        out_path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent / "results_generate_profile.json"
        names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["int4 g32", "int8 per channel", "nf4"]
        res = profile_step(names)
        print(json.dumps(res[-1]))
        out_path.write_text(json.dumps(res, indent=1) + "\n")
    else:  # the whole section: through the harness's command line (no import of it here: no cycle)
        sys.exit(subprocess.call([sys.executable, "-m", "bench", "--only", "generate", *sys.argv[1:]],
                                 cwd=str(Path(__file__).resolve().parents[1])))
