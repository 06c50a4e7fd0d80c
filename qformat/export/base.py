"""What every export target shares: a tensor's pieces, the mapping contract, the exactness check.

Export runs the other way from :mod:`qformat.convert`: a qformat checkpoint (anything qformat
reads, including sources converted in place) becomes a checkpoint in another ecosystem's
format.  One module per target format holds one :class:`Target` subclass; for each tensor it
decides, from the descriptor alone (no bytes read), the target form the tensor takes
(:class:`Mapped`) or why there is none (:class:`Refusal`).  When the writer reaches the
tensor, :meth:`Mapped.build` makes the target's arrays from the tensor's :class:`Parts` (its
codes and parameter grids) and :meth:`Mapped.decode`, the target's own dequantization written
down in NumPy (tests compare it with the target library), decodes them again.  Export is exact
when that gives the same binary32 bits as qformat's decoding of the source (NaN by class); so
every claim of exactness is checked on the actual data, tensor by tensor, and never rests on
the structural match alone.  Otherwise the tensor is refused (``EXPORT_NOT_EXACT``), unless the
caller allowed rounding, in which case its max abs difference and SQNR are reported.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from ..container import TensorSpec
from ..decode import decode, decode_full
from ..descriptor import Descriptor, Param
from ..elements import Element
from ..errors import QFormatError, error
from ..regions import element_table, full_region, grid_array, plan_codes, read_codes
from ..sources import Source


class Refusal(Exception):
    """A tensor has no exact form in the target: ``reason`` says which feature does not map."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# -- a tensor's pieces ---------------------------------------------------------------------------
