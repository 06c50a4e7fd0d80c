"""One table of exit statuses for every command (README, "Exit statuses"; issue 44): 1 for a
problem with what a file holds, 2 for usage (a path that cannot be read), in Python and in the
JavaScript qformat-read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good.safetensors"
    qformat.save_file({"w": qformat.quantize(np.ones((4, 32), np.float32), "int", bits=4, group_size=32)}, good)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(good.read_bytes()[:-3])  # DATA_TRUNCATED: malformed
    return {"good": good, "bad": bad, "missing": tmp_path / "missing.safetensors", "out": tmp_path / "out"}


@pytest.mark.parametrize("command", [
    lambda f: ["check", str(f)],
    lambda f: ["inspect", str(f)],
    lambda f: ["diff", str(f), str(f)],
    lambda f: ["dequantize", str(f), str(f.parent / "out.safetensors")],
    lambda f: ["export", str(f), str(f.parent / "out.gguf"), "--to", "gguf"],
], ids=["check", "inspect", "diff", "dequantize", "export"])
def test_malformed_is_1_and_unreadable_is_2(files: dict[str, Path], command, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command(files["bad"])) == 1
    assert main(command(files["missing"])) == 2
    capsys.readouterr()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_javascript_command_uses_the_same_statuses(files: dict[str, Path]) -> None:
    read = [shutil.which("node") or "node", str(ROOT / "readers" / "js" / "bin" / "qformat-read.mjs")]
    run = lambda *a: subprocess.run([*read, *map(str, a)], capture_output=True, text=True, timeout=120).returncode  # noqa: E731
    assert run(files["good"], files["out"]) == 0
    assert run(files["bad"], files["out"]) == 1
    assert run(files["missing"], files["out"]) == 2
    assert run("--check", files["good"]) == 0
    assert run("--check", files["bad"]) == 1
    assert run("--check", files["missing"]) == 2
    assert run("--nope") == 2


def test_the_console_script_passes_the_status_on(files: dict[str, Path]) -> None:
    p = subprocess.run([sys.executable, "-m", "qformat", "check", str(files["bad"])], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "DATA_TRUNCATED" in p.stdout


def test_help_shows_defaults_urls_and_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "http(s):// URL" in top and "Exit statuses: 0 done, 1 problems in the input, 2 usage" in top
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "(default: 8000" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "required unless --list" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")
    with pytest.raises(SystemExit):
        main(["conformance", "run", "--help"])
    assert "--jobs" in capsys.readouterr().out


def test_convert_has_json(files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["convert", str(files["good"]), str(tmp_path / "c.safetensors"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format_version"] == 1 and d["command"] == "convert" and d["logical"] == 1 and d["files"]
