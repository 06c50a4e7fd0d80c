"""Corpus cases for the device layouts of version 1.1 (SPEC.md §11): every named layout and
parameter value, grouped and per-channel scales, and one failing case per constraint.

Device tensors are built field by field by conformance/spec_reference.py (``device_codes``,
``device_scales``) from SPEC.md §11.3 / §11.4, and expected outputs are decoded by its
``to_canonical`` + ``decode``: no qformat code is involved.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import case, valid, values
from .cases_errors import M, base, delf, setf

L11 = ["11.1", "11.2"]
TG, MA = "tinygemm_int4_cuda", "marlin_dense"
PK32 = {"container": 32, "bit_order": "lsb_first", "axis": 1}


def layout_file(rng: np.random.Generator, name: str, params: dict, shape: tuple[int, int], b: int, group: int | None,
                bias: bool = False, dtype: str = "bfloat16", sdt: Any = ml_dtypes.bfloat16, code_dtype: Any = np.int32):
    """(descs, comps, plain): logical 'w' [N, K] in layout ``name`` with a scale [K/G, N]
    (order [1, 0]) and, for tinygemm, an optional additive bias with the same blocks."""
    n, k = shape
    q = rng.integers(0, 1 << b, size=shape)
    kg = 1 if group is None else -(-k // group)
    s = values(rng, (kg, n), sdt)
    desc: dict[str, Any] = {
        "shape": [n, k], "dtype": dtype,
        "codes": {"tensor": "w.codes", "element": {"type": "int", "bits": b, "signedness": "offset_binary"}, "packing": dict(PK32)},
        "scale": {"blocks": {"type": "grid", "size": [1, group]}, "op": "multiply", "tensor": "w.scale", "order": [1, 0]},
        "layout": {"name": name, "parameters": dict(params)},
    }
    comps: dict[str, Any] = {"w.codes": R.device_codes(name, params, q, b).view(code_dtype)}
    comps["w.scale"] = R.device_scales(s, group is not None and group < k) if name == MA else s
    if bias:
        desc["bias"] = {"blocks": {"type": "grid", "size": [1, group]}, "op": "add", "tensor": "w.bias", "order": [1, 0]}
        comps["w.bias"] = values(rng, (kg, n), sdt)
    return {"w": desc}, comps, {"b": rng.normal(size=3).astype(np.float32)}


# -- valid: every layout and parameter ------------------------------------------------------------
for _t, _shape, _g, _bias in ((2, (8, 64), 32, False), (4, (16, 128), 64, True), (8, (8, 256), 256, True), (2, (24, 32), 32, True)):
    @case(f"layout-tinygemm-t{_t}-{_shape[0]}x{_shape[1]}-g{_g}", f"tinygemm_int4_cuda, inner_k_tiles {_t}, [N, K] = {list(_shape)}, bf16 scale per {_g}"
          + (" and additive bias (tinygemm's float zero)" if _bias else ""), ["11.3"] + L11, ["layout", f"layout:{TG}"])
    def _(rng, t=_t, shape=_shape, g=_g, bias=_bias):
        descs, comps, plain = layout_file(rng, TG, {"inner_k_tiles": t}, shape, 4, g, bias=bias)
        return valid(descs, comps, plain, version="1.1")


for _b, _g, _dt in ((4, 32, "float16"), (4, 64, "bfloat16"), (4, 128, "float32"), (4, None, "bfloat16"), (8, 64, "float16"), (8, None, "bfloat16")):
    _k = 256 if _g == 128 else 128
    @case(f"layout-marlin-b{_b}-g{_g or 'channel'}", f"marlin_dense, {_b}-bit, [N, K] = [64, {_k}], scale "
          + ("per output channel (runs of 32)" if _g is None else f"per {_g} along K (runs of 64)"), ["11.4"] + L11, ["layout", f"layout:{MA}"])
    def _(rng, b=_b, g=_g, dt=_dt, k=_k):
        descs, comps, plain = layout_file(rng, MA, {}, (64, k), b, g, dtype=dt, sdt=np.float16)
        return valid(descs, comps, plain, version="1.1")


@case("layout-marlin-group-equals-k", "marlin_dense with a group of 128 = K: the per-channel scale permutation (runs of 32) applies", ["11.4"] + L11,
      ["layout", f"layout:{MA}"])
def _(rng):
    descs, comps, plain = layout_file(rng, MA, {}, (64, 128), 4, 128, sdt=np.float16, code_dtype=np.uint32)
    return valid(descs, comps, plain, version="1.1")


# -- failing: forbidden, unknown by version, parameters, each constraint --------------------------
def TGF(shape=(8, 64), t=2, g=32, bias=False):
    return lambda rng: layout_file(rng, TG, {"inner_k_tiles": t}, shape, 4, g, bias=bias)


def MAF(shape=(64, 128), b=4, g=32):
    return lambda rng: layout_file(rng, MA, {}, shape, b, g, sdt=np.float16)


E = ["layout", "descriptor"]
_CASES = [
    ("invalid-layout-tinygemm-cpu-forbidden", "the descriptor declares torch's CPU int4pack layout 'tinygemm_int4_cpu' (bytes depend on the CPU's instruction set): LAYOUT_FORBIDDEN",
     ["11.5"], "LAYOUT_FORBIDDEN", TGF((16, 64)), [setf("layout", {"name": "tinygemm_int4_cpu", "parameters": {}})], "1.1"),
    ("unsupported-layout-tinygemm-cpu-in-1.0-file", "a 1.0 file names 'tinygemm_int4_cpu', which version 1.0 does not define: LAYOUT_UNKNOWN (as a 1.0 reader reports)",
     ["11.1", "3.4"], "LAYOUT_UNKNOWN", TGF((16, 64)), [setf("layout", {"name": "tinygemm_int4_cpu"})], "1.0"),
    ("unsupported-layout-tinygemm-in-1.0-file", "a 1.0 file uses 'tinygemm_int4_cuda', defined from 1.1: LAYOUT_UNKNOWN",
     ["11.1", "3.4"], "LAYOUT_UNKNOWN", TGF(), [], "1.0"),
    ("unsupported-layout-marlin-in-1.0-file", "a 1.0 file uses 'marlin_dense', defined from 1.1: LAYOUT_UNKNOWN",
     ["11.1", "3.4"], "LAYOUT_UNKNOWN", MAF(), [], "1.0"),
    ("invalid-layout-tinygemm-inner-k-tiles-3", "tinygemm_int4_cuda with inner_k_tiles 3 (allowed: 2, 4, 8): LAYOUT_INVALID",
     ["11.1", "11.3"], "LAYOUT_INVALID", TGF(), [setf("layout.parameters.inner_k_tiles", 3)], "1.1"),
    ("invalid-layout-tinygemm-inner-k-tiles-missing", "tinygemm_int4_cuda without its required parameter inner_k_tiles: LAYOUT_INVALID",
     ["11.1", "11.3"], "LAYOUT_INVALID", TGF(), [setf("layout.parameters", {})], "1.1"),
    ("invalid-layout-marlin-unknown-parameter", "marlin_dense (no parameters) with parameters {'tile': 16}: LAYOUT_INVALID",
     ["11.1", "11.4"], "LAYOUT_INVALID", MAF(), [setf("layout.parameters", {"tile": 16})], "1.1"),
    ("unsupported-layout-tinygemm-inner-k-tiles-16-1.3", "a 1.3 file uses inner_k_tiles 16 (a value a newer minor may add): FEATURE_UNSUPPORTED",
     ["11.1", "3.4"], "FEATURE_UNSUPPORTED", TGF((8, 256)), [setf("layout.parameters.inner_k_tiles", 16)], "1.3"),
    ("invalid-layout-tinygemm-n-not-multiple-of-8", "tinygemm_int4_cuda with N = 12: LAYOUT_SHAPE",
     ["11.3"], "LAYOUT_SHAPE", TGF(), [setf("shape", [12, 64])], "1.1"),
    ("invalid-layout-tinygemm-k-not-multiple-of-16t", "tinygemm_int4_cuda, inner_k_tiles 4, with K = 96 (not a multiple of 64): LAYOUT_SHAPE",
     ["11.3"], "LAYOUT_SHAPE", TGF((8, 96)), [setf("layout.parameters.inner_k_tiles", 4)], "1.1"),
    ("invalid-layout-marlin-k-not-multiple-of-128", "marlin_dense with K = 192: LAYOUT_SHAPE",
     ["11.4"], "LAYOUT_SHAPE", MAF(), [setf("shape", [64, 192])], "1.1"),
    ("invalid-layout-marlin-n-not-multiple-of-64", "marlin_dense with N = 96: LAYOUT_SHAPE",
     ["11.4"], "LAYOUT_SHAPE", MAF(), [setf("shape", [96, 128])], "1.1"),
    ("invalid-layout-rank-3", "a device layout on a rank-3 logical shape: LAYOUT_SHAPE",
     ["11.1"], "LAYOUT_SHAPE", TGF(), [setf("shape", [2, 4, 64])], "1.1"),
    ("invalid-layout-tinygemm-group-16", "tinygemm_int4_cuda with a scale group of 16 (allowed: 32, 64, 128, 256): LAYOUT_GROUP_SIZE",
     ["11.3"], "LAYOUT_GROUP_SIZE", TGF(), [setf("scale.blocks.size", [1, 16])], "1.1"),
    ("invalid-layout-tinygemm-per-channel", "tinygemm_int4_cuda with a per-channel scale (group null): LAYOUT_GROUP_SIZE",
     ["11.3"], "LAYOUT_GROUP_SIZE", TGF(), [setf("scale.blocks.size", [1, None])], "1.1"),
    ("invalid-layout-marlin-group-16", "marlin_dense with a scale group of 16 (allowed: 32, 64, 128, per channel): LAYOUT_GROUP_SIZE",
     ["11.4"], "LAYOUT_GROUP_SIZE", MAF(), [setf("scale.blocks.size", [1, 16])], "1.1"),
    ("invalid-layout-marlin-unsigned-element", "marlin_dense with unsigned (not offset_binary) codes: LAYOUT_MISMATCH",
     ["11.1"], "LAYOUT_MISMATCH", MAF(), [setf("codes.element.signedness", "unsigned")], "1.1"),
    ("invalid-layout-tinygemm-8-bit", "tinygemm_int4_cuda with 8-bit codes: LAYOUT_MISMATCH",
     ["11.1", "11.3"], "LAYOUT_MISMATCH", TGF(), [setf("codes.element.bits", 8)], "1.1"),
    ("invalid-layout-packing-container-8", "a device layout whose packing has container 8 instead of the canonical 32: LAYOUT_MISMATCH",
     ["11.1"], "LAYOUT_MISMATCH", TGF(), [setf("codes.packing.container", 8)], "1.1"),
    ("invalid-layout-packing-slot-order", "a device layout whose packing has a slot_order: LAYOUT_MISMATCH",
     ["11.1"], "LAYOUT_MISMATCH", MAF(), [setf("codes.packing.slot_order", [0, 2, 4, 6, 1, 3, 5, 7])], "1.1"),
    ("invalid-layout-tinygemm-zero-point", "tinygemm_int4_cuda with a 'zero' parameter (tinygemm's zero is a bias): LAYOUT_MISMATCH",
     ["11.3"], "LAYOUT_MISMATCH", TGF(bias=True), [lambda d, c, p: d["w"].__setitem__("zero", d["w"].pop("bias")) or d["w"]["zero"].pop("op")], "1.1"),
    ("invalid-layout-tinygemm-bias-blocks", "tinygemm_int4_cuda whose bias blocks differ from the scale's: LAYOUT_MISMATCH",
     ["11.3"], "LAYOUT_MISMATCH", TGF((8, 128), g=32, bias=True), [setf("bias.blocks.size", [1, 64])], "1.1"),
    ("invalid-layout-scale-divide", "a device layout whose scale has op 'divide': LAYOUT_MISMATCH",
     ["11.3"], "LAYOUT_MISMATCH", TGF(), [setf("scale.op", "divide")], "1.1"),
    ("invalid-layout-marlin-bias", "marlin_dense with a bias: LAYOUT_MISMATCH",
     ["11.4"], "LAYOUT_MISMATCH", MAF(), [setf("bias", {"blocks": {"type": "grid", "size": [1, None]}, "op": "add", "tensor": "b"})], "1.1"),
    ("invalid-layout-marlin-scale-order", "marlin_dense whose scale has no order [1, 0]: LAYOUT_MISMATCH",
     ["11.4"], "LAYOUT_MISMATCH", MAF(), [delf("scale.order")], "1.1"),
    ("invalid-layout-nested", "a canonical tensor whose encoded scale declares a device layout (allowed only at depth 0): LAYOUT_MISMATCH",
     ["11.1", "9.3"], "LAYOUT_MISMATCH", base, [lambda d, c, p: (d["w"].__setitem__("scale", {"blocks": {"type": "grid", "size": [1, 4]}, "op": "multiply", "encoded": {
         "shape": [3, 2], "dtype": "float32", "codes": {"tensor": "w.scale", "element": {"type": "int", "bits": 4, "signedness": "offset_binary"}, "packing": dict(PK32)},
         "layout": {"name": TG, "parameters": {"inner_k_tiles": 2}}}}))], "1.1"),
    ("invalid-layout-tinygemm-component-shape", "tinygemm_int4_cuda codes stored [8, 32] instead of [1, 2, 32, 1]: COMPONENT_SHAPE",
     ["11.1", "11.3"], "COMPONENT_SHAPE", TGF(), [lambda d, c, p: c.__setitem__("w.codes", c["w.codes"].reshape(8, -1))], "1.1"),
    ("invalid-layout-marlin-component-shape", "marlin_dense 4-bit codes stored [K/16, 4N] (the 8-bit shape): COMPONENT_SHAPE",
     ["11.1", "11.4"], "COMPONENT_SHAPE", MAF(), [lambda d, c, p: c.__setitem__("w.codes", np.zeros((8, 256), np.int32))], "1.1"),
]

for _id, _desc, _spec, _code, _maker, _edits, _ver in _CASES:
    @case(_id, _desc, _spec, E)
    def _(rng, code=_code, maker=_maker, eds=_edits, ver=_ver):
        return M(rng, code, *eds, maker=maker, version=ver)
