"""Split conversion (issue 27 part 3): ``--part K/N`` + ``qformat merge`` and ``--workers N``.

The reference for every split run is the single-process run of the same command on the same
source, written by the writer's ordinary path: the merged folder must hold the same files with
the same bytes (shards, index, config.json, side files).  A part killed mid-write must leave no
finished-looking output, the merge must refuse with SPLIT_PART_INVALID naming the missing part,
and rerunning that part must repair the run.  Bad input gets coded errors, never tracebacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.checkpoint import split
from qformat.container import write_file
from qformat.errors import QFormatError

from .peak_memory import MB, assert_flat, peak, write_sharded

H, I, V = 64, 128, 96
INT4 = dict(scheme="int", bits=4, group_size=32)


def _llama(folder: Path, layers: int = 4, shards: int = 3, seed: int = 0, config: dict | None = None) -> None:
    """A sharded fp16 Llama-shaped checkpoint with a side tree (tokenizer, a subfolder)."""
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in "qkvo":
            t[p + f"self_attn.{n}_proj.weight"] = rng.standard_normal((H, H)).astype(np.float16)
        t[p + "mlp.gate_proj.weight"] = rng.standard_normal((I, H)).astype(np.float16)
        t[p + "mlp.up_proj.weight"] = rng.standard_normal((I, H)).astype(np.float16)
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((H, I)).astype(np.float16)
        t[p + "input_layernorm.weight"] = np.ones(H, np.float16)
    t["model.norm.weight"] = np.ones(H, np.float16)
    t["lm_head.weight"] = rng.standard_normal((V, H)).astype(np.float16)
    folder.mkdir()
    names, wm = list(t), {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: t[n] for n in names[s::shards]}
        write_file(folder / fn, part, {"format": "pt"})
        wm.update({n: fn for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama", "hidden_size": H}))
    (folder / "tokenizer.json").write_text('{"t": 1}')
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"pooling": "mean"}')


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_same_output(single: Path, split_out: Path) -> None:
    a, b = _tree(single), _tree(split_out)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], f"{name} differs between the single-process and the split run"
    # the same tensors, decoded, and the index maps the same names to the same files
    idx = "model.safetensors.index.json"
    assert json.loads(a[idx])["weight_map"] == json.loads(b[idx])["weight_map"]
    want, got = qformat.load_checkpoint(single / idx), qformat.load_checkpoint(split_out / idx)
    assert sorted(want) == sorted(got) and all(want[n].tobytes() == got[n].tobytes() for n in want)


def _no_leftovers(parent: Path, dst: Path) -> None:
    assert not Path(split.staging_folder(dst)).exists(), "the staging folder is removed after a merge"
    assert not [n for n in os.listdir(parent) if n.startswith(".qformat-")]


def _code(fn) -> QFormatError:  # type: ignore[no-untyped-def]
    with pytest.raises(QFormatError) as e:
        fn()
    return e.value


def _cli(*args: str, pre: str = "") -> subprocess.CompletedProcess:
    """``qformat ARGS`` in a fresh interpreter (``pre``: Python run before the command)."""
    code = f"import sys\n{pre}\nfrom qformat.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("split") / "src"
    _llama(folder)
    return folder


@pytest.fixture(scope="module")
def single(src) -> Path:
    out = src.parent / "single"
    qformat.quantize_checkpoint(src, out, **INT4)
    return out


def test_assignment_is_balanced_and_deterministic():
    # worked by hand: 50 -> part 1; 40 -> part 2; 30 -> part 2 (40 < 50); 20 -> part 1 (50 < 70); 10 -> part 1 (70 = 70, lower part)
    sizes = [("e", 10), ("a", 50), ("d", 20), ("c", 30), ("b", 40)]
    assert split.assign(sizes, 2) == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 1}
    assert split.assign(list(reversed(sizes)), 2) == split.assign(sizes, 2)  # the order given does not matter
    assert split.assign([("x", 5), ("y", 5)], 3) == {"x": 1, "y": 2}  # equal sizes: by name; part 3 gets nothing


def test_workers_output_equals_single_process(src, single, tmp_path):
    out = tmp_path / "workers"
    s = qformat.quantize_checkpoint(src, out, workers=2, **INT4)
    _assert_same_output(single, out)
    _no_leftovers(tmp_path, out)
    assert s.quantized_tensors == 28 and [p["part"] for p in s.parts] == [1, 2]
    assert sorted(os.path.basename(f) for p in s.parts for f in p["files"]) == sorted(p.name for p in single.glob("*.safetensors"))
    assert all(p["cpu_seconds"] > 0 for p in s.parts)


def test_parts_then_merge_equal_single_process_with_reshard(src, tmp_path):
    # --max-shard-size: the sharding comes from the plan, so every part names the same files
    ref = tmp_path / "ref"
    qformat.quantize_checkpoint(src, ref, max_shard_size="30KB", **INT4)
    nfiles = len(list(ref.glob("*.safetensors")))
    assert nfiles >= 4
    out = tmp_path / "out"
    for k in (3, 1, 2):  # any order, as independent hosts finish
        r = qformat.quantize_checkpoint(src, out, max_shard_size="30KB", part=f"{k}/3", **INT4)
        assert r.parts[0]["part"] == k and r.parts[0]["files"]
        assert not out.exists(), "nothing at the destination before the merge"
    m = split.merge(out)
    assert m.command == "quantize" and len(m.files) == nfiles and [p["part"] for p in m.parts] == [1, 2, 3]
    _assert_same_output(ref, out)
    _no_leftovers(tmp_path, out)


def test_convert_parts_equal_single_convert(single, tmp_path):
    ref = tmp_path / "ref"
    qformat.convert.convert(single, ref, repack=True)
    out = tmp_path / "out"
    for k in (1, 2):
        split.convert(single, out, repack=True, part=f"{k}/2")
    split.merge(out)
    _assert_same_output(ref, out)
    # the CLI: --workers 2 on one machine
    cli_out = tmp_path / "cli"
    r = _cli("convert", str(single), str(cli_out), "--repack", "--workers", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "part 2/2" in r.stdout
    _assert_same_output(ref, cli_out)


# SIGKILL of the part's own process once its first shard is written and checked (the writer
# verifies each file as it is done): a hard kill, which no handler can clean up after.
_KILL_AFTER_FIRST_FILE = """
import os, signal
import qformat.convert.writer as cw
_verify = cw.verify_output
def _die(path):
    _verify(path)
    os.kill(os.getpid(), signal.SIGKILL)
