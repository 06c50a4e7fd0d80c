"""Coverage-guided fuzz targets (issue 40, item 7): one harness per reader of input qformat did
not write, registered by a stable id, driven by atheris (libFuzzer for Python).

Each :class:`Target` has ``one_input(data)``: it builds what the bytes say (a file, a folder, a
server's behaviour), runs qformat on it and checks the oracle every target shares:

* every input either succeeds or raises :class:`qformat.errors.QFormatError` (a code of
  qformat/tables/errors.json); any other exception propagates, and atheris records the input as
  a crash (``crash-<sha1>``);
* a run past the target's ``timeout_s`` is a hang (libFuzzer's ``-timeout``: ``timeout-<sha1>``)
  and a process past ``rss_limit_mb`` is exhaustion (``-rss_limit_mb``: ``oom-<sha1>``);
* per target, what else a promise says (an ``AssertionError`` is a crash too): the merge writes
  and reads nothing outside its sandbox, accepted manifest names stay inside the destination,
  remote reads never reach another host and end within their deadlines, two readers of the same
  bytes agree, an importance matrix's failure is blamed on the matrix.

The targets (``TARGETS``):

``header``          the safetensors header, the qformat object and every descriptor:
                    :func:`qformat.io.open_bytes` and each tensor read, then the same bytes as a
                    file through ``load_file(verify=True)`` and ``check(digests=True)``; seeded
                    with the conformance corpus's inputs.
``gguf``            qformat's GGUF reader: ``inspect`` and ``convert --layout gguf`` of the bytes
                    (tests/gguf_hostile.py's :func:`parse_gguf`); seeded with GGUFs gguf-py writes.
``gguf_hf``         a GGUF to a transformers folder (``convert_gguf``) of a tiny llama-shaped
                    GGUF, mutated mostly by a structure-aware mutator (a KV value or tensor info
                    changed and the file written again: tests/gguf_hostile.py's ``mutate``).
``merge``           ``qformat merge`` of a staging folder the bytes edit (manifest members, file
                    names, links and pipes, truncations; records recomputed so edits get past the
                    digests), in a sandbox beside canary files and links to them.
``split_manifest``  a part manifest (``part.json``) read and its names checked by the path policy.
``imatrix``         llama.cpp importance matrices (GGUF and legacy .dat) loaded and applied by
                    ``quantize_checkpoint --preset`` to a tiny llama checkpoint.
``remote``          the remote reader (header, tensors, an index and its shards, ``check``, a side
                    JSON) behind tests/fault_server.py's loopback server, whose behaviour per input
                    the first bytes choose (drip, wrong or short ranges, resets, a redirect to
                    127.0.0.2, huge or negative totals, 200 for a range, a changed file ...).

``python -m tests.fuzz_targets TARGET [--seeds DIR] [libFuzzer flags] [CORPUS ...]`` is one
target's atheris process (libFuzzer ends the process when it is done or finds something);
:func:`run_atheris` starts one and reads its output.  ``scripts/fuzz_atheris.py`` runs them at
scale; tests/test_fuzz_targets.py runs every target briefly with a fixed seed and replays the kept
regression inputs (``tests/fixtures/fuzz/<target>/regressions/``).  This module imports no qformat
module at import time: the child imports them under atheris' instrumentation.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import os
import random
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "fuzz"
CONFORMANCE = ROOT / "conformance" / "v1" / "cases"


@dataclass(frozen=True)
class Target:
    """One fuzz target: ``one_input(data)`` (the harness), ``seeds()`` (name -> bytes, made by
    code here), ``setup()`` (once per process, before the first input), an optional
    structure-aware ``mutator(data, max_size, seed) -> bytes``, the top-level packages atheris
    instruments, and libFuzzer's limits for it; ``short_runs``: executions of the suite's
    seeded run."""

    name: str
    one_input: Callable[[bytes], None]
    seeds: Callable[[], dict[str, bytes]]
    setup: Callable[[], None] = lambda: None
    mutator: Callable[[bytes, int, int], bytes] | None = None
    instrument: tuple[str, ...] = ("qformat",)
    max_len: int = 4096
    timeout_s: int = 20
    rss_limit_mb: int = 2048
    short_runs: int = 200


TARGETS: dict[str, Target] = {}


def register(name: str, **kw: Any) -> Callable[[Callable[[bytes], None]], Callable[[bytes], None]]:
    """Register the decorated ``one_input`` as target ``name`` (a stable id: regression inputs
    are kept under it)."""
    def wrap(fn: Callable[[bytes], None]) -> Callable[[bytes], None]:
        TARGETS[name] = Target(name, fn, **kw)
        return fn
    return wrap


# -- shared helpers ---------------------------------------------------------------------------------
_SCRATCH: Path | None = None


def scratch() -> Path:
    """This process's work folder: ``QFORMAT_FUZZ_SCRATCH`` (the parent removes it; libFuzzer
    ends the process without Python's exit handlers), else a new one on a RAM disk where there
    is one, removed at exit."""
    global _SCRATCH
    if _SCRATCH is None:
        given = os.environ.get("QFORMAT_FUZZ_SCRATCH")
        if given:
            _SCRATCH = Path(given)
            _SCRATCH.mkdir(parents=True, exist_ok=True)
        else:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            _SCRATCH = Path(tempfile.mkdtemp(prefix="qformat-fuzz-", dir=base))
            atexit.register(shutil.rmtree, _SCRATCH, True)
    return _SCRATCH


def fresh(name: str) -> Path:
    """An empty folder ``name`` in :func:`scratch` (emptied of what the last input left)."""
    p = scratch() / name
    if os.path.lexists(p):
        _rmtree(p)
    p.mkdir(parents=True)
    return p


def _rmtree(p: Path) -> None:
    """Remove ``p`` whatever an input left there (folders without permissions, pipes, links)."""
    if os.path.islink(p) or not p.is_dir():
        p.unlink()
        return
    for dirpath, dirs, _ in os.walk(p):
        for d in dirs:
            q = os.path.join(dirpath, d)
            if not os.path.islink(q):
                os.chmod(q, 0o700)
    shutil.rmtree(p)


def coded(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[Any, Any]:
    """``(result, None)``, or ``(None, the QFormatError)``; any other exception propagates (the
    finding)."""
    from qformat.errors import QFormatError

    try:
        return fn(*args, **kw), None
    except QFormatError as e:
        assert isinstance(e.code, str) and e.code, e
        return None, e


class Bytes:
    """The fuzzer's bytes as small decisions: zeros once they run out (so every prefix is an
    input too)."""

    def __init__(self, data: bytes):
        self.data, self.i = data, 0

    def byte(self) -> int:
        if self.i >= len(self.data):
            return 0
        self.i += 1
        return self.data[self.i - 1]

    def int(self, n: int) -> int:
        return (self.byte() | self.byte() << 8) % n if n > 0 else 0

    def choice(self, seq: Any) -> Any:
        return seq[self.int(len(seq))]

    def take(self, n: int) -> bytes:
        out = self.data[self.i:self.i + n]
        self.i += len(out)
        return out

    def text(self) -> str:
        """A string of up to 31 bytes of the input (invalid UTF-8 replaced)."""
        return self.take(self.byte() % 32).decode("utf-8", "replace")

    def rest(self) -> bytes:
        out, self.i = self.data[self.i:], len(self.data)
        return out


def _byte_mutate(data: bytes, max_size: int) -> bytes:
    import atheris

    return atheris.Mutate(data, max_size)


# -- header: the safetensors header, the qformat object, the descriptors ------------------------------
def _header_seeds() -> dict[str, bytes]:
    out = {}
    for p in sorted(CONFORMANCE.glob("*/input.safetensors")):
        if p.stat().st_size <= TARGETS["header"].max_len:
            out[p.parent.name] = p.read_bytes()
    return out


def _header_setup() -> None:
    import qformat.check  # noqa: F401  (imported under the instrumentation, with what they import)
    import qformat.io  # noqa: F401


@register("header", seeds=_header_seeds, setup=_header_setup, max_len=8192, timeout_s=20, short_runs=1500)
def header(data: bytes) -> None:
    """The bytes as a file in memory (every tensor read), then on disk (``load_file`` with its
    digests verified, ``check --digests``).  Promises: a header the in-memory reader refuses is
    refused on disk with the same code; both readers return the same tensors bit for bit."""
    import numpy as np

    import qformat
    from qformat.conformance import compare
    from qformat.io import open_bytes

    mem: dict[str, Any] | None = None
    f, err = coded(open_bytes, data)
    if f is not None:
        with np.errstate(all="ignore"):
            got, err = coded(lambda: {k: f.get_tensor(k) for k in f.keys()})
        if got is not None and not f.model.problems():
            mem = got
    path = fresh("header") / "x.safetensors"
    path.write_bytes(data)
    with np.errstate(all="ignore"):
        disk, err2 = coded(qformat.load_file, path)
        coded(qformat.load_file, path, verify=True)
        report = qformat.check(path, digests=True)  # a report, never an exception
    assert isinstance(report.ok, bool)
    if f is None and err is not None:
        assert err2 is not None, f"open_bytes refuses the header ({err.code}) and load_file reads the file"
        # load_file first tells a file that is no safetensors file at all (GGUF, ZIP, text) by its first bytes
        other = {"NOT_SAFETENSORS"} | ({"FILE_UNREADABLE"} if data[:4] == b"GGUF" else set())
        assert err2.code == err.code or err2.code in other, f"open_bytes says {err.code}, load_file {err2.code}"
    if mem is not None and disk is not None:
        diff = compare(disk, mem)
        assert diff is None, f"load_file and open_bytes differ: {diff}"


# -- gguf: qformat's GGUF reader ------------------------------------------------------------------------
_TINY = dict(hidden=32, inter=64, heads=4, kv_heads=2, layers=1)


def _tiny_vocab() -> dict[str, Any]:
    """A tokenizer.json-shaped dict: a 32-token byte-level BPE vocabulary with two merges."""
    vocab = {"<s>": 0, "</s>": 1}
    for c in list("abcdefghijklmnopqrstuvwxyz") + ["\u0120", "."]:
        vocab[c] = len(vocab)
    merges = [("t", "h"), ("th", "e")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return {"model": {"vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}, "added_tokens": []}


def tiny_llama_gguf(path: Path, qtype: str = "Q8_0", tie: bool = False, arch: str = "llama", seed: int = 0,
                    types: dict[str, str] | None = None) -> Path:
    """A llama-shaped GGUF of one block (hidden 32, 4 heads, 2 KV heads, 32 tokens) laid out as
    llama.cpp's converter lays it out (tests/gguf_models.py): about 15 KB."""
    import numpy as np

    from .gguf_models import write_gguf_from

    tj = _tiny_vocab()
    v, h, i = len(tj["model"]["vocab"]), _TINY["hidden"], _TINY["inter"]
    kv = h // _TINY["heads"] * _TINY["kv_heads"]
    cfg = dict(num_hidden_layers=_TINY["layers"], hidden_size=h, intermediate_size=i, num_attention_heads=_TINY["heads"],
               num_key_value_heads=_TINY["kv_heads"], max_position_embeddings=64, vocab_size=v, rms_norm_eps=1e-5,
               tie_word_embeddings=tie)
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not tie:
        shapes["lm_head.weight"] = (v, h)
    for layer in range(_TINY["layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    rng = np.random.default_rng(seed)
    tensors = [(n, rng.standard_normal(s).astype(np.float32)) for n, s in shapes.items()]
    return write_gguf_from(path, arch, cfg, tj, tensors, qtype=qtype, types=types, seed=seed + 1)


def _mixed_gguf(path: Path) -> Path:
    """A GGUF of every value type (nested arrays too), a custom alignment and tensors of many
    ggml types and ranks."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.strs", ["a", "", "bc"])
    w.add_array("t.floats", [0.5, -1.0])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("f32", rng.standard_normal((4, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 16)).astype(np.float16))
    w.add_tensor("bf16", rng.integers(0, 2**15, (2, 8), dtype=np.uint16).view(np.uint8).reshape(2, 16),
                 raw_shape=(2, 16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.add_tensor("i8", rng.integers(-128, 128, (3, 5), dtype=np.int8))
    w.add_tensor("i32", rng.integers(-1000, 1000, (6,), dtype=np.int32))
    w.add_tensor("rank3", rng.standard_normal((2, 2, 4)).astype(np.float32))
    for t in ("Q4_0", "Q4_1", "Q5_0", "Q8_0"):
        q = gguf.GGMLQuantizationType[t]
        raw = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), q)
        w.add_tensor(t.lower(), raw, raw_shape=raw.shape, raw_dtype=q)
    for t, offs in (("Q4_K", (0, 2)), ("Q6_K", (208,))):
        q = gguf.GGMLQuantizationType[t]
        block, size = gguf.GGML_QUANT_SIZES[q]
        raw = rng.integers(0, 256, (2, size), dtype=np.uint8)
        for off in offs:  # small finite float16 scales
            raw[:, off:off + 2] = np.full((2, 1), 0.005, np.float16).view(np.uint8)
        w.add_tensor(t.lower(), raw, raw_shape=(2, 2 * size), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _gguf_seeds() -> dict[str, bytes]:
    from .gguf_hostile import imatrix_files

    work = fresh("gguf-seeds")
    out = {"tiny-llama-q8_0": tiny_llama_gguf(work / "a.gguf").read_bytes(),
           "tiny-llama-mixed": tiny_llama_gguf(work / "b.gguf", qtype="F16", tie=True, types={"ffn_down": "Q4_0", "attn_v": "F32"}).read_bytes(),
           "mixed-types": _mixed_gguf(work / "m.gguf").read_bytes()}
    out["imatrix"] = imatrix_files(work)[0].read_bytes()
    return out


def _gguf_parts(data: bytes) -> Any:
    """tests/gguf_hostile.py's editable parts of ``data``, or None when qformat cannot read it."""
    from qformat.errors import QFormatError

    from .gguf_hostile import read_parts

    p = scratch() / "mutator.gguf"
    p.write_bytes(data)
    try:
        return read_parts(p)
    except (QFormatError, ValueError, KeyError, TypeError, OverflowError):  # mutants the reader or the parts cannot hold
        return None


def _gguf_mutator(share: float) -> Callable[[bytes, int, int], bytes]:
    """A mutator that edits a parsed GGUF's key/values and tensor infos (tests/gguf_hostile.py's
    :func:`mutate`: most mutants stay readable, so they reach what reads the metadata) for a share
    ``share`` of the mutants, libFuzzer's byte mutations for the rest."""
    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        from .gguf_hostile import mutate as mutate_parts, to_bytes

        rng = random.Random(seed)
        if data[:4] == b"GGUF" and rng.random() < share:
            parts = _gguf_parts(data)
            if parts is not None:
                try:
                    out = to_bytes(mutate_parts(parts, rng)[0])
                except (ValueError, KeyError, TypeError, OverflowError, struct.error):  # an edit the writer cannot store
                    out = b""
                if out and len(out) <= max_size:
                    return out
        return _byte_mutate(data, max_size)
    return mutate


def _gguf_setup() -> None:
    import qformat.convert  # noqa: F401
    import qformat.convert.gguf_file  # noqa: F401
    import qformat.inspection  # noqa: F401


@register("gguf", seeds=_gguf_seeds, setup=_gguf_setup, mutator=_gguf_mutator(0.5), max_len=65536, timeout_s=30, short_runs=150)
def gguf_reader(data: bytes) -> None:
    """The bytes as a ``.gguf`` file: ``inspect``, then ``convert --layout gguf`` (every component)."""
    from .gguf_hostile import parse_gguf

    tempfile.tempdir = str(scratch())
    parse_gguf(data)


# -- gguf_hf: GGUF to a transformers folder ---------------------------------------------------------------
def _gguf_hf_seeds() -> dict[str, bytes]:
    work = fresh("gguf-hf-seeds")
    return {"tiny-llama-q8_0": tiny_llama_gguf(work / "a.gguf").read_bytes(),
            "tiny-llama-f16-tied": tiny_llama_gguf(work / "b.gguf", qtype="F16", tie=True).read_bytes(),
            "tiny-mistral-mixed": tiny_llama_gguf(work / "c.gguf", arch="mistral", types={"ffn_down": "Q4_0", "attn_q": "F32"},
                                                  seed=5).read_bytes()}


def _gguf_hf_setup() -> None:
    import qformat_transformers.gguf_layout  # noqa: F401  (torch and transformers: seconds, once)


@register("gguf_hf", seeds=_gguf_hf_seeds, setup=_gguf_hf_setup, mutator=_gguf_mutator(0.9),
          instrument=("qformat", "qformat_transformers"), max_len=65536, timeout_s=60, rss_limit_mb=4096, short_runs=40)
def gguf_hf(data: bytes) -> None:
    """The bytes as a ``.gguf`` file converted to a transformers folder (``convert --layout hf``)."""
    from .gguf_hostile import convert_hf

    tempfile.tempdir = str(scratch())
    convert_hf(data)


# -- merge and split manifests ----------------------------------------------------------------------------
#: Segments hostile names are made of (each may climb, be empty, absolute, odd, or another file's name).
SEGMENTS = ("..", ".", "", "x", "tree", "shards", "canary.txt", "canary-link", "outside", "out", "out.parts", "sub", "/", "\\", "\0",
            "C:", "~", ".qformat-merge.lock", ".qformat-writer.json", ".qformat-x", "part-1-of-2", "part.json", "config.json",
            "tokenizer.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "1_Pooling", "a" * 300,
            "%2e%2e", "\u00e9", " ", "x\n")
_TEMPLATE: Path | None = None


def merge_template() -> Path:
    """A finished staging folder (``out.parts``) of a two-part int4 quantize of a small sharded
    llama with a side tree (tests/test_split_convert.py's), made once per process."""
    global _TEMPLATE
    if _TEMPLATE is None:
        import qformat

        from .test_split_convert import INT4, _llama

        base = fresh("merge-template")
        _llama(base / "src", layers=2, shards=3)
        for k in (1, 2):
            qformat.quantize_checkpoint(base / "src", base / "out", part=f"{k}/2", **INT4)
        _TEMPLATE = base / "out.parts"
    return _TEMPLATE


def _name(b: Bytes) -> str:
    if b.byte() % 8 == 0:
        return b.text()  # the fuzzer's own string
    return "/".join(b.choice(SEGMENTS) for _ in range(1 + b.int(4)))


def _value(b: Bytes) -> Any:
    return b.choice([_name(b), b.int(1 << 16) - 100, -1, 0, None, True, 1.5, [], {}, "0" * 64, "g" * 64, 2, 10**30, float("nan"),
                     {"size": 1, "sha256": "0" * 64}, "qformat-split-part", "quantize"])


def edit_manifest(m: dict[str, Any], b: Bytes) -> None:
    """One edit of a parsed part manifest that the next bytes choose: a hostile name, number or
    type in a member (tree, assignment, files, index, top-level)."""
    what = b.int(9)
    tree, files, assignment = m.get("tree"), m.get("files"), m.get("assignment")
    if what == 0 and isinstance(tree, dict):  # a tree entry under a hostile name
        tree[_name(b)] = copy.deepcopy(b.choice(list(tree.values()))) if tree else {"size": 0, "sha256": "0" * 64}
    elif what == 1 and isinstance(assignment, dict) and assignment:  # a planned file renamed
        old = b.choice(sorted(assignment))
        new = _name(b)
        assignment[new] = assignment.pop(old)
        if isinstance(files, dict) and old in files:
            files[new] = files.pop(old)
    elif what == 2 and m:  # a top-level member replaced
        m[b.choice(sorted(m))] = _value(b)
    elif what == 3 and isinstance(files, dict) and files:  # a file record's member replaced
        rec = files[b.choice(sorted(files))]
        if isinstance(rec, dict) and rec:
            rec[b.choice(sorted(rec))] = _value(b)
    elif what == 4:
        m["index"] = b.choice([_name(b), None, b.choice(sorted(tree)) if isinstance(tree, dict) and tree else "x"])
    elif what == 5 and isinstance(tree, dict) and tree:
        tree.pop(b.choice(sorted(tree)))
    elif what == 6 and isinstance(assignment, dict) and assignment:  # a file moved to another part
        assignment[b.choice(sorted(assignment))] = b.choice([1, 2, 3, 0, -1, "1"])
    elif what == 7:
        m[b.choice(["version", "parts", "part", "format", "command"])] = b.choice([1, 2, 3, 0, "2", None, "convert", "dequantize"])
    else:  # a tree record's member replaced
        if isinstance(tree, dict) and tree:
            rec = tree[b.choice(sorted(tree))]
            if isinstance(rec, dict) and rec:
                rec[b.choice(sorted(rec))] = _value(b)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fix_records(part: Path, m: dict[str, Any]) -> None:
    """Make the manifest's records say what the part folder holds (sizes and digests of the
    regular files there), so that edits get past the digest checks to what follows them."""
    from qformat.checkpoint.split import _header_bytes

    for key, sub in (("files", "shards"), ("tree", "tree")):
        recs = m.get(key)
        if not isinstance(recs, dict):
            continue
        for name, rec in recs.items():
            if not isinstance(name, str) or "\0" in name or not isinstance(rec, dict):
                continue
            p = part / sub / name
            try:
                if not stat.S_ISREG(os.lstat(p).st_mode):
                    continue
                raw = p.read_bytes()
            except (OSError, ValueError):
                continue
            rec["size"], rec["sha256"] = len(raw), _sha(raw)
            if key == "files":
                try:
                    rec["header_sha256"] = _sha(_header_bytes(str(p)))
                except Exception:  # noqa: BLE001 - not a safetensors file: its record stays as it was
                    pass


def _edit_files(part: Path, case: Path, m: dict[str, Any], b: Bytes) -> None:
    """One edit of a part folder's files: a link to the canary outside the sandbox (absolute or
    relative), a link to a folder outside, a link inside the part, a pipe, a truncation, a flipped
    byte, a new file under a name the manifest then lists, a folder replaced by a link."""
    inside = str(part) + os.sep
    files = sorted(p for p in part.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "part.json"
                   and os.path.realpath(p).startswith(inside))  # never one reached through a link this harness made
    how = b.int(9)
    if how == 8:  # a new tree file under a (possibly hostile) name, listed in the manifest
        name = _name(b)
        try:
            target = part / "tree" / name
            if os.path.realpath(target).startswith(str(part) + os.sep):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(b.take(b.byte()))
        except (OSError, ValueError):
            pass
        if isinstance(m.get("tree"), dict):
            m["tree"][name] = {"size": 0, "sha256": "0" * 64}
        return
    if not files:
        return
    p = b.choice(files)
    if how == 0:
        p.unlink()
        os.symlink(case / "canary.txt", p)
    elif how == 1:
        p.unlink()
        os.symlink(os.path.relpath(case / "canary-link", p.parent), p)
    elif how == 2:
        p.unlink()
        os.symlink(case / "outside", p)
    elif how == 3 and len(files) > 1:
        q = b.choice([f for f in files if f != p])
        p.unlink()
        os.symlink(os.path.relpath(q, p.parent), p)
    elif how == 4:
        p.unlink()
        os.mkfifo(p)
    elif how == 5:
        raw = p.read_bytes()
        p.write_bytes(raw[:b.int(len(raw) + 1)])
    elif how == 6:
        raw = bytearray(p.read_bytes())
        if raw:
            raw[b.int(len(raw))] ^= 1 + b.byte() % 255
            p.write_bytes(bytes(raw))
    else:  # the file's folder replaced by a link to the folder outside
        d = p.parent
        if d != part:
            shutil.rmtree(d)
            os.symlink(case / "outside", d)


def _snapshot(root: Path, skip: Path) -> dict[str, Any]:
    """Every entry under ``root`` except under ``skip``: files by content and mode, links by target,
    folders by mode and listing."""
    out: dict[str, Any] = {}
    for dirpath, dirs, names in os.walk(root):
        d = Path(dirpath)
        if d == skip or skip in d.parents:
            dirs[:] = []
            continue
        out[os.path.relpath(d, root) + "/"] = (stat.S_IMODE(os.lstat(d).st_mode), sorted(dirs + names))
        for n in names + [x for x in dirs if os.path.islink(d / x)]:
            p = d / n
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(root))] = ("link", os.readlink(p))
            else:
                out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), p.read_bytes())
        dirs[:] = [x for x in dirs if not os.path.islink(d / x)]
    return out


