"""llama.cpp's importance matrices (``llama-imatrix`` output), read as ``llama-quantize --imatrix``
reads them.

An importance matrix holds, per weight tensor (by GGUF name, ``blk.0.ffn_down.weight``), the
mean square of each input column's activations over a calibration text: one value per column
(times the expert count for a 3-D expert tensor).  ``llama-quantize`` passes a tensor's vector
to ggml's quantizers, which weight every rounding decision by it
(:mod:`qformat.schemes.ggml_weighted`).  Two file formats exist, and :func:`load_imatrix` reads
both, normalising the values exactly as ``llama-quantize``'s ``load_imatrix`` does
(``tools/quantize/quantize.cpp``), in binary32:

- **GGUF** (llama-imatrix's default since 2025): per tensor, F32 tensors ``<name>.in_sum2``
  (sums of squared activations) and ``<name>.counts`` (tokens seen, one per expert); the value
  is ``in_sum2 / float(lround(count))``, or 1 where the count is 0.  The keys
  ``imatrix.datasets``, ``imatrix.chunk_count`` and ``imatrix.chunk_size`` must be present
  (``llama-quantize`` refuses the file without them).
- **legacy .dat**: int32 entry count; per entry int32 name length, the name, int32 ``ncall``,
  int32 value count, the float32 values (``sum / count * ncall``); then optionally int32 chunk
  count, int32 length and the dataset name.  The value is ``value / float(ncall)`` (as they are
  for ``ncall`` 0).

Every length is checked against the bytes left before anything is allocated; problems are
``IMATRIX_INVALID`` with the entry and what was expected.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from .errors import QFormatError, error

_GGUF_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
_SUMS, _COUNTS = ".in_sum2", ".counts"


@dataclass
class Imatrix:
    """A loaded importance matrix: ``entries`` (GGUF tensor name -> float32 values, normalised
    as llama-quantize uses them), the file's ``format`` (``gguf`` or ``legacy``), its
    ``datasets`` and ``chunk_count`` (0 when the file does not say)."""

    path: str
    format: str
    entries: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0

    def for_tensor(self, gguf_name: str | None, n_per_row: int, experts: int = 1) -> np.ndarray | None:
        """The vector for the tensor ``gguf_name`` with rows of ``n_per_row`` (None when the file
        has no entry: llama-quantize then quantizes that tensor without one).  A length other
        than ``n_per_row * experts`` is IMATRIX_INVALID (llama-quantize stops there too), except
        for the token embedding, which llama-quantize then quantizes without one."""
        if gguf_name is None or gguf_name not in self.entries:
            return None
        v = self.entries[gguf_name]
        if v.size != n_per_row * experts:
            if gguf_name == "token_embd.weight":
                return None
            raise error("IMATRIX_INVALID", f"{os.path.basename(self.path)}: the entry for {gguf_name!r} has {v.size} values, expected "
                        f"{n_per_row * experts} (one per column of the tensor's rows); the matrix was made for another model",
                        tensor=gguf_name)
        return v


def _bad(path: str, msg: str, entry: str | None = None) -> QFormatError:
    return error("IMATRIX_INVALID", f"{os.path.basename(path)}: {msg}", tensor=entry)


def load_imatrix(path: str | os.PathLike[str]) -> Imatrix:
    """Read the importance matrix file ``path`` (GGUF or legacy .dat, told apart by the GGUF
    magic); values as llama-quantize normalises them.  Raises IMATRIX_INVALID."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise _bad(path, f"cannot read the file: {e.strerror or e}") from None
    m = _load_gguf(path) if magic == b"GGUF" else _load_legacy(path)
    if not m.entries:
        raise _bad(path, "the file holds no entries, expected at least one")
    for name, v in m.entries.items():
        if not np.isfinite(v).all():
            bad = int(np.flatnonzero(~np.isfinite(v))[0])
            raise _bad(path, f"value {bad} is {v[bad]}, expected finite values (llama-quantize refuses non-finite ones)", name)
    return m


