"""Section ``real_models``: speed and memory on the real llama.cpp models, as ratios against
llama.cpp's own tools in the same run (issue 42 item 6).

``python -m bench --only real_models``.  Models: Gemma 3 270M Q4_K_M (tests/real_models.py) and
SmolLM2-135M-Instruct Q4_1 (``tests.real_models.smollm2_gguf`` where it exists, else the file
``$QFORMAT_SMOLLM2_GGUF``); a model that cannot be had is skipped by name.  Each step runs in a
child interpreter of its own and reports its seconds (imports excluded; ``wall_s`` includes
them) and its peak resident set (VmHWM, reset before the step; ``baseline_MB`` is the same
child's resident set after its imports):

- ``convert_single``: ``qformat convert model.gguf out.safetensors``;
- ``convert_folder``: ``qformat convert model.gguf out/`` (transformers' config and tokenizer
  included); ``x_single`` = its seconds over the single-file convert's (target <= 1.5), and
  its peak above its baseline against the largest tensor's bytes; the tokenizer is built and
  proven in a forked child beside the weights' write, so every row also gives ``cpu_s`` (the
  step's own CPU, all threads), ``children_cpu_s`` and ``children_peak_MB`` (the largest
  child's resident set, its pages shared with the parent at the fork included);
- ``load``: ``AutoModelForCausalLM.from_pretrained(out/)`` and the first forward, quiet and
  with a busy loop spinning on another core (``x_quiet``: target < 2): the layers' kernels are
  prepared at their first use, so a model is ready to run only after its first forward, and
  ``seconds`` is from_pretrained's plus the first forward's (``from_pretrained_s`` and
  ``first_forward_s`` apart, ``cpu_s`` their CPU time, all threads: on a shared machine the
  quiet figure to trust); then a second forward;
- ``save_pretrained``: the loaded model saved again: bytes against the folder's, and whether
  the embedding kept its scheme;
- ``llama_quantize`` / ``quantize_export``: the model's F32 GGUF (made once by ``llama-quantize
  --allow-requantize ... F32``, not timed) quantized to Q4_K_M by ``llama-quantize`` with 2
  threads (wall seconds of the process) and by ``qformat quantize --preset Q4_K_M`` then
  ``qformat export --to gguf`` (qformat's threads: one per CPU, at most 8); ``x_llama``: the
  sum of qformat's two steps' seconds over llama-quantize's (target <= 1);
- ``export_folder``: ``qformat export --to gguf`` of the converted folder (peak memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, sys, time
t_imp = time.perf_counter()
step, args = sys.argv[1], json.loads(sys.argv[2])
import qformat.cli
if step in ("convert_folder", "load", "save"):
    import torch, transformers, qformat.transformers, qformat_transformers.gguf_layout
    from transformers import AutoModelForCausalLM
def vm(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) // 1024
imports = time.perf_counter() - t_imp
base = vm("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
out = {}
t0 = time.perf_counter()
c0 = time.process_time()
if step in ("cli", "convert_folder"):
    rc = qformat.cli.main(args)
    assert rc == 0, rc
else:
    model = AutoModelForCausalLM.from_pretrained(args[0])
    if step == "save":
        model.save_pretrained(args[1])
    else:
        out["load_s"] = time.perf_counter() - t0
        ids = torch.tensor([[2, 105, 2364, 107, 9259, 236764, 1217, 659, 611, 236881]]) % model.config.vocab_size
        with torch.no_grad():
            t1 = time.perf_counter(); model(ids); out["first_forward_s"] = time.perf_counter() - t1
            # the layers' kernels are prepared in the first forward: the model is ready after it
            out["ready_s"], out["ready_cpu_s"] = out["load_s"] + out["first_forward_s"], time.process_time() - c0
            t1 = time.perf_counter(); model(ids); out["second_forward_s"] = time.perf_counter() - t1
dt = out.get("ready_s", time.perf_counter() - t0)
import resource
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # a folder convert's tokenizer child (gguf_layout._TokenizerJob)
out.update({"seconds": dt, "imports_s": imports, "peak_MB": vm("VmHWM"), "baseline_MB": base, "cpu_s": time.process_time() - c0,
            "children_cpu_s": kids.ru_utime + kids.ru_stime, "children_peak_MB": kids.ru_maxrss / 1024})
print(json.dumps(out), flush=True)
"""


