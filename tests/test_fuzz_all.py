"""The seeded hostile-input run of the suite (issue 24, item 7; tests/fuzz.py says what is
compared): about 10^4 target runs, every reader and every command on the same mutants, with no
crash, hang, disagreement, silently accepted refused file or file left behind.
``scripts/fuzz_all.py`` runs the same at scale."""

from __future__ import annotations

import shutil

import pytest

from tests import fuzz

SEED = 20261204


def _targets(with_jax: bool) -> list[str]:
    out = [t for t in fuzz.all_targets() if t != "jax" or with_jax]
    missing = []
    for mod, names in (("torch", ["torch", "qlinear"]), ("jax", ["jax"])):
        try:
            __import__(mod)
        except ImportError:
            missing += names
    if shutil.which("node") is None:
        missing.append("js")
    return [t for t in out if t not in missing]


def _assert_clean(totals: fuzz.Totals, targets: list[str], n: int) -> None:
    assert not totals.findings, f"{len(totals.findings)} findings:\n" + "\n".join(totals.findings[:40])
    assert all(totals.runs[t] == n for t in targets), dict(totals.runs)


def test_every_target_on_the_same_mutants() -> None:
    targets = _targets(with_jax=False)
    n = 800  # x 12 targets: about 10^4 runs, about 25 s on one core
    totals = fuzz.run(n, SEED, targets)
    _assert_clean(totals, targets, n)
    # the mutants reach many checks, and the commands both succeed and refuse
    assert len(totals.outcomes["numpy"]) >= 15, totals.outcomes["numpy"]
    assert totals.outcomes["convert"]["done"] >= n // 10 and totals.outcomes["dequantize"]["done"] >= n // 10


def test_jax_on_the_same_mutants() -> None:
    pytest.importorskip("jax")
    n = 120  # a compile per file: about 8 s
    totals = fuzz.run(n, SEED, ["numpy", "jax"])
    _assert_clean(totals, ["numpy", "jax"], n)
