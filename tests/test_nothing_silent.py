"""Issue 24 (nothing silent), items 4 and 6: what used to pass without a word now says so."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.cli import main
from qformat.errors import QFormatError


def _model(tmp: Path, cols: int = 384) -> Path:
    src = tmp / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    qformat.save_file({f"model.layers.{i}.mlp.down_proj.weight": rng.standard_normal((64, cols)).astype(np.float16)
                       for i in range(2)}, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"model_type": "test", "architectures": ["TestModel"]}))
    return src


# -- item 4: partial groups ----------------------------------------------------------------
def test_partial_groups_warn_and_name_the_refusing_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qformat.export import export

    src = _model(tmp_path)
    assert main(["quantize", str(src), str(tmp_path / "out"), "--scheme", "int", "--group-size", "100", "--json"]) == 0
    cap = capsys.readouterr()
    (w,) = json.loads(cap.out)["warnings"]
    assert w["code"] == "QUANTIZE_PARTIAL_GROUPS" and len(w["tensors"]) == 2
    assert "384 values along axis 1 in groups of 100: the last group holds 84" in w["message"]
    assert w["targets"] == ["compressed-tensors"]
    assert "warning: [QUANTIZE_PARTIAL_GROUPS]" in cap.err and "--to compressed-tensors" in cap.err
    assert qformat.check(tmp_path / "out").ok  # valid qformat all the same
    with pytest.raises(QFormatError) as e:  # and the target named does refuse it
        export(tmp_path / "out", tmp_path / "ct", to="compressed-tensors")
    assert e.value.code == "EXPORT_UNMAPPABLE"


@pytest.mark.parametrize("argv", [["--scheme", "int", "--group-size", "100"], ["--scheme", "mxfp4", "--block-size", "100"],
                                  ["--scheme", "fp8_e4m3", "--granularity", "block", "--block-size", "100x100"],
                                  ["--scheme", "nf4", "--block-size", "100"]])
def test_strict_refuses_partial_groups_and_writes_nothing(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _model(tmp_path)
    assert main(["quantize", str(src), str(tmp_path / "out"), *argv, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "[QUANTIZE_PARTIAL_GROUPS]" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_whole_groups_say_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _model(tmp_path)
    s = qformat.quantize_checkpoint(src, tmp_path / "out", scheme="int", group_size=128, strict=True)
    assert s.warnings == [] and "warning" not in capsys.readouterr().err


# -- item 6: check says what a file is ---------------------------------------------------------
@pytest.mark.parametrize("data, what", [(b"GGUF\x03\x00\x00\x00" + bytes(64), "GGUF file"), (b"# A README\n\ntext\n", "text file"),
                                        (b"PK\x03\x04\x14\x00\x00\x00" + bytes(40), "ZIP archive")])
def test_check_says_a_file_is_not_safetensors(data: bytes, what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "model.safetensors"
    p.write_bytes(data)
    assert main(["check", str(p)]) == 1  # a file problem since SPEC.md 1.2.1 (a malformed code), like HEADER_TOO_LARGE
    out = capsys.readouterr().out
    assert "NOT_SAFETENSORS" in out and what in out and "HEADER_TOO_LARGE" not in out
    if what != "GGUF file":  # the commands that read checkpoints say the same (a GGUF file they read)
        with pytest.raises(QFormatError) as e:
            qformat.dequantize_checkpoint(p, tmp_path / "out.safetensors")
        assert e.value.code == "NOT_SAFETENSORS"


# -- item 6: one destination rule ------------------------------------------------------------
def _single(tmp: Path) -> Path:
    p = tmp / "single.safetensors"
    qformat.save_file({"model.layers.0.mlp.down_proj.weight": np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)}, p)
    return p


@pytest.mark.parametrize("command", ["quantize", "dequantize", "convert", "export"])
def test_one_destination_rule(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _single(tmp_path)
    folder = _model(tmp_path)
    if command != "quantize":  # the others read a qformat checkpoint
        q = qformat.quantize_checkpoint(src, tmp_path / "q.safetensors", scheme="int", bits=4, group_size=32, scale_dtype="float16")
        src = Path(q.files[0])
        qformat.quantize_checkpoint(folder, tmp_path / "qf", scheme="int", bits=4, group_size=32, scale_dtype="float16")
        folder = tmp_path / "qf"
    extra = {"quantize": ["--scheme", "int", "--group-size", "32"], "export": ["--to", "compressed-tensors"]}.get(command, [])

    def run(s: Path, dst: str) -> int:
        return main([command, str(s), dst, "--quiet", *extra])

    (tmp_path / "into").mkdir()
    assert run(src, str(tmp_path / "into")) == 0  # an existing folder: the file goes in it
    assert os.listdir(tmp_path / "into") == [src.name]
    (tmp_path / "into2").mkdir()
    assert run(src, str(tmp_path / "into2") + "/") == 0  # a trailing slash
    assert os.listdir(tmp_path / "into2") == [src.name]
    assert run(src, str(tmp_path / "one.safetensors")) == 0 and (tmp_path / "one.safetensors").is_file()
    capsys.readouterr()
    assert run(src, str(tmp_path / "neither")) == 2  # ambiguous: refused, nothing written
    # each command names itself in the code (issue 24: quantize no longer says CONVERT_...)
    assert f"{command.upper()}_DESTINATION_INVALID" in capsys.readouterr().err and not (tmp_path / "neither").exists()
    assert run(folder, str(tmp_path / "wrong.safetensors")) == 2  # a folder's output is no file
    assert "names a file" in capsys.readouterr().err and not (tmp_path / "wrong.safetensors").exists()
    assert run(folder, str(tmp_path / "out")) == 0 and (tmp_path / "out" / "model.safetensors").is_file()


def test_export_gguf_into_a_folder(tmp_path: Path) -> None:
    src = _single(tmp_path)
    q = tmp_path / "q.safetensors"
    qformat.quantize_checkpoint(src, q, scheme="int", bits=4, group_size=32, scale_dtype="float16")
    (tmp_path / "g").mkdir()
    assert main(["export", str(q), str(tmp_path / "g") + "/", "--to", "gguf", "--quiet"]) == 0
    assert os.listdir(tmp_path / "g") == ["q.gguf"]


# -- item 6: the JavaScript reader guide's snippets run as written (docs/javascript.md) ---------
def _js_blocks() -> list[str]:
    import re

    guide = (Path(__file__).resolve().parent.parent / "docs" / "javascript.md").read_text()
    return re.findall(r"```js\n(.*?)```", guide, re.S)


def _readme_model(folder: Path) -> None:
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    qformat.save_file({"model.layers.0.mlp.down_proj.weight": qformat.quantize(w, "int", bits=4, group_size=32)},
                      folder / "model.safetensors")


@pytest.mark.skipif(__import__("shutil").which("node") is None, reason="node (Node.js 18 or later) is not installed")
def test_readme_javascript_runs_in_node(tmp_path: Path) -> None:
    import subprocess

    js = Path(__file__).resolve().parent.parent / "readers" / "js"
    node_block = _js_blocks()[0]
    _readme_model(tmp_path)
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "qformat-reader").symlink_to(js)  # what `npm install readers/js` makes
    (tmp_path / "read.mjs").write_text(node_block)
    p = subprocess.run(["node", "read.mjs"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_readme_javascript_runs_in_a_browser(tmp_path: Path) -> None:
    """The browser snippet as written, in a module script of a page that headless Chromium loads
    over HTTP on loopback, with the reader copied beside the page as docs/javascript.md says."""
    from tests import browser

    if (why := browser.available()) is not None:
        pytest.skip(why)
    js = Path(__file__).resolve().parent.parent / "readers" / "js"
    _readme_model(tmp_path)
    shutil.copytree(js / "src", tmp_path / "qformat-reader" / "src")
    (tmp_path / "snippet.mjs").write_text(_js_blocks()[1])
    (tmp_path / "index.html").write_text('<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,"><script type="module" src="snippet.mjs"></script>\n')
    with browser.serve(tmp_path) as base:
        out = browser.run_page(base + "index.html", expect=1)
    assert out["errors"] == [] and out["console"] == ["[]"], out
    # a negative control: the same page on a damaged file reports check's codes, not []
    data = bytearray((tmp_path / "model.safetensors").read_bytes())
    data[8:10] = b"[ "
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    with browser.serve(tmp_path) as base:
        out = browser.run_page(base + "index.html", expect=1)
    assert out["errors"] and "HEADER" in out["errors"][0], out


# -- item 6: a closed pipe ends the CLI quietly ------------------------------------------------
class _ClosedPipe:
    """A stdout whose reader went away (``| head -0``)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("no file descriptor")


