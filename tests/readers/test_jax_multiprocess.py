"""qformat.jax under JAX's multi-controller runtime: several processes, one global mesh.

Two groups of processes run on this machine, each started once for the module: 2 processes with
2 CPU devices each and 4 processes with 1 each (4 global devices either way), every process
``jax.distributed.initialize``-d on a free loopback port with gloo collectives
(tests/readers/jax_multiprocess_worker.py).  They load one sharded checkpoint (two shards and an
index, written with ``qformat.save_file``: int4 g32, nf4, mxfp4, fp8 per channel, nvfp4 and
plain tensors; split by rows, by columns, on a 2 x 2 mesh, replicated, and one on the last
process's devices only).  The worker itself asserts that each of its addressable shards equals
the single-process NumPy decode (``qformat.load_file``) bit for bit, decoded and packed; here:

* each process read exactly the bytes that an independent transcription of SPEC.md
  (tests/test_slicing.py ``needed``) says the block-aligned boxes of its own devices need, the
  boxes and their alignment computed here from the mesh and the schemes' block sizes; that is
  at most its share of the tensor plus the alignment, and nothing at all of a tensor it holds
  no part of;
* with rows split, different processes read disjoint bytes that together cover the tensor;
* a column split that is not block-aligned, loaded packed, is SLICE_INVALID in every process,
  naming the axis and the alignment, before any read of that tensor;
* a 2-layer MLP on the global mesh (weights packed and sharded, one cross-process all-reduce)
  matches the same forward on one device within a bound computed here (see the test).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

pytest.importorskip("jax")

import qformat  # noqa: E402

from ..test_slicing import needed  # noqa: E402
from .jax_processes import run_group  # noqa: E402
from .jax_multiprocess_worker import DEVICES, INDEX, MISALIGNED, PACKED_PLACEMENT, PLAN, write_checkpoint  # noqa: E402
from .run_once import run_once  # noqa: E402

#: process groups: processes -> CPU devices per process
GROUPS = {2: 2, 4: 1}
TIMEOUT_S = 150

#: scheme -> period of block-aligned bounds (rows, columns), from each scheme's layout in
#: SPEC.md, written out here rather than asked of qformat.slicing: rows are independent in all
#: of them; int4 g32 and mxfp4 have a scale per 32 columns (two codes per byte); nvfp4 one per
#: 16; fp8 per channel one per row (any column cut); nf4 flat blocks of 64 elements, which a
#: flat layout cuts only along the first axis (None: columns only whole).
PERIODS = {"int": (1, 32), "mxfp4": (1, 32), "nvfp4": (1, 16), "fp8_e4m3": (1, 1), "nf4": (1, None), "plain": (1, 1)}


def _launch(folder: str, nproc: int, local: int) -> dict:
    """Run ``nproc`` workers to the end (tests/readers/jax_processes.py); their JSON reports, or
    what failed with each one's stderr."""
    argvs = [[str(i), str(nproc), "{port}", folder, os.path.join(folder, f"report-{nproc}-{i}.json")] for i in range(nproc)]
    failed = run_group(folder, f"{nproc} processes", "tests.readers.jax_multiprocess_worker", argvs, local, TIMEOUT_S)
    if failed is not None:
        return {"ok": False, "error": failed}
    reports = []
    for i in range(nproc):
        with open(os.path.join(folder, f"report-{nproc}-{i}.json")) as fh:
            reports.append(json.load(fh))
    return {"ok": True, "reports": reports}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """The checkpoint, and in the same folder what the process groups wrote (tests/readers/run_once.py:
    once per run, whichever xdist worker asks first)."""
    folder, _ = run_once(tmp_path_factory, "jax-mp-ckpt", lambda f: write_checkpoint(str(f)))
    return str(folder)


@pytest.fixture(scope="module")
def groups(ckpt, tmp_path_factory) -> dict[int, dict]:
    """Each process group, run once for the whole run (tests/readers/run_once.py)."""
    _, out = run_once(tmp_path_factory, "jax-mp-groups", lambda _: {n: _launch(ckpt, n, local) for n, local in GROUPS.items()})
    return {int(n): g for n, g in out.items()}  # JSON's keys are strings


