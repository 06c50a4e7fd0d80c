"""Export to GGUF, with gguf-py (0.19) as the oracle: ``GGUFReader`` reads what was written and
``gguf.quants.dequantize`` decodes it.

- A GGUF file written by gguf-py's own ``GGUFWriter`` (every supported ggml type, plain tensors,
  KVs of every value type, one moved into a ``gguf.kv.*`` tensor) goes through ``qformat convert``
  and back: the same file, byte for byte, and per tensor the same type, shape and bytes.
- Every mapping's decode rule is gguf-py's ``dequantize`` bit for bit, and every exported tensor
  dequantizes to qformat's binary32 values of its source.
- qformat's own int4 / int8 / int3 / int5 g32 F16 and mxfp4 export to Q4_0 / Q8_0 / Q4_0 / Q5_0 /
  MXFP4; what has no exact form is refused (nothing left at DST) or, with ``allow_rounding``,
  re-encoded and reported.
- A tiny Llama (transformers, random weights) quantized with ``quantize_checkpoint`` exports with
  llama.cpp's KVs, tensor names (gguf-py's ``TensorNameMap``) and q/k rotary permutation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

import qformat
from qformat.convert import convert
from qformat.errors import QFormatError
from qformat.export import export
from qformat.export.gguf import BY_NAME, _decode, rotary_permutation

from ..convert.test_gguf import K_SCALES, QUANTIZABLE, quant_data, write_gguf

ALL_TYPES = QUANTIZABLE + list(K_SCALES)
INT4 = {"bits": 4, "group_size": 32, "scale_dtype": "float16"}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit for bit, any NaN matching any NaN."""
    g, w = np.asarray(got, np.float32).reshape(-1), np.asarray(want, np.float32).reshape(-1)
    return g.shape == w.shape and bool(((_bits(g) == _bits(w)) | (np.isnan(g) & np.isnan(w))).all())


def _dequant(t: gguf.ReaderTensor) -> np.ndarray:
    """gguf-py's values of a tensor read by GGUFReader, in NumPy (logical) order."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), np.float32)
    return v.reshape(tuple(int(s) for s in reversed(t.shape)))


def _kvs(path: Path) -> dict[str, tuple[list[int], object]]:
    """Every KV as (value type ids, contents) via GGUFReader (the GGUF.* header fields excluded)."""
    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        v = f.contents()
        out[k] = ([int(t) for t in f.types], json.dumps(v, default=str) if not isinstance(v, float) or v == v else "nan")
    return out


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {t.name: (t.tensor_type.name, tuple(int(s) for s in t.shape), np.asarray(t.data).tobytes())
            for t in gguf.GGUFReader(path).tensors}


def _source_values(path: Path) -> dict[str, np.ndarray]:
    """qformat's binary32 values of every logical tensor (converted sources are float32)."""
    return {k: np.asarray(v).astype(np.float32) for k, v in qformat.load_file(path).items()}


# -- the decode rule is gguf-py's ---------------------------------------------------------------------
@pytest.mark.parametrize("qt", ALL_TYPES, ids=lambda t: t.name)
def test_decode_rule_is_gguf_py(qt: T) -> None:
    rng = np.random.default_rng(int(qt) + 100)
    bs = gguf.GGML_QUANT_SIZES[qt][0]
    raw = quant_data(qt, (4, 2 * bs), rng)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.asarray(dequantize(raw, qt), np.float32).reshape(4, 2 * bs)
    assert _same(_decode(BY_NAME[qt.name], raw, (4, 2 * bs)), want)


# -- GGUF -> qformat -> GGUF ------------------------------------------------------------------------
def _kv_writers() -> list:
    big = [f"tok{i:06d}" for i in range(9000)]  # > 64 KiB of JSON: the converter moves it into a tensor
    return [
        lambda w: w.add_uint8("t.u8", 200), lambda w: w.add_int8("t.i8", -100), lambda w: w.add_uint16("t.u16", 60000),
        lambda w: w.add_int16("t.i16", -30000), lambda w: w.add_uint32("t.u32", 4000000000), lambda w: w.add_int32("t.i32", -2000000000),
        lambda w: w.add_float32("t.f32", 0.1), lambda w: w.add_float32("t.nan", float("nan")), lambda w: w.add_float32("t.inf", float("-inf")),
        lambda w: w.add_uint64("t.u64", 2**63 + 5), lambda w: w.add_int64("t.i64", -(2**62)), lambda w: w.add_float64("t.f64", 1 / 3),
        lambda w: w.add_bool("t.bool", True), lambda w: w.add_string("t.str", "héllo ✓"),
        lambda w: w.add_array("t.ints", [1, 2, 3]), lambda w: w.add_array("t.floats", [0.5, -1.25]),
        lambda w: w.add_array("t.strs", ["a", "b c", ""]), lambda w: w.add_array("t.bools", [True, False]),
        lambda w: w.add_array("t.nested", [[1, 2], [3]]),
        lambda w: w.add_array("tokenizer.ggml.tokens", big),
    ]