_CANARY = b"canary: qformat must neither read nor change this file\n"


def _merge_seeds() -> dict[str, bytes]:
    # byte 0: mode (bit 0: part 2's manifest, bit 1: fix the records, bit 2: overwrite,
    # bits 3-4: what is at DST, bit 7: the manifest's text is the rest); byte 1: edits; then the edits' bytes
    return {"as-is": b"\x00\x00", "fixed": b"\x02\x00", "part2-edit": b"\x03\x01\x00\x00\x01",
            "tree-dotdot": b"\x02\x01\x00\x00\x00\x01\x01\x00\x00\x00\x00",
            "link-to-canary": b"\x02\x81\x00\x00\x00\x00", "new-tree-file": b"\x02\x81\x08\x00\x01\x03\x00\x00\x04abcd",
            "dst-link": b"\x1e\x00", "raw": b"\x80{\"format\": \"qformat-split-part\", \"version\": 2}"}


def _merge_setup() -> None:
    import qformat.checkpoint.split  # noqa: F401

    merge_template()


@register("merge", seeds=_merge_seeds, setup=_merge_setup, max_len=512, timeout_s=60, short_runs=120)
def merge(data: bytes) -> None:
    """A staging folder the bytes edit, merged in a sandbox (module docstring).  Promises:
    nothing outside the sandbox is changed or copied (canary files, a link to one, a folder, all
    compared before and after; a merged file never holds the canary's bytes); a refusal leaves no
    destination and no temporary; a merge that succeeds leaves only regular files and folders, no
    wider than the user's default mode."""
    from qformat.atomic import default_mode
    from qformat.checkpoint import split

    b = Bytes(data)
    mode, edits = b.byte(), b.byte()
    case = fresh("merge")
    (case / "canary.txt").write_bytes(_CANARY)
    os.chmod(case / "canary.txt", 0o600)
    os.symlink("canary.txt", case / "canary-link")
    (case / "outside").mkdir()
    (case / "outside" / "secret.txt").write_bytes(_CANARY)
    box = case / "box"
    box.mkdir()
    dst = box / "out"
    staging = Path(split.staging_folder(dst))
    shutil.copytree(merge_template(), staging)
    part = staging / f"part-{1 + (mode & 1)}-of-2"
    manifest = part / "part.json"
    at_dst = (mode >> 3) & 3
    if at_dst == 1:  # an earlier result
        dst.mkdir()
        (dst / "old.txt").write_text("old")
    elif at_dst == 2:  # a link to a folder outside the sandbox
        os.symlink(case / "outside", dst)
    elif at_dst == 3:  # a link to the canary
        os.symlink(case / "canary.txt", dst)
    if mode & 0x80:
        manifest.write_bytes(b.rest())
    else:
        m = json.loads(manifest.read_text())
        for _ in range(edits & 0x7F and 1 + (edits & 0x7F) % 6):
            if b.byte() & 1:
                _edit_files(part, case, m, b)
            else:
                edit_manifest(m, b)
        if mode & 2:
            _fix_records(part, m)
        manifest.write_text(json.dumps(m))
    before = _snapshot(case, box)
    dst_before = _snapshot(dst, case) if dst.is_dir() and not dst.is_symlink() else None
    summary, err = coded(split.merge, dst, overwrite=bool(mode & 4))
    assert _snapshot(case, box) == before, "the merge changed something outside its sandbox"
    left = [n for n in os.listdir(box) if n.startswith(".qformat-")]
    assert not left, f"the merge left {left}"
    if err is not None:
        if at_dst == 0:
            assert not os.path.lexists(dst), f"a refused merge ({err.code}) left a destination"
        elif dst_before is not None:
            assert _snapshot(dst, case) == dst_before, f"a refused merge ({err.code}) changed the earlier destination"
        return
    assert dst.is_dir() and not dst.is_symlink(), "a merge that succeeded left no destination folder"
    widest = default_mode()
    for dirpath, dirs, names in os.walk(dst):
        for n in names + dirs:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), f"merged {p} is not a regular file or folder"
            if stat.S_ISREG(st.st_mode):
                assert stat.S_IMODE(st.st_mode) & ~widest == 0, f"merged {p} has mode {oct(st.st_mode)}, wider than {oct(widest)}"
                with open(p, "rb") as fh:
                    assert _CANARY not in fh.read(), f"merged {p} holds the canary's bytes (read from outside the sandbox)"


