"""Native decode kernels (issue 23): which path decodes, and the one call into the C kernel.

The C extension :mod:`qformat.kernels._native` (``_native.c``, built by the package's own
setuptools build as an *optional* extension) fuses a decode into one pass: packed bytes ->
element value (a 256-entry byte table) -> zero, scale, bias in binary32 -> one
round-to-nearest-even cast to float32 / float16 / bfloat16.  :mod:`qformat.decode` plans each
region (which bytes, which parameter cells; two-level parameters decoded first by the NumPy
reference) and calls :func:`fused`; whatever the kernel does not cover, or any machine where
the extension did not build, takes the NumPy reference path, which gives the same bits.

``QFORMAT_KERNELS`` (read at import) picks the path: unset or ``auto`` (the best level this CPU
has), ``numpy`` (never the native kernel), or a level name (``generic``, ``avx2``,
``avx512``).  :func:`info` says which path runs; :func:`use` switches it at run time (tests).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import numpy as np

try:  # the extension is optional: no compiler at install time leaves the NumPy path
    from . import _native  # type: ignore[attr-defined]

    _IMPORT_ERROR: str | None = None
except ImportError as e:  # pragma: no cover - exercised by the fresh-install check without a compiler
    _native = None
    _IMPORT_ERROR = ("qformat.kernels._native was not built (no C compiler at install time, or a platform it does not "
                     "support)" if "_native" in str(e) else str(e))

#: Parameter operations and column modes, as numbered in ``_native.c``.
OPS = {"subtract": 0, "multiply": 1, "divide": 2, "add": 3}
MODE_CONST, MODE_BLOCK, MODE_FLAT, MODE_COLS = 0, 1, 2, 3
OUT_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2}
LEVELS = ("generic", "avx2", "avx512")
#: Values per tile in ``_native.c`` (TILE): a planes span the kernel reads must divide it.
TILE = 1024

#: A decode's float32 output from this size up is written with non-temporal stores (``stream``
#: of :func:`fused`): it would not stay in cache for its reader anyway.
STREAM_FROM_BYTES = 16 << 20


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)``, on a 64-byte (cache line) boundary when it is at least
    :data:`STREAM_FROM_BYTES`: the kernel writes whole lines there (two 64-byte stores per 32
    values, none split across lines).  A smaller array is a plain ``np.empty``.  (A decode's own
    output is not streamed: see :func:`qformat.decode.decode`.)"""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n < STREAM_FROM_BYTES:
        return np.empty(shape, dt)
    raw = np.empty(n + 64, np.uint8)
    k = -raw.ctypes.data % 64
    return raw[k : k + n].view(dt).reshape(shape)


_enabled = False
_reason = ""


def _configure(choice: str) -> None:
    global _enabled, _reason
    choice = (choice or "auto").strip().lower()
    if _native is None:
        _enabled, _reason = False, f"the native extension is not built ({_IMPORT_ERROR})"
        return
    if choice == "numpy":
        _enabled, _reason = False, "QFORMAT_KERNELS=numpy"
        return
    level = _native.cpu_level() if choice == "auto" else choice
    if level not in LEVELS:
        raise ValueError(f"QFORMAT_KERNELS must be auto, numpy or one of {', '.join(LEVELS)}; found {choice!r}")
    _native.set_level(level)  # ValueError for a level this CPU lacks
    _enabled, _reason = True, "" if choice == "auto" else f"QFORMAT_KERNELS={choice}"


_configure(os.environ.get("QFORMAT_KERNELS", "auto"))


def enabled() -> bool:
    """True when decodes go through the native kernel (where it covers the descriptor)."""
    return _enabled


def info() -> dict[str, Any]:
    """Which decode path runs: ``path`` ("native" or "numpy"), ``level`` (the native kernel's
    instruction set level, None on the NumPy path), ``cpu_level`` (the best level this CPU and
    build have, None without the extension), ``built`` (whether the extension imported) and
    ``reason`` (why the NumPy path, or why a forced level); and ``matmul``: the packed-weight
    matmul's level name (None without its extension or with native kernels off), ``bf16``
    (AVX512_BF16 dot products for several bfloat16 rows), ``bf16_table`` (1 to 8 bfloat16 rows
    of scale-only 4-bit codes multiplied with the table in bfloat16 and each group's sum scaled
    once: int4 symmetric, nf4, mxfp4, nvfp4), ``amx`` (AMX tiles for several rows) and
    ``threads`` ("openmp": the process's OpenMP threads, torch's where torch is loaded; "pool":
    the extension's own)."""
    mm = matmul_available()
    return {
        "path": "native" if _enabled else "numpy",
        "level": _native.level() if _enabled and _native is not None else None,
        "cpu_level": _native.cpu_level() if _native is not None else None,
        "built": _native is not None,
        "reason": _reason,
        "matmul": {"level": LEVELS[matmul_level()] if mm else None, "bf16": mm and matmul_bf16(),
                   "bf16_table": mm and matmul_bf16() and bool(_matmul.bf1()),
                   "amx": mm and matmul_bf16() and matmul_amx(), "threads": _matmul.threading() if mm else None},
    }


