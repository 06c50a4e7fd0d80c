"""``qformat diff``: the metrics' definitions, every readable kind on either side, the
``--fail-below`` gate, ``--json``, and ``--plot`` (with and without matplotlib)."""

from __future__ import annotations

import builtins
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import qformat
from qformat.cli import main
from qformat.convert import convert
from qformat.diff import TensorDiff, compare, coarser, diff_checkpoints, ordinals

from .test_inspect import _gguf, _gptq_source, model, quantized, run_cli, write_sharded


def cmp(a: np.ndarray, b: np.ndarray) -> TensorDiff:
    return compare(np.asarray(a), np.asarray(b), TensorDiff("t", "compared"))


def sqnr(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return 10 * math.log10(float((a64**2).sum()) / float(((a64 - b64) ** 2).sum()))


# -- the metrics ---------------------------------------------------------------------------
def test_bit_exact_nan_by_class_and_signed_zero() -> None:
    a = np.array([1.0, np.nan, 0.0], np.float32)
    b = a.copy()
    b.view(np.uint32)[1] = 0xFFC00001  # another NaN (sign and payload differ)
    t = cmp(a, b)
    assert t.bit_exact and t.differing_elements == 0 and t.sqnr_db == math.inf and t.max_abs_diff == 0
    b[2] = -0.0
    t = cmp(a, b)
    assert not t.bit_exact and t.differing_elements == 1 and t.max_ulp_diff == 0 and t.max_abs_diff == 0


def test_ulp_in_the_coarser_dtype() -> None:
    assert coarser(np.dtype(np.float32), np.dtype(np.float16)) == np.float16
    assert coarser(np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)) == ml_dtypes.bfloat16
    assert coarser(np.dtype(np.int8), np.dtype(np.float32)) is None
    one = np.array([1.0], np.float32)
    assert cmp(one, np.array([1.0 + 2**-10], np.float16)).max_ulp_diff == 1  # one fp16 step
    t = cmp(one, np.array([1.0 + 2**-23], np.float32))
    assert t.max_ulp_diff == 1 and t.ulp_dtype == "float32"
    t = cmp(np.array([1.0 + 2**-12], np.float32), np.array([1.0], np.float16))  # rounds to 1.0 in fp16
    assert t.max_ulp_diff == 0 and not t.bit_exact and t.ulp_dtype == "float16"
    # across zero: the smallest subnormals on both sides are 2 apart; -Inf vs +Inf is exact too
    tiny = np.array([2**-149], np.float32)
    assert cmp(tiny, -tiny).max_ulp_diff == 2
    assert int(ordinals(np.array([np.inf], np.float32))[0]) == 0x7F800000
    t = cmp(np.array([-np.inf], np.float32), np.array([np.inf], np.float32))
    assert t.max_ulp_diff == 2 * 0x7F800000 and t.nonfinite_mismatches == 1
    assert cmp(np.arange(4), np.arange(4) + 1).max_ulp_diff is None  # integers: no ulp


def test_sqnr_and_max_abs() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(3000).astype(np.float32)
    b = (a + rng.standard_normal(3000).astype(np.float32) * 0.01).astype(np.float32)
    t = cmp(a, b)
    assert t.sqnr_db == pytest.approx(sqnr(a, b), rel=1e-12)
    assert t.max_abs_diff == float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
    assert t.elements == 3000 and not t.bit_exact and t.differing_elements == int((a != b).sum())


def test_chunked_equals_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import qformat.diff as qd

    rng = np.random.default_rng(1)
    a = rng.standard_normal((50, 41)).astype(np.float32)
    b = a.astype(np.float16)
    whole = cmp(a, b)
    monkeypatch.setattr(qd, "CHUNK", 97)
    part = cmp(a, b)
    assert part.to_dict() == {**whole.to_dict(), "sqnr_db": pytest.approx(whole.to_dict()["sqnr_db"])}


# -- checkpoints ---------------------------------------------------------------------------
@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    t = model()
    a, b = tmp_path / "fp32.safetensors", tmp_path / "q.safetensors"
    qformat.save_file(t, a)
    qformat.save_file(quantized(t), b)
    return a, b, t


