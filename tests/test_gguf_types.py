"""Every ggml tensor type is read bit-exactly: ``qformat convert`` of a GGUF file, then every reader.

The test is parametrized over gguf-py's ``GGMLQuantizationType`` as installed, so a type a new
gguf-py defines joins by itself: it passes once qformat reads it, and fails until then unless it
is listed in :data:`REFUSED` (``xfail`` strict, with the reason), so nothing is skipped silently.
Types qformat knows that the installed gguf-py does not (llama.cpp's ``Q2_0``) are tested too,
their files written by patching the tensor info of a gguf-py-written file.

Each type's GGUF holds, per tensor shape, real quantizations where a quantizer exists (gguf-py's
``gguf.quants.quantize``; else llama.cpp's own ``quantize_<type>`` from ``ggml-quants.c``, with
a random importance vector where the type needs one) and random block bytes with finite scales
(planted f16 edge values included: subnormals, +-0, 65504), so every code, grid row and sign
pattern occurs.  The expected values are the oracles', never the converter's:

- gguf-py's ``gguf.quants.dequantize`` wherever it has a dequantizer;
- llama.cpp's ``dequantize_row_<type>`` (``ggml/src/ggml-quants.c`` from the llama-cpp-python sdist
  that tests/llama_cpp_source.py fetches, compiled once into the cache), for every type that has
  one; where both exist they must agree with each other too;
- Q8_1 has neither (ggml uses it only for activations) and is refused (:data:`REFUSED`).

``qformat.load_file`` (NumPy) must match bit for bit (NaN by class).  One file holding every type
is also read by the JS reader (``node readers/js/bin/qformat-read.mjs``) and libqformat
(``qformat-c read``), and must diff to nothing against the GGUF; ``qformat inspect`` of the GGUF
names a descriptor for every type.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import struct
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

import qformat
from qformat.convert import convert
from qformat.convert import gguf as cg
from qformat.convert import gguf_codes
from qformat.convert.gguf_file import GGML_TYPES
from qformat.errors import QFormatError

REPO = Path(__file__).resolve().parent.parent

#: Types qformat refuses, with the reason (each is an xfail(strict=True) case); every other type
#: the installed gguf-py and the llama.cpp source define is read.
REFUSED: dict[str, str] = {
    "Q8_1": "activation-only: llama.cpp never writes it to a model file, neither ggml nor gguf-py defines a dequantizer, "
            "and they disagree on its block size (ggml 36 bytes, gguf-py 40)",
}

#: Byte offsets of the f16 scales of each type's block (ggml-common.h), to plant finite values.
F16_SCALES: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q8_1": (0, 2),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "Q1_0": (0,), "Q2_0": (0,),
}
#: f16 scales planted in the first blocks: smallest and largest subnormal, +-0, largest finite, 1.
EDGE_F16 = np.array([0x0001, 0x03FF, 0x0000, 0x8000, 0x7BFF, 0x3C00], np.uint16)
PLAIN = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
#: ggml type ids qformat reads beyond the installed gguf-py's enum (tested through llama.cpp's C).
EXTRA_IDS = sorted(set(GGML_TYPES) - {int(t) for t in T})


def _name(tid: int) -> str:
    return GGML_TYPES[tid][0] if tid in GGML_TYPES else T(tid).name


def _sizes(tid: int) -> tuple[int, int]:
    return GGML_TYPES[tid][1:] if tid in GGML_TYPES else gguf.GGML_QUANT_SIZES[T(tid)]


# -- llama.cpp's ggml-quants.c as an oracle -------------------------------------------------------
_STUBS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
static const int64_t BLCK[64] = {@BLOCKS@};
static const size_t TSIZE[64] = {@SIZES@};
size_t ggml_type_size(int type) { return TSIZE[type]; }
size_t ggml_row_size(int type, int64_t ne) { return TSIZE[type] * (size_t)(ne / BLCK[type]); }
const char * ggml_type_name(int type) { (void)type; return "?"; }
"""


def _stubs() -> str:
    """The few ggml.c functions ggml-quants.c calls, with ggml's block sizes (block_q8_1 is 36 bytes)."""
    sizes = {tid: (bs, 36 if tid == 9 else ts) for tid, (_, bs, ts) in GGML_TYPES.items()}
    blocks = ", ".join(f"[{t}] = {bs}" for t, (bs, _) in sorted(sizes.items()))
    tsizes = ", ".join(f"[{t}] = {ts}" for t, (_, ts) in sorted(sizes.items()))
    return _STUBS.replace("@BLOCKS@", blocks).replace("@SIZES@", tsizes)