def _split_manifest_seeds() -> dict[str, bytes]:
    t = merge_template()
    out = {f"part-{k}": (t / f"part-{k}-of-2" / "part.json").read_bytes() for k in (1, 2)}
    m = json.loads(out["part-1"])
    m["tree"]["sub/deeper/x.json"] = {"size": 1, "sha256": "0" * 64}
    out["nested-tree"] = json.dumps(m).encode()
    out["tiny"] = b'{"format": "qformat-split-part", "version": 2, "part": 1, "parts": 1}'
    return out


def _json_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """Mostly a parsed manifest with :func:`edit_manifest`'s edits (random bytes choose them), else
    libFuzzer's byte mutations."""
    rng = random.Random(seed)
    if rng.random() < 0.7:
        try:
            m = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            m = None
        if isinstance(m, dict):
            b = Bytes(rng.randbytes(64))
            for _ in range(1 + rng.randrange(3)):
                edit_manifest(m, b)
            out = json.dumps(m).encode()
            if len(out) <= max_size:
                return out
    return _byte_mutate(data, max_size)


def _split_setup() -> None:
    import qformat.checkpoint.split  # noqa: F401
    import qformat.paths  # noqa: F401


@register("split_manifest", seeds=_split_manifest_seeds, setup=_split_setup, mutator=_json_mutator, max_len=16384,
          timeout_s=20, short_runs=1500)
