"""Hostile input at scale: mutants through every reader and command (tests/fuzz.py).

    .venv/bin/python scripts/fuzz_all.py [--mutants 100000] [--seed 1] [--jobs 2]
        [--targets numpy,torch,js,convert,...] [--json totals.json]

Default targets: all of tests/fuzz.all_targets() (the readers numpy, torch, jax, js; convert,
dequantize, diff, inspect, check and export to every registered target).  Prints the runs,
outcomes and findings per target; exits 1 when there is any finding (a crash, a hang, a
disagreement, a refused file accepted, a file left behind), listing the first fifty.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _work(args: tuple[int, int, list[str], int, int]) -> object:
    from tests import fuzz

    n, seed, targets, start, step = args
    return fuzz.run(n, seed, targets, start, step)


def main() -> int:
    from tests import fuzz

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--targets", default=",".join(fuzz.all_targets()))
    ap.add_argument("--json", help="write the totals here")
    a = ap.parse_args()
    targets = [t for t in a.targets.split(",") if t]
    unknown = sorted(set(targets) - set(fuzz.all_targets()))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {fuzz.all_targets()}")
    t0 = time.time()
    totals = fuzz.Totals()
    jobs = [(a.mutants, a.seed, targets, k, a.jobs) for k in range(a.jobs)]
    with multiprocessing.get_context("spawn").Pool(a.jobs) as pool:
        for part in pool.imap_unordered(_work, jobs):
            totals.merge(part)
    secs = time.time() - t0
    d = totals.to_dict()
    d.update(mutants=a.mutants, seed=a.seed, seconds=round(secs), targets=targets)
    print(f"{a.mutants} mutants, seed {a.seed}, {a.jobs} jobs, {secs:.0f} s")
    for t in targets:
        outs = totals.outcomes.get(t, {})
        top = ", ".join(f"{k} {v}" for k, v in sorted(outs.items(), key=lambda kv: -kv[1])[:6])
        print(f"  {t:28s} {totals.runs.get(t, 0):8d} runs, findings {dict(totals.by_kind.get(t, {})) or 0}; {top}")
    print(f"  total {sum(totals.runs.values())} runs, {len(totals.findings)} findings")
    for line in totals.findings[:50]:
        print("   ", line[:400])
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(d, f, indent=1, sort_keys=True)
    return 1 if totals.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
