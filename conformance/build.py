"""Building blocks for corpus cases: a raw safetensors writer, tensor makers, the case registry.

Nothing here uses qformat's writer, packing or decoder: files are laid out byte by byte, codes
are packed by conformance/spec_reference.py, and expected outputs are decoded by it too.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union

import ml_dtypes
import numpy as np

from . import spec_reference as R

#: NumPy dtype -> safetensors dtype name (independent of qformat's own table).
ST_DTYPE = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.uint16): "U16",
    np.dtype(np.int16): "I16", np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32", np.dtype(np.uint64): "U64",
    np.dtype(np.int64): "I64", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.complex64): "C64",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
    np.dtype(ml_dtypes.float8_e8m0fnu): "F8_E8M0",
}
WIDTH = {"U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2, "F16": 2,
         "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}

#: A tensor to lay out: a NumPy array, or (safetensors dtype, shape, raw bytes) taken verbatim.
Tensorish = Union[np.ndarray, "tuple[str, Sequence[int], bytes]"]


# -- raw files -----------------------------------------------------------------------------------
# The one raw safetensors writer of the repository: the corpus cases here and the test suite
# (tests/filebuild.py imports these) lay files out byte by byte with it, never with qformat's writer.
def raw_tensor(t: Tensorish) -> tuple[str, list[int], bytes]:
    """(dtype name, shape, little-endian bytes) of an array or of a raw (dtype, shape, bytes) triple."""
    if isinstance(t, tuple):
        dt, shape, data = t
        return dt, list(shape), bytes(data)
    a = np.asarray(t)
    dt = np.dtype(a.dtype)
    if dt == np.dtype(ml_dtypes.float4_e2m1fn):  # SPEC.md §2.6: F4, element 2k in the low nibble of byte k
        nib = a.reshape(-1).view(np.uint8) & 0x0F
        nib = np.concatenate([nib, np.zeros(nib.size % 2, np.uint8)])
        return "F4", list(a.shape), (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    # ascontiguousarray makes 0-d arrays 1-d: the reshape keeps the shape
    c = np.ascontiguousarray(a, dtype=dt.newbyteorder("<")).reshape(a.shape)
    return ST_DTYPE[dt.newbyteorder("=")], list(a.shape), c.tobytes()


def layout(tensors: Mapping[str, Tensorish], sort: bool = False) -> tuple[dict[str, Any], bytes]:
    """Header entries with consecutive offsets and the data buffer, in the mapping's order (or
    in name order with ``sort``)."""
    entries: dict[str, Any] = {}
    chunks = []
    off = 0
    for name in (sorted(tensors) if sort else tensors):
        dt, shape, data = raw_tensor(tensors[name])
        entries[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    return entries, b"".join(chunks)


def header_entries(tensors: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    """Entries and data buffer for tensors given as arrays or (dtype, shape, bytes) triples,
    laid out in name order."""
    return layout(tensors, sort=True)


def header_bytes(header: Mapping[str, Any] | str | bytes, pad: bool = True) -> bytes:
    """The header as bytes: dicts are dumped compactly; ``pad`` adds spaces to a multiple of 8."""
    if isinstance(header, Mapping):
        hb = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    elif isinstance(header, str):
        hb = header.encode("utf-8")
    else:
        hb = bytes(header)
    if pad:
        hb += b" " * (-len(hb) % 8)
    return hb


def raw_file(header: Mapping[str, Any] | str | bytes, data: bytes = b"", pad: bool = True,
             length: int | None = None) -> bytes:
    """8-byte length (``length`` overrides the true one), header (dict -> compact JSON, or given
    text/bytes verbatim), data."""
    hb = header_bytes(header, pad)
    return struct.pack("<Q", len(hb) if length is None else length) + hb + data


def qformat_json(descs: Mapping[str, Any], version: str = "1.0", **top: Any) -> str:
    return json.dumps({"version": version, "tensors": dict(descs), **top}, separators=(",", ":"), sort_keys=True)


def build_file(tensors: Mapping[str, Tensorish], metadata: Mapping[str, str] | None = None,
               qformat: Mapping[str, Any] | str | None = None, *, pad: bool = True, sort: bool = False) -> bytes:
    """A complete file; ``qformat`` (object, or raw text) goes to __metadata__["qformat"]; tensors
    are laid out in the mapping's order (name order with ``sort``)."""
    entries, data = layout(tensors, sort)
    header: dict[str, Any] = {}
    meta = dict(metadata or {})
    if qformat is not None:
        meta["qformat"] = qformat if isinstance(qformat, str) else json.dumps(qformat, separators=(",", ":"))
    if meta:
        header["__metadata__"] = meta
    header.update(entries)
    return raw_file(header, data, pad=pad)