def _round_trip(tmp_path: Path, tensors: list, alignment: int | None = None) -> tuple[Path, Path, Path]:
    src = write_gguf(tmp_path / "src.gguf", tensors, kv=_kv_writers(), alignment=alignment)
    mid = tmp_path / "mid.safetensors"
    convert(src, mid)
    out = tmp_path / "out.gguf"
    rep = export(mid, out, to="gguf")
    assert rep.to_dict()["exact"] is True and rep.files == [str(out)]
    return src, mid, out


def test_round_trip_every_type_byte_for_byte(tmp_path: Path) -> None:
    """gguf-py's file -> qformat convert -> export: the same file, tensor by tensor and KV by KV."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    tensors: list = []
    for qt in ALL_TYPES:
        bs = gguf.GGML_QUANT_SIZES[qt][0]
        tensors.append((f"blk.0.{qt.name.lower()}.weight", quant_data(qt, (3, 2 * bs), rng), qt))
        tensors.append((f"blk.1.{qt.name.lower()}.weight", quant_data(qt, (2, 2, bs), rng), qt))
    mx = quant_data(T.MXFP4, (2, 64), rng)
    mx.reshape(-1, 17)[1, 0] = 255  # ggml's 2^127: the converter's nested exponent table
    tensors.append(("mx255", mx, T.MXFP4))
    bf = rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16).view(np.uint8)
    tensors += [("norm.f32", rng.standard_normal(8).astype(np.float32), None), ("h.f16", rng.standard_normal((2, 3)).astype(np.float16), None),
                ("h.bf16", bf, T.BF16), ("h.f64", rng.standard_normal(3), None), ("h.i32", np.arange(-3, 3, dtype=np.int32), None),
                ("h.i8", np.arange(-4, 4, dtype=np.int8), None)]
    src, mid, out = _round_trip(tmp_path, tensors)
    from qformat.container import read_header

    assert "gguf.kv.tokenizer.ggml.tokens" in read_header(mid).metadata  # the large value went through its own member
    assert not any(n.startswith("gguf.kv.") for n in qformat.load_file(mid))  # ... and the tensors are the model's
    assert _tensors(out) == _tensors(src)
    assert _kvs(out) == _kvs(src)
    assert out.read_bytes() == src.read_bytes()
    # every exported tensor decodes (gguf-py) to qformat's binary32 values of the converted source
    values = _source_values(mid)
    for t in gguf.GGUFReader(out).tensors:
        if t.tensor_type not in (T.F64, T.I32, T.I8):
            assert _same(_dequant(t), values[t.name]), t.name


def test_round_trip_keeps_alignment_and_nonfinite_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a, c = quant_data(T.Q4_K, (2, 256), rng), quant_data(T.Q4_1, (1, 64), rng)
    a.reshape(-1, 144)[0, 2:4] = np.array([0x7E00], np.uint16).view(np.uint8)  # dmin NaN
    c.reshape(-1, 20)[1, 0:2] = np.array([0xFC00], np.uint16).view(np.uint8)  # d -Inf
    tensors = [("a", a, T.Q4_K), ("b", rng.standard_normal(5).astype(np.float32), None), ("c", c, T.Q4_1)]
    src, mid, out = _round_trip(tmp_path, tensors, alignment=64)
    assert gguf.GGUFReader(out).alignment == 64
    assert out.read_bytes() == src.read_bytes()
    values = _source_values(mid)
    for t in gguf.GGUFReader(out).tensors:
        assert _same(_dequant(t), values[t.name])
    assert np.isnan(values["a"]).any() and np.isinf(values["c"]).any()


# -- qformat's own schemes ---------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,params,ggml", [
    ("int", INT4, "Q4_0"), ("int", dict(INT4, bits=8), "Q8_0"), ("int", dict(INT4, bits=3), "Q4_0"),
    ("int", dict(INT4, bits=5), "Q5_0"), ("int", dict(INT4, bits=2), "Q4_0"), ("mxfp4", {}, "MXFP4"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_qformat_schemes_export_exactly(scheme: str, params: dict, ggml: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 128)).astype(np.float32) * rng.choice([1e-3, 1.0, 50.0], size=(6, 1)).astype(np.float32)
    if scheme == "mxfp4":
        x = np.where(np.abs(x) < 0.25 * np.abs(x).max(axis=1, keepdims=True), np.abs(x), x)  # no negative value rounds to -0
    q = qformat.quantize(x, scheme, **params)
    src = tmp_path / "src.safetensors"
    e = rng.standard_normal((3, 128)).astype(np.float16)
    qformat.save_file({"w": q, "b": rng.standard_normal(128).astype(np.float16), "e": e}, src)
    out = tmp_path / "w.gguf"
    rep = export(src, out, to="gguf")
    assert rep.to_dict()["exact"] is True
    r = gguf.GGUFReader(out)
    (w,) = [t for t in r.tensors if t.name == "w"]
    assert w.tensor_type.name == ggml and [int(s) for s in w.shape] == [128, 6]
    assert _same(_dequant(w), np.asarray(qformat.load_file(src)["w"], np.float32))
    # a 1-D float16 tensor (a norm weight, a bias) is widened to F32 as llama.cpp's converter
    # writes it (its CPU backend aborts on a BF16 norm weight), exactly; 2-D plain tensors stay
    (b,) = [t for t in r.tensors if t.name == "b"]
    assert b.tensor_type == T.F32 and np.array_equal(np.asarray(b.data), qformat.load_file(src)["b"].astype(np.float32))
    (e2,) = [t for t in r.tensors if t.name == "e"]
    assert e2.tensor_type == T.F16 and np.asarray(e2.data).tobytes() == e.tobytes()
    assert "general.architecture" not in r.fields  # no config.json: names and nothing else


def test_mxfp4_negative_zero_is_not_exact_and_says_why(tmp_path: Path) -> None:
    from qformat.qtensor import QTensor

    x = np.full((2, 32), 4.0, np.float32)
    x[0, 3] = -1e-9  # rounds to zero: qformat's encoder writes +0 (code 0), which ggml reads alike
    q = qformat.quantize(x, "mxfp4")
    d = np.asarray(q.dequantize())
    assert d[0, 3] == 0 and not np.signbit(d[0, 3])
    ours = tmp_path / "ours.safetensors"
    qformat.save_file({"w": q}, ours)
    assert all(t.exact for t in export(ours, tmp_path / "ours.gguf", to="gguf").results)
    # Another writer's E2M1 -0 (code 8, element 3 = the high nibble of byte 1) has no MXFP4 form.
    codes = np.array(q.components["codes"])
    codes[0, 1] = (codes[0, 1] & 0x0F) | 0x80
    q = QTensor(q.descriptor, {**q.components, "codes": codes})
    d = np.asarray(q.dequantize())
    assert d[0, 3] == 0 and np.signbit(d[0, 3])
    tmp_path = tmp_path / "neg"
    tmp_path.mkdir()
    src = tmp_path / "src.safetensors"
    qformat.save_file({"w": q}, src)
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "o.gguf", to="gguf")
    assert e.value.code == "EXPORT_NOT_EXACT" and "sign of zero" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["src.safetensors"]
    rep = export(src, tmp_path / "o.gguf", to="gguf", allow_rounding=True)
    (r,) = rep.rounded
    assert r.name == "w" and r.max_abs == 0


# -- refusals and rounding ---------------------------------------------------------------------------
def _refused(tmp_path: Path, tensors: dict) -> QFormatError:
    src = tmp_path / "src.safetensors"
    qformat.save_file(tensors, src)
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "o.gguf", to="gguf")
    assert e.value.tensor == "w"
    assert sorted(os.listdir(tmp_path)) == ["src.safetensors"]
    return e.value


def test_refusals_leave_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    e = _refused(tmp_path, {"w": qformat.quantize(x, "int", **dict(INT4, group_size=64))})
    assert e.code == "EXPORT_UNMAPPABLE" and "32" in str(e)
    e = _refused(tmp_path, {"w": qformat.quantize(x, "int", bits=4, group_size=128, symmetric=False)})
    assert e.code == "EXPORT_UNMAPPABLE" and "zero point" in str(e)
    e = _refused(tmp_path, {"w": qformat.quantize(x, "nf4", block_size=64)})
    assert e.code == "EXPORT_UNMAPPABLE"
    # F32 scales: exported as F16 only where every scale is an F16 value (x / 7 is not)
    e = _refused(tmp_path, {"w": qformat.quantize(x, "int", bits=4, group_size=32, scale_dtype="float32")})
    assert e.code == "EXPORT_NOT_EXACT"


def test_f32_scales_that_are_f16_values_export(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    q = qformat.quantize(rng.standard_normal((2, 64)).astype(np.float32), "int", **INT4)
    comps = dict(q.components)
    comps["scale"] = comps["scale"].astype(np.float32)  # the same values, stored wider
    src = tmp_path / "src.safetensors"
    qformat.save_file({"w": qformat.QTensor(q.descriptor, comps)}, src)
    out = tmp_path / "o.gguf"
    assert export(src, out, to="gguf").to_dict()["exact"] is True
    (t,) = gguf.GGUFReader(out).tensors
    assert t.tensor_type == T.Q4_0 and _same(_dequant(t), np.asarray(q.dequantize(), np.float32))


def test_allow_rounding_reencodes_and_reports(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 128)).astype(np.float32)
    src = tmp_path / "src.safetensors"
    qformat.save_file({"a": qformat.quantize(x, "int", **dict(INT4, group_size=64)),
                       "b": qformat.quantize(x, "int", bits=4, group_size=128, symmetric=False),
                       "c": qformat.quantize(x, "nf4", block_size=64),
                       "d": qformat.quantize(x, "int", bits=4, group_size=32, scale_dtype="float32")}, src)
    out = tmp_path / "o.gguf"
    rep = export(src, out, to="gguf", allow_rounding=True)
    rounded = {r.name: r for r in rep.rounded}
    assert set(rounded) == {"a", "b", "c", "d"}
    for name in "abc":
        assert rounded[name].reencoded and rounded[name].max_abs > 0 and 5 < rounded[name].sqnr_db < 100
    assert rounded["d"].reencoded is None and 0 < rounded["d"].max_abs < 1e-2  # scales rounded to F16
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert types == {"a": "Q4_0", "b": "Q4_0", "c": "Q8_0", "d": "Q4_0"}
    values = qformat.load_file(src)
    for t in gguf.GGUFReader(out).tensors:  # the reported difference is the one gguf-py sees
        diff = np.abs(_dequant(t).astype(np.float64) - np.asarray(values[t.name], np.float64)).max()
        assert diff == pytest.approx(rounded[t.name].max_abs, rel=0, abs=0)
    d = rep.to_dict()["rounded"]
    assert all("max_abs_diff" in r and "sqnr_db" in r for r in d)


def test_destination_rules(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    src = tmp_path / "src.safetensors"
    qformat.save_file({"w": qformat.quantize(rng.standard_normal((2, 64)).astype(np.float32), "int", **INT4)}, src)
    out = tmp_path / "o.gguf"
    out.write_bytes(b"old")
    with pytest.raises(QFormatError) as e:
        export(src, out, to="gguf")
    assert e.value.code == "EXPORT_DESTINATION_INVALID" and out.read_bytes() == b"old"
    export(src, out, to="gguf", overwrite=True)
    assert out.read_bytes()[:4] == b"GGUF"
    assert sorted(os.listdir(tmp_path)) == ["o.gguf", "src.safetensors"]


# -- a Hugging Face llama ----------------------------------------------------------------------------
def _hf_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py ``LlamaModel.permute`` (llama.cpp), verbatim in NumPy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_rotary_permutation_is_llama_cpp_s() -> None:
    w = np.arange(64 * 3).reshape(64, 3)
    for heads in (1, 2, 4, 8):
        assert np.array_equal(w[rotary_permutation(64, heads)], _hf_permute(w, heads, heads))


SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>"]


def _bpe_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer.json (GPT-2 / Llama 3 style) with two special tokens added
    after the trained vocabulary, a BOS template and a tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog's back"] * 20, trainer)
    tok.add_special_tokens(SPECIAL)
    bos = tok.token_to_id(SPECIAL[0])
    tok.post_processor = processors.TemplateProcessing(single=f"{SPECIAL[0]} $A", pair=f"{SPECIAL[0]} $A {SPECIAL[0]} $B", special_tokens=[(SPECIAL[0], bos)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "chat_template": "{{ messages }}",
                                                               "tokenizer_class": "PreTrainedTokenizerFast"}))


def test_tiny_llama(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    _bpe_tokenizer(tmp_path / "hf")
    qformat.quantize_checkpoint(tmp_path / "hf", tmp_path / "q", scheme="int", bits=4, group_size=32, scale_dtype="float16")
    out = tmp_path / "llama.gguf"
    # the tokenizer trained here is in no llama.cpp table: no pre-tokenizer is guessed, nothing is written
    with pytest.raises(QFormatError) as e:
        export(tmp_path / "q", out, to="gguf")
    assert e.value.code == "EXPORT_TOKENIZER_UNKNOWN" and "--gguf-pre" in str(e.value) and not out.exists()
    rep = export(tmp_path / "q", out, to="gguf", gguf_pre="gpt-2")
    assert rep.to_dict()["exact"] is True and rep.kinds()["Q4_0"] == 14  # 7 linear layers x 2 blocks
    r = gguf.GGUFReader(out)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert kv["general.architecture"] == "llama" and kv["tokenizer.ggml.pre"] == "gpt-2"
    assert "general.name" not in kv  # no model card, no _name_or_path: not the folder's name ("q")
    want = {"llama.block_count": 2, "llama.context_length": 256, "llama.embedding_length": 128, "llama.feed_forward_length": 256,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.rope.dimension_count": 32,
            "llama.vocab_size": 300, "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_0), "general.quantization_version": 2}
    assert {k: kv[k] for k in want} == want
    assert kv["llama.rope.freq_base"] == pytest.approx(10000.0) and kv["llama.attention.layer_norm_rms_epsilon"] == np.float32(1e-5)
    assert r.fields["llama.rope.freq_base"].types == [gguf.GGUFValueType.FLOAT32]
    assert r.fields["llama.block_count"].types == [gguf.GGUFValueType.UINT32]
    # tensor names: gguf-py's map from Hugging Face names, every tensor present once
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    src = {k: np.asarray(v, np.float32) for k, v in qformat.load_file(tmp_path / "q" / "model.safetensors").items()}
    got = {t.name: t for t in r.tensors}
    expected = {names.get_name(k, try_suffixes=(".weight", ".bias")): k for k in src}
    assert set(got) == set(expected) and len(got) == len(src)
    for gname, hf in expected.items():
        t = got[gname]
        v = src[hf]
        if ".self_attn.q_proj." in hf:
            v = _hf_permute(v, 4, 4)
        elif ".self_attn.k_proj." in hf:
            v = _hf_permute(v, 4, 2)
        assert _same(_dequant(t), v), gname
        if hf.endswith("_proj.weight"):
            assert t.tensor_type == T.Q4_0
    # the tokenizer, against gguf-py's own readers of tokenizer.json (BpeVocab, SpecialVocab)
    from gguf.vocab import BpeVocab, SpecialVocab

    assert kv["tokenizer.ggml.model"] == "gpt2"
    bpe = list(BpeVocab(tmp_path / "hf").all_tokens())
    want_tokens = [t.decode() if isinstance(t, bytes) else t for t, _, _ in bpe] + [f"[PAD{i}]" for i in range(len(bpe), 300)]
    want_types = [int(k) for _, _, k in bpe] + [int(gguf.TokenType.UNUSED)] * (300 - len(bpe))
    assert kv["tokenizer.ggml.tokens"] == want_tokens and kv["tokenizer.ggml.token_type"] == want_types
    assert want_types.count(int(gguf.TokenType.CONTROL)) == 2
    sv = SpecialVocab(tmp_path / "hf", load_merges=True, n_vocab=300)
    assert sv.merges and kv["tokenizer.ggml.merges"] == sv.merges
    TK = gguf.Keys.Tokenizer
    ids = {"bos": TK.BOS_ID, "eos": TK.EOS_ID, "unk": TK.UNK_ID, "sep": TK.SEP_ID, "pad": TK.PAD_ID, "mask": TK.MASK_ID}
    assert {t: kv[ids[t]] for t in sv.special_token_ids} == sv.special_token_ids
    assert sv.special_token_ids["bos"] == want_tokens.index(SPECIAL[0])
    adds = {"bos": TK.ADD_BOS, "eos": TK.ADD_EOS, "sep": TK.ADD_SEP}
    assert {t: kv[adds[t]] for t in sv.add_special_token} == sv.add_special_token == {"bos": True, "sep": False}
    assert kv[TK.CHAT_TEMPLATE] == sv.chat_template


# -- equivalent descriptors from other origins ---------------------------------------------------------
def _converted(tmp_path: Path, qt: T, shape: tuple[int, ...]) -> tuple[np.ndarray, dict, dict]:
    """(GGUF bytes, descriptor, components) of one tensor converted from a gguf-py file."""
    from safetensors.numpy import load_file

    from qformat.container import read_header

    raw = quant_data(qt, shape, np.random.default_rng(int(qt)), edges=False)
    mid = tmp_path / f"{qt.name}.safetensors"
    convert(write_gguf(tmp_path / f"{qt.name}.gguf", [("w", raw, qt)]), mid)
    desc = json.loads(read_header(mid).metadata["qformat"])["tensors"]["w"]
    return raw, desc, load_file(mid)


def _export_one(tmp_path: Path, q: qformat.QTensor) -> gguf.ReaderTensor:
    src = tmp_path / "src.safetensors"
    qformat.save_file({"w": q}, src)
    out = tmp_path / "o.gguf"
    assert export(src, out, to="gguf", overwrite=True).to_dict()["exact"] is True
    (t,) = gguf.GGUFReader(out).tensors
    assert _same(_dequant(t), np.asarray(qformat.load_file(src)["w"], np.float32))
    return t


def _flip(a: np.ndarray) -> np.ndarray:
    return (np.asarray(a, np.float16).view(np.uint16) ^ np.uint16(0x8000)).view(np.float16)


def test_subtracted_minimum_is_q4_1(tmp_path: Path) -> None:
    """d * q - b is Q4_1 with m = -b (the F16 sign bit flipped): the same blocks as the source."""
    raw, desc, comps = _converted(tmp_path, T.Q4_1, (3, 64))
    desc["bias"]["op"] = "subtract"
    comps["w.bias"] = _flip(comps["w.bias"])
    t = _export_one(tmp_path, qformat.QTensor(desc, comps))
    assert t.tensor_type == T.Q4_1 and np.asarray(t.data).tobytes() == raw.tobytes()


def test_added_k_minimum_is_q4_k(tmp_path: Path) -> None:
    """A K-quant minimum added with dmin negated is the same Q4_K blocks."""
    raw, desc, comps = _converted(tmp_path, T.Q4_K, (2, 512))
    desc["bias"]["op"] = "add"
    comps["w.bias.scale"] = _flip(comps["w.bias.scale"])
    t = _export_one(tmp_path, qformat.QTensor(desc, comps))
    assert t.tensor_type == T.Q4_K and np.asarray(t.data).tobytes() == raw.tobytes()


def test_unsigned_codes_without_minimum_are_q5_0(tmp_path: Path) -> None:
    """Unsigned 4-bit codes (0..15) times d: Q5_0 holds -16..15, so q = x + 16."""
    _, desc, comps = _converted(tmp_path, T.Q4_1, (3, 64))
    del desc["bias"], comps["w.bias"]
    assert _export_one(tmp_path, qformat.QTensor(desc, comps)).tensor_type == T.Q5_0


def test_plain_types_without_a_ggml_form_are_refused(tmp_path: Path) -> None:
    e = _refused(tmp_path, {"w": np.arange(64, dtype=np.uint8)})
    assert e.code == "EXPORT_UNMAPPABLE" and "U8" in str(e)


def test_a_gguf_file_is_not_a_source(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", [("w", quant_data(T.Q8_0, (1, 32), np.random.default_rng(0)), T.Q8_0)])
    with pytest.raises(QFormatError) as e:
        export(src, tmp_path / "o.gguf", to="gguf")
    assert e.value.code == "EXPORT_UNMAPPABLE" and "qformat convert" in str(e.value)
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.parametrize("model_type", ["t5", "phi3"])
def test_other_architectures_are_refused_by_name(tmp_path: Path, model_type: str) -> None:
    """A model folder whose architecture is not in the architecture table is refused, naming it,
    and nothing is written (issue 42: a Gemma 3 folder was written with transformers' names, no
    hyperparameters and no tokenizer, reported as a success, and llama.cpp refused the file)."""
    folder = tmp_path / "m"
    folder.mkdir()
    rng = np.random.default_rng(7)
    qformat.save_file({"encoder.block.0.w": qformat.quantize(rng.standard_normal((4, 64)).astype(np.float32), "int", **INT4)}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    out = tmp_path / "o.gguf"
    with pytest.raises(QFormatError) as e:
        export(folder, out, to="gguf")
    assert e.value.code == "EXPORT_UNMAPPABLE" and repr(model_type) in str(e.value) and "llama, mistral, qwen2" in str(e.value)
    assert not out.exists()
    # asked for: the tensors under their own names, no model metadata
    export(folder, out, to="gguf", tensors_only=True)
    r = gguf.GGUFReader(out)
    assert "general.architecture" not in r.fields and [t.name for t in r.tensors] == ["encoder.block.0.w"]


def test_a_folder_without_model_type_keeps_its_names(tmp_path: Path) -> None:
    """No config.json model_type: a container of tensors, not a model; its names are kept."""
    folder = tmp_path / "m"
    folder.mkdir()
    rng = np.random.default_rng(7)
    qformat.save_file({"encoder.block.0.w": qformat.quantize(rng.standard_normal((4, 64)).astype(np.float32), "int", **INT4)}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architectures": ["Thing"]}))
    out = tmp_path / "o.gguf"
    export(folder, out, to="gguf")
    r = gguf.GGUFReader(out)
    assert "general.architecture" not in r.fields and [t.name for t in r.tensors] == ["encoder.block.0.w"]


def _convert_hf_llama3_factors(rp: dict, dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py ``LlamaModel.generate_extra_tensors`` (llama.cpp), in torch as there."""
    import math

    import torch

    base = rp.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rp.get("factor", 8.0)
    low_freq_factor = rp.get("low_freq_factor", 1.0)
    high_freq_factor = rp.get("high_freq_factor", 4.0)
    old_context_len = rp.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(rope_factors, dtype=torch.float32).numpy()