def split_manifest(data: bytes) -> None:
    """The bytes as a part's ``part.json``: read and validated, its names checked as the merge
    checks them.  Promise: every name the path policy accepts is a relative path that stays
    inside the destination; a ``--part`` value made of the first bytes is K/N with 1 <= K <= N or
    refused."""
    from qformat.checkpoint import split

    p, err = coded(split.parse_part, data[:16].decode("latin-1"))
    assert err is not None or 1 <= p.k <= p.n, p
    work = scratch() / "split"
    folder = work / "part-1-of-2"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part.json").write_bytes(data)
    m, err = coded(split._read_manifest, str(folder))
    if m is None:
        return
    dst = str(work / "dst")
    _, err = coded(split._check_names, dst, str(folder), m["assignment"], m)
    if err is not None:
        return
    real = os.path.realpath(dst)
    for name in [*m["assignment"], *m["tree"]]:
        segs = name.split("/")
        assert name and "\0" not in name and "\\" not in name and not os.path.isabs(name), f"accepted {name!r}"
        assert all(s not in ("", ".", "..") for s in segs), f"accepted {name!r}"
        assert os.path.realpath(os.path.join(real, *segs)).startswith(real + os.sep), f"accepted {name!r}, outside {dst}"
    assert m["index"] is None or m["index"] in m["tree"], m["index"]


