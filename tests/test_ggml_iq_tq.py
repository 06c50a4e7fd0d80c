"""IQ4_NL, IQ4_XS, TQ1_0 and TQ2_0 produced byte for byte as llama.cpp produces them (default suite).

The oracle is llama.cpp's own ``ggml-quants.c`` (the llama-cpp-python sdist's, compiled once into
the cache by tests/test_gguf_types.py's harness): ``quantize_iq4_nl`` / ``quantize_iq4_xs`` /
``quantize_tq1_0`` / ``quantize_tq2_0`` (what llama-quantize calls, with and without an importance
vector) and the ``quantize_row_*_ref`` functions, against :mod:`qformat.schemes.ggml_blocks` and
:mod:`qformat.schemes.ggml_weighted`, on random rows with planted edge cases (all-zero blocks,
1e-30 and subnormal blocks, huge values, exact ties, one spike, one sign, -0.0) and the real rows
of a trained tiny Llama 3 (the frozen llama-quantize fixture's inputs).  The whole-model
comparison with ``llama-quantize`` itself is in tests/test_llama_cpp_quantize.py (marker
``llama_cpp``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import gguf_presets
from qformat.errors import QFormatError
from qformat.schemes.ggml_blocks import NONLINEAR_TYPES, SIZES, quantize_blocks, quantize_iq4_nl_ref
from qformat.schemes.ggml_weighted import quantize_rows_weighted

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize" / "ggml_blocks.safetensors"
_P = ctypes.c_void_p


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    """tests/test_gguf_types.py's compiled ggml-quants.c, loaded without its IQ2/IQ3 grid set-up
    (iq2xs_init_impl takes minutes on a loaded machine; these types need no grid)."""
    import hashlib

    from tests import llama_cpp_source as src
    from tests.test_gguf_types import _ggml, _stubs

    try:
        tree = src.source_dir("ggml/src", "ggml/include")
    except src.Unavailable as e:
        pytest.skip(f"llama.cpp's source is not available: {e}")
    files = [tree / "ggml/src/ggml-quants.c", tree / "ggml/src/ggml-common.h", tree / "ggml/src/ggml-impl.h"]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in files) + _stubs().encode()).hexdigest()[:16]  # _ggml()'s cache key
    lib = src.cache_root() / f"ggml-quants-{key}" / "libggml_quants.so"
    if lib.is_file():
        return ctypes.CDLL(str(lib))
    c = _ggml()  # builds it (once)
    if isinstance(c, str):
        pytest.skip(c)
    return c


def _c_quantize(c: ctypes.CDLL, t: str, x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's ``quantize_<type>(src, dst, nrow, n_per_row, quant_weights)``: uint8 [rows, bytes]."""
    block, size = SIZES[t]
    x = np.ascontiguousarray(x, np.float32)
    r, n = x.shape
    out = np.full((r, n // block * size), 0xAA, np.uint8)
    w = None if qw is None else np.ascontiguousarray(qw, np.float32)
    fn = getattr(c, "quantize_" + t.lower())
    fn.restype = ctypes.c_size_t
    fn(x.ctypes.data_as(_P), out.ctypes.data_as(_P), ctypes.c_int64(r), ctypes.c_int64(n), None if w is None else w.ctypes.data_as(_P))
    return out


def _c_ref(c: ctypes.CDLL, t: str, x: np.ndarray) -> np.ndarray:
    """llama.cpp's ``quantize_row_<type>_ref`` over all of ``x`` in one call: uint8 [blocks, size]."""
    block, size = SIZES[t]
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.full((x.size // block, size), 0xAA, np.uint8)
    getattr(c, f"quantize_row_{t.lower()}_ref")(x.ctypes.data_as(_P), out.ctypes.data_as(_P), ctypes.c_int64(x.size))
    return out


def _rows(seed: int, rows: int = 48, n: int = 512) -> np.ndarray:
    """Random rows of many kinds, with the edge cases planted per 32 and per 256."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * np.exp(rng.uniform(-6, 3, (rows, 1)))).astype(np.float32)
    x[0] = 0  # all-zero row
    x[1, :32] = 0  # an all-zero block of 32, and an all-zero super-block
    x[1, 256:512] = 0
    x[2] *= np.float32(1e-30)  # tiny: 1/d is finite, F16 d is 0
    x[3] *= np.float32(1e-41)  # subnormal: 1/amax overflows to Inf
    x[4] = 1.0  # constant
    x[5] = 0
    x[5, 77] = -3.5  # one spike
    x[6] = np.abs(x[6])  # one sign
    x[7] = -np.abs(x[7])
    x[8] = rng.integers(-4, 5, n)  # integers: ties of x / amax at halves for the ternary types
    x[9] = rng.choice(np.array([-1.0, -0.5, 0.0, 0.5, 1.0], np.float32), n)  # exact halves of amax
    x[10] = (rng.integers(-127, 128, n) / 127).astype(np.float32)  # multiples of amax / 127: IQ4 grid ties
    x[11] = rng.standard_normal(n) * 1e6
    x[12] = rng.standard_normal(n) * 1e15  # huge (below the encoder's 2^63 limit)
    x[13] = -0.0
    x[13, 5] = 2.0
    x[14, ::2] = -0.0
    x[15] = rng.standard_t(1.5, n)  # heavy tails
    for b in range(16, min(rows, 24)):  # all-zero blocks of 32 at each position of a super-block
        x[b, 32 * (b - 16):32 * (b - 15)] = 0
    return x


def _real_rows() -> np.ndarray:
    from safetensors.numpy import load_file

    fx = load_file(str(FIXTURE))
    return np.concatenate([fx[k].reshape(-1, 256) for k in sorted(fx) if k.startswith("input.trained.")]).reshape(-1, 512)


def _inputs() -> list[tuple[str, np.ndarray]]:
    return [("random", _rows(1)), ("random2", _rows(2, 16, 1024)), ("real", _real_rows())]


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    bad = np.argwhere(got.reshape(want.shape) != want)
    assert bad.size == 0, f"{what}: {len(bad)} bytes differ, the first at {bad[0].tolist()}"


@pytest.mark.parametrize("t", NONLINEAR_TYPES)
def test_blocks_equal_ggml(ggml: ctypes.CDLL, t: str) -> None:
    """Without importance: quantize_<type>(..., NULL), what llama-quantize writes."""
    for case, x in _inputs():
        want = _c_quantize(ggml, t, x)
        _assert_same(quantize_blocks(x.reshape(-1, SIZES[t][0]), t), want, f"{t} {case}")


@pytest.mark.parametrize("t", NONLINEAR_TYPES)
def test_weighted_blocks_equal_ggml(ggml: ctypes.CDLL, t: str) -> None:
    """With an importance vector (llama-quantize --imatrix); TQ1_0 / TQ2_0 ignore it, as ggml."""
    rng = np.random.default_rng(7)
    for case, x in _inputs():
        for kind in ("random", "zeros", "huge"):
            qw = rng.random(x.shape[1]).astype(np.float32)
            if kind == "zeros":
                qw[:40] = 0  # a block of 32 with no weight at all, and part of the next
            elif kind == "huge":
                qw *= np.float32(1e20)
            want = _c_quantize(ggml, t, x, qw)
            _assert_same(quantize_rows_weighted(x, t, qw), want, f"{t} {case} importance {kind}")


@pytest.mark.parametrize("t", ["IQ4_XS", "TQ1_0", "TQ2_0"])
def test_reference_rows_equal_ggml(ggml: ctypes.CDLL, t: str) -> None:
    """quantize_row_<type>_ref (for these three the same bytes as quantize_<type> without importance)."""
    for case, x in _inputs():
        _assert_same(quantize_blocks(x.reshape(-1, SIZES[t][0]), t), _c_ref(ggml, t, x), f"{t} ref {case}")


def test_iq4_nl_reference_equals_ggml(ggml: ctypes.CDLL) -> None:
    """quantize_row_iq4_nl_ref: no scale search (it differs from quantize_iq4_nl).  An all-zero
    block keeps what its stack array held (the previous block's codes in one call), so the input
    never starts with one (_rows' first rows have empty blocks: a heavy-tailed row goes first)."""
    for case, x in _inputs():
        x = np.concatenate([x[15:16], x])
        want = _c_ref(ggml, "IQ4_NL", x)
        _assert_same(quantize_iq4_nl_ref(x), want, f"IQ4_NL ref {case}")
        assert not np.array_equal(want, _c_quantize(ggml, "IQ4_NL", x).reshape(want.shape))  # the search matters


def _native_levels() -> list[int]:
    from qformat import kernels

    if not kernels.ggml_available():
        return []
    from qformat.kernels import _ggml

    return [0, 1] + ([2] if _ggml.best_level() == 2 else [])


@pytest.mark.parametrize("t", NONLINEAR_TYPES)
def test_native_kernel_equals_numpy(t: str) -> None:
    """_ggml.c's section for these types: the NumPy bytes at every level, from float32 and float16
    sources, with and without importance (the default path wherever the extension is built)."""
    levels = _native_levels()
    if not levels:
        pytest.skip("the _ggml extension is not built here (the NumPy path runs)")
    from qformat.kernels import _ggml

    block = SIZES[t][0]
    rng = np.random.default_rng(11)
    for case, x in _inputs():
        want = quantize_blocks(x.reshape(-1, block), t).reshape(x.shape[0], -1)
        xh = np.clip(x, -60000, 60000).astype(np.float16)
        want_h = quantize_blocks(xh.astype(np.float32).reshape(-1, block), t).reshape(x.shape[0], -1)
        qw = rng.random(x.shape[1]).astype(np.float32)
        qw[:40] = 0
        want_w = quantize_rows_weighted(x, t, qw)
        for level in levels:
            out = np.empty_like(want)
            _ggml.quantize(t, np.ascontiguousarray(x), out, level, 0)
            _assert_same(out, want, f"{t} {case} level {level}")
            _ggml.quantize(t, np.ascontiguousarray(xh), out, level, 1)
            _assert_same(out, want_h, f"{t} {case} float16 level {level}")
            _ggml.quantize_weighted(t, np.ascontiguousarray(x), qw, out, level)
            _assert_same(out, want_w, f"{t} {case} importance level {level}")


@pytest.mark.parametrize("t", NONLINEAR_TYPES)
def test_scheme_and_export_write_the_blocks(t: str, tmp_path: Path) -> None:
    """quantize(..., "gguf", type=t) -> qformat file -> export --to gguf: gguf-py reads the
    reference blocks back with their type, and qformat's decode equals gguf-py's dequantize."""
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from qformat.export import export

    x = np.delete(_rows(3, 24, 512), [11, 12], axis=0)  # not the huge rows: F16 scales cannot hold them
    rng = np.random.default_rng(4)
    qw = rng.random(512).astype(np.float32)
    tensors = {"plain": (quantize_blocks(x.reshape(-1, SIZES[t][0]), t).reshape(x.shape[0], -1), None),
               "imatrix": (quantize_rows_weighted(x, t, qw), qw)}
    src = tmp_path / "q.safetensors"
    qformat.save_file({n: qformat.quantize(x, "gguf", type=t, importance=w) for n, (_, w) in tensors.items()}, src)
    assert qformat.check(src).ok
    out = tmp_path / "q.gguf"
    export(str(src), str(out), to="gguf")
    loaded = qformat.load_file(str(src))
    r = GGUFReader(str(out))
    assert sorted(tt.name for tt in r.tensors) == sorted(tensors)
    for tt in r.tensors:
        want = tensors[tt.name][0]
        assert tt.tensor_type.name == t
        assert np.array_equal(np.asarray(tt.data).reshape(-1).view(np.uint8), want.reshape(-1)), tt.name
        y = dequantize(want, gguf.GGMLQuantizationType[t]).astype(np.float32).reshape(x.shape)
        assert np.array_equal(loaded[tt.name].view(np.uint32), y.view(np.uint32)), tt.name


def test_export_of_ternary_codes_outside_tq1_0_refused(tmp_path: Path) -> None:
    """2-bit two's-complement codes with an F16 scale per 256 are TQ1_0, which holds -1, 0, +1:
    a code -2 is refused by name, not written as something else."""
    from qformat.export import export

    q = qformat.quantize(_rows(5, 16, 256)[13:], "gguf", type="TQ1_0")
    comps = dict(q.components)
    codes = comps["codes"].copy()
    codes[0, 0] = (codes[0, 0] & 0xFC) | 2  # element 0's code -> -2
    comps["codes"] = codes
    src = tmp_path / "bad.safetensors"
    qformat.save_file({"w": qformat.QTensor(q.descriptor, comps)}, src)
    with pytest.raises(QFormatError) as e:
        export(str(src), str(tmp_path / "bad.gguf"), to="gguf")
    assert "TQ1_0" in str(e.value) and "-2" in str(e.value) and "MXFP4" not in str(e.value)


@pytest.mark.parametrize("t", NONLINEAR_TYPES)
def test_overflow_and_partial_rows_refused(t: str) -> None:
    block = SIZES[t][0]
    with pytest.raises(QFormatError) as e:
        qformat.quantize(np.ones((2, block + 16), np.float32), "gguf", type=t)
    assert e.value.code == "ENCODE_PARAM_INVALID" and f"multiple of {block}" in str(e.value)
    x = np.ones((2, 256), np.float32)
    x[1, 7] = 1e20
    with pytest.raises(QFormatError) as e:
        qformat.quantize(x, "gguf", type=t)
    assert e.value.code == "ENCODE_INPUT_INVALID"
    x[1, 7] = 1e9  # the F16 block scale overflows
    with pytest.raises(QFormatError) as e:
        qformat.quantize(x, "gguf", type=t)
    assert e.value.code == "ENCODE_INPUT_INVALID" and "overflow" in str(e.value)


# -- presets: llama-quant.cpp's choices for these ftypes -------------------------------------------
def _shapes(layers: int, hidden: int, kv: int, ffn: int, vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        s["output.weight"] = (vocab, hidden)
    for i in range(layers):
        p = f"blk.{i}."
        s.update({p + "attn_q.weight": (hidden, hidden), p + "attn_k.weight": (kv, hidden), p + "attn_v.weight": (kv, hidden),
                  p + "attn_output.weight": (hidden, hidden), p + "ffn_gate.weight": (ffn, hidden),
                  p + "ffn_up.weight": (ffn, hidden), p + "ffn_down.weight": (hidden, ffn), p + "attn_norm.weight": (hidden,)})
    return s


def _cfg(layers: int, heads: int, kv_heads: int) -> dict:
    return {"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "model_type": "llama"}


@pytest.mark.parametrize("preset", ["IQ4_NL", "IQ4_XS"])
def test_iq4_presets(preset: str) -> None:
    # 16 layers, GQA 4 (attn_v -> Q5_K), rows of 4096 / 14336: no fallback
    r = gguf_presets.resolve(preset, _shapes(16, 4096, 1024, 14336, 1000, False), _cfg(16, 32, 8))
    t = r.types
    assert t["output.weight"] == "Q6_K" and t["token_embd.weight"] == preset
    assert all(t[f"blk.{i}.attn_v.weight"] == "Q5_K" for i in range(16))
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(16)] == ["Q5_K"] * 2 + [preset] * 14  # first 8th, no imatrix
    assert t["blk.3.attn_q.weight"] == t["blk.3.attn_output.weight"] == preset
    # with an importance matrix the first ffn_down layers keep the type; GQA 2: attn_v keeps it
    r = gguf_presets.resolve(preset, _shapes(16, 4096, 2048, 14336, 1000, False), _cfg(16, 32, 16), has_imatrix=True)
    assert all(v == preset for k, v in r.types.items() if k != "output.weight")


def test_iq4_xs_rows_of_576_fall_back_to_iq4_nl() -> None:
    # SmolLM2-135M's shapes: hidden 576 (not a multiple of 256), 30 layers, tied, GQA 3
    r = gguf_presets.resolve("IQ4_XS", _shapes(30, 576, 192, 1536, 49152, True), _cfg(30, 9, 3))
    t = r.types
    assert t["token_embd.weight"] == "Q8_0"  # tied: the output's type; 576 % 256 != 0 -> Q8_0
    assert t["blk.5.attn_q.weight"] == t["blk.5.ffn_up.weight"] == t["blk.5.attn_v.weight"] == "IQ4_NL"
    assert t["blk.5.ffn_down.weight"] == "IQ4_XS" and t["blk.0.ffn_down.weight"] == "Q5_K"  # rows of 1536
    assert any("falling back to IQ4_NL" in n for n in r.notes)
    # a row length 32 does not divide: llama.cpp writes F16, qformat keeps the tensor
    r = gguf_presets.resolve("IQ4_NL", {"blk.0.attn_q.weight": (8, 48)}, _cfg(1, 1, 1))
    assert r.types == {} and "fit no block type" in r.notes[0]


@pytest.mark.parametrize("preset", ["TQ1_0", "TQ2_0"])
def test_ternary_presets(preset: str) -> None:
    r = gguf_presets.resolve(preset, _shapes(4, 512, 256, 1024, 1000, False), _cfg(4, 8, 4))
    t = r.types
    assert t["token_embd.weight"] == "Q4_K" and t["output.weight"] == "Q6_K"
    assert all(v == preset for k, v in t.items() if k.startswith("blk."))
    # rows of 576 (not a multiple of 256): Q4_0, and the untied embedding's Q4_K -> Q5_0
    t = gguf_presets.resolve(preset, _shapes(2, 576, 192, 1536, 1000, False), _cfg(2, 9, 3)).types
    assert t["blk.0.attn_q.weight"] == "Q4_0" and t["blk.0.ffn_down.weight"] == preset and t["token_embd.weight"] == "Q5_0"
    assert t["output.weight"] == "Q8_0"
