"""GGUF types whose codes are computed per element: the i-quants, the ternary types, NVFP4, Q1_0,
Q2_0 and Q8_K, read bit-exactly as qformat descriptors.

:mod:`qformat.convert.gguf` describes the types whose codes are bit fields of the block (the
legacy types, the K-quants, MXFP4).  The types here need one step more, done once at conversion:
each element's code is *computed* from the block (a base-3 digit for TQ1_0; for the lattice
i-quants, the grid row a group of elements points at, read at the element's column, plus the
element's sign bit), and then written as an ordinary 2-4 bit code whose element is an in-file
codebook (``W.table``, ``F32``).  Sub-block scales that are odd multiples or half-integers of the
block scale (``d * (0.5 + s) / 4``, ``d * (2s + 1)``) are nested codebooks too (``W.scale.table``)
times the ``F16`` block scale ``d``.  Every reader of qformat descriptors (Python, JS, C) then
decodes them; no reader needs llama.cpp's grids.

The decoded values are gguf-py's ``gguf.quants.dequantize`` bit for bit: in every type below
each product gguf-py rounds is exact in binary32 (the factors' significands have at most 11 + 5 + 6
bits together, and no value reaches the subnormal or overflow range: the smallest block scale is
the f16 subnormal 2^-24), so the exact real product qformat rounds once is the same number,
signed zeros and non-finite ``d`` included.

==========  ================  ===================================================  ====================================================
type        block (el, B)     element (code -> value; ``W.table``)                 scale
==========  ================  ===================================================  ====================================================
IQ4_NL      32, 18            4-bit codebook ``kvalues_iq4nl`` (-127 ... 113)      ``d`` F16, grid [1, 32]
IQ4_XS      256, 136          4-bit codebook ``kvalues_iq4nl``                     encoded per 32: 6-bit ``offset_binary`` (ls - 32) times ``d``
TQ1_0       256, 54           2-bit ``twos_complement`` (base-3 digit - 1)         ``d`` F16, grid [1, 256]
TQ2_0       256, 66           2-bit codebook [-1, 0, 1, 2]                         ``d`` F16, grid [1, 256]
Q1_0        128, 18           1-bit codebook [-1, 1]                               ``d`` F16, grid [1, 128]
Q2_0        64, 18            2-bit codebook [-1, 0, 1, 2]                         ``d`` F16, grid [1, 64]
Q8_K        256, 292          8-bit ``twos_complement``                            ``d`` F32, grid [1, 256] (``bsums`` are derived, not kept)
NVFP4       64, 36            4-bit codebook E2M1 doubled (+0 at code 8)           encoded per 16: 8-bit codebook, ggml's ``ue4m3_to_fp32`` / 2 of each byte
IQ2_XXS     256, 66           3-bit codebook [8, 25, 43, -8, -25, -43]             encoded per 32: 4-bit codebook (0.5 + s) / 4 times ``d``
IQ2_XS      256, 74           as IQ2_XXS                                           encoded per 16: as IQ2_XXS
IQ2_S       256, 82           as IQ2_XXS                                           encoded per 16: as IQ2_XXS
IQ3_XXS     256, 98           4-bit codebook [4, 12, ..., 62, -4, ..., -62]        encoded per 32: 4-bit codebook (0.5 + s) / 2 times ``d``
IQ3_S       256, 110          4-bit codebook [1, 3, ..., 15, -1, ..., -15]         encoded per 32: 4-bit codebook 2s + 1 times ``d``
IQ1_S       256, 50           3-bit codebook g + delta (g in -1, 0, 1; +-1/8)      encoded per 32: 3-bit codebook 2s + 1 times ``d``
IQ1_M       256, 56           as IQ1_S (delta per 8 elements)                      encoded per 16: as IQ1_S (``d`` reassembled from 4 nibbles)
==========  ================  ===================================================  ====================================================

The lattice types (IQ1_*, IQ2_*, IQ3_*) grow on the way: a group of 8 (IQ2, IQ1) or 4 (IQ3)
elements shares one 8-11 bit grid index and a 7-bit sign index in GGUF, and gets one 3- or 4-bit
code per element here (IQ2_XXS: 2.06 bits per weight in GGUF, 3.19 here; IQ1_S 1.56 -> 3.19).
Nothing is lost: the grid rows are distinct, so the GGUF blocks could be rebuilt from the codes.
Q8_K's ``bsums`` are the sums of the codes per 16, which ggml derives for its dot products; no
decoder (ggml's ``dequantize_row_q8_K``) reads them, so they are not kept.

Q1_0, Q2_0 and Q8_K have no gguf-py dequantizer; their reference is ggml's ``dequantize_row_*``
(``ggml/src/ggml-quants.c``: ``bit ? d : -d``, ``(q - 1) * d``, ``d * q``), which
tests/test_gguf_types.py runs (compiled from llama.cpp's source) for every type.

Refused: ``Q8_1`` (``CONVERT_UNSUPPORTED``).  It is an activation-only type: llama.cpp never writes
it to a model file and defines no dequantizer for it (``type_traits[GGML_TYPE_Q8_1]`` has no
``to_float``; gguf-py has none either), and the two disagree on its block: ggml's ``block_q8_1`` is
36 bytes (f16 ``d`` and ``s``), gguf-py's ``GGML_QUANT_SIZES`` says 40 (f32, an older layout).
There is no reference a reading could be exact against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..packing import Packing
from ..schemes._common import codes_entry, packing
from ._fastpack import pack_canonical
from .gguf_grids import GRIDS, grid_indices, ksigns

F = np.float32
#: Blocks decoded per step when a component is made (bounds the temporaries to a few MB).
CHUNK_BLOCKS = 1 << 14

#: ggml's kvalues_iq4nl.
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
#: E2M1 values doubled, code 8 is +0 (ggml's kvalues_mxfp4, gguf-py's NVFP4.kvalues).
KVALUES_FP4_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def ue4m3_half() -> np.ndarray:
    """ggml's ``ggml_ue4m3_to_fp32`` of every byte (0 and 0x7F are 0; bit 7 is ignored), as
    gguf-py computes it: ``float32[256]``, every value exact."""
    x = np.arange(256, dtype=np.int64)
    exp, man = (x >> 3) & 0xF, (x & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * 2.0 ** (exp - 7).astype(np.float64))
    return np.where((x == 0) | (x == 0x7F), 0.0, raw * 0.5).astype(F)


def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, off:off + 2]).view("<f2")[:, 0]


def _u16(blocks: np.ndarray, off: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, off:off + 2 * count]).view("<u2")


def _u32(blocks: np.ndarray, off: int, count: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, off:off + 4 * count]).view("<u4")


def _nibbles(b: np.ndarray) -> np.ndarray:
    """Bytes [n, m] -> their nibbles [n, 2m], low nibble first."""
    return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1)


def _bits(b: np.ndarray) -> np.ndarray:
    """Bytes [n, m] -> their bits [n, 8m], bit 0 first."""
    return np.unpackbits(b, axis=-1, bitorder="little")


def _split_halves(qs: np.ndarray, per: int) -> np.ndarray:
    """Codes of blocks of ``2 * per`` elements stored as ``per`` bytes: element j < per the low
    nibble of byte j, element j + per its high nibble (qs [n, groups * per])."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, per) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


