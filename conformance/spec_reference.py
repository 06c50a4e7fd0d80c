"""A slow, literal transcription of SPEC.md used to produce the corpus's expected outputs.

It shares no code with the qformat package's packing or decoder: codes are located bit by bit
from the formulas of SPEC.md §7, element values come from §6 (float formats read through
ml_dtypes, an independent implementation of the same bit layouts; named codebooks from the
hex tables of qformat/tables/codebooks.json, the data SPEC.md itself is generated from), and
the arithmetic of §10 runs one binary32 NumPy scalar operation at a time.  It is meant for
tensors of at most a few thousand elements.
"""

from __future__ import annotations

import hashlib
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


def integers(v: Any) -> Any:
    """§3.2: a number with an integral value is an integer however written (4.0 is 4)."""
    if isinstance(v, float) and math.isfinite(v) and v == math.floor(v):
        return int(v)
    if isinstance(v, list):
        return [integers(x) for x in v]
    if isinstance(v, dict):
        return {k: integers(x) for k, x in v.items()}
    return v


def decode(desc: Mapping[str, Any], comps: Mapping[str, np.ndarray]) -> np.ndarray:
    """Decode per SPEC.md §10, one element and one binary32 operation at a time."""
    desc = integers(desc)
    if desc.get("layout", {"name": "canonical"})["name"] != "canonical":
        desc, comps = to_canonical(desc, comps)  # §11: a device layout is read as its canonical component
    shape = tuple(desc["shape"])
    if 0 in shape:  # §10.6: a tensor with no elements reads no component value
        return np.zeros(shape, LOGICAL[desc["dtype"]])
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


# -- §5.5 structural checks, transcribed as data (independent of qformat/structure.py) ----------
# A value spec is a tuple: ("int", lo, hi) an integer in [lo, hi] (a JSON number with an integral
# value, never a boolean); ("enum", values); ("str", lo, hi) a string of lo..hi code points;
# ("bool",); ("anyobj",); ("nullor", spec); ("arr", spec, lo, hi) an array of lo..hi items;
# ("obj", required, optional) an object with exactly those members, each a dict name -> spec;
# ("variant", {type: obj spec}) an object whose string "type" selects one obj spec.
SAFE = 2**53 - 1
NAME = ("str", 1, None)
IDX = ("int", 0, 15)
ELEMENT_SPEC = ("variant", {
    "int": ("obj", {"type": ("enum", ("int",)), "bits": ("int", 1, 8),
                    "signedness": ("enum", ("unsigned", "twos_complement", "offset_binary"))},
            {"code_offset": ("int", 0, 255), "frac_bits": ("int", 0, 16)}),
    "float": ("obj", {"type": ("enum", ("float",)), "format": ("enum", tuple(_FLOAT_BITS))}, {}),
    "codebook": ("xor", ("obj", {"type": ("enum", ("codebook",)), "bits": ("int", 1, 8)},
                         {"table": ("enum", ("nf4", "bnb_fp4")), "table_tensor": NAME}), ("table", "table_tensor")),
})
BLOCKS_SPEC = ("variant", {
    "grid": ("obj", {"type": ("enum", ("grid",)), "size": ("arr", ("nullor", ("int", 1, SAFE)), 0, 64)},
             {"index": ("obj", {"axis": IDX, "tensor": NAME, "count": ("int", 1, SAFE)}, {})}),
    "flat": ("obj", {"type": ("enum", ("flat",)), "size": ("int", 1, SAFE)}, {}),
})
EXTENSIONS_SPEC = ("arr", ("obj", {"name": ("str", 1, 256)}, {"must_understand": ("bool",), "configuration": ("anyobj",)}), 0, 64)
PACKING_VALUES = {"container": ("enum", (8, 16, 32)), "bit_order": ("enum", ("lsb_first", "msb_first")),
                  "axis": ("nullor", IDX), "order": ("arr", IDX, 0, 64), "straddle": ("bool",),
                  "slot_order": ("arr", ("int", 0, 255), 1, 256), "row_alignment": ("int", 1, 65536)}


def _integer(v: Any) -> bool:
    if type(v) is int:
        return True
    return type(v) is float and math.isfinite(v) and v == math.floor(v)


