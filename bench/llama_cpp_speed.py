"""Section ``llama_cpp_speed``: llama.cpp's own CPU speed on the ``generate`` section's weights
(issue 23's anchor row).

``python -m bench --only llama_cpp_speed [--quick]``; ``python -m bench.llama_cpp_speed`` is the
same.  Rows of a run on a 2-core machine (the one of results_generate_avx512.json):
bench/results_llama_cpp_speed.json.

The build.  llama.cpp's tools from the source PyPI ships (the llama-cpp-python sdist;
``tests/llama_cpp_source.py`` fetches and extracts it, ``tests/llama_cpp.py`` builds it into a
cache folder keyed by the source, the cmake flags and the tools), built here for speed, not
portability: :data:`FLAGS` are the tests' build with ``GGML_NATIVE=ON`` instead of the x86-64
baseline, i.e. ``-march=native`` (AVX-512, AVX512-VNNI, AVX512-BF16 where the CPU has them),
still static, ggml's own thread pool (no OpenMP), no curl, server, tests or examples; tools
:data:`TOOLS`.  AMX is switched off (``-mno-amx-*``): the Firecracker VM of those figures lists ``amx_tile``/``amx_int8`` in /proc/cpuinfo, but its tile instructions fault
(SIGILL at ``tilezero`` in ggml's AMX matmul, which ``-march=native`` puts in for Q4_0, Q8_0 and
the K-quants), and qformat's kernels do not use AMX either.  It is compiled under
``nice -n 19`` with :data:`JOBS` jobs (other work on the machine keeps its CPUs; about 4 minutes
on 2 idle cores, longer on busy ones), once: a full run builds it when it is
missing, ``--quick`` (the test suite's smoke run) never builds, it measures only where a finished
build exists.  Nothing of llama.cpp is bundled with qformat.  A run that cannot build or run
llama.cpp (no source, no cmake or compiler, a failing tool) records one row named
``llama.cpp (skipped)`` with the reason and prints it; it does not fail the benchmark.

The weights.  ``bench/generate.py``'s ``build(FULL)`` (seeded random Llama, hidden 1024, 20
layers, intermediate 2816, vocabulary 32000, untied head; bf16), written with
``save_pretrained``, next to a small byte-level BPE tokenizer (``tests/gguf_models.tokenizer``,
320 tokens; the exporter pads the GGUF vocabulary to the model's 32000 with llama.cpp's unused
``[PAD<i>]`` tokens).  llama-bench feeds token ids, never text, so the vocabulary only has to load.
The GGUF files are made by qformat itself, the route a qformat user takes, all bit-exact (the
exporter writes 1-D BF16 tensors, the RMS norm weights, as F32 as llama.cpp's converter does:
llama.cpp aborted on a BF16 norm weight):

- ``BF16``: ``qformat export --to gguf`` of the bf16 folder, every tensor as itself: the baseline
  (the ``generate`` section's baseline is bf16 too);
- ``Q8_0``, ``Q4_0``, ``Q4_K_M``: ``qformat quantize --preset P`` (llama-quantize's mix of types
  for this model: token embedding and head included, e.g. Q4_0 with a Q6_K head; the
  ``gguf_quantize`` section checks these bits against llama-quantize's), then ``export``;
- ``Q4_0 (qformat int4 g32, bf16 embeddings and head)``: the ``generate`` section's ``int4 g32,
  fp16 scales (older files)`` variant, its scheme and parameters through the command line
  (``qformat quantize --scheme int --bits 4 --group-size 32 --scale-dtype float16``: the default
  selection rule keeps the embedding and ``lm_head`` bf16), which exports exactly as Q4_0: the
  tensors qformat's own kernels run in that section, run by llama.cpp;
- ``F16``: ``llama-quantize BF16-file F16`` (qformat's exporter keeps each tensor's dtype, so
  llama.cpp's own tool casts the bf16 weights; F16 is llama.cpp's usual unquantized type).

Why not llama.cpp's ``convert_hf_to_gguf.py`` + ``llama-quantize``: the converter needs the
``sentencepiece`` package and a tokenizer it recognises, and the exporter's files are checked
bit-exact against qformat's tensors, so every row here runs the same values as ``generate``.

The measurement.  One ``llama-bench -m FILE -t 2 -p 8 -n 16 -r 3 -o json`` per file (``--quick``:
``-n 4 -r 1``): ``tg16`` (16 tokens generated one at a time, from an empty context) gives
``tokens_per_s`` and ``ms`` per token (the ``generate`` section's "1 token" figure; it generates
after an 8-token prompt), ``pp8`` (one batch of 8 tokens) gives ``prompt8_tokens_per_s`` (its
"8-token prompt" figure); the median of the repetitions after llama-bench's warm-up run, as
``generate`` takes medians (llama-bench's mean, standard deviation and samples are kept too).
``x_vs`` / ``prompt8_x_vs``: over llama.cpp's own BF16 row of the same run; BF16 is measured first
and again last (``BF16 (again)``): on a machine shared with other jobs, 2 threads on 2 cores
stall at ggml's barriers whenever one is descheduled (a few seconds of another job took pp8 from
300 to 4 tokens/s here), so each run also records ``other_load``, the cores' worth of CPU time
other processes used while it ran (from /proc/stat, less llama-bench's own), and a run where that
exceeds :data:`MAX_OTHER_LOAD` is repeated once after a pause, the quieter of the two kept
(``runs_other_load``: each run's figure; not in ``--quick``, whose runs are too short to tell).
Each row also holds the file's size and tensor types, the build's flags and seconds, and
llama.cpp's commit as llama-bench reports it.  Threads: 2 (``QFORMAT_BENCH_THREADS`` overrides).
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SECTION = "llama_cpp_speed"
ROOT = Path(__file__).resolve().parents[1]

#: cmake options of the speed build (with :data:`TOOLS`, the build cache's key).  The tests'
#: build (tests/llama_cpp.py BUILD_FLAGS) with GGML_NATIVE=ON and without its switches that turn
#: the SIMD extensions off.
FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    # the tests' tail (tests/llama_cpp.py BUILD_TAIL; test_bench_smoke checks they agree)
    "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    # no AMX (see the module docstring): explicit -mno-* win over -march=native in either order
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
TOOLS = ("llama-bench", "llama-quantize")
JOBS = 2
NICE = 19
#: --preset of each quantized row, in order (the baseline BF16 and F16 come first).
PRESETS = ("Q8_0", "Q4_0", "Q4_K_M")
#: The generate section's variant that exports as Q4_0 (its qformat quantize arguments).
GENERATE_Q4_0 = ("Q4_0 (qformat int4 g32, bf16 embeddings and head)",
                 ["--scheme", "int", "--bits", "4", "--group-size", "32", "--scale-dtype", "float16"])
BASELINE = "BF16"
#: Other jobs' share of the CPUs (cores) during a llama-bench run above which it is run once more.
MAX_OTHER_LOAD = 0.1
RETRY_PAUSE_S = 10
TIMEOUT_S = 900


class Skip(RuntimeError):
    """llama.cpp cannot be built or run here; the message says why."""


def _lc() -> Any:
    """tests/llama_cpp.py (the build machinery the llama_cpp tests use)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from tests import llama_cpp as L
    except ImportError as e:  # a copy of bench/ without the repository's tests/
        raise Skip(f"tests/llama_cpp.py (the llama.cpp build harness) cannot be imported: {e}") from None
    return L