# -- imatrix: llama.cpp importance matrices, loaded and applied -------------------------------------------
_IM_SHAPES = {"hidden": 256, "kv": 128, "ffn": 256, "vocab": 32}
_IM_SRC: Path | None = None


def _imatrix_source() -> Path:
    """A one-block llama checkpoint (hidden 256: whole K-quant blocks) and its config, made once."""
    global _IM_SRC
    if _IM_SRC is None:
        import numpy as np

        import qformat

        from .test_gguf_scheme import _llama_shapes

        src = fresh("imatrix-src")
        s = _IM_SHAPES
        cfg = {"model_type": "llama", "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
               "hidden_size": s["hidden"], "intermediate_size": s["ffn"], "vocab_size": s["vocab"], "architectures": ["LlamaForCausalLM"]}
        (src / "config.json").write_text(json.dumps(cfg))
        rng = np.random.default_rng(0)
        qformat.save_file({n: rng.standard_normal(sh).astype(np.float32)
                           for n, sh in _llama_shapes(1, s["hidden"], s["kv"], s["ffn"], s["vocab"]).items()}, src / "model.safetensors")
        _IM_SRC = src
    return _IM_SRC


def _imatrix_entries() -> dict[str, tuple[Any, Any]]:
    import numpy as np

    from qformat import gguf_presets

    from .test_gguf_scheme import _llama_shapes

    s = _IM_SHAPES
    shapes = _llama_shapes(1, s["hidden"], s["kv"], s["ffn"], s["vocab"])
    cfg = json.loads((_imatrix_source() / "config.json").read_text())
    rng = np.random.default_rng(5)
    return {g: (rng.gamma(1.0, 30.0, shapes[n][-1]).astype(np.float32), np.array([6.0]))
            for n, g in gguf_presets.gguf_names(list(shapes), cfg).items()
            if g and len(shapes[n]) == 2 and g != "token_embd.weight"}


