"""Scheme ``gguf``: llama.cpp's block types, encoded as ``llama-quantize`` encodes them.

``quantize(x, "gguf", type="Q4_K")`` runs ggml's reference quantizer of that type
(:mod:`.ggml_blocks`: the same bytes as ``quantize_row_<type>_ref``, which ``llama-quantize``
uses for every listed type when no importance matrix is given) over the rows of ``x`` (blocks
run along the last axis, as ggml's rows do) and describes the blocks exactly as ``qformat
convert`` describes a GGUF tensor of that type (:mod:`qformat.convert.gguf`): codes, ``F16``
block scales and minimums, and for the K-quants the nested 4/6/8-bit sub-block scales.  So
``qformat export --to gguf`` writes the very blocks back, byte for byte, and a reader decodes
them as gguf-py and llama.cpp do.

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (super-blocks
of 256), and the non-linear IQ4_NL (32) and IQ4_XS (256) and ternary TQ1_0, TQ2_0 (256), whose
blocks are those of ggml's ``quantize_iq4_nl`` / ``quantize_iq4_xs`` / ``quantize_row_tq*_ref``
(what llama-quantize calls) and whose descriptors are ``qformat convert``'s for them
(:mod:`qformat.convert.gguf_codes`); the last axis must be a multiple of the block.  The input is rounded to binary32 first
(float16 and bfloat16 are exact there; float64 rounds once), as llama.cpp reads its source.

``importance`` (optional): the tensor's importance vector, one value per column (what
``llama-quantize --imatrix`` takes from an importance matrix file, :mod:`qformat.imatrix`; for a
3-D tensor of experts, one vector per expert, ``[experts, columns]``).  The blocks are then
those of ggml's weighted quantizers (:mod:`.ggml_weighted`), byte for byte; Q8_0 ignores it,
as ggml does.  It shapes the choice of codes only: the descriptor is the same.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

import numpy as np

from .. import kernels
from ..errors import error
from ..qtensor import QTensor, rename_references
from . import _common
from ._common import check_choice
from .ggml_blocks import ALL_TYPES, SIZES, TYPES, quantize_blocks
from .ggml_weighted import quantize_rows_weighted
from .registry import Planned, register

#: ggml type ids (ggml.h's ``enum ggml_type``) of the types this scheme writes.
TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
            "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
            "IQ4_NL": 20, "IQ4_XS": 23, "TQ1_0": 34, "TQ2_0": 35}
#: Elements a worker quantizes per call (bounds the temporaries: about 20 float32 arrays of it).
CHUNK_ELEMENTS = 1 << 18
_PREFIX = "t"
#: Inputs at or above this magnitude are refused: ggml squares values in binary32 (overflow
#: from 1.8e19 makes NaN scales, and its quantizers then write zero blocks without a word);
#: every type's F16 parameters overflow long before, which :func:`_check_finite` reports.
MAX_MAGNITUDE = 2.0**63


def _check(shape: tuple[int, ...], type_name: Any) -> str:
    t = check_choice("type", type_name, ALL_TYPES)
    block = SIZES[t][0]
    if len(shape) < 1 or shape[-1] % block:
        found = f"shape {list(shape)}" if shape else "a scalar"
        raise error("ENCODE_PARAM_INVALID", f"type {t} needs rows (the last axis) of a multiple of {block} elements; found {found}",
                    field="type")
    return t


def _described(shape: tuple[int, ...], t: str, blocks: np.ndarray | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(descriptor, lazy components by local name) of ``blocks`` as qformat convert describes a
    GGUF tensor of type ``t`` (``blocks`` None: planning, from the shape alone)."""
    from ..convert import gguf_codes
    from ..convert.base import Described  # the converter imports this package's helpers
    from ..convert.gguf import _describe, _grid, lazy
    from ..convert.gguf_file import TensorInfo

    out = Described()
    info = TensorInfo(_PREFIX, shape, TYPE_IDS[t], 0, 0, 0)
    if TYPE_IDS[t] in gguf_codes.TYPES:  # IQ4_NL, IQ4_XS, TQ1_0, TQ2_0: codes computed from the blocks
        if blocks is None:  # planning: the descriptor reads only whether the F16 d are finite (zeros are)
            size = SIZES[t][1] * (math.prod(shape) // SIZES[t][0])
            gguf_codes.describe(out, info, lambda: np.zeros(size, np.uint8), _grid, lazy)
        else:
            gguf_codes.describe(out, info, lambda: blocks, _grid, lazy)
    else:
        _describe(out, info, (lambda: blocks) if blocks is not None else None)
    desc = out.descriptors[_PREFIX]
    local = {name: name[len(_PREFIX) + 1:] for name in out.added}
    desc = rename_references(desc, lambda n: local[n])
    desc["scheme"] = "gguf"
    comps = {local[n]: out.added.component(n) for n in out.added}
    return desc, comps


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_POOL_PREFIX = "qformat-gguf"


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: make a new pool there when needed."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _run_chunks(fn: Callable[[int, int], None], n: int, row_elements: int) -> None:
    """``fn(lo, hi)`` over the ``n`` rows in ranges of about :data:`CHUNK_ELEMENTS` elements, on
    one pool of ``_common.THREADS`` threads made once for this scheme (a checkpoint quantizes
    hundreds of tensors: a pool per tensor started and joined its threads each time).  ``fn``
    works on its own rows, so the bytes never depend on the split; called from one of the
    pool's own threads, or with one range, it runs inline.  Every range has finished when it
    returns (or raises the first range's error)."""
    global _POOL
    bounds = _bounds(n, row_elements, _common.THREADS)
    if _common.THREADS <= 1 or len(bounds) == 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        for lo, hi in bounds:
            fn(lo, hi)
        return
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_common.THREADS, thread_name_prefix=_POOL_PREFIX)
        pool = _POOL
    futures = [pool.submit(fn, lo, hi) for lo, hi in bounds]
    wait(futures)
    for f in futures:
        f.result()


