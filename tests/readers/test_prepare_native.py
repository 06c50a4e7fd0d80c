"""The native steps of ``lut_grouped``'s preparation (issue 42 item 6), held to the torch
steps they replace, bit for bit:

* ``qformat.kernels.unpack_codes`` (what ``LutGrouped._codes`` uses for rows of bytes along
  in_features: every bit order, slot order, straddling or whole-slot codes, row alignment)
  against the canonical codes the components were packed from and against the core's read plan
  (``apply_codes``, the path it replaced, still taken for other packings);
* ``qformat.kernels.weight_span`` (what ``LutGrouped._weight_span`` uses with a zero point or a
  bias on 4-bit codes) against the torch scan it replaced, kept here as the reference, on
  random parameters and on random bit patterns (subnormals, infinities, NaN, overflowing steps);
* a prepared layer's kernel tensors are the same with the native steps as without them.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import qformat  # noqa: E402
from qformat import kernels as qk  # noqa: E402
from qformat.descriptor import parse_descriptor  # noqa: E402
from qformat.packing import Packing  # noqa: E402
from qformat.regions import full_region, plan_codes  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.decode import apply_codes  # noqa: E402
from qformat_torch.kernels import LutGrouped  # noqa: E402
from qformat_torch.sources import TensorSource  # noqa: E402
from tests.filebuild import pack  # noqa: E402

with qk.use("auto"):
    if not qk.prepare_available():  # pragma: no cover - a machine without the extension
        pytest.skip("the native matmul extension is not built here", allow_module_level=True)


@pytest.fixture(autouse=True)
def _reader_ops_path():
    """Overrides the readers' conftest fixture (which keeps decodes off the native kernels):
    lut_grouped and its preparation run only with them on."""
    with qk.use("auto"):
        yield


def _packings(bits: int):
    """Every packing of ``bits``-bit codes in rows of bytes along axis 1 that the native unpacker
    takes: both bit orders, straddling or not, every slot order of up to 4 slots (a sample of
    8), row alignments 1 and 3."""
    for bit_order, straddle, align in itertools.product(("lsb_first", "msb_first"), (True, False), (1, 3)):
        pk = {"container": 8, "bit_order": bit_order, "axis": 1}
        if not straddle:
            pk["straddle"] = False
        if align != 1:
            pk["row_alignment"] = align
        p = Packing.from_dict(pk)
        if not p.uses_slots(bits):
            yield pk
            continue
        n = 8 // bits
        orders = [None] + [list(o) for o in itertools.islice(itertools.permutations(range(n)), 1, 9)]
        for so in orders:
            yield pk if so is None else {**pk, "slot_order": so}


def _desc(n: int, k: int, bits: int, pk: dict, codes: np.ndarray):
    raw = {"shape": [n, k], "dtype": "float32",
           "codes": {"tensor": "codes", "element": {"type": "int", "bits": bits, "signedness": "unsigned"}, "packing": pk},
           "scale": {"tensor": "scale", "op": "multiply", "blocks": {"type": "grid", "size": [1, 8]}}}
    comps = {"codes": torch.from_numpy(np.ascontiguousarray(pack(codes, bits, pk))),
             "scale": torch.ones(n, -(-k // 8))}
    return parse_descriptor("w", raw), comps


@pytest.mark.parametrize("bits", range(1, 9))
def test_unpack_codes_matches_the_canonical_codes_and_the_read_plan(bits):
    rng = np.random.default_rng(bits)
    for pk in _packings(bits):
        for n, k in ((3, 1), (5, 8), (4, 30), (7, 64), (2, 77)):
            codes = rng.integers(0, 1 << bits, size=(n, k)).astype(np.uint8)
            desc, comps = _desc(n, k, bits, pk, codes)
            stored = comps["codes"]
            out = torch.empty((n, k), dtype=torch.uint8)
            assert LutGrouped._unpack_native(desc, stored, False, out), pk
            assert np.array_equal(out.numpy(), codes), (pk, n, k)
            plan = apply_codes(plan_codes(desc, full_region(desc.shape)), TensorSource(comps, torch.device("cpu")))
            assert torch.equal(out, plan.to(torch.uint8)), (pk, n, k)
            if bits <= 4 and k % 2 == 0:
                nib = torch.empty((n, k // 2), dtype=torch.uint8)
                assert LutGrouped._unpack_native(desc, stored, True, nib)
                assert np.array_equal(nib.numpy(), codes[:, 0::2] | (codes[:, 1::2] << 4)), (pk, n, k)


def test_unpack_codes_leaves_other_packings_to_the_read_plan():
    codes = np.random.default_rng(0).integers(0, 16, size=(4, 32)).astype(np.uint8)
    for pk in ({"container": 16, "bit_order": "lsb_first", "axis": 1}, {"container": 8, "bit_order": "lsb_first", "axis": 0},
               {"container": 8, "bit_order": "lsb_first", "axis": 1, "planes": {"span": 8}}):
        desc, comps = _desc(4, 32, 4, pk, codes)
        assert not LutGrouped._unpack_native(desc, comps["codes"], True, torch.empty((4, 16), dtype=torch.uint8))
        # and _codes still gives the codes through the read plan
        assert np.array_equal(LutGrouped._codes(desc, comps, True).numpy(), codes[:, 0::2] | (codes[:, 1::2] << 4))


def test_unpack_codes_checks_sizes():
    w = np.zeros(10, np.uint8)
    with pytest.raises(ValueError):  # 2 rows of 8 codes of 5 bits need 5 bytes each, 10 apart
        qk.unpack_codes(w, 5, 3, 8, 5, qk.UNPACK_STREAM_LSB, b"", np.empty((3, 8), np.uint8), False)
    with pytest.raises(ValueError):  # a row's codes past its stride
        qk.unpack_codes(w, 4, 2, 8, 5, qk.UNPACK_STREAM_LSB, b"", np.empty((2, 8), np.uint8), False)
    with pytest.raises(ValueError):  # out too short
        qk.unpack_codes(w, 5, 2, 8, 5, qk.UNPACK_STREAM_LSB, b"", np.empty((2, 7), np.uint8), False)
    with pytest.raises(ValueError):  # nibbles of 5-bit codes
        qk.unpack_codes(w, 5, 2, 8, 5, qk.UNPACK_STREAM_LSB, b"", np.empty((2, 4), np.uint8), True)
    with pytest.raises(ValueError):  # a slot past the byte
        qk.unpack_codes(w, 5, 2, 8, 4, qk.UNPACK_SLOTS, bytes([0, 5]), np.empty((2, 8), np.uint8), False)


# -- the candidate-weight span ---------------------------------------------------------------------
def _span_reference(values: np.ndarray, params: dict[str, torch.Tensor]) -> tuple[float, float]:
    """LutGrouped._weight_span's torch scan for 4-bit codes with a zero point or bias, as it was
    before the native scan (kept verbatim as the reference)."""
    lo, hi = np.inf, 0.0
    z, sc, b = params.get("zero"), params.get("scale"), params.get("bias")
    rows, groups = next(iter(params.values())).shape
    step = max(1, (1 << 18) // max(1, groups))
    t = torch.from_numpy(values.astype(np.float32))
    for a in range(0, rows, step):
        w = t
        if z is not None:
            w = w - z[a:a + step, :, None]
        if sc is not None:
            w = w * sc[a:a + step, :, None]
        if b is not None:
            w = w + b[a:a + step, :, None]
        w = w.abs()[torch.isfinite(w)]
        w = w[w != 0]
        if w.numel():
            lo, hi = min(lo, float(w.min())), max(hi, float(w.max()))
    return lo, hi


def _random_bits(rng: np.random.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    u = rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32)
    u[rng.random(shape) < 0.5] &= np.uint32(0x80FFFFFF)  # subnormal and tiny exponents
    return torch.from_numpy(u.view(np.float32))


@pytest.mark.parametrize("roles", [("zero",), ("bias",), ("zero", "scale"), ("scale", "bias"), ("zero", "scale", "bias"), ("zero", "bias")])
def test_weight_span_matches_the_torch_scan(roles):
    rng = np.random.default_rng(len(roles) * 7 + len(roles[0]))
    for trial in range(40):
        rows, groups = int(rng.integers(1, 300)), int(rng.integers(1, 40))
        nv = int(rng.integers(1, 17))
        if trial % 2:  # random bit patterns: NaN, infinities, subnormals, overflowing products
            values = _random_bits(rng, (nv,)).numpy()
            params = {r: _random_bits(rng, (rows, groups)) for r in roles}
        else:
            values = (np.arange(nv) - 8 + rng.normal(size=nv) * (trial % 4 == 0)).astype(np.float32)
            params = {r: torch.from_numpy((rng.normal(size=(rows, groups)) * 10.0 ** rng.integers(-40, 30)).astype(np.float32))
                      for r in roles}
            if trial % 8 == 0:  # zeros and exact cancellations
                for r in params.values():
                    r[rng.random((rows, groups)) < 0.3] = 0.0
        ref = _span_reference(values, params)
        got = LutGrouped._weight_span(values, params, True)
        assert (np.float64(got[0]).tobytes(), np.float64(got[1]).tobytes()) == (np.float64(ref[0]).tobytes(), np.float64(ref[1]).tobytes()), (trial, got, ref)


def test_weight_span_without_candidates():
    params = {"zero": torch.full((3, 2), float("inf")), "scale": torch.zeros(3, 2)}
    values = np.arange(16, dtype=np.float32)
    assert LutGrouped._weight_span(values, params, True) == _span_reference(values, params) == (np.inf, 0.0)


# -- a prepared layer --------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,kw", [("int", {"bits": 4, "group_size": 32, "symmetric": False}),
                                       ("int", {"bits": 5, "group_size": 32}), ("int", {"bits": 3, "group_size": 64}),
                                       ("gguf", {"type": "Q4_K"}), ("gguf", {"type": "Q6_K"}), ("gguf", {"type": "Q5_0"}),
                                       ("gguf", {"type": "Q4_1"})])
def test_prepared_tensors_are_those_of_the_torch_steps(scheme, kw, monkeypatch):
    w = (np.random.default_rng(1).standard_normal((96, 256)) * 0.02).astype(np.float32)
    qt = qformat.quantize(w, scheme, **kw)
    from qformat_torch.qtensor import TorchQTensor

    tq = TorchQTensor.from_qtensor(qt, "cpu")
    path = kernels.LutGrouped()
    if not path.match(tq.parsed, torch.device("cpu")):
        pytest.skip("lut_grouped does not take this tensor here")
    native = path.prepare(tq.parsed, tq.components, "native")
    monkeypatch.setattr(qk, "prepare_available", lambda: False)
    torch_steps = path.prepare(tq.parsed, tq.components, "native")
    assert native is not None and torch_steps is not None
    assert native.tensors.keys() == torch_steps.tensors.keys()
    for name, t in native.tensors.items():
        assert t.dtype == torch_steps.tensors[name].dtype and torch.equal(t.view(torch.uint8), torch_steps.tensors[name].view(torch.uint8)), name
    assert (native.exact, native.why, native.roundings, native.meta) == (torch_steps.exact, torch_steps.why, torch_steps.roundings, torch_steps.meta)


# -- parameter grids by the core's reader ------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from qformat.errors import QFormatError  # noqa: E402
from qformat.regions import plan_grid  # noqa: E402
from qformat_torch.decode import grid_values  # noqa: E402
from qformat_torch.dtypes import numpy_to_torch  # noqa: E402
from tests.strategies import descriptors, with_random_bits  # noqa: E402


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.tuples(st.integers(1, 7), st.integers(1, 9)).flatmap(lambda shape: descriptors(shape=shape)), st.integers(0, 2**32 - 1),
       st.booleans())
def test_parameter_grids_by_the_core_equal_the_torch_decoders(case, seed, random_bits):
    """``kernels._grid`` (the core's reader on CPU components) against the torch decoder's
    ``grid_values`` it replaced: the same binary32 values bit for bit (NaN by class), or the
    same error code."""
    raw, comps, _ = case
    if random_bits:
        comps = with_random_bits(raw, comps, seed)
    desc = parse_descriptor("w", raw)
    tcomps = {k: numpy_to_torch(np.ascontiguousarray(v), "cpu") for k, v in comps.items()}
    for prm in desc.params():
        box = full_region(prm.blocks.grid_shape(desc.shape))
        try:
            want = grid_values(plan_grid(prm, desc, box), TensorSource(tcomps, torch.device("cpu")), 0).contiguous()
        except QFormatError as e:
            with pytest.raises(QFormatError) as got:
                kernels._grid(desc, prm, tcomps)
            assert got.value.code == e.code
            continue
        got = kernels._grid(desc, prm, tcomps)
        assert got.dtype == torch.float32 and tuple(got.shape) == tuple(want.shape)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


# -- giving a mapped file's pages back ---------------------------------------------------------------
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="MADV_PAGEOUT and /proc/self/maps are Linux's")
def test_release_file_pages_only_inside_file_mappings(tmp_path):
    """Pages of a tensor in a mapped file are handed back, each time (a mapping found before is
    confirmed, not assumed); a tensor in anonymous memory never is, nor one whose file mapping
    is gone (its range is then anonymous memory or nothing)."""
    import mmap

    page = mmap.PAGESIZE
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(range(256)) * (64 * page // 256))
    for _ in range(2):  # a fresh mapping each time: the first lookup reads the maps, the second confirms the cached range
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        t = torch.frombuffer(m, dtype=torch.uint8)
        assert kernels.release_file_pages(t) and kernels.release_file_pages(t[page:])
        assert int(t[5]) == 5  # the bytes are still there (read from the file again)
        del t
        m.close()
    anon = mmap.mmap(-1, 16 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (a shared one is /dev/zero's)
    t = torch.frombuffer(anon, dtype=torch.uint8)
    assert not kernels.release_file_pages(t)
    del t
    anon.close()
    assert not kernels.release_file_pages(torch.ones(1 << 20, dtype=torch.uint8))
    assert not kernels.release_file_pages(torch.ones(16))  # smaller than a page


def test_heap_trims_are_batched(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels, "trim_heap", lambda: calls.append(1) or True)
    monkeypatch.setattr(kernels, "_TRIM", {"pending": 0})
    step = kernels.TRIM_EVERY_ELEMENTS // 4
    assert [kernels.trim_heap_after(step) for _ in range(8)] == [False, False, False, True] * 2 and len(calls) == 2
    assert kernels.trim_heap_after(kernels.TRIM_EVERY_ELEMENTS)  # a large layer: at once