def _load_gguf(path: str) -> Imatrix:
    from .convert.gguf_file import GGUFFile

    try:
        g = GGUFFile(path)
    except QFormatError as e:
        raise _bad(path, f"not a readable GGUF file: {e.message}") from None
    missing = [k for k in _GGUF_KEYS if k not in g.kv]
    if missing:
        raise _bad(path, f"keys {', '.join(missing)} are missing; llama-quantize requires {', '.join(_GGUF_KEYS)} in a GGUF imatrix")
    out = Imatrix(path, "gguf")
    ds = g.kv["imatrix.datasets"]
    if ds.type == "array" and ds.element_type == "string":
        out.datasets = [str(s) for s in ds.value]
    cc = g.kv["imatrix.chunk_count"]
    out.chunk_count = int(cc.value) if cc.type in ("uint32", "int32", "uint64", "int64") else 0
    pairs: dict[str, list[str | None]] = {}
    for name in g.tensors:
        for i, suffix in enumerate((_SUMS, _COUNTS)):
            if name.endswith(suffix) and len(name) > len(suffix):
                pairs.setdefault(name[: -len(suffix)], [None, None])[i] = name
    for base in sorted(pairs):
        s_name, c_name = pairs[base]
        if s_name is None or c_name is None:
            raise _bad(path, f"{base!r} has {'no ' + _SUMS if s_name is None else 'no ' + _COUNTS} tensor, expected both "
                       f"{base}{_SUMS} and {base}{_COUNTS}", base)
        sums, counts = _f32_tensor(g, s_name, path), _f32_tensor(g, c_name, path)
        if counts.size == 0 or sums.size % counts.size:
            raise _bad(path, f"{s_name} has {sums.size} values and {c_name} {counts.size}, expected a whole number of values per "
                       "count", base)
        # lround of each count (half away from zero), then back to float, as llama-quantize
        n = np.floor(np.abs(counts.astype(np.float64)) + 0.5) * np.sign(counts)
        nf = n.astype(np.float32)
        per = sums.reshape(counts.size, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where((nf > 0)[:, None], per / nf[:, None], np.float32(1))
        out.entries[base] = np.ascontiguousarray(v, np.float32).reshape(-1)
    return out


def _f32_tensor(g: object, name: str, path: str) -> np.ndarray:
    info = g.tensors[name]  # type: ignore[attr-defined]
    if info.type_name != "F32":
        raise _bad(path, f"{name} is {info.type_name}, expected F32", name)
    return np.frombuffer(g.raw(name), dtype="<f4").astype(np.float32)  # type: ignore[attr-defined]


def _load_legacy(path: str) -> Imatrix:
    with open(path, "rb") as f:
        data = f.read()
    size, pos = len(data), 0

    def i32(what: str) -> int:
        nonlocal pos
        if size - pos < 4:
            raise _bad(path, f"{what}: expected 4 bytes at offset {pos}, found the end of the file at {size} (truncated, or not an "
                       "imatrix file)")
        (v,) = struct.unpack_from("<i", data, pos)
        pos += 4
        return int(v)

    n_entries = i32("entry count")
    if n_entries < 1 or n_entries * 16 > size - pos:
        raise _bad(path, f"the entry count is {n_entries}, expected 1 to {max((size - pos) // 16, 1)} (neither a GGUF nor a legacy "
                   "imatrix file?)")
    out = Imatrix(path, "legacy")
    for i in range(n_entries):
        n = i32(f"entry {i}: name length")
        if n < 0 or n > size - pos:
            raise _bad(path, f"entry {i}: the name length is {n}, expected 0 to {size - pos} (the bytes left)")
        raw = data[pos:pos + n]
        pos += n
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")  # llama.cpp reads it as a C string
        ncall = i32(f"entry {name!r}: ncall")
        nval = i32(f"entry {name!r}: value count")
        if nval < 1 or nval * 4 > size - pos:
            raise _bad(path, f"entry {name!r}: the value count is {nval}, expected 1 to {(size - pos) // 4} (the bytes left)", name)
        vals = np.frombuffer(data, "<f4", nval, pos).astype(np.float32)
        pos += 4 * nval
        out.entries[name] = (vals / np.float32(ncall)).astype(np.float32) if ncall > 0 else vals
    if pos < size and size - pos >= 4:
        out.chunk_count = i32("chunk count")
        if size - pos >= 4:
            n = i32("dataset name length")
            if 0 < n <= size - pos:
                out.datasets = [data[pos:pos + n].split(b"\0", 1)[0].decode("utf-8", "replace")]
    return out
