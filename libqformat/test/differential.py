#!/usr/bin/env python3
"""Differential test: libqformat (``qformat-c --batch``) against the Python reference reader.

Mutates the conformance corpus's input files (seeded, byte-level and JSON-aware mutations, the
kinds fuzz/driver.c applies), runs every mutant through

* the reference, ``qformat.conformance.reference_reader`` in-process (an error is an exception
  whose ``code`` attribute is the SPEC.md section 16 code), and
* ``qformat-c --batch`` (stdin lines "INPUT<TAB>OUTPUT"; one JSON line per input:
  {"input", "code", "crash"}; many inputs per process),

and compares the outcomes: both decode (then every tensor must match bit for bit, NaN by class,
via ``qformat.conformance.compare``), or both fail with the same code.

    .venv/bin/python libqformat/test/differential.py --count 2000 --seed 1 --jobs 2 \\
        --qformat-c libqformat/build/qformat-c --out /tmp/qf-diff

Prints one JSON line: {"mutants", "agreed", "disagreed": {kind: n}, ..., "batch_errors"}; exit 0
when every mutant agrees and no qformat-c process exited non-zero (a leak reported at exit by a
sanitized build, say), 1 otherwise.  Kinds: ``ref_valid_c_error``, ``ref_error_c_valid``, ``code``
(both fail, different codes), ``bits`` (both decode, different tensors), ``c_crash`` (qformat-c
reported a crash, died, timed out or wrote an unreadable output), ``ref_crash`` (the reference
raised something without a code: a defect on the Python side).  With --out, each disagreement's
mutant is written to DIR/<kind>-<seed>-<index>.safetensors with a .json beside it.  Every code
must match exactly (SPEC.md 1.2.1 made NOT_SAFETENSORS a required code: no difference is allowed).

``--qformat-c`` takes a command line (shlex-split), so any reader speaking the --batch protocol
can stand in, e.g. ``--qformat-c "node readers/js/bin/qformat-read.mjs"``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_CORPUS = REPO / "conformance" / "v1"

# ---------------------------------------------------------------------------------------- seeds


def load_seeds(corpus: Path) -> tuple[list[bytes], list[int]]:
    """The input file of every non-sharded case (sorted by id, for reproducibility), and the
    indices of the valid ones (mutants start from those three times in four: most mutants of an
    error case only fail the same way)."""
    man = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    seeds, valid = [], []
    for c in sorted(man["cases"], key=lambda c: c["id"]):
        inp = c["input"]
        if inp.endswith(".safetensors"):
            if c["expect"] == "valid":
                valid.append(len(seeds))
            seeds.append((corpus / inp).read_bytes())
    return seeds, valid


def harvest_tokens(seeds: list[bytes]) -> list[bytes]:
    """Every distinct quoted JSON string of the seeds' headers (the dictionary of token edits)."""
    out: set[bytes] = set()
    for s in seeds:
        span = header_span(s)
        if not span:
            continue
        h = s[span[0] : span[1]]
        i = 0
        while True:
            a = h.find(b'"', i)
            if a < 0:
                break
            b = h.find(b'"', a + 1)
            if b < 0:
                break
            if b - a <= 64:
                out.add(h[a : b + 1])
            i = b + 1
    return sorted(out)


# ------------------------------------------------------------------------------------ mutations

INTERESTING = [0, 1, -1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1023, 1024,
               4095, 4096, 32767, 32768, 65535, 65536, 100000000, 2**31 - 1, -(2**31), 2**32 - 1, 2**32,
               2**63 - 1, -(2**63), 0x7FF0000000000000, 0x7F800000, 0x7FC00000, 0xFF800000, 0x7C00, 0xFC00, 0x7E00]
JSON_NUMBERS = ["0", "1", "-1", "2", "3", "4", "7", "8", "15", "16", "31", "32", "33", "63", "64", "65", "127",
                "128", "255", "256", "1024", "65535", "65536", "2147483647", "2147483648", "4294967295",
                "4294967296", "9007199254740992", "9007199254740993", "9223372036854775807",
                "9223372036854775808", "18446744073709551615", "18446744073709551616", "1e308", "1e309", "-0",
                "0.5", "1.0", "1e3", "-9223372036854775808", "00", "01", "1.", "NaN", "Infinity", "-Infinity",
                "true", "false", "null", "[]", "{}", '""', "[0]", "[1,1]", "[0,0]"]