def st_file(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    return build_file(tensors, metadata, sort=True)


def q_file(descs: Mapping[str, Any], comps: Mapping[str, Any], plain: Mapping[str, Any] | None = None,
           version: str = "1.0", extra_meta: Mapping[str, str] | None = None, **top: Any) -> bytes:
    meta = dict(extra_meta or {})
    meta["qformat"] = qformat_json(descs, version, **top)
    return st_file({**comps, **(plain or {})}, meta)


# -- tensors ---------------------------------------------------------------------------------------
def qtensor(rng: np.random.Generator, prefix: str, shape: tuple[int, ...], dtype: str, element: dict, packing: dict,
            params: Mapping[str, dict] | None = None, codes: np.ndarray | None = None,
            code_dtype: Any = None, table: np.ndarray | None = None) -> tuple[dict, dict]:
    """A descriptor and its components.  ``params[role]`` is a dict with 'blocks', optional 'op',
    and either 'values' (an array of the grid's shape, stored as given), 'stored' (exact array to
    store, e.g. squeezed or transposed, with optional 'order'), or 'encoded' (a (desc, comps) pair
    from a nested qtensor call)."""
    bits = R.element_bits(element)
    comps: dict[str, Any] = {}
    n_codes = 1 << bits
    if element["type"] == "codebook" and "table_tensor" in element:
        assert table is not None
        n_codes = len(table)
        comps[element["table_tensor"]] = table
    elif element["type"] == "codebook":
        n_codes = len(R.named_codebook(element["table"]))
    if codes is None:
        codes = rng.integers(0, n_codes, size=shape)
    words = R.pack(np.asarray(codes), bits, packing)
    if code_dtype is not None:
        words = words.view(code_dtype)
    comps[prefix + "codes"] = words
    desc: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "codes": {"tensor": prefix + "codes", "element": element, "packing": packing}}
    for role, p in (params or {}).items():
        d: dict[str, Any] = {"blocks": p["blocks"]}
        if "op" in p:
            d["op"] = p["op"]
        if "encoded" in p:
            sub, subc = p["encoded"]
            d["encoded"] = sub
            comps.update(subc)
        else:
            name = p.get("name", prefix + role)
            comps[name] = p["stored"] if "stored" in p else p["values"]
            d["tensor"] = name
            if "order" in p:
                d["order"] = p["order"]
        if "index" in p:
            d["blocks"] = dict(d["blocks"], index=p["index"][0])
            comps[p["index"][0]["tensor"]] = p["index"][1]
        desc[role] = d
    return desc, comps


def grid(blocks: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    return R.grid_shape(blocks, shape)


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any, lo: float = 0.05, hi: float = 2.0) -> np.ndarray:
    """Random parameter values of a storage dtype (positive floats; small non-negative ints)."""
    dt = np.dtype(dtype)
    if dt == np.dtype(ml_dtypes.float8_e8m0fnu):
        return rng.integers(118, 134, size=shape).astype(np.uint8).view(dt)
    if dt.kind in "iu":
        return rng.integers(0, 16, size=shape).astype(dt)
    return (rng.uniform(lo, hi, size=shape) * rng.choice([-1, 1], size=shape)).astype(dt)


def pk(container: int = 8, bit_order: str = "lsb_first", axis: int | None = -1, rank: int = 2, **kw: Any) -> dict:
    if axis == -1:
        axis = rank - 1 if rank else None
    return {"container": container, "bit_order": bit_order, "axis": axis, **kw}


# -- the registry -------------------------------------------------------------------------------
@dataclass
class Built:
    """What a case produces: its files (relative paths -> bytes), which one a reader is given,
    the reader's expectation and, for checkers, the exact set of codes `qformat check` reports."""

    files: dict[str, bytes]
    input: str
    expect: str  # "valid" | "malformed" | "invalid"
    error: str | None = None
    expected: dict[str, np.ndarray] | None = None
    check_codes: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)


