"""Tensor-parallel loading with torch.distributed (issue 27): qformat_torch.load_tensor_parallel.

Small seeded Llamas are quantized (qformat_torch.quantize_model + save_model: int4 g32, nf4,
int8 per channel, GGUF Q4_K) into qformat checkpoints once per module; ``torchrun --standalone``
then starts tests/readers/torch_tp_worker.py on 2 and on 4 CPU processes (gloo), each rank
loading its part of every checkpoint and writing what it measured to a JSON file.  The
assertions are here, with every expected value computed from the checkpoint headers and plain
NumPy slicing, not from the loader:

(a) each rank's packed components are byte-identical to the rank's block-aligned slice of the
    full packed components (the worker slices them with NumPy by proportion);
(b) the bytes each rank read of a split component are exactly its 1/world share of the
    component when the component varies along the split axis, and at most the whole component
    when it does not (a per-row scale of a column split); the ranks' ranges of each varying
    component are disjoint, lie inside the component and together cover it exactly;
(c) logits of the TP model against the single-process model and a float64 evaluation of the
    same decoded weights (tolerance below), greedy tokens identical; every split layer within
    the rigorous float32 summation bound of the float64 product;
(d) misaligned splits (int4 g32 columns at 176 or 88, nf4 columns at all, Q4_K columns at 128)
    and splits inside a head are refused with SLICE_INVALID on every rank, naming tensor, axis
    and alignment, before a single packed byte is touched and with the model unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import qformat  # noqa: E402
import qformat_torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from .run_once import run_once  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "torch_tp_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
DECODER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WORLDS = (2, 4)
TIMEOUT = 240  # seconds per torchrun group; a hung collective is killed, not waited for


def llama(hidden: int, heads: int, kv: int, inter: int, layers: int) -> LlamaForCausalLM:
    """A seeded random Llama whose Linears have biases (split colwise, added once after a rowwise
    reduction: both paths are exercised); transformers initialises biases to zero, so they are
    filled with random values here, as are the RMSNorm weights."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=320,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=128,
                      attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.05)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def write(folder: Path, model: LlamaForCausalLM, scheme: str, sharded: bool = False, names: tuple = DECODER,
          **params) -> dict:
    """Quantize the Linears of ``model`` named in ``names`` (``lm_head``, which no plan splits,
    stays packed and whole on every rank; decoder Linears left out are split as plain
    tensors) and save it (one file, or two shards and an index)."""
    folder.mkdir(parents=True)
    qformat_torch.quantize_model(model, scheme, min_numel=0, include=lambda n, m: n.rsplit(".", 1)[-1] in names, **params)
    model.config.to_json_file(folder / "config.json")
    single = folder / "model.safetensors"
    qformat_torch.save_model(model, single)
    if not sharded:
        return {"path": str(single), "config": str(folder / "config.json")}
    # two shards: layer 0 in the first, everything else in the second, and their index
    weight_map: dict[str, str] = {}
    with qformat.safe_open(single) as f:
        parts: dict[str, dict] = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
        for key in f.keys():
            dest = "model-00001-of-00002.safetensors" if ".layers.0." in key else "model-00002-of-00002.safetensors"
            parts[dest][key] = f.get_qtensor(key) if f.is_quantized(key) else f.get_tensor(key)
        for name, tensors in parts.items():
            qformat.save_file(tensors, folder / name)
            with qformat.safe_open(folder / name) as g:
                weight_map.update({n: name for n in list(g.header.entries) + g.keys()})
    # load_model reads single files: the reference model loads the unsharded copy (same tensors)
    reference = single.rename(folder / "reference.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {"path": str(index), "config": str(folder / "config.json"), "reference": str(reference)}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[dict]:
    """The checkpoints, written once per run, whichever xdist worker asks first (tests/readers/run_once.py)."""
    return run_once(tmp_path_factory, "torch-tp-cases", _write_cases)[1]


def _write_cases(base: Path) -> list[dict]:
    out = []

    def add(name: str, model, scheme: str, plan: str = "llama", sharded: bool = False, names: tuple = DECODER,
            **params) -> None:
        out.append({"name": name, "plan": plan, **write(base / name, model, scheme, sharded, names, **params)})

    add("int4g32", llama(256, 4, 4, 512, 2), "int", bits=4, group_size=32)
    add("int4g32-sharded", llama(256, 4, 4, 512, 2), "int", sharded=True, bits=4, group_size=32)
    add("int8-per-channel", llama(256, 4, 4, 512, 2), "int", names=DECODER + ("lm_head",), bits=8, group_size=None)
    add("int4g32-plain-attention", llama(256, 4, 4, 512, 2), "int", names=DECODER[4:], bits=4, group_size=32)
    add("nf4", llama(256, 4, 4, 512, 2), "nf4")  # flat blocks: rows only; the Megatron plan is refused
    out.append({**out[-1], "name": "nf4-colwise_rep", "plan": "colwise_rep"})  # every Linear split by rows
    add("q4k-wide", llama(512, 4, 4, 1024, 1), "gguf", type="Q4_K")  # super-blocks of 256 columns
    add("int4g32-misaligned", llama(256, 4, 4, 352, 1), "int", bits=4, group_size=32)  # 352 / 2 = 176 = 5.5 groups
    add("heads", llama(256, 8, 1, 512, 1), "int", bits=4, group_size=32)  # one KV head of 32: not splittable
    (base / "cases.json").write_text(json.dumps(out))
    return out


#: case -> world -> None (loads) or (axis/alignment fragment, tensor of the refusal)
REFUSED = {
    "nf4": {2: ("axis 1 allows cuts at only 0 or 256", "model.layers.0.self_attn.o_proj.weight"),
            4: ("axis 1 allows cuts at only 0 or 256", "model.layers.0.self_attn.o_proj.weight")},
    "q4k-wide": {2: None, 4: ("axis 1 allows cuts at multiples of 256 or 512", "model.layers.0.self_attn.o_proj.weight")},
    "int4g32-misaligned": {2: ("axis 1 allows cuts at multiples of 32 or 352", "model.layers.0.mlp.down_proj.weight"),
                           4: ("axis 1 allows cuts at multiples of 32 or 352", "model.layers.0.mlp.down_proj.weight")},
    "heads": {2: ("not whole heads", "model.layers.0.self_attn.k_proj.weight"),
              4: ("not whole heads", "model.layers.0.self_attn.k_proj.weight")},
}


def _run(cases_json: Path, world: int, out: Path) -> list[dict]:
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(HERE.parents[1]), str(HERE.parents[1] / "readers"), os.environ.get("PYTHONPATH", "")]))
    cmd = [str(TORCHRUN), "--standalone", f"--nproc_per_node={world}", str(WORKER), str(cases_json), str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank it started
        log, _ = proc.communicate()
        pytest.fail(f"torchrun with {world} ranks timed out after {TIMEOUT} s:\n{log[-6000:]}")
    results = []
    for r in range(world):
        p = out / f"rank{r}.json"
        assert p.exists(), f"rank {r} of {world} wrote no result (exit {proc.returncode}):\n{log[-6000:]}"
        results.append(json.loads(p.read_text()))
    assert proc.returncode == 0 and not any("crash" in r for r in results), \
        f"torchrun with {world} ranks failed (exit {proc.returncode}):\n{log[-6000:]}"
    return results


@pytest.fixture(scope="module")
def runs(cases, tmp_path_factory) -> dict[int, list[dict]]:
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun next to {sys.executable}")
    cases_json = Path(cases[0]["path"]).parents[1] / "cases.json"
    _, out = run_once(tmp_path_factory, "torch-tp-runs", lambda base: {w: _run(cases_json, w, base / f"world{w}") for w in WORLDS})
    return {int(w): res for w, res in out.items()}  # JSON's keys are strings


def _loaded(runs, world):
    """(case name, [per-rank result]) of every case that loaded at ``world``."""
    by = {}
    for res in runs[world]:
        for c in res["cases"]:
            by.setdefault(c["name"], []).append(c)
    return {k: v for k, v in by.items() if "refused" not in v[0]}, by


def _components(path: str) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Every stored tensor of a checkpoint: (first byte's file offset, bytes, shape), from the headers."""
    out = {}
    with qformat.safe_open(path) as f:
        files = list(f.shards.values()) if hasattr(f, "shards") else [f]
        for g in files:
            for name, e in g.header.entries.items():
                out[name] = (g.header.data_start + e.begin, e.end - e.begin, tuple(e.shape))
    return out


def _logical_shapes(path: str) -> dict[str, tuple[int, ...]]:
    with qformat.safe_open(path) as f:
        return {k: tuple(f.shape(k)) for k in f.keys() if f.is_quantized(k)}


@pytest.mark.parametrize("world", WORLDS)
def test_every_case_loads_or_is_refused_as_expected(runs, cases, world):
    loaded, by = _loaded(runs, world)
    for c in cases:
        want = REFUSED.get(c["name"], {}).get(world)
        got = by[c["name"]]
        assert len(got) == world
        if want is None:
            assert c["name"] in loaded, f"{c['name']} at {world} ranks refused: {got[0].get('refused')}"
            continue
        fragment, tensor = want
        for r, res in enumerate(got):  # every rank refuses, the same way, before any packed byte
            ref = res.get("refused")
            assert ref is not None, f"{c['name']} rank {r} of {world} loaded; expected a refusal ({fragment})"
            assert ref["code"] == "SLICE_INVALID", ref
            assert tensor in ref["message"] and fragment in ref["message"], ref["message"]
            if "heads" not in c["name"]:
                assert "axis 1 (in_features)" in ref["message"], ref["message"]
            assert ref["takes"] == 0 and ref["copies"] == 0, f"bytes were read before the refusal: {ref}"
            assert ref["model_untouched"], ref
        assert len({res["refused"]["message"] for res in got}) == 1  # the same message on every rank


@pytest.mark.parametrize("world", WORLDS)
def test_packed_components_are_the_aligned_slices(runs, cases, world):
    loaded, _ = _loaded(runs, world)
    for c in cases:
        if c["name"] not in loaded:
            continue
        layers = LlamaConfig.from_json_file(c["config"]).num_hidden_layers
        for r, res in enumerate(loaded[c["name"]]):
            assert res["packed_mismatch"] == [], f"{c['name']} rank {r}: {res['packed_mismatch'][:3]}"
            assert len(res["split"]) == layers * len(DECODER)  # every decoder Linear was split
            quantized = set(_logical_shapes(c["path"]))  # codes + at least one parameter each; a plain weight: itself
            assert res["components_checked"] >= sum(2 if k in quantized else 1 for k in res["split"])
            # a quantized Linear outside the plan (the int8 case's lm_head) stays a whole, packed QLinear
            assert res["replicated_qlinears"] == (["lm_head"] if c["name"] == "int8-per-channel" else [])


@pytest.mark.parametrize("world", WORLDS)
def test_each_rank_reads_its_share_and_ranks_read_disjoint_ranges(runs, cases, world):
    loaded, _ = _loaded(runs, world)
    for c in cases:
        if c["name"] not in loaded:
            continue
        comps = _components(c["path"])
        shapes = _logical_shapes(c["path"])
        per_rank = loaded[c["name"]]
        splits = per_rank[0]["split"]
        total_split_bytes = 0
        for key, (_, dim, _) in splits.items():
            if key in comps:  # a plain weight (split as it is stored): exactly its share, disjoint
                start, nbytes, cshape = comps[key]
                got = [[(o, l) for t, o, l in res["reads"] if t == key] for res in per_rank]
                assert all(sum(l for _, l in g) == nbytes // world for g in got), (c["name"], key)
                flat = sorted(x for g in got for x in g)
                assert all(a[0] + a[1] <= b[0] for a, b in zip(flat, flat[1:])) and flat[0][0] >= start
                assert flat[-1][0] + flat[-1][1] <= start + nbytes
                total_split_bytes += nbytes
                continue
            n = shapes[key][dim]
            for comp, (start, nbytes, cshape) in comps.items():
                if not comp.startswith(key + "."):
                    continue
                numel = 1
                for s in cshape:
                    numel *= s
                # does the component vary along the split axis? rows: any per-row or flat-blocked
                # component; columns: one with more than one item per row
                varies = (numel % n == 0 and numel >= n) if dim == 0 else (len(cshape) >= 2 and cshape[1] > 1)
                share = nbytes // world if varies else nbytes
                ranges = []
                for r, res in enumerate(per_rank):
                    mine = [(o, l) for t, o, l in res["reads"] if t == comp]
                    got = sum(l for _, l in mine)
                    assert got <= share, f"{c['name']} rank {r}: {comp} read {got} bytes, share {share}"
                    assert all(start <= o and o + l <= start + nbytes for o, l in mine), (comp, mine, start, nbytes)
                    if varies:
                        assert got == share, f"{c['name']} rank {r}: {comp} read {got} bytes of its share {share}"
                    ranges += mine
                if varies:  # disjoint and covering: each byte of the component read by exactly one rank
                    ranges.sort()
                    assert all(a[0] + a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), f"overlapping reads of {comp}"
                    assert sum(l for _, l in ranges) == nbytes
                total_split_bytes += nbytes
            bias = key[: -len("weight")] + "bias"
            if bias in comps:  # a colwise bias is split like the rows; a rowwise one is read whole
                start, nbytes, _ = comps[bias]
                share = nbytes // world if dim == 0 else nbytes
                ranges = [(o, l) for res in per_rank for t, o, l in res["reads"] if t == bias]
                assert len(ranges) == world and all(l == share for _, l in ranges), (c["name"], bias, ranges, share)
                if dim == 0:
                    assert sorted(o for o, _ in ranges) == [start + r * share for r in range(world)], (bias, ranges)
        payload = sum(nb for _, nb, _ in comps.values())
        for r, res in enumerate(per_rank):
            # everything else is read whole (replicated): the rank reads at most its split share
            # plus the rest of the checkpoint, and a whole component only where it cannot split
            assert res["bytes_read"] <= payload - total_split_bytes + total_split_bytes // world + \
                sum(nb for comp, (_, nb, sh) in comps.items() for key, (_, d, _) in splits.items()
                    if comp.startswith(key + ".") and d == 1 and not (len(sh) >= 2 and sh[1] > 1)), (c["name"], r)
            assert res["bytes_read"] == sum(l for _, _, l in res["reads"])
            # what the loader copied out of the file (counted apart, in the worker) is what it reported
            assert res["copied_bytes"] == res["bytes_read"], (c["name"], r, res["copied_bytes"], res["bytes_read"])


# The logits tolerance.  The TP model and the single-process model hold the same decoded weights
# (checked bit for bit above); they differ only in summation order: a row-parallel layer sums
# world partial products (each over in_features / world terms, in the kernel's order) with an
# all-reduce, and a column-parallel layer runs the kernel on fewer rows.  Per layer, every order
# is within gamma_(K+world) |x||W|^T of the exact product (asserted below per split layer against
# float64); through RMSNorm, attention and SiLU such differences are not bounded a priori, so the
# yardstick is the single-process model's own float32 error against a float64 evaluation of the
# same weights: the TP model's error must be of the same size, at most 4x it (plus 2^-20 of the
# logits' magnitude, so that an exact single-process result does not demand exactness).
@pytest.mark.parametrize("world", WORLDS)
def test_tp_logits_match_the_single_process_model(runs, cases, world):
    loaded, _ = _loaded(runs, world)
    assert loaded
    for name, per_rank in loaded.items():
        for r, res in enumerate(per_rank):
            lg = res["logits"]
            tol = 4 * lg["single_vs_f64"] + 2.0 ** -20 * lg["max_abs_f64"]
            assert lg["tp_vs_f64"] <= tol, f"{name} rank {r} of {world}: {lg}"
            assert lg["tp_vs_single"] <= lg["tp_vs_f64"] + lg["single_vs_f64"]
            # a greedy step whose top two logits were closer than the tolerance would be a tie
            assert res["min_top2_margin"] > 2 * tol, f"{name}: greedy path too close to a tie to compare: {res['min_top2_margin']}"
            assert res["tokens_tp"] == res["tokens_single"], f"{name} rank {r}: {res['tokens_tp']} != {res['tokens_single']}"
            bad = {k: v for k, v in res["layers"].items() if not v <= 1.0}
            assert not bad, f"{name} rank {r}: layer outputs beyond the float32 summation bound (ratio): {bad}"
        assert len({res["logits"]["tp_sha"] for res in per_rank}) == 1  # every rank holds the same logits


def test_one_rank_in_process_is_load_model_and_meta_models_load(cases):
    """Without a process group (rank=0, world=1 given): every planned layer holds the whole
    weight, so the logits are load_model's bit for bit; a model built on the meta device gets the
    checkpoint's tensors assigned; an unknown plan style is refused before anything is read."""
    from qformat_torch.distributed import ColwiseQLinear, RowwiseQLinear, llama_tp_plan

    case = next(c for c in cases if c["name"] == "int4g32")
    cfg = LlamaConfig.from_json_file(case["config"])
    ids = torch.tensor([[3, 17, 42, 99, 5]])
    log: list = []
    tp = qformat_torch.load_tensor_parallel(LlamaForCausalLM(cfg).eval(), case["path"], rank=0, world=1, read_log=log)
    single = qformat_torch.load_model(LlamaForCausalLM(cfg).eval(), case["path"])
    assert isinstance(tp.model.layers[0].self_attn.q_proj, ColwiseQLinear)  # default plan: config.base_model_tp_plan
    assert isinstance(tp.model.layers[1].mlp.down_proj, RowwiseQLinear)
    with torch.no_grad():
        assert torch.equal(tp(ids).logits, single(ids).logits)
    assert log[0].bytes_read == sum(nb for _, nb, _ in _components(case["path"]).values())  # one rank reads it all

    with torch.device("meta"):
        meta = LlamaForCausalLM(cfg)
    meta = qformat_torch.load_tensor_parallel(meta, case["path"], llama_tp_plan(), rank=0, world=1)
    assert not any(t.is_meta for t in meta.state_dict().values())
    assert torch.equal(meta.model.embed_tokens.weight, single.model.embed_tokens.weight)

    with pytest.raises(ValueError, match="unknown plan styles"):
        qformat_torch.load_tensor_parallel(LlamaForCausalLM(cfg), case["path"], {"layers.*.mlp.up_proj": "sideways"}, rank=0, world=1)
