"""``qformat check``: validate files, folders and sharded checkpoints, reporting every problem.

The checker verifies the container, the qformat metadata against the JSON Schema, every
descriptor against its components, and the payload where it matters (padding bits, parameter
values, group indices, codebook codes).  Payload checks stream through memory-mapped data in
bounded chunks, so memory stays flat however large the file is.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from . import tables
from .container import not_safetensors_kind, read_mapped
from .remote import is_url, read_header
from .decode import decode
from .layouts import canonical_view
from .regions import element_table
from .descriptor import Descriptor, Param, codes_shape
from .validate import INT_PARAM_DTYPES
from .errors import QFormatError, error
from .sources import FileSource
from .index import INDEX_SUFFIX, is_index, mismatches, scan_index
from .paths import source_file
from .redact import scrub, shown
from .model import interpret
from .packing import pack_rows, unpack_rows

#: Packed bytes examined per step of the payload scan.
SCAN_BYTES = 8 << 20


@dataclass(frozen=True)
class Problem:
    """One finding: a stable ``code``, the ``file`` and ``tensor`` it concerns, a sentence."""

    code: str
    file: str | None
    tensor: str | None
    field: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The problem as ``check --json`` records it: a URL in ``file`` or the message shown by
        :func:`qformat.redact.shown` (no user-info, no query)."""
        return {"code": self.code, "file": None if self.file is None else shown(self.file), "tensor": self.tensor,
                "field": self.field, "message": scrub(self.message)}


@dataclass
class FileReport:
    path: str
    quantized: int = 0
    plain: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: stored tensors in the file (components and plain tensors)
    stored: int = 0
    #: with ``digests``: the stored tensors whose recorded digest was computed and matched (None:
    #: digests were not asked for, or the file could not be read that far)
    digests_verified: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"path": shown(self.path), "ok": self.ok, "quantized_tensors": self.quantized, "plain_tensors": self.plain,
                "stored_tensors": self.stored, "digests_verified": self.digests_verified,
                "problems": [p.to_dict() for p in self.problems]}


@dataclass
class Report:
    """The result of :func:`check`: ``ok`` when every file conforms."""

    files: list[FileReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # every problem, files' included

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unreadable(self) -> bool:
        return any(p.code == "FILE_UNREADABLE" for p in self.problems)  # NOT_SAFETENSORS: a file problem (SPEC.md 1.2.1)

    @property
    def digests_verified(self) -> int | None:
        """Digests verified in all files (None when no file's digests were verified)."""
        counts = [f.digests_verified for f in self.files if f.digests_verified is not None]
        return sum(counts) if counts else None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "files": [f.to_dict() for f in self.files], "digests_verified": self.digests_verified,
                "problems": [p.to_dict() for p in self.problems]}


def _problem(e: QFormatError, path: str | None) -> Problem:
    return Problem(e.code, path, e.tensor, e.field, e.message)


