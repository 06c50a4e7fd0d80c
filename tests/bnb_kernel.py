"""What bitsandbytes' native CPU 4-bit dequantize kernel does on this machine, found by running it.

bitsandbytes 0.50's ``libbitsandbytes_cpu`` chooses its ``dequantize_4bit`` kernel at run time:
a vectorized one where the CPU has AVX-512F, a scalar one elsewhere (AVX2-only machines).  The
two differ from each other, and from bitsandbytes' own format (its ``quantize_4bit``, its code
tables, its pure-torch path, and qformat), in two documented places:

* FP4 code 8 (sign bit set, zero magnitude): the code table says +0.0; the scalar kernel
  computes the sign from the code and returns -0.0.
* Blocks straddling rows (an even row length that is not a multiple of the block size, block
  size < 2048): the AVX-512 kernel restarts the block count at each row, so it uses the wrong
  absmax for whole runs of elements.

Tests never assume which kernel runs.  :func:`behaviour` probes the kernel in use, and
:func:`kernel_differences` returns exactly the elements where the kernel's output differs
from the format's formula for a documented reason, so a test can assert that *only* those
differ.  :func:`scalar_kernel` forces the scalar kernel on an AVX-512 machine, so both kernels
are covered on one machine.  bitsandbytes has no switch for this: it caches its CPU check
(``has_avx512f``) in static flags, which the context manager sets through the library's ELF
symbol table and restores afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np
import pytest


def _library_path() -> str | None:
    import bitsandbytes  # noqa: F401  (loads the native library)

    with open("/proc/self/maps") as f:
        for line in f:
            if "libbitsandbytes_cpu" in line:
                return line.split()[-1]
    return None


@lru_cache(maxsize=1)
def _static_flags() -> tuple[str, int, dict[str, int]] | None:
    """(library path, load base, {symbol: offset}) of the cached AVX-512 flags, or None."""
    path = _library_path()
    if path is None:
        return None
    syms = _elf_symbols(path)
    if "has_avx512f_cpu" not in syms:
        return None
    lib = ctypes.CDLL(path)
    base = ctypes.cast(lib.has_avx512f_cpu, ctypes.c_void_p).value - syms["has_avx512f_cpu"]  # type: ignore[operator]
    flags = {n: a for n, a in syms.items() if "supported_avx512f" in n}
    return (path, base, flags) if flags else None


def _elf_symbols(path: str) -> dict[str, int]:
    """Symbol name -> value from an ELF64 little-endian file's .symtab (no binutils needed)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out: dict[str, int] = {}
    for _name, kind, _f, _a, off, size, link, _i, _al, entsize in sections:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        stroff = sections[link][4]
        for j in range(size // entsize):
            st_name, _info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, off + j * entsize)
            end = data.index(b"\0", stroff + st_name)
            out[data[stroff + st_name : end].decode("ascii", "replace")] = value
    return out


def has_avx512f() -> bool:
    """What bitsandbytes' native library reports (its choice of kernel)."""
    from bitsandbytes.cextension import lib

    return bool(lib.has_avx512f_cpu())


def can_force_scalar() -> bool:
    return has_avx512f() and _static_flags() is not None


@contextlib.contextmanager
def scalar_kernel() -> Iterator[None]:
    """Inside the block, bitsandbytes behaves as on an AVX2-only CPU: its native library runs
    the scalar kernel, and its Python dispatcher (which sends block sizes >= 2048 to the
    pure-torch path only when torch reports AVX-512) sees no AVX-512 either.  Restored after."""
    found = _static_flags()
    if found is None:
        raise RuntimeError("bitsandbytes' CPU flags were not found in its symbol table")
    from bitsandbytes.backends.cpu import ops

    has_avx512f()  # make sure the cached flags are initialised before they are overwritten
    _, base, flags = found
    saved = {n: ctypes.c_uint8.from_address(base + a).value for n, a in flags.items()}
    saved_torch = ops._has_avx512
    try:
        for n, a in flags.items():
            ctypes.c_uint8.from_address(base + a).value = 1 if n.startswith("_ZGV") else 0  # guard set, flag off
        ops._has_avx512 = False
        yield
    finally:
        ops._has_avx512 = saved_torch
        for n, a in flags.items():
            ctypes.c_uint8.from_address(base + a).value = saved[n]


@dataclass(frozen=True)
class Behaviour:
    """How the kernel in use departs from bitsandbytes' format (False: it follows it)."""

    straddle_restarts_blocks: bool


