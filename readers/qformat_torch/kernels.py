"""Native CPU kernel paths of :class:`~qformat_torch.nn.QLinear`, and its exact decode path.

A kernel path maps a class of stored weights onto a CPU matmul kernel for packed weights:
torch's own int4 and int8 ones, or qformat's (``lut_grouped``, ``qformat/kernels/_matmul.c``)
for every element of at most 8 bits.  Order: torch's first, except where qformat's kernel runs
at its AVX-512 level, where it goes first (measured faster there, and it keeps no repacked copy).
Each path has

- ``match(desc, device)``: structural -- does this descriptor (parsed) map onto the kernel;
- ``prepare(desc, components)``: repack the weight into the kernel's own tensors, once, when the
  layer is built or moved (never in a forward); also says whether the mapping is *exact*;
- ``forward(prepared, x)``: ``x [M, in_features]`` in the kernel's compute dtype -> ``[M, out]``.

Exact mapping: every weight the kernel multiplies (its dequantized value, which both kernels
form in binary32) equals qformat's decoded weight, bit for bit.  The kernels take their scales
(and zero points) in the activations' dtype, so a mapping is exact only where every stored
parameter is representable in that dtype: bfloat16 scales into the bfloat16 kernels, and a
float32 logical dtype (a bfloat16 or float16 logical dtype rounds ``q * s``, which the kernel
does not).

Policies.  ``"auto"`` (the default) takes a kernel wherever each weight it multiplies is within
a relative ``2^-8`` (one bfloat16 rounding) per rounding step of qformat's decoded weight, so
that the output obeys :func:`error_bound` with ``weight_roundings`` (``Prepared.roundings``)
counted: the logical dtype's rounding of ``q * s`` (bfloat16; float16 where every nonzero
``q * s`` is a normal float16 number) and float16 (or float32) scales rounded to bfloat16.  A
bfloat16 model quantized with qformat's defaults (bfloat16 scales for a bfloat16 logical dtype)
has ``roundings == 1``: the kernel multiplies ``q * s`` exactly as stored, the decoded weight is
its bfloat16 rounding.  ``"native"`` also takes mappings whose error is not relative to the
weight (an int4 zero point folded into a bfloat16 offset ``(8 + emin - z) * s``, non-integral
zero points, float16 logical values that could be subnormal).  ``"decode"`` never takes a kernel:
``F.linear(x, W.to(x.dtype))`` bit for bit.  The outputs of a kernel differ from the decode
path's: the kernel keeps the binary32 weight where F.linear rounds it to bfloat16, and sums in
its own order (binary32 accumulation); see tests/readers/test_torch_kernels.py for the bound.
``lut_grouped`` with several rows of bfloat16 activations on a CPU with AVX512_BF16 (and AMX)
multiplies the weights rounded to bfloat16 -- the rounding F.linear does on the decode path --
where every weight is proved in bfloat16's normal range (``Prepared.meta["bf16_normal"]``), with
exact products and binary32 sums (:func:`error_bound` covers it).

Torch's native ops used here are private (underscore) ATen ops.  Each is used only after a
capability probe at first use (the op exists, accepts the call, and is right on a tiny input
within the bound), cached per process; where it fails, QLinear decodes instead.

Only bfloat16 activations go to torch's kernels (``lut_grouped`` takes float32 and float16 ones
too, computing in binary32): torch's float32 and float16 versions of
both ops measured 10-60x slower than decoding plus F.linear (no vectorized path).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from qformat.descriptor import Descriptor
from qformat.regions import element_table, full_region, plan_codes, plan_grid

from .decode import _empty_out, apply_codes, decode, grid_values
from .sources import NumpyView, TensorSource, numpy_view

__all__ = ["POLICIES", "KernelPath", "Prepared", "PATHS", "get_kernel_policy", "set_kernel_policy", "select",
           "probe", "decode_chunked", "DECODE_CHUNK_ELEMENTS", "clear_workspace", "release_file_pages", "trim_heap",
           "trim_heap_after"]

#: ``"auto"``: native kernels where each kernel weight is within ``2^-8`` relative per rounding
#: of the decoded weight (see the module doc), else decode; ``"native"``: also where an offset
#: or zero point rounds; ``"decode"``: always decode (bit-identical to F.linear on the decoded weight).
POLICIES = ("auto", "native", "decode")
_POLICY = {"value": "auto", "generation": 0}


def set_kernel_policy(policy: str) -> None:
    """The default kernel policy of every QLinear whose ``kernel`` is None (see :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise ValueError(f"kernel policy must be one of {POLICIES}, found {policy!r}")
    if policy != _POLICY["value"]:
        _POLICY["value"] = policy
        _POLICY["generation"] += 1


def get_kernel_policy() -> str:
    return str(_POLICY["value"])


def policy_generation() -> int:
    return int(_POLICY["generation"])


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` (None off Linux or without it)."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Preparing a kernel allocates transients several times the size of the copy it keeps; glibc
    serves blocks of a few megabytes from its heap once a larger block was freed (its dynamic mmap
    threshold), so the kept copies end up between freed transients, and without a trim the
    process keeps every hole: measured on a 119M-parameter Llama loaded from int4, 258 MB over the
    baseline right after from_pretrained instead of 148 MB.  Returns whether the call was made."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


#: Weight elements prepared between two heap trims (:func:`trim_heap_after`).
TRIM_EVERY_ELEMENTS = 1 << 24
_TRIM = {"pending": 0}
_TRIM_LOCK = threading.Lock()


def trim_heap_after(elements: int) -> bool:
    """:func:`trim_heap` once the weights prepared since the last trim reach
    :data:`TRIM_EVERY_ELEMENTS` elements (``elements``: this preparation's), not after every
    layer: each trim walks the whole heap and gives its free pages back one system call at a
    time (Gemma 3 270M's 126 layers: 126 trims, 0.6 s of its first forward; now 5).  A
    preparation's transients are a few bytes per weight element at most (the torch paths' int32
    and int64 codes; qformat's own unpacker has none), so the holes left between trims stay
    within a few times 16M elements' bytes, and a layer of that size or larger is trimmed after
    at once, as before.  Returns whether a trim was made."""
    with _TRIM_LOCK:
        _TRIM["pending"] += max(0, int(elements))
        if _TRIM["pending"] < TRIM_EVERY_ELEMENTS:
            return False
        _TRIM["pending"] = 0
    return trim_heap()


_MADV_PAGEOUT = 21  # Linux >= 5.4: reclaim these pages (clean file pages are dropped, nothing is lost)


#: File mappings (start, end) found by :func:`_in_file_mapping`, most recent first: QLinear's
#: components and decoded tensors all lie in the few mappings of the checkpoint's files.
_FILE_MAPS: list[tuple[int, int]] = []
_FILE_MAPS_LOCK = threading.Lock()


def _still_file_mapped(a: int, b: int) -> bool | None:
    """Whether a mapping of a file spans exactly [a, b) now: ``/proc/self/map_files`` lists one
    entry per file mapping, named by its range (None where it cannot be read: then the caller
    reads ``/proc/self/maps``)."""
    import os

    try:
        os.lstat(f"/proc/self/map_files/{a:x}-{b:x}")
        return True
    except FileNotFoundError:
        return False
    except OSError:
        return None


def _in_file_mapping(lo: int, hi: int) -> bool:
    """Whether [lo, hi) lies wholly inside one mapping of a file (an inode and a path: not
    [heap], [stack] or anonymous memory).  A mapping found before is confirmed through
    ``/proc/self/map_files`` (one lstat); else ``/proc/self/maps`` is read up to the mapping that
    holds lo: a whole read takes milliseconds (it lists every mapped library, and the kernel
    writes each line on demand), which QLinear's preparation paid for each component."""
    with _FILE_MAPS_LOCK:
        for i, (a, b) in enumerate(_FILE_MAPS):
            if a <= lo and hi <= b:
                ok = _still_file_mapped(a, b)
                if ok:
                    return True
                del _FILE_MAPS[i]  # gone or replaced (or unknown): read the maps again
                break
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            a, b = (int(x, 16) for x in parts[0].split("-"))
            if a > lo:
                return False  # the lines are in address order: no mapping holds lo
            if a <= lo and hi <= b:
                if len(parts) < 6 or parts[4] == "0" or not parts[5].strip().startswith("/"):
                    return False
                with _FILE_MAPS_LOCK:
                    _FILE_MAPS.insert(0, (a, b))
                    del _FILE_MAPS[8:]
                return True
    return False


@functools.lru_cache(maxsize=1)
def _madvise() -> Any:
    import ctypes

    fn = ctypes.CDLL(None, use_errno=True).madvise
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def release_file_pages(t: torch.Tensor) -> bool:
    """Ask the kernel to reclaim the resident pages of ``t`` when ``t`` is a view of a file mapped
    into memory (transformers reads safetensors through mmap, so every weight it hands over is
    such a view, and each page read stays resident while the file is mapped).

    Used where the bytes are no longer needed in memory: a full-precision weight encoded on load
    (qformat.transformers; else the whole full-precision checkpoint would stay resident, one page
    at a time, until loading finishes), a QLinear's components once the native kernel holds its
    own copy (they are read from the file again if state_dict or a save asks).  Only pages wholly inside ``t``'s bytes are touched, only inside a mapping
    of a file, and only with ``MADV_PAGEOUT``, a reclaim hint that never discards data (a page
    written since it was mapped is kept or swapped, never dropped).  Linux only; elsewhere, or
    when the kernel refuses, nothing happens.  Returns whether the hint was given.
    """
    import sys

    if not sys.platform.startswith("linux") or t.device.type != "cpu" or t.numel() == 0:
        return False
    try:
        import ctypes
        import os

        page = os.sysconf("SC_PAGE_SIZE")
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        lo, hi = -(-start // page) * page, end // page * page
        if hi <= lo or not _in_file_mapping(lo, hi):
            return False
        return _madvise()(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_PAGEOUT) == 0
    except (OSError, ValueError, AttributeError):
        return False


# -- prepared kernels --------------------------------------------------------------------------
@dataclass
class Prepared:
    """A weight repacked for one kernel path."""

    path: "KernelPath"
    tensors: dict[str, torch.Tensor]
    dtype: torch.dtype  # activations' dtype the kernel runs in
    exact: bool  # every implied weight equals the decoded weight (see the module doc)
    why: str = ""  # where not exact: which parameter rounds
    roundings: int = 0  # relative 2^-8 roundings between the decoded and the kernel's weight (error_bound)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    meta: dict[str, Any] = field(default_factory=dict)  # the path's own settings (group size, code kind)

    def __call__(self, x2d: torch.Tensor) -> torch.Tensor:
        return self.path.forward(self, x2d)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["meta"] = {k: v for k, v in self.meta.items() if k != "run"}  # a closure: rebuilt at first use
        return state

    @property
    def run(self) -> Any:
        """``path.forward(self, x2d)`` as one callable with everything the path can fix once
        (its tensors' views, the code kind, the group) bound: the same call, the same output bit
        for bit, without the per-call look-ups (:meth:`KernelPath.runner`); built at first use."""
        fn = self.meta.get("run")
        if fn is None:
            fn = self.meta["run"] = self.path.runner(self)
        return fn


class KernelPath:
    """One native kernel: see the module doc."""

    name = "?"
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)

    def match(self, desc: Descriptor, device: torch.device) -> bool:
        raise NotImplementedError

    def prepare(self, desc: Descriptor, comps: dict[str, torch.Tensor], policy: str = "native") -> Prepared | None:
        """The repacked weight, or None where ``policy`` does not allow the mapping (checked on
        the parameters before the codes are repacked; see the module doc)."""
        raise NotImplementedError

    def forward(self, p: Prepared, x2d: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def runner(self, p: Prepared) -> Any:
        """A callable ``x2d -> forward(p, x2d)`` (:attr:`Prepared.run`); paths whose forward looks
        things up per call bind them here."""
        return functools.partial(self.forward, p)

    def probe_case(self) -> tuple[Prepared, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(prepared tiny weight, x, the exact float64 product, |x| @ |W|^T) for the probe."""
        raise NotImplementedError


# -- shared structural checks ---------------------------------------------------------------------
def _int_table(desc: Descriptor, comps: dict[str, torch.Tensor]) -> np.ndarray | None:
    """The element values (float64) of an integer element with integral values, or None."""
    el = desc.codes.element
    if el.type != "int" or el.frac_bits:
        return None
    table, valid = element_table(desc, numpy_view(TensorSource(comps, torch.device("cpu"))))
    t = np.asarray(table, np.float64)[:valid]
    if valid != len(table) or not np.all(np.isfinite(t)) or not np.all(t == np.round(t)):
        return None
    return t


def _plain_2d(desc: Descriptor, device: torch.device) -> bool:
    return (device.type == "cpu" and len(desc.shape) == 2 and desc.layout == "canonical" and not desc.extensions
            and desc.bias is None and desc.scale is not None and desc.scale.op == "multiply"
            and desc.scale.blocks.type == "grid" and desc.scale.blocks.index is None)


def _grid(desc: Descriptor, prm: Any, comps: dict[str, torch.Tensor]) -> torch.Tensor:
    """A parameter's binary32 values over its whole grid (stored or encoded, any order), in a
    tensor of its own (never a view of a component: callers may write it).

    Components on the CPU go through the core's NumPy reader (a two-level parameter by the
    core's decoder, its native kernel where it covers it): the torch decoder's values, bit for
    bit (the two decoders are held equal by the differential tests, and this route by
    tests/readers/test_prepare_native.py), without its dozen small torch ops per parameter,
    each a parallel region whose barrier cost milliseconds with the cores busy (Gemma 3 270M's
    153 parameter grids: 1.7 s of its first forward on a loaded 2-core machine, against 0.1 s)."""
    box = full_region(prm.blocks.grid_shape(desc.shape))
    if comps and all(t.device.type == "cpu" for t in comps.values()):
        return torch.from_numpy(np.ascontiguousarray(_grid_numpy(desc, prm, comps, box)))  # a fresh array (astype copies)
    g = grid_values(plan_grid(prm, desc, box), TensorSource(comps, torch.device("cpu")), 0).contiguous()
    own = {t.untyped_storage().data_ptr() for t in comps.values()}
    return g.clone() if g.untyped_storage().data_ptr() in own else g  # binary32 components come back as they are


def _grid_numpy(desc: Descriptor, prm: Any, comps: dict[str, torch.Tensor], box: Any) -> np.ndarray:
    """:func:`_grid` by the core (float32): a stored grid widened exactly, an encoded one decoded
    whole (SPEC.md 10.6), rounded to its logical dtype and widened, as the torch decoder's
    :func:`~qformat_torch.decode.grid_values` does."""
    from qformat.decode import decode as np_decode
    from qformat.regions import grid_array

    src = _ViewSource(TensorSource(comps, torch.device("cpu")))
    g = plan_grid(prm, desc, box)
    if prm.encoded is not None:
        whole = np_decode(prm.encoded, src, threads=1)
        cut = whole[tuple(slice(lo, hi) for lo, hi in g.box)] if g.box else whole
        return cut.astype(np.float32)
    return grid_array(prm, desc, src, box).astype(np.float32)


class _ViewSource(NumpyView):
    """The core's NumPy source over CPU components, as views of their bytes where they are
    contiguous (the parameters' bytes are only read; :class:`NumpyView` copies each)."""

    def array(self, name: str) -> np.ndarray:
        from qformat import dtypes as qdtypes

        from .dtypes import int_view_dtype, storage_name, torch_to_numpy

        t = self.src.read(name)
        if t.is_contiguous() and t.dtype is not torch.bool and t.numel():
            npdt = qdtypes.storage_numpy(storage_name(t.dtype))
            if npdt is not None and npdt.itemsize == t.element_size():
                return t.view(int_view_dtype(t.element_size())).numpy().view(npdt)
        return torch_to_numpy(t)


def _codes(desc: Descriptor, comps: dict[str, torch.Tensor]) -> torch.Tensor:
    """The stored codes in logical order, int64 ``[N, K]`` (the core's read plan, any packing)."""
    src = TensorSource(comps, torch.device("cpu"))
    return apply_codes(plan_codes(desc, full_region(desc.shape)), src)


def _nibbles(desc: Descriptor, comps: dict[str, torch.Tensor], table: np.ndarray, emin: float) -> torch.Tensor:
    """The kernel's unsigned nibbles ``table[code] - emin`` as int32 ``[N, K]``.  Plain 4-bit
    packing (two codes per byte, low nibble first, rows along in_features) is split with byte
    ops (5 bytes per element of temporaries); any other packing goes through the core's read plan."""
    n, k = desc.shape
    lut = torch.from_numpy((table - emin).astype(np.int32))
    p, codes = desc.codes.packing, comps[desc.codes.tensor]
    if (desc.codes.element.bits == 4 and p.container == 8 and p.bit_order == "lsb_first" and p.axis == 1 and p.order is None
            and p.slot_order is None and p.planes_span is None and p.row_alignment == 1 and k % 2 == 0
            and tuple(codes.shape) == (n, k // 2)):
        b = codes.view(torch.uint8)
        nib = torch.stack([b & 15, b >> 4], -1).reshape(n, k)
        if np.array_equal(table - emin, np.arange(16)):  # unsigned codes
            return nib.to(torch.int32)
        if np.array_equal(table - emin, np.arange(16) ^ 8):  # two's complement codes: e + 8
            return (nib ^ 8).to(torch.int32)
        return lut[nib.to(torch.int64)]
    return lut[_codes(desc, comps)]


def _representable(v: torch.Tensor, dtype: torch.dtype) -> bool:
    return bool(torch.equal(v.to(dtype).to(torch.float64), v.to(torch.float64)))


def _roundings(desc: Descriptor, s: torch.Tensor, dt: torch.dtype) -> tuple[list[str], list[str]]:
    """(relative roundings between the decoded weight and the kernel's, for ``Prepared.roundings``
    and the "auto" policy; roundings "auto" does not take) of the logical dtype and the scales
    ``s`` (float64).  Element values are integers, so a nonzero ``|q * s| >= min |s|``."""
    rel, other = [], []
    if desc.dtype == "bfloat16":
        rel.append("the logical dtype bfloat16 rounds q*s, the kernel does not")
    elif desc.dtype == "float16":
        nz = s.abs()[s != 0]
        if nz.numel() and float(nz.min()) < 2.0**-14:  # q*s could be a float16 subnormal: an absolute error
            other.append("the logical dtype float16 rounds q*s, possibly to a subnormal")
        else:
            rel.append("the logical dtype float16 rounds q*s, the kernel does not")
    elif desc.dtype != "float32":
        other.append(f"the logical dtype {desc.dtype} rounds q*s, the kernel does not")
    if not _representable(s, dt):
        nz = s.abs()[s != 0]
        if nz.numel() and float(nz.min()) < 2.0**-126:  # a bfloat16 subnormal: an absolute rounding
            other.append("scales round to bfloat16 subnormals")
        else:
            rel.append("scales round to bfloat16")
    return rel, other


def _allowed(policy: str, rel: list[str], other: list[str]) -> bool:
    return policy == "native" or (policy == "auto" and not other)


# -- int4 grouped affine -> _weight_int4pack_mm_for_cpu -------------------------------------------
class Int4Grouped(KernelPath):
    """Integer codes of at most 4 bits (values spanning at most 16 integers), a multiply scale per
    group of 32/64/128/256 along in_features, optional zero point per group (or per row).

    The kernel's weight is ``(u - 8) * s + c`` with u in [0, 15] (``[N, K]`` int32 repacked by
    ``_convert_weight_to_int4pack_for_cpu``) and ``(s, c)`` per group as ``[K/g, N, 2]`` in the
    activations' dtype.  With element values ``e = u + emin``: ``(e - z) * s = (u - 8) * s + (8 +
    emin - z) * s``, so ``c = (8 + emin - z) * s`` (zero without a zero point and emin = -8, the
    two's complement case).  Exact where s and c are bfloat16 values (and z integral)."""

    name = "int4_grouped"
    GROUPS = (32, 64, 128, 256)

    def match(self, desc: Descriptor, device: torch.device) -> bool:
        if not _plain_2d(desc, device) or desc.codes.element.type != "int" or desc.codes.element.bits > 4:
            return False
        n, k = desc.shape
        size = desc.scale.blocks.size
        if not (isinstance(size, tuple) and len(size) == 2 and size[0] == 1 and size[1] in self.GROUPS):
            return False
        g = int(size[1])
        if n % 16 or k % g or k == 0:  # the repack needs N % 16; groups must tile the rows
            return False
        z = desc.zero
        if z is not None:
            zs = z.blocks.size
            if z.blocks.type != "grid" or z.blocks.index is not None or not isinstance(zs, tuple):
                return False
            if not (zs[0] == 1 and (zs[1] is None or zs[1] == k or zs[1] == g)):
                return False
        return True

    def prepare(self, desc: Descriptor, comps: dict[str, torch.Tensor], policy: str = "native") -> Prepared | None:
        n, k = desc.shape
        g = int(desc.scale.blocks.size[1])  # type: ignore[index]
        table = _int_table(desc, comps)
        if table is None or table.max() - table.min() > 15:
            raise ValueError("element values are not 16 consecutive integers")
        emin = float(table.min())
        s = _grid(desc, desc.scale, comps).to(torch.float64).reshape(n, k // g)
        if desc.zero is not None:
            z = _grid(desc, desc.zero, comps).to(torch.float64).reshape(n, -1)
            z = z.expand(n, k // g) if z.shape[1] == 1 else z
        else:
            z = torch.zeros_like(s)
        c = (8.0 + emin - z) * s  # float64: exact (a 24-bit value times a small integer)
        dt = torch.bfloat16
        rel, other = _roundings(desc, s, dt)
        if not _representable(c, dt):
            # where s itself rounds, c = (8 + emin - z) * s rounds with it (relative, counted
            # there) only when the integer factor is a power of two; else it is an offset error
            if _representable(s, dt) or not bool(torch.equal(c.to(dt).double(), (8.0 + emin - z) * s.to(dt).double())):
                other.append("the zero-point offset (8 + emin - z) * s rounds to bfloat16")
        if not bool(torch.equal(z, torch.round(z))):
            other.append("non-integral zero points")
        why = rel + other
        if not _allowed(policy, rel, other):
            return None
        u = _nibbles(desc, comps, table, emin)  # [N, K] int32 in [0, 15]
        w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.contiguous(), 1)
        del u
        sz = torch.stack([s.to(dt), c.to(dt)], 2).transpose(0, 1).contiguous()  # [K/g, N, 2]
        return Prepared(self, {"weight": w, "scales_and_zeros": sz, "group": torch.tensor(g)}, dt, not why, "; ".join(why), len(rel))

    def forward(self, p: Prepared, x2d: torch.Tensor) -> torch.Tensor:
        t = p.tensors
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2d, t["weight"], int(t["group"]), t["scales_and_zeros"])

    def runner(self, p: Prepared) -> Any:
        t = p.tensors
        op, w, g, sz = torch.ops.aten._weight_int4pack_mm_for_cpu, t["weight"], int(t["group"]), t["scales_and_zeros"]
        return lambda x2d: op(x2d, w, g, sz)

    def probe_case(self) -> tuple[Prepared, torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        n, k, g = 32, 128, 32
        u = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        s = (torch.rand(k // g, n, generator=gen) + 0.5).to(torch.bfloat16)
        c = torch.randint(-7, 9, (k // g, n), generator=gen).to(torch.bfloat16) * s
        w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
        sz = torch.stack([s, c], 2).contiguous()
        p = Prepared(self, {"weight": w, "scales_and_zeros": sz, "group": torch.tensor(g)}, torch.bfloat16, True)
        wd = (u.double() - 8) * s.double().T.repeat_interleave(g, 1) + c.double().T.repeat_interleave(g, 1)
        x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
        return p, x, x.double() @ wd.T, x.double().abs() @ wd.abs().T


# -- int8 per channel symmetric -> _weight_int8pack_mm --------------------------------------------
class Int8PerChannel(KernelPath):
    """Integer codes of at most 8 bits with values in [-128, 127], no zero point, one multiply
    scale per output row.  The kernel's weight is ``q * s`` with q int8 ``[N, K]`` (the codes
    component itself where it holds the two's complement values: no copy) and s ``[N]`` in the
    activations' dtype.  Exact where s is a bfloat16 value."""

    name = "int8_per_channel"

    def match(self, desc: Descriptor, device: torch.device) -> bool:
        if not _plain_2d(desc, device) or desc.codes.element.type != "int" or desc.codes.element.bits > 8 or desc.zero is not None:
            return False
        n, k = desc.shape
        size = desc.scale.blocks.size
        if not (isinstance(size, tuple) and len(size) == 2 and size[0] == 1 and (size[1] is None or size[1] >= k)):
            return False
        # the AVX-512 kernel measured wrong results / crashes for K % 16 != 0; keep a margin
        return n > 0 and k > 0 and k % 32 == 0 and n % 16 == 0

    def prepare(self, desc: Descriptor, comps: dict[str, torch.Tensor], policy: str = "native") -> Prepared | None:
        n, k = desc.shape
        table = _int_table(desc, comps)
        if table is None or table.min() < -128 or table.max() > 127:
            raise ValueError("element values do not fit int8")
        s = _grid(desc, desc.scale, comps).to(torch.float64).reshape(n)
        dt = torch.bfloat16
        rel, other = _roundings(desc, s, dt)
        why = rel + other
        if not _allowed(policy, rel, other):
            return None
        codes = comps[desc.codes.tensor]
        p = desc.codes.packing
        plain = (desc.codes.element.bits == 8 and p.container == 8 and p.axis == 1 and p.order is None and p.slot_order is None
                 and p.planes_span is None and p.row_alignment == 1 and tuple(codes.shape) == (n, k)
                 and np.array_equal(table, np.arange(256, dtype=np.int64).astype(np.uint8).view(np.int8).astype(np.float64)))
        if plain and codes.data_ptr() % 64 == 0:
            q = codes.view(torch.int8)  # shares the buffer
        elif plain:
            # torch's AVX-512 kernel reads the weight with aligned loads from 4 rows of
            # activations up: a weight that is not on a 16-byte boundary (a tensor at an 8-byte
            # safetensors offset) crashed it (measured, torch 2.13).  A copy is 64-byte aligned.
            q = codes.view(torch.int8).clone()
        else:
            q = torch.from_numpy(table.astype(np.int8))[_codes(desc, comps)].contiguous()
        return Prepared(self, {"weight": q, "scales": s.to(dt).contiguous()}, dt, not why, "; ".join(why), len(rel))

    def forward(self, p: Prepared, x2d: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x2d, p.tensors["weight"], p.tensors["scales"])

    def runner(self, p: Prepared) -> Any:
        op, w, s = torch.ops.aten._weight_int8pack_mm, p.tensors["weight"], p.tensors["scales"]
        return lambda x2d: op(x2d, w, s)

    def probe_case(self) -> tuple[Prepared, torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        n, k = 32, 64
        q = torch.randint(-128, 128, (n, k), generator=gen).to(torch.int8)
        s = (torch.rand(n, generator=gen) * 0.01 + 1e-3).to(torch.bfloat16)
        p = Prepared(self, {"weight": q, "scales": s}, torch.bfloat16, True)
        wd = q.double() * s.double()[:, None]
        x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
        return p, x, x.double() @ wd.T, x.double().abs() @ wd.abs().T


# -- any element of at most 8 bits, per-group parameters -> qformat's own matmul kernel --------------
#: The parameter ops the kernel applies, by role (SPEC.md §9: a zero point has no op; a bias that
#: subtracts is added negated, the same binary32 result).
_PARAM_OPS = {"zero": (None,), "scale": ("multiply",), "bias": ("add", "subtract")}


def _kernel_group(desc: Descriptor) -> tuple[int, list[tuple[Any, int, int]]] | None:
    """(g, [(param, rows per cell, columns per cell)]) where every parameter is a grid of
    blocks (or flat blocks that tile whole rows or lie inside one) whose column extent is a
    multiple of ``g`` (g: the smallest, a multiple of 8 dividing in_features), else None."""
    n, k = desc.shape
    found, widths = [], []
    for role, prm in (("zero", desc.zero), ("scale", desc.scale), ("bias", desc.bias)):
        if prm is None:
            continue
        if prm.op not in _PARAM_OPS[role]:
            return None
        if prm.blocks.type == "flat":
            f = int(prm.blocks.size)  # type: ignore[arg-type]
            if k % f == 0:
                bn, bk = 1, f
            elif f % k == 0:
                bn, bk = f // k, k
            else:
                return None
        elif prm.blocks.index is None:
            bn, bk = prm.blocks.size  # type: ignore[misc]
            bn, bk = n if bn is None else int(bn), k if bk is None else int(bk)
        else:
            return None
        found.append((prm, bn, bk))
        widths.append(min(bk, k))
    if not found:
        return None
    from qformat.kernels import MATMUL_MAX_GROUP

    g = min(widths)
    while g > MATMUL_MAX_GROUP and g % 2 == 0:  # a per-row parameter on a very wide row: any divisor works
        g //= 2
    if g % 8 or k % g or any((w % g and w != k) or (k % w and w != k) for w in widths) or g > MATMUL_MAX_GROUP:
        return None
    return g, found


class LutGrouped(KernelPath):
    """Every element encoding of at most 8 bits (int, float, codebook: nf4, fp4, e2m1 of MX and
    NV, fp8, int asym, the GGUF K-family as converted), with zero/scale/bias per group of
    columns (any block shape whose column width is a multiple of 8), on qformat's own kernel
    (:func:`qformat.kernels.matmul`, ``qformat/kernels/_matmul.c``).

    The kernel forms each weight with the decoder's binary32 steps ``(v - z) * s + b`` from the
    same binary32 element values and parameter values (``_grid``: two-level parameters decoded
    first, as the decoder does), so the weight it multiplies equals qformat's decoded binary32
    weight bit for bit; the only rounding between it and the decoded weight is the logical
    dtype's (bfloat16: one relative rounding; float32: none).  It computes in binary32 from
    activations of any float dtype (bfloat16 and float16 convert exactly)."""

    name = "lut_grouped"
    dtypes = (torch.bfloat16, torch.float32, torch.float16)

    def match(self, desc: Descriptor, device: torch.device) -> bool:
        from qformat import kernels as qk

        if not qk.matmul_available() or device.type != "cpu" or len(desc.shape) != 2 or desc.layout != "canonical":
            return False
        if desc.extensions or desc.codes.element.bits > 8 or desc.dtype not in ("float32", "bfloat16", "float16"):
            return False
        n, k = desc.shape
        if n == 0 or k == 0:
            return False
        grp = _kernel_group(desc)
        return grp is not None and (desc.codes.element.bits > 4 or (k % 32 == 0 and grp[0] % 16 == 0))

    def prepare(self, desc: Descriptor, comps: dict[str, torch.Tensor], policy: str = "native") -> Prepared | None:
        n, k = desc.shape
        g, found = _kernel_group(desc)  # type: ignore[misc]
        src = TensorSource(comps, torch.device("cpu"))
        table, valid = element_table(desc, numpy_view(src))
        table = np.asarray(table, np.float32)
        bits = desc.codes.element.bits
        nib = bits <= 4
        lut = np.zeros(16 if nib else 256, np.float32)
        lut[:valid] = table[:valid]
        params = {}
        for role, (prm, bn, bk) in zip([r for r in ("zero", "scale", "bias") if getattr(desc, r) is not None], found):
            grid = _grid(desc, prm, comps).to(torch.float32).reshape(-(-n // bn), -(-k // bk)).numpy()
            if bn == 1 and bk == g:  # one cell per (row, group) already (GGUF's blocks); _grid's tensor is our own
                cell = np.ascontiguousarray(grid)
            else:
                cell = np.ascontiguousarray(grid[np.arange(n) // bn][:, np.arange(0, k, g) // bk])
            if role == "bias" and prm.op == "subtract":
                np.negative(cell, out=cell)  # x - b and x + (-b) are the same binary32 operation
            # NumPy, not torch, for these small arrays: each torch op is a parallel region, whose
            # barrier cost milliseconds per op with the cores busy (measured on Gemma 3's 126 layers)
            params[role] = torch.from_numpy(cell)
        span = self._weight_span(lut[:valid], params, nib)
        rel, other = self._logical_rounding(desc.dtype, span)
        if not _allowed(policy, rel, other):
            return None
        codes = self._codes(desc, comps, nib)
        kind = "nib4" if nib else self._byte_kind(lut[:valid], valid, codes)
        if kind == "lut8" and valid <= 64:  # codes of at most 6 bits (Q6_K's): below 64, as "lut6" promises the kernel
            kind = "lut6"
        why = rel + other
        t = {"codes": codes, "table": torch.from_numpy(lut), **params}
        # the kernel's bfloat16 dot products (several rows of bfloat16 x) need every nonzero
        # weight in bfloat16's normal range: they take subnormals as zero
        lo_bf, hi_bf = self.NORMAL["bfloat16"]
        bf16_normal = span is not None and (span[0] >= lo_bf or span[0] == np.inf) and span[1] <= hi_bf
        return Prepared(self, t, torch.float32, not why, "; ".join(why), len(rel),
                        meta={"group": g, "kind": kind, "bf16_normal": bf16_normal})

    #: The logical dtypes' normal range: a weight in it rounds with a relative error of at most
    #: one unit roundoff (the error_bound's weight rounding); outside it the rounding is absolute
    #: (subnormals) or an overflow to infinity.
    NORMAL = {"bfloat16": (2.0**-126, 3.3895313892515355e38), "float16": (2.0**-14, 65504.0)}

    @classmethod
    def _logical_rounding(cls, dtype: str, span: tuple[float, float] | None) -> tuple[list[str], list[str]]:
        """(relative roundings, other roundings) between the kernel's binary32 weights and the
        decoded ones, which the logical dtype rounds: relative where every nonzero finite weight
        the codes and parameters can form lies in the dtype's normal range (``span``, from
        :meth:`_weight_span`), else other."""
        if dtype not in cls.NORMAL:
            return [], []  # float32: the kernel's weight is the decoded weight
        relative = [f"the logical dtype {dtype} rounds each weight, the kernel does not"]
        if span is None:
            return [], [f"the logical dtype {dtype} rounds each weight; with a zero point or bias on 8-bit codes its range is not proved"]
        lo_ok, hi_ok = cls.NORMAL[dtype]
        lo, hi = span
        if lo < lo_ok or hi > hi_ok:
            return [], [f"the logical dtype {dtype} rounds weights outside its normal range (subnormal or overflowing): an absolute rounding"]
        return relative, []

    @staticmethod
    def _weight_span(values: np.ndarray, params: dict[str, torch.Tensor], nib: bool) -> tuple[float, float] | None:
        """(smallest, largest) magnitude of the nonzero finite weights the codes and parameters
        can form, proved from the table and the parameters: the product of the extremes without
        a zero point or bias; with one, every group's 16 candidate weights for 4-bit codes
        (``(inf, 0)`` where there is no nonzero weight); None where not proved (8-bit codes with
        a zero point or bias)."""
        v = values.astype(np.float64)
        v = v[np.isfinite(v)]
        if "zero" not in params and "bias" not in params:
            s = np.abs(params["scale"].numpy().astype(np.float64)) if "scale" in params else np.ones(1)
            s = s[np.isfinite(s)]
            nz_v, nz_s = np.abs(v[v != 0]), s[s != 0]
            if not nz_v.size or not nz_s.size:
                return np.inf, 0.0
            return float(nz_v.min() * nz_s.min()), float(nz_v.max() * nz_s.max())
        if nib:
            from qformat import kernels as qk

            z, sc, b = params.get("zero"), params.get("scale"), params.get("bias")
            rows, groups = next(iter(params.values())).shape
            if qk.prepare_available():  # the same binary32 steps in one native loop (no temporaries)
                arr = lambda t: None if t is None else np.ascontiguousarray(t.numpy(), np.float32)  # noqa: E731
                return qk.weight_span(np.ascontiguousarray(values, np.float32), arr(z), arr(sc), arr(b), rows * groups)
            lo, hi = np.inf, 0.0
            step = max(1, (1 << 18) // max(1, groups))
            t = torch.from_numpy(values.astype(np.float32))
            for a in range(0, rows, step):  # the kernel's own binary32 steps, per group (a zero point or bias broadcasts t)
                w = t
                if z is not None:
                    w = w - z[a:a + step, :, None]
                if sc is not None:
                    w = w * sc[a:a + step, :, None]
                if b is not None:
                    w = w + b[a:a + step, :, None]
                w = w.abs()[torch.isfinite(w)]
                w = w[w != 0]
                if w.numel():
                    lo, hi = min(lo, float(w.min())), max(hi, float(w.max()))
            return lo, hi
        return None

    @staticmethod
    def _codes(desc: Descriptor, comps: dict[str, torch.Tensor], nib: bool) -> torch.Tensor:
        """The codes as the kernel reads them: uint8 ``[N, K/2]`` (two per byte, low nibble
        first) or ``[N, K]``; the stored bytes themselves where they already are that."""
        n, k = desc.shape
        p, stored = desc.codes.packing, comps[desc.codes.tensor]
        plain = (p.container == 8 and p.axis == 1 and p.order is None and p.slot_order is None and p.planes_span is None
                 and p.row_alignment == 1 and stored.element_size() == 1 and stored.is_contiguous())  # U8, I8, F8_*: the bytes as they are
        if nib and plain and desc.codes.element.bits == 4 and p.bit_order == "lsb_first" and tuple(stored.shape) == (n, k // 2):
            return stored.view(torch.uint8)
        if not nib and plain and desc.codes.element.bits == 8 and tuple(stored.shape) == (n, k):
            return stored.view(torch.uint8)
        out = torch.empty((n, k // 2 if nib else k), dtype=torch.uint8)
        if LutGrouped._unpack_native(desc, stored, nib, out):
            return out
        step = max(1, (1 << 20) // k)  # rows per chunk: the read plan's int64 codes stay small
        src = TensorSource(comps, torch.device("cpu"))
        for a in range(0, n, step):
            b = min(n, a + step)
            c = apply_codes(plan_codes(desc, ((a, b), (0, k))), src).to(torch.uint8)
            out[a:b] = (c[:, 0::2] | (c[:, 1::2] << 4)) if nib else c
        return out

    @staticmethod
    def _unpack_native(desc: Descriptor, stored: torch.Tensor, nib: bool, out: torch.Tensor) -> bool:
        """``out`` filled with the codes by :func:`qformat.kernels.unpack_codes` (one pass over
        the stored bytes) where the packing is rows of bytes along in_features (any bit order,
        slot order, straddling codes, row alignment; not planes); False elsewhere (the caller
        takes the read plan).  The same codes as the read plan's, bit for bit
        (tests/readers/test_prepare_native.py)."""
        from qformat import kernels as qk
        from qformat.descriptor import codes_shape
        from qformat.packing import inverse_permutation, slot_shifts

        p, bits = desc.codes.packing, desc.codes.element.bits
        n, k = desc.shape
        if not qk.prepare_available() or p.container != 8 or p.axis != 1 or p.order is not None or p.planes_span is not None:
            return False
        stride = codes_shape(desc).words_per_row
        if stored.device.type != "cpu" or stored.element_size() != 1 or not stored.is_contiguous() or stored.numel() != n * stride:
            return False
        if p.uses_slots(bits):
            shifts = slot_shifts(p, bits).astype(np.int64)
            if p.slot_order is not None:  # code i of a byte is in slot slot_order^-1[i]
                shifts = shifts[inverse_permutation(p.slot_order)]
            mode = qk.UNPACK_SLOTS
        else:
            shifts = np.zeros(0, np.int64)
            mode = qk.UNPACK_STREAM_LSB if p.bit_order == "lsb_first" else qk.UNPACK_STREAM_MSB
        qk.unpack_codes(stored.view(torch.uint8).numpy(), stride, n, k, bits, mode, bytes(shifts.astype(np.uint8)), out.numpy(), nib)
        return True

    @staticmethod
    def _byte_kind(values: np.ndarray, valid: int, codes: torch.Tensor) -> str:
        """The fastest kind whose conversion gives exactly these element values (compared bit
        for bit on every code): i8, u8, e4m3 (where no NaN code occurs), e5m2, else lut8."""
        import ml_dtypes

        if valid != 256:
            return "lut8"
        c = np.arange(256, dtype=np.uint8)
        cands = {"i8": c.view(np.int8).astype(np.float32), "u8": c.astype(np.float32),
                 "e4m3": c.view(ml_dtypes.float8_e4m3fn).astype(np.float32), "e5m2": c.view(ml_dtypes.float8_e5m2).astype(np.float32)}
        for kind, v in cands.items():
            nan = np.isnan(v)
            # bit for bit, NaN by class (a NaN weight gives a NaN output either way)
            same = np.array_equal(nan, np.isnan(values)) and np.array_equal(v[~nan].view(np.uint32), values[~nan].view(np.uint32))
            # e4m3's fast conversion has no NaN: taken only where no NaN code occurs
            if same and (kind != "e4m3" or not bool(((codes & 0x7F) == 0x7F).any())):
                return kind
        return "lut8"

    def forward(self, p: Prepared, x2d: torch.Tensor) -> torch.Tensor:
        from qformat import kernels as qk

        args = p.meta.get("args")
        if args is None:  # the kernel's arguments, as NumPy views of the prepared tensors, once
            t = p.tensors
            arr = lambda name: t[name].numpy() if name in t else None  # noqa: E731
            args = p.meta["args"] = (t["codes"].numpy(), p.meta["kind"], t["table"].numpy(), p.meta["group"],
                                     arr("zero"), arr("scale"), arr("bias"))
        x = x2d if x2d.dtype == torch.float32 else x2d.float()  # bfloat16 and float16 widen exactly
        out = np.empty((x.shape[0], args[0].shape[0]), np.float32)
        qk.matmul(x.contiguous().numpy(), *args, out, threads=torch.get_num_threads(),
                  bf16=x2d.dtype == torch.bfloat16 and p.meta.get("bf16_normal", False))
        y = torch.from_numpy(out)
        return y if x2d.dtype == torch.float32 else y.to(x2d.dtype)

    def runner(self, p: Prepared) -> Any:
        """:meth:`forward` with its arguments bound once and ``qformat.kernels.matmul``'s own
        steps inlined (the level, read per call as it does, so ``qformat.kernels.use`` still
        applies; the thread count as forward passes it): the same native call with the same
        arguments, so the same output bit for bit, for about a third of forward's Python cost
        per call (a decoding step makes one call per linear layer)."""
        from qformat import kernels as qk

        mm = getattr(qk, "_matmul", None)
        if mm is None:
            return functools.partial(self.forward, p)
        t = p.tensors
        arr = lambda name: t[name].numpy() if name in t else None  # noqa: E731
        codes, table, zero, scale, bias = t["codes"].numpy(), t["table"].numpy(), arr("zero"), arr("scale"), arr("bias")
        n, kind, group = codes.shape[0], qk.MATMUL_KINDS[p.meta["kind"]], p.meta["group"]
        bf16_ok = 1 if p.meta.get("bf16_normal", False) else 0
        call, level, nthreads, empty, from_numpy = mm.matmul, qk.matmul_level, torch.get_num_threads, np.empty, torch.from_numpy
        f32, bf16, npf32 = torch.float32, torch.bfloat16, np.float32

        def run(x2d: torch.Tensor) -> torch.Tensor:
            dt = x2d.dtype
            x = x2d if dt is f32 else x2d.float()  # bfloat16 and float16 widen exactly
            if not x.is_contiguous():
                x = x.contiguous()
            m, k = x.shape
            out = empty((m, n), npf32)
            call(x.numpy(), m, k, codes, n, kind, table, group, zero, scale, bias, out, 0, n, level(),
                 bf16_ok if dt is bf16 else 0, max(1, nthreads()))
            y = from_numpy(out)
            return y if dt is f32 else y.to(dt)

        return run

    def probe_case(self) -> tuple[Prepared, torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        n, k, g = 32, 128, 16
        table = torch.randn(16, generator=gen)
        c = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        codes = (c[:, 0::2] | (c[:, 1::2] << 4)).contiguous()
        s = torch.rand(n, k // g, generator=gen) + 0.5
        z = torch.randn(n, k // g, generator=gen)
        p = Prepared(self, {"codes": codes, "table": table, "zero": z, "scale": s}, torch.float32, True,
                     meta={"group": g, "kind": "nib4"})
        wd = (table.double()[c.long()] - z.double().repeat_interleave(g, 1)) * s.double().repeat_interleave(g, 1)
        x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
        return p, x, x.double() @ wd.T, x.double().abs() @ wd.abs().T


#: The kernel paths, tried in order: torch's own where they map (int4 and int8 with bfloat16
#: scales), then qformat's for everything else of at most 8 bits.
PATHS: list[KernelPath] = [Int4Grouped(), Int8PerChannel(), LutGrouped()]


# -- tolerance and capability probe ----------------------------------------------------------------
def error_bound(ref: torch.Tensor, absdot: torch.Tensor, k: int, dtype: torch.dtype, weight_roundings: int = 0) -> torch.Tensor:
    """The bound on |kernel output - exact product| the kernels are held to (float64):

    ``u * |y| + (u + (k + 2) * 2^-24) * (|x| @ |W|^T)`` with ``u`` the unit roundoff of ``dtype``
    (2^-8 for bfloat16): rounding of the output to ``dtype`` (u |y|), binary32 accumulation of k
    products in any order ((k + 2) 2^-24 |x||W|, the classic gamma_k bound), and a rounding of
    each dequantized weight to ``dtype`` (u |x||W|), which a kernel may do (bfloat16 dot
    products; F.linear on the decode path does exactly this).

    ``weight_roundings = r > 0`` (``Prepared.roundings``: the kernel's weight is r relative
    roundings of at most 2^-8 away from qformat's decoded weight W, the reference here): the
    weight term becomes ``((1 + r) u (1 + 2^-6) + (k + 2) 2^-24)``, the factor ``1 + 2^-6``
    covering the products of roundings (second order: at most 4 u^2 + (k + 2) 2^-24 * 3u).

    Plus an absolute ``(k + 2) 2^-126``: bfloat16 dot-product instructions (``lut_grouped`` on
    AVX512_BF16, several rows of bfloat16 activations) flush a subnormal partial sum to zero, an
    error below 2^-126 per step (their subnormal inputs are excluded: such x takes the binary32
    path, and such weights are proved absent before that path is allowed)."""
    u = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]
    w = u if not weight_roundings else (1 + weight_roundings) * 2.0**-8 * (1 + 2.0**-6)
    return u * ref.abs() + (w + (k + 2) * 2.0**-24) * absdot + (k + 2) * 2.0**-126


_PROBED: dict[tuple[str, torch.dtype], bool] = {}
_PROBE_LOCK = threading.Lock()


def probe(path: KernelPath, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``path``'s native op exists and is right on a tiny input (cached per process)."""
    key = (path.name, dtype)
    with _PROBE_LOCK:
        if key not in _PROBED:
            try:
                p, x, ref, absdot = path.probe_case()
                y = path.forward(p, x.to(dtype)).to(torch.float64)
                ok = tuple(y.shape) == tuple(ref.shape) and bool(((y - ref).abs() <= error_bound(ref, absdot, x.shape[1], dtype)).all())
            except (RuntimeError, AttributeError, NotImplementedError, TypeError, ValueError):
                ok = False
            _PROBED[key] = ok
        return _PROBED[key]


def select(desc: Descriptor, comps: dict[str, torch.Tensor], device: torch.device, policy: str) -> Prepared | None:
    """The prepared kernel of the first path that matches, passes its probe and is allowed by
    ``policy`` (see the module doc), or None (decode)."""
    if policy == "decode":
        return None
    from qformat import kernels as qk

    # qformat's kernel goes first (a stable sort keeps the rest in order) for a float32 model,
    # whose float32 activations torch's kernels do not take, and where it runs at its AVX-512
    # level: measured at least as fast as torch's int4 and int8 kernels there (bench `generate`,
    # 2-core AVX-512 machine: int8 per channel 1.60x bf16 against 1.29x at one token, 1.06x
    # against 0.72x at an 8-token prompt; int4 g128 2.03x against 1.97x), holding no repacked copy
    first = desc.dtype == "float32" or (qk.matmul_available() and qk.matmul_level() == 2)
    paths = sorted(PATHS, key=lambda p: p.name != LutGrouped.name) if first else PATHS
    for path in paths:
        if not path.match(desc, device) or not probe(path):
            continue
        try:
            p = path.prepare(desc, comps, policy)
        except (ValueError, RuntimeError):
            continue
        if p is not None:
            p.device = device
            return p
        # None: this path's error is not one the policy takes; a later path may map exactly
    return None


# -- the decode path: chunked decode into the compute dtype -----------------------------------------
#: Elements decoded per chunk of output rows (4 MB of binary32): the binary32 values of a chunk
#: stay in cache between the decode and the cast to the compute dtype.
DECODE_CHUNK_ELEMENTS = 1 << 20

_WS = threading.local()


def clear_workspace() -> None:
    """Free this thread's reusable decode workspace."""
    _WS.__dict__.clear()


def _workspace(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable per-thread buffer (CPU; freshly allocated megabytes are page-faulted in on
    every forward otherwise)."""
    if device.type != "cpu":
        return empty((numel,), dtype, device)
    key = str(dtype)
    b = _WS.__dict__.get(key)
    if b is None or b.numel() < numel:
        with torch.inference_mode(False):
            b = _WS.__dict__[key] = _empty_out((numel,), dtype, device)
    return b[:numel]


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty`` outside inference mode: a normal tensor can be written in place both
    inside and outside ``torch.inference_mode()`` (an inference tensor only inside it), so a
    buffer kept between forwards serves callers in either mode."""
    with torch.inference_mode(False):
        return torch.empty(shape, dtype=dtype, device=device)


def chunk_rows_for(rows: int, cols: int, chunk_elements: int | None = None) -> int:
    return max(1, min(rows, (chunk_elements or DECODE_CHUNK_ELEMENTS) // max(1, cols)))


def decode_chunked(desc: Descriptor, comps: dict[str, torch.Tensor], dtype: torch.dtype, *, out: torch.Tensor | None = None,
                   chunk_rows: int | None = None, reuse: bool = False) -> torch.Tensor:
    """The 2-D weight decoded and cast to ``dtype``, chunk of rows by chunk of rows: the logical
    dtype's values of one chunk (``chunk_rows`` x in_features) at a time, each cast into ``out``
    (round to nearest even, as ``.to(dtype)``).  Bit-identical to ``decode(...).to(dtype)``.
    ``reuse``: decode into this thread's workspace (the caller must not keep the result)."""
    from .dtypes import LOGICAL_TORCH

    n, k = desc.shape
    dev = next(iter(comps.values())).device if comps else torch.device("cpu")
    src = TensorSource(comps, dev)
    if out is None:
        out = _workspace(n * k, dtype, dev).view(n, k) if reuse else empty((n, k), dtype, dev)
    step = chunk_rows or chunk_rows_for(n, k)
    logical = LOGICAL_TORCH[desc.dtype]
    if logical == dtype and chunk_rows is None:  # straight into out (the decoder chunks internally, in cache)
        return decode(desc, src, None, tensor="weight", out=out)
    scratch = None if logical == dtype else empty((min(step, n), k), logical, dev)
    for a in range(0, n, step):
        b = min(n, a + step)
        if scratch is None:
            decode(desc, src, ((a, b), (0, k)), tensor="weight", out=out[a:b])
        else:
            out[a:b].copy_(decode(desc, src, ((a, b), (0, k)), tensor="weight", out=scratch[: b - a]))
    return out


def linear_streamed(desc: Descriptor, comps: dict[str, torch.Tensor], x: torch.Tensor, bias: torch.Tensor | None,
                    chunk_rows: int | None = None) -> torch.Tensor:
    """``F.linear`` one chunk of output rows at a time: nothing larger than chunk x in_features of
    the weight exists at once.  Each output equals F.linear on that chunk's rows; torch's GEMMs
    may round a row block differently from the whole matrix (bfloat16 with many tokens)."""
    import torch.nn.functional as F

    n, k = desc.shape
    step = chunk_rows or chunk_rows_for(n, k)
    y = torch.empty(x.shape[:-1] + (n,), dtype=x.dtype, device=x.device)
    keep = torch.is_grad_enabled() and x.requires_grad  # autograd keeps each chunk: no shared buffer
    buf = None if keep else _workspace(min(step, n) * k, x.dtype, x.device).view(-1, k)
    for a in range(0, n, step):
        b = min(n, a + step)
        dst = empty((b - a, k), x.dtype, x.device) if buf is None else buf[: b - a]
        w = _decode_rows(desc, comps, a, b, x.dtype, dst)
        y[..., a:b] = F.linear(x, w, None if bias is None else bias[a:b])
    return y


def _decode_rows(desc: Descriptor, comps: dict[str, torch.Tensor], a: int, b: int, dtype: torch.dtype, out: torch.Tensor) -> torch.Tensor:
    from .dtypes import LOGICAL_TORCH

    k = desc.shape[1]
    dev = out.device
    src = TensorSource(comps, dev)
    logical = LOGICAL_TORCH[desc.dtype]
    if logical == dtype:
        return decode(desc, src, ((a, b), (0, k)), tensor="weight", out=out)
    return out.copy_(decode(desc, src, ((a, b), (0, k)), tensor="weight", out=empty((b - a, k), logical, dev)))
