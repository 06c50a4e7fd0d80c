"""Target ``gguf``: qformat checkpoints out to GGUF files (llama.cpp / ggml), bit-exact or refused.

Every tensor becomes one GGUF tensor.  A quantized tensor maps to a ggml block type when its
descriptor has that type's arithmetic (SPEC.md Appendix D, ``qformat/export/mapping/gguf.md``):

- integer codes with one scale per 32 along the last axis and nothing else: ``Q4_0`` /
  ``Q5_0`` / ``Q8_0`` (the smallest whose integer range holds the element's values, so qformat's
  symmetric int4 g32 is ``Q4_0`` with ``q = code + 8``); with a bias per 32 added (or subtracted)
  and non-negative codes: ``Q4_1`` / ``Q5_1``;
- the K-quants' two-level form (a nested scale per 16 or 32 whose own scale is the super-block
  ``d``, a nested subtracted minimum times ``dmin``): ``Q2_K`` ... ``Q6_K``;
- E2M1 codes (or gguf-py's codebook) with an ``F8_E8M0`` scale per 32, or the converter's form
  with ggml's exponent table: ``MXFP4``;
- ``kvalues_iq4nl`` codebook codes with an F16 scale per 32 (``IQ4_NL``) or a 6-bit sub-block
  scale per 32 times an F16 per 256 (``IQ4_XS``); 2-bit codes -1..1 (``TQ1_0``) or the codebook
  [-1, 0, 1, 2] (``TQ2_0``) with an F16 scale per 256: the forms ``qformat convert`` and scheme
  ``gguf`` give these types;
- plain ``F32``/``F16``/``BF16``/``F64``/``I8``/``I16``/``I32``/``I64`` tensors as themselves,
  except 1-D ``F16``/``BF16`` ones (norm weights, biases), widened exactly to ``F32`` as
  llama.cpp's own converter writes them (its CPU backend aborts on a BF16 norm weight).

The block layouts are the converter's tables (:data:`qformat.convert.gguf.TYPES`), run the
other way: codes are OR-ed into their bits of each block (:func:`_insert`), ``d``/``m``/``dmin``
stored as ``F16`` (a scale stored in another dtype is converted, and the exactness check refuses
it unless every value survives).  :func:`_decode` is gguf-py's ``dequantize`` arithmetic in
NumPy: binary32, ``d`` widened from ``F16``, one rounding per product, in its order.

Names and metadata: a source that ``qformat convert`` made from a GGUF file keeps its tensor
names, tensor order, alignment and every key/value pair with its type (``__metadata__["gguf"]``
and its ``gguf.kv.<key>`` members, or the ``gguf.kv.*`` tensors of older conversions, which are
not exported as tensors); when the tensors are written in other types than the source recorded,
``general.file_type`` follows them.  The Hugging Face folder ``qformat convert model.gguf out/``
makes keeps that record too, with transformers' tensor names: the architecture table
(:mod:`qformat.architectures`) names them back, permutes llama's q/k rows (and Bloom's fused
q/k/v rows) again, transposes GPT-2's ``Conv1D`` weights back and adds 1 to Gemma's norms, so an unchanged folder gives back the original file; a GGUF architecture the table
does not have is refused by name.  A Hugging Face llama-family checkpoint (``model_type``
llama, mistral: architecture ``llama``; qwen2: ``qwen2``) gets the keys llama.cpp's converter
writes (every name from gguf-py's ``gguf.Keys``; the authorship keys, ``general.name`` among them,
from the model card as gguf-py's ``gguf.Metadata`` reads it), llama.cpp's tensor names, and for
``llama`` the rotary row permutation of ``q_proj``/``k_proj`` (convert_hf_to_gguf.py
``LlamaModel.permute``; whole rows of blocks move, which is exact; Llama 3 rope scaling adds
``rope_freqs.weight``), and a byte-level BPE ``tokenizer.json`` as llama.cpp's ``gpt2`` tokenizer
keys (:mod:`.gguf_tokenizer`, ``tokenizer.ggml.pre`` included).  Anything else keeps its names,
with ``general.architecture`` set from ``config.json``'s ``model_type`` when there is one.
A model folder whose ``model_type`` is not in :data:`ARCHITECTURES` is refused
(``EXPORT_UNMAPPABLE`` naming it): its GGUF would not load in llama.cpp.  A bare file or folder
without a ``model_type``, or the ``tensors_only`` option (``--tensors-only``), keeps the tensors'
names and writes no model metadata (a container of tensors, not a model).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..architectures import MODEL_TYPES, Architecture, by_gguf, by_model_type, rotary_permutation
from ..container import TensorSpec
from ..convert.gguf import _MXFP4_DOUBLED, METADATA_KEY, PLAIN, TYPES, _Field, _Type, e8m0_half
from ..convert import gguf_codes
from ..convert.gguf_file import DEFAULT_ALIGNMENT, GGML_TYPES, MAX_DIMS
from ..descriptor import Descriptor, Param
from ..dtypes import storage_name
from ..errors import error
from . import gguf_tokenizer
from .base import Context, ExportPlan, Mapped, Parts, Refusal, Target, compare, int_element, not_exact, require, row_groups, unmappable
from ..schemes import ggml_blocks
from .gguf_writer import GGML_TYPE_IDS, TensorEntry, write_gguf

#: safetensors dtype -> ggml type name of the plain tensor types GGUF has.
PLAIN_TYPES: dict[str, str] = {str(storage_name(dt)): GGML_TYPES[i][0] for i, dt in PLAIN.items()}
#: Scale/minimum storage dtypes converted to ggml's F16 (the exactness check verifies each value).
FLOAT_STORAGE = ("F16", "F32", "BF16", "F64")
#: ggml type name -> its block layout (the converter's table).
BY_NAME: dict[str, _Type] = {t.name: t for t in TYPES.values()}
#: Integer block types without a minimum: (type, lowest and highest value of q as decoded).
SYMMETRIC = (("Q4_0", -8, 7), ("Q5_0", -16, 15), ("Q8_0", -128, 127))
#: Integer block types with an added minimum m: d * q + m.
AFFINE = (("Q4_1", 0, 15), ("Q5_1", 0, 31))
#: gguf-py's MXFP4 values halved: E2M1 (code 8 is +0 in ggml).
MXFP4_VALUES = _MXFP4_DOUBLED * np.float32(0.5)
#: config.json model_type -> its entry of the architecture table (:mod:`qformat.architectures`:
#: tensor names, rotary permutation, norm shift, keys, tokenizer model).
ARCHITECTURES: dict[str, Architecture] = dict(MODEL_TYPES)


# -- integer codes ---------------------------------------------------------------------------------
def int_range(bits: int, signedness: str) -> tuple[int, int]:
    """Lowest and highest value of a plain integer element."""
    if signedness == "unsigned":
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def code_values(bits: int, signedness: str) -> np.ndarray:
    """The integer value of each of the 2^bits codes (int64)."""
    c = np.arange(1 << bits, dtype=np.int64)
    if signedness == "unsigned":
        return c
    half = 1 << (bits - 1)
    if signedness == "offset_binary":
        return c - half
    return np.where(c >= half, c - (1 << bits), c)


def encode_values(v: np.ndarray, bits: int, signedness: str) -> np.ndarray:
    """Codes (uint8) of a field of ``bits`` / ``signedness`` holding integer values ``v``."""
    v = np.asarray(v, np.int64)
    if signedness == "offset_binary":
        v = v + (1 << (bits - 1))
    return (v & ((1 << bits) - 1)).astype(np.uint8)


# -- blocks ----------------------------------------------------------------------------------------
def _insert(blocks: np.ndarray, f: _Field, codes: np.ndarray, lut: np.ndarray | None = None) -> None:
    """OR ``codes`` ([nblocks, codes per block], below 2^bits; ``lut[codes]`` when a 256-entry
    uint8 ``lut`` is given) into their bits of ``blocks``: the inverse of ``_Field.extract`` over
    the same compiled runs (``_ggml.insert`` where the native extension runs: the same bytes, one
    pass; else :func:`_insert_numpy`)."""
    from .. import kernels

    native = getattr(kernels._ggml, "insert", None) if kernels.ggml_available() else None
    nb = blocks.shape[0]
    if native is None or nb == 0 or not blocks.flags.c_contiguous:
        _insert_numpy(blocks, f, codes if lut is None else lut[codes])
        return
    if lut is None:
        native(blocks, np.ascontiguousarray(codes, np.uint8), _runs_array(f), nb)
    else:
        native(blocks, np.ascontiguousarray(codes, np.uint8), _runs_array(f), nb, np.ascontiguousarray(lut, np.uint8))


def _runs_array(f: _Field) -> np.ndarray:
    """A field's compiled runs as int32 rows (c0, n, b0, rs, mask, ls), cached on the field."""
    a = f.__dict__.get("_runs_i32")
    if a is None:
        a = np.array([r for runs in f._runs for r in runs], np.int32).reshape(-1, 6)  # type: ignore[attr-defined]
        object.__setattr__(f, "_runs_i32", a)
    return a


