"""Helpers of the architecture matrix (``tests/test_arch_matrix.py``; the table is
``tests/arch_matrix_models.py``): the tokenizers, the tiny random models and llama.cpp's GGUF
files of them, and the comparisons each (architecture, preset) pair goes through.

- :func:`tokenizer_folder`: a Hugging Face tokenizer llama.cpp's converter takes: the BPE ones
  from the sdist's ``models/ggml-vocab-*.gguf`` (:func:`tests.llama_cpp_models.hf_tokenizer`,
  which checks the converter's pre-tokenizer fingerprint), the SentencePiece one as a
  ``tokenizer.model`` written from the Gemma 3 270M GGUF's vocabulary (:func:`sentencepiece_model`).
- :func:`tiny_model`: the entry's transformers model, initialised from its seed, every 1-D
  parameter (norms, biases) moved off its constant initial value so that a norm shift or a bias
  permutation done wrong changes the logits, saved in float32.
- :func:`transformers_row` / :func:`llama_cpp_row`: the two halves of the check, each returning
  the row recorded in the results file.

Nothing here decides a result from qformat's own output alone: transformers' GGUF loader and
llama.cpp's tools run on llama.cpp's files are the references.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from . import llama_cpp as L
from . import llama_cpp_models as M
from .arch_matrix_models import ArchSpec

#: The tokenizer key -> the llama_cpp_models variant (vocab file and pre-tokenizer) it is made from.
BPE_VARIANTS: dict[str, M.Variant] = {
    "llama-bpe": M.LLAMA3,
    "qwen2": M.QWEN2,
    "gpt-2": M.Variant("gpt2", "ggml-vocab-gpt-2.gguf", "gpt-2", False, "gpt2"),
}
#: How many pieces of the Gemma 3 vocabulary the SentencePiece fixture keeps before its base
#: characters (:func:`sentencepiece_model`): the first 16384 hold the control, byte and
#: user-defined pieces below that id and the most frequent merges (the scores fall with the
#: id), and keep the embedding a sixteenth of the full 262144 rows.
GEMMA_PIECES = 16384
PROMPT = "The capital of France is"
NEW_TOKENS = 12
CTX = 32


# -- tokenizers ------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 values take ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pb(field: int, value: int | float | bytes | str) -> bytes:
    """One protobuf field: varint (int, bool), fixed32 (float) or length-delimited (bytes, str)."""
    if isinstance(value, float):
        return _varint(field << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, (bytes, str)):
        raw = value.encode("utf-8") if isinstance(value, str) else value
        return _varint(field << 3 | 2) + _varint(len(raw)) + raw
    return _varint(field << 3) + _varint(int(value))


def sentencepiece_model(gguf_path: Path, out: Path, n: int = GEMMA_PIECES) -> dict[str, int]:
    """Write ``out/tokenizer.model`` (sentencepiece's ``ModelProto``, encoded here: the protobuf
    package is not needed) from the first ``n`` pieces of a SentencePiece GGUF vocabulary and its later Latin
    single-character pieces
    (``tokenizer.ggml.model`` ``llama``): pieces, scores and types as the GGUF has them, BPE,
    byte fallback, Gemma's normalizer (no dummy prefix, whitespace kept), and the GGUF's special
    ids and pieces.  The unknown piece is typed UNKNOWN (sentencepiece requires one; Gemma's GGUF types
    it as control).  Returns the special ids."""
    from qformat.convert.gguf_file import GGUFFile

    kv = {k: v.value for k, v in GGUFFile(str(gguf_path)).kv.items()}
    if kv.get("tokenizer.ggml.model") != "llama":
        raise AssertionError(f"{gguf_path}: not a SentencePiece vocabulary")
    every = kv["tokenizer.ggml.tokens"]
    # the first n pieces, then the single characters up to U+024F (Latin, with accents) that
    # come later (SentencePiece BPE puts its base characters last): without them, transformers'
    # GGUF import finds no merges to build words from and spells them in byte pieces
    keep = list(range(n)) + [i for i in range(n, len(every)) if kv["tokenizer.ggml.token_type"][i] == 1
                             and len(every[i]) == 1 and (ord(every[i]) < 0x250 or every[i] == "\u2581")]
    tokens = [every[i] for i in keep]
    scores = [kv["tokenizer.ggml.scores"][i] for i in keep]
    types = [kv["tokenizer.ggml.token_type"][i] for i in keep]
    ids = {k: int(kv[f"tokenizer.ggml.{k}_token_id"]) for k in ("bos", "eos", "unknown", "padding")}
    body = bytearray()
    for i, (piece, score, typ) in enumerate(zip(tokens, scores, types)):
        typ = 2 if i == ids["unknown"] else int(typ)
        body += _pb(1, _pb(1, piece) + _pb(2, float(score)) + _pb(3, typ))
    trainer = (_pb(3, 2) + _pb(4, len(tokens)) + _pb(35, 1) + _pb(40, ids["unknown"]) + _pb(41, ids["bos"])
               + _pb(42, ids["eos"]) + _pb(43, ids["padding"])
               + b"".join(_pb(f, tokens[ids[k]]) for f, k in ((45, "unknown"), (46, "bos"), (47, "eos"), (48, "padding"))))
    normalizer = _pb(1, "identity") + _pb(3, 0) + _pb(4, 0) + _pb(5, 1)
    body += _pb(2, trainer) + _pb(3, normalizer)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(bytes(body))
    # what the converter reads for tokenizer.ggml.add_bos_token / add_eos_token (Gemma's values)
    (out / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False}) + "\n")
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(out / "tokenizer.model"))
    if sp.vocab_size() != len(tokens) or sp.bos_id() != ids["bos"] or not sp.IsByte(int(types.index(6))):
        raise AssertionError("sentencepiece reads the written tokenizer.model differently")
    return {"vocab_size": len(tokens), "bos": ids["bos"], "eos": ids["eos"], "pad": ids["padding"], "unk": ids["unknown"]}


def tokenizer_folder(name: str, source: Path, out: Path) -> dict[str, Any]:
    """Make tokenizer ``name`` (``arch_matrix_models.TOKENIZERS``) in ``out``; returns the
    vocabulary size and special ids the model's config takes."""
    if name in BPE_VARIANTS:
        from transformers import AutoTokenizer

        variant = BPE_VARIANTS[name]
        M.hf_tokenizer(source / "models", variant, out, source / "conversion" / "base.py")
        tok = AutoTokenizer.from_pretrained(str(out))
        return {"vocab_size": len(tok), "bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    if name == "gemma3":
        from . import real_models

        return sentencepiece_model(real_models.require_gemma3(), out)
    raise KeyError(f"no tokenizer {name!r} (arch_matrix_models.TOKENIZERS)")


def cached_tokenizer(name: str, source: Path) -> Path:
    """:func:`tokenizer_folder` made once per sdist and transformers version, in the qformat cache
    (``arch-matrix/<versions>/<name>``: ``tok/`` and ``ids.json``); the BPE ones take minutes on
    a loaded machine (transformers' GGUF vocabulary import, twice)."""
    import os
    import shutil

    import transformers

    from . import llama_cpp_source as lcs

    root = L.cache_root() / "arch-matrix" / f"llama_cpp_python-{lcs.VERSION}-transformers-{transformers.__version__}"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / name
    with lcs.locked(root / f"{name}.lock"):
        if not (folder / "ids.json").is_file():
            tmp = root / f".{name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            ids = tokenizer_folder(name, source, tmp / "tok")
            (tmp / "ids.json").write_text(json.dumps(ids))
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
    return folder


# -- the model -------------------------------------------------------------------------------------


def tiny_model(spec: ArchSpec, tokenizer_dir: Path, ids: dict[str, Any], out: Path) -> Path:
    """``spec``'s transformers model with the tokenizer's vocabulary, seeded, saved in float32
    with the tokenizer files.  transformers initialises norms to a constant (1, or 0 for Gemma's
    ``1 + w``) and biases to 0; they get seeded noise (scale 0.1) so that each takes a
    value of its own, which a wrong shift, permutation or mapping would change."""
    import shutil

    import torch
    import transformers

    cfg_cls, model_cls = getattr(transformers, spec.config_class), getattr(transformers, spec.model_class)
    kw = spec.config_kwargs()
    kw.update(vocab_size=ids["vocab_size"], bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"))
    cfg = cfg_cls(**kw)
    torch.manual_seed(spec.seed)
    model = model_cls(cfg).float().eval()
    gen = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(str(out))
    for f in tokenizer_dir.iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)
    return out


# -- the checks ------------------------------------------------------------------------------------


def transformers_row(src: Path, folder: Path) -> dict[str, Any]:
    """The folder (``qformat convert src folder``) in transformers against transformers' own
    GGUF loader on ``src``: token ids of the prompt and the paragraph, greedy tokens and logits
    under the ``decode`` kernel policy (asserted bit-identical) and the default one (recorded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import qformat.transformers  # noqa: F401
    from qformat_torch import kernels
    from qformat_torch.nn import QLinear

    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name).eval()
    tok_ref = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids.tolist() == tok_ref(PROMPT, return_tensors="pt").input_ids.tolist()
    para = tok(M.PARAGRAPH, return_tensors="pt").input_ids
    assert para.tolist() == tok_ref(M.PARAGRAPH, return_tensors="pt").input_ids.tolist()
    gen = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok_ref.eos_token_id)
    with torch.no_grad():
        a = ref(para).logits
        g_ref = ref.generate(ids, **gen)
    old = kernels.get_kernel_policy()
    row: dict[str, Any] = {"prompt_ids": ids[0].tolist(), "paragraph_tokens": int(para.shape[1]),
                           "reference_greedy": g_ref[0, ids.shape[1]:].tolist()}
    try:
        for policy in dict.fromkeys(("decode", old)):
            kernels.set_kernel_policy(policy)
            model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
            with torch.no_grad():
                b = model(para).logits
                g = model.generate(ids, **gen)
            row[policy] = {"qlinear": sum(isinstance(m, QLinear) for m in model.modules()),
                           "logits_bit_identical": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()),
                           "greedy_equal": bool(torch.equal(g_ref, g))}
            assert torch.equal(g_ref, g), (policy, g_ref.tolist(), g.tolist())
            if policy == "decode":
                assert torch.equal(a, b), f"decode policy: max abs difference {(a - b).abs().max().item()}"
    finally:
        kernels.set_kernel_policy(old)
    return row


def gguf_identity(a: Path, b: Path) -> dict[str, Any]:
    """How far GGUF ``b`` is from ``a``: keys (name, type, value), tensors (name, type, shape,
    bytes), whole file; names of what differs (qformat's reader: gguf-py's takes seconds per
    large vocabulary)."""
    from qformat.convert.gguf_file import GGUFFile

    fa, fb = GGUFFile(str(a)), GGUFFile(str(b))
    ka = {k: (v.type, v.value) for k, v in fa.kv.items()}
    kb = {k: (v.type, v.value) for k, v in fb.kv.items()}
    keys_differing = sorted(k for k in set(ka) | set(kb) if ka.get(k) != kb.get(k))
    ta, tb = _tensor_list(a), _tensor_list(b)
    return {"byte_identical": a.read_bytes() == b.read_bytes(), "key_order_equal": list(ka) == list(kb),
            "keys_differing": keys_differing, "tensor_list_equal": [t[:3] for t in ta] == [t[:3] for t in tb],
            "tensors_differing": sorted({x[0] for x, y in zip(ta, tb) if x != y} | {t[0] for t in ta[len(tb):] + tb[len(ta):]})}


def _tensor_list(path: Path) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return [(t.name, t.tensor_type.name, tuple(int(s) for s in t.shape), bytes(t.data.tobytes())) for t in r.tensors]


def llama_cpp_row(src: Path, back: Path, paragraph: Path) -> dict[str, Any]:
    """``back`` (the folder's export) in llama.cpp against ``src``: no warning ``src`` does not
    draw, the same ``llama-tokenize`` ids and the same final perplexity line (asserted)."""
    want_ids, got_ids = L.tokenize(src, M.PARAGRAPH), L.tokenize(back, M.PARAGRAPH)
    assert got_ids == want_ids
    want, got = L.perplexity_line(src, paragraph, CTX), L.perplexity_line(back, paragraph, CTX)
    w_src, w_back = L.model_warnings(L.load_log(src, paragraph, CTX)), L.model_warnings(L.load_log(back, paragraph, CTX))
    assert w_back == w_src, "\n".join(w_back)
    assert got == want
    return {"tokens": len(got_ids), "original": want, "exported": got, "warnings": w_back}