def fits(v: Any, spec: tuple) -> bool:
    kind = spec[0]
    if kind == "int":
        return _integer(v) and spec[1] <= v <= spec[2]
    if kind == "enum":
        if type(v) is str:
            return v in spec[1]
        return _integer(v) and any(type(e) is int and e == v for e in spec[1])
    if kind == "str":
        return type(v) is str and len(v) >= spec[1] and (spec[2] is None or len(v) <= spec[2])
    if kind == "bool":
        return type(v) is bool
    if kind == "anyobj":
        return isinstance(v, dict)
    if kind == "nullor":
        return v is None or fits(v, spec[1])
    if kind == "arr":
        return type(v) is list and spec[2] <= len(v) <= spec[3] and all(fits(x, spec[1]) for x in v)
    if kind == "obj":
        req, opt = spec[1], spec[2]
        if not isinstance(v, dict) or any(k not in v for k in req) or any(k not in req and k not in opt for k in v):
            return False
        return all(fits(x, req[k] if k in req else opt[k]) for k, x in v.items())
    if kind == "xor":
        return fits(v, spec[1]) and sum(k in v for k in spec[2]) == 1
    if kind == "variant":
        if not isinstance(v, dict) or type(v.get("type")) is not str or v["type"] not in spec[1]:
            return False
        return fits(v, spec[1][v["type"]])
    raise AssertionError(kind)


def _members(o: dict, allowed: tuple) -> bool:
    return all(k in allowed for k in o)


def structural_codes(d: Any, max_rank: int = 64) -> list[str]:
    """The codes of every failing check D1..D14 of SPEC.md §5.5 for descriptor ``d`` (empty: valid)."""
    if not isinstance(d, dict):
        return ["SCHEMA_VIOLATION"]  # D1
    out = []
    fail = out.append
    if any(k not in d for k in ("shape", "dtype", "codes")) or not _members(d, (
            "shape", "dtype", "codes", "zero", "scale", "bias", "layout", "allow_nonfinite_params", "scheme", "extensions")):
        fail("SCHEMA_VIOLATION")  # D2
    if "shape" in d and not fits(d["shape"], ("arr", ("int", 0, SAFE), 0, max_rank)):
        fail("SHAPE_INVALID")  # D3
    if "dtype" in d and not fits(d["dtype"], ("enum", ("float32", "float16", "bfloat16"))):
        fail("DTYPE_INVALID")  # D4
    c = d.get("codes")
    if "codes" in d and not isinstance(c, dict):
        fail("SCHEMA_VIOLATION")  # D5
    if isinstance(c, dict):
        if any(k not in c for k in ("tensor", "element", "packing")) or not _members(c, ("tensor", "element", "packing")):
            fail("SCHEMA_VIOLATION")  # D5
        if "tensor" in c and not fits(c["tensor"], NAME):
            fail("SCHEMA_VIOLATION")  # D6
        if "element" in c and not fits(c["element"], ELEMENT_SPEC):
            fail("ELEMENT_INVALID")  # D7
        if "packing" in c:
            p = c["packing"]
            if not isinstance(p, dict):
                fail("PACKING_INVALID")  # D8
            else:
                bad8 = any(k not in p for k in ("container", "bit_order", "axis"))
                bad8 |= any(k in p and not fits(p[k], s) for k, s in PACKING_VALUES.items())
                pl = p.get("planes")
                if "planes" in p:
                    bad8 |= not isinstance(pl, dict) or not fits(pl.get("span"), ("int", 1, SAFE))
                if bad8:
                    fail("PACKING_INVALID")
                if not _members(p, tuple(PACKING_VALUES) + ("planes",)) or (isinstance(pl, dict) and not _members(pl, ("span",))):
                    fail("SCHEMA_VIOLATION")  # D9
    ops = {"zero": (), "scale": ("multiply", "divide"), "bias": ("add", "subtract")}
    for role, allowed_ops in ops.items():
        if role not in d:
            continue
        prm = d[role]
        if not isinstance(prm, dict):
            fail("SCHEMA_VIOLATION")  # D10
            continue
        ok10 = "blocks" in prm and _members(prm, ("blocks", "op", "tensor", "order", "encoded"))
        ok10 &= ("tensor" in prm) != ("encoded" in prm) and not ("encoded" in prm and "order" in prm)
        ok10 &= ("op" not in prm) if role == "zero" else fits(prm.get("op"), ("enum", allowed_ops))
        ok10 &= "tensor" not in prm or fits(prm["tensor"], NAME)
        ok10 &= "order" not in prm or fits(prm["order"], ("arr", IDX, 0, 64))
        if not ok10:
            fail("SCHEMA_VIOLATION")
        if "blocks" in prm and not fits(prm["blocks"], BLOCKS_SPEC):
            fail("BLOCKS_INVALID")  # D11
        if "encoded" in prm and structural_codes(prm["encoded"], max_rank):
            fail("SCHEMA_VIOLATION")  # D12
    if "layout" in d:
        lay = d["layout"]
        if not isinstance(lay, dict) or not fits(lay.get("name"), NAME) or ("parameters" in lay and not isinstance(lay["parameters"], dict)):
            fail("LAYOUT_INVALID")  # D13
        if isinstance(lay, dict) and not _members(lay, ("name", "parameters")):
            fail("SCHEMA_VIOLATION")  # D13'
    for k, s in (("allow_nonfinite_params", ("bool",)), ("scheme", ("str", 1, 64)), ("extensions", EXTENSIONS_SPEC)):
        if k in d and not fits(d[k], s):
            fail("SCHEMA_VIOLATION")  # D14
    return out