def _reports(groups: dict, nproc: int) -> list[dict]:
    g = groups[nproc]
    assert g["ok"], g["error"]
    return g["reports"]


@pytest.fixture(scope="module")
def layout(ckpt) -> dict:
    """Per tensor: raw descriptor (None: plain), components, file offsets; from the files' headers."""
    with open(os.path.join(ckpt, INDEX)) as fh:
        idx = json.load(fh)
    out = {}
    for fname in sorted(set(idx["weight_map"].values())):
        with qformat.safe_open(os.path.join(ckpt, fname)) as f:
            start = f.header.data_start
            for name in f.keys():
                raw = f.descriptor(name)
                comps = sorted({c for _, c in f.validated_descriptor(name).references()}) if raw else [name]
                out[name] = {
                    "raw": raw,
                    "arrays": {c: np.asarray(f.source.array(c)) for c in comps},
                    "span": {c: (start + f.header.entries[c].begin, start + f.header.entries[c].end) for c in comps},
                    "shape": tuple(f.shape(name)),
                }
    return out


# -- what each process should read, computed here --------------------------------------------------
def _split(n: int, parts: int, k: int) -> tuple[int, int]:
    assert n % parts == 0
    return (k * n // parts, (k + 1) * n // parts)


def _boxes(name: str, placement: str, shape: tuple[int, ...], report: dict) -> list[tuple[tuple[int, int], ...]]:
    """The boxes of ``report``'s process: its devices' positions in the mesh (devices ordered by
    process, then id, as the worker builds it) and the placement's split."""
    order = report["mesh_devices"]
    mine = [order.index(d) for d in report["local_devices"]]
    whole = tuple((0, n) for n in shape)
    out = []
    for k in mine:
        if placement == "rows":
            out.append((_split(shape[0], DEVICES, k),) + whole[1:])
        elif placement == "cols":
            out.append((whole[0], _split(shape[1], DEVICES, k)))
        elif placement == "grid":
            out.append((_split(shape[0], 2, k // 2), _split(shape[1], 2, k % 2)))
        elif placement == "replicated":
            out.append(whole)
        elif placement == "stage":  # the last process's devices only, rows split over them
            if _is_last(report):
                n = len(mine)
                out.append((_split(shape[0], n, k - (DEVICES - n)),) + whole[1:])
        else:
            raise AssertionError(placement)
    return sorted(set(out))


def _is_last(report: dict) -> bool:
    return report["local_devices"] == report["mesh_devices"][-len(report["local_devices"]):]


def _aligned(box: tuple[tuple[int, int], ...], scheme: str, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for (lo, hi), n, m in zip(box, shape, PERIODS[scheme]):
        out.append((0, n) if m is None else (lo - lo % m, min(n, -(-hi // m) * m)))
    return tuple(out)


def _expected_bytes(name: str, boxes: list, lay: dict) -> set[int]:
    """File bytes that the aligned ``boxes`` of ``name`` need (tests/test_slicing.needed)."""
    scheme, shape = PLAN[name][0], lay["shape"]
    want: set[int] = set()
    if not boxes:
        return want
    if lay["raw"] is None:  # plain: the box's elements, row-major
        (c,) = lay["arrays"]
        item = lay["arrays"][c].itemsize
        start = lay["span"][c][0]
        for box in boxes:
            idx = np.stack(np.meshgrid(*[np.arange(lo, hi) for lo, hi in box], indexing="ij"), -1).reshape(-1, len(shape))
            flat = np.ravel_multi_index(idx.T, shape)
            want.update((start + flat[:, None] * item + np.arange(item)).reshape(-1).tolist())
        return want
    need: dict[str, set[int]] = {}
    for box in boxes:
        a = _aligned(box, scheme, shape)
        idx = np.stack(np.meshgrid(*[np.arange(lo, hi) for lo, hi in a], indexing="ij"), -1).reshape(-1, len(shape))
        needed(lay["raw"], lay["arrays"], idx, need)
    for c, elems in need.items():
        item = lay["arrays"][c].itemsize
        e = np.fromiter(elems, np.int64)
        want.update((lay["span"][c][0] + e[:, None] * item + np.arange(item)).reshape(-1).tolist())
    return want


def _got_bytes(records: list, lay: dict) -> set[int]:
    got: set[int] = set()
    for r in records:
        for comp, off, length in r["reads"]:
            lo, hi = lay["span"][comp]
            assert lo <= off and off + length <= hi, (comp, off, length, lo, hi)
            got.update(range(off, off + length))
    return got


def _share_bound(name: str, boxes: list, lay: dict) -> int:
    """Its share plus the alignment, component by component: each component's elements seen as a
    grid over the logical tensor (a code byte spans 2 columns, an int4 g32 scale 32, a per-channel
    scale the whole row, a flat nf4 scale 64 consecutive elements, a scalar all of it), the
    elements whose cells meet an aligned box, times the element size."""
    scheme, shape = PLAN[name][0], lay["shape"]
    total = 0
    for c, a in lay["arrays"].items():
        mask = np.zeros(a.shape, bool)
        for box in boxes:
            al = _aligned(box, scheme, shape)
            if a.ndim == len(shape):  # a grid: cell size shape / component shape along each axis
                mask[tuple(slice(lo * m // n, -(-hi * m // n)) for (lo, hi), n, m in zip(al, shape, a.shape))] = True
            elif a.ndim == 0:
                mask[()] = True
            else:  # flat blocks: the box's flat element range (whole rows, as the aligned box is)
                assert a.ndim == 1 and al[1:] == tuple((0, n) for n in shape[1:]), (c, al)
                per = math.prod(shape) // a.shape[0]
                row = math.prod(shape[1:])
                mask[al[0][0] * row // per: -(-al[0][1] * row // per)] = True
        total += int(mask.sum()) * a.itemsize
    return total


# -- tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_every_process_holds_its_shards_bit_exact(groups, nproc):
    reports = _reports(groups, nproc)
    assert sorted(r["pid"] for r in reports) == list(range(nproc))
    for r in reports:
        assert len(r["local_devices"]) == GROUPS[nproc] and len(r["mesh_devices"]) == DEVICES
        # the worker compared each of these shards with qformat.load_file's bits
        for name, (_, _, shape, _, placement) in PLAN.items():
            boxes = _boxes(name, placement, shape, r)
            assert r["held_shards"][name] == (len(r["local_devices"]) if boxes else 0), (r["pid"], name)
            if PLAN[name][0] != "plain":
                want = "bits equal" if boxes or PACKED_PLACEMENT.get(name) else "none held"
                assert r["packed_dequantized"][name] == want, (r["pid"], name)


@pytest.mark.parametrize("packed", [False, True], ids=["decoded", "packed"])
@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_each_process_reads_only_its_aligned_blocks(groups, layout, nproc, packed):
    reports = _reports(groups, nproc)
    checked = 0
    for r in reports:
        log = r["packed_reads" if packed else "reads"]
        for name, (scheme, _, shape, _, placement) in PLAN.items():
            if packed:
                placement = PACKED_PLACEMENT.get(name, placement)
            boxes = _boxes(name, placement, shape, r)
            recs = log.get(name, [])
            regions = sorted({tuple(map(tuple, x["region"])) for x in recs})
            assert regions == boxes, (r["pid"], name, regions, boxes)
            # one record per device holding a box (a fully replicated tensor: read once for all)
            assert len(recs) == (0 if not boxes else 1 if placement == "replicated" else len(r["local_devices"])), (r["pid"], name)
            got = _got_bytes(recs, layout[name])
            want = _expected_bytes(name, boxes, layout[name])
            assert got == want, (nproc, r["pid"], name, len(got), len(want))
            assert len(got) <= _share_bound(name, boxes, layout[name]), (nproc, r["pid"], name)
            if not boxes:
                assert not recs, (r["pid"], name)  # holds no part: not one byte of it read
            checked += 1
    assert checked == nproc * len(PLAN)
    # the tensor on the last process's devices: the others read none of it, the last all of it
    stage = [len(_got_bytes(r[("packed_reads" if packed else "reads")].get("stage", []), layout["stage"])) for r in reports]
    assert stage[:-1] == [0] * (nproc - 1) and stage[-1] == sum(a.nbytes for a in layout["stage"]["arrays"].values())


@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_row_split_processes_read_disjoint_bytes(groups, layout, nproc):
    reports = _reports(groups, nproc)
    for key, over in (("reads", {}), ("packed_reads", PACKED_PLACEMENT)):
        names = [n for n, p in PLAN.items() if over.get(n, p[4]) == "rows"]
        assert len(names) >= 4, names
        for name in names:
            lay = layout[name]
            scalars = {b for c, a in lay["arrays"].items() if a.nbytes <= 4 for b in range(*lay["span"][c])}
            per = [_got_bytes(r[key].get(name, []), lay) - scalars for r in reports]
            for i in range(nproc):
                for j in range(i + 1, nproc):
                    assert not per[i] & per[j], (key, name, i, j, len(per[i] & per[j]))
            every = {b for c in lay["arrays"] for b in range(*lay["span"][c])} - scalars
            assert set().union(*per) == every, (key, name)


@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_misaligned_packed_split_refused_everywhere(groups, nproc):
    for r in _reports(groups, nproc):
        ref = r["refused"]
        assert ref is not None, f"process {r['pid']} loaded {MISALIGNED} packed on a misaligned split"
        assert ref["code"] == "SLICE_INVALID" and ref["tensor"] == MISALIGNED, ref
        # 320 columns over 4 devices: bounds at 80, 160, 240; int4 g32 cuts at multiples of 32
        assert "axis 1" in ref["message"] and "multiples of 32" in ref["message"] and "80" in ref["message"], ref["message"]
        assert ref["read_records"] == 0, ref  # refused before any of its bytes was read


@pytest.mark.parametrize("nproc", sorted(GROUPS))
def test_sharded_mlp_matches_one_device(groups, ckpt, nproc):
    """y = relu(x W1^T + b1) W2^T + b2 with W1 split by rows (no reduction across devices) and W2
    by columns (each device sums its 32 columns, then an all-reduce across processes).

    XLA's CPU dot sums in an order that depends on the operand shapes, and the all-reduce adds the
    partial sums in yet another, so the result is not bit-equal to the one-device forward (the
    first layer already differs by an ulp or so).  The bound is the classical one for float32
    sums of K products in any order, |fl(sum) - sum| <= gamma_K sum|terms| with gamma_K =
    K u / (1 - K u), u = 2^-24, taken twice (both results against the exact value) and carried
    through relu (1-Lipschitz) into the second layer."""
    ref = qformat.load_file(os.path.join(ckpt, INDEX))
    w1, b1, w2, b2 = (ref[k].astype(np.float64) for k in ("mlp.up.weight", "mlp.up.bias", "mlp.down.weight", "mlp.down.bias"))
    outs = [np.load(os.path.join(ckpt, f"mlp-{r['pid']}.npz")) for r in _reports(groups, nproc)]
    u = 2.0**-24

    def gamma(k: int) -> float:
        return k * u / (1 - k * u)

    for o in outs[1:]:  # every process gathered the same global output
        assert np.array_equal(o["y"].view(np.uint32), outs[0]["y"].view(np.uint32))
    o = outs[0]
    x = o["x"].astype(np.float64)
    h_bound = 2 * gamma(w1.shape[1] + 1) * (np.abs(x) @ np.abs(w1).T + np.abs(b1))
    dh = np.abs(o["h"].astype(np.float64) - o["h_ref"])
    assert (dh <= h_bound).all(), float((dh / np.maximum(h_bound, 1e-300)).max())
    h = np.abs(o["h_ref"].astype(np.float64)) + h_bound
    y_bound = (h_bound @ np.abs(w2).T) * (1 + gamma(w2.shape[1])) + 2 * gamma(w2.shape[1] + 1) * (h @ np.abs(w2).T + np.abs(b2))
    dy = np.abs(o["y"].astype(np.float64) - o["y_ref"])
    assert (dy <= y_bound).all(), float((dy / y_bound).max())
    assert np.abs(o["y_ref"]).max() > 1.0  # a forward that computed something
