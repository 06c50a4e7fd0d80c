"""Corpus cases that decode: every element encoding, packing variant, block structure, parameter
form, logical dtype and shape class; several tensors; a sharded checkpoint; every encoder scheme.

Expected outputs are decoded by conformance/spec_reference.py.  Case ids are stable: add new
cases, never rename or rebuild existing ones (the files are frozen once written).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import Built, case, features_of, grid, pk, q_file, qtensor, valid, values

DTYPES = ("float32", "float16", "bfloat16")
GRID = lambda *s: {"type": "grid", "size": list(s)}  # noqa: E731
FLAT = lambda n: {"type": "flat", "size": n}  # noqa: E731


def scale_param(rng, shape, blocks, dtype=np.float32, op="multiply"):
    return {"blocks": blocks, "op": op, "values": values(rng, grid(blocks, shape), dtype)}


# -- §6.2 integer elements: every bit width and signedness ---------------------------------------
SIGNS = ("unsigned", "twos_complement", "offset_binary")
for bits in range(1, 9):
    for si, sign in enumerate(SIGNS):
        cid = f"int{bits}-{sign.replace('_', '-')}"

        @case(cid, f"{bits}-bit {sign} integer codes, LSB-first bytes along the last axis, a scale per group of 4",
              ["6.2", "7.2", "7.4", "8.1", "9.1", "10.2"])
        def _(rng, bits=bits, sign=sign, si=si):
            shape = (3, 13)
            dt = DTYPES[(bits + si) % 3]
            d, c = qtensor(rng, "w.", shape, dt, {"type": "int", "bits": bits, "signedness": sign}, pk(8, rank=2),
                           {"scale": scale_param(rng, shape, GRID(1, 4))})
            return valid({"w": d}, c)


@case("int4-code-offset-gptq-v1", "GPTQ v1 zero points: 4-bit unsigned codes read with code_offset 1 (stored z-1)", ["6.2", "9.1"])
def _(rng):
    shape = (4, 16)
    z, zc = qtensor(rng, "w.zero.", (4, 2), "float32", {"type": "int", "bits": 4, "signedness": "unsigned", "code_offset": 1},
                    pk(32, rank=2, axis=0))
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(32, rank=2, axis=1),
                   {"zero": {"blocks": GRID(1, 8), "encoded": (z, zc)}, "scale": scale_param(rng, shape, GRID(1, 8), np.float16)})
    return valid({"w": d}, c)


@case("int8-frac-bits-mxint8", "MXINT8 elements: 8-bit two's complement with 6 fraction bits, E8M0 scale per 32", ["6.2", "6.3", "9.2"])
def _(rng):
    shape = (2, 40)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "int", "bits": 8, "signedness": "twos_complement", "frac_bits": 6},
                   pk(8, rank=2), {"scale": scale_param(rng, shape, GRID(1, 32), ml_dtypes.float8_e8m0fnu)}, code_dtype=np.int8)
    return valid({"w": d}, c)


# -- §6.3 float elements -------------------------------------------------------------------------
for fmt in ("e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn", "e8m0fnu"):
    @case(f"float-{fmt}-all-codes", f"every code of {fmt} (NaN and Inf codes included) times a per-row scale", ["6.3", "10.4"])
    def _(rng, fmt=fmt):
        bits = R.element_bits({"type": "float", "format": fmt})
        n = 1 << bits
        codes = np.arange(n).reshape(4, n // 4)
        shape = codes.shape
        d, c = qtensor(rng, "w.", shape, "float32", {"type": "float", "format": fmt}, pk(8, rank=2), codes=codes,
                       params={"scale": {"blocks": GRID(1, None), "op": "multiply", "values": np.array([[1.0], [0.5], [-2.0], [3.0]], np.float32)}})
        return valid({"w": d}, c)


@case("float-e4m3fn-as-f8-dtype", "FP8 E4M3 codes stored with dtype F8_E4M3 (a plain safetensors reader sees fp8), per-channel fp32 scale", ["6.3", "7.2", "3.6"])
def _(rng):
    shape = (5, 7)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "float", "format": "e4m3fn"}, pk(8, rank=2),
                   {"scale": scale_param(rng, shape, GRID(1, None))}, code_dtype=ml_dtypes.float8_e4m3fn,
                   codes=rng.integers(0, 0x7E, size=shape))
    return valid({"w": d}, c)


# -- §6.4 codebooks --------------------------------------------------------------------------------
@case("codebook-nf4-flat64", "bitsandbytes-style NF4: MSB-first nibbles over the flattened tensor, fp32 absmax per 64 (partial tail)", ["6.4", "7.4", "7.7", "8.3"])
def _(rng):
    shape = (3, 50)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "codebook", "bits": 4, "table": "nf4"}, pk(8, "msb_first", None, rank=2),
                   {"scale": scale_param(rng, shape, FLAT(64))})
    return valid({"w": d}, c)


@case("codebook-bnb-fp4", "bitsandbytes FP4 table (not OCP E2M1), flat blocks of 32", ["6.4", "8.3"])
def _(rng):
    shape = (70,)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "codebook", "bits": 4, "table": "bnb_fp4"}, pk(8, "msb_first", None, rank=1),
                   {"scale": scale_param(rng, shape, FLAT(32))})
    return valid({"w": d}, c)


for bits, n, tdt in ((4, 10, np.float32), (3, 8, np.float16), (8, 256, ml_dtypes.bfloat16), (1, 2, np.float32), (5, 17, np.float16)):
    @case(f"codebook-tensor-b{bits}-n{n}", f"a {n}-entry {np.dtype(tdt).name} table stored in the file, {bits}-bit codes", ["6.4", "7.6", "7.7"])
    def _(rng, bits=bits, n=n, tdt=tdt):
        shape = (3, 11)
        table = rng.normal(size=n).astype(tdt)
        d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "codebook", "bits": bits, "table_tensor": "w.table"}, pk(8, rank=2),
                       {"scale": scale_param(rng, shape, GRID(1, None))}, table=table)
        return valid({"w": d}, c)


# -- §7 packing variants ----------------------------------------------------------------------------
for bits in (3, 5, 6, 7):
    for container in (8, 16, 32):
        for order in ("lsb_first", "msb_first"):
            @case(f"stream-b{bits}-c{container}-{order.replace('_', '-')}",
                  f"{bits}-bit codes straddling {container}-bit containers, {order}", ["7.2", "7.5", "7.6", "7.10"])
            def _(rng, bits=bits, container=container, order=order):
                shape = (3, 19)
                d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": bits, "signedness": "twos_complement"},
                               pk(container, order, rank=2), {"scale": scale_param(rng, shape, GRID(1, 8))})
                return valid({"w": d}, c)


for bits in (1, 2, 4, 8):
    for container in (16, 32):
        for order in ("lsb_first", "msb_first"):
            @case(f"slots-b{bits}-c{container}-{order.replace('_', '-')}",
                  f"{bits}-bit codes in {container}-bit little-endian containers, {order}", ["7.2", "7.7"])
            def _(rng, bits=bits, container=container, order=order):
                shape = (2, 37)
                d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": bits, "signedness": "unsigned"},
                               pk(container, order, rank=2), {"scale": scale_param(rng, shape, GRID(None, None))},
                               code_dtype=[np.uint16, np.int16, np.float16, ml_dtypes.bfloat16][bits % 4] if container == 16 else [np.uint32, np.int32, np.float32][bits % 3])
                return valid({"w": d}, c)


@case("slots-no-straddle-b3-c32-reversed", "HQQ-style: ten 3-bit slots per 32-bit word (straddle false), slot_order reversed, 2 spare high bits", ["7.5", "7.7", "7.10"])
def _(rng):
    shape = (4, 23)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 3, "signedness": "unsigned"},
                   pk(32, rank=2, straddle=False, slot_order=list(range(9, -1, -1))), {"scale": scale_param(rng, shape, GRID(1, None))})
    return valid({"w": d}, c)


@case("slot-order-awq", "AWQ GEMM: 4-bit codes in int32 along N with slot_order [0,2,4,6,1,3,5,7]; logical [K, N] as stored", ["7.7", "9.1"])
def _(rng):
    shape = (16, 24)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 4, "signedness": "unsigned"},
                   pk(32, rank=2, axis=1, slot_order=[0, 2, 4, 6, 1, 3, 5, 7]),
                   {"zero": {"blocks": GRID(8, 1), "values": rng.integers(0, 16, size=(2, 24)).astype(np.uint8)},
                    "scale": scale_param(rng, shape, GRID(8, 1), np.float16)}, code_dtype=np.int32)
    return valid({"w": d}, c)


@case("order-transposed-gptq", "GPTQ-like: logical [N, K]; codes stored as [K/8, N] int32 (order [1,0], packed along storage axis 0); scales stored [K/G, N] (order [1,0])", ["7.3", "7.4", "9.2"])
def _(rng):
    shape = (6, 32)
    blocks = GRID(1, 16)
    sc = values(rng, grid(blocks, shape), np.float16)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "int", "bits": 4, "signedness": "offset_binary"},
                   pk(32, rank=2, axis=0, order=[1, 0]),
                   {"scale": {"blocks": blocks, "op": "multiply", "stored": np.ascontiguousarray(sc.T), "order": [1, 0]}}, code_dtype=np.int32)
    return valid({"w": d}, c)


@case("planes-gguf-split-halves", "GGUF Q4_0 nibble order: planes of span 32 (byte j holds elements j and j+16), partial last segment", ["7.8"])
def _(rng):
    shape = (2, 80)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 4, "signedness": "offset_binary"},
                   pk(8, rank=2, planes={"span": 32}), {"scale": scale_param(rng, shape, GRID(1, 32), np.float16)})
    return valid({"w": d}, c)


@case("planes-quanto-whole-axis-odd", "quanto: planes spanning the whole packed axis 0 of odd length 7 (rows 0-3 low nibble, 4-6 high)", ["7.4", "7.8"])
def _(rng):
    shape = (7, 5)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 4, "signedness": "unsigned"},
                   pk(8, rank=2, axis=0, planes={"span": 7}), {"scale": scale_param(rng, shape, GRID(None, 1)),
                                                               "bias": {"blocks": GRID(None, 1), "op": "subtract", "values": values(rng, (1, 5), np.float32)}})
    return valid({"w": d}, c)


@case("planes-2bit-slot-order", "2-bit codes, four planes of span 12 with a slot permutation, MSB-first", ["7.7", "7.8"])
def _(rng):
    shape = (3, 30)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 2, "signedness": "twos_complement"},
                   pk(8, "msb_first", rank=2, planes={"span": 12}, slot_order=[2, 0, 3, 1]), {"scale": scale_param(rng, shape, GRID(1, 6))})
    return valid({"w": d}, c)


@case("row-alignment", "rows padded to a multiple of 4 containers (row_alignment 4); padding words are zero", ["7.9", "7.10"])
def _(rng):
    shape = (3, 9)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(16, rank=2, row_alignment=4),
                   {"scale": scale_param(rng, shape, GRID(1, None))})
    return valid({"w": d}, c)


@case("axis-middle-rank3", "rank 3, packed along the middle axis, groups along it", ["7.4", "8.1"])
def _(rng):
    shape = (2, 9, 3)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 5, "signedness": "offset_binary"}, pk(8, rank=3, axis=1),
                   {"scale": scale_param(rng, shape, GRID(1, 4, 1))})
    return valid({"w": d}, c)


@case("rank4-order-permuted", "rank 4 with a storage order [2,0,3,1] and flat packing", ["7.3", "7.4"])
def _(rng):
    shape = (2, 3, 4, 5)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "float", "format": "e2m1fn"}, pk(8, rank=4, axis=None, order=[2, 0, 3, 1]),
                   {"scale": scale_param(rng, shape, GRID(1, 3, 2, None))})
    return valid({"w": d}, c)


# -- §8 blocks and §9 parameters --------------------------------------------------------------------
@case("blocks-per-tensor-scalar", "one scale for the whole tensor stored as a 0-d tensor (squeezed [1,1] grid)", ["8.1", "9.2"])
def _(rng):
    shape = (4, 6)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "float", "format": "e5m2"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(None, None), "op": "divide", "stored": np.array(0.75, np.float32)}})
    return valid({"w": d}, c)


@case("blocks-per-channel-axis0-squeezed", "per-row scale [N] for grid [N, 1] (size-1 axes dropped), per-column bias [1, K]", ["8.1", "9.2"])
def _(rng):
    shape = (5, 8)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 8, "signedness": "twos_complement"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, None), "op": "multiply", "stored": values(rng, (5,), np.float32)},
                    "bias": {"blocks": GRID(None, 1), "op": "add", "values": values(rng, (1, 8), ml_dtypes.bfloat16)}}, code_dtype=np.int8)
    return valid({"w": d}, c)


@case("blocks-2d-partial-edges", "2-D blocks of 4x8 over [10, 20] with partial blocks on both edges (like 128x128 fp8 blocks)", ["8.1"])
def _(rng):
    shape = (10, 20)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "float", "format": "e4m3fn"}, pk(8, rank=2),
                   {"scale": scale_param(rng, shape, GRID(4, 8))}, codes=rng.integers(0, 0x7E, size=shape))
    return valid({"w": d}, c)


@case("blocks-groups-axis0", "groups of 3 along axis 0 with a partial last group; unsigned codes with a U8 zero point", ["8.1", "9.1"])
def _(rng):
    shape = (8, 5)
    blocks = GRID(3, 1)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(8, rank=2, axis=0),
                   {"zero": {"blocks": blocks, "values": rng.integers(0, 16, size=grid(blocks, shape)).astype(np.uint8)},
                    "scale": scale_param(rng, shape, blocks, np.float16)})
    return valid({"w": d}, c)


@case("blocks-group-index-shared", "GPTQ act-order: a group index over axis 1 shared by zero and scale", ["8.2", "4.1"])
def _(rng):
    shape = (4, 24)
    gidx = (np.arange(24) * 7 % 3).astype(np.int32)
    idx = {"axis": 1, "tensor": "w.g_idx", "count": 3}
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(32, rank=2),
                   {"zero": {"blocks": GRID(1, None), "values": rng.integers(0, 16, size=(4, 3)).astype(np.int32), "index": (idx, gidx)},
                    "scale": {"blocks": GRID(1, None), "op": "multiply", "values": values(rng, (4, 3), np.float16), "index": (idx, gidx)}})
    return valid({"w": d}, c)


@case("blocks-flat-partial-tail", "flat blocks of 7 over a [5, 3] tensor (partial tail block)", ["8.3"])
def _(rng):
    shape = (5, 3)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "float", "format": "e3m2fn"}, pk(8, rank=2),
                   {"scale": scale_param(rng, shape, FLAT(7))})
    return valid({"w": d}, c)


@case("params-all-ops-dtypes", "zero (I8), scale with op divide (F8_E4M3), bias with op add (F16): the order zero, scale, bias", ["9.1", "9.2", "10.2"])
def _(rng):
    shape = (3, 16)
    b = GRID(1, 8)
    g = grid(b, shape)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "int", "bits": 6, "signedness": "unsigned"}, pk(8, rank=2),
                   {"zero": {"blocks": b, "values": rng.integers(-8, 40, size=g).astype(np.int8)},
                    "scale": {"blocks": b, "op": "divide", "values": values(rng, g, ml_dtypes.float8_e4m3fn)},
                    "bias": {"blocks": b, "op": "add", "values": values(rng, g, np.float16)}})
    return valid({"w": d}, c)


@case("params-int-scale-i32-u16", "integer parameter dtypes: I32 scale and U16 bias", ["9.2"])
def _(rng):
    shape = (2, 12)
    b = GRID(1, 4)
    g = grid(b, shape)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "int", "bits": 3, "signedness": "twos_complement"}, pk(8, rank=2),
                   {"scale": {"blocks": b, "op": "multiply", "values": rng.integers(1, 1000, size=g).astype(np.int32)},
                    "bias": {"blocks": b, "op": "subtract", "values": rng.integers(0, 60000, size=g).astype(np.uint16)}})
    return valid({"w": d}, c)


# -- §9.3 encoded parameters ---------------------------------------------------------------------------
@case("encoded-nvfp4", "NVFP4: E2M1 codes; scale = E4M3 per 16 (encoded) times an fp32 per-tensor scale", ["9.3", "9.4"])
def _(rng):
    shape = (4, 48)
    sg = (4, 3)
    s, sc = qtensor(rng, "w.scale.", sg, "float32", {"type": "float", "format": "e4m3fn"}, pk(8, rank=2),
                    {"scale": {"blocks": GRID(None, None), "op": "multiply", "stored": np.array(0.0123, np.float32)}},
                    codes=rng.integers(0x20, 0x60, size=sg), code_dtype=ml_dtypes.float8_e4m3fn)
    d, c = qtensor(rng, "w.", shape, "bfloat16", {"type": "float", "format": "e2m1fn"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 16), "op": "multiply", "encoded": (s, sc)}})
    return valid({"w": d}, c)


@case("encoded-nvfp4-global-divisor", "compressed-tensors NVFP4: the per-tensor global scale divides the E4M3 block scale", ["9.3", "9.4"])
def _(rng):
    shape = (2, 32)
    sg = (2, 2)
    s, sc = qtensor(rng, "w.scale.", sg, "float32", {"type": "float", "format": "e4m3fn"}, pk(8, rank=2),
                    {"scale": {"blocks": GRID(None, None), "op": "divide", "stored": np.array(81.3, np.float32)}},
                    codes=rng.integers(0x20, 0x60, size=sg), code_dtype=ml_dtypes.float8_e4m3fn)
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "float", "format": "e2m1fn"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 16), "op": "multiply", "encoded": (s, sc)}})
    return valid({"w": d}, c)


@case("encoded-bnb-double-quant", "bitsandbytes double quantization: absmax = table[u8] * nested scale per 256 + offset", ["9.3", "9.4", "6.4"])
def _(rng):
    shape = (600,)
    nb = 10  # ceil(600 / 64)
    table = np.sort(rng.uniform(-1, 1, 256)).astype(np.float32)
    a, ac = qtensor(rng, "w.absmax.", (nb,), "float32", {"type": "codebook", "bits": 8, "table_tensor": "w.absmax.table"},
                    pk(8, rank=1), {"scale": {"blocks": FLAT(256), "op": "multiply", "values": values(rng, (1,), np.float32)},
                                    "bias": {"blocks": GRID(None), "op": "add", "stored": np.array(0.4, np.float32)}}, table=table)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "codebook", "bits": 4, "table": "nf4"}, pk(8, "msb_first", None, rank=1),
                   {"scale": {"blocks": FLAT(64), "op": "multiply", "encoded": (a, ac)}})
    return valid({"w": d}, c)


@case("encoded-kquant-superblock", "GGUF K-quant style: scale = 6-bit codes x fp16 d per 256, bias subtracted = 6-bit mins x fp16 dmin", ["9.3", "9.4"])
def _(rng):
    shape = (2, 512)
    sg = (2, 16)
    s, sc = qtensor(rng, "w.scale.", sg, "float32", {"type": "int", "bits": 6, "signedness": "unsigned"}, pk(8, rank=2),
                    {"scale": {"blocks": GRID(1, 8), "op": "multiply", "values": values(rng, (2, 2), np.float16)}})
    m, mc = qtensor(rng, "w.bias.", sg, "float32", {"type": "int", "bits": 6, "signedness": "unsigned"}, pk(8, rank=2),
                    {"scale": {"blocks": GRID(1, 8), "op": "multiply", "values": values(rng, (2, 2), np.float16)}})
    d, c = qtensor(rng, "w.", shape, "float16", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(8, rank=2, planes={"span": 64}),
                   {"scale": {"blocks": GRID(1, 32), "op": "multiply", "encoded": (s, sc)},
                    "bias": {"blocks": GRID(1, 32), "op": "subtract", "encoded": (m, mc)}})
    return valid({"w": d}, c)


@case("encoded-depth3-bf16-chain", "three nested levels, each rounded to its own dtype (bfloat16, float16) before use", ["9.3", "10.3"])
def _(rng):
    s3, c3 = qtensor(rng, "w.s.s.s.", (1, 1), "float32", {"type": "float", "format": "e8m0fnu"}, pk(8, rank=2),
                     codes=np.array([[125]]))
    s2, c2 = qtensor(rng, "w.s.s.", (2, 1), "float16", {"type": "int", "bits": 8, "signedness": "twos_complement"}, pk(8, rank=2),
                     {"scale": {"blocks": GRID(None, None), "op": "multiply", "encoded": (s3, c3)}})
    s1, c1 = qtensor(rng, "w.s.", (2, 3), "bfloat16", {"type": "int", "bits": 7, "signedness": "offset_binary"}, pk(8, rank=2),
                     {"scale": {"blocks": GRID(1, None), "op": "divide", "encoded": (s2, c2)}})
    d, c = qtensor(rng, "w.", (2, 12), "float32", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 4), "op": "multiply", "encoded": (s1, c1)}})
    return valid({"w": d}, c)


# -- §5 shapes and dtypes, §10 special values --------------------------------------------------------
@case("shape-rank0", "a rank-0 tensor (flat packing, one code) with a scalar scale", ["5.2", "7.4"])
def _(rng):
    d, c = qtensor(rng, "w.", (), "bfloat16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, axis=None, rank=0),
                   {"scale": {"blocks": GRID(), "op": "multiply", "stored": np.array(1.5, np.float32)}})
    return valid({"w": d}, c)


@case("shape-one-element", "a [1, 1] tensor", ["5.2"])
def _(rng):
    d, c = qtensor(rng, "w.", (1, 1), "float16", {"type": "float", "format": "e2m3fn"}, pk(8, rank=2),
                   {"scale": scale_param(rng, (1, 1), GRID(1, 32))})
    return valid({"w": d}, c)


@case("shape-zero-size", "zero-size tensors [0, 8] and [3, 0] (no codes; empty components)", ["5.2", "7.4"])
def _(rng):
    d1, c1 = qtensor(rng, "a.", (0, 8), "float32", {"type": "int", "bits": 4, "signedness": "unsigned"}, pk(8, rank=2),
                     {"scale": scale_param(rng, (0, 8), GRID(1, 4))})
    d2, c2 = qtensor(rng, "b.", (3, 0), "bfloat16", {"type": "int", "bits": 3, "signedness": "unsigned"}, pk(8, rank=2),
                     {"scale": scale_param(rng, (3, 0), GRID(1, 4))})
    return valid({"a": d1, "b": d2}, {**c1, **c2})


@case("shape-rank1", "a rank-1 tensor of odd length, groups of 16", ["5.2"])
def _(rng):
    d, c = qtensor(rng, "w.", (45,), "float16", {"type": "int", "bits": 2, "signedness": "offset_binary"}, pk(8, rank=1),
                   {"scale": scale_param(rng, (45,), GRID(16))})
    return valid({"w": d}, c)


@case("cast-overflow-to-inf", "binary32 results beyond the float16 range become +-Inf on the final cast; bfloat16 keeps them", ["10.3"])
def _(rng):
    shape = (2, 8)
    codes = np.array([[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]])
    d1, c1 = qtensor(rng, "h.", shape, "float16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2), codes=codes,
                     params={"scale": {"blocks": GRID(None, None), "op": "multiply", "stored": np.array(20000.0, np.float32)}})
    d2, c2 = qtensor(rng, "b.", shape, "bfloat16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2), codes=codes,
                     params={"scale": {"blocks": GRID(None, None), "op": "multiply", "stored": np.array(3.1e37, np.float32)}})
    return valid({"h": d1, "b": d2}, {**c1, **c2})


@case("rounding-ties-subnormals", "values on bfloat16/float16 rounding ties and in the subnormal range: round to nearest even, no flush to zero", ["10.2", "10.3"])
def _(rng):
    shape = (4, 8)
    codes = rng.integers(0, 256, size=shape)
    scales = np.array([[1 + 2**-8], [1 + 3 * 2**-8], [2.0**-140], [2.0**-20]], np.float32)
    d1, c1 = qtensor(rng, "b.", shape, "bfloat16", {"type": "int", "bits": 8, "signedness": "unsigned"}, pk(8, rank=2), codes=codes,
                     params={"scale": {"blocks": GRID(1, None), "op": "multiply", "values": scales}})
    d2, c2 = qtensor(rng, "h.", shape, "float16", {"type": "int", "bits": 8, "signedness": "unsigned"}, pk(8, rank=2), codes=codes,
                     params={"scale": {"blocks": GRID(1, None), "op": "multiply", "values": scales}})
    return valid({"b": d1, "h": d2}, {**c1, **c2})


@case("nonfinite-allowed-e8m0-nan-block", "allow_nonfinite_params: an E8M0 0xFF scale marks a NaN block; readers decode NaN there", ["6.3", "10.4", "12.4"])
def _(rng):
    shape = (2, 64)
    sc = np.array([[127, 0xFF], [130, 120]], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    d, c = qtensor(rng, "w.", shape, "float32", {"type": "float", "format": "e2m1fn"}, pk(8, rank=2),
                   {"scale": {"blocks": GRID(1, 32), "op": "multiply", "values": sc}})
    d["allow_nonfinite_params"] = True
    return valid({"w": d}, c)


# -- files with several tensors, plain tensors, sharding ---------------------------------------------
@case("multi-tensor-with-plain", "three quantized tensors of different schemes and four plain tensors (F32, BF16, I64, BOOL) in one file", ["4.1", "2.5", "3.6"])
def _(rng):
    d1, c1 = qtensor(rng, "a.", (4, 32), "bfloat16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2),
                     {"scale": scale_param(rng, (4, 32), GRID(1, 32), np.float16)})
    d2, c2 = qtensor(rng, "b.", (64,), "float32", {"type": "codebook", "bits": 4, "table": "nf4"}, pk(8, "msb_first", 0, rank=1),
                     {"scale": scale_param(rng, (64,), FLAT(64))})
    d3, c3 = qtensor(rng, "c.", (3, 5), "float16", {"type": "float", "format": "e5m2"}, pk(8, rank=2), codes=rng.integers(0, 0x7B, size=(3, 5)))
    plain = {"ln.weight": rng.normal(size=7).astype(np.float32), "emb": rng.normal(size=(2, 3)).astype(ml_dtypes.bfloat16),
             "pos": np.arange(5, dtype=np.int64), "mask": np.array([True, False, True])}
    return valid({"a": d1, "b": d2, "c": d3}, {**c1, **c2, **c3}, plain)


@case("in-place-name", "in-place description: the logical tensor has the name of its own codes component (bitsandbytes' 'weight')", ["4.3"])
def _(rng):
    shape = (4, 16)
    d, c = qtensor(rng, "weight.", shape, "float16", {"type": "codebook", "bits": 4, "table": "nf4"}, pk(8, "msb_first", None, rank=2),
                   {"scale": {"blocks": FLAT(64), "op": "multiply", "values": values(rng, (1,), np.float32), "name": "weight.absmax"}})
    c["weight"] = c.pop("weight.codes")
    d["codes"]["tensor"] = "weight"
    return valid({"weight": d}, c)


@case("sharded-two-shards", "a sharded checkpoint: an index and two self-contained shards, quantized and plain tensors in each", ["14"])
def _(rng):
    d1, c1 = qtensor(rng, "l0.w.", (4, 16), "bfloat16", {"type": "int", "bits": 4, "signedness": "twos_complement"}, pk(8, rank=2),
                     {"scale": scale_param(rng, (4, 16), GRID(1, 8))})
    d2, c2 = qtensor(rng, "l1.w.", (3, 8), "float16", {"type": "float", "format": "e4m3fn"}, pk(8, rank=2), codes=rng.integers(0, 0x7E, size=(3, 8)))
    p1 = {"l0.b": rng.normal(size=4).astype(np.float32)}
    p2 = {"l1.b": rng.normal(size=3).astype(np.float32)}
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    wm = {**{n: s1 for n in [*c1, *p1, "l0.w"]}, **{n: s2 for n in [*c2, *p2, "l1.w"]}}
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": dict(sorted(wm.items()))}, indent=1).encode()
    expected = {"l0.w": R.decode(d1, c1), "l1.w": R.decode(d2, c2), **p1, **p2}
    feats = sorted(features_of(d1) | features_of(d2) | {"sharded"})
    return Built({"model.safetensors.index.json": index, s1: q_file({"l0.w": d1}, c1, p1), s2: q_file({"l1.w": d2}, c2, p2)},
                 "model.safetensors.index.json", "valid", None, expected, [], feats)


@case("plain-only-file", "a plain safetensors file with no qformat metadata: every tensor is read as stored", ["3.6", "4.1"])
def _(rng):
    plain = {"x": rng.normal(size=(3, 4)).astype(np.float32), "y": rng.normal(size=5).astype(np.float16), "z": np.arange(4, dtype=np.int32)}
    from .build import st_file

    return Built({"input.safetensors": st_file(plain, {"format": "pt"})}, "input.safetensors", "valid", None, plain, [], ["plain-only"])


# -- the reference encoder's output: one case per scheme ------------------------------------------------
def _scheme_cases() -> None:
    from qformat import tables

    settings = {
        "int": [{"bits": 4, "group_size": 32}, {"bits": 3, "group_size": 16, "symmetric": False}, {"bits": 8, "group_size": None}],
        "nf4": [{"block_size": 64}, {"block_size": 64, "double_quant": True}],
        "fp8_e4m3": [{"granularity": "channel"}, {"granularity": "block", "block_size": [8, 16]}],
        "fp8_e5m2": [{"granularity": "tensor"}],
        "codebook": [{"values": [-1.0, -0.4, -0.1, 0.0, 0.2, 0.5, 1.0], "block_size": 32}],
    }
    for scheme in tables.schemes():
        if scheme == "gguf":  # rows of whole 32/256 blocks only; not in corpus v1 yet (its 6 x 80 case shape)
            continue
        for k, params in enumerate(settings.get(scheme, [{}])):
            @case(f"scheme-{scheme.replace('_', '-')}-{k}", f"the reference encoder's {scheme} output with {json.dumps(params, sort_keys=True)}",
                  ["A", "9", "10"], [f"scheme:{scheme}"])
            def _(rng, scheme=scheme, params=params):
                import qformat

                x = (rng.standard_normal((6, 80)) * rng.uniform(0.01, 2, size=(6, 1))).astype(np.float32)
                q = qformat.quantize(x, scheme, **params)
                desc = json.loads(json.dumps(q.descriptor))
                comps = q.components
                ren = {k: f"w.{k}" for k in comps}
                from qformat.qtensor import rename_references

                desc = rename_references(desc, lambda n: ren[n])
                return valid({"w": desc}, {ren[k]: v for k, v in comps.items()})


_scheme_cases()
