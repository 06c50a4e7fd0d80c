"""Small GGUF model files for the tests, laid out the way llama.cpp's converter lays them out.

A tiny transformers model (random weights from a fixed seed) of each architecture is written
as GGUF with gguf-py: llama.cpp's tensor names (``gguf.get_tensor_name_map``), the hyperparameter
keys of ``gguf.Keys``, llama.cpp's rotary row order of q/k for ``llama`` (convert_hf_to_gguf.py's
``LlamaModel.permute``), Gemma's norms stored as ``w + 1``, a byte-level BPE vocabulary (``gpt2``
tokenizer keys) trained here on a short text, and weights quantized by ``gguf.quants.quantize``
(legacy types) or as random blocks (K-quants, which gguf-py cannot quantize).  These files are
the input; the oracle the tests compare with is transformers' own GGUF loader reading the same
file, so nothing here has to agree with qformat.  tests/test_llama_cpp.py makes real files with
llama.cpp's own converter and quantizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: Architecture -> (transformers config class, GGUF architecture, general.name).
ARCHS: dict[str, tuple[str, str, str]] = {
    "llama": ("LlamaConfig", "llama", "tiny-llama"),
    "mistral": ("MistralConfig", "llama", "Mistral-tiny"),  # llama.cpp writes Mistral as llama
    "qwen2": ("Qwen2Config", "qwen2", "tiny-qwen2"),
    "qwen3": ("Qwen3Config", "qwen3", "tiny-qwen3"),
    "gemma2": ("Gemma2Config", "gemma2", "tiny-gemma2"),
    "gemma3": ("Gemma3TextConfig", "gemma3", "tiny-gemma3"),
    "phi3": ("Phi3Config", "phi3", "tiny-phi3"),
}
GEMMA = ("gemma2", "gemma3")

TEXT = (
    "The quick brown fox jumps over the lazy dog. Quantized weights travel between runtimes, and every "
    "runtime must read them the same way, bit for bit. A format that says what its bytes mean lets a "
    "reader in any language decode them without guessing at nibble order or scale placement. 0123456789 "
)


#: Vocabulary kind per architecture: llama.cpp writes Gemma's as a SentencePiece ("llama") vocabulary.
SPM = GEMMA
#: SentencePiece special tokens in Gemma's order (pad, eos, bos, unk).
SPM_SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]


def tokenizer(folder: Path, spm: bool = False) -> Any:
    """A tokenizer trained on :data:`TEXT`, saved into ``folder`` with transformers
    (tokenizer.json, tokenizer_config.json); returns it.  Byte-level BPE (GPT-2 style), or with
    ``spm`` a SentencePiece-style BPE (``\u2581`` for spaces) with Gemma's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if spm:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator([TEXT] * 4, trainers.BpeTrainer(vocab_size=320, special_tokens=SPM_SPECIALS))
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>", unk_token="<unk>")
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([TEXT] * 4, trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    return fast


def hf_model(arch: str, folder: Path, *, tie: bool = False, seed: int = 0) -> Any:
    """A tiny transformers model of ``arch`` with its tokenizer, saved into ``folder``."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(folder, spm=arch in SPM)
    cls = getattr(transformers, ARCHS[arch][0])
    kw: dict[str, Any] = dict(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                              tie_word_embeddings=tie, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if arch in GEMMA:
        kw["head_dim"] = 32
    # transformers' GGUF config has no head_dim key for qwen3, so the tiny model keeps Qwen3Config's
    # default (128), as real Qwen3 models do
    if arch in GEMMA:  # llama.cpp's Gemma files have no output.weight: the head is always the embedding
        kw.update(sliding_window=64, query_pre_attn_scalar=32, tie_word_embeddings=True)
    if arch == "phi3":  # transformers' Phi3 config keeps its pad id 32000 (a GGUF cannot set it): Phi-3's vocab size
        kw.update(vocab_size=32064, hidden_size=128)
    cfg = cls(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms away from their initial ones, so that a lost offset shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary row order (per head, the two halves of its rows interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _kquant_blocks(rows: int, cols: int, qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant type with small finite f16 d/dmin (gguf-py cannot quantize K-quants)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % block == 0, f"rows of {cols} are not whole {qtype.name} blocks of {block}"
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    offsets = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[qtype.name]
    for off in offsets:
        raw[..., off:off + 2] = (rng.uniform(0.001, 0.01, raw.shape[:2]).astype(np.float16)).view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def write_gguf(hf_folder: Path, path: Path, arch: str, *, qtype: str = "Q8_0", types: dict[str, str] | None = None,
               seed: int = 1, drop: tuple[str, ...] = (), gguf_arch: str | None = None,
               override: dict[str, int] | None = None) -> Path:
    """``hf_folder`` (from :func:`hf_model`) as a GGUF file of ``qtype`` weights.

    ``types`` overrides the type by a dot-separated part of the GGUF name (``{"token_embd": "Q8_0"}``);
    ``"F32"``/``"F16"`` keep a tensor plain.  1-D tensors (norms, biases) stay F32 as llama.cpp
    keeps them.  For the tests of bad input: ``drop`` leaves out keys (a prefix such as
    ``"tokenizer."`` drops all of its keys), ``gguf_arch`` writes another architecture name,
    ``override`` sets uint32 keys to other values.
    """
    from safetensors.numpy import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tj = json.loads((hf_folder / "tokenizer.json").read_text())
    return write_gguf_from(path, arch, cfg, tj, load_file(str(hf_folder / "model.safetensors")).items(), qtype=qtype, types=types,
                           seed=seed, drop=drop, gguf_arch=gguf_arch, override=override)


def write_gguf_from(path: Path, arch: str, cfg: dict[str, Any], tj: dict[str, Any], tensors: Any, *, qtype: str = "Q8_0",
                    types: dict[str, str] | None = None, seed: int = 1, drop: tuple[str, ...] = (),
                    gguf_arch: str | None = None, override: dict[str, int] | None = None) -> Path:
    """:func:`write_gguf` from a config dict, a tokenizer.json dict and ``(HF name, array)``
    pairs (produced one at a time, so a large model need not be in memory as float32)."""
    import gguf

    garch, name = ARCHS[arch][1], ARCHS[arch][2]
    n_layers = int(cfg["num_hidden_layers"])
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == garch), n_layers)
    w = gguf.GGUFWriter(str(path), gguf_arch or garch)
    K = gguf.Keys
    w.add_name(name)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_block_count(n_layers)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv(int(cfg["num_key_value_heads"]))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_rope_freq_base(float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    if cfg.get("head_dim"):
        w.add_key_length(int(cfg["head_dim"]))
        w.add_value_length(int(cfg["head_dim"]))
    if cfg.get("sliding_window"):
        w.add_sliding_window(int(cfg["sliding_window"]))
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(int(cfg["vocab_size"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    # vocabulary: tokens by id, merges, special ids (gpt2 model)
    vocab = {int(i): t for t, i in tj["model"]["vocab"].items()}
    for a in tj.get("added_tokens", []):
        vocab[int(a["id"])] = a["content"]
    # ids up to the model's vocab_size that the tokenizer does not use: llama.cpp's [PAD<i>] tokens
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(max(len(vocab), int(cfg["vocab_size"])))]
    special = {"<s>", "</s>", "<pad>"}
    ttypes = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.UNKNOWN if t == "<unk>" else
              gguf.TokenType.UNUSED if i not in vocab else gguf.TokenType.NORMAL for i, t in enumerate(tokens)]
    if arch in SPM:  # SentencePiece vocabulary: scores give the merge order, no merges stored
        w.add_string(K.Tokenizer.MODEL, "llama")
        w.add_array(K.Tokenizer.LIST, tokens)
        w.add_array(K.Tokenizer.SCORES, [float(-i) for i in range(len(tokens))])
        w.add_uint32(K.Tokenizer.UNK_ID, tokens.index("<unk>"))
        w.add_uint32(K.Tokenizer.PAD_ID, tokens.index("<pad>"))
    else:
        w.add_string(K.Tokenizer.MODEL, "gpt2")
        # the pre-tokenizer llama.cpp's converter names for these families (transformers' Qwen2
        # tokenizer class imposes Qwen2's split, so a Qwen file must say "qwen2")
        w.add_string(K.Tokenizer.PRE, "qwen2" if garch in ("qwen2", "qwen3") else "default")
        w.add_array(K.Tokenizer.LIST, tokens)
        merges = tj["model"]["merges"]
        w.add_array(K.Tokenizer.MERGES, [m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_array(K.Tokenizer.TOKEN_TYPE, [int(t) for t in ttypes])
    w.add_uint32(K.Tokenizer.BOS_ID, tokens.index("<s>"))
    w.add_uint32(K.Tokenizer.EOS_ID, tokens.index("</s>"))
    w.add_bool(K.Tokenizer.ADD_BOS, True)
    w.add_string(K.Tokenizer.CHAT_TEMPLATE, "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}")

    rng = np.random.default_rng(seed)
    for hf_name, value in tensors:
        if cfg.get("tie_word_embeddings") and hf_name == "lm_head.weight":
            continue
        gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf_name
        data = value.astype(np.float32)
        if garch == "llama" and ".attn_q." in gname:
            data = _permute(data, int(cfg["num_attention_heads"]))
        elif garch == "llama" and ".attn_k." in gname:
            data = _permute(data, int(cfg["num_key_value_heads"]))
        if arch in GEMMA and gname.endswith("norm.weight"):
            data = data + np.float32(1)
        t = qtype
        for key, tt in (types or {}).items():
            if key in gname.split("."):  # a whole part of the name: "output" is not "attn_output"
                t = tt
        if data.ndim == 1 or t == "F32":
            w.add_tensor(gname, data)
            continue
        if t == "F16":
            w.add_tensor(gname, data.astype(np.float16))
            continue
        q = gguf.GGMLQuantizationType[t]
        if t.endswith("_K"):
            raw = _kquant_blocks(data.shape[0], data.shape[1], q, rng)
        else:
            raw = gguf.quants.quantize(data, q)
        w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=q)
    kv = w.kv_data[0]
    for key in [k for k in kv if any(k == d or (d.endswith(".") and k.startswith(d)) for d in drop)]:
        del kv[key]
    for key, value in (override or {}).items():
        kv[key] = gguf.GGUFValue(value, gguf.GGUFValueType.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def count_gguf_readers(monkeypatch: Any) -> list[str]:
    """Count the gguf-py readers opened from now on (``gguf.GGUFReader`` replaced through
    ``monkeypatch``): the paths, in order, in the returned list."""
    import gguf

    opened: list[str] = []
    real = gguf.GGUFReader

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, path: Any, *a: Any, **k: Any) -> None:
            opened.append(str(path))
            super().__init__(path, *a, **k)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    return opened