def build_tools(section: str, flags: tuple[str, ...], tools: tuple[str, ...], build: bool, what: str, minutes: str) -> tuple[Path, dict[str, Any]]:
    """(folder of ``tools`` built with ``flags`` by tests/llama_cpp.py, the build's record),
    building them (niced) when ``build`` and missing; :class:`Skip` saying why otherwise.  The
    one builder of every bench section that runs llama.cpp's tools."""
    L = _lc()
    S = L.llama_cpp_source
    if not build and not (os.environ.get("QFORMAT_LLAMA_CPP_SRC") or os.environ.get("QFORMAT_LLAMA_CPP_SDIST")
                          or (S.cache_root() / S.SDIST_NAME).is_file()):
        raise Skip(f"the llama.cpp source is not downloaded (and --quick downloads nothing); a full run fetches and builds it: "
                   f"python -m bench --only {section}")
    try:
        src = L.source_dir()
        final = L.build_dir(src, flags, tools)
        if not (final / L.BUILD_RECORD).is_file():
            if not build:
                raise Skip(f"{what} build is not there ({final}); a full run builds it: python -m bench --only {section}")
            print(f"[{section}] building {what} into {final}: nice -n {NICE}, {JOBS} jobs, {minutes} minutes on 2 cores ...", flush=True)
        d = L.tools_dir(src, JOBS, flags, tools, nice=NICE)
        return d, L.build_record(src, flags, tools) | {"sdist": f"{S.PACKAGE} {S.VERSION}"}
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001 - no source, no cmake, a failed build: the section says so
        raise Skip(f"{what} could not be built: {type(e).__name__}: {e}") from None