def _imatrix_seeds() -> dict[str, bytes]:
    from .imatrix_files import dat_bytes, write_gguf

    work = fresh("imatrix-seeds")
    entries = _imatrix_entries()
    some = dict(list(entries.items())[:2])
    return {"gguf-full": write_gguf(work / "a.gguf", entries).read_bytes(),
            "gguf-two": write_gguf(work / "b.gguf", some, chunk_count=1).read_bytes(),
            "dat-full": dat_bytes({k: (s / c[0] * 2, 2) for k, (s, c) in entries.items()}),
            "dat-two-no-dataset": dat_bytes({k: (s, 1) for k, (s, _) in some.items()}, chunk_count=None)}


def _imatrix_setup() -> None:
    import qformat.checkpoint.quantize  # noqa: F401
    import qformat.imatrix  # noqa: F401
    import qformat.schemes.gguf  # noqa: F401

    _imatrix_source()


_PRESETS = ("Q4_0", "Q4_K_M", "Q2_K_S", "Q6_K")


@register("imatrix", seeds=_imatrix_seeds, setup=_imatrix_setup, mutator=_gguf_mutator(0.3), max_len=16384, timeout_s=60,
          short_runs=120)
def imatrix(data: bytes) -> None:
    """The bytes as an importance matrix (GGUF or legacy .dat, by the magic), loaded, then applied
    by ``quantize_checkpoint --preset`` (the preset chosen by the input's length) to a one-block
    llama.  Promises: the weights are ordinary, so a refusal while applying is IMATRIX_INVALID
    naming a tensor (or ENCODE_PARAM_INVALID), never blamed on the weights; a refusal writes nothing."""
    from qformat.checkpoint.quantize import quantize_checkpoint
    from qformat.imatrix import load_imatrix

    work = fresh("imatrix")
    path = work / "imatrix.dat"
    path.write_bytes(data)
    im, err = coded(load_imatrix, path)
    if im is None:
        assert err.code == "IMATRIX_INVALID", f"{err.code}: an unreadable importance matrix is IMATRIX_INVALID"
        return
    dst = work / "out"
    _, err = coded(quantize_checkpoint, _imatrix_source(), dst, preset=_PRESETS[len(data) % len(_PRESETS)], imatrix=im)
    if err is not None:
        assert not os.path.lexists(dst), f"a refused quantize ({err.code}) left {dst}"
        assert err.code in ("IMATRIX_INVALID", "ENCODE_PARAM_INVALID"), f"{err.code}: {err} (the weights are ordinary)"
        assert err.code != "IMATRIX_INVALID" or err.tensor is not None, f"IMATRIX_INVALID names no tensor: {err}"


