"""llama.cpp itself as the oracle for qformat's GGUF files (the tests marked ``llama_cpp``).

gguf-py checks that a GGUF file says what qformat meant; only llama.cpp can say that llama.cpp
reads it as meant.  This harness builds llama.cpp's tools from the source PyPI ships (the
llama-cpp-python sdist vendors llama.cpp; see ``tests/llama_cpp_source.py``) once per source and
build flags, into a cache folder, and wraps the few invocations the tests need:

- ``tokenize(model, text)``: the token ids ``llama-tokenize`` gives;
- ``perplexity(model, text_file, ctx)``: the final estimate of ``llama-perplexity``;
- ``load_log(model)`` / ``model_warnings(log)``: what llama.cpp printed while loading the model,
  and which of its warnings are about the model;
- ``convert_hf(folder, outtype, out)``: llama.cpp's own ``convert_hf_to_gguf.py`` (with the sdist's
  gguf-py), and ``quantize(src, dst, type)``: ``llama-quantize``, to make GGUF sources that
  llama.cpp itself produced.

Every invocation has a timeout and captured output; a failure raises ``LlamaCppError`` with the
command and the tail of what the tool printed.  Nothing from llama.cpp is part of qformat: the
source is downloaded at test time and only run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from . import llama_cpp_source

# The tools the tests run (llama-cli needs the server target, which this build leaves out).
TOOLS = ("llama-perplexity", "llama-tokenize", "llama-quantize", "llama-imatrix")

# cmake options, part of the cache key.  Why each:
# - GGML_NATIVE=OFF alone is not portable: it then turns on SSE4.2, AVX, AVX2, BMI2, FMA and F16C
#   (x86-64-v3), which fault on older or low-end x86-64 CPUs.  Switching those off too builds the
#   x86-64 baseline (SSE2), which runs on any x86-64 machine and takes the same code path on each,
#   so a perplexity printed here is the one printed anywhere for the same file.  Runtime CPU
#   detection (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS) would compile the CPU backend about ten
#   times over; the test models are tiny, so speed is not worth that build time.
# - BUILD_SHARED_LIBS=OFF: self-contained executables, so the finished build can be moved into
#   place (a shared build's RPATH would point into the temporary build folder).
# - No network (CURL, OpenSSL), no server, tests or examples: fewer targets to configure.
# - GGML_OPENMP=OFF: ggml's own thread pool, so no OpenMP runtime is needed; GGML_CCACHE=OFF so
#   the build does not depend on (or warn about) ccache.
#: The options every build takes, before and after its instruction-set ones (bench/llama_cpp_speed.py's
#: native build shares them).
BUILD_HEAD = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF")
BUILD_TAIL = ("-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")
BUILD_FLAGS = BUILD_HEAD + ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=OFF", "-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_BMI2=OFF",
                            "-DGGML_FMA=OFF", "-DGGML_F16C=OFF") + BUILD_TAIL

CONFIGURE_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3 * 3600  # about 14 minutes on 2 cores here; slow CI machines get headroom
TOOL_TIMEOUT_S = 600
THREADS = 2  # fixed, so every run of a tool does the same arithmetic

BUILD_RECORD = "build.json"  # written last into a finished build; its presence means complete


class LlamaCppError(RuntimeError):
    """A llama.cpp build or tool run failed; the message holds the command and its output tail."""


# -- where things live -----------------------------------------------------------------------------


def cache_root() -> Path:
    """``$QFORMAT_CACHE``, else ``~/.cache/qformat`` (the sdist is cached there too)."""
    return llama_cpp_source.cache_root()


def source_dir() -> Path:
    """The whole vendored llama.cpp tree (downloaded and extracted once, see
    ``tests/llama_cpp_source.py``; ``QFORMAT_LLAMA_CPP_SRC`` points at an extracted one)."""
    return llama_cpp_source.source_dir()


# -- running a command -----------------------------------------------------------------------------


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(cmd: Sequence[str | os.PathLike[str]], *, timeout: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with captured output and a timeout; raise ``LlamaCppError`` with the tail of
    stderr (and stdout) on failure, since llama.cpp explains its refusals only there."""
    argv = [str(c) for c in cmd]
    shown = " ".join(argv)
    try:
        # Bytes, decoded leniently: a tool may print a partial UTF-8 token piece.
        p = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode("utf-8", "replace")
        raise LlamaCppError(f"timed out after {timeout:.0f} s: {shown}\n--- stderr tail ---\n{_tail(err)}") from None
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode != 0:
        raise LlamaCppError(
            f"exit status {p.returncode}: {shown}\n--- stderr tail ---\n{_tail(err)}\n--- stdout tail ---\n{_tail(out, 10)}"
        )
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


# -- the build -------------------------------------------------------------------------------------


