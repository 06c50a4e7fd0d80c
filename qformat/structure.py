"""The structural checks of SPEC.md §5.5: which error code a descriptor that fails the schema gets.

The JSON Schema (``qformat/schema/qformat-1.0.schema.json``) says which descriptors are valid;
SPEC.md §5.5 says, as an ordered list of checks on members and values, which code an invalid
one gets.  This module is that list, written without any JSON Schema library, so that the code
never depends on where a validator reports a failure.  ``tests/test_structural_codes.py``
checks that the list and the schema accept exactly the same documents.

Each check is numbered as in SPEC.md §5.5 (``D1`` ... ``D14``).  :func:`descriptor_failures`
returns every failing check as ``(path, code, message)``; :func:`descriptor_code` combines
them: one specific code when every failure has that code, else ``SCHEMA_VIOLATION``.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from . import tables

SV = "SCHEMA_VIOLATION"
MAX_SAFE = 2**53 - 1
DESCRIPTOR_MEMBERS = ("shape", "dtype", "codes", "zero", "scale", "bias", "layout", "allow_nonfinite_params",
                      "scheme", "extensions")
PACKING_MEMBERS = ("container", "bit_order", "axis", "order", "straddle", "slot_order", "planes", "row_alignment")
PARAM_MEMBERS = ("blocks", "op", "tensor", "order", "encoded")
OPS = {"zero": None, "scale": ("multiply", "divide"), "bias": ("add", "subtract")}

Failure = tuple[str, str, str]  # (path, code, message)


# -- JSON value classes (SPEC.md §3.2: a number with an integral value is an integer) ---------
def is_object(v: Any) -> bool:
    return isinstance(v, Mapping)


def is_int(v: Any, lo: int | None = None, hi: int | None = None) -> bool:
    """A JSON number with an integral value (``4``, ``4.0``, ``4e0``) within [lo, hi]."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        n = v
    elif isinstance(v, float) and v == v and v not in (float("inf"), float("-inf")) and v.is_integer():
        n = v  # type: ignore[assignment]
    else:
        return False
    return (lo is None or n >= lo) and (hi is None or n <= hi)


def is_name(v: Any) -> bool:
    return isinstance(v, str) and len(v) >= 1


def is_str(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, str) and lo <= len(v) <= hi  # len(): Unicode code points


def in_enum(v: Any, values: tuple) -> bool:
    """Enumeration membership: strings exactly, numbers by value (``8.0`` is 8), booleans never."""
    if isinstance(v, str):
        return v in values
    if is_int(v):
        return any(isinstance(e, int) and v == e for e in values)
    return False


def int_array(v: Any, lo: int, hi: int, max_items: int, min_items: int = 0) -> bool:
    return isinstance(v, list) and min_items <= len(v) <= max_items and all(is_int(x, lo, hi) for x in v)


def unknown(obj: Mapping[str, Any], known: tuple[str, ...]) -> list[str]:
    return [k for k in obj if k not in known]