def tools_dir(build: bool) -> tuple[Path, dict[str, Any]]:
    """(folder of :data:`TOOLS`, the build's record), building it (niced) when ``build`` and missing."""
    return build_tools(SECTION, FLAGS, TOOLS, build, "llama.cpp's speed", "10-15")


def _run(cmd: list[Any], what: str, timeout: float = TIMEOUT_S, cwd: Path | None = None) -> str:
    """``cmd``'s stdout, through the tests' runner (timeout, output tails on failure); a failure
    is a :class:`Skip` naming ``what``."""
    L = _lc()
    try:
        return str(L.run(cmd, timeout=timeout, cwd=cwd).stdout)
    except (OSError, L.LlamaCppError) as e:
        raise Skip(f"{what} failed: {e}") from None


def _qformat(*args: Any) -> None:
    _run([sys.executable, "-m", "qformat", *args, "--quiet"], f"qformat {args[0]}", cwd=ROOT)


def make_ggufs(base: Path, quick: bool, tools: Path) -> dict[str, tuple[Path, str]]:
    """Row name -> (GGUF file, how it was made), baseline first (see the module docstring)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.gguf_models import tokenizer

    from .generate import FULL, QUICK, build

    # --quick: generate's tiny model with a vocabulary that holds the tokenizer's 320 tokens
    cfg = dict(QUICK, vocab_size=512) if quick else FULL
    hf = base / "hf-bf16"
    model = build(cfg)
    model.save_pretrained(hf)
    del model
    tokenizer(hf)
    out: dict[str, tuple[Path, str]] = {}
    pre = ("--gguf-pre", "default")  # the trained tokenizer has no llama.cpp pre-tokenizer name
    bf16 = base / "model-BF16.gguf"
    _qformat("export", hf, bf16, "--to", "gguf", *pre)
    out[BASELINE] = (bf16, "qformat export --to gguf (bf16 folder)")
    f16 = base / "model-F16.gguf"
    _run([tools / "llama-quantize", bf16, f16, "F16", str(JOBS)], "llama-quantize F16")
    out["F16"] = (f16, "llama-quantize BF16 -> F16")
    for preset in PRESETS[1:2] if quick else PRESETS:
        q, g = base / f"q-{preset}", base / f"model-{preset}.gguf"
        _qformat("quantize", hf, q, "--preset", preset)
        _qformat("export", q, g, "--to", "gguf", *pre)
        out[preset] = (g, f"qformat quantize --preset {preset}; qformat export --to gguf")
    name, args = GENERATE_Q4_0
    q, g = base / "q-int4-g32", base / "model-int4-g32.gguf"
    _qformat("quantize", hf, q, *args)
    _qformat("export", q, g, "--to", "gguf", *pre)
    out[name] = (g, f"qformat quantize {' '.join(args)}; qformat export --to gguf")
    return out


def tensor_types(path: Path) -> dict[str, int]:
    """ggml type -> number of tensors of the GGUF file."""
    from gguf import GGUFReader

    return dict(collections.Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors))


def _busy_s() -> float | None:
    """Seconds all CPUs spent busy (not idle or waiting for I/O) since boot; None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def llama_bench(tool: Path, model: Path, threads: int, n_gen: int, reps: int) -> dict[str, Any]:
    """llama-bench's JSON for ``pp8`` and ``tg<n_gen>`` of ``model`` (the two entries by test),
    and ``other_load``: the CPUs' busy seconds during the run that were not llama-bench's (nor
    this process's), per wall second, i.e. how many cores other jobs took meanwhile (None where
    /proc/stat is missing)."""
    b0, c0, t0 = _busy_s(), _cpu_s(), time.perf_counter()
    text = _run([tool, "-m", model, "-t", threads, "-p", 8, "-n", n_gen, "-r", reps, "-o", "json"], f"llama-bench {model.name}")
    b1, c1, t1 = _busy_s(), _cpu_s(), time.perf_counter()
    other = None if b0 is None or b1 is None else max(0.0, (b1 - b0) - (c1 - c0)) / (t1 - t0)
    try:
        entries = json.loads(text)
        pp = next(e for e in entries if e["n_prompt"] == 8 and e["n_gen"] == 0)
        tg = next(e for e in entries if e["n_prompt"] == 0 and e["n_gen"] == n_gen)
    except (ValueError, StopIteration, KeyError, TypeError):
        raise Skip(f"llama-bench printed no pp8/tg{n_gen} results for {model.name}:\n{text[-2000:]}") from None
    return {"pp": pp, "tg": tg, "other_load": other, "wall_s": t1 - t0}