def _source_id(src: Path) -> str:
    """``llama_cpp_python-<version>`` for a folder extracted from that sdist (the same source
    wherever it was extracted), else a hash of the folder's path."""
    name = src.resolve().parent.parent.name
    if re.fullmatch(r"llama_cpp_python-[0-9][0-9A-Za-z.]*", name):
        return name
    return "src-" + hashlib.sha256(str(src.resolve()).encode()).hexdigest()[:12]


def build_dir(src: Path | None = None, flags: Sequence[str] = BUILD_FLAGS, tools: Sequence[str] = TOOLS) -> Path:
    """The finished build's folder for this source and these flags (it may not exist yet).

    ``flags`` and ``tools`` (default :data:`BUILD_FLAGS`, :data:`TOOLS`: the tests' build) are
    the cache key; another set (the bench's native build) gets its own folder."""
    src = src or source_dir()
    key = hashlib.sha256(json.dumps({"flags": tuple(flags), "tools": tuple(tools)}).encode()).hexdigest()[:12]
    return cache_root() / "llama-cpp-build" / f"{_source_id(src)}-{key}"


def build_record(src: Path | None = None, flags: Sequence[str] = BUILD_FLAGS, tools: Sequence[str] = TOOLS) -> dict:
    """What the build recorded: flags, jobs, seconds, compiler (for docs/llama-cpp.md's numbers)."""
    return json.loads((build_dir(src, flags, tools) / BUILD_RECORD).read_text())


def tools_dir(src: Path | None = None, jobs: int | None = None, flags: Sequence[str] = BUILD_FLAGS,
              tools: Sequence[str] = TOOLS, nice: int | None = None) -> Path:
    """The folder holding ``tools`` (default ``TOOLS``), built with ``flags`` (default
    ``BUILD_FLAGS``) now if no finished build exists; ``nice``: run the compiler under
    ``nice -n NICE`` (not part of the cache key).

    The build runs in a temporary folder next to the final one and is renamed into place only
    after every tool exists and the record is written, so an interrupted or failed build leaves
    nothing that looks complete (its leftovers are removed by the next build)."""
    src = src or source_dir()
    final = build_dir(src, flags, tools)
    if (final / BUILD_RECORD).is_file():
        return final / "bin"
    with llama_cpp_source.locked(final.parent / (final.name + ".lock")):
        if (final / BUILD_RECORD).is_file():  # another worker finished while this one waited
            return final / "bin"
        for stale in final.parent.glob(final.name + ".tmp-*"):  # only the lock holder builds
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # no record: not a finished build
            shutil.rmtree(final)
        staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=final.name + ".tmp-"))
        try:
            _build(src, staging, jobs or os.cpu_count() or 1, tuple(flags), tuple(tools), nice)
            os.rename(staging / "out", final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final / "bin"


def _build(src: Path, staging: Path, jobs: int, flags: tuple[str, ...] = BUILD_FLAGS, tools: tuple[str, ...] = TOOLS,
           nice: int | None = None) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppError("cmake is not installed; the llama_cpp tests build llama.cpp with it")
    build, out = staging / "build", staging / "out"
    t0 = time.monotonic()
    prefix = ["nice", "-n", str(nice)] if nice is not None and shutil.which("nice") else []
    run([*prefix, cmake, "-S", src, "-B", build, *flags], timeout=CONFIGURE_TIMEOUT_S)
    t1 = time.monotonic()
    run([*prefix, cmake, "--build", build, "--target", *tools, "-j", str(jobs)], timeout=BUILD_TIMEOUT_S)
    t2 = time.monotonic()
    (out / "bin").mkdir(parents=True)
    for tool in tools:
        shutil.copy2(build / "bin" / tool, out / "bin" / tool)
    cxx = run([os.environ.get("CXX", "c++"), "--version"], timeout=60).stdout.splitlines()[0]
    record = {"source": str(src), "flags": flags, "tools": tools, "jobs": jobs,
              "configure_s": round(t1 - t0, 1), "build_s": round(t2 - t1, 1), "compiler": cxx}
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=1) + "\n")


def tool(name: str) -> Path:
    return tools_dir() / name


# -- the tools -------------------------------------------------------------------------------------


