"""``qformat quantize`` of a plain GGUF file reads its tensors in place (issue 42 item 6): no
temporary conversion is written, and the output is byte for byte what quantizing the file's
single-file conversion (``qformat convert model.gguf x.safetensors``) gives, as before.
(tests/test_llama_cpp_quantize.py compares the real models' route "file" with llama-quantize.)"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from qformat.errors import QFormatError

gguf = pytest.importorskip("gguf")

COLS = 256


def _gguf(path: Path, quantized: bool = False) -> Path:
    """A 2-layer llama GGUF of F32, F16 and I32 tensors (one Q8_0 tensor when ``quantized``)."""
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(5000)])  # large enough for its own member
    t: dict[str, np.ndarray] = {"token_embd.weight": rng.standard_normal((64, COLS)).astype(np.float32),
                                "output_norm.weight": rng.standard_normal(COLS).astype(np.float32),
                                "rope_freqs.weight": rng.standard_normal(COLS // 2).astype(np.float16),
                                "positions": np.arange(16, dtype=np.int32)}
    for i in range(2):
        t.update({f"blk.{i}.attn_norm.weight": rng.standard_normal(COLS).astype(np.float32),
                  f"blk.{i}.attn_q.weight": rng.standard_normal((COLS, COLS)).astype(np.float16),
                  f"blk.{i}.attn_v.weight": rng.standard_normal((64, COLS)).astype(np.float32),
                  f"blk.{i}.ffn_down.weight": rng.standard_normal((COLS, 512)).astype(np.float32),
                  f"blk.{i}.ffn_up.weight": rng.standard_normal((512, COLS)).astype(np.float32)})
    for name, a in t.items():
        if quantized and name == "blk.1.ffn_up.weight":
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _files(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("how", "kwargs"), [
    ("preset", {"preset": "Q4_K_M"}),
    ("preset", {"preset": "Q2_K"}),
    ("scheme", {"scheme": "int", "bits": 4, "group_size": 32}),
    ("sharded", {"scheme": "int", "bits": 8, "max_shard_size": "100KB"}),
])
def test_same_output_as_quantizing_the_conversion(tmp_path: Path, how: str, kwargs: dict) -> None:
    from qformat.checkpoint.quantize import quantize_checkpoint
    from qformat.convert import convert

    src = _gguf(tmp_path / "tiny.gguf")
    conv = tmp_path / "conv" / "tiny.safetensors"
    conv.parent.mkdir()
    convert(src, conv)
    folder = how == "sharded"
    a = tmp_path / ("a" if folder else "a.safetensors")
    b = tmp_path / ("b" if folder else "b.safetensors")
    sa = quantize_checkpoint(src, a, **kwargs)
    sb = quantize_checkpoint(conv, b, **kwargs)
    fa, fb = _files(a), _files(b)
    if not folder:
        fa, fb = list(fa.values()), list(fb.values())
    assert fa == fb
    da, db = sa.to_dict(), sb.to_dict()
    da.pop("files"), db.pop("files")
    assert da == db


def test_no_temporary_conversion_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF tensors are quantized from the GGUF file's memory map: nothing is converted first."""
    import qformat.convert as convert_pkg
    from qformat.checkpoint.gguf_plain import PlainGGUF
    from qformat.checkpoint.quantize import preset_recipe, quantize_checkpoint

    src = _gguf(tmp_path / "tiny.gguf")

    def no_write(*a, **k):  # noqa: ANN002, ANN003
        raise AssertionError("a conversion was written")

    monkeypatch.setattr(convert_pkg, "write", no_write)
    ck = PlainGGUF(src)
    arr = ck.array("blk.0.ffn_down.weight")
    assert arr.shape == (COLS, 512) and arr.dtype == np.float32 and not arr.flags.writeable and not arr.flags.owndata
    assert ck.info("rope_freqs.weight").dtype == "F16" and ck.info("positions").dtype == "I32"
    ck.release()
    # next to the GGUF file, under its conversion's name: a destination like any other
    dst = tmp_path / "tiny.safetensors"
    quantize_checkpoint(src, dst, preset="Q4_K_M")
    assert sorted(os.listdir(tmp_path)) == ["tiny.gguf", "tiny.safetensors"]
    assert preset_recipe(src, "Q4_K_M").preset == "Q4_K_M"


