"""Folders are carried whole (issue 22, item 3): every command that writes a model folder
(quantize, dequantize, convert in place and ``--repack``, export to the safetensors targets)
copies the source folder's whole side tree, subfolders included, with relative paths kept
(:func:`qformat.checkpoint.output.side_files`, one implementation for all of them).

Left out: the checkpoint's own top-level weights and index (rewritten), the same weights in
other frameworks' formats (``pytorch_model.bin``), qformat's temporaries, hidden folders
(``.git``, huggingface_hub's ``.cache``) and a destination inside the source.  Copied as they
are: ``*.safetensors`` files inside subfolders (a module's own weights).  Links: a link to a
file inside the folder, or into the ``blobs/`` of the huggingface_hub cache repository the
folder is a snapshot of, is copied as that file's contents; any other link is refused before
anything is written.  Every written file and folder gets ordinary permissions under the umask.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import qformat
from qformat.checkpoint.output import is_weight_file, side_files
from qformat.container import write_file
from qformat.convert import convert
from qformat.errors import QFormatError
from qformat.export import export, get

#: The side tree every source folder gets: relative path -> content.  All of it is carried.
TREE = {
    "tokenizer.json": '{"model": "wordpiece"}',
    "tokenizer_config.json": '{"do_lower_case": true}',
    "chat_template.jinja": "{{ messages }}",
    "README.md": "# a model card\n",
    "modules.json": '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]',
    "config_sentence_transformers.json": '{"similarity_fn_name": "cosine"}',
    ".gitattributes": "*.safetensors filter=lfs\n",
    "1_Pooling/config.json": '{"word_embedding_dimension": 256, "pooling_mode_mean_tokens": true}',
    "2_Dense/config.json": '{"in_features": 256, "out_features": 8}',
    "deep/er/still/notes.txt": "three levels down\n",
}
#: Never carried: other frameworks' copies of the weights, a repository's history, a download's
#: bookkeeping, qformat's own temporaries.
LEFT_OUT = {
    "pytorch_model.bin": "stale unquantized weights",
    "tf_model.h5": "stale unquantized weights",
    ".git/HEAD": "ref: refs/heads/main\n",
    ".cache/huggingface/download/model.safetensors.metadata": "etag\n",
    ".qformat-3f2a.tmp": "a half-written file",
    ".qformat-convert-x/model.safetensors": "a half-written folder",
}


def _write_tree(src: Path) -> None:
    for name, text in {**TREE, **LEFT_OUT}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    # a sentence-transformers Dense module's own weights: copied byte for byte, never rewritten
    write_file(src / "2_Dense" / "model.safetensors", {"linear.weight": np.arange(2048, dtype=np.float32).reshape(8, 256)}, {"format": "pt"})
    os.symlink("tokenizer.json", src / "vocab_alias.json")  # a link inside the folder: copied as a file


def _plain(tmp: Path) -> Path:
    """A plain model folder: two fp16 Linear weights, a norm, config.json and the side tree."""
    rng = np.random.default_rng(0)
    src = tmp / "plain"
    src.mkdir()
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": rng.standard_normal((64, 256)).astype(np.float16) for i in range(2)}
    tensors["model.norm.weight"] = np.ones(256, np.float16)
    write_file(src / "model.safetensors", tensors, {"format": "pt"})
    (src / "config.json").write_text(json.dumps({"model_type": "test", "torch_dtype": "float16"}))
    _write_tree(src)
    return src


def _quantized(tmp: Path, scheme: str = "int", params: dict | None = None) -> Path:
    """The same model folder quantized by ``qformat quantize`` (its side tree carried)."""
    src = tmp / "quantized-src"
    qformat.quantize_checkpoint(_plain(tmp), src, scheme=scheme, **(params or {"bits": 4, "group_size": 32}))
    return src


def _export(target: str) -> tuple[Callable[[Path], Path], Callable[[Path, Path], object]]:
    scheme, params = get(target).exact_schemes[0]
    return (lambda tmp: _quantized(tmp, scheme, params)), (lambda src, dst: export(src, dst, to=target))


#: command -> (make its kind of source under tmp, run the command from that source to dst)
COMMANDS: dict[str, tuple[Callable[[Path], Path], Callable[[Path, Path], object]]] = {
    "quantize": (_plain, lambda src, dst: qformat.quantize_checkpoint(src, dst, scheme="int", bits=4, group_size=32)),
    "dequantize": (_quantized, lambda src, dst: qformat.dequantize_checkpoint(src, dst)),
    "convert": (_quantized, lambda src, dst: convert(src, dst)),
    "convert-repack": (_quantized, lambda src, dst: convert(src, dst, repack=True)),
    "export-compressed-tensors": _export("compressed-tensors"),
    "export-mlx": _export("mlx"),
    "export-bitsandbytes": _export("bitsandbytes"),
}


def _files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if not p.is_dir()}


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o027)  # not the usual 022: the modes below must follow whatever it is
    yield 0o027
    os.umask(old)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_whole_tree_is_carried(command, tmp_path, umask):
    make, run = COMMANDS[command]
    dst = tmp_path / "out"
    run(make(tmp_path), dst)
    files = _files(dst)
    carried = {n: t for n, t in TREE.items()}
    for name, text in carried.items():
        assert name in files, f"{command} lost {name}"
        assert files[name].read_text() == text, name
    assert files["vocab_alias.json"].read_text() == TREE["tokenizer.json"] and not files["vocab_alias.json"].is_symlink()
    assert files["2_Dense/model.safetensors"].read_bytes() == (tmp_path / "plain" / "2_Dense" / "model.safetensors").read_bytes()
    own = {"model.safetensors", "config.json"}
    assert set(files) == set(carried) | {"vocab_alias.json", "2_Dense/model.safetensors"} | own, sorted(set(files) ^ (set(carried) | own))
    # ordinary permissions under the umask, for the copies and the folders made for them too
    assert _mode(dst) == 0o777 & ~umask
    for name, p in files.items():
        assert _mode(p) == 0o666 & ~umask, name
    for d in ("1_Pooling", "2_Dense", "deep", "deep/er", "deep/er/still"):
        assert _mode(dst / d) == 0o777 & ~umask, d


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("link", ["outside", "folder", "broken"])
def test_unsafe_links_are_refused_before_anything_is_written(command, link, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not part of the model")
    make, run = COMMANDS[command]
    src = make(tmp_path)
    target = {"outside": outside, "folder": src / "deep", "broken": src / "missing.json"}[link]
    os.symlink(target, src / "1_Pooling" / "extra.json")
    dst = tmp_path / "out"
    with pytest.raises(QFormatError) as e:
        run(src, dst)
    assert e.value.code == "CONVERT_SOURCE_INVALID"
    assert "1_Pooling/extra.json" in str(e.value)
    assert not dst.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".qformat-")]


def test_huggingface_cache_snapshot_links_are_followed_into_its_blobs(tmp_path):
    """huggingface_hub's cache: every file of ``snapshots/<rev>/`` links into ``../../blobs``."""
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    (snap / "1_Pooling").mkdir(parents=True)
    plain = _plain(tmp_path)
    for i, name in enumerate(["model.safetensors", "config.json", "tokenizer.json", "1_Pooling/config.json"]):
        (blobs / f"blob{i}").write_bytes((plain / name).read_bytes())
        os.symlink(os.path.relpath(blobs / f"blob{i}", (snap / name).parent), snap / name)
    dst = tmp_path / "out"
    qformat.quantize_checkpoint(snap, dst, scheme="int", bits=4, group_size=32)
    assert set(_files(dst)) == {"model.safetensors", "config.json", "tokenizer.json", "1_Pooling/config.json"}
    assert (dst / "1_Pooling" / "config.json").read_text() == TREE["1_Pooling/config.json"]
    # a link out of the snapshot that is not into its repository's blobs is still refused
    os.symlink(tmp_path / "plain" / "README.md", snap / "README.md")
    with pytest.raises(QFormatError, match="README.md"):
        side_files(str(snap))


