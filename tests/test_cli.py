"""The ``qformat check`` command, run as a user runs it: in a subprocess.

Exit status: 0 conforming, 1 problems found, 2 usage error or unreadable path.  Whatever the
input, no Python traceback reaches the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .filebuild import build_file, int4_tensor, qformat_object, raw_file, valid_file

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)
    assert "Traceback" not in proc.stdout and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return proc


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def bad_file(folder: Path) -> Path:
    """A qformat file whose scale component has the wrong shape (COMPONENT_SHAPE on 'w')."""
    d, c = int4_tensor("w")
    c["w.scale"] = np.ones((4, 3), np.float16)
    return write(folder / "bad.safetensors", build_file(c, qformat=qformat_object({"w": d})))


def padding_file(folder: Path) -> Path:
    """Header-valid, payload-invalid (a padding bit set): PADDING_NONZERO only with payload checks."""
    d, c = int4_tensor("w", shape=(4, 7))
    c["w.codes"][0, 3] |= 0x80
    return write(folder / "padding.safetensors", build_file(c, qformat=qformat_object({"w": d})))


def test_good_file(tmp_path: Path) -> None:
    p = write(tmp_path / "good.safetensors", valid_file())
    r = run_cli("check", str(p))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and str(p) in r.stdout
    assert "1 quantized" in r.stdout and "1 plain" in r.stdout


def test_plain_safetensors_file(tmp_path: Path) -> None:
    p = write(tmp_path / "plain.safetensors", build_file({"a": np.ones(3, np.float32), "b": np.zeros((2, 2), np.int8)}))
    r = run_cli("check", str(p))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and "no quantized tensors" in r.stdout


def test_bad_file(tmp_path: Path) -> None:
    p = bad_file(tmp_path)
    r = run_cli("check", str(p))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "COMPONENT_SHAPE" in r.stdout and " w " in r.stdout
    assert "OK" not in r.stdout


@pytest.mark.parametrize("data, code", [
    (b"", "HEADER_TOO_SMALL"),
    (b"\xff" * 16, "HEADER_TOO_LARGE"),
    (raw_file("\x0b{}"), "HEADER_INVALID_JSON"),
    (raw_file('{"x":' + "[" * 50_000 + "]" * 50_000 + "}"), "HEADER_INVALID_JSON"),
    (raw_file(b'{"\xff":1}'), "HEADER_NOT_UTF8"),
    (build_file({"b": np.ones(2, np.float32)}, qformat="{" * 100_000), "QFORMAT_JSON_INVALID"),
    (build_file({"b": np.ones(2, np.float32)}, qformat='{"version":"2.0","tensors":{}}'), "VERSION_UNSUPPORTED"),
])
def test_malformed_files_never_show_a_traceback(data: bytes, code: str, tmp_path: Path) -> None:
    p = write(tmp_path / "x.safetensors", data)
    r = run_cli("check", str(p))
    assert r.returncode == 1, r.stdout + r.stderr
    assert code in r.stdout


def test_strict_reports_what_writers_never_write(tmp_path: Path) -> None:
    """SPEC.md §2.4: read as safetensors reads it (exit 0); --strict reports it (exit 1)."""
    p = write(tmp_path / "x.safetensors", raw_file(' \t{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}\n', b"\x01", pad=False))
    assert run_cli("check", str(p)).returncode == 0
    r = run_cli("check", "--strict", str(p))
    assert r.returncode == 1, r.stdout + r.stderr
    assert all(c in r.stdout for c in ("HEADER_LEADING_WHITESPACE", "HEADER_PADDING_NOT_SPACE", "TENSOR_NAME_INVALID"))


def test_header_only_skips_payload_checks(tmp_path: Path) -> None:
    p = padding_file(tmp_path)
    full = run_cli("check", str(p))
    assert full.returncode == 1 and "PADDING_NONZERO" in full.stdout
    header = run_cli("check", "--header-only", str(p))
    assert header.returncode == 0, header.stdout + header.stderr


def test_missing_path(tmp_path: Path) -> None:
    r = run_cli("check", str(tmp_path / "missing.safetensors"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "FILE_UNREADABLE" in r.stdout + r.stderr


def test_missing_path_wins_over_problems(tmp_path: Path) -> None:
    r = run_cli("check", str(bad_file(tmp_path)), str(tmp_path / "missing.safetensors"))
    assert r.returncode == 2
    assert "COMPONENT_SHAPE" in r.stdout and "FILE_UNREADABLE" in r.stdout


@pytest.mark.parametrize("args", [[], ["check"], ["check", "--no-such-option", "x"], ["--no-such-option"], ["frobnicate", "x"]],
                         ids=["no-args", "check-no-paths", "unknown-option", "unknown-top-option", "unknown-command"])
def test_usage_errors_exit_2(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "usage" in (r.stdout + r.stderr).lower()


def test_help_exits_0() -> None:
    r = run_cli("check", "--help")
    assert r.returncode == 0
    assert "--json" in r.stdout and "--header-only" in r.stdout


@pytest.mark.parametrize("argv", [
    ["check", "x"], ["convert", "x", "y"], ["quantize", "x", "y"], ["merge", "y"], ["dequantize", "x", "y"],
    ["export", "x", "y"], ["inspect", "x"], ["diff", "x", "y"], ["conformance", "run", "--reader", "r"], ["conformance", "read", "x", "y"],
], ids=lambda a: "-".join(a[:2]) if a[0] == "conformance" else a[0])
def test_every_command_taking_paths_has_the_remote_options(argv: list[str]) -> None:
    """``--show-secrets`` and ``--deadline SECONDS`` (qformat.redact, qformat.remote) on every
    command that takes a path, with the same meaning."""
    from qformat.cli import _parser

    args = _parser().parse_args([*argv, "--show-secrets", "--deadline", "2.5"])
    assert args.show_secrets is True and args.deadline == 2.5
    args = _parser().parse_args(argv)
    assert args.show_secrets is False and args.deadline is None


def _problem_keys(p: dict[str, Any]) -> None:
    assert {"code", "tensor", "message"} <= set(p)
    assert isinstance(p["code"], str) and isinstance(p["message"], str) and p["message"]


def test_json_output(tmp_path: Path) -> None:
    good = write(tmp_path / "good.safetensors", valid_file())
    bad = bad_file(tmp_path)
    r = run_cli("check", "--json", str(good), str(bad))
    assert r.returncode == 1
    rep = json.loads(r.stdout)
    assert rep["ok"] is False
    assert {"ok", "files", "problems"} <= set(rep)
    files = {Path(f["path"]).name: f for f in rep["files"]}
    assert files["good.safetensors"]["ok"] is True and files["good.safetensors"]["problems"] == []
    assert files["bad.safetensors"]["ok"] is False
    for p in rep["problems"] + files["bad.safetensors"]["problems"]:
        _problem_keys(p)
    assert [(p["code"], p["tensor"]) for p in rep["problems"]] == [("COMPONENT_SHAPE", "w")]


def test_json_output_ok_and_unreadable(tmp_path: Path) -> None:
    good = write(tmp_path / "good.safetensors", valid_file())
    r = run_cli("check", "--json", str(good))
    assert r.returncode == 0
    rep = json.loads(r.stdout)
    assert rep["ok"] is True and rep["problems"] == [] and len(rep["files"]) == 1
    r = run_cli("check", "--json", str(tmp_path / "missing.safetensors"))
    assert r.returncode == 2
    rep = json.loads(r.stdout)
    assert rep["ok"] is False and [p["code"] for p in rep["problems"]] == ["FILE_UNREADABLE"]
    _problem_keys(rep["problems"][0])


def _sharded(folder: Path) -> Path:
    d1, c1 = int4_tensor("w")
    d2, c2 = int4_tensor("v", seed=1)
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write(folder / s1, build_file({**c1, "b": np.ones(2, np.float32)}, qformat=qformat_object({"w": d1})))
    write(folder / s2, build_file(c2, qformat=qformat_object({"v": d2})))
    wm = {**{n: s1 for n in [*c1, "b"]}, **{n: s2 for n in c2}}
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return index


def test_folder(tmp_path: Path) -> None:
    write(tmp_path / "m" / "a.safetensors", valid_file())
    write(tmp_path / "m" / "b.safetensors", valid_file(seed=3))
    (tmp_path / "m" / "README.md").write_text("not a tensor file")
    r = run_cli("check", str(tmp_path / "m"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("OK") == 2
    bad_file(tmp_path / "m")
    r = run_cli("check", str(tmp_path / "m"))
    assert r.returncode == 1 and "COMPONENT_SHAPE" in r.stdout


def test_sharded_checkpoint(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "ckpt")
    for target in (index, index.parent):
        r = run_cli("check", str(target))
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count("OK") == 2
    r = run_cli("check", "--json", str(index))
    assert r.returncode == 0 and len(json.loads(r.stdout)["files"]) == 2


def test_sharded_checkpoint_with_problems(tmp_path: Path) -> None:
    index = _sharded(tmp_path / "ckpt")
    wm = json.loads(index.read_text())
    wm["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    wm["weight_map"]["x"] = "../escape.safetensors"
    index.write_text(json.dumps(wm))
    r = run_cli("check", str(index))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "INDEX_MISMATCH" in r.stdout and "ghost" in r.stdout and "INDEX_INVALID" in r.stdout
    index.write_text("{not json")
    r = run_cli("check", "--json", str(index))
    assert r.returncode == 1
    assert [p["code"] for p in json.loads(r.stdout)["problems"]] == ["INDEX_INVALID"]


def test_console_script_entry_point_matches_module(tmp_path: Path) -> None:
    """``python -m qformat`` and the ``qformat`` console script share one entry function."""
    from qformat import cli

    p = write(tmp_path / "good.safetensors", valid_file())
    assert cli.main(["check", str(p)]) == 0
    assert cli.main(["check", str(tmp_path / "missing")]) == 2
