"""The decoder in jax.numpy: one traced function per descriptor, bit-exact with the reference.

Everything static (shapes, packing geometry, block sizes, lookup tables of the element
encodings) comes from the descriptor, parsed and validated by the neutral core; the traced
function takes only the component arrays, so it runs under ``jax.jit`` and inside a model's
forward pass with the weights still packed on the device.

Exactness on XLA (SPEC.md §10.2), checked by tests/readers/test_jax_decode.py:

* XLA:CPU contracts a multiply followed by an add into one FMA, and runs kernels with
  flush-to-zero and denormals-are-zero set, so plain binary32 jax.numpy arithmetic is *not*
  the spec's arithmetic.  In ``exact`` mode (the default) each step therefore runs in binary64:
  both operands are widened exactly, the one binary64 operation is exact or, for ``/``,
  ``+`` and ``-``, correctly rounded to 53 bits, which rounds to the same binary32 value as
  the exact result (53 >= 2*24+2, Figueroa's double-rounding bound; results in the binary32
  subnormal range are exact sums or coarser roundings still), and the narrowing back to
  binary32 is done in integer arithmetic wherever the result is below 2^-126.  A binary64
  value is never subnormal here, so FTZ/DAZ never bite; binary64 and the narrowing steps
  separate every multiply from the next add, so nothing is contracted.
* XLA rewrites ``a / broadcast(b)`` and ``a / gather(b)`` as ``a * (1 / b)`` (two roundings):
  a divisor is materialized at full shape behind ``lax.optimization_barrier`` first.
* Widening binary16/bfloat16/float8 values and rounding to binary16/bfloat16 are done on the
  bits (integer operations, lookup tables), never with a float conversion instruction that
  DAZ could touch.

``exact=False`` decodes with plain binary32 operations: faster, still within rounding of the
reference, but not guaranteed bit-identical (FMA, FTZ, backend differences).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from qformat.descriptor import Descriptor, Param
from qformat.dtypes import storage_name
from qformat.elements import float_lut
from qformat.elements import lut as element_lut
from qformat.packing import Packing, inverse_permutation, slot_shifts
from qformat.regions import full_region, plan_codes, plan_grid

_F8_FORMATS = {"F8_E4M3": "e4m3fn", "F8_E5M2": "e5m2", "F8_E8M0": "e8m0fnu"}
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}
_JNP_LOGICAL = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}


def _x64():  # type: ignore[no-untyped-def]
    """A context in which binary64 arrays may be created while tracing."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is not None:
        return ctx(True)
    from jax.experimental import enable_x64  # older JAX

    return enable_x64()


def storage_of(x: Any) -> str:
    """safetensors dtype name of an array's dtype (its storage dtype on the device)."""
    name = storage_name(np.dtype(x.dtype))
    if name is None:
        raise TypeError(f"dtype {x.dtype} is not a safetensors dtype")
    return name


# -- bit-level conversions (no float instruction touches a subnormal) --------------------------
def _bits(x: jax.Array) -> jax.Array:
    """The raw bits of any array as an unsigned integer array of the same width."""
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return x
    return lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize])


