"""Per-stored-tensor digests (SPEC.md §3.8, spec 1.2): written by every writer while the bytes
stream out, verified by ``qformat check --digests``, by ``verify=True`` readers and by every
command that reads a qformat checkpoint; a 1.1 reader still reads a 1.2 file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import container
from qformat.container import read_header
from qformat.errors import QFormatError

from .filebuild import int4_expected, int4_tensor

ROOT = Path(__file__).resolve().parent.parent


def _save(path: Path, **extra: np.ndarray) -> dict[str, np.ndarray]:
    d, c = int4_tensor("w")
    d2, c2 = int4_tensor("v", seed=1)
    tensors = {"w": qformat.QTensor(d, c), "v": qformat.QTensor(d2, c2), "b": np.arange(3, dtype=np.float32), **extra}
    qformat.save_file(tensors, path)
    return {"w": int4_expected(d, c)}


def _qobj(path: Path) -> dict:
    return json.loads(read_header(path).metadata["qformat"])


def _stored(path: Path) -> dict[str, bytes]:
    h = read_header(path)
    data = path.read_bytes()
    return {n: data[h.data_start + e.begin : h.data_start + e.end] for n, e in h.entries.items()}


def _flip(path: Path, stored: str, at: int = 0) -> None:
    h = read_header(path)
    data = bytearray(path.read_bytes())
    data[h.data_start + h.entries[stored].begin + at] ^= 0x01
    path.write_bytes(bytes(data))


def test_save_file_records_the_sha256_of_every_stored_tensor(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    _save(p, e=np.zeros((0, 4), np.float32))
    q = _qobj(p)
    assert q["version"] == "1.2"  # SPEC.md §3.3: digests are a 1.2 feature
    stored = _stored(p)
    assert q["digests"]["algorithm"] == "sha256" and set(q["digests"]["tensors"]) == set(stored)
    for n, b in stored.items():
        assert q["digests"]["tensors"][n] == hashlib.sha256(b).hexdigest(), n
    assert q["digests"]["tensors"]["e"] == hashlib.sha256(b"").hexdigest()
    assert qformat.check(p, digests=True).ok
    # deterministic: the placeholders never reach the file
    p2 = tmp_path / "b.safetensors"
    _save(p2, e=np.zeros((0, 4), np.float32))
    assert p.read_bytes() == p2.read_bytes()


def test_a_file_without_quantized_tensors_stays_plain_safetensors(tmp_path: Path) -> None:
    p = tmp_path / "plain.safetensors"
    qformat.save_file({"b": np.arange(3, dtype=np.float32)}, p)
    assert read_header(p).metadata is None


def test_a_1_1_reader_reads_a_1_2_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.safetensors"
    want = _save(p)
    from qformat import descriptor, model, validate

    for mod in (descriptor, model, validate):
        monkeypatch.setattr(mod, "READER_VERSION", (1, 1))
    got = qformat.load_file(p)  # newer minor: the unknown top-level member 'digests' is ignored (§3.4)
    np.testing.assert_array_equal(got["w"], want["w"])
    with qformat.safe_open(p) as f:
        assert f.model.digests is not None  # a 1.1 reader ignores them; this one keeps them, unverified


def test_a_flipped_byte_is_found_by_check_digests_and_verify(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    _save(p)
    _flip(p, "w.codes", 3)
    assert qformat.check(p).ok  # the default check does not read every byte
    rep = qformat.check(p, digests=True)
    assert [(x.code, x.tensor, x.field) for x in rep.problems] == [("DIGEST_MISMATCH", "w", "digests.tensors['w.codes']")]
    assert "w.codes" in rep.problems[0].message and "sha256" in rep.problems[0].message
    qformat.load_file(p)  # readers that do not verify decode the bytes as they are
    with pytest.raises(QFormatError) as ei:
        qformat.load_file(p, verify=True)
    assert ei.value.code == "DIGEST_MISMATCH" and ei.value.tensor == "w"
    with qformat.safe_open(p, verify=True) as f:  # only the tensor whose bytes differ is refused
        f.get_tensor("v")
        f.get_tensor("b")
        with pytest.raises(QFormatError):
            f.get_tensor("w")


def test_check_cli_digests_flag(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    _save(p)
    _flip(p, "b")
    run = lambda *a: subprocess.run([sys.executable, "-m", "qformat", "check", *a, str(p)], capture_output=True, text=True)  # noqa: E731
    assert run().returncode == 0
    r = run("--digests")
    assert r.returncode == 1 and "DIGEST_MISMATCH" in r.stdout and "'b'" in r.stdout


def _digests_file(path: Path, digests: dict) -> None:
    """A 1.2 file of int4 tensor ``w`` and plain ``b`` whose qformat object records ``digests``."""
    from .filebuild import build_file

    d, c = int4_tensor("w")
    q = {"version": "1.2", "tensors": {"w": d}, "digests": digests}
    path.write_bytes(build_file({**c, "b": np.arange(3, dtype=np.float32)}, qformat=json.dumps(q)))


def _sha(path: Path) -> dict[str, str]:
    return {n: hashlib.sha256(b).hexdigest() for n, b in _stored(path).items()}


def test_unknown_algorithm_is_unsupported_only_where_digests_are_verified(tmp_path: Path) -> None:
    p = tmp_path / "a.safetensors"
    _digests_file(p, {"algorithm": "blake3", "tensors": {"w.codes": "ab"}})
    qformat.load_file(p)
    assert [x.code for x in qformat.check(p, digests=True).problems] == ["DIGEST_UNSUPPORTED"]
    assert qformat.check(p).ok  # a checker that does not verify digests reports nothing
    with pytest.raises(QFormatError) as ei:
        qformat.safe_open(p, verify=True)
    assert ei.value.code == "DIGEST_UNSUPPORTED"


def test_commands_refuse_an_unknown_algorithm_as_check_digests_does(tmp_path: Path) -> None:
    """Issue 40: dequantize, convert and export verify the digests of what they read (SPEC.md §3.8
    as a verifying reader, §12.5 as a checker): an algorithm they cannot verify refuses the file,
    DIGEST_UNSUPPORTED on field digests.algorithm, nothing written; they skipped it silently.
    ``--no-check`` (unchecked()) still reads it, and inspect, which reads no tensor, lists it."""
    from qformat.checkpoint.source import unchecked
    from qformat.convert import convert
    from qformat.export import export
    from qformat.inspection import inspect_checkpoint

    p = tmp_path / "a.safetensors"
    _digests_file(p, {"algorithm": "blake3", "tensors": {"w.codes": "ab", "b": "cd"}})
    [want] = [(x.code, x.tensor, x.field) for x in qformat.check(p, digests=True).problems]
    runs = {"dequantize": lambda dst: qformat.dequantize_checkpoint(p, dst),
            "convert": lambda dst: convert(p, dst),
            "export": lambda dst: export(p, dst, "gguf")}
    for what, run in runs.items():
        dst = tmp_path / f"{what}.{'gguf' if what == 'export' else 'safetensors'}"
        with pytest.raises(QFormatError) as ei:
            run(dst)
        assert (ei.value.code, ei.value.tensor, ei.value.field) == want == ("DIGEST_UNSUPPORTED", None, "digests.algorithm"), what
        assert not dst.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["a.safetensors"], what
    with unchecked():
        qformat.dequantize_checkpoint(p, tmp_path / "dq.safetensors")
    assert inspect_checkpoint(p) is not None


def test_a_digest_listed_under_a_logical_name_refuses_that_tensor(tmp_path: Path) -> None:
    """Issue 40: SPEC.md §3.8 case 2: 'digests' lists stored names only; a listed name that is no
    stored tensor (here the logical name 'w') is DIGEST_MISMATCH for that name, and a verifying
    reader refuses the logical tensor so named.  The readers ignored it; now check --digests,
    load_file/safe_open(verify=True) and the commands give the same code, tensor and field."""
    p = tmp_path / "a.safetensors"
    _digests_file(p, {"algorithm": "sha256", "tensors": {}})
    _digests_file(p, {"algorithm": "sha256", "tensors": {**_sha(p), "w": "0" * 64}})  # every stored digest right
    want = ("DIGEST_MISMATCH", "w", "digests.tensors['w']")
    assert [(x.code, x.tensor, x.field) for x in qformat.check(p, digests=True).problems] == [want]
    qformat.load_file(p)  # a reader that does not verify decodes
    with pytest.raises(QFormatError) as ei:
        qformat.load_file(p, verify=True)
    assert (ei.value.code, ei.value.tensor, ei.value.field) == want
    with qformat.safe_open(p, verify=True) as f:
        np.testing.assert_array_equal(f.get_tensor("b"), np.arange(3, dtype=np.float32))  # every other tensor still reads
        with pytest.raises(QFormatError) as ei:
            f.get_tensor("w")
        assert (ei.value.code, ei.value.tensor, ei.value.field) == want
    with pytest.raises(QFormatError) as ei:
        qformat.dequantize_checkpoint(p, tmp_path / "dq.safetensors")
    assert (ei.value.code, ei.value.tensor, ei.value.field) == want
    assert not (tmp_path / "dq.safetensors").exists()



@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_javascript_reader_refuses_a_digest_listed_under_a_logical_name(tmp_path: Path) -> None:
    """The same file through the JavaScript reader's openFile(path, {verify: true}): it read 'w'
    (its digest check looked at 'w''s components only); now the same code, tensor and field."""
    p = tmp_path / "a.safetensors"
    _digests_file(p, {"algorithm": "sha256", "tensors": {}})
    _digests_file(p, {"algorithm": "sha256", "tensors": {**_sha(p), "w": "0" * 64}})
    script = ("import { openFile } from " + json.dumps((ROOT / "readers/js/src/node.js").as_uri()) + ";"
              "const f = openFile(process.argv[1], { verify: true }); const out = { b: f.getTensor('b').shape };"
              "try { f.getTensor('w'); out.w = 'read'; } catch (e) { out.w = [e.code, e.tensor, e.field]; }"
              "console.log(JSON.stringify(out));")
    r = subprocess.run(["node", "--input-type=module", "-e", script, str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"b": [3], "w": ["DIGEST_MISMATCH", "w", "digests.tensors[\"w\"]"]}


def test_checkpoint_writers_record_digests_and_commands_refuse_damage(tmp_path: Path) -> None:
    from .test_quantize_checkpoint import _llama

    (tmp_path / "w").mkdir()
    _llama(tmp_path / "w" / "src")
    out = tmp_path / "w" / "q"
    qformat.quantize_checkpoint(tmp_path / "w" / "src", out, scheme="int", bits=4, group_size=32)
    f = out / "model.safetensors"
    q = _qobj(f)
    stored = _stored(f)
    assert q["version"] == "1.2" and all(q["digests"]["tensors"][n] == hashlib.sha256(b).hexdigest() for n, b in stored.items())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["spec_version"] == "1.2"
    assert qformat.check(out, digests=True).ok
    name = next(n for n in stored if n.endswith(".codes"))
    _flip(f, name, 1)
    with pytest.raises(QFormatError) as ei:  # every command reads with check's rules, digests included
        qformat.dequantize_checkpoint(out, tmp_path / "dq")
    assert ei.value.code == "DIGEST_MISMATCH"
    from qformat.checkpoint.source import unchecked

    with unchecked():  # --no-check: read as it is, at the user's risk
        qformat.dequantize_checkpoint(out, tmp_path / "dq2")


def test_copied_bodies_get_the_digest_of_the_copied_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    body = np.arange(64, dtype=np.uint8)
    src.write_bytes(b"xyz" + body.tobytes())
    spec = container.TensorSpec("t", "U8", (64,))
    plan = container.plan_file([spec], {"qformat": json.dumps({"version": "1.0", "tensors": {}})})
    out = tmp_path / "o.safetensors"
    container.write_planned(out, plan, lambda s: body, copy_from={"t": (str(src), 3)})
    q = _qobj(out)
    assert q["version"] == "1.2" and q["digests"]["tensors"]["t"] == hashlib.sha256(body.tobytes()).hexdigest()
    assert qformat.check(out, digests=True).ok


def test_a_tensor_named_like_a_digest_does_not_confuse_the_writer(tmp_path: Path) -> None:
    """The writer finds its digest placeholders in one pass over the header (issue 40: one search
    per placeholder was quadratic): names made of 64 hexadecimal digits are no placeholders."""
    p = tmp_path / "a.safetensors"
    names = {"0" * 64: np.zeros(2, np.float32), hashlib.sha256(b"x").hexdigest(): np.ones(2, np.float32)}
    _save(p, **names)
    assert qformat.check(p, digests=True).ok
    q = _qobj(p)
    assert all(q["digests"]["tensors"][n] == hashlib.sha256(v.tobytes()).hexdigest() for n, v in names.items())


def test_every_shard_a_checkpoint_writer_writes_records_digests(tmp_path: Path) -> None:
    """quantize's plain shards (here: a shard of only unquantized tensors) and every shard of
    dequantize record a digest of every stored tensor (issue 44: a 46.9 MB embedding in a plain
    shard was unprotected), and check --digests says how many it verified, per file and in all."""
    import json
    import subprocess
    import sys

    from safetensors.numpy import save_file as st_save

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    st_save({"norm.weight": rng.standard_normal(64).astype(np.float32)}, str(src / "model-00001-of-00002.safetensors"))
    st_save({"layer.weight": rng.standard_normal((64, 64)).astype(np.float32), "layer.bias": np.zeros(64, np.float32)},
            str(src / "model-00002-of-00002.safetensors"))
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "norm.weight": "model-00001-of-00002.safetensors", "layer.weight": "model-00002-of-00002.safetensors",
        "layer.bias": "model-00002-of-00002.safetensors"}}))
    q = tmp_path / "q"
    qformat.quantize_checkpoint(src, q, "int", bits=4, group_size=32)  # a 1-D norm stays plain: a shard of plain tensors only
    d = tmp_path / "d"
    qformat.dequantize_checkpoint(q, d)
    for folder in (q, d):
        for f in sorted(folder.glob("*.safetensors")):
            h = read_header(f)
            obj = json.loads(h.metadata["qformat"])
            assert obj["version"] == "1.2" and sorted(obj["digests"]["tensors"]) == sorted(h.entries), (f, obj)
        rep = qformat.check(folder, digests=True)
        assert rep.ok and rep.digests_verified == sum(len(read_header(f).entries) for f in folder.glob("*.safetensors"))
        p = subprocess.run([sys.executable, "-m", "qformat", "check", "--digests", str(folder)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "digests of 1 of 1 stored tensors verified" in p.stdout, p.stdout  # the norm's shard
        assert f"digests: {rep.digests_verified} of {rep.digests_verified} stored tensors verified in 2 files" in p.stdout
    # a damaged byte in the plain shard is found
    shard = q / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    rep = qformat.check(q, digests=True)
    assert [p.code for p in rep.problems] == ["DIGEST_MISMATCH"] and rep.files[0].digests_verified == 0
