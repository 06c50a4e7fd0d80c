"""The native decode kernel (qformat.kernels, issue 23) against the NumPy reference decoder.

Every case decodes the same descriptor twice, once on the NumPy path (``kernels.use("numpy")``,
the reference the conformance corpus checks) and once on each native level this CPU has, and
compares the bits (NaN by class).  The NumPy fallback is tested as a fallback: forced by
``QFORMAT_KERNELS=numpy`` in a fresh process.  The kernel's own argument checks are tested by
calling it with wrong sizes and out-of-range parameter cells; the sanitizer test
(``test_sanitized_kernel_on_mutants``) builds the C file with AddressSanitizer and
UndefinedBehaviorSanitizer and decodes corpus mutants through it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from qformat import kernels
from qformat.decode import decode, native_covers
from qformat.descriptor import parse_descriptor
from qformat.sources import ArraySource

ROOT = Path(__file__).resolve().parents[1]
native = pytest.mark.skipif(not kernels.info()["built"], reason="the native extension is not built")
LEVELS = [lv for lv in kernels.LEVELS if kernels.info()["built"] and kernels.LEVELS.index(lv) <= kernels.LEVELS.index(kernels.info()["cpu_level"])]


def _pk(axis=1, **kw):
    return dict({"container": 8, "bit_order": "lsb_first", "axis": axis}, **kw)


def _special_f32(rng, n):
    """binary32 values of every class: zeros of both signs, subnormals, values on binary16 and
    bfloat16 rounding ties and overflow edges, infinities, NaNs, and random bit patterns."""
    edges = np.array([0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x33000000, 0x33000001, 0x337FFFFF,
                      0x38800000, 0x387FE000, 0x387FF000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x7F7FFFFF,
                      0x3F808000, 0x3F818000, 0x3F807FFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
                      0x3F800000, 0xBF800000, 0x3C000000, 0x00400000], np.uint32)
    rand = rng.integers(0, 2**32, n - len(edges), dtype=np.uint64).astype(np.uint32)
    return np.concatenate([edges, rand]).view(np.float32)


def _cases():
    """(name, descriptor dict, components) covering each way the kernel reads codes and
    parameters: packed bytes (1, 2, 4 codes per byte, both bit orders), unpacked codes (odd
    widths, streams, planes, 1-bit, a storage order), constant / block / flat / per-column
    parameter cells, two-level parameters, and elements with every class of value."""
    rng = np.random.default_rng(23)
    out = []

    def add(name, shape, el, pk, params, codes, **comps):
        d = {"shape": list(shape), "dtype": "float32", "codes": {"tensor": "codes", "element": el, "packing": pk}}
        d.update(params)
        out.append((name, d, dict(codes=codes, **comps)))

    nib = lambda r, c: rng.integers(0, 256, (r, c // 2), dtype=np.uint8)  # noqa: E731
    sc = lambda *s: (rng.random(s, np.float32) * 0.02 + 1e-3).astype(np.float16)  # noqa: E731
    i4 = {"type": "int", "bits": 4, "signedness": "twos_complement"}
    u4 = {"type": "int", "bits": 4, "signedness": "unsigned"}
    add("int4 g32", (16, 96), i4, _pk(), {"scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "s"}},
        nib(16, 96), s=sc(16, 3))
    add("int4 g32 asym msb", (16, 96), u4, _pk(bit_order="msb_first"),
        {"zero": {"blocks": {"type": "grid", "size": [1, 32]}, "tensor": "z"},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "s"}},
        nib(16, 96), z=rng.integers(0, 16, (16, 3), dtype=np.uint8), s=sc(16, 3))
    add("int4 g40 partial, divide, bias", (6, 100), i4, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [1, 40]}, "op": "divide", "tensor": "s"},
         "bias": {"blocks": {"type": "grid", "size": [2, None]}, "op": "subtract", "tensor": "b"}},
        nib(6, 100), s=sc(6, 3), b=rng.standard_normal((3, 1)).astype(np.float32))
    add("nf4 flat 64", (8, 96), {"type": "codebook", "bits": 4, "table": "nf4"}, _pk(),
        {"scale": {"blocks": {"type": "flat", "size": 64}, "op": "multiply", "tensor": "s"}},
        nib(8, 96), s=rng.random(12, np.float32))
    add("nf4 flat 7 over odd rows", (5, 6), {"type": "codebook", "bits": 4, "table": "nf4"}, _pk(),
        {"scale": {"blocks": {"type": "flat", "size": 7}, "op": "multiply", "tensor": "s"}},
        nib(5, 6), s=rng.random(5, np.float32))
    add("int8 per-row", (8, 40), {"type": "int", "bits": 8, "signedness": "twos_complement"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [1, None]}, "op": "multiply", "tensor": "s"}},
        rng.integers(-128, 128, (8, 40), dtype=np.int8), s=rng.random((8, 1), np.float32))
    add("int8 per-column", (8, 40), {"type": "int", "bits": 8, "signedness": "twos_complement"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [None, 1]}, "op": "multiply", "tensor": "s"}},
        rng.integers(-128, 128, (8, 40), dtype=np.int8), s=rng.random((1, 40), np.float32))
    add("int2 per-tensor", (4, 64), {"type": "int", "bits": 2, "signedness": "twos_complement"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [None, None]}, "op": "multiply", "tensor": "s"}},
        rng.integers(0, 256, (4, 16), dtype=np.uint8), s=np.array([[0.5]], np.float32))
    add("int1 (8 per byte, unpacked path)", (4, 64), {"type": "int", "bits": 1, "signedness": "unsigned"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [1, 16]}, "op": "multiply", "tensor": "s"}},
        rng.integers(0, 256, (4, 8), dtype=np.uint8), s=sc(4, 4))
    add("int3 stream, rank 3 axis-0 groups", (4, 3, 16), {"type": "int", "bits": 3, "signedness": "twos_complement"}, _pk(axis=2),
        {"scale": {"blocks": {"type": "grid", "size": [2, None, None]}, "op": "multiply", "tensor": "s"}},
        rng.integers(0, 256, (4, 3, 6), dtype=np.uint8), s=sc(2, 1, 1))
    add("int4 flat packing, odd width", (5, 7), i4, _pk(axis=None),
        {"scale": {"blocks": {"type": "grid", "size": [1, 4]}, "op": "multiply", "tensor": "s"}},
        rng.integers(0, 256, 18, dtype=np.uint8), s=sc(5, 2))
    add("q4_0 planes span 32", (4, 64), {"type": "int", "bits": 4, "signedness": "offset_binary"}, _pk(planes={"span": 32}),
        {"scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "s"}},
        nib(4, 64), s=sc(4, 2))
    gidx = (np.arange(24) * 7 % 3).astype(np.int32)
    add("act-order group index on the last axis", (4, 24), u4, _pk(),
        {"zero": {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "g", "count": 3}}, "tensor": "z"},
         "scale": {"blocks": {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": "g", "count": 3}}, "op": "multiply", "tensor": "s"}},
        nib(4, 24), z=rng.integers(0, 16, (4, 3), dtype=np.uint8), s=sc(4, 3), g=gidx)
    e4 = rng.integers(0, 256, (6, 32), dtype=np.uint8)
    add("fp8 e4m3 (NaN codes) per-row", (6, 32), {"type": "float", "format": "e4m3fn"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [1, None]}, "op": "multiply", "tensor": "s"}},
        e4.view(ml_dtypes.float8_e4m3fn), s=rng.random((6, 1), np.float32))
    g16 = 4
    add("nvfp4 (two-level scale)", (8, 64), {"type": "float", "format": "e2m1fn"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [1, 16]}, "op": "multiply",
                   "encoded": {"shape": [8, g16], "dtype": "float32",
                               "codes": {"tensor": "sc", "element": {"type": "float", "format": "e4m3fn"}, "packing": _pk()},
                               "scale": {"blocks": {"type": "grid", "size": [None, None]}, "op": "multiply", "tensor": "ss"}}}},
        nib(8, 64), sc=rng.integers(0x20, 0x60, (8, g16), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn), ss=np.array(0.0123, np.float32))
    # every class of binary32 value, through every operation: a 256-entry codebook of special
    # values, per-row zero (subtract), per-column scale (divide, zeros included), per-row bias
    table = _special_f32(rng, 256)
    par = _special_f32(rng, 40)
    add("special values, 8-bit codebook table", (40, 40), {"type": "codebook", "bits": 8, "table_tensor": "t"}, _pk(),
        {"zero": {"blocks": {"type": "grid", "size": [1, None]}, "tensor": "z"},
         "scale": {"blocks": {"type": "grid", "size": [None, 1]}, "op": "divide", "tensor": "s"},
         "bias": {"blocks": {"type": "grid", "size": [8, None]}, "op": "add", "tensor": "b"}},
        np.arange(1600, dtype=np.uint32).astype(np.uint8).reshape(40, 40), t=table, z=par.reshape(40, 1)[::-1].copy(),
        s=par.reshape(1, 40), b=par[:5].reshape(5, 1))
    add("special values times 1", (16, 16), {"type": "codebook", "bits": 8, "table_tensor": "t"}, _pk(),
        {"scale": {"blocks": {"type": "grid", "size": [None, None]}, "op": "multiply", "tensor": "s"}},
        np.arange(256, dtype=np.uint8).reshape(16, 16), t=table, s=np.ones((1, 1), np.float32))
    # the same classes through the two-codes-per-byte path (16-entry table, blocks of 16)
    t16 = table[[0, 1, 2, 3, 5, 8, 10, 13, 15, 16, 19, 20, 21, 22, 24, 26]]
    add("special values, 4-bit codebook table", (16, 64), {"type": "codebook", "bits": 4, "table_tensor": "t"}, _pk(),
        {"zero": {"blocks": {"type": "grid", "size": [1, 32]}, "tensor": "z"},
         "scale": {"blocks": {"type": "grid", "size": [1, 16]}, "op": "divide", "tensor": "s"}},
        nib(16, 64), t=t16, z=_special_f32(rng, 32).reshape(16, 2), s=_special_f32(rng, 64).reshape(16, 4))
    return out


CASES = _cases()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bits, NaN by class (SPEC.md 10.4)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.size == 0:  # (zero-size tensors of the corpus may have huge other axes)
        return True
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    if a.dtype.kind in "iub":  # a plain integer tensor of the file
        return bool(np.array_equal(a.view(bits), b.view(bits)))
    na, nb = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    return bool((na == nb).all() and (a.view(bits)[~na] == b.view(bits)[~nb]).all())


def _regions(shape):
    full = tuple((0, n) for n in shape)
    out = [None, ((1, shape[0]),) + full[1:]]
    if shape[-1] > 3:
        out.append(full[:-1] + ((1, shape[-1] - 2),))
    return out


@native
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name,d,comps", CASES, ids=[c[0] for c in CASES])
def test_native_matches_numpy_reference(name, d, comps, dtype, level):
    desc = parse_descriptor("w", dict(d, dtype=dtype))
    src = ArraySource(comps)
    for region in _regions(tuple(d["shape"])):
        with kernels.use("numpy"):
            assert not native_covers(desc)
            want = decode(desc, src, region, threads=1)
        with kernels.use(level):
            assert native_covers(desc)
            for threads in (1, 2):
                got = decode(desc, src, region, threads=threads)
                assert _same(got, want), (name, dtype, level, region, threads)


@native
def test_native_decode_of_large_tensor_is_chunked_and_threaded():
    """Many chunks on two threads give the bits of one NumPy pass."""
    rng = np.random.default_rng(1)
    rows, cols = 512, 4096
    d = {"shape": [rows, cols], "dtype": "bfloat16",
         "codes": {"tensor": "c", "element": {"type": "codebook", "bits": 4, "table": "nf4"}, "packing": _pk()},
         "scale": {"blocks": {"type": "grid", "size": [1, 64]}, "op": "multiply", "tensor": "s"}}
    desc = parse_descriptor("w", d)
    src = ArraySource({"c": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), "s": rng.random((rows, 64), np.float32)})
    with kernels.use("numpy"):
        want = decode(desc, src, threads=1)
    assert _same(decode(desc, src, threads=2), want)


@native
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("scheme", ["int4 g32 lsb", "nf4 b64 msb"])
def test_streamed_float32_output_has_the_reference_bits(level, scheme):
    """A float32 output of at least STREAM_FROM_BYTES is written with non-temporal stores
    (64-byte-aligned lines, the nibble rows): the same bits as the NumPy path, in decode()'s own
    aligned output, in a caller's output that is not 64-byte aligned, and at 1 and 2 threads."""
    rng = np.random.default_rng(5)
    rows, cols = 1056, 4096  # 17.3 MB of float32; 1056 rows: the chunks do not divide evenly
    assert rows * cols * 4 >= kernels.STREAM_FROM_BYTES
    codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    if scheme.startswith("int4"):
        el, g = {"type": "int", "bits": 4, "signedness": "twos_complement"}, 32
        pk = _pk()
    else:
        el, g = {"type": "codebook", "bits": 4, "table": "nf4"}, 64
        pk = _pk(bit_order="msb_first")
    scale = _special_f32(rng, rows * cols // g).reshape(rows, cols // g)
    d = {"shape": [rows, cols], "dtype": "float32", "codes": {"tensor": "c", "element": el, "packing": pk},
         "scale": {"blocks": {"type": "grid", "size": [1, g]}, "op": "multiply", "tensor": "s"}}
    desc = parse_descriptor("w", d)
    src = ArraySource({"c": codes, "s": scale})
    with kernels.use("numpy"):
        want = decode(desc, src, threads=1)
    with kernels.use(level):
        for threads in (1, 2):
            got = decode(desc, src, threads=threads)
            assert got.ctypes.data % 64 == 0 and _same(got, want), (level, threads)
            raw = np.empty(rows * cols * 4 + 64, np.uint8)
            k = (-raw.ctypes.data % 64) + 4  # 4 bytes past a line boundary
            out = raw[k : k + rows * cols * 4].view(np.float32).reshape(rows, cols)
            assert decode(desc, src, out=out, threads=threads) is out and _same(out, want), (level, threads)

def test_info_says_which_path_runs():
    i = kernels.info()
    assert set(i) == {"path", "level", "cpu_level", "built", "reason", "matmul"}
    assert set(i["matmul"]) == {"level", "bf16", "bf16_table", "amx", "threads"}
    # the bfloat16-table path follows its switch (tests and benchmarks turn it off)
    if i["matmul"]["bf16"]:
        from qformat.kernels import _matmul as mm

        assert i["matmul"]["bf16_table"] is True
        mm.bf1(0)
        try:
            assert kernels.info()["matmul"]["bf16_table"] is False
        finally:
            mm.bf1(1)
    with kernels.use("numpy"):
        assert kernels.info()["path"] == "numpy" and kernels.info()["level"] is None
    assert kernels.info() == i
    with pytest.raises(ValueError):
        with kernels.use("sse9"):
            pass


def test_numpy_fallback_in_a_fresh_process(tmp_path):
    """QFORMAT_KERNELS=numpy: the NumPy path runs (as on a machine where the extension did
    not build) and decodes the same bits."""
    import json

    name, d, comps = CASES[1]
    np.savez(tmp_path / "c.npz", **comps)
    code = """
import json, sys, numpy as np
from qformat import kernels
from qformat.decode import decode
from qformat.descriptor import parse_descriptor
from qformat.sources import ArraySource
comps = dict(np.load(sys.argv[1]))
out = decode(parse_descriptor("w", json.loads(sys.argv[2])), ArraySource(comps), threads=1)
print(json.dumps(kernels.info()), out.view(np.uint32).sum(dtype=np.uint64))
"""
    env = dict(os.environ, QFORMAT_KERNELS="numpy")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.npz"), json.dumps(d)], env=env, capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    info_s, total = r.stdout.rsplit(" ", 1)
    info = json.loads(info_s)
    assert info["path"] == "numpy" and info["reason"] == "QFORMAT_KERNELS=numpy"
    with kernels.use("numpy"):
        want = decode(parse_descriptor("w", d), ArraySource(comps), threads=1)
    assert int(total) == int(want.view(np.uint32).sum(dtype=np.uint64))


def test_without_the_extensions_everything_takes_the_numpy_paths(tmp_path):
    """As on a machine where no compiler built the extensions: both modules made unimportable in a
    fresh process; qformat decodes with NumPy (info() says why), QLinear of nf4 and int4 decodes
    per forward and equals F.linear on the decoded weight, and the JAX reader keeps its jitted
    decoder on the CPU."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    code = """
import sys, importlib.abc
class NoExtensions(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("qformat.kernels._native", "qformat.kernels._matmul", "qformat.kernels._ggml"):
            raise ImportError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoExtensions())
import numpy as np, torch, jax, qformat, qformat_jax
from qformat import kernels
info = kernels.info()
assert info["path"] == "numpy" and not info["built"] and not kernels.matmul_available(), info
from qformat_torch.nn import QLinear
lin = torch.nn.Linear(128, 32)
for scheme, kw in (("nf4", {}), ("int", {"bits": 4, "group_size": 32})):
    ql = QLinear.from_linear(lin, scheme, **kw)
    x = torch.randn(3, 128)
    with torch.no_grad():
        assert ql.kernel_path != "lut_grouped", ql.kernel_path
        y = ql(x)
        assert torch.equal(y, torch.nn.functional.linear(x, ql.dequantize_weight(), lin.bias)), scheme
assert not qformat_jax.host_decodes(jax.devices("cpu")[0])
assert not kernels.ggml_available()
from qformat.schemes.ggml_blocks import quantize_blocks
x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
q = qformat.quantize(x, "gguf", type="Q4_K")
assert q.dequantize().shape == (4, 512)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "readers")])))
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