def _ggml() -> ctypes.CDLL | str:
    """llama.cpp's ggml-quants.c compiled as a shared library (cached), or why it is not here."""
    from tests import llama_cpp_source as src

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler on PATH"
    try:
        tree = src.source_dir("ggml/src", "ggml/include")
    except src.Unavailable as e:
        return f"llama.cpp's source is not available: {e}"
    files = [tree / "ggml/src/ggml-quants.c", tree / "ggml/src/ggml-common.h", tree / "ggml/src/ggml-impl.h"]
    stubs = _stubs()
    key = hashlib.sha256(b"".join(f.read_bytes() for f in files) + stubs.encode()).hexdigest()[:16]
    out = src.cache_root() / f"ggml-quants-{key}"
    lib = out / "libggml_quants.so"
    out.mkdir(parents=True, exist_ok=True)
    with src.locked(out / ".lock"):
        if not lib.exists():
            (out / "stubs.c").write_text(stubs)
            tmp = out / "libggml_quants.so.tmp"
            p = subprocess.run([cc, "-O1", "-shared", "-fPIC", "-std=gnu11", "-DNDEBUG", f"-I{tree}/ggml/include", f"-I{tree}/ggml/src",
                                str(tree / "ggml/src/ggml-quants.c"), str(out / "stubs.c"), "-lm", "-o", str(tmp)],
                               capture_output=True, text=True, timeout=300)
            if p.returncode:  # the source is here: a failed build is a failure, not a skip
                raise RuntimeError(f"ggml-quants.c did not compile: {p.stderr[-2000:]}")
            tmp.replace(lib)
    c = ctypes.CDLL(str(lib))
    c.iq2xs_init_impl(16), c.iq2xs_init_impl(17), c.iq2xs_init_impl(22), c.iq2xs_init_impl(19), c.iq2xs_init_impl(29)
    c.iq3xs_init_impl(256), c.iq3xs_init_impl(512)
    return c


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL | str:
    return _ggml()


def _cname(tid: int) -> str:
    n = _name(tid).lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


def _c_fn(c: ctypes.CDLL | str, name: str):  # type: ignore[no-untyped-def]
    if isinstance(c, str):
        return None
    try:
        return getattr(c, name)
    except AttributeError:
        return None


