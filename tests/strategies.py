"""The test suite's hypothesis strategies, in one place.

* :func:`descriptors`: whole random quantized tensors (descriptor dict, components, canonical
  codes): every element type, packing (order/axis/slots/planes/row alignment/word views),
  zero/scale/bias with flat, grid and indexed blocks, plain or encoded (nested) parameters,
  every logical dtype.  Used by the shared backend suite, slicing, and the reference decoder's
  own tests.
* :func:`random_bit_descriptors`: the same with random bit patterns in every float parameter
  and codebook table (subnormals, Inf, NaN, overflowing and underflowing products).
* :func:`packings`: a code width and a :class:`qformat.packing.Packing` along axis 0.
* :func:`float_arrays`: float32 arrays of any shape (0 to 3 dimensions) within ``[-top, top]``.
* :func:`json_paths`: every member and item path of a JSON value (for mutating descriptors).

The strategies build components with NumPy and :func:`tests.filebuild.pack` (qformat's
pack_rows) and size parameter grids with conformance/spec_reference.py, never with the decoder.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance import spec_reference as R
from qformat import tables
from qformat.packing import Packing

from .filebuild import pack

LOGICAL = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
PARAM_DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu, np.int8, np.uint8, np.int32]

#: Canonical codes (logical order) -> the codes component (the packing's ``order`` applied).
pack_codes = pack


@st.composite
def descriptors(draw, depth=0, shape=None, dtype=None, prefix=""):
    """(descriptor dict, components dict, canonical codes) for a random tensor."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if shape is None:
        rank = draw(st.integers(0, 4))
        shape = tuple(draw(st.lists(st.integers(0 if rank else 1, 7), min_size=rank, max_size=rank)))
    rank = len(shape)
    if dtype is None:
        dtype = draw(st.sampled_from(sorted(LOGICAL)))
    comps: dict[str, np.ndarray] = {}
    kind = draw(st.sampled_from(["int", "float", "codebook"] if depth == 0 else ["int", "float"]))
    if kind == "int":
        bits = draw(st.integers(1, 8))
        el = {"type": "int", "bits": bits, "signedness": draw(st.sampled_from(["unsigned", "twos_complement", "offset_binary"]))}
        if draw(st.booleans()):
            el["code_offset"] = draw(st.integers(0, (1 << bits) - 1))
        if draw(st.booleans()):
            el["frac_bits"] = draw(st.integers(0, 16))
        ncodes = 1 << bits
    elif kind == "float":
        fmt = draw(st.sampled_from(sorted(tables.float_formats())))
        el = {"type": "float", "format": fmt}
        bits = tables.float_formats()[fmt]["bits"]
        ncodes = 1 << bits
    else:
        bits = draw(st.integers(1, 8))
        if draw(st.booleans()) and bits >= 4:
            el = {"type": "codebook", "bits": bits, "table": draw(st.sampled_from(["nf4", "bnb_fp4"]))}
            ncodes = 16
        else:
            n = draw(st.integers(1, 1 << bits))
            tdt = draw(st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]))
            comps[prefix + "table"] = rng.normal(size=n).astype(tdt)
            el = {"type": "codebook", "bits": bits, "table_tensor": prefix + "table"}
            ncodes = n
    container = draw(st.sampled_from([c for c in (8, 16, 32) if c >= bits]))
    order = tuple(draw(st.permutations(range(rank)))) if rank > 1 and draw(st.booleans()) else None
    axis = None if rank == 0 or draw(st.integers(0, 4)) == 0 else draw(st.integers(0, rank - 1))
    straddle = draw(st.booleans())
    pk = {"container": container, "bit_order": draw(st.sampled_from(["lsb_first", "msb_first"])), "axis": axis}
    if order is not None:
        pk["order"] = list(order)
    if not straddle:
        pk["straddle"] = False
    if container % bits == 0 or not straddle:
        n = container // bits
        if draw(st.booleans()):
            pk["slot_order"] = list(draw(st.permutations(range(n))))
        if draw(st.booleans()):
            pk["planes"] = {"span": draw(st.integers(1, 9))}
    if draw(st.integers(0, 3)) == 0:
        pk["row_alignment"] = draw(st.integers(2, 3))
    p = Packing.from_dict(pk)
    codes = rng.integers(0, ncodes, size=shape).astype(np.uint8)
    words = pack_codes(codes, bits, p)
    word_views = {8: [np.uint8, np.int8, ml_dtypes.float8_e4m3fn], 16: [np.uint16, np.int16, np.float16, ml_dtypes.bfloat16], 32: [np.uint32, np.int32, np.float32]}
    comps[prefix + "codes"] = words.view(word_views[container][draw(st.integers(0, len(word_views[container]) - 1))])
    desc = {"shape": list(shape), "dtype": dtype, "codes": {"tensor": prefix + "codes", "element": el, "packing": pk}}
    for role in ("zero", "scale", "bias"):
        if not draw(st.booleans()):
            continue
        prm, pc = draw(params(role, shape, depth, prefix + role + "."))
        desc[role] = prm
        comps.update(pc)
    return desc, comps, codes