@native
def test_kernel_checks_its_arguments():
    """The C entry point refuses every size or parameter cell outside its buffers (ValueError)
    before it reads a byte, whatever the caller passes."""
    codes = np.zeros((4, 8), np.uint8)
    bt = np.zeros((256, 2), np.float32)
    out = np.zeros((4, 16), np.float32)
    v = np.ones(8, np.float32)
    row = np.arange(4, dtype=np.int64) * 2
    ok = (1, kernels.MODE_BLOCK, v, row, None, 0, 8)
    kernels.fused(codes, 8, 4, 16, 2, bt, [ok], out, 0)  # the baseline call is accepted
    bad = [
        (codes[:3], 8, 4, 16, 2, bt, [ok], out, 0),  # codes too short
        (codes, 8, 4, 16, 2, bt[:255], [ok], out, 0),  # byte table too short
        (codes, 8, 4, 16, 3, bt, [ok], out, 0),  # 3 codes per byte
        (codes, 8, 4, 15, 2, bt, [ok], out, 0),  # half a byte per row
        (codes, 8, 4, 16, 2, bt, [ok], out[:3], 0),  # output too short
        (codes, 8, 4, 16, 2, bt, [ok], out, 7),  # no such output kind
        (codes, 8, 4, 16, 2, bt, [ok] * 4, out, 0),  # four parameters
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_BLOCK, v[:7], row, None, 0, 8)], out, 0),  # last cell past the values
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_BLOCK, v, row, None, 0, 0)], out, 0),  # blocks of 0
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_BLOCK, v, row - 1, None, 0, 8)], out, 0),  # negative cell
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_BLOCK, v, row[:3], None, 0, 8)], out, 0),  # a row offset missing
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_CONST, v, row + 2, None, 0, 1)], out, 0),  # const cell past the end
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_FLAT, v, row * 16, None, 0, 8)], out, 0),  # flat cells past the end
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_COLS, v, row, np.zeros(15, np.int64), 0, 1)], out, 0),  # colidx short
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_COLS, v, row, np.full(16, 2, np.int64), 0, 1)], out, 0),  # col cell past
        (codes, 8, 4, 16, 2, bt, [(1, kernels.MODE_COLS, v, row, np.full(16, -1, np.int64), 0, 1)], out, 0),  # negative col
        (codes, 8, 4, 16, 2, bt, [(9, kernels.MODE_BLOCK, v, row, None, 0, 8)], out, 0),  # no such op
        (codes, 8, 4, 16, 2, bt, [(1, 9, v, row, None, 0, 8)], out, 0),  # no such mode
    ]
    for i, args in enumerate(bad):
        with pytest.raises(ValueError):
            kernels.fused(*args)
            pytest.fail(f"bad call {i} accepted")
    with pytest.raises(TypeError):
        kernels.fused(codes, 8, 4, 16, 2, bt, [ok], out.view(np.float32)[:, ::2], 0)  # not contiguous