@contextmanager
def use(choice: str) -> Iterator[None]:
    """Decode with ``choice`` ("numpy", "auto" or a level name) inside the block (not
    thread-safe: for tests and benchmarks)."""
    before = (_enabled, _reason, _native.level() if _native is not None else None)
    _configure(choice)
    try:
        yield
    finally:
        _restore(before)


def _restore(state: tuple[bool, str, str | None]) -> None:
    global _enabled, _reason
    _enabled, _reason = state[0], state[1]
    if _native is not None and state[2] is not None:
        _native.set_level(state[2])


def native_threads() -> bool:
    """Whether one :func:`fused` call can split its rows over native threads (POSIX builds)."""
    return _native is not None and bool(_native.threads())


def fused(codes: Any, stride: int, rows: int, cols: int, n: int, byte_table: Any,
          params: Sequence[tuple[Any, ...]], out: Any, out_kind: int, span: int = 0, stream: bool = False,
          six: bool = False, threads: int = 1) -> None:
    """One call of the C kernel on ``rows`` x ``cols`` values (see ``_native.c``): ``codes``
    (bytes, ``n`` codes per byte, rows ``stride`` bytes apart), ``byte_table`` (float32
    ``[256, n]``), ``params`` in decode order as ``(op, mode, values, rowoff, colidx, a, b[, value format])``
    (format 0: binary32 values, 1: binary16, 2: bfloat16, as uint16 bits),
    ``out`` (C-contiguous, ``out_kind``), ``span`` (0, or a planes span, SPEC.md 7.12), ``stream``
    (a float32 ``out`` too large to stay in cache: lines on a 64-byte boundary are written with
    non-temporal stores where the kernel's nibble rows apply; the same bits), ``six`` (6-bit codes,
    four in three bytes, least significant bits first: ``n`` is 1 and each row ``cols / 4 * 3``
    bytes; GGUF K-quants' sub-block scales and Q6_K's codes), ``threads`` (native threads that
    share the rows, each taking the next block of about 2 MiB of output, where
    :func:`native_threads`; the bits never depend on it).  Every size and
    parameter cell is range-checked in C (ValueError) before any byte is read."""
    if _native is None:
        raise RuntimeError(f"the native extension is not built ({_IMPORT_ERROR})")
    _native.decode(codes, stride, rows, cols, n, byte_table, params, out, out_kind, span, stream, six, threads)


_POOLS: dict[int, ThreadPoolExecutor] = {}


def pool(n: int) -> ThreadPoolExecutor:
    """A pool of exactly ``n`` threads, made once and reused (the decoder's chunks and the
    matmul's column ranges run on it; the kernels release the GIL)."""
    p = _POOLS.get(n)
    if p is None:
        p = _POOLS.setdefault(n, ThreadPoolExecutor(max_workers=n, thread_name_prefix="qformat-kernels"))
    return p


# -- the packed-weight matmul (``_matmul.c``) -------------------------------------------------------
try:  # optional like _native: without it QLinear decodes per forward
    from . import _matmul  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised by the fresh-install check without a compiler
    _matmul = None

#: Code kinds of the matmul kernel, as numbered in ``_matmul.c``.
#: ``lut6``: a 256-entry table whose codes are below 64 (6-bit codes one per byte, e.g. GGUF's Q6_K):
#: ``lut8`` everywhere but the one-row bfloat16-table path, which looks codes up from 64 entries.
MATMUL_KINDS = {"nib4": 0, "i8": 1, "u8": 2, "e4m3": 3, "e5m2": 4, "lut8": 5, "lut6": 6}
#: Largest group (columns per parameter value) the matmul kernel takes (``MAXG`` in ``_matmul.c``).
MATMUL_MAX_GROUP = 4096


def matmul_available() -> bool:
    """Whether :func:`matmul` can run (the extension built, and native kernels not switched off)."""
    return _matmul is not None and _enabled


def matmul_level() -> int:
    """The matmul kernel's level: 2 (AVX-512 F/BW/VL/DQ), 1 (AVX2 + FMA + F16C) or 0 (the
    portable loop): the best this CPU has, capped by the level the decode kernel is set to
    (:func:`use`), so that ``use("avx2")`` runs both on AVX2."""
    if _matmul is None:
        return 0
    cpu = int(_matmul.cpu_level())
    return cpu if _native is None else min(cpu, LEVELS.index(_native.level()))