cw.verify_output = _die
"""


def test_killed_part_leaves_nothing_finished_and_rerun_repairs(src, single, tmp_path):
    out = tmp_path / "out"
    staging = Path(split.staging_folder(out))
    base = ["quantize", str(src), str(out), "--scheme", "int", "--bits", "4", "--group-size", "32", "--quiet"]
    assert _cli(*base, "--part", "1/2").returncode == 0
    # part 2 of 2 gets two of the three shards (the smaller two: see test_assignment_*), so it dies halfway
    r = _cli(*base, "--part", "2/2", pre=_KILL_AFTER_FIRST_FILE)
    assert r.returncode == -9, (r.returncode, r.stderr)
    assert not out.exists()
    temps = [p for p in staging.iterdir() if p.name.startswith(".qformat-convert-")]
    assert len(temps) == 1 and len(list(temps[0].rglob("*.safetensors"))) == 1, "the killed part wrote one shard"
    assert not (staging / "part-2-of-2").exists(), "a killed part has no part folder"
    assert not list(temps[0].rglob("part.json")) and not list(temps[0].rglob("*.index.json"))
    r = _cli("merge", str(out))
    assert r.returncode == 2 and "SPLIT_PART_INVALID" in r.stderr and "part 2/2 is missing" in r.stderr, r.stderr
    assert temps[0].name in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and (staging / "part-1-of-2" / "part.json").is_file(), "a refused merge changes nothing"
    r = _cli(*base, "--part", "2/2")
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stderr and temps[0].name in r.stderr, "the killed part's temporary folder is cleaned, with a note"
    assert not temps[0].exists()
    r = _cli("merge", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert [p["part"] for p in json.loads(r.stdout)["parts"]] == [1, 2]
    _assert_same_output(single, out)
    _no_leftovers(tmp_path, out)


def test_worker_death_is_a_coded_error(src, tmp_path):
    out = tmp_path / "out"
    e = _code(lambda: split.run(_worker_that_dies, dict(src=src, dst=out, **INT4), command="quantize", workers=2))
    assert e.code == "SPLIT_PART_INVALID" and "part 2/2 did not finish" in e.message and "status 9" in e.message
    assert not out.exists()
    assert (Path(split.staging_folder(out)) / "part-1-of-2").is_dir()


def _worker_that_dies(**kwargs):  # type: ignore[no-untyped-def]
    """quantize_checkpoint, except that part 2's process ends at once without a word (killed)."""
    from qformat.checkpoint.writer import _PART

    if str(_PART.get().part) == "2/2":
        os._exit(9)
    return qformat.quantize_checkpoint(**kwargs)


