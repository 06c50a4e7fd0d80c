"""Coverage-guided fuzzing at scale: tests/atheris_targets.py's targets under atheris (libFuzzer).

    nice -n 10 .venv/bin/python scripts/fuzz_atheris.py --target all --runs 100000 [--runs gguf_hf=10000 ...]
        [--seconds S] [--seed 1] [--json totals.json] [--corpus DIR] [--max-restarts 10] [--no-keep]
    .venv/bin/python scripts/fuzz_atheris.py --write-seeds [--target NAME]

Each target runs in its own process, one at a time (``python -m tests.atheris_targets NAME``;
libFuzzer ends the process when its runs are done or when it finds something).  ``--runs``
takes one count for every target and ``NAME=COUNT`` for one (executions, the seeds' first pass
included); ``--seconds`` bounds each target's time.  A finding (``uncoded``: an exception that
is not a qformat error; ``escape``: a read, write or request outside what was named;
``promise``: another broken promise; ``crash``: a native crash; ``hang``: past the target's
``-timeout``; ``oom``: past its ``-rss_limit_mb``) ends the process: its input is copied into
``tests/fixtures/atheris/<target>/regressions/<sha256>`` (not with ``--no-keep``) and the target
starts again from the next seed with the corpus grown so far, until its runs or seconds are
spent or ``--max-restarts`` findings were made.  The grown corpora are kept in ``--corpus``
(default: a temporary folder, removed).

Prints per target the executions, seconds, executions per second, libFuzzer's coverage
(``cov``: instrumented edges reached; ``ft``: features), the corpus size and the findings by
kind with their signatures; ``--json`` writes the same and the totals.  Exits 1 when anything
was found.  ``--write-seeds`` writes each target's seed corpus into
``tests/fixtures/atheris/<target>/seeds/`` (replacing it) and exits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests import atheris_targets as at  # noqa: E402

KINDS = ("uncoded", "escape", "promise", "crash", "hang", "oom")


def write_seeds(names: list[str]) -> None:
    """Write each target's seeds (named by their SHA-256's first 16 hex digits and their label)."""
    for name in names:
        t = at.TARGETS[name]
        made = t.make_seeds()
        shutil.rmtree(t.seeds_dir, ignore_errors=True)
        t.seeds_dir.mkdir(parents=True)
        for label, data in made.items():
            (t.seeds_dir / f"{hashlib.sha256(data).hexdigest()[:16]}-{label}").write_bytes(data)
        print(f"{name}: {len(made)} seeds, {sum(map(len, made.values()))} bytes in {t.seeds_dir.relative_to(at.ROOT)}")


def fuzz_target(name: str, runs: int, seed: int, work: Path, corpus: Path, seconds: float | None, max_restarts: int, keep: bool,
                nice: int) -> dict[str, Any]:
    """``runs`` executions of target ``name`` (restarted after each finding); its totals."""
    tot: dict[str, Any] = dict(target=name, executions=0, seconds=0.0, cov=0, ft=0, corpus=0, peak_rss_mb=0, processes=0,
                               findings=Counter(), signatures={}, kept=[], errors=[])
    t0 = time.monotonic()
    left, skip = runs, set()
    while left > 0:
        budget = None if seconds is None else int(seconds - (time.monotonic() - t0))
        if budget is not None and budget < 5:
            break
        r = at.run(name, left, seed + tot["processes"], work / name, corpus=corpus, seconds=budget, nice=nice,
                   skip=frozenset(skip), every_module=True)
        tot["processes"] += 1
        tot["executions"] += r.executions
        tot["seconds"] += r.seconds
        tot["cov"], tot["ft"] = max(tot["cov"], r.cov), max(tot["ft"], r.ft)
        tot["corpus"], tot["peak_rss_mb"] = max(tot["corpus"], r.corpus), max(tot["peak_rss_mb"], r.peak_rss_mb)
        left -= max(r.executions, 1)
        if r.finding is None:
            if r.executions == 0:
                tot["errors"].append(r.log[-800:])
            break
        if r.finding == "error":  # the process failed outside any input (no finding): restarting would not help
            tot["errors"].append(r.signature + "\n" + r.log[-1500:])
            break
        tot["findings"][r.finding] += 1
        sig = f"{r.finding}: {r.signature}"
        tot["signatures"][sig] = tot["signatures"].get(sig, 0) + 1
        if r.artifact is not None:
            data = r.artifact.read_bytes()
            h = hashlib.sha256(data).hexdigest()
            skip.add(h)
            dest = at.TARGETS[name].regressions_dir / h
            if keep and not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
                tot["kept"].append(str(dest.relative_to(at.ROOT)))
            for p in corpus.iterdir():  # a corpus input that fails would fail the next process's first pass
                if p.is_file() and p.stat().st_size == len(data) and p.read_bytes() == data:
                    p.unlink()
        if tot["processes"] > max_restarts:
            break
    tot["seconds"] = round(tot["seconds"], 1)
    tot["exec_per_s"] = round(tot["executions"] / tot["seconds"], 1) if tot["seconds"] else 0.0
    tot["findings"] = dict(tot["findings"])
    return tot


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/fuzz_atheris.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="all", help="NAME, NAME,NAME or all (%s)" % ", ".join(at.TARGETS))
    ap.add_argument("--runs", action="append", default=[], help="executions per target: N, or NAME=N for one target")
    ap.add_argument("--seconds", type=float, help="at most this many seconds per target")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the per-target results and the totals here")
    ap.add_argument("--corpus", help="keep the grown corpora in DIR/<target> (default: a temporary folder)")
    ap.add_argument("--max-restarts", type=int, default=10)
    ap.add_argument("--no-keep", action="store_true", help="do not copy findings into tests/fixtures/atheris/*/regressions/")
    ap.add_argument("--nice", type=int, default=10, help="run the fuzzing processes under nice -n N (0: not)")
    ap.add_argument("--write-seeds", action="store_true", help="write the seed corpora into tests/fixtures/atheris/ and exit")
    args = ap.parse_args(argv)
    names = list(at.TARGETS) if args.target == "all" else args.target.split(",")
    for n in names:
        if n not in at.TARGETS:
            ap.error(f"unknown target {n!r}; the targets: {', '.join(at.TARGETS)}")
    if args.write_seeds:
        write_seeds(names)
        return 0
    default, per = 10000, {}
    for r in args.runs:
        if "=" in r:
            k, v = r.split("=", 1)
            per[k] = int(v)
        else:
            default = int(r)
    runs = {n: per.get(n, default) for n in names}
    work = Path(tempfile.mkdtemp(prefix="qformat-atheris-"))
    results = {}
    try:
        for n in names:
            corpus = Path(args.corpus) / n if args.corpus else work / "corpora" / n
            corpus.mkdir(parents=True, exist_ok=True)
            tot = fuzz_target(n, runs[n], args.seed, work, corpus, args.seconds, args.max_restarts, not args.no_keep, args.nice)
            results[n] = tot
            found = " ".join(f"{k} {tot['findings'].get(k, 0)}" for k in KINDS)
            print(f"{n:15s} {tot['executions']:9d} execs {tot['seconds']:8.1f} s {tot['exec_per_s']:8.1f}/s  cov {tot['cov']:5d}  "
                  f"ft {tot['ft']:6d}  corpus {tot['corpus']:5d}  findings: {found}", flush=True)
            for sig, c in tot["signatures"].items():
                print(f"    {c} x {sig}", flush=True)
            if tot["errors"]:
                print(f"    {len(tot['errors'])} harness error(s) (a process failed outside any input):")
            for e in tot["errors"]:
                print("    error: " + e.replace("\n", "\n    "), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = {"executions": sum(r["executions"] for r in results.values()),
             "errors": sum(len(r["errors"]) for r in results.values()),
             "seconds": round(sum(r["seconds"] for r in results.values()), 1),
             "findings": dict(sum((Counter(r["findings"]) for r in results.values()), Counter()))}
    print(f"{'total':15s} {total['executions']:9d} execs {total['seconds']:8.1f} s  findings: "
          + " ".join(f"{k} {total['findings'].get(k, 0)}" for k in KINDS) + f"  harness errors {total['errors']}")
    if args.json:
        out = {"seed": args.seed, "targets": results, "total": total}
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 1 if total["findings"] or total["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
