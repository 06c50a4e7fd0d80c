"""The strict safetensors container: reading and validating the header, writing atomically.

qformat reads every file safetensors' writer produces and its reader accepts, and refuses the
few that reader lets through against its own documentation (SPEC.md §2.4): duplicate keys,
extra fields in a tensor entry.  Nothing is allocated from a size the header
claims before that size has been checked against the file.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from typing import Any, BinaryIO, Callable, Iterable, Mapping, NamedTuple

import numpy as np

from . import dtypes as _dt
from . import tables
from .atomic import atomic_write
from .errors import QFormatError, error

#: Codes only ``qformat check --strict`` reports: what safetensors' reader accepts and its writer
#: never writes, which readers accept since spec 1.2 (SPEC.md §2.4).
STRICT_CODES = ("HEADER_LEADING_WHITESPACE", "HEADER_PADDING_NOT_SPACE", "TENSOR_NAME_INVALID")
#: ... and METADATA_INVALID for ``"__metadata__": null`` (the code also refuses other metadata).
STRICT_ALSO = ("METADATA_INVALID",)
MAX_JSON_DEPTH = tables.limits()["max_json_depth"]
JSON_WHITESPACE = " \t\n\r"
_U64 = 1 << 64
_ENTRY_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


class Entry(NamedTuple):
    """One tensor of the container: dtype name, shape, byte range in the data buffer.

    (A named tuple, not a frozen dataclass: a header of 10^5 tensors builds 10^5 of them, and a
    frozen dataclass's ``__init__`` costs several times a tuple's.)"""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    metadata: dict[str, str] | None
    entries: dict[str, Entry]
    data_start: int
    file_size: int
    #: what the file does that safetensors' writer never does but its reader accepts, and so
    #: qformat reads too (SPEC.md §2.4): leading whitespace, non-space padding, an empty tensor
    #: name.  ``qformat check --strict`` reports each as a problem with its code.
    lenient: tuple[QFormatError, ...] = ()


def _mal(code: str, msg: str, tensor: str | None = None) -> QFormatError:
    return error(code, msg, tensor=tensor)


#: A JSON string literal as :func:`json_depth_ok` skips it: from a quote to the next unescaped
#: quote (a backslash escapes any one character), or to the end of the text when none follows.
#: Possessive quantifiers: the regular-expression engine keeps no backtracking state per escape
#: (with plain ``*`` a string of 10^5 escapes held 13 MB).
_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+"?')
#: Text outside strings and whole strings: where it stops, a string begins that does not end
#: within the window searched.
_WHOLE = re.compile(r'(?:[^"]++|"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+")*+')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
#: Characters of text examined per step of :func:`json_depth_ok` (bounds its memory).
_DEPTH_WINDOW = 1 << 16


def json_depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when brackets outside strings nest at most ``limit`` deep (guards the parser).

    Linear in ``len(text)``, run by the regular-expression engine and C iterators (a Python loop
    per character took 0.6 s of a 10^5-tensor header, issue 40), a window of text at a time so
    that its memory is bounded whatever the text: a string longer than a window is skipped by
    one match over the whole text, which keeps no state per character."""
    depth, pos, n = 0, 0, len(text)
    while pos < n:
        end = min(n, pos + _DEPTH_WINDOW)
        cut = _WHOLE.match(text, pos, end).end()  # text[pos:cut] holds whole strings only
        brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text[pos:cut]))
        if brackets:
            if max(accumulate(map(_BRACKET_STEP.__getitem__, brackets), initial=depth)) > limit:
                return False
            depth += sum(map(_BRACKET_STEP.__getitem__, brackets))
        pos = cut if cut == end else _JSON_STRING.match(text, cut).end()  # a string reaching past the window
    return True