def _f32(u: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(u.astype(jnp.uint32), jnp.float32)


def _f16_bits_to_f32(h: jax.Array) -> jax.Array:
    u = h.astype(jnp.uint32)
    sign = (u >> 15) << 31
    e = (u >> 10) & 0x1F
    m = u & 0x3FF
    normal = sign | ((e + 112) << 23) | (m << 13)
    special = sign | 0x7F800000 | (m << 13)
    # subnormal binary16 m * 2^-24 is a normal binary32: leading one of m at bit p
    p = 31 - lax.clz(jnp.maximum(m, 1)).astype(jnp.uint32)
    sub = sign | ((p + 103) << 23) | ((m << (23 - p)) & 0x7FFFFF)
    sub = jnp.where(m == 0, sign, sub)
    return _f32(jnp.where(e == 0, sub, jnp.where(e == 31, special, normal)))


def widen_to_f32(x: jax.Array, storage: str) -> jax.Array:
    """Values of a stored array as binary32, exactly (SPEC.md §9.2 widening)."""
    if storage == "F32":
        return lax.bitcast_convert_type(_bits(x), jnp.float32)
    if storage == "F16":
        return _f16_bits_to_f32(_bits(x))
    if storage == "BF16":
        return _f32(_bits(x).astype(jnp.uint32) << 16)
    if storage in _F8_FORMATS:
        table = jnp.asarray(float_lut(_F8_FORMATS[storage]))
        return jnp.take(table, _bits(x).astype(jnp.int32), mode="clip")
    # integers: the integer value rounded to binary32 (RNE); no subnormal can arise
    return x.astype(jnp.float32)


def _to_f64(x: jax.Array) -> jax.Array:
    """binary32 -> binary64, exactly, subnormals included (must run under _x64)."""
    u = _bits(x)
    mag = u & 0x7FFFFFFF
    is_sub = (mag < 0x800000) & (mag != 0)
    alt = (u & 0x7FFFFF).astype(jnp.float64) * np.float64(2.0**-149)
    alt = jnp.where((u >> 31) == 1, -alt, alt)
    return jnp.where(is_sub, alt, x.astype(jnp.float64))


def _to_f32(v: jax.Array) -> jax.Array:
    """binary64 -> binary32 with RNE, subnormal results included (must run under _x64)."""
    a = jnp.abs(v)
    tiny = a < np.float64(2.0**-126)
    k = lax.round(jnp.where(tiny, a, 0.0) * np.float64(2.0**149), lax.RoundingMethod.TO_NEAREST_EVEN)
    sign = jnp.signbit(v).astype(jnp.uint32) << 31
    tiny_val = _f32(sign | k.astype(jnp.uint32))
    return jnp.where(tiny, tiny_val, v.astype(jnp.float32))


def _round_f16(x: jax.Array) -> jax.Array:
    """binary32 -> binary16, RNE; subnormal results computed on the bits."""
    u = _bits(x)
    mag = _f32(u & 0x7FFFFFFF)
    tiny = (u & 0x7FFFFFFF) < 0x38800000  # |x| < 2^-14 (the binary16 normal range starts there)
    # |x| * 2^24 < 2^10 is a normal binary32 (or a flushed subnormal: those round to 0 anyway)
    k = lax.round(jnp.where(tiny, mag, 0.0) * np.float32(2.0**24), lax.RoundingMethod.TO_NEAREST_EVEN)
    h = ((u >> 16) & 0x8000) | k.astype(jnp.uint32)
    tiny_val = lax.bitcast_convert_type(h.astype(jnp.uint16), jnp.float16)
    return jnp.where(tiny, tiny_val, x.astype(jnp.float16))


def _round_bf16(x: jax.Array) -> jax.Array:
    """binary32 -> bfloat16 by the bit formula of SPEC.md §10.3; NaN stays NaN."""
    u = _bits(x)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = jnp.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)
    return lax.bitcast_convert_type(r.astype(jnp.uint16), jnp.bfloat16)