def measure(tool: Path, model: Path, threads: int, n_gen: int, reps: int, retry: bool = True) -> dict[str, Any]:
    """:func:`llama_bench`, once more (after a pause; with ``retry``) when other jobs took more
    than :data:`MAX_OTHER_LOAD` of a core meanwhile; the run with less of them is kept, and
    ``runs_other_load`` holds each run's ``other_load``."""
    r = llama_bench(tool, model, threads, n_gen, reps)
    loads = [r["other_load"]]
    if retry and r["other_load"] is not None and r["other_load"] > MAX_OTHER_LOAD:
        time.sleep(RETRY_PAUSE_S)
        again = llama_bench(tool, model, threads, n_gen, reps)
        loads.append(again["other_load"])
        if again["other_load"] is not None and again["other_load"] < r["other_load"]:
            r = again
    return r | {"runs_other_load": loads}


def _median(entry: dict[str, Any]) -> float:
    """Median tokens/s of llama-bench's repetitions (``samples_ts``; its mean where it has none),
    as the generate section takes medians."""
    samples = entry.get("samples_ts") or [entry["avg_ts"]]
    return float(statistics.median(samples))


def _skipped(run: Any, reason: str) -> None:
    run.rows.append({"section": SECTION, "name": "llama.cpp (skipped)", "skipped": reason})
    print(f"\n[{SECTION}] skipped: {reason}", flush=True)


