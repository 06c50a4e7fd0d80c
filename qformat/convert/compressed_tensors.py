"""Source ``compressed-tensors``: checkpoints written by the compressed-tensors library (vLLM).

config.json holds ``quantization_config`` with ``quant_method`` ``compressed-tensors``, a
``format`` (top-level, or per config group when it is ``mixed-precision``), ``config_groups``
(each with ``targets`` and ``weights`` quantization args) and ``ignore``.  The tensors of a
quantized module ``P`` depend on the format (compressed-tensors 0.20.1, ``compressors/``):

- ``pack-quantized``: ``P.weight_packed`` I32 (codes ``q + 2^(b-1)``, 1 to 8 bits, packed
  densely, element ``i`` of a row at stream bits ``[i*b, i*b+b)``, ``pack_quantized/helpers.py``),
  ``P.weight_shape`` (the logical shape, as a tensor), ``P.weight_scale`` and, asymmetric,
  ``P.weight_zero_point`` (for group and channel strategies packed the same way along dim 0).
- ``nvfp4-pack-quantized``: ``P.weight_packed`` U8 (E2M1, element 2k in the low nibble),
  ``P.weight_scale`` F8_E4M3 per 16, ``P.weight_global_scale`` F32, a *divisor*.
- ``mxfp4-pack-quantized``: ``P.weight_packed`` U8 as above, ``P.weight_scale`` U8 holding
  E8M0 exponents (``2^(e - 127)``) per 32.
- ``float-quantized`` / ``int-quantized`` / ``naive-quantized``: ``P.weight`` stored as FP8
  E4M3 (or int8) with ``P.weight_scale`` per tensor, channel, group or 2-D block.

The library dequantizes as ``(q - zp) * scale`` in the scale's dtype (``scale / global`` first
for NVFP4), so the logical dtype is the scale's dtype (bfloat16 for the FP4 formats, whose
unpacked values are bfloat16).  Appendix C (``mapping/compressed-tensors.md``) gives the
descriptors and why they decode to the library's bits.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .base import Checkpoint, Converter, Described, quant_config_value, source_error, unsupported

#: Storage dtype of a float scale -> the logical dtype the library dequantizes to.
_SCALE_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_INT_DTYPES = ("I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64")
_FORMATS = ("pack-quantized", "nvfp4-pack-quantized", "mxfp4-pack-quantized", "float-quantized",
            "int-quantized", "naive-quantized")


def _lsb(tensor: str, element: dict[str, Any], container: int, axis: int | None) -> dict[str, Any]:
    return {"tensor": tensor, "element": element, "packing": {"container": container, "bit_order": "lsb_first", "axis": axis}}


def fp4_descriptor(codes: str, shape: list[int], dtype: str, scale: dict[str, Any], scheme: str) -> dict[str, Any]:
    """E2M1 codes two per byte along the last axis, element 2k in the low nibble (NVFP4, MXFP4)."""
    return {"shape": shape, "dtype": dtype, "scheme": scheme,
            "codes": _lsb(codes, {"type": "float", "format": "e2m1fn"}, 8, len(shape) - 1),
            "scale": scale}


def nvfp4_scale(scale: str, grid: list[int], global_scale: str, op: str) -> dict[str, Any]:
    """The NVFP4 scale: an E4M3 code per 16 along the last axis, times (or over) an F32 scalar."""
    r = len(grid)
    return {"blocks": {"type": "grid", "size": [1] * (r - 1) + [16]}, "op": "multiply",
            "encoded": {"shape": grid, "dtype": "float32",
                        "codes": _lsb(scale, {"type": "float", "format": "e4m3fn"}, 8, r - 1),
                        "scale": {"blocks": {"type": "grid", "size": [None] * r}, "op": op, "tensor": global_scale}}}


def check_shape(ck: Checkpoint, name: str, want: list[int], dtypes: tuple[str, ...], what: str) -> None:
    """``CONVERT_SOURCE_INVALID`` unless ``name`` exists with one of ``dtypes`` and shape ``want``."""
    i = ck.require(name, dtypes)
    if list(i.shape) != list(want):
        raise source_error(f"{what}: shape is {list(i.shape)}, expected {want}", tensor=name)


def _squeeze(s: list[int] | tuple[int, ...]) -> list[int]:
    return [int(x) for x in s if x != 1]


class CompressedTensors(Converter):
    name = "compressed-tensors"
    title = "compressed-tensors (pack-quantized int 1-8 bit, nvfp4/mxfp4-pack-quantized, float/int-quantized)"
    priority = 20

    def detect(self, ck: Checkpoint) -> bool:
        qc = ck.quantization_config() if ck.kind == "safetensors" else None
        return isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors"

    # -- config ---------------------------------------------------------------------------
    def _groups(self, qc: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
        """(group name, weights args, format) for every config group that quantizes weights."""
        groups = quant_config_value(qc, "config_groups", (dict,), required=True)
        top = quant_config_value(qc, "format", (str,), default=None)
        out = []
        for gname, g in groups.items():
            if not isinstance(g, dict):
                raise source_error(f"config group {gname!r} is not an object", field=f"quantization_config.config_groups.{gname}")
            w = g.get("weights")
            if w is None:
                continue
            if not isinstance(w, dict):
                raise source_error(f"config group {gname!r}: weights is not an object", field=f"quantization_config.config_groups.{gname}.weights")
            fmt = g.get("format") or top
            if not isinstance(fmt, str) or fmt == "mixed-precision":
                raise source_error(f"config group {gname!r} has no format of its own and the top-level format is {top!r}",
                                   field=f"quantization_config.config_groups.{gname}.format")
            targets = g.get("targets", [])
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise source_error(f"config group {gname!r}: targets is not a list of strings", field=f"quantization_config.config_groups.{gname}.targets")
            out.append((gname, {**w, "_targets": targets}, fmt))
        return out

    @staticmethod
    def _family(ck: Checkpoint, p: str) -> str:
        """The format the tensors of module ``p`` are in, judged from the tensors alone."""
        packed = ck.info(f"{p}.weight_packed")
        if packed is not None:
            if packed.dtype == "I32":
                return "pack-quantized"
            if f"{p}.weight_global_scale" in ck:
                return "nvfp4-pack-quantized"
            return "mxfp4-pack-quantized"
        w = ck.info(f"{p}.weight")
        return "float-quantized" if w is not None and w.dtype.startswith("F8") else "int-quantized"

    def _scheme_for(self, ck: Checkpoint, p: str, groups: list[tuple[str, dict[str, Any], str]]) -> tuple[str, dict[str, Any], str]:
        """The config group that quantized module ``p``: a name or ``re:`` target matching ``p``
        wins over a class-name target (which a checkpoint cannot check); among several, the
        ones whose format fits the tensors; they must agree."""
        fam = self._family(ck, p)
        same = {"float-quantized", "int-quantized", "naive-quantized"}

        def fits(fmt: str) -> bool:
            return fmt == fam or (fam in same and fmt in same)

        named, by_class = [], []
        for g in groups:
            hit = None
            for t in g[1]["_targets"]:
                if t.startswith("re:"):
                    try:
                        if re.match(t[3:], p):
                            hit = "name"
                    except re.error:
                        raise source_error(f"config group {g[0]!r}: target {t!r} is not a valid regular expression",
                                           field=f"quantization_config.config_groups.{g[0]}.targets") from None
                elif t == p:
                    hit = "name"
                elif hit is None and "." not in t:
                    hit = "class"
            if hit == "name":
                named.append(g)
            elif hit == "class":
                by_class.append(g)
        targeted = named or by_class
        if targeted and all(g[2] not in _FORMATS for g in targeted):
            raise unsupported(f"compressed-tensors format {targeted[0][2]!r} (config group {targeted[0][0]!r}) is not supported; "
                              f"supported: {', '.join(_FORMATS)}", tensor=f"{p}.weight")
        cands = [g for g in targeted if fits(g[2])] or [g for g in groups if fits(g[2])]
        if not cands:
            raise source_error(f"the module's tensors are {fam} but no config group with that format targets it "
                               f"(groups: {', '.join(f'{g[0]} ({g[2]})' for g in groups)})", tensor=f"{p}.weight")
        key = lambda g: ({k: v for k, v in g[1].items() if k != "_targets"}, g[2])  # noqa: E731
        if any(key(g) != key(cands[0]) for g in cands[1:]):
            raise unsupported(f"config groups {', '.join(g[0] for g in cands)} all may target this module and differ; "
                              "cannot tell which one quantized it", tensor=f"{p}.weight")
        return cands[0]

    # -- describe -------------------------------------------------------------------------
    def describe(self, ck: Checkpoint) -> Described:
        qc = ck.quantization_config()
        if not isinstance(qc, dict) or qc.get("quant_method") != "compressed-tensors":
            raise source_error("config.json has no quantization_config with quant_method 'compressed-tensors'",
                               field="quantization_config.quant_method")
        groups = self._groups(qc)
        out = Described()
        prefixes = []
        for n in ck.names():
            if n.endswith(".weight_packed"):
                prefixes.append(n[: -len(".weight_packed")])
            elif n.endswith(".weight_scale") and f"{n[:-len('.weight_scale')]}.weight" in ck:
                prefixes.append(n[: -len(".weight_scale")])
        if not prefixes:
            raise source_error("no quantized module found: expected tensors named P.weight_packed, or P.weight with P.weight_scale")
        for p in prefixes:
            gname, w, fmt = self._scheme_for(ck, p, groups)
            if fmt not in _FORMATS:
                raise unsupported(f"compressed-tensors format {fmt!r} (config group {gname!r}) is not supported; "
                                  f"supported: {', '.join(_FORMATS)}", tensor=f"{p}.weight")
            if fmt == "pack-quantized":
                self._pack(ck, p, w, out)
            elif fmt == "nvfp4-pack-quantized":
                self._fp4(ck, p, w, out, nv=True)
            elif fmt == "mxfp4-pack-quantized":
                self._fp4(ck, p, w, out, nv=False)
            else:
                self._naive(ck, p, w, out)
        return out

    @staticmethod
    def _args(w: dict[str, Any], p: str) -> tuple[int, str, str, int | None, bool, list[int] | None]:
        def val(key: str, kinds: tuple[type, ...], default: Any) -> Any:
            v = w.get(key, default)
            if v is not None and (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds)):
                raise source_error(f"weights.{key} is {v!r}, expected {' or '.join(k.__name__ for k in kinds)}", field=f"quantization_config.weights.{key}")
            return v
        bits = val("num_bits", (int,), 8)
        typ = val("type", (str,), "int")
        strategy = val("strategy", (str,), None)
        gs = val("group_size", (int,), None)
        sym = val("symmetric", (bool,), True)
        block = val("block_structure", (list,), None)
        if strategy is None:  # the library infers it from group_size (QuantizationArgs.validate_model_after)
            strategy = "group" if gs is not None and gs > 0 else ("channel" if gs == -1 else "tensor")
        if block is not None and (len(block) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise source_error(f"weights.block_structure is {block!r}, expected two positive integers", field="quantization_config.weights.block_structure")
        return bits, typ, strategy, gs, sym, block

    @staticmethod
    def _grid(strategy: str, shape: list[int], gs: int | None, block: list[int] | None, p: str) -> list[int | None]:
        """Grid block sizes of the scale for a logical ``shape`` (compressed-tensors initialize_qparams)."""
        r = len(shape)
        if strategy == "tensor":
            return [None] * r
        if strategy == "channel":
            return [1] * (r - 1) + [None]
        if strategy in ("group", "tensor_group"):
            if gs is None or gs <= 0:
                raise source_error(f"strategy {strategy} needs a positive group_size, found {gs!r}", field="quantization_config.weights.group_size")
            return [1] * (r - 1) + [gs]
        if strategy == "block":
            if block is None or r != 2:
                raise source_error(f"strategy block needs block_structure [rows, cols] and a 2-D weight; found {block!r} and shape {shape}", tensor=f"{p}.weight_scale")
            return list(block)
        raise unsupported(f"weight quantization strategy {strategy!r} is not supported (tensor, channel, group, tensor_group, block are)", tensor=f"{p}.weight")

    @staticmethod
    def _cells(shape: list[int], size: list[int | None]) -> list[int]:
        return [1 if s is None else -(-n // s) for n, s in zip(shape, size)]

    def _plain_param(self, ck: Checkpoint, name: str, shape: list[int], size: list[int | None], dtypes: tuple[str, ...], op: str | None) -> dict[str, Any]:
        grid = self._cells(shape, size)
        i = ck.require(name, dtypes)
        if _squeeze(i.shape) != _squeeze(grid):
            raise source_error(f"shape is {list(i.shape)}, expected {grid} (one value per block of {size} over the weight {shape})", tensor=name)
        par: dict[str, Any] = {"blocks": {"type": "grid", "size": size}, "tensor": name}
        if op:
            par["op"] = op
        return par

    def _scale_dtype(self, ck: Checkpoint, name: str) -> str:
        i = ck.require(name, tuple(_SCALE_DTYPES))
        return _SCALE_DTYPES[i.dtype]

    def _pack(self, ck: Checkpoint, p: str, w: dict[str, Any], out: Described) -> None:
        bits, typ, strategy, gs, sym, block = self._args(w, p)
        packed = f"{p}.weight_packed"
        if typ != "int" or not 1 <= bits <= 8:
            raise source_error(f"pack-quantized holds int weights of 1 to 8 bits; the config says type {typ!r}, num_bits {bits}", tensor=packed)
        pi = ck.require(packed, ("I32",))
        if len(pi.shape) < 2:
            raise source_error(f"shape is {list(pi.shape)}, expected rank 2 or more", tensor=packed)
        shp = f"{p}.weight_shape"
        si = ck.require(shp, _INT_DTYPES, rank=1)
        if si.shape[0] != len(pi.shape):
            raise source_error(f"holds {si.shape[0]} entries, expected {len(pi.shape)} (the rank of {packed})", tensor=shp)
        shape = [int(x) for x in ck.array(shp).tolist()]
        if shape[:-1] != list(pi.shape[:-1]) or shape[-1] < 0 or -(-shape[-1] * bits // 32) != pi.shape[-1]:
            raise source_error(f"logical shape {shape} does not fit {packed} {list(pi.shape)}: "
                               f"expected {shape[:-1] + [-(-max(shape[-1], 0) * bits // 32)]} for {bits}-bit codes", tensor=shp)
        r = len(shape)
        size = self._grid(strategy, shape, gs, block, p)
        dtype = self._scale_dtype(ck, f"{p}.weight_scale")
        desc: dict[str, Any] = {
            "shape": shape, "dtype": dtype, "scheme": "int",
            "codes": _lsb(packed, {"type": "int", "bits": bits, "signedness": "offset_binary"}, 32, r - 1),
        }
        if not sym:
            zp = f"{p}.weight_zero_point"
            if strategy in ("group", "channel"):
                # PackedQuantizationCompressor.compress: pack_to_int32(zero_point, b, packed_dim=0).
                grid = self._cells(shape, size)
                zi = ck.require(zp, ("I32",))
                want = grid[:-2] + [-(-grid[-2] * bits // 32), grid[-1]]
                if list(zi.shape) != want:
                    raise source_error(f"shape is {list(zi.shape)}, expected {want} ({bits}-bit zero points of a {grid} grid packed along dim {r - 2})", tensor=zp)
                desc["zero"] = {"blocks": {"type": "grid", "size": size},
                                "encoded": {"shape": grid, "dtype": "float32",
                                            "codes": _lsb(zp, {"type": "int", "bits": bits, "signedness": "offset_binary"}, 32, r - 2)}}
            else:
                desc["zero"] = self._plain_param(ck, zp, shape, size, ("I8", "I16", "I32"), None)
        desc["scale"] = self._plain_param(ck, f"{p}.weight_scale", shape, size, tuple(_SCALE_DTYPES), "multiply")
        out.descriptors[f"{p}.weight"] = desc

    def _fp4(self, ck: Checkpoint, p: str, w: dict[str, Any], out: Described, nv: bool) -> None:
        bits, typ, strategy, gs, sym, _ = self._args(w, p)
        packed = f"{p}.weight_packed"
        block = 16 if nv else 32
        if typ != "float" or bits != 4 or gs != block:
            raise source_error(f"{'nv' if nv else 'mx'}fp4-pack-quantized holds float 4-bit weights in groups of {block}; "
                               f"the config says type {typ!r}, num_bits {bits}, group_size {gs!r}", tensor=packed)
        if not sym:
            raise unsupported("asymmetric FP4 (a weight_zero_point) is not supported", tensor=packed)
        pi = ck.require(packed, ("U8",), rank=2)
        n, k = pi.shape[0], pi.shape[1] * 2
        shape = [n, k]
        scale = f"{p}.weight_scale"
        grid = [n, -(-k // block)]
        if nv:
            check_shape(ck, scale, grid, ("F8_E4M3",), f"an E4M3 scale per {block} of the weight {shape}")
            gscale = f"{p}.weight_global_scale"
            gi = ck.require(gscale, ("F32",))
            if math.prod(gi.shape) != 1:
                raise source_error(f"shape is {list(gi.shape)}, expected one value ([] or [1])", tensor=gscale)
            par = nvfp4_scale(scale, grid, gscale, "divide")
            out.descriptors[f"{p}.weight"] = fp4_descriptor(packed, shape, "bfloat16", par, "nvfp4")
        else:
            check_shape(ck, scale, grid, ("U8",), f"an E8M0 exponent per {block} of the weight {shape}")
            # A U8 plain parameter would be read as an integer: describe it as e8m0fnu codes.
            par = {"blocks": {"type": "grid", "size": [1, block]}, "op": "multiply",
                   "encoded": {"shape": grid, "dtype": "float32", "codes": _lsb(scale, {"type": "float", "format": "e8m0fnu"}, 8, 1)}}
            out.descriptors[f"{p}.weight"] = fp4_descriptor(packed, shape, "bfloat16", par, "mxfp4")

    def _naive(self, ck: Checkpoint, p: str, w: dict[str, Any], out: Described) -> None:
        bits, typ, strategy, gs, sym, block = self._args(w, p)
        weight = f"{p}.weight"
        if typ == "float":
            if bits != 8:
                raise unsupported(f"float-quantized with num_bits {bits} (only FP8 E4M3 is supported)", tensor=weight)
            wi = ck.require(weight, ("F8_E4M3",))
            element: dict[str, Any] = {"type": "float", "format": "e4m3fn"}
            scheme = "fp8_e4m3"
        else:
            if bits != 8:
                raise unsupported(f"int-quantized with num_bits {bits} (only int8 is stored unpacked)", tensor=weight)
            wi = ck.require(weight, ("I8",))
            element = {"type": "int", "bits": 8, "signedness": "twos_complement"}
            scheme = "int"
        shape = list(wi.shape)
        if not shape:
            raise source_error("shape is [], expected rank 1 or more", tensor=weight)
        size = self._grid(strategy, shape, gs, block, p)
        dtype = self._scale_dtype(ck, f"{p}.weight_scale")
        desc: dict[str, Any] = {"shape": shape, "dtype": dtype, "scheme": scheme,
                                "codes": _lsb(weight, element, 8, len(shape) - 1)}
        if not sym:
            if typ == "float":
                raise unsupported("asymmetric float-quantized weights (a float zero point) are not supported", tensor=weight)
            desc["zero"] = self._plain_param(ck, f"{p}.weight_zero_point", shape, size, ("I8", "I16", "I32"), None)
        desc["scale"] = self._plain_param(ck, f"{p}.weight_scale", shape, size, tuple(_SCALE_DTYPES), "multiply")
        out.descriptors[weight] = desc
