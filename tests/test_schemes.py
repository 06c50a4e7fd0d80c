"""The reference encoders: descriptors, shapes, error bounds, errors, and independent code checks.

Every configuration below runs through every shape; a new scheme in tables/schemes.json joins
these tests by adding one CONFIGS entry (a test fails until every registered id has one).
The error bounds are derived per element from what the file stores (scales, zero points) and
the element format, so they hold for any input, not only for typical data.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import jsonschema
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import qformat
import qformat.schemes
from qformat import QTensor, tables
from qformat.errors import QFormatError
from qformat.packing import Packing, unpack_rows
from qformat.schemes import get, ids, quantize

from qformat.schemes.ggml_blocks import SIZES as GGUF_SIZES, TYPES as GGUF_TYPES

from .strategies import float_arrays

CB16 = [-1.5, -1.0, -0.7, -0.45, -0.3, -0.2, -0.1, -0.03, 0.0, 0.05, 0.12, 0.25, 0.4, 0.6, 0.9, 1.25]

# id -> (scheme, params, largest |x| the strategy draws).  Scales stored as float16 bound the
# magnitudes an int configuration can take; everything else goes up to 1e30 (float32 range).
CONFIGS: dict[str, tuple[str, dict[str, Any], float]] = {
    "int": ("int", {}, 1e4),
    "int-b2": ("int", {"bits": 2}, 1e4),
    "int-b3-g7-axis0": ("int", {"bits": 3, "group_size": 7, "axis": 0}, 1e4),
    "int-b8-channel": ("int", {"bits": 8, "group_size": None}, 1e4),
    "int-b6-f32scale-out16": ("int", {"bits": 6, "scale_dtype": "float32", "dtype": "float16"}, 6e4),
    "int-b4-bf16scale": ("int", {"scale_dtype": "bfloat16"}, 1e30),
    "int-asym": ("int", {"symmetric": False}, 1e4),
    "int-b5-asym-bf16scale": ("int", {"bits": 5, "symmetric": False, "scale_dtype": "bfloat16", "axis": 0, "group_size": 5}, 1e30),
    "int-b8-asym-g16": ("int", {"bits": 8, "symmetric": False, "group_size": 16, "scale_dtype": "float32"}, 1e30),
    "nf4": ("nf4", {}, 1e30),
    "nf4-dq": ("nf4", {"double_quant": True}, 1e30),
    "nf4-b2-dq": ("nf4", {"block_size": 2, "double_quant": True}, 1e30),
    "nf4-b5-bf16": ("nf4", {"block_size": 5, "dtype": "bfloat16"}, 1e30),
    "fp8_e4m3": ("fp8_e4m3", {}, 1e30),
    "fp8_e4m3-tensor": ("fp8_e4m3", {"granularity": "tensor"}, 1e30),
    "fp8_e4m3-block": ("fp8_e4m3", {"granularity": "block", "block_size": [5, 3]}, 1e30),
    "fp8_e5m2": ("fp8_e5m2", {}, 1e30),
    "fp8_e5m2-channel-axis0-out16": ("fp8_e5m2", {"axis": 0, "dtype": "float16"}, 6e4),
    "mxfp4": ("mxfp4", {}, 1e30),
    "mxfp4-b7": ("mxfp4", {"block_size": 7}, 1e30),
    "mxfp6_e2m3": ("mxfp6_e2m3", {}, 1e30),
    "mxfp6_e3m2": ("mxfp6_e3m2", {}, 1e30),
    "mxfp8_e4m3": ("mxfp8_e4m3", {}, 1e30),
    "mxfp8_e5m2-bf16": ("mxfp8_e5m2", {"dtype": "bfloat16"}, 1e30),
    "mxint8": ("mxint8", {}, 1e30),
    "nvfp4": ("nvfp4", {}, 1e30),
    "nvfp4-out16": ("nvfp4", {"dtype": "float16"}, 6e4),
    "codebook": ("codebook", {"values": CB16}, 1e30),
    "codebook-noscale": ("codebook", {"values": CB16, "block_size": None}, 1.0),
    "codebook-1": ("codebook", {"values": [0.5]}, 1e30),
    "codebook-3-b5": ("codebook", {"values": [3.0, -2.0, 0.1], "block_size": 5}, 1e30),
    # llama.cpp's types: their F16 block parameters overflow beyond about 1e5 (K-quants) to
    # 5e5 (Q4_0), so the strategy stays at 1e4 (tests/test_gguf_scheme.py covers the overflow).
    **{f"gguf-{t}": ("gguf", {"type": t}, 1e4) for t in GGUF_TYPES},
    "gguf-Q4_K-bf16": ("gguf", {"type": "Q4_K", "dtype": "bfloat16"}, 1e4),
}

SHAPES = [(1,), (5,), (33,), (1, 1), (7, 45), (3, 5, 17), (2, 3, 4, 19), (), (0,), (4, 0), (0, 3)]
_OUT = {"float32": (0.0, 2.0**-149), "float16": (2.0**-11, 2.0**-25), "bfloat16": (2.0**-8, 2.0**-134)}
_SCALE_EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_SCALE_MIN_NORMAL = {"float32": 2.0**-126, "float16": 2.0**-14, "bfloat16": 2.0**-126}


def _input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))
    return x.astype(np.float32)


def _row_block(cfg: str) -> int | None:
    """The block a configuration's rows must be whole multiples of (gguf), else None."""
    scheme, params, _ = CONFIGS[cfg]
    return GGUF_SIZES[params["type"]][0] if scheme == "gguf" else None