@pytest.mark.parametrize("bad", ["3/2", "0/2", "1/0", "2", "a/b", "1/2/3", "-1/2"])
def test_bad_part(src, tmp_path, bad):
    e = _code(lambda: qformat.quantize_checkpoint(src, tmp_path / "o", part=bad, **INT4))
    assert e.code == "SPLIT_PART_INVALID" and "--part" in e.message
    assert os.listdir(tmp_path) == []


def test_bad_requests(src, tmp_path):
    e = _code(lambda: qformat.quantize_checkpoint(src, tmp_path / "o", part="1/2", workers=2, **INT4))
    assert e.code == "SPLIT_PART_INVALID" and "not both" in e.message
    e = _code(lambda: qformat.quantize_checkpoint(src, tmp_path / "o", workers=0, **INT4))
    assert e.code == "SPLIT_PART_INVALID" and "--workers" in e.message
    e = _code(lambda: qformat.quantize_checkpoint(src / "model-00001-of-00003.safetensors", tmp_path / "o.safetensors",
                                                  part="1/2", **INT4))
    assert e.code == "SPLIT_PART_INVALID" and "one file" in e.message
    # a worker's coded error is the run's, and a failed run leaves no staging folder behind
    e = _code(lambda: qformat.quantize_checkpoint(src, tmp_path / "o", workers=2, recipe={"rules": [{"glob": "nope", "keep": True}]}))
    assert e.code == "QUANTIZE_RECIPE_INVALID" and "rule 1" in e.message
    assert os.listdir(tmp_path) == []
    e = _code(lambda: split.merge(tmp_path / "nothing"))
    assert e.code == "SPLIT_PART_INVALID" and "no parts" in e.message
    # the CLI: coded errors and usage errors, no traceback
    r = _cli("quantize", str(src), str(tmp_path / "o"), "--scheme", "int", "--part", "3/2")
    assert r.returncode == 2 and "SPLIT_PART_INVALID" in r.stderr and "Traceback" not in r.stderr
    r = _cli("quantize", str(src), str(tmp_path / "o"), "--scheme", "int", "--part", "1/2", "--workers", "2")
    assert r.returncode == 2 and "not allowed with" in r.stderr and "Traceback" not in r.stderr
    r = _cli("merge", str(tmp_path / "o"))
    assert r.returncode == 2 and "SPLIT_PART_INVALID" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_merge_refuses_inconsistent_parts(src, tmp_path):
    out = tmp_path / "out"
    staging = Path(split.staging_folder(out))
    qformat.quantize_checkpoint(src, out, part="1/2", **INT4)
    qformat.quantize_checkpoint(src, out, part="2/2", **INT4)
    good = {p.name: p for p in staging.iterdir()}

    def refused(*words: str) -> None:
        e = _code(lambda: split.merge(out))
        assert e.code == "SPLIT_PART_INVALID", e
        for wd in words:
            assert wd in e.message, (wd, e.message)
        assert not out.exists()

    # a duplicated part (a second copy of part 1 under another name)
    shutil.copytree(good["part-1-of-2"], staging / "part-1-of-2-copy")
    refused("part 1/2 appears twice", "part-1-of-2-copy")
    shutil.rmtree(staging / "part-1-of-2-copy")
    # another N
    qformat.quantize_checkpoint(src, out, part="3/3", **INT4)
    refused("N differs", "2 parts against 3")
    shutil.rmtree(staging / "part-3-of-3")
    # other options (int8 per channel)
    saved = staging.parent / "saved-part-2"
    shutil.copytree(good["part-2-of-2"], saved)
    qformat.quantize_checkpoint(src, out, part="2/2", scheme="int", bits=8, group_size=None)
    refused("part 2/2", "plan differs", '"bits": 8')
    # another source (its config.json differs)
    other = tmp_path / "other"
    _llama(other, config={"model_type": "llama", "hidden_size": H, "note": "another"})
    qformat.quantize_checkpoint(other, out, part="2/2", **INT4)
    refused("source differs", str(other))
    # a damaged part: a shard cut short (an interrupted copy between hosts)
    shutil.rmtree(staging / "part-2-of-2")
    shutil.copytree(saved, staging / "part-2-of-2")
    shard = next((staging / "part-2-of-2" / "shards").iterdir())
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    refused("part 2/2", "bytes, its manifest records")
    shard.write_bytes(data)
    # a folder that is not a finished part (no manifest)
    (staging / "part-9-of-9").mkdir()
    refused("has no part.json")
    (staging / "part-9-of-9").rmdir()
    # a destination that exists: the command's destination code, without --overwrite
    out.mkdir()
    (out / "keep.txt").write_text("x")
    e = _code(lambda: split.merge(out))
    assert e.code == "QUANTIZE_DESTINATION_INVALID" and "--overwrite" in e.message
    assert (out / "keep.txt").read_text() == "x"
    split.merge(out, overwrite=True)
    assert not (out / "keep.txt").exists()
    assert qformat.check([str(out / "model.safetensors.index.json")]).ok


