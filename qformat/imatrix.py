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

Every length is checked against the bytes left before anything is allocated (the legacy file is
read entry by entry, the GGUF file through qformat's GGUF reader, whose tensors cannot share
bytes), so memory stays within the values the file really holds; every value must be finite and
from 0 to :data:`MAX_VALUE`.  Problems are ``IMATRIX_INVALID`` naming the entry, what was
expected and what was found.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from .errors import QFormatError, error

_GGUF_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
#: The largest importance value taken (2^64; llama-imatrix's values are mean squares of
#: activations, far below it).  ggml's weighted quantizers weigh each column by
#: ``value * sqrt(sigma2 + x*x)`` and sum such weights times squared values in binary32: with
#: values of 1e36 a Q4_K block of ordinary weights already overflows; below this bound only
#: weights beyond about 10^5 can, which the quantizer then blames on the weights.
MAX_VALUE = 2.0**64
#: The longest entry or dataset name a legacy file may give (a tensor name; a file name).
MAX_NAME_BYTES = 1 << 16
_CHUNK = 1 << 20
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
    return m


def _check_values(path: str, name: str, v: np.ndarray) -> None:
    """IMATRIX_INVALID naming the entry, the first bad value and its index, unless every value
    is a mean square of activations ggml's weighted quantizers can take: finite, from 0 to
    :data:`MAX_VALUE`."""
    bad = np.zeros(0, np.intp)
    for lo in range(0, v.size, _CHUNK):  # in chunks: the masks stay small beside a large entry
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~((v[lo:lo + _CHUNK] >= 0) & (v[lo:lo + _CHUNK] <= MAX_VALUE))) + lo  # NaN fails both
        if bad.size:
            break
    if bad.size:
        i = int(bad[0])
        x = float(v[i])
        why = ("llama-quantize refuses non-finite ones" if not np.isfinite(x) else
               "a mean square cannot be negative" if x < 0 else
               "larger ones overflow binary32 in ggml's weighted quantizers, whose blocks would be zeros or infinities")
        raise _bad(path, f"entry {name!r}: value {i} is {x:.6g}, expected a mean square of activations "
                   f"from 0 to {MAX_VALUE:.6g} ({why})", name)


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
        v = np.ones(per.shape, np.float32)  # the one array kept; sums stay a view of the file
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(per, nf[:, None], out=v, where=(nf > 0)[:, None])
        out.entries[base] = v.reshape(-1)
        _check_values(path, base, out.entries[base])
    return out


def _f32_tensor(g: object, name: str, path: str) -> np.ndarray:
    info = g.tensors[name]  # type: ignore[attr-defined]
    if info.type_name != "F32":
        raise _bad(path, f"{name} is {info.type_name}, expected F32", name)
    return np.frombuffer(g.raw(name), dtype="<f4")  # type: ignore[attr-defined]  (a view of the memory map)


class _Reader:
    """Little-endian fields of an open legacy file, each checked against the bytes left before
    it is read, so no count from the file sizes a read or an allocation beyond the file."""

    def __init__(self, path: str, f: BinaryIO, size: int):
        self.path, self.f, self.size, self.pos = path, f, size, 0

    @property
    def left(self) -> int:
        return self.size - self.pos

    def read(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise _bad(self.path, f"{what}: expected {n} bytes at offset {self.pos}, found the end of the file at {self.size} "
                       "(truncated, or not an imatrix file)")
        raw = self.f.read(n)
        if len(raw) != n:  # the file shrank while it was read
            raise _bad(self.path, f"{what}: expected {n} bytes at offset {self.pos}, read {len(raw)}")
        self.pos += n
        return raw

    def i32(self, what: str) -> int:
        return int(struct.unpack("<i", self.read(4, what))[0])

    def f32(self, n: int, what: str) -> np.ndarray:
        """``n`` float32 values read straight into the one array kept (no bytes object besides)."""
        if 4 * n > self.left:
            self.read(4 * n, what)  # refuses
        out = np.empty(n, "<f4")
        got = self.f.readinto(memoryview(out).cast("B"))
        if got != 4 * n:
            raise _bad(self.path, f"{what}: expected {4 * n} bytes at offset {self.pos}, read {got}")
        self.pos += 4 * n
        return out


def _load_legacy(path: str) -> Imatrix:
    """The legacy format, read entry by entry: memory holds the values read so far (at most the
    file's size) and one entry's bytes, never the whole file at once."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _bad(path, f"cannot read the file: {e.strerror or e}") from None
    with f:
        r = _Reader(path, f, os.fstat(f.fileno()).st_size)
        n_entries = r.i32("entry count")
        # an entry takes at least 16 bytes: name length, ncall, value count, one value
        if n_entries < 1 or n_entries > r.left // 16:
            raise _bad(path, f"the entry count is {n_entries}, expected 1 to {max(r.left // 16, 1)} (each entry takes at least 16 "
                       f"bytes and {r.left} are left; neither a GGUF nor a legacy imatrix file?)")
        out = Imatrix(path, "legacy")
        for i in range(n_entries):
            n = r.i32(f"entry {i}: name length")
            if not 0 <= n <= min(r.left, MAX_NAME_BYTES):
                raise _bad(path, f"entry {i}: the name length is {n}, expected 0 to {min(r.left, MAX_NAME_BYTES)} (at most "
                           f"{MAX_NAME_BYTES}, and {r.left} bytes are left)")
            name = r.read(n, f"entry {i}: name").split(b"\0", 1)[0].decode("utf-8", "replace")  # llama.cpp reads a C string
            ncall = r.i32(f"entry {name!r}: ncall")
            nval = r.i32(f"entry {name!r}: value count")
            if nval < 1 or nval > r.left // 4:
                raise _bad(path, f"entry {name!r}: the value count is {nval}, expected 1 to {r.left // 4} (the bytes left)", name)
            vals = r.f32(nval, f"entry {name!r}: values")
            if ncall > 0:
                with np.errstate(all="ignore"):  # a non-finite value is refused just below, naming the entry
                    vals /= np.float32(ncall)  # binary32, as llama-quantize divides
            _check_values(path, name, vals)
            out.entries[name] = vals
        if r.left >= 4:
            out.chunk_count = r.i32("chunk count")
            if r.left >= 4:
                n = r.i32("dataset name length")
                if n > MAX_NAME_BYTES:
                    raise _bad(path, f"the dataset name length is {n}, expected at most {MAX_NAME_BYTES}")
                if 0 < n <= r.left:
                    out.datasets = [r.read(n, "dataset name").split(b"\0", 1)[0].decode("utf-8", "replace")]
    return out
