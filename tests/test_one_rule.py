"""Issue 24, item 1: what ``qformat check`` refuses, every command that reads a checkpoint
refuses too, with check's code and nothing written (unless ``--no-check``).

Runs every command over the conformance corpus's invalid and malformed cases (the hostile-file
set) and over a valid file with one scale set to infinity."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import qformat
from qformat import check
from qformat.cli import main
from qformat.errors import QFormatError

CORPUS = Path(__file__).resolve().parent.parent / "conformance" / "v1"


def _cases() -> list[Any]:
    """One invalid or malformed case per error code (the first in the manifest), and every
    index case (the index rules are applied before any shard is read)."""
    man = json.loads((CORPUS / "manifest.json").read_text())
    seen: set[str] = set()
    out = []
    for c in man["cases"]:
        if c["expect"] != "valid" and (c["error"] not in seen or c["input"].endswith(".json")):
            seen.add(c["error"])
            out.append(pytest.param(c, id=c["id"]))
    return out


def _readable_refused() -> list[Any]:
    """The corpus's valid cases that a checker still reports (readers decode them, SPEC.md
    §12.5: padding bits, an empty tensor's out-of-range group index, non-finite scales, ...)."""
    man = json.loads((CORPUS / "manifest.json").read_text())
    # DIGEST_UNSUPPORTED alone is no refusal for a command: nothing says the bytes are wrong
    # (check.Admission; docs/cli.md, "Digests")
    return [pytest.param(c, id=c["id"]) for c in man["cases"]
            if c["expect"] == "valid" and set(c.get("check") or []) - {"DIGEST_UNSUPPORTED"}
            and c["input"].endswith(".safetensors")]


def _payload_only(src: str) -> bool:
    """Whether check refuses ``src`` only for payload rules (found when a tensor is read)."""
    return check(src, payload=False).ok


def _convert(src: str, dst: str) -> Any:
    from qformat.convert import convert

    return convert(src, dst)


def _dequantize(src: str, dst: str) -> Any:
    return qformat.dequantize_checkpoint(src, dst)


def _export(src: str, dst: str) -> Any:
    from qformat.export import export

    return export(src, dst, to="compressed-tensors", allow_rounding=True)


def _diff(src: str, dst: str) -> Any:
    from qformat.diff import diff_checkpoints

    return diff_checkpoints(src, src)


def _inspect(src: str, dst: str) -> Any:
    from qformat.inspection import inspect_checkpoint

    return inspect_checkpoint(src)


def _quantize(src: str, dst: str) -> Any:
    return qformat.quantize_checkpoint(src, dst, scheme="int")


#: Every command reading a checkpoint; whether it reads payload (inspect and quantize's source
#: check read headers only: payload rules cannot apply to them).
COMMANDS: dict[str, tuple[Callable[[str, str], Any], bool]] = {
    "convert": (_convert, True), "dequantize": (_dequantize, True), "export": (_export, True),
    "diff": (_diff, True), "inspect": (_inspect, False), "quantize": (_quantize, False),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", _cases())
def test_every_command_refuses_what_check_refuses(case: dict, command: str, tmp_path: Path) -> None:
    src = str(CORPUS / case["input"])
    report = check(src)
    if report.ok:  # a case the corpus marks refused but this checker accepts is test_conformance's failure
        pytest.skip(f"qformat check accepts {case['id']}")
    fn, reads_payload = COMMANDS[command]
    with open(src, "rb") as f:
        if f.read(4) == b"GGUF":  # these commands read GGUF files as GGUF (their own codes); check reads safetensors
            pytest.skip(f"{command} reads a GGUF file as GGUF; check refuses {case['id']} as NOT_SAFETENSORS")
    if not reads_payload and _payload_only(src):
        pytest.skip(f"{command} reads no payload; check refuses {case['id']} for a payload rule only")
    out = tmp_path / "out"
    out.mkdir()
    dst = str(out / ("x" if src.endswith(".json") else "x.safetensors"))
    with pytest.raises(QFormatError) as e:
        fn(src, dst)
    assert e.value.code == report.problems[0].code, (e.value, report.problems[0])
    assert os.listdir(out) == []  # nothing written, no temporary left


@pytest.mark.parametrize("command", sorted(c for c, (_, payload) in COMMANDS.items() if payload))
@pytest.mark.parametrize("case", _readable_refused())
def test_every_command_refuses_what_readers_decode_and_check_reports(case: dict, command: str, tmp_path: Path) -> None:
    """Found by tests/fuzz.py: dequantize and diff decoded an empty tensor whose group index is
    out of range (no element reads a stored byte, so the per-read guard never ran)."""
    src = str(CORPUS / case["input"])
    report = check(src, digests=True)
    assert not report.ok
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(QFormatError) as e:
        COMMANDS[command][0](src, str(out / "x.safetensors"))
    first = report.problems[0]
    # check's code, unless the command refuses another tensor for its own reason first (an
    # export that cannot map it; SPEC.md §1.4: tensors failing at different steps)
    own = e.value.code.startswith("EXPORT_") and e.value.tensor != first.tensor
    assert e.value.code == first.code or own, (e.value, first)
    assert os.listdir(out) == []


def _inf_scale(tmp_path: Path) -> tuple[Path, Path]:
    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    good = tmp_path / "good.safetensors"
    qformat.save_file({"w": qformat.quantize(w, "int", bits=4, group_size=32), "b": np.ones(3, np.float32)}, good)
    data = bytearray(good.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    e = json.loads(data[8 : 8 + n])["w.scale"]
    assert e["dtype"] == "F16"
    off = 8 + n + e["data_offsets"][0]
    data[off : off + 2] = np.array([np.inf], np.float16).tobytes()
    bad = tmp_path / "inf.safetensors"
    bad.write_bytes(bytes(data))
    return good, bad


def test_the_set_is_hostile() -> None:
    assert sum(not check(str(CORPUS / c.values[0]["input"])).ok for c in _cases()) >= 40


@pytest.mark.parametrize("argv", [["convert"], ["dequantize"], ["export", "--to", "gguf"], ["export", "--to", "mlx"], ["diff"]])
def test_a_nonfinite_scale_is_refused_by_the_cli(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = _inf_scale(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / ("x.gguf" if "gguf" in argv else "x.safetensors")
    args = [argv[0], str(good), str(bad)] if argv[0] == "diff" else [argv[0], str(bad), str(dst), *argv[1:]]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc in (1, 2) and "PARAM_NONFINITE" in err and "Traceback" not in err, err
    assert os.listdir(out) == []


def test_no_check_reads_it_anyway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, bad = _inf_scale(tmp_path)
    dst = tmp_path / "plain.safetensors"
    assert main(["dequantize", str(bad), str(dst), "--no-check"]) == 0
    assert not np.isfinite(qformat.load_file(dst)["w"]).all()
    with pytest.raises(QFormatError) as e:  # the API's default: refused
        qformat.dequantize_checkpoint(bad, tmp_path / "again.safetensors")
    assert e.value.code == "PARAM_NONFINITE"