def test_llama3_rope_scaling_writes_rope_freqs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    folder = tmp_path / "m"
    folder.mkdir()
    rp = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    cfg = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
           "intermediate_size": 512, "rms_norm_eps": 1e-5, "vocab_size": 64, "max_position_embeddings": 131072, "rope_parameters": rp}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.norm.weight": np.ones(256, np.float32)}, folder / "model.safetensors")
    out = tmp_path / "o.gguf"
    export(folder, out, to="gguf")
    r = gguf.GGUFReader(out)
    (rf,) = [t for t in r.tensors if t.name == "rope_freqs.weight"]
    want = _convert_hf_llama3_factors(rp, 128)
    assert rf.tensor_type == T.F32 and np.asarray(rf.data).tobytes() == want.tobytes()
    assert len(set(want.tolist())) > 3  # all three branches of the rule are taken
    assert "llama.rope.scaling.type" not in r.fields
    cfg["rope_parameters"] = dict(rp, rope_type="yarn")
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QFormatError) as e:
        export(folder, tmp_path / "p.gguf", to="gguf")
    assert e.value.code == "EXPORT_UNMAPPABLE" and "yarn" in str(e.value)


# -- key names, model card, file type, older conversions -------------------------------------------------------
def _gguf_py_key(key: str, arch: str) -> bool:
    """Whether ``key`` is one of gguf-py's ``gguf.Keys`` (a templated one formatted for ``arch``,
    ids and template names filled in)."""
    import re

    names: list[str] = []

    def walk(cls: type) -> None:
        for k, v in vars(cls).items():
            if isinstance(v, type):
                walk(v)
            elif isinstance(v, str) and not k.startswith("_"):
                names.append(v)

    walk(gguf.Keys)
    for n in names:
        if "{" not in n:
            if key == n:
                return True
            continue
        pat = re.escape(n).replace(r"\{arch\}", re.escape(arch)).replace(r"\{id\}", r"\d+").replace(r"\{name\}", r"[A-Za-z0-9_]+")
        if "{" not in pat.replace(r"\{", "") and re.fullmatch(pat, key):
            return True
    return False