# -- codes per type: blocks [n, type size] uint8 -> codes [n, block] uint8 ------------------------
def _iq4_nl(b: np.ndarray) -> np.ndarray:
    return _split_halves(b[:, 2:18], 16)


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    return _split_halves(b[:, 8:136], 16)


def _iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    lo = _nibbles(b[:, 4:8])  # [n, 8]
    hi = (_u16(b, 2, 1)[:, :1] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    return (lo | (hi.astype(np.uint8) << 4)).astype(np.uint8)


def _tq1_0(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    pw = np.array([1, 3, 9, 27, 81], np.uint8)

    def digits(qs: np.ndarray, mult: np.ndarray) -> np.ndarray:
        v = (qs[:, None, :] * mult.reshape(1, -1, 1)).astype(np.uint8)  # uint8 product, mod 256
        return ((v.astype(np.uint16) * 3) >> 8).reshape(n, -1)

    t = np.concatenate([digits(b[:, 0:32], pw), digits(b[:, 32:48], pw), digits(b[:, 48:52], pw[:4])], axis=1)
    return ((t.astype(np.int16) - 1) & 3).astype(np.uint8)  # the digit minus 1, two's complement


def _tq2_0(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    q = b[:, 0:64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    return (q & 3).reshape(n, 256)


def _q1_0(b: np.ndarray) -> np.ndarray:
    return _bits(b[:, 2:18])


def _q2_0(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    return ((b[:, 2:18].reshape(n, 16, 1) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4)) & 3).reshape(n, 64)


def _nvfp4(b: np.ndarray) -> np.ndarray:
    return _split_halves(b[:, 4:36], 8)


class _Grid:
    """A lattice grid's coordinate indices, decoded once."""

    _cache: dict[str, np.ndarray] = {}

    @classmethod
    def get(cls, name: str) -> np.ndarray:
        g = cls._cache.get(name)
        if g is None:
            g = cls._cache[name] = grid_indices(name)
        return g


_KSIGNS = ksigns()


def _lattice(name: str, idx: np.ndarray, signs: np.ndarray | None, levels: int) -> np.ndarray:
    """Codes ``coordinate + levels * sign`` of groups [n, groups] of grid indices (``signs`` the
    element signs [n, elements], 1 = negative; None: no sign)."""
    g = _Grid.get(name)[idx]  # [n, groups, width]
    codes = g.reshape(idx.shape[0], -1)
    if signs is not None:
        codes = codes + np.uint8(levels) * signs
    return codes.astype(np.uint8)


def _ksign_bits(sidx: np.ndarray) -> np.ndarray:
    """7-bit sign indices [n, groups] -> sign bits [n, groups * 8] (ksigns_iq2xs)."""
    return _bits(_KSIGNS[sidx])


def _iq2_xxs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    aux = _u32(b, 2, 16).reshape(n, 8, 2)
    idx = np.ascontiguousarray(aux[:, :, 0]).view(np.uint8).reshape(n, 32)
    sidx = ((aux[:, :, 1:2] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F).reshape(n, 32)
    return _lattice("IQ2_XXS", idx, _ksign_bits(sidx.astype(np.intp)), 3)


def _iq2_xxs_scales(b: np.ndarray) -> np.ndarray:
    return (_u32(b, 2, 16).reshape(-1, 8, 2)[:, :, 1] >> 28).astype(np.uint8)


def _iq2_xs(b: np.ndarray) -> np.ndarray:
    qs = _u16(b, 2, 32)
    return _lattice("IQ2_XS", (qs & 511).astype(np.intp), _ksign_bits((qs >> 9).astype(np.intp)), 3)


def _iq2_xs_scales(b: np.ndarray) -> np.ndarray:
    return _nibbles(b[:, 66:74])


def _iq2_s(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    qh = ((b[:, 66:74].reshape(n, 8, 1) >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(n, 32)
    idx = b[:, 2:34].astype(np.intp) | (qh.astype(np.intp) << 8)
    return _lattice("IQ2_S", idx, _bits(b[:, 34:66]), 3)


def _iq2_s_scales(b: np.ndarray) -> np.ndarray:
    return _nibbles(b[:, 74:82])


def _iq3_xxs(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    aux = _u32(b, 66, 8)
    sidx = ((aux[:, :, None] >> np.array([0, 7, 14, 21], np.uint32)) & 0x7F).reshape(n, 32)
    return _lattice("IQ3_XXS", b[:, 2:66].astype(np.intp), _ksign_bits(sidx.astype(np.intp)), 8)


def _iq3_xxs_scales(b: np.ndarray) -> np.ndarray:
    return (_u32(b, 66, 8) >> 28).astype(np.uint8)


def _iq3_s(b: np.ndarray) -> np.ndarray:
    idx = b[:, 2:66].astype(np.intp) | (_bits(b[:, 66:74]).astype(np.intp) << 8)
    return _lattice("IQ3_S", idx, _bits(b[:, 74:106]), 8)


def _iq3_s_scales(b: np.ndarray) -> np.ndarray:
    return _nibbles(b[:, 106:110])


def _iq1_s(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    qh = _u16(b, 34, 8)
    hi = ((qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 32)
    idx = b[:, 2:34].astype(np.intp) | (hi.astype(np.intp) << 8)
    neg = np.repeat((qh >> 15).astype(np.uint8), 32, axis=1)  # delta sign per 32 elements
    return _lattice("IQ1_S", idx, neg, 3)


def _iq1_s_scales(b: np.ndarray) -> np.ndarray:
    return ((_u16(b, 34, 8) >> 12) & 7).astype(np.uint8)


def _iq1_m(b: np.ndarray) -> np.ndarray:
    nib = _nibbles(b[:, 32:48])  # [n, 32]: one per group of 8
    idx = b[:, 0:32].astype(np.intp) | ((nib & 7).astype(np.intp) << 8)
    neg = np.repeat(nib >> 3, 8, axis=1)  # delta sign per 8 elements
    return _lattice("IQ1_M", idx, neg, 3)


def _iq1_m_scales(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    s = _u16(b, 48, 4)
    return ((s[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & 7).reshape(n, 16).astype(np.uint8)


def _iq1_m_d(b: np.ndarray) -> np.ndarray:
    s = _u16(b, 48, 4) & np.uint16(0xF000)
    bits = (s[:, 0] >> 12) | (s[:, 1] >> 8) | (s[:, 2] >> 4) | s[:, 3]
    return bits.astype("<u2").view("<f2")


def _q8(count: int) -> Callable[[np.ndarray], np.ndarray]:
    """Q8_K: ``count`` int8 codes after 4 bytes of parameters, as their two's complement bytes."""
    return lambda b: np.ascontiguousarray(b[:, 4:4 + count])


# -- tables --------------------------------------------------------------------------------------
def _signed(values: tuple[float, ...]) -> np.ndarray:
    v = np.array(values, F)
    return np.concatenate([v, -v])


def _iq1_values() -> np.ndarray:
    g = np.array(GRIDS["IQ1_S"][2], F)
    return np.concatenate([g + F(0.125), g - F(0.125)]).astype(F)


_HALF_QUARTERS = ((np.arange(16, dtype=F) + F(0.5)) * F(0.25)).astype(F)
_HALF_HALVES = ((np.arange(16, dtype=F) + F(0.5)) * F(0.5)).astype(F)
_ODD16 = (2 * np.arange(16) + 1).astype(F)
_ODD8 = (2 * np.arange(8) + 1).astype(F)


@dataclass(frozen=True)
class Computed:
    """One computed-code ggml type: its block, how to get each element's code, the element, and
    its scale (a plain block scale ``d``, or sub-block codes looked up / decoded and times ``d``)."""

    name: str
    block: int
    size: int
    bits: int
    codes: Callable[[np.ndarray], np.ndarray]
    element: dict[str, Any]  # "table" holds the codebook's values (an array), not yet a name
    d: Callable[[np.ndarray], np.ndarray] | None  # block scale (F16; Q8_K F32), None: no outer scale
    sub: int | None = None  # elements per sub-block of the encoded scale
    sc_bits: int = 0
    sc: Callable[[np.ndarray], np.ndarray] | None = None
    sc_element: dict[str, Any] = field(default_factory=dict)

    def element_text(self) -> str:
        """The element as ``qformat inspect`` shows it."""
        e = self.element
        if e["type"] == "codebook":
            return f"codebook{self.bits} ({len(e['table'])} values, in-file)"
        return f"int{self.bits} {e['signedness']}"


def _cb(bits: int, table: Any) -> dict[str, Any]:
    return {"type": "codebook", "bits": bits, "table": np.asarray(table, F)}


def _int(bits: int, signedness: str) -> dict[str, Any]:
    return {"type": "int", "bits": bits, "signedness": signedness}


def _d(off: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda b: _f16(b, off)


def _types() -> dict[int, Computed]:
    iq2 = _cb(3, _signed((8, 25, 43)))
    return {
        15: Computed("Q8_K", 256, 292, 8, _q8(256), _int(8, "twos_complement"),
                     lambda b: np.ascontiguousarray(b[:, 0:4]).view("<f4")[:, 0]),
        16: Computed("IQ2_XXS", 256, 66, 3, _iq2_xxs, iq2, _d(0), 32, 4, _iq2_xxs_scales, _cb(4, _HALF_QUARTERS)),
        17: Computed("IQ2_XS", 256, 74, 3, _iq2_xs, iq2, _d(0), 16, 4, _iq2_xs_scales, _cb(4, _HALF_QUARTERS)),
        18: Computed("IQ3_XXS", 256, 98, 4, _iq3_xxs, _cb(4, _signed(GRIDS["IQ3_XXS"][2])), _d(0), 32, 4, _iq3_xxs_scales,
                     _cb(4, _HALF_HALVES)),
        19: Computed("IQ1_S", 256, 50, 3, _iq1_s, _cb(3, _iq1_values()), _d(0), 32, 3, _iq1_s_scales, _cb(3, _ODD8)),
        20: Computed("IQ4_NL", 32, 18, 4, _iq4_nl, _cb(4, KVALUES_IQ4NL), _d(0)),
        21: Computed("IQ3_S", 256, 110, 4, _iq3_s, _cb(4, _signed(GRIDS["IQ3_S"][2])), _d(0), 32, 4, _iq3_s_scales, _cb(4, _ODD16)),
        22: Computed("IQ2_S", 256, 82, 3, _iq2_s, iq2, _d(0), 16, 4, _iq2_s_scales, _cb(4, _HALF_QUARTERS)),
        23: Computed("IQ4_XS", 256, 136, 4, _iq4_xs, _cb(4, KVALUES_IQ4NL), _d(0), 32, 6, _iq4_xs_scales, _int(6, "offset_binary")),
        29: Computed("IQ1_M", 256, 56, 3, _iq1_m, _cb(3, _iq1_values()), _iq1_m_d, 16, 3, _iq1_m_scales, _cb(3, _ODD8)),
        34: Computed("TQ1_0", 256, 54, 2, _tq1_0, _int(2, "twos_complement"), _d(52)),
        35: Computed("TQ2_0", 256, 66, 2, _tq2_0, _cb(2, (-1, 0, 1, 2)), _d(64)),
        40: Computed("NVFP4", 64, 36, 4, _nvfp4, _cb(4, KVALUES_FP4_DOUBLED), None, 16, 8,
                     lambda b: np.ascontiguousarray(b[:, 0:4]), _cb(8, ue4m3_half())),
        41: Computed("Q1_0", 128, 18, 1, _q1_0, _cb(1, (-1, 1)), _d(0)),
        42: Computed("Q2_0", 64, 18, 2, _q2_0, _cb(2, (-1, 0, 1, 2)), _d(0)),
    }


TYPES = _types()


# -- descriptors ---------------------------------------------------------------------------------
def _chunked(blocks: Callable[[], np.ndarray], fn: Callable[[np.ndarray], np.ndarray], out_shape: tuple[int, ...],
             per_block: int, dtype: Any) -> Callable[[], np.ndarray]:
    """``fn`` over the blocks in chunks of :data:`CHUNK_BLOCKS`, as an array of ``out_shape``."""
    def produce() -> np.ndarray:
        b = blocks()
        out = np.empty((b.shape[0], per_block), dtype)
        for i in range(0, b.shape[0], CHUNK_BLOCKS):
            out[i:i + CHUNK_BLOCKS] = fn(b[i:i + CHUNK_BLOCKS])
        return out.reshape(out_shape)
    return produce


def _packed_codes(blocks: Callable[[], np.ndarray], fn: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...],
                  per_block: int, bits: int) -> tuple[tuple[int, ...], Callable[[], np.ndarray]]:
    """(shape, producer) of the canonical packing of the codes ``fn`` computes, made in row chunks."""
    lead, K = shape[:-1], shape[-1]
    words = Packing.from_dict(packing(len(shape))).words_per_row(K, bits)
    rows_per = max(1, (CHUNK_BLOCKS * per_block) // K)
    bpr = K // per_block  # blocks per row

    def produce() -> np.ndarray:
        b = blocks()
        rows = b.shape[0] // bpr
        out = np.empty((rows, words), np.uint8)
        for r in range(0, rows, rows_per):
            c = fn(b[r * bpr:(r + rows_per) * bpr]).reshape(-1, K)
            out[r:r + c.shape[0]] = pack_canonical(c, bits)
        return out.reshape(lead + (words,))
    return lead + (words,), produce


def describe(out: Any, t: Any, raw: Callable[[], np.ndarray], grid: Callable[[int, int], dict[str, Any]],
             lazy: Callable[[str, tuple[int, ...], Callable[[], np.ndarray]], Any]) -> None:
    """Add the descriptor and components of tensor ``t`` (a computed-code type) to ``out``
    (:class:`qformat.convert.base.Described`); ``raw()`` gives its block bytes."""
    spec = TYPES[t.ggml_type]
    name, shape, r = t.name, tuple(t.shape), len(t.shape)
    lead, K = shape[:-1], shape[-1]
    nb = K // spec.block

    def blocks() -> np.ndarray:
        return raw().reshape(-1, spec.size)

    def element(e: dict[str, Any], tname: str) -> dict[str, Any]:
        if e["type"] != "codebook":
            return dict(e)
        return {"type": "codebook", "bits": e["bits"], "table_tensor": out.add(tname, e["table"].copy())}

    cshape, cprod = _packed_codes(blocks, spec.codes, shape, spec.block, spec.bits)
    desc: dict[str, Any] = {"shape": list(shape), "dtype": "float32", "scheme": "gguf_" + spec.name.lower()}
    desc["codes"] = codes_entry(out.add(name + ".codes", lazy("U8", cshape, cprod)), element(spec.element, name + ".table"), r)
    dshape = lead + (nb,)
    d_st = "F32" if spec.name == "Q8_K" else "F16"
    d_np = "<f4" if d_st == "F32" else "<f2"
    nonfinite = False
    if spec.d is not None:
        d_fn = spec.d
        d_all = _chunked(blocks, lambda b: d_fn(b).reshape(-1, 1), dshape, 1, d_np)
        nonfinite = not bool(np.isfinite(d_all().astype(F)).all())
    if spec.sub is None:
        assert spec.d is not None
        desc["scale"] = {"blocks": grid(r, spec.block), "op": "multiply", "tensor": out.add(name + ".scale", lazy(d_st, dshape, d_all))}
    else:
        assert spec.sc is not None
        nshape = lead + (K // spec.sub,)
        per = spec.block // spec.sub
        scshape, scprod = _packed_codes(blocks, spec.sc, nshape, per, spec.sc_bits)
        nested: dict[str, Any] = {"shape": list(nshape), "dtype": "float32",
                                  "codes": codes_entry(out.add(name + ".scale.codes", lazy("U8", scshape, scprod)),
                                                       element(spec.sc_element, name + ".scale.table"), r)}
        if spec.d is not None:
            nested["scale"] = {"blocks": grid(r, per), "op": "multiply", "tensor": out.add(name + ".scale.scale", lazy(d_st, dshape, d_all))}
            if nonfinite:
                nested["allow_nonfinite_params"] = True
        desc["scale"] = {"blocks": grid(r, spec.sub), "op": "multiply", "encoded": nested}
    if nonfinite:
        desc["allow_nonfinite_params"] = True
    out.descriptors[name] = desc