# -- remote: the remote reader behind a fault-injecting server ------------------------------------------------
_FS: Any = None
#: The deadline of each remote read of the harness (seconds): a drip or a silence ends after it.
REMOTE_DEADLINE_S = 0.2
_ACTIONS = ("tensors", "index", "header", "check", "side_json", "slice")


def _remote_server() -> Any:
    """The loopback servers (tests/fault_server.py) serving a small qformat file, a two-shard
    checkpoint with its index and a side JSON; started once per process."""
    global _FS
    if _FS is None:
        import numpy as np

        import qformat
        from qformat import remote

        from .fault_server import FaultServer

        folder = fresh("remote-served")
        rng = np.random.default_rng(0)
        qformat.save_file({"w": qformat.quantize(rng.standard_normal((8, 64)).astype(np.float32), "int", bits=4, group_size=32),
                           "b": rng.standard_normal(8).astype(np.float32)}, folder / "m.safetensors")
        wm = {}
        for i, names in enumerate((("x", "y"), ("z",))):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            qformat.save_file({n: qformat.quantize(rng.standard_normal((4, 32)).astype(np.float32), "int", bits=8, group_size=32)
                               for n in names}, folder / fn)
            wm.update({n: fn for n in names})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
        _FS = FaultServer(folder, deadline_s=REMOTE_DEADLINE_S).__enter__()
        remote.DEFAULT_OPTIONS = _FS.options
    return _FS


def _remote_seeds() -> dict[str, bytes]:
    from .fault_server import MODES

    return {f"{mode}-{action}": bytes([i, 0, 17, 3, 0, 0, 0, 0, a])
            for i, mode in enumerate(MODES) for a, action in enumerate(_ACTIONS)}


def _remote_setup() -> None:
    import qformat.check  # noqa: F401
    import qformat.index  # noqa: F401
    import qformat.remote  # noqa: F401

    _remote_server()


def _same_as_local(got: dict[str, Any], folder: Path, name: str) -> None:
    import qformat
    from qformat.conformance import compare

    diff = compare(qformat.load_file(folder / name), got)
    assert diff is None, f"{name} over HTTP differs from the file: {diff}"


@register("remote", seeds=_remote_seeds, setup=_remote_setup, max_len=64, timeout_s=30, short_runs=60)
def remote_read(data: bytes) -> None:
    """Bytes 0-7 choose the server's fault (tests/fault_server.py's :func:`faults_from_bytes`),
    byte 8 what is read: every tensor of a file, a sharded checkpoint by its index, a header,
    ``check --digests``, a side JSON, a slice.  Promises: a refusal is a code; a value read equals
    the file's; no request reaches the other host (127.0.0.2); each read ends within its deadline."""
    import qformat
    from qformat import remote
    from qformat.remote import fetch_bytes

    fs = _remote_server()
    fs.use_bytes(data[:8])
    action = _ACTIONS[data[8] % len(_ACTIONS)] if len(data) > 8 else "tensors"
    remote.forget_opened()
    t0 = time.monotonic()
    if action == "tensors":
        fs.read("m.safetensors")  # compares with the file, checks the other host and the time itself
        return
    reads = 16
    if action == "index":
        got, _ = coded(qformat.load_file, fs.url + "model.safetensors.index.json")
        if got is not None:
            _same_as_local(got, fs.folder, "model.safetensors.index.json")
    elif action == "header":
        coded(remote.read_header, fs.url + "m.safetensors")
    elif action == "check":
        report = qformat.check(fs.url + "m.safetensors", digests=True)
        assert isinstance(report.ok, bool)
    elif action == "side_json":
        got, _ = coded(fetch_bytes, fs.url + "config.json", 1 << 10)
        assert got is None or got == (fs.folder / "config.json").read_bytes()[:(1 << 10) + 1], "the side JSON differs"
    else:
        def one_slice() -> Any:
            with qformat.safe_open(fs.url + "m.safetensors") as f:
                return f.get_slice("w")[1:3]
        got, _ = coded(one_slice)
        if got is not None:
            want = qformat.load_file(fs.folder / "m.safetensors")["w"][1:3]
            assert got.tobytes() == want.tobytes(), "a slice over HTTP differs from the file's"
    elapsed = time.monotonic() - t0
    assert fs.other.log.requests == [], f"a request reached the other host: {fs.other.log.requests}"
    assert elapsed < reads * (REMOTE_DEADLINE_S + 1.0), f"{action}: {elapsed:.1f} s, more than {reads} reads' deadlines"