H2, I2 = 512, 2048  # tests/test_checkpoint_memory.py's shapes: the largest tensor is 2 MB fp16


def _big(folder: Path, layers: int, seed: int) -> int:
    rng = np.random.default_rng(seed)

    def shard(s: int):  # type: ignore[no-untyped-def]
        arrays = {}
        for i in range(s * layers // 4, (s + 1) * layers // 4):
            p = f"model.layers.{i}."
            for n in ("q", "k", "v", "o"):
                arrays[p + f"self_attn.{n}_proj.weight"] = rng.integers(0x2000, 0x2400, (H2, H2), dtype=np.uint16).view(np.float16)
            for n, shape in (("gate", (I2, H2)), ("up", (I2, H2)), ("down", (H2, I2))):
                arrays[p + f"mlp.{n}_proj.weight"] = rng.integers(0x2000, 0x2400, shape, dtype=np.uint16).view(np.float16)
        return arrays, {}

    return write_sharded(folder, (shard(s) for s in range(4)), {"model_type": "llama"}, {"format": "pt"})


def test_part_peak_memory_is_bounded(tmp_path):
    """A part is the single-process pipeline over its share of the shards: one tensor at a time."""
    baseline = peak([])
    peaks, sizes = [], []
    for k, layers in enumerate([12, 24]):
        src = tmp_path / f"src{k}"
        sizes.append(_big(src, layers, k))
        out = tmp_path / f"out{k}"
        peaks.append(peak(["quantize", "--quiet", "--scheme", "mxfp4", "--part", "1/2", str(src), str(out)]))
        assert (Path(split.staging_folder(out)) / "part-1-of-2" / "part.json").is_file()
        os.sync()
    assert_flat("quantize --part 1/2 (sizes: the part's half)", peaks, [s // 2 for s in sizes], baseline, 40 * MB)