#: The C sources of an extension built from more than its own file (setup.py's SOURCES): the decode
#: wrapper compiles libqformat's fused kernel.
_SOURCES = {"_native": ["qformat/kernels/_native.c", "libqformat/src/kernel.c"]}


def _sanitized_build(name: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """qformat/kernels/``name``.c built with -fsanitize=address,undefined (any report aborts),
    and the environment that preloads the sanitizer runtimes; skips without a compiler or ASan."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    asan = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    ubsan = subprocess.run([cc, "-print-file-name=libubsan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(asan) or not os.path.exists(asan):
        pytest.skip("the compiler has no AddressSanitizer runtime")
    so = tmp_path / (name + sysconfig.get_config_var("EXT_SUFFIX"))
    # -O0: the sanitizers instrument every access and check every operation in the source at any
    # level (-O0 keeps more of them, nothing is folded away), and these runs are small; the build
    # is most of each test's time and -O1 made it 3-4 times longer (_matmul.c: 47 s of CPU against
    # 12, its run 1.5 s either way)
    build = subprocess.run([cc, "-O0", "-g", "-std=c11", "-ffp-contract=off", "-fno-omit-frame-pointer",
                            "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-shared", "-fPIC",
                            "-I" + sysconfig.get_paths()["include"], "-I" + str(ROOT / "libqformat/src"),
                            *[str(ROOT / s) for s in _SOURCES.get(name, [f"qformat/kernels/{name}.c"])], "-o", str(so)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = dict(os.environ, LD_PRELOAD=" ".join(p for p in (asan, ubsan) if os.path.isabs(p)),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return so, env


_SANITIZED = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("qformat.kernels._native", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sys.modules["qformat.kernels._native"] = mod
from qformat import kernels
assert kernels.info()["path"] == "native", kernels.info()
import numpy as np
from pathlib import Path
import qformat, tempfile
from qformat.errors import QFormatError
from tests.test_kernels import CASES
from tests.test_spec_differential import mutants
from qformat.decode import decode
from qformat.descriptor import parse_descriptor
from qformat.sources import ArraySource
levels = [lv for lv in kernels.LEVELS if kernels.LEVELS.index(lv) <= kernels.LEVELS.index(kernels.info()["cpu_level"])]
for lv in levels:
    with kernels.use(lv):
        for name, d, comps in CASES:
            for dt in ("float32", "float16", "bfloat16"):
                decode(parse_descriptor("w", dict(d, dtype=dt)), ArraySource(comps), threads=2)
counts = {"decoded": 0, "refused": 0}


def read(path):
    try:
        with np.errstate(all="ignore"):
            qformat.load_file(path)
        counts["decoded"] += 1
    except QFormatError:
        counts["refused"] += 1


with tempfile.TemporaryDirectory() as tmp:
    p = Path(tmp) / "m.safetensors"
    for label, data in mutants(int(sys.argv[2]), 7):
        p.write_bytes(data)
        read(p)
for f in sorted((Path(sys.argv[3])).glob("**/*.safetensors")):
    read(f)
decoded, refused = counts["decoded"], counts["refused"]
print("decoded", decoded, "refused", refused)
"""


@native
def test_sanitized_kernel_on_mutants(tmp_path):
    """The C file built with -fsanitize=address,undefined decodes the kernel cases, the
    conformance corpus and corpus mutants (the differential fuzzer's) with no invalid read or
    write and no undefined behaviour (any report aborts the process)."""
    so, env = _sanitized_build("_native", tmp_path)
    corpus = ROOT / "conformance" / "v1"
    env.update(QFORMAT_KERNELS="auto", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _SANITIZED, str(so), os.environ.get("QFORMAT_SANITIZE_MUTANTS", "150"), str(corpus)],
                       env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.stdout.startswith("decoded"), r.stdout


_SANITIZED_MATMUL = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("qformat.kernels._matmul", sys.argv[1])
mm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mm)
rng = np.random.default_rng(0)
kinds = {0: 16, 1: 256, 2: 256, 3: 256, 4: 256, 5: 256}
import ml_dtypes
c = np.arange(256, dtype=np.uint8)
tables = {0: rng.standard_normal(16).astype(np.float32), 1: c.view(np.int8).astype(np.float32), 2: c.astype(np.float32),
          3: np.where(np.isnan(c.view(ml_dtypes.float8_e4m3fn).astype(np.float32)), 0, c.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).astype(np.float32),
          4: c.view(ml_dtypes.float8_e5m2).astype(np.float32), 5: rng.standard_normal(256).astype(np.float32)}