def matmul_bf16() -> bool:
    """Whether :func:`matmul` with ``bf16=True`` may take bfloat16 dot products here: the
    matmul runs at level 2 (AVX-512) and the CPU has AVX512_BF16."""
    return _matmul is not None and matmul_level() == 2 and bool(_matmul.cpu_bf16())


def matmul_amx(enabled: bool | None = None) -> bool:
    """Whether several rows of bfloat16 x (``matmul(..., bf16=True)``) go to the AMX tile unit
    (AMX-BF16, where the CPU and OS allow it) rather than AVX512_BF16 dot products; ``enabled``
    False switches AMX off for this process (tests and benchmarks), True back on."""
    if _matmul is None:
        return False
    return bool(_matmul.amx() if enabled is None else _matmul.amx(int(bool(enabled))))


def matmul(x: Any, codes: Any, kind: str, table: Any, group: int, zero: Any, scale: Any, bias: Any, out: Any,
           threads: int | None = None, bf16: bool = False) -> Any:
    """``out[M, N] = x[M, K] @ W[N, K]^T`` with ``W`` packed (see ``_matmul.c``).

    ``x``: C-contiguous float32 ``[M, K]``; ``codes``: uint8 ``[N, K/2]`` (kind ``nib4``: two
    4-bit codes per byte, low nibble first) or ``[N, K]``; ``table``: float32, 16 or 256 element
    values; ``zero``/``scale``/``bias``: float32 ``[N, K/group]`` or None, applied in that order
    with binary32 steps (each weight equals qformat's decoded binary32 weight; the sums use FMA
    in the kernel's order); ``out``: C-contiguous float32 ``[M, N]``.  The N columns are split
    over ``threads`` threads (default: the CPU count, at most 8): the process's OpenMP threads
    where an OpenMP runtime (torch's) is loaded, else the extension's own pool (``_matmul.c``).

    ``bf16=True`` says that ``x`` holds bfloat16 values and that every nonzero weight is within
    bfloat16's normal range: several rows of x may then be multiplied with bfloat16 dot products
    (AVX512_BF16, where the CPU has it): each weight rounded to bfloat16 (nearest even), exact
    products, binary32 sums, subnormal partial sums flushed to zero (see ``_matmul.c``); and 1 to
    8 rows with 4-bit codes whose only parameter is a scale take the table rounded to bfloat16
    and each group's sum scaled once (the kernel's weight ``bf16(t) s``: the same one rounding)."""
    if _matmul is None:
        raise RuntimeError("the native matmul extension is not built")
    m, k = x.shape
    n = codes.shape[0]
    level = matmul_level()
    t = max(1, min(8, os.cpu_count() or 1) if threads is None else int(threads))
    # the extension splits the columns over its own native threads (whole 16 columns, at least
    # 64 per thread): Python's pool cost more per call than a small layer's whole product
    _matmul.matmul(x, m, k, codes, n, MATMUL_KINDS[kind], table, group, zero, scale, bias, out, 0, n, level, int(bool(bf16)), t)
    return out


# -- the GGUF block quantizers (``_ggml.c``) --------------------------------------------------------
try:  # optional like _native: without it qformat.schemes.gguf quantizes with its NumPy reference
    from . import _ggml  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised by the fresh-install check without a compiler
    _ggml = None


def ggml_available() -> bool:
    """Whether :func:`ggml_quantize` can run (the extension built, and native kernels not
    switched off with ``QFORMAT_KERNELS=numpy`` or :func:`use`)."""
    return _ggml is not None and (_enabled or (_native is None and _reason == ""))


#: _ggml.quantize's source kinds by NumPy dtype name (float16 and bfloat16 are read as stored).
_GGML_SOURCES = {"float32": 0, "float16": 1, "bfloat16": 2}


def ggml_quantize(type_name: str, x: Any, out: Any) -> float:
    """ggml's reference blocks of ``type_name`` for ``x`` (C-contiguous float32, float16 or
    bfloat16, whole blocks; the last two read as stored, without a float32 copy) into ``out``
    (writable uint8 of exactly the blocks' bytes), the GIL released: the bytes of
    :func:`qformat.schemes.ggml_blocks.quantize_blocks` of ``x`` as float32.  Returns the
    largest magnitude in ``x`` (for the caller's range check)."""
    if _ggml is None:
        raise RuntimeError("the native GGUF quantizer extension is not built")
    src = _GGML_SOURCES.get(getattr(getattr(x, "dtype", None), "name", ""))
    if src is None:
        raise TypeError(f"ggml_quantize takes float32, float16 or bfloat16 arrays, not {getattr(x, 'dtype', type(x))}")
    return float(_ggml.quantize(type_name, x, out, -1, src))


