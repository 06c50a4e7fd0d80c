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
whose names start so (bf16 always).  Each row also has ``cpu_ms`` (the child's process CPU time
per generated token; with one torch thread, that thread's) and ``cpu_x_vs``, its ratio against
bf16: on a shared machine other jobs stretch wall time far more than CPU time.  Then the same
rows for the real GGUF models (:data:`GGUF_MODELS`, ``qformat convert``-ed; their bf16 baseline
is the same folder decoded, :func:`densify`), with llama.cpp's own tokens/s on the same file
where its speed build exists (bench/llama_cpp_speed.py; never built here);
``QFORMAT_BENCH_GGUF=0`` skips them.

``python -m bench.generate profile [OUT.json] [variant,...] [converted GGUF folder,...]`` (issue 45 item 6): where one
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
#: Issue 45 item 6's, on the CPU-time ratio (``cpu_x_vs``), the GGUF models' 4-bit rows included.
TARGETS_1TOKEN_45 = {4: 2.5, 8: 1.6}
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


def densify(model: Any) -> Any:
    """``model`` (a qformat folder loaded by ``from_pretrained``) with every packed layer made the
    plain bf16 module it decodes to: packed embeddings unpacked (their tied heads become plain
    Linears sharing the table), each QLinear an ``nn.Linear`` holding its decoded weight.  The
    bf16 baseline of a model that exists only quantized (a GGUF file converted)."""
    import torch
    from torch import nn

    import qformat_torch as qt
    from qformat_torch.embedding import PackedEmbedding, TiedHead

    for mod in list(model.modules()):
        if isinstance(mod, PackedEmbedding):
            mod.unpack()
    for name, mod in list(model.named_modules()):
        if isinstance(mod, (qt.QLinear, TiedHead)):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
            w = mod.dequantize_weight() if isinstance(mod, qt.QLinear) else mod.weight
            lin.weight = nn.Parameter(w.detach().to(torch.bfloat16), requires_grad=False)
            if mod.bias is not None:
                lin.bias = nn.Parameter(mod.bias.detach().to(torch.bfloat16), requires_grad=False)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, lin)
    return model