class Parts:
    """A qformat tensor's pieces, as a target needs them: the code grid, the parameter grids
    (stored values, or binary32 values, or the nested tensor of an encoded parameter) and the
    decoded binary32 values.  A device layout is taken to its canonical view once, here.

    ``rows`` (``(r0, r1)`` on axis 0, or None for the whole tensor) restricts every read to
    those rows: codes, parameter grids (whose blocks must then be one row tall: the caller
    checks, :func:`row_chunkable`), nested tensors and the decoded values, so a target can build
    and check a tensor a slice of rows at a time (:func:`checked_chunks`)."""

    def __init__(self, desc: Descriptor | None, src: Source, name: str | None = None, rows: tuple[int, int] | None = None):
        from ..layouts import canonical_view

        self.name = name
        self.original = desc
        self.rows = rows
        if desc is None:  # a plain tensor: only ``src`` is used
            self.desc, self.src = desc, src  # type: ignore[assignment]
        else:
            self.desc, self.src = canonical_view(desc, src)

    def row_slice(self, r0: int, r1: int) -> "Parts":
        """These parts restricted to rows ``r0:r1`` of axis 0 (the canonical view is shared)."""
        p = object.__new__(Parts)
        p.name, p.original, p.desc, p.src, p.rows = self.name, self.original, self.desc, self.src, (r0, r1)
        return p

    def region(self) -> tuple[tuple[int, int], ...]:
        """The logical region these parts read: every element, or the rows of :attr:`rows`."""
        full = full_region(self.desc.shape)
        return full if self.rows is None else (self.rows,) + tuple(full[1:])

    @property
    def element(self) -> Element:
        return self.desc.codes.element

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.desc.shape)

    def codes(self) -> np.ndarray:
        """The code of every logical element (uint8, the logical shape): the stored bit
        pattern, before the element encoding turns it into a value."""
        return fast_codes(self.desc, self.src, self.region())

    def element_values(self) -> np.ndarray:
        """The binary32 value of each of the 2^bits codes (§6), from the element (or its table)."""
        return element_table(self.desc, self.src)[0]

    def param(self, role: str) -> Param | None:
        return getattr(self.desc, role)

    def grid(self, role: str) -> np.ndarray:
        """A stored parameter's values over its grid, in grid axis order and in the storage dtype."""
        p = self._param(role)
        if p.encoded is not None:
            raise Refusal(f"the {role} is encoded (a nested descriptor), not stored")
        box = None
        if self.rows is not None:
            box = full_region(p.blocks.grid_shape(self.desc.shape))
            sizes = block_sizes(p, self.shape)
            if sizes is None or (sizes[0] != 1 and self.shape[0] != 1):
                raise ValueError(f"the {role}'s blocks are not one row tall; the tensor cannot be read by rows")
            box = ((self.rows[0], self.rows[1]) if sizes[0] == 1 else (0, 1),) + tuple(box[1:])
        return np.ascontiguousarray(grid_array(p, self.desc, self.src, box))

    def storage(self, role: str) -> str:
        """The safetensors dtype a stored parameter is kept in (``F16``, ``F32``, ...)."""
        p = self._param(role)
        if p.tensor is None:
            raise Refusal(f"the {role} is encoded (a nested descriptor), not stored")
        info = self.src.info(p.tensor)
        if info is None:
            raise error("CONVERT_SOURCE_INVALID", f"tensor {p.tensor!r} is not in the checkpoint", tensor=self.name)
        return info.dtype

    def values(self, role: str) -> np.ndarray:
        """A parameter's binary32 values over its grid (SPEC.md §9: stored values widened, or
        the nested descriptor decoded to its own dtype and widened)."""
        p = self._param(role)
        if p.encoded is not None:
            return self.nested(role).decoded(own_dtype=True)
        a = self.grid(role)
        st = self.storage(role)
        return widen(a, st)

    def nested(self, role: str) -> "Parts":
        """The nested tensor of an encoded parameter."""
        p = self._param(role)
        if p.encoded is None:
            raise Refusal(f"the {role} is stored, not encoded")
        return Parts(p.encoded, self.src, self.name, self.rows)

    def decoded(self, own_dtype: bool = False) -> np.ndarray:
        """The tensor decoded (§10) in binary32, before the conversion to its logical dtype
        (``own_dtype``: converted to the logical dtype and widened back, as a nested parameter's
        values are).  A plain tensor (no descriptor): its stored values widened to binary32."""
        if self.desc is None:
            return np.asarray(self.src.array(self.name)).astype(np.float32)
        if self.rows is not None:
            region = self.region()
            if own_dtype:
                return np.asarray(decode(self.desc, self.src, region, tensor=self.name)).astype(np.float32)
            return np.asarray(decode(dataclasses.replace(self.desc, dtype="float32"), self.src, region, tensor=self.name))
        if own_dtype:
            out = decode_full(self.desc, self.src, tensor=self.name)
            return np.asarray(out).astype(np.float32)
        return np.asarray(decode_full(dataclasses.replace(self.desc, dtype="float32"), self.src, tensor=self.name))

    def _param(self, role: str) -> Param:
        p = getattr(self.desc, role)
        if p is None:
            raise Refusal(f"there is no {role}")
        return p


def _native_unpack() -> Any:
    """``_ggml.unpack`` when the native GGUF extension runs and has it (an extension built
    before it does not: the NumPy path reads the codes, the same ones), else None."""
    from .. import kernels

    if not kernels.ggml_available():
        return None
    return getattr(kernels._ggml, "unpack", None)


def fast_codes(desc: Descriptor, src: Source, region: tuple[tuple[int, int], ...]) -> np.ndarray:
    """:func:`~qformat.regions.read_codes` of ``region``, the common case in one native pass:
    codes packed as a little-endian bit stream in bytes along the last stored axis (``lsb_first``,
    container 8, no slot order or planes, no storage order; what ``qformat convert`` and scheme
    ``gguf`` store) are unpacked by ``_ggml.unpack`` (8-bit codes are the bytes themselves).
    Anything else, or without the extension, goes through ``read_codes``; both give the same codes."""
    plan = plan_codes(desc, region)
    p, bits = plan.packing, plan.bits
    unpack = _native_unpack()
    if (unpack is None or plan.axis is None or plan.axis != len(plan.words_shape) - 1 or plan.to_logical is not None
            or p.container != 8 or p.bit_order != "lsb_first" or p.slot_order is not None or p.planes_span is not None
            or not (p.straddle or 8 % bits == 0)):
        return read_codes(desc, src, region)
    words = np.asarray(src.array(plan.tensor)).view(np.uint8).reshape(plan.words_shape)[plan.box]
    lead = words.shape[:-1]
    rows = math.prod(lead)
    if bits == 8:
        codes = words[..., : plan.length]
    else:
        codes = np.empty(lead + (plan.length,), np.uint8)
        if rows and plan.length:
            unpack(np.ascontiguousarray(words).reshape(rows, words.shape[-1]), bits, rows, codes)
    return codes[..., plan.cut[0] : plan.cut[1]]