def structural_code(d: Any) -> str | None:
    """§5.5: None when every check passes; the common code of the failures, else SCHEMA_VIOLATION."""
    codes = set(structural_codes(d))
    if not codes:
        return None
    return codes.pop() if len(codes) == 1 else "SCHEMA_VIOLATION"


# -- reading a file whose container is sound (for the differential fuzzer) -------------------------
_NP = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
       "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
       "F32": np.float32, "F64": np.float64, "C64": np.complex64, "F8_E4M3": ml_dtypes.float8_e4m3fn,
       "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": ml_dtypes.float8_e8m0fnu,
       "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz}


def read_parts(data: bytes) -> tuple[dict | None, dict[str, np.ndarray]]:
    """(the qformat object or None, every stored tensor as an array) of a file whose container
    SPEC.md §2 accepts (not re-checked here); sub-byte tensors are left out."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    comps = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] not in _NP:
            continue
        b, end = e["data_offsets"]
        if 0 in e["shape"] and not empty_representable(e["shape"], np.dtype(_NP[e["dtype"]]).itemsize):
            # §2.2: a component is never refused for an empty shape no array can hold; no element
            # of it is ever read, so a flat empty array stands for it
            comps[name] = np.zeros((0,), _NP[e["dtype"]])
            continue
        comps[name] = np.frombuffer(data[base + b : base + end], _NP[e["dtype"]]).reshape(e["shape"])
    meta = header.get("__metadata__")  # §2.3 check 8: null is no metadata
    q = (meta if meta is not None else {}).get("qformat")
    return (json.loads(q) if q is not None else None), comps


def object_code(q: Any, newer: bool, minor: int = 0) -> str | None:
    """§3.2 checks Q1 to Q5 on the qformat object without its descriptors (version checked before);
    ``minor``: the minor version the file declares (`digests` is a member from 1.2 on, §3.8)."""
    with_digests = newer or minor >= 2
    ok = "tensors" in q and isinstance(q["tensors"], dict)
    ok &= newer or all(k in ("version", "tensors", "extensions") + (("digests",) if with_digests else ()) for k in q)
    ok &= "extensions" not in q or fits(q["extensions"], EXTENSIONS_SPEC)
    ok &= not with_digests or "digests" not in q or digests_member_ok(q["digests"])
    return None if ok else ("FEATURE_UNSUPPORTED" if newer else "SCHEMA_VIOLATION")


# -- §3.8 digests (spec 1.2) -------------------------------------------------------------------------
#: the algorithms §3.8 defines -> the number of hexadecimal digits of a digest
DIGEST_DIGITS = {"sha256": 64}


def digests_member_ok(d: Any) -> bool:
    """§3.2 check Q5: an object of exactly `algorithm` (a name of [a-z0-9-], 1 to 32 characters,
    not starting with '-') and `tensors` (an object of strings of 1 to 128 digits 0-9a-f)."""
    if not isinstance(d, dict) or set(d) != {"algorithm", "tensors"}:
        return False
    alg, ts = d["algorithm"], d["tensors"]
    if not isinstance(alg, str) or not 1 <= len(alg) <= 32 or alg[0] == "-":
        return False
    if any(ch not in "abcdefghijklmnopqrstuvwxyz0123456789-" for ch in alg):
        return False
    if not isinstance(ts, dict):
        return False
    return all(isinstance(v, str) and 1 <= len(v) <= 128 and all(ch in "0123456789abcdef" for ch in v) for v in ts.values())


def stored_bytes(data: bytes) -> dict[str, bytes]:
    """Every stored tensor's bytes: its data_offsets range of the data buffer (§2.1), nothing else."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    return {name: data[base + e["data_offsets"][0] : base + e["data_offsets"][1]] for name, e in header.items() if name != "__metadata__"}


