"""``qformat quantize`` / ``qformat dequantize`` of whole checkpoints (issue 11 items 1, 2, 6, 8):
selection, recipes (every bad-recipe case), sharding, config.json, determinism, interruption,
stale temporary folders, refusal of quantized sources, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.checkpoint import writer as checkpoint_writer
from qformat.container import read_header, write_file
from qformat.errors import QFormatError
from qformat.recipe import Recipe, default_selected
from qformat.sources import TensorInfo

H, V, I = 64, 96, 128


def _llama(folder: Path, layers: int = 2, shards: int = 1, tied_copy: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in "qkvo":
            t[p + f"self_attn.{n}_proj.weight"] = rng.standard_normal((H, H)).astype(np.float16)
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((I, H)).astype(np.float16)
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((I, H)).astype(np.float16)
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((H, I)).astype(np.float16)
        t[p + "input_layernorm.weight"] = np.ones(H, np.float16)
    t["model.norm.weight"] = np.ones(H, np.float16)
    t["lm_head.weight" if not tied_copy else "cls.decoder.weight"] = rng.standard_normal((V, H)).astype(np.float16)
    t["model.rope.inv_freq"] = np.arange(8, dtype=np.int64)
    folder.mkdir()
    names = list(t)
    if shards == 1:
        write_file(folder / "model.safetensors", t, {"format": "pt"})
    else:
        wm = {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: t[n] for n in names[s::shards]}
            write_file(folder / fn, part, {"format": "pt"})
            wm.update({n: fn for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": H, "tie_word_embeddings": False}))
    (folder / "tokenizer.json").write_text('{"t": 1}')
    return t


def _descs(path: Path) -> dict[str, dict]:
    out = {}
    for f in sorted(path.glob("*.safetensors")) if path.is_dir() else [path]:
        md = read_header(f).metadata or {}
        if "qformat" in md:
            out.update(json.loads(md["qformat"])["tensors"])
    return out


def _no_temp(folder: Path) -> None:
    assert not [n for n in os.listdir(folder) if n.startswith(".qformat-")]


def test_default_selection(tmp_path):
    t = _llama(tmp_path / "src")
    s = qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", scheme="int", bits=4, group_size=32)
    d = _descs(tmp_path / "out")
    want = {n for n in t if "_proj" in n}
    assert set(d) == want
    assert s.quantized_tensors == len(want) and s.kept["tensors"] == len(t) - len(want)
    assert all(x["dtype"] == "float16" and x["scheme"] == "int" for x in d.values())
    assert qformat.check(tmp_path / "out" / "model.safetensors").ok
    got = qformat.load_file(tmp_path / "out" / "model.safetensors")
    np.testing.assert_array_equal(got["lm_head.weight"], t["lm_head.weight"])
    q = qformat.quantize(t["model.layers.0.mlp.up_proj.weight"], "int", bits=4, group_size=32)
    np.testing.assert_array_equal(got["model.layers.0.mlp.up_proj.weight"], q.dequantize())


def test_default_rule_by_name_and_tying():
    f16 = lambda *s: TensorInfo("F16", s)  # noqa: E731
    emb = [(V, H)]
    assert default_selected("a.b.weight", f16(64, 64), emb)
    assert not default_selected("a.b.weight", f16(32, 64), emb)  # < 4096 elements
    assert not default_selected("a.b.bias", f16(64, 64), emb)
    assert not default_selected("a.b.weight", TensorInfo("I8", (64, 64)), emb)
    assert not default_selected("a.b.weight", f16(2, 64, 64), emb)
    for n in ("model.embed_tokens.weight", "transformer.wte.weight", "embeddings.word_embeddings.weight", "lm_head.weight",
              "output.weight", "gpt_neox.embed_out.weight", "x.final_layernorm.weight", "h.0.ln_1.weight", "model.norm.weight"):
        assert not default_selected(n, f16(128, 128), emb), n
    assert not default_selected("cls.decoder.weight", f16(V, H), emb)  # a tied head stored under its own name


def test_tied_head_copy_is_kept(tmp_path):
    _llama(tmp_path / "src", tied_copy=True)
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", scheme="nf4")
    assert "cls.decoder.weight" not in _descs(tmp_path / "out")


RECIPE = """
[[rules]]
glob = "*.mlp.down_proj.weight"
scheme = "int"
bits = 8
group_size = "none"