def ggml_quantize_weighted(type_name: str, x: Any, importance: Any, out: Any = None, level: int = -1) -> Any:
    """ggml's importance-weighted blocks (``quantize_<type>`` with quant_weights, what
    ``llama-quantize --imatrix`` writes) of the float32 rows ``x`` (C-contiguous, each of
    ``len(importance)`` elements) into ``out`` (uint8, exactly the rows' bytes; allocated when
    None, and returned), the GIL released: the bytes of
    :func:`qformat.schemes.ggml_weighted.quantize_rows_weighted`.  ``level`` as ``_ggml.quantize``'s:
    0 scalar, 1 lanes, 2 lanes in AVX2, -1 the best this CPU runs (every level writes the same bytes)."""
    if _ggml is None:
        raise RuntimeError("the native GGUF quantizer extension is not built")
    import numpy as np

    from ..schemes.ggml_blocks import SIZES

    block, size = SIZES[type_name]
    w = np.ascontiguousarray(importance, np.float32).reshape(-1)
    xa = np.ascontiguousarray(x, np.float32).reshape(-1, w.size)
    if out is None:
        out = np.empty((xa.shape[0], w.size // block * size), np.uint8)
    _ggml.quantize_weighted(type_name, xa, w, out, level)
    return out


# -- the int group encoders (``_encode.c``, issue 45 item 5) ----------------------------------------
try:  # optional like _native: without it qformat.schemes.int_ encodes with its NumPy path (the same bytes)
    from . import _encode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - exercised by the fresh-install check without a compiler
    _encode = None


def encode_available() -> bool:
    """Whether the native int group encoders run (the extension built, and native kernels not
    switched off with ``QFORMAT_KERNELS=numpy`` or :func:`use`)."""
    return _encode is not None and (_enabled or (_native is None and _reason == ""))


def encode_level() -> int:
    """The int encoders' level (0 baseline, 1 AVX2, 2 AVX-512): the best this CPU has, capped
    by the decode kernel's level (:func:`use`), as :func:`matmul_level`."""
    if _encode is None:
        return 0
    cpu = int(_encode.best_level())
    return cpu if _native is None else min(cpu, LEVELS.index(_native.level()))


# -- preparing a weight for the matmul kernel (``_matmul.c``'s last section; issue 42 item 6) ---------
#: unpack_codes' modes: whole slots, a least- or a most-significant-first bit stream (SPEC.md 7.2).
UNPACK_SLOTS, UNPACK_STREAM_LSB, UNPACK_STREAM_MSB = 0, 1, 2


def prepare_available() -> bool:
    """Whether :func:`unpack_codes` and :func:`weight_span` run natively (as :func:`matmul_available`:
    the extension built and native kernels not switched off); else their callers take torch ops."""
    return matmul_available() and hasattr(_matmul, "unpack_codes")


def unpack_codes(words: Any, stride: int, rows: int, length: int, bits: int, mode: int, shifts: bytes, out: Any,
                 nib: bool) -> Any:
    """The codes of ``rows`` rows of packed bytes (``words``, rows ``stride`` bytes apart, each
    row's codes from its first byte) into ``out``, the GIL released: uint8 ``[rows, length]``, or
    with ``nib`` ``[rows, length / 2]`` two codes per byte, low nibble first (what :func:`matmul`
    reads).  ``mode``: :data:`UNPACK_SLOTS` (``len(shifts)`` codes per byte, code ``j`` at right
    shift ``shifts[j % len(shifts)]``, slot order folded in), :data:`UNPACK_STREAM_LSB` or
    :data:`UNPACK_STREAM_MSB` (codes straddling bytes).  Sizes are checked in C (ValueError)."""
    if _matmul is None:
        raise RuntimeError("the native matmul extension is not built")
    _matmul.unpack_codes(words, int(stride), int(rows), int(length), int(bits), int(mode), bytes(shifts), out, bool(nib))
    return out


def weight_span(values: Any, zero: Any, scale: Any, bias: Any, cells: int) -> tuple[float, float]:
    """(smallest, largest) magnitude of the nonzero finite ``((v - z) * s) + b`` over every value
    ``v`` (float32, at most 256) and every cell's parameters (float32 ``[cells]`` each, or None:
    that step skipped), each step one binary32 rounding; ``(inf, 0.0)`` where there is none."""
    if _matmul is None:
        raise RuntimeError("the native matmul extension is not built")
    lo, hi = _matmul.weight_span(values, zero, scale, bias, int(cells))
    return float(lo), float(hi)