def test_plain_vs_quantized(pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    a, b, t = pair
    r = diff_checkpoints(a, b)
    dec = qformat.load_file(b)
    by = {x.name: x for x in r.tensors}
    assert [x.name for x in r.tensors] == ["layers.0.w", "layers.1.w", "layers.10.w", "norm"]
    assert by["norm"].bit_exact and by["norm"].sqnr_db == math.inf
    for n in ("layers.0.w", "layers.1.w", "layers.10.w"):
        x = by[n]
        assert not x.bit_exact and x.quantized_b and not x.quantized_a
        assert x.sqnr_db == pytest.approx(sqnr(t[n], dec[n]), rel=1e-12)
    s = r.summary()
    assert s["compared"] == 4 and s["bit_exact"] == 1 and s["only_in_a"] == s["only_in_b"] == []
    worst = min((by[n] for n in by if n != "norm"), key=lambda x: x.sqnr_db)
    assert s["worst_sqnr_db"]["name"] == worst.name and s["ok"] and s["failing"] == []


def test_cli_json_schema_and_gate(pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    a, b, _ = pair
    p = run_cli("diff", "--json", str(a), str(b))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["format_version"] == 1
    assert set(d) == {"format_version", "a", "b", "tensors", "summary"}
    assert d["a"] == {"path": str(a), "kind": "safetensors", "source_format": None}
    assert d["b"]["kind"] == "qformat"
    assert set(d["tensors"][0]) == {"name", "status", "shape_a", "shape_b", "dtype_a", "dtype_b", "quantized_a", "quantized_b",
                                    "elements", "bit_exact", "differing_elements", "nonfinite_mismatches", "max_abs_diff",
                                    "max_ulp_diff", "ulp_dtype", "sqnr_db", "error"}
    assert set(d["summary"]) == {"compared", "bit_exact", "shape_mismatches", "errors", "only_in_a", "only_in_b",
                                 "worst_sqnr_db", "fail_below_db", "failing", "ok"}
    norm = next(t for t in d["tensors"] if t["name"] == "norm")
    assert norm["sqnr_db"] == "inf" and norm["bit_exact"] is True
    worst = d["summary"]["worst_sqnr_db"]["sqnr_db"]
    ok = run_cli("diff", "--fail-below", str(worst - 0.5), str(a), str(b))
    assert ok.returncode == 0 and "gate --fail-below" in ok.stdout and ": pass" in ok.stdout
    bad = run_cli("diff", "--json", "--fail-below", str(worst + 0.5), str(a), str(b))
    assert bad.returncode == 1
    s = json.loads(bad.stdout)["summary"]
    assert s["ok"] is False and d["summary"]["worst_sqnr_db"]["name"] in s["failing"] and "norm" not in s["failing"]
    text = run_cli("diff", str(a), str(b))
    assert "4 tensors compared, 1 bit-exact" in text.stdout and "worst SQNR" in text.stdout


def test_only_in_and_shape_mismatch_fail_the_gate(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    qformat.save_file({"x": np.ones((2, 3), np.float32), "y": np.ones(4, np.float32), "only_a": np.zeros(1, np.float32)}, a)
    qformat.save_file({"x": np.ones((3, 2), np.float32), "y": np.ones(4, np.float32), "only_b": np.zeros(1, np.float32)}, b)
    r = diff_checkpoints(a, b, fail_below=10)
    s = r.summary()
    assert s["only_in_a"] == ["only_a"] and s["only_in_b"] == ["only_b"]
    assert s["shape_mismatches"] == ["x"] and s["failing"] == ["x"] and s["compared"] == 1
    assert main(["diff", str(a), str(b), "--fail-below", "10", "--quiet"]) == 1
    assert main(["diff", str(a), str(b)]) == 0  # without a gate, differences are reported, not an error


def test_sharded_vs_single_file(tmp_path: Path, pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    _, b, t = pair
    idx = write_sharded(tmp_path / "sharded", quantized(t))
    for other in (idx, idx.parent):
        r = diff_checkpoints(b, other)
        assert r.summary()["bit_exact"] == 4 == r.summary()["compared"]


def test_gguf_and_its_conversion_bit_exact(tmp_path: Path) -> None:
    g = _gguf(tmp_path / "m.gguf")
    out = tmp_path / "m.safetensors"
    convert(g, out)
    p = run_cli("diff", "--json", "--fail-below", "200", str(g), str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert d["a"]["source_format"] == "gguf" and d["b"]["kind"] == "qformat"
    s = d["summary"]
    assert s["compared"] == 4 and s["bit_exact"] == 4 and s["only_in_a"] == [] and s["only_in_b"] == []
    # and against gguf-py's own dequantization, saved as a plain file
    import gguf
    from gguf.quants import dequantize

    rd = gguf.GGUFReader(str(g))
    with np.errstate(over="ignore", invalid="ignore"):  # the planted edge scales overflow, as in gguf-py
        ref = {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
               for t in rd.tensors}
    plain = tmp_path / "gguf-py.safetensors"
    qformat.save_file(ref, plain)
    r = diff_checkpoints(plain, g)
    assert r.summary()["bit_exact"] == 4


def test_in_place_source_vs_conversion_and_oracle(tmp_path: Path) -> None:
    src, want = _gptq_source(tmp_path / "gptq")
    out = tmp_path / "out"
    convert(src, out)
    r = diff_checkpoints(src, out)
    s = r.summary()
    assert r.a["source_format"] == "gptq" and s["compared"] == s["bit_exact"] == 2
    oracle = tmp_path / "oracle.safetensors"
    qformat.save_file(want, oracle)
    r = diff_checkpoints(oracle, src)
    assert r.summary()["compared"] == 1 and r.summary()["bit_exact"] == 1


def test_unreadable_side(tmp_path: Path, capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    a, _, _ = pair
    assert main(["diff", str(a), str(tmp_path / "nope.safetensors")]) == 2
    assert "FILE_UNREADABLE" in capsys.readouterr().err


# -- the plot ------------------------------------------------------------------------------
def test_plot(tmp_path: Path, pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    pytest.importorskip("matplotlib")
    a, b, _ = pair
    png = tmp_path / "sqnr.png"
    p = run_cli("diff", str(a), str(b), "--plot", str(png), "--fail-below", "15")
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                 pair: tuple[Path, Path, dict[str, np.ndarray]]) -> None:
    a, b, _ = pair
    real = builtins.__import__

    def fake_import(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    png = tmp_path / "sqnr.png"
    assert main(["diff", str(a), str(b), "--plot", str(png)]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith("qformat: [DEPENDENCY_MISSING]") and "matplotlib" in cap.err and "pip install" in cap.err
    assert "Traceback" not in cap.err and cap.out == "" and not png.exists()