class _Dup(Exception):
    def __init__(self, key: str):
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # a repeated key: name the first one repeated
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Dup(k)
            seen.add(k)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Huge:
    """A header integer of more than 20 digits (so 2^64 or more), kept exactly as its digits: SPEC.md
    §2.1 (1.2.1) decides codes by exact arithmetic, and converting a long digit string to an int
    costs time quadratic in its length (a header may hold 100 MB of digits)."""

    __slots__ = ("digits", "neg")

    def __init__(self, text: str) -> None:
        self.neg = text.startswith("-")
        self.digits = text.lstrip("-")

    def __repr__(self) -> str:
        return ("-" if self.neg else "") + (self.digits if len(self.digits) <= 30 else f"{self.digits[:12]}...({len(self.digits)} digits)")


def _parse_int(s: str) -> int | _Huge:
    return int(s) if len(s) <= 21 else _Huge(s)


def _digits(v: int | _Huge) -> str:
    return v.digits if isinstance(v, _Huge) else str(v)


def _key(v: int | _Huge) -> tuple[int, str]:
    """An order on non-negative integers that equals the numeric one (JSON integers have no leading zeros)."""
    d = _digits(v)
    return (len(d), d)


def _plus(v: int | _Huge, k: int) -> int | _Huge:
    """``v + k`` exactly, for ``k >= 0``."""
    if not isinstance(v, _Huge):
        return v + k
    d = list(v.digits)
    carry, i = k, len(d) - 1
    while carry and i >= 0:
        carry, r = divmod(int(d[i]) + carry, 10)
        d[i] = str(r)
        i -= 1
    return _Huge((str(carry) if carry else "") + "".join(d))


def _natural(v: Any) -> bool:
    return (type(v) is int and v >= 0) or (isinstance(v, _Huge) and not v.neg)


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constant, parse_int=lambda s: int(s) if len(s) < 100 else (-1 if s[0] == "-" else 1) << 64)  # huge integers never wrap: in qformat JSON and indexes any 100-digit value is out of every range, like 2^64
#: the container header's integers (shapes, offsets) stay exact however long (SPEC.md §2.1, 1.2.1)
_HEADER_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constant, parse_int=_parse_int)


#: A surrogate code point (text decoded from UTF-8 has none; a ``\\u`` escape can make one).
_SURROGATE = re.compile("[\ud800-\udfff]")


def strict_json(text: str, header: bool = False) -> tuple[Any, int]:
    """Parse one JSON value from the start of ``text``; returns (value, end index).  ``header``:
    the container header, whose integers stay exact however long (:class:`_Huge` past 21 digits).

    Raises _Dup for a repeated key and ValueError for anything else that is not JSON.
    """
    if not json_depth_ok(text):
        raise ValueError(f"nesting deeper than {MAX_JSON_DEPTH}")
    value, end = (_HEADER_DECODER if header else _DECODER).raw_decode(text)
    if "\\u" in text or (not text.isascii() and _SURROGATE.search(text)):  # only then can a string hold a lone one
        try:
            # Lone surrogate escapes (\ud800) parse in Python but are not Unicode text.
            json.dumps(value, ensure_ascii=False, default=repr).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone surrogate escape") from None
    return value, end


def _is_text(head: bytes) -> bool:
    """SPEC.md §2.3 (d): after dropping at most 3 trailing bytes of a cut UTF-8 sequence, ``head``
    is well-formed UTF-8 whose code points are TAB, LF, CR, U+0020..U+007E or U+00A0 and above."""
    for cut in range(4):
        try:
            t = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.reason == "unexpected end of data":
                continue  # a sequence cut by the end: drop one more byte
            return False
        return all(c in "\t\n\r" or 0x20 <= ord(c) <= 0x7E or ord(c) >= 0xA0 for c in t)
    return False


