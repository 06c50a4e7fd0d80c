#!/usr/bin/env python3
"""Three-way differential run: the Python reference, the JavaScript reader and libqformat on the
same mutants, every pair compared.

Mutants come from the generators of the two existing harnesses, imported (not copied):

* ``cdiff.<kind>``: libqformat/test/differential.py's ``make_mutant`` with exactly one mutation of
  that kind (bitflip, byteset, int, header-length, json, insert, delete, splice, payload-swap,
  payload) over every non-sharded corpus input, and ``cdiff.chain``: its ``make_mutant`` as that
  harness runs it (1, sometimes 2-5 mutations of random kinds);
* ``jsdiff.<kind>``: tests/test_js_differential.py's ``mutate_bytes``, ``mutate_json``,
  ``mutate_entries`` and ``mutate_payload`` over the valid corpus inputs and tests/test_errors.py's
  seeds.

Mutant ``i`` of seed ``s`` depends on (s, its generator, i) alone; generators take turns by
weight (``--generators`` picks a subset, the turns stay weighted).  Every mutant goes through

* ``py``: ``qformat.conformance.reference_reader`` in-process (an error is an exception with a
  ``code``; anything else is a crash), in a pool of worker processes;
* ``js``: ``node readers/js/bin/qformat-read.mjs --batch`` and
* ``c``: ``libqformat/build/qformat-c --batch`` (stdin lines "INPUT<TAB>OUTPUT", one JSON line
  {"input", "code", "crash"} per input, a decoded file's tensors written to OUTPUT),

many inputs per node / qformat-c process (``--batch-size``), those running while the worker
runs the reference.  For every pair (py-js, py-c, js-c) the outcomes must be equal: both decode
and every tensor has the same bits (NaN by class, ``qformat.conformance.compare``), or both fail
with the same code (every code exactly: NOT_SAFETENSORS is required since SPEC.md 1.2.1).
A disagreement is one of ``code`` (different codes), ``valid_vs_error``, ``bits`` or ``crash``
(either side crashed, died, timed out or wrote an unreadable output).

    .venv/bin/python scripts/differential.py --count 10000 --seed 1 --jobs 2 --out /tmp/qf-diff3

prints a table (per generator and pair: mutants, agreements, disagreements by kind) and, as its
last line, one JSON summary; exits 1 on any disagreement, crash or failed batch process, 2 on a
usage error.  With ``--out DIR`` every disagreeing mutant is written to
``DIR/<generator>-<seed>-<index>.safetensors`` with a ``.json`` beside it (the three outcomes,
each pair's kind and detail, the mutations applied).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import multiprocessing
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

READERS = ("py", "js", "c")
KINDS = ("code", "valid_vs_error", "bits", "crash")
DEFAULT_JS = f"node {REPO / 'readers' / 'js' / 'bin' / 'qformat-read.mjs'}"
#: seconds the reference may take on one mutant before it counts as a crash (a hang)
PY_TIME_LIMIT = 60


def _default_c() -> str:
    for d in ("build", "build-pytest"):
        p = REPO / "libqformat" / d / "qformat-c"
        if p.exists():
            return str(p)
    return str(REPO / "libqformat" / "build" / "qformat-c")


def _load_cdiff():
    """libqformat/test/differential.py as a module (it is a script in a folder without a package)."""
    name = "qformat_c_differential"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "libqformat" / "test" / "differential.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------------- generators

#: generator -> weight (its share of the turns)
def generator_weights() -> dict[str, int]:
    cd = _load_cdiff()
    w = {f"cdiff.{k}": 1 for k in cd.MUTATION_KINDS}
    w["cdiff.json"] = 2
    w["cdiff.chain"] = 2
    w.update({"jsdiff.bytes": 1, "jsdiff.json": 3, "jsdiff.entries": 2, "jsdiff.payload": 1})
    return w


class Mutator:
    """Every generator's seeds, loaded once (before the worker processes fork)."""

    def __init__(self, corpus: Path) -> None:
        self.cd = _load_cdiff()
        self.c_seeds, self.c_valid = self.cd.load_seeds(corpus)
        self.tokens = self.cd.harvest_tokens(self.c_seeds)
        import tests.test_js_differential as jd

        self.jd = jd
        self.js_seeds = jd._seeds()
        self.js_names = sorted(self.js_seeds)
        self.js_gen = {"bytes": jd.mutate_bytes, "json": jd.mutate_json, "entries": jd.mutate_entries,
                       "payload": jd.mutate_payload}

    def make(self, gen: str, index: int, seed: int) -> tuple[bytes, list[str]]:
        """(the mutant's bytes, what was done to it)."""
        family, kind = gen.split(".", 1)
        if family == "cdiff":
            k = None if kind == "chain" else self.cd.MUTATION_KINDS[kind]
            data, done = self.cd.make_mutant(index, f"{seed}:{gen}", self.c_seeds, self.tokens, self.c_valid, k)
            return data, [f"corpus seed {done[0][4:]}", *done[1:]]
        rng = random.Random(f"{seed}:{gen}:{index}")
        name = rng.choice(self.js_names)
        try:
            return self.js_gen[kind](rng, self.js_seeds[name]), [f"{kind} of {name}"]
        except Exception as e:  # noqa: BLE001 - a generator's defect must not stop the run
            return self.js_seeds[name], [f"{kind} of {name} failed ({type(e).__name__}: {e}); the seed unchanged"]