levels = list(range(mm.cpu_level() + 1))
runs = 0
for kind in kinds:
    for m in (1, 2, 5, 9, 17):
        for k, g, n in ((64, 16, 7), (96, 32, 7), (256, 64, 7), (128, 128, 7), (40, 8, 7), (64, 32, 150), (96, 16, 37)):
            if kind == 0 and k % 2:
                continue
            w = rng.integers(0, 256, (n, k // 2 if kind == 0 else k), dtype=np.uint8)
            if kind == 3:
                w &= 0xF7  # no NaN code (the caller's rule for this kind)
            if kind == 4:
                w &= 0xBF  # finite e5m2 codes (NaN and infinity would make the reference NaN)
            x = rng.standard_normal((m, k)).astype(np.float32)
            ps = [rng.standard_normal((n, k // g)).astype(np.float32) if rng.random() < 0.6 else None for _ in range(3)]
            codes = np.stack([w & 15, w >> 4], -1).reshape(n, k) if kind == 0 else w
            wf = tables[kind][codes].astype(np.float64)
            z, s, b = (np.repeat(p.astype(np.float64), g, 1) if p is not None else None for p in ps)
            wf = wf - (z if z is not None else 0)
            wf = wf * (s if s is not None else 1)
            wf = wf + (b if b is not None else 0)
            ref = x.astype(np.float64) @ wf.T
            absx = np.abs(x).astype(np.float64) @ np.abs(wf).T
            bound = 1e-5 * absx + 1e-30
            for lv in levels:
                # bf16x (lv 2): AVX512_BF16 / AMX products for several rows, x and the weights
                # rounded to bfloat16 (a looser bound); threads: the pool's shares
                for bf, threads in ((0, 1), (0, 3), (1, 1), (1, 2)) if lv == 2 else ((0, 1), (0, 3)):
                    loose = 2.0**-6 if bf else 0.0
                    # every column range on one thread; with several, the whole and an inner range
                    # (the shares' edges), which keeps the sanitized run within a minute
                    for n0, n1 in ((0, n), (2, 5), (6, 7), (3, 3), (1, n - 1)) if threads == 1 else ((0, n), (1, n - 1)):
                        y = np.full((m, n), np.nan, np.float32)
                        mm.matmul(x, m, k, w, n, kind, tables[kind], g, ps[0], ps[1], ps[2], y, n0, n1, lv, bf, threads)
                        ok = np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= bound[:, n0:n1] + loose * absx[:, n0:n1]
                        assert ok.all(), (kind, m, k, g, lv, n0, n1, bf, threads)
                        assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()  # nothing outside the range
                        runs += 1
# the bfloat16-table path (row1_bfs, few_bfs: scale-only 4-bit codes, bfloat16 x, 1 to 8 rows;
# K with and without a last 64 columns) on every group size it takes, where the CPU has it
if mm.bf1():
    for m in (1, 2, 5, 8):
        for k, g, n in ((64, 16, 7), (192, 32, 37), (256, 64, 150), (384, 128, 7), (256, 256, 40)):
            w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
            s = rng.standard_normal((n, k // g)).astype(np.float32)
            x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16).astype(np.float32)
            codes = np.stack([w & 15, w >> 4], -1).reshape(n, k)
            wf = tables[0][codes].astype(np.float32) * np.repeat(s, g, 1)
            ref = x.astype(np.float64) @ wf.astype(np.float64).T
            absx = np.abs(x).astype(np.float64) @ np.abs(wf.astype(np.float64)).T
            for threads in (1, 2):
                for n0, n1 in ((0, n), (1, n - 1)):
                    y = np.full((m, n), np.nan, np.float32)
                    mm.matmul(x, m, k, w, n, 0, tables[0], g, None, s, None, y, n0, n1, 2, 1, threads)
                    ok = np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= (2.0**-8 + 1e-5) * absx[:, n0:n1] + 1e-30
                    assert ok.all(), ("bf1", m, k, g, threads, n0, n1)
                    assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()
                    runs += 1
# the tiled path of many bfloat16 rows (blk_bf, blk_bfvb: more than 1 MiB of x), its heap tile
# and packed x, a share's last tile masked
if mm.cpu_bf16():
    for kind, g in ((0, 32), (5, 32), (1, 64)):
        m, k, n = 300, 2048, 70
        w = rng.integers(0, 256, (n, k // 2 if kind == 0 else k), dtype=np.uint8)
        tab = tables[kind] if kind != 5 else tables[5].astype(ml_dtypes.bfloat16).astype(np.float32)  # bfloat16 values: the planes
        s = rng.standard_normal((n, k // g)).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16).astype(np.float32)
        codes = np.stack([w & 15, w >> 4], -1).reshape(n, k) if kind == 0 else w
        wf = tab[codes].astype(np.float32) * np.repeat(s, g, 1)
        ref = x.astype(np.float64) @ wf.astype(np.float64).T
        absx = np.abs(x).astype(np.float64) @ np.abs(wf.astype(np.float64)).T
        for threads in (1, 2):
            for n0, n1 in ((0, n), (1, n - 1)):
                y = np.full((m, n), np.nan, np.float32)
                mm.matmul(x, m, k, w, n, kind, tab, g, None, s, None, y, n0, n1, 2, 1, threads)
                assert (np.abs(y[:, n0:n1] - ref[:, n0:n1]) <= (2.0**-8 + 1e-5) * absx[:, n0:n1] + 1e-30).all(), ("tiles", kind, threads, n0, n1)
                assert np.isnan(y[:, :n0]).all() and np.isnan(y[:, n1:]).all()
                runs += 1
print("runs", runs)
"""


_SANITIZED_GGML = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("qformat.kernels._ggml", sys.argv[1])
gg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gg)
from qformat.schemes.ggml_blocks import SIZES, TYPES, quantize_blocks
rng = np.random.default_rng(0)
rows = [rng.standard_normal(512), np.zeros(512), np.full(512, 0.25), rng.standard_normal(512) * 1e-39,
        rng.standard_normal(512) * 1e-30, rng.uniform(0, 1, 512), -rng.uniform(0, 1, 512), rng.standard_t(1.2, 512),
        rng.integers(-4, 4, 512).astype(float), rng.standard_normal(512) * 3e3]
x = np.concatenate(rows).astype(np.float32)
levels = [0, 1] + ([2] if gg.best_level() == 2 else [])
runs = 0
import ml_dtypes
for src, dt in ((0, np.float32), (1, np.float16), (2, ml_dtypes.bfloat16)):
    xs = x.astype(dt)  # float16 / bfloat16 sources are read as stored
    xf = xs.astype(np.float32)
    for t in TYPES:
        want = quantize_blocks(xf.reshape(-1, SIZES[t][0]), t).reshape(-1)
        for lv in levels:
            out = np.empty(want.size, np.uint8)
            top = gg.quantize(t, xs, out, lv, src)
            assert np.array_equal(out, want), (t, lv, src)
            assert top == float(np.abs(xf).max()), (t, lv, src, top)
            runs += 1
from qformat.schemes.ggml_weighted import quantize_rows_weighted
xr = x.reshape(-1, 512)
for w in (rng.gamma(1.0, 1.0, 512), np.zeros(512), np.where(rng.random(512) < 0.9, 0.0, 1e4)):
    w = w.astype(np.float32)
    for t in TYPES:
        want = quantize_rows_weighted(xr, t, w).reshape(-1)
        for lv in levels:
            out = np.empty(want.size, np.uint8)
            gg.quantize_weighted(t, xr, w, out, lv)
            assert np.array_equal(out, want), ("weighted", t, lv)
            runs += 1
for bad in ((x[:33], np.empty(18, np.uint8)), (x[:32], np.empty(17, np.uint8)), (x[:32], np.empty(18, np.uint8), -1, 3),
            (x[:24], np.empty(18, np.uint8), -1, 1)):
    try:
        gg.quantize("Q4_0", *bad)
        raise AssertionError("accepted")
    except ValueError:
        pass
w32 = np.ones(32, np.float32)
for bad in ((x[:33], w32, np.empty(18, np.uint8)), (x[:32], w32, np.empty(17, np.uint8)), (x[:32], w32[:31], np.empty(18, np.uint8)),
            (x[:32], w32[:0], np.empty(0, np.uint8))):
    try:
        gg.quantize_weighted("Q4_0", *bad)
        raise AssertionError("accepted")
    except ValueError:
        pass
# the block readers and writers of a GGUF export and of scheme gguf (extract_packed, insert,
# unpack), run through qformat with this module as its _ggml and compared with the NumPy paths
import qformat
from qformat import kernels, packing
from qformat.export.gguf import BY_NAME, _insert, _insert_numpy
kernels._ggml = gg
def comps(t):
    q = qformat.quantize(xr[:6], "gguf", type=t)
    return {k: np.asarray(v).tobytes() for k, v in q.components.items()}
for t in TYPES:
    with kernels.use("numpy"):
        want = comps(t)
    assert comps(t) == want, ("extract_packed", t)
    runs += 1
for t in ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
    f = BY_NAME[t].codes
    codes = rng.integers(0, 1 << f.bits, (33, f.parts[0][0].size), dtype=np.uint8)
    lut = rng.permutation(256).astype(np.uint8) & np.uint8((1 << f.bits) - 1)
    for table in (None, lut):
        a, b = np.zeros((33, BY_NAME[t].size), np.uint8), np.zeros((33, BY_NAME[t].size), np.uint8)
        _insert(a, f, codes, table)
        _insert_numpy(b, f, codes if table is None else table[codes])
        assert (a == b).all(), ("insert", t, table is None)
        runs += 1
for bits in range(1, 9):
    for length in (1, 31, 33, 577):
        p = packing.Packing(8, "lsb_first", 1)
        words = rng.integers(0, 256, (3, p.words_per_row(length, bits) + 2), dtype=np.uint8)
        assert (packing.unpack_rows(words, bits, p, length) == packing.unpack_rows_numpy(words, bits, p, length)).all(), ("unpack", bits)
        runs += 1
print("runs", runs)
"""


@native
def test_sanitized_ggml_quantizers(tmp_path):
    """qformat/kernels/_ggml.c built with -fsanitize=address,undefined: every type on every
    level (scalar, baseline lanes, AVX2 lanes where the CPU has it) and source kind (float32,
    and float16 / bfloat16 read as stored) on awkward rows (zeros, constants, subnormal and tiny
    blocks, one sign, heavy tails, integers), each equal to the NumPy reference byte for byte
    with the input's largest magnitude returned, the importance-weighted quantizers the same way under three
    importance vectors (gamma, all zero, 90% zero with 1e4 spikes), and sizes that are not whole
    blocks or rows refused; then, as qformat's _ggml, the block readers and writers (scheme gguf's
    extract_packed for every type, a GGUF export's insert with and without a code table, and the
    stream unpack of every width), each equal to its NumPy path."""
    so, env = _sanitized_build("_ggml", tmp_path)
    r = subprocess.run([sys.executable, "-c", _SANITIZED_GGML, str(so)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    assert r.stdout.startswith("runs"), r.stdout


@native
def test_sanitized_matmul_kernel(tmp_path):
    """qformat/kernels/_matmul.c built with -fsanitize=address,undefined: every code kind, 1 to 17
    rows of x, groups of 8 to 128, 7 to 150 columns, partial column ranges, one and several
    threads (the native pool: the sanitized module is loaded without torch, so no OpenMP), the
    bfloat16 products (AVX512_BF16 / AMX) where this CPU has them, and the bfloat16-table path of
    scale-only 4-bit codes (1 to 8 rows, every group size it takes) and the tiles of many bfloat16
    rows (300 x 2048: past 1 MiB of x; 4-bit, byte-plane and int8 codes), on every level this CPU has,
    against a float64 reference, with no invalid access or undefined behaviour; columns outside
    the range asked for are never written."""
    so, env = _sanitized_build("_matmul", tmp_path)
    r = subprocess.run([sys.executable, "-c", _SANITIZED_MATMUL, str(so)], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.stdout.startswith("runs"), r.stdout


_POOL_AFTER_FORK = """
import multiprocessing as mp, os, numpy as np
from qformat import kernels as qk
assert qk.info()["matmul"]["threads"] == "pool", qk.info()  # no OpenMP runtime in this process
rng = np.random.default_rng(0)
codes = rng.integers(0, 256, (1024, 128), dtype=np.uint8)
tab = rng.standard_normal(16).astype(np.float32)
s = rng.standard_normal((1024, 8)).astype(np.float32)
x = rng.standard_normal((3, 256)).astype(np.float32)
def run(threads):
    y = np.full((3, 1024), np.nan, np.float32)
    qk.matmul(x, codes, "nib4", tab, 32, None, s, None, y, threads=threads)
    return y
y1 = run(1)
assert all(np.array_equal(run(t), y1) for t in (2, 3, 4))
def child():
    os._exit(0 if np.array_equal(run(2), y1) else 3)
p = mp.get_context("fork").Process(target=child)
p.start()
p.join(60)
print("child", p.exitcode)
"""


@native
def test_matmul_pool_splits_columns_and_survives_fork():
    """Without an OpenMP runtime in the process the matmul's shares run on the extension's own
    pool: 2-4 threads give the one-thread output bit for bit, and a child forked after the pool
    ran (its workers not copied) gets its own pool and the same output."""
    if not kernels.matmul_available():
        pytest.skip("the matmul extension is not built")
    r = subprocess.run([sys.executable, "-c", _POOL_AFTER_FORK], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and r.stdout.strip() == "child 0", (r.stdout, r.stderr[-3000:])


@native
def test_bench_kernels_section_rows():
    """bench/kernels.py (the decode-per-scheme rows against np.copyto) on tiny data: a row per
    path and thread count, each checked bit for bit against the NumPy path before timing."""
    from bench.common import Run
    from bench.kernels import bench_kernels

    run = Run(1, True)
    bench_kernels(run, 32, 256)
    names = {(r["section"], r["name"]) for r in run.rows}
    level = kernels.info()["level"]
    for sec in ("kernels int4 g32 -> float32", "kernels nf4 b64 -> bfloat16"):
        assert (sec, f"native ({level}), 2 threads") in names and (sec, "numpy decoder, 1 thread") in names
    assert all(r["x_memcpy"] > 0 for r in run.rows)


@native
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_reader_on_cpu_uses_the_native_kernel(dtype, monkeypatch):
    """The torch reader hands a CPU decode to the native kernel (into the torch output's
    memory) and gets the bits of its own torch steps."""
    torch = pytest.importorskip("torch")
    from qformat_torch import decode as tdec
    from qformat_torch.sources import TensorSource

    name, d, comps = CASES[2]  # int4, partial groups, divide, per-row-pair bias
    desc = parse_descriptor("w", dict(d, dtype=dtype))
    src = TensorSource({k: torch.from_numpy(np.ascontiguousarray(v).view(np.uint8) if v.dtype.kind == "V" else v) for k, v in comps.items()})
    with kernels.use("numpy"):
        want = tdec.decode(desc, src)
    calls = []
    real = tdec.np_decode
    monkeypatch.setattr(tdec, "np_decode", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    got = tdec.decode(desc, src)
    assert calls and got.dtype == want.dtype
    bits = torch.int16 if got.element_size() == 2 else torch.int32
    assert torch.equal(got.view(bits), want.view(bits))


@native
def test_corpus_decodes_alike_on_both_paths():
    """Every file of the conformance corpus gives the same tensors (bits, NaN by class) or the
    same error code on the NumPy path and on the native kernel."""
    import qformat
    from qformat.errors import QFormatError

    def load(path):
        try:
            with np.errstate(all="ignore"):
                return qformat.load_file(path)
        except QFormatError as e:
            return e.code

    files = sorted((ROOT / "conformance" / "v1").glob("**/*.safetensors"))
    assert len(files) > 100
    native_decoded = 0
    for f in files:
        with kernels.use("numpy"):
            want = load(f)
        got = load(f)
        if isinstance(want, str):
            assert got == want, f
            continue
        assert isinstance(got, dict) and sorted(got) == sorted(want), f
        for k in want:
            assert _same(np.asarray(got[k]), np.asarray(want[k])), (f, k)
        native_decoded += 1
    assert native_decoded > 50