# -- the element (D7) and the blocks (D11): each one variant selected by "type" ----------------
def element_problem(el: Any) -> str | None:
    """Why ``codes.element`` is not one of the variants of §6 (None when it is)."""
    if not is_object(el):
        return "the element must be an object"
    t = el.get("type")
    if t == "int" and isinstance(t, str):
        if unknown(el, ("type", "bits", "signedness", "code_offset", "frac_bits")):
            return f"unknown members {unknown(el, ('type', 'bits', 'signedness', 'code_offset', 'frac_bits'))}"
        if not is_int(el.get("bits"), 1, 8):
            return "bits must be an integer 1..8"
        if el.get("signedness") not in ("unsigned", "twos_complement", "offset_binary") or not isinstance(el.get("signedness"), str):
            return "signedness must be unsigned, twos_complement or offset_binary"
        if "code_offset" in el and not is_int(el["code_offset"], 0, 255):
            return "code_offset must be an integer 0..255"
        if "frac_bits" in el and not is_int(el["frac_bits"], 0, 16):
            return "frac_bits must be an integer 0..16"
        return None
    if t == "float" and isinstance(t, str):
        if unknown(el, ("type", "format")):
            return f"unknown members {unknown(el, ('type', 'format'))}"
        fmt = el.get("format")
        if not isinstance(fmt, str) or fmt not in tables.float_formats():
            return "format must name a float format of §6.3"
        return None
    if t == "codebook" and isinstance(t, str):
        if unknown(el, ("type", "bits", "table", "table_tensor")):
            return f"unknown members {unknown(el, ('type', 'bits', 'table', 'table_tensor'))}"
        if not is_int(el.get("bits"), 1, 8):
            return "bits must be an integer 1..8"
        if ("table" in el) == ("table_tensor" in el):
            return "exactly one of table and table_tensor"
        if "table" in el and (not isinstance(el["table"], str) or el["table"] not in tables.codebooks()):
            return "table must name a codebook of §6.4"
        if "table_tensor" in el and not is_name(el["table_tensor"]):
            return "table_tensor must be a non-empty string"
        return None
    return "type must be int, float or codebook"


def blocks_problem(b: Any) -> str | None:
    """Why a parameter's ``blocks`` is not one of the variants of §8 (None when it is)."""
    if not is_object(b):
        return "blocks must be an object"
    t = b.get("type")
    if t == "grid" and isinstance(t, str):
        if unknown(b, ("type", "size", "index")):
            return f"unknown members {unknown(b, ('type', 'size', 'index'))}"
        size = b.get("size")
        if not isinstance(size, list) or len(size) > 64 or not all(s is None or is_int(s, 1, MAX_SAFE) for s in size):
            return "size must be an array of at most 64 entries, each a positive integer or null"
        if "index" in b:
            ix = b["index"]
            if not is_object(ix) or unknown(ix, ("axis", "tensor", "count")):
                return "index must be an object with exactly axis, tensor and count"
            if not (is_int(ix.get("axis"), 0, 15) and is_name(ix.get("tensor")) and is_int(ix.get("count"), 1, MAX_SAFE)):
                return "index needs axis (0..15), tensor (a name) and count (a positive integer)"
        return None
    if t == "flat" and isinstance(t, str):
        if unknown(b, ("type", "size")):
            return f"unknown members {unknown(b, ('type', 'size'))}"
        if not is_int(b.get("size"), 1, MAX_SAFE):
            return "size must be a positive integer"
        return None
    return "type must be grid or flat"


def extensions_ok(v: Any) -> bool:
    """An ``extensions`` list (§3.5) as the schema allows it."""
    if not isinstance(v, list) or len(v) > tables.limits()["max_extensions"]:
        return False
    for e in v:
        if not is_object(e) or unknown(e, ("name", "must_understand", "configuration")):
            return False
        if not is_str(e.get("name"), 1, 256):
            return False
        if "must_understand" in e and not isinstance(e["must_understand"], bool):
            return False
        if "configuration" in e and not is_object(e["configuration"]):
            return False
    return True


