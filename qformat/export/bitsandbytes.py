"""Target ``bitsandbytes``: 4-bit NF4 / FP4 weights as transformers saves a bnb 4-bit model.

Each 4-bit tensor ``P.weight`` (``n`` elements, block size ``B``, ``nb = ceil(n/B)`` blocks)
becomes the tensors ``QuantState.as_dict(packed=True)`` writes (bitsandbytes/functional.py):

- ``P.weight``: ``U8 [ceil(n/2), 1]``, the codes of the flattened tensor, element ``2k`` in the
  high nibble of byte ``k``; an odd tail is padded with the code of 0.0, as ``quantize_4bit`` does;
- ``P.weight.absmax``: ``F32 [nb]``, or with double quantization ``U8 [nb]`` codes into
  ``P.weight.nested_quant_map`` (``F32 [256]``) times ``P.weight.nested_absmax`` (``F32``, one
  per ``nested_blocksize`` codes), plus ``nested_offset`` (a JSON number);
- ``P.weight.quant_map``: ``F32 [16]``, bitsandbytes' built-in table for the quant type;
- ``P.weight.quant_state.bitsandbytes__nf4`` (``__fp4``): ``U8``, the UTF-8 JSON of the other
  members, byte for byte as ``pack_dict_to_tensor`` writes it.

config.json gets transformers' ``BitsAndBytesConfig.to_dict()`` as ``quantization_config``.
The decoding rule (:func:`decode`) is bitsandbytes' ``dequantize_4bit`` (its reference path,
``backends/default/ops.py``; the CPU kernels compute the same products): ``w[f] =
table[code[f]] * absmax[f // B]`` in float32, the absmax of a double-quantized weight being
``(nested_quant_map[a[j]] * nested_absmax[j // B2]) + nested_offset`` in two float32 roundings.
Mapping table and refusals: mapping/bitsandbytes.md (SPEC.md Appendix D).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import tables
from ..container import TensorSpec
from ..descriptor import Descriptor, Param
from .base import Context, ExportPlan, Mapped, Parts, Refusal, Target, block_sizes, flat_blocks, plain_mapped, require, row_groups, widen

#: qformat's named codebook -> bitsandbytes quant_type (the tables are bit-identical).
QUANT_TYPES = {"nf4": "nf4", "bnb_fp4": "fp4"}
#: The code bitsandbytes' quantize_4bit pads an odd tail with: the code of 0.0.
ZERO_CODE = {"nf4": 7, "fp4": 0}
#: Block sizes dequantize_4bit accepts (functional.py); nested blocks are held to the same set.
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: Logical dtypes dequantize_4bit produces.
DTYPES = ("float32", "float16", "bfloat16")
#: Tensor name suffixes of one 4-bit weight besides the weight itself, as bitsandbytes writes
#: them, and those qformat's converter adds: a source's copies are regenerated, not copied.
SIDE_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".nested_offset", ".qformat_codes",
                 ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4")


@dataclass(frozen=True)
class Nested:
    """A double-quantized absmax: ``bits``-bit codes (at most 8) through a 256-entry table,
    times a float32 scale per ``blocksize`` codes (``scaled`` false: none, written as 1.0),
    plus a float32 ``offset`` (no bias: -0.0, which adds nothing, not even to -0.0)."""

    blocksize: int
    scaled: bool
    offset: float


@dataclass(frozen=True)
class Form:
    """One 4-bit weight as bitsandbytes stores it (everything its quant state records)."""

    quant_type: str
    blocksize: int
    dtype: str
    shape: tuple[int, ...]
    nested: Nested | None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def blocks(self) -> int:
        return -(-self.numel // self.blocksize)

    def quant_state(self) -> bytes:
        """The JSON blob exactly as ``QuantState.as_dict(packed=True)`` writes it: the non-tensor
        members in its order, ``json.dumps`` defaults, ``nested_offset`` the float32 as a float."""
        d: dict[str, Any] = {"quant_type": self.quant_type, "blocksize": self.blocksize, "dtype": self.dtype, "shape": list(self.shape)}
        if self.nested is not None:
            d.update(nested_blocksize=self.nested.blocksize, nested_dtype="float32", nested_offset=self.nested.offset)
        return json.dumps(d).encode("utf-8")

    def specs(self, name: str) -> list[TensorSpec]:
        nb = self.blocks
        out = [TensorSpec(name, "U8", (-(-self.numel // 2), 1))]
        if self.nested is None:
            out.append(TensorSpec(f"{name}.absmax", "F32", (nb,)))
        else:
            out.append(TensorSpec(f"{name}.absmax", "U8", (nb,)))
        out.append(TensorSpec(f"{name}.quant_map", "F32", (16,)))
        if self.nested is not None:
            out.append(TensorSpec(f"{name}.nested_absmax", "F32", (-(-nb // self.nested.blocksize),)))
            out.append(TensorSpec(f"{name}.nested_quant_map", "F32", (256,)))
        out.append(TensorSpec(f"{name}.quant_state.bitsandbytes__{self.quant_type}", "U8", (len(self.quant_state()),)))
        return out

    @property
    def kind(self) -> str:
        return f"{self.quant_type} b{self.blocksize}" + (f" double-quant b{self.nested.blocksize}" if self.nested else "")


def table(quant_type: str) -> np.ndarray:
    """bitsandbytes' built-in 16-entry table for ``quant_type`` (float32; the same bits as
    ``functional.get_4bit_type``, which tests check)."""
    named = {v: k for k, v in QUANT_TYPES.items()}[quant_type]
    return np.asarray(tables.codebook_values(named), np.float32)


# -- planning ---------------------------------------------------------------------------------------
def _blocksize(p: Param, shape: tuple[int, ...], what: str) -> int:
    """The size of a parameter's blocks over the flattened tensor: flat blocks, or groups along
    the last axis that tile whole rows (which are then the same blocks)."""
    b = flat_blocks(p)
    if b is None:
        g = row_groups(p, shape)
        require(g is not None, f"the {what} is not one value per block of the flattened tensor (blocks {block_sizes(p, shape)}): "
                               "bitsandbytes' absmax is per block of consecutive elements")
        # Groups along the last axis are flat blocks when they tile whole rows (or there is one row).
        require(shape[-1] % g == 0 or math.prod(shape[:-1]) == 1,  # type: ignore[operator]
                f"the {what}'s groups of {g} do not tile the rows of {shape[-1]}, so they are not flat blocks")
        b = g
    require(b in BLOCKSIZES, f"the {what} is per block of {b}; bitsandbytes' blocks are one of {BLOCKSIZES}")
    return b  # type: ignore[return-value]


def _nested(enc: Descriptor, nb: int, offset: Any) -> Nested:
    """The double-quantized form of an encoded absmax, or :class:`Refusal`."""
    require(enc.dtype == "float32", f"the encoded absmax decodes to {enc.dtype}; bitsandbytes' nested absmax is float32")
    require(tuple(enc.shape) == (nb,), f"the encoded absmax has shape {list(enc.shape)}, expected [{nb}]")
    require(not enc.extensions, "the encoded absmax has extensions")
    require(enc.codes.element.bits <= 8, f"the absmax codes have {enc.codes.element.bits} bits; bitsandbytes stores 8-bit codes")
    require(enc.zero is None, "the encoded absmax has a zero point; bitsandbytes' is code * scale + offset")
    scaled = enc.scale is not None
    bs = 256
    if scaled:
        s = enc.scale
        require(s.encoded is None and s.op == "multiply", "the encoded absmax's scale must be a stored multiplier")  # type: ignore[union-attr]
        bs = _blocksize(s, (nb,), "absmax's nested scale")  # type: ignore[arg-type]
    off = -0.0
    if enc.bias is not None:
        b = enc.bias
        require(b.encoded is None and b.op == "add", "the encoded absmax's bias must be a stored addend")
        sizes = block_sizes(b, (nb,))
        require(sizes == (nb,) or flat_blocks(b) is not None and flat_blocks(b) >= nb,  # type: ignore[operator]
                "the encoded absmax's bias is not one value for the whole tensor (bitsandbytes' nested_offset)")
        off = float(np.float32(offset()))
    return Nested(bs, scaled, off)


def form_of(name: str, desc: Descriptor, ctx: Context) -> Form:
    """The bitsandbytes form of a qformat tensor, from its descriptor (and the one float32 of a
    nested offset, which the quant state's JSON, and so its length, holds); or :class:`Refusal`."""
    el = desc.codes.element
    require(el.type == "codebook" and el.bits == 4 and el.table in QUANT_TYPES and el.table_tensor is None,
            f"the element is {el.to_dict()}; bitsandbytes holds only the named 4-bit codebooks {sorted(QUANT_TYPES)} (its nf4, fp4)")
    require(desc.dtype in DTYPES, f"the logical dtype is {desc.dtype}; bitsandbytes dequantizes to {DTYPES}")
    require(len(desc.shape) >= 1 and math.prod(desc.shape) > 0, f"the shape {list(desc.shape)} is empty or a scalar")
    require(not desc.extensions, f"the tensor has extensions {[e.name for e in desc.extensions]}")
    require(desc.zero is None and desc.bias is None, "the tensor has a zero point or bias; bitsandbytes has only a scale (absmax)")
    sc = desc.scale
    require(sc is not None, "the tensor has no scale; bitsandbytes always multiplies by an absmax")
    require(sc.op == "multiply", f"the scale's op is {sc.op}; bitsandbytes multiplies")  # type: ignore[union-attr]
    bs = _blocksize(sc, tuple(desc.shape), "scale")  # type: ignore[arg-type]
    nested = None
    if sc.encoded is not None:  # type: ignore[union-attr]
        def offset() -> Any:  # one stored value (SPEC §9.2 widening), read without decoding the tensor
            t = sc.encoded.bias.tensor  # type: ignore[union-attr]
            info = ctx.source.info(t)
            require(info is not None, f"the nested offset tensor {t!r} is not in the checkpoint")
            return widen(np.asarray(ctx.source.array(t)), info.dtype).reshape(-1)[0]  # type: ignore[union-attr]

        nested = _nested(sc.encoded, -(-math.prod(desc.shape) // bs), offset)  # type: ignore[union-attr]
    return Form(QUANT_TYPES[el.table], bs, desc.dtype, tuple(int(s) for s in desc.shape), nested)  # type: ignore[index]


# -- building and decoding -------------------------------------------------------------------------
def pack(codes: np.ndarray, quant_type: str) -> np.ndarray:
    """4-bit codes in element order -> bitsandbytes' bytes ``[ceil(n/2), 1]``: element ``2k`` in
    the high nibble of byte ``k``, an odd tail padded with the code of 0.0."""
    c = np.asarray(codes, np.uint8).reshape(-1)
    if c.size % 2:
        c = np.concatenate([c, np.array([ZERO_CODE[quant_type]], np.uint8)])
    return ((c[0::2] << 4) | c[1::2]).astype(np.uint8).reshape(-1, 1)


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    """bitsandbytes' bytes -> the ``n`` codes in element order (high nibble first)."""
    b = np.asarray(packed).reshape(-1).view(np.uint8)
    return np.stack([b >> 4, b & 15], 1).reshape(-1)[:n]


def build(name: str, f: Form, parts: Parts) -> dict[str, np.ndarray]:
    """The target tensors of one weight from its qformat pieces."""
    out: dict[str, np.ndarray] = {name: pack(parts.codes(), f.quant_type)}
    if f.nested is None:
        out[f"{name}.absmax"] = np.ascontiguousarray(parts.values("scale").reshape(-1), np.float32)
    else:
        np_ = parts.nested("scale")
        out[f"{name}.absmax"] = np.ascontiguousarray(np_.codes().reshape(-1), np.uint8)
        nqm = np.zeros(256, np.float32)  # codes of fewer than 8 bits never reach the rest
        ev = np.asarray(np_.element_values(), np.float32).reshape(-1)
        nqm[: ev.size] = ev
        nnb = -(-f.blocks // f.nested.blocksize)
        out[f"{name}.nested_absmax"] = (np.ascontiguousarray(np_.values("scale").reshape(-1), np.float32) if f.nested.scaled
                                        else np.ones(nnb, np.float32))
        out[f"{name}.nested_quant_map"] = nqm
    out[f"{name}.quant_map"] = table(f.quant_type)
    out[f"{name}.quant_state.bitsandbytes__{f.quant_type}"] = np.frombuffer(f.quant_state(), np.uint8).copy()
    return out


def decode(name: str, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """bitsandbytes' ``dequantize_4bit`` of one weight's tensors, in NumPy, before the final
    cast to the quant state's dtype (a round to nearest even, as qformat's): the float32
    products ``quant_map[code] * absmax`` over flat blocks; a nested absmax first decoded as
    ``dequantize_blockwise`` (``nested_quant_map[a] * nested_absmax``, float32) ``+ offset``."""
    blob = next(v for k, v in arrays.items() if k.startswith(f"{name}.quant_state.bitsandbytes__"))
    qs = json.loads(bytes(np.asarray(blob, np.uint8)).decode("utf-8"))
    shape, bs = tuple(qs["shape"]), int(qs["blocksize"])
    n = math.prod(shape)
    codes = unpack(arrays[name], n)
    absmax = np.asarray(arrays[f"{name}.absmax"]).reshape(-1)
    if "nested_offset" in qs:
        nbs = int(qs["nested_blocksize"])
        na = np.repeat(np.asarray(arrays[f"{name}.nested_absmax"], np.float32).reshape(-1), nbs)[: absmax.size]
        absmax = np.asarray(arrays[f"{name}.nested_quant_map"], np.float32)[absmax.astype(np.uint8)] * na
        absmax = (absmax + np.float32(float(qs["nested_offset"]))).astype(np.float32)
    absmax = absmax.astype(np.float32, copy=False)
    # dequantize_4bit uses its built-in table (the same bits as the quant_map it writes); the
    # products are made in place, whole blocks then the partial last one, as its reference does.
    w = table(qs["quant_type"])[codes]
    del codes
    full = n - n % bs
    w[:full].reshape(-1, bs)[...] *= absmax[: full // bs, None]
    if full < n:
        w[full:] *= absmax[full // bs]
    return w.reshape(shape)


# -- config.json -------------------------------------------------------------------------------------
def quantization_config(forms: Mapping[str, Form], skip: list[str] | None) -> dict[str, Any]:
    """transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...).to_dict()``, member for member:
    the quant type and double quantization of most weights (each weight's own quant state
    decides its decoding), the compute dtype of the weights when they share one."""
    qt = max(("nf4", "fp4"), key=lambda t: sum(f.quant_type == t for f in forms.values()))
    double = sum(f.nested is not None for f in forms.values()) * 2 >= len(forms) if forms else False
    dtypes = {f.dtype for f in forms.values()}
    return {
        "quant_method": "bitsandbytes", "_load_in_8bit": False, "_load_in_4bit": True, "llm_int8_threshold": 6.0,
        "llm_int8_skip_modules": skip, "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False,
        "bnb_4bit_quant_type": qt, "bnb_4bit_use_double_quant": bool(double),
        "bnb_4bit_compute_dtype": dtypes.pop() if len(dtypes) == 1 else "float32", "bnb_4bit_quant_storage": "uint8",
        "load_in_4bit": True, "load_in_8bit": False,
    }


class BitsAndBytes(Target):
    name = "bitsandbytes"
    title = "bitsandbytes 4-bit (nf4, fp4; double quantization) as transformers saves it"
    exact_schemes = (("nf4", {"block_size": 64}), ("nf4", {"block_size": 64, "double_quant": True}),
                     ("nf4", {"block_size": 128, "double_quant": True}))

    def __init__(self) -> None:
        self.forms: dict[str, Form] = {}
        self.plain_weights: list[str] = []

    def map(self, name: str, desc: Descriptor | None, ctx: Context) -> Mapped:
        if desc is None:
            return self._plain(name, ctx)
        f = form_of(name, desc, ctx)
        self.forms[name] = f
        return Mapped(f.kind, f.specs(name), lambda parts: build(name, f, parts), lambda arrays: decode(name, arrays),
                      {"quant_type": f.quant_type, "blocksize": f.blocksize, "double_quant": f.nested is not None})

    def _plain(self, name: str, ctx: Context) -> Mapped:
        """A plain tensor copied, except a source's own bitsandbytes side tensors of a weight
        exported here (described tensors are planned first), which that weight regenerates."""
        for s in SIDE_SUFFIXES:
            if name.endswith(s) and name[: -len(s)] in self.forms:
                return Mapped("bitsandbytes quant state (regenerated)", [], lambda parts: {})
        info = ctx.source.info(name)
        if info is None:
            raise Refusal("the tensor is not in the checkpoint")
        if name.endswith(".weight") and len(info.shape) == 2:
            self.plain_weights.append(name[: -len(".weight")])
        return plain_mapped(name, info.dtype, info.shape)

    def fallback(self, name: str, desc: Descriptor, ctx: Context) -> tuple[str, dict[str, Any]] | None:
        """NF4 in blocks of 64 (bitsandbytes' default), when the dtype and shape allow."""
        if desc.dtype not in DTYPES or len(desc.shape) < 1 or math.prod(desc.shape) == 0:
            return None
        return "nf4", {"block_size": 64}

    def skip_modules(self) -> list[str] | None:
        """``llm_int8_skip_modules``: the modules whose 2-D weights stay plain (transformers
        would otherwise make every Linear 4-bit), plus ``lm_head`` (the default skip a list
        replaces, for a tied head with no weight of its own); None when none stay plain."""
        skip = sorted(m for m in self.plain_weights if f"{m}.weight" not in self.forms)
        if not skip:
            return None
        if "lm_head" not in skip and "lm_head.weight" not in self.forms:
            skip.append("lm_head")
        return skip

    def config(self, cfg: dict[str, Any] | None) -> dict[str, Any] | None:
        if cfg is None:
            return None
        out = {k: v for k, v in cfg.items() if k != "quantization_config"}
        if self.forms:
            out["quantization_config"] = quantization_config(self.forms, self.skip_modules())
        return out

    def write(self, dst: str, plan: ExportPlan, ctx: Context) -> list[str]:
        from .safetensors_out import write_safetensors

        return write_safetensors(dst, plan, ctx, label=self.name, config=self.config)
