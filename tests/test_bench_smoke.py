"""Smoke run of the benchmark harness (bench/): every section on tiny data, one repetition.

No speed is asserted here (timings on a shared machine are noise); the full run,
``python -m bench``, evaluates the targets.  This only keeps the harness from rotting: each
section runs, its equality checks against gguf-py / bitsandbytes / safetensors hold, and the
JSON it writes has the rows the README's table is built from.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("gguf")
pytest.importorskip("bitsandbytes")
pytest.importorskip("torchao")

from bench.harness import main  # noqa: E402


def test_bench_quick_runs_every_section(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--quick", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    res = json.loads(out.read_text())
    sections = {r["section"] for r in res["rows"]}
    for expect in ("decode int4 g32 asym", "decode nvfp4", "gguf Q4_0 vs int4 g32 sym (offset_binary, fp16 scale)",
                   "gguf Q8_0 vs int8 g32", "gguf MXFP4 vs mxfp4", "nf4 vs bitsandbytes", "nf4 vs torchao",
                   "load to bf16 (warm page cache)", "load to bf16 (cold page cache)", "qformat check",
                   "decode memory", "scaling"):
        assert expect in sections, expect
    timed = [r for r in res["rows"] if "ms" in r]
    assert all(r["ms"] > 0 for r in timed)
    assert all(r["x_memcpy"] > 0 for r in timed if "x_memcpy" in r)
    checks = [r for r in res["rows"] if r["section"] == "qformat check"]
    assert len(checks) == 4 and all(r["peak_rss_MB"] > 0 for r in checks)
    assert list(tmp_path.glob("qformat-bench-*")) == []  # big temporary files are removed
    assert "[targets]" in capsys.readouterr().out
