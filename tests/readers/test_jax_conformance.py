"""The whole conformance corpus through qformat.jax.conformance_reader (in-process protocol)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("jax")

from qformat import conformance as conf  # noqa: E402
from qformat_jax import conformance_reader  # noqa: E402

CORPUS = Path(__file__).resolve().parents[2] / "conformance" / "v1"


def test_jax_reader_passes_the_corpus():
    if not (CORPUS / "manifest.json").is_file():
        pytest.skip("the conformance corpus (conformance/v1) is not built")
    cases = conf.load_manifest(str(CORPUS))["cases"]
    lines: list[str] = []
    conf.run(str(CORPUS), list(cases), lambda c: conf.run_python(conformance_reader, str(CORPUS), c), lines.append, "qformat_jax")
    results = [json.loads(x) for x in lines[:-1]]
    failed = {r["id"]: r["detail"] for r in results if r["result"] != "pass"}
    assert not failed, failed
    assert len(results) == len(cases)