def _fit(cfg: str, x: np.ndarray) -> np.ndarray:
    """``x`` as a configuration takes it: for gguf, the last axis widened to the next multiple
    of the block by repeating its values (a scalar becomes one row).  Every other length is
    refused, which tests/test_gguf_scheme.py checks; here gguf meets every shape's other axes."""
    b = _row_block(cfg)
    if b is None:
        return x
    x = x.reshape(1) if x.ndim == 0 else x
    n = x.shape[-1]
    want = -(-n // b) * b
    return x if want == n else np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, want - n)], mode="wrap")


def _encode(cfg: str, x: np.ndarray) -> QTensor:
    scheme, params, _ = CONFIGS[cfg]
    return quantize(_fit(cfg, x), scheme, **params)


def _references(desc: dict[str, Any]) -> list[str]:
    names = [desc["codes"]["tensor"]]
    if "table_tensor" in desc["codes"]["element"]:
        names.append(desc["codes"]["element"]["table_tensor"])
    for role in ("zero", "scale", "bias"):
        p = desc.get(role)
        if p is not None:
            names += [p["tensor"]] if "tensor" in p else _references(p["encoded"])
    return names


# -- registry ---------------------------------------------------------------------------------
def test_registry_ids_equal_table_keys() -> None:
    assert ids() == sorted(tables.schemes())


def test_every_scheme_has_a_config() -> None:
    assert {scheme for scheme, _, _ in CONFIGS.values()} == set(ids())


@pytest.mark.parametrize("scheme", ids())
def test_encoder_signature_matches_table(scheme: str) -> None:
    params = list(inspect.signature(get(scheme)).parameters)
    assert params[0] == "x"
    assert sorted(params[1:]) == sorted(tables.schemes()[scheme]["parameters"])


# -- descriptors and shapes ----------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_descriptor_and_decode(cfg: str, shape: tuple[int, ...]) -> None:
    scheme, params, _ = CONFIGS[cfg]
    x = _fit(cfg, _input(shape))
    shape = x.shape
    qt = quantize(x, scheme, **params)
    desc = qt.descriptor
    jsonschema.Draft202012Validator(tables.schema()).validate({"version": "1.0", "tensors": {"w": desc}})
    assert desc["scheme"] == scheme
    assert desc["shape"] == list(shape)
    assert desc["codes"]["packing"] == {"container": 8, "bit_order": "lsb_first", "axis": len(shape) - 1 if shape else None}
    if scheme == "gguf":  # the nested K-quant scales are packed the same way
        for role in ("scale", "bias"):
            if "encoded" in desc.get(role, {}):
                assert desc[role]["encoded"]["codes"]["packing"] == desc["codes"]["packing"]
    refs = _references(desc)
    assert sorted(refs) == sorted(qt.components), "every component referenced exactly once"
    want = np.dtype(params.get("dtype", "float32")) if params.get("dtype") != "bfloat16" else np.dtype(ml_dtypes.bfloat16)
    y = qt.dequantize()
    assert y.shape == shape and y.dtype == want and qt.dtype == want
    assert np.isfinite(y.astype(np.float64)).all()


@pytest.mark.parametrize(("src", "want"), [(np.float16, np.float16), (np.float32, np.float32),
                                           (np.float64, np.float32), (ml_dtypes.bfloat16, ml_dtypes.bfloat16)])
def test_default_dtype_follows_input(src: Any, want: Any) -> None:
    qt = quantize(_input((3, 8)).astype(src), "mxfp4")
    assert qt.descriptor["dtype"] == np.dtype(want).name and qt.dequantize().dtype == np.dtype(want)


def test_eight_bit_codes_keep_natural_dtypes() -> None:
    x = _input((4, 40))
    assert quantize(x, "int", bits=8).components["codes"].dtype == np.int8
    assert quantize(x, "int", bits=8, symmetric=False).components["codes"].dtype == np.uint8
    assert quantize(x, "mxint8").components["codes"].dtype == np.int8
    assert quantize(x, "fp8_e4m3").components["codes"].dtype == ml_dtypes.float8_e4m3fn
    assert quantize(x, "mxfp8_e5m2").components["codes"].dtype == ml_dtypes.float8_e5m2
    assert quantize(x, "mxfp4").components["scale"].dtype == ml_dtypes.float8_e8m0fnu
    assert quantize(x, "nvfp4").components["scale.codes"].dtype == ml_dtypes.float8_e4m3fn
    assert quantize(x, "int", scale_dtype="bfloat16").components["scale"].dtype == ml_dtypes.bfloat16


