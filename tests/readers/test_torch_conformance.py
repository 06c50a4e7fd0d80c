"""The whole conformance corpus through qformat_torch.conformance_reader (torch decode on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from qformat import conformance as conf  # noqa: E402

import qformat_torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    committed = ROOT / "conformance" / "v1"
    if (committed / "manifest.json").is_file():
        return str(committed)
    from conformance import generate  # the corpus is not committed yet: build it (about a second)

    out = tmp_path_factory.mktemp("corpus") / "v1"
    assert generate.main(["--root", str(out)]) == 0
    return str(out)


def test_torch_reader_passes_every_case(corpus):
    man = conf.load_manifest(corpus)
    lines: list[str] = []
    summary = conf.run(corpus, man["cases"], lambda c: conf.run_python(qformat_torch.conformance_reader, corpus, c), lines.append, "torch")
    failed = [r for r in map(json.loads, lines[:-1]) if r["result"] != "pass"]
    assert not failed, failed[:5]
    assert summary["passed"] == len(man["cases"]) > 0