# -- the descriptor (D1 to D14) -------------------------------------------------------------------
def descriptor_failures(d: Any, path: str = "") -> Iterator[Failure]:
    """Every failing check of SPEC.md §5.5 for a descriptor, in the order of the list."""
    at = (lambda m: f"{path}.{m}" if path else m)
    # D1
    if not is_object(d):
        yield path or "(descriptor)", SV, "a descriptor must be a JSON object"
        return
    # D2
    missing = [m for m in ("shape", "dtype", "codes") if m not in d]
    if missing:
        yield path or "(descriptor)", SV, f"missing required members {missing}"
    extra = unknown(d, DESCRIPTOR_MEMBERS)
    if extra:
        yield path or "(descriptor)", SV, f"unknown members {extra}"
    # D3
    if "shape" in d and not int_array(d["shape"], 0, MAX_SAFE, tables.limits()["max_rank"]):
        yield at("shape"), "SHAPE_INVALID", "shape must be an array of at most max_rank integers 0..2^53-1"
    # D4
    if "dtype" in d and not (isinstance(d["dtype"], str) and d["dtype"] in ("float32", "float16", "bfloat16")):
        yield at("dtype"), "DTYPE_INVALID", "dtype must be float32, float16 or bfloat16"
    # D5 - D9: codes
    if "codes" in d:
        codes = d["codes"]
        if not is_object(codes):
            yield at("codes"), SV, "codes must be an object"
        else:
            missing = [m for m in ("tensor", "element", "packing") if m not in codes]
            if missing:
                yield at("codes"), SV, f"codes lacks {missing}"
            if unknown(codes, ("tensor", "element", "packing")):
                yield at("codes"), SV, f"unknown members of codes {unknown(codes, ('tensor', 'element', 'packing'))}"
            # D6
            if "tensor" in codes and not is_name(codes["tensor"]):
                yield at("codes.tensor"), SV, "codes.tensor must be a non-empty string"
            # D7
            if "element" in codes:
                why = element_problem(codes["element"])
                if why:
                    yield at("codes.element"), "ELEMENT_INVALID", why
            # D8, D9
            if "packing" in codes:
                yield from _packing_failures(codes["packing"], at("codes.packing"))
    # D10 - D12: parameters
    for role in ("zero", "scale", "bias"):
        if role in d:
            yield from _param_failures(role, d[role], at(role))
    # D13: layout
    if "layout" in d:
        lay = d["layout"]
        if not is_object(lay):
            yield at("layout"), "LAYOUT_INVALID", "layout must be an object"
        else:
            if not is_name(lay.get("name")):
                yield at("layout.name"), "LAYOUT_INVALID", "layout.name must be a non-empty string"
            if "parameters" in lay and not is_object(lay["parameters"]):
                yield at("layout.parameters"), "LAYOUT_INVALID", "layout.parameters must be an object"
            if unknown(lay, ("name", "parameters")):
                yield at("layout"), SV, f"unknown members of layout {unknown(lay, ('name', 'parameters'))}"
    # D14: informative members and extensions
    if "allow_nonfinite_params" in d and not isinstance(d["allow_nonfinite_params"], bool):
        yield at("allow_nonfinite_params"), SV, "allow_nonfinite_params must be a boolean"
    if "scheme" in d and not is_str(d["scheme"], 1, 64):
        yield at("scheme"), SV, "scheme must be a string of 1 to 64 characters"
    if "extensions" in d and not extensions_ok(d["extensions"]):
        yield at("extensions"), SV, "extensions must be an array of at most max_extensions extension objects"


def _packing_failures(p: Any, at: str) -> Iterator[Failure]:
    P = "PACKING_INVALID"
    if not is_object(p):
        yield at, P, "packing must be an object"
        return
    missing = [m for m in ("container", "bit_order", "axis") if m not in p]
    if missing:
        yield at, P, f"packing lacks {missing}"
    if "container" in p and not in_enum(p["container"], (8, 16, 32)):
        yield f"{at}.container", P, "container must be 8, 16 or 32"
    if "bit_order" in p and not in_enum(p["bit_order"], ("lsb_first", "msb_first")):
        yield f"{at}.bit_order", P, "bit_order must be lsb_first or msb_first"
    if "axis" in p and not (p["axis"] is None or is_int(p["axis"], 0, 15)):
        yield f"{at}.axis", P, "axis must be an integer 0..15 or null"
    if "order" in p and not int_array(p["order"], 0, 15, 64):
        yield f"{at}.order", P, "order must be an array of at most 64 integers 0..15"
    if "straddle" in p and not isinstance(p["straddle"], bool):
        yield f"{at}.straddle", P, "straddle must be a boolean"
    if "slot_order" in p and not int_array(p["slot_order"], 0, 255, 256, min_items=1):
        yield f"{at}.slot_order", P, "slot_order must be an array of 1 to 256 integers 0..255"
    if "planes" in p:
        pl = p["planes"]
        if not is_object(pl):
            yield f"{at}.planes", P, "planes must be an object"
        else:
            if not is_int(pl.get("span"), 1, MAX_SAFE):
                yield f"{at}.planes.span", P, "planes.span must be a positive integer"
            if unknown(pl, ("span",)):
                yield f"{at}.planes", SV, f"unknown members of planes {unknown(pl, ('span',))}"
    if "row_alignment" in p and not is_int(p["row_alignment"], 1, 65536):
        yield f"{at}.row_alignment", P, "row_alignment must be an integer 1..65536"
    if unknown(p, PACKING_MEMBERS):
        yield at, SV, f"unknown members of packing {unknown(p, PACKING_MEMBERS)}"