# -- error bounds ----------------------------------------------------------------------------
def _per_element(qt: QTensor, role: str) -> np.ndarray:
    """A parameter's binary32 values broadcast to the logical shape (float64)."""
    desc, comps, shape = qt.descriptor, qt.components, qt.shape
    p = desc[role]
    if "tensor" in p:
        vals = comps[p["tensor"]].astype(np.float32).astype(np.float64)
    else:
        vals = QTensor(p["encoded"], comps).dequantize().astype(np.float32).astype(np.float64)
    b = p["blocks"]
    if b["type"] == "flat":
        return np.repeat(vals.reshape(-1), b["size"])[: math.prod(shape)].reshape(shape)
    grid = [1 if s is None else -(-n // s) for n, s in zip(shape, b["size"])]
    v = vals.reshape(grid)
    for a, s in enumerate(b["size"]):
        v = np.repeat(v, shape[a] if s is None else s, axis=a)[(slice(None),) * a + (slice(0, shape[a]),)]
    return v


def _slack(x: np.ndarray, d: np.ndarray, dtype: str) -> np.ndarray:
    """Rounding of the binary32 product plus the cast to the logical dtype."""
    rel, absolute = _OUT[dtype]
    return np.maximum(np.abs(x), np.abs(d)) * (2.0**-23 + rel) + absolute + 2.0**-149


def _outside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, np.maximum(lo - x, x - hi))


def _bound_int(qt: QTensor, x: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    bits = params.get("bits", 4)
    sdt = params.get("scale_dtype", "float16")
    s = _per_element(qt, "scale")
    z = _per_element(qt, "zero") if "zero" in qt.descriptor else np.zeros(x.shape)
    if params.get("symmetric", True):
        q = np.array([-(2 ** (bits - 1)), 2 ** (bits - 1) - 1], np.float64)
        # Largest candidate m = 2^(b-1) + 1/2 maps the extreme value to -m: the other sign's
        # values, up to amax, then clip at 2^(b-1) - 1, at most 3/2 of a step away.
        clip_allow = 1.5 + (2 ** (bits - 1) + 1) * _SCALE_EPS[sdt]
    else:
        q = np.stack([-z, 2**bits - 1 - z])
        clip_allow = 0.5 + 2**bits * _SCALE_EPS[sdt]  # zero point rounding and scale rounding
    ends = q[0] * s, q[1] * s
    out = _outside(x, np.minimum(*ends), np.maximum(*ends))
    # Clipping is bounded by the candidate set wherever the stored scale is a normal number.
    normal = np.abs(s) >= _SCALE_MIN_NORMAL[sdt]
    assert (out[normal] <= clip_allow * np.abs(s[normal]) * (1 + 2.0**-20)).all()
    # Half a step, or a whole one where the nearest code would decode to Inf in the logical
    # dtype (values within a step of its max): the encoder then takes the next code in.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        near = np.clip(np.rint(np.where(s != 0, x / np.where(s != 0, s, 1.0), 0.0) + z), q[0] + z, q[1] + z)
        dec = (((near - z) * s).astype(np.float32)).astype(qt.dtype)
    step = np.where(np.isfinite(dec.astype(np.float64)), 0.5, 1.0) * np.abs(s)
    return np.where(out > 0, out, step)


def _float_bound(x: np.ndarray, s: np.ndarray, fmt: str) -> np.ndarray:
    """|x - E(x/s) * s| for a round-to-nearest, saturating element format with max fmax."""
    f = tables.float_formats()[fmt]
    m, emin, fmax = f["mantissa_bits"], 1 - f["bias"], f["max"]
    ok = s > 0
    y = np.abs(x) / np.where(ok, s, 1.0)
    e = np.maximum(np.frexp(np.minimum(y, fmax))[1] - 1, emin)
    half_ulp = np.ldexp(s, e - m - 1)
    return np.where(ok, half_ulp + np.maximum(0.0, np.abs(x) - fmax * s), np.abs(x))


def _bound_nf4(qt: QTensor, x: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    a = _per_element(qt, "scale")
    table = tables.codebook_values("nf4").astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.clip(np.where(a != 0, x / np.where(a != 0, a, 1.0), 0.0), -1, 1)
    k = np.clip(np.searchsorted(table, y), 1, 15)
    half_gap = (table[k] - table[k - 1]) / 2
    b = np.abs(a) * (half_gap + 2.0**-22) + np.maximum(0.0, np.abs(x) - np.abs(a))
    if params.get("double_quant"):
        # The decoded absmax is within half a nested step of the true absmax.
        bs = params.get("block_size", 64)
        flat = np.abs(x.astype(np.float32).astype(np.float64)).reshape(-1)
        nb = -(-flat.size // bs)
        amax = np.max(np.pad(flat, (0, nb * bs - flat.size)).reshape(nb, bs), axis=1, initial=0.0)
        s2 = np.repeat(qt.components["scale.scale"].astype(np.float64), 256)[:nb]
        got = qt.descriptor["scale"]["encoded"]
        decoded = QTensor(got, qt.components).dequantize().astype(np.float64)
        mean = float(qt.components["scale.bias"])
        with np.errstate(over="ignore"):
            near = np.clip(np.rint((amax.astype(np.float32) - np.float32(mean)) / s2), -127, 127)
            near_abs = ((near * s2).astype(np.float32) + np.float32(mean)).astype(qt.dtype)
            finite = np.isfinite(near_abs.astype(np.float64))
        # Half a nested step (a whole one where the nearest would overflow the logical dtype).
        allow = np.where(finite, 0.5, 1.0) * s2
        assert (np.abs(decoded - amax) <= allow * (1 + 2.0**-20) + np.abs(amax) * 2.0**-22 + 2.0**-149).all()
    return np.where(np.abs(a) < 1e-38, np.maximum(b, np.abs(x)), b)


def _bound_codebook(qt: QTensor, x: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    table = np.asarray(params["values"], np.float32).astype(np.float64)
    s = _per_element(qt, "scale") if "scale" in qt.descriptor else np.ones(x.shape)
    with np.errstate(over="ignore"):
        dec = (table * s[..., None]).astype(np.float32).astype(qt.dtype).astype(np.float64)
    return np.min(np.abs(dec - x[..., None]), axis=-1, initial=np.inf)


def _bound_gguf(qt: QTensor, x: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """The distance from x to the nearest value the block can decode to (codes times the
    element's scale, plus or minus its bias), plus what choosing the code differently allows:
    K-quants pick the nearest code of the stored (F16-derived) scale and minimum, up to the
    binary32 rounding of (x + m) / s; the 32-element types pick it with the binary32 scale
    before its F16 rounding (relative 2^-11, or 2^-25 absolute where F16 is subnormal), so the
    chosen code may decode up to twice that times qmax (and the minimum's) farther than the
    nearest one."""
    desc = qt.descriptor
    s = _per_element(qt, "scale")
    b = _per_element(qt, "bias") if "bias" in desc else np.zeros(x.shape)
    sign = -1.0 if desc.get("bias", {}).get("op") == "subtract" else 1.0
    el = desc["codes"]["element"]
    bits = el["bits"]
    lo, hi = {"unsigned": (0, 2**bits - 1), "twos_complement": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1),
              "offset_binary": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)}[el["signedness"]]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(np.where(s != 0, (x - sign * b) / np.where(s != 0, s, 1.0), 0.0)), lo, hi)
    near = np.full(x.shape, np.inf)
    for dq in (-1, 0, 1):  # the nearest code is the rounded one or a neighbour (float64 rounding)
        qq = np.clip(q + dq, lo, hi)
        near = np.minimum(near, np.abs((qq * s).astype(np.float32).astype(np.float64) + sign * b - x))
    qmax = max(abs(lo), abs(hi))
    if params["type"].endswith("_K"):
        allow = (np.abs(x) + np.abs(b)) * 2.0**-20
    else:  # F16 rounds the scale by at most max(|s| 2^-11, 2^-25) (its subnormal step is 2^-24)
        allow = 2 * qmax * (np.abs(s) * 2.0**-11 + 2.0**-25) + 2 * (np.abs(b) * 2.0**-11 + 2.0**-25) + np.abs(x) * 2.0**-20
    return near + allow


def _bound(cfg: str, qt: QTensor, x: np.ndarray) -> np.ndarray:
    scheme, params, _ = CONFIGS[cfg]
    if scheme == "gguf":
        return _bound_gguf(qt, x, params)
    if scheme == "int":
        return _bound_int(qt, x, params)
    if scheme == "nf4":
        return _bound_nf4(qt, x, params)
    if scheme == "codebook":
        return _bound_codebook(qt, x, params)
    s = _per_element(qt, "scale")
    if scheme.startswith("fp8"):
        fmt = qt.descriptor["codes"]["element"]["format"]
        assert (np.abs(x) <= tables.float_formats()[fmt]["max"] * s * (1 + 2.0**-20)).all(), "fp8 scales never clip"
        return _float_bound(x, s, fmt)
    if scheme == "mxint8":
        step = s / 64
        return np.where(np.abs(x) > 127 * step, np.abs(x) - 127 * step, step / 2)
    return _float_bound(x, s, qt.descriptor["codes"]["element"]["format"])


def _check_bound(cfg: str, x: np.ndarray) -> None:
    x = _fit(cfg, x)
    qt = _encode(cfg, x)
    x64 = x.astype(np.float64)
    d = qt.dequantize().astype(np.float64)
    bound = _bound(cfg, qt, x64) + _slack(x64, d, qt.descriptor["dtype"])
    err = np.abs(d - x64)
    if not (err <= bound).all():  # NaN fails too
        i = tuple(int(v) for v in np.argwhere(~(err <= bound))[0])
        pytest.fail(f"{cfg}: error {err[i]!r} > bound {bound[i]!r} at {i} (x={x64[i]!r}, decoded={d[i]!r})")


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_error_bound(cfg: str) -> None:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(float_arrays(CONFIGS[cfg][2]))
    def check(x: np.ndarray) -> None:
        _check_bound(cfg, x)

    check()


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_error_bound_wide_dynamic_range(cfg: str) -> None:
    # Blocks whose magnitudes differ by many orders, plus zeros and exact ties.
    x = _input((6, 70), seed=3)
    x[0, :20] = 0.0
    x[1] = np.arange(70, dtype=np.float32) * 0.25 - 8
    x = np.clip(x, -CONFIGS[cfg][2], CONFIGS[cfg][2])
    _check_bound(cfg, x)


@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16, np.float64], ids=["f16", "bf16", "f64"])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_error_bound_other_input_dtypes(cfg: str, src: Any) -> None:
    _check_bound(cfg, _input((3, 50), seed=11).astype(src))


_EXTREMES = {
    "f16-max": np.array([65504, -65504, 65000, 1, 0, -3e-8, 6e-8], np.float16),
    "bf16-max": np.array([3.3895e38, -3.38e38, 1, 0, 1e-40], ml_dtypes.bfloat16),
    "f32-max": np.array([3.4028235e38, -3.4028235e38, 3.4e38, 1, 0, 1e-45], np.float32),
    "f32-subnormal": np.array([1e-45, -1e-45, 3e-45, 0, 1.2e-38], np.float32),
}


@pytest.mark.parametrize("case", list(_EXTREMES))
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_error_bound_at_dtype_extremes(cfg: str, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Values at the logical dtype's largest and smallest magnitudes (logical dtype = input's).
    scheme, params, top = CONFIGS[cfg]
    monkeypatch.setitem(CONFIGS, cfg, (scheme, {k: v for k, v in params.items() if k != "dtype"}, top))
    base = _EXTREMES[case]
    for x in (base, base[::-1].copy(), np.tile(base, 40)):
        try:
            _check_bound(cfg, x)
        except QFormatError as e:  # float16 scales cannot hold max / 7 (int) or the block's F16 parameters overflow (gguf)
            assert (scheme == "int" and e.code == "ENCODE_PARAM_INVALID" and "scale_dtype" in str(e)) or \
                (scheme == "gguf" and e.code == "ENCODE_INPUT_INVALID" and "overflow" in str(e)), str(e)


def test_int_chunking_does_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from qformat.schemes import int_

    x = _input((40, 70), seed=2)
    for params in ({}, {"symmetric": False, "axis": 0, "group_size": 3}):
        whole = quantize(x, "int", **params).components
        monkeypatch.setattr(int_, "CHUNK_ELEMENTS", 100)
        chunked = quantize(x, "int", **params).components
        monkeypatch.undo()
        assert all(np.array_equal(whole[k], chunked[k]) for k in whole)


@pytest.mark.parametrize("shape", [(7, 45), (), (0, 3)], ids=["7x45", "scalar", "0x3"])
@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_saved_file_checks_clean_and_decodes_the_same(cfg: str, shape: tuple[int, ...], tmp_path: Any) -> None:
    import qformat

    qt = _encode(cfg, _input(shape))
    path = tmp_path / "q.safetensors"
    qformat.save_file({"w": qt}, path)
    report = qformat.check(path)
    assert report.ok, [(p.code, p.message) for p in report.problems]
    got, want = qformat.load_file(path)["w"], qt.dequantize()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_int_symmetric_at_least_as_good_as_q4_0_choice_per_group() -> None:
    # Per group of 32 the chosen scale's squared error is <= the Q4_0 scale's (d = x_ext / -8).
    x = _input((16, 96), seed=5)
    qt = quantize(x, "int")
    d = qt.dequantize().astype(np.float64)
    g = x.reshape(-1, 32).astype(np.float64)
    ext = np.take_along_axis(g, np.abs(g).argmax(axis=1)[:, None], axis=1)
    s = (ext / -8).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.trunc(g / s + 8.5), 0, 15) - 8
    ref = (q * s).astype(np.float32).astype(np.float64)
    ours = ((d.reshape(-1, 32) - g) ** 2).sum(axis=1)
    assert (ours <= ((ref - g) ** 2).sum(axis=1)).all()