def round_to(x: jax.Array, dtype: str) -> jax.Array:
    """binary32 -> the logical dtype (SPEC.md §10.3)."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return _round_f16(x)
    return _round_bf16(x)


def logical_to_f32(x: jax.Array, dtype: str) -> jax.Array:
    """A decoded value in its logical dtype, widened exactly to binary32."""
    if dtype == "float32":
        return x
    return widen_to_f32(x, "F16" if dtype == "float16" else "BF16")


# -- unpacking ------------------------------------------------------------------------------
def _unpack_rows(words: jax.Array, bits: int, p: Packing, length: int) -> jax.Array:
    """``words[..., W]`` (uint32) -> codes ``[..., length]`` (int32), per SPEC.md §7."""
    lead = words.shape[:-1]
    if length == 0:
        return jnp.zeros(lead + (0,), jnp.int32)
    mask = np.uint32((1 << bits) - 1)
    if p.uses_slots(bits):
        n = p.slots_per_word(bits)
        shifts = jnp.asarray(slot_shifts(p, bits))
        inv = None if p.slot_order is None else inverse_permutation(p.slot_order)

        def slots_of(seg: jax.Array) -> jax.Array:  # [..., m] -> [..., m, n] codes by element
            s = (seg[..., None] >> shifts) & mask
            return s if inv is None else s[..., inv]

        if p.planes_span is None:
            w = -(-length // n)
            return slots_of(words[..., :w]).reshape(lead + (w * n,))[..., :length].astype(jnp.int32)
        t = p.planes_span
        m = -(-t // n)
        full, rest = divmod(length, t)
        parts = []
        if full:
            seg = words[..., : full * m].reshape(lead + (full, m))
            el = jnp.swapaxes(slots_of(seg), -1, -2).reshape(lead + (full, n * m))[..., :t]
            parts.append(el.reshape(lead + (full * t,)))
        if rest:
            mr = -(-rest // n)
            seg = words[..., full * m : full * m + mr]
            parts.append(jnp.swapaxes(slots_of(seg), -1, -2).reshape(lead + (n * mr,))[..., :rest])
        out = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)
        return out.astype(jnp.int32)
    # stream: the row as a byte stream (little-endian words, or big-endian bytes for msb_first);
    # a code of b <= 8 bits lies within two consecutive bytes.
    c = p.container
    nb = c // 8
    w = -(-(length * bits) // c)
    raw = words[..., :w]
    if p.bit_order == "lsb_first":
        sh = np.arange(nb, dtype=np.uint32) * 8
    else:
        sh = (c - 8 - np.arange(nb, dtype=np.uint32) * 8).astype(np.uint32)
    by = ((raw[..., None] >> jnp.asarray(sh)) & 0xFF).reshape(lead + (w * nb,))
    by = jnp.concatenate([by, jnp.zeros(lead + (1,), jnp.uint32)], axis=-1)
    off = np.arange(length, dtype=np.int64) * bits
    k0 = jnp.asarray((off // 8).astype(np.int32))
    r = (off % 8).astype(np.uint32)
    b0 = jnp.take(by, k0, axis=-1)
    b1 = jnp.take(by, k0 + 1, axis=-1)
    if p.bit_order == "lsb_first":
        u = ((b0 | (b1 << 8)) >> jnp.asarray(r)) & mask
    else:
        u = (((b0 << 8) | b1) >> jnp.asarray((16 - r - bits).astype(np.uint32))) & mask
    return u.astype(jnp.int32)


def read_codes(desc: Descriptor, comps: Mapping[str, jax.Array]) -> jax.Array:
    """The logical code grid (int32, logical shape) of a canonical-layout descriptor: the core's
    read plan for the whole tensor (:func:`qformat.regions.plan_codes`) applied with jax.numpy."""
    plan = plan_codes(desc, full_region(desc.shape))
    words = _bits(comps[plan.tensor]).astype(jnp.uint32).reshape(plan.words_shape)[plan.box]
    c0, c1 = plan.cut
    if plan.axis is None:
        codes = _unpack_rows(words[None, :], plan.bits, plan.packing, plan.length)[0, c0:c1]
        s = codes.reshape(plan.rows_shape)[plan.rows_box]
    else:
        codes = _unpack_rows(jnp.moveaxis(words, plan.axis, -1), plan.bits, plan.packing, plan.length)[..., c0:c1]
        s = jnp.moveaxis(codes, -1, plan.axis)
    return s if plan.to_logical is None else s.transpose(plan.to_logical)


# -- parameters -----------------------------------------------------------------------------
def _repeat(vals: jax.Array, size: int, axis: int, length: int) -> jax.Array:
    """Each entry along ``axis`` repeated ``size`` times, cut to ``length`` (static shapes)."""
    g = vals.shape[axis]
    v = jnp.expand_dims(vals, axis + 1)
    shape = list(v.shape)
    shape[axis + 1] = size
    v = jnp.broadcast_to(v, shape).reshape(vals.shape[:axis] + (g * size,) + vals.shape[axis + 1 :])
    return lax.slice_in_dim(v, 0, length, axis=axis)


def _expand(vals: jax.Array, prm: Param, shape: tuple[int, ...], comps: Mapping[str, jax.Array]) -> jax.Array:
    """Grid values ``vals`` (shape G) -> one value per logical element (broadcastable to shape)."""
    b = prm.blocks
    if b.type == "flat":
        return _repeat(vals, int(b.size), 0, math.prod(shape)).reshape(shape)  # type: ignore[arg-type]
    for a, s in enumerate(b.size):  # type: ignore[arg-type]
        if b.index is not None and a == b.index.axis:
            idx = comps[b.index.tensor].astype(jnp.int32)
            vals = jnp.take(vals, idx, axis=a, mode="clip")  # range checked before decoding
        elif s is not None:
            vals = _repeat(vals, s, a, shape[a])
    return vals


def _grid_values(prm: Param, desc: Descriptor, comps: Mapping[str, jax.Array], exact: bool) -> tuple[jax.Array, jax.Array]:
    """(binary32 values of a parameter over its grid G, ok flag of a nested decode)."""
    if prm.encoded is not None:
        enc = prm.encoded
        out, ok = decode_traced(enc, comps, exact)
        return logical_to_f32(out, enc.dtype), ok
    x = comps[prm.tensor or ""]
    g = plan_grid(prm, desc, full_region(prm.blocks.grid_shape(desc.shape)))  # the core's stored -> grid order
    v = widen_to_f32(x, storage_of(x)).reshape(g.stored_shape)[g.stored_box]
    return (v if g.to_grid is None else v.transpose(g.to_grid)), jnp.bool_(True)


# -- the whole decode -----------------------------------------------------------------------
def _element_table(desc: Descriptor, comps: Mapping[str, jax.Array]) -> tuple[jax.Array, int]:
    """(2**bits binary32 lookup table, valid codes): the core's table (:func:`qformat.elements.lut`);
    a stored codebook's values are widened on the device and take the place of the core's
    table's first entries (the rest, past the valid codes, are the core's NaN)."""
    el = desc.codes.element
    if el.type == "codebook" and el.table_tensor is not None:
        t = comps[el.table_tensor]
        layout, valid = element_lut(el, np.zeros(math.prod(t.shape), np.float32))
        vals = widen_to_f32(t, storage_of(t)).reshape(-1)
        if valid < layout.shape[0]:
            vals = jnp.concatenate([vals, jnp.asarray(layout[valid:])])
        return vals, valid
    table, valid = element_lut(el)
    return jnp.asarray(table), valid


def _opaque(v: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The divisor at full shape behind an optimization barrier.

    XLA rewrites ``a / broadcast(b)`` and ``a / gather(b)`` into ``a * (1 / b)``: two roundings
    instead of one (SPEC.md §10.2 forbids it).  A materialized, opaque divisor prevents that.
    """
    return lax.optimization_barrier(jnp.broadcast_to(v, shape))


