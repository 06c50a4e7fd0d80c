"""Every export target, through the generic contract (parametrized over the registry).

For each target and each ``qformat.quantize`` setting it declares exact
(``Target.exact_schemes``): a checkpoint quantized with it exports with every tensor reported
bit-exact, plain tensors keep their bytes, and the output's peak memory does not grow with the
checkpoint.  A tensor the target cannot hold is refused with EXPORT_UNMAPPABLE naming the tensor
and the target, and nothing is left at the destination; with ``allow_rounding`` it is re-encoded
and reported.  The per-target modules (test_gguf.py, ...) check the outputs against each
target's own library.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.cli import main
from qformat.errors import QFormatError
from qformat.export import export, get, targets

from ..peak_memory import MB, assert_flat, peak

CASES = [pytest.param(t, s, p, id=f"{t}-{s}-" + "-".join(f"{k}{v}" for k, v in sorted(p.items())))
         for t in targets() for s, p in get(t).exact_schemes]


#: A user codebook stored in the file (5 values, 3-bit codes): no target here holds one.
UNMAPPABLE = ("codebook", {"values": [-1.0, -0.25, 0.0, 0.5, 1.0], "block_size": 64})


def _out(target: str, tmp: Path, name: str = "out") -> Path:
    return tmp / (f"{name}.gguf" if target == "gguf" else name)


def _folder(tmp: Path, scheme: str, params: dict, layers: int = 2, rows: int = 64, cols: int = 256, seed: int = 0) -> Path:
    """A small model folder: ``layers`` quantized Linear weights, a plain norm and a config.json."""
    rng = np.random.default_rng(seed)
    src = tmp / "src"
    src.mkdir()
    tensors: dict = {"model.norm.weight": np.ones(cols, np.float16)}
    for i in range(layers):
        x = rng.standard_normal((rows, cols))
        # a tenth of the values tiny, half of them negative: they round to zero, which every
        # encoder must write as +0 for targets without -0 (ggml's MXFP4, MLX; issue 24)
        x = np.where(rng.random((rows, cols)) < 0.1, x * 1e-4, x).astype(np.float16)
        tensors[f"model.layers.{i}.mlp.down_proj.weight"] = qformat.quantize(x, scheme, **params)
    qformat.save_file(tensors, src / "model.safetensors")
    # no model_type: a container of tensors (gguf refuses a model_type it has no llama.cpp mapping for)
    (src / "config.json").write_text(json.dumps({"architectures": ["TestModel"], "torch_dtype": "float16"}))
    return src


def test_every_target_declares_exact_schemes() -> None:
    for t in targets():
        target = get(t)
        assert target.name == t and target.title
        assert target.exact_schemes, f"{t} declares no exact scheme"


@pytest.mark.parametrize("target,scheme,params", CASES)
def test_declared_exact_schemes_export_exactly(target: str, scheme: str, params: dict, tmp_path: Path) -> None:
    src = _folder(tmp_path, scheme, params)
    r = export(src, _out(target, tmp_path), to=target)
    assert r.results and all(t.exact for t in r.results), [t.to_dict() for t in r.results if not t.exact]
    assert {t.name for t in r.results} >= {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    assert all(os.path.exists(f) for f in r.files)


@pytest.mark.parametrize("target", targets())
def test_unmappable_is_refused_and_nothing_is_left(target: str, tmp_path: Path) -> None:
    src = _folder(tmp_path, *UNMAPPABLE)
    out = _out(target, tmp_path)
    with pytest.raises(QFormatError) as e:
        export(src, out, to=target)
    assert e.value.code == "EXPORT_UNMAPPABLE"
    assert e.value.tensor == "model.layers.0.mlp.down_proj.weight" and target in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize("target", targets())
def test_allow_rounding_reencodes_and_reports(target: str, tmp_path: Path) -> None:
    src = _folder(tmp_path, *UNMAPPABLE)
    r = export(src, _out(target, tmp_path), to=target, allow_rounding=True)
    rounded = {t.name: t for t in r.rounded}
    assert set(rounded) == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    for t in rounded.values():
        assert t.reencoded and t.max_abs > 0 and 0 < t.sqnr_db < 100


def test_cli_list_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert all(t in listed for t in targets())
    assert main(["export", str(tmp_path), str(tmp_path / "o")]) == 2  # no --to
    src = _folder(tmp_path, *UNMAPPABLE)
    capsys.readouterr()
    assert main(["export", str(src), str(tmp_path / "o"), "--to", "no-such"]) == 2
    assert "EXPORT_TARGET_UNKNOWN" in capsys.readouterr().err
    assert main(["export", str(src), str(tmp_path / "o"), "--to", targets()[-1]]) == 2
    err = capsys.readouterr().err
    assert "EXPORT_UNMAPPABLE" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", targets())
def test_cli_json_report(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scheme, params = get(target).exact_schemes[0]
    src = _folder(tmp_path, scheme, params)
    assert main(["export", str(src), str(_out(target, tmp_path)), "--to", target, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["target"] == target and rep["exact"] is True and rep["rounded"] == []


@pytest.mark.parametrize("target", targets())
def test_peak_memory_does_not_grow_with_the_checkpoint(target: str, tmp_path: Path) -> None:
    scheme, params = get(target).exact_schemes[0]
    rows, cols = 512, 4096  # 2M values per tensor: 8 MB in float32 while verified
    sizes, peaks = [], []
    for n, layers in (("a", 6), ("b", 12)):
        d = tmp_path / n
        d.mkdir()
        src = _folder(d, scheme, params, layers=layers, rows=rows, cols=cols)
        sizes.append(sum(f.stat().st_size for f in src.iterdir()))
        peaks.append(peak(["export", "--quiet", str(src), str(_out(target, d)), "--to", target]))
    base = peak([])
    # The decoded source and target values of the largest tensor (2 x 8 MB), its codes and
    # arrays, and the target module's imports: far below 12 tensors' decoded values (96 MB,
    # about 16 times the 4-bit checkpoint).
    assert_flat(f"export --to {target}", peaks, sizes, base, allowance=64 * MB, scale=16)
