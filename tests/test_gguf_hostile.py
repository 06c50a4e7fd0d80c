"""Hostile GGUF files into Hugging Face model folders (issue 40): the name map bounded by the
tensors, every hyperparameter transformers reads checked before a config is built, and seeded
mutant streams through the GGUF reader, the GGUF-to-transformers conversion and the importance
matrix readers (tests/gguf_hostile.py) ending in success or a qformat code, never anything else.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from qformat.errors import QFormatError  # noqa: E402
from qformat_transformers import gguf_hparams, gguf_layout  # noqa: E402
from qformat_transformers.gguf_layout import convert_gguf, gguf_names  # noqa: E402

from . import gguf_hostile as h  # noqa: E402
from .gguf_hostile import KV, Parts  # noqa: E402

SEED = 20261205
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-hostile")
    return dict(zip(ARCHS, h.test_models(root, ARCHS)))


def _refused(parts: Parts, tmp_path: Path, code: str, field: str | None, *words: str) -> QFormatError:
    src = tmp_path / "m.gguf"
    src.write_bytes(h.to_bytes(parts))
    with pytest.raises(QFormatError) as e:
        convert_gguf(src, tmp_path / "out")
    assert e.value.code == code, e.value
    if field is not None:
        assert e.value.field == field, e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".qformat-")]
    return e.value


# -- the name map ------------------------------------------------------------------------------------
def _model(src: Path) -> tuple[Any, Any, str]:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, load_gguf_checkpoint
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    parsed = load_gguf_checkpoint(str(src))
    cfg = CONFIG_MAPPING[parsed["config"]["model_type"]].from_dict(dict(parsed["config"]))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    arch = h.read_parts(src).arch
    return model, TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed["config"]), arch


@pytest.mark.parametrize("arch", ARCHS)
def test_name_map_is_transformers_map(models: dict[str, Path], arch: str) -> None:
    """The map built once is transformers' own ``get_gguf_hf_weights_map``, entry for entry, in order."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    model, processor, garch = _model(models[arch])
    want = get_gguf_hf_weights_map(model, processor, model_type=garch)
    got = gguf_names(model, processor, garch, model.config.num_hidden_layers)
    assert list(got.items()) == list(want.items())


def test_name_map_is_built_once_for_the_blocks_the_file_holds(models: dict[str, Path], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers builds gguf-py's map of every block's names again for each module (quadratic in
    the block count: 100 blocks took 157 s here); the conversion builds it once, for the blocks
    the tensors hold."""
    import gguf

    calls: list[int] = []
    real = gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, n: calls.append(n) or real(arch, n))
    convert_gguf(models["llama"], tmp_path / "out")
    assert calls == [2]


@pytest.mark.parametrize("blocks", [3, 100, 10**6, 2**32 - 1, 2**64 - 1])
def test_block_count_must_be_the_blocks_the_tensors_hold(models: dict[str, Path], tmp_path: Path, blocks: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A block count the tensors do not have is refused before any model or name map is built,
    so a large one costs nothing (10^6 took over 120 s and 4.5 GB before, without an answer)."""
    import gguf

    built: list[Any] = []
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: built.append(a))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", lambda *a, **k: built.append(a))
    p = h.read_parts(models["llama"])
    p.kv["llama.block_count"] = KV("uint64" if blocks >= 2**32 else "uint32", blocks)
    _refused(p, tmp_path, "CONVERT_SOURCE_INVALID", "llama.block_count", f"is {blocks}", "blk.0 to blk.1")
    assert built == []


def test_a_block_without_tensors_is_named(models: dict[str, Path], tmp_path: Path) -> None:
    p = h.read_parts(models["llama"])
    for t in p.tensors:
        t.name = t.name.replace("blk.1.", "blk.2.")
    p.kv["llama.block_count"] = KV("uint32", 3)
    _refused(p, tmp_path, "CONVERT_SOURCE_INVALID", "llama.block_count", "blk.1 has none")


