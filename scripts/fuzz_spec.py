"""Longer differential fuzzing run: reference reader against conformance/spec_reference.py.

    .venv/bin/python scripts/fuzz_spec.py [--mutants 10000] [--seed 1]

The comparison is tests/test_spec_differential.py's; exits 1 and lists the mutants on any
disagreement (each is a spec point to settle, SPEC.md §1.4).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.test_spec_differential import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    t = time.time()
    outcomes, bad = run(a.mutants, a.seed)
    print(f"{a.mutants} mutants in {time.time() - t:.0f} s; reference outcomes: {dict(sorted(outcomes.items()))}")
    for line in bad[:100]:
        print(line)
    print(f"{len(bad)} disagreements")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
