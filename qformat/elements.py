"""Element encodings: how one b-bit code maps to an exact binary32 value (SPEC.md "Elements").

Every element encoding in qformat has at most 2**8 codes, so decoding is a lookup in a table
of 2**bits binary32 values built here from the rules in SPEC.md (never from a framework's
cast, so the tables are an independent implementation; tests compare them with ml_dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from . import tables


@dataclass(frozen=True)
class Element:
    """A parsed ``element`` object."""

    type: str  # "int" | "float" | "codebook"
    bits: int
    signedness: str | None = None
    code_offset: int = 0
    frac_bits: int = 0
    format: str | None = None
    table: str | None = None
    table_tensor: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Element":
        t = d["type"]
        if t == "int":
            return cls("int", int(d["bits"]), signedness=d["signedness"],
                       code_offset=int(d.get("code_offset", 0)), frac_bits=int(d.get("frac_bits", 0)))
        if t == "float":
            fmt = d["format"]
            return cls("float", int(tables.float_formats()[fmt]["bits"]), format=fmt)
        return cls("codebook", int(d["bits"]), table=d.get("table"), table_tensor=d.get("table_tensor"))

    def to_dict(self) -> dict[str, Any]:
        if self.type == "int":
            d: dict[str, Any] = {"type": "int", "bits": self.bits, "signedness": self.signedness}
            if self.code_offset:
                d["code_offset"] = self.code_offset
            if self.frac_bits:
                d["frac_bits"] = self.frac_bits
            return d
        if self.type == "float":
            return {"type": "float", "format": self.format}
        d = {"type": "codebook", "bits": self.bits}
        if self.table is not None:
            d["table"] = self.table
        else:
            d["table_tensor"] = self.table_tensor
        return d

    def problems(self) -> list[str]:
        """Inconsistencies that the JSON Schema cannot express."""
        out = []
        if self.type == "int" and self.code_offset >= (1 << self.bits):
            out.append(f"code_offset must be below 2^bits = {1 << self.bits}, found {self.code_offset}")
        return out


def int_lut(bits: int, signedness: str, code_offset: int = 0, frac_bits: int = 0) -> np.ndarray:
    """Values of every code of an integer element, as binary32."""
    u = (np.arange(1 << bits, dtype=np.int64) + code_offset) % (1 << bits)
    if signedness == "twos_complement":
        v = np.where(u >= (1 << (bits - 1)), u - (1 << bits), u)
    elif signedness == "offset_binary":
        v = u - (1 << (bits - 1))
    else:
        v = u
    return np.ldexp(v.astype(np.float64), -frac_bits).astype(np.float32)


@lru_cache(maxsize=None)
def _float_lut(fmt: str) -> np.ndarray:
    spec = tables.float_formats()[fmt]
    e_bits, m_bits, bias = spec["exponent_bits"], spec["mantissa_bits"], spec["bias"]
    n = 1 << spec["bits"]
    out = np.empty(n, np.float64)
    for u in range(n):
        sign = -1.0 if spec["signed"] and (u >> (e_bits + m_bits)) & 1 else 1.0
        ex = (u >> m_bits) & ((1 << e_bits) - 1)
        m = u & ((1 << m_bits) - 1)
        if m_bits == 0:
            mag = 2.0 ** (ex - bias)
        elif ex == 0:
            mag = m * 2.0 ** (1 - bias - m_bits)
        else:
            mag = ((1 << m_bits) + m) * 2.0 ** (ex - bias - m_bits)
        all_e = ex == (1 << e_bits) - 1
        if spec["specials"] == "ieee" and all_e:
            mag = np.inf if m == 0 else np.nan
        elif spec["specials"] == "nan_all_ones" and all_e and m == (1 << m_bits) - 1:
            mag = np.nan
        out[u] = sign * mag
    lut = out.astype(np.float32)
    lut.setflags(write=False)
    return lut


def float_lut(fmt: str) -> np.ndarray:
    """Values of every code of a float mini-format, as binary32 (read-only)."""
    return _float_lut(fmt)


def lut(element: Element, table: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The 2**bits lookup table of ``element`` and the count of valid codes.

    For codebooks, codes at or past ``len(table)`` are invalid; their entries are NaN and the
    caller must refuse such codes (CODE_OUT_OF_RANGE) rather than decode them.
    """
    n = 1 << element.bits
    if element.type == "int":
        return int_lut(element.bits, element.signedness or "unsigned", element.code_offset, element.frac_bits), n
    if element.type == "float":
        return float_lut(element.format or ""), n
    values = tables.codebook_values(element.table) if element.table is not None else table
    if values is None:
        raise ValueError("a codebook element with a table_tensor needs that tensor's values")
    values = np.asarray(values).astype(np.float32).reshape(-1)
    out = np.full(n, np.nan, np.float32)
    out[: len(values)] = values
    return out, len(values)