# -- the binary32 path, where it provably gives the exact path's bits ----------------------------
def _f32_steps_ok(desc: Descriptor) -> bool:
    """Static half of the binary32 path's proof: no step XLA could rewrite.

    XLA:CPU contracts a multiply whose result feeds an add or subtract into one FMA (one
    rounding instead of two), and rewrites division as multiplication by a reciprocal; neither
    can happen when no parameter divides and no add/subtract step follows a multiply
    (SPEC.md's order is zero, scale, bias: a scale that multiplies rules out a bias).  Nested
    (encoded) parameters are decoded by the exact path, so only this level's steps count.
    """
    seen_multiply = False
    for prm in desc.params():
        if prm.arith == "divide":
            return False
        if prm.arith == "multiply":
            seen_multiply = True
        elif seen_multiply:
            return False
    return True


def _min_exponent(v: jax.Array) -> jax.Array:
    """floor(log2) of the smallest non-zero, non-NaN magnitude in ``v`` (binary32), computed on
    the bits (comparisons on floats would see a subnormal as zero under DAZ); -127 marks a
    subnormal, +128 an array with no non-zero value."""
    mag = _bits(v.astype(jnp.float32)).reshape(-1) & 0x7FFFFFFF
    usable = (mag != 0) & (mag <= 0x7F800000)
    m = jnp.min(jnp.where(usable, mag, jnp.uint32(0xFFFFFFFF)))
    e = (m >> 23).astype(jnp.int32) - 127
    return jnp.where(m == 0xFFFFFFFF, jnp.int32(128), jnp.where(m < 0x800000, jnp.int32(-127), e))