def test_destination_inside_the_source_is_not_carried_into_itself(tmp_path):
    src = _plain(tmp_path)
    dst = src / "int4"
    for _ in range(2):  # the second run finds the first output inside the source
        qformat.quantize_checkpoint(src, dst, scheme="int", bits=4, group_size=32, overwrite=True)
    assert not [n for n in _files(dst) if n.startswith("int4/")]
    assert (dst / "1_Pooling" / "config.json").is_file()


def test_sharded_source_index_and_shards_are_rewritten_not_copied(tmp_path):
    src = _plain(tmp_path)
    resharded = tmp_path / "sharded"
    qformat.quantize_checkpoint(src, resharded, scheme="int", bits=4, group_size=32, max_shard_size=12_000)
    assert (resharded / "model.safetensors.index.json").is_file()
    assert (resharded / "1_Pooling" / "config.json").is_file()
    back = tmp_path / "back"
    qformat.dequantize_checkpoint(resharded / "model.safetensors.index.json", back)
    shards = sorted(n for n in os.listdir(resharded) if n.endswith(".safetensors"))
    assert len(shards) > 1 and sorted(n for n in os.listdir(back) if n.endswith(".safetensors")) == shards
    assert (back / "2_Dense" / "model.safetensors").is_file() and (back / "deep/er/still/notes.txt").is_file()