def _hf_folder(folder: Path, cfg: dict, card: str | None = None, config_extra: dict | None = None) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(cfg, **(config_extra or {}))))
    if card is not None:
        (folder / "README.md").write_text(card, encoding="utf-8")
    qformat.save_file({"model.norm.weight": np.ones(cfg["hidden_size"], np.float32),
                       "model.layers.0.mlp.up_proj.weight": qformat.quantize(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "int", **INT4)},
                      folder / "model.safetensors")
    return folder


CFG = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
       "intermediate_size": 64, "rms_norm_eps": 1e-5, "vocab_size": 300, "max_position_embeddings": 64, "head_dim": 16,
       "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
CARD = """---
name: Tiny Llama Test
license: apache-2.0
base_model: meta-llama/Llama-3.2-1B
tags: [test, tiny]
language: [en]
---
# Ignored Title
"""


def _metadata_oracle(folder: Path, total: int) -> dict:
    """The general.* keys llama.cpp's converter writes for the folder: gguf-py's ``Metadata.load``
    and ``set_gguf_meta_model`` (the folder is named ``m``, which its name heuristics ignore)."""
    m = gguf.Metadata.load(None, folder, None, total)
    w = gguf.GGUFWriter(path=None, arch="llama")
    m.set_gguf_meta_model(w)
    return {k: v.value for k, v in w.kv_data[0].items() if k != gguf.Keys.General.ARCHITECTURE}