JSON_SPECIALS = '"{}[],:\\ 0123456789-.eE'
ODD_BYTES = [b"\\u0000", b"\\ud800", b'\\"', "é".encode(), b"\xff", b"\xed\xa0\x80", b"\t", b"\n", b"\\", b"\x7f"]
MAX_LEN = 1 << 20


def header_span(b: bytes | bytearray) -> tuple[int, int] | None:
    if len(b) < 10:
        return None
    (h,) = struct.unpack_from("<Q", b, 0)
    if h == 0 or h > len(b) - 8:
        return None
    return 8, 8 + h


def _set_hlen(b: bytearray, delta: int) -> None:
    if len(b) >= 8:
        (h,) = struct.unpack_from("<Q", b, 0)
        struct.pack_into("<Q", b, 0, (h + delta) % 2**64)


def _replace(b: bytearray, at: int, n: int, s: bytes, keep: bool) -> None:
    b[at : at + n] = s
    if keep:
        _set_hlen(b, len(s) - n)


def mutate_json(b: bytearray, rng: random.Random, tokens: list[bytes]) -> str:
    span = header_span(b)
    if not span:
        return "json-skip"
    lo, hi = span
    keep = rng.random() < 0.9  # usually keep the length field in step, so the JSON is parsed
    at = rng.randrange(lo, hi)
    k = rng.randrange(8)
    if k == 0:  # rewrite a number
        s = at
        while s < hi and not (48 <= b[s] <= 57):
            s += 1
        if s >= hi:
            return "json-number-none"
        e = s
        while e < hi and (48 <= b[e] <= 57 or b[e] in b".e-+"):
            e += 1
        if s > lo and b[s - 1] == ord("-"):
            s -= 1
        _replace(b, s, e - s, rng.choice(JSON_NUMBERS).encode(), keep)
        return "json-number"
    if k == 1:  # increment / decrement a digit
        for _ in range(64):
            i = rng.randrange(lo, hi)
            if 48 <= b[i] <= 57:
                b[i] = 48 + (b[i] - 48 + rng.choice((1, 9))) % 10
                return "json-digit"
        return "json-digit-none"
    if k == 2:  # replace a string token with one from the dictionary
        s = b.find(b'"', at, hi)
        e = b.find(b'"', s + 1, hi) if s >= 0 else -1
        if s < 0 or e < 0 or not tokens:
            return "json-string-none"
        _replace(b, s, e - s + 1, rng.choice(tokens), keep)
        return "json-string"
    if k == 3:  # delete a structural character
        for _ in range(64):
            i = rng.randrange(lo, hi)
            if b[i] in b'"{}[],:':
                _replace(b, i, 1, b"", keep)
                return "json-delete"
        return "json-delete-none"
    if k == 4:  # insert a structural character, a number or a dictionary token
        r = rng.randrange(3)
        s = (rng.choice(JSON_SPECIALS).encode() if r == 0 else
             rng.choice(tokens) if r == 1 and tokens else rng.choice(JSON_NUMBERS).encode())
        _replace(b, at, 0, s, keep)
        return "json-insert"
    if k == 5:  # swap bracket / quote kinds
        table = {ord("["): b"{", ord("]"): b"}", ord("{"): b"[", ord("}"): b"]", ord('"'): b"'",
                 ord(","): b";", ord(":"): b","}
        for _ in range(64):
            i = rng.randrange(lo, hi)
            if b[i] in table:
                b[i] = table[b[i]][0]
                return "json-swap"
        return "json-swap-none"
    if k == 6:  # duplicate a "key": value pair
        s = b.find(b'"', at, hi)
        e = b.find(b",", s + 1, hi) if s >= 0 else -1
        if s < 0 or e < 0 or e - s > 4096:
            return "json-dup-none"
        piece = bytes(b[s : e + 1])
        b[s:s] = piece
        if keep:
            _set_hlen(b, len(piece))
        return "json-dup"
    _replace(b, at, rng.randrange(2), rng.choice(ODD_BYTES), keep)
    return "json-odd"