[[rules]]
regex = 'model\\.layers\\.1\\..*'
keep = true

[default]
scheme = "int"
bits = 4
group_size = 32
"""


def test_recipe_mixed_precision(tmp_path):
    _llama(tmp_path / "src", layers=3)
    r = tmp_path / "r.toml"
    r.write_text(RECIPE)
    s = qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", recipe=r)
    d = _descs(tmp_path / "out")
    assert d["model.layers.0.mlp.down_proj.weight"]["codes"]["element"]["bits"] == 8
    assert d["model.layers.0.mlp.down_proj.weight"]["scale"]["blocks"]["size"] == [1, None]
    assert d["model.layers.2.self_attn.q_proj.weight"]["codes"]["element"]["bits"] == 4
    assert not any(n.startswith("model.layers.1.") and "down" not in n for n in d)
    assert "model.layers.1.mlp.down_proj.weight" in d  # the first matching rule wins
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "qformat" and qc["spec_version"] == "1.2"  # the files record digests (SPEC.md §3.8)
    assert qc["rules"][0] == {"glob": "*.mlp.down_proj.weight", "scheme": "int", "bits": 8, "group_size": "none"}
    assert qc["rules"][1]["keep"] is True and qc["default"]["bits"] == 4
    assert len(s.quantized) == 2


BAD = {
    "syntax": ("[[rules]\nglob = 1", "not valid TOML"),
    "unknown-scheme": ('[[rules]]\nglob = "*"\nscheme = "int5"', "rule 1"),
    "unknown-param": ('[[rules]]\nglob = "*_proj.weight"\nscheme = "int"\nbitz = 4', "rule 1"),
    "bad-value": ('[[rules]]\nglob = "*.weight"\nkeep = true\n[[rules]]\nglob = "*"\nscheme = "int"\nbits = 99', "rule 2"),
    "bad-value-type": ('[[rules]]\nglob = "*_proj.weight"\nscheme = "int"\ngroup_size = "x"', "rule 1"),
    "matches-nothing": ('[[rules]]\nglob = "*.nope"\nkeep = true', "rule 1"),
    "shadowed": ('[[rules]]\nglob = "*"\nkeep = true\n[[rules]]\nglob = "*.weight"\nscheme = "nf4"', "rule 2"),
    "no-pattern": ('[[rules]]\nscheme = "nf4"', "rule 1"),
    "two-patterns": ('[[rules]]\nglob = "*"\nregex = ".*"\nkeep = true', "rule 1"),
    "bad-regex": ('[[rules]]\nregex = "("\nkeep = true', "rule 1"),
    "no-action": ('[[rules]]\nglob = "*"', "rule 1"),
    "keep-and-scheme": ('[[rules]]\nglob = "*"\nkeep = true\nscheme = "nf4"', "rule 1"),
    "keep-false": ('[[rules]]\nglob = "*"\nkeep = false', "rule 1"),
    "keep-with-params": ('[[rules]]\nglob = "*"\nkeep = true\nbits = 4', "rule 1"),
    "non-float-tensor": ('[[rules]]\nglob = "*"\nscheme = "nf4"', "rule 1"),
    "unknown-top-key": ('rulez = []', "unknown top-level"),
    "empty": ("", "no rules"),
    "bad-default": ('[default]\nscheme = "int"\nbits = "four"', "default"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipe(tmp_path, case):
    _llama(tmp_path / "src")
    text, needle = BAD[case]
    r = tmp_path / "r.toml"
    r.write_text(text)
    with pytest.raises(QFormatError) as ei:
        qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", recipe=r)
    assert ei.value.code == "QUANTIZE_RECIPE_INVALID", ei.value
    assert needle in str(ei.value)
    assert not (tmp_path / "out").exists()
    _no_temp(tmp_path)


def test_sharded_source_keeps_its_sharding(tmp_path):
    t = _llama(tmp_path / "src", shards=2)
    qformat.quantize_checkpoint(tmp_path / "src" / "model.safetensors.index.json", tmp_path / "out", scheme="mxfp4")
    files = sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    idx = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    wm = idx["weight_map"]
    assert wm["model.layers.0.mlp.up_proj.weight"] == wm["model.layers.0.mlp.up_proj.weight.codes"]
    assert set(t) <= set(wm)
    assert idx["metadata"]["total_size"] == sum(e.nbytes for f in files for e in read_header(tmp_path / "out" / f).entries.values())
    assert qformat.check(tmp_path / "out" / "model.safetensors.index.json").ok
    assert (tmp_path / "out" / "tokenizer.json").read_text() == '{"t": 1}'
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == {"model_type": "llama", "hidden_size": H, "tie_word_embeddings": False}


def test_max_shard_size(tmp_path):
    _llama(tmp_path / "src", layers=4)
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", scheme="int", bits=8, max_shard_size="40KB")
    files = sorted((tmp_path / "out").glob("*.safetensors"))
    assert len(files) > 2 and files[0].name.endswith(f"-of-{len(files):05d}.safetensors")
    for f in files[1:-1]:
        assert f.stat().st_size < 40_000 + 8192
    assert qformat.check(tmp_path / "out" / "model.safetensors.index.json").ok
    d = qformat.dequantize_checkpoint(tmp_path / "out", tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back").glob("*.safetensors")) == [f.name for f in files]
    assert d.dequantized == 28


def test_deterministic_bytes(tmp_path, monkeypatch):
    _llama(tmp_path / "src")
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "a", scheme="int", bits=4, group_size=32)
    from qformat import decode
    from qformat.schemes import int_

    monkeypatch.setattr(int_, "CHUNK_ELEMENTS", 1000)  # other chunking
    monkeypatch.setattr(decode, "THREADS", 1)
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "b", scheme="int", bits=4, group_size=32)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


def test_interrupt_leaves_nothing(tmp_path, monkeypatch):
    _llama(tmp_path / "src")
    import qformat.schemes as schemes

    real, calls = schemes.quantize, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(schemes, "quantize", flaky)
    with pytest.raises(KeyboardInterrupt):
        qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", scheme="nf4")
    assert not (tmp_path / "out").exists()
    _no_temp(tmp_path)


def test_stale_temporary_folder_is_cleaned(tmp_path):
    _llama(tmp_path / "src")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / (checkpoint_writer.TEMP_PREFIX + "killed")
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    import socket

    (stale / checkpoint_writer.MARKER).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "destination": "x"}))
    live = tmp_path / (checkpoint_writer.TEMP_PREFIX + "running")
    live.mkdir()
    (live / checkpoint_writer.MARKER).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    notes: list[str] = []
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "out", scheme="nf4", notice=notes.append)
    assert not stale.exists() and live.exists()
    assert len(notes) == 1 and "killed" in notes[0]
    assert not (tmp_path / "out" / checkpoint_writer.MARKER).exists()


def test_quantized_sources_are_refused(tmp_path):
    _llama(tmp_path / "src")
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "q", scheme="nf4")
    for src in (tmp_path / "q", tmp_path / "q" / "model.safetensors"):
        with pytest.raises(QFormatError) as ei:
            qformat.quantize_checkpoint(src, tmp_path / "again", scheme="nf4")
        assert ei.value.code == "QUANTIZE_SOURCE_QUANTIZED" and "qformat convert" in str(ei.value)
    cfg = tmp_path / "src" / "config.json"
    cfg.write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 4}}))
    with pytest.raises(QFormatError) as ei:
        qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "again", scheme="nf4")
    assert ei.value.code == "QUANTIZE_SOURCE_QUANTIZED"


def test_single_file_in_single_file_out(tmp_path):
    _llama(tmp_path / "src")
    qformat.quantize_checkpoint(tmp_path / "src" / "model.safetensors", tmp_path / "q.safetensors", scheme="fp8_e4m3", dtype="bfloat16")
    d = _descs(tmp_path / "q.safetensors")
    assert d and all(x["dtype"] == "bfloat16" for x in d.values())
    qformat.dequantize_checkpoint(tmp_path / "q.safetensors", tmp_path / "p.safetensors", dtype="float32")
    h = read_header(tmp_path / "p.safetensors")
    # no logical tensor left; the qformat object carries only the digests of every stored tensor
    obj = json.loads(h.metadata["qformat"])
    assert obj["tensors"] == {} and sorted(obj["digests"]["tensors"]) == sorted(h.entries)
    assert h.entries["model.layers.0.mlp.up_proj.weight"].dtype == "F32"
    assert h.entries["model.norm.weight"].dtype == "F16"  # plain tensors are copied as they are


def test_dequantize_roundtrip(tmp_path):
    _llama(tmp_path / "src", shards=2)
    qformat.quantize_checkpoint(tmp_path / "src", tmp_path / "q", scheme="int", bits=4, group_size=32)
    s = qformat.dequantize_checkpoint(tmp_path / "q", tmp_path / "p")
    want = qformat.load_checkpoint(tmp_path / "q" / "model.safetensors.index.json")
    got = qformat.load_checkpoint(tmp_path / "p" / "model.safetensors.index.json")
    assert set(got) == set(want)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
    assert s.dequantized == 14 and not _descs(tmp_path / "p")
    assert "quantization_config" not in json.loads((tmp_path / "p" / "config.json").read_text())
    wm = json.loads((tmp_path / "p" / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any(n.endswith(".codes") for n in wm)


def test_dequantize_in_place_converted_source(tmp_path):
    """A file qformat convert described in place (descriptors over the source's own names)."""
    from tests.convert.test_pipeline_memory import _qformat_source

    _qformat_source(tmp_path / "src", 1, 1, 1)
    qformat.convert.convert(tmp_path / "src", tmp_path / "conv")
    qformat.dequantize_checkpoint(tmp_path / "conv", tmp_path / "p")
    want = qformat.load_checkpoint(tmp_path / "conv" / "model.safetensors.index.json")
    got = qformat.load_checkpoint(tmp_path / "p" / "model.safetensors.index.json")
    assert set(got) == set(want) and all(got[n].tobytes() == want[n].tobytes() for n in want)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True)


