"""Source ``gguf``: GGUF files (llama.cpp / ggml) into qformat files, bit-exact with gguf-py.

GGUF is not safetensors, so nothing can be described in place: every quantized tensor is split
into canonical components (SPEC.md Appendix C.1): its codes, unpacked from the blocks
(reassembling codes whose bits the block splits over several arrays) and packed into ``U8``
rows along the last axis; its block scales and minimums as plain ``F16`` parameters; and for
the K-quants, the 4/6/8-bit sub-block scales and minimums as nested (``encoded``) parameters
whose own scale is the super-block ``d`` / ``dmin``.  Both conversion modes write the same
components.  F32, F16, BF16, F64 and integer tensors are written as plain tensors.

The descriptors reproduce gguf-py's ``gguf.quants.dequantize`` (binary32, one rounding per
operation, in its order) bit for bit:

==========  ==========================  ===============================================
type        gguf-py                     qformat (x = element value of the code)
==========  ==========================  ===============================================
Q4_0, Q5_0  ``d * (q - 8|16)``          offset_binary codes; scale ``d``
Q4_1, Q5_1  ``d * q + m``               unsigned codes; scale ``d``; bias add ``m``
Q8_0        ``q * d``                   twos_complement codes; scale ``d``
Q2_K        ``(d*sc) * q - dmin*m``     scale encoded ``sc * d``; bias subtract ``m * dmin``
Q3_K        ``(d*(sc-32)) * q``         offset_binary 3-bit codes; scale encoded 6-bit offset_binary ``sc * d``
Q4_K, Q5_K  ``(d*sc) * q - dmin*m``     as Q2_K with 6-bit sc/m per 32
Q6_K        ``(d*sc) * (q - 32)``       offset_binary 6-bit codes; scale encoded int8 ``sc * d``
MXFP4       ``2^(e-128) * 2v``          codebook (E2M1 with +0 at code 8); F8_E8M0 scale ``2^(e-127)``
==========  ==========================  ===============================================

The other ggml types (the i-quants IQ1_S ... IQ4_XS, TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0, Q8_K) have
codes that are computed rather than bit fields (base-3 digits, lattice grid rows and sign
patterns); :mod:`.gguf_codes` describes them, with in-file codebooks, and documents each
mapping.  Only Q8_1 is refused (``CONVERT_UNSUPPORTED``; see there why).

Multiplication is commutative in IEEE 754 (``d*sc`` and ``sc*d`` round alike), and for MXFP4
both sides are the exact product of a power of two and an E2M1 value rounded once.  Two MXFP4
details need care: gguf-py maps code 8 to ``+0.0`` (E2M1's ``-0``), so the element is an
in-file codebook rather than ``e2m1fn``; and ggml reads exponent byte 255 as ``2^127`` where
qformat's ``e8m0fnu`` reads NaN, so a tensor with a 255 exponent takes its scale from a
256-entry in-file table of ggml's values instead (``_mxfp4``).

The GGUF key/value metadata goes to ``__metadata__["gguf"]`` as JSON (``_metadata``); a value
whose JSON exceeds :data:`MAX_INLINE_VALUE_BYTES` (tokenizer vocabularies, merges) gets its own
``__metadata__`` member ``gguf.kv.<key>`` holding that JSON, the ``gguf`` member pointing at it.
So the output's tensors are the model's tensors and nothing else, and the ``gguf`` member stays
small enough to read at a glance; all the members together are kept under
:data:`MAX_METADATA_BYTES` of header (safetensors headers end at 100 MB).  Files written before
stored such values as ``U8`` tensors of the same names (:data:`KV_TENSOR_PREFIX`); export still
reads them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import ml_dtypes
import numpy as np

from .. import dtypes as _dt
from ..packing import Packing
from ..pipeline import Component
from ..schemes._common import codes_entry, packing
from ._fastpack import describe_parts, extract, extract_packed, pack_canonical
from . import gguf_codes
from .base import Checkpoint, Converter, Described, lazy, source_error, unsupported
from .gguf_file import GGML_TYPES, KV, GGUFFile, TensorInfo

#: A metadata value whose JSON is longer than this gets its own ``gguf.kv.<key>`` metadata member.
MAX_INLINE_VALUE_BYTES = 64 << 10
#: The most header bytes the GGUF metadata members may take together (as escaped JSON strings in
#: the safetensors header): safetensors refuses headers over 100 MB, and the tensor index and the
#: qformat descriptors need the rest.  A GGUF file with more metadata is CONVERT_UNSUPPORTED.
MAX_METADATA_BYTES = 64_000_000
METADATA_KEY = "gguf"
#: The ``__metadata__`` member of a large value: this prefix and the GGUF key.
KV_MEMBER_PREFIX = "gguf.kv."
#: Files converted before the members existed stored large values as ``U8`` tensors of these names.
KV_TENSOR_PREFIX = KV_MEMBER_PREFIX

#: ggml types stored as plain tensors: id -> NumPy dtype of their elements (little-endian).
PLAIN: dict[int, Any] = {
    0: np.dtype("<f4"), 1: np.dtype("<f2"), 30: np.dtype(ml_dtypes.bfloat16), 24: np.dtype("i1"),
    25: np.dtype("<i2"), 26: np.dtype("<i4"), 27: np.dtype("<i8"), 28: np.dtype("<f8"),
}

_Part = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # byte in block, right shift, width, left shift


def _part(byte: Any, shift: Any, width: Any, dest: int = 0) -> _Part:
    return (np.asarray(byte, np.intp), np.asarray(shift, np.uint8), np.asarray(width, np.uint8), dest)


@dataclass(frozen=True)
class _Field:
    """Codes spread over a block: ``parts`` OR-ed together, one entry per code of the block."""

    bits: int
    signedness: str
    parts: tuple[_Part, ...]

    def element(self) -> dict[str, Any]:
        return {"type": "int", "bits": self.bits, "signedness": self.signedness}

    def __post_init__(self) -> None:
        # The bit map compiled into runs of consecutive bytes (read as slices, scalar shifts).
        object.__setattr__(self, "_runs", describe_parts(self.parts))

    def extract(self, blocks: np.ndarray) -> np.ndarray:
        return extract(blocks, int(self.parts[0][0].size), self._runs)  # type: ignore[attr-defined]

    def extract_packed(self, blocks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The canonical packing of the codes (of logical ``shape``), made in row chunks."""
        return extract_packed(blocks, int(self.parts[0][0].size), self._runs, shape, self.bits)  # type: ignore[attr-defined]

    def extract_reference(self, blocks: np.ndarray) -> np.ndarray:
        """The same codes by per-element gathers (the definition :meth:`extract` is tested against)."""
        out = np.zeros((blocks.shape[0], self.parts[0][0].size), np.uint8)
        for byte, shift, width, dest in self.parts:
            mask = ((1 << width.astype(np.int64)) - 1).astype(np.uint8)
            out |= ((blocks[:, byte] >> shift) & mask) << np.uint8(dest)
        return out