def _offset(b: bytearray, rng: random.Random, width: int = 1) -> int | None:
    """A random offset for a width-byte edit: in the data section half the time (a header byte
    flipped mostly just breaks the JSON or its UTF-8)."""
    n = len(b)
    if n < width:
        return None
    span = header_span(b)
    if span and span[1] <= n - width and rng.randrange(2):
        return rng.randrange(span[1], n - width + 1)
    return rng.randrange(n - width + 1)


#: The kinds of ``mutate_once`` by name (the value of ``k`` that picks each; 4, 5 and 6 all pick
#: ``mutate_json``), for callers that draw one kind at a time (scripts/differential.py).
MUTATION_KINDS = {"bitflip": 0, "byteset": 1, "int": 2, "header-length": 3, "json": 4, "insert": 7, "delete": 8,
                  "splice": 9, "payload-swap": 10, "payload": 11}


def mutate_once(b: bytearray, rng: random.Random, seeds: list[bytes], tokens: list[bytes], k: int | None = None) -> str:
    """One mutation of ``b`` in place, of kind ``k`` (drawn from ``rng`` when None); returns its name."""
    if k is None:
        k = rng.randrange(12)
    n = len(b)
    if k == 0:
        at = _offset(b, rng)
        if at is not None:
            b[at] ^= 1 << rng.randrange(8)
        return "bitflip"
    if k == 1:
        at = _offset(b, rng)
        if at is not None:
            b[at] = rng.randrange(256)
        return "byteset"
    if k == 2:
        w = 1 << rng.randrange(4)
        at = _offset(b, rng, w)
        if at is not None:
            b[at : at + w] = (rng.choice(INTERESTING) % 2**64).to_bytes(8, "little")[:w]
        return f"int{8 * w}"
    if k == 3:
        if n >= 8:
            (h,) = struct.unpack_from("<Q", b, 0)
            r = rng.randrange(6)
            v = [h + 1 + rng.randrange(8), h - 1 - rng.randrange(8), n - 8, rng.choice(INTERESTING),
                 100000000 + rng.randrange(3) - 1, h ^ (1 << rng.randrange(64))][r]
            struct.pack_into("<Q", b, 0, v % 2**64)
        return "header-length"
    if k in (4, 5, 6):
        return mutate_json(b, rng, tokens)
    if k == 7:
        m = 1 + rng.randrange(8 if rng.randrange(2) else 256)
        if n + m <= MAX_LEN:
            at = rng.randrange(n + 1)
            mode = rng.randrange(3)
            if mode == 0:
                piece = bytes([rng.randrange(256)]) * m
            elif mode == 1:
                piece = bytes(rng.randrange(256) for _ in range(m))
            else:
                piece = bytes(b[at : at + m]).ljust(m, b"\0")
            b[at:at] = piece
        return "insert"
    if k == 8:
        if n:
            at = rng.randrange(n)
            del b[at : at + 1 + rng.randrange(8 if rng.randrange(2) else 256)]
        return "delete"
    if k == 9:
        o = rng.choice(seeds)
        cut, frm = rng.randrange(n + 1), rng.randrange(len(o) + 1)
        if cut + len(o) - frm <= MAX_LEN:
            b[cut:] = o[frm:]
        return "splice"
    if k == 10:
        span, o = header_span(b), rng.choice(seeds)
        ospan = header_span(o)
        if span and ospan:
            b[span[1] :] = o[ospan[1] :]
        return "payload-swap"
    span = header_span(b)
    if span and span[1] < n:
        at = rng.randrange(span[1], n)
        for i in range(at, min(n, at + 1 + rng.randrange(16))):
            b[i] = rng.randrange(256) if rng.randrange(4) else rng.choice((0, 0xFF))
    return "payload"


