"""The coverage-guided fuzz targets (issue 40, item 7; tests/atheris_targets.py says what each
target builds and promises).

- Every input a fuzz run once failed on (``tests/fixtures/atheris/<target>/regressions/``) is
  replayed through its target in this process: it must now end in success or a qformat error
  code, every promise kept, within the target's time limit.
- Every target runs briefly under atheris (a fuzzing process, libFuzzer ``-seed`` fixed) and must
  find nothing, and its instrumentation must report coverage (qformat's branches are seen).
- The oracle can fail: a fuzzing process with a planted defect (an uncaught TypeError in the
  header parser, a hang, a merge that writes outside its sandbox, a runaway allocation) must
  end with the matching finding and its input kept.

scripts/fuzz_atheris.py runs the targets at scale.  Skipped where atheris is not installed
(``pip install .[test]`` installs it).
"""

from __future__ import annotations

import signal
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests import atheris_targets as at

SEED = 20261205


def _regressions() -> list[Any]:
    return [pytest.param(name, p, id=f"{name}/{p.name[:16]}")
            for name, t in at.TARGETS.items() if t.regressions_dir.is_dir() for p in sorted(t.regressions_dir.iterdir())]


class _Hang(BaseException):
    pass


def _alarm(_sig: int, _frame: Any) -> None:
    raise _Hang()


def test_registry_is_complete() -> None:
    """The targets issue 40 names, each with committed seeds."""
    assert list(at.TARGETS) == ["header", "gguf", "gguf_hf", "merge", "split_manifest", "imatrix", "remote"]
    for t in at.TARGETS.values():
        assert t.seeds_dir.is_dir() and any(t.seeds_dir.iterdir()), f"{t.name}: no seeds (scripts/fuzz_atheris.py --write-seeds)"


@pytest.mark.parametrize(("name", "path"), _regressions())
def test_regression_input(name: str, path: Path) -> None:
    """A kept input, replayed in this process: success or a coded refusal, every promise kept,
    within the target's time limit."""
    t = at.TARGETS[name]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(t.timeout_s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as in the fuzzing process: a warning is no finding
            t.one_input(path.read_bytes())
    except _Hang:
        pytest.fail(f"{name}: {path.name} ran past {t.timeout_s} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name", list(at.TARGETS))
def test_seeded_short_run(name: str, tmp_path: Path) -> None:
    """``short_runs`` executions (the seeds, then coverage-guided mutants of them) with a fixed
    libFuzzer seed: no uncoded exception, broken promise, hang or exhaustion, and coverage seen."""
    pytest.importorskip("atheris")
    t = at.TARGETS[name]
    r = at.run(name, t.short_runs, SEED, tmp_path, wall_limit_s=300)
    assert r.finding is None, f"{name}: {r.finding}: {r.signature}\n{r.log[-3000:]}"
    assert r.executions >= t.short_runs, r.log[-3000:]
    assert r.cov > 0, f"no coverage reported: is qformat instrumented?\n{r.log[-3000:]}"


@pytest.mark.parametrize(("target", "plant", "kind", "limits"), [
    pytest.param("header", "uncoded", "uncoded", {}, id="uncoded"),
    pytest.param("header", "hang", "hang", {"timeout_s": 1}, id="hang"),
    pytest.param("header", "oom", "oom", {"rss_limit_mb": 400}, id="oom"),
    pytest.param("merge", "escape", "escape", {}, id="escape"),
])
def test_oracle_catches_planted_defect(target: str, plant: str, kind: str, limits: dict[str, int], tmp_path: Path) -> None:
    """A defect planted in the fuzzing process (tests/atheris_targets.py's PLANTS) is found at
    once, as its kind, and its input is kept as a libFuzzer artifact."""
    pytest.importorskip("atheris")
    r = at.run(target, 50, SEED, tmp_path, plant=plant, wall_limit_s=300, **limits)
    assert r.finding == kind, f"{plant}: found {r.finding} ({r.signature})\n{r.log[-3000:]}"
    assert r.artifact is not None and r.artifact.is_file() and r.artifact.name.startswith(
        {"hang": "timeout-", "oom": "oom-"}.get(kind, "crash-")), r.artifact
    if kind == "uncoded":
        assert "TypeError: planted defect" in r.signature and "qformat/io.py" in r.signature, r.signature