# -- the atheris process ---------------------------------------------------------------------------------
def write_seeds(target: Target, folder: Path) -> int:
    """Write ``target``'s seeds into ``folder`` (one file each); how many."""
    folder.mkdir(parents=True, exist_ok=True)
    seeds = target.seeds()
    for name, data in seeds.items():
        (folder / re.sub(r"[^A-Za-z0-9_.-]", "_", name)).write_bytes(data)
    return len(seeds)


def child(argv: list[str]) -> None:
    """``TARGET [--seeds DIR] [libFuzzer args]``: instrument qformat, set the target up, write its
    seeds into DIR (when empty) and fuzz (libFuzzer ends the process)."""
    import atheris

    name, rest = argv[0], argv[1:]
    target = TARGETS[name]
    corpora = []
    if rest[:1] == ["--seeds"]:
        seeds, rest = Path(rest[1]), rest[2:]
        corpora.append(str(seeds))
    tempfile.tempdir = str(scratch())
    with atheris.instrument_imports(include=list(target.instrument)):
        target.setup()
        if corpora and not any(Path(corpora[0]).glob("*")):
            write_seeds(target, Path(corpora[0]))
        first = sorted(Path(corpora[0]).iterdir())[:1] if corpora else []
        for p in first:  # what the target imports on first use is imported instrumented too
            try:
                target.one_input(p.read_bytes())
            except Exception:  # noqa: BLE001 - libFuzzer runs the seed again and records it
                pass
    kw = {"custom_mutator": target.mutator} if target.mutator is not None else {}
    atheris.Setup([sys.argv[0], *rest, *corpora], target.one_input, **kw)
    atheris.Fuzz()


@dataclass
class Result:
    """What one atheris process did: ``executions`` (libFuzzer's count), ``seconds`` (wall, start
    included), ``cov``/``ft`` (libFuzzer's coverage and feature counts at the end), ``finding``
    (``crash``, ``timeout``, ``oom`` or None), ``artifact`` (the input libFuzzer wrote),
    ``signature`` (the exception and where it was raised, for grouping), ``returncode``, ``log``
    (the output's last lines)."""

    target: str
    executions: int = 0
    seconds: float = 0.0
    cov: int = 0
    ft: int = 0
    finding: str | None = None
    artifact: Path | None = None
    signature: str = ""
    returncode: int = 0
    log: str = ""
    corpus_added: int = 0


_COV = re.compile(r"cov: (\d+) ft: (\d+)")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")


def _signature(out: str) -> str:
    """The uncaught exception's type and message head, and the last qformat (or test) frame."""
    block = out.split("=== Uncaught Python exception: ===", 1)
    if len(block) < 2:
        return ""
    lines = block[1].strip().splitlines()
    head = lines[0][:160] if lines else ""
    frames = [x.strip() for x in lines if x.strip().startswith("File ")]
    ours = [f for f in frames if "/qformat" in f or "/tests/" in f] or frames
    where = ours[-1] if ours else ""
    where = re.sub(r'File ".*?/((?:qformat|readers|tests)/[^"]+)"', r"\1", where)
    return f"{head} @ {where}"


def run_atheris(name: str, runs: int, seed: int, work: Path, *, corpus: Path | None = None, max_time: int | None = None,
                extra: list[str] | None = None, python: str | None = None) -> Result:
    """Run target ``name`` in its own atheris process for ``runs`` executions with libFuzzer's
    ``seed`` (``max_time``: at most that many seconds), its corpus growing in ``corpus`` (default
    ``work/corpus``), seeds in ``work/seeds``, artifacts in ``work/artifacts``; parse its output."""
    target = TARGETS[name]
    for sub in ("seeds", "artifacts", "scratch"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    corpus = corpus or work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    before = len(os.listdir(corpus))
    args = [python or sys.executable, "-m", "tests.fuzz_targets", name, "--seeds", str(work / "seeds"),
            f"-runs={runs}", f"-seed={seed}", f"-timeout={target.timeout_s}", f"-rss_limit_mb={target.rss_limit_mb}",
            f"-max_len={target.max_len}", f"-artifact_prefix={work / 'artifacts'}/", "-print_final_stats=1",
            *([f"-max_total_time={max_time}"] if max_time else []), *(extra or []), str(corpus)]
    env = dict(os.environ, QFORMAT_FUZZ_SCRATCH=str(work / "scratch"), PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
    old = set(os.listdir(work / "artifacts"))
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace")
    secs = time.monotonic() - t0
    shutil.rmtree(work / "scratch", ignore_errors=True)
    out = proc.stdout + proc.stderr
    r = Result(name, seconds=secs, returncode=proc.returncode, log="\n".join(out.splitlines()[-60:]))
    m = re.findall(r"stat::number_of_executed_units: (\d+)", out)
    r.executions = int(m[-1]) if m else 0
    covs = _COV.findall(out)
    if covs:
        r.cov, r.ft = int(covs[-1][0]), int(covs[-1][1])
    new = sorted(set(os.listdir(work / "artifacts")) - old)
    if new:
        r.artifact = work / "artifacts" / new[0]
        r.finding = new[0].split("-", 1)[0]
        r.signature = _signature(out) or next((x for x in out.splitlines() if "ERROR: libFuzzer" in x), "")
    elif proc.returncode != 0:
        r.finding = "error"
        r.signature = next((x for x in reversed(out.splitlines()) if x.strip()), "")[:300]
    r.corpus_added = len(os.listdir(corpus)) - before
    return r


def regressions(name: str) -> list[Path]:
    """The kept inputs of target ``name`` that once failed (tests/fixtures/fuzz/NAME/regressions/)."""
    d = FIXTURES / name / "regressions"
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")) if d.is_dir() else []


if __name__ == "__main__":
    child(sys.argv[1:])