def make_mutant(index: int, seed: int | str, seeds: list[bytes], tokens: list[bytes],
                valid: list[int] | None = None, kind: int | None = None) -> tuple[bytes, list[str]]:
    """Mutant ``index`` of run ``seed``: independent of every other index (reproducible alone).
    Usually 1, sometimes 2-5 mutations of random kinds; exactly one of kind ``kind`` (a value of
    MUTATION_KINDS) when given."""
    rng = random.Random(f"{seed}:{index}")
    si = rng.choice(valid) if valid and rng.randrange(4) else rng.randrange(len(seeds))
    b = bytearray(seeds[si])
    kinds = [f"seed{si}"]
    if kind is not None:
        kinds.append(mutate_once(b, rng, seeds, tokens, kind))
        return bytes(b[:MAX_LEN]), kinds
    for _ in range(1 if rng.random() < 0.6 else 2 + rng.randrange(3)):
        kinds.append(mutate_once(b, rng, seeds, tokens))
    return bytes(b[:MAX_LEN]), kinds


# ---------------------------------------------------------------------------------- the readers


def reference_outcome(path: str) -> tuple[str, Any]:
    """("valid", tensors) | ("error", code) | ("crash", text), from the reference reader."""
    from qformat.conformance import reference_reader

    try:
        return "valid", dict(reference_reader(path))
    except Exception as e:  # the reference's failure is data here
        code = getattr(e, "code", None)
        if isinstance(code, str):
            return "error", code
        return "crash", f"{type(e).__name__}: {e}"[:500]


def _ref_worker(path: str) -> tuple[str, Any]:
    return reference_outcome(path)


