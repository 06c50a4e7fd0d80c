"""The tiny models the llama_cpp tests run through llama.cpp, built from nothing but fixed seeds
and the real tokenizers the llama.cpp source ships (``models/ggml-vocab-*.gguf``: vocabularies
without weights).

- ``hf_tokenizer``: a Hugging Face tokenizer made from such a vocabulary by transformers' own GGUF
  import, brought back to the tokenizer the vocabulary came from (see there), and checked to be
  one llama.cpp's converter recognises (its pre-tokenizer fingerprint).
- ``tiny_model``: a 2-layer Llama or Qwen2 with that tokenizer's vocabulary, trained for a few
  dozen steps to repeat the test paragraph, saved with ``save_pretrained``.  A random model predicts
  every token about equally badly whatever its weights are, so its perplexity could not tell a
  correct GGUF from a broken one; one that has learnt the paragraph reaches a perplexity far
  below the vocabulary size only if llama.cpp computes what transformers computed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

# A paragraph of ordinary English (digits, punctuation, an apostrophe), long enough for
# llama-perplexity at a context of 32 (it needs twice the context in tokens).
PARAGRAPH = (
    "The old lighthouse stood at the end of a narrow spit of sand, where the river met the sea. "
    "Every evening at dusk the keeper climbed its one hundred and twelve steps, trimmed the wick, "
    "and wound the clockwork that turned the great lens. Ships passing in the dark counted its "
    "flashes, three short and one long, to know where they were. In 1936 the lamp was replaced by "
    "an electric one, and the keeper's cottage became a small museum. Visitors can still climb the "
    "stairs on summer afternoons, if they don't mind the wind."
)


@dataclass(frozen=True)
class Variant:
    """One model family: the vocabulary it takes from the llama.cpp source and how it is made."""

    name: str
    vocab_gguf: str  # in the source's models/
    pre: str  # tokenizer.ggml.pre llama.cpp's converter must find for it
    add_bos: bool  # the original tokenizer adds BOS (Llama 3 does, Qwen2 does not)
    model_type: str
    # Warnings llama.cpp prints on loading the vocabulary GGUF itself, so on any model with it
    # (substrings).  Qwen2's vocabulary has "</s>" as an ordinary token, which llama.cpp's
    # loader flags as control-looking in ggml-vocab-qwen2.gguf and in its converter's output.
    vocab_warnings: tuple[str, ...] = ()


LLAMA3 = Variant("llama3", "ggml-vocab-llama-bpe.gguf", "llama-bpe", True, "llama")
QWEN2 = Variant("qwen2", "ggml-vocab-qwen2.gguf", "qwen2", False, "qwen2",
                vocab_warnings=("control-looking token: 128247 '</s>' was not control-type",))


# -- the tokenizer ---------------------------------------------------------------------------------


def _gguf_token_count(path: Path) -> int:
    from gguf import GGUFReader

    return len(GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].data)


def hf_tokenizer(models_dir: Path, variant: Variant, out: Path, converter_py: Path) -> Path:
    """Save in ``out`` the Hugging Face tokenizer of ``variant``'s vocabulary.

    transformers reads the GGUF vocabulary (``AutoTokenizer.from_pretrained(..., gguf_file=)``);
    two things then differ from the tokenizer the vocabulary came from, and are put back:
    - its byte-level builder (GPT2Tokenizer) adds its default ``<|endoftext|>`` as a new token
      when the vocabulary has none (Llama 3), one id past the vocabulary: removed, so the
      tokenizer has exactly the GGUF's tokens;
    - it adds no BOS, while Llama 3's tokenizer puts ``<|begin_of_text|>`` first: set with
      ``add_bos_token`` as the variant says.
    The result must give llama.cpp's converter the pre-tokenizer fingerprint of the original
    tokenizer (``converter_py``'s table, e.g. "llama-bpe"), else its conversion would refuse it;
    checked here so a transformers change shows as a clear fixture error."""
    from transformers import AutoTokenizer

    vocab = models_dir / variant.vocab_gguf
    n = _gguf_token_count(vocab)
    tok = AutoTokenizer.from_pretrained(str(models_dir), gguf_file=variant.vocab_gguf)
    tok.save_pretrained(str(out))
    _drop_tokens_from(out, n)
    tok = AutoTokenizer.from_pretrained(str(out), add_bos_token=variant.add_bos)
    tok.save_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) != n:
        raise AssertionError(f"{variant.name}: the tokenizer has {len(tok)} tokens, its GGUF vocabulary {n}")
    found = converter_pre(tok, converter_py)
    if found != variant.pre:
        raise AssertionError(f"{variant.name}: llama.cpp's converter would see pre-tokenizer {found!r}, not {variant.pre!r}")
    return out


def _drop_tokens_from(folder: Path, n: int) -> None:
    """Remove the added tokens with an id >= n from tokenizer.json and tokenizer_config.json."""
    tj_path, tc_path = folder / "tokenizer.json", folder / "tokenizer_config.json"
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    tj["added_tokens"] = [t for t in tj["added_tokens"] if t["id"] < n]
    vocab = tj["model"]["vocab"]
    for k in [k for k, i in vocab.items() if i >= n]:
        del vocab[k]
    tj_path.write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" in tc:
        tc["added_tokens_decoder"] = {k: v for k, v in tc["added_tokens_decoder"].items() if int(k) < n}
    tc_path.write_text(json.dumps(tc, ensure_ascii=False, indent=2), encoding="utf-8")


def converter_pre(tok, converter_py: Path) -> str | None:
    """The ``tokenizer.ggml.pre`` llama.cpp's converter would write for ``tok``: the sha256 of the
    ids of its check text, looked up in the converter's table.  Both are read from the
    converter's source (its data, not its code), so this follows the sdist's version."""
    src = converter_py.read_text(encoding="utf-8")
    m = re.search(r"^\s*chktxt = ('.*')\s*$", src, re.MULTILINE)
    if m is None:
        raise AssertionError(f"no chktxt in {converter_py}")
    chktxt = _python_string(m.group(1))
    chkhsh = sha256(str(tok.encode(chktxt)).encode()).hexdigest()
    m = re.search(rf'chkhsh == "{chkhsh}":\s*\n(?:\s*#.*\n)*\s*res = "([^"]+)"', src)
    return m.group(1) if m else None


def _python_string(literal: str) -> str:
    import ast

    value = ast.literal_eval(literal)
    if not isinstance(value, str):
        raise TypeError("chktxt is not a string literal")
    return value


# -- the model -------------------------------------------------------------------------------------

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 256, 2, 4, 2, 512


def perplexity_windows(ids: list[int], bos: int | None, ctx: int) -> list[list[int]]:
    """The token windows ``llama-perplexity -c ctx`` scores: consecutive chunks of ``ctx`` ids,
    the first of each replaced by BOS when the model adds one (the tool does that)."""
    out = []
    for c in range(len(ids) // ctx):
        w = list(ids[c * ctx:(c + 1) * ctx])
        if bos is not None:
            w[0] = bos
        out.append(w)
    return out


def tiny_model(variant: Variant, tokenizer_dir: Path, out: Path, *, text: str = PARAGRAPH, ctx: int = 32,
               seed: int = 0, steps: int = 40, lr: float = 1e-2) -> Path:
    """A 2-layer ``variant.model_type`` model (hidden 256, 4 heads, 2 KV heads, intermediate 512)
    with the tokenizer's vocabulary, initialised from ``seed``, trained ``steps`` Adam steps on
    the windows of ``text`` that ``llama-perplexity -c ctx`` scores, and saved in float32 with the
    tokenizer.  The token embeddings stay as initialised (fixed random vectors are enough to
    tell tokens apart; it halves the optimizer's work on a 128K-token vocabulary)."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    common = {
        "vocab_size": len(tok), "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "intermediate_size": INTERMEDIATE, "max_position_embeddings": 2048,
        "tie_word_embeddings": False, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
    }
    if variant.model_type == "llama":
        cfg, cls = LlamaConfig(rms_norm_eps=1e-5, rope_theta=500000.0, **common), LlamaForCausalLM
    else:
        cfg, cls = Qwen2Config(rms_norm_eps=1e-6, rope_theta=1000000.0, **common), Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).float()
    ids = tok(text)["input_ids"]
    windows = torch.tensor(perplexity_windows(ids, tok.bos_token_id if variant.add_bos else None, ctx))
    model.get_input_embeddings().weight.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=windows, labels=windows).loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