def test_a_quantized_gguf_is_refused(tmp_path: Path) -> None:
    from qformat.checkpoint.quantize import quantize_checkpoint

    src = _gguf(tmp_path / "q.gguf", quantized=True)
    with pytest.raises(QFormatError) as e:
        quantize_checkpoint(src, tmp_path / "out.safetensors", preset="Q4_K_M")
    assert e.value.code == "QUANTIZE_SOURCE_QUANTIZED" and "qformat convert" in e.value.message
    assert not (tmp_path / "out.safetensors").exists()


def test_a_truncated_gguf_keeps_the_readers_error(tmp_path: Path) -> None:
    from qformat.checkpoint.quantize import quantize_checkpoint

    src = _gguf(tmp_path / "t.gguf")
    data = src.read_bytes()
    src.write_bytes(data[: len(data) - 1000])
    with pytest.raises(QFormatError) as e:
        quantize_checkpoint(src, tmp_path / "out.safetensors", preset="Q4_K_M")
    assert e.value.code == "CONVERT_SOURCE_INVALID"


def test_a_folder_holding_one_gguf_file(tmp_path: Path) -> None:
    """A folder of one GGUF file is that file: a single-file output, as its conversion gives."""
    from qformat.checkpoint.quantize import quantize_checkpoint

    (tmp_path / "m").mkdir()
    src = _gguf(tmp_path / "m" / "tiny.gguf")
    quantize_checkpoint(tmp_path / "m", tmp_path / "a.safetensors", preset="Q4_K_M")
    quantize_checkpoint(src, tmp_path / "b.safetensors", preset="Q4_K_M")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_workers_equal_one_process(tmp_path: Path) -> None:
    from qformat.checkpoint.quantize import quantize_checkpoint

    src = _gguf(tmp_path / "tiny.gguf")
    kw = {"scheme": "int", "bits": 4, "group_size": 32, "max_shard_size": "100KB"}
    quantize_checkpoint(src, tmp_path / "one", **kw)
    s = quantize_checkpoint(src, tmp_path / "two", workers=2, **kw)
    assert [p["part"] for p in s.parts] == [1, 2]
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


def test_peak_memory_is_bounded(tmp_path: Path) -> None:
    """As tests/test_checkpoint_memory.py for safetensors: an F16 GGUF's tensors are read one at
    a time from its memory map (no conversion held or written), so the peak does not grow with it."""
    from .peak_memory import MB, assert_flat, peak

    H, I = 512, 2048  # the largest tensor is [2048, 512] fp16 = 2 MB
    base = peak([])
    peaks, sizes = [], []
    for k, layers in enumerate([12, 24]):
        rng = np.random.default_rng(k)
        src = tmp_path / f"src{k}.gguf"
        w = gguf.GGUFWriter(str(src), "llama")
        w.add_block_count(layers)
        total = 0
        for i in range(layers):
            for n, shape in (("attn_q", (H, H)), ("attn_k", (H, H)), ("attn_v", (H, H)), ("attn_output", (H, H)),
                             ("ffn_gate", (I, H)), ("ffn_up", (I, H)), ("ffn_down", (H, I))):
                a = rng.integers(0x2000, 0x2400, shape, dtype=np.uint16).view(np.float16)
                w.add_tensor(f"blk.{i}.{n}.weight", a)
                total += a.nbytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        sizes.append(total)
        out = tmp_path / f"out{k}.safetensors"
        peaks.append(peak(["quantize", "--quiet", "--scheme", "int", "--bits", "8", "--group-size", "32", str(src), str(out)]))
        assert out.is_file()
        os.sync()
    assert_flat("quantize (GGUF source)", peaks, sizes, base, 48 * MB)