# -- errors ----------------------------------------------------------------------------------
def _raises(code: str, fn: Any, *args: Any, **kw: Any) -> QFormatError:
    with pytest.raises(QFormatError) as info:
        fn(*args, **kw)
    assert info.value.code == code, str(info.value)
    return info.value


@pytest.mark.parametrize("scheme", ids())
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("in_dtype", ["float32", "float16", "bfloat16", "float64"])
def test_nonfinite_input_rejected(scheme: str, bad: float, in_dtype: str) -> None:
    x = _input((3, 8)).astype(ml_dtypes.bfloat16 if in_dtype == "bfloat16" else in_dtype)
    x[1, 5] = bad
    x[2, 0] = bad
    params = {"values": CB16} if scheme == "codebook" else {}
    err = _raises("ENCODE_INPUT_INVALID", quantize, x, scheme, **params)
    assert "2 NaN or Inf" in str(err) and "(1, 5)" in str(err)


@pytest.mark.parametrize("x", [np.arange(6), np.ones(3, np.complex64), np.array(["a"]), np.ones(2, bool), [1, 2]],
                         ids=["int", "complex", "str", "bool", "int-list"])
def test_non_float_input_rejected(x: Any) -> None:
    _raises("ENCODE_INPUT_INVALID", quantize, x, "int")