def _general(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if k.startswith("general.")
            and k not in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.TYPE, gguf.Keys.General.FILE_TYPE, gguf.Keys.General.QUANTIZATION_VERSION)}


@pytest.mark.parametrize("card,extra,name", [
    (CARD, None, "Tiny Llama Test"),
    (None, {"_name_or_path": "acme/SuperLM-1B-Instruct-v2"}, "SuperLM 1B Instruct v2"),
    ("# My Great Model\n\nText.\n", None, "My Great Model"),
], ids=["front-matter", "name-or-path", "title"])
def test_general_name_from_the_model_card(card: str | None, extra: dict | None, name: str, tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", CFG, card, extra)
    out = tmp_path / "o.gguf"
    export(folder, out, to="gguf")
    got = _general(out)
    assert got[gguf.Keys.General.NAME] == name
    if card is None or card.startswith("---"):  # what gguf-py's Metadata gives, key for key
        total = sum(int(np.prod(t.shape)) for t in gguf.GGUFReader(out).tensors)
        assert got == _metadata_oracle(folder, total)


def test_every_key_written_is_a_gguf_py_key(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", CFG, CARD)
    _bpe_tokenizer(folder)
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}")
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    tc.update(unk_token=SPECIAL[1], pad_token=SPECIAL[1], sep_token=SPECIAL[1])
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    out = tmp_path / "o.gguf"
    export(folder, out, to="gguf", gguf_pre="default")
    keys = [k for k in gguf.GGUFReader(out).fields if not k.startswith("GGUF.")]
    assert len(keys) > 30 and "tokenizer.chat_template.tool_use" in keys and "general.base_model.0.name" in keys
    assert [k for k in keys if not _gguf_py_key(k, "llama")] == []
    assert not _gguf_py_key("tokenizer.ggml.unk_token_id", "llama")  # the helper does refuse what gguf-py lacks


def _gguf_f32_source(tmp_path: Path) -> tuple[Path, Path]:
    """A GGUF file of F32 weights recording general.file_type ALL_F32, and its conversion."""
    rng = np.random.default_rng(8)
    tensors = [("token_embd.weight", rng.standard_normal((16, 64)).astype(np.float32), None),
               ("blk.0.ffn_up.weight", rng.standard_normal((8, 64)).astype(np.float32), None),
               ("blk.0.ffn_down.weight", rng.standard_normal((64, 32)).astype(np.float32), None),
               ("output_norm.weight", rng.standard_normal(64).astype(np.float32), None)]
    src = write_gguf(tmp_path / "src.gguf", tensors, kv=[lambda w: w.add_file_type(int(gguf.LlamaFileType.ALL_F32)),
                                                         lambda w: w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(9000)])])
    mid = tmp_path / "mid.safetensors"
    convert(src, mid)
    return src, mid