def schedule(gens: list[str], weights: dict[str, int]) -> list[str]:
    """The turns: each generator ``weight`` times, interleaved (round robin over the weights)."""
    out, left = [], {g: weights[g] for g in gens}
    while any(left.values()):
        for g in gens:
            if left[g]:
                out.append(g)
                left[g] -= 1
    return out


# ------------------------------------------------------------------------------------- outcomes


def _alarm(_sig: int, _frame: Any) -> None:
    raise TimeoutError(f"the reference took more than {PY_TIME_LIMIT} s")


def py_outcome(path: str) -> tuple[str, Any]:
    """("valid", tensors) | ("error", code) | ("crash", text) from the reference, time-limited."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PY_TIME_LIMIT)
    try:
        return _load_cdiff().reference_outcome(path)
    except TimeoutError as e:
        return "crash", str(e)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def compare_pair(a: tuple[str, Any], b: tuple[str, Any], names: tuple[str, str]) -> tuple[str | None, str]:
    """(None, "") when two outcomes agree, else (kind, detail)."""
    from qformat.conformance import compare

    x, y = names
    if a[0] == "crash" or b[0] == "crash":
        return "crash", "; ".join(f"{n} crashed: {o[1]}" for n, o in ((x, a), (y, b)) if o[0] == "crash")
    if a[0] == "valid" and b[0] == "valid":
        d = compare(a[1], b[1])
        return (None, "") if d is None else ("bits", f"{x} vs {y}: {d}"[:1000])
    if a[0] != b[0]:
        return "valid_vs_error", f"{x} {'decodes' if a[0] == 'valid' else a[1]}, {y} {'decodes' if b[0] == 'valid' else b[1]}"
    if a[1] != b[1]:
        return "code", f"{x} {a[1]}, {y} {b[1]}"
    return None, ""


def _brief(o: tuple[str, Any]) -> str:
    return "valid" if o[0] == "valid" else (o[1] if o[0] == "error" else f"crash: {o[1]}")


# --------------------------------------------------------------------------------------- worker

_STATE: dict[str, Any] = {}


def _work(chunk: list[int]) -> dict[str, Any]:
    """One chunk of mutant indices, end to end: generate, run the batch readers in the background
    while the reference runs here, compare every pair.  Returns the chunk's tallies and records."""
    st = _STATE
    a, mut, turns, cmds = st["args"], st["mutator"], st["turns"], st["cmds"]
    cd = mut.cd
    readers = a.readers
    pairs = list(itertools.combinations(readers, 2))
    tmp = tempfile.mkdtemp(prefix="qf-diff3-")
    try:
        items = []
        for i in chunk:
            gen = turns[i % len(turns)]
            data, done = mut.make(gen, i, a.seed)
            p = os.path.join(tmp, f"m{i:07d}.safetensors")
            with open(p, "wb") as f:
                f.write(data)
            items.append((i, gen, done, p))
        batch = {}
        with ThreadPoolExecutor(2) as pool:
            for r in ("js", "c"):
                if r in readers:
                    io = [(p, os.path.join(tmp, f"{r}{i:07d}.safetensors")) for i, _, _, p in items]
                    batch[r] = (io, pool.submit(cd.run_batch, cmds[r], io, a.timeout))
            pys = [py_outcome(p) for _, _, _, p in items] if "py" in readers else None
            answers, batch_errors = {}, []
            for r, (io, fut) in batch.items():
                res, errs = fut.result()
                answers[r] = (io, res)
                batch_errors.extend(f"{r}: {e}" for e in errs)
        tally: dict[str, dict[str, dict[str, int]]] = {}
        outcomes = {r: {"valid": 0, "error": 0, "crash": 0} for r in readers}
        records = []
        for n, (i, gen, done, p) in enumerate(items):
            out: dict[str, tuple[str, Any]] = {}
            if pys is not None:
                out["py"] = pys[n]
            for r, (io, res) in answers.items():
                inp, outp = io[n]
                got = cd.c_outcome(res.get(inp, {"crash": f"no answer from the {r} batch process"}), outp)
                if got[0] == "crash" and r == "js":
                    got = ("crash", got[1].replace("qformat-c --batch", "qformat-read.mjs --batch"))
                out[r] = got
            for r in readers:
                outcomes[r][out[r][0]] += 1
            t = tally.setdefault(gen, {})
            diffs = {}
            for x, y in pairs:
                key = f"{x}-{y}"
                c = t.setdefault(key, {"mutants": 0, "agreed": 0, **{k: 0 for k in KINDS}})
                c["mutants"] += 1
                kind, detail = compare_pair(out[x], out[y], (x, y))
                if kind is None:
                    c["agreed"] += 1
                else:
                    c[kind] += 1
                    diffs[key] = {"kind": kind, "detail": detail}
            if diffs:
                rec = {"index": i, "seed": a.seed, "generator": gen, "mutations": done,
                       "outcomes": {r: _brief(out[r]) for r in readers}, "pairs": diffs}
                if a.out:
                    stem = os.path.join(a.out, f"{gen}-{a.seed}-{i:07d}")
                    shutil.copyfile(p, stem + ".safetensors")
                    rec["file"] = stem + ".safetensors"
                    with open(stem + ".json", "w", encoding="utf-8") as f:
                        json.dump(rec, f, indent=1)
                records.append(rec)
        return {"tally": tally, "outcomes": outcomes, "records": records, "batch_errors": batch_errors}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------- main


