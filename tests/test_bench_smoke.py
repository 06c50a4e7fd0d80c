"""Smoke run of the benchmark harness (bench/): every section on tiny data, one repetition.

No speed is asserted here (timings on a shared machine are noise); the full run,
``python -m bench``, evaluates the targets.  This only keeps the harness from rotting: each
section runs, its equality checks against gguf-py / bitsandbytes / safetensors hold, and the
JSON it writes has the rows docs/performance.md's tables are built from.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("gguf")
pytest.importorskip("bitsandbytes")
pytest.importorskip("torchao")

from bench.harness import main  # noqa: E402


def test_bench_quick_runs_every_section(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--quick", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    res = json.loads(out.read_text())
    sections = {r["section"] for r in res["rows"]}
    for expect in ("decode int4 g32 asym", "decode nvfp4", "gguf Q4_0 vs int4 g32 sym (offset_binary, fp16 scale)",
                   "gguf Q8_0 vs int8 g32", "gguf MXFP4 vs mxfp4", "nf4 vs bitsandbytes", "nf4 vs torchao",
                   "load to bf16 (warm page cache)", "load to bf16 (cold page cache)", "qformat check",
                   "decode memory", "scaling", "libqformat"):
        assert expect in sections, expect
    timed = [r for r in res["rows"] if "ms" in r]
    assert all(r["ms"] > 0 for r in timed)
    assert all(r["x_memcpy"] > 0 for r in timed if "x_memcpy" in r)
    checks = [r for r in res["rows"] if r["section"] == "qformat check"]
    assert len(checks) == 4 and all(r["peak_rss_MB"] > 0 for r in checks)
    assert list(tmp_path.glob("qformat-bench-*")) == []  # big temporary files are removed
    assert "[targets]" in capsys.readouterr().out


def test_bench_gguf_quantize_section(tmp_path, capsys):
    """The llama-quantize comparison in --quick form: one preset on a one-layer model and the same
    with an importance matrix, their tensors checked equal, or the section says it is skipped
    where llama.cpp is not built."""
    out = tmp_path / "r.json"
    assert main(["--quick", "--only", "gguf_quantize", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["section"] == "gguf_quantize"]
    printed = capsys.readouterr().out
    if "[gguf_quantize] skipped" in printed:
        assert rows == []
        return
    assert [r["name"] for r in rows] == ["Q4_K_M", "Q4_K_M+imatrix"]
    assert all(r["tensors_checked_equal"] >= 5 and r["x_llama_quantize"] > 0 for r in rows)


def test_bench_llama_cpp_speed_section(tmp_path, capsys):
    """llama.cpp's own speed in --quick form: where the native build exists (a full run of the
    section makes it; --quick never builds), BF16, F16 and Q4_0 files of a tiny model each get a
    tokens/s row against BF16; elsewhere one row says why the section was skipped."""
    out = tmp_path / "r.json"
    assert main(["--quick", "--only", "llama_cpp_speed", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["section"] == "llama_cpp_speed"]
    printed = capsys.readouterr().out
    if "[llama_cpp_speed] skipped" in printed:
        assert [r["name"] for r in rows] == ["llama.cpp (skipped)"] and rows[0]["skipped"]
        return
    assert [r["type"] for r in rows] == ["BF16", "F16", "Q4_0", "Q4_0 (qformat int4 g32, bf16 embeddings and head)", "BF16 (again)"]
    assert all(r["tokens_per_s"] > 0 and r["prompt8_tokens_per_s"] > 0 and r["file_MB"] > 0 for r in rows)
    assert all(r["x_vs"] > 0 and r["vs"] == "llama.cpp BF16" for r in rows[1:])
    assert rows[2]["tensor_types"]["Q4_0"] > 0 and rows[3]["tensor_types"]["BF16"] > 0


def test_bench_llama_cpp_speed_says_why_it_is_skipped(tmp_path, monkeypatch, capsys):
    """A llama.cpp that cannot be built (here: a source folder with nothing in it) gives one row
    with the reason, in a full run as in --quick; nothing fails silently and nothing is built."""
    from bench.common import Run
    from bench.llama_cpp_speed import bench_llama_cpp_speed

    (tmp_path / "src").mkdir()
    monkeypatch.setenv("QFORMAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("QFORMAT_LLAMA_CPP_SRC", str(tmp_path / "src"))
    for quick, why in ((True, "speed build is not there"), (False, "could not be built")):
        run = Run(1, quick)
        bench_llama_cpp_speed(run, str(tmp_path))
        (row,) = run.rows
        assert row["name"] == "llama.cpp (skipped)" and why in row["skipped"], row
        assert f"[llama_cpp_speed] skipped: {row['skipped']}" in capsys.readouterr().out
    assert not list((tmp_path / "cache" / "llama-cpp-build").glob("*/bin"))


# -- the fast paths the benchmark measures give the reference's bits -------------------------------
# Each fast path (per-byte tables for `planes`, integer bfloat16 rounding, the torch chunked
# decoder with its worker threads) is compared with the general path it replaces, which the
# decode tests check against the SPEC transcription, and with gguf-py where it is the oracle.
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import qformat  # noqa: E402
from qformat import decode as qdecode  # noqa: E402
from qformat.descriptor import parse_descriptor  # noqa: E402
from qformat.sources import ArraySource  # noqa: E402

from qformat import kernels  # noqa: E402

from .backends import same_bits  # noqa: E402


@pytest.fixture
def numpy_path():
    """The NumPy and torch-ops fast paths these tests check are what runs without the native
    kernel (no compiler, ``QFORMAT_KERNELS=numpy``, CUDA tensors); tests/test_kernels.py checks
    the native kernel against them."""
    with kernels.use("numpy"):
        yield


def test_bfloat16_integer_rounding_equals_ml_dtypes():
    """SPEC §10.3's integer formula (plus NaN quieting) against ml_dtypes' RNE cast, on random
    bit patterns and every class: halfway ties (even and odd), one below/above, the largest
    finite binary32 (rounds to +Inf), infinities, NaNs with payloads, subnormals, signed zeros."""
    rng = np.random.default_rng(0)
    top = rng.integers(0, 2**16, size=1 << 14, dtype=np.uint32) << 16
    special = np.array([0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFFFFFFF, 0x7FC00000,
                        0x7FBFFFFF, 0x00000001, 0x80008000, 0x00018000, 0x0, 0x80000000, 0x7F7F8000, 0x7F7F7FFF], np.uint32)
    bits = np.concatenate([rng.integers(0, 2**32, size=1 << 16, dtype=np.uint64).astype(np.uint32),
                           top, top | 0x8000, top | 0x7FFF, top | 0x8001, top | 0x18000, special])
    x = bits.view(np.float32)
    got = np.empty(x.shape, np.uint16)
    qdecode._to_bfloat16_bits(x, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
    assert same_bits(got.view(ml_dtypes.bfloat16), want)
    nan = np.isnan(x)
    assert ((got[nan] & 0x7FFF) > 0x7F80).all() and ((got[nan] >> 15) == (bits[nan] >> 31)).all()  # NaN, sign kept


def _planes_case(rows, cols, span, bit_order, slot_order, dtype, rng):
    el = {"type": "int", "bits": 4, "signedness": "offset_binary"}
    pk = {"container": 8, "bit_order": bit_order, "axis": 1, "planes": {"span": span}}
    if slot_order is not None:
        pk["slot_order"] = slot_order
    d = {"shape": [rows, cols], "dtype": dtype, "codes": {"tensor": "codes", "element": el, "packing": pk},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
    desc = parse_descriptor("w", d)
    wpr = desc.codes.packing.words_per_row(cols, 4)
    comps = {"codes": rng.integers(0, 256, (rows, wpr), dtype=np.uint8),
             "scale": (rng.standard_normal((rows, -(-cols // 32))) * 0.01).astype(np.float16)}
    return desc, ArraySource(comps)


@pytest.mark.parametrize("rows,cols,span,bit_order,slot_order,dtype", [
    (7, 96, 32, "lsb_first", None, "float32"),      # GGUF's split halves
    (5, 64, 32, "msb_first", None, "bfloat16"),
    (3, 64, 16, "lsb_first", [1, 0], "float16"),
    (4, 70, 32, "lsb_first", None, "float32"),      # a partial last segment: general path
    (6, 48, 6, "lsb_first", None, "bfloat16"),
])
def test_planes_fast_path_equals_general_unpacker(monkeypatch, numpy_path, rows, cols, span, bit_order, slot_order, dtype):
    rng = np.random.default_rng(rows * cols + span)
    desc, src = _planes_case(rows, cols, span, bit_order, slot_order, dtype, rng)
    monkeypatch.setattr(qdecode, "CHUNK_ELEMENTS", 2 * cols)  # several chunks, also threaded
    taken = []
    real = qdecode._fast_planes
    monkeypatch.setattr(qdecode, "_fast_planes", lambda *a: taken.append(real(*a)) or taken[-1])
    fast = qdecode.decode(desc, src, threads=2)
    assert all(t is not None for t in taken) == (cols % span == 0) and taken
    sliced = qdecode.decode(desc, src, region=((1, rows), (0 if cols % span else span, cols)), threads=1)
    monkeypatch.setattr(qdecode, "_fast_planes", lambda *a: None)
    monkeypatch.setattr(qdecode, "_to_bfloat16_bits", lambda x, dst: dst.__setitem__(..., x.astype(ml_dtypes.bfloat16).view(np.uint16)))
    general = qdecode.decode(desc, src, threads=1)
    assert same_bits(fast, general)
    assert same_bits(sliced, general[1:, (0 if cols % span else span):])


def test_planes_fast_path_equals_gguf_py_q4_0():
    quants = pytest.importorskip("gguf").quants
    from gguf import GGMLQuantizationType as T

    rows, cols = 5, 96
    rng = np.random.default_rng(7)
    data = quants.quantize(rng.standard_normal((rows, cols), dtype=np.float32), T.Q4_0)
    want = quants.dequantize(data, T.Q4_0)
    b = data.reshape(rows, cols // 32, 18)
    scale = np.ascontiguousarray(b[..., :2]).view(np.float16).reshape(rows, cols // 32)
    d = {"shape": [rows, cols], "dtype": "float32",
         "codes": {"tensor": "codes", "element": {"type": "int", "bits": 4, "signedness": "offset_binary"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1, "planes": {"span": 32}}},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
    q = qformat.QTensor(d, {"codes": np.ascontiguousarray(b[..., 2:]).reshape(rows, cols // 2), "scale": scale})
    assert same_bits(q.dequantize(), want)


@pytest.mark.parametrize("kind,dtype", [("int4 g32 sym", "float32"), ("int4 g128 asym", "bfloat16"), ("nf4 b64", "bfloat16"),
                                        ("nvfp4", "float16"), ("int8 g32", "float32"), ("mxfp4", "bfloat16")])
@pytest.mark.parametrize("threads", [1, 2])
def test_torch_fast_decode_equals_numpy_reference(monkeypatch, numpy_path, kind, dtype, threads):
    torch = pytest.importorskip("torch")
    from bench.harness import make_case
    from qformat_torch import decode as tdecode
    from qformat_torch.qtensor import TorchQTensor
    from qformat_torch.sources import TensorSource

    q = make_case(kind, 64, 256, np.random.default_rng(3), dtype=dtype)
    desc = parse_descriptor("w", q.descriptor)
    want = qdecode.decode(desc, ArraySource(q.components), threads=1)
    tsrc = TensorSource(TorchQTensor.from_qtensor(q).components)
    monkeypatch.setattr(tdecode, "FAST_CHUNK_ELEMENTS", 1024)  # many chunks: the worker pool runs
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        called = []
        real = tdecode._fast_decode
        monkeypatch.setattr(tdecode, "_fast_decode", lambda *a: called.append(real(*a)) or called[-1])
        got = tdecode.decode(desc, tsrc)
        assert called == [True]  # the fast path decoded it
        assert torch.get_num_threads() == threads  # workers' single-thread setting stays theirs
        out = torch.empty_like(got)
        assert tdecode.decode(desc, tsrc, region=((8, 40), (0, 256)), out=out[:32]) is not None
    finally:
        torch.set_num_threads(before)
    np_of = (lambda t: t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)) if got.dtype == torch.bfloat16 else (lambda t: t.numpy())
    assert same_bits(np_of(got), want)
    assert same_bits(np_of(out[:32]), want[8:40])


def test_torch_fast_decode_into_misaligned_out_and_one_long_row(numpy_path):
    """An ``out`` whose offset cannot hold the byte table's items, and a single row longer than
    a chunk, decode (by the general path or unchunked) to the reference's bits."""
    torch = pytest.importorskip("torch")
    from bench.harness import make_case
    from qformat_torch import decode as tdecode
    from qformat_torch.qtensor import TorchQTensor
    from qformat_torch.sources import TensorSource

    for rows, cols in [(4, 64), (1, 4096)]:
        q = make_case("int4 g32 asym", rows, cols, np.random.default_rng(5), dtype="float32")
        desc = parse_descriptor("w", q.descriptor)
        want = qdecode.decode(desc, ArraySource(q.components), threads=1)
        tsrc = TensorSource(TorchQTensor.from_qtensor(q).components)
        buf = torch.empty(rows * cols + 1)
        out = buf[1:].view(rows, cols)  # storage offset 1: not float64-aligned
        tdecode.decode(desc, tsrc, out=out)
        assert same_bits(out.numpy(), want)
        old = tdecode.FAST_CHUNK_ELEMENTS
        tdecode.FAST_CHUNK_ELEMENTS = 64
        try:
            assert same_bits(tdecode.decode(desc, tsrc).numpy(), want)
        finally:
            tdecode.FAST_CHUNK_ELEMENTS = old