@pytest.mark.parametrize("command, status", [("export", 0), ("inspect", 141)])
def test_a_closed_pipe_ends_quietly_with_the_file_written(command: str, status: int, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    src = _single(tmp_path)
    q = tmp_path / "q.safetensors"
    qformat.quantize_checkpoint(src, q, scheme="int", bits=4, group_size=32, scale_dtype="float16")
    argv = ["export", str(q), str(tmp_path / "o.gguf"), "--to", "gguf", "--quiet"] if command == "export" else ["inspect", str(q)]
    monkeypatch.setattr("sys.stdout", _ClosedPipe())
    assert main(argv) == status
    monkeypatch.undo()
    assert capsys.readouterr().err == ""  # no "internal error", no traceback
    if command == "export":
        assert (tmp_path / "o.gguf").is_file()


# -- item 6: importing the transformers integration is quiet -----------------------------------
def test_importing_the_transformers_integration_prints_nothing() -> None:
    """Without the environment's ``qformat_quiet.pth`` (``-S``: no .pth file runs; site-packages
    on the path by hand), ``import qformat_transformers`` installs the filters itself."""
    import site
    import subprocess
    import sys

    pytest.importorskip("transformers")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "readers"), *site.getsitepackages()]))
    code = "import sys; assert 'qformat_quiet' not in sys.modules; import qformat_transformers"
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stderr


