"""One rank of tests/readers/test_torch_tp.py, started by ``torchrun --standalone --nproc_per_node=N``.

``python torch_tp_worker.py CASES.json OUT_DIR``: for every case of CASES.json (a checkpoint, the
config of its Llama and a plan) this rank loads its tensor-parallel part with
``qformat_torch.load_tensor_parallel`` over a gloo group and records, in ``OUT_DIR/rank<r>.json``:

- ``refused``: the error's code and message when the load was refused, and how many packed
  bytes were touched before (``RecordingSource.take`` and the loader's ``numpy_to_torch`` are
  wrapped to count every read, so a refusal after a read is seen);
- ``copied_bytes``: the bytes the loader copied out of the file (the wrapped ``numpy_to_torch``),
  a count of its own beside the byte ranges the loader reports;
- ``packed_mismatch``: every component of every split weight whose bytes differ from the
  block-aligned slice of the full packed tensor, computed here by plain NumPy slicing (a
  component of ``n`` items along the split axis of a tensor of ``N`` logical elements gives
  items ``[lo * n / N, hi * n / N)``; a component of one item along it is taken whole);
- ``reads``: the byte ranges the load reported, per component (the test bounds them from the
  header, independently);
- ``logits``: the TP model, the single-process model (``qformat_torch.load_model``, same kernel
  policy) and a float64 copy of the same decoded weights, on a fixed input; the greedy tokens
  of the TP and the single model;
- ``layers``: for every split layer, its output on a random input against the float64 product
  with the decoded weight, as a ratio to the rigorous bound (must be <= 1).

The test asserts on the files; this script only measures (it never decides pass or fail).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback

import numpy as np
import torch

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch.distributed as dist  # noqa: E402

import qformat  # noqa: E402
import qformat.slicing as qslicing  # noqa: E402
import qformat_torch  # noqa: E402
import qformat_torch.distributed as qtd  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_torch.dtypes import torch_to_numpy  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

IDS = torch.tensor([[3, 17, 42, 99, 5, 250, 7, 64, 128, 1, 77, 200]])
U = 2.0 ** -24  # binary32 unit roundoff

TOUCHED = {"takes": 0, "copies": 0, "bytes": 0}
_take, _to_torch = qslicing.RecordingSource.take, qtd.numpy_to_torch


def _counting_take(self, name, base, view):  # type: ignore[no-untyped-def]
    TOUCHED["takes"] += 1
    return _take(self, name, base, view)


def _counting_to_torch(*a, **k):  # type: ignore[no-untyped-def]
    TOUCHED["copies"] += 1
    TOUCHED["bytes"] += np.asarray(a[0]).nbytes  # a second count of what the loader copied out of the file
    return _to_torch(*a, **k)


qslicing.RecordingSource.take = _counting_take  # type: ignore[method-assign]
qtd.numpy_to_torch = _counting_to_torch  # type: ignore[assignment]


def model_for(config_path: str, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(1234)  # the weights are overwritten by the load; a seed keeps runs repeatable
    return LlamaForCausalLM(LlamaConfig.from_json_file(config_path)).to(dtype).eval()


def expected_slice(comp: np.ndarray, n_logical: int, dim: int, lo: int, hi: int) -> np.ndarray:
    """The part of a component a [lo, hi) split of logical axis ``dim`` keeps, by proportion."""
    if dim == 0:
        if comp.ndim >= 1 and comp.shape[0] % n_logical == 0:
            per = comp.shape[0] // n_logical
            return comp[lo * per: hi * per]
        flat = comp.reshape(-1)  # a flat-blocked component: rows are equal runs of it
        per = flat.shape[0] // n_logical
        return flat[lo * per: hi * per]
    if comp.ndim < 2 or comp.shape[1] == 1:
        return comp  # constant along the columns (a per-row scale): every rank needs all of it
    n = comp.shape[1]
    assert (lo * n) % n_logical == 0 and (hi * n) % n_logical == 0, (comp.shape, n_logical, lo, hi)
    return comp[:, lo * n // n_logical: hi * n // n_logical]


def run_case(case: dict, rank: int, world: int) -> dict:
    out: dict = {"name": case["name"]}
    path, cfg = case["path"], case["config"]
    plan = qtd.llama_tp_plan() if case["plan"] == "llama" else {"layers.*.*.*_proj": "colwise_rep"}
    model = model_for(cfg)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    TOUCHED["takes"] = TOUCHED["copies"] = TOUCHED["bytes"] = 0
    log: list = []
    try:
        tp = qtd.load_tensor_parallel(model, path, plan, read_log=log)
    except QFormatError as e:
        out["refused"] = {"code": e.code, "message": str(e), "takes": TOUCHED["takes"], "copies": TOUCHED["copies"],
                          "model_untouched": all(torch.equal(before[k], v) for k, v in model.state_dict().items())
                          and set(before) == set(model.state_dict())}
        return out
    stats = log[0]
    out["copied_bytes"] = TOUCHED["bytes"]
    out["bytes_read"], out["packed_bytes"], out["plain_bytes"] = stats.bytes_read, stats.packed_bytes, stats.plain_bytes
    out["seconds"] = stats.seconds
    out["split"] = {k: [st, d, list(b)] for k, (st, d, b) in stats.split.items()}
    out["reads"] = [[r.tensor, r.offset, r.length] for _, r in stats.reads]
    out["kernel_paths"] = sorted({m.kernel_path for m in tp.modules() if isinstance(m, qformat_torch.QLinear)})
    out["replicated_qlinears"] = sorted(n for n, m in tp.named_modules() if type(m) is qformat_torch.QLinear)

    # (a) packed components against NumPy slices of the full packed tensor
    mismatch, checked = [], 0
    with qformat.safe_open(path) as f:
        for key, (style, dim, (lo, hi)) in stats.split.items():
            mod = tp.get_submodule(key.rsplit(".", 1)[0])
            if not f.is_quantized(key):  # a plain weight: the rows or columns as stored
                whole = f.get_tensor(key)
                want = np.ascontiguousarray(whole[lo:hi] if dim == 0 else whole[:, lo:hi])
                checked += 1
                if torch_to_numpy(mod.weight.detach()).tobytes() != want.tobytes():
                    mismatch.append([key, "plain", list(mod.weight.shape), list(want.shape)])
                continue
            full = f.get_qtensor(key)
            mine = {k: torch_to_numpy(v) for k, v in mod.component_tensors().items()}
            n_logical = full.descriptor["shape"][dim]
            prefix = key + "."
            for comp, arr in full.components.items():
                want = np.ascontiguousarray(expected_slice(np.asarray(arr), n_logical, dim, lo, hi))
                got = mine.get(comp[len(prefix):] if comp.startswith(prefix) else comp)
                checked += 1
                if got is None or got.tobytes() != want.tobytes():
                    mismatch.append([key, comp, None if got is None else list(got.shape), list(want.shape)])
            if list(mod.descriptor["shape"]) != [hi - lo if a == dim else s for a, s in enumerate(full.descriptor["shape"])]:
                mismatch.append([key, "shape", mod.descriptor["shape"], full.descriptor["shape"]])
    out["packed_mismatch"], out["components_checked"] = mismatch, checked

    # per layer: the split layer's output against the float64 product, as a ratio to the bound
    decoded = qformat_torch.load_file(path)  # the reference's decoded weights (torch reader, exact)
    g = torch.Generator().manual_seed(7)
    layers = {}
    for key, (style, dim, (lo, hi)) in stats.split.items():
        modname = key.rsplit(".", 1)[0]
        mod = tp.get_submodule(modname)
        w = decoded[key].double()
        bias = decoded.get(modname + ".bias")
        x = torch.randn(3, w.shape[1], generator=g)
        with torch.no_grad():
            if style == "rowwise":
                y = mod(x[:, lo:hi]).double()
            else:
                y = mod(x).double()
                w = w[lo:hi] if style == "colwise" else w
                bias = None if bias is None else (bias[lo:hi] if style == "colwise" else bias)
        exact = x.double() @ w.T + (0 if bias is None else bias.double())
        k = w.shape[1] + world  # products, the rank's sum, then world - 1 more additions
        gamma = k * U / (1 - k * U)
        bound = gamma * (x.double().abs() @ w.abs().T) + (0 if bias is None else U * exact.abs()) + 1e-300
        layers[key] = float(((y - exact).abs() / bound).max())
    out["layers"] = layers

    # (c) logits: TP, single process, float64 reference of the same decoded weights
    single = qformat_torch.load_model(model_for(cfg), case.get("reference", path))
    ref = model_for(cfg, torch.float64)
    ref.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in decoded.items()}, strict=True)
    with torch.no_grad():
        lt = tp(IDS).logits.double()
        ls = single(IDS).logits.double()
        lr = ref(IDS).logits
    out["logits"] = {
        "tp_vs_single": float((lt - ls).abs().max()), "tp_vs_f64": float((lt - lr).abs().max()),
        "single_vs_f64": float((ls - lr).abs().max()), "max_abs_f64": float(lr.abs().max()),
        "tp_sha": hashlib.sha256(lt.float().numpy().tobytes()).hexdigest(),
    }
    with torch.no_grad():
        gen_kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)  # same step count everywhere
        out["tokens_tp"] = tp.generate(IDS, **gen_kw)[0].tolist()
        g = single.generate(IDS, **gen_kw, output_scores=True, return_dict_in_generate=True)
        out["tokens_single"] = g.sequences[0].tolist()
        top2 = [torch.topk(sc[0].double(), 2).values for sc in g.scores]
        out["min_top2_margin"] = float(min(t[0] - t[1] for t in top2))
    return out


def main() -> int:
    cases_path, out_dir = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = json.loads(open(cases_path).read())
    results = {"rank": rank, "world": world, "cases": []}
    try:
        for case in cases:
            if world in case.get("skip_worlds", []):
                continue
            results["cases"].append(run_case(case, rank, world))
            dist.barrier()
    except Exception:
        results["crash"] = traceback.format_exc()
        print(results["crash"], file=sys.stderr, flush=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.destroy_process_group()
    return 1 if "crash" in results else 0


if __name__ == "__main__":
    sys.exit(main())