def not_safetensors_kind(head: bytes) -> str | None:
    """What a file whose 8-byte length prefix ``head`` fails check 2 or 3 is, when SPEC.md §2.3
    says it is no safetensors file at all (``NOT_SAFETENSORS``): a GGUF file, a ZIP archive, a
    Python object-serialization stream or text; None for a damaged length (the check's own code)."""
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    if head[:4] == b"GGUF":
        return ("a GGUF file, not safetensors: `qformat inspect` lists it, `qformat convert` turns it into "
                "qformat (which `qformat check` then checks)")
    if head[:4] == b"PK\x03\x04":
        what = "a ZIP archive (a PyTorch .bin/.pt checkpoint?)"
    elif head[0] == 0x80 and 2 <= head[1] <= 5:  # protocols 4, 5: a frame's 8-byte length follows (N < 2^48)
        what = "a serialized Python object stream (a PyTorch .bin checkpoint?)"
    elif n >= 1 << 48 and _is_text(head):
        what = "a text file"
    else:
        return None
    return (f"{what}, not safetensors: its first 8 bytes {head!r} are no safetensors header length; qformat reads "
            ".safetensors files, folders of them and *.safetensors.index.json (and GGUF files: convert, inspect, diff, export)")


def parse_header(f: BinaryIO, file_size: int, null_metadata_ok: bool = False) -> Header:
    """Read and validate the header of an open safetensors file."""
    if file_size < 8:
        raise _mal("HEADER_TOO_SMALL", f"expected at least 8 bytes, the file has {file_size}")
    f.seek(0)
    (n,) = struct.unpack("<Q", f.read(8))
    max_n = tables.limits()["max_header_bytes"]
    if n > max_n or n == 0 or 8 + n > file_size:
        f.seek(0)
        what = not_safetensors_kind(f.read(8))  # SPEC.md §2.3: in place of a failing check 2 or 3
        if what is not None:
            raise _mal("NOT_SAFETENSORS", what)
    if n > max_n:
        raise _mal("HEADER_TOO_LARGE", f"header length {n} exceeds the limit {max_n}")
    if n == 0 or 8 + n > file_size:
        raise _mal("HEADER_LENGTH_INVALID", f"header length {n} does not fit a file of {file_size} bytes")
    raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _mal("HEADER_NOT_UTF8", f"header byte {e.start} is not valid UTF-8") from None
    lenient: list[QFormatError] = []
    lead = len(text) - len(text.lstrip(JSON_WHITESPACE))  # SPEC.md §2.3: JSON whitespace may precede the object
    if lead:
        lenient.append(_mal("HEADER_LEADING_WHITESPACE", f"the header begins with {lead} JSON whitespace byte(s) ({text[:1]!r} first) "
                                                         "before '{': safetensors reads it, its writer never writes it"))
    if not text.startswith("{", lead):
        raise _mal("HEADER_INVALID_JSON", f"the header must begin with '{{' (after optional JSON whitespace), found {text[lead:lead + 1]!r}")
    try:
        obj, end = strict_json(text[lead:], header=True)
        end += lead
    except _Dup as d:
        raise _mal("HEADER_DUPLICATE_KEY", f"key {d.key!r} appears twice in one JSON object") from None
    except (ValueError, RecursionError) as e:
        raise _mal("HEADER_INVALID_JSON", f"the header is not valid JSON: {e}") from None
    rest = text[end:]
    if rest.strip(JSON_WHITESPACE):
        bad = rest.lstrip(JSON_WHITESPACE)[:1]
        raise _mal("HEADER_INVALID_JSON", f"only JSON whitespace padding may follow the header object, found {bad!r} at byte "
                                          f"{8 + len(text[:end].encode()) + (len(rest) - len(rest.lstrip(JSON_WHITESPACE)))}")
    if rest.strip(" "):
        bad = rest.lstrip(" ")[:1]
        lenient.append(_mal("HEADER_PADDING_NOT_SPACE", f"the header object is followed by {bad!r} padding, not only spaces (0x20): "
                                                        "safetensors reads it, its writer pads with spaces"))
    if not isinstance(obj, dict):
        raise _mal("HEADER_INVALID_JSON", f"the header must be a JSON object, found {type(obj).__name__}")

    metadata = None
    entries: dict[str, Entry] = {}
    known = tables.dtypes()
    bits_of = {k: v["bits"] for k, v in known.items()}
    max_rank = tables.limits()["max_rank"]
    for name, ent in obj.items():
        if name == "__metadata__":
            if ent is None:  # what mx.save_safetensors writes by default; safetensors reads it as none (SPEC.md §2.4)
                lenient.append(_mal("METADATA_INVALID", "__metadata__ is null: read as no metadata, as safetensors reads it "
                                                        "(mx.save_safetensors writes it; safetensors' writer never does)"))
                continue
            if not isinstance(ent, dict) or not all(isinstance(v, str) for v in ent.values()):
                raise _mal("METADATA_INVALID", "__metadata__ must be an object whose values are all strings")
            metadata = ent
            continue
        if name == "":  # safetensors writes and reads it (SPEC.md §2.4)
            lenient.append(_mal("TENSOR_NAME_INVALID", "a tensor name is empty: safetensors writes and reads it, qformat reads it", ""))
        if not isinstance(ent, dict) or ent.keys() != _ENTRY_FIELDS:
            found = sorted(ent) if isinstance(ent, dict) else type(ent).__name__
            raise _mal("TENSOR_ENTRY_INVALID", f"expected exactly the fields ['data_offsets', 'dtype', 'shape'], found {found}", name)
        dt, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
        if not isinstance(dt, str):
            raise _mal("TENSOR_ENTRY_INVALID", f"dtype must be a string, found {dt!r}", name)
        if dt not in bits_of:
            raise _mal("DTYPE_UNKNOWN", f"dtype {dt!r} is not a safetensors dtype", name)
        if not isinstance(shape, list) or not all(_natural(s) for s in shape):
            raise _mal("TENSOR_ENTRY_INVALID", f"shape must be a list of non-negative integers, found {shape!r}"[:300], name)
        if not (isinstance(offs, list) and len(offs) == 2 and all(_natural(o) for o in offs)):
            raise _mal("TENSOR_ENTRY_INVALID", f"data_offsets must be two non-negative integers, found {offs!r}"[:300], name)
        if len(shape) > max_rank:
            raise _mal("TENSOR_ENTRY_INVALID", f"rank must be at most {max_rank}, found {len(shape)}", name)
        if any(isinstance(s, _Huge) or s >= _U64 for s in shape):  # SPEC.md §2.2: an entry of 2^64 or more, even in an empty tensor
            raise _mal("SIZE_OVERFLOW", f"a shape entry of {shape} does not fit 64 bits"[:300], name)
        numel = math.prod(shape)  # exact: [2^40, 2^40, 0] has 0 elements
        if numel >= _U64:
            raise _mal("SIZE_OVERFLOW", f"element count of shape {shape} overflows 64 bits", name)
        nbits = numel * bits_of[dt]
        if nbits >= _U64:
            raise _mal("SIZE_OVERFLOW", f"bit size of shape {shape} with dtype {dt} overflows 64 bits", name)
        if nbits % 8:
            raise _mal("SUB_BYTE_MISALIGNED", f"{numel} elements of {dt} fill {nbits} bits, not a whole number of bytes", name)
        b, e = offs  # exact, however many digits (SPEC.md §2.1)
        if _key(e) < _key(b):
            raise _mal("OFFSETS_INVALID", f"data_offsets [{b!r}, {e!r}] end before they begin", name)
        if _key(e) != _key(_plus(b, nbits // 8)):
            span = e - b if isinstance(e, int) and isinstance(b, int) else "2^64 or more"
            raise _mal("TENSOR_SIZE_MISMATCH", f"shape {shape} of {dt} needs {nbits // 8} bytes, data_offsets span {span}", name)
        entries[name] = Entry(name, dt, tuple(shape), b, e)

    pos: int | _Huge = 0
    for ent in sorted(entries.values(), key=lambda x: (_key(x.begin), _key(x.end))):
        if _key(ent.begin) != _key(pos):
            what = ("overlaps the previous tensor" if _key(ent.begin) < _key(pos) else
                    f"leaves a hole of {ent.begin - pos if isinstance(ent.begin, int) and isinstance(pos, int) else '2^64 or more'} bytes")
            raise _mal("OFFSETS_INVALID", f"data_offsets begin at {ent.begin!r}, expected {pos!r}: the tensor {what}", ent.name)
        pos = ent.end
    data_start = 8 + n
    if isinstance(pos, _Huge) or data_start + pos > file_size:
        raise _mal("DATA_TRUNCATED", f"tensor data needs {pos} bytes after the header, the file has {file_size - data_start}")
    if data_start + pos < file_size:
        raise _mal("TRAILING_BYTES", f"{file_size - data_start - pos} bytes follow the last tensor's data")
    return Header(metadata, entries, data_start, file_size, tuple(lenient))


def read_header(path: str | os.PathLike[str], null_metadata_ok: bool = False) -> Header:
    """Open ``path`` and validate its header (FILE_UNREADABLE when it cannot be read).

    ``null_metadata_ok``: kept for callers; since spec 1.2 every reader reads ``"__metadata__":
    null`` as no metadata, as the safetensors library does (SPEC.md §2.3, check 8; §2.4)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return parse_header(f, size, null_metadata_ok)
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read {os.fspath(path)!r}: {e.strerror or e}") from None


def read_mapped(path: str | os.PathLike[str]) -> tuple[Header, mmap.mmap]:
    """Open ``path`` once: validate its header, read through that open file, then map that same
    open file (the same inode, whatever happens to the name meanwhile) for exactly the
    ``file_size`` the header was validated against, so the header and every byte viewed through
    the map are of one file.  Errors as :func:`read_header` says them (FILE_UNREADABLE "cannot
    read", the container's codes), or, when the file cannot be mapped (it shrank since its size
    was read), FILE_UNREADABLE "cannot map" as :class:`qformat.sources.FileSource` says it."""
    try:
        with open(path, "rb") as f:
            header = parse_header(f, os.fstat(f.fileno()).st_size)
            try:
                mm = mmap.mmap(f.fileno(), header.file_size, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise error("FILE_UNREADABLE", f"cannot map {os.fspath(path)!r}: {e}") from None
    except OSError as e:
        raise error("FILE_UNREADABLE", f"cannot read {os.fspath(path)!r}: {e.strerror or e}") from None
    return header, mm


# -- writing -------------------------------------------------------------------------------
def _alignment(dtype: str) -> int:
    return max(1, _dt.storage_bits(dtype) // 8)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to be written, known before its bytes exist: name, safetensors dtype, shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _dt.storage_bits(self.dtype) // 8


@dataclass(frozen=True)
class FilePlan:
    """A file planned before any tensor body is produced: its header bytes (length prefix,
    JSON, space padding) and the tensors in the order their bodies follow it."""

    header: bytes
    order: tuple[TensorSpec, ...]
    #: (stored tensor name, byte offset in ``header``) of each digest placeholder (SPEC.md §3.8)
    digest_slots: tuple[tuple[str, int], ...] = ()

    @cached_property
    def digested(self) -> frozenset[str]:
        """The stored tensors whose digest the plan records (a set: asked once per tensor)."""
        return frozenset(n for n, _ in self.digest_slots)

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.order)

    @property
    def size(self) -> int:
        return len(self.header) + self.data_bytes


def _with_digest_placeholders(metadata: Mapping[str, str], names: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``metadata`` whose qformat object records a digest placeholder for every stored tensor and
    declares at least version 1.2 (the version that defines ``digests``, SPEC.md §3.8, §17.1)."""
    from . import digests

    ph = digests.placeholders(names)
    meta = dict(metadata)
    meta["qformat"] = digests.with_digests(metadata["qformat"], ph)
    return meta, ph


def plan_file(specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None, digests: bool = True) -> FilePlan:
    """Plan a file: order the tensors (widest dtype first, then by name, so every tensor starts
    aligned to its own width) and build the header, all from names, dtypes and shapes.

    ``digests``: when the metadata holds a qformat object, record a digest of every stored
    tensor in it (SPEC.md §3.8; the file then declares at least version 1.2).  The header is
    planned with placeholders of the digests' final length; :func:`write_planned` writes each
    digest over its placeholder once the tensor's bytes are out."""
    specs = list(specs)
    ph: dict[str, str] = {}
    if digests and metadata and "qformat" in metadata:
        metadata, ph = _with_digest_placeholders(metadata, [t.name for t in specs])
    seen: set[str] = set()
    for t in specs:
        if t.name in seen:
            raise error("SAVE_INVALID", "a tensor name appears twice in one file", tensor=t.name)
        seen.add(t.name)
    order = sorted(specs, key=lambda t: (-_alignment(t.dtype), t.name))
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    off = 0
    for t in order:
        n = t.nbytes
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    # Where each placeholder sits, from one pass over the header (a find per placeholder was
    # quadratic: 25 s to plan 24,000 tensors, issue 40).  Placeholders are random hex digits of
    # the digest's length, so only hex runs of exactly that length are looked at.
    where: dict[str, list[int]] = {p: [] for p in ph.values()}
    width = len(next(iter(ph.values()), ""))  # digests.placeholders: one width for all
    for m in re.finditer(rb"(?<![0-9a-f])[0-9a-f]{%d}(?![0-9a-f])" % width, hb) if ph else ():
        hit = where.get(m.group().decode("ascii"))
        if hit is not None:
            hit.append(m.start())
    slots = []
    for name, p in ph.items():
        if len(where[p]) != 1:
            raise error("SAVE_INVALID", "a digest placeholder is not unique in the header", tensor=name)
        slots.append((name, 8 + where[p][0]))
    return FilePlan(struct.pack("<Q", len(hb)) + hb, tuple(order), tuple(slots))


def write_planned(path: str | os.PathLike[str], plan: FilePlan, produce: Callable[[TensorSpec], np.ndarray],
                  written: Callable[[TensorSpec], None] | None = None,
                  copy_from: Mapping[str, tuple[str, int]] | None = None, sync: bool = True) -> None:
    """Write a planned file atomically, producing each tensor body only when its turn comes.

    ``produce(spec)`` returns the tensor's array (its storage dtype and shape must be the
    planned ones, else SAVE_INVALID); it is written in bounded chunks and dropped before the
    next one is produced.  ``written(spec)`` is called after each body (a producer reading a
    memory map can release its pages there).  As :func:`write_file`, the data goes to a
    temporary file beside ``path`` that replaces ``path`` only when everything was written.

    ``copy_from`` maps a tensor name to ``(file, offset)`` where its body already sits byte for
    byte: it is copied file to file in the kernel (``os.copy_file_range``; no page of it enters
    this process), falling back to ``produce`` where the system cannot.  ``sync``: as for
    :func:`~qformat.atomic.atomic_write`.
    """
    from . import digests

    copies = dict(copy_from or {})
    slots = dict(plan.digest_slots)
    found: dict[str, Any] = {}
    with atomic_write(path, "wb", sync=sync) as f:
        f.write(plan.header)
        for t in plan.order:
            where = copies.get(t.name)
            if where is not None and copy_range(where[0], where[1], f, t.nbytes):
                if t.name in slots:
                    # the copied bytes, hashed from the source (a qformat source's own digests are
                    # verified when the command reads it: checkpoint.source's admission, check.Admission)
                    found[t.name] = digests.hash_range(where[0], where[1], t.nbytes)
            else:
                a = checked_array(t, produce(t))
                if t.name in slots:
                    h = digests.hasher()
                    write_array(_Hashing(f, h), a)
                    found[t.name] = h.hexdigest()
                else:
                    write_array(f, a)
                del a
            if written is not None:
                written(t)
        write_digests(f, plan, found)


class _Hashing:
    """A file that hashes what is written through it (a writer's digest, SPEC.md §3.8)."""

    def __init__(self, f: BinaryIO, h: Any):
        self.f, self.h = f, h

    def write(self, b: Any) -> int:
        self.h.update(b)
        return self.f.write(b)


def digest_sink(f: BinaryIO, name: str, plan: FilePlan, found: dict[str, Any]) -> Any:
    """Where a writer writes tensor ``name``'s body: ``f`` itself, or, when the plan records its
    digest, ``f`` through a hasher kept in ``found`` (see :func:`write_digests`)."""
    if name not in plan.digested:
        return f
    from . import digests

    h = found[name] = digests.hasher()
    return _Hashing(f, h)


def write_digests(f: BinaryIO, plan: FilePlan, found: Mapping[str, Any]) -> None:
    """Write each digest over its placeholder in the header (``found``: stored name -> hex digest
    or hasher); the file position is kept."""
    if not plan.digest_slots:
        return
    end = f.tell()
    header = bytearray(plan.header)  # patched in memory, then written once (a seek per digest flushed the buffer each time)
    for name, at in plan.digest_slots:
        d = found[name]
        hexd = (d if isinstance(d, str) else d.hexdigest()).encode("ascii")
        header[at : at + len(hexd)] = hexd
    f.seek(0)
    f.write(header)
    f.seek(end)


def copy_range(src: str, offset: int, f: BinaryIO, nbytes: int) -> bool:
    """Append ``nbytes`` of file ``src`` from ``offset`` to the open file ``f`` in the kernel;
    False (nothing written) where ``os.copy_file_range`` is missing or refuses these files."""
    fn = getattr(os, "copy_file_range", None)
    if fn is None:
        return False
    f.flush()
    out = f.fileno()
    start = os.lseek(out, 0, os.SEEK_CUR)
    try:
        with open(src, "rb") as s:
            if os.fstat(s.fileno()).st_size < offset + nbytes:
                return False
            done = 0
            while done < nbytes:
                n = fn(s.fileno(), out, min(nbytes - done, 1 << 30), offset + done, start + done)
                if n <= 0:
                    raise OSError("copy_file_range made no progress")
                done += n
    except OSError:
        os.ftruncate(out, start)
        return False
    f.seek(start + nbytes)
    return True


def checked_array(t: TensorSpec, a: Any) -> np.ndarray:
    """``a`` as an array, checked against its planned dtype and shape (SAVE_INVALID otherwise)."""
    a = np.asarray(a)
    st = _dt.storage_name(a.dtype)
    if st is None:
        raise error("SAVE_INVALID", f"array dtype {a.dtype} has no safetensors dtype", tensor=t.name)
    if st != t.dtype or tuple(a.shape) != tuple(t.shape):
        raise error("SAVE_INVALID", f"produced {st} {list(a.shape)}, planned {t.dtype} {list(t.shape)}", tensor=t.name)
    return np.ascontiguousarray(a).reshape(a.shape)  # keep 0-d arrays 0-d


def write_file(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None) -> None:
    """Write ``arrays`` (already in storage dtypes) and ``metadata`` atomically to ``path``.

    The data goes to a temporary file in the destination folder, is flushed to disk, then
    renamed over ``path``: an interrupted write leaves ``path`` as it was.  (A thin wrapper
    over :func:`plan_file` and :func:`write_planned`.)
    """
    specs = []
    for name, a in arrays.items():
        st = _dt.storage_name(a.dtype)
        if st is None:
            raise error("SAVE_INVALID", f"array dtype {a.dtype} has no safetensors dtype", tensor=name)
        specs.append(TensorSpec(name, st, tuple(a.shape)))
    write_planned(path, plan_file(specs, metadata), lambda t: arrays[t.name])


def write_array(f: BinaryIO, a: np.ndarray) -> None:
    """Write one tensor body, little-endian, in bounded chunks of at most 16 MB."""
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    flat = a.reshape(-1)
    if flat.flags.c_contiguous and flat.size:
        raw = flat.view(np.uint8)  # the bytes themselves, written without a copy
        for i in range(0, raw.size, 16 << 20):
            f.write(memoryview(raw[i : i + (16 << 20)]))
        return
    step = max(1, (16 << 20) // max(1, a.dtype.itemsize))
    for i in range(0, flat.size, step):
        f.write(flat[i : i + step].tobytes())


def names_sorted(entries: Iterable[Entry]) -> list[str]:
    return [e.name for e in sorted(entries, key=lambda e: e.begin)]


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)