def test_llama_cpp_speed_build_shares_the_tests_build_options():
    """The speed build is the tests' build (tests/llama_cpp.py) with the native instruction set:
    the same options before and after it, so the two never drift apart."""
    from bench.llama_cpp_speed import FLAGS
    from tests.llama_cpp import BUILD_HEAD, BUILD_TAIL

    assert FLAGS[:len(BUILD_HEAD)] == BUILD_HEAD
    assert FLAGS[len(BUILD_HEAD)] == "-DGGML_NATIVE=ON"
    assert FLAGS[len(BUILD_HEAD) + 1:len(BUILD_HEAD) + 1 + len(BUILD_TAIL)] == BUILD_TAIL


def test_a_partial_run_replaces_only_its_sections() -> None:
    """``python -m bench --only X`` merges into bench/results.json: X's rows and targets are
    replaced, every other section's are kept, and the run is recorded (issue 44: a partial run
    used to overwrite the whole file)."""
    from bench.harness import merge_results

    old = {"info": {"command": "full"}, "seconds": 9.0,
           "rows": [{"section": "a", "name": "1"}, {"section": "b", "name": "2"}],
           "targets": [{"target": "ta", "met": True}, {"target": "tb", "met": False}]}
    new = {"info": {"command": "--only b"}, "seconds": 1.0,
           "rows": [{"section": "b", "name": "3"}], "targets": [{"target": "tb", "met": True}]}
    got = merge_results(old, new)
    assert got["rows"] == [{"section": "a", "name": "1"}, {"section": "b", "name": "3"}]
    assert got["targets"] == [{"target": "ta", "met": True}, {"target": "tb", "met": True}]
    assert got["info"] == {"command": "full"}
    assert got["merged_runs"] == [{"info": {"command": "--only b"}, "seconds": 1.0, "sections": ["b"]}]
    assert merge_results(None, new) is new