# -- every hyperparameter transformers reads ------------------------------------------------------
def _set(key: str, value: KV | None) -> Callable[[Parts], None]:
    def edit(p: Parts) -> None:
        if value is None:
            del p.kv[key]
        else:
            p.kv[key] = value
    return edit


def _tokens(f: Callable[[list[Any]], list[Any]], element: str = "string") -> Callable[[Parts], None]:
    def edit(p: Parts) -> None:
        p.kv["tokenizer.ggml.tokens"] = KV("array", f(list(p.kv["tokenizer.ggml.tokens"].value)), element)
    return edit


U32, I32, F32 = "uint32", "int32", "float32"
#: name -> (edit of the tiny llama GGUF: 2 blocks, 256 wide, 4 heads of 64, 2 key/value heads,
#: feed-forward 512, 320 tokens), code, field, words of the message.
HYPER = {
    "head_count_kv 0": (_set("llama.attention.head_count_kv", KV(U32, 0)), "CONVERT_SOURCE_INVALID", "llama.attention.head_count_kv", "from 1"),
    "head_count_kv 3": (_set("llama.attention.head_count_kv", KV(U32, 3)), "CONVERT_SOURCE_INVALID", "llama.attention.head_count_kv", "divisor"),
    "head_count 0": (_set("llama.attention.head_count", KV(U32, 0)), "CONVERT_SOURCE_INVALID", "llama.attention.head_count", "is 0"),
    "head_count 3": (_set("llama.attention.head_count", KV(U32, 3)), "CONVERT_SOURCE_INVALID", "llama.attention.head_count", "divisor of llama.embedding_length"),
    "head_count per layer": (_set("llama.attention.head_count", KV("array", [4, 4], U32)), "CONVERT_UNSUPPORTED", "llama.attention.head_count", "one per layer"),
    "head_count as array of 3": (_set("llama.attention.head_count", KV("array", [4, 4, 4], U32)), "CONVERT_SOURCE_INVALID", "llama.attention.head_count", "an integer"),
    "embedding_length -1": (_set("llama.embedding_length", KV(I32, -1)), "CONVERT_SOURCE_INVALID", "llama.embedding_length", "is -1", "from 1 to 512"),
    "embedding_length 2^63": (_set("llama.embedding_length", KV("uint64", 2**63)), "CONVERT_SOURCE_INVALID", "llama.embedding_length", "largest tensor dimension"),
    "embedding_length 512": (_set("llama.embedding_length", KV(U32, 512)), "CONVERT_SOURCE_INVALID", "llama.embedding_length", "token_embd.weight"),
    "embedding_length as float": (_set("llama.embedding_length", KV(F32, 256.0)), "CONVERT_SOURCE_INVALID", "llama.embedding_length", "an integer", "float32"),
    "embedding_length as string": (_set("llama.embedding_length", KV("string", "256")), "CONVERT_SOURCE_INVALID", "llama.embedding_length", "the string '256'"),
    "feed_forward_length 2^40": (_set("llama.feed_forward_length", KV("uint64", 2**40)), "CONVERT_SOURCE_INVALID", "llama.feed_forward_length", "to 512"),
    "block_count 0": (_set("llama.block_count", KV(U32, 0)), "CONVERT_SOURCE_INVALID", "llama.block_count", "from 1"),
    "block_count as bool": (_set("llama.block_count", KV("bool", True)), "CONVERT_SOURCE_INVALID", "llama.block_count", "an integer"),
    "no block_count": (_set("llama.block_count", None), "CONVERT_SOURCE_INVALID", "llama.block_count", "has no llama.block_count"),
    "rms epsilon NaN": (_set("llama.attention.layer_norm_rms_epsilon", KV(F32, float("nan"))), "CONVERT_SOURCE_INVALID", "llama.attention.layer_norm_rms_epsilon", "finite"),
    "rms epsilon 0": (_set("llama.attention.layer_norm_rms_epsilon", KV(F32, 0.0)), "CONVERT_SOURCE_INVALID", "llama.attention.layer_norm_rms_epsilon", "above 0"),
    "rms epsilon -1": (_set("llama.attention.layer_norm_rms_epsilon", KV(F32, -1.0)), "CONVERT_SOURCE_INVALID", "llama.attention.layer_norm_rms_epsilon", "above 0"),
    "rms epsilon as int": (_set("llama.attention.layer_norm_rms_epsilon", KV(I32, -1)), "CONVERT_SOURCE_INVALID", "llama.attention.layer_norm_rms_epsilon", "a float"),
    "rope base inf": (_set("llama.rope.freq_base", KV(F32, float("inf"))), "CONVERT_SOURCE_INVALID", "llama.rope.freq_base", "is inf"),
    "rope dimensions odd": (_set("llama.rope.dimension_count", KV(U32, 7)), "CONVERT_SOURCE_INVALID", "llama.rope.dimension_count", "an even integer"),
    "context 0": (_set("llama.context_length", KV(U32, 0)), "CONVERT_SOURCE_INVALID", "llama.context_length", "from 1"),
    "context 2^40": (_set("llama.context_length", KV("uint64", 2**40)), "CONVERT_SOURCE_INVALID", "llama.context_length", str(2**31 - 1)),
    "vocab_size 321": (_set("llama.vocab_size", KV(U32, 321)), "CONVERT_SOURCE_INVALID", "llama.vocab_size", "vocabulary size 320"),
    "bos id 320": (_set("tokenizer.ggml.bos_token_id", KV(U32, 320)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.bos_token_id", "from 0 to 319"),
    "eos id -1": (_set("tokenizer.ggml.eos_token_id", KV(I32, -1)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.eos_token_id", "is -1"),
    "padding id 2^32-1": (_set("tokenizer.ggml.padding_token_id", KV(U32, 2**32 - 1)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.padding_token_id", "below the vocabulary size 320"),
    "tokens of ints": (_tokens(lambda t: list(range(len(t))), U32), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.tokens", "an array of string values"),
    "no tokens": (_tokens(lambda t: []), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.tokens", "non-empty"),
    "a token short": (_tokens(lambda t: t[:-1]), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.tokens", "an array of 319", "one value per token (320, the rows of token_embd.weight)"),
    "token types short": (_set("tokenizer.ggml.token_type", KV("array", [1] * 10, I32)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.token_type", "an array of 10", "one value per token (320"),
    "merges of ints": (_set("tokenizer.ggml.merges", KV("array", [1, 2], U32)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.merges", "string values"),
    "name as int": (_set("general.name", KV(U32, 7)), "CONVERT_SOURCE_INVALID", "general.name", "a string"),
    "add_bos as int": (_set("tokenizer.ggml.add_bos_token", KV(U32, 1)), "CONVERT_SOURCE_INVALID", "tokenizer.ggml.add_bos_token", "a bool"),
    "architecture a transformers name": (_set("general.architecture", KV("string", "qwen2_moe")), "CONVERT_UNSUPPORTED", "general.architecture", "'qwen2_moe'"),
}


@pytest.mark.parametrize("case", list(HYPER))
def test_hyperparameter_refused_before_a_config_is_built(models: dict[str, Path], tmp_path: Path, case: str) -> None:
    edit, code, field, *words = HYPER[case]
    p = h.read_parts(models["llama"])
    edit(p)
    e = _refused(p, tmp_path, code, field, *words)
    assert "while building" not in str(e)  # the checks refused it, not the net behind them


def test_token_embedding_rows_are_the_vocabulary(models: dict[str, Path], tmp_path: Path) -> None:
    p = h.read_parts(models["llama"])
    out = next(t for t in p.tensors if t.name == "output.weight")
    out.dims = [out.dims[0], 160]
    out.data = out.data[: len(out.data) // 2]
    _refused(p, tmp_path, "CONVERT_SOURCE_INVALID", None, "output.weight", "320 rows")


def test_rules_cover_every_key_transformers_reads() -> None:
    """Every key transformers' GGUF loader copies into a config or a tokenizer, for every
    architecture the conversion takes, has a rule (a key transformers adds fails here first)."""
    import gguf
    from transformers.integrations import GGUF_CONFIG_MAPPING
    from transformers.integrations.gguf.utils import is_gguf_arch_supported

    named = set(gguf.MODEL_ARCH_NAMES.values())
    archs = [a for a in GGUF_CONFIG_MAPPING if a in named and a not in gguf_layout.MERGED_ARCHITECTURES and not is_gguf_arch_supported(a)]
    assert {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"} <= set(archs)
    missing = [f"{a}.{k}" for a in archs for k, attr in GGUF_CONFIG_MAPPING[a].items() if attr is not None and k not in gguf_hparams.RULES]
    assert missing == []
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING as M

    tok = [f"{prefix}.{k}" for part in ("tokenizer", "tokenizer_config") for prefix, keys in M[part].items() for k in keys]
    assert tok and [k for k in tok if k not in gguf_hparams.RULES] == []


# -- seeded mutant streams ------------------------------------------------------------------------
def _clean(out: h.Outcomes, n: int) -> None:
    assert out.uncoded == 0, "\n".join(out.examples.values())
    assert sum(out.counts.values()) == n


def test_mutants_convert_or_refuse_with_a_code(models: dict[str, Path]) -> None:
    """Mutated metadata and tensor infos of the six test models, through the conversion: done or a
    code.  ``python -m tests.gguf_hostile 7000 40 --time-limit 10`` runs 7,000 of the same stream:
    before the checks 1,946 ended in a transformers or torch exception and 77 ran past 10 s; after,
    none, and none reached the net behind the checks."""
    n = 240  # about 15 s on one core
    out = h.run(list(models.values()), n, SEED, h.convert_hf)
    _clean(out, n)
    assert out.counts["done"] >= n // 10 and out.counts["coded CONVERT_SOURCE_INVALID"] >= n // 3, out.counts


def test_mutants_through_the_gguf_reader(models: dict[str, Path]) -> None:
    """inspect and convert --layout gguf on mutants (metadata, tensor infos, bytes)."""
    n = 120
    out = h.run([models["llama"], models["gemma3"]], n, SEED, h.parse_gguf, bytes_share=0.5)
    _clean(out, n)
    assert out.counts["done"] and out.counts["coded CONVERT_SOURCE_INVALID"], out.counts


def test_mutants_through_the_imatrix_readers(tmp_path: Path) -> None:
    n = 1500  # about 4 s
    out = h.run(h.imatrix_files(tmp_path), n, SEED, h.read_imatrix, bytes_share=0.5)
    _clean(out, n)
    assert out.counts["done"] and out.counts["coded IMATRIX_INVALID"] >= n // 10, out.counts


def test_entry_points_assert_the_code(tmp_path: Path) -> None:
    """The fuzzing entry points pass a coded refusal back and let anything else propagate."""
    e = h.read_imatrix(b"not an imatrix")
    assert isinstance(e, QFormatError) and e.code == "IMATRIX_INVALID"
    assert h.parse_gguf(b"GGUF").code == "CONVERT_SOURCE_INVALID"
    with pytest.raises(ZeroDivisionError):
        h._coded(lambda: 1 // 0)


def test_mutations_are_seeded(models: dict[str, Path]) -> None:
    p = h.read_parts(models["qwen2"])
    a = [h.to_bytes(h.mutate(p, random.Random(5))[0]) for _ in range(2)]
    assert a[0] == a[1] and a[0] != h.to_bytes(p)
    assert h.to_bytes(p) == models["qwen2"].read_bytes()  # the writer gives back the file it read
    assert np.array_equal(np.frombuffer(h.mutate_bytes(b"\0" * 64, random.Random(1))[0][:4], np.uint8),
                          np.frombuffer(h.mutate_bytes(b"\0" * 64, random.Random(1))[0][:4], np.uint8))