def _child(step: str, args: list[str], busy: bool = False) -> dict[str, Any]:
    from .common import _require

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", CHILD, step, json.dumps(args)], capture_output=True, text=True,
                           cwd=str(Path(__file__).resolve().parents[1]), env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"})
        wall = time.perf_counter() - t0
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()
    _require(r.returncode == 0, r.stderr[-3000:])
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def models() -> list[tuple[str, Path]]:
    """(name, GGUF path) of the real models that can be had here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import real_models as rm

    out = []
    smol = getattr(rm, "smollm2_gguf", None)
    try:
        p = smol() if smol is not None else (Path(os.environ["QFORMAT_SMOLLM2_GGUF"]) if os.environ.get("QFORMAT_SMOLLM2_GGUF") else None)
        if p is not None and Path(p).is_file():
            out.append(("SmolLM2-135M Q4_1", Path(p)))
    except Exception as e:  # noqa: BLE001 - unavailable: skipped by name
        print(f"  SmolLM2-135M skipped: {e}", flush=True)
    try:
        out.append(("Gemma 3 270M Q4_K_M", rm.gemma3_gguf()))
    except Exception as e:  # noqa: BLE001
        print(f"  Gemma 3 270M skipped: {e}", flush=True)
    return out


def _largest_tensor(path: Path) -> int:
    from qformat.convert.gguf_file import GGUFFile

    return max(t.nbytes for t in GGUFFile(path).tensors.values())


def _tree_mb(p: Path) -> float:
    from .common import MB

    return (p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())) / MB


def bench_real_models(run: Any, tmp: str) -> None:
    """Rows in section ``real_models`` (see the module docstring)."""
    from .common import MB
    from .gguf_quantize import llama_quantize_tool

    print("\n[real_models]", flush=True)
    tool = llama_quantize_tool()
    for name, src in models():
        base = Path(tmp) / "real_models" / name.split()[0]
        base.mkdir(parents=True, exist_ok=True)
        rows: dict[str, dict[str, Any]] = {}

        def row(step: str, r: dict[str, Any], **extra: Any) -> dict[str, Any]:
            d = {"section": "real_models", "model": name, "name": f"{name}: {step}", "step": step, **r, **extra}
            run.rows.append(d)
            rows[step] = d
            shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items())
            print(f"  {name:<20} {step:<18} {r['seconds']:7.2f} s (wall {r['wall_s']:6.2f} s)  peak {r['peak_MB']:6.0f} MB "
                  f"(baseline {r['baseline_MB']:5.0f} MB)  {shown}", flush=True)
            return d

        single = row("convert_single", _child("cli", ["convert", "--quiet", str(src), str(base / "single.safetensors")]))
        folder = base / "hf"
        largest = _largest_tensor(src) / MB
        f = _child("convert_folder", ["convert", "--quiet", str(src), str(folder)])
        row("convert_folder", f, x_single=f["seconds"] / single["seconds"], above_baseline_MB=f["peak_MB"] - f["baseline_MB"],
            largest_tensor_MB=largest)
        run.target(f"real_models {name}: convert to a folder within 1.5x of the single-file convert (single s / folder s >= 1/1.5)",
                   single["seconds"] / f["seconds"], 1 / 1.5)
        quiet = _child("load", [str(folder)])
        row("load", quiet, from_pretrained_s=quiet["load_s"], first_forward_s=quiet["first_forward_s"], cpu_s=quiet["ready_cpu_s"],
            second_forward_s=quiet["second_forward_s"])
        busy = _child("load", [str(folder)], busy=True)
        row("load_busy", busy, x_quiet=busy["seconds"] / quiet["seconds"], cpu_s=busy["ready_cpu_s"])
        if "Gemma" in name:
            run.target(f"real_models {name}: from_pretrained + first forward under 3 s (3 / seconds >= 1)", 3.0 / quiet["seconds"], 1.0)
            run.target(f"real_models {name}: load with both cores busy under 2x quiet (2 / ratio >= 1)", 2.0 / max(busy["seconds"] / quiet["seconds"], 1e-9), 1.0)
        saved = base / "saved"
        s = _child("save", [str(folder), str(saved)])
        from qformat.io import SafeOpen

        fo = SafeOpen(str(saved / "model.safetensors"))
        try:
            kept = fo.model.raw.get("model.embed_tokens.weight", {}).get("scheme")
        finally:
            fo.close()
        row("save_pretrained", s, folder_MB=_tree_mb(folder / "model.safetensors"), saved_MB=_tree_mb(saved / "model.safetensors"),
            embedding_scheme=kept)
        e = _child("cli", ["export", "--quiet", "--to", "gguf", str(folder), str(base / "folder.gguf")])
        row("export_folder", e, above_baseline_MB=e["peak_MB"] - e["baseline_MB"], largest_tensor_MB=largest)
        if tool is None:
            print("  llama-quantize is not built: quantize + export vs llama-quantize skipped", flush=True)
            continue
        f32 = base / "model-F32.gguf"
        subprocess.run([str(tool), "--allow-requantize", str(src), str(f32), "F32", "2"], capture_output=True, check=True)
        os.sync()
        t0 = time.perf_counter()
        r = subprocess.run([str(tool), str(f32), str(base / "llama-Q4_K_M.gguf"), "Q4_K_M", "2"], capture_output=True, text=True)
        llama_s = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        lq = {"seconds": llama_s, "wall_s": llama_s, "peak_MB": float("nan"), "baseline_MB": float("nan")}
        row("llama_quantize", lq, threads=2)
        q = _child("cli", ["quantize", "--quiet", str(f32), str(base / "q.safetensors"), "--preset", "Q4_K_M"])
        row("quantize", q)
        x = _child("cli", ["export", "--quiet", "--to", "gguf", str(base / "q.safetensors"), str(base / "q.gguf")])
        both = q["seconds"] + x["seconds"]
        row("export", x, x_llama=both / llama_s, quantize_x_llama=q["seconds"] / llama_s)
        run.target(f"real_models {name}: quantize + export within llama-quantize's time (llama s / qformat s >= 1)", llama_s / both, 1.0)
        for p in (f32, base / "llama-Q4_K_M.gguf", base / "q.gguf", base / "q.safetensors", base / "folder.gguf"):
            p.unlink(missing_ok=True)