def widen(a: np.ndarray, storage: str) -> np.ndarray:
    """Stored parameter values in safetensors dtype ``storage`` widened to binary32 (§9.2)."""
    from ..dtypes import storage_numpy

    view = np.asarray(a).view(storage_numpy(storage)) if np.asarray(a).dtype != storage_numpy(storage) else np.asarray(a)
    if storage == "F8_E8M0":
        from ..elements import float_lut

        return float_lut("e8m0fnu")[view.view(np.uint8)]
    return view.astype(np.float32)


# -- structural helpers ----------------------------------------------------------------------------
def block_sizes(p: Param, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A grid parameter's block size per axis with ``None`` (whole axis) made the axis length,
    or None for flat blocks and group indexes (no target here has either)."""
    if p.blocks.type != "grid" or p.blocks.index is not None:
        return None
    return tuple(n if s is None else int(s) for n, s in zip(shape, p.blocks.size))  # type: ignore[arg-type]


def row_groups(p: Param | None, shape: tuple[int, ...]) -> int | None:
    """The group size along the last axis when ``p``'s blocks are one row of ``g`` elements
    (size 1 on every other axis; g may be the whole row), else None.  Row groups are what every
    target here stores: GGUF blocks, compressed-tensors and MLX groups, bitsandbytes blocks of a
    flattened weight are not (see :func:`flat_blocks`)."""
    if p is None or not shape:
        return None
    sizes = block_sizes(p, shape)
    if sizes is None:
        return None
    for s, n in zip(sizes[:-1], shape[:-1]):
        if s != 1 and n != 1:
            return None
    return sizes[-1]


def flat_blocks(p: Param | None) -> int | None:
    """The block size of a parameter with flat blocks (§8.3), else None."""
    if p is None or p.blocks.type != "flat":
        return None
    return int(p.blocks.size)  # type: ignore[arg-type]


def int_element(el: Element) -> tuple[int, str] | None:
    """(bits, signedness) of a plain integer element (no code offset, no fraction bits)."""
    if el.type != "int" or el.code_offset or el.frac_bits:
        return None
    return el.bits, str(el.signedness)


def require(ok: bool, reason: str) -> None:
    """Raise :class:`Refusal` with ``reason`` unless ``ok``."""
    if not ok:
        raise Refusal(reason)


# -- the mapping contract --------------------------------------------------------------------------
@dataclass
class Mapped:
    """One source tensor's form in the target, planned from its descriptor alone.

    ``kind`` names the target form for reports (``Q4_0``, ``pack-quantized int4 g32``,
    ``plain``).  ``specs`` are the target tensors (name, dtype, shape) in the target's own
    terms: safetensors dtypes and shapes for safetensors targets; for GGUF the dtype is the
    ggml type name.  ``build(parts)`` returns those tensors' arrays (by name) from the source
    tensor's :class:`Parts`.  ``decode(arrays)`` is the target's dequantization of them to
    binary32 in the source's logical shape (None: the arrays are the source's own values, a
    plain tensor copied).  ``info`` carries what the target gathers for its configuration
    (group size, bits, symmetric) and ``rename`` the target name of a plain tensor."""

    kind: str
    specs: list[TensorSpec]
    build: Callable[[Parts], Mapping[str, np.ndarray]]
    decode: Callable[[Mapping[str, np.ndarray]], np.ndarray] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: ``decode`` gives the target's values already converted to the source's logical dtype
    #: (widened to binary32), as a library that dequantizes in that dtype does: they are then
    #: compared with qformat's values in that dtype (``Parts.decoded(own_dtype=True)``), not
    #: with the binary32 step before it.
    in_dtype: bool = False
    #: ``build`` and ``decode`` work on any slice of rows (axis 0) as on the whole tensor (the
    #: built array's axis 0 is the tensor's rows, its blocks lie within a row): the target may
    #: then build, check and write the tensor a slice of rows at a time (:func:`checked_chunks`).
    row_chunks: bool = False


@dataclass
class Context:
    """What a target may consult while mapping: the source checkpoint (config.json,
    metadata, infos of stored tensors) and the caller's choices."""

    checkpoint: Any
    source: Source
    allow_rounding: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any] | None:
        return self.checkpoint.config if self.checkpoint is not None else None


