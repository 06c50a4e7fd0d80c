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