def child(argv: list[str]) -> None:
    """``python -m bench.generate child FOLDER CFG_JSON POLICY NEW_TOKENS REPS [dense]``: one
    variant (``dense``: the folder's layers decoded to plain bf16 ones first, :func:`densify`)."""
    folder, cfg, policy, new, reps = argv[0], json.loads(argv[1]), argv[2], int(argv[3]), int(argv[4])
    dense = len(argv) > 5 and argv[5] == "dense"
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
    if dense:
        model = densify(model)
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
    ts, ps, cs, cps, out = [], [], [], [], None
    cpu = time.process_time  # every thread of the process: with one torch thread, that thread's time
    with torch.inference_mode():
        model.generate(prompt, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up
        for _ in range(reps):
            t1, c1 = time.perf_counter(), cpu()
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            ts.append(time.perf_counter() - t1)
            cs.append(cpu() - c1)
        for _ in range(max(3, reps)):  # the prompt alone: one forward of 8 tokens
            t1, c1 = time.perf_counter(), cpu()
            model(prompt)
            ps.append(time.perf_counter() - t1)
            cps.append(cpu() - c1)
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
                      "gen_cpu_s": statistics.median(cs), "gen_cpu_s_all": cs, "prompt_cpu_s": statistics.median(cps),
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
    _time_rows(run, [(name, folder, policy, qsec, "") for name, (folder, policy, qsec) in folders.items()], cfg, new, reps,
               {"params_M": nparams / 1e6})
    if not run.quick:
        for name, bits in BITS.items():
            row = next((x for x in run.rows if x["section"] == "generate" and x["name"] == name), None)
            if row is not None:
                run.target(f"generate {name}: 1-token tokens/s vs bf16", row["x_vs"], TARGETS_1TOKEN[bits])
                run.target(f"generate {name}: 8-token prompt tokens/s vs bf16", row["prompt8_x_vs"], 1.0)
                run.target(f"generate {name}: 1-token CPU time vs bf16 (issue 45)", row["cpu_x_vs"], TARGETS_1TOKEN_45[bits])
    if not run.quick and os.environ.get("QFORMAT_BENCH_GGUF", "1") != "0":
        bench_generate_gguf(run, tmp, new, reps)


def _time_rows(run: Any, entries: list[tuple[str, str, str, float, str]], cfg: dict[str, Any], new: int, reps: int,
               extra: dict[str, Any], model: str = "") -> list[dict[str, Any]]:
    """One child per entry ``(name, folder, policy, quantize-on-load seconds, mode)``, the first
    the baseline: rows with tokens/s (wall) and CPU ms per token (``cpu_ms``: the child's process
    CPU time, which other jobs on a shared machine disturb far less than wall time), each with
    its ratio against the first row (``x_vs``: wall; ``cpu_x_vs``: CPU time)."""
    base_row: dict[str, Any] | None = None
    rows = []
    for name, folder, policy, qsec, mode in entries:
        r = _run_child(folder, json.dumps(cfg), policy, str(new), str(reps), *([mode] if mode else []))
        tps = r["new_tokens"] / r["gen_s"]
        pps = 8 / r["prompt_s"]
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".safetensors"))
        row = {"section": "generate", "name": f"{model}{name}", "ms": r["gen_s"] * 1e3 / r["new_tokens"], "tokens_per_s": tps,
               "cpu_ms": r["gen_cpu_s"] * 1e3 / r["new_tokens"], "prompt8_cpu_ms": r["prompt_cpu_s"] * 1e3,
               "prompt8_ms": r["prompt_s"] * 1e3, "prompt8_tokens_per_s": pps, "spread_gen": _spread(r["gen_s_all"]),
               "spread_gen_cpu": _spread(r["gen_cpu_s_all"]),
               "spread_prompt8": _spread(r["prompt_s_all"]), "policy": policy,
               "load_s": r["load_s"], "rss_after_load_MB": r["rss_after_load_MB"], "model_MB": r["rss_after_load_MB"] - r["rss_before_MB"], "held_MB": r["held_MB"],
               "peak_rss_MB": r["peak_rss_MB"], "file_MB": size / 2**20, "quantize_on_load_s": qsec,
               "kernel_paths": r["paths"], "cpu": r["cpu"], "threads": r["threads"], **extra}
        for k in ("logit_max_abs_diff", "logit_max_abs", "argmax_agree"):
            if k in r:
                row[k] = r[k]
        if base_row is None:
            base_row = row | {"tokens": r["tokens"]}
        else:
            row["vs"] = base_row["name"]
            row["x_vs"] = tps / base_row["tokens_per_s"]
            row["cpu_x_vs"] = base_row["cpu_ms"] / row["cpu_ms"]
            row["prompt8_x_vs"] = pps / base_row["prompt8_tokens_per_s"]
            row["prompt8_cpu_x_vs"] = base_row["prompt8_cpu_ms"] / row["prompt8_cpu_ms"]
            row["same_tokens_as_bf16"] = sum(a == b for a, b in zip(r["tokens"], base_row["tokens"])) - 8
        run.rows.append(row)
        rows.append(row)
        vs = f" {row['x_vs']:5.2f}x" if "x_vs" in row else "       "
        cvs = f" {row['cpu_x_vs']:5.2f}x" if "cpu_x_vs" in row else "       "
        pvs = f" {row['prompt8_x_vs']:5.2f}x" if "prompt8_x_vs" in row else "       "
        logit = f"  logits vs decode: max |d| {row['logit_max_abs_diff']:.4f} of {row['logit_max_abs']:.2f}, argmax agree {row['argmax_agree']:.3f}" if "logit_max_abs_diff" in row else ""
        print(f"  {row['name']:<36} 1 token {tps:7.2f} tok/s{vs}, CPU {row['cpu_ms']:7.2f} ms/token{cvs}  8-token prompt {pps:8.1f} tok/s{pvs}  "
              f"load {r['load_s']:6.2f} s  held {row['held_MB']:6.1f} MB  peak RSS {r['peak_rss_MB']:7.1f} MB  paths {r['paths']}{logit}", flush=True)
    return rows


#: The real models of the GGUF rows: (name, file under ~/.cache/qformat/models or $QFORMAT_<KEY>_GGUF).
GGUF_MODELS = (("SmolLM2-135M-Instruct Q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf", "SMOLLM2"),
               ("Gemma 3 270M Q4_K_M", "gemma-3-270m-q4_k_m.gguf", "GEMMA3"))


