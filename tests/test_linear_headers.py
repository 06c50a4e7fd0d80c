"""Every header walk is linear in the number of tensors (issue 40: ``load_file`` of 40,000 plain
tensors took 23 s, 100,000 took 191 s, where safetensors takes 0.3 s).

Each test reads a file (or checkpoint) of N and of 4N tensors and compares the CPU seconds: a
linear walk takes about 4 times as long, a quadratic one about 16 times (the quadratic
``require`` measured 15x from 2,000 to 8,000 tensors).  The bound, 6, leaves room for noise;
each size is timed three times, interleaved, and the fastest run counts; a ratio above the
bound is measured again (twice at most) before it fails.  Speeds against
safetensors are bench/'s (``python -m bench --only headers``), not asserted here.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import qformat
from qformat.container import Entry, Header
from qformat.index import Index, mismatches
from qformat.model import FileModel

from .filebuild import int4_tensor

#: time(4N) / time(N) above this is not linear (linear: about 4; quadratic: about 16)
BOUND = 6.0


def _plain(path: Path, n: int) -> None:
    from safetensors.numpy import save_file

    save_file({f"model.layers.{i}.t": np.full(2, i, np.float32) for i in range(n)}, str(path))


def _digested(path: Path, n: int) -> None:
    """A qformat 1.2 file: one int4 tensor and ``n`` plain ones, ``n + 2`` recorded digests."""
    d, c = int4_tensor("w")
    qformat.save_file({"w": qformat.QTensor(d, c), **{f"t{i}": np.full(2, i, np.float32) for i in range(n)}}, path)


def _quantized(path: Path, n: int) -> None:
    """``n`` int4 tensors: ``n`` descriptors, ``2n`` components."""
    tensors = {}
    for i in range(n):
        d, c = int4_tensor(f"q{i}", seed=i % 7)
        tensors[f"q{i}"] = qformat.QTensor(d, c)
    qformat.save_file(tensors, path)


def _sharded(folder: Path, n: int, per: int = 25) -> Path:
    """An index of ``n`` plain tensors in shards of ``per``."""
    from safetensors.numpy import save_file

    folder.mkdir()
    wm = {}
    for s in range(n // per):
        name = f"model-{s:05d}.safetensors"
        part = {f"s{s}.t{i}": np.zeros(2, np.float32) for i in range(per)}
        save_file(part, str(folder / name))
        wm.update(dict.fromkeys(part, name))
    idx = folder / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return idx


def _each(verify: bool = False) -> Callable[[Path], None]:
    def go(p: Path) -> None:
        with qformat.safe_open(p, verify=verify) as f:
            for k in f.keys():
                f.get_tensor(k)
    return go


def _checked(**kw: Any) -> Callable[[Path], None]:
    def go(p: Path) -> None:
        rep = qformat.check(p, **kw)
        assert rep.ok, rep.problems[:3]
    return go


def _inspect(p: Path) -> None:
    from qformat.cli import main

    assert main(["inspect", str(p)]) == 0


def _ratio(small: Any, large: Any, op: Callable[[Any], Any]) -> tuple[float, float]:
    """Fastest CPU seconds of ``op`` on ``small`` and on ``large``, three runs each, interleaved
    (after a warm-up, so first-use imports are not timed).  The cyclic garbage collector is off
    while timing: its full collections land on one run or another and scan every live object,
    noise of up to 1.5x at these sizes that says nothing about the walks themselves."""
    op(small)
    best = [float("inf"), float("inf")]
    for _ in range(3):
        for i, arg in enumerate((small, large)):
            gc.collect()
            gc.disable()
            try:
                t0 = time.process_time()
                op(arg)
                best[i] = min(best[i], time.process_time() - t0)
            finally:
                gc.enable()
    return best[0], best[1]


def _assert_linear(what: str, n: int, measure: Callable[[], tuple[float, float]]) -> None:
    """``measure()`` gives (seconds at n, seconds at 4n).  Measured again, up to three times in
    all, while the ratio is above the bound: on a shared machine a burst of other work can slow
    one run of a linear walk (this happened, at 6.5x), while a quadratic walk is above the bound
    every time (15x and more)."""
    seen = []
    for _ in range(3):
        t = measure()
        seen.append(f"{t[0]:.3f} s / {t[1]:.3f} s = {t[1] / t[0]:.1f}x")
        if t[1] < BOUND * t[0]:
            return
    pytest.fail(f"{what}: {n} then {4 * n} tensors took {'; '.join(seen)} (linear is about 4x, the bound {BOUND}x)")


FILE_CASES = {
    "load_file": (_plain, 3000, qformat.load_file),
    "safe_open + get_tensor": (_plain, 3000, _each()),
    "check --header-only": (_plain, 3000, _checked(payload=False)),
    "check": (_plain, 3000, _checked()),
    "inspect": (_plain, 1500, _inspect),
    "load_file(verify=True)": (_digested, 1500, lambda p: qformat.load_file(p, verify=True)),
    "safe_open(verify=True) + get_tensor": (_digested, 1500, _each(verify=True)),
    "check --digests": (_digested, 1500, _checked(digests=True)),
    "load_file, quantized": (_quantized, 150, qformat.load_file),
    "check, quantized": (_quantized, 150, _checked()),
}


@pytest.mark.parametrize("case", list(FILE_CASES))
def test_file_walks_are_linear_in_the_tensor_count(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    build, n, op = FILE_CASES[case]
    small, large = tmp_path / "small.safetensors", tmp_path / "large.safetensors"
    build(small, n)
    build(large, 4 * n)
    _assert_linear(case, n, lambda: _ratio(small, large, op))


def test_save_file_is_linear_in_the_tensor_count(tmp_path: Path) -> None:
    """The writer too: placing 3,000 digest placeholders in the header was one search of the
    header each (25 s for 24,000 tensors)."""
    _assert_linear("save_file with digests", 3000, lambda: _ratio(3000, 12000, lambda n: _digested(tmp_path / f"{n}.safetensors", n)))


@pytest.mark.parametrize("case", ["load_file", "check"])
def test_sharded_checkpoints_are_linear_in_the_tensor_count(tmp_path: Path, case: str) -> None:
    n = 1000
    small, large = _sharded(tmp_path / "small", n), _sharded(tmp_path / "large", 4 * n)
    op = qformat.load_file if case == "load_file" else _checked()
    _assert_linear(f"sharded {case}", n, lambda: _ratio(small, large, op))


def test_index_mismatches_are_linear_in_the_entries() -> None:
    """Checking every shard against the index: one pass over the weight map in all, not one per
    shard (it was: 10^5 entries in 1,000 shards made 10^8 steps)."""
    def walk(n: int) -> None:
        per = 10
        shards = {f"model-{s:05d}.safetensors": [f"s{s}.t{i}" for i in range(per)] for s in range(n // per)}
        index = Index("/x/model.safetensors.index.json", "/x", {k: shard for shard, names in shards.items() for k in names})
        for shard, names in shards.items():
            header = Header(None, {k: Entry(k, "F32", (0,), 0, 0) for k in names}, 8, 8)
            assert mismatches(index, shard, header, FileModel()) == []

    _assert_linear("mismatches over every shard", 20000, lambda: _ratio(20000, 80000, walk))


def _depth_walk(text: str, limit: int) -> bool:
    """The nesting guard as a walk over the characters (the reference its linear rewrite keeps):
    brackets outside strings, a backslash in a string escaping the next character."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def test_json_depth_guard_agrees_with_a_character_walk() -> None:
    """container.json_depth_ok (regular expressions and NumPy since issue 40; it was a Python loop
    per character, 0.6 s of a 10^5-tensor header) gives the walk's answer on every text."""
    import random

    from qformat.container import MAX_JSON_DEPTH, json_depth_ok

    rng = random.Random(40)
    for _ in range(20000):
        text = "".join(rng.choice('[]{}"\\ a,:') for _ in range(rng.randint(0, 40)))
        limit = rng.randint(0, 8)
        assert json_depth_ok(text, limit) == _depth_walk(text, limit), (text, limit)
    deep = '{"a":' * MAX_JSON_DEPTH + "1" + "}" * MAX_JSON_DEPTH
    assert json_depth_ok(deep) and not json_depth_ok("[" + deep + "]")
    assert json_depth_ok('"' + "[" * 1000 + '"') and json_depth_ok('"\\"' + "[" * 1000)  # inside strings


def test_bench_headers_section_runs(tmp_path: Path) -> None:
    """``python -m bench --only headers`` in --quick form (10^3 tensors): every reader of the
    section agrees with safetensors and gets its row and ratio (no speed asserted here)."""
    from bench.harness import main

    out = tmp_path / "r.json"
    assert main(["--quick", "--only", "headers", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["section"] == "headers (1000 tensors)"]
    assert len(rows) == 17 and all(r["ms"] > 0 and r["x_safetensors_load_file"] > 0 for r in rows)
    assert {r["name"] for r in rows} >= {"qformat load_file, plain file", "safetensors load_file (numpy), plain file",
                                         "qformat check --digests, qformat 1.2 file"}