@dataclass
class Case:
    id: str
    description: str
    spec: list[str]
    features: list[str]
    build: Callable[[np.random.Generator], Built]


CASES: dict[str, Case] = {}


def case(id: str, description: str, spec: list[str], features: list[str] | None = None):
    """Register a case builder under a stable id (ids are never reused or renamed)."""

    def deco(fn: Callable[[np.random.Generator], Built]) -> Callable[[np.random.Generator], Built]:
        if id in CASES:
            raise ValueError(f"duplicate case id {id}")
        CASES[id] = Case(id, description, spec, list(features or []), fn)
        return fn

    return deco


def seed_of(case_id: str) -> int:
    return int.from_bytes(hashlib.sha256(case_id.encode()).digest()[:8], "little")


def valid(descs: Mapping[str, Any], comps: Mapping[str, Any], plain: Mapping[str, Any] | None = None,
          check_codes: list[str] | None = None, file_bytes: bytes | None = None, **top: Any) -> Built:
    """A valid single-file case whose expected output is decoded by spec_reference."""
    expected = {name: R.decode(d, comps) for name, d in descs.items()}
    for name, a in (plain or {}).items():
        expected[name] = np.asarray(a)
    data = file_bytes if file_bytes is not None else q_file(descs, comps, plain, **top)
    feats = sorted({f for d in descs.values() for f in features_of(d)})
    return Built({"input.safetensors": data}, "input.safetensors", "valid", None, expected, list(check_codes or []), feats)


def failing(data: bytes, code: str, expect: str | None = None, check_codes: list[str] | None = None,
            name: str = "input.safetensors") -> Built:
    from qformat import tables  # only the error table (data), not the reader

    cat = tables.errors()[code]["category"]
    exp = expect or ("malformed" if cat == "malformed" else "invalid")
    return Built({name: data}, name, exp, code, None, [code] if check_codes is None else check_codes, [f"error:{code}"])


def features_of(desc: Mapping[str, Any], depth: int = 0) -> set[str]:
    """Feature tags of a descriptor (used to filter cases), derived from its content."""
    f: set[str] = set()
    el, p = desc["codes"]["element"], desc["codes"]["packing"]
    f.add(f"dtype:{desc['dtype']}")
    f.add(f"rank:{len(desc['shape'])}")
    if 0 in desc["shape"]:
        f.add("shape:zero-size")
    f.add(f"element:{el['type']}")
    if el["type"] == "int":
        f.update({f"int:bits{el['bits']}", f"int:{el['signedness']}"})
        if el.get("code_offset"):
            f.add("int:code_offset")
        if el.get("frac_bits"):
            f.add("int:frac_bits")
    elif el["type"] == "float":
        f.add(f"float:{el['format']}")
    else:
        f.add(f"codebook:{el.get('table', 'tensor')}")
        f.add(f"codebook:bits{el['bits']}")
    bits = R.element_bits(el)
    f.update({f"container:{p['container']}", f"bit_order:{p['bit_order']}"})
    f.add("packing:flat" if p["axis"] is None else "packing:axis")
    f.add("packing:stream" if (p["container"] % bits and p.get("straddle", True)) else "packing:slots")
    for k in ("order", "slot_order", "planes", "row_alignment"):
        if k in p:
            f.add(f"packing:{k}")
    for role in ("zero", "scale", "bias"):
        if role not in desc:
            continue
        prm = desc[role]
        f.add(f"param:{role}")
        if "op" in prm:
            f.add(f"op:{prm['op']}")
        b = prm["blocks"]
        f.add(f"blocks:{b['type']}")
        if "index" in b:
            f.add("blocks:index")
        if b["type"] == "grid" and sum(s is not None and s > 1 for s in b["size"]) >= 2:
            f.add("blocks:2d")
        if "encoded" in prm:
            f.add("param:encoded")
            f.update(features_of(prm["encoded"], depth + 1))
        elif "order" in prm:
            f.add("param:order")
    if depth:
        f.add(f"nesting:depth{depth}")
    if desc.get("extensions"):
        f.add("extensions")
    return f