def _llama_cpp_tg(path: Path, new: int, reps: int) -> dict[str, Any]:
    """llama.cpp's own tokens/s on ``path``: ``python -m bench.llama_cpp_speed tg`` in a child
    (:func:`bench.llama_cpp_speed.tg_json`; that module imports this one, so no import here)."""
    r = subprocess.run([sys.executable, "-m", "bench.llama_cpp_speed", "tg", str(path), str(new), str(reps)], capture_output=True,
                       text=True, cwd=str(Path(__file__).resolve().parents[1]))
    if r.returncode:
        return {"llama_cpp_skipped": f"bench.llama_cpp_speed tg failed: {r.stderr[-2000:]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_generate_gguf(run: Any, tmp: str, new: int, reps: int) -> None:
    """The same rows for real models converted from their GGUF files (``qformat convert FILE
    folder/``, loaded with a plain ``from_pretrained``: the GGUF's own types, packed tied
    embedding and head), against the same folder decoded to bf16 (:func:`densify`), with
    llama.cpp's tokens/s on the same file where llama-bench is built."""
    home = Path(os.path.expanduser("~/.cache/qformat/models"))
    for label, fname, key in GGUF_MODELS:
        path = Path(os.environ.get(f"QFORMAT_{key}_GGUF") or home / fname)
        if not path.is_file():
            print(f"  {label}: {path} not found, skipped", flush=True)
            continue
        folder = os.path.join(tmp, f"gguf-{key.lower()}")
        subprocess.run([sys.executable, "-m", "qformat", "convert", str(path), folder + "/"], check=True, capture_output=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
        vocab = json.loads(Path(folder, "config.json").read_text())
        vocab = vocab.get("vocab_size") or vocab.get("text_config", {}).get("vocab_size")
        print(f"\n[generate] {label}, converted from its GGUF; bf16: the same layers decoded", flush=True)
        rows = _time_rows(run, [("bf16 (decoded)", folder, "auto", 0.0, "dense"), ("as converted", folder, "auto", 0.0, ""),
                                ("bf16 (decoded, again)", folder, "auto", 0.0, "dense")],
                          {"vocab_size": int(vocab)}, new, reps, {"gguf": path.name}, model=f"{label}: ")
        lc = _llama_cpp_tg(path, new, reps)
        rows[1].update(lc)
        run.target(f"generate {label} as converted: 1-token CPU time vs bf16 (issue 45)", rows[1]["cpu_x_vs"], TARGETS_1TOKEN_45[4])
        if "llama_cpp_tokens_per_s" in lc:
            rows[1]["x_llama_cpp"] = rows[1]["tokens_per_s"] / lc["llama_cpp_tokens_per_s"]
            print(f"  llama.cpp on {path.name}: {lc['llama_cpp_tokens_per_s']:.2f} tok/s ({lc['llama_cpp_threads']} threads)", flush=True)
        else:
            print(f"  llama.cpp: {lc['llama_cpp_skipped']}", flush=True)


# -- issue 45 item 6: where a one-token decoding step's time goes --------------------------------------
def _profile_model(m: Any, name: str, steps: int) -> dict[str, Any]:
    """Where one-token decoding steps of ``m`` go (see :func:`profile_step`): one row."""
    import numpy as np
    import torch

    import qformat_torch as qt
    from qformat_torch.embedding import TiedHead

    clk = time.thread_time
    vocab = int(m.config.get_text_config().vocab_size)
    acc: dict[str, float] = {}
    starts: dict[int, float] = {}
    kind: dict[int, str] = {}
    for mname, mod in m.named_modules():
        cls = type(mod).__name__
        if mname.endswith("lm_head") or (isinstance(mod, (torch.nn.Linear, qt.QLinear, TiedHead)) and mod.out_features == vocab):
            kind[id(mod)] = "lm_head"
        elif isinstance(mod, (torch.nn.Linear, qt.QLinear)):
            kind[id(mod)] = "linear (attention q/k/v/o)" if "attn" in mname else "linear (MLP)"
        elif isinstance(mod, torch.nn.Embedding):
            kind[id(mod)] = "embedding"
        elif cls.endswith("RMSNorm"):
            kind[id(mod)] = "norms"
        elif cls.endswith("RotaryEmbedding"):
            kind[id(mod)] = "rotary"
        elif cls.endswith("Attention"):
            kind[id(mod)] = "attention module"
        elif cls.endswith("MLP"):
            kind[id(mod)] = "MLP module"

    def pre(mod: Any, inp: Any) -> None:
        starts[id(mod)] = clk()

    def post(mod: Any, inp: Any, out: Any) -> None:
        k = kind[id(mod)]
        acc[k] = acc.get(k, 0.0) + clk() - starts[id(mod)]

    mods = [mod for mod in m.modules() if id(mod) in kind]
    prompt = torch.randint(0, min(vocab, 32000), (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = m(prompt, use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        am: list[float] = []

        def step() -> float:
            nonlocal cache, tok
            t0 = clk()
            o = m(tok, past_key_values=cache, use_cache=True)
            t = clk() - t0
            t1 = clk()
            nxt = o.logits[:, -1:].argmax(-1)  # greedy sampling
            am.append(clk() - t1)
            cache, tok = o.past_key_values, nxt
            return t

        plain = [step() for _ in range(steps)]
        hooks = [mod.register_forward_pre_hook(pre) for mod in mods] + [mod.register_forward_hook(post) for mod in mods]
        hooked: list[tuple[float, dict[str, float]]] = []
        for _ in range(steps):
            acc.clear()
            hooked.append((step(), dict(acc)))
        for h in hooks:
            h.remove()
        # the native kernel alone on each QLinear's prepared weight (one row, the step's shapes):
        # what the matrix products cost without QLinear's Python around them
        from qformat import kernels as qk

        kern, paths = [], {}
        for mod in m.modules():
            if isinstance(mod, qt.QLinear):
                p = mod._native
                paths[mod.kernel_path] = paths.get(mod.kernel_path, 0) + 1
                if p is not None and p.path.name == "lut_grouped" and getattr(qk, "_matmul", None) is not None:
                    t = p.tensors
                    arr = lambda n: t[n].numpy() if n in t else None  # noqa: E731
                    codes = t["codes"].numpy()
                    xs = np.random.default_rng(0).standard_normal((1, mod.in_features)).astype(np.float32)
                    y = np.empty((1, codes.shape[0]), np.float32)
                    args = (xs, 1, mod.in_features, codes, codes.shape[0], qk.MATMUL_KINDS[p.meta["kind"]], t["table"].numpy(),
                            p.meta["group"], arr("zero"), arr("scale"), arr("bias"), y, 0, codes.shape[0], qk.matmul_level(),
                            0, 1)
                    kern.append(args)
        kernel_ms = None
        if kern:
            ks = []
            for _ in range(max(3, steps // 2)):
                t0 = clk()
                for args in kern:
                    qk._matmul.matmul(*args)
                ks.append(clk() - t0)
            kernel_ms = statistics.median(ks) * 1e3
    hooked = hooked[2:]
    parts = {k: statistics.median(a.get(k, 0.0) for _, a in hooked) * 1e3 for k in sorted({k for _, a in hooked for k in a})}
    tot = statistics.median(t for t, _ in hooked) * 1e3
    lin = parts.get("linear (attention q/k/v/o)", 0.0) + parts.get("linear (MLP)", 0.0)
    table = {
        "matrix products (decoder layers)": lin,
        "lm_head": parts.get("lm_head", 0.0),
        "attention (softmax(QK^T)V, rotary on q/k, cache update)": parts.get("attention module", 0.0) - parts.get("linear (attention q/k/v/o)", 0.0),
        "MLP activation and product": parts.get("MLP module", 0.0) - parts.get("linear (MLP)", 0.0),
        "norms": parts.get("norms", 0.0),
        "rotary embedding (cos/sin)": parts.get("rotary", 0.0),
        "embedding": parts.get("embedding", 0.0),
        "rest (residual adds, the model's Python, cache object)": tot - sum(parts.get(k, 0.0) for k in ("attention module", "MLP module", "lm_head", "norms", "rotary", "embedding")),
        "greedy sampling (argmax)": statistics.median(am[steps + 2:] or am) * 1e3,
    }
    n_layers = sum(paths.values()) if paths else sum(1 for mod in m.modules() if isinstance(mod, torch.nn.Linear)) - 1
    row = {"section": "generate profile", "name": name, "step_ms": statistics.median(plain[2:]) * 1e3, "hooked_step_ms": tot,
           **{f"{k}_ms": x for k, x in table.items()}, "kernel_paths": paths, "linear_calls": n_layers,
           "clock": "thread CPU time, 1 torch thread"}
    if kernel_ms is not None:
        row["native kernels alone_ms"] = kernel_ms
        row["QLinear around its kernel_ms"] = lin - kernel_ms
        row["QLinear around its kernel, per call_us"] = (lin - kernel_ms) / max(1, len(kern)) * 1e3
    print(f"  {name:<28} step {row['step_ms']:7.2f} ms (hooked {tot:7.2f}): "
          + ", ".join(f"{k.split(' (')[0]} {x:.2f}" for k, x in table.items())
          + (f"; kernels alone {kernel_ms:.2f}, QLinear around them {lin - kernel_ms:.2f} ({row['QLinear around its kernel, per call_us']:.1f} us/call)" if kernel_ms is not None else ""),
          flush=True)
    return row


def profile_step(variants: list[str], steps: int = 12, folder: str | None = None, ggufs: list[str] | None = None) -> list[dict[str, Any]]:
    """One-token decoding steps of the README's model (:data:`FULL`, bf16 and each variant of
    :data:`VARIANTS` named, quantized on load with the default ``QFormatConfig``) and of converted
    GGUF folders (``ggufs``: each as converted and decoded to bf16, :func:`densify`), one torch
    thread, timed by the thread's CPU time: the whole step without hooks, then per part with
    forward hooks: the decoder layers' matrix products (QLinear / Linear), ``lm_head``, attention
    (the attention module less its projections), the MLP's activation, norms, rotary, embedding,
    the rest (residual adds, the model's Python), greedy sampling; and each QLinear's native
    kernel alone on its prepared weight, so that QLinear's own cost around it shows.  Plus the
    cost of one ``QLinear`` call around its kernel on a tiny layer.  Medians over ``steps``."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from qformat.transformers import QFormatConfig

    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if variants:
            src = folder or os.path.join(tmp, "bf16")
            if not os.path.exists(os.path.join(src, "config.json")):
                build(FULL).save_pretrained(src)
            for v in ["bf16", *variants]:
                kw = {} if v == "bf16" else {"quantization_config": QFormatConfig(scheme=VARIANTS[v][0], **VARIANTS[v][1])}
                m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, **kw).eval()
                rows.append(_profile_model(m, v, steps))
                del m
            base = rows[0]["step_ms"]
            for r in rows[1:]:
                r["x_bf16_step"] = base / r["step_ms"]
        for g in ggufs or []:
            label = os.path.basename(os.path.normpath(g))
            first = len(rows)
            for dense in (True, False):
                m = AutoModelForCausalLM.from_pretrained(g, dtype=torch.bfloat16).eval()
                if dense:
                    m = densify(m)
                rows.append(_profile_model(m, f"{label} {'bf16 (decoded)' if dense else 'as converted'}", steps))
                del m
            rows[-1]["x_bf16_step"] = rows[first]["step_ms"] / rows[-1]["step_ms"]
    rows.append(_qlinear_overhead())
    return rows


def _qlinear_overhead(reps: int = 2000) -> dict[str, Any]:
    """Microseconds per call (thread CPU time, the fastest of 5 rounds) on a 64 x 256 int4 g32
    layer, one bfloat16 row: QLinear's forward (its fast path), its per-call path (``_forward``),
    the prepared kernel's own forward and its bound ``run``, qformat.kernels.matmul, and torch's
    bf16 F.linear on the same shape for scale."""
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
        return min(ts)  # the least disturbed of the rounds: other jobs only ever add

    with torch.inference_mode():
        ql(x)
        p = ql._native
        p(x.reshape(-1, 256))  # the path's own forward: binds its arguments in meta["args"]
        a = p.meta["args"]
        xf = x.reshape(1, 256).float().numpy()
        out = np.empty((1, 64), np.float32)
        return {"section": "generate profile", "name": "per-call cost (us), 64x256 int4 g32, 1 row", "qlinear_forward_us": us(lambda: ql(x)),
                "qlinear_per_call_path_us": us(lambda: ql._forward(x, None)),
                "prepared_call_us": us(lambda: p(x.reshape(-1, 256))), "prepared_run_us": us(lambda: p.run(x.reshape(-1, 256))),
                "qk_matmul_us": us(lambda: qk.matmul(xf, *a, out, threads=1)),
                "torch_bf16_linear_us": us(lambda: torch.nn.functional.linear(x, wt)), "clock": "thread CPU time"}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "profile":  # python -m bench.generate profile [OUT.json] [variant,...]
        out_path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent / "results_generate_profile.json"
        names = [n for n in sys.argv[3].split(",") if n] if len(sys.argv) > 3 else ["int4 g32", "int8 per channel", "nf4"]
        ggufs = [g for g in sys.argv[4].split(",") if g] if len(sys.argv) > 4 else []  # converted GGUF folders
        res = profile_step(names, ggufs=ggufs)
        print(json.dumps(res[-1]))
        out_path.write_text(json.dumps(res, indent=1) + "\n")
    else:  # the whole section: through the harness's command line (no import of it here: no cycle)
        sys.exit(subprocess.call([sys.executable, "-m", "bench", "--only", "generate", *sys.argv[1:]],
                                 cwd=str(Path(__file__).resolve().parents[1])))