def test_value_beyond_logical_dtype_rejected() -> None:
    err = _raises("ENCODE_INPUT_INVALID", quantize, np.array([1.0, 1e6], np.float32), "fp8_e4m3", dtype="float16")
    assert "float16" in str(err) and "(1,)" in str(err)
    _raises("ENCODE_INPUT_INVALID", quantize, np.array([1e300]), "mxfp4")
    # the extremes decide: float16's largest value and what rounds to it pass, 65520 does not
    # (also from bfloat16 input, whose range check works on the bits; also the negative end)
    quantize(np.array([65504.0, -65519.99], np.float32), "int", dtype="float16")
    err = _raises("ENCODE_INPUT_INVALID", quantize, np.array([1.0, -65520.0], np.float32), "int", dtype="float16")
    assert "(1,)" in str(err)
    err = _raises("ENCODE_INPUT_INVALID", quantize, np.array([1.0, 2.0, -70144.0], ml_dtypes.bfloat16), "int", dtype="float16")
    assert "1 that overflow" in str(err) and "(2,)" in str(err)
    quantize(np.array([1.0, -65280.0], ml_dtypes.bfloat16), "int", dtype="float16")
    _raises("ENCODE_INPUT_INVALID", quantize, np.array([3.4e38, 1.0]), "int", dtype="bfloat16")