@st.composite
def params(draw, role, shape, depth, prefix):
    """(parameter dict, its components) for ``role`` of a tensor of ``shape``."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    rank = len(shape)
    comps: dict[str, np.ndarray] = {}
    if rank and draw(st.integers(0, 3)) == 0:
        blocks = {"type": "flat", "size": draw(st.integers(1, 9))}
    else:
        size = [draw(st.one_of(st.none(), st.integers(1, 4))) for _ in range(rank)]
        blocks = {"type": "grid", "size": size}
        if rank and draw(st.integers(0, 3)) == 0:
            ax = draw(st.integers(0, rank - 1))
            count = draw(st.integers(1, 4))
            size[ax] = None
            comps[prefix + "g_idx"] = rng.integers(0, count, size=shape[ax]).astype(np.int32)
            blocks["index"] = {"axis": ax, "tensor": prefix + "g_idx", "count": count}
    grid = R.grid_shape(blocks, tuple(shape))
    prm: dict = {"blocks": blocks}
    if role == "scale":
        prm["op"] = draw(st.sampled_from(["multiply", "divide"]))
    elif role == "bias":
        prm["op"] = draw(st.sampled_from(["add", "subtract"]))
    if depth < 2 and draw(st.integers(0, 3)) == 0:
        sub, subc, _ = draw(descriptors(depth + 1, tuple(grid), draw(st.sampled_from(sorted(LOGICAL))), prefix))
        prm["encoded"] = sub
        comps.update(subc)
        return prm, comps
    dt = draw(st.sampled_from(PARAM_DTYPES))
    if dt == ml_dtypes.float8_e8m0fnu:
        vals = rng.integers(100, 150, size=grid).astype(np.uint8).view(dt)
    elif np.dtype(dt).kind in "iu":
        vals = rng.integers(0, 100, size=grid).astype(dt)
    else:
        vals = (rng.normal(size=grid) * 3).astype(dt)
    order = tuple(draw(st.permutations(range(len(grid))))) if len(grid) > 1 and draw(st.booleans()) else None
    stored = vals.transpose(order) if order else vals
    if draw(st.booleans()):
        stored = stored.reshape([s for s in stored.shape if s != 1])
    comps[prefix + "p"] = np.ascontiguousarray(stored)
    prm["tensor"] = prefix + "p"
    if order:
        prm["order"] = list(order)
    return prm, comps


def code_tensors(desc: dict) -> set[str]:
    """Names of the codes components of a descriptor and of its encoded parameters."""
    out = {desc["codes"]["tensor"]}
    for role in ("zero", "scale", "bias"):
        if role in desc and "encoded" in desc[role]:
            out |= code_tensors(desc[role]["encoded"])
    return out


def with_random_bits(desc: dict, comps: dict, seed: int) -> dict:
    """``comps`` with every float parameter and table of 2 or 4 bytes (codes excepted) replaced
    by random bit patterns, half of them with the exponent bits mostly clear (subnormal and
    tiny normal values)."""
    comps = dict(comps)
    rng = np.random.default_rng(seed)
    codes = code_tensors(desc)
    for name, a in list(comps.items()):
        if name in codes or np.dtype(a.dtype).kind not in "fV" or a.dtype.itemsize == 1:
            continue
        u = rng.integers(0, 1 << (8 * a.itemsize), size=a.shape, dtype=np.uint64).astype(f"u{a.itemsize}")
        if rng.random() < 0.5:
            u &= np.array(0x80FFFFFF if a.itemsize == 4 else 0x80FF, dtype=u.dtype)
        comps[name] = u.view(a.dtype)
    return comps


@st.composite
def random_bit_descriptors(draw):
    """(descriptor, components, canonical codes) of :func:`descriptors` with random bit patterns
    in float parameters and tables (:func:`with_random_bits`)."""
    desc, comps, codes = draw(descriptors())
    return desc, with_random_bits(desc, comps, draw(st.integers(0, 2**32 - 1))), codes


@st.composite
def packings(draw):
    """(bits, Packing along axis 0): any container, bit order, straddling or slots, slot order,
    planes, row alignment."""
    bits = draw(st.integers(1, 8))
    container = draw(st.sampled_from([c for c in (8, 16, 32) if c >= bits]))
    bit_order = draw(st.sampled_from(["lsb_first", "msb_first"]))
    straddle = draw(st.booleans())
    slots = container % bits == 0 or not straddle
    n = container // bits
    slot_order = None
    planes = None
    if slots:
        if draw(st.booleans()):
            slot_order = tuple(draw(st.permutations(range(n))))
        if draw(st.booleans()):
            planes = draw(st.integers(1, 40))
    align = draw(st.sampled_from([1, 1, 2, 3]))
    return bits, Packing(container, bit_order, 0, straddle=straddle, slot_order=slot_order,
                         planes_span=planes, row_alignment=align)


@st.composite
def float_arrays(draw: Any, top: float) -> np.ndarray:
    """float32 arrays of 0 to 3 dimensions (sides 0..40) with finite values in [-top, top]."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40))
    top = float(np.float32(top))  # exactly representable bounds
    elements = st.floats(-top, top, width=32, allow_nan=False, allow_infinity=False)
    return draw(hnp.arrays(np.float32, shape, elements=elements))


def json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indices) into a JSON value, the empty path first."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += json_paths(v, prefix + (i,))
    return out