def _f32_values_ok(desc: Descriptor, table: jax.Array, valid: int, grids: list[jax.Array]) -> jax.Array:
    """Runtime half of the proof: no input or result of any step is subnormal (FTZ/DAZ).

    ``e`` bounds the non-zero magnitudes of the running value below by 2^e (and, below an
    add/subtract, every value is a multiple of 2^q).  Element table: every non-zero value
    normal, e = its smallest exponent.  Multiply by p (all non-zero |p| >= 2^ep, normal):
    non-zero products are >= 2^(e+ep), which must be >= 2^-126.  Add/subtract p: both operands
    are multiples of 2^q with q = min(e, ep) - 23 (a binary32 value >= 2^k is a multiple of
    2^(k-23)), so a non-zero result is >= 2^q, which must be >= 2^-126.  Zero operands and
    results are exact in both arithmetics; Inf and NaN propagate the same (NaN by class).
    """
    e = _min_exponent(table[:valid])
    ok = e >= -126
    for prm, v in zip(desc.params(), grids):
        ep = _min_exponent(v)
        ok = ok & (ep >= -126)
        if prm.arith == "multiply":
            e = jnp.where(ep == 128, e, e + ep)
        else:  # add / subtract (divide never reaches here)
            e = jnp.minimum(e, ep) - 23
        ok = ok & (jnp.where(e > 128, 128, e) >= -126)
    return ok


def _static_values(desc: Descriptor, comps: Mapping[str, jax.Array], codes: jax.Array) -> jax.Array | None:
    """Element values of an integer element computed by conversion instead of a lookup, where the
    (static) table is exactly ``code + offset`` or the two's-complement value of the code: the
    same binary32 integers (all below 2^24) without a gather."""
    el = desc.codes.element
    if el.type == "codebook" and el.table_tensor is not None:
        return None
    table, valid = element_lut(el)
    table = np.asarray(table, np.float32)
    n = 1 << el.bits
    if valid != n or el.bits > 16:
        return None
    c = np.arange(n, dtype=np.int64)
    if np.array_equal(table, (c + int(table[0])).astype(np.float32)) and np.all(np.isfinite(table)):
        return (codes + int(table[0])).astype(jnp.float32)
    half = n // 2
    if np.array_equal(table, np.where(c >= half, c - n, c).astype(np.float32)):
        return ((codes ^ half) - half).astype(jnp.float32)
    return None


def decode_traced(desc: Descriptor, comps: Mapping[str, jax.Array], exact: bool = True) -> tuple[jax.Array, jax.Array]:
    """(decoded array in the logical dtype, ok flag) for traced or concrete component arrays.

    ``ok`` is False when a code indexes past the end of a codebook table (CODE_OUT_OF_RANGE);
    the decoded value of such a code is NaN.
    """
    shape = desc.shape
    if math.prod(shape) == 0:
        return jnp.zeros(shape, _JNP_LOGICAL[desc.dtype]), jnp.bool_(True)
    if desc.layout != "canonical":  # a device layout: static gathers to canonical (SPEC.md §11)
        from ._layouts import canonical

        desc, comps = canonical(desc, comps, _bits)
    params = list(desc.params())
    if exact and params and _f32_steps_ok(desc):
        # binary32 where the values allow it (checked at run time on the small parameter grids
        # and the table), the binary64 path otherwise: lax.cond runs one of the two
        with _x64():
            grids, ok = [], jnp.bool_(True)
            for prm in params:
                v32, ok_p = _grid_values(prm, desc, comps, True)  # nested: always the exact path
                grids.append(v32)
                ok = ok & ok_p
            table, valid = _element_table(desc, comps)
            use_f32 = _f32_values_ok(desc, table, valid, grids)

            def f32_path() -> tuple[jax.Array, jax.Array]:
                return _steps(desc, comps, grids, table, valid, fast=True)

            def f64_path() -> tuple[jax.Array, jax.Array]:
                return _steps(desc, comps, grids, table, valid, fast=False)

            x, ok_c = lax.cond(use_f32, f32_path, f64_path)
        return round_to(x, desc.dtype), ok & ok_c
    codes = read_codes(desc, comps)
    table, valid = _element_table(desc, comps)
    ok = jnp.bool_(True)
    if valid < table.shape[0]:
        ok = jnp.max(codes) < valid
    x = jnp.take(table, codes, mode="clip")
    if exact and params:
        with _x64():
            for prm in params:
                v32, ok_p = _grid_values(prm, desc, comps, exact)
                ok = ok & ok_p
                v = _expand(_to_f64(v32), prm, shape, comps)
                if prm.arith == "divide":
                    v = _opaque(v, shape)
                r = getattr(jnp, prm.arith)(_to_f64(x), v)
                x = _to_f32(jnp.broadcast_to(r, shape))
    else:
        for prm in params:
            v32, ok_p = _grid_values(prm, desc, comps, exact)
            ok = ok & ok_p
            v = _expand(v32, prm, shape, comps)
            if prm.arith == "divide":
                v = _opaque(v, shape)
            x = jnp.broadcast_to(getattr(jnp, prm.arith)(x, v), shape)
    return round_to(x, desc.dtype), ok