class Target:
    """One target format.  Subclasses set ``name`` (the stable id ``--to`` takes) and
    ``title``, and implement :meth:`map`, :meth:`fallback` and :meth:`write`."""

    name: str = ""
    title: str = ""
    #: ``qformat.quantize`` settings (scheme, parameters) whose output this target holds
    #: exactly for any finite input: the generic export tests (tests/export/test_targets.py)
    #: run every target over each of them.
    exact_schemes: tuple[tuple[str, dict[str, Any]], ...] = ()

    def map(self, name: str, desc: Descriptor | None, ctx: Context) -> Mapped:
        """The target form of tensor ``name`` (``desc`` None: a plain tensor, whose stored
        dtype and shape ``ctx.source.info(name)`` gives), or :class:`Refusal`."""
        raise NotImplementedError

    def fallback(self, name: str, desc: Descriptor, ctx: Context) -> tuple[str, dict[str, Any]] | None:
        """For ``--allow-rounding``: the qformat scheme and parameters (``qformat.quantize``'s)
        whose output this target stores exactly, to re-encode a tensor that has no exact form;
        None when there is none."""
        return None

    def write(self, dst: str, plan: "ExportPlan", ctx: Context) -> list[str]:
        """Write the planned tensors (each produced when reached) as the target's checkpoint
        at ``dst``, atomically; returns the paths written."""
        raise NotImplementedError


# -- comparing --------------------------------------------------------------------------------------
@dataclass
class Comparison:
    """How a target's values compare with qformat's (binary32, NaN by class)."""

    exact: bool
    max_abs: float
    sqnr_db: float
    mismatches: int
    #: mismatches where both values are zeros of opposite sign (nothing else differs when equal)
    signed_zeros: int = 0


def compare(want: np.ndarray, got: np.ndarray, chunk: int = 1 << 18) -> Comparison:
    """Bit-for-bit comparison of binary32 arrays (any NaN matches any NaN), with the max abs
    difference over finite pairs and the SQNR of ``got`` against ``want`` for reports.  Works
    in chunks of ``chunk`` elements, so its temporaries stay small beside the tensor."""
    w = np.ascontiguousarray(want, np.float32).reshape(-1)
    g = np.ascontiguousarray(got, np.float32).reshape(-1)
    if w.shape != g.shape:
        raise ValueError(f"shapes differ: {np.shape(want)} vs {np.shape(got)}")
    # The figures (max abs difference, SQNR in float64) describe a difference: where every bit
    # matches (every export that maps exactly) they are 0 and infinity without computing them,
    # which was half of a GGUF export's time.
    if all(np.array_equal(w[lo : lo + chunk].view(np.uint32), g[lo : lo + chunk].view(np.uint32)) for lo in range(0, w.size, chunk)):
        return Comparison(True, 0.0, math.inf, 0, 0)
    mism, zeros, max_abs, sig, noise = 0, 0, 0.0, 0.0, 0.0
    for lo in range(0, w.size, chunk):
        wc, gc = w[lo : lo + chunk], g[lo : lo + chunk]
        same = (wc.view(np.uint32) == gc.view(np.uint32)) | (np.isnan(wc) & np.isnan(gc))
        mism += int(same.size - np.count_nonzero(same))
        if same.all():
            sig += float(np.dot(wc[np.isfinite(wc)].astype(np.float64), wc[np.isfinite(wc)].astype(np.float64)))
            continue
        zeros += int(np.count_nonzero(~same & (wc == 0) & (gc == 0)))
        fin = np.isfinite(wc) & np.isfinite(gc)
        w64, g64 = wc[fin].astype(np.float64), gc[fin].astype(np.float64)
        d = np.abs(w64 - g64)
        if d.size:
            max_abs = max(max_abs, float(d.max()))
        sig += float(np.dot(w64, w64))
        noise += float(np.dot(d, d))
    sqnr = math.inf if noise == 0 else (10 * math.log10(sig / noise) if sig > 0 else -math.inf)
    return Comparison(mism == 0, max_abs, sqnr, mism, zeros)


