"""qformat's GGUF files run in llama.cpp itself (marker ``llama_cpp``, deselected by default; run
with ``./test.sh -m llama_cpp``; docs/llama-cpp.md says what it downloads
and builds).

- Round trip: GGUF files llama.cpp made (its converter: F16; ``llama-quantize``: Q4_0, Q8_0,
  Q4_K_M) go through ``qformat convert`` and ``qformat export --to gguf`` and come back byte for
  byte, and llama.cpp prints the same perplexity for both.
- A qformat-quantized export (``qformat quantize --scheme int`` 4 and 8 bits, g32, float16
  scales, then ``qformat export --to gguf``) of a tiny Llama 3 and Qwen2: llama.cpp loads it
  with no warning about the model, tokenizes the test paragraph exactly as the folder's
  transformers tokenizer does, and its perplexity is recorded next to the F16 source's.
- Two negative controls show that the checks can fail: a GGUF without ``tokenizer.ggml.pre``
  draws llama.cpp's warning, and q/k rows left in Hugging Face order break the perplexity bound.

The commands run as a user runs them (``qformat`` in a subprocess).  Models, GGUF sources and
the llama.cpp build are made once per session and shared by pytest-xdist workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from . import llama_cpp as L
from . import llama_cpp_models as M
from . import llama_cpp_source

pytestmark = pytest.mark.llama_cpp

CTX = 32  # llama-perplexity context: the paragraph (117 Llama 3 tokens) gives 3 chunks
SOURCE_TYPES = ("F16", "Q4_0", "Q8_0", "Q4_K_M")
# qformat quantize settings of the export test: GGUF keeps one float16 scale per 32 values, so
# int4 / int8 g32 with float16 scales export exactly as Q4_0 / Q8_0.
SCHEMES = {"int4": ["--bits", "4"], "int8": ["--bits", "8"]}
# The bound on the quantized export's perplexity, as a multiple of the F16 source's.  Nothing
# guarantees how much 4-bit rounding costs, but the tiny model reaches a perplexity near 1.7 on
# the paragraph it learnt (measured: int4 and int8 within 0.2% of F16), while a file llama.cpp
# reads differently from what qformat meant, e.g. the wrong pre-tokenizer (12.4 here) or q/k rows
# without the rotary permutation (see test_perplexity_bound_fails_for_unpermuted_qk), is far
# above twice that.  MAX_SOURCE_PPL: the F16 source itself must show the model learnt the text,
# else the bound would have no teeth (a random model scores about the vocabulary size).
PPL_FACTOR = 2.0
MAX_SOURCE_PPL = 4.0
VARIANTS = {"llama3": M.LLAMA3, "qwen2": M.QWEN2}


# -- session-wide artefacts, made once even under pytest-xdist ---------------------------------------


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the workers' common parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(folder)`` once per session (the first worker makes it, the others wait for it);
    a ``.done`` file marks a finished folder, so a failed ``make`` is redone, not reused."""
    root = _shared_root(tmp_path_factory) / "llama_cpp_artefacts"
    root.mkdir(exist_ok=True)
    folder = root / name
    with llama_cpp_source.locked(root / f"{name}.lock"):
        if not (folder / ".done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / ".done").touch()
    return folder


@pytest.fixture(scope="session")
def source() -> Path:
    """The llama.cpp tree (skipped when it cannot be downloaded, failed under CI's
    ``QFORMAT_REQUIRE_LLAMA_CPP=1``)."""
    return llama_cpp_source.require()


@pytest.fixture(scope="session")
def tools(source: Path) -> Path:
    """The built tools (minutes the first time on this machine, then cached)."""
    return L.tools_dir()


@pytest.fixture(scope="session")
def paragraph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _once(tmp_path_factory, "paragraph", lambda d: (d / "paragraph.txt").write_text(M.PARAGRAPH, encoding="utf-8")) / "paragraph.txt"


def _hf_folder(tmp_path_factory: pytest.TempPathFactory, source: Path, variant: M.Variant) -> Path:
    def make(d: Path) -> None:
        tok = M.hf_tokenizer(source / "models", variant, d / "tokenizer", source / "conversion" / "base.py")
        M.tiny_model(variant, tok, d / "model", ctx=CTX)

    return _once(tmp_path_factory, f"hf-{variant.name}", make) / "model"


def _f16_source(tmp_path_factory: pytest.TempPathFactory, source: Path, variant: M.Variant, tools: Path) -> Path:
    folder = _hf_folder(tmp_path_factory, source, variant)
    return _once(tmp_path_factory, f"gguf-{variant.name}-F16",
                 lambda d: L.convert_hf(folder, "f16", d / "model-F16.gguf")) / "model-F16.gguf"


@pytest.fixture(scope="session")
def llama_sources(tmp_path_factory: pytest.TempPathFactory, source: Path, tools: Path) -> dict[str, Path]:
    """The tiny Llama 3 as llama.cpp makes it: its converter's F16, llama-quantize's others."""
    f16 = _f16_source(tmp_path_factory, source, M.LLAMA3, tools)
    out = {"F16": f16}
    for t in SOURCE_TYPES[1:]:
        out[t] = _once(tmp_path_factory, f"gguf-llama3-{t}", lambda d, t=t: L.quantize(f16, d / f"model-{t}.gguf", t)) / f"model-{t}.gguf"
    return out


def _qformat(*args: str | Path, timeout: float = 900) -> str:
    """The ``qformat`` command line, in a subprocess as a user runs it."""
    cmd = [sys.executable, "-m", "qformat", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert p.returncode == 0, f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


# -- results ---------------------------------------------------------------------------------------


def _results_path() -> Path:
    """``QFORMAT_LLAMA_CPP_RESULTS``, else ``llama_cpp_results.json`` in the cache folder."""
    env = os.environ.get("QFORMAT_LLAMA_CPP_RESULTS")
    return Path(env) if env else L.cache_root() / "llama_cpp_results.json"


def _record(key: str, row: dict) -> None:
    """Merge ``row`` under ``key`` into the results file (locked: xdist workers write it too)."""
    path = _results_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with llama_cpp_source.locked(path.with_name(path.name + ".lock")):
        data = json.loads(path.read_text()) if path.is_file() else {}
        with contextlib.suppress(OSError, ValueError):
            data["build"] = L.build_record()
        data.setdefault("rows", {})[key] = row
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    print(f"\n{key}: {json.dumps(row)}")


# -- the build ----------------------------------------------------------------------------------------


def test_build_uses_only_baseline_x86_64(tools):
    """llama-perplexity (statically linked: all of ggml's CPU code the tools run) holds no AVX,
    AVX-512, FMA or F16C instruction (what GGML_NATIVE=OFF alone emits: about 20,000 of them in
    ggml's CPU backend here), so the build runs on any x86-64 CPU.  Checked on the disassembly,
    since the flags' effect depends on ggml's CMake defaults."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    text = L.run([objdump, "-d", "--no-show-raw-insn", tools / "llama-perplexity"], timeout=600).stdout
    assert "vec_dot" in text or "ggml_" in text  # the disassembly has ggml's code in it
    hits = re.findall(r"%[yz]mm\d+|\bvfn?m(?:add|sub)\w*|\bvcvtph2ps\b|\bvcvtps2ph\b", text)
    assert sorted(set(hits))[:8] == []


# -- a. round trip of llama.cpp's own files ------------------------------------------------------------


@pytest.mark.parametrize("qtype", SOURCE_TYPES)
def test_round_trip_is_byte_identical_and_same_perplexity(qtype, llama_sources, paragraph, tmp_path):
    src = llama_sources[qtype]
    mid, back = tmp_path / "mid.safetensors", tmp_path / "back.gguf"
    _qformat("convert", src, mid)
    _qformat("export", mid, back, "--to", "gguf")
    assert back.read_bytes() == src.read_bytes(), f"{qtype}: the exported GGUF differs from llama.cpp's"
    want, got = L.perplexity_line(src, paragraph, CTX), L.perplexity_line(back, paragraph, CTX)
    assert got == want
    assert L.model_warnings(L.load_log(back, paragraph, CTX)) == []
    _record(f"round trip llama3 {qtype}", {"source": want, "exported": got, "bytes": src.stat().st_size})


# -- b. a qformat-quantized export ---------------------------------------------------------------------


@pytest.fixture(scope="session", params=sorted(VARIANTS))
def variant(request) -> M.Variant:
    return VARIANTS[request.param]


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_quantized_export_runs_in_llama_cpp(scheme, variant, tmp_path_factory, source, tools, paragraph, tmp_path):
    from transformers import AutoTokenizer

    folder = _hf_folder(tmp_path_factory, source, variant)
    f16 = _f16_source(tmp_path_factory, source, variant, tools)
    quantized, gguf_path = tmp_path / "quantized", tmp_path / f"{variant.name}-{scheme}.gguf"
    _qformat("quantize", folder, quantized, "--scheme", "int", *SCHEMES[scheme], "--group-size", "32",
             "--scale-dtype", "float16", "--quiet")
    _qformat("export", quantized, gguf_path, "--to", "gguf")

    # Loads with no warning about the model: none but what the vocabulary itself draws, which
    # llama.cpp's own conversion of the same folder gets too (all warnings in the message).
    log = L.load_log(gguf_path, paragraph, CTX)
    found, theirs = L.model_warnings(log), L.model_warnings(L.load_log(f16, paragraph, CTX))
    shown = "llama.cpp warned:\n" + "\n".join(L.warnings(log))
    assert found == theirs, shown
    assert all(any(v in w for v in variant.vocab_warnings) for w in found), shown

    # Tokenizes as transformers does, each with its defaults: the tokenizer adds what its
    # template says, llama.cpp what the GGUF says (add_bos_token) and keeps text as text.
    want = AutoTokenizer.from_pretrained(str(quantized))(M.PARAGRAPH)["input_ids"]
    got = L.tokenize(gguf_path, M.PARAGRAPH)
    assert got == want, _first_difference(got, want)
    assert L.tokenize(f16, M.PARAGRAPH) == want  # llama.cpp's own conversion agrees too

    ppl, ppl_src = L.perplexity(gguf_path, paragraph, CTX), L.perplexity(f16, paragraph, CTX)
    _record(f"qformat export {variant.name} {scheme}", {
        "perplexity": ppl, "f16_source_perplexity": ppl_src, "ratio": round(ppl / ppl_src, 4),
        "tokens": len(want), "ctx": CTX, "warnings": L.warnings(log), "gguf_MB": round(gguf_path.stat().st_size / 1e6, 1),
    })
    assert math.isfinite(ppl_src) and ppl_src < MAX_SOURCE_PPL, f"the F16 source's perplexity {ppl_src}: the model did not learn the text"
    assert math.isfinite(ppl) and ppl <= PPL_FACTOR * ppl_src, f"perplexity {ppl} against the F16 source's {ppl_src}"


def _first_difference(got: list[int], want: list[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"llama.cpp and transformers differ at token {i}: {got[i:i + 8]} vs {want[i:i + 8]} ({len(got)} vs {len(want)} tokens)"


# -- negative controls: the checks above can fail ------------------------------------------------------


def test_warning_check_sees_a_missing_pretokenizer(llama_sources, paragraph, tmp_path):
    """Without ``tokenizer.ggml.pre`` llama.cpp says GENERATION QUALITY WILL BE DEGRADED, and
    ``model_warnings`` reports it (the file is rewritten by gguf-py's gguf_new_metadata)."""
    dst = tmp_path / "no-pre.gguf"
    L.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--remove-metadata", "tokenizer.ggml.pre",
           "--force", llama_sources["Q8_0"], dst], timeout=600)
    found = L.model_warnings(L.load_log(dst, paragraph, CTX))
    _record("negative control llama3 Q8_0 without tokenizer.ggml.pre", {
        "perplexity": L.perplexity(dst, paragraph, CTX), "source_perplexity": L.perplexity(llama_sources["Q8_0"], paragraph, CTX),
        "warnings": found})
    assert any("missing pre-tokenizer type" in w for w in found), found
    assert any("GENERATION QUALITY WILL BE DEGRADED" in w for w in found), found


def test_perplexity_bound_fails_for_unpermuted_qk(llama_sources, paragraph, tmp_path):
    """The Q8_0 source with every attn_q / attn_k row put back in Hugging Face order (what an
    exporter that forgot llama.cpp's rotary permutation writes): its perplexity is above the
    bound the export test allows."""
    dst = tmp_path / "unpermuted.gguf"
    unpermute_qk(llama_sources["Q8_0"], dst)
    ppl, ppl_src = L.perplexity(dst, paragraph, CTX), L.perplexity(llama_sources["Q8_0"], paragraph, CTX)
    _record("negative control llama3 Q8_0 q/k unpermuted", {"perplexity": ppl, "source_perplexity": ppl_src})
    assert not ppl <= PPL_FACTOR * ppl_src


def unpermute_qk(src: Path, dst: Path) -> None:
    """Copy ``src`` with the rows of each ``blk.*.attn_q`` / ``attn_k`` weight reordered within
    each head from llama.cpp's order back to Hugging Face's.  convert_hf_to_gguf stores row
    ``h*d + 2*i + j`` of a head of ``d`` rows from Hugging Face row ``h*d + j*d/2 + i``; a row is
    a whole number of blocks in every ggml type, so this moves bytes, nothing is re-encoded."""
    from gguf import GGUFReader

    shutil.copyfile(src, dst)
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    heads = {"attn_q": r.fields[f"{arch}.attention.head_count"].contents(),
             "attn_k": r.fields[f"{arch}.attention.head_count_kv"].contents()}
    data = np.memmap(dst, dtype=np.uint8, mode="r+")
    for t in r.tensors:
        m = re.fullmatch(r"blk\.\d+\.(attn_q|attn_k)\.weight", t.name)
        if not m:
            continue
        rows = int(t.shape[1])
        d = rows // int(heads[m.group(1)])
        k = np.arange(rows)
        h, rest = np.divmod(k, d)
        i, j = np.divmod(rest, 2)
        hf_row = h * d + j * (d // 2) + i  # llama.cpp row k came from this Hugging Face row
        block = data[t.data_offset:t.data_offset + int(t.n_bytes)].reshape(rows, -1)
        out = np.empty_like(block)
        out[hf_row] = block
        block[...] = out
    data.flush()
    del data


# -- c. a llama.cpp file as a Hugging Face folder (qformat convert model.gguf out/) ---------------------


@pytest.mark.parametrize("qtype", SOURCE_TYPES)
def test_hf_layout_of_llama_cpp_files_runs_like_transformers_gguf_loader(qtype, llama_sources, tmp_path):
    """The files llama.cpp made (its converter's F16, llama-quantize's Q4_0, Q8_0 and the Q4_K_M
    mix of Q4_K / Q6_K), converted with one command into a Hugging Face folder: transformers'
    from_pretrained of the folder (weights packed) gives logits bit-identical to its own GGUF
    loader's (which dequantizes everything), the same greedy tokens and the same token ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import qformat.transformers  # noqa: F401
    from qformat_torch.nn import QLinear

    from qformat_torch import kernels

    src = llama_sources[qtype]
    out = tmp_path / "hf"
    _qformat("convert", "--quiet", src, out)
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    tok_ref = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok(M.PARAGRAPH, return_tensors="pt").input_ids
    assert ids.tolist() == tok_ref(M.PARAGRAPH, return_tensors="pt").input_ids.tolist()
    prompt = ids[:, :12]
    gen = dict(max_new_tokens=16, do_sample=False, pad_token_id=tok_ref.eos_token_id)
    with torch.no_grad():
        a = ref(ids).logits
    g_ref = ref.generate(prompt, **gen)
    # bit-identical logits under the "decode" kernel policy (weights decoded, then torch's matmul,
    # as transformers' own GGUF loader does); the default policy's fused kernels sum in another
    # order (about 1e-5 apart), recorded, with the same greedy tokens
    old = kernels.get_kernel_policy()
    row: dict = {"gguf_MB": round(src.stat().st_size / 1e6, 2)}
    try:
        for policy in ("decode", old):
            kernels.set_kernel_policy(policy)
            model = AutoModelForCausalLM.from_pretrained(str(out))
            n_packed = sum(isinstance(m, QLinear) for m in model.modules())
            assert (n_packed > 0) == (qtype != "F16")
            with torch.no_grad():
                b = model(ids).logits
            g = model.generate(prompt, **gen)
            assert torch.equal(g_ref, g)
            row[policy] = {"qlinear": n_packed, "logits_bit_identical": bool(torch.equal(a, b)),
                           "max_abs_diff": float((a - b).abs().max()), "greedy_tokens": g[0, 12:].tolist()}
            if policy == "decode":
                assert torch.equal(a, b), f"max abs difference {(a - b).abs().max().item()}"
    finally:
        kernels.set_kernel_policy(old)
    _record(f"hf layout llama3 {qtype}", row)