def _table(by_gen: dict[str, dict[str, dict[str, int]]], pairs: list[str]) -> str:
    head = ["generator", "pair", "mutants", "agreed", *KINDS]
    rows = []
    for gen in sorted(by_gen):
        for key in pairs:
            c = by_gen[gen].get(key)
            if c:
                rows.append([gen, key, c["mutants"], c["agreed"], *(c[k] for k in KINDS)])
    for key in pairs:
        tot = {k: sum(by_gen[g].get(key, {}).get(k, 0) for g in by_gen) for k in ("mutants", "agreed", *KINDS)}
        rows.append(["TOTAL", key, tot["mutants"], tot["agreed"], *(tot[k] for k in KINDS)])
    w = [max(len(str(r[j])) for r in [head, *rows]) for j in range(len(head))]
    fmt = lambda r: "  ".join(str(v).ljust(w[j]) if j < 2 else str(v).rjust(w[j]) for j, v in enumerate(r))  # noqa: E731
    lines = [fmt(head), fmt(["-" * x for x in w])]
    prev = None
    for r in rows:
        if prev is not None and r[0] != prev and r[0] == "TOTAL":
            lines.append(fmt(["-" * x for x in w]))
        lines.append(fmt(r))
        prev = r[0]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    weights = generator_weights()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000, help="mutants (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default 0)")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="worker processes (default 2)")
    ap.add_argument("--out", help="write each disagreeing mutant and a .json of its three outcomes here")
    ap.add_argument("--readers", default="py,js,c", help="a subset of py,js,c (at least two; default all)")
    ap.add_argument("--generators", default=",".join(weights),
                    help=f"comma-separated subset of: {', '.join(weights)} (default all)")
    ap.add_argument("--js-cmd", default=DEFAULT_JS, help="the JavaScript reader's command line (--batch is appended)")
    ap.add_argument("--qformat-c", default=_default_c(), help="qformat-c (a command line; --batch is appended)")
    ap.add_argument("--corpus", default=str(REPO / "conformance" / "v1"), help="conformance corpus (default conformance/v1)")
    ap.add_argument("--batch-size", type=int, default=250, help="mutants per chunk (one node and one qformat-c process each)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per batch process")
    ap.add_argument("--verbose", action="store_true", help="one JSON line per disagreeing mutant on stderr")
    ap.add_argument("--no-table", action="store_true", help="print only the JSON summary")
    a = ap.parse_args(argv)

    given = [r.strip() for r in a.readers.split(",") if r.strip()]
    a.readers = [r for r in READERS if r in given]
    bad = [r for r in given if r not in READERS]
    if bad or len(a.readers) < 2:
        ap.error(f"--readers: two or more of py, js, c (got {','.join(given)})")
    gens = [g.strip() for g in a.generators.split(",") if g.strip()]
    unknown = [g for g in gens if g not in weights]
    if unknown or not gens:
        ap.error(f"--generators: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(weights)}")
    cmds = {"js": shlex.split(a.js_cmd), "c": shlex.split(a.qformat_c)}
    for r in ("js", "c"):
        if r in a.readers and not shutil.which(cmds[r][0]):
            print(f"differential: the {r} reader {cmds[r][0]!r} is not there (build it, or leave {r} out of --readers)",
                  file=sys.stderr)
            return 2
    if a.out:
        os.makedirs(a.out, exist_ok=True)

    t0 = time.perf_counter()
    _STATE.update(args=a, mutator=Mutator(Path(a.corpus)), turns=schedule(gens, weights), cmds=cmds)
    chunks = [list(range(s, min(a.count, s + a.batch_size))) for s in range(0, a.count, a.batch_size)]
    results = []
    if a.jobs > 1 and len(chunks) > 1:
        with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
            results = list(pool.imap_unordered(_work, chunks))
    else:
        results = [_work(ch) for ch in chunks]
    seconds = time.perf_counter() - t0

    pairs = [f"{x}-{y}" for x, y in itertools.combinations(a.readers, 2)]
    by_gen: dict[str, dict[str, dict[str, int]]] = {}
    outcomes = {r: {"valid": 0, "error": 0, "crash": 0} for r in a.readers}
    records, batch_errors = [], []
    for res in results:
        for gen, t in res["tally"].items():
            g = by_gen.setdefault(gen, {})
            for key, c in t.items():
                d = g.setdefault(key, {"mutants": 0, "agreed": 0, **{k: 0 for k in KINDS}})
                for k, v in c.items():
                    d[k] += v
        for r, c in res["outcomes"].items():
            for k, v in c.items():
                outcomes[r][k] += v
        records.extend(res["records"])
        batch_errors.extend(res["batch_errors"])
    records.sort(key=lambda r: r["index"])
    pair_tot = {key: {k: sum(by_gen[g].get(key, {}).get(k, 0) for g in by_gen) for k in ("mutants", "agreed", *KINDS)}
                for key in pairs}
    for r in records if a.verbose else []:
        print(json.dumps(r), file=sys.stderr)
    for e in batch_errors:
        print(f"differential: a batch process failed: {e}", file=sys.stderr)
    summary = {
        "mutants": a.count, "seed": a.seed, "readers": a.readers,
        "disagreeing_mutants": len(records),
        "pairs": {key: {"mutants": c["mutants"], "agreed": c["agreed"],
                        "disagreed": {k: c[k] for k in KINDS if c[k]}} for key, c in pair_tot.items()},
        "by_generator": {g: {"mutants": next(iter(by_gen[g].values()))["mutants"],
                             "pairs": {key: {"agreed": c["agreed"], "disagreed": {k: c[k] for k in KINDS if c[k]}}
                                       for key, c in by_gen[g].items()}} for g in sorted(by_gen)},
        "outcomes": outcomes, "batch_errors": len(batch_errors),
        "seconds": round(seconds, 2), "mutants_per_second": round(a.count / seconds, 1) if seconds else None,
        "jobs": a.jobs, "out": a.out,
    }
    if not a.no_table:
        print(_table(by_gen, pairs))
        print(f"{a.count} mutants in {seconds:.1f} s ({summary['mutants_per_second']} /s, {a.jobs} jobs); "
              f"{len(records)} disagreeing mutants; outcomes {outcomes}")
    print(json.dumps(summary))
    return 0 if not records and not batch_errors else 1


if __name__ == "__main__":
    sys.exit(main())