# -- the plan ----------------------------------------------------------------------------------------
@dataclass
class TensorExport:
    """One source tensor in the export: its name, the target form, the output file it goes
    to (safetensors targets keep the source's sharding), whether it was re-encoded for
    ``--allow-rounding``, and the producer of its target arrays (built and verified)."""

    name: str
    mapped: Mapped
    file: str
    produce: Callable[[], Mapping[str, np.ndarray]]
    reencoded: str | None = None
    #: for a target that writes as it goes (GGUF): the tensor's single target array in slices of
    #: rows, each built and checked before it is yielded (:func:`checked_chunks`); None: use
    #: ``produce``
    chunks: Callable[[], Iterator[np.ndarray]] | None = None


@dataclass
class ExportPlan:
    """Every tensor's export in source order, plus where results are recorded."""

    tensors: list[TensorExport]
    report: "Report"

    def by_file(self) -> dict[str, list[TensorExport]]:
        out: dict[str, list[TensorExport]] = {}
        for t in self.tensors:
            out.setdefault(t.file, []).append(t)
        return out


@dataclass
class TensorResult:
    name: str
    kind: str
    exact: bool
    max_abs: float = 0.0
    sqnr_db: float = math.inf
    reencoded: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "exact": self.exact}
        if not self.exact:
            d["max_abs_diff"] = self.max_abs
            d["sqnr_db"] = None if math.isinf(self.sqnr_db) else round(self.sqnr_db, 3)
        if self.reencoded:
            d["reencoded"] = self.reencoded
        return d


@dataclass
class Report:
    """What an export did, tensor by tensor (filled in as the writer produces each one)."""

    target: str = ""
    files: list[str] = field(default_factory=list)
    results: list[TensorResult] = field(default_factory=list)
    bytes: int = 0

    @property
    def rounded(self) -> list[TensorResult]:
        return [r for r in self.results if not r.exact]

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.kind] = out.get(r.kind, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "files": self.files, "bytes": self.bytes, "kinds": self.kinds(),
                "exact": all(r.exact for r in self.results), "rounded": [r.to_dict() for r in self.rounded]}


def not_exact(name: str, target: str, reason: str) -> QFormatError:
    """``EXPORT_NOT_EXACT``: the tensor's values differ in the target (no --allow-rounding)."""
    return error("EXPORT_NOT_EXACT", f"{target}: {reason}; pass --allow-rounding to export it anyway", tensor=name)


def unmappable(name: str, target: str, reason: str) -> QFormatError:
    """``EXPORT_UNMAPPABLE``: the target has no form that holds the tensor's descriptor."""
    return error("EXPORT_UNMAPPABLE", f"{target} cannot hold this tensor exactly: {reason}", tensor=name)


def checked(name: str, target: str, mapped: Mapped, parts: Callable[[], Parts], want: Callable[[Parts], np.ndarray],
            allow_rounding: bool, report: Report, reencoded: str | None = None) -> Callable[[], Mapping[str, np.ndarray]]:
    """The producer of a tensor's target arrays: build them from ``parts()``, decode them
    with the target's own rule, compare with ``want`` (qformat's binary32 values of the
    source) and record the result; a difference without ``allow_rounding`` raises
    ``EXPORT_NOT_EXACT``."""

    def produce() -> Mapping[str, np.ndarray]:
        p = parts()
        arrays = mapped.build(p)
        if mapped.decode is None:
            report.results.append(TensorResult(name, mapped.kind, True))
            return arrays
        got = mapped.decode(arrays)
        c = compare(want(p), got)
        del got
        if not c.exact and not allow_rounding and reencoded is None:
            how = "only in the sign of zero" if c.signed_zeros == c.mismatches else f"max abs difference {c.max_abs:.3g}"
            raise not_exact(name, target, f"{c.mismatches} values differ as {mapped.kind} ({how})")
        report.results.append(TensorResult(name, mapped.kind, c.exact and reencoded is None, c.max_abs, c.sqnr_db, reencoded))
        return arrays

    return produce


