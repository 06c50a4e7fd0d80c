"""Hostile GGUF files and importance matrices (issue 40): a GGUF writer that writes whatever it is
given, seeded mutators of a GGUF's metadata and tensor infos, and the entry points a fuzzer calls.

- :class:`Parts` / :func:`read_parts` / :func:`to_bytes`: a GGUF as editable parts (key/values
  with their GGUF types, tensor infos with their bytes) and back to bytes.  Nothing is checked on
  the way out, so a mutant says exactly what the mutation made it say.
- :func:`mutate`: one to three seeded edits of the parts: integer values set to 0, negative,
  huge or off by one; floats to 0, negative, NaN, infinite, huge, tiny; values of another type
  (an integer as a float, a string, a bool or an array; a string as an integer); strings emptied
  or set to other architecture names; arrays emptied, cut, extended, re-typed, their elements
  made huge or negative; keys deleted or added (hyperparameters and token ids the file lacked);
  tensor infos re-shaped, re-typed, renamed into another block, dropped or duplicated.
- The entry points, each taking the bytes of one input and asserting that a failure is a
  :class:`~qformat.errors.QFormatError` (anything else propagates, which is the finding):
  :func:`parse_gguf` (qformat's GGUF reader and the ``gguf`` converter's description, every
  component produced: ``convert --layout gguf`` without the write), :func:`convert_hf` (the GGUF
  to transformers conversion, ``convert --layout hf``, into a fresh temporary folder) and
  :func:`read_imatrix` (both importance-matrix formats).

tests/test_gguf_hostile.py runs seeded mutant streams through them; ``python -m tests.gguf_hostile``
runs more and prints the outcomes by class (:func:`main`).
"""

from __future__ import annotations

import copy
import math
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from qformat.convert.gguf_file import GGML_TYPES, KV, VALUE_TYPES, GGUFFile
from qformat.errors import QFormatError

TYPE_IDS = {name: i for i, (name, _, _) in VALUE_TYPES.items()}
INTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
FLOATS = ("float32", "float64")
_FMT = {name: fmt for _, (name, fmt, _) in VALUE_TYPES.items() if fmt is not None}
_RANGE = {t: (np.iinfo(np.dtype(_FMT[t])).min, np.iinfo(np.dtype(_FMT[t])).max) for t in INTS}
#: GGUF architecture names a string value may become (supported, merged, unknown, transformers' own spellings).
ARCH_NAMES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gemma4", "phi3", "falcon", "stablelm", "gpt2", "starcoder2",
              "nemotron", "deci", "umt5", "t5", "qwen2moe", "qwen2_moe", "minimax_m2", "gemma", "bert", "mamba", "")
#: Keys a mutation may add (``{arch}`` is the file's architecture): hyperparameters and token ids.
ADDED_KEYS = ("{arch}.attention.key_length", "{arch}.attention.value_length", "{arch}.attention.sliding_window", "{arch}.vocab_size",
              "{arch}.rope.dimension_count", "{arch}.attention.layer_norm_epsilon", "{arch}.context_length",
              "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.bos_token_id", "general.alignment")


@dataclass
class Tensor:
    """One tensor info and its bytes: ``dims`` innermost first, as GGUF stores them."""

    name: str
    dims: list[int]
    type: int
    data: bytes


@dataclass
class Parts:
    """A GGUF as editable parts: ``kv`` (key -> :class:`~qformat.convert.gguf_file.KV`, file order)
    and ``tensors`` (file order)."""

    kv: dict[str, KV] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)
    version: int = 3

    @property
    def arch(self) -> str:
        a = self.kv.get("general.architecture")
        return a.value if a is not None and isinstance(a.value, str) else "llama"


def read_parts(path: str | os.PathLike[str]) -> Parts:
    """The parts of the (valid) GGUF file ``path``."""
    f = GGUFFile(path)
    return Parts(dict(f.kv), [Tensor(t.name, list(reversed(t.shape)), t.ggml_type, bytes(f.raw(t.name))) for t in f.tensors.values()],
                 f.version)


