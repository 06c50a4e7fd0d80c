"""``qformat conformance report``: counts per spec section, per implementation, and the files.

The report runs on a few cases with the Python reference and a reader wrong on purpose (it
answers valid cases right, with the gold file, and every error case with a code that does
not exist), so
the expected figures are known from the manifest alone: the reference passes everything, the
broken reader passes exactly the valid cases, per section and in total.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from qformat import conformance as conf
from qformat import conformance_report as rep

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "conformance" / "v1"
IDS = ["int4-*", "malformed-header-not-utf8*", "malformed-offsets-*"]


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    man = conf.load_manifest(str(CORPUS), verify=False)
    chosen = conf.select(man["cases"], IDS, [], [])
    assert 8 <= len(chosen) <= 20, [c["id"] for c in chosen]
    assert any(c["expect"] == "valid" for c in chosen) and any(c["expect"] != "valid" for c in chosen)
    return chosen


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, cases: list[dict]) -> tuple[dict, str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("report")
    broken = tmp / "broken_reader.py"
    # no qformat import (a process per case stays cheap): a valid case's answer is the gold file
    # beside its input; every other case gets a code that does not exist
    broken.write_text(textwrap.dedent("""\
        import os, shutil, sys
        gold = os.path.join(os.path.dirname(sys.argv[1]), "expected.safetensors")
        if os.path.exists(gold):
            shutil.copyfile(gold, sys.argv[2])
            sys.exit(0)
        print("NOT_A_REAL_CODE")
        sys.exit(1)
        """))
    out, js = tmp / "REPORT.md", tmp / "report.json"
    argv = [sys.executable, "-m", "qformat", "conformance", "report", "--corpus", str(CORPUS), "--no-builtin",
            "--python", "ref=qformat.conformance:reference_reader",
            "--reader", f"broken={shlex.quote(sys.executable)} {shlex.quote(str(broken))}",
            "--out", str(out), "--json", str(js), "--jobs", "2"]
    for i in IDS:
        argv += ["--id", i]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(js.read_text(encoding="utf-8")), out.read_text(encoding="utf-8"), p


def _expected_counts(cases: list[dict], passes) -> dict[str, tuple[int, int]]:
    """Row -> (passed, total), computed here from the manifest, independently of the module."""
    counts: dict[str, list[int]] = {}
    for c in cases:
        rows = {f"§{s.split('.')[0]}" for s in c["spec"]} | {s for s in c["spec"] if "." in s}
        for r in rows:
            t = counts.setdefault(r, [0, 0])
            t[1] += 1
            t[0] += bool(passes(c))
    return {k: (v[0], v[1]) for k, v in counts.items()}


def test_counts_per_section_and_totals(report, cases) -> None:
    doc, _, _ = report
    impls = {i["name"]: i for i in doc["implementations"]}
    assert [i["name"] for i in doc["implementations"]] == ["ref", "broken"]
    n, n_valid = len(cases), sum(c["expect"] == "valid" for c in cases)
    assert (impls["ref"]["passed"], impls["ref"]["failed"], impls["ref"]["total"]) == (n, 0, n)
    assert (impls["broken"]["passed"], impls["broken"]["failed"]) == (n_valid, n - n_valid)
    assert sorted(f["id"] for f in impls["broken"]["failures"]) == sorted(c["id"] for c in cases if c["expect"] != "valid")
    assert all(f["got"] == "error:NOT_A_REAL_CODE" for f in impls["broken"]["failures"])
    got = {r["row"]: r for r in doc["sections"]}
    want_ref = _expected_counts(cases, lambda c: True)
    want_broken = _expected_counts(cases, lambda c: c["expect"] == "valid")
    assert set(got) == set(want_ref)
    for row, (passed, total) in want_ref.items():
        assert got[row]["cases"] == total and got[row]["passed"]["ref"] == passed, row
        assert got[row]["passed"]["broken"] == want_broken[row][0], row
    assert any(got[r]["passed"]["broken"] < got[r]["cases"] for r in got)  # the broken row shows failures
    assert doc["corpus"]["cases_selected"] == n and doc["corpus"]["filters"] == {"id": IDS}


def test_sections_are_in_spec_order_with_top_levels_first(report) -> None:
    doc, _, _ = report
    rows = [r["section"] for r in doc["sections"]]
    assert rows == sorted(rows, key=lambda s: (rep.section_key(rep.top_level(s)), s != rep.top_level(s), rep.section_key(s)))
    assert rows.index("2") < rows.index("2.3") < rows.index("6")
    assert [r["row"] for r in doc["sections"] if r["top_level"]][0] == "§2"


def test_markdown_table(report, cases) -> None:
    doc, md, _ = report
    n, n_valid = len(cases), sum(c["expect"] == "valid" for c in cases)
    assert "| Section | ref | broken |" in md
    total = next(ln for ln in md.splitlines() if ln.startswith("| **Total** |"))
    assert total == f"| **Total** | **{n}/{n}** ✅ | **{n_valid}/{n}** |"
    row = next(ln for ln in md.splitlines() if ln.startswith("| &emsp;2.3 "))
    r23 = next(r for r in doc["sections"] if r["row"] == "2.3")
    assert row.endswith(f"| {r23['cases']}/{r23['cases']} ✅ | {r23['passed']['broken']}/{r23['cases']} |")
    assert "**§2** The container" in md  # titles come from SPEC.md
    failing = md.split("## Failures", 1)[1]
    assert "<b>broken</b>" in failing and "<b>ref</b>" not in failing
    for c in cases:
        assert (f"`{c['id']}`" in failing) == (c["expect"] != "valid"), c["id"]
    assert f"corpus **{doc['corpus']['corpus_version']}**".lower() in md.lower()
    assert "--reader 'broken=" in md  # the command line that made it


def test_json_is_stable(report) -> None:
    doc, _, p = report
    assert doc["format_version"] == 1
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    # the file is written exactly so: sorted keys, two-space indent (diffs between runs stay small)
    js = next(a for a in p.args[p.args.index("--json") + 1:][:1])
    assert Path(js).read_text(encoding="utf-8") == text


@pytest.mark.parametrize("extra, message", [
    (["--no-builtin"], "no implementation to run"),
    (["--no-builtin", "--reader", "no name"], "NAME=CMD"),
    (["--no-builtin", "--reader", "a|b=x"], "NAME=CMD"),
    (["--no-builtin", "--python", "r=qformat.conformance:reference_reader", "--python", "r=qformat.conformance:reference_reader"],
     "two implementations are named 'r'"),
    (["--no-builtin", "--python", "r=no_such_module_xyz:f"], "cannot load the reader"),
    (["--no-builtin", "--reader", "r=./no-such-reader-xyz --flag"], "'./no-such-reader-xyz' was not found"),
    (["--no-builtin", "--python", "r=qformat.conformance:reference_reader", "--id", "no-such-case-*"], "no case matches"),
])
def test_usage_errors_exit_2_with_a_code(tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], message: str) -> None:
    from qformat.cli import main

    code = main(["conformance", "report", "--corpus", str(CORPUS), "--no-verify",
                 "--out", str(tmp_path / "r.md"), "--json", str(tmp_path / "r.json"), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "[FILE_UNREADABLE]" in err and "Traceback" not in err
    assert not (tmp_path / "r.md").exists()


def test_help_shows_defaults(capsys: pytest.CaptureFixture) -> None:
    from qformat.cli import main

    with pytest.raises(SystemExit) as e:
        main(["conformance", "report", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for s in ("--reader NAME=CMD", "--python NAME=MODULE:FUNC", "--no-builtin", "default: conformance/REPORT.md",
              "default: conformance/report.json", "default: 2"):
        assert s in out, s


def test_c_column_not_run_when_libqformat_cannot_be_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "libqformat").mkdir()
    (tmp_path / "libqformat" / "CMakeLists.txt").write_text("project(x C)\n")
    monkeypatch.setattr(rep, "ROOT", str(tmp_path))
    impl = rep._builtin_c(False, 1, lambda m: None)
    assert impl.skipped and "not built" in impl.skipped and "--no-build" in impl.skipped
    monkeypatch.setattr(rep.shutil, "which", lambda name: None)
    impl = rep._builtin_c(True, 1, lambda m: None)
    assert impl.skipped and "cmake" in impl.skipped
    js = rep._builtin_js()
    assert js.skipped  # no readers/js under tmp_path


def test_section_helpers() -> None:
    assert rep.top_level("3.7.5") == "3" and rep.top_level("A.1") == "A" and rep.top_level("14") == "14"
    assert sorted(["10", "A", "2.10", "2.3", "9", "B.1", "2"], key=rep.section_key) == ["2", "2.3", "2.10", "9", "10", "A", "B.1"]
    assert rep.case_sections({"spec": ["9.1", "9", "3.7", "3.4", "3.7"]}) == (["3.4", "3.7", "9", "9.1"], ["3", "9"])
