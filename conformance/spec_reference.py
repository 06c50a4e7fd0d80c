"""A slow, literal transcription of SPEC.md used to produce the corpus's expected outputs.

It shares no code with the qformat package's packing or decoder: codes are located bit by bit
from the formulas of SPEC.md §7, element values come from §6 (float formats read through
ml_dtypes, an independent implementation of the same bit layouts; named codebooks from the
hex tables of qformat/tables/codebooks.json, the data SPEC.md itself is generated from), and
the arithmetic of §10 runs one binary32 NumPy scalar operation at a time.  It is meant for
tensors of at most a few thousand elements.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import ml_dtypes
import numpy as np

_TABLES = os.path.join(os.path.dirname(__file__), "..", "qformat", "tables")
_FLOAT_DTYPES = {
    "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e2m3fn": ml_dtypes.float6_e2m3fn,
    "e3m2fn": ml_dtypes.float6_e3m2fn, "e2m1fn": ml_dtypes.float4_e2m1fn, "e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
_FLOAT_BITS = {"e4m3fn": 8, "e5m2": 8, "e2m3fn": 6, "e3m2fn": 6, "e2m1fn": 4, "e8m0fnu": 8}
LOGICAL = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def named_codebook(name: str) -> np.ndarray:
    with open(os.path.join(_TABLES, "codebooks.json"), encoding="utf-8") as f:
        hexes = json.load(f)[name]["values_f32"]
    return np.array([int(h, 16) for h in hexes], np.uint32).view(np.float32)


# -- §6 element values -----------------------------------------------------------------------
def element_bits(el: Mapping[str, Any]) -> int:
    return _FLOAT_BITS[el["format"]] if el["type"] == "float" else int(el["bits"])


def element_value(el: Mapping[str, Any], u: int, comps: Mapping[str, np.ndarray]) -> np.float32:
    """e(u) of SPEC.md §6 as a binary32 scalar; raises LookupError for a code past a codebook."""
    if el["type"] == "int":
        b = el["bits"]
        v = (u + el.get("code_offset", 0)) % (1 << b)
        if el["signedness"] == "twos_complement" and v >= 1 << (b - 1):
            v -= 1 << b
        elif el["signedness"] == "offset_binary":
            v -= 1 << (b - 1)
        return np.float32(math.ldexp(v, -el.get("frac_bits", 0)))
    if el["type"] == "float":
        return np.array([u], np.uint8).view(_FLOAT_DTYPES[el["format"]]).astype(np.float32)[0]
    table = named_codebook(el["table"]) if "table" in el else np.asarray(comps[el["table_tensor"]]).astype(np.float32)
    if u >= len(table):
        raise LookupError(f"code {u} past a {len(table)}-entry codebook")
    return np.float32(table[u])


# -- §7 packing --------------------------------------------------------------------------------
def _slots_mode(bits: int, pk: Mapping[str, Any]) -> bool:
    return pk["container"] % bits == 0 or not pk.get("straddle", True)


def words_per_row(length: int, bits: int, pk: Mapping[str, Any]) -> int:
    c = pk["container"]
    if _slots_mode(bits, pk):
        n = c // bits
        if "planes" not in pk:
            w = -(-length // n)
        else:
            t = pk["planes"]["span"]
            w = sum(-(-min(t, length - g) // n) for g in range(0, length, t))
    else:
        w = -(-(length * bits) // c)
    a = pk.get("row_alignment", 1)
    return -(-w // a) * a


def _positions(length: int, bits: int, pk: Mapping[str, Any]) -> list[list[tuple[int, int]]]:
    """For each code i of a row: the list of (word index, bit index) of its bits, weight 2^0 first."""
    c, order = pk["container"], pk["bit_order"]
    out: list[list[tuple[int, int]]] = [[] for _ in range(length)]
    if not _slots_mode(bits, pk):
        for i in range(length):
            for j in range(bits):  # stream bit i*b + j
                k = i * bits + (j if order == "lsb_first" else bits - 1 - j)
                w, r = divmod(k, c)
                out[i].append((w, r if order == "lsb_first" else c - 1 - r))
        return out
    n = c // bits
    pi = pk.get("slot_order", list(range(n)))

    def slot_bits(w: int, s: int) -> list[tuple[int, int]]:
        lo = s * bits if order == "lsb_first" else c - (s + 1) * bits
        return [(w, lo + j) for j in range(bits)]

    if "planes" not in pk:
        for w in range(-(-length // n)):
            for s in range(n):
                e = w * n + pi[s]
                if e < length:
                    out[e] = slot_bits(w, s)
        return out
    t = pk["planes"]["span"]
    base = 0
    for g in range(0, length, t):
        tg = min(t, length - g)
        mg = -(-tg // n)
        for w in range(mg):
            for s in range(n):
                off = pi[s] * mg + w
                if off < tg:
                    out[g + off] = slot_bits(base + w, s)
        base += mg
    return out


def pack_row(codes: list[int], bits: int, pk: Mapping[str, Any]) -> list[int]:
    words = [0] * words_per_row(len(codes), bits, pk)
    for u, bits_at in zip(codes, _positions(len(codes), bits, pk)):
        for j, (w, b) in enumerate(bits_at):
            words[w] |= ((u >> j) & 1) << b
    return words


def unpack_row(words: list[int], bits: int, pk: Mapping[str, Any], length: int) -> list[int]:
    return [sum(((words[w] >> b) & 1) << j for j, (w, b) in enumerate(bits_at)) for bits_at in _positions(length, bits, pk)]


_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def pack(codes: np.ndarray, bits: int, pk: Mapping[str, Any]) -> np.ndarray:
    """Canonical codes (logical axis order) -> the codes component (unsigned words), per §7."""
    order = pk.get("order") or list(range(codes.ndim))
    s = np.asarray(codes).transpose(order)
    wt = _UINT[pk["container"]]
    if pk["axis"] is None:
        return np.array(pack_row([int(x) for x in s.reshape(-1)], bits, pk), wt)
    moved = np.moveaxis(s, pk["axis"], -1)
    lead = moved.shape[:-1]
    wpr = words_per_row(moved.shape[-1], bits, pk)
    out = np.zeros(lead + (wpr,), wt)
    for li in np.ndindex(*lead):
        out[li] = pack_row([int(x) for x in moved[li]], bits, pk)
    return np.moveaxis(out, -1, pk["axis"])


def unpack(desc: Mapping[str, Any], comps: Mapping[str, np.ndarray]) -> np.ndarray:
    """The canonical codes of a descriptor, read from its codes component per §7."""
    codes = desc["codes"]
    pk, bits = codes["packing"], element_bits(codes["element"])
    shape = tuple(desc["shape"])
    order = pk.get("order") or list(range(len(shape)))
    sshape = tuple(shape[a] for a in order)
    if math.prod(shape) == 0:
        return np.zeros(shape, np.int64)
    raw = np.ascontiguousarray(comps[codes["tensor"]])
    words = raw.view(_UINT[pk["container"]])
    if pk["axis"] is None:
        flat = unpack_row([int(x) for x in words.reshape(-1)], bits, pk, math.prod(shape))
        s = np.array(flat, np.int64).reshape(sshape)
    else:
        ax = pk["axis"]
        moved = np.moveaxis(words, ax, -1)
        rows = moved.reshape(-1, moved.shape[-1])
        length = sshape[ax]
        lead = tuple(np.delete(np.array(sshape, dtype=np.int64), ax)) if sshape else ()
        vals = [unpack_row([int(x) for x in r], bits, pk, length) for r in rows]
        s = np.moveaxis(np.array(vals, np.int64).reshape(lead + (length,)), -1, ax)
    return s.transpose(np.argsort(order)) if order else s


# -- §8 blocks, §9 parameters, §10 arithmetic -------------------------------------------------
def grid_shape(blocks: Mapping[str, Any], shape: tuple[int, ...]) -> tuple[int, ...]:
    if blocks["type"] == "flat":
        return (-(-math.prod(shape) // blocks["size"]),)
    idx = blocks.get("index")
    return tuple(idx["count"] if idx and idx["axis"] == a else (1 if s is None else -(-n // s))
                 for a, (n, s) in enumerate(zip(shape, blocks["size"])))


def param_grid(prm: Mapping[str, Any], shape: tuple[int, ...], comps: Mapping[str, np.ndarray]) -> np.ndarray:
    grid = grid_shape(prm["blocks"], shape)
    if "encoded" in prm:
        return decode(prm["encoded"], comps).astype(np.float32)
    order = prm.get("order")
    stored = [grid[a] for a in order] if order else list(grid)
    v = np.asarray(comps[prm["tensor"]]).reshape(stored)
    return (v.transpose(np.argsort(order)) if order else v).astype(np.float32)


def cell(blocks: Mapping[str, Any], idx: tuple[int, ...], flat: int, comps: Mapping[str, np.ndarray]) -> tuple[int, ...]:
    if blocks["type"] == "flat":
        return (flat // blocks["size"],)
    gi = blocks.get("index")
    out = []
    for a, i in enumerate(idx):
        if gi and gi["axis"] == a:
            g = int(np.asarray(comps[gi["tensor"]])[i])
            if not 0 <= g < gi["count"]:
                raise LookupError(f"group index {g} out of range")
            out.append(g)
        else:
            s = blocks["size"][a]
            out.append(0 if s is None else i // s)
    return tuple(out)


def decode(desc: Mapping[str, Any], comps: Mapping[str, np.ndarray]) -> np.ndarray:
    """Decode per SPEC.md §10, one element and one binary32 operation at a time."""
    if desc.get("layout", {"name": "canonical"})["name"] != "canonical":
        desc, comps = to_canonical(desc, comps)  # §11: a device layout is read as its canonical component
    shape = tuple(desc["shape"])
    codes = unpack(desc, comps)
    el = desc["codes"]["element"]
    grids = {r: param_grid(desc[r], shape, comps) for r in ("zero", "scale", "bias") if r in desc}
    out = np.empty(shape, np.float32)
    with np.errstate(all="ignore"):
        for flat in range(math.prod(shape)):
            idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
            x = element_value(el, int(codes[idx]), comps)
            for role, g in grids.items():
                v = np.float32(g[cell(desc[role]["blocks"], idx, flat, comps)])
                op = desc[role].get("op")
                if role == "zero" or op == "subtract":
                    x = np.float32(x - v)
                elif op == "multiply":
                    x = np.float32(x * v)
                elif op == "divide":
                    x = np.float32(x / v)
                else:
                    x = np.float32(x + v)
            out[idx] = x
        return out.astype(LOGICAL[desc["dtype"]])


# -- §11 device layouts (version 1.1), literally as SPEC.md §11.3 / §11.4 state them ---------------
def _field(word: int, j: int, b: int) -> int:
    return (int(word) >> (b * j)) & ((1 << b) - 1)


def tinygemm_nk(nt: int, ko: int, t: int, w: int, j: int, T: int) -> tuple[int, int]:
    """§11.3: the logical (n, k) held by field j of D[nt, ko, t, w]."""
    i, h = j % 4, j // 4
    n = 8 * nt + t // 4
    k = 16 * (ko * T + 2 * w) + 2 * (t % 4) + 8 * (i % 2) + 16 * (i // 2) + h
    return n, k


def marlin_perm(b: int) -> list[int]:
    """§11.4: PERM_b."""
    perm: list[int] = []
    for i in range(32):
        col = i // 4
        p1 = []
        for blk in (0, 1):
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1):
                p1.append(16 * row + col + 8 * blk)
        for j in range(4):
            perm += [x + 256 * j for x in p1]
    il = [0, 2, 4, 6, 1, 3, 5, 7] if b == 4 else [0, 2, 1, 3]
    return [perm[len(il) * (m // len(il)) + il[m % len(il)]] for m in range(1024)]


def marlin_scale_perm(grouped: bool) -> list[int]:
    """§11.4: SP (runs of 64) or SP1 (runs of 32)."""
    if grouped:
        return [8 * (m % 8) + m // 8 for m in range(64)]
    return [2 * (m // 8) + [0, 1, 8, 9, 16, 17, 24, 25][m % 8] for m in range(32)]


def _marlin_grouped(desc: Mapping[str, Any]) -> bool:
    g = desc["scale"]["blocks"]["size"][1]
    return g is not None and g < desc["shape"][1]


def device_codes(name: str, params: Mapping[str, Any], q: np.ndarray, b: int) -> np.ndarray:
    """Logical codes [N, K] -> the device tensor D (uint32), field by field (§11.3, §11.4)."""
    n, k = q.shape
    if name == "tinygemm_int4_cuda":
        T = params["inner_k_tiles"]
        d = np.zeros((n // 8, k // (16 * T), 32, T // 2), np.uint32)
        for idx in np.ndindex(*d.shape):
            word = 0
            for j in range(8):
                nn, kk = tinygemm_nk(*idx, j, T)
                word |= int(q[nn, kk]) << (4 * j)
            d[idx] = word
        return d
    P = 32 // b
    perm = marlin_perm(b)
    A = np.zeros((k // 16, 16 * n), np.int64)
    for kt in range(k // 16):
        for nt in range(n // 16):
            for r in range(16):
                for c in range(16):
                    A[kt, nt * 256 + r * 16 + c] = q[16 * nt + c, 16 * kt + r]
    R = np.zeros_like(A)
    for kt in range(k // 16):
        for u in range(16 * n // 1024):
            for m in range(1024):
                R[kt, 1024 * u + m] = A[kt, 1024 * u + perm[m]]
    d = np.zeros((k // 16, 16 * n // P), np.uint32)
    for kt in range(k // 16):
        for x in range(16 * n // P):
            d[kt, x] = sum(int(R[kt, P * x + i]) << (b * i) for i in range(P))
    return d


def device_scales(values: np.ndarray, grouped: bool) -> np.ndarray:
    """§11.4: natural-order scale values -> the stored (permuted) ones, same shape."""
    sp = marlin_scale_perm(grouped)
    v = np.asarray(values).reshape(-1)
    out = np.empty_like(v)
    for u in range(v.size // len(sp)):
        for m in range(len(sp)):
            out[len(sp) * u + m] = v[len(sp) * u + sp[m]]
    return out.reshape(np.shape(values))


def to_canonical(desc: Mapping[str, Any], comps: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """§11.1: a descriptor in a device layout -> (canonical descriptor, components with Wc and the
    natural-order scale), by reading every field of D (§11.3, §11.4)."""
    lay = desc.get("layout", {"name": "canonical"})
    if lay["name"] == "canonical":
        return dict(desc), dict(comps)
    name, params = lay["name"], lay.get("parameters", {})
    n, k = desc["shape"]
    b = element_bits(desc["codes"]["element"])
    D = np.ascontiguousarray(comps[desc["codes"]["tensor"]]).view(np.uint32)
    q = np.full((n, k), -1, np.int64)
    if name == "tinygemm_int4_cuda":
        T = params["inner_k_tiles"]
        for idx in np.ndindex(*D.shape):
            for j in range(8):
                nn, kk = tinygemm_nk(*idx, j, T)
                q[nn, kk] = _field(D[idx], j, 4)
    elif name == "marlin_dense":
        P = 32 // b
        perm = marlin_perm(b)
        R = np.zeros((k // 16, 16 * n), np.int64)
        for kt, x in np.ndindex(*D.shape):
            for i in range(P):
                R[kt, P * x + i] = _field(D[kt, x], i, b)
        A = np.zeros_like(R)
        for kt in range(k // 16):
            for u in range(16 * n // 1024):
                for m in range(1024):
                    A[kt, 1024 * u + perm[m]] = R[kt, 1024 * u + m]
        for kt in range(k // 16):
            for nt in range(n // 16):
                for r in range(16):
                    for c in range(16):
                        q[16 * nt + c, 16 * kt + r] = A[kt, nt * 256 + r * 16 + c]
    else:
        raise LookupError(f"layout {name!r}")
    assert (q >= 0).all()
    out = dict(comps)
    out[desc["codes"]["tensor"]] = pack(q, b, desc["codes"]["packing"])
    if name == "marlin_dense":
        stored = np.asarray(comps[desc["scale"]["tensor"]])
        sp = marlin_scale_perm(_marlin_grouped(desc))
        flat = stored.reshape(-1)
        v = np.empty_like(flat)
        for u in range(flat.size // len(sp)):
            for m in range(len(sp)):
                v[len(sp) * u + sp[m]] = flat[len(sp) * u + m]
        out[desc["scale"]["tensor"]] = v.reshape(stored.shape)
    d = dict(desc)
    d.pop("layout", None)
    return d, out