def run_batch(cmd: list[str], pairs: list[tuple[str, str]], timeout: float) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Run ``cmd --batch`` over (input, output) pairs; a process that dies or hangs loses the
    input it was on (marked as a crash) and the rest are run again in a fresh process.  Also
    returns the failures of processes that answered every input yet exited non-zero (a leak
    LeakSanitizer reports at exit, say)."""
    results: dict[str, dict[str, Any]] = {}
    exit_errors: list[str] = []
    todo = list(pairs)
    while todo:
        text = "".join(f"{i}\t{o}\n" for i, o in todo)
        try:
            p = subprocess.run(cmd + ["--batch"], input=text, capture_output=True, text=True, timeout=timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = f"timed out after {timeout} s", -1
        except OSError as e:
            for i, _ in todo:
                results[i] = {"input": i, "code": None, "crash": f"cannot run {cmd!r}: {e}"}
            return results, exit_errors
        for line in out.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and r.get("input") in dict(todo):
                results[r["input"]] = r
        rest = [(i, o) for i, o in todo if i not in results]
        if not rest:
            if rc != 0:
                exit_errors.append(f"exit {rc} after answering inputs {todo[0][0]} .. {todo[-1][0]}; stderr: {err[-600:]}")
            break
        # the first input without an answer is the one the process died on
        i0 = rest[0][0]
        results[i0] = {"input": i0, "code": None,
                       "crash": f"qformat-c --batch exited {rc} on this input; stderr: {err[-400:]}"}
        todo = rest[1:]
    return results, exit_errors


def c_outcome(r: dict[str, Any], out_path: str) -> tuple[str, Any]:
    from qformat.errors import QFormatError
    from qformat.io import load_file

    if r.get("crash"):
        return "crash", str(r["crash"])[:500]
    if r.get("code"):
        return "error", r["code"]
    try:
        return "valid", load_file(out_path)
    except (QFormatError, OSError) as e:
        return "crash", f"decoded but wrote an unreadable output: {e}"[:500]


def classify(ref: tuple[str, Any], c: tuple[str, Any]) -> tuple[str | None, str]:
    """(None, "") when the outcomes agree, else (kind, detail)."""
    from qformat.conformance import compare

    if ref[0] == "crash":
        return "ref_crash", ref[1]
    if c[0] == "crash":
        return "c_crash", c[1]
    if ref[0] == "valid" and c[0] == "valid":
        d = compare(ref[1], c[1])
        return (None, "") if d is None else ("bits", d)
    if ref[0] == "valid":
        return "ref_valid_c_error", f"reference decodes; qformat-c fails with {c[1]}"
    if c[0] == "valid":
        return "ref_error_c_valid", f"reference fails with {ref[1]}; qformat-c decodes"
    if ref[1] != c[1]:
        return "code", f"reference {ref[1]}, qformat-c {c[1]}"
    return None, ""


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000, help="mutants (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="parallel workers")
    ap.add_argument("--qformat-c", default=str(REPO / "libqformat" / "build" / "qformat-c"),
                    help="the qformat-c binary (or a command line speaking --batch)")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="conformance corpus (default conformance/v1)")
    ap.add_argument("--out", help="write each disagreeing mutant (and a .json of details) here")
    ap.add_argument("--batch-size", type=int, default=200, help="inputs per qformat-c process")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per qformat-c batch process")
    ap.add_argument("--verbose", action="store_true", help="one JSON line per disagreement on stderr")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    seeds, valid = load_seeds(Path(a.corpus))
    tokens = harvest_tokens(seeds)
    cmd = shlex.split(a.qformat_c)
    tmp = tempfile.mkdtemp(prefix="qf-diff-")
    try:
        inputs, outputs, kinds = [], [], []
        for i in range(a.count):
            data, k = make_mutant(i, a.seed, seeds, tokens, valid)
            p = os.path.join(tmp, f"m{i:07d}.safetensors")
            with open(p, "wb") as f:
                f.write(data)
            inputs.append(p)
            outputs.append(os.path.join(tmp, f"o{i:07d}.safetensors"))
            kinds.append(k)

        # qformat-c in background processes while the reference runs here
        from concurrent.futures import ThreadPoolExecutor

        pairs = list(zip(inputs, outputs))
        chunks = [pairs[i : i + a.batch_size] for i in range(0, len(pairs), a.batch_size)]
        c_jobs = max(1, a.jobs // 2) if a.jobs > 1 else 1
        c_results: dict[str, dict[str, Any]] = {}
        batch_errors: list[str] = []
        ref_jobs = max(1, a.jobs - c_jobs) if a.jobs > 1 else 1
        # the reference's worker processes are forked before any thread starts
        mp = multiprocessing.get_context("fork").Pool(ref_jobs) if ref_jobs > 1 else None
        try:
            with ThreadPoolExecutor(c_jobs) as pool:
                futs = [pool.submit(run_batch, cmd, ch, a.timeout) for ch in chunks]
                if mp is not None:
                    refs = mp.map(_ref_worker, inputs, chunksize=16)
                else:
                    refs = [reference_outcome(p) for p in inputs]
                for f in futs:
                    res, errs = f.result()
                    c_results.update(res)
                    batch_errors.extend(errs)
        finally:
            if mp is not None:
                mp.close()
                mp.join()

        agreed = 0
        disagreed: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for i, (inp, outp) in enumerate(pairs):
            ref = refs[i]
            c = c_outcome(c_results.get(inp, {"crash": "no answer from qformat-c"}), outp)
            outcomes[f"ref_{ref[0]}"] += 1
            kind, detail = classify(ref, c)
            if kind is None:
                agreed += 1
                continue
            disagreed[kind] += 1
            rec = {"index": i, "kind": kind, "detail": detail, "mutations": kinds[i],
                   "reference": ref[1] if ref[0] != "valid" else "valid",
                   "qformat_c": c[1] if c[0] != "valid" else "valid"}
            if a.verbose:
                print(json.dumps(rec), file=sys.stderr)
            if a.out:
                os.makedirs(a.out, exist_ok=True)
                stem = os.path.join(a.out, f"{kind}-{a.seed}-{i:07d}")
                shutil.copyfile(inp, stem + ".safetensors")
                with open(stem + ".json", "w", encoding="utf-8") as f:
                    json.dump(rec, f, indent=1)
        summary = {"mutants": a.count, "agreed": agreed, "disagreed": dict(sorted(disagreed.items())),
                   "seed": a.seed, "reference_outcomes": dict(sorted(outcomes.items())),
                   "seconds": round(time.perf_counter() - t0, 2), "qformat_c": a.qformat_c,
                   "batch_errors": len(batch_errors)}
        for e in batch_errors:
            print(f"differential: a qformat-c --batch process failed: {e}", file=sys.stderr)
        print(json.dumps(summary, sort_keys=False))
        return 0 if agreed == a.count and not batch_errors else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