def _steps(desc: Descriptor, comps: Mapping[str, jax.Array], grids: list[jax.Array], table: jax.Array, valid: int,
           fast: bool) -> tuple[jax.Array, jax.Array]:
    """Codes, element values and every parameter step: in plain binary32 (``fast``; only where
    :func:`_f32_steps_ok` and :func:`_f32_values_ok` hold) or in binary64 with exact narrowing."""
    shape = desc.shape
    codes = read_codes(desc, comps)
    ok = jnp.bool_(True)
    if valid < table.shape[0]:
        ok = jnp.max(codes) < valid
    x = _static_values(desc, comps, codes) if fast else None
    if x is None:
        x = jnp.take(table, codes, mode="clip")
    for prm, v32 in zip(desc.params(), grids):
        if fast:
            x = jnp.broadcast_to(getattr(jnp, prm.arith)(x, _expand(v32, prm, shape, comps)), shape)
        else:
            v = _expand(_to_f64(v32), prm, shape, comps)
            if prm.arith == "divide":
                v = _opaque(v, shape)
            x = _to_f32(jnp.broadcast_to(getattr(jnp, prm.arith)(_to_f64(x), v), shape))
    return x.astype(jnp.float32), ok


@lru_cache(maxsize=256)
def jitted(desc_json: str, exact: bool = True, cut: tuple[tuple[int, int], ...] | None = None):  # type: ignore[no-untyped-def]
    """``jax.jit`` of the decode of one descriptor: components dict -> (array, ok).

    ``cut`` (a static box) returns only that box of the decoded tensor, in the same program.
    """
    desc = Descriptor.from_dict(json.loads(desc_json))

    def fn(comps: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        out, ok = decode_traced(desc, comps, exact)
        if cut is not None:
            out = out[tuple(slice(lo, hi) for lo, hi in cut)]
        return out, ok

    return jax.jit(fn)


def descriptor_json(desc: Descriptor | Mapping[str, Any]) -> str:
    d = desc.to_dict() if isinstance(desc, Descriptor) else desc
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def f32_path_chosen(desc: Descriptor, comps: Mapping[str, jax.Array]) -> bool:
    """Whether the exact decode of these components runs in binary32 (for tests and the
    benchmark): the static step check and the run-time value check of :func:`decode_traced`."""
    if desc.layout != "canonical":
        from ._layouts import canonical

        desc, comps = canonical(desc, comps, _bits)
    params = list(desc.params())
    if not params or not _f32_steps_ok(desc) or math.prod(desc.shape) == 0:
        return False
    with _x64():
        grids = [_grid_values(prm, desc, comps, True)[0] for prm in params]
        table, valid = _element_table(desc, comps)
        return bool(_f32_values_ok(desc, table, valid, grids))