@pytest.mark.parametrize("name,weight", [
    ("model.safetensors", True), ("model-00001-of-00002.safetensors", True), ("model.safetensors.index.json", True),
    ("model.safetensors.index.fp16.json", True), ("pytorch_model.bin", True), ("pytorch_model-00001-of-00003.bin", True),
    ("pytorch_model.bin.index.json", True), ("tf_model.h5", True), ("flax_model.msgpack", True), ("rust_model.ot", True),
    ("config.json", False), ("tokenizer.json", False), ("model_card.md", False), ("training_args.bin", False),
])
def test_which_top_level_files_are_weights(name, weight):
    assert is_weight_file(name) is weight


def test_save_pretrained_carries_the_folder_it_was_loaded_from(tmp_path, umask):
    """transformers' save_pretrained of a model loaded through qformat: the loaded folder's side
    tree is copied in, except what the save wrote itself and the source's weights and index (a
    sharded source saved unsharded must not keep the old index, or the save would not load)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import qformat.transformers  # noqa: F401

    from .readers.test_transformers import IDS, tiny_config

    torch.manual_seed(0)
    fp = tmp_path / "fp"
    transformers.LlamaForCausalLM(tiny_config()).save_pretrained(fp)
    _write_tree(fp)
    src = tmp_path / "sharded"
    qformat.quantize_checkpoint(fp, src, scheme="int", bits=4, group_size=32, max_shard_size=100_000)
    assert (src / "model.safetensors.index.json").is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(src)
    out = tmp_path / "saved"
    model.save_pretrained(out)  # one file: the model is smaller than the default shard size
    files = _files(out)
    assert not any(n.startswith("model-") or n.endswith(".index.json") for n in files), sorted(files)
    for name, text in TREE.items():
        assert files[name].read_text() == text, name
        assert _mode(files[name]) == 0o666 & ~umask, name
    assert _mode(out / "deep" / "er") == 0o777 & ~umask
    assert not ({"pytorch_model.bin", ".git/HEAD"} & set(files))
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "qformat"
    again = transformers.AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, model(IDS).logits)
    # a model that does not come from a local folder gets nothing extra
    model.name_or_path = "org/not-a-local-folder"
    model.config._name_or_path = "org/not-a-local-folder"
    bare = tmp_path / "bare"
    model.save_pretrained(bare)
    assert not (bare / "1_Pooling").exists() and not (bare / "tokenizer.json").exists()
