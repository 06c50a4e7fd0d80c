"""Scheme ``gguf`` (llama.cpp's block types) and the llama-quantize presets, in the default suite.

The byte-level truth is llama-quantize's: ``tests/fixtures/llama_quantize/ggml_blocks.safetensors``
holds float32 rows (from a trained tiny Llama 3 and from awkward random data) and the blocks
``llama-quantize --pure`` wrote for them in each type, frozen by the llama_cpp marker test
(tests/test_llama_cpp_quantize.py, which rebuilds them from llama.cpp and compares).  The
generic encoder properties (descriptors, every shape, error bounds, plans) are in
tests/test_schemes.py with the other schemes.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import gguf_presets
from qformat.errors import QFormatError
from qformat.schemes.ggml_blocks import NONLINEAR_TYPES, SIZES, TYPES, quantize_blocks

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize" / "ggml_blocks.safetensors"


def _fixture() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(FIXTURE))


def _cases() -> list[tuple[str, str]]:
    keys = _fixture().keys()
    return sorted((t, k[len("input."):]) for k in keys if k.startswith("input.") for t in TYPES)


@pytest.mark.parametrize(("qtype", "case"), _cases())
def test_blocks_equal_llama_quantize(qtype: str, case: str) -> None:
    fx = _fixture()
    x, want = fx["input." + case], fx[f"{qtype}.{case}"]
    got = quantize_blocks(x.reshape(-1, SIZES[qtype][0]), qtype).reshape(want.shape)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{qtype} {case}: {len(bad)} bytes differ, the first at row {bad[0][0]} byte {bad[0][1]}"


@pytest.mark.parametrize("qtype", TYPES)
def test_fixture_covers_the_awkward_rows(qtype: str) -> None:
    # The random rows include all-zero, constant, one-spike, one-sign and 1e-30 rows; a fixture
    # missing them would let the edge cases drift.
    x = _fixture()["input.random.blk.0.attn_q.weight"]
    assert (x == 0).all(axis=1).any() and (np.abs(x).max(axis=1) < 1e-20).any() and ((x > 0).all(axis=1)).any()


@pytest.mark.parametrize("qtype", TYPES)
def test_export_writes_the_same_blocks(qtype: str, tmp_path: Path) -> None:
    """quantize -> qformat file -> ``qformat export --to gguf``: gguf-py reads llama-quantize's
    bytes back, and qformat's decode equals gguf-py's dequantize of them."""
    import gguf
    from gguf import GGUFReader
    from gguf.quants import dequantize

    fx = _fixture()
    tensors = {}
    for case in ("random.blk.0.ffn_down.weight", "trained.blk.0.attn_q.weight"):
        tensors[case.replace(".weight", "")] = (fx["input." + case], fx[f"{qtype}.{case}"])
    src = tmp_path / "q.safetensors"
    qformat.save_file({n: qformat.quantize(x, "gguf", type=qtype) for n, (x, _) in tensors.items()}, src)
    assert qformat.check(src).ok
    out = tmp_path / "q.gguf"
    from qformat.export import export

    export(str(src), str(out), to="gguf")
    r = GGUFReader(str(out))
    loaded = qformat.load_file(str(src))
    for t in r.tensors:
        x, want = tensors[t.name]
        assert t.tensor_type.name == qtype
        assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), want.reshape(-1)), t.name
        y = dequantize(want, gguf.GGMLQuantizationType[qtype]).astype(np.float32)
        assert np.array_equal(loaded[t.name].view(np.uint32), y.reshape(x.shape).view(np.uint32)), t.name


@pytest.mark.parametrize("qtype", TYPES)
def test_rows_of_partial_blocks_refused(qtype: str) -> None:
    block = SIZES[qtype][0]
    for shape in [(4, block + 16), (block // 2,), ()]:
        with pytest.raises(QFormatError) as e:
            qformat.quantize(np.ones(shape, np.float32), "gguf", type=qtype)
        assert e.value.code == "ENCODE_PARAM_INVALID" and e.value.field == "type" and f"multiple of {block}" in str(e.value)


@pytest.mark.parametrize("qtype", TYPES)
def test_overflowing_values_refused(qtype: str) -> None:
    x = np.ones((2, 256), np.float32)
    x[1, 7] = 1e20  # squares overflow binary32: ggml would write a zero block
    with pytest.raises(QFormatError) as e:
        qformat.quantize(x, "gguf", type=qtype)
    assert e.value.code == "ENCODE_INPUT_INVALID" and "overflow" in str(e.value)
    x[1, 7] = 3e9  # F16 block parameters overflow (every type's are below 65504 * 2^8 here)
    with pytest.raises(QFormatError) as e:
        qformat.quantize(x, "gguf", type=qtype)
    block = SIZES[qtype][0]
    assert e.value.code == "ENCODE_INPUT_INVALID" and "overflow" in str(e.value) and f"elements 256..{255 + block}" in str(e.value)


def test_unknown_type_refused() -> None:
    with pytest.raises(QFormatError) as e:
        qformat.quantize(np.ones((2, 256), np.float32), "gguf", type="IQ2_XXS")  # read, never produced
    assert e.value.code == "ENCODE_PARAM_INVALID" and e.value.field == "type"


def test_float64_input_rounds_to_binary32_first() -> None:
    x = np.random.default_rng(3).standard_normal((4, 256))
    a = qformat.quantize(x, "gguf", type="Q4_K")
    b = qformat.quantize(x.astype(np.float32), "gguf", type="Q4_K")
    assert all(np.array_equal(a.components[k], b.components[k]) for k in a.components)


# -- presets ---------------------------------------------------------------------------------------
def _llama_shapes(layers: int, hidden: int, kv: int, ffn: int, vocab: int, tied: bool = False) -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not tied:
        s["lm_head.weight"] = (vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        s.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                  p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                  p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                  p + "mlp.down_proj.weight": (hidden, ffn), p + "input_layernorm.weight": (hidden,),
                  p + "post_attention_layernorm.weight": (hidden,)})
    return s


def _resolve(preset: str, shapes: dict[str, tuple[int, ...]], cfg: dict) -> gguf_presets.Resolved:
    return gguf_presets.resolve(preset, shapes, cfg, gguf_presets.gguf_names(list(shapes), cfg))


LLAMA3_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}


def test_q4_k_m_of_llama3_8b_has_llama_cpps_counts() -> None:
    # Published llama.cpp load logs of Meta-Llama-3-8B Q4_K_M files say q4_K: 193, q6_K: 33 tensors
    # (and 65 F32); an external reference, as the 8B model is not on this machine.
    r = _resolve("Q4_K_M", _llama_shapes(32, 4096, 1024, 14336, 128256), LLAMA3_8B)
    counts = {t: list(r.types.values()).count(t) for t in set(r.types.values())}
    assert counts == {"Q4_K": 193, "Q6_K": 33}
    more = [i for i in range(32) if r.types[f"model.layers.{i}.self_attn.v_proj.weight"] == "Q6_K"]
    assert more == [i for i in range(32) if i < 4 or i >= 28 or (i - 4) % 3 == 2]
    assert r.types["lm_head.weight"] == "Q6_K" and r.types["model.embed_tokens.weight"] == "Q4_K"
    assert not any(".norm" in n or "layernorm" in n for n in r.types)


def test_tied_embedding_takes_the_output_type() -> None:
    r = _resolve("Q4_K_M", _llama_shapes(4, 512, 128, 1024, 1000, tied=True), dict(LLAMA3_8B, num_hidden_layers=4))
    assert r.types["model.embed_tokens.weight"] == "Q6_K"
    r = _resolve("Q8_0", _llama_shapes(4, 512, 128, 1024, 1000, tied=True), dict(LLAMA3_8B, num_hidden_layers=4))
    assert set(r.types.values()) == {"Q8_0"}


def test_rows_the_block_does_not_divide_fall_back_as_llama_cpp() -> None:
    # Qwen2.5-0.5B: hidden 896 = 3.5 super-blocks.
    cfg = {"model_type": "qwen2", "num_hidden_layers": 2, "num_attention_heads": 14, "num_key_value_heads": 2}
    r = _resolve("Q4_K_M", _llama_shapes(2, 896, 128, 4864, 1000), cfg)
    assert r.types["model.layers.0.self_attn.q_proj.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert r.types["model.layers.0.self_attn.v_proj.weight"] == "Q5_0"
    assert r.types["model.layers.1.self_attn.v_proj.weight"] == "Q8_0"  # more bits (the last layer): Q6_K -> Q8_0
    assert r.types["lm_head.weight"] == "Q8_0"  # 896 % 256: the output takes Q8_0
    assert r.types["model.layers.0.mlp.down_proj.weight"] == "Q4_K"  # rows of 4864 = 19 * 256 fit
    assert r.types["model.layers.1.mlp.down_proj.weight"] == "Q6_K"
    assert any("falling back" in n for n in r.notes)
    r = _resolve("Q4_K_M", {"blk.0.attn_q.weight": (64, 40)}, {"num_hidden_layers": 1})
    assert r.types == {} and "F16" in r.notes[0]


def test_70b_attn_v_gets_q5_k() -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}
    shapes = {f"blk.{i}.attn_v.weight": (1024, 8192) for i in range(80)}
    r = gguf_presets.resolve("Q3_K_M", shapes, cfg)
    assert set(r.types.values()) == {"Q5_K"}
    r = gguf_presets.resolve("Q3_K_M", shapes, dict(cfg, num_hidden_layers=79))
    assert {r.types[f"blk.{i}.attn_v.weight"] for i in range(2, 79)} == {"Q4_K"}


def test_q2_k_s_needs_an_importance_matrix() -> None:
    with pytest.raises(QFormatError) as e:
        _resolve("Q2_K_S", _llama_shapes(2, 256, 128, 512, 64), dict(LLAMA3_8B, num_hidden_layers=2))
    assert e.value.code == "ENCODE_PARAM_INVALID" and "importance matrix" in str(e.value)


def test_preset_table_is_consistent() -> None:
    table = gguf_presets.presets()
    for name, p in table.items():
        assert p["type"] in TYPES + NONLINEAR_TYPES
        for cat in set(p) - {"type", "ftype", "requires_imatrix"}:
            assert cat in ("attn_v", "ffn_down", "attn_output", "token_embd"), (name, cat)
            for cond, t in p[cat]:
                assert t in TYPES + NONLINEAR_TYPES
                gguf_presets._holds(cond, 0, 8, 4.0, True)  # a KeyError for an unknown condition
    import gguf

    for name, p in table.items():
        assert int(gguf.LlamaFileType[f"MOSTLY_{name}"]) == p["ftype"], name


def test_recipe_toml_round_trips() -> None:
    from qformat.recipe import Recipe

    r = _resolve("Q4_K_M", _llama_shapes(3, 256, 128, 512, 1000), dict(LLAMA3_8B, num_hidden_layers=3))
    text = gguf_presets.recipe_toml(r)
    tomllib.loads(text)
    rec = Recipe.from_toml(text)
    assert [(x.pattern, x.choice.scheme, x.choice.params) for x in rec.rules] == \
        [(n, "gguf", {"type": t}) for n, t in r.types.items()]


def test_preset_needs_llama_names() -> None:
    with pytest.raises(QFormatError) as e:
        gguf_presets.gguf_names(["encoder.layer.0.attention.self.query.weight"], {"model_type": "no-such-arch"})
    assert e.value.code == "ENCODE_PARAM_INVALID" and "no-such-arch" in str(e.value)
    names = gguf_presets.gguf_names(["encoder.layer.0.attention.self.value.weight", "pooler.dense.weight"],
                                    {"model_type": "bert", "num_hidden_layers": 6})
    assert names == {"encoder.layer.0.attention.self.value.weight": "blk.0.attn_v.weight", "pooler.dense.weight": None}
    with pytest.raises(QFormatError) as e:
        gguf_presets.resolve("Q4_K_XL", {}, {})
    assert e.value.code == "ENCODE_PARAM_INVALID" and "Q4_K_M" in str(e.value)


def test_cli_preset_options(tmp_path: Path) -> None:
    from qformat.cli import main

    assert main(["quantize", str(tmp_path), str(tmp_path / "o"), "--preset", "Q4_K_M", "--scheme", "int"]) == 2
    assert main(["quantize", str(tmp_path), str(tmp_path / "o"), "--scheme", "int", "--save-recipe", str(tmp_path / "r.toml")]) == 2
    assert not (tmp_path / "o").exists() and not (tmp_path / "r.toml").exists()


def test_preset_quantizes_a_llama_folder(tmp_path: Path) -> None:
    """A tiny llama folder through ``quantize_checkpoint(preset=...)``: the types of the preset,
    config.json records the preset, and the quantized tensors are what the scheme writes."""
    from safetensors.numpy import save_file

    from qformat.checkpoint.quantize import quantize_checkpoint

    cfg = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "intermediate_size": 512, "vocab_size": 64, "architectures": ["LlamaForCausalLM"]}
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    shapes = _llama_shapes(2, 256, 128, 512, 64)
    save_file({n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}, str(src / "model.safetensors"))
    s = quantize_checkpoint(src, tmp_path / "dst", preset="Q4_K_M")
    assert s.quantized_tensors == 16
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert qc["gguf_preset"] == "Q4_K_M"
    want = _resolve("Q4_K_M", shapes, cfg)
    from safetensors.numpy import load_file

    plain = load_file(str(src / "model.safetensors"))
    got = qformat.load_file(str(tmp_path / "dst" / "model.safetensors"))
    for n, t in want.types.items():
        ref = qformat.quantize(plain[n], "gguf", type=t).dequantize()
        assert np.array_equal(got[n], ref), n
    assert math.isclose(len(want.types), 16)


def _native_levels() -> list[int]:
    from qformat import kernels

    if kernels._ggml is None:
        return []
    return [0, 1] + ([2] if kernels._ggml.best_level() == 2 else [])


@pytest.mark.parametrize("level", _native_levels() or [pytest.param(None, marks=pytest.mark.skip(reason="the native extension is not built"))])
@pytest.mark.parametrize("qtype", TYPES)
def test_native_levels_equal_llama_quantize(qtype: str, level: int) -> None:
    """qformat/kernels/_ggml.c at every level (scalar; 8 sub-blocks per vector, baseline ISA and
    AVX2) against llama-quantize's frozen bytes, and against the NumPy reference on rows of
    extreme but accepted magnitudes."""
    from qformat import kernels

    fx = _fixture()
    for key in (k for k in fx if k.startswith("input.")):
        x, want = fx[key], fx[f"{qtype}.{key[len('input.'):]}"]
        out = np.empty(want.size, np.uint8)
        kernels._ggml.quantize(qtype, np.ascontiguousarray(x), out, level)
        assert np.array_equal(out, want.reshape(-1)), key
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(256) * 6e4, rng.standard_normal(256) * 1e-39, np.full(256, -3.0),
                        rng.standard_normal(256) * 1e-3]).astype(np.float32)
    out = np.empty(x.size // SIZES[qtype][0] * SIZES[qtype][1], np.uint8)
    kernels._ggml.quantize(qtype, x, out, level)
    assert np.array_equal(out, quantize_blocks(x.reshape(-1, SIZES[qtype][0]), qtype).reshape(-1))


def test_default_path_is_the_native_kernel_where_built() -> None:
    from qformat import kernels

    if kernels._ggml is None:
        pytest.skip("the native extension is not built")
    assert kernels.ggml_available()
    with kernels.use("numpy"):
        assert not kernels.ggml_available()
