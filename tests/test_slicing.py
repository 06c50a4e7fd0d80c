"""Block-aligned slicing (qformat/slicing.py) over random descriptors.

For random boxes of random tensors (tests/strategies.py descriptors(): every element, packing,
block and nesting feature): the aligned box contains the box, is aligned, and is the smallest
such box; the standalone slice decodes to the full decode restricted to the aligned box, bit for
bit; and the bytes it reads from the memory-mapped file are exactly the ones an independent,
per-element transcription of SPEC.md (conformance/spec_reference.py) says the box needs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qformat
from conformance import spec_reference as ref
from qformat.errors import QFormatError
from qformat.slicing import RecordingSource, aligned_region, axis_periods, is_aligned, slice_qtensor

from .backends import same_bits
from .strategies import descriptors

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])


# -- an independent oracle: which elements of which component a set of logical indices needs --
def needed(desc: dict, comps: dict, indices, out: dict[str, set[int]]) -> None:
    """Add to ``out[name]`` the flat element indices of each component that decoding the
    logical ``indices`` (an (M, rank) integer array or a list of tuples) reads, per SPEC.md:
    the containers holding any bit of their codes (§7, via spec_reference._positions), the
    parameter cells they use (§8; along an indexed axis every cell 0..count-1, since the group
    index may point anywhere), the group-index entries, nested parameters recursively (§9.3),
    and codebook tables whole."""
    shape = tuple(desc["shape"])
    rank = len(shape)
    idx = np.asarray(indices, dtype=np.int64)
    if idx.ndim != 2:
        idx = idx.reshape(-1, rank)
    codes = desc["codes"]
    pk, bits = codes["packing"], ref.element_bits(codes["element"])
    order = pk.get("order") or list(range(rank))
    sshape = tuple(shape[a] for a in order)
    cname = codes["tensor"]
    cshape = np.asarray(comps[cname]).shape
    if "table_tensor" in codes["element"]:
        t = codes["element"]["table_tensor"]
        out.setdefault(t, set()).update(range(np.asarray(comps[t]).size))
    if len(idx) == 0:
        return
    length = math.prod(shape) if pk["axis"] is None else sshape[pk["axis"]]
    # word index of every bit of the code at each row position: [L, bits]
    words_of = np.array([[w for w, _ in bits_at] for bits_at in ref._positions(length, bits, pk)], np.int64)
    si = idx[:, order]
    s = out.setdefault(cname, set())
    if pk["axis"] is None:
        f = np.ravel_multi_index(si.T, sshape) if rank else np.zeros(len(idx), np.int64)
        s.update(np.unique(words_of[f]).tolist())
    else:
        ax = pk["axis"]
        for j in range(bits):
            ci = si.copy()
            ci[:, ax] = words_of[si[:, ax], j]
            s.update(np.unique(np.ravel_multi_index(ci.T, cshape)).tolist())
    flat = np.ravel_multi_index(idx.T, shape) if rank else np.zeros(len(idx), np.int64)
    for role in ("zero", "scale", "bias"):
        prm = desc.get(role)
        if prm is None:
            continue
        blocks = prm["blocks"]
        grid = ref.grid_shape(blocks, shape)
        gi = blocks.get("index")
        if blocks["type"] == "flat":
            cells = np.unique(flat // blocks["size"])[:, None]
        else:
            base = np.stack([np.zeros(len(idx), np.int64) if sz is None else idx[:, a] // sz for a, sz in enumerate(blocks["size"])], axis=1) if rank else np.zeros((len(idx), 0), np.int64)
            if gi is not None:
                out.setdefault(gi["tensor"], set()).update(np.unique(idx[:, gi["axis"]]).tolist())
                reps = []
                for g in range(gi["count"]):
                    b = base.copy()
                    b[:, gi["axis"]] = g
                    reps.append(b)
                base = np.concatenate(reps)
            cells = np.unique(base, axis=0)
        if "encoded" in prm:
            needed(prm["encoded"], comps, cells, out)
        else:
            po = prm.get("order") or list(range(len(grid)))
            stored = tuple(grid[a] for a in po)
            t = out.setdefault(prm["tensor"], set())
            t.update((np.ravel_multi_index(cells[:, po].T, stored) if stored else np.zeros(len(cells), np.int64)).tolist())


def byte_set(ranges) -> set[int]:
    out: set[int] = set()
    for r in ranges:
        out.update(range(r.offset, r.end))
    return out


def draw_region(data, shape):
    reg = []
    for n in shape:
        lo = data.draw(st.integers(0, n))
        reg.append((lo, data.draw(st.integers(lo, n))))
    return tuple(reg)


@SETTINGS
@given(descriptors(), st.data())
def test_aligned_slices_decode_and_read_only_their_bytes(tmp_path_factory, case, data):
    desc, comps, _ = case
    qt = qformat.QTensor(desc, comps)
    full = qt.dequantize()
    path = tmp_path_factory.mktemp("sl") / "t.safetensors"
    qformat.save_file({"t": qt}, path)
    with qformat.safe_open(path) as f:
        D = f.validated_descriptor("t")
        raw = f.descriptor("t")
        file_comps = {name: f.source.array(name) for _, name in D.references()}
        entries = {name: f.header.entries[name] for name in file_comps}
        start = f.header.data_start
        shape = D.shape
        for _ in range(2):
            region = draw_region(data, shape)
            A = aligned_region(D, region)
            assert all(a_lo <= lo <= hi <= a_hi for (lo, hi), (a_lo, a_hi) in zip(region, A)), (region, A)
            assert is_aligned(D, A)
            # smallest: moving any bound of A toward the region leaves alignment
            for a, ((lo, hi), (a_lo, a_hi)) in enumerate(zip(region, A)):
                for p in range(a_lo + 1, lo + 1):
                    assert not is_aligned(D, A[:a] + ((p, a_hi),) + A[a + 1 :])
                for p in range(hi, a_hi):
                    assert not is_aligned(D, A[:a] + ((a_lo, p),) + A[a + 1 :])
            rec = RecordingSource(f.source)
            sub, sub_comps = slice_qtensor(D, rec, A)
            assert tuple(sub["shape"]) == tuple(hi - lo for lo, hi in A)
            part = qformat.QTensor(sub, sub_comps).dequantize()
            assert same_bits(part, full[tuple(slice(lo, hi) for lo, hi in A)])
            # every read lies inside its component's entry ...
            for r in rec.reads:
                e = entries[r.tensor]
                assert start + e.begin <= r.offset and r.end <= start + e.end, (r, e)
            # ... and the bytes read are exactly the ones the spec says the box needs
            if math.prod(hi - lo for lo, hi in A) == 0:
                continue
            idx = np.indices([hi - lo for lo, hi in A]).reshape(len(A), -1).T + np.array([lo for lo, _ in A], np.int64) if A else np.zeros((1, 0), np.int64)
            need: dict[str, set[int]] = {}
            needed(raw, file_comps, idx, need)
            want = set()
            for name, elems in need.items():
                item = file_comps[name].itemsize
                off = start + entries[name].begin
                for el in elems:
                    want.update(range(off + el * item, off + (el + 1) * item))
            assert byte_set(rec.reads) == want


def _file(tmp_path, scheme, shape=(64, 256), **kw):
    rng = np.random.default_rng(0)
    w = rng.normal(size=shape).astype(np.float32)
    qt = qformat.quantize(w, scheme, **kw)
    path = tmp_path / "w.safetensors"
    qformat.save_file({"w": qt}, path)
    return path, qt


@pytest.mark.parametrize("scheme", ["int", "nf4", "mxfp4", "nvfp4", "fp8_e4m3"])
def test_get_qtensor_slice(tmp_path, scheme):
    path, qt = _file(tmp_path, scheme)
    full = qt.dequantize()
    with qformat.safe_open(path) as f:
        D = f.validated_descriptor("w")
        per = axis_periods(D)
        A = aligned_region(D, ((8, 40), (64, 192)))
        q = f.get_slice("w").qtensor(tuple(slice(lo, hi) for lo, hi in A))
        assert q.shape == tuple(hi - lo for lo, hi in A)
        assert same_bits(q.dequantize(), full[tuple(slice(lo, hi) for lo, hi in A)])
        assert q.nbytes < qt.nbytes
        q2 = f.get_qtensor_slice("w", (slice(A[0][0], A[0][1]), slice(A[1][0], A[1][1])))
        assert same_bits(q2.dequantize(), q.dequantize())
        bad = next(((a, p) for a, m in enumerate(per) if m is not None and m > 1 for p in [m + 1]), None)
        if bad is not None:
            a, p = bad
            key = [slice(None)] * 2
            key[a] = slice(p, None)
            with pytest.raises(QFormatError) as ei:
                f.get_slice("w").qtensor(tuple(key))
            assert ei.value.code == "SLICE_INVALID" and "nearest aligned bounds" in str(ei.value)


def test_periods_of_common_schemes(tmp_path):
    # int4 g32 packs two codes per byte along K: rows cut anywhere, K at multiples of 32.
    assert axis_periods(qformat.safe_open(_file(tmp_path, "int")[0]).validated_descriptor("w")) == (1, 32)