# -- writing ------------------------------------------------------------------------------------
def _str(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _scalar(t: str, v: Any) -> bytes:
    if t == "string":
        return _str(v)
    if t == "bool":
        return struct.pack("<B", int(v) & 0xFF)
    if t in INTS:
        lo, hi = _RANGE[t]
        v = int(v)
        if not lo <= v <= hi:  # wrap as the C type would store it
            v = (v - lo) % (hi - lo + 1) + lo
    return np.array([v], dtype=np.dtype(_FMT[t])).tobytes()


def _value(v: KV) -> bytes:
    if v.type != "array":
        return _scalar(v.type, v.value)
    et = v.element_type or "uint8"
    out = [struct.pack("<IQ", TYPE_IDS[et], len(v.value))]
    for x in v.value:
        out.append(_value(x) if et == "array" else _scalar(et, x))
    return b"".join(out)


def to_bytes(p: Parts, alignment: int = 32) -> bytes:
    """The GGUF file of ``p``: tensors laid out in order, each at the next multiple of
    ``alignment``; nothing is checked (dims need not match the bytes)."""
    head = [b"GGUF", struct.pack("<IQQ", p.version, len(p.tensors), len(p.kv))]
    for k, v in p.kv.items():
        head += [_str(k), struct.pack("<I", TYPE_IDS[v.type]), _value(v)]
    offsets, off = [], 0
    for t in p.tensors:
        offsets.append(off)
        off = -(-(off + len(t.data)) // alignment) * alignment
    for t, o in zip(p.tensors, offsets):
        head += [_str(t.name), struct.pack("<I", len(t.dims)), struct.pack(f"<{len(t.dims)}Q", *[d % (1 << 64) for d in t.dims]),
                 struct.pack("<IQ", t.type % (1 << 32), o)]
    raw = b"".join(head)
    raw += b"\0" * (-len(raw) % alignment)
    body = bytearray(off)
    for t, o in zip(p.tensors, offsets):
        body[o:o + len(t.data)] = t.data
    return raw + bytes(body)


# -- mutations ----------------------------------------------------------------------------------
def _int_values(v: int) -> list[int]:
    return [0, -1, -(2**31), 1, v + 1, v - 1, 2 * v, v // 2, 3, 7, 100, 10**6, 2**31 - 1, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**64 - 1]


_FLOAT_VALUES = (0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 1e38, 3.4e38, 1e-45, 1e-30, 1e30, 0.5, 1e6)


def _mutate_kv(p: Parts, key: str, rng: random.Random) -> str:
    v = p.kv[key]
    r = rng.random()
    if r < 0.06:
        del p.kv[key]
        return f"delete {key}"
    if v.type in INTS or v.type == "bool":
        if r < 0.6:
            new = rng.choice(_int_values(int(v.value)))
            t = v.type if v.type != "bool" else "uint32"
            if new < 0 and t.startswith("u"):
                t = rng.choice(("int32", "int64"))
            elif new > _RANGE[t][1]:
                t = "uint64" if new < 2**64 else t
            p.kv[key] = KV(t, new)
            return f"{key} = {new} ({t})"
        choice = rng.randrange(6)
        if choice == 0:
            p.kv[key] = KV(rng.choice(FLOATS), float(v.value) + rng.choice((0.0, 0.5)))
        elif choice == 1:
            p.kv[key] = KV("string", rng.choice((str(v.value), "", "x", "12abc")))
        elif choice == 2:
            p.kv[key] = KV("bool", bool(rng.getrandbits(1)))
        elif choice == 3:
            p.kv[key] = KV("array", [int(v.value)] * rng.randrange(0, 4), "uint32")
        elif choice == 4:
            p.kv[key] = KV("array", [str(v.value)], "string")
        else:
            p.kv[key] = KV(rng.choice(INTS), int(v.value))
        return f"{key} -> {p.kv[key].type}"
    if v.type in FLOATS:
        if r < 0.7:
            p.kv[key] = KV(v.type, rng.choice(_FLOAT_VALUES))
        else:
            p.kv[key] = rng.choice((KV("uint32", 1), KV("int32", -1), KV("string", "1e-5"), KV("array", [1.0, 2.0], "float32"), KV("bool", True)))
        return f"{key} -> {p.kv[key].type} {p.kv[key].value!r:.40}"
    if v.type == "string":
        choice = rng.randrange(5)
        if choice == 0 or key == "general.architecture":
            p.kv[key] = KV("string", rng.choice(ARCH_NAMES))
        elif choice == 1:
            p.kv[key] = KV("string", rng.choice(("", "\0", "mistral", "x" * 1000, "\u00e9\U0001f999")))
        elif choice == 2:
            p.kv[key] = KV("uint32", rng.choice((0, 1, 7)))
        elif choice == 3:
            p.kv[key] = KV("array", [v.value, v.value], "string")
        else:
            p.kv[key] = KV("string", v.value[: len(v.value) // 2])
        return f"{key} -> {p.kv[key].type} {p.kv[key].value!r:.40}"
    # arrays
    items = list(v.value)
    et = v.element_type
    choice = rng.randrange(9)
    if choice == 0:
        items = []
    elif choice == 1:
        items = items[: rng.randrange(len(items) + 1)]
    elif choice == 2 and items:
        items = items + items[: rng.randrange(1, min(len(items), 64) + 1)]
    elif choice == 3 and items and et in INTS + FLOATS:
        i = rng.randrange(len(items))
        items[i] = rng.choice(_int_values(100) if et in INTS else _FLOAT_VALUES)
        if et in INTS and (items[i] < _RANGE[et][0] or items[i] > _RANGE[et][1]):
            et = "int64" if items[i] < 0 else "uint64"
            items = [int(x) for x in items]
    elif choice == 4 and items and et == "string":
        i = rng.randrange(len(items))
        items[i] = rng.choice(("", "a", "a b c", "\0", items[0], "x" * 300))
    elif choice == 5:
        if et == "string":
            et, items = "uint32", list(range(len(items)))
        else:
            et, items = "string", [str(x) for x in items]
    elif choice == 6:
        p.kv[key] = KV("uint32", len(items))
        return f"{key} -> uint32"
    elif choice == 7 and et in INTS + FLOATS:
        et = rng.choice(INTS + FLOATS)
        items = [float(x) if et in FLOATS else int(x) if math.isfinite(x) else 0 for x in items]
        if et in INTS:
            items = [min(max(x, _RANGE[et][0]), _RANGE[et][1]) for x in items]
    else:
        et, items = "array", [KV("array", items[:2], et)]
    p.kv[key] = KV("array", items, et)
    return f"{key} -> array[{et}] of {len(items)}"


def _mutate_tensor(p: Parts, rng: random.Random) -> str:
    if not p.tensors:
        return "no tensor"
    i = rng.randrange(len(p.tensors))
    t = p.tensors[i]
    choice = rng.randrange(7)
    if choice == 0:
        del p.tensors[i]
        return f"drop tensor {t.name}"
    if choice == 1:
        parts = t.name.split(".")
        if parts[0] == "blk":
            parts[1] = str(rng.choice((int(parts[1]) + 1, int(parts[1]) + 2, 10**6, 2**40)))
            t.name = ".".join(parts)
        else:
            t.name = rng.choice(("blk.5.attn_q.weight", t.name + ".x", "output.weight", "token_embd.weight"))
        return f"rename tensor -> {t.name}"
    if choice == 2:
        p.tensors.append(Tensor(rng.choice(("output.weight", "blk.0.attn_q.bias", "blk.2.ffn_up.weight")), list(t.dims), t.type, t.data))
        return f"add a copy of {t.name}"
    # a new shape or type, with bytes to match (so that the reader gets past the sizes)
    dims, typ = list(t.dims), t.type
    if choice == 3:
        j = rng.randrange(len(dims))
        dims[j] = rng.choice((1, 2, dims[j] * 2, max(dims[j] // 2, 1), dims[j] + GGML_TYPES[typ][1]))
    elif choice == 4:
        dims = list(reversed(dims))
    elif choice == 5:
        dims = dims + [1] if len(dims) < 4 else dims[:-1]
    else:
        typ = rng.choice((0, 1, 8, 2, 12, 14, 30, 26))
    block, size = GGML_TYPES[typ][1], GGML_TYPES[typ][2]
    if dims[0] % block:
        dims[0] = -(-dims[0] // block) * block
    nbytes = dims[0] // block * size * math.prod(dims[1:])
    if nbytes > 64 << 20:
        return f"tensor {t.name}: left alone (the new shape is too large)"
    data = (t.data * (nbytes // max(len(t.data), 1) + 1))[:nbytes] if t.data else bytes(nbytes)
    p.tensors[i] = Tensor(t.name, dims, typ, data)
    return f"tensor {t.name}: dims {t.dims} {GGML_TYPES[t.type][0]} -> {dims} {GGML_TYPES[typ][0]}"


def mutate(p: Parts, rng: random.Random) -> tuple[Parts, list[str]]:
    """A mutant of ``p`` (a copy; ``p`` is unchanged) and what was done, one line per edit."""
    m = copy.deepcopy(p)
    done = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        r = rng.random()
        if r < 0.15:
            done.append(_mutate_tensor(m, rng))
            continue
        if r < 0.22:
            key = rng.choice(ADDED_KEYS).format(arch=m.arch)
            m.kv[key] = rng.choice((KV("uint32", rng.choice((0, 1, 16, 32, 320, 10**6, 2**32 - 1))), KV("int32", -1),
                                    KV("float32", rng.choice(_FLOAT_VALUES)), KV("string", "x")))
            done.append(f"add {key} = {m.kv[key].value!r}")
            continue
        keys = list(m.kv)
        if not keys:
            continue
        # the hyperparameters and the scalar tokenizer keys are what the conversion reads: most edits go there
        hyper = [k for k in keys if k.startswith(m.arch + ".") or k.startswith("general.") or
                 (k.startswith("tokenizer.") and m.kv[k].type != "array")]
        key = rng.choice(hyper if hyper and r < 0.8 else keys)
        done.append(_mutate_kv(m, key, rng))
    return m, done


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """A byte-level mutant of ``data`` (any format) and what was done: bytes flipped, an aligned
    int32 / int64 field set to 0, -1, a huge value or the file's length, the file cut or
    extended."""
    b = bytearray(data)
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        choice = rng.randrange(5)
        if choice == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
            done.append(f"flip a bit of byte {i}")
        elif choice in (1, 2) and len(b) >= 8:
            width = 4 if choice == 1 else 8
            i = rng.randrange(0, len(b) - width + 1, 4) if len(b) >= width else 0
            v = rng.choice((0, -1, 1, 2**31 - 1, 2**30, len(b), len(b) // 4, -(2**31)))
            b[i:i + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
            done.append(f"int{8 * width} at {i} = {v}")
        elif choice == 3 and b:
            n = rng.randrange(len(b))
            del b[n:]
            done.append(f"cut at {n}")
        else:
            b += bytes(rng.choice((1, 4, 16, 1000)))
            done.append("extended")
    return bytes(b), done


# -- entry points -------------------------------------------------------------------------------
def _in_temp(data: bytes, name: str, run: Callable[[Path], Any]) -> Any:
    tmp = Path(tempfile.mkdtemp(prefix="qformat-hostile-"))
    try:
        src = tmp / name
        src.write_bytes(data)
        return run(src)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _coded(run: Callable[[], Any]) -> QFormatError | None:
    """None when ``run`` succeeds, the QFormatError it raised otherwise; anything else propagates."""
    try:
        run()
    except QFormatError as e:
        assert isinstance(e.code, str) and e.code, e
        return e
    return None


def parse_gguf(data: bytes) -> QFormatError | None:
    """``data`` through qformat's GGUF reader: ``inspect`` of the file, then ``convert --layout
    gguf`` (the ``gguf`` converter's description and every component written to a temporary
    ``.safetensors``): None, or the QFormatError."""
    from qformat import convert as cv
    from qformat.inspection import inspect_checkpoint

    def run(src: Path) -> None:
        inspect_checkpoint(src)
        cv.convert(src, src.parent / "out.safetensors", "gguf")

    return _in_temp(data, "model.gguf", lambda src: _coded(lambda: run(src)))


def convert_hf(data: bytes) -> QFormatError | None:
    """``data`` through the GGUF to transformers conversion (``convert --layout hf``) into a
    fresh temporary folder: None, or the QFormatError.  transformers and torch are imported once
    per process (the first call); a mutant costs one conversion (about 0.1 s for the test models)."""
    from qformat_transformers.gguf_layout import convert_gguf

    return _in_temp(data, "model.gguf", lambda src: _coded(lambda: convert_gguf(src, src.parent / "out")))


def read_imatrix(data: bytes) -> QFormatError | None:
    """``data`` through qformat's importance-matrix reader (GGUF or legacy .dat, by its magic):
    None, or the QFormatError."""
    from qformat.imatrix import load_imatrix

    return _in_temp(data, "imatrix.dat", lambda src: _coded(lambda: load_imatrix(src)))


# -- the mutation run ---------------------------------------------------------------------------
class Hang(BaseException):
    """A target ran past the time limit (a BaseException: no ``except Exception`` on the way swallows it)."""


def _alarm(_sig: int, _frame: Any) -> None:
    raise Hang()


@dataclass
class Outcomes:
    counts: Counter = field(default_factory=Counter)  # "done", "coded CODE", "uncoded ExcType", "hang"
    examples: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def uncoded(self) -> int:
        return sum(n for k, n in self.counts.items() if not k.startswith(("done", "coded")))


def run(sources: list[Path], n: int, seed: int, target: Callable[[bytes], QFormatError | None] = convert_hf,
        time_limit: int = 30, log: Any = None, bytes_share: float = 0.0) -> Outcomes:
    """``n`` mutants of ``sources`` (round robin, seeded) through ``target``, classified: a GGUF
    source's by :func:`mutate`, or by :func:`mutate_bytes` for a share ``bytes_share`` of them;
    any other source's by :func:`mutate_bytes`."""
    rng = random.Random(seed)
    raws = [s.read_bytes() for s in sources]
    parts = [read_parts(s) if r.startswith(b"GGUF") else None for s, r in zip(sources, raws)]
    out = Outcomes()
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.perf_counter()
    try:
        for i in range(n):
            p = parts[i % len(parts)]
            if p is None or (bytes_share and rng.random() < bytes_share):  # no draw at 0: the stream stays the same
                data, done = mutate_bytes(raws[i % len(raws)], rng)
            else:
                m, done = mutate(p, rng)
                data = to_bytes(m)
            signal.alarm(time_limit)
            try:
                e = target(data)
                key = "done" if e is None else f"coded {e.code}"
                what = "" if e is None else str(e)
            except Hang:
                key, what = "hang", f"over {time_limit} s"
            except Exception as e:  # the finding: an exception without a code
                key, what = f"uncoded {type(e).__name__}", str(e).splitlines()[0][:200] if str(e) else ""
            finally:
                signal.alarm(0)
            out.counts[key] += 1
            line = f"{i} {sources[i % len(sources)].name} {'; '.join(done)} => {key}: {what[:300]}"
            if not key.startswith(("done", "coded")):
                out.examples.setdefault(f"{key}: {what[:80]}", line)
            if log is not None:
                print(line, file=log, flush=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    out.seconds = time.perf_counter() - t0
    return out


def test_models(root: Path, archs: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3")) -> list[Path]:
    """The GGUF models of tests/readers/test_gguf_layout.py (its types per architecture), made
    in ``root`` unless there."""
    from .gguf_models import hf_model, write_gguf
    from .readers.test_gguf_layout import CASES

    out = []
    for arch in archs:
        tie, types = CASES[arch]
        path = root / f"{arch}.gguf"
        if not path.exists():
            if not (root / f"hf-{arch}").exists():
                hf_model(arch, root / f"hf-{arch}", tie=tie)
            write_gguf(root / f"hf-{arch}", path, arch, types=types)
        out.append(path)
    return out


def imatrix_files(root: Path) -> list[Path]:
    """Two small importance matrices, one per format (tests/imatrix_files.py), made in ``root``."""
    from .imatrix_files import write_dat, write_gguf

    rng = np.random.default_rng(0)
    entries = {f"blk.{i}.attn_q.weight": (rng.gamma(1.0, 30.0, 64).astype(np.float32), np.array([6.0])) for i in range(3)}
    return [write_gguf(root / "imatrix.gguf", entries),
            write_dat(root / "imatrix.dat", {k: (s / c[0] * 2, 2) for k, (s, c) in entries.items()})]


TARGETS = {"convert": convert_hf, "parse": parse_gguf, "imatrix": read_imatrix}


def main(argv: list[str]) -> int:
    """``python -m tests.gguf_hostile [--target convert|parse|imatrix] [--log FILE] N [SEED]``: N
    mutants through the target (the test models for ``convert`` and ``parse``, the two imatrix
    files for ``imatrix``); prints the outcomes by class, executions per second and one example
    of each uncoded outcome.  ``GGUF_HOSTILE_MODELS`` names where the models are kept."""
    import argparse
    import resource

    ap = argparse.ArgumentParser(prog="python -m tests.gguf_hostile")
    ap.add_argument("n", type=int, nargs="?", default=700)
    ap.add_argument("seed", type=int, nargs="?", default=40)
    ap.add_argument("--target", choices=sorted(TARGETS), default="convert")
    ap.add_argument("--log")
    ap.add_argument("--time-limit", type=int, default=30)
    args = ap.parse_args(argv)
    root = Path(os.environ.get("GGUF_HOSTILE_MODELS", tempfile.gettempdir())) / "gguf-hostile-models"
    root.mkdir(parents=True, exist_ok=True)
    sources = imatrix_files(root) if args.target == "imatrix" else test_models(root)
    target = TARGETS[args.target]
    if args.target == "convert":
        import qformat_transformers.gguf_layout  # noqa: F401  (transformers and torch, once)
    target(sources[0].read_bytes())  # warm: imports, first builds
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))  # a runaway allocation is a MemoryError here, not the machine's
    with open(args.log, "w") if args.log else open(os.devnull, "w") as log:
        out = run(sources, args.n, args.seed, target, time_limit=args.time_limit, log=log,
                  bytes_share=0.0 if args.target == "convert" else 0.5)
    print(f"{args.target}: {args.n} mutants in {out.seconds:.0f} s ({args.n / out.seconds:.1f}/s): {out.uncoded} uncoded")
    for k, c in sorted(out.counts.items(), key=lambda kv: -kv[1]):
        print(f"  {c:6d}  {k}")
    for k, line in out.examples.items():
        print(f"- {k}\n    {line[:400]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