def c_dequantize(c: ctypes.CDLL | str, tid: int, raw: np.ndarray, n: int) -> np.ndarray | None:
    f = _c_fn(c, f"dequantize_row_{_cname(tid)}")
    if f is None:
        return None
    raw = np.ascontiguousarray(raw, np.uint8)
    y = np.empty(n, np.float32)
    f(raw.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return y


def c_quantize(c: ctypes.CDLL | str, tid: int, x: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    bs, ts = _sizes(tid)
    rows, k = x.reshape(-1, x.shape[-1]).shape
    dst = np.zeros(rows * k // bs * ts, np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    f = _c_fn(c, f"quantize_{_cname(tid)}")
    if f is not None:
        imatrix = (rng.random(k) + 0.1).astype(np.float32)
        f.restype = ctypes.c_size_t
        f(x.ctypes.data_as(ctypes.c_void_p), dst.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(rows), ctypes.c_int64(k),
          imatrix.ctypes.data_as(ctypes.c_void_p))
        return dst
    f = _c_fn(c, f"quantize_row_{_cname(tid)}_ref")
    if f is None:
        return None
    f(x.ctypes.data_as(ctypes.c_void_p), dst.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(rows * k))
    return dst


# -- data ----------------------------------------------------------------------------------------
def random_blocks(tid: int, nblocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random block bytes of type ``tid`` whose scales are finite (edge values in the first blocks)."""
    name = _name(tid)
    bs, ts = _sizes(tid)
    b = rng.integers(0, 256, (nblocks, ts), dtype=np.uint8)
    d = (rng.standard_normal(nblocks) * 0.05).astype(np.float16).view(np.uint16)
    d[: min(nblocks, EDGE_F16.size)] = EDGE_F16[:nblocks]
    for off in F16_SCALES.get(name, ()):
        b[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    if name == "Q8_K":
        b[:, 0:4] = (rng.standard_normal(nblocks) * 0.05).astype(np.float32).view(np.uint8).reshape(-1, 4)
    if name == "IQ1_M":  # d is the top nibbles of the four uint16 scale words
        s = np.ascontiguousarray(b[:, 48:56]).view("<u2") & np.uint16(0x0FFF)
        for i in range(4):
            s[:, i] |= ((d >> np.uint16(4 * i)) & np.uint16(0xF)) << np.uint16(12)
        b[:, 48:56] = s.view(np.uint8)
    return b


def real_blocks(tid: int, shape: tuple[int, ...], rng: np.random.Generator, c: ctypes.CDLL | str) -> np.ndarray | None:
    """A real quantization of normal data (gguf-py's quantizer, else llama.cpp's), or None."""
    x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0], size=shape[:-1] + (1,))).astype(np.float32)
    if tid in {int(t) for t in T}:
        try:
            return np.ascontiguousarray(quantize(x, T(tid))).reshape(-1)
        except NotImplementedError:
            pass
    return c_quantize(c, tid, x, rng)


def oracles(tid: int, raw: np.ndarray, n: int, c: ctypes.CDLL | str) -> dict[str, np.ndarray]:
    """The decoded values of every oracle that has a decoder for the type (float32 [n])."""
    out: dict[str, np.ndarray] = {}
    if tid in {int(t) for t in T}:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                out["gguf-py"] = np.asarray(dequantize(raw, T(tid)), np.float32).reshape(-1)
        except NotImplementedError:
            pass
    y = c_dequantize(c, tid, raw, n)
    if y is not None:
        out["llama.cpp"] = y
    return out


def bits_equal(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False, f"shape {a.shape} vs {b.shape}"
    na, nb = np.isnan(a), np.isnan(b)
    same = (na & nb) | (a.view(np.uint32) == b.view(np.uint32))
    if same.all():
        return True, ""
    i = np.flatnonzero(~same.reshape(-1))
    return False, f"{i.size} of {a.size} differ, first at {i[0]}: {a.reshape(-1)[i[0]]!r} vs {b.reshape(-1)[i[0]]!r}"


def write_gguf(path: Path, tensors: list[tuple[str, np.ndarray, int, tuple[int, ...]]]) -> Path:
    """A GGUF file written by gguf-py: (name, raw block bytes, ggml type id, logical shape).  A type
    the installed gguf-py lacks is written as ``I8`` bytes and its tensor info patched."""
    known = {int(t) for t in T}
    w = gguf.GGUFWriter(str(path), arch="test")
    patches = []
    for name, raw, tid, shape in tensors:
        bs, ts = _sizes(tid)
        byte_shape = shape[:-1] + (shape[-1] // bs * ts,)
        if tid in known:
            w.add_tensor(name, raw.reshape(byte_shape), raw_dtype=T(tid))
        else:
            w.add_tensor(name, raw.reshape(byte_shape).view(np.int8), raw_dtype=T.I8)
            patches.append((name, tid, shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    for name, tid, shape in patches:
        key = struct.pack("<Q", len(name.encode())) + name.encode()
        at = data.index(key) + len(key)
        nd = struct.unpack_from("<I", data, at)[0]
        assert nd == len(shape)
        struct.pack_into(f"<{nd}Q", data, at + 4, *reversed(shape))
        struct.pack_into("<I", data, at + 4 + 8 * nd, tid)
    path.write_bytes(bytes(data))
    return path


def _tensors_of(tid: int, rng: np.random.Generator, c: ctypes.CDLL | str) -> list[tuple[str, np.ndarray, int, tuple[int, ...]]]:
    bs, _ = _sizes(tid)
    name = _name(tid).lower()
    out = []
    for tag, shape in (("w2d", (5 if bs <= 64 else 3, 2 * bs)), ("w3d", (2, 2, bs))):
        nblocks = int(np.prod(shape)) // bs
        out.append((f"{name}.random.{tag}", random_blocks(tid, nblocks, rng).reshape(-1), tid, shape))
    real = real_blocks(tid, (4, 2 * bs), rng, c)
    if real is not None:
        out.append((f"{name}.real", real, tid, (4, 2 * bs)))
    return out


# -- every type ----------------------------------------------------------------------------------
def _cases() -> list:  # type: ignore[type-arg]
    out = []
    for tid in [int(t) for t in T if t.name not in PLAIN] + EXTRA_IDS:
        name = _name(tid)
        marks = [pytest.mark.xfail(strict=True, raises=QFormatError, reason=REFUSED[name])] if name in REFUSED else []
        out.append(pytest.param(tid, id=name, marks=marks))
    return out


@pytest.mark.parametrize("tid", _cases())
def test_type_reads_bit_exactly(tid: int, ggml: ctypes.CDLL | str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1000 + tid)
    tensors = _tensors_of(tid, rng, ggml)
    expected: dict[str, np.ndarray] = {}
    for tname, raw, _, shape in tensors:
        refs = oracles(tid, raw, int(np.prod(shape)), ggml)
        if not refs and _name(tid) in REFUSED:
            continue
        if not refs:
            pytest.skip(f"{_name(tid)}: no oracle here (gguf-py has no dequantizer and llama.cpp's C could not be had: {ggml})")
        first, want = next(iter(refs.items()))
        for other, got in refs.items():  # the oracles agree with each other
            ok, why = bits_equal(got, want)
            assert ok, f"{tname}: {other} vs {first}: {why}"
        expected[tname] = want.reshape(shape)
    src = write_gguf(tmp_path / "m.gguf", tensors)
    dst = tmp_path / "m.safetensors"
    try:
        convert(src, dst, repack=True)
    except QFormatError as e:  # a refusal must be the documented one, naming the type
        assert e.code == "CONVERT_UNSUPPORTED" and _name(tid) in str(e), str(e)
        raise
    report = qformat.check([dst])
    assert report.ok, [(p.code, p.tensor, p.message) for f in report.files for p in f.problems]
    got = qformat.load_file(dst)
    for tname, want in expected.items():
        ok, why = bits_equal(got[tname], want)
        assert ok, f"{tname}: {why}"


def test_every_type_is_mapped_or_refused() -> None:
    """Every type of the installed gguf-py and of qformat's GGUF reader has a mapping or a reason."""
    for tid in [int(t) for t in T] + EXTRA_IDS:
        name = _name(tid)
        mapped = tid in cg.TYPES or tid in gguf_codes.TYPES or tid in cg.PLAIN
        assert mapped != (name in REFUSED), f"{name}: mapped={mapped}, refused={name in REFUSED}"


def test_grids_are_gguf_pys() -> None:
    """The i-quant grids and sign table qformat carries are gguf-py's, entry for entry."""
    import gguf.quants as gq

    from qformat.convert.gguf_grids import GRIDS, grid_indices, ksigns

    for name in GRIDS:
        cls = getattr(gq, name)
        cls.init_grid()
        mine = np.array(GRIDS[name][2], np.float32)[grid_indices(name)]
        assert np.array_equal(mine, cls.grid.reshape(cls.grid_shape)), name
    assert np.array_equal(ksigns(), np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8))


# -- every reader, one file ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def all_types(ggml: ctypes.CDLL | str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(GGUF, converted file, expected values) of one file with every computed-code type."""
    tmp = tmp_path_factory.mktemp("all")
    rng = np.random.default_rng(42)
    tensors, expected = [], {}
    for tid in sorted(gguf_codes.TYPES):
        for tname, raw, t, shape in _tensors_of(tid, rng, ggml):
            refs = oracles(tid, raw, int(np.prod(shape)), ggml)
            if refs:
                tensors.append((tname, raw, t, shape))
                expected[tname] = next(iter(refs.values())).reshape(shape)
    src = write_gguf(tmp / "all.gguf", tensors)
    dst = tmp / "all.safetensors"
    convert(src, dst, repack=True)
    return src, dst, expected


def _plain_outputs(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_js_reader(all_types: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    if shutil.which("node") is None:
        pytest.skip("node is not on PATH")
    _, dst, expected = all_types
    out = tmp_path / "js.safetensors"
    p = subprocess.run(["node", str(REPO / "readers/js/bin/qformat-read.mjs"), str(dst), str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = _plain_outputs(out)
    for tname, want in expected.items():
        ok, why = bits_equal(got[tname], want)
        assert ok, f"js {tname}: {why}"


def test_libqformat_reader(all_types: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    from tests import test_libqformat as tl

    if tl._missing:
        pytest.skip(f"libqformat cannot be built here: {' and '.join(tl._missing)} not found on PATH")
    exe = tl._exe(tl._build("build-pytest", ["-DCMAKE_BUILD_TYPE=Release"]), "qformat-c")
    _, dst, expected = all_types
    out = tmp_path / "c.safetensors"
    p = subprocess.run([str(exe), "read", str(dst), str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = _plain_outputs(out)
    for tname, want in expected.items():
        ok, why = bits_equal(got[tname], want)
        assert ok, f"qformat-c {tname}: {why}"


def test_diff_and_inspect(all_types: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    """``qformat diff`` reads the GGUF through the converter: no tensor differs from the converted
    file; ``qformat inspect`` of the GGUF gives every type a descriptor row."""
    from qformat.diff import diff_checkpoints
    from qformat.inspection import inspect_checkpoint

    src, dst, expected = all_types
    r = diff_checkpoints(src, dst)
    assert not r.only_in_a and not r.only_in_b
    assert len(r.tensors) == len(expected)
    bad = [(t.name, t.status, t.error) for t in r.tensors if t.status != "compared" or not t.bit_exact or t.nonfinite_mismatches]
    assert not bad, bad
    rows = inspect_checkpoint(src).tensors
    assert len(rows) == len(expected)
    assert all(row.scheme_source == "descriptor" for row in rows), [(row.name, row.element) for row in rows if row.scheme_source != "descriptor"]