def test_gguf_source_file_type_follows_the_written_types(tmp_path: Path) -> None:
    from qformat.container import read_header

    src, mid = _gguf_f32_source(tmp_path)
    same = tmp_path / "same.gguf"
    export(mid, same, to="gguf")
    assert same.read_bytes() == src.read_bytes()  # unchanged types: the same file
    # the same checkpoint with its two block weights quantized (int4 g32: Q4_0)
    values = qformat.load_file(mid)
    meta = {k: v for k, v in read_header(mid).metadata.items() if k.startswith("gguf")}
    tensors = {n: (qformat.quantize(v, "int", **INT4) if n.startswith("blk.") else v) for n, v in values.items()}
    q = tmp_path / "q.safetensors"
    qformat.save_file(tensors, q, metadata=meta)
    out = tmp_path / "q.gguf"
    export(q, out, to="gguf")
    r, before = gguf.GGUFReader(out), gguf.GGUFReader(src)
    assert [t.name for t in r.tensors] == [t.name for t in before.tensors]  # the source's order
    assert {t.name: t.tensor_type.name for t in r.tensors} == {"token_embd.weight": "F32", "blk.0.ffn_up.weight": "Q4_0",
                                                            "blk.0.ffn_down.weight": "Q4_0", "output_norm.weight": "F32"}
    got = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    was = {k: f.contents() for k, f in before.fields.items() if not k.startswith("GGUF.")}
    assert got.pop(gguf.Keys.General.FILE_TYPE) == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    assert got.pop(gguf.Keys.General.QUANTIZATION_VERSION) == gguf.GGML_QUANT_VERSION
    was.pop(gguf.Keys.General.FILE_TYPE)
    assert got == was  # every other key as the source had it