#: A tensor of at least this many elements is split over the threads even when it is below
#: :data:`CHUNK_ELEMENTS` (a 576 x 192 projection is one chunk of 110592 otherwise: one thread).
SPLIT_ELEMENTS = 1 << 15


def _bounds(n: int, row_elements: int, threads: int) -> list[tuple[int, int]]:
    """Row ranges for :func:`_run_chunks`: at most about :data:`CHUNK_ELEMENTS` elements each, as
    many as a multiple of ``threads`` and of near equal size (ranges of 455, 455, 455 and 171
    rows kept one of two threads idle for a quarter of the tensor)."""
    if n <= 0:
        return [(0, 0)]
    rows_per = max(1, CHUNK_ELEMENTS // max(1, row_elements))
    k = -(-n // rows_per)
    if threads > 1 and n * row_elements >= SPLIT_ELEMENTS:
        k = -(-k // threads) * threads
    k = min(k, n)
    return [(n * i // k, n * (i + 1) // k) for i in range(k)]


@functools.lru_cache(maxsize=None)
def _native_has(t: str) -> bool:
    """Whether the built ``_ggml`` extension quantizes type ``t`` (the legacy and K types always;
    IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 since issue 42: an extension built before refuses them, and the
    NumPy path, which gives the same bytes, runs)."""
    if t in TYPES:
        return True
    block, size = SIZES[t]
    try:
        kernels.ggml_quantize(t, np.zeros(block, np.float32), np.empty(size, np.uint8))
    except ValueError:
        return False
    return True


#: The packed ``codes`` component's bits for the types whose codes ``_ggml.quantize`` writes along
#: with the blocks (issue 45 item 5: read out of the blocks afterwards they cost as much as the
#: quantizing); the bytes ``_ggml.extract_packed`` gives (tests compare them).
_FUSED_CODES = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q3_K": 3}


@functools.lru_cache(maxsize=None)
def _writes_codes(ext: Any) -> bool:
    """Whether the extension module ``ext``'s quantize takes the codes buffer (one built before
    issue 45 item 5 refuses it; then the codes are read out of the blocks)."""
    try:
        ext.quantize("Q4_0", np.zeros(32, np.float32), np.empty(18, np.uint8), -1, 0, np.empty(16, np.uint8))
    except (TypeError, ValueError):
        return False
    return True


def _check_finite(blocks: np.ndarray, t: str, shape: tuple[int, ...]) -> None:
    """ENCODE_INPUT_INVALID when a block's F16 ``d`` / ``m`` / ``dmin`` overflowed (values
    beyond what the type's F16 parameters can scale; ggml would write Inf there and its own
    validation of the file refuse it)."""
    from ..convert import gguf_codes
    from ..convert.gguf import TYPES as LAYOUTS

    if TYPE_IDS[t] in gguf_codes.TYPES:
        d_of = gguf_codes.TYPES[TYPE_IDS[t]].d
        assert d_of is not None
        params = [d_of(blocks).view(np.uint16)]
    else:
        spec = LAYOUTS[TYPE_IDS[t]]
        params = [blocks[:, o].astype(np.uint16) | (blocks[:, o + 1].astype(np.uint16) << 8)
                  for o in (spec.d, spec.m, spec.dmin) if o is not None]
    for bits in params:
        bad = np.flatnonzero((bits & 0x7C00) == 0x7C00)
        if bad.size:
            block = SIZES[t][0]
            raise error("ENCODE_INPUT_INVALID", f"type {t}: the F16 block parameters of {bad.size} block(s) overflow (the first: "
                        f"elements {bad[0] * block}..{bad[0] * block + block - 1} of the flattened {list(shape)}); "
                        f"its values are too large for {t}'s F16 scales")


def _importance(shape: tuple[int, ...], importance: Any) -> np.ndarray | None:
    """The importance vectors as float32 [experts, columns] (experts 1 unless a 3-D tensor gives
    one per expert), or None; ENCODE_PARAM_INVALID for a wrong shape or a non-finite value."""
    if importance is None:
        return None
    try:
        w = np.asarray(importance, dtype=np.float32)
    except (TypeError, ValueError):
        raise error("ENCODE_PARAM_INVALID", f"importance must be an array of numbers, found {type(importance).__name__}",
                    field="importance") from None
    cols = shape[-1] if shape else 0
    experts = shape[0] if len(shape) == 3 else 1
    if w.size == cols:
        w = w.reshape(1, cols)
    elif len(shape) == 3 and w.size == experts * cols:
        w = w.reshape(experts, cols)
    else:
        per = f" or {experts} x {cols} (one per expert)" if len(shape) == 3 else ""
        raise error("ENCODE_PARAM_INVALID", f"importance has {w.size} values, expected {cols} (one per column of the last axis){per}",
                    field="importance")
    if not np.isfinite(w).all():
        raise error("ENCODE_PARAM_INVALID", "importance holds NaN or infinite values, expected finite ones", field="importance")
    return np.ascontiguousarray(w)


def plan(shape: tuple[int, ...], dtype: str, type: Any = "Q4_K", importance: Any = None) -> Planned:  # noqa: A002 (the parameter's name)
    t = _check(shape, type)
    _importance(shape, importance)
    desc, comps = _described(shape, t, None)
    desc["dtype"] = dtype
    return desc, {k: (c.spec.dtype, tuple(c.spec.shape)) for k, c in comps.items()}


@register("gguf", plan, proxy_row=2 * 256)
def encode(x: np.ndarray, *, dtype: str, type: Any = "Q4_K", importance: Any = None) -> QTensor:  # noqa: A002
    shape = tuple(x.shape)
    t = _check(shape, type)
    qw = _importance(shape, importance)
    block, size = SIZES[t]
    rows = x.reshape(math.prod(shape[:-1]), shape[-1])
    per_expert = rows.shape[0] // qw.shape[0] if qw is not None and qw.shape[0] > 1 else rows.shape[0] or 1
    per_row = shape[-1] // block * size
    blocks = np.empty((rows.shape[0], per_row), np.uint8)

    def too_large(top: float) -> None:
        if top >= MAX_MAGNITUDE:
            raise error("ENCODE_INPUT_INVALID", f"type {t}: values of magnitude {top:.4g} overflow ggml's quantizers (squares beyond "
                        f"binary32, F16 scales beyond 65504); they take magnitudes below {MAX_MAGNITUDE:.4g}")

    # the packed codes written by the quantizer with the blocks, where it can (else read out of
    # the blocks below, by _native_fields or the converter's producers: the same bytes)
    codes = d = m = None
    if (qw is None and t in _FUSED_CODES and per_row and rows.shape[0] and rows.dtype.name in kernels._GGML_SOURCES
            and kernels.ggml_available() and _writes_codes(kernels._ggml)):
        codes = np.empty((rows.shape[0], shape[-1] * _FUSED_CODES[t] // 8), np.uint8)
        if block == 32:  # and the F16 block parameters, the scale and bias components' bytes
            d = np.empty((rows.shape[0], shape[-1] // block), np.float16)
            m = np.empty_like(d) if t in ("Q4_1", "Q5_1") else None

    tops: list[float] = []  # the fused path's largest magnitudes, one per part

    def part(lo: int, hi: int) -> None:
        if hi == lo or per_row == 0:
            return
        native = kernels.ggml_available() and _native_has(t)
        if qw is None and native and rows.dtype.name in ("float32", "float16", "bfloat16"):
            # the C kernel reads float16 / bfloat16 rows as stored (exact in binary32) and
            # returns their largest magnitude: one pass over the source, no float32 copy
            xr = np.ascontiguousarray(rows[lo:hi])
            if codes is not None:
                top = kernels._ggml.quantize(t, xr, blocks[lo:hi], -1, kernels._GGML_SOURCES[xr.dtype.name], codes[lo:hi],
                                             None if d is None else d[lo:hi], None if m is None else m[lo:hi])
                too_large(top)
                tops.append(top)
            else:
                too_large(kernels.ggml_quantize(t, xr, blocks[lo:hi]))
            return
        xr = np.asarray(rows[lo:hi], np.float32)  # binary32, as ggml reads its rows
        too_large(max(float(xr.max()), -float(xr.min())))  # no |x| temporary
        if qw is not None:  # llama-quantize --imatrix: ggml's weighted quantizers, row by row
            a = lo
            while a < hi:  # the rows of one expert at a time, each expert with its vector
                b = min(hi, (a // per_expert + 1) * per_expert)
                w, xs = qw[a // per_expert], np.ascontiguousarray(xr[a - lo:b - lo])
                if native:
                    kernels.ggml_quantize_weighted(t, xs, w, blocks[a:b])
                else:
                    blocks[a:b] = quantize_rows_weighted(xs, t, w)
                a = b
        elif native:  # the same bytes, about 3-40x faster (bench/)
            kernels.ggml_quantize(t, np.ascontiguousarray(xr), blocks[lo:hi])
        else:
            blocks[lo:hi] = quantize_blocks(xr.reshape(-1, block), t).reshape(hi - lo, per_row)

    _run_chunks(part, rows.shape[0], shape[-1])
    # The F16 parameters of these types are bounded by the input: |d| <= 2 max|x| / 15 and
    # |m| <= max|x| (Q4_1, Q5_1), |d| <= max|x| / 8 (Q4_0, Q5_0), and Q3_K's d about max|x| / 32
    # (each sub-block scale sum(w x l) / sum(w l^2) is at most max|x| as |l| <= l^2): below
    # 1024 none reaches F16's 65504, so the blocks need no second look.
    if codes is None or len(tops) == 0 or not max(tops) < 1024.0:
        _check_finite(blocks.reshape(-1, size), t, shape)
    desc, comps = _described(shape, t, blocks.reshape(-1))
    desc["dtype"] = dtype
    done = {}
    for local, a, dt in (("codes", codes, "U8"), ("scale", d, "F16"), ("bias", m, "F16")):
        c = comps.get(local)
        if a is not None and c is not None and c.spec.dtype == dt and tuple(c.spec.shape) == tuple(shape[:-1]) + a.shape[1:]:
            done[local] = a.reshape(c.spec.shape)
    fast = {**_native_fields(t, shape, blocks.reshape(-1, size), comps, skip=tuple(done)), **done}
    return QTensor(desc, {k: fast[k] if k in fast else c.produce() for k, c in comps.items()})


def _native_fields(t: str, shape: tuple[int, ...], blocks: np.ndarray, comps: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The packed code components (``codes``, and a K-quant's ``scale.codes`` / ``bias.codes``)
    read out of the blocks by ``_ggml.extract_packed`` in one pass, where the native extension has
    it: the bytes the converter's producers give (``_Field.extract_packed``; tests compare them),
    about 5x faster for the 5-bit types.  Empty (the converter's producers run) for another type,
    without the extension, or where a component's shape is not the packed rows this expects;
    the components named in ``skip`` (already written by the quantizer) are left out."""
    from ..convert import gguf_codes
    from ..convert.gguf import TYPES as LAYOUTS

    if TYPE_IDS[t] in gguf_codes.TYPES or not kernels.ggml_available() or not shape or not blocks.size:
        return {}
    native = getattr(kernels._ggml, "extract_packed", None)
    if native is None:
        return {}
    from ..export.gguf import _runs_array

    layout = LAYOUTS[TYPE_IDS[t]]
    nb = blocks.shape[0]
    rows = math.prod(shape[:-1])
    out: dict[str, np.ndarray] = {}
    for local, f, length in (("codes", layout.codes, shape[-1]),
                             ("scale.codes", layout.sc, shape[-1] // layout.sub if layout.sub else 0),
                             ("bias.codes", layout.mins, shape[-1] // layout.sub if layout.sub else 0)):
        c = comps.get(local)
        if c is None or f is None or local in skip:
            continue
        count = int(f.parts[0][0].size)
        want = tuple(shape[:-1]) + (-(-length * f.bits // 8),)
        if (length <= 0 or length % count or nb * count != rows * length or c.spec.dtype != "U8" or tuple(c.spec.shape) != want):
            return {}
        a = np.empty(want, np.uint8)
        flat, runs, bpr = a.reshape(rows, -1), _runs_array(f), length // count

        def part(lo: int, hi: int, flat: np.ndarray = flat, runs: np.ndarray = runs, bpr: int = bpr, f: Any = f, count: int = count,
                 length: int = length) -> None:
            if hi > lo:
                native(blocks[lo * bpr : hi * bpr], (hi - lo) * bpr, runs, count, f.bits, length, flat[lo:hi])

        _run_chunks(part, rows, length)
        out[local] = a
    return out
