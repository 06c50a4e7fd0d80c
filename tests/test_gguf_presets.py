"""GGUF presets on a source converted from a GGUF file (no config.json): head counts from the GGUF
metadata, and the record ``qformat export --to gguf`` writes made what ``llama-quantize`` writes
(tests/test_llama_cpp_quantize.py checks the same against llama-quantize itself, byte for byte).

The expected values are llama.cpp's: ``llama_tensor_get_type`` gives a Q2_K ``attn_v`` Q4_K when
heads / KV heads >= 4, else Q3_K; ``llama_model_quantize_impl`` copies the input's keys, then sets
``general.quantization_version`` (2) and ``general.file_type`` (the ftype asked for: LLAMA_FTYPE,
gguf-py's ``LlamaFileType``), each removed and appended, removes the split keys, and the
``quantize.imatrix.*`` overrides come last.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qformat import gguf_presets

gguf = pytest.importorskip("gguf")

N_LAYER, COLS = 2, 256


def _tiny_gguf(path: Path, heads: int, kv_heads: int) -> Path:
    """An F32 GGUF of a 2-layer llama with rows of 256, written with gguf-py, whose head counts
    only its metadata says, and whose general.file_type sits before other keys (as llama.cpp's
    converter writes it)."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_block_count(N_LAYER)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_string("general.name", "tiny")
    t = {"token_embd.weight": (64, COLS), "output_norm.weight": (COLS,)}
    for i in range(N_LAYER):
        t.update({f"blk.{i}.attn_norm.weight": (COLS,), f"blk.{i}.attn_q.weight": (COLS, COLS), f"blk.{i}.attn_v.weight": (64, COLS),
                  f"blk.{i}.ffn_down.weight": (COLS, 512), f"blk.{i}.ffn_up.weight": (512, COLS)})
    for name, shape in t.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_head_counts_from_gguf_metadata() -> None:
    kv = {"general.architecture": {"type": "string", "value": "llama"}, "llama.block_count": {"type": "uint32", "value": 30},
          "llama.attention.head_count": {"type": "uint32", "value": 9},
          "llama.attention.head_count_kv": {"type": "array", "element_type": "uint32", "value": [3, 3]}}
    assert gguf_presets.gguf_hparams(kv) == {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3}
    assert gguf_presets.gguf_hparams({}) == {}


def test_quantized_metadata_is_llama_quantizes() -> None:
    u32 = lambda v: {"type": "uint32", "value": v}  # noqa: E731
    rec = {"version": 3, "alignment": 32, "kv": {"general.architecture": {"type": "string", "value": "llama"}, "general.file_type": u32(1),
                                                 "split.count": {"type": "uint16", "value": 1}, "llama.block_count": u32(1)},
           "tensors": [["blk.0.attn_q.weight", "F32", [256, 256]], ["blk.0.attn_norm.weight", "F32", [256]]]}
    r = gguf_presets.Resolved("Q4_K_M", types={"model.layers.0.self_attn.q_proj.weight": "Q4_K"}, gguf_types={"blk.0.attn_q.weight": "Q4_K"})
    im = [("quantize.imatrix.file", {"type": "string", "value": "im.gguf"}), ("quantize.imatrix.entries_count", u32(7))]
    meta = gguf_presets.quantized_metadata({"gguf": json.dumps(rec), "other": "kept"}, r, im)
    out = json.loads(meta["gguf"])
    assert list(out["kv"]) == ["general.architecture", "llama.block_count", "general.quantization_version", "general.file_type",
                               "quantize.imatrix.file", "quantize.imatrix.entries_count"]
    assert out["kv"]["general.file_type"] == u32(int(gguf.LlamaFileType.MOSTLY_Q4_K_M)) and out["kv"]["general.quantization_version"] == u32(2)
    assert out["tensors"] == [["blk.0.attn_q.weight", "Q4_K", [256, 256]], ["blk.0.attn_norm.weight", "F32", [256]]]
    assert meta["other"] == "kept" and gguf_presets.quantized_metadata({"x": "y"}, r) == {"x": "y"}


@pytest.mark.parametrize(("heads", "kv_heads", "attn_v"), [(4, 1, "Q4_K"), (4, 2, "Q3_K")])
def test_preset_on_a_gguf_file(tmp_path: Path, heads: int, kv_heads: int, attn_v: str) -> None:
    """``quantize_checkpoint`` of an F32 GGUF file (its single-file conversion), then export:
    the head counts come from the GGUF metadata, the file type and key order are llama-quantize's."""
    from gguf import GGUFReader

    from qformat.checkpoint.quantize import quantize_checkpoint
    from qformat.export import export

    src = _tiny_gguf(tmp_path / "tiny.gguf", heads, kv_heads)
    q = tmp_path / "q.safetensors"
    quantize_checkpoint(src, q, preset="Q2_K")
    export(q, tmp_path / "out.gguf", "gguf")
    r = GGUFReader(str(tmp_path / "out.gguf"))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(N_LAYER)] == [attn_v] * N_LAYER
    assert types["blk.0.attn_q.weight"] == "Q2_K" and types["blk.0.ffn_down.weight"] == "Q3_K" and types["token_embd.weight"] == "Q6_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert keys[-2:] == ["general.quantization_version", "general.file_type"] and "general.name" in keys
    assert int(r.fields["general.file_type"].contents()) == int(gguf.LlamaFileType.MOSTLY_Q2_K)
