"""Target ``compressed-tensors``: checkpoints the compressed-tensors library (and vLLM,
transformers) loads, as compressed-tensors 0.20.1 writes them.

A quantized weight ``P.weight`` [N, K] becomes the tensors of one of the library's formats
(``compressors/``), and config.json gets a ``quantization_config`` describing every quantized
module exactly: one config group per distinct weights arguments, targeting the module names
themselves, and every unquantized 2-D ``*.weight`` in ``ignore``.

- ``pack-quantized`` (int, 1-8 bits; 8 bits unless the source says ``int-quantized``):
  ``P.weight_packed`` I32 (``q + 2^(b-1)``, densely packed, element ``i`` of a row at stream
  bits ``[i*b, i*b+b)``), ``P.weight_shape`` I64, ``P.weight_scale``, asymmetric
  ``P.weight_zero_point`` (group / channel: packed the same way along dim 0; tensor / block: I8).
- ``int-quantized`` (int8) / ``float-quantized`` (FP8 E4M3): ``P.weight`` I8 / F8_E4M3 and
  ``P.weight_scale`` (and an I8 ``P.weight_zero_point``).
- ``nvfp4-pack-quantized``: ``P.weight_packed`` U8 (E2M1, element 2k in the low nibble),
  ``P.weight_scale`` F8_E4M3 per 16 and ``P.weight_global_scale`` F32 [1], a divisor.
- ``mxfp4-pack-quantized``: ``P.weight_packed`` U8 and ``P.weight_scale`` U8 E8M0 exponents per 32.

The library dequantizes (``quantization/lifecycle/forward.py`` ``_dequantize``) as
``(q.to(S) - zp.to(S)) * scale`` in the scale's dtype S (torch computes a bfloat16 / float16
product in binary32 and rounds it once to S); NVFP4 first divides its bfloat16 block scale by
the float32 global scale (binary32), multiplies in binary32 and rounds to bfloat16.  Each
:class:`~.base.Mapped` below carries that rule in NumPy.  The scale is written in the tensor's
logical dtype (transformers and vLLM load it into a parameter of the model's dtype), so the
library's result is in the logical dtype and is compared with qformat's values in it; a scale
stored in another dtype (say float16 scales of a bfloat16 tensor) is refused, and
``--allow-rounding`` re-encodes with scales in the logical dtype.  SPEC.md
Appendix D gives the table.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import numpy as np

from ..container import TensorSpec
from ..descriptor import Descriptor, Param
from ..dtypes import logical_numpy
from .base import Context, ExportPlan, Mapped, Parts, Refusal, Target, block_sizes, int_element, plain_mapped, require

#: compressed-tensors release whose format is written (config ``version``).
FORMAT_VERSION = "0.20.1"
#: logical dtype -> safetensors dtype of a scale the library dequantizes in that dtype
_SCALE_STORAGE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_INT_FORMATS = ("int-quantized", "naive-quantized")
_FP8_FORMATS = ("float-quantized", "naive-quantized")


# -- bit packing (compressors/pack_quantized/helpers.py) ----------------------------------------------
#: Rows per chunk of the bit-level pack/unpack: their bit streams are 8 to 32 times the codes, so
#: they are made a few rows at a time (about 4 M bits each) instead of for the whole tensor.
_CHUNK_BITS = 1 << 22


def _row_step(cols: int, bits: int) -> int:
    return max(1, _CHUNK_BITS // max(1, cols * bits))


def pack_int32(u: np.ndarray, bits: int) -> np.ndarray:
    """``pack_to_int32`` along the last axis: unsigned b-bit values, element i of a row at
    bits [i*b, i*b+b) of the row's little-endian word stream, zero padded."""
    rows, cols = u.shape
    words = -(-cols * bits // 32)
    out = np.empty((rows, words), np.int32)
    shifts = np.arange(bits, dtype=np.uint8)
    step = _row_step(cols, bits)
    for lo in range(0, rows, step):
        part = u[lo : lo + step].astype(np.uint8)
        n = part.shape[0]
        stream = np.zeros((n, words * 32), np.uint8)
        stream[:, : cols * bits] = ((part[..., None] >> shifts) & 1).reshape(n, cols * bits)
        out[lo : lo + n] = np.packbits(stream, axis=1, bitorder="little").view("<u4").view(np.int32).reshape(n, words)
    return out


def unpack_int32(w: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """``unpack_from_int32`` along the last axis, before the offset: unsigned values (int32)."""
    rows = w.shape[0]
    words = np.ascontiguousarray(w).astype("<i4").view(np.uint8).reshape(rows, -1)
    out = np.empty((rows, cols), np.int32)
    step = _row_step(cols, bits)
    for lo in range(0, rows, step):
        part = words[lo : lo + step]
        n = part.shape[0]
        b = np.unpackbits(part, axis=1, bitorder="little")[:, : cols * bits].reshape(n, cols, bits)
        acc = np.zeros((n, cols), np.int32)
        for i in range(bits):
            acc |= b[..., i].astype(np.int32) << i
        out[lo : lo + n] = acc
    return out


# -- value tables ---------------------------------------------------------------------------------------
def _float_table(fmt: str) -> np.ndarray:
    from ..elements import float_lut

    return np.asarray(float_lut(fmt), np.float32)


def _expand(s: np.ndarray, sizes: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """A [rows, cols] scale grid repeated over blocks of ``sizes`` and cut to ``shape`` (as the
    library's group / block reshapes and padding do)."""
    g = s.reshape(-(-shape[0] // sizes[0]), -(-shape[1] // sizes[1]))
    return np.repeat(np.repeat(g, sizes[0], axis=0), sizes[1], axis=1)[: shape[0], : shape[1]]


def _in_dtype(v32: np.ndarray, dtype: str) -> np.ndarray:
    """Binary32 values rounded once to ``dtype`` (torch's CPU bfloat16 / float16 arithmetic
    computes in binary32 and rounds the result), widened back to binary32."""
    if dtype == "float32":
        return v32.astype(np.float32)
    with np.errstate(over="ignore"):
        return v32.astype(np.float32).astype(logical_numpy(dtype)).astype(np.float32)


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, np.float32)


# -- strategies -----------------------------------------------------------------------------------------
def _strategy(p: Param, shape: tuple[int, int]) -> tuple[dict[str, Any], tuple[int, int], list[int]]:
    """(weights args of the strategy, block sizes, the library's scale shape) of a scale grid."""
    sizes = block_sizes(p, shape)
    require(sizes is not None, "the scale's blocks are not a grid (flat blocks or a group index)")
    n, k = shape
    bh, bw = sizes  # type: ignore[misc]
    if bh >= n and bw >= k:
        return {"strategy": "tensor", "group_size": None}, (n, k), [1]
    if bh == 1 and bw >= k:
        return {"strategy": "channel", "group_size": None}, (1, k), [n, 1]
    if bh == 1:
        require(k % bw == 0, f"groups of {bw} do not divide the {k} columns (the library's _process_group needs whole groups)")
        return {"strategy": "group", "group_size": bw}, (1, bw), [n, k // bw]
    return ({"strategy": "block", "group_size": None, "block_structure": [bh, bw]}, (bh, bw), [-(-n // bh), -(-k // bw)])


def _scale_param(desc: Descriptor, ctx: Context) -> tuple[Param, str]:
    """The stored, multiplying scale and the dtype it is written in: the logical dtype.  The
    library dequantizes in the scale's dtype, and transformers and vLLM load the scale into a
    parameter of the model's dtype, so a scale in another dtype would be rounded there: only a
    scale stored in the logical dtype, or widened exactly to float32, maps."""
    p = desc.scale
    require(p is not None, "there is no scale")
    require(p.op == "multiply", f"the scale's op is {p.op!r}; compressed-tensors multiplies")  # type: ignore[union-attr]
    require(p.encoded is None, "the scale is encoded (a nested descriptor); compressed-tensors stores it plainly")  # type: ignore[union-attr]
    info = ctx.source.info(p.tensor)  # type: ignore[union-attr,arg-type]
    if info is None:  # a descriptor planned for --allow-rounding: :meth:`fallback` stores its scale in the logical dtype
        return p, desc.dtype  # type: ignore[return-value]
    require(info.dtype == _SCALE_STORAGE[desc.dtype] or (desc.dtype == "float32" and info.dtype in ("F16", "BF16")),
            f"the scale is stored as {info.dtype} and the tensor is {desc.dtype}: compressed-tensors dequantizes in the scale's "
            "dtype and transformers / vLLM hold the scale in the model's dtype, so it would be rounded")
    return p, desc.dtype  # type: ignore[return-value]


def _module_format(ctx: Context, module: str) -> str | None:
    """The format the source's own compressed-tensors config gives ``module`` (a name or
    ``re:`` target), so that a compressed-tensors source keeps its format; None otherwise."""
    cfg = ctx.config or {}
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
        return None
    top = qc.get("format")
    found = set()
    for g in (qc.get("config_groups") or {}).values():
        if not isinstance(g, dict) or not isinstance(g.get("weights"), dict):
            continue
        for t in g.get("targets") or []:
            if isinstance(t, str) and (t == module or (t.startswith("re:") and _matches(t[3:], module)) or "." not in t):
                found.add(g.get("format") or top)
    return found.pop() if len(found) == 1 else None


def _matches(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


# -- the target -----------------------------------------------------------------------------------------
class CompressedTensors(Target):
    """compressed-tensors 0.20.1 checkpoints (see the module docstring)."""

    name = "compressed-tensors"
    title = "compressed-tensors (llm-compressor): pack-quantized, int/float-quantized, nvfp4, mxfp4"
    # Scales in the logical dtype (the int scheme's default): what transformers and vLLM load.
    exact_schemes = (("int", {"bits": 8, "group_size": None}), ("int", {"bits": 4, "group_size": 32}),
                     ("int", {"bits": 4, "group_size": 128, "symmetric": False}), ("mxfp4", {}))

    def __init__(self) -> None:
        #: modules whose weight is quantized (planned first: described tensors come before plain ones)
        self._quantized: set[str] = set()

    # -- map ------------------------------------------------------------------------------------
    def map(self, name: str, desc: Descriptor | None, ctx: Context) -> Mapped:
        if desc is None:
            return self._plain(name, ctx)
        require(name.endswith(".weight"), "compressed-tensors quantizes module weights (a tensor named P.weight)")
        require(len(desc.shape) == 2, f"the tensor has rank {len(desc.shape)}; compressed-tensors' compressors here take [N, K] weights")
        require(desc.bias is None, "the descriptor adds a bias; compressed-tensors has no additive parameter")
        require(desc.dtype in _SCALE_STORAGE, f"logical dtype {desc.dtype} (the library dequantizes to float32, float16 or bfloat16)")
        module = name[: -len(".weight")]
        el = desc.codes.element
        if el.type == "int":
            mapped = self._int(module, desc, ctx)
        elif el.type == "float" and el.format == "e4m3fn":
            mapped = self._fp8(module, desc, ctx)
        elif el.type == "float" and el.format == "e2m1fn":
            mapped = self._fp4(module, desc, ctx)
        else:
            raise Refusal(f"{el.type} element {el.format or el.bits}: compressed-tensors holds int 1-8 bit, FP8 E4M3 and FP4 E2M1 weights")
        self._quantized.add(module)
        return mapped

    def _plain(self, name: str, ctx: Context) -> Mapped:
        info = ctx.source.info(name)
        assert info is not None
        if name.endswith(".weight_shape") and name[: -len(".weight_shape")] in self._quantized:
            # an in-place compressed-tensors source keeps weight_shape; its weight's mapping writes it
            return Mapped("dropped", [], lambda _p: {})
        m = plain_mapped(name, info.dtype, info.shape)
        if name.endswith(".weight") and len(info.shape) >= 2:
            m.info["ignore"] = name[: -len(".weight")]
        return m

    def _int(self, p: str, desc: Descriptor, ctx: Context) -> Mapped:
        ie = int_element(desc.codes.element)
        require(ie is not None, "an int element with a code offset or fraction bits")
        bits, sign = ie  # type: ignore[misc]
        require(1 <= bits <= 8, f"{bits}-bit integers (pack-quantized holds 1 to 8)")
        shape = (int(desc.shape[0]), int(desc.shape[1]))
        scale, sdt = _scale_param(desc, ctx)
        args, sizes, sshape = _strategy(scale, shape)
        zero = desc.zero
        if zero is not None:
            require(zero.blocks == scale.blocks, "the zero point's blocks differ from the scale's")
        # compressed-tensors codes are signed b-bit q with (q - zp) * s; unsigned codes u shift
        # to q = u - 2^(b-1) with zp = z - 2^(b-1) (z = 0 without a zero point).
        shift = 0 if sign in ("twos_complement", "offset_binary") else 1 << (bits - 1)
        sym = zero is None and shift == 0
        hint = _module_format(ctx, p)
        fmt = hint if bits == 8 and hint in _INT_FORMATS else "pack-quantized"
        packed_zp = fmt == "pack-quantized" and args["strategy"] in ("group", "channel")
        n, k = shape
        specs = [TensorSpec(f"{p}.weight_scale", _SCALE_STORAGE[sdt], tuple(sshape))]
        if fmt == "pack-quantized":
            specs = [TensorSpec(f"{p}.weight_packed", "I32", (n, -(-k * bits // 32)))] + specs + [TensorSpec(f"{p}.weight_shape", "I64", (2,))]
        else:
            specs = [TensorSpec(f"{p}.weight", "I8", shape)] + specs
        if not sym:
            zshape = (-(-sshape[0] * bits // 32), sshape[1]) if packed_zp else tuple(sshape)
            specs.append(TensorSpec(f"{p}.weight_zero_point", "I32" if packed_zp else "I8", zshape))
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        zlo, zhi = (lo, hi) if packed_zp else (-128, 127)

        def build(parts: Parts) -> dict[str, np.ndarray]:
            q = parts.element_values()[parts.codes()].astype(np.int32) - shift
            out: dict[str, np.ndarray] = {f"{p}.weight_scale": parts.values("scale").astype(logical_numpy(sdt)).reshape(sshape)}
            if fmt == "pack-quantized":
                out[f"{p}.weight_packed"] = pack_int32((q - lo).astype(np.uint8), bits)
                out[f"{p}.weight_shape"] = np.array(shape, np.int64)
            else:
                out[f"{p}.weight"] = q.astype(np.int8)
            if not sym:
                zv = parts.values("zero") if zero is not None else np.zeros(sshape, np.float32)
                # a zero point outside the library's range (or not an integer) cannot be written:
                # clipped here, the decode below then differs and the export is refused as inexact
                zp = np.clip(np.rint(zv.astype(np.float64)) - shift, zlo, zhi).astype(np.int32).reshape(sshape)
                out[f"{p}.weight_zero_point"] = pack_int32((zp - lo).T.astype(np.uint8), bits).T.copy() if packed_zp else zp.astype(np.int8)
            return out

        def decode(a: Mapping[str, np.ndarray]) -> np.ndarray:
            if fmt == "pack-quantized":
                q = unpack_int32(a[f"{p}.weight_packed"], bits, k) + lo
            else:
                q = a[f"{p}.weight"].astype(np.int32)
            v = q.astype(np.float32)
            if not sym:
                z = a[f"{p}.weight_zero_point"]
                zp = unpack_int32(z.T, bits, sshape[0]).T + lo if packed_zp else z.astype(np.int32)
                v = v - _expand(zp.astype(np.float32), sizes, shape)  # exact: integers below 2^9
            s = _expand(_f32(a[f"{p}.weight_scale"]), sizes, shape)
            return _in_dtype(v * s, sdt)

        args = {**args, "num_bits": bits, "type": "int", "symmetric": sym}
        return Mapped(f"{fmt} int{bits} {args['strategy']}{'' if args['group_size'] is None else ' g' + str(args['group_size'])}"
                      f"{'' if sym else ' asym'}", specs, build, decode, info={"module": p, "format": fmt, "weights": args},
                      in_dtype=sdt == desc.dtype)

    def _fp8(self, p: str, desc: Descriptor, ctx: Context) -> Mapped:
        require(desc.zero is None, "a zero point on FP8 codes (compressed-tensors' float formats are symmetric)")
        shape = (int(desc.shape[0]), int(desc.shape[1]))
        scale, sdt = _scale_param(desc, ctx)
        args, sizes, sshape = _strategy(scale, shape)
        hint = _module_format(ctx, p)
        fmt = hint if hint in _FP8_FORMATS else "float-quantized"
        table = _float_table("e4m3fn")
        specs = [TensorSpec(f"{p}.weight", "F8_E4M3", shape), TensorSpec(f"{p}.weight_scale", _SCALE_STORAGE[sdt], tuple(sshape))]

        def build(parts: Parts) -> dict[str, np.ndarray]:
            import ml_dtypes

            return {f"{p}.weight": parts.codes().view(ml_dtypes.float8_e4m3fn),
                    f"{p}.weight_scale": parts.values("scale").astype(logical_numpy(sdt)).reshape(sshape)}

        def decode(a: Mapping[str, np.ndarray]) -> np.ndarray:
            v = table[np.asarray(a[f"{p}.weight"]).view(np.uint8)]  # E4M3 -> S is exact for every S here
            return _in_dtype(v * _expand(_f32(a[f"{p}.weight_scale"]), sizes, shape), sdt)

        args = {**args, "num_bits": 8, "type": "float", "symmetric": True}
        return Mapped(f"{fmt} fp8 {args['strategy']}", specs, build, decode, info={"module": p, "format": fmt, "weights": args},
                      in_dtype=sdt == desc.dtype)

    def _fp4(self, p: str, desc: Descriptor, ctx: Context) -> Mapped:
        require(desc.zero is None, "a zero point on FP4 codes (the library's FP4 formats are symmetric)")
        shape = (int(desc.shape[0]), int(desc.shape[1]))
        n, k = shape
        sp = desc.scale
        require(sp is not None and sp.op == "multiply", "FP4 codes need a multiplying block scale")
        sizes = block_sizes(sp, shape)  # type: ignore[arg-type]
        require(sizes is not None and sizes[0] == 1 and sizes[1] in (16, 32), "FP4 block scales must be row groups of 16 (NVFP4) or 32 (MXFP4)")
        g = int(sizes[1])  # type: ignore[index]
        require(k % g == 0, f"groups of {g} do not divide the {k} columns")
        e2m1 = _float_table("e2m1fn")
        out_dtype = "bfloat16"  # unpack_fp4_from_uint8 gives bfloat16 and the library dequantizes to it
        specs = [TensorSpec(f"{p}.weight_packed", "U8", (n, k // 2))]
        if g == 16:
            # e2m1 * (e4m3 / G) rounded to bfloat16 is not the binary32 value of another dtype
            require(desc.dtype == "bfloat16", f"the library decompresses NVFP4 to bfloat16; the tensor's dtype is {desc.dtype}")
            global_of = self._nv_scale(sp, ctx)  # type: ignore[arg-type]
            specs += [TensorSpec(f"{p}.weight_scale", "F8_E4M3", (n, k // 16)), TensorSpec(f"{p}.weight_global_scale", "F32", (1,))]
            e4m3 = _float_table("e4m3fn")
            fmt = "nvfp4-pack-quantized"
            args = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
                    "scale_dtype": "torch.float8_e4m3fn"}

            def build(parts: Parts) -> dict[str, np.ndarray]:
                import ml_dtypes

                codes, divisor = global_of(parts)
                return {f"{p}.weight_packed": _pack_nibbles(parts.codes()), f"{p}.weight_scale": codes.view(ml_dtypes.float8_e4m3fn),
                        f"{p}.weight_global_scale": np.array([divisor], np.float32)}

            def decode(a: Mapping[str, np.ndarray]) -> np.ndarray:
                s = e4m3[np.asarray(a[f"{p}.weight_scale"]).view(np.uint8)] / _f32(a[f"{p}.weight_global_scale"])[0]  # binary32
                v = e2m1[_unpack_nibbles(a[f"{p}.weight_packed"])]
                return _in_dtype(v * _expand(s.astype(np.float32), (1, 16), shape), out_dtype)
        else:
            exps = self._mx_scale(sp, ctx)  # type: ignore[arg-type]
            specs += [TensorSpec(f"{p}.weight_scale", "U8", (n, k // 32))]
            fmt = "mxfp4-pack-quantized"
            args = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32, "scale_dtype": "torch.uint8"}

            def build(parts: Parts) -> dict[str, np.ndarray]:
                return {f"{p}.weight_packed": _pack_nibbles(parts.codes()), f"{p}.weight_scale": exps(parts)}

            def decode(a: Mapping[str, np.ndarray]) -> np.ndarray:
                e = np.asarray(a[f"{p}.weight_scale"]).astype(np.int32) - 127
                # decompress_mx_scale: 2.0 ** e in bfloat16 (e = 128, the NaN code, gives +Inf)
                with np.errstate(over="ignore"):
                    s = _in_dtype(np.ldexp(np.float32(1), e).astype(np.float32), "bfloat16")
                v = e2m1[_unpack_nibbles(a[f"{p}.weight_packed"])]
                return _in_dtype(v * _expand(s, (1, 32), shape), out_dtype)

        return Mapped(f"{fmt}", specs, build, decode, info={"module": p, "format": fmt, "weights": args},
                      in_dtype=desc.dtype == out_dtype)

    @staticmethod
    def _nv_scale(sp: Param, ctx: Context) -> Callable[[Parts], tuple[np.ndarray, float]]:
        """NVFP4's block scale: E4M3 codes (encoded, times or over an F32 scalar; or stored
        F8_E4M3 alone, divisor 1) -> (codes, the divisor the library divides by)."""
        if sp.encoded is None:
            info = ctx.source.info(sp.tensor)  # type: ignore[arg-type]
            require(info is not None and info.dtype == "F8_E4M3", "the NVFP4 block scale is not E4M3")

            def plain(parts: Parts) -> tuple[np.ndarray, float]:
                return np.ascontiguousarray(parts.grid("scale")).view(np.uint8), 1.0

            return plain
        nd = sp.encoded
        require(nd.codes.element.type == "float" and nd.codes.element.format == "e4m3fn", "the block scale's codes are not E4M3")
        require(nd.dtype == "float32", f"the block scale decodes to {nd.dtype}; the library keeps it in binary32")
        require(nd.zero is None and nd.bias is None, "the block scale has a zero point or bias")
        gp = nd.scale
        require(gp is not None and gp.encoded is None and gp.op in ("multiply", "divide"), "the block scale's own scale is not one stored number")
        require(all(s is None or s >= n for s, n in zip(gp.blocks.size, nd.shape)) if gp.blocks.type == "grid" else False,  # type: ignore[union-attr]
                "the block scale's own scale is not one number for the whole tensor")
        table = _float_table("e4m3fn")

        def encoded(parts: Parts) -> tuple[np.ndarray, float]:
            nested = parts.nested("scale")
            g = float(nested.values("scale").reshape(-1)[0])
            if gp.op == "divide":  # type: ignore[union-attr]
                return nested.codes(), g
            return nested.codes(), _divisor_for(g, table)

        return encoded

    @staticmethod
    def _mx_scale(sp: Param, ctx: Context) -> Callable[[Parts], np.ndarray]:
        """MXFP4's E8M0 exponents: stored F8_E8M0, or encoded ``e8m0fnu`` codes."""
        if sp.encoded is None:
            info = ctx.source.info(sp.tensor)  # type: ignore[arg-type]
            require(info is not None and info.dtype == "F8_E8M0", "the MXFP4 block scale is not stored as E8M0")
            return lambda parts: np.ascontiguousarray(parts.grid("scale")).view(np.uint8)
        nd = sp.encoded
        require(nd.codes.element.type == "float" and nd.codes.element.format == "e8m0fnu" and nd.scale is None and nd.zero is None
                and nd.bias is None, "the MXFP4 block scale is not plain E8M0 codes")
        return lambda parts: parts.nested("scale").codes()

    # -- fallback -----------------------------------------------------------------------------------
    def fallback(self, name: str, desc: Descriptor, ctx: Context) -> tuple[str, dict[str, Any]] | None:
        """Symmetric int codes (the source's width, else 4 bits, 8 for 8-bit floats) in groups
        of the source's row groups or 32 where they divide the row, else per channel; the
        scale in the logical dtype, so the library dequantizes in it."""
        if not name.endswith(".weight") or len(desc.shape) != 2 or desc.dtype not in _SCALE_STORAGE:
            return None
        el = desc.codes.element
        bits = el.bits if el.type == "int" and 2 <= el.bits <= 8 else (8 if el.bits >= 8 else 4)
        k = int(desc.shape[1])
        g = block_sizes(desc.scale, tuple(desc.shape)) if desc.scale is not None else None
        gs = g[1] if g is not None and g[0] == 1 and g[1] < k and k % g[1] == 0 else (32 if k % 32 == 0 and k > 32 else None)
        return "int", {"bits": bits, "group_size": gs, "symmetric": True, "scale_dtype": desc.dtype}

    # -- write --------------------------------------------------------------------------------------
    def write(self, dst: str, plan: ExportPlan, ctx: Context) -> list[str]:
        from .safetensors_out import write_safetensors

        qc = quantization_config(plan)
        return write_safetensors(dst, plan, ctx, label="compressed-tensors",
                                 config=lambda cfg: {**{k: v for k, v in (cfg or {}).items() if k != "quantization_config"}, "quantization_config": qc})


def _divisor_for(g: float, table: np.ndarray) -> float:
    """A binary32 divisor G with fp32(s / G) == fp32(s * g) for every finite E4M3 value s, so
    the library's ``scale / global_scale`` gives qformat's ``scale * g``; the nearest candidate
    to 1/g when none does (the export's check then refuses the values that differ)."""
    s = table[np.isfinite(table) & (table != 0)]
    gg = np.float32(g)
    want = s * gg
    first = np.float32(1) / gg
    cand = [first, np.nextafter(first, np.float32(np.inf)), np.nextafter(first, np.float32(0))]
    for c in cand:
        if np.isfinite(c) and c != 0:
            with np.errstate(all="ignore"):
                if np.array_equal((s / c).view(np.uint32), want.view(np.uint32)):
                    return float(c)
    return float(first)


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """pack_fp4_to_uint8: element 2k in the low nibble, 2k+1 in the high one."""
    c = codes.astype(np.uint8)
    return (c[:, 0::2] & 0xF) | ((c[:, 1::2] & 0xF) << 4)


def _unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    a = np.asarray(packed, np.uint8)
    return np.stack((a & 0xF, a >> 4), axis=-1).reshape(a.shape[0], -1)


def quantization_config(plan: ExportPlan) -> dict[str, Any]:
    """config.json's ``quantization_config`` for the planned tensors: one config group per
    distinct (format, weights arguments), its ``targets`` the module names it covers exactly;
    ``ignore`` lists every unquantized 2-D weight's module."""
    groups: dict[str, dict[str, Any]] = {}
    ignore: list[str] = []
    for t in plan.tensors:
        info = t.mapped.info
        if "ignore" in info:
            ignore.append(info["ignore"])
        if "module" not in info:
            continue
        w = {"dynamic": False, "group_size": None, **info["weights"]}
        key = repr((info["format"], sorted(w.items())))
        g = groups.setdefault(key, {"format": info["format"], "input_activations": None, "output_activations": None,
                                    "targets": [], "weights": dict(sorted(w.items()))})
        g["targets"].append(info["module"])
    formats = {g["format"] for g in groups.values()}
    return {
        "config_groups": {f"group_{i}": g for i, g in enumerate(groups.values())},
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "global_compression_ratio": None,
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": FORMAT_VERSION,
    }