@dataclass(frozen=True)
class _Type:
    """Where everything sits in one block of a ggml type (ggml-common.h's block_* structs)."""

    name: str
    block: int
    size: int
    codes: _Field
    d: int  # byte offset of the f16 block scale d (MXFP4: of the E8M0 exponent byte)
    m: int | None = None  # Q4_1 / Q5_1: byte offset of the f16 minimum m (added)
    sub: int | None = None  # K-quants: elements per sub-block
    sc: _Field | None = None  # K-quants: sub-block scales (times d)
    dmin: int | None = None  # K-quants: byte offset of the f16 dmin
    mins: _Field | None = None  # K-quants: sub-block minimums (times dmin, subtracted)


def _types() -> dict[int, _Type]:
    """Block layouts from ggml-common.h (bit maps as gguf-py's quants.py reads them)."""
    e = np.arange(32)
    k = np.arange(256)
    j8 = np.arange(8)
    j16 = np.arange(16)
    half = 4 * (e // 16)  # Q4_0-style split halves: element j in the low nibble of byte j, j+16 in the high
    kq4 = 4 * ((k % 64) // 32)  # Q4_K/Q5_K: per 64 elements, 32 bytes, low nibbles first
    kq2 = 2 * ((k % 128) // 32)  # Q2_K/Q3_K: per 128 elements, 32 bytes, 4 shifts of 2 bits
    lo = j8 < 4
    # Q4_K/Q5_K 6-bit scales and mins (12 bytes at offset 4): j < 4 in bytes j (scale) / 4+j (min)
    # bits 0-5; j >= 4 in the nibbles of byte 8+j-4 plus bits 6-7 of bytes j-4 / j as bits 4-5.
    sc6 = _Field(6, "unsigned", (
        _part(np.where(lo, 4 + j8, 12 + j8 - 4), 0, np.where(lo, 6, 4)),
        _part(np.where(lo, 4, 4 + j8 - 4), 6, np.where(lo, 0, 2), 4)))
    min6 = _Field(6, "unsigned", (
        _part(np.where(lo, 8 + j8, 12 + j8 - 4), np.where(lo, 0, 4), np.where(lo, 6, 4)),
        _part(np.where(lo, 8, 8 + j8 - 4), 6, np.where(lo, 0, 2), 4)))
    return {
        2: _Type("Q4_0", 32, 18, _Field(4, "offset_binary", (_part(2 + e % 16, half, 4),)), d=0),
        3: _Type("Q4_1", 32, 20, _Field(4, "unsigned", (_part(4 + e % 16, half, 4),)), d=0, m=2),
        6: _Type("Q5_0", 32, 22, _Field(5, "offset_binary", (_part(6 + e % 16, half, 4), _part(2 + e // 8, e % 8, 1, 4))), d=0),
        7: _Type("Q5_1", 32, 24, _Field(5, "unsigned", (_part(8 + e % 16, half, 4), _part(4 + e // 8, e % 8, 1, 4))), d=0, m=2),
        8: _Type("Q8_0", 32, 34, _Field(8, "twos_complement", (_part(2 + e, 0, 8),)), d=0),
        10: _Type("Q2_K", 256, 84, _Field(2, "unsigned", (_part(16 + (k // 128) * 32 + k % 32, kq2, 2),)), d=80,
                  sub=16, sc=_Field(4, "unsigned", (_part(j16, 0, 4),)), dmin=82, mins=_Field(4, "unsigned", (_part(j16, 4, 4),))),
        # Q3_K: q = low 2 bits + 4 * hmask bit, minus 4 (gguf-py: ql - 4 * (1 - h)); scales: low
        # nibbles of bytes 96..103 then their high nibbles, bits 4-5 from bytes 104..107, minus 32.
        11: _Type("Q3_K", 256, 110, _Field(3, "offset_binary", (_part(32 + (k // 128) * 32 + k % 32, kq2, 2), _part(k % 32, k // 32, 1, 2))), d=108,
                  sub=16, sc=_Field(6, "offset_binary", (_part(96 + j16 % 8, 4 * (j16 // 8), 4), _part(104 + j16 % 4, 2 * (j16 // 4), 2, 4)))),
        12: _Type("Q4_K", 256, 144, _Field(4, "unsigned", (_part(16 + (k // 64) * 32 + k % 32, kq4, 4),)), d=0,
                  sub=32, sc=sc6, dmin=2, mins=min6),
        13: _Type("Q5_K", 256, 176, _Field(5, "unsigned", (_part(48 + (k // 64) * 32 + k % 32, kq4, 4), _part(16 + k % 32, k // 32, 1, 4))), d=0,
                  sub=32, sc=sc6, dmin=2, mins=min6),
        # Q6_K: ql[128] (per 128 elements, 64 bytes, low nibbles first), qh[64] (per 128, 32 bytes,
        # 4 shifts of 2 bits), int8 scales[16], f16 d; q = (ql | qh << 4) - 32.
        14: _Type("Q6_K", 256, 210, _Field(6, "offset_binary", (_part((k // 128) * 64 + k % 64, 4 * ((k % 128) // 64), 4),
                                                               _part(128 + (k // 128) * 32 + k % 32, kq2, 2, 4))), d=208,
                  sub=16, sc=_Field(8, "twos_complement", (_part(192 + j16, 0, 8),))),
        39: _Type("MXFP4", 32, 17, _Field(4, "unsigned", (_part(1 + e % 16, half, 4),)), d=0),
    }


TYPES = _types()

#: MXFP4 element values as gguf-py uses them (kvalues, E2M1 doubled; code 8 is +0).
_MXFP4_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_e8m0_to_fp32_half``: 2^(e-128) as binary32, built from its bits (255 -> 2^127)."""
    e = np.asarray(e, np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


class GGUF(Converter):
    name = "gguf"
    title = "GGUF files (llama.cpp): every ggml type (legacy, K-quants, i-quants, TQ*, MXFP4, NVFP4, Q1_0, Q2_0), F32/F16/BF16"
    priority = 10

    def detect(self, ck: Checkpoint) -> bool:
        return ck.kind == "gguf"

    def describe(self, ck: Checkpoint) -> Described:
        if ck.kind != "gguf":
            raise source_error(f"{ck.path} is not a GGUF file (it is read as {ck.kind})")
        f = GGUFFile(os.path.join(ck.folder, ck.files[0]))
        ck.track(f._mm)  # the writer's release() drops the pages each tensor touched
        out = Described()
        for t in f.tensors.values():
            if t.ggml_type in PLAIN:
                c = _lazy(PLAIN[t.ggml_type], t.shape, lambda t=t: f.raw(t.name).view(PLAIN[t.ggml_type]).reshape(t.shape))
                out.plain[t.name] = Component(c.spec, c.produce, (f.path, t.start))  # little-endian bytes, as stored
            elif t.ggml_type in TYPES or t.ggml_type in gguf_codes.TYPES:
                try:
                    if t.ggml_type in TYPES:
                        _describe(out, t, lambda t=t: f.raw(t.name))
                    else:
                        gguf_codes.describe(out, t, lambda t=t: f.raw(t.name), _grid, lazy)
                    ck.release()
                except KeyError as e:  # Described.add: a component name made twice
                    raise unsupported(f"component name {e.args[0]} is made twice (tensor names of the file collide with <name>.codes, <name>.scale, ...)", tensor=t.name) from None
            else:
                supported = ", ".join(sorted([GGML_TYPES[i][0] for i in TYPES] + [GGML_TYPES[i][0] for i in gguf_codes.TYPES]
                                             + [GGML_TYPES[i][0] for i in PLAIN]))
                raise unsupported(f"ggml type {t.type_name} has no qformat mapping here; supported: {supported}", tensor=t.name, field=f"tensor_info[{t.name}].type")
        clash = sorted((set(out.plain) | set(out.descriptors)) & set(out.added))
        if clash:
            raise unsupported(f"the component name {clash[0]!r} is also the name of a tensor of the file", tensor=clash[0])
        out.metadata.update(_metadata(f))
        return out


def _grid(rank: int, size: int) -> dict[str, Any]:
    return {"type": "grid", "size": [1] * (rank - 1) + [size]}


def _lazy(dtype: Any, shape: Any, produce: Callable[[], np.ndarray]) -> Component:
    """A component of NumPy dtype ``dtype`` and ``shape``, made by ``produce`` when written."""
    st = _dt.storage_name(np.dtype(dtype))
    assert st is not None
    return lazy(st, tuple(shape), produce)


def _packed(shape: Any, bits: int, codes: Callable[[], np.ndarray]) -> Component:
    """The canonical packing of ``codes()`` (of ``shape``), made when written."""
    shape = tuple(shape)
    words = Packing.from_dict(packing(len(shape))).words_per_row(shape[-1], bits)
    return lazy("U8", shape[:-1] + (words,), lambda: pack_canonical(codes(), bits))


def _describe(out: Described, t: TensorInfo, raw: Callable[[], np.ndarray] | None) -> None:
    """Add the descriptor and components of one quantized tensor to ``out``.

    ``raw`` None: only the plan (descriptor and component specs) of blocks known to have
    finite parameters (the ``gguf`` encoder's, which checks that itself).

    The descriptor is made now (reading only what it depends on: whether the block scales are
    finite, whether an MXFP4 exponent is 255); every component is produced from the block
    bytes (``raw()``, a memory map) only when the writer writes it.
    """
    spec = TYPES[t.ggml_type]
    name, shape, r = t.name, tuple(t.shape), len(t.shape)
    lead, K = shape[:-1], shape[-1]

    def blocks() -> np.ndarray:
        assert raw is not None
        return raw().reshape(-1, spec.size)

    def f16(off: int) -> Callable[[], np.ndarray]:
        # every block size and f16 offset is even: one strided uint16 gather, not 2-byte runs
        return lambda: np.ascontiguousarray(blocks().view("<u2")[:, off // 2]).view("<f2").reshape(lead + (K // spec.block,))

    def codes() -> np.ndarray:
        return spec.codes.extract(blocks()).reshape(shape)

    desc: dict[str, Any] = {"shape": list(shape), "dtype": "float32", "scheme": "gguf_" + spec.name.lower()}
    params: list[Callable[[], np.ndarray]] = []
    offsets = [o for o in (spec.d, spec.m, spec.dmin) if o is not None]  # the f16 block parameters
    if spec.name == "MXFP4":
        _mxfp4(out, name, desc, codes, lambda: blocks()[:, spec.d].reshape(lead + (K // 32,)), lead + (K // 32,), r)
        out.descriptors[name] = desc
        return
    words = Packing.from_dict(packing(r)).words_per_row(K, spec.codes.bits)
    fused = lazy("U8", lead + (words,), lambda: spec.codes.extract_packed(blocks(), shape))
    desc["codes"] = codes_entry(out.add(name + ".codes", fused), spec.codes.element(), r)
    d = f16(spec.d)
    params.append(d)
    pshape = lead + (K // spec.block,)
    if spec.sub is None:
        desc["scale"] = {"blocks": _grid(r, spec.block), "op": "multiply", "tensor": out.add(name + ".scale", _lazy("<f2", pshape, d))}
        if spec.m is not None:
            m = f16(spec.m)
            params.append(m)
            desc["bias"] = {"blocks": _grid(r, spec.block), "op": "add", "tensor": out.add(name + ".bias", _lazy("<f2", pshape, m))}
    else:
        assert spec.sc is not None
        nested_shape = list(lead) + [K // spec.sub]
        per = spec.block // spec.sub

        def nested(role: str, field: Any, sup: Callable[[], np.ndarray]) -> dict[str, Any]:
            c = lazy("U8", tuple(nested_shape[:-1]) + (Packing.from_dict(packing(r)).words_per_row(nested_shape[-1], field.bits),),
                     lambda: field.extract_packed(blocks(), tuple(nested_shape)))
            return {"shape": nested_shape, "dtype": "float32",
                    "codes": codes_entry(out.add(f"{name}.{role}.codes", c), field.element(), r),
                    "scale": {"blocks": _grid(r, per), "op": "multiply", "tensor": out.add(f"{name}.{role}.scale", _lazy("<f2", pshape, sup))}}

        desc["scale"] = {"blocks": _grid(r, spec.sub), "op": "multiply", "encoded": nested("scale", spec.sc, d)}
        if spec.mins is not None:
            assert spec.dmin is not None
            dmin = f16(spec.dmin)
            params.append(dmin)
            desc["bias"] = {"blocks": _grid(r, spec.sub), "op": "subtract", "encoded": nested("bias", spec.mins, dmin)}
    # finite float16 <=> exponent field not all ones: integer ops on the bits (NumPy's float16
    # isfinite converts each value)
    if raw is not None and not all(bool((np.bitwise_and(blocks().view("<u2")[:, off // 2], 0x7C00) != 0x7C00).all()) for off in offsets):
        # gguf-py decodes non-finite scales as IEEE arithmetic says; so does qformat, and the flag
        # keeps `qformat check` from reporting what the source itself holds.
        desc["allow_nonfinite_params"] = True
        for role in ("scale", "bias"):
            if "encoded" in desc.get(role, {}):
                desc[role]["encoded"]["allow_nonfinite_params"] = True
    out.descriptors[name] = desc


def _mxfp4(out: Described, name: str, desc: dict[str, Any], codes: Callable[[], np.ndarray], e: Callable[[], np.ndarray],
           eshape: tuple[int, ...], r: int) -> None:
    """MXFP4: E2M1 codes (gguf-py's code 8 is +0, so an in-file codebook) times 2^(e-127).

    With every exponent byte below 255 the scale is the plain ``F8_E8M0`` tensor of exponents
    (x_code * 2^(e-127) is the exact product gguf-py rounds once as (2 x_code) * 2^(e-128)).
    ggml reads 255 as 2^127 (times the doubled value), which ``e8m0fnu`` cannot say (it is NaN
    there), so such a tensor uses gguf-py's doubled values and a nested 8-bit codebook whose
    256-entry table is ggml's ``e8m0_to_fp32_half``.
    """
    shape = tuple(desc["shape"])
    packed = out.add(name + ".codes", _packed(shape, 4, codes))
    blocks = _grid(r, 32)
    if not (e() == 255).any():
        table = _MXFP4_DOUBLED * np.float32(0.5)  # exact halving; code 8 stays +0.0
        element = {"type": "codebook", "bits": 4, "table_tensor": out.add(name + ".table", table)}
        desc["codes"] = codes_entry(packed, element, r)
        desc["scale"] = {"blocks": blocks, "op": "multiply",
                         "tensor": out.add(name + ".scale", _lazy(ml_dtypes.float8_e8m0fnu, eshape,
                                                                 lambda: np.ascontiguousarray(e()).view(ml_dtypes.float8_e8m0fnu)))}
        return
    element = {"type": "codebook", "bits": 4, "table_tensor": out.add(name + ".table", _MXFP4_DOUBLED.copy())}
    desc["codes"] = codes_entry(packed, element, r)
    half = {"type": "codebook", "bits": 8, "table_tensor": out.add(name + ".scale.table", e8m0_half(np.arange(256)))}
    desc["scale"] = {"blocks": blocks, "op": "multiply", "encoded": {
        "shape": list(eshape), "dtype": "float32", "codes": codes_entry(out.add(name + ".scale.codes", _packed(eshape, 8, e)), half, r)}}


# -- metadata ------------------------------------------------------------------------------------
def _jsonable(v: KV) -> dict[str, Any]:
    """A KV as JSON: {"type", "value"}; arrays add "element_type"; non-finite floats as strings."""
    if v.type == "array":
        if v.element_type == "array":
            items: list[Any] = [_jsonable(x) for x in v.value]
        elif v.element_type in ("float32", "float64"):
            items = [_float(x) for x in v.value]
        else:
            items = list(v.value)
        return {"type": "array", "element_type": v.element_type, "value": items}
    if v.type in ("float32", "float64"):
        return {"type": v.type, "value": _float(v.value)}
    return {"type": v.type, "value": v.value}


def kv_json(v: KV) -> dict[str, Any]:
    """One GGUF key/value in the JSON form ``__metadata__["gguf"]`` records it in (SPEC.md C.11)."""
    return _jsonable(v)


def _float(x: float) -> float | str:
    # float32 values are exact as binary64, whose shortest repr round-trips; JSON has no NaN/Inf.
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def header_bytes(key: str, text: str) -> int:
    """Bytes a ``__metadata__`` member takes in the safetensors header (its key and its value as
    JSON strings, escaped as qformat's container writes them, plus the separators)."""
    return len(json.dumps(key, ensure_ascii=False).encode("utf-8")) + len(json.dumps(text, ensure_ascii=False).encode("utf-8")) + 2


def _metadata(f: GGUFFile) -> dict[str, str]:
    """The ``__metadata__`` members holding the GGUF key/values: ``gguf`` (version, alignment,
    every key, the tensor list) and one ``gguf.kv.<key>`` per value too large to sit inline,
    whose entry in ``gguf`` is a stub naming the member."""
    kv: dict[str, Any] = {}
    members: dict[str, str] = {}
    for key, v in f.kv.items():
        j = _jsonable(v)
        text = _dumps(j)
        if len(text.encode("utf-8")) <= MAX_INLINE_VALUE_BYTES:
            kv[key] = j
            continue
        member = KV_MEMBER_PREFIX + key
        members[member] = text
        stub: dict[str, Any] = {"type": j["type"], "metadata": member, "bytes": len(text.encode("utf-8"))}
        if j["type"] == "array":
            stub.update(element_type=j["element_type"], length=len(j["value"]))
        kv[key] = stub
    obj = {"version": f.version, "alignment": f.alignment, "kv": kv,
           "tensors": [[t.name, t.type_name, list(t.shape)] for t in f.tensors.values()]}
    out = {METADATA_KEY: _dumps(obj), **members}
    total = sum(header_bytes(k, t) for k, t in out.items())
    if total > MAX_METADATA_BYTES:
        big = max(members, key=lambda m: len(members[m])) if members else METADATA_KEY
        raise unsupported(f"the GGUF key/values need {total:,} bytes of safetensors header (the largest, {big!r}, "
                          f"{header_bytes(big, out[big]):,}); at most {MAX_METADATA_BYTES:,} fit beside the tensor index", field=METADATA_KEY)
    return out