def _insert_numpy(blocks: np.ndarray, f: _Field, codes: np.ndarray) -> None:
    """:func:`_insert` in NumPy."""
    for runs in f._runs:  # type: ignore[attr-defined]
        for c0, n, b0, rs, mask, ls in runs:
            v = codes[:, c0 : c0 + n]
            if ls:
                v = v >> np.uint8(ls)
            if mask != 0xFF:
                v = v & np.uint8(mask)
            if rs:
                v = v << np.uint8(rs)
            blocks[:, b0 : b0 + n] |= v


def _put_f16(blocks: np.ndarray, off: int, bits: np.ndarray) -> None:
    blocks[:, off : off + 2] = np.ascontiguousarray(bits, "<u2").reshape(-1, 1).view(np.uint8)


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """The F16 field at byte ``off`` of every block, widened to binary32 (as gguf-py does)."""
    return np.ascontiguousarray(blocks[:, off : off + 2]).view("<f2").reshape(-1).astype(np.float32)


def _values(f: _Field, blocks: np.ndarray) -> np.ndarray:
    """The codes of a field as binary32 integer values (their signedness applied)."""
    return code_values(f.bits, f.signedness).astype(np.float32)[f.extract(blocks)]


def _f16_bits(parts: Parts, role: str) -> np.ndarray:
    """A stored parameter as F16 bit patterns (flat, grid order): F16 as stored, bit for bit;
    another float dtype rounded to F16 (exact only if every value is an F16 value)."""
    if parts.storage(role) == "F16":
        return parts.grid(role).reshape(-1).view(np.uint16)
    with np.errstate(over="ignore"):
        return parts.values(role).reshape(-1).astype(np.float16).view(np.uint16)


#: The types ``_ggml.dequantize`` (ggml's dequantize_row_<type> in C) decodes.
NATIVE_DECODE = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


def _native_dequantize() -> Any:
    """``_ggml.dequantize`` where the native GGUF extension runs and has it, else None."""
    from .. import kernels

    if not kernels.ggml_available():
        return None
    return getattr(kernels._ggml, "dequantize", None)