def test_older_conversions_with_kv_tensors_still_export(tmp_path: Path) -> None:
    """Files converted before the metadata members stored large values as U8 tensors
    ``gguf.kv.<key>``: they export to the same GGUF file, those tensors not written as tensors,
    and inspect does not count them as model tensors."""
    from safetensors.numpy import load_file, save_file

    from qformat.container import read_header
    from qformat.inspection import inspect_checkpoint

    src, mid = _gguf_f32_source(tmp_path)
    meta = dict(read_header(mid).metadata)
    obj = json.loads(meta["gguf"])
    arrays = load_file(mid)
    for key, stub in obj["kv"].items():  # the older form: the member's JSON as a U8 tensor, the stub naming it
        if isinstance(stub, dict) and "metadata" in stub:
            arrays[stub["metadata"]] = np.frombuffer(meta.pop(stub["metadata"]).encode("utf-8"), np.uint8).copy()
            obj["kv"][key] = {k: v for k, v in stub.items() if k != "metadata"} | {"tensor": stub["metadata"]}
    meta["gguf"] = json.dumps(obj)
    old = tmp_path / "old.safetensors"
    save_file(arrays, old, metadata=meta)
    assert "gguf.kv.tokenizer.ggml.tokens" in load_file(old)
    out = tmp_path / "old.gguf"
    export(old, out, to="gguf")
    assert out.read_bytes() == src.read_bytes()
    a, b = inspect_checkpoint(old), inspect_checkpoint(mid)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors] and a.totals() == b.totals()
    assert a.gguf["kv_tensors"] == ["gguf.kv.tokenizer.ggml.tokens"] and a.gguf["tokenizer"]["vocab_size"] == 9000


