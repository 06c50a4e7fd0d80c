"""GGUF export a slice of rows at a time (issue 42 item 6): the native kernels and the streaming
writer give the bytes the NumPy paths and a whole-tensor build give, and the export's peak memory
stays within about one tensor.

- ``_ggml.dequantize`` (ggml's dequantize_row_<type> in C) against :func:`_decode_numpy`
  (gguf-py's arithmetic in NumPy) on random blocks, every F16 bit pattern included;
- ``_ggml.insert`` against :func:`_insert_numpy`, ``_ggml.unpack`` against
  :func:`qformat.packing.unpack_rows_numpy`;
- an export of scheme ``gguf`` tensors of every legacy and K type, in slices of a few rows and in
  one piece, with and without the native kernels: the same file, whose blocks are the scheme's;
- the peak resident set of ``qformat export --to gguf`` of a checkpoint whose one large tensor
  decodes to 256 MB of binary32 stays below that tensor's GGUF bytes above the interpreter's
  own (measured in a child: its VmHWM after a reset, as bench/real_models.py measures it).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import numpy as np
import pytest

import qformat
from qformat import kernels
from qformat.container import write_file
from qformat.convert.gguf_file import GGUFFile
from qformat.export import base as export_base
from qformat.export import export
from qformat.export.gguf import BY_NAME, NATIVE_DECODE, _decode, _decode_numpy, _insert, _insert_numpy
from qformat.packing import Packing, unpack_rows_numpy

MB = 1 << 20
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
native = pytest.mark.skipif(not kernels.ggml_available() or not hasattr(kernels._ggml, "dequantize"),
                            reason="the native GGUF extension is not built (or predates dequantize)")


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


@native
@pytest.mark.parametrize("name", TYPES)
def test_native_dequantize_is_the_numpy_rule(name):
    t = BY_NAME[name]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (4000, t.size), dtype=np.uint8)  # every d, m, dmin bit pattern likely: subnormal, Inf, NaN
    assert name in NATIVE_DECODE
    assert same_bits(_decode(t, raw, (-1, t.block)), _decode_numpy(t, raw, (-1, t.block)))


@native
def test_native_insert_and_unpack_are_the_numpy_ones():
    rng = np.random.default_rng(2)
    for name in TYPES:
        t = BY_NAME[name]
        for f in (t.codes, t.sc, t.mins):
            if f is None:
                continue
            codes = rng.integers(0, 1 << f.bits, (333, f.parts[0][0].size), dtype=np.uint8)
            a, b = np.zeros((333, t.size), np.uint8), np.zeros((333, t.size), np.uint8)
            _insert(a, f, codes)
            _insert_numpy(b, f, codes)
            assert (a == b).all(), name
    p = Packing(8, "lsb_first", 1)
    for bits in range(1, 9):
        for length in (1, 7, 32, 576, 1001):
            words = rng.integers(0, 256, (5, p.words_per_row(length, bits)), dtype=np.uint8)
            out = np.empty((5, length), np.uint8)
            kernels._ggml.unpack(words, bits, 5, out)
            assert (out == unpack_rows_numpy(words, bits, p, length)).all(), (bits, length)


def _scheme_checkpoint(path, rng) -> dict[str, np.ndarray]:
    """A file of scheme gguf tensors, one per type (rows of 512, 2 to 40 rows), and their blocks."""
    arrays, descs, blocks = {}, {}, {}
    for i, name in enumerate(TYPES):
        x = rng.standard_normal((2 + 3 * i + (i % 2), 512)).astype(np.float32)
        q = qformat.quantize(x, "gguf", type=name)
        comps = {f"w{i}.{k}": v for k, v in q.components.items()}
        desc = json.loads(json.dumps(q.descriptor).replace('"tensor": "', f'"tensor": "w{i}.'))
        arrays.update(comps)
        descs[f"w{i}"] = desc
        out = np.empty((x.shape[0], 512 // BY_NAME[name].block * BY_NAME[name].size), np.uint8)
        from qformat.schemes.ggml_blocks import quantize_blocks

        out[:] = quantize_blocks(x.reshape(-1, BY_NAME[name].block), name).reshape(out.shape)
        blocks[f"w{i}"] = out
    write_file(path, arrays, {"qformat": json.dumps({"version": "1.0", "tensors": descs})})
    return blocks


def test_sliced_export_is_the_whole_one(tmp_path, monkeypatch):
    src = tmp_path / "q.safetensors"
    blocks = _scheme_checkpoint(src, np.random.default_rng(3))
    outs = []
    for chunk, mode in ((1 << 20, "auto"), (1100, "auto"), (1100, "numpy"), (1 << 30, "numpy")):
        monkeypatch.setattr(export_base, "CHUNK_ELEMENTS", chunk)  # 1100: slices of 2 rows (K-quants: of n/8 rows)
        dst = tmp_path / f"out-{chunk}-{mode}.gguf"
        with kernels.use(mode):
            report = export(src, dst, "gguf")
        assert all(r.exact for r in report.results) and len(report.results) == len(TYPES)
        outs.append(dst.read_bytes())
    assert all(o == outs[0] for o in outs[1:])
    g = GGUFFile(str(tmp_path / "out-1100-auto.gguf"))
    try:
        for name, want in blocks.items():
            assert np.asarray(g.raw(name)).tobytes() == want.tobytes(), name
    finally:
        with contextlib.suppress(BufferError, ValueError):
            g._buf.release()
            del g._bytes
            g._mm.close()


_CHILD = r"""
import json, sys
import qformat.cli, qformat.export, qformat.export.gguf, gguf
def vm(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
base = vm("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
rc = qformat.cli.main(sys.argv[1:])
print(json.dumps({"rc": rc, "base": base, "peak": vm("VmHWM")}))
"""


def test_export_peak_memory_is_within_one_tensor(tmp_path):
    rows, cols = 16384, 4096  # int4 g32: 32 MB of codes, a 36 MB Q4_0 tensor, 256 MB decoded in binary32
    rng = np.random.default_rng(4)
    arrays = {"big.codes": rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
              "big.scale": rng.uniform(0.001, 0.01, (rows, cols // 32)).astype(np.float16),
              "norm": np.ones(cols, np.float32)}
    desc = {"shape": [rows, cols], "dtype": "float32",
            "codes": {"tensor": "big.codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
            "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "big.scale"}}
    src = tmp_path / "big.safetensors"
    write_file(src, arrays, {"qformat": json.dumps({"version": "1.0", "tensors": {"big": desc}})})
    del arrays
    tensor_bytes = rows * cols // 32 * 18
    dst = tmp_path / "big.gguf"
    p = subprocess.run([sys.executable, "-c", _CHILD, "export", "--quiet", "--to", "gguf", str(src), str(dst)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["rc"] == 0
    above = r["peak"] - r["base"]
    print(f"export --to gguf of a {tensor_bytes / MB:.1f} MB Q4_0 tensor ({rows * cols * 4 / MB:.0f} MB in binary32): "
          f"peak {above / MB:.1f} MB above the interpreter's {r['base'] / MB:.0f} MB")
    assert dst.stat().st_size > tensor_bytes
    assert above < tensor_bytes, f"peak {above / MB:.1f} MB above baseline, the tensor is {tensor_bytes / MB:.1f} MB"


def test_a_sliced_entry_of_the_wrong_size_is_refused_and_nothing_is_left(tmp_path):
    from qformat.errors import QFormatError
    from qformat.export.gguf_writer import TensorEntry, write_gguf

    dst = tmp_path / "x.gguf"
    for pieces, said in (([np.zeros(10, np.float32)], "is 40 bytes"), ([np.zeros(16, np.float32), np.zeros(1, np.float32)], "more than 64")):
        entry = TensorEntry("t", "F32", (16,), lambda: np.zeros(16, np.float32), lambda p=pieces: iter(p))
        with pytest.raises(QFormatError) as e:
            write_gguf(str(dst), [], [entry])
        assert e.value.code == "EXPORT_NOT_EXACT" and said in str(e.value)
        assert list(tmp_path.iterdir()) == []
    entry = TensorEntry("t", "F32", (16,), lambda: np.zeros(16, np.float32), lambda: iter([np.zeros(6, np.float32), np.ones(10, np.float32)]))
    write_gguf(str(dst), [], [entry])
    g = GGUFFile(str(dst))
    try:
        assert np.asarray(g.raw("t")).view(np.float32).tolist() == [0.0] * 6 + [1.0] * 10
    finally:
        with contextlib.suppress(BufferError, ValueError):
            g._buf.release()
            del g._bytes
            g._mm.close()