#: Elements a chunked export builds, decodes and compares at a time (a few MB of temporaries).
CHUNK_ELEMENTS = 1 << 19


def row_chunkable(mapped: Mapped, desc: Descriptor | None, allow_rounding: bool) -> bool:
    """Whether :func:`checked_chunks` can produce this tensor: a mapping that works on slices of
    rows, a tensor of two axes or more whose parameters' blocks are one row tall, and no
    rounding allowed (a rounded tensor's SQNR is reported over the whole tensor)."""
    if not mapped.row_chunks or desc is None or allow_rounding or len(desc.shape) < 2 or len(mapped.specs) != 1:
        return False

    def ok(d: Descriptor) -> bool:
        for p in (d.scale, d.bias, d.zero):
            if p is None:
                continue
            if p.encoded is not None:
                if not ok(p.encoded) or len(p.encoded.shape) != len(d.shape) or p.encoded.shape[0] != d.shape[0]:
                    return False
                continue
            sizes = block_sizes(p, tuple(d.shape))
            if sizes is None or (sizes[0] != 1 and d.shape[0] != 1):
                return False
        return True

    return ok(desc)


def checked_chunks(name: str, target: str, mapped: Mapped, parts: Callable[[], Parts], want: Callable[[Parts], np.ndarray],
                   report: Report, chunk_elements: int | None = None) -> Callable[[], Iterator[np.ndarray]]:
    """:func:`checked` for a tensor :func:`row_chunkable` accepts, a slice of rows at a time: each
    slice's target array is built, decoded with the target's rule, compared bit for bit with
    qformat's values of those rows and yielded, in order; so memory holds one slice's arrays,
    not the tensor's.  (Slices made on two threads measured no faster on a loaded 2-core machine
    and raised the peak by a second malloc arena's worth, about 30 MB on Gemma 3 270M.)  A
    difference raises ``EXPORT_NOT_EXACT`` (there is no rounding on this path)."""
    (spec,) = mapped.specs

    def one(p: Parts) -> np.ndarray:
        arrays = mapped.build(p)
        if mapped.decode is not None:
            got = mapped.decode(arrays)
            c = compare(want(p), got)
            del got
            if not c.exact:
                how = "only in the sign of zero" if c.signed_zeros == c.mismatches else f"max abs difference {c.max_abs:.3g}"
                raise not_exact(name, target, f"{c.mismatches} values differ as {mapped.kind} ({how})")
        return arrays[spec.name]

    def chunks() -> Iterator[np.ndarray]:
        whole = parts()
        shape = whole.shape
        per_row = max(1, math.prod(shape[1:]))
        d = whole.desc
        elements = chunk_elements or CHUNK_ELEMENTS
        if any(p is not None and p.encoded is not None for p in (d.scale, d.bias, d.zero)):
            # a two-level parameter's grid is decoded whole for every slice (SPEC.md 10.6):
            # at most 8 slices, so that costs at most half the tensor again
            elements = max(elements, shape[0] * per_row // 8)
        step = max(1, elements // per_row)
        for r0 in range(0, shape[0], step):
            yield one(whole.row_slice(r0, min(shape[0], r0 + step)))
        report.results.append(TensorResult(name, mapped.kind, True))

    return chunks


def plain_mapped(name: str, dtype: str, shape: Iterable[int], out_name: str | None = None) -> Mapped:
    """A plain tensor copied unchanged (its stored dtype and shape) under ``out_name``."""
    target = out_name or name
    spec = TensorSpec(target, dtype, tuple(int(s) for s in shape))

    def build(parts: Parts) -> Mapping[str, np.ndarray]:
        return {target: np.asarray(parts.src.array(name))}

    return Mapped("plain", [spec], build)
