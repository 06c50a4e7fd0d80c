"""GGUF export's tokenizer keys, against llama.cpp's own files and gguf-py / transformers as oracles.

- ``qformat/tables/llama_cpp_pre.json`` is what ``scripts/gen_llama_cpp_pre.py`` reads from the
  llama-cpp-python sdist it names (``tests/llama_cpp_source.py`` fetches it).
- Real tokenizers: llama.cpp ships ``models/ggml-vocab-*.gguf`` (tokenizers without weights);
  transformers turns a few into Hugging Face folders (``AutoTokenizer.from_pretrained(models,
  gguf_file=...)`` then ``save_pretrained``; cached, it takes minutes).  For each, qformat's token
  ids of llama.cpp's ``chktxt`` (the ``tokenizers`` library on ``tokenizer.json``) equal
  ``AutoTokenizer``'s, which llama.cpp's converter hashes, and the fingerprint names the
  pre-tokenizer the vocab file itself records.  An export of a model with such a tokenizer carries
  the vocab file's tokens, merges and pre-tokenizer.
- Special token ids, ``add_*_token`` flags and chat templates: gguf-py's ``SpecialVocab`` (what
  llama.cpp's converter uses) on the same folder, over real and constructed tokenizer folders;
  the chat template keys: gguf-py's ``GGUFWriter.add_chat_template``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest

import qformat
from qformat.errors import QFormatError
from qformat.export import export
from qformat.export import gguf_tokenizer as gt

from .. import llama_cpp_source as lcs
from .test_gguf import SPECIAL, _bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]
#: Vocab files whose transformers conversion is the tokenizer llama.cpp's table knows, with the
#: name the vocab file records.  (transformers converts deepseek-*, falcon and aquila with a
#: generic pre-tokenizer, so their fingerprints are not those of the original tokenizers.)
KNOWN = {"gpt-2": "gpt-2", "qwen2": "qwen2", "starcoder": "starcoder", "llama-bpe": "llama-bpe"}
LLAMA3_BOS = "<|begin_of_text|>"


def _autotokenizer(folder: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(folder)


def hf_vocab(name: str) -> Path:
    """The Hugging Face folder transformers makes of ``models/ggml-vocab-<name>.gguf`` (cached
    under the qformat cache, per sdist and transformers version)."""
    transformers = pytest.importorskip("transformers")
    src = lcs.require(f"models/ggml-vocab-{name}.gguf") / "models"
    root = lcs.cache_root() / "hf-vocab" / f"llama_cpp_python-{lcs.VERSION}-transformers-{transformers.__version__}"
    folder = root / name
    with lcs.locked(root / f"{name}.lock"):
        if not (folder / "tokenizer.json").is_file():
            tmp = root / f".{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            transformers.AutoTokenizer.from_pretrained(src, gguf_file=f"ggml-vocab-{name}.gguf").save_pretrained(tmp)
            os.replace(tmp, folder)
    return folder


def _copy(name: str, tmp_path: Path) -> Path:
    """A private copy of a converted vocab folder; llama-bpe gets Llama 3's BOS template back
    (Meta's tokenizer.json adds <|begin_of_text|>; the vocab file leaves that to llama.cpp's
    defaults, so transformers' conversion has none)."""
    folder = tmp_path / name
    shutil.copytree(hf_vocab(name), folder)
    if name == "llama-bpe":
        tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
        bos = next(a["id"] for a in tj["added_tokens"] if a["content"] == LLAMA3_BOS)
        tj["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": LLAMA3_BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [{"SpecialToken": {"id": LLAMA3_BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                         {"SpecialToken": {"id": LLAMA3_BOS, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                                "special_tokens": {LLAMA3_BOS: {"id": LLAMA3_BOS, "ids": [bos], "tokens": [LLAMA3_BOS]}}}
        (folder / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    return folder


def _vocab_kv(name: str) -> dict[str, Any]:
    """The key/values of llama.cpp's vocab file (qformat's GGUF reader: gguf-py's takes minutes here)."""
    from qformat.convert.gguf_file import GGUFFile

    f = GGUFFile(str(lcs.require(f"models/ggml-vocab-{name}.gguf") / "models" / f"ggml-vocab-{name}.gguf"))
    return {k: v.value for k, v in f.kv.items()}


def _config(folder: Path) -> dict[str, Any] | None:
    p = folder / "tokenizer_config.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


# -- the table -------------------------------------------------------------------------------------------
def test_table_is_generated_from_the_sdist() -> None:
    src = lcs.require("conversion/base.py", "src/llama-vocab.cpp")
    spec = importlib.util.spec_from_file_location("gen_llama_cpp_pre", ROOT / "scripts" / "gen_llama_cpp_pre.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.render(gen.build(src, lcs.VERSION, lcs.SDIST_SHA256))
    assert (ROOT / "qformat" / "tables" / "llama_cpp_pre.json").read_text(encoding="utf-8") == text
    table = gt.pre_table()
    assert table["source"]["version"] == lcs.VERSION and {"llama-bpe", "qwen2", "gpt-2", "default"} <= table["loader_names"]
    # the chktxt of the table is the converter's own (read here independently of the generator)
    import ast

    fn = next(n for n in ast.walk(ast.parse((src / "conversion" / "base.py").read_text(encoding="utf-8")))
              if isinstance(n, ast.FunctionDef) and n.name == "get_vocab_base_pre")
    chktxt = next(ast.literal_eval(s.value) for s in fn.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "chktxt")
    assert table["chktxt"] == chktxt


def test_fingerprint_is_llama_cpp_s_chkhsh() -> None:
    """sha256 of Python's repr of the id list, as ``get_vocab_base_pre`` hashes it."""
    import hashlib

    assert gt.fingerprint([1, 22, 333]) == hashlib.sha256(b"[1, 22, 333]").hexdigest()


# -- real tokenizers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_real_tokenizer_fingerprint_names_its_pre(name: str, tmp_path: Path) -> None:
    folder = _copy(name, tmp_path)
    tc = _config(folder)
    ids = gt.chktxt_ids(folder / "tokenizer.json", tc)
    assert ids == _autotokenizer(folder).encode(gt.pre_table()["chktxt"])  # what llama.cpp's converter hashes
    assert gt.choose_pre(str(folder / "tokenizer.json"), tc, None) == KNOWN[name] == _vocab_kv(name)["tokenizer.ggml.pre"]


def test_gpt_neox_class_adds_no_special_tokens(tmp_path: Path) -> None:
    """transformers' GPTNeoXTokenizer rebuilds the post-processor without the template of
    tokenizer.json: qformat's ids follow AutoTokenizer, not the template."""
    folder = _copy("gpt-2", tmp_path)
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    eot = "<|endoftext|>"
    single = [{"SpecialToken": {"id": eot, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    tj["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": single + [{"Sequence": {"id": "B", "type_id": 1}}],
                            "special_tokens": {eot: {"id": eot, "ids": [50256], "tokens": [eot]}}}
    (folder / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    tc = dict(_config(folder) or {}, tokenizer_class="GPTNeoXTokenizer", add_bos_token=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")
    ids = gt.chktxt_ids(folder / "tokenizer.json", tc)
    auto = _autotokenizer(folder)
    assert type(auto).__name__ == "GPTNeoXTokenizer" and ids == auto.encode(gt.pre_table()["chktxt"])
    with_template = gt.chktxt_ids(folder / "tokenizer.json", dict(tc, tokenizer_class="PreTrainedTokenizerFast"))
    assert with_template == [50256] + ids  # the template would have added the token


@pytest.mark.parametrize("name,model_type", [("gpt-2", "llama"), ("qwen2", "qwen2")])
def test_export_carries_the_real_tokenizer(name: str, model_type: str, tmp_path: Path) -> None:
    """A tiny model with a real tokenizer: the exported file has llama.cpp's pre-tokenizer for it
    (no option needed) and every ``tokenizer.*`` key of llama.cpp's own vocab file, the same:
    tokens, token types, merges, special token ids and chat template."""
    folder = _copy(name, tmp_path)
    want = _vocab_kv(name)
    n = len(want["tokenizer.ggml.tokens"])
    cfg = {"model_type": model_type, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
           "intermediate_size": 64, "rms_norm_eps": 1e-6, "vocab_size": n, "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    qformat.save_file({"model.embed_tokens.weight": rng.standard_normal((n, 32)).astype(np.float16),
                       "model.norm.weight": np.ones(32, np.float32)}, folder / "model.safetensors")
    out = tmp_path / "m.gguf"
    export(folder, out, to="gguf")
    from qformat.convert.gguf_file import GGUFFile

    got = {k: v.value for k, v in GGUFFile(str(out)).kv.items()}
    T = gguf.Keys.Tokenizer
    assert got[T.PRE] == want[T.PRE] == KNOWN[name] and got[T.MODEL] == "gpt2"
    assert got[T.LIST] == want[T.LIST] and got[T.TOKEN_TYPE] == want[T.TOKEN_TYPE] and got[T.MERGES] == want[T.MERGES]
    assert {k: v for k, v in got.items() if k.startswith("tokenizer.")} == {k: v for k, v in want.items() if k.startswith("tokenizer.")}


# -- special tokens: gguf-py's SpecialVocab as the oracle -------------------------------------------------------
def _small(folder: Path, tc: dict[str, Any] | None = None, post: Any = "keep", config: dict[str, Any] | None = None,
           files: dict[str, str] | None = None) -> Path:
    """The small trained BPE tokenizer of test_gguf with a chosen tokenizer_config.json (None:
    none), post-processor, config.json and extra files."""
    pytest.importorskip("tokenizers")
    folder.mkdir()
    _bpe_tokenizer(folder)
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    if post != "keep":
        tj["post_processor"] = post
    base = 1 + max([*tj["model"]["vocab"].values(), *(a["id"] for a in tj["added_tokens"])])
    tj["added_tokens"] += [{"id": base + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                           for i, c in enumerate(EXTRA)]
    ids = {a["content"]: a["id"] for a in tj["added_tokens"]}
    pp = tj.get("post_processor") or {}
    for proc in pp.get("processors", [pp]):  # a template names its special tokens' ids (tokenizers checks)
        if proc.get("type") == "TemplateProcessing":
            used = {p["SpecialToken"]["id"] for p in proc["single"] + proc["pair"] if "SpecialToken" in p}
            proc["special_tokens"] = {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in sorted(used)}
    (folder / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    if tc is None:
        (folder / "tokenizer_config.json").unlink()
    else:
        (folder / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text, encoding="utf-8")
    return folder


def _ids(folder: Path) -> dict[str, int]:
    """Token text -> id of the added tokens of a tokenizer folder."""
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return {a["content"]: a["id"] for a in tj["added_tokens"]}


def _n(folder: Path) -> int:
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return 1 + max([*tj["model"]["vocab"].values(), *(a["id"] for a in tj["added_tokens"])])


def _tp(single: list[str], pair: list[str]) -> dict[str, Any]:
    def items(spec: list[str]) -> list[dict[str, Any]]:
        return [{"Sequence": {"id": s, "type_id": 0 if s == "A" else 1}} if s in ("A", "B") else {"SpecialToken": {"id": s, "type_id": 0}} for s in spec]

    return {"type": "TemplateProcessing", "single": items(single), "pair": items(pair), "special_tokens": {}}


BOS, EOS = SPECIAL
EXTRA = ["<sep>", "<pad>", "<unk>", "<|eot|>"]  # special tokens added after the small tokenizer's own
BASE_TC = {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
VARIANTS: dict[str, Callable[[Path], Path]] = {
    "bos-template": lambda p: _small(p, BASE_TC),
    "no-tokenizer-config": lambda p: _small(p, None, config={"bos_token_id": 0, "pad_token_id": 3}),
    "config-ids-and-text-config": lambda p: _small(p, dict(BASE_TC, unk_token="<unk>"), config={"pad_token_id": 3, "text_config": {"sep_token_id": 2}}),
    "flags-in-config": lambda p: _small(p, dict(BASE_TC, add_bos_token=False, add_eos_token=True, pad_token={"content": "<pad>", "special": True})),
    "roberta": lambda p: _small(p, {"bos_token": BOS, "eos_token": EOS}, post={"type": "RobertaProcessing", "sep": ["<sep>", 0], "cls": [BOS, 1],
                                                                              "trim_offsets": True, "add_prefix_space": False}),
    "eos-template-eot": lambda p: _small(p, BASE_TC, post=_tp([BOS, "A", "<|eot|>"], [BOS, "A", "<|eot|>", BOS, "B", "<|eot|>"])),
    "pair-separator": lambda p: _small(p, dict(BASE_TC, sep_token="<sep>"), post=_tp([BOS, "A"], [BOS, "A", "<sep>", "B"])),
    "cls-as-bos": lambda p: _small(p, {"cls_token": BOS, "sep_token": "<sep>"}, post=_tp([BOS, "A"], [BOS, "A", "<sep>", "B"])),
    "sequence-of-processors": lambda p: _small(p, BASE_TC, post={"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}, _tp([BOS, "A"], [BOS, "A", BOS, "B"])]}),
    "chat-template-jinja": lambda p: _small(p, BASE_TC, files={"chat_template.jinja": "{{ bos_token }}{{ messages }}"}),
    "additional-chat-templates": lambda p: _small(p, BASE_TC, files={"chat_template.jinja": "{{ messages }}",
                                                                    "additional_chat_templates/tool_use.jinja": "{{ tools }}",
                                                                    "additional_chat_templates/rag.jinja": "{{ documents }}"}),
    "chat-template-json": lambda p: _small(p, BASE_TC, files={"chat_template.json": json.dumps({"chat_template": "{{ legacy }}"})}),
    "config-template-wins": lambda p: _small(p, dict(BASE_TC, chat_template="{{ config }}"), files={"chat_template.jinja": "{{ jinja }}"}),
    "config-template-list": lambda p: _small(p, dict(BASE_TC, chat_template=[{"name": "default", "template": "{{ a }}"},
                                                                              {"name": "tool use", "template": "{{ b }}"}])),
}


def _templates(t: Any) -> Any:
    """Named templates by name (gguf-py lists additional_chat_templates/ in directory order)."""
    return {c["name"]: c["template"] for c in t} if isinstance(t, list) else t


def _oracle(folder: Path, n: int) -> Any:
    return gguf.SpecialVocab(folder, load_merges=True, n_vocab=n)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_special_vocab_is_gguf_py_s(variant: str, tmp_path: Path) -> None:
    folder = VARIANTS[variant](tmp_path / "tok")
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else None
    n = _n(folder)
    got = gt.special_vocab(str(folder), tj, _config(folder), config, n)
    sv = _oracle(folder, n)
    assert got["ids"] == sv.special_token_ids
    assert got["add"] == sv.add_special_token
    assert _templates(got["chat_template"]) == _templates(sv.chat_template)
    assert gt.merge_strings(tj["model"]["merges"]) == sv.merges


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_special_vocab_of_real_tokenizers(name: str, tmp_path: Path) -> None:
    folder = _copy(name, tmp_path)
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    n = len(_vocab_kv(name)["tokenizer.ggml.tokens"])
    got = gt.special_vocab(str(folder), tj, _config(folder), None, n)
    sv = _oracle(folder, n)
    assert (got["ids"], got["add"], _templates(got["chat_template"])) == (sv.special_token_ids, sv.add_special_token, _templates(sv.chat_template))


@pytest.mark.parametrize("variant", [v for v in sorted(VARIANTS) if "chat-template" in v or "config-template" in v])
def test_chat_template_keys_are_gguf_writer_s(variant: str, tmp_path: Path) -> None:
    folder = VARIANTS[variant](tmp_path / "tok")
    template = _oracle(folder, _n(folder)).chat_template
    assert template is not None
    w = gguf.GGUFWriter(path=None, arch="llama")
    w.add_chat_template(template)
    want = {k: v.value for k, v in w.kv_data[0].items() if k != gguf.Keys.General.ARCHITECTURE}
    got = {k: v["value"] for k, v in gt.chat_template_kvs(template)}
    key = gguf.Keys.Tokenizer.CHAT_TEMPLATES
    if key in want:  # gguf-py lists the names in set order
        assert sorted(got.pop(key)) == sorted(want.pop(key))
    assert got == want


def test_export_writes_the_special_keys_llama_cpp_reads(tmp_path: Path) -> None:
    """The id keys are gguf-py's (``unknown_token_id``, ``padding_token_id``,
    ``seperator_token_id``), and the chat templates of a transformers 5 folder travel."""
    folder = VARIANTS["additional-chat-templates"](tmp_path / "m")
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc.update(unk_token="<unk>", pad_token="<pad>", sep_token="<sep>")
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    n = _n(folder)
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": n}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.embed_tokens.weight": np.zeros((n, 32), np.float16)}, folder / "model.safetensors")
    out = tmp_path / "m.gguf"
    export(folder, out, to="gguf", gguf_pre="default")
    r = gguf.GGUFReader(out)
    kv = {k: f.contents() for k, f in r.fields.items()}
    T = gguf.Keys.Tokenizer
    ids = _ids(folder)
    assert (kv[T.UNK_ID], kv[T.PAD_ID], kv[T.SEP_ID]) == (ids["<unk>"], ids["<pad>"], ids["<sep>"]) and kv[T.PRE] == "default"
    assert not any(k in kv for k in ("tokenizer.ggml.unk_token_id", "tokenizer.ggml.pad_token_id"))
    assert kv[T.CHAT_TEMPLATE] == "{{ messages }}" and kv[T.CHAT_TEMPLATE_N.format(name="rag")] == "{{ documents }}"
    assert sorted(kv[T.CHAT_TEMPLATES]) == ["rag", "tool_use"]


def test_unknown_fingerprint_and_bad_names_are_refused(tmp_path: Path) -> None:
    folder = VARIANTS["bos-template"](tmp_path / "m")
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": _n(folder)}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.norm.weight": np.ones(32, np.float32)}, folder / "model.safetensors")
    fp = gt.fingerprint(gt.chktxt_ids(folder / "tokenizer.json", _config(folder)))
    assert fp not in gt.pre_table()["by_hash"]
    out = tmp_path / "o.gguf"
    with pytest.raises(QFormatError) as e:
        export(folder, out, to="gguf")
    assert e.value.code == "EXPORT_TOKENIZER_UNKNOWN" and fp in str(e.value)
    with pytest.raises(QFormatError) as e:
        export(folder, out, to="gguf", gguf_pre="no-such-pre")
    assert e.value.code == "EXPORT_OPTION_INVALID" and "llama-bpe" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["m"]
    plain = tmp_path / "plain"
    plain.mkdir()
    qformat.save_file({"w": np.ones((2, 32), np.float32)}, plain / "model.safetensors")
    with pytest.raises(QFormatError) as e:
        export(plain, tmp_path / "p.gguf", to="gguf", gguf_pre="gpt-2")
    assert e.value.code == "EXPORT_OPTION_INVALID" and not (tmp_path / "p.gguf").exists()


def test_cli_gguf_pre(tmp_path: Path) -> None:
    import subprocess

    folder = VARIANTS["bos-template"](tmp_path / "m")
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": _n(folder)}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.norm.weight": np.ones(32, np.float32)}, folder / "model.safetensors")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([sys.executable, "-m", "qformat", "export", *args], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert "Traceback" not in p.stdout + p.stderr
        return p

    p = cli(str(folder), str(tmp_path / "o.gguf"), "--to", "gguf")
    assert p.returncode == 2 and "EXPORT_TOKENIZER_UNKNOWN" in p.stderr and not (tmp_path / "o.gguf").exists()
    p = cli(str(folder), str(tmp_path / "o"), "--to", "mlx", "--gguf-pre", "gpt-2")
    assert p.returncode == 2 and "--to gguf" in p.stderr
    p = cli(str(folder), str(tmp_path / "o.gguf"), "--to", "gguf", "--gguf-pre", "gpt-2", "--quiet")
    assert p.returncode == 0, p.stderr
    assert gguf.GGUFReader(tmp_path / "o.gguf").fields[gguf.Keys.Tokenizer.PRE].contents() == "gpt-2"


def test_without_the_tokenizers_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fingerprint needs the tokenizers package: without it the export says so (and
    --gguf-pre still works, since then no fingerprint is needed)."""
    folder = VARIANTS["bos-template"](tmp_path / "m")
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": _n(folder)}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.norm.weight": np.ones(32, np.float32)}, folder / "model.safetensors")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(QFormatError) as e:
        export(folder, tmp_path / "o.gguf", to="gguf")
    assert e.value.code == "DEPENDENCY_MISSING" and "tokenizers" in str(e.value) and not (tmp_path / "o.gguf").exists()
    export(folder, tmp_path / "o.gguf", to="gguf", gguf_pre="gpt-2")
    assert gguf.GGUFReader(tmp_path / "o.gguf").fields[gguf.Keys.Tokenizer.PRE].contents() == "gpt-2"


# -- the path policy (qformat.paths, issue 40): side files that link out of the folder ----------------
@pytest.mark.parametrize("name", ["chat_template.jinja", "additional_chat_templates/tool_use.jinja", "chat_template.json",
                                  "additional_chat_templates"])
def test_a_chat_template_linking_out_of_the_folder_is_refused(name: str, tmp_path: Path) -> None:
    """A chat template is read into the GGUF's keys: one that is a link to a file outside the
    model folder (or lies in a linked folder outside it) is CONVERT_SOURCE_INVALID, naming it,
    and nothing is written (it was read and carried into the GGUF)."""
    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    secret = "{{ SECRET_FROM_OUTSIDE }}"
    (outside / "secret.jinja").write_text(secret)
    (outside / "deeper" / "tool_use.jinja").write_text(secret)
    (outside / "secret.json").write_text(json.dumps({"chat_template": secret}))
    # additional_chat_templates/ is read beside a chat_template.jinja only
    files = {"chat_template.jinja": "{{ messages }}"} if name.startswith("additional_chat_templates") else {}
    folder = _small(tmp_path / "m", BASE_TC, files=files)
    link = folder / name
    link.parent.mkdir(parents=True, exist_ok=True)
    target = {"chat_template.json": outside / "secret.json", "additional_chat_templates": outside / "deeper"}.get(name, outside / "secret.jinja")
    os.symlink(target, link)
    n = _n(folder)
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": n}
    (folder / "config.json").write_text(json.dumps(cfg))
    qformat.save_file({"model.embed_tokens.weight": np.zeros((n, 32), np.float16)}, folder / "model.safetensors")
    out = tmp_path / "m.gguf"
    with pytest.raises(QFormatError) as e:
        export(folder, out, to="gguf", gguf_pre="default")
    assert e.value.code == "CONVERT_SOURCE_INVALID" and "outside the folder" in e.value.message, e.value
    assert name.split("/")[0] in e.value.message or "tool_use.jinja" in e.value.message, e.value
    assert sorted(os.listdir(tmp_path)) == ["m", "outside"]


def test_a_chat_template_of_a_hub_snapshot_is_read_through_its_blob(tmp_path: Path) -> None:
    """huggingface_hub's snapshot links into its own blobs/ are the layout's, and are followed."""
    folder = _small(tmp_path / "m", BASE_TC)
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "b1").write_text("{{ from_the_blob }}")
    snap = repo / "snapshots" / "rev"
    shutil.copytree(folder, snap)
    os.symlink("../../blobs/b1", snap / "chat_template.jinja")
    sv = gt.special_vocab(str(snap), json.loads((snap / "tokenizer.json").read_text()), BASE_TC, None, _n(snap))
    assert sv["chat_template"] == "{{ from_the_blob }}"