@pytest.mark.parametrize("scheme", ["nope", "INT", "", None, 3])
def test_unknown_scheme(scheme: Any) -> None:
    _raises("SCHEME_UNKNOWN", quantize, np.ones(4, np.float32), scheme)


@pytest.mark.parametrize(("scheme", "params", "name"), [
    ("int", {"bitz": 4}, "bitz"),
    ("int", {"bits": 1}, "bits"),
    ("int", {"bits": 9}, "bits"),
    ("int", {"bits": 4.0}, "bits"),
    ("int", {"bits": True}, "bits"),
    ("int", {"group_size": 0}, "group_size"),
    ("int", {"group_size": -32}, "group_size"),
    ("int", {"axis": 2}, "axis"),
    ("int", {"axis": -3}, "axis"),
    ("int", {"symmetric": 1}, "symmetric"),
    ("int", {"scale_dtype": "float64"}, "scale_dtype"),
    ("int", {"dtype": "float64"}, "dtype"),
    ("int", {"dtype": "int8"}, "dtype"),
    ("nf4", {"block_size": 0}, "block_size"),
    ("nf4", {"double_quant": "yes"}, "double_quant"),
    ("nf4", {"group_size": 64}, "group_size"),
    ("fp8_e4m3", {"granularity": "row"}, "granularity"),
    ("fp8_e4m3", {"block_size": []}, "block_size"),
    ("fp8_e4m3", {"block_size": [128, 0]}, "block_size"),
    ("fp8_e5m2", {"axis": 5}, "axis"),
    ("mxfp4", {"block_size": 0}, "block_size"),
    ("mxfp4", {"bits": 4}, "bits"),
    ("nvfp4", {"block_size": 16}, "block_size"),
    ("codebook", {}, "values"),
    ("codebook", {"values": []}, "values"),
    ("codebook", {"values": list(range(257))}, "values"),
    ("codebook", {"values": [[1.0, 2.0]]}, "values"),
    ("codebook", {"values": [1.0, float("nan")]}, "values"),
    ("codebook", {"values": [1.0, 1e39]}, "values"),
    ("codebook", {"values": [0.0, 0.0]}, "values"),
    ("codebook", {"values": [1.0], "block_size": 0}, "block_size"),
])
def test_bad_params(scheme: str, params: dict[str, Any], name: str) -> None:
    err = _raises("ENCODE_PARAM_INVALID", quantize, _input((3, 8)), scheme, **params)
    assert name in str(err) and err.field == name
    if name in params and name not in ("values", "block_size"):  # those name the bad item
        assert repr(params[name]) in str(err) or "no parameter" in str(err)


