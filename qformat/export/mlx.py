"""Target ``mlx``: MLX / mlx-lm checkpoints (``mx.save_safetensors`` files, ``config.json``).

Per quantized layer ``P`` (a tensor named ``P.weight``): ``P.weight`` (``U32``, the codes as
``mx.quantize`` packs them: a continuous LSB-first bit stream per row, ``K*bits/32`` words),
``P.scales`` and, in mode ``affine``, ``P.biases``; ``config.json`` gets mlx-lm's
``"quantization"`` (and the same object as ``"quantization_config"``): the most common
``{"group_size", "bits", "mode"}`` as defaults plus one ``LAYER: {...}`` entry per layer that
differs (the source's own defaults and entries are kept where they still hold, so an mlx-lm
checkpoint round-trips with its config unchanged).  Every file's metadata is
``{"format": "mlx"}``.

Modes (decoding as MLX's CPU kernels do it, checked against ``mx.dequantize`` in the tests):

- ``affine`` (bits 1-6, 8; group 32, 64, 128): ``w = s*q + b`` with each operation rounded in
  the scales' dtype (no fused multiply-add).  Scales and biases are written in float32: then
  MLX's arithmetic is qformat's binary32 arithmetic (§10.2), exact by construction for every
  unsigned-code / scale-multiply / bias-add descriptor, and for signed codes and zero points
  (``b = -(c + z)*s``) whenever that product is exact (always for float16/bfloat16 scales).
  The option ``scale_dtype="source"`` keeps float16/bfloat16 stored scales and biases as they
  are (a byte-identical round trip of an mlx-lm checkpoint); MLX then computes
  ``fl(fl(s*q) + b)`` in that dtype, which the exactness check usually refuses.
- ``mxfp4`` / ``mxfp8``: E2M1 / E4M3 codes, ``U8`` E8M0 scale per 32 (MLX reads code 255 as
  +Inf, not NaN); ``nvfp4``: E2M1 codes, ``U8`` E4M3 scale per 16, optionally times a float32
  ``P.global_scale`` G, which MLX folds as ``fl32(G / 2688)``.  Output bfloat16 (float32 with
  a global scale).

Plain tensors are copied unchanged.  SPEC.md Appendix D gives the table (mapping/mlx.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from ..container import TensorSpec
from ..descriptor import Descriptor, Param
from ..elements import float_lut
from .base import Context, ExportPlan, Mapped, Parts, Refusal, Target, block_sizes, plain_mapped, require, row_groups
from .safetensors_out import write_safetensors

AFFINE_BITS = (1, 2, 3, 4, 5, 6, 8)
#: MLX's affine group sizes, largest first (a larger qformat group splits into these exactly).
AFFINE_GROUPS = (128, 64, 32)
#: mode -> (element format, bits, group size, scale format)
FLOAT_MODES: dict[str, tuple[str, int, int, str]] = {
    "mxfp4": ("e2m1fn", 4, 32, "e8m0fnu"),
    "mxfp8": ("e4m3fn", 8, 32, "e8m0fnu"),
    "nvfp4": ("e2m1fn", 4, 16, "e4m3fn"),
}
#: the stored dtype of a float mode's scale when it is a plain parameter
_SCALE_STORAGE = {"e8m0fnu": "F8_E8M0", "e4m3fn": "F8_E4M3"}
NVFP4_GLOBAL_DIVISOR = np.float32(448.0 * 6.0)
_NARROW = {"F16": np.float16, "BF16": ml_dtypes.bfloat16}
_SUFFIX = ".weight"


# -- packing ------------------------------------------------------------------------------------
#: Elements per chunk when packing/unpacking (the bit arrays are 8 bytes per code bit).
_CHUNK = 1 << 18


def _step(k: int) -> int:
    """Rows per chunk for rows of ``k`` codes."""
    return max(1, _CHUNK // max(k, 1))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes ``[..., K]`` as MLX packs them: each row a continuous bit stream, code i at
    bits ``[i*bits, (i+1)*bits)`` counted from the least significant bit of little-endian
    uint32 words (``[..., K*bits/32]``)."""
    c = np.ascontiguousarray(codes, np.uint8)
    lead, k = c.shape[:-1], c.shape[-1]
    if bits == 8:
        return c.view("<u4").reshape(*lead, k // 4).copy()
    flat = c.reshape(-1, k)
    out = np.empty((flat.shape[0], k * bits // 8), np.uint8)
    for r in range(0, flat.shape[0], _step(k)):  # rows at a time: the bit array is 8x the codes
        b = np.unpackbits(flat[r: r + _step(k)][..., None], axis=-1, count=bits, bitorder="little")
        out[r: r + b.shape[0]] = np.packbits(b.reshape(b.shape[0], k * bits), axis=-1, bitorder="little")
    return out.view("<u4").reshape(*lead, k * bits // 32)


def unpack(words: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The inverse of :func:`pack`: uint8 codes ``[..., k]`` (MLX's unpacking)."""
    w = np.ascontiguousarray(words).astype("<u4", copy=False)
    by = w.view(np.uint8).reshape(-1, w.shape[-1] * 4)
    if bits == 8:
        return by[:, :k].reshape(*w.shape[:-1], k).copy()
    out = np.empty((by.shape[0], k), np.uint8)
    for r in range(0, by.shape[0], _step(k)):
        part = by[r: r + _step(k)]
        b = np.unpackbits(part, axis=-1, bitorder="little")[:, : k * bits]
        out[r: r + part.shape[0]] = np.packbits(b.reshape(part.shape[0], k, bits), axis=-1, bitorder="little")[..., 0]
    return out.reshape(*w.shape[:-1], k)


def _grouped(v: np.ndarray, group: int) -> np.ndarray:
    """A ``[..., K]`` array viewed as ``[..., K/group, group]`` (per-group values broadcast)."""
    return v.reshape(*v.shape[:-1], v.shape[-1] // group, group)


# -- decoding (MLX's rule, in NumPy) ----------------------------------------------------------
def affine_decode(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, group: int) -> np.ndarray:
    """``mx.dequantize(..., mode="affine")`` on CPU: ``fl(fl(s*q) + b)`` with each step rounded
    to the scales' dtype (float32 steps, then a narrowing), returned widened to binary32."""
    k = scales.shape[-1] * group
    q = unpack(w, bits, k).astype(np.float32)
    x = _grouped(q, group)
    dt = scales.dtype
    s = scales.astype(np.float32)[..., None]
    b = biases.astype(np.float32)[..., None]
    with np.errstate(all="ignore"):
        np.multiply(x, s, out=x)  # binary32, rounded (NumPy does not contract it with the add)
        if dt != np.float32:
            x[...] = x.astype(dt)  # MLX rounds the product to the scales' dtype
        np.add(x, b, out=x)
        if dt != np.float32:
            x[...] = x.astype(dt)
    return q


def e8m0_scale(codes: np.ndarray) -> np.ndarray:
    """MLX's E8M0 scale: 2^(c - 127) as binary32, code 255 read as +Inf (not NaN)."""
    c = codes.astype(np.int64)
    with np.errstate(over="ignore"):
        return np.where(c == 255, np.float32(np.inf), np.ldexp(np.float32(1), c - 127).astype(np.float32)).astype(np.float32)


def float_decode(mode: str, w: np.ndarray, scales: np.ndarray, global_scale: np.ndarray | None = None) -> np.ndarray:
    """``mx.dequantize(..., mode=mode[, global_scale])`` on CPU: element value times the
    block's scale in binary32, rounded to bfloat16 (without a global scale); with an nvfp4
    global scale G the scale is ``fl32(e4m3 * fl32(G / 2688))`` and the output float32."""
    fmt, bits, group, sfmt = FLOAT_MODES[mode]
    k = scales.shape[-1] * group
    e = float_lut(fmt)[unpack(w, bits, k)]
    x = _grouped(e, group)
    su = scales.astype(np.uint8)
    s = e8m0_scale(su) if sfmt == "e8m0fnu" else float_lut(sfmt)[su]
    with np.errstate(all="ignore"):
        if global_scale is not None:
            g = np.float32(np.asarray(global_scale, np.float32).reshape(())) / NVFP4_GLOBAL_DIVISOR
            np.multiply(x, (s * np.float32(g))[..., None], out=x)
            return e
        np.multiply(x, s[..., None], out=x)
        x[...] = x.astype(ml_dtypes.bfloat16)
    return e


def global_scale_for(g: np.float32) -> np.float32:
    """A float32 G with ``fl32(G / 2688) == g`` (MLX's nvfp4 global scale for qformat's
    multiplier g), the one nearest g * 2688 when several do; g * 2688 rounded when none does
    (then the exactness check refuses the tensor)."""
    g = np.float32(g)
    g0 = np.float32(np.float64(g) * 2688.0)
    with np.errstate(all="ignore"):
        if np.float32(g0) / NVFP4_GLOBAL_DIVISOR == g:
            return g0
        up, down = g0, g0
        for _ in range(8):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            for c in (down, up):
                if c / NVFP4_GLOBAL_DIVISOR == g:
                    return np.float32(c)
    return g0


# -- the target ---------------------------------------------------------------------------------
def _layer(name: str) -> str:
    require(name.endswith(_SUFFIX) and len(name) > len(_SUFFIX),
            f"MLX names a quantized tensor LAYER.weight (beside LAYER.scales, LAYER.biases); {name!r} does not end in '.weight'")
    return name[: -len(_SUFFIX)]


def _groups(p: Param | None, shape: tuple[int, ...], role: str) -> int:
    g = row_groups(p, shape)
    require(g is not None, f"the {role}'s blocks are not groups along the last axis (MLX groups rows)")
    return int(g)  # type: ignore[arg-type]


def _mlx_group(groups: list[int], k: int, allowed: tuple[int, ...]) -> int:
    """The largest MLX group size that divides every qformat group and the row length."""
    for gm in allowed:
        if k % gm == 0 and all(g % gm == 0 for g in groups):
            return gm
    raise Refusal(f"groups of {sorted(set(groups))} along rows of {k} split into no MLX group size {list(allowed)}")


def _int_shift(desc: Descriptor) -> tuple[int, int]:
    """(bits, c) for an integer element: the code MLX stores is q' with element value q' - c."""
    el = desc.codes.element
    require(el.type == "int", f"{el.type} elements (MLX affine stores integers, its float modes fixed formats)")
    require(el.frac_bits == 0, "fixed-point integer elements (frac_bits)")
    require(el.bits in AFFINE_BITS, f"{el.bits}-bit codes (MLX affine: {list(AFFINE_BITS)} bits)")
    return el.bits, 0 if el.signedness == "unsigned" else 1 << (el.bits - 1)


def _mlx_codes(parts: Parts) -> np.ndarray:
    """The unsigned codes q' MLX stores (element value q' - c, see :func:`_int_shift`)."""
    el = parts.element
    b = el.bits
    u = ((parts.codes().astype(np.uint16) + el.code_offset) % (1 << b)).astype(np.uint8)
    if el.signedness == "twos_complement":
        u ^= np.uint8(1 << (b - 1))
    return u


def _plain_stored(p: Param) -> bool:
    return p.tensor is not None and p.encoded is None


class MLX(Target):
    """Export to MLX / mlx-lm (affine 1-6, 8 bit; mxfp4, mxfp8, nvfp4)."""

    name = "mlx"
    title = "MLX / mlx-lm (affine, mxfp4, mxfp8, nvfp4; config.json quantization)"
    #: exact for any finite input: float16/bfloat16 scales (and integer zero points) make
    #: every step of MLX's float32 affine arithmetic exact; mxfp4's products are exact in
    #: bfloat16.  (nvfp4's global scale G with fl32(G / 2688) == g does not always exist, and
    #: mxfp8's smallest products can underflow bfloat16.)
    exact_schemes = (("int", {"bits": 8, "group_size": 128, "symmetric": False, "scale_dtype": "float16"}),
                     ("int", {"bits": 4, "group_size": 64, "symmetric": False, "scale_dtype": "float16"}),
                     ("int", {"bits": 4, "group_size": 32, "symmetric": False, "scale_dtype": "bfloat16"}),
                     ("mxfp4", {}), ("mxfp8_e4m3", {}), ("nvfp4", {}))

    def map(self, name: str, desc: Descriptor | None, ctx: Context) -> Mapped:
        if desc is None:
            info = ctx.source.info(name)
            require(info is not None, "the tensor is not in the checkpoint")
            return plain_mapped(name, info.dtype, info.shape)  # type: ignore[union-attr]
        for ext in desc.extensions:
            require(not ext.must_understand, f"the extension {ext.name!r}")
        shape = tuple(desc.shape)
        require(len(shape) >= 1 and shape[-1] > 0, f"shape {list(shape)} (MLX quantizes rows of a tensor of rank >= 1)")
        layer = _layer(name)
        if desc.codes.element.type == "float":
            return self._float(name, layer, desc, ctx)
        return self._affine(name, layer, desc, ctx)

    # -- affine ---------------------------------------------------------------------------------
    def _affine(self, name: str, layer: str, desc: Descriptor, ctx: Context) -> Mapped:
        shape = tuple(desc.shape)
        k = shape[-1]
        bits, c = _int_shift(desc)
        require(desc.scale is not None, "no scale (MLX affine always multiplies by a scale)")
        require(desc.scale.op == "multiply", f"scale op {desc.scale.op} (MLX multiplies)")
        groups = [_groups(desc.scale, shape, "scale")]
        if desc.zero is not None:
            groups.append(_groups(desc.zero, shape, "zero point"))
        if desc.bias is not None:
            groups.append(_groups(desc.bias, shape, "bias"))
            # s*q' + b' with one bias: a shift (signed codes, zero point) would need a second
            # rounded term, which MLX's two roundings do not reproduce.
            require(c == 0 and desc.zero is None, "a bias together with signed codes or a zero point")
        gm = _mlx_group(groups, k, AFFINE_GROUPS)
        keep = ctx.options.get("scale_dtype") == "source"
        sdt = "F32"
        if keep and _plain_stored(desc.scale) and desc.zero is None and c == 0:
            st = ctx.source.info(desc.scale.tensor).dtype  # type: ignore[union-attr, arg-type]
            bst = ctx.source.info(desc.bias.tensor).dtype if desc.bias is not None and _plain_stored(desc.bias) else st  # type: ignore[union-attr, arg-type]
            if st in _NARROW and bst == st:
                sdt = st
        ngroups = k // gm
        wn, sn, bn = name, f"{layer}.scales", f"{layer}.biases"
        specs = [TensorSpec(wn, "U32", (*shape[:-1], k * bits // 32)),
                 TensorSpec(sn, sdt, (*shape[:-1], ngroups)), TensorSpec(bn, sdt, (*shape[:-1], ngroups))]
        out_np = np.float32 if sdt == "F32" else _NARROW[sdt]

        def per_group(parts: Parts, role: str) -> np.ndarray:
            """The role's values per MLX group ([..., K/gm]), binary32 (or stored, when kept)."""
            p = parts.param(role)
            if sdt != "F32" and p is not None and _plain_stored(p):
                v = parts.grid(role).view(out_np)
            else:
                v = parts.values(role)
            g = block_sizes(p, shape)[-1]  # type: ignore[arg-type, index]
            v = np.broadcast_to(v, (*shape[:-1], v.shape[-1]))  # a size-1 grid axis covers the axis
            return np.repeat(v, g // gm, axis=-1)[..., :ngroups]

        def build(parts: Parts) -> dict[str, np.ndarray]:
            s = per_group(parts, "scale")
            with np.errstate(all="ignore"):
                if desc.bias is not None:
                    b = per_group(parts, "bias")
                    if desc.bias.op == "subtract":
                        b = -b  # exact: x - t == x + (-t)
                elif c or desc.zero is not None:
                    shift = np.float32(c)
                    if desc.zero is not None:
                        shift = per_group(parts, "zero") + np.float32(c)  # integer zero points: exact
                    b = -(shift * s.astype(np.float32))  # binary32: exact for float16/bfloat16 scales
                else:
                    b = np.full(s.shape, -0.0, np.float32)  # y + (-0) == y for every y, -0 included
            return {wn: pack(_mlx_codes(parts), bits), sn: np.ascontiguousarray(s.astype(out_np)),
                    bn: np.ascontiguousarray(b.astype(out_np))}

        def decode(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
            return affine_decode(arrays[wn], arrays[sn], arrays[bn], bits, gm)

        kind = f"affine b{bits} g{gm}" + ("" if sdt == "F32" else f" {sdt}")
        return Mapped(kind, specs, build, decode, {"layer": layer, "group_size": gm, "bits": bits, "mode": "affine"})

    # -- mxfp4, mxfp8, nvfp4 ------------------------------------------------------------------------
    def _float(self, name: str, layer: str, desc: Descriptor, ctx: Context) -> Mapped:
        shape = tuple(desc.shape)
        k = shape[-1]
        fmt = desc.codes.element.format
        require(desc.zero is None and desc.bias is None, "a zero point or bias with float elements (MLX's float modes have neither)")
        require(desc.scale is not None and desc.scale.op == "multiply", "float elements without a multiplying scale")
        p = desc.scale
        g = _groups(p, shape, "scale")
        inner: Param | None = None
        if p.encoded is not None:
            nd = p.encoded
            sfmt = nd.codes.element.format if nd.codes.element.type == "float" else None
            require(nd.zero is None and nd.bias is None, "the encoded scale has a zero point or bias")
            inner = nd.scale
            if inner is not None:
                whole = block_sizes(inner, tuple(nd.shape)) == tuple(nd.shape)
                require(inner.op == "multiply" and whole, "the encoded scale's own scale is not one multiplier for the whole tensor")
        else:
            st = ctx.source.info(p.tensor).dtype  # type: ignore[union-attr, arg-type]
            sfmt = {v: f for f, v in _SCALE_STORAGE.items()}.get(st)
        modes = [m for m, (ef, _, _, sf) in FLOAT_MODES.items() if ef == fmt and sf == sfmt]
        require(bool(modes), f"{fmt} elements with {sfmt or 'a non-E8M0/E4M3'} scales (MLX: mxfp4 e2m1/e8m0, mxfp8 e4m3fn/e8m0, nvfp4 e2m1/e4m3)")
        mode = modes[0]
        _, bits, gm, _ = FLOAT_MODES[mode]
        require(g % gm == 0 and k % gm == 0, f"scale groups of {g} along rows of {k} (MLX {mode}: groups of {gm})")
        if inner is not None:
            require(mode == "nvfp4", f"a scaled {sfmt} scale (only MLX nvfp4 has a global scale)")
        wn, sn, gn = name, f"{layer}.scales", f"{layer}.global_scale"
        # A source that keeps MLX's own global scale (an mlx-lm checkpoint, converted) holds it
        # as a plain tensor, copied as such: the layer reads it to verify, and writes none.
        own_g = inner is not None and ctx.source.info(gn) is not None
        specs = [TensorSpec(wn, "U32", (*shape[:-1], k * bits // 32)), TensorSpec(sn, "U8", (*shape[:-1], k // gm))]
        if inner is not None and not own_g:
            specs.append(TensorSpec(gn, "F32", ()))
        seen: dict[str, np.ndarray] = {}

        def build(parts: Parts) -> dict[str, np.ndarray]:
            if p.encoded is not None:
                sc = parts.nested("scale").codes()
            else:
                sc = np.ascontiguousarray(parts.grid("scale")).view(np.uint8)
            sc = np.repeat(np.broadcast_to(sc, (*shape[:-1], sc.shape[-1])), g // gm, axis=-1)[..., : k // gm]
            out = {wn: pack(parts.codes(), bits), sn: np.ascontiguousarray(sc, np.uint8)}
            if inner is not None:
                if own_g:
                    seen["g"] = np.asarray(ctx.source.array(gn), np.float32).reshape(())
                else:
                    gv = np.float32(parts.nested("scale").values("scale").reshape(-1)[0])
                    out[gn] = np.asarray(global_scale_for(gv), np.float32).reshape(())
            return out

        def decode(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
            gs = arrays.get(gn, seen.pop("g", None)) if inner is not None else None
            return float_decode(mode, arrays[wn], arrays[sn], gs)

        kind = mode + (" global_scale" if inner is not None else "")
        return Mapped(kind, specs, build, decode, {"layer": layer, "group_size": gm, "bits": bits, "mode": mode})

    # -- --allow-rounding -------------------------------------------------------------------------
    def fallback(self, name: str, desc: Descriptor, ctx: Context) -> tuple[str, dict[str, Any]] | None:
        """Affine 4-bit (asymmetric: unsigned codes, integer zero point) in groups of 64 (32
        when the rows are not a multiple of 64), with scales in the tensor's dtype (bfloat16 for
        float32 tensors, whose range float16 may not hold): exact in MLX's float32 arithmetic."""
        shape = tuple(desc.shape)
        if not name.endswith(_SUFFIX) or not shape or shape[-1] % 32:
            return None
        g = 64 if shape[-1] % 64 == 0 else 32
        sdt = desc.dtype if desc.dtype in ("float16", "bfloat16") else "bfloat16"
        return "int", {"bits": 4, "group_size": g, "axis": -1, "symmetric": False, "scale_dtype": sdt}

    # -- writing ----------------------------------------------------------------------------------
    def write(self, dst: str, plan: ExportPlan, ctx: Context) -> list[str]:
        layers = {t.mapped.info["layer"]: {k: t.mapped.info[k] for k in ("group_size", "bits", "mode")}
                  for t in plan.tensors if "layer" in t.mapped.info}

        def config(src: dict[str, Any] | None) -> dict[str, Any] | None:
            return mlx_config(src, layers)

        return write_safetensors(dst, plan, ctx, label="mlx", config=config, metadata={"format": "mlx"})


_KEYS = ("group_size", "bits", "mode")


def _params_of(entry: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    p = {**{k: base[k] for k in _KEYS if k in base}, **{k: entry[k] for k in _KEYS if k in entry}}
    p.setdefault("mode", "affine")
    return p


def mlx_config(src: dict[str, Any] | None, layers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """config.json for the export: the source's, with mlx-lm's ``quantization`` (defaults and
    per-layer entries, see the module docstring) as both ``quantization`` and
    ``quantization_config`` (mlx-lm's save_config writes both); without quantized layers the
    source's quantization entries are dropped."""
    cfg = {k: v for k, v in (src or {}).items() if k not in ("quantization", "quantization_config")}
    if not layers:
        return cfg
    old = (src or {}).get("quantization")
    old = old if isinstance(old, dict) else {}
    old_defaults = {k: old[k] for k in _KEYS if k in old}
    counts = Counter(tuple(p[k] for k in _KEYS) for p in layers.values())
    common = dict(zip(_KEYS, counts.most_common(1)[0][0]))
    if old_defaults and _params_of(old_defaults, {}) in [dict(zip(_KEYS, c)) for c in counts]:
        defaults = old_defaults  # the source's own defaults still describe some layers: keep them
    else:
        defaults = common
    base = _params_of(defaults, {})
    q: dict[str, Any] = dict(defaults)
    for key, entry in old.items():
        if key in _KEYS:
            continue
        if entry is False and key not in layers:
            q[key] = False
        elif isinstance(entry, dict) and key in layers and _params_of(entry, base) == dict(layers[key]):
            q[key] = entry
    for layer, p in layers.items():
        if layer not in q and dict(p) != base:
            q[layer] = dict(p)
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    return cfg