# -- payload checks ------------------------------------------------------------------------
def _iter_row_blocks(words: np.ndarray, axis: int | None, wpr: int) -> Iterable[np.ndarray]:
    """Yield 2-D [rows, wpr] blocks of packed words, at most about SCAN_BYTES each."""
    if axis is None:
        yield words.reshape(1, -1)
        return
    if words.size == 0:
        return
    step_bytes = max(1, SCAN_BYTES // max(1, wpr * words.dtype.itemsize))
    if axis == words.ndim - 1:
        flat = words.reshape(-1, wpr)
        for i in range(0, flat.shape[0], step_bytes):
            yield flat[i : i + step_bytes]
        return
    other = 0 if axis != 0 else 1
    inner = math.prod(words.shape) // (words.shape[other] * wpr)
    step = max(1, step_bytes // max(1, inner))
    for i in range(0, words.shape[other], step):
        idx = [slice(None)] * words.ndim
        idx[other] = slice(i, i + step)
        yield np.moveaxis(words[tuple(idx)], axis, -1).reshape(-1, wpr)


def _release(src: Any, a: np.ndarray) -> None:
    """Unmap the memory-mapped pages under ``a`` once they are scanned, so resident memory stays
    at a few scan steps however large the file is.  The data stays in the page cache (a later
    read maps it again); a read-only mapping loses nothing.  Sources without a map: no-op."""
    mm = getattr(src, "_mm", None)
    if mm is None or a.size == 0 or not hasattr(mm, "madvise"):
        return
    base = np.frombuffer(mm, np.uint8, count=1).__array_interface__["data"][0]
    start = a.__array_interface__["data"][0] - base
    span = sum((n - 1) * abs(st) for n, st in zip(a.shape, a.strides)) + a.itemsize
    if start < 0 or span > 2 * a.nbytes + SCAN_BYTES:  # interleaved view: its pages are shared
        return
    page = start // mmap.PAGESIZE * mmap.PAGESIZE
    end = min(len(mm), start + span)
    if end > page:
        mm.madvise(mmap.MADV_DONTNEED, page, end - page)


def _padding_mask(p: Any, bits: int, length: int, nwords: int) -> np.ndarray:
    """For a row of ``length`` codes stored in ``nwords`` containers: the padding bits of each
    container (spare slot bits, the row's tail, alignment words).  pack(unpack(w)) == w exactly
    where ``w & mask == 0``, so a container has stray padding when it meets this mask."""
    mask = np.full(nwords, (1 << p.container) - 1, dtype=p.word_dtype)
    if length:
        used = pack_rows(np.full((1, length), (1 << bits) - 1, np.uint8), bits, p)[0]
        k = min(nwords, used.size)
        mask[:k] &= ~used[:k]
    return mask


def _check_codes(name: str, desc: Descriptor, src: Any, field_prefix: str) -> list[QFormatError]:
    probs: list[QFormatError] = []
    p, el = desc.codes.packing, desc.codes.element
    bits = el.bits
    _, length, wpr = codes_shape(desc)
    words = src.array(desc.codes.tensor).view(p.word_dtype)
    _, valid = element_table(desc, src)
    bad_pad = 0
    max_code = -1
    # Every code is valid unless a codebook table is shorter than 2**bits; then codes are unpacked.
    need_codes = valid < (1 << bits)
    if p.axis is not None:
        if words.size == 0:  # no rows: nothing to scan (and no row-sized mask to allocate)
            return probs
        # Padding sits at the same bits of every row: test only the containers that have any.
        # (A row's mask is no larger than the stored row, which the file holds.)
        mask = _padding_mask(p, bits, length, wpr)
        cols = np.flatnonzero(mask)
        for block in _iter_row_blocks(words, p.axis, wpr):
            if cols.size == wpr:
                bad_pad += int(np.count_nonzero(np.asarray(block) & mask))
            elif cols.size:
                bad_pad += int(np.count_nonzero(np.asarray(block[:, cols]) & mask[cols]))
            if need_codes and length:
                codes = unpack_rows(np.asarray(block), bits, p, length)
                if codes.size:
                    max_code = max(max_code, int(codes.max()))
            _release(src, block)
        if bad_pad:
            probs.append(error("PADDING_NONZERO", f"{bad_pad} packed containers have padding bits set to 1; writers must leave padding zero", tensor=name, field=f"{field_prefix}codes.tensor"))
        if max_code >= valid:
            probs.append(error("CODE_OUT_OF_RANGE", f"code {max_code} is past the end of the {valid}-entry codebook", tensor=name, field=f"{field_prefix}codes.tensor"))
        return probs
    for block in _iter_row_blocks(words, p.axis, wpr):
        if p.axis is None:
            # One long row: walk it in whole alignment units.
            block = block.reshape(-1)
            unit = p.element_alignment(bits)
            unit_words = max(1, p.words_for(unit, bits))
            units_per_step = max(1, (SCAN_BYTES // words.dtype.itemsize) // unit_words)
            # Whole units with no padding bit and no codebook limit cannot fail: only the tail is read.
            skip_whole = not need_codes and not _padding_mask(p, bits, unit, p.words_for(unit, bits)).any()
            e = 0
            while e < length:
                n = min(length - e, units_per_step * unit)
                w0 = p.words_for(e, bits)
                last = e + n >= length
                if skip_whole and not last:
                    e += n
                    continue
                w1 = block.size if last else w0 + p.words_for(n, bits)
                seg = np.asarray(block[w0:w1])[None, :]
                codes = unpack_rows(seg, bits, p, n)
                if last:
                    # The final unit carries the row's tail padding and alignment words.
                    rep = np.zeros_like(seg)
                    packed = pack_rows(codes, bits, p)
                    rep[:, : packed.shape[1]] = packed[:, : seg.shape[1]]
                else:
                    rep = pack_rows(codes, bits, p)
                bad_pad += int(np.count_nonzero(rep != seg))
                if codes.size:
                    max_code = max(max_code, int(codes.max()))
                _release(src, block[w0:w1])
                e += n
            if length == 0 and block.size:
                bad_pad += int(np.count_nonzero(block))
            continue
        block = np.asarray(block)
        codes = unpack_rows(block, bits, p, length)
        bad_pad += int(np.count_nonzero(pack_rows(codes, bits, p) != block))
        if codes.size:
            max_code = max(max_code, int(codes.max()))
    if bad_pad:
        probs.append(error("PADDING_NONZERO", f"{bad_pad} packed containers have padding bits set to 1; writers must leave padding zero", tensor=name, field=f"{field_prefix}codes.tensor"))
    if max_code >= valid:
        probs.append(error("CODE_OUT_OF_RANGE", f"code {max_code} is past the end of the {valid}-entry codebook", tensor=name, field=f"{field_prefix}codes.tensor"))
    return probs


def _check_values(name: str, desc: Descriptor, prm: Param, vals: np.ndarray, field: str, int_dtype: bool) -> list[QFormatError]:
    probs = []
    if int_dtype:
        big = np.abs(vals.astype(np.int64)) > tables.limits()["max_int_param_magnitude"]
        if big.any():
            probs.append(error("PARAM_INT_RANGE", f"{int(big.sum())} values exceed {tables.limits()['max_int_param_magnitude']} in magnitude", tensor=name, field=field))
        if prm.op == "divide" and (vals == 0).any():
            probs.append(error("PARAM_DIVISOR_ZERO", f"{int((vals == 0).sum())} divisor scale values are zero", tensor=name, field=field))
        return probs
    f32 = vals.astype(np.float32)
    if not desc.allow_nonfinite_params:
        nf = ~np.isfinite(f32)
        if nf.any():
            i = int(np.flatnonzero(nf.reshape(-1))[0])
            probs.append(error("PARAM_NONFINITE", f"{int(nf.sum())} {prm.role} values are NaN or infinite (first at flat index {i}: {f32.reshape(-1)[i]})", tensor=name, field=field))
    if prm.op == "divide":
        z = f32 == 0
        if z.any():
            probs.append(error("PARAM_DIVISOR_ZERO", f"{int(z.sum())} divisor scale values are zero", tensor=name, field=field))
    return probs


def _stored(src: Any, name: str) -> np.ndarray:
    """A stored component's values; an empty one of a shape no array can hold as an empty vector
    (a component is never refused for it, SPEC.md §2.2)."""
    try:
        return src.array(name)
    except QFormatError as e:
        if e.code != "SHAPE_UNREPRESENTABLE":
            raise
        from . import dtypes as _dt

        return np.zeros(0, _dt.storage_numpy(src.info(name).dtype))


def check_payload(name: str, desc: Descriptor, src: Any, field_prefix: str = "") -> list[QFormatError]:
    """Payload problems of one valid descriptor (recursing into encoded parameters)."""
    desc, src = canonical_view(desc, src)  # a device layout is checked through its canonical component (§11)
    # an empty logical tensor has no codes to check; its components may be empty arrays no array
    # type can hold, which are never refused (SPEC.md §2.2, 1.2.1: components are exempt)
    probs = _check_codes(name, desc, src, field_prefix) if math.prod(desc.shape) else []
    for prm in desc.params():
        f = f"{field_prefix}{prm.role}"
        gi = prm.blocks.index
        if gi is not None:
            g = np.asarray(_stored(src, gi.tensor)).astype(np.int64)
            bad = (g < 0) | (g >= gi.count)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                probs.append(error("GROUP_INDEX_RANGE", f"{int(bad.sum())} group indices are outside 0..{gi.count - 1} (first at {i}: {int(g[i])})", tensor=name, field=f"{f}.blocks.index.tensor"))
        if prm.tensor is not None:
            info = src.info(prm.tensor)
            arr = _stored(src, prm.tensor).reshape(-1)
            step = max(1, SCAN_BYTES // max(1, arr.dtype.itemsize))
            seen: set[str] = set()
            for i in range(0, arr.size, step):
                for pr in _check_values(name, desc, prm, np.asarray(arr[i : i + step]), f"{f}.tensor", info.dtype in INT_PARAM_DTYPES):
                    if pr.code not in seen:
                        seen.add(pr.code)
                        probs.append(pr)
                _release(src, arr[i : i + step])
        elif prm.encoded is not None:
            enc = prm.encoded
            sub = check_payload(name, enc, src, f"{f}.encoded.")
            probs.extend(sub)
            if not sub:
                try:
                    vals = decode(enc, src, None, tensor=name)
                except QFormatError as e:
                    probs.append(e)
                    continue
                probs.extend(_check_values(name, desc, prm, vals, f"{f}.encoded", False))
    return probs


def not_safetensors(path: str) -> QFormatError | None:
    """``NOT_SAFETENSORS`` for a local file that SPEC.md §2.3 says is no safetensors file at all
    (its length prefix fails check 2 or 3, and its first bytes are a GGUF, ZIP or object-stream
    signature or text), saying what it is; None otherwise (a damaged safetensors file gets the
    container's own codes, from :func:`qformat.container.parse_header`, which applies the same
    rule)."""
    if is_url(path):
        return None  # a URL is read by ranges; parse_header applies the rule to its prefix
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    if size < 8:
        return None
    n = int.from_bytes(head, "little")
    if not (n > tables.limits()["max_header_bytes"] or n == 0 or 8 + n > size):
        return None
    what = not_safetensors_kind(head)
    return None if what is None else error("NOT_SAFETENSORS", f"{os.path.basename(path)} is {what}")


def open_source(path: str) -> tuple[Any, FileSource]:
    """``path``'s validated header and its stored tensors, read once: a local file is opened
    once, its header read and parsed through that open file and the same open file memory-mapped
    (:func:`qformat.container.read_mapped`), so what is checked is what is read; a URL's header
    is read by ranges and its sparse mirror mapped.  Errors as ``read_header`` then
    ``FileSource`` raise them."""
    if is_url(path):
        header = read_header(path)
        return header, FileSource(path, header)
    header, mm = read_mapped(path)
    return header, FileSource.from_bytes(mm, header, path)


def payload_problems(name: str, desc: Descriptor | None, src: Any) -> list[QFormatError]:
    """Every payload rule of ``qformat check`` for one tensor of a file (``desc`` None: a plain
    tensor).  The one function both :func:`check_file` and every command's admission of a
    source (:class:`Admission`) call: a rule added here is enforced everywhere."""
    if desc is None:
        return []
    return check_payload(name, desc, src)


class Admission:
    """``qformat check``'s rules for a checkpoint a command reads (the one rule, issue 24).

    :meth:`headers` refuses the checkpoint with the first problem ``check --header-only``
    reports (same code, tensor and field); :meth:`tensor` runs :func:`payload_problems` for
    the logical tensors a stored tensor belongs to, once each, when a command first reads it,
    so payload rules cost no extra pass over the file.  ``paths`` are the checkpoint's
    safetensors files; ``index`` its ``*.safetensors.index.json`` (or None); ``digests``: verify
    recorded digests too (SPEC.md §3.8; the commands do, model loaders only when asked)."""

    def __init__(self, paths: list[str], index: str | None = None, digests: bool = True):
        self.paths, self.index = paths, index
        self.verify = digests  # False: recorded digests are not verified (a loader without verify=)
        self.owners: dict[str, list[str]] = {}  # stored name -> logical names reading it
        self.descs: dict[str, Descriptor | None] = {}
        self.done: set[str] = set()
        self.refused: QFormatError | None = None  # the payload problem that refused the checkpoint
        #: logical (or plain) name -> (file, header, model) of a 1.2 file that records digests (SPEC.md §3.8)
        self.digested: dict[str, tuple[str, Any, Any]] = {}
        self.where: dict[str, str] = {}  # logical (or plain) name -> the file holding it
        self._sources: dict[str, FileSource] = {}
        #: path -> (header, source, model) of each admitted file: the one read and parse of its
        #: header that the rules were applied to, bound to one open file (see :meth:`open`)
        self._opened: dict[str, tuple[Any, FileSource, Any]] = {}

    def headers(self) -> None:
        if self.index is not None:
            reports, probs, opened = _check_index(self.index, payload=False, keep=True)
            found = probs + [p for r in reports for p in r.problems]  # check()'s order
        else:
            found, opened = [], {}
            for path in self.paths:
                rep, got = _check_file(path, payload=False)
                found += rep.problems
                if got is not None:
                    opened[path] = got
        if found:
            p = found[0]
            raise error(p.code, p.message, tensor=p.tensor, field=p.field)
        for path in self.paths:
            got = opened.get(path)  # the header check read: never read again (a file replaced since is not trusted)
            if got is None:  # a path the index spells otherwise: read here, as check reads it
                header, src = open_source(path)
                got = (header, src, interpret(header, src))
            header, src, model = self._opened[path] = got
            self._sources[path] = src
            for name, desc in model.descriptors.items():
                self.descs[name] = desc
                self.where[name] = path
                for _, ref in desc.references():
                    self.owners.setdefault(ref, []).append(name)
            for name in model.plain:
                self.descs.setdefault(name, None)
                self.where.setdefault(name, path)
                self.owners.setdefault(name, []).append(name)
            if model.digests is not None and self.verify:
                for name in [*model.descriptors, *model.plain]:
                    self.digested[name] = (path, header, model)

    def shard(self, path: str) -> Any:
        """The admitted file ``path`` as a :class:`qformat.checkpoint.Shard` of what
        :meth:`headers` read: the same header, interpretation and memory map (of the same open
        file) that the header rules passed, for ``SafeOpen(path, admission.shard(path))``
        (:func:`qformat.io.open_admitted`), so a load reads and parses each header once and a
        file replaced after its admission is never read under its admitted facts.  None for a
        path not admitted here (``SafeOpen(path, None)`` opens it anew)."""
        from .checkpoint import Shard

        got = self._opened.get(path)
        if got is None:
            return None
        header, src, model = got
        name = path.rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)
        return Shard(path, name, header, model, src)

    def _problems(self, name: str, src: Any) -> list[QFormatError]:
        """check's payload problems of ``name``, then its digest problems (SPEC.md §3.8: every
        command verifies the digests of what it reads, on the tensor's first read, as
        ``check --digests`` does; a verifying reader refuses the whole file for an algorithm it
        lacks, DIGEST_UNSUPPORTED, on its first read of any tensor of the file; ``--no-check``
        reads it as it is)."""
        probs = payload_problems(name, self.descs[name], src)
        at = self.digested.get(name)
        if at is not None:
            probs += tensor_digest_problems(*at, name)
        return probs

    def guards(self, stored: str) -> bool:
        """Whether reading ``stored`` still needs a payload check."""
        return any(n not in self.done for n in self.owners.get(stored, ()))

    def logical(self, name: str, src: Any) -> None:
        """Refuse with the first payload problem of the logical (or plain) tensor ``name``: a
        command that refuses a tensor for another reason (an export that cannot map it) calls
        this first, so a damaged tensor is refused as damaged, with check's code."""
        if name in self.descs and name not in self.done:
            self._admit(name, src)

    def check_logical(self, name: str) -> None:
        """:meth:`logical` for ``name``, read from the file that holds it (memory-mapped): for a
        loader that reads the file through another library (torch, transformers) but refuses
        what ``qformat check`` refuses, as the commands do."""
        path = self.where.get(name)
        if path is not None:
            self.logical(name, self._sources[path])

    def tensor(self, stored: str, src: Any) -> None:
        """Refuse with the first payload problem of the logical tensors ``stored`` belongs to."""
        for name in self.owners.get(stored, ()):
            if name not in self.done:
                self._admit(name, src)

    def _admit(self, name: str, src: Any) -> None:
        self.done.add(name)
        probs = self._problems(name, src)
        if probs:
            self.refused = probs[0]
            raise probs[0]


# -- files, folders, indexes ---------------------------------------------------------------
def digest_problems(path: str, header: Any, model: Any, names: Iterable[str] | None = None) -> list[QFormatError]:
    """The digest rule of ``qformat check`` (SPEC.md §3.8): DIGEST_UNSUPPORTED, DIGEST_MISMATCH
    for the stored tensors of one file (``names``: only these; default every one listed), each
    problem naming the logical tensor the stored tensor belongs to."""
    from .digests import verify

    return verify(path, header, model.digests, lambda s: model.components.get(s, s), names)


def tensor_digest_problems(path: str, header: Any, model: Any, name: str) -> list[QFormatError]:
    """The digest problems that refuse logical (or plain) tensor ``name`` of one file when a
    reader verifies it (SPEC.md §3.8): DIGEST_UNSUPPORTED (the whole file), and DIGEST_MISMATCH of
    its stored tensors and of ``name`` itself, when ``digests`` lists that logical name, which is
    no stored tensor (a digest is listed under stored names only).  The one rule of the
    ``verify=True`` readers and the commands, the same problems ``check --digests`` reports."""
    desc = model.descriptors.get(name)
    names = {name} | ({c for _, c in desc.references()} if desc is not None else set())
    return digest_problems(path, header, model, sorted(names))


def check_file(path: str, payload: bool = True, digests: bool | None = None, strict: bool = False) -> FileReport:
    """Check one safetensors file (``digests``: also verify the recorded digests, SPEC.md §3.8,
    which reads every stored byte once: off by default, since the other checks read only what
    they examine (a 2.16 GB file: 0.4 s without, 4.2 to 7.0 s with); ``strict``: also report
    what readers accept but writers never write, SPEC.md §2.4)."""
    return _check_file(path, payload, digests, strict)[0]


def _check_file(path: str, payload: bool = True, digests: bool | None = None,
                strict: bool = False) -> tuple[FileReport, tuple[Any, FileSource, Any] | None]:
    """:func:`check_file`'s report, with the (header, source, model) it checked (None when the
    header could not be read): for a caller that goes on to read the file (an index's rules,
    :class:`Admission`) without reading and parsing its header again."""
    digests = bool(digests)
    rep = FileReport(path)
    other = not_safetensors(path)
    if other is not None:
        rep.problems.append(_problem(other, path))
        return rep, None
    try:
        header, src = open_source(path)
    except QFormatError as e:
        rep.problems.append(_problem(e, path))
        return rep, None
    if strict:
        rep.problems.extend(_problem(e, path) for e in header.lenient)
    model = interpret(header, src)
    rep.plain = len(model.plain)
    rep.quantized = len(model.raw)
    rep.stored = len(header.entries)
    for e in model.problems():
        rep.problems.append(_problem(e, path))
    if payload and not model.file_problems:
        for name, desc in sorted(model.descriptors.items()):
            try:
                for e in payload_problems(name, desc, src):
                    rep.problems.append(_problem(e, path))
            except QFormatError as e:
                rep.problems.append(_problem(e, path))
    if digests and not model.file_problems:
        found = digest_problems(path, header, model)
        for e in found:
            rep.problems.append(_problem(e, path))
        listed = model.digests["tensors"] if model.digests else {}
        if any(e.code == "DIGEST_UNSUPPORTED" for e in found):
            rep.digests_verified = 0
        else:  # a mismatch names its stored tensor in the field: digests.tensors['NAME']
            bad = {e.field for e in found if e.code == "DIGEST_MISMATCH"}
            rep.digests_verified = sum(1 for n in listed if f"digests.tensors[{n!r}]" not in bad)
    return rep, (header, src, model)


def check_index(path: str, payload: bool = True, digests: bool | None = None,
                strict: bool = False) -> tuple[list[FileReport], list[Problem]]:
    """Check a sharded checkpoint through its ``*.safetensors.index.json``."""
    reports, probs, _ = _check_index(path, payload, digests, strict)
    return reports, probs


def _check_index(path: str, payload: bool = True, digests: bool | None = None, strict: bool = False,
                 keep: bool = False) -> tuple[list[FileReport], list[Problem], dict[str, tuple[Any, FileSource, Any]]]:
    """:func:`check_index`, each shard's header read and parsed once (for its file rules and the
    index's); ``keep``: also return shard path -> (header, source, model) of each shard read."""
    opened: dict[str, tuple[Any, FileSource, Any]] = {}
    try:
        index, found = scan_index(path)
    except QFormatError as e:
        return [], [_problem(e, path)], opened
    reports, probs = [], [_problem(e, path) for e in found]
    exposed: dict[str, str] = {}  # name a reader returns -> the first shard exposing it (§14)
    for shard in index.shards:
        sp = index.shard_path(shard)
        rep, got = _check_file(sp, payload, digests, strict)
        reports.append(rep)
        if got is None:  # its header could not be read: the file's report says why
            continue
        if keep:
            opened[sp] = got
        header, _, model = got
        probs.extend(_problem(e, path) for e in mismatches(index, shard, header, model))
        for name in model.logical_names():
            first = exposed.setdefault(name, shard)
            if first != shard:
                probs.append(_problem(error("INDEX_MISMATCH", f"tensor {name!r} appears in both {first!r} and {shard!r}",
                                            tensor=name, field="weight_map"), path))
    return reports, probs, opened


def check(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], payload: bool = True,
          digests: bool | None = None, strict: bool = False) -> Report:
    """Check files, folders (every ``*.safetensors`` inside, and any index) or index files.

    Returns a :class:`Report`; ``report.ok`` is true when there is no problem at all.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    report = Report()
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            names = sorted(os.listdir(p))
            listed = [n for n in names if n.endswith(INDEX_SUFFIX) or n.endswith(".safetensors")]
            for n in listed:  # the path policy: a link leaving the folder is reported, not read
                try:
                    source_file(p, n, code="FILE_UNREADABLE", what="file", single=True)
                except QFormatError as e:
                    report.problems.append(_problem(e, os.path.join(p, n)))
                    names.remove(n)
            indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
            covered: set[str] = set()
            for n in indexes:
                files, probs = check_index(os.path.join(p, n), payload, digests, strict)
                report.files.extend(files)
                report.problems.extend(probs)
                covered.update(os.path.basename(f.path) for f in files)
            for n in names:
                if n.endswith(".safetensors") and n not in covered:
                    report.files.append(check_file(os.path.join(p, n), payload, digests, strict))
            if not indexes and not any(n.endswith(".safetensors") for n in names):
                report.problems.append(Problem("FILE_UNREADABLE", p, None, None, f"folder {p!r} holds no .safetensors file"))
        elif is_index(p):  # for a URL, by its path: 'model.safetensors.index.json?download=1' is an index
            files, probs = check_index(p, payload, digests, strict)
            report.files.extend(files)
            report.problems.extend(probs)
        else:
            report.files.append(check_file(p, payload, digests, strict))
    for f in report.files:
        report.problems.extend(f.problems)
    return report


def report_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2)