def _formula(packed, qs) -> tuple[np.ndarray, np.ndarray]:
    b = packed.reshape(-1).view(-1).numpy().view(np.uint8)
    n = int(np.prod(qs.shape))
    codes = np.stack([b >> 4, b & 15], 1).reshape(-1)[:n]
    vals = qs.code.numpy()[codes] * np.repeat(qs.absmax.numpy(), qs.blocksize)[:n]
    return vals.astype(np.float32).reshape(tuple(qs.shape)), codes.reshape(tuple(qs.shape))


def behaviour() -> Behaviour:
    """Probe the kernel now in use on a tiny tensor (not cached: :func:`scalar_kernel` may
    switch kernels between calls)."""
    import torch
    from bitsandbytes import functional as BF

    w = torch.randn(4, 96, generator=torch.Generator().manual_seed(0))
    packed, qs = BF.quantize_4bit(w, blocksize=64, quant_type="nf4")
    want, _ = _formula(packed, qs)
    got = BF.dequantize_4bit(packed, qs).numpy()
    return Behaviour(not np.array_equal(got.view(np.uint32), want.view(np.uint32)))


def fp4_code8_is_negative_zero(shape: tuple[int, ...], blocksize: int, dtype=None) -> bool:
    """Whether ``dequantize_4bit`` of an fp4 tensor of this shape, block size and dtype gives
    -0.0 for code 8: probed with every code 8, since which kernel runs depends on all three."""
    import torch
    from bitsandbytes import functional as BF

    dtype = dtype or torch.float32
    w = torch.ones(shape, dtype=dtype)
    packed, qs = BF.quantize_4bit(w, blocksize=blocksize, quant_type="fp4")
    packed = torch.full_like(packed, 0x88)
    return bool(torch.signbit(BF.dequantize_4bit(packed, qs)).all())


def straddles(shape: tuple[int, ...], blocksize: int) -> bool:
    """Whether blocks straddle rows where the AVX-512 kernel restarts them (see the docstring)."""
    n = shape[-1]
    return len(shape) > 1 and n % 2 == 0 and n % blocksize != 0 and blocksize < 2048


def kernel_differences(kernel: np.ndarray, formula: np.ndarray, codes: np.ndarray, quant_type: str,
                       blocksize: int, found: Behaviour, found_negative_zero: bool = False) -> tuple[np.ndarray, str] | None:
    """The mask of elements where the kernel may differ from the formula for a documented
    reason of the kernel in use, and that reason; None when it must equal the formula exactly.
    A straddling layer under a kernel that restarts blocks gives a mask of everything."""
    if found.straddle_restarts_blocks and straddles(tuple(formula.shape), blocksize):
        return np.ones(formula.shape, bool), "the AVX-512 kernel restarts the block count at each row"
    if quant_type == "fp4" and found_negative_zero:
        return (codes.reshape(formula.shape) == 8), "the scalar kernel returns -0.0 for fp4 code 8"
    return None


def assert_kernel_agrees(kernel: np.ndarray, formula: np.ndarray, codes: np.ndarray, quant_type: str,
                         blocksize: int, found: Behaviour, negative_zero: bool = False) -> None:
    """The kernel's output equals the formula bit for bit, except exactly the elements that the
    kernel in use gets differently for its documented reason (and those differ only as
    documented: -0.0 for +0.0)."""
    k = np.ascontiguousarray(kernel).astype(np.float32)
    f = np.ascontiguousarray(formula).astype(np.float32)
    differ = k.view(np.uint32) != f.view(np.uint32)
    known = kernel_differences(k, f, codes, quant_type, blocksize, found, negative_zero)
    if known is None:
        assert not differ.any(), f"{int(differ.sum())} elements differ from the formula, first at {np.argwhere(differ)[0].tolist()}"
        return
    mask, why = known
    if mask.all():  # the straddling case: only shown, by the tests that document it
        return
    assert np.array_equal(differ, mask), f"expected exactly the elements where {why} to differ: {int(differ.sum())} differ, {int(mask.sum())} expected"
    assert (f[mask] == 0).all() and not np.signbit(f[mask]).any() and np.signbit(k[mask]).all(), why


@pytest.fixture(params=["native", "scalar"])
def kernel(request):
    """bitsandbytes' CPU kernel of this machine, then its scalar kernel forced (the one an
    AVX2-only CPU runs), so both are compared on one machine.  Import it into a test module."""
    if request.param == "native":
        yield "native"
        return
    if not can_force_scalar():
        pytest.skip("the native kernel already is the scalar one, or it cannot be forced here")
    with scalar_kernel():
        yield "scalar"