def bench_llama_cpp_speed(run: Any, tmp: str) -> None:
    """Rows in section ``llama_cpp_speed`` (see the module docstring)."""
    from .common import MB

    try:
        tools, record = tools_dir(build=not run.quick)
    except Skip as e:
        _skipped(run, str(e))
        return
    threads = int(os.environ.get("QFORMAT_BENCH_THREADS") or 2)
    n_gen, reps = (4, 1) if run.quick else (16, 3)
    base = Path(tmp).resolve() / SECTION
    base.mkdir(parents=True, exist_ok=True)
    build_info = {"sdist": record["sdist"], "flags": list(record["flags"]), "jobs": record.get("jobs"), "nice": NICE,
                  "build_s": record.get("build_s"), "compiler": record.get("compiler")}
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        files = make_ggufs(base, run.quick, tools)
        print(f"\n[{SECTION}] llama.cpp (llama-bench -t {threads} -p 8 -n {n_gen} -r {reps}), native build "
              f"({record.get('build_s')} s to build), GGUF files of generate's {'QUICK' if run.quick else 'FULL'} model "
              f"made in {time.perf_counter() - t0:.0f} s", flush=True)
        # the baseline again last: the spread of the two says how noisy the machine was
        order = [*files, f"{BASELINE} (again)"]
        for name in order:
            path, route = files[name.removesuffix(" (again)")]
            r = measure(tools / "llama-bench", path, threads, n_gen, reps, retry=not run.quick)
            tg, pp = r["tg"], r["pp"]
            tps, pps = _median(tg), _median(pp)
            row = {"section": SECTION, "name": f"llama.cpp {name}", "type": name,
                   "ms": 1e3 / tps, "tokens_per_s": tps, "tokens_per_s_mean": tg["avg_ts"], "tokens_per_s_stddev": tg["stddev_ts"],
                   "tokens_per_s_samples": tg.get("samples_ts"), "prompt8_ms": 8e3 / pps, "prompt8_tokens_per_s": pps,
                   "prompt8_tokens_per_s_mean": pp["avg_ts"], "prompt8_tokens_per_s_stddev": pp["stddev_ts"],
                   "prompt8_tokens_per_s_samples": pp.get("samples_ts"),
                   "n_gen": n_gen, "reps": reps, "threads": tg["n_threads"], "other_load": r["other_load"],
                   "runs_other_load": r["runs_other_load"], "file_MB": path.stat().st_size / MB,
                   "tensor_types": tensor_types(path), "gguf_route": route, "model_type": tg.get("model_type"),
                   "params_M": tg.get("model_n_params", 0) / 1e6, "build_commit": tg.get("build_commit"),
                   "build_number": tg.get("build_number"), "cpu_info": tg.get("cpu_info"), "backends": tg.get("backends"),
                   "build": build_info}
            if rows:
                row["vs"] = rows[0]["name"]
                row["x_vs"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
                row["prompt8_x_vs"] = row["prompt8_tokens_per_s"] / rows[0]["prompt8_tokens_per_s"]
            rows.append(row)
            vs = f" {row['x_vs']:5.2f}x" if "x_vs" in row else "       "
            pvs = f" {row['prompt8_x_vs']:5.2f}x" if "prompt8_x_vs" in row else "       "
            busy = "  ".join(f"{x:.2f}" if x is not None else "?" for x in r["runs_other_load"])
            print(f"  {row['name']:<58} 1 token {row['tokens_per_s']:7.2f} tok/s{vs}  8-token prompt "
                  f"{row['prompt8_tokens_per_s']:8.1f} tok/s{pvs}  {row['file_MB']:6.1f} MB  other jobs {busy} cores", flush=True)
    except Skip as e:
        run.rows.extend(rows)
        _skipped(run, str(e))
        return
    run.rows.extend(rows)
    print(f"  llama.cpp {rows[0]['build_commit']} (build {rows[0]['build_number']}), {rows[0]['cpu_info']}, "
          f"backends {rows[0]['backends']}", flush=True)


def tg_json(path: str, n_gen: int, reps: int) -> dict[str, Any]:
    """llama.cpp's own 1-token speed on the GGUF file ``path`` (``llama-bench -n n_gen``, the
    measurement of :func:`measure`), on an existing speed build only (never built here):
    ``{"llama_cpp_tokens_per_s", "llama_cpp_ms", "llama_cpp_threads", "llama_cpp_other_load"}``,
    or ``{"llama_cpp_skipped": why}``.  ``python -m bench.llama_cpp_speed tg FILE N REPS`` prints
    it (bench/generate.py's GGUF rows run it so, in a child: it imports nothing of this module,
    which imports it)."""
    try:
        tools, _ = tools_dir(build=False)
        threads = int(os.environ.get("QFORMAT_BENCH_THREADS") or 2)
        r = measure(tools / "llama-bench", Path(path), threads, n_gen, reps)
    except Skip as e:
        return {"llama_cpp_skipped": str(e)}
    tps = _median(r["tg"])
    return {"llama_cpp_tokens_per_s": tps, "llama_cpp_ms": 1e3 / tps, "llama_cpp_threads": threads, "llama_cpp_other_load": r["other_load"]}


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "tg":  # python -m bench.llama_cpp_speed tg FILE N REPS
    print(json.dumps(tg_json(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
elif __name__ == "__main__":  # the whole section through the harness's command line (no import of it here: no cycle)
    sys.exit(subprocess.call([sys.executable, "-m", "bench", "--only", SECTION, *sys.argv[1:]], cwd=str(ROOT)))