def tokenize(model: Path, text: str) -> list[int]:
    """The ids llama.cpp gives ``text``, special tokens added as the model's GGUF says (BOS when
    ``add_bos_token`` is true or llama.cpp's default for the vocabulary is to add it), and text
    that spells a special token kept as text (``--no-parse-special``): what a user's prompt gets.

    The text goes through a file, read verbatim (``--no-escape``: a backslash stays a backslash)."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "text.txt"
        f.write_bytes(text.encode("utf-8"))
        p = run([tool("llama-tokenize"), "-m", model, "-f", f, "--ids", "--no-escape", "--no-parse-special",
                 "--log-colors", "off"], timeout=TOOL_TIMEOUT_S)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    if len(lines) != 1:
        raise LlamaCppError(f"llama-tokenize printed no single id list:\n{_tail(p.stdout)}\n{_tail(p.stderr)}")
    return json.loads(lines[0])


_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf) \+/- ([0-9.]+|nan|inf)")


@functools.lru_cache(maxsize=64)
def _perplexity_run(model: Path, mtime_ns: int, text_file: Path, ctx: int) -> tuple[float, str, tuple[dict, ...]]:
    """One ``llama-perplexity`` run: (final estimate, its printed text, its log entries).

    ``--log-jsonl`` prints every log entry as one JSON object with its level (so a warning is
    told by its level, not by its wording).  ``-c ctx -b ctx``: one sequence per chunk; the tool
    needs at least ``2 * ctx`` tokens and scores the second half of each chunk."""
    p = run([tool("llama-perplexity"), "-m", model, "-f", text_file, "-c", str(ctx), "-b", str(ctx),
             "-t", str(THREADS), "--no-warmup", "-lv", "4", "--log-jsonl", "--log-colors", "off"], timeout=TOOL_TIMEOUT_S)
    entries = []
    for line in p.stdout.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict) and obj.get("type") == "log":
                entries.append(obj)
    text = "".join(e["msg"] for e in entries)
    m = _FINAL.search(text)
    if m is None:
        raise LlamaCppError(f"llama-perplexity printed no final estimate:\n{_tail(text)}\n{_tail(p.stderr)}")
    return float(m.group(1)), m.group(0), tuple(entries)


def _ppl_run(model: Path, text_file: Path, ctx: int) -> tuple[float, str, tuple[dict, ...]]:
    model = Path(model).resolve()
    return _perplexity_run(model, model.stat().st_mtime_ns, Path(text_file).resolve(), ctx)


def perplexity(model: Path, text_file: Path, ctx: int = 32) -> float:
    """llama.cpp's perplexity of the text in ``text_file`` (at least ``2 * ctx`` tokens)."""
    return _ppl_run(model, text_file, ctx)[0]


def perplexity_line(model: Path, text_file: Path, ctx: int = 32) -> str:
    """The tool's own ``Final estimate: PPL = ... +/- ...`` text, to compare as printed."""
    return _ppl_run(model, text_file, ctx)[1]


def load_log(model: Path, text_file: Path, ctx: int = 32) -> list[dict]:
    """The log entries (``{"level": ..., "msg": ...}``) of llama.cpp loading ``model`` and
    creating a context for it, from the same run as ``perplexity`` (the model is loaded fully,
    weights included, so a warning about any tensor shows here)."""
    return list(_ppl_run(model, text_file, ctx)[2])


# Warnings llama.cpp prints that are about the run's settings, not the model file (patterns on
# the message), each with why.  Any other warning counts as about the model.
NOT_ABOUT_THE_MODEL = (
    # llama_context: the requested context is longer than the model's training context (a
    # vocabulary-only load, as llama-tokenize does, has a training context of 0).
    re.compile(r"n_ctx_seq \(\d+\) > n_ctx_train \(\d+\) -- possible training context overflow"),
    # llama-perplexity's own remark on the same.
    re.compile(r"model was trained on only \d+ context tokens"),
)


def warnings(log: list[dict]) -> list[str]:
    """Every warning and error entry of a log, as text."""
    return [e["msg"].rstrip() for e in log if e.get("level") in ("warn", "error")]


def model_warnings(log: list[dict]) -> list[str]:
    """The warnings of ``warnings(log)`` that are about the model (all but ``NOT_ABOUT_THE_MODEL``)."""
    return [w for w in warnings(log) if not any(p.search(w) for p in NOT_ABOUT_THE_MODEL)]


def quantize(src: Path, dst: Path, qtype: str, *options: str) -> Path:
    """``llama-quantize [options] src dst TYPE`` (e.g. Q4_0, Q8_0, Q4_K_M; options such as
    ``--pure``): a GGUF llama.cpp quantized."""
    run([tool("llama-quantize"), *options, src, dst, qtype, str(THREADS)], timeout=TOOL_TIMEOUT_S)
    return Path(dst)


def convert_hf(folder: Path, outtype: str, out: Path) -> Path:
    """llama.cpp's own ``convert_hf_to_gguf.py`` on a Hugging Face folder (``outtype`` f32, f16,
    bf16, q8_0), run with the sdist's gguf-py first on ``PYTHONPATH`` so the converter and its
    gguf-py are the same version (the venv's gguf package may be another)."""
    src = source_dir()
    # The converter imports sentencepiece before it looks for a tokenizer.model (there is none
    # here), so it fails without it even for a BPE tokenizer: say so plainly.
    if importlib.util.find_spec("sentencepiece") is None:
        raise LlamaCppError("llama.cpp's convert_hf_to_gguf.py needs the sentencepiece package (pip install sentencepiece)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src / "gguf-py"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; nothing to fetch
    run([sys.executable, src / "convert_hf_to_gguf.py", folder, "--outtype", outtype, "--outfile", out],
        timeout=TOOL_TIMEOUT_S, env=env)
    return Path(out)