def test_the_project_environment_imports_transformers_quietly() -> None:
    """In the environment scripts/env.sh makes (the README's commands), a plain transformers model
    and the quantizer backends import with nothing on the console; any other torchao record
    still prints."""
    import site
    import subprocess
    import sys

    pytest.importorskip("transformers")
    pytest.importorskip("torchao")
    if not any(os.path.isfile(os.path.join(d, "qformat_quiet.pth")) for d in site.getsitepackages()):
        pytest.skip("not the project's environment (scripts/env.sh writes qformat_quiet.pth)")
    code = ("from transformers import AutoConfig, AutoModelForCausalLM\n"
            "c = AutoConfig.for_model('llama', hidden_size=32, intermediate_size=64, num_hidden_layers=1,"
            " num_attention_heads=2, num_key_value_heads=2, vocab_size=64)\n"
            "AutoModelForCausalLM.from_config(c)\n"
            "import torchao, bitsandbytes, sentence_transformers\n"
            "import logging; logging.getLogger('torchao').warning('another torchao record')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=os.path.expanduser("~"))
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "another torchao record\n", p.stderr


def test_only_the_known_noise_is_dropped() -> None:
    import logging

    pytest.importorskip("transformers")
    import qformat_quiet as _quiet

    f = _quiet.KnownNoise(_quiet.KNOWN_NOISE["torchao"])
    rec = lambda msg: logging.LogRecord("torchao", logging.WARNING, __file__, 1, msg, None, None)  # noqa: E731
    assert not f.filter(rec("Failed to load /x/_C_mxfp8.so: Could not load this library"))
    assert f.filter(rec("something else torchao says"))