def _decode(t: _Type, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's ``quants.dequantize`` of ``raw`` blocks of type ``t`` (binary32): ggml's
    ``dequantize_row_<type>`` in C for the legacy and K types where the native extension runs
    (the same products in the same order; tests compare it with :func:`_decode_numpy`), else
    :func:`_decode_numpy`."""
    deq = _native_dequantize() if t.name in NATIVE_DECODE else None
    if deq is None:
        return _decode_numpy(t, raw, shape)
    b = np.ascontiguousarray(raw).reshape(-1)
    out = np.empty(b.size // t.size * t.block, np.float32)
    deq(t.name, b, out)
    return out.reshape(shape)


def _decode_numpy(t: _Type, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's ``quants.dequantize`` of ``raw`` blocks of type ``t`` in NumPy (binary32)."""
    b = np.asarray(raw).reshape(-1, t.size)
    n = b.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        if t.name == "MXFP4":  # d = 2^(e-128) (ggml_e8m0_to_fp32_half); d * kvalues[q]
            return (e8m0_half(b[:, t.d])[:, None] * _MXFP4_DOUBLED[t.codes.extract(b)]).reshape(shape)
        d = _f16(b, t.d)
        out = _values(t.codes, b)  # a new array: the products are made in place (one rounding each)
        if t.sub is None:  # Q4_0, Q5_0, Q8_0: d * q; Q4_1, Q5_1: d * q + m
            out *= d[:, None]
            if t.m is not None:
                out += _f16(b, t.m)[:, None]
            return out.reshape(shape)
        assert t.sc is not None
        per = t.block // t.sub  # K-quants: (d * sc) * q [- dmin * m] per sub-block
        out = out.reshape(n, per, t.sub)
        out *= (d[:, None] * _values(t.sc, b))[:, :, None]
        if t.mins is not None:
            assert t.dmin is not None
            out -= (_f16(b, t.dmin)[:, None] * _values(t.mins, b))[:, :, None]
        return out.reshape(shape)


# -- mapping one tensor ----------------------------------------------------------------------------
def _stored_float(p: Param | None, ctx: Context, role: str) -> None:
    """A parameter stored in a float dtype ggml's F16 can take (checked on the data).  A
    parameter of a re-encoded (--allow-rounding) tensor is not in the checkpoint: its scheme
    stores F16 by construction."""
    require(p is not None and p.encoded is None and p.tensor is not None, f"the {role} is not a stored parameter")
    assert p is not None and p.tensor is not None
    info = ctx.source.info(p.tensor)
    require(info is None or info.dtype in FLOAT_STORAGE,
            f"the {role} is stored as {info.dtype if info else ''}; ggml block types hold F16 (from {', '.join(FLOAT_STORAGE)})")


def _quantized(name: str, out: str, desc: Descriptor, ctx: Context) -> Mapped:
    shape = tuple(desc.shape)
    require(1 <= len(shape) <= MAX_DIMS, f"rank {len(shape)}; GGUF tensors have 1 to {MAX_DIMS} axes")
    require(desc.zero is None, "a zero point (asymmetric codes); ggml block types have none (Q4_1/Q5_1 add a minimum after the scale, which rounds differently)")
    ext = [e.name for e in desc.extensions if e.must_understand]
    require(not ext, f"extension {', '.join(ext)}")
    require(desc.scale is not None, "no scale; every ggml block type has one")
    assert desc.scale is not None
    require(desc.scale.op == "multiply", f"scale op {desc.scale.op}")
    el = desc.codes.element
    nonlinear = _nonlinear(name, out, desc, ctx)
    if nonlinear is not None:
        return nonlinear
    if el.type in ("float", "codebook") and el.bits == 4:
        return _mxfp4(name, out, desc, ctx)
    if desc.scale.encoded is not None:
        return _kquant(name, out, desc, ctx)
    return _simple(name, out, desc, ctx)


def _blocks_of(desc: Descriptor, p: Param | None, size: int, role: str) -> None:
    g = row_groups(p, tuple(desc.shape))
    require(g == size, f"{role} groups of {g} along the last axis; this ggml type has one per {size}" if g else
            f"the {role} is not one value per group of the last axis; ggml blocks run along rows")
    require(desc.shape[-1] % size == 0, f"rows of {desc.shape[-1]}, not a multiple of the block size {size}")


def _simple(name: str, out: str, desc: Descriptor, ctx: Context) -> Mapped:
    """Q4_0/Q5_0/Q8_0 (d * q) and Q4_1/Q5_1 (d * q + m): integer codes, F16 values per 32."""
    el = desc.codes.element
    ie = int_element(el)
    require(ie is not None, f"{el.type} element {el.format or el.bits}; ggml's integer block types need plain integer codes (MXFP4: E2M1)")
    assert ie is not None
    bits, sgn = ie
    lo, hi = int_range(bits, sgn)
    _blocks_of(desc, desc.scale, 32, "scale")
    _stored_float(desc.scale, ctx, "scale")
    if desc.bias is None:
        choice = [t for t, tlo, thi in SYMMETRIC if tlo <= lo and hi <= thi]
        require(bool(choice), f"{bits}-bit {sgn} codes ({lo}..{hi}) fit no ggml type (Q8_0 holds -128..127)")
        negate = False
    else:
        b = desc.bias
        require(b.op in ("add", "subtract"), f"bias op {b.op}")
        _blocks_of(desc, b, 32, "bias")
        _stored_float(b, ctx, "bias")
        choice = [t for t, tlo, thi in AFFINE if tlo <= lo and hi <= thi]
        require(bool(choice), f"{bits}-bit {sgn} codes ({lo}..{hi}) with a minimum fit no ggml type (Q4_1 holds 0..15, Q5_1 0..31)")
        negate = b.op == "subtract"  # x*s - b == x*s + (-b); negating an F16 is exact
    t = BY_NAME[choice[0]]
    lut = encode_values(code_values(bits, sgn), t.codes.bits, t.codes.signedness)
    # codes are below 2^bits: the table's rest is never read.  No table where the stored codes
    # are the block's own (Q5_0, Q8_0 of scheme gguf): _ggml.insert then skips the lookup
    table = None if np.array_equal(lut, np.arange(lut.size)) else np.pad(lut, (0, 256 - lut.size))
    shape = tuple(desc.shape)
    lead, K = shape[:-1], shape[-1]

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        codes = parts.codes().reshape(-1, t.block)
        blocks = np.zeros((codes.shape[0], t.size), np.uint8)
        _insert(blocks, t.codes, codes, table)
        del codes
        _put_f16(blocks, t.d, _f16_bits(parts, "scale"))
        if t.m is not None:
            m = _f16_bits(parts, "bias")
            _put_f16(blocks, t.m, m ^ np.uint16(0x8000) if negate else m)
        return {out: blocks.reshape(_rows_shape(lead, K // t.block * t.size))}

    return Mapped(t.name, [TensorSpec(out, t.name, shape)], build, lambda a: _decode(t, a[out], _rows_shape(lead, K)), {"ggml_type": t.name},
                  row_chunks=True)


def _rows_shape(lead: tuple[int, ...], last: int) -> tuple[int, ...]:
    """The shape of a slice of rows (axis 0 of any length) of a tensor ``lead + (last,)``: a
    block type's build and decode work on the whole tensor or on rows of it alike."""
    return ((-1,) + lead[1:] + (last,)) if lead else (last,)


def _kquant(name: str, out: str, desc: Descriptor, ctx: Context) -> Mapped:
    """Q2_K ... Q6_K: codes times a nested sub-block scale (codes times the super-block d),
    minus a nested sub-block minimum (codes times dmin) for Q2_K, Q4_K and Q5_K."""
    shape = tuple(desc.shape)
    lead, K = shape[:-1], shape[-1]
    ie = int_element(desc.codes.element)
    require(ie is not None, "an encoded scale over non-integer codes (K-quants have integer codes)")
    sub = row_groups(desc.scale, shape)
    inner_sc = desc.scale.encoded if desc.scale is not None else None
    assert inner_sc is not None
    sc_el = int_element(inner_sc.codes.element)
    bias_el = None
    if desc.bias is not None:
        require(desc.bias.encoded is not None and desc.bias.op in ("add", "subtract"), "a K-quant minimum must be an encoded (nested) bias")
        assert desc.bias.encoded is not None
        bias_el = int_element(desc.bias.encoded.codes.element)
    found = [t for t in TYPES.values() if t.sub is not None and t.sub == sub and ie == (t.codes.bits, t.codes.signedness)
             and t.sc is not None and sc_el == (t.sc.bits, t.sc.signedness) and (t.mins is None) == (desc.bias is None)
             and (t.mins is None or bias_el == (t.mins.bits, t.mins.signedness))]
    require(len(found) == 1, f"a two-level scale (sub-blocks of {sub}, {ie} codes, {sc_el} sub-block scales"
            f"{', a minimum' if desc.bias is not None else ''}) that is none of ggml's K-quants")
    t = found[0]
    require(K % t.block == 0, f"rows of {K}, not a multiple of the {t.name} super-block {t.block}")
    per = t.block // t.sub  # type: ignore[operator]
    for role, inner in (("scale", inner_sc), ("bias", desc.bias.encoded if desc.bias is not None else None)):
        if inner is None:
            continue
        require(tuple(inner.shape) == lead + (K // sub,), f"the nested {role} has shape {list(inner.shape)}")  # type: ignore[operator]
        require(inner.zero is None and inner.bias is None and inner.scale is not None and inner.scale.op == "multiply",
                f"the nested {role} is not codes times one super-block value")
        _blocks_of(inner, inner.scale, per, f"nested {role} scale")
        _stored_float(inner.scale, ctx, f"nested {role} scale")
    negate = desc.bias is not None and desc.bias.op == "add"  # x*s + dmin*m == x*s - (-dmin)*m

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        codes = parts.codes().reshape(-1, t.block)
        blocks = np.zeros((codes.shape[0], t.size), np.uint8)
        _insert(blocks, t.codes, codes)
        del codes
        ps = parts.nested("scale")
        _insert(blocks, t.sc, ps.codes().reshape(-1, per))  # type: ignore[arg-type]
        _put_f16(blocks, t.d, _f16_bits(ps, "scale"))
        if t.mins is not None:
            assert t.dmin is not None
            pb = parts.nested("bias")
            _insert(blocks, t.mins, pb.codes().reshape(-1, per))
            dm = _f16_bits(pb, "scale")
            _put_f16(blocks, t.dmin, dm ^ np.uint16(0x8000) if negate else dm)
        return {out: blocks.reshape(_rows_shape(lead, K // t.block * t.size))}

    return Mapped(t.name, [TensorSpec(out, t.name, shape)], build, lambda a: _decode(t, a[out], _rows_shape(lead, K)), {"ggml_type": t.name},
                  row_chunks=True)


# -- IQ4_NL, IQ4_XS, TQ1_0, TQ2_0: codes computed from the block (qformat.convert.gguf_codes) ------
#: The codebooks that name these types (a descriptor's table must hold exactly these values).
_IQ4_VALUES = np.array(gguf_codes.KVALUES_IQ4NL, np.float32)
_TQ2_VALUES = np.array([-1, 0, 1, 2], np.float32)


def _nonlinear(name: str, out: str, desc: Descriptor, ctx: Context) -> Mapped | None:
    """IQ4_NL (``kvalues_iq4nl`` codebook, F16 scale per 32), IQ4_XS (the same codebook, scale
    per 32 encoded as 6-bit ``offset_binary`` codes times an F16 per 256), TQ1_0 (2-bit
    two's-complement codes -1..1, F16 scale per 256) and TQ2_0 (codebook [-1, 0, 1, 2], F16 scale
    per 256): the forms ``qformat convert`` and scheme ``gguf`` give them.  None: not one of them."""
    el, shape = desc.codes.element, tuple(desc.shape)
    lead, K = shape[:-1], shape[-1]
    if desc.bias is not None or desc.scale is None:
        return None
    if el.type == "codebook" and el.bits in (2, 4):
        table = Parts(desc, ctx.source, name).element_values()
        if el.bits == 4 and _same(table, _IQ4_VALUES):
            tname = "IQ4_NL" if desc.scale.encoded is None else "IQ4_XS"
        elif el.bits == 2 and _same(table, _TQ2_VALUES):
            tname = "TQ2_0"
        else:
            return None
    elif int_element(el) == (2, "twos_complement") and desc.scale.encoded is None and row_groups(desc.scale, shape) == 256:
        tname = "TQ1_0"
    else:
        return None
    tid = GGML_TYPE_IDS[tname]
    block, size = GGML_TYPES[tid][1:]
    if tname == "IQ4_XS":
        inner = desc.scale.encoded
        assert inner is not None
        require(row_groups(desc.scale, shape) == 32, "IQ4_XS sub-block scales are one per 32 along the last axis")
        require(tuple(inner.shape) == lead + (K // 32,) and inner.zero is None and inner.bias is None and inner.scale is not None
                and inner.scale.op == "multiply" and int_element(inner.codes.element) == (6, "offset_binary"),
                "IQ4_XS's nested scale is 6-bit offset_binary codes times one F16 value per 256")
        _blocks_of(inner, inner.scale, 8, "nested scale scale")
        _stored_float(inner.scale, ctx, "nested scale scale")
    else:
        _blocks_of(desc, desc.scale, block, "scale")
        _stored_float(desc.scale, ctx, "scale")
    require(K % block == 0, f"rows of {K}, not a multiple of the {tname} block {block}")

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        codes = parts.codes().reshape(-1, block)
        if tname == "IQ4_NL":
            blocks = np.empty((codes.shape[0], size), np.uint8)
            _put_f16(blocks, 0, _f16_bits(parts, "scale"))
            blocks[:, 2:] = ggml_blocks.iq4_codes_bytes(codes)
        elif tname == "IQ4_XS":
            ps = parts.nested("scale")
            ls = ps.codes().reshape(-1, 8).astype(np.uint16)  # the stored 6-bit ls (value ls - 32)
            blocks = np.empty((codes.shape[0], size), np.uint8)
            _put_f16(blocks, 0, _f16_bits(ps, "scale"))
            _put_f16(blocks, 2, np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=1))
            blocks[:, 4:8] = ((ls[:, 0::2] & 0xF) | ((ls[:, 1::2] & 0xF) << 4)).astype(np.uint8)
            blocks[:, 8:] = ggml_blocks.iq4_codes_bytes(codes)
        elif tname == "TQ1_0":
            bad = np.flatnonzero(codes.reshape(-1) == 2)
            if bad.size:
                raise unmappable(name, "gguf", f"TQ1_0 holds -1, 0 and +1; {bad.size} codes are -2 (the first at flat element {bad[0]})")
            blocks = ggml_blocks.tq1_0_pack(((codes.astype(np.int32) + 1) & 3), _f16_bits(parts, "scale"))  # -1, 0, 1 -> 0, 1, 2
        else:
            blocks = ggml_blocks.tq2_0_pack(codes.astype(np.int32), _f16_bits(parts, "scale"))
        return {out: blocks.reshape(lead + (K // block * size,))}

    return Mapped(tname, [TensorSpec(out, tname, shape)], build, lambda a: _decode_computed(tid, a[out], shape), {"ggml_type": tname})


def _decode_computed(tid: int, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """IQ4_NL / IQ4_XS / TQ1_0 / TQ2_0 blocks decoded as gguf-py does (``d * value``; IQ4_XS
    ``(d * (ls - 32)) * value``); every product is exact in binary32 (gguf_codes' docstring)."""
    spec = gguf_codes.TYPES[tid]
    b = np.asarray(raw).reshape(-1, spec.size)
    codes = spec.codes(b)
    el = spec.element
    vals = el["table"][codes] if el["type"] == "codebook" else (((codes.astype(np.int8) << 6) >> 6)).astype(np.float32)
    assert spec.d is not None
    d = spec.d(b).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if spec.sc is None:
            return (vals.reshape(b.shape[0], -1) * d[:, None]).reshape(shape)
        dl = d[:, None] * (spec.sc(b).astype(np.float32) - np.float32(32))
        return (vals.reshape(b.shape[0], -1, 32) * dl[:, :, None]).reshape(shape)


def _same(a: np.ndarray, b: np.ndarray, zero_sign: bool = False) -> bool:
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    if a.shape != b.shape:
        return False
    same = a.view(np.uint32) == b.view(np.uint32)
    if zero_sign:
        same |= (a == 0) & (b == 0)
    return bool(same.all())


def _mxfp4(name: str, out: str, desc: Descriptor, ctx: Context) -> Mapped:
    """MXFP4: E2M1 codes times 2^(e-127) per 32 (ggml: kvalues[q] * 2^(e-128), doubled values).
    ggml has no -0: a code whose value is -0.0 (E2M1's code 8) decodes as +0.0 there."""
    shape = tuple(desc.shape)
    lead, K = shape[:-1], shape[-1]
    require(desc.bias is None, "a bias; MXFP4 has none")
    _blocks_of(desc, desc.scale, 32, "scale")
    assert desc.scale is not None
    table = Parts(desc, ctx.source, name).element_values()  # 16 values: read now, it decides the form
    sc = desc.scale
    if sc.encoded is None:
        info = ctx.source.info(sc.tensor) if sc.tensor else None
        require(info is not None and info.dtype == "F8_E8M0", f"MXFP4 scales are E8M0 exponents; this one is stored as {info.dtype if info else 'nothing'}")
        require(_same(table, MXFP4_VALUES, zero_sign=True), "4-bit codes whose values are not E2M1's")
    else:
        inner = sc.encoded
        require(inner.zero is None and inner.scale is None and inner.bias is None and inner.codes.element.type == "codebook"
                and inner.codes.element.bits == 8 and tuple(inner.shape) == lead + (K // 32,),
                "an encoded scale that is not ggml's E8M0 table")
        inner_table = Parts(inner, ctx.source, name).element_values()
        require(_same(inner_table, e8m0_half(np.arange(256))), "an encoded scale that is not ggml's E8M0 table (2^(e-128))")
        require(_same(table, _MXFP4_DOUBLED, zero_sign=True), "4-bit codes whose values are not ggml's MXFP4 kvalues")
    neg_zero = bool((np.signbit(table) & (table == 0)).any())
    t = BY_NAME["MXFP4"]

    def decode(a: Mapping[str, np.ndarray]) -> np.ndarray:
        return _decode(t, a[out], shape)

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        codes = parts.codes().reshape(-1, 32)
        blocks = np.zeros((codes.shape[0], t.size), np.uint8)
        _insert(blocks, t.codes, codes)
        del codes
        if sc.encoded is None and parts.storage("scale") != "F8_E8M0":
            raise unmappable(name, "gguf", f"MXFP4 scales are E8M0 exponents; this one is stored as {parts.storage('scale')}")
        e = parts.grid("scale").view(np.uint8) if sc.encoded is None else parts.nested("scale").codes()
        blocks[:, t.d] = e.reshape(-1)
        arrays = {out: blocks.reshape(lead + (K // 32 * t.size,))}
        if neg_zero and not ctx.allow_rounding:
            _zero_sign(name, parts, decode(arrays))
        return arrays

    return Mapped(t.name, [TensorSpec(out, t.name, shape)], build, decode, {"ggml_type": t.name})


def _zero_sign(name: str, parts: Parts, got: np.ndarray) -> None:
    """Refuse, saying so, a tensor whose only differences are -0.0 that ggml reads as +0.0."""
    want = parts.decoded()
    c = compare(want, got)
    if c.exact:
        return
    w, g = want.reshape(-1), got.reshape(-1)
    differ = (w.view(np.uint32) != g.view(np.uint32)) & ~(np.isnan(w) & np.isnan(g))
    if bool(((w[differ] == 0) & (g[differ] == 0)).all()):
        raise not_exact(name, "gguf", f"{c.mismatches} values differ only in the sign of zero: they are -0.0 (E2M1 code 8) and "
                        "ggml's MXFP4 decodes code 8 as +0.0, so -0.0 has no MXFP4 form")


def _plain(name: str, out: str, ctx: Context) -> Mapped:
    info = ctx.source.info(name)
    require(info is not None, "the tensor is not readable from this source (export from a qformat checkpoint: `qformat convert` a GGUF file first)")
    assert info is not None
    ggml = PLAIN_TYPES.get(info.dtype)
    require(ggml is not None, f"dtype {info.dtype}; GGUF's plain types are {', '.join(PLAIN_TYPES)}")
    assert ggml is not None
    shape = tuple(int(s) for s in info.shape)
    require(1 <= len(shape) <= MAX_DIMS, f"rank {len(shape)}; GGUF tensors have 1 to {MAX_DIMS} axes")
    if len(shape) == 1 and ggml in ("F16", "BF16"):
        # 1-D float tensors (norm weights, biases) as F32, as llama.cpp's own converter writes
        # them: its CPU backend has no f32 x bf16 elementwise op and aborted on a BF16 norm
        # weight (`binary_op: unsupported types`); the widening is exact, and checked
        def build32(parts: Parts) -> Mapping[str, np.ndarray]:
            return {out: np.asarray(parts.src.array(name)).astype(np.float32)}

        return Mapped("F32", [TensorSpec(out, "F32", shape)], build32, lambda a: np.asarray(a[out], np.float32),
                      {"ggml_type": "F32", "widened_from": ggml})

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        return {out: np.asarray(parts.src.array(name))}

    return Mapped(ggml, [TensorSpec(out, ggml, shape)], build, None, {"ggml_type": ggml})


def _shifted(m: Mapped, shift: float) -> Mapped:
    """A plain tensor stored as ``values + shift`` in binary32 (Gemma's norms: llama.cpp
    multiplies by its weight, transformers by ``1 + w``; convert_hf_to_gguf.py adds 1).  The
    GGUF value is ``fl(w + 1)``, the very factor transformers computes (``1.0 + weight.float()``),
    so llama.cpp multiplies by what transformers multiplies by; no comparison is made, since
    transformers' GGUF loader reading it back computes ``fl(fl(w + 1) - 1)``, which is ``w``
    except where ``|w|`` is below about 2^-24 of 1 (measured: every norm of Gemma 3 270M comes back
    bit for bit)."""
    inner = m.build

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        return {k: np.asarray(v, np.float32) + np.float32(shift) for k, v in inner(parts).items()}

    specs = [TensorSpec(s.name, "F32", s.shape) for s in m.specs]
    return Mapped("F32", specs, build, None, dict(m.info, ggml_type="F32", shifted=shift))


def _transposed(name: str, out: str, desc: Descriptor | None, ctx: Context) -> Mapped:
    """A 2-D tensor llama.cpp stores as the transpose of the checkpoint's (GPT-2's ``Conv1D``
    weights, ``[in, out]``; GGUF ``[out, in]``).  A plain one is transposed as it is copied (its
    dtype kept); a packed one is mapped from the descriptor of its transpose over the same
    components (:func:`~qformat.architectures.base.transposed_descriptor`), which is a ggml
    block type only when its blocks run along the GGUF's rows, as ``qformat convert`` of a GGUF
    describes them; the built blocks decode, transposed back, to the checkpoint's values."""
    from ..architectures.base import transposed_descriptor
    from ..descriptor import parse_descriptor

    if desc is None:
        info = ctx.source.info(name)
        require(info is not None and len(info.shape) == 2, "a tensor llama.cpp stores transposed is not 2-D here")
        inner = _plain(name, out, ctx)
        assert info is not None

        def build_plain(parts: Parts) -> Mapping[str, np.ndarray]:
            return {k: np.ascontiguousarray(np.asarray(v).T) for k, v in inner.build(parts).items()}

        specs = [TensorSpec(sp.name, sp.dtype, tuple(sp.shape)[::-1]) for sp in inner.specs]
        return Mapped(inner.kind, specs, build_plain, lambda a: np.asarray(a[out], np.float32).T, dict(inner.info, transposed=True))
    require(len(desc.shape) == 2, f"a rank-{len(desc.shape)} tensor; llama.cpp stores this one as a transposed matrix")
    try:
        back = parse_descriptor(name, transposed_descriptor(desc.to_dict()))
    except ValueError as e:
        raise Refusal(f"llama.cpp stores this tensor transposed, and its packing cannot be described transposed ({e})") from None
    m = _quantized(name, out, back, ctx)
    decode = m.decode

    def build(_parts: Parts) -> Mapping[str, np.ndarray]:
        return m.build(Parts(back, ctx.source, name))  # the same components, read in the GGUF's orientation

    return Mapped(m.kind, m.specs, build, None if decode is None else (lambda a: decode(a).T), dict(m.info, transposed=True), m.in_dtype)


def _permuted(m: Mapped, perm: np.ndarray) -> Mapped:
    """``m`` with its rows (axis 0) reordered: target row i is source row ``perm[i]``.  Rows of
    whole blocks move as they are; the decode puts them back for the comparison."""
    inv = np.argsort(perm)

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        return {k: np.ascontiguousarray(np.asarray(v)[perm]) for k, v in m.build(parts).items()}

    decode = None
    if m.decode is not None:
        inner = m.decode

        def decode(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
            return inner(arrays)[inv]

    return Mapped(m.kind, m.specs, build, decode, dict(m.info, permuted=True))


# -- the model: names and key/value metadata ---------------------------------------------------------
@dataclass
class _Model:
    """How a source's tensors are named and which KVs go with them.

    Modes: ``gguf``, a source converted from a GGUF file that records its key/values and tensor
    list (``__metadata__["gguf"]``), with the GGUF's own tensor names (``qformat convert
    model.gguf out.safetensors``) or, with ``table`` set, with transformers' names (``qformat
    convert model.gguf out/``, the Hugging Face folder), which the architecture table maps back;
    ``hf``, a Hugging Face checkpoint of an architecture of the table; ``plain``, anything else
    (tensors under their own names, or refused with ``problem``)."""

    mode: str  # "gguf" (converted from GGUF), "hf" (an architecture of the table), "plain"
    kvs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    order: list[str] = field(default_factory=list)
    arch: str | None = None
    table: Architecture | None = None  # the architecture table's entry, when names are transformers'
    config: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # a reason every tensor is refused
    recorded: dict[str, str] = field(default_factory=dict)  # "gguf": tensor name -> ggml type the source recorded
    kv_tensors: frozenset[str] = frozenset()  # "gguf": tensors of older files holding large values (not exported)

    def rename(self, name: str) -> str | None:
        """The GGUF name of tensor ``name`` (None: not exported), or :class:`Refusal`."""
        if self.problem is not None:
            raise Refusal(self.problem)
        if self.mode == "gguf" and self.table is None:
            return None if name in self.kv_tensors else name
        if self.table is None:
            return name
        if name in self.kv_tensors:
            return None
        try:
            return self.table.gguf_name(name)
        except KeyError:
            raise Refusal(f"no llama.cpp tensor name for {name!r} in architecture {self.arch}") from None

    def permutation(self, name: str, shape: tuple[int, ...], quantized: bool) -> np.ndarray | None:
        if self.table is None:
            return None
        if any(re.fullmatch(p, name) for p, _ in self.table.head_split):  # Bloom's fused q/k/v: whole rows move
            require(len(shape) == 2 or not quantized, "a quantized 1-D fused q/k/v tensor cannot have its elements regrouped")
            try:
                return self.table.permutation(name, shape[0] if shape else 0, self.config)
            except ValueError as e:
                raise Refusal(str(e)) from None
        heads = self.table.heads_of(name, self.config)
        if heads is None:
            return None
        require(bool(shape) and shape[0] % (2 * heads) == 0, f"{shape[0] if shape else 0} rows do not split into {heads} heads of two halves")
        require(len(shape) == 2 or not quantized, "a quantized 1-D q/k tensor cannot have its elements permuted for rotary")
        return rotary_permutation(shape[0], heads)

    def transposes(self, name: str) -> bool:
        """Whether llama.cpp stores this 2-D tensor transposed (GPT-2's Conv1D weights)."""
        return self.table is not None and self.table.transposes(name)

    def shift(self, name: str) -> float:
        """What llama.cpp adds to this tensor's values (Gemma's norms: 1)."""
        return self.table.shift(name) if self.table is not None else 0.0


def gguf_metadata(ck: Any) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The ``gguf`` metadata a converted GGUF file records (the parsed object and the ``__metadata__``
    of the file holding it, where its large values are), or None."""
    if ck is None or ck.kind != "safetensors":
        return None
    for f in ck.files:
        meta = ck.metadata(f)
        text = meta.get(METADATA_KEY)
        if text is not None:
            try:
                obj = json.loads(text)
            except ValueError:
                raise error("CONVERT_SOURCE_INVALID", f"{f}: __metadata__[{METADATA_KEY!r}] is not JSON") from None
            if isinstance(obj, dict) and isinstance(obj.get("kv"), dict):
                return obj, dict(meta)
            raise error("CONVERT_SOURCE_INVALID", f"{f}: __metadata__[{METADATA_KEY!r}] has no kv object")
    return None


def kv_tensor_names(meta: dict[str, Any]) -> frozenset[str]:
    """Tensors in which files converted before the metadata members stored large values."""
    return frozenset(str(v["tensor"]) for v in meta.get("kv", {}).values() if isinstance(v, dict) and "tensor" in v)


def _transformers_named(ck: Any, recorded: dict[str, str]) -> bool:
    """Whether a converted GGUF's tensors carry transformers' names (the Hugging Face folder of
    ``qformat convert model.gguf out/``) rather than the GGUF's own: none of the recorded names
    is stored, as a plain tensor or as a quantized tensor's components."""
    if not recorded:
        return False
    stored = set(ck.names()) if hasattr(ck, "names") else set()
    return not any(n in stored or f"{n}.codes" in stored for n in recorded)


def _unknown(what: str) -> str:
    known = ", ".join(f"{a.name} (model_type {', '.join(a.model_types)})" for a in sorted(set(MODEL_TYPES.values()), key=lambda a: a.name)
                      if a.hf_export)
    converted = ", ".join(sorted(a.name for a in set(MODEL_TYPES.values()) if not a.hf_export))
    also = f"; from a folder converted from a GGUF file also for architectures {converted}" if converted else ""
    return (f"{what} has no llama.cpp mapping in this version (tensor names, hyperparameters and tokenizer keys are known for "
            f"model_type {', '.join(sorted(k for k, a in ARCHITECTURES.items() if a.hf_export))}: architectures {known}{also}); "
            f"a GGUF of it would not load in llama.cpp, "
            f"so none is written (--tensors-only writes the tensors under their own names, for gguf-py and other tensor readers)")


def _model(ctx: Context) -> _Model:
    ck = ctx.checkpoint
    if getattr(ck, "kind", None) == "gguf":
        return _Model("plain", problem="the source is a GGUF file already; export reads qformat checkpoints (`qformat convert` it first)")
    cfg = ctx.config if isinstance(ctx.config, dict) else {}
    mt = cfg.get("model_type")
    found = gguf_metadata(ck)
    if found is not None:
        meta, members = found
        kvs = [(k, _restored(ctx, k, v, members)) for k, v in meta["kv"].items()]
        recorded = {str(t[0]): str(t[1]) for t in meta.get("tensors", []) if isinstance(t, list) and len(t) >= 2}
        model = _Model("gguf", kvs, int(meta.get("alignment", DEFAULT_ALIGNMENT)), list(recorded), recorded=recorded,
                       kv_tensors=kv_tensor_names(meta), config=cfg)
        if not ctx.options.get("tensors_only") and _transformers_named(ck, recorded):
            # a Hugging Face folder converted from this GGUF: the table maps its names back
            arch = next((v.get("value") for k, v in kvs if k == "general.architecture"), None)
            model.arch = str(arch) if arch is not None else None
            model.table = by_gguf(arch)
            if model.table is None:
                model.problem = _unknown(f"GGUF architecture {arch!r} (config.json model_type {mt!r})")
            elif mt is not None and mt not in model.table.model_types:
                model.problem = (f"config.json's model_type {mt!r} is not GGUF architecture {arch!r} (model_type "
                                 f"{', '.join(model.table.model_types)}), which the recorded GGUF metadata names")
        return model
    if ctx.options.get("tensors_only"):  # asked for: a container of tensors, no model metadata
        return _Model("plain", config=cfg)
    table = by_model_type(mt)
    if table is not None:
        model = _Model("hf", arch=table.name, table=table, config=cfg)
        model.problem = _unsupported_config(cfg, table)
        return model
    model = _Model("plain", arch=str(mt) if isinstance(mt, str) else None, config=cfg)
    if mt is not None:
        # a model whose architecture has no mapping here would get transformers' tensor names and
        # no hyperparameters or tokenizer: a file llama.cpp refuses, reported as a success before
        model.problem = _unknown(f"config.json's model_type {mt!r}")
    return model


def _restored(ctx: Context, key: str, v: Any, members: dict[str, str]) -> dict[str, Any]:
    """A KV as the converter recorded it: inline, in its own ``gguf.kv.<key>`` metadata member,
    or (files converted before those members) in a ``gguf.kv.<key>`` tensor."""
    if isinstance(v, dict) and "metadata" in v:
        text = members.get(str(v["metadata"]))
        if text is None:
            raise error("CONVERT_SOURCE_INVALID", f"the GGUF key {key!r} is recorded in the metadata member {v['metadata']!r}, which the file lacks",
                        field=f"gguf.kv[{key}]")
        try:
            v = json.loads(text)
        except ValueError:
            raise error("CONVERT_SOURCE_INVALID", f"the metadata member {v['metadata']!r} does not hold the JSON of the GGUF key {key!r}",
                        field=str(v["metadata"])) from None
    elif isinstance(v, dict) and "tensor" in v:
        raw = np.asarray(ctx.source.array(str(v["tensor"]))).view(np.uint8)
        try:
            v = json.loads(raw.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise error("CONVERT_SOURCE_INVALID", f"the tensor {v['tensor']!r} does not hold the JSON of the GGUF key {key!r}", tensor=str(v["tensor"])) from None
    if not isinstance(v, dict) or "type" not in v or "value" not in v:
        raise error("CONVERT_SOURCE_INVALID", f"the GGUF key {key!r} is recorded without a type and value", field=f"gguf.kv[{key}]")
    return v


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters llama.cpp's keys take (the architecture's section of per-layer-type ones)."""
    table = by_model_type(cfg.get("model_type"))
    if table is not None:
        return table.rope(cfg)
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return rp if isinstance(rp, dict) else {}


def _unsupported_config(cfg: dict[str, Any], table: Architecture) -> str | None:
    if not table.hf_export:
        # the keys its converter writes beyond the common ones are not in the table: a file
        # without them would not load in llama.cpp (or would run wrongly)
        return _unknown(f"config.json's model_type {cfg.get('model_type')!r} (GGUF architecture {table.name}) as a Hugging Face "
                        "checkpoint not converted from a GGUF file")
    for k in ("num_attention_heads", "hidden_size", "num_hidden_layers"):
        if not isinstance(cfg.get(k), int):
            return f"config.json has no integer {k}"
    rt = _rope_type(cfg)
    if rt is not None and rt not in table.rope_types:
        return f"rope type {rt!r} (llama.cpp needs extra tensors or keys for it that this exporter does not write)"
    return None


def _rope_type(cfg: dict[str, Any]) -> Any:
    rp = _rope(cfg)
    return rp.get("rope_type", rp.get("type", "default"))


def _head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))


def llama3_rope_factors(cfg: dict[str, Any]) -> np.ndarray:
    """``rope_freqs.weight`` for Llama 3 rope scaling, as convert_hf_to_gguf.py's
    ``LlamaModel.generate_extra_tensors`` computes it (binary32 throughout, as its torch code)."""
    rp = _rope(cfg)
    f32 = np.float32
    base = f32(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    dim = _head_dim(cfg)
    freqs = f32(1.0) / (base ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    factor = f32(rp.get("factor", 8.0))
    low, high = f32(rp.get("low_freq_factor", 1.0)), f32(rp.get("high_freq_factor", 4.0))
    old = f32(rp.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = f32(2 * np.pi) / freq
        if wavelen < high_wavelen:
            out.append(f32(1))
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(f32(1) / ((f32(1) - smooth) / factor + smooth))
    return np.array(out, np.float32)


def _u32(v: Any) -> dict[str, Any]:
    return {"type": "uint32", "value": int(v)}


def _f32(v: Any) -> dict[str, Any]:
    return {"type": "float32", "value": float(np.float32(v))}


def _str(v: str) -> dict[str, Any]:
    return {"type": "string", "value": v}


def _hf_kvs(model: _Model, entries: list[TensorEntry], ck: Any, gguf_pre: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The keys llama.cpp reads for a model of an architecture of the table (convert_hf_to_gguf.py's
    TextModel ``set_gguf_parameters`` and the architecture's own keys), from config.json; names from
    ``gguf.Keys``."""
    import gguf

    K = gguf.Keys
    cfg, a = model.config, str(model.arch)
    table = model.table
    assert table is not None
    heads = int(cfg["num_attention_heads"])
    head_dim = _head_dim(cfg)
    rope = _rope(cfg)
    kv: list[tuple[str, dict[str, Any]]] = [
        (K.General.ARCHITECTURE, _str(a)),
        (K.General.TYPE, _str(gguf.GGUFType.MODEL)),
        *model_card_kvs(getattr(ck, "folder", None), sum(math.prod(e.shape) for e in entries)),
        (K.LLM.BLOCK_COUNT.format(arch=a), _u32(cfg["num_hidden_layers"])),
    ]
    if cfg.get("max_position_embeddings"):
        kv.append((K.LLM.CONTEXT_LENGTH.format(arch=a), _u32(cfg["max_position_embeddings"])))
    kv.append((K.LLM.EMBEDDING_LENGTH.format(arch=a), _u32(cfg["hidden_size"])))
    if cfg.get("intermediate_size"):
        kv.append((K.LLM.FEED_FORWARD_LENGTH.format(arch=a), _u32(cfg["intermediate_size"])))
    kv.append((K.Attention.HEAD_COUNT.format(arch=a), _u32(heads)))
    kv.append((K.Attention.HEAD_COUNT_KV.format(arch=a), _u32(cfg.get("num_key_value_heads") or heads)))
    theta = cfg.get("rope_theta", rope.get("rope_theta"))
    if theta is not None:
        kv.append((K.Rope.FREQ_BASE.format(arch=a), _f32(theta)))
    if cfg.get("rms_norm_eps") is not None:
        kv.append((K.Attention.LAYERNORM_RMS_EPS.format(arch=a), _f32(cfg["rms_norm_eps"])))
    if cfg.get("head_dim"):
        kv.append((K.Attention.KEY_LENGTH.format(arch=a), _u32(head_dim)))
        kv.append((K.Attention.VALUE_LENGTH.format(arch=a), _u32(head_dim)))
    if rope.get("rope_type", rope.get("type")) == "linear":
        kv.append((K.Rope.SCALING_TYPE.format(arch=a), _str(gguf.RopeScalingType.LINEAR.value)))
        kv.append((K.Rope.SCALING_FACTOR.format(arch=a), _f32(rope["factor"])))
    for key, typ, get in table.hparams:
        v = get(cfg)
        if v is not None:
            kv.append((key.format(arch=a), _u32(v) if typ == "uint32" else _f32(v)))
    ft = preset_file_type(cfg, entries)
    if ft is not None:
        kv.append((K.General.FILE_TYPE, _u32(ft)))
    kv += imatrix_kvs(cfg)
    if cfg.get("vocab_size"):
        kv.append((K.LLM.VOCAB_SIZE.format(arch=a), _u32(cfg["vocab_size"])))
    if table.rope_dimension_count:
        kv.append((K.Rope.DIMENSION_COUNT.format(arch=a), _u32(head_dim)))
    if any(e.ggml_type not in PLAIN_TYPES.values() for e in entries):
        kv.append((K.General.QUANTIZATION_VERSION, _u32(gguf.GGML_QUANT_VERSION)))
    tok = gguf_tokenizer.tokenizer_kvs(ck, cfg.get("vocab_size"), gguf_pre)
    if not tok and table.tokenizer_model != "gpt2":
        # llama.cpp's converter writes this architecture's vocabulary from tokenizer.model (or a
        # byte-level BPE tokenizer.json, which the folder does not have): no file without one
        raise error("EXPORT_UNMAPPABLE", f"gguf: architecture {a}'s vocabulary (tokenizer.ggml.model {table.tokenizer_model!r}, "
                    "SentencePiece) is written only from the GGUF metadata a folder converted from a GGUF file records "
                    "(`qformat convert model.gguf out/`); this folder has neither that record nor a byte-level BPE tokenizer.json",
                    field="tokenizer.json")
    return kv + tok


def file_type(ggml_type: str) -> int | None:
    """``general.file_type`` of a file mostly of ``ggml_type``: gguf-py's ``LlamaFileType``
    ``MOSTLY_<type>`` (``ALL_F32`` for F32; the K-quants' ``_M`` mix and MXFP4's ``_MOE``, the
    values llama.cpp guesses for them), or None when it has none."""
    import gguf

    for name in (f"MOSTLY_{ggml_type}", f"ALL_{ggml_type}", f"MOSTLY_{ggml_type}_M", f"MOSTLY_{ggml_type}_MOE"):
        if name in gguf.LlamaFileType.__members__:
            return int(gguf.LlamaFileType[name])
    return None


def preset_file_type(cfg: Mapping[str, Any], entries: list[TensorEntry]) -> int | None:
    """general.file_type: llama.cpp's ftype of the preset ``qformat quantize --preset`` recorded
    (config.json quantization_config ``gguf_preset``; a Q4_K_S file is mostly Q4_K, as a Q4_K_M
    one is), else :func:`file_type_of`."""
    qc = cfg.get("quantization_config")
    preset = qc.get("gguf_preset") if isinstance(qc, dict) else None
    if isinstance(preset, str):
        from .. import tables

        p = tables.gguf_presets().get(preset)
        if p is not None:
            return int(p["ftype"])
    return file_type_of(entries)


def imatrix_kvs(cfg: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The ``quantize.imatrix.*`` keys llama-quantize writes when it applied an importance
    matrix (file name and first dataset cut to 127 bytes, entry and chunk counts as uint32), from
    what ``qformat quantize --imatrix`` recorded in quantization_config."""
    qc = cfg.get("quantization_config")
    im = qc.get("imatrix") if isinstance(qc, dict) else None
    if not isinstance(im, dict):
        return []

    def cut(v: Any) -> str:
        return str(v).encode("utf-8")[:127].decode("utf-8", "ignore")

    out = [("quantize.imatrix.file", _str(cut(im.get("file", ""))))]
    ds = im.get("datasets")
    if isinstance(ds, list) and ds:
        out.append(("quantize.imatrix.dataset", _str(cut(ds[0]))))
    if isinstance(im.get("entries"), int):
        out.append(("quantize.imatrix.entries_count", _u32(abs(im["entries"]))))
    if isinstance(im.get("chunks"), int) and im["chunks"] > 0:
        out.append(("quantize.imatrix.chunks_count", _u32(im["chunks"])))
    return out


def file_type_of(entries: list[TensorEntry]) -> int | None:
    """general.file_type: the most frequent type of the tensors of 2 or more axes (llama.cpp's
    "mostly ..., except 1d tensors")."""
    count: dict[str, int] = {}
    for e in entries:
        if len(e.shape) >= 2:
            count[e.ggml_type] = count.get(e.ggml_type, 0) + 1
    if not count:
        return None
    return file_type(max(count, key=lambda k: count[k]))


def _retyped(model: _Model, entries: list[TensorEntry]) -> list[tuple[str, dict[str, Any]]]:
    """A GGUF source's KVs for the exported tensors: as recorded while every tensor keeps the type
    the source recorded (so an unchanged round trip gives the same file), else with
    ``general.file_type`` (and ``general.quantization_version``) for the types written now."""
    import gguf

    K = gguf.Keys.General
    if all(model.recorded.get(e.name) == e.ggml_type for e in entries):
        return model.kvs
    kvs = list(model.kvs)
    ft = file_type_of(entries)
    if ft is not None:
        kvs = _put(kvs, K.FILE_TYPE, _u32(ft))
    if any(e.ggml_type not in PLAIN_TYPES.values() for e in entries) and all(k != K.QUANTIZATION_VERSION for k, _ in kvs):
        kvs.append((K.QUANTIZATION_VERSION, _u32(gguf.GGML_QUANT_VERSION)))
    return kvs


def _put(kvs: list[tuple[str, dict[str, Any]]], key: str, value: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``kvs`` with ``key`` set to ``value``: in its place when present, else appended."""
    if any(k == key for k, _ in kvs):
        return [(k, value if k == key else v) for k, v in kvs]
    return kvs + [(key, value)]


def model_card_kvs(folder: str | None, total_params: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """The authorship keys llama.cpp's converter writes (``general.name``, ``basename``,
    ``size_label``, ``license``, ``tags``, ``base_model.*`` ...): gguf-py's ``gguf.Metadata``
    heuristics over the folder's model card (``README.md`` front matter) and ``config.json``
    (``_name_or_path``), written by its ``set_gguf_meta_model``.  Unlike the converter, the folder's
    own name is not used (a qformat output folder's name says nothing about the model): without a
    name from those, the card's first ``# Title`` is the name, else there is no ``general.name``."""
    from pathlib import Path

    import gguf

    path = Path(folder) if folder else None
    try:
        card = gguf.Metadata.load_model_card(path)
    except Exception as e:  # noqa: BLE001 - yaml's errors (a broken front matter), or not UTF-8
        raise error("CONVERT_SOURCE_INVALID", f"README.md: the model card cannot be read (gguf-py's Metadata, as llama.cpp's converter reads it): "
                    f"{type(e).__name__}: {e}", field="README.md") from None
    meta = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), card, gguf.Metadata.load_hf_parameters(path), None, total_params)
    if meta.name is None:
        meta.name = _card_title(path)
    named = meta.name is not None
    if not named:
        meta.name = ""  # set_gguf_meta_model needs one; dropped below
    w = gguf.GGUFWriter(path=None, arch="")
    meta.set_gguf_meta_model(w)
    out: list[tuple[str, dict[str, Any]]] = []
    for key, v in w.kv_data[0].items():
        if key == gguf.Keys.General.ARCHITECTURE or (key == gguf.Keys.General.NAME and not named):
            continue
        item = _writer_value(v)
        if item is not None:
            out.append((key, item))
    return out


def _card_title(path: Any) -> str | None:
    """The first ``# Title`` line of a model card (after its front matter)."""
    if path is None or not (path / "README.md").is_file():
        return None
    try:
        lines = (path / "README.md").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    if lines and lines[0] == "---":
        end = next((i for i, line in enumerate(lines[1:], 1) if line == "---"), len(lines))
        lines = lines[end + 1 :]
    for line in lines:
        m = re.fullmatch(r"#\s+(.*?)\s*#*\s*", line)
        if m and m.group(1):
            return m.group(1)
    return None


def _writer_value(v: Any) -> dict[str, Any] | None:
    """A gguf-py ``GGUFValue`` in the JSON form the writer takes (empty arrays left out: gguf-py
    cannot write them either)."""
    import gguf

    t = gguf.GGUFValueType(v.type)
    if t != gguf.GGUFValueType.ARRAY:
        return {"type": t.name.lower(), "value": v.value}
    items = list(v.value)
    if not items:
        return None
    sub = gguf.GGUFValueType(v.sub_type) if v.sub_type is not None else gguf.GGUFValueType.get_type(items[0])
    return {"type": "array", "element_type": sub.name.lower(), "value": items}


# -- the target --------------------------------------------------------------------------------------
class GGUF(Target):
    """GGUF v3 files for llama.cpp: ggml block types, plain tensors, the source's metadata."""

    name = "gguf"
    title = "GGUF (llama.cpp / ggml)"
    exact_schemes = (("int", {"bits": 8, "group_size": 32, "scale_dtype": "float16"}),
                     ("int", {"bits": 4, "group_size": 32, "scale_dtype": "float16"}),
                     ("int", {"bits": 5, "group_size": 32, "scale_dtype": "float16"}),
                     ("mxfp4", {}))

    def __init__(self) -> None:
        self._models: dict[int, _Model] = {}

    def model(self, ctx: Context) -> _Model:
        m = self._models.get(id(ctx))
        if m is None:
            if ctx.options.get("gguf_pre") is not None:  # a bad name fails before any tensor is planned
                gguf_tokenizer.check_pre_name(ctx.options["gguf_pre"])
            m = self._models[id(ctx)] = _model(ctx)
            if m.mode in ("plain", "gguf") and m.problem is not None:  # the whole model, before any tensor is planned
                raise error("EXPORT_UNMAPPABLE", m.problem, field="config.json model_type")
        return m

    def map(self, name: str, desc: Descriptor | None, ctx: Context) -> Mapped:
        model = self.model(ctx)
        out = model.rename(name)
        if out is None:  # metadata tensors, unused buffers: nothing to write
            return Mapped("not exported", [], lambda _p: {})
        if model.transposes(name):  # GPT-2's Conv1D weights: the GGUF holds [out, in]
            return _transposed(name, out, desc, ctx)
        if desc is None:
            info = ctx.source.info(name)
            mapped = _plain(name, out, ctx)
            shape = tuple(info.shape) if info is not None else ()
        else:
            mapped = _quantized(name, out, desc, ctx)
            shape = tuple(desc.shape)
        shift = model.shift(name)
        if shift:
            require(desc is None, f"a quantized tensor that llama.cpp stores as its values plus {shift:g} ({model.arch}'s norms): "
                    "packed codes cannot take the shift exactly")
            mapped = _shifted(mapped, shift)
        perm = model.permutation(name, shape, desc is not None)
        return _permuted(mapped, perm) if perm is not None else mapped

    def fallback(self, name: str, desc: Descriptor, ctx: Context) -> tuple[str, dict[str, Any]] | None:
        """int4 g32 F16 symmetric (Q4_0) for integer codes of 4 bits or fewer, else int8 g32 F16
        (Q8_0); None when the rows are not a multiple of 32 or the tensor cannot be named."""
        shape = tuple(desc.shape)
        if not 1 <= len(shape) <= MAX_DIMS or shape[-1] % 32:
            return None
        try:
            self.model(ctx).rename(name)
        except Refusal:
            return None
        el = desc.codes.element
        bits = 4 if el.type == "int" and el.bits <= 4 else 8
        return "int", {"bits": bits, "group_size": 32, "symmetric": True, "scale_dtype": "float16"}

    def kvs(self, entries: list[TensorEntry], ctx: Context) -> list[tuple[str, dict[str, Any]]]:
        """The file's key/values: a GGUF source's own (``general.file_type`` following the types
        written), a llama-family checkpoint's from config.json, model card and tokenizer, else the
        architecture alone.  The ``gguf_pre`` option sets ``tokenizer.ggml.pre``."""
        import gguf

        model = self.model(ctx)
        pre = ctx.options.get("gguf_pre")
        if pre is not None:
            pre = gguf_tokenizer.check_pre_name(pre)
        if model.mode == "gguf":
            kvs = _retyped(model, entries)
            if pre is not None:
                require_option(any(k == gguf.Keys.Tokenizer.MODEL for k, _ in kvs), "the GGUF source has no tokenizer")
                kvs = _put(kvs, gguf.Keys.Tokenizer.PRE, _str(str(pre)))
            return kvs
        if model.mode == "hf":
            kvs = _hf_kvs(model, entries, ctx.checkpoint, pre)
            require_option(pre is None or any(k == gguf.Keys.Tokenizer.PRE for k, _ in kvs), "the checkpoint has no byte-level BPE tokenizer.json")
            return kvs
        require_option(pre is None, "only llama-family checkpoints (config.json model_type llama, mistral, qwen2) get tokenizer keys")
        return [(gguf.Keys.General.ARCHITECTURE, _str(model.arch))] if model.arch else []

    def write(self, dst: str, plan: ExportPlan, ctx: Context) -> list[str]:
        from ..checkpoint import output as out_
        from ..checkpoint.writer import check_destination

        check_destination(dst, False, bool(ctx.options.get("overwrite")))
        model = self.model(ctx)
        release = getattr(ctx.checkpoint, "release", None)

        def chunked(t: Any) -> Any:
            """A tensor's slices as it builds them, the source's pages dropped after each is
            written (a large tensor's pages do not accumulate while it is read)."""
            if t.chunks is None:
                return None

            def chunks() -> Any:
                for piece in t.chunks():
                    yield piece
                    del piece
                    if release is not None:
                        release()

            return chunks

        entries: list[TensorEntry] = []
        for t in plan.tensors:
            if not t.mapped.specs:
                t.produce()  # records the tensor as handled; makes nothing
                continue
            (spec,) = t.mapped.specs
            entries.append(TensorEntry(spec.name, spec.dtype, tuple(spec.shape), lambda t=t, n=spec.name: t.produce()[n], chunked(t)))
        if model.order:
            rank = {n: i for i, n in enumerate(model.order)}
            entries.sort(key=lambda e: rank.get(e.name, len(rank)))
        if model.mode == "hf" and _rope_type(model.config) == "llama3":
            factors = llama3_rope_factors(model.config)  # llama.cpp's Llama 3 rope scaling is this tensor
            entries.insert(0, TensorEntry("rope_freqs.weight", "F32", factors.shape, lambda: factors))
        if model.mode == "gguf" and model.table is not None:
            entries = _recorded_tensors(model, entries)
        kvs = self.kvs(entries, ctx)
        bar = out_.ByteProgress(sum(e.nbytes for e in entries), ctx.options.get("progress"), "export gguf")

        def written(e: TensorEntry) -> None:
            bar.advance(e.nbytes)
            if release is not None:
                release()

        try:
            write_gguf(dst, kvs, entries, alignment=model.alignment, written=written)
        finally:
            bar.close()
        return [dst]


def _recorded_tensors(model: _Model, entries: list[TensorEntry]) -> list[TensorEntry]:
    """A folder converted from a GGUF file: the recorded tensors transformers does not load
    (``rope_freqs.weight`` of Llama 3 rope scaling) made again from config.json, in the recorded
    order; any other recorded tensor missing is refused (a GGUF without it would run differently)."""
    have = {e.name for e in entries}
    missing = [n for n in model.order if n not in have]
    if "rope_freqs.weight" in missing and _rope_type(model.config) == "llama3" and model.table is not None and "llama3" in model.table.rope_types:
        factors = llama3_rope_factors(model.config)
        entries = entries + [TensorEntry("rope_freqs.weight", "F32", factors.shape, lambda: factors)]
        missing.remove("rope_freqs.weight")
        rank = {n: i for i, n in enumerate(model.order)}
        entries.sort(key=lambda e: rank.get(e.name, len(rank)))
    if missing:
        raise error("EXPORT_UNMAPPABLE", f"gguf: the GGUF this folder was converted from has {len(missing)} tensor(s) the folder does not "
                    f"hold ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}) and that cannot be made again from config.json; "
                    "llama.cpp would run the file differently without them", tensor=missing[0])
    return entries


def require_option(ok: bool, why: str) -> None:
    """The ``gguf_pre`` option must have something to apply to (an option that does nothing is an
    error, not silently ignored)."""
    if not ok:
        raise error("EXPORT_OPTION_INVALID", f"gguf: --gguf-pre was given but {why}", field="gguf_pre")
