"""Coverage-guided fuzz targets for atheris (libFuzzer for Python; issue 40, item 7).

Each target is a function of one input's bytes, registered under a stable id in :data:`TARGETS`:

=================  ============================================================================
``header``         :func:`qformat.io.open_bytes` (the header, descriptor and structure rules of
                   a file in memory), then every tensor read.
``gguf``           qformat's GGUF reader: ``inspect``, then ``convert --layout gguf``
                   (:func:`tests.gguf_hostile.parse_gguf`).
``gguf_hf``        the GGUF to transformers conversion (:func:`tests.gguf_hostile.convert_hf`).
``merge``          ``qformat merge`` of a two-part staging folder the bytes edit
                   (:func:`tests.hostile_trees.one_input`: canaries, links, pipes, manifests).
``split_manifest`` a part manifest (``part.json``) read and its names checked
                   (:func:`qformat.checkpoint.split._read_manifest`, ``_check_names``).
``imatrix``        an importance matrix read (GGUF or legacy .dat) and, when its entries fit
                   the tiny model's tensors, used by ``quantize --preset ... --imatrix``.
``remote``         a file, a quantized file, a two-shard index or a hostile file the bytes
                   give, read over HTTP from :class:`tests.fault_server.FaultServer` with the
                   fault the first bytes choose (drip, wrong or short ranges, resets, a redirect
                   to another host, huge or negative totals, a changing file, ...).
=================  ============================================================================

The oracle is the same for all: an input succeeds or raises a
:class:`~qformat.errors.QFormatError` whose code is one of qformat/tables/errors.json's;
anything else propagates, and libFuzzer keeps the input as a ``crash-`` file.  Targets add
their own promises as assertions: :class:`Escape` when something was read, written or asked
for outside what was named (``merge``'s canaries, a manifest name resolving outside the
destination, a request reaching the redirect's other host), :class:`BrokenPromise` for the
rest (a refused merge that left something behind, a remote read past its deadlines, remote
values that differ from the local file's).  libFuzzer's ``-timeout`` catches hangs
(``timeout-`` files) and ``-rss_limit_mb`` exhaustion (``oom-`` files).

``python -m tests.atheris_targets NAME [--plant=KIND] [--every-module] [libFuzzer flags] [corpus
dirs]`` is one fuzzing process (libFuzzer ends the process at the end of the run): qformat (and
qformat_transformers for ``gguf_hf``) is imported under ``atheris.instrument_imports`` so that
its branches are the coverage (``--every-module``: each of its modules, about 3 s more, as
scripts/fuzz_atheris.py runs it; else those the target imports and its seeds reach), the
target's seeds run once, and then ``atheris.Fuzz()`` (with the target's structure-aware
mutator: GGUF key/value and tensor-info edits from tests/gguf_hostile.py, JSON edits of headers,
descriptors and manifests, falling back to libFuzzer's own byte mutations).  :func:`run` starts such a process
and parses what it printed; scripts/fuzz_atheris.py runs them at scale and
tests/test_atheris_targets.py runs each briefly, replays every kept input and proves that the
oracle catches planted defects (``--plant``).

Seed corpora live in ``tests/fixtures/atheris/<target>/seeds/`` (written by
``python scripts/fuzz_atheris.py --write-seeds``: the conformance suite's small files, tiny
GGUFs written with gguf-py, the merge harness's template manifests); inputs a run once failed
on in ``tests/fixtures/atheris/<target>/regressions/`` (named by their SHA-256).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import pkgutil
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# No qformat import at module level: the fuzzing process imports qformat under instrumentation.

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "atheris"
CONFORMANCE = ROOT / "conformance" / "v1" / "cases"
#: Packages whose code is instrumented (their branches are libFuzzer's coverage).
INSTRUMENTED = ("qformat",)
#: qformat modules never imported by the fuzzing process (framework shims: torch, jax).
_SKIP_MODULES = ("qformat.torch", "qformat.jax", "qformat.transformers", "qformat.__main__")
#: Environment variable naming the fuzzing process's scratch folder (the runner removes it).
SCRATCH_ENV = "QFORMAT_ATHERIS_SCRATCH"


class Escape(AssertionError):
    """Something was read, written or requested outside what the input's user named."""


class BrokenPromise(AssertionError):
    """Another promise broken (something left behind, a bound exceeded, wrong values)."""


@dataclass(frozen=True)
class Target:
    """One fuzz target: ``one_input(data)`` (the oracle: returns, raises a QFormatError with a
    known code, or raises the finding), and how a fuzzing process runs it."""

    name: str
    one_input: Callable[[bytes], None]
    make_seeds: Callable[[], dict[str, bytes]]
    mutator: Callable[[bytes, int, int], bytes] | None = None
    imports: tuple[str, ...] = ()  # extra modules warmed under instrumentation (and instrumented when qformat's)
    instrument: tuple[str, ...] = INSTRUMENTED
    timeout_s: int = 10  # libFuzzer -timeout: one input past it is a hang
    rss_limit_mb: int = 2048  # libFuzzer -rss_limit_mb: past it is exhaustion
    max_len: int = 16384  # libFuzzer -max_len
    short_runs: int = 200  # executions of the seeded short run in tests/test_atheris_targets.py
    seeds_from: tuple[str, ...] = ()  # other targets whose seeds this one also starts from

    @property
    def seeds_dir(self) -> Path:
        return FIXTURES / self.name / "seeds"

    @property
    def regressions_dir(self) -> Path:
        return FIXTURES / self.name / "regressions"


TARGETS: dict[str, Target] = {}


