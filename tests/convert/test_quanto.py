"""The ``quanto`` converter against optimum-quanto itself (the oracle).

Checkpoints are made the way quanto users make them: ``quantize(model, weights=...)``,
``freeze(model)``, safetensors of ``model.state_dict()`` and ``quanto_qmap.json`` from
``quantization_map(model)``.  Expected values come from quanto reloading that checkpoint
(``requantize`` into a fresh model, then each weight's ``dequantize()``).

Where quanto computes in the scale's dtype (float16/bfloat16 scales with a float shift, the
default ``MaxOptimizer``): quanto rounds ``scale * q`` to that dtype before subtracting the
shift, qformat (SPEC §10) rounds once at the end.  Those variants are compared bit for bit
with an independent binary32 transcription of the spec's formula over quanto's own unpacked
codes, scales and shifts, and the difference from quanto is bounded separately.  With
float32 scales, with integer shifts and for the 8-bit qtypes, quanto's result is matched bit
for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
quanto = pytest.importorskip("optimum.quanto")
from optimum.quanto import freeze, quantization_map, quantize, requantize  # noqa: E402
from optimum.quanto.tensor.optimizers import MaxOptimizer  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import qformat  # noqa: E402
from qformat.convert import Checkpoint, describe  # noqa: E402
from qformat.convert.quanto import Quanto, quanto_group_size, unpack_planes  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402

from .helpers import assert_converts, bits_equal  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


QBITS = ["qint4", "qint2"]
QBYTES = ["qint8", "qfloat8_e4m3fn", "qfloat8_e5m2", "qfloat8_e4m3fnuz"]


def _layers(qtype: str):
    """Layers chosen for their packing.  2/4-bit: grouped rows (gs 96, 10 rows; gs 96, 8 rows;
    gs 32, 15 rows) with and without a bias, per-axis odd rows, a per-axis 4-D convolution."""
    if qtype in QBITS:
        return torch.nn.Sequential(
            torch.nn.Linear(192, 5, bias=False),   # grouped [10, 96], no bias: grouped shape
            torch.nn.Linear(64, 7),                # per axis [7, 64] (odd rows)
            torch.nn.Linear(192, 4),               # grouped, bias -> [4, 192], 8 rows: planes over the flat tensor
            torch.nn.Linear(160, 3),               # grouped gs 32, bias -> [3, 160], 15 rows: added codes
            torch.nn.Conv2d(3, 5, 3),              # per axis [5, 3, 3, 3]
        )
    if qtype == "qint8":
        return torch.nn.Sequential(torch.nn.Linear(40, 7), torch.nn.Conv2d(3, 5, 3))
    return torch.nn.Sequential(torch.nn.Linear(40, 7))


def _model(dtype, qtypes):
    torch.manual_seed(0)
    return torch.nn.ModuleDict({q: _layers(q) for q in qtypes}).to(dtype)


class ZeroPoint(MaxOptimizer):
    """quanto's MaxOptimizer with ``zeropoint=True``: integer (uint8) shifts."""

    def __call__(self, base, qtype, axis, group_size=None, zeropoint=False):
        return super().__call__(base, qtype, axis, group_size, zeropoint=True)


def _checkpoint(tmp: Path, qtypes: list[str], dtype: str, optimizer=None) -> tuple[Path, dict]:
    """One checkpoint mixing qtypes (one ``quantize`` call per qtype, selected by ``include``)."""
    src = tmp / "src"
    src.mkdir()
    model = _model(DTYPES[dtype], qtypes)
    for q in qtypes:
        quantize(model, weights=q, optimizer=optimizer, include=f"{q}.*")
    freeze(model)
    qmap = quantization_map(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, src / "model.safetensors")
    (src / "quanto_qmap.json").write_text(json.dumps(qmap, indent=4))
    # The oracle: a fresh model reloaded by quanto from the files.
    fresh = _model(DTYPES[dtype], qtypes)
    requantize(fresh, load_file(src / "model.safetensors"), json.loads((src / "quanto_qmap.json").read_text()))
    return src, {f"{q}.{i}.weight": m.weight for q in qtypes for i, m in enumerate(fresh[q])}


def _np(t) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _logical_shape(name: str, w) -> tuple[int, ...]:
    # Layer 0 has groups and no bias: quanto stores neither its shape nor its group size, so the
    # converter exposes the grouped shape [N*K/gs, gs] (same values, same row-major order).
    return (10, 96) if name.endswith(".0.weight") and name.split(".")[0] in QBITS else tuple(w.shape)