def test_a_broken_model_card_is_refused(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", CFG, "---\nname: [unclosed\n---\n")
    with pytest.raises(QFormatError) as e:
        export(folder, tmp_path / "o.gguf", to="gguf")
    assert e.value.code == "CONVERT_SOURCE_INVALID" and "README.md" in str(e.value) and not (tmp_path / "o.gguf").exists()


# -- the architecture table (issue 42 item 1) -----------------------------------------------------------
def test_architecture_table_names_are_gguf_py_s() -> None:
    """Every name of every entry is what gguf-py's tensor map gives for the architecture, and the
    table is keyed by both the GGUF architecture and config.json's model_type."""
    from qformat.architectures import ARCHITECTURES, by_model_type

    for arch in ARCHITECTURES.values():
        assert gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch.model_arch]] == arch.name
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.model_arch], 3)
        for pattern, _ in arch.tensors:
            for suffix in ("weight", "bias"):
                hf = pattern.replace(r"(\d+)", "2").replace(r"\.", ".").replace("(weight|bias)", suffix)
                if "(" in hf or (suffix == "bias" and not pattern.endswith("(weight|bias)")):
                    continue
                assert arch.gguf_name(hf) == names.get_name(hf, try_suffixes=(".weight", ".bias")), (arch.name, hf)
        for mt in arch.model_types:
            assert by_model_type(mt) is arch
    gemma = ARCHITECTURES["gemma3"]
    assert gemma.shift("model.layers.0.self_attn.q_norm.weight") == 1.0 and gemma.shift("model.layers.0.mlp.up_proj.weight") == 0.0
    assert gemma.permutation("model.layers.0.self_attn.q_proj.weight", 64, {"num_attention_heads": 4}) is None
    llama = ARCHITECTURES["llama"]
    perm = llama.permutation("model.layers.0.self_attn.k_proj.weight", 64, {"num_attention_heads": 4, "num_key_value_heads": 2})
    assert perm is not None and np.array_equal(perm, rotary_permutation(64, 2))


def test_gemma3_folder_without_a_gguf_record_is_refused_for_its_vocabulary(tmp_path: Path) -> None:
    """A Gemma 3 folder that no GGUF conversion made (no recorded vocabulary) and whose tokenizer
    is not byte-level BPE: llama.cpp's Gemma vocabulary is SentencePiece, which this exporter
    writes only from the record; refused by name, nothing written."""
    folder = tmp_path / "m"
    folder.mkdir()
    rng = np.random.default_rng(7)
    qformat.save_file({"model.layers.0.mlp.up_proj.weight": qformat.quantize(rng.standard_normal((4, 64)).astype(np.float32), "int", **INT4),
                       "model.layers.0.input_layernorm.weight": rng.standard_normal(64).astype(np.float32)}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3_text", "num_attention_heads": 4, "num_key_value_heads": 1,
                                                    "hidden_size": 64, "num_hidden_layers": 1, "head_dim": 16, "sliding_window": 512}))
    out = tmp_path / "o.gguf"
    with pytest.raises(QFormatError) as e:
        export(folder, out, to="gguf")
    assert e.value.code == "EXPORT_UNMAPPABLE" and "gemma3" in str(e.value) and "SentencePiece" in str(e.value)
    assert not out.exists()