def register(name: str, make_seeds: Callable[[], dict[str, bytes]],
             **kw: Any) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    """Register the decorated ``one_input`` as target ``name`` (see :class:`Target`)."""
    def deco(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        if kw.get("mutator") is not None:
            kw["mutator"] = _safe_mutator(kw["mutator"])
        TARGETS[name] = Target(name, fn, make_seeds, **kw)
        return fn
    return deco


def _safe_mutator(mutator: Callable[[bytes, int, int], bytes]) -> Callable[[bytes, int, int], bytes]:
    """``mutator``, falling back to libFuzzer's byte mutation where its structure-aware edit of
    an odd input fails (a mutator's own error is no finding, and would end the process)."""
    def safe(data: bytes, max_size: int, seed: int) -> bytes:
        try:
            return mutator(data, max_size, seed)
        except Exception:  # noqa: BLE001
            return _byte_mutate(data, max_size)

    safe.__doc__ = mutator.__doc__
    return safe


# -- the oracle's pieces ---------------------------------------------------------------------------
def coded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``(fn(*args, **kwargs), None)``, or ``(None, code)`` when it raised a QFormatError with a
    code of errors.json; any other exception propagates (the finding)."""
    from qformat import tables
    from qformat.errors import QFormatError

    try:
        return fn(*args, **kwargs), None
    except QFormatError as e:
        if e.code not in tables.errors():
            raise BrokenPromise(f"{type(e).__name__} with code {e.code!r}, not a code of errors.json: {e}") from e
        return None, e.code


_SCRATCH: Path | None = None


def scratch() -> Path:
    """This process's scratch folder (``$QFORMAT_ATHERIS_SCRATCH`` under the runner, which
    removes it: libFuzzer ends the process without Python's exit handlers)."""
    global _SCRATCH
    if _SCRATCH is None:
        env = os.environ.get(SCRATCH_ENV)
        if env:
            _SCRATCH = Path(env)
            _SCRATCH.mkdir(parents=True, exist_ok=True)
        else:
            import atexit

            _SCRATCH = Path(tempfile.mkdtemp(prefix="qformat-atheris-"))
            atexit.register(shutil.rmtree, _SCRATCH, True)
    return _SCRATCH


def _fresh(name: str) -> Path:
    """An empty folder ``name`` in :func:`scratch` (emptied if it was there)."""
    p = scratch() / name
    if os.path.lexists(p):
        shutil.rmtree(p, ignore_errors=True)
    p.mkdir(parents=True)
    return p


# -- mutators --------------------------------------------------------------------------------------
def _byte_mutate(data: bytes, max_size: int) -> bytes:
    """libFuzzer's own mutation (under atheris), or a random byte edit outside it."""
    try:
        import atheris

        return atheris.Mutate(data, max_size)
    except (ImportError, RuntimeError):
        from .gguf_hostile import mutate_bytes

        return mutate_bytes(data, random.Random(len(data)))[0][:max_size]


#: Values a JSON edit may put anywhere (numbers at the edges, odd types, names the rules use).
_HOSTILE_VALUES: tuple[Any, ...] = (0, -1, 1, 2, 3, 7, 8, 32, 255, 256, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, 10**30,
                                    -2**63,
                                    1.5, -0.0, 1e308, None, True, False, "", "x", "..", "/etc/passwd", "\u0000", "a" * 300,
                                    [], [0], [1, 0], [2**40, 2**40], [-1], [0, 2**64], {}, {"type": "x"}, "1.0", "2.0", "1.2",
                                    "F32", "U8", "I4", "F8_E4M3", "BF16", "float16", "bfloat16", "int", "uint8", "multiply", "add",
                                    "grid", "flat", "lsb_first", "msb_first", "nf4", "fp4", "e4m3fn", "e2m1", "codebook", "float")


def _nodes(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    out = [(path, obj)]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _nodes(v, path + (i,))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return obj


def json_edit(obj: Any, rng: random.Random, pool: list[Any] | None = None, keys: list[str] | None = None) -> Any:
    """One to three structural edits of the parsed JSON ``obj`` (changed in place where it can
    be; the result returned): a node replaced by a hostile value or one from ``pool``, a member
    deleted or added (a name from ``keys``), a list element dropped or repeated."""
    def value() -> Any:
        return copy.deepcopy(rng.choice(pool) if pool and rng.random() < 0.5 else rng.choice(_HOSTILE_VALUES))

    for _ in range(rng.choice((1, 1, 2, 3))):
        path, node = rng.choice(_nodes(obj))
        r = rng.random()
        if r < 0.45 or not path:
            obj = _set(obj, path, value())
        elif r < 0.6:
            parent = obj
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        elif r < 0.8 and isinstance(node, dict):
            node[rng.choice(keys) if keys and rng.random() < 0.7 else rng.choice(("x", "", "__metadata__", "qformat"))] = value()
        elif isinstance(node, list) and node:
            i = rng.randrange(len(node))
            if rng.random() < 0.5:
                node.insert(i, copy.deepcopy(node[i]))
            else:
                node.pop(i)
        else:
            obj = _set(obj, path, value())
    return obj


def _json_pool(docs: list[Any]) -> tuple[list[Any], list[str]]:
    """Every leaf value and member name found in ``docs`` (for splicing between seeds)."""
    vals, keys = [], set()
    for d in docs:
        for _, v in _nodes(d):
            if isinstance(v, dict):
                keys.update(k for k in v if isinstance(k, str))
            elif not isinstance(v, list):
                vals.append(v)
    return vals[:4000], sorted(keys)


# -- header ----------------------------------------------------------------------------------------
_DESCRIPTORS = "qformat"  # the __metadata__ member holding the descriptors (a JSON string)


def _split_file(data: bytes) -> tuple[Any, bytes] | None:
    """(the header's JSON, the data section) of a well-framed safetensors file, else None; the
    descriptors string in ``__metadata__`` parsed too (so edits reach inside it)."""
    if len(data) < 8:
        return None
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        return None
    try:
        head = json.loads(data[8:8 + n])
    except (ValueError, RecursionError):
        return None
    meta = head.get("__metadata__") if isinstance(head, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get(_DESCRIPTORS), str):
        try:
            meta[_DESCRIPTORS] = {"__parsed__": json.loads(meta[_DESCRIPTORS])}
        except (ValueError, RecursionError):
            pass
    return head, data[8 + n:]


def _join_file(head: Any, body: bytes) -> bytes:
    meta = head.get("__metadata__") if isinstance(head, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get(_DESCRIPTORS), dict) and "__parsed__" in meta[_DESCRIPTORS]:
        meta[_DESCRIPTORS] = json.dumps(meta[_DESCRIPTORS]["__parsed__"], separators=(",", ":"))
    raw = json.dumps(head, separators=(",", ":")).encode()
    return len(raw).to_bytes(8, "little") + raw + body


_HEADER_POOL: tuple[list[Any], list[str]] | None = None


def header_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Structure-aware: the header's JSON (and the descriptors inside it) edited with values
    spliced from the seeds (:func:`json_edit`), the header's text byte-mutated with its length
    prefix kept right, or the data section cut or extended; else libFuzzer's byte mutation."""
    global _HEADER_POOL
    rng = random.Random(seed)
    r = rng.random()
    parts = _split_file(data) if r < 0.75 else None
    if parts is None:
        return _byte_mutate(data, max_size)
    head, body = parts
    if _HEADER_POOL is None:
        docs = [p[0] for p in (_split_file(s) for s in seeds(TARGETS["header"]).values()) if p is not None]
        _HEADER_POOL = _json_pool(docs)
    if r < 0.45:
        out = _join_file(json_edit(head, rng, *_HEADER_POOL), body)
    elif r < 0.65:
        n = int.from_bytes(data[:8], "little")
        text = _byte_mutate(data[8:8 + n], max(n + 64, 64))
        out = len(text).to_bytes(8, "little") + text + body
    else:
        cut = rng.randrange(len(body) + 1)
        out = data[:len(data) - len(body)] + (body[:cut] if rng.random() < 0.5 else body + bytes(rng.randrange(1, 64)))
    return out if len(out) <= max_size else _byte_mutate(data, max_size)


def _header_seeds() -> dict[str, bytes]:
    """Small files of the conformance suite (inputs and expected outputs), at most 3 per case
    family (the name's first word), each at most 4 KiB."""
    out: dict[str, bytes] = {}
    per: dict[str, int] = {}
    for case in sorted(CONFORMANCE.iterdir()) if CONFORMANCE.is_dir() else ():
        fam = case.name.split("-")[0]
        for f in sorted(case.glob("*.safetensors")):
            data = f.read_bytes()
            if len(data) <= 4096 and per.get(fam, 0) < 3 and data not in out.values():
                out[f"{case.name}-{f.stem}"] = data
                per[fam] = per.get(fam, 0) + 1
    return out


@register("header", _header_seeds, mutator=header_mutator, imports=("qformat.io",), timeout_s=10, rss_limit_mb=2048,
          max_len=65536, short_runs=600)
def header(data: bytes) -> None:
    """Open ``data`` as a file (header, descriptors, structure rules), then read every tensor
    (each tensor's refusal is its own; the others are still read)."""
    from qformat.io import open_bytes

    f, code = coded(open_bytes, data)
    if code is not None:
        return
    for k in f.keys():
        coded(f.get_tensor, k)


# -- gguf, gguf_hf ---------------------------------------------------------------------------------
def gguf_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Structure-aware for a parseable GGUF: tests/gguf_hostile.py's key/value and tensor-info
    edits (:func:`tests.gguf_hostile.mutate`) written back, or its aligned-field byte edits;
    else libFuzzer's byte mutation."""
    from . import gguf_hostile as gh

    rng = random.Random(seed)
    r = rng.random()
    if r < 0.5 and data[:4] == b"GGUF":
        p = scratch() / "mutator.gguf"
        p.write_bytes(data)
        try:
            out = gh.to_bytes(gh.mutate(gh.read_parts(p), rng)[0])
        except Exception:  # noqa: BLE001  (a GGUF qformat refuses, or one the writer cannot write back)
            out = b""
        if out and len(out) <= max_size:
            return out
    if r < 0.65:
        return gh.mutate_bytes(data, rng)[0][:max_size]
    return _byte_mutate(data, max_size)


def _tiny_hf(arch: str) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, Any]]]:
    """(config.json, tokenizer.json, named tensors) of a tiny transformers model of ``arch``
    (hidden 32, one layer; random weights from a fixed seed)."""
    import torch
    import transformers

    from .gguf_models import ARCHS, GEMMA, SPM, tokenizer

    with tempfile.TemporaryDirectory() as d:
        tok = tokenizer(Path(d), spm=arch in SPM)
        tj = json.loads((Path(d) / "tokenizer.json").read_text())
    kw: dict[str, Any] = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=arch in ("qwen3",) + GEMMA,
                              bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if arch in GEMMA:
        kw.update(head_dim=8, sliding_window=16, query_pre_attn_scalar=8)
    if arch == "qwen3":
        kw.update(head_dim=8)
    cfg = getattr(transformers, ARCHS[arch][0])(**kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    tensors = [(n, t.detach().float().numpy()) for n, t in model.state_dict().items()]
    return cfg.to_dict(), tj, tensors


def _gguf_hf_seeds() -> dict[str, bytes]:
    """Tiny GGUFs (one layer, hidden 32) of the architectures the conversion knows, written
    with gguf-py as llama.cpp's converter lays them out (tests/gguf_models.py), in F32, F16,
    Q8_0 and Q4_0."""
    from .gguf_models import write_gguf_from

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for arch, qtype, types in (("llama", "Q8_0", {"attn_v": "Q4_0", "attn_output": "F32"}), ("mistral", "F16", None),
                                   ("qwen2", "Q8_0", {"ffn_down": "Q4_1"}), ("qwen3", "Q8_0", {"ffn_up": "Q5_0"}),
                                   ("gemma2", "Q8_0", None), ("gemma3", "F16", None)):
            cfg, tj, tensors = _tiny_hf(arch)
            types = {"token_embd": "Q4_0", "output": "Q4_0", **(types or {})}  # the embedding is most of the bytes
            p = write_gguf_from(Path(d) / f"{arch}.gguf", arch, cfg, tj, tensors, qtype=qtype, types=types)
            out[arch] = p.read_bytes()
    return out


def _gguf_seeds() -> dict[str, bytes]:
    """One GGUF holding a small tensor of every ggml type qformat reads (K-quants and i-quants as
    random blocks); the target also starts from ``gguf_hf``'s seeds."""
    import gguf
    import numpy as np

    from qformat.convert.gguf_file import GGML_TYPES

    out = {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        w = gguf.GGUFWriter(str(Path(d) / "mixed.gguf"), "llama")
        w.add_block_count(1)
        for tid, (name, block, size) in sorted(GGML_TYPES.items()):
            try:
                qt = gguf.GGMLQuantizationType(tid)
            except ValueError:
                continue
            cols = block if block > 1 else 8
            raw = rng.integers(0, 256, (2, cols // block * size), dtype=np.uint8)  # floats too: NaN and inf are values
            w.add_tensor(f"blk.0.t_{name.lower()}.weight", raw, raw_shape=raw.shape, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out["mixed-types"] = (Path(d) / "mixed.gguf").read_bytes()
    return out


@register("gguf", _gguf_seeds, mutator=gguf_mutator, imports=("qformat.convert", "qformat.inspection"), timeout_s=20,
          rss_limit_mb=3072, max_len=65536, short_runs=150, seeds_from=("gguf_hf",))
def gguf_reader(data: bytes) -> None:
    """``data`` through qformat's GGUF reader: ``inspect``, then ``convert --layout gguf``
    (:func:`tests.gguf_hostile.parse_gguf`)."""
    from . import gguf_hostile as gh

    e = gh.parse_gguf(data)
    if e is not None:
        coded(_raise, e)


def _raise(e: BaseException) -> None:
    raise e


@register("gguf_hf", _gguf_hf_seeds, mutator=gguf_mutator, imports=("qformat_transformers.gguf_layout",),
          instrument=("qformat", "qformat_transformers"), timeout_s=60, rss_limit_mb=6144, max_len=65536, short_runs=40)
def gguf_hf(data: bytes) -> None:
    """``data`` through the GGUF to transformers conversion (``convert --layout hf``) into a
    fresh folder (:func:`tests.gguf_hostile.convert_hf`)."""
    from . import gguf_hostile as gh

    e = gh.convert_hf(data)
    if e is not None:
        coded(_raise, e)


# -- merge, split_manifest -------------------------------------------------------------------------
def manifest_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """A parseable manifest: tests/hostile_trees.py's manifest edits (hostile names, numbers,
    types) or :func:`json_edit`; else libFuzzer's byte mutation."""
    from . import hostile_trees as ht

    rng = random.Random(seed)
    r = rng.random()
    if r < 0.6:
        try:
            m = json.loads(data)
        except (ValueError, RecursionError):
            m = None
        if isinstance(m, dict):
            if r < 0.35:
                ht._mutate_manifest(m, ht.Bytes(rng.randbytes(32)))
            else:
                m = json_edit(m, rng, keys=["tree", "assignment", "files", "index", "part", "parts", "version", "size", "sha256"])
            out = json.dumps(m).encode()
            if len(out) <= max_size:
                return out
    return _byte_mutate(data, max_size)


def merge_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """An input whose mode replaces the manifest's text (:func:`tests.hostile_trees.one_input`,
    mode 0: the bytes after the first four): that text through :func:`manifest_mutator`; any
    other input: libFuzzer's byte mutation."""
    if len(data) > 4 and (data[0] | data[1] << 8) % 4 == 0 and random.Random(seed).random() < 0.7:
        return data[:4] + manifest_mutator(data[4:], max_size - 4, seed)
    return _byte_mutate(data, max_size)


def _template_manifests() -> dict[str, bytes]:
    from . import hostile_trees as ht

    t = ht._template()
    return {p.parent.name: p.read_bytes() for p in sorted(t.glob("part-*-of-2/part.json"))}


def _merge_seeds() -> dict[str, bytes]:
    """Each of hostile_trees' modes (the manifest's text replaced, its members edited, its files
    edited, both) for each part, a few random edit streams each; and each template manifest
    whole (a merge that succeeds)."""
    out: dict[str, bytes] = {}
    rng = random.Random(40)
    for k, (name, text) in enumerate(sorted(_template_manifests().items())):
        out[f"whole-{name}"] = bytes([0, 0, k, 0]) + text
    for mode in (1, 2, 3):
        for k in (0, 1):
            for i in range(3):
                out[f"mode{mode}-part{k + 1}-{i}"] = bytes([mode, 0, k, 0]) + rng.randbytes(24)
    out["mode0-junk"] = b"\0\0\0\0{\"format\": 1}"
    return out


@register("merge", _merge_seeds, mutator=merge_mutator, imports=("qformat.checkpoint.split", "qformat.check"), timeout_s=30,
          rss_limit_mb=2048, max_len=16384, short_runs=40)
def merge(data: bytes) -> None:
    """:func:`tests.hostile_trees.one_input`: a two-part staging folder edited as ``data`` says,
    merged; no write outside the sandbox (canaries; :class:`Escape`), a refusal coded and leaving
    nothing, a success holding only regular files and leaving no temporary beside it."""
    from qformat.checkpoint import split

    from . import hostile_trees as ht

    if not getattr(split.merge, "_leaves_nothing", False):
        split.merge = _leaves_nothing(split.merge)
    try:
        ht.one_input(data)
    except AssertionError as e:
        if "outside its sandbox" in str(e):
            raise Escape(str(e)) from e
        raise BrokenPromise(str(e)) from e


def _leaves_nothing(merge_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``merge_fn`` checked to leave no temporary (``.qformat-*``) beside the destination when it
    succeeded (hostile_trees checks that after a refusal)."""
    def merge_checked(dst: Any, *a: Any, **kw: Any) -> Any:
        out = merge_fn(dst, *a, **kw)
        parent = os.path.dirname(os.path.abspath(os.fspath(dst)))
        left = sorted(n for n in os.listdir(parent) if n.startswith(".qformat-"))
        if left:
            raise BrokenPromise(f"a merge that succeeded left {left} beside its destination")
        return out

    merge_checked._leaves_nothing = True  # type: ignore[attr-defined]
    return merge_checked


def _inside(root: str, name: Any, what: str) -> None:
    """``name`` is a relative '/'-separated path that stays inside ``root`` (an independent
    statement of the path policy: no absolute path, drive, empty, '.' or '..' segment,
    backslash or NUL)."""
    if not isinstance(name, str) or not name:
        raise Escape(f"{what} {name!r} is not a non-empty name")
    segs = name.split("/")
    if "\0" in name or "\\" in name or any(s in ("", ".", "..") for s in segs) or re.match(r"^[A-Za-z]:", name):
        raise Escape(f"{what} {name!r} was accepted; it leaves or is not a plain path under the destination")
    full = os.path.normpath(os.path.join(root, *segs))
    if os.path.commonpath([root, full]) != root or full == root:
        raise Escape(f"{what} {name!r} resolves to {full}, outside {root}")


def _split_seeds() -> dict[str, bytes]:
    """The template's two manifests and a few hostile edits of each."""
    from . import hostile_trees as ht

    out = dict(_template_manifests())
    rng = random.Random(41)
    for name, text in list(out.items()):
        for i in range(4):
            m = json.loads(text)
            ht._mutate_manifest(m, ht.Bytes(rng.randbytes(24)))
            out[f"{name}-edit{i}"] = json.dumps(m).encode()
    return out


@register("split_manifest", _split_seeds, mutator=manifest_mutator, imports=("qformat.checkpoint.split",), timeout_s=10,
          rss_limit_mb=2048, max_len=32768, short_runs=600)
def split_manifest(data: bytes) -> None:
    """``data`` as ``DST.parts/part-1-of-2/part.json``: read and validated
    (:func:`qformat.checkpoint.split._read_manifest`) and its names checked
    (``_check_names``); an accepted manifest's every name must stay inside ``DST``."""
    from qformat.checkpoint import split

    root = scratch() / "split"
    dst = str(root / "out")
    folder = root / "out.parts" / "part-1-of-2"
    folder.mkdir(parents=True, exist_ok=True)  # nothing but the manifest is read: the folder is reused
    (folder / split.MANIFEST).write_bytes(data)
    m, code = coded(split._read_manifest, str(folder))
    if code is not None:
        return
    _, code = coded(split._check_names, dst, str(folder), m["assignment"], m)
    if code is not None:
        return
    for f in m["assignment"]:
        _inside(dst, f, "the planned file")
        if "/" in f:
            raise Escape(f"the planned file {f!r} (a shard: one name) was accepted")
    for rel in m["tree"]:
        _inside(dst, rel, "the tree entry")
    if m.get("index") is not None:
        _inside(dst, m["index"], "the index")


# -- imatrix ---------------------------------------------------------------------------------------
_IM_MODEL: Path | None = None
_IM_PRESETS = ("Q4_K_M", "Q2_K_S", "Q6_K", "Q4_0")


def _imatrix_model() -> Path:
    """A tiny plain llama checkpoint (hidden 256, one layer) that a preset quantizes with the
    importance matrix, made once per process."""
    global _IM_MODEL
    if _IM_MODEL is None:
        import numpy as np

        import qformat

        d = scratch() / "imatrix-model"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        rng = np.random.default_rng(0)
        h, i, v = 256, 256, 32
        t = {"model.embed_tokens.weight": rng.standard_normal((v, h)).astype(np.float16)}
        for n in "qkvo":
            t[f"model.layers.0.self_attn.{n}_proj.weight"] = rng.standard_normal((h, h)).astype(np.float16)
        for n, shape in (("gate", (i, h)), ("up", (i, h)), ("down", (h, i))):
            t[f"model.layers.0.mlp.{n}_proj.weight"] = rng.standard_normal(shape).astype(np.float16)
        t["model.layers.0.input_layernorm.weight"] = np.ones(h, np.float16)
        t["model.norm.weight"] = np.ones(h, np.float16)
        t["lm_head.weight"] = rng.standard_normal((v, h)).astype(np.float16)
        qformat.save_file(t, d / "model.safetensors")
        (d / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
                                                   "intermediate_size": i, "num_hidden_layers": 1, "num_attention_heads": 4,
                                                   "num_key_value_heads": 4, "vocab_size": v}))
        _IM_MODEL = d
    return _IM_MODEL


#: The tiny model's GGUF tensor names with their row lengths (the entries an imatrix may have).
_IM_ENTRIES = {**{f"blk.0.attn_{n}.weight": 256 for n in ("q", "k", "v", "output")},
               **{f"blk.0.ffn_{n}.weight": 256 for n in ("gate", "up", "down")}, "output.weight": 256}


def _imatrix_seeds() -> dict[str, bytes]:
    """Importance matrices for the tiny model in both formats (tests/imatrix_files.py): all
    entries, a few, and one with an entry of the wrong length; .dat files with every entry whose
    last byte picks each preset (a GGUF's, 6.0's last byte, picks the first)."""
    import numpy as np

    from .imatrix_files import dat_bytes, write_gguf

    rng = np.random.default_rng(0)
    full = {k: (rng.gamma(1.0, 30.0, n).astype(np.float32), np.array([6.0])) for k, n in _IM_ENTRIES.items()}
    few = dict(list(full.items())[:2])
    wrong = {"blk.0.attn_q.weight": (rng.gamma(1.0, 3.0, 64).astype(np.float32), np.array([2.0]))}
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, entries in (("full", full), ("few", few), ("wrong", wrong)):
            out[f"{name}.gguf"] = write_gguf(Path(d) / f"{name}.gguf", entries).read_bytes()
            out[f"{name}.dat"] = dat_bytes({k: (s / c[0], int(c[0])) for k, (s, c) in entries.items()})
        for i, last in enumerate("@HPX"):  # a .dat ends with its dataset's name: each preset applies one
            out[f"full-{_IM_PRESETS[i]}.dat"] = dat_bytes({k: (s / c[0], int(c[0])) for k, (s, c) in full.items()},
                                                          dataset=f"calibration-{last}")
    return out


@register("imatrix", _imatrix_seeds, mutator=gguf_mutator, imports=("qformat.imatrix", "qformat.checkpoint.quantize"),
          timeout_s=20, rss_limit_mb=2048, max_len=32768, short_runs=150)
def imatrix(data: bytes) -> None:
    """``data`` as an importance matrix (GGUF or legacy .dat, by its magic); one that loads, has an
    entry for one of the tiny model's tensors and whose last byte is a multiple of 8 is then
    applied by a preset (that byte / 8 chooses which) as ``qformat quantize --preset P
    --imatrix`` applies it."""
    import qformat
    from qformat.imatrix import load_imatrix

    p = _fresh("imatrix") / "imatrix.dat"
    p.write_bytes(data)
    im, code = coded(load_imatrix, p)
    if code is not None:
        return
    for name, v in im.entries.items():
        if v.dtype.name != "float32" or v.ndim != 1:
            raise BrokenPromise(f"entry {name!r}: {v.dtype} {v.shape}, expected one float32 vector")
    if not set(im.entries) & set(_IM_ENTRIES) or data[-1] % 8:  # quantizing costs 100 times the read: 1 input in 8
        return
    preset = _IM_PRESETS[data[-1] // 8 % len(_IM_PRESETS)]
    coded(qformat.quantize_checkpoint, _imatrix_model(), p.parent / "out", preset=preset, imatrix=im)


# -- remote ----------------------------------------------------------------------------------------
REMOTE_DEADLINE_S = 0.2
#: What byte 8 of an input chooses to read: served files, the last one written from the input.
REMOTE_FILES = ("m.safetensors", "q.safetensors", "model.safetensors.index.json", "h.safetensors")
_FS: Any = None


def _remote_server() -> Any:
    """The loopback fault servers (tests/fault_server.py) over a folder holding a plain file, a
    quantized one (a conformance input), a two-shard checkpoint and ``h.safetensors`` (each
    input's own)."""
    global _FS
    if _FS is None:
        import numpy as np

        import qformat

        from .fault_server import FaultServer

        d = _fresh("remote")
        rng = np.random.default_rng(7)
        qformat.save_file({"a": rng.standard_normal((8, 16)).astype(np.float32), "b": np.arange(12, dtype=np.int16).reshape(3, 4)},
                          d / "m.safetensors")
        shutil.copyfile(CONFORMANCE / "blocks-2d-partial-edges" / "input.safetensors", d / "q.safetensors")
        shutil.copyfile(d / "m.safetensors", d / "h.safetensors")
        wm = {}
        for i, prefix in enumerate(("a.", "b.")):
            name = f"model-{i + 1:05d}-of-00002.safetensors"
            qformat.save_file({prefix + "w": rng.standard_normal((4, 4)).astype(np.float16)}, d / name)
            wm[prefix + "w"] = name
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        _FS = FaultServer(d, deadline_s=REMOTE_DEADLINE_S).__enter__()
    return _FS


def _remote_seeds() -> dict[str, bytes]:
    """Every fault mode once (two parameter sets) on one of the served files in turn; the
    hostile slot with a few conformance files."""
    from .fault_server import MODES

    out = {}
    for i, mode in enumerate(MODES):
        for j, params in enumerate((b"\x00\x00\x00\x00\x00\x00\x00", b"\x81\x07\x05\x00\x00\x00\x00")):
            out[f"{mode}-{j}"] = bytes([i]) + params + bytes([(i + j) % 3])
    for case in ("blocks-2d-partial-edges", "codebook-nf4-flat64"):
        f = CONFORMANCE / case / "input.safetensors"
        if f.is_file():
            out[f"ok-hostile-{case}"] = bytes(8) + bytes([3]) + f.read_bytes()
    return out


def _local_tensors(path: Path) -> dict[str, Any] | None:
    """Every tensor of the local file or index ``path`` by name (None when qformat refuses it),
    with the shard each comes from."""
    import qformat
    from qformat.errors import QFormatError

    try:
        with qformat.safe_open(path) as f:
            return {n: f.get_tensor(n) for n in f.keys()}
    except QFormatError:
        return None


def _shard_of(folder: Path, name: str) -> dict[str, str]:
    """Tensor name -> the file it is stored in, for the served ``name`` (a file or an index)."""
    if not name.endswith(".index.json"):
        return {}
    return json.loads((folder / name).read_text())["weight_map"]


@register("remote", _remote_seeds, imports=("qformat.remote", "qformat.io"), timeout_s=60, rss_limit_mb=2048, max_len=8192,
          short_runs=40)
def remote_read(data: bytes) -> None:
    """Bytes 0-7 choose the server's fault (:func:`tests.fault_server.faults_from_bytes`), byte 8
    the file (:data:`REMOTE_FILES`; the last is the bytes after it); every tensor is read over
    HTTP.  Promised: a code of errors.json or the served file's values (under the ``change``
    fault each file's values are all of one version, the first or the changed one: a server that
    changes its file before a reader's first answer just serves that file); no request to the
    other host (:class:`Escape`); at most 16 reads' deadlines in all (tests/fault_server.py's
    bound); no remote success where the local file is refused (:class:`BrokenPromise`)."""
    import numpy as np

    import qformat
    from qformat import remote

    from .fault_server import faults_from_bytes
    from .range_server import _changed_part

    fs = _remote_server()
    name = REMOTE_FILES[data[8] % len(REMOTE_FILES)] if len(data) > 8 else REMOTE_FILES[0]
    if name == "h.safetensors":
        (fs.folder / name).write_bytes(data[9:])
    mode, faults = faults_from_bytes(data[:8], fs.other)
    fs.use(faults)
    remote.forget_opened()
    t0 = time.monotonic()

    def read() -> dict[str, Any]:
        with qformat.safe_open(fs.url + name) as r:
            return {n: r.get_tensor(n) for n in r.keys()}

    old, remote.DEFAULT_OPTIONS = remote.DEFAULT_OPTIONS, fs.options  # short timeouts and deadline, one retry
    try:
        got, code = coded(read)
    finally:
        remote.DEFAULT_OPTIONS = old
    elapsed = time.monotonic() - t0
    if fs.other.log.requests:
        raise Escape(f"a request reached the other host: {fs.other.log.requests} (fault {mode}, file {name})")
    bound = 16 * (fs.options.deadline_s + 1.0)
    if elapsed > bound:
        raise BrokenPromise(f"reading {name} under fault {mode} took {elapsed:.1f} s, more than 16 reads' deadlines "
                            f"({bound:.1f} s)")
    if got is None:
        return
    versions = [_local_tensors(fs.folder / name)]
    if mode == "change":
        alt = _fresh("remote-changed")
        for f in fs.folder.iterdir():
            if f.is_file():
                raw = f.read_bytes()
                (alt / f.name).write_bytes(_changed_part(raw, 0, len(raw)) if f.suffix == ".safetensors" else raw)
        versions.append(_local_tensors(alt / name))
    if all(v is None for v in versions):
        raise BrokenPromise(f"the remote read of {name} under fault {mode} succeeded; qformat refuses the local file")
    shard = _shard_of(fs.folder, name)
    groups: dict[str, set[int]] = {}
    for n, a in got.items():
        a = np.asarray(a)
        same = {i for i, v in enumerate(versions) if v is not None and n in v and np.asarray(v[n]).dtype == a.dtype
                and np.asarray(v[n]).shape == a.shape and np.asarray(v[n]).tobytes() == a.tobytes()}
        g = shard.get(n, name)
        groups[g] = groups.get(g, {0, 1}) & same
        if not groups[g]:
            raise BrokenPromise(f"tensor {n!r} of {name} read under fault {mode} differs from the served file's "
                                "(or mixes versions)")
    if not any(v is not None and set(v) == set(got) for v in versions):
        raise BrokenPromise(f"the remote read of {name} under fault {mode} gave tensors {sorted(got)[:10]}, the file holds others")


# -- planted defects (tests/test_atheris_targets.py proves that the oracle catches them) -------------
def _plant_uncoded() -> None:
    """``header``'s descriptor interpretation raises TypeError for any header that parses."""
    import qformat.io as qio

    real = qio.interpret

    def planted(*a: Any, **kw: Any) -> Any:
        real(*a, **kw)
        raise TypeError("planted defect")

    qio.interpret = planted


def _plant_hang() -> None:
    """``header``'s descriptor interpretation sleeps far past any -timeout."""
    import qformat.io as qio

    real = qio.interpret

    def planted(*a: Any, **kw: Any) -> Any:
        time.sleep(3600)
        return real(*a, **kw)

    qio.interpret = planted


def _plant_escape() -> None:
    """``merge``'s file placement also appends to a file two folders above the destination."""
    from qformat.checkpoint import split

    real = split._place

    def planted(src: str, dst: str) -> None:
        real(src, dst)
        out = os.path.dirname(os.path.dirname(os.path.dirname(dst)))  # tmp -> sandbox -> d2
        with open(os.path.join(out, "canary.txt"), "ab") as fh:
            fh.write(b"planted\n")

    split._place = planted


def _plant_oom() -> None:
    """``header`` keeps a 256 MiB buffer alive per tensor read (far past a small -rss_limit_mb)."""
    import qformat.io as qio

    real, kept = qio.interpret, []

    def planted(*a: Any, **kw: Any) -> Any:
        kept.append(bytearray(256 << 20))
        for b in kept[-1:]:
            b[::4096] = b"\1" * len(b[::4096])  # touch every page
        time.sleep(0.3)  # libFuzzer's memory check looks once a second
        return real(*a, **kw)

    qio.interpret = planted


PLANTS: dict[str, Callable[[], None]] = {"uncoded": _plant_uncoded, "hang": _plant_hang, "escape": _plant_escape,
                                         "oom": _plant_oom}


# -- the fuzzing process ---------------------------------------------------------------------------
def _import_all(packages: tuple[str, ...], extra: tuple[str, ...], every_module: bool) -> None:
    """Import ``packages`` and ``extra`` (and with ``every_module`` each module of ``packages``,
    so that code reached only by rare inputs is instrumented too; about 3 s more)."""
    for pkg in packages:
        mod = importlib.import_module(pkg)
        for m in pkgutil.walk_packages(mod.__path__, pkg + ".") if every_module else ():
            if m.name in _SKIP_MODULES or m.name.startswith(("qformat_transformers.",)) and m.name not in extra:
                continue
            try:
                importlib.import_module(m.name)
            except ImportError:  # an optional dependency this machine lacks
                pass
    for m in extra:
        importlib.import_module(m)


def seeds(target: Target) -> dict[str, bytes]:
    """The target's committed seeds (its ``seeds/`` folder, or freshly made ones) and those of
    the targets it shares seeds with."""
    out = {}
    for t in (target, *(TARGETS[n] for n in target.seeds_from)):
        if t.seeds_dir.is_dir():
            out.update({p.name: p.read_bytes() for p in sorted(t.seeds_dir.iterdir()) if p.is_file()})
        else:
            out.update(t.make_seeds())
    return out


def warm(target: Target) -> None:
    """Run the target's seeds once (imports, templates, servers), findings ignored here: the
    fuzzer runs them again and reports them."""
    for data in seeds(target).values():
        try:
            target.one_input(data)
        except Exception:  # noqa: BLE001
            pass


def child(argv: list[str]) -> None:
    """``python -m tests.atheris_targets NAME [--plant=KIND] [--every-module] [libFuzzer args]``:
    fuzz one target."""
    import atheris

    name, rest = argv[0], argv[1:]
    plant, every_module = None, False
    while rest and rest[0].startswith("--"):
        if rest[0].startswith("--plant="):
            plant = rest[0].split("=", 1)[1]
        elif rest[0] == "--every-module":
            every_module = True
        else:
            raise SystemExit(f"unknown option {rest[0]}")
        rest = rest[1:]
    target = TARGETS[name]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tempfile.tempdir = str(scratch() / "tmp")
    os.makedirs(tempfile.tempdir, exist_ok=True)
    warnings.simplefilter("ignore")  # a warning is no finding (and would flood the log)
    with atheris.instrument_imports(include=list(target.instrument)):
        _import_all(target.instrument, target.imports, every_module)
        from . import fault_server, gguf_hostile, hostile_trees  # noqa: F401  (their qformat imports instrumented)
        warm(target)
    if plant is not None:
        PLANTS[plant]()
    atheris.Setup([sys.argv[0], *rest], target.one_input, custom_mutator=target.mutator)
    atheris.Fuzz()


# -- running a fuzzing process and reading what it printed -----------------------------------------
#: Artifact prefixes libFuzzer writes, by the kind of finding.
ARTIFACT_KINDS = {"crash": "crash", "timeout": "hang", "oom": "oom", "leak": "oom"}


@dataclass
class Result:
    """What one fuzzing process did: ``executions`` (libFuzzer's executed units), ``seconds``
    (wall), ``cov``/``ft`` (libFuzzer's last coverage and feature counts), ``corpus`` (its last
    corpus size), ``finding`` (None, or ``uncoded``, ``escape``, ``promise``, ``crash``, ``hang``,
    ``oom``, ``error``: the process failed outside any input), ``signature`` (the exception's
    last line and where), ``artifact`` (the input), ``log``."""

    target: str
    executions: int = 0
    seconds: float = 0.0
    cov: int = 0
    ft: int = 0
    corpus: int = 0
    peak_rss_mb: int = 0
    finding: str | None = None
    signature: str = ""
    artifact: Path | None = None
    log: str = ""
    returncode: int = 0

    @property
    def exec_per_s(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0


_STATUS = re.compile(r"^#(\d+)\s+\w+.*?cov: (\d+) ft: (\d+)(?: corp: (\d+))?", re.M)
_STAT = re.compile(r"^stat::(\w+):\s*(\d+)", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def _classify(log: str, artifact: Path | None) -> tuple[str, str]:
    """(kind, signature) of a finding from the process's log and artifact name."""
    kind = ARTIFACT_KINDS.get(artifact.name.split("-")[0], "crash") if artifact else "error"
    sig = ""
    m = re.search(r"=== Uncaught Python exception: ===\n(.*?)(?:\n==\d+==|\nMS:|\Z)", log, re.S)
    if m:
        lines = [ln for ln in m.group(1).strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else ""
        where = next((ln.strip() for ln in reversed(lines) if ln.strip().startswith("File ") and "/qformat" in ln), "")
        if not where:
            where = next((ln.strip() for ln in reversed(lines) if ln.strip().startswith("File ")), "")
        where = re.sub(r'File ".*?/((?:qformat|tests|readers)[^"]*)"', r"\1", where)
        sig = f"{last[:200]} @ {where}"
        if kind == "crash":
            exc = last.split(":", 1)[0].rsplit(".", 1)[-1]
            kind = {"Escape": "escape", "BrokenPromise": "promise", "AssertionError": "promise"}.get(exc, "uncoded")
    elif kind == "hang":
        m = re.search(r"=== Timeout: (.*?) ===\n(.*?)\nALARM", log, re.S)
        frames = [ln.strip() for ln in m.group(2).splitlines() if ln.strip().startswith("File ")] if m else []
        top = next((f for f in frames if "/qformat" in f), frames[0] if frames else "")
        sig = f"timeout ({m.group(1) if m else '?'}) @ " + re.sub(r'File ".*?/((?:qformat|tests|readers)[^"]*)"', r"\1", top)
    elif kind == "oom":
        m = re.search(r"out-of-memory \(used: (\d+)Mb; (?:exceeds|limit): (\d+)Mb\)", log)
        sig = f"rss {m.group(1)} MB > {m.group(2)} MB" if m else "out of memory"
    elif kind == "crash":
        m = re.search(r"ERROR: libFuzzer: (.*)", log)
        sig = m.group(1).strip() if m else "native crash"
    return kind, sig


def command(name: str, runs: int, seed: int, artifacts: Path, corpora: list[Path], *, seconds: int | None = None,
            plant: str | None = None, timeout_s: int | None = None, rss_limit_mb: int | None = None,
            every_module: bool = False) -> list[str]:
    """The fuzzing process's command line."""
    t = TARGETS[name]
    cmd = [sys.executable, "-m", "tests.atheris_targets", name]
    if plant:
        cmd.append(f"--plant={plant}")
    if every_module:
        cmd.append("--every-module")
    cmd += [f"-runs={runs}", f"-seed={seed}", f"-timeout={timeout_s or t.timeout_s}",
            f"-rss_limit_mb={rss_limit_mb or t.rss_limit_mb}", f"-max_len={t.max_len}", f"-artifact_prefix={artifacts}/",
            "-print_final_stats=1", "-reload=0"]
    if seconds:
        cmd.append(f"-max_total_time={seconds}")
    return cmd + [str(c) for c in corpora]


def run(name: str, runs: int, seed: int, work: Path, *, corpus: Path | None = None, seconds: int | None = None,
        plant: str | None = None, timeout_s: int | None = None, rss_limit_mb: int | None = None, nice: int = 0,
        wall_limit_s: float | None = None, skip: frozenset[str] = frozenset(), every_module: bool = False) -> Result:
    """One fuzzing process of target ``name``: ``runs`` executions (libFuzzer ``-runs``, the
    seeds' first pass included) from ``seed``, growing ``corpus`` (default: a folder in
    ``work``) from a copy of the target's seeds; ``seconds`` bounds its time; ``every_module``:
    every qformat module instrumented (:func:`_import_all`).  Its scratch folder is removed
    afterwards.  ``skip``: SHA-256s of seeds left out (inputs already found to
    fail, so that a restarted run gets past them)."""
    t = TARGETS[name]
    work.mkdir(parents=True, exist_ok=True)
    artifacts, seed_copy, scratch_dir = work / "artifacts", work / "seeds", work / "scratch"
    for d in (artifacts, seed_copy):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    for data in seeds(t).values():
        h = hashlib.sha256(data).hexdigest()
        if h not in skip:
            (seed_copy / h).write_bytes(data)
    corpus = corpus or work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    cmd = command(name, runs, seed, artifacts, [corpus, seed_copy], seconds=seconds, plant=plant, timeout_s=timeout_s,
                  rss_limit_mb=rss_limit_mb, every_module=every_module)
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    env = dict(os.environ, **{SCRATCH_ENV: str(scratch_dir), "PYTHONWARNINGS": "ignore"})
    # Started by a shell that forks it, not by subprocess directly: Linux gives a process started
    # by vfork (as subprocess starts one) its parent's peak resident set at exec, and libFuzzer's
    # -rss_limit_mb judges that peak, so a pytest worker that once held 2 GB made every target
    # "out of memory" at its first input; a forked child starts from the shell's few MB.  Its own
    # session, so that a timeout stops the fuzzer, not only the shell.
    wrapped = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd] if os.name == "posix" else cmd
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(wrapped, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=os.name == "posix")
        try:
            log, _ = proc.communicate(timeout=wall_limit_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            log, _ = proc.communicate()
            log, rc = (log or "") + f"\n[runner] the process ran past {wall_limit_s} s and was stopped\n", -9
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    r = Result(name, seconds=time.monotonic() - t0, log=log, returncode=rc)
    stats = {k: int(v) for k, v in _STAT.findall(log)}
    status = _STATUS.findall(log)
    r.executions = stats.get("number_of_executed_units", int(status[-1][0]) if status else 0)
    if status:
        r.cov, r.ft = int(status[-1][1]), int(status[-1][2])
        r.corpus = int(status[-1][3] or 0)
    r.peak_rss_mb = stats.get("peak_rss_mb", 0)
    found = sorted(artifacts.iterdir())
    m = _ARTIFACT.search(log)
    if found or rc != 0:
        r.artifact = Path(m.group(1)) if m and Path(m.group(1)).exists() else (found[0] if found else None)
        r.finding, r.signature = _classify(log, r.artifact)
        if r.finding == "error":
            r.signature = log.strip().splitlines()[-1][:300] if log.strip() else f"exit status {rc}"
    return r


if __name__ == "__main__":
    child(sys.argv[1:])