def test_scale_dtype_too_narrow_is_a_param_error() -> None:
    err = _raises("ENCODE_PARAM_INVALID", quantize, np.array([1e30, 1.0], np.float32), "int")
    assert "scale_dtype" in str(err)


# -- independent checks of MX and NVFP4 bytes against ml_dtypes casts ------------------------
_ML = {"e2m1fn": ml_dtypes.float4_e2m1fn, "e2m3fn": ml_dtypes.float6_e2m3fn, "e3m2fn": ml_dtypes.float6_e3m2fn,
       "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_EMAX = {"e2m1fn": 2, "e2m3fn": 2, "e3m2fn": 4, "e4m3fn": 8, "e5m2": 15, "int8": 0}


def _codes(qt: QTensor, bits: int) -> np.ndarray:
    c = qt.components["codes"]
    if bits == 8:
        return c.view(np.uint8)
    p = Packing.from_dict(qt.descriptor["codes"]["packing"])
    return unpack_rows(c, bits, p, qt.shape[-1])


def _floor_log2(a: np.ndarray) -> np.ndarray:
    e = np.floor(np.log2(a))
    e = np.where(2.0**e > a, e - 1, e)
    return np.where(2.0 ** (e + 1) <= a, e + 1, e)


def _mx_data(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((9, 100)) * np.exp2(rng.integers(-20, 20, (9, 1)))
    x[0, 40:64] = 0.0  # an all-zero block
    x[1, :32] = np.linspace(-6, 6, 32)  # exact element values and ties
    return x.astype(np.float32)


@pytest.mark.parametrize("scheme", ["mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2", "mxint8"])
@pytest.mark.parametrize("seed", [0, 1])
def test_mx_bytes_match_ml_dtypes(scheme: str, seed: int) -> None:
    x = _mx_data(seed)
    qt = quantize(x, scheme)
    fmt = {"mxfp4": "e2m1fn", "mxfp6_e2m3": "e2m3fn", "mxfp6_e3m2": "e3m2fn", "mxfp8_e4m3": "e4m3fn",
           "mxfp8_e5m2": "e5m2", "mxint8": "int8"}[scheme]
    x64 = x.astype(np.float64)
    padded = np.pad(np.abs(x64), ((0, 0), (0, 28))).reshape(9, 4, 32)
    amax = padded.max(axis=2)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.clip(_floor_log2(amax) - _EMAX[fmt], -127, 127), -127)
    assert np.array_equal(qt.components["scale"].view(np.uint8), (e + 127).astype(np.uint8))
    y = x64 / np.repeat(2.0**e, 32, axis=1)[:, :100]
    if fmt == "int8":
        want = np.clip(np.round(y * 64), -127, 127).astype(np.int8).view(np.uint8)
        assert np.array_equal(qt.components["codes"].view(np.uint8), want)
        return
    fmax = tables.float_formats()[fmt]["max"]
    bits = tables.float_formats()[fmt]["bits"]
    want = np.clip(y, -fmax, fmax).astype(_ML[fmt]).view(np.uint8) & ((1 << bits) - 1)
    want[want == 1 << (bits - 1)] = 0  # a value that rounds to zero is written +0 (issue 24)
    assert np.array_equal(_codes(qt, bits), want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_bytes_match_ml_dtypes(seed: int) -> None:
    x = _mx_data(seed)
    qt = quantize(x, "nvfp4")
    c = qt.components
    g = np.float32(np.abs(x).max()) / np.float32(6 * 448)
    assert c["scale.scale"].shape == () and c["scale.scale"] == g
    bam = np.pad(np.abs(x), ((0, 0), (0, 12))).reshape(9, 7, 16).max(axis=2).astype(np.float64)
    v = np.where(bam > 0, np.clip(bam / (6 * np.float64(g)), 2.0**-9, 448), 0)
    e4 = v.astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(c["scale.codes"].view(np.uint8), e4.view(np.uint8))
    s = e4.astype(np.float32) * g  # binary32 product, as a reader computes it
    assert s.dtype == np.float32
    s_el = np.repeat(s.astype(np.float64), 16, axis=1)[:, :100]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(s_el > 0, x.astype(np.float64) / s_el, 0)
    want = np.clip(y, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    want[want == 8] = 0  # a value that rounds to zero is written +0 (issue 24)
    assert np.array_equal(_codes(qt, 4), want)
    d = qt.dequantize()
    assert np.array_equal(d, (want.view(ml_dtypes.float4_e2m1fn).astype(np.float32) * s_el.astype(np.float32)))


def test_fp8_bytes_match_ml_dtypes() -> None:
    x = _mx_data(4)
    for scheme, dt, fmax in (("fp8_e4m3", ml_dtypes.float8_e4m3fn, 448.0), ("fp8_e5m2", ml_dtypes.float8_e5m2, 57344.0)):
        qt = quantize(x, scheme)
        assert np.array_equal(qt.components["scale"], np.abs(x).max(axis=1, keepdims=True) / np.float32(fmax))
        s = qt.components["scale"].astype(np.float64)
        y = x.astype(np.float64) / s
        want = np.clip(y, -fmax, fmax).astype(dt)
        assert np.array_equal(qt.components["codes"].view(np.uint8), want.view(np.uint8))


# -- planners: every registered scheme says what it writes without encoding ---------------------
_PLAN_PARAMS = {
    "int": [{}, {"bits": 3, "group_size": 16}, {"bits": 8, "group_size": None}, {"symmetric": False, "scale_dtype": "bfloat16"},
            {"bits": 5, "axis": 0, "group_size": 7}],
    "nf4": [{}, {"block_size": 48, "double_quant": True}, {"block_size": 300, "double_quant": True}],
    "fp8_e4m3": [{}, {"granularity": "tensor"}, {"granularity": "block", "block_size": [4, 8]}],
    "fp8_e5m2": [{}, {"granularity": "block", "block_size": 16}],
    "codebook": [{"values": [-1.0, 0.0, 0.5, 1.0]}, {"values": list(range(5)), "block_size": None}],
    "gguf": [{"type": t} for t in GGUF_TYPES],
}


@pytest.mark.parametrize("scheme", qformat.schemes.ids())
@pytest.mark.parametrize("shape", [(37,), (3, 37), (2, 5, 33), (64, 128)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_equals_what_the_encoder_writes(scheme, shape, dtype):
    """The planner registered with each encoder (used to plan whole-checkpoint headers before
    encoding) gives exactly the encoder's descriptor and component dtypes and shapes."""
    from qformat.dtypes import storage_name

    if scheme == "gguf":  # whole super-blocks only
        shape = shape[:-1] + (-(-shape[-1] // 256) * 256,)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    for params in _PLAN_PARAMS.get(scheme, [{}]):
        if scheme == "fp8_e4m3" and params.get("granularity") == "block" and len(shape) < 2:
            continue
        q = qformat.quantize(x, scheme, dtype=dtype, **params)
        desc, comps = qformat.schemes.plan(shape, scheme, dtype, **params)
        assert desc == q.descriptor, (scheme, params)
        assert comps == {k: (storage_name(a.dtype), tuple(a.shape)) for k, a in q.components.items()}, (scheme, params)


def test_plan_refuses_what_quantize_refuses():
    for scheme, params in [("no_such", {}), ("int", {"nope": 1}), ("int", {"bits": 99}), ("nf4", {"block_size": 0})]:
        with pytest.raises(qformat.QFormatError) as a:
            qformat.quantize(np.ones((4, 64), np.float32), scheme, **params)
        with pytest.raises(qformat.QFormatError) as b:
            qformat.schemes.plan((4, 64), scheme, "float32", **params)
        assert a.value.code == b.value.code, (scheme, params)


def _codes_by_hand(r: np.ndarray, fmt: str) -> np.ndarray:
    """Bit patterns of values already representable in ``fmt`` (sign kept, -0 too), from the
    format's fields in tables/float_formats.json: the transcription cast_codes must equal."""
    spec = tables.float_formats()[fmt]
    ne, m, bias = int(spec["exponent_bits"]), int(spec["mantissa_bits"]), int(spec["bias"])
    a = np.abs(r)
    normal = a >= 2.0 ** (1 - bias)
    e = np.frexp(a)[1] - 1
    ex = np.where(normal, e + bias, 0)
    man = np.where(normal, np.ldexp(a, m - e) - 2**m, np.ldexp(a, m - (1 - bias)))
    return ((np.signbit(r).astype(np.int64) << (ne + m)) | (ex.astype(np.int64) << m) | np.rint(man).astype(np.int64)).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["e2m1fn", "e2m3fn", "e3m2fn", "e4m3fn", "e5m2"])
def test_cast_codes_equals_rounding_by_hand(fmt):
    """The encoders' one ml_dtypes cast (clip, round half to even) gives the codes of the
    by-hand binary64 rounding (round_float), on every float32 sign/exponent/high-mantissa
    pattern (with low bits around the halfway points) and on float64 ties and their neighbours."""
    from qformat.schemes._common import cast_codes, round_float

    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    f32 = (hi[:, None] | low[None, :]).reshape(-1).view(np.float32)
    f32 = f32[np.isfinite(f32)]
    fmax = float(tables.float_formats()[fmt]["max"])
    rng = np.random.default_rng(0)
    grid = np.ldexp(rng.integers(-64, 64, 1 << 16).astype(np.float64), rng.integers(-12, 4, 1 << 16))
    f64 = np.concatenate([grid, grid + 2.0**-40, grid - 2.0**-40, rng.standard_normal(1 << 16) * fmax])
    for y in (f32, f64):
        want = _codes_by_hand(round_float(y, fmt), fmt)
        got = cast_codes(y, fmt)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (fmt, y.dtype, y[bad[:5]], got[bad[:5]], want[bad[:5]])