def sha256_hex(raw: bytes) -> str:
    """§3.8 `sha256`: SHA-256 (FIPS 180-4) as 64 lower-case hexadecimal digits."""
    return hashlib.sha256(raw).hexdigest()


def digest_codes(data: bytes) -> list[str]:
    """§3.8 verification of a file whose qformat object has a valid `digests`: the codes a checker
    reports (DIGEST_UNSUPPORTED once; DIGEST_MISMATCH per listed name that is no stored tensor, has
    the wrong length or differs from the digest of the bytes)."""
    q, _ = read_parts(data)
    d = (q or {}).get("digests")
    if d is None:
        return []
    if d["algorithm"] not in DIGEST_DIGITS:
        return ["DIGEST_UNSUPPORTED"]
    raw = stored_bytes(data)
    out = []
    for name, want in d["tensors"].items():
        if name not in raw or len(want) != DIGEST_DIGITS[d["algorithm"]] or sha256_hex(raw[name]) != want:
            out.append("DIGEST_MISMATCH")
    return out


# -- §2.6 plain tensors of the packed storage dtypes, §2.2 empty shapes (spec 1.2) ---------------------
def plain_f4(raw: bytes, shape: list[int]) -> np.ndarray:
    """§2.6: a plain F4 tensor, element k of the row-major order in byte k // 2, the low nibble for
    even k and the high nibble for odd k; each nibble is an e2m1fn value (ml_dtypes float4_e2m1fn)."""
    count = math.prod(shape)
    nib = []
    for k in range(count):
        byte = raw[k // 2]
        nib.append(byte & 0x0F if k % 2 == 0 else byte >> 4)
    return np.array(nib, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).reshape(shape)


def plain_f6(raw: bytes) -> np.ndarray:
    """§2.6: a plain F6_E2M3 or F6_E3M2 tensor reads as its raw bytes, a 1-D U8 array."""
    return np.frombuffer(bytes(raw), dtype=np.uint8).copy()


def empty_representable(shape: list[int], element_bytes: int) -> bool:
    """§2.2: an empty shape is readable when the element size in bytes times the product of its
    non-zero entries is below 2^63 (a shape without a 0 entry always is)."""
    if 0 not in shape:
        return True
    product = element_bytes
    for s in shape:
        if s != 0:
            product *= s
    return product < 2**63


def strict_only_codes(data: bytes) -> list[str]:
    """The codes only a strict checker reports (SPEC.md §2.3 checks 5 and 9, §2.4) for a file whose
    container SPEC.md §2 accepts: JSON whitespace before the header object
    (HEADER_LEADING_WHITESPACE), padding after it other than spaces (HEADER_PADDING_NOT_SPACE), an
    empty tensor name (TENSOR_NAME_INVALID), ``"__metadata__": null`` (METADATA_INVALID)."""
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n].decode("utf-8")
    codes = []
    lead = len(text) - len(text.lstrip(" \t\n\r"))
    if lead:
        codes.append("HEADER_LEADING_WHITESPACE")
    obj, end = json.JSONDecoder().raw_decode(text, lead)
    if text[end:].strip(" "):
        codes.append("HEADER_PADDING_NOT_SPACE")
    if "" in obj:
        codes.append("TENSOR_NAME_INVALID")
    if "__metadata__" in obj and obj["__metadata__"] is None:
        codes.append("METADATA_INVALID")
    return codes