def _param_failures(role: str, prm: Any, at: str) -> Iterator[Failure]:
    # D10
    if not is_object(prm):
        yield at, SV, f"{role} must be an object"
        return
    if "blocks" not in prm:
        yield at, SV, f"{role} lacks blocks"
    if unknown(prm, PARAM_MEMBERS):
        yield at, SV, f"unknown members of {role} {unknown(prm, PARAM_MEMBERS)}"
    if ("tensor" in prm) == ("encoded" in prm) or ("encoded" in prm and "order" in prm):
        yield at, SV, f"{role} needs exactly one of tensor and encoded (and no order next to encoded)"
    ops = OPS[role]
    if ops is None:
        if "op" in prm:
            yield f"{at}.op", SV, "a zero point has no op"
    elif not (isinstance(prm.get("op"), str) and prm["op"] in ops):
        yield f"{at}.op", SV, f"{role}.op must be one of {list(ops)}"
    if "tensor" in prm and not is_name(prm["tensor"]):
        yield f"{at}.tensor", SV, f"{role}.tensor must be a non-empty string"
    if "order" in prm and not int_array(prm["order"], 0, 15, 64):
        yield f"{at}.order", SV, f"{role}.order must be an array of at most 64 integers 0..15"
    # D11
    if "blocks" in prm:
        why = blocks_problem(prm["blocks"])
        if why:
            yield f"{at}.blocks", "BLOCKS_INVALID", why
    # D12
    if "encoded" in prm:
        for path, _code, msg in descriptor_failures(prm["encoded"], f"{at}.encoded"):
            yield path, SV, msg  # every failure inside a nested descriptor is SCHEMA_VIOLATION


def combine(codes: list[str] | set[str]) -> str:
    """The code of a descriptor with failures of these codes (SPEC.md §5.5, last rule)."""
    s = set(codes)
    return s.pop() if len(s) == 1 else SV


def descriptor_code(d: Any) -> tuple[str | None, list[str]]:
    """(None, []) for a descriptor that passes every check, else (its code, messages)."""
    fails = list(descriptor_failures(d))
    if not fails:
        return None, []
    return combine([c for _, c, _ in fails]), [f"at {p}: {m}" for p, _, m in fails]


# -- the qformat object without its descriptors (Q1 to Q4) -----------------------------------
def object_failures(obj: Mapping[str, Any], newer: bool, minor: int | None = None) -> list[str]:
    """Failures of the qformat object's own members (SPEC.md §3.2 list); ``version`` has been
    checked before.  In a newer minor, top-level members this reader does not know are ignored.
    ``minor``: the file's minor version; ``digests`` is a member only from 1.2 on (§3.8)."""
    from . import digests

    out = []
    if "tensors" not in obj:
        out.append("the qformat object lacks 'tensors'")
    elif not is_object(obj["tensors"]):
        out.append("'tensors' must be an object")
    has_digests = newer or (minor is not None and minor >= digests.SINCE_MINOR)
    known = ("version", "tensors", "extensions") + (("digests",) if has_digests else ())
    if not newer and unknown(obj, known):
        out.append(f"unknown members {unknown(obj, known)}")
    if "extensions" in obj and not extensions_ok(obj["extensions"]):
        out.append("'extensions' must be an array of at most max_extensions extension objects")
    if has_digests and "digests" in obj:
        out.extend(digests.structure_failures(obj["digests"]))  # Q5
    return out