def test_cli(tmp_path):
    _llama(tmp_path / "src")
    r = _cli("quantize", str(tmp_path / "src"), str(tmp_path / "out"), "--scheme", "int", "--bits", "8", "--group-size", "none", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["quantized_tensors"] == 14 and s["quantized"]["int bits=8 group_size=none"]["tensors"] == 14
    r = _cli("quantize", str(tmp_path / "src"), str(tmp_path / "out"), "--scheme", "int")
    assert r.returncode == 2 and "QUANTIZE_DESTINATION_INVALID" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "bad.toml").write_text('[[rules]]\nglob = "nothing"\nkeep = true\n')
    r = _cli("quantize", str(tmp_path / "src"), str(tmp_path / "o2"), "--recipe", str(tmp_path / "bad.toml"))
    assert r.returncode == 2 and "QUANTIZE_RECIPE_INVALID" in r.stderr and "rule 1" in r.stderr and "Traceback" not in r.stderr
    r = _cli("quantize", str(tmp_path / "out"), str(tmp_path / "o3"), "--scheme", "nf4")
    assert r.returncode == 2 and "QUANTIZE_SOURCE_QUANTIZED" in r.stderr
    r = _cli("quantize", str(tmp_path / "src"), str(tmp_path / "o4"))
    assert r.returncode == 2 and "--scheme, --recipe or --preset" in r.stderr
    r = _cli("dequantize", str(tmp_path / "out"), str(tmp_path / "deq"))
    assert r.returncode == 0 and "dequantized 14 tensors" in r.stdout
    assert _cli("check", str(tmp_path / "deq" / "model.safetensors")).returncode == 0


def test_recipe_from_dict_matches_toml():
    import tomllib

    assert Recipe.from_dict(tomllib.loads(RECIPE)).to_dict() == Recipe.from_toml(RECIPE).to_dict()