def _spec_reference(w, dtype: str) -> np.ndarray:
    """SPEC §10 in binary32 over quanto's own unpacked codes: x = q*s (float shift: then x - t;
    integer shift: (q - z)*s), rounded once to the logical dtype."""
    q = _np(w._data.unpack()).astype(np.float32)
    s = _np(w._scale).astype(np.float32)
    t = _np(w._shift)
    if t.dtype == np.uint8:
        x = (q - t.astype(np.float32)) * s
    else:
        x = q * s - t.astype(np.float32)
    return x.astype(np.float32).astype(NP[dtype]).reshape(w.shape)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place of the logical dtype (monotone integer mapping)."""
    bits = 8 * a.dtype.itemsize
    ia = a.view(f"i{a.dtype.itemsize}").astype(np.int64)
    ib = b.view(f"i{b.dtype.itemsize}").astype(np.int64)
    top = 1 << (bits - 1)
    ia = np.where(ia < 0, -(ia + top), ia)
    ib = np.where(ib < 0, -(ib + top), ib)
    return np.abs(ia - ib)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_every_qtype(dtype, tmp_path):
    src, oracle = _checkpoint(tmp_path, QBITS + QBYTES, dtype)
    expected, differ = {}, 0
    for name, w in oracle.items():
        lib = _np(w.dequantize())
        if name.split(".")[0] in QBYTES or dtype == "float32":
            # s * data: an 8-bit value times a 16-bit float is exact in binary32, so quanto's one
            # rounding in the scale dtype is the spec's; with binary32 scales quanto's binary32
            # steps are the spec's own.  Bit for bit against quanto.
            if name.split(".")[0] in QBITS:
                ok, why = bits_equal(_spec_reference(w, dtype), lib)
                assert ok, f"{name}: {why}"
            expected[name] = lib.reshape(_logical_shape(name, w))
            continue
        # quanto: fl(fl(s*q) - t) in the scale dtype; the spec: s*q - t in binary32, one rounding.
        # |lib - ref| <= 1/2 ulp(s*q) (quanto's extra rounding) + 1 ulp of the larger result
        # (the two final roundings), all in the logical dtype.
        ref = _spec_reference(w, dtype)
        q = _np(w._data.unpack()).astype(np.float32)
        sq = (q * _np(w._scale).astype(np.float32)).reshape(w.shape)
        f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
        big = np.maximum(np.abs(f64(lib)), np.abs(f64(ref))).astype(NP[dtype])
        bound = 0.5 * f64(np.spacing(np.abs(sq).astype(NP[dtype]))) + f64(np.spacing(big))
        diff = np.abs(f64(lib) - f64(ref))
        assert (diff <= bound).all(), f"{name}: quanto differs from the spec formula by more than the bound"
        differ += int((diff > 0).sum())
        expected[name] = ref.reshape(_logical_shape(name, w))
    if dtype != "float32":
        assert differ > 0  # the documented difference is real on this data
    assert_converts(src, expected, tmp_path, detect_as="quanto")
    _, _, d = describe(src)
    for q in QBITS:
        # 15 grouped rows do not fill four (or two) planes: canonical codes are added for layer 3.
        assert d.descriptors[f"{q}.3.weight"]["codes"]["tensor"] == f"{q}.3.weight.qformat_codes"
        assert d.descriptors[f"{q}.2.weight"]["codes"]["packing"] == {"container": 8, "bit_order": "lsb_first", "axis": None, "planes": {"span": 768}}
        assert d.descriptors[f"{q}.0.weight"]["codes"]["packing"]["planes"] == {"span": 10}
        assert d.descriptors[f"{q}.0.weight"]["shape"] == [10, 96]
    assert d.descriptors["qfloat8_e4m3fnuz.0.weight"]["codes"]["element"]["table_tensor"] == "qfloat8_e4m3fnuz.0.weight.qformat_table"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_integer_shift_is_bit_exact(dtype, tmp_path):
    # (q - z) * s: the binary32 product of an integer below 2^8 and a 16-bit float is exact,
    # so quanto's one rounding in the scale dtype equals the spec's.
    src, oracle = _checkpoint(tmp_path, ["qint4"], dtype, optimizer=ZeroPoint())
    expected = {}
    for name, w in oracle.items():
        assert w._shift.dtype == torch.uint8
        lib = _np(w.dequantize())
        ok, why = bits_equal(_spec_reference(w, dtype), lib)
        assert ok, why
        expected[name] = lib.reshape(_logical_shape(name, w))
    assert_converts(src, expected, tmp_path, from_format="quanto")
    _, _, d = describe(src, "quanto")
    assert d.descriptors["qint4.1.weight"]["zero"]["tensor"] == "qint4.1.weight._shift" and "bias" not in d.descriptors["qint4.1.weight"]


def test_unpack_planes_hand_example():
    # pack_weights (optimum/quanto/tensor/packed.py) with 5 rows, 4-bit: R = 3, rows 0-2 in the
    # low nibbles, rows 3-4 in the high nibbles of byte rows 0-1; byte row 2's high nibble is 0.
    packed = np.array([[0x41], [0x52], [0x03]], np.uint8)
    assert unpack_planes(packed, 4, 5)[:, 0].tolist() == [1, 2, 3, 4, 5]
    # 2-bit, 5 rows: R = 2, planes at bits 0-1, 2-3, 4-5, 6-7.
    packed = np.array([[0b00_11_10_01], [0b00_00_01_10]], np.uint8)
    assert unpack_planes(packed, 2, 5)[:, 0].tolist() == [1, 2, 2, 1, 3]
    t = torch.tensor([[1], [2], [3], [4], [5]], dtype=torch.uint8)
    from optimum.quanto.tensor.packed import pack_weights

    assert pack_weights(t, 4)[:, 0].tolist() == [0x41, 0x52, 0x03]


def test_group_size_rule_matches_quanto():
    for k in (64, 128, 160, 192, 200, 256, 288, 320, 4096, 11008):
        m = torch.nn.Sequential(torch.nn.Linear(k, 2, device="meta"))
        quantize(m, weights="qint4")
        assert quanto_group_size(k) == m[0].weight_group_size, k


def _expect_error(src: Path, code: str, text: str) -> None:
    with pytest.raises(QFormatError) as e:
        Quanto().describe(Checkpoint(src))
    assert e.value.code == code, e.value
    assert text in str(e.value), str(e.value)


def test_errors(tmp_path):
    src, _ = _checkpoint(tmp_path, ["qint4"], "float16")
    qmap_path = src / "quanto_qmap.json"
    qmap = json.loads(qmap_path.read_text())
    # A quantized weight whose module the qmap does not list: its qtype is unknown.
    qmap_path.write_text(json.dumps({k: v for k, v in qmap.items() if k != "qint4.2"}))
    _expect_error(src, "CONVERT_SOURCE_INVALID", "no entry for module 'qint4.2'")
    qmap_path.write_text(json.dumps(qmap | {"qint4.2": {"weights": "qint3", "activations": "none"}}))
    _expect_error(src, "CONVERT_UNSUPPORTED", "qint3")
    qmap_path.write_text(json.dumps(qmap | {"qint4.2": {"weights": "qint4"}}))
    _expect_error(src, "CONVERT_SOURCE_INVALID", "'activations'")
    qmap_path.write_text('{"qint4.0": {"weights": "qint4", "activations": "none"}, "qint4.0": {}}')
    _expect_error(src, "CONVERT_SOURCE_INVALID", "repeats")
    qmap_path.unlink()
    _expect_error(src, "CONVERT_SOURCE_INVALID", "quanto_qmap.json is missing")
    qmap_path.write_text(json.dumps(qmap))
    # Scales that do not match the packed rows (and so no group size fits).
    sd = load_file(src / "model.safetensors")
    for k in ("qint4.2.weight._scale", "qint4.2.weight._shift"):
        sd[k] = sd[k][:5].contiguous()
    save_file(sd, src / "model.safetensors")
    _expect_error(src, "CONVERT_SOURCE_INVALID", "qint4.2.weight._data._data must have ceil(5/2) = 3 packed rows")
    sd["qint4.2.weight._scale"] = sd["qint4.2.weight._scale"].reshape(1, 5).contiguous()
    save_file(sd, src / "model.safetensors")
    _expect_error(src, "CONVERT_SOURCE_INVALID", "expected [rows, 1]")


def test_qbytes_scale_shape_error(tmp_path):
    src, _ = _checkpoint(tmp_path, ["qint8"], "float16")
    sd = load_file(src / "model.safetensors")
    sd["qint8.0.weight._scale"] = sd["qint8.0.weight._scale"][:3].contiguous()
    save_file(sd, src / "model.safetensors")
    _expect_error(src, "CONVERT_SOURCE_INVALID", "expected [7, 1] (per output channel)")
