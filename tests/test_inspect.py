"""``qformat inspect``: every readable kind of checkpoint, from headers only.

Kinds: a qformat file, a plain safetensors file, a sharded checkpoint (index and folder), a
GGUF file (tensor infos only) and a source folder that ``qformat convert`` detects (GPTQ, read
in place).  The no-payload rule is tested two ways: every payload accessor is patched to fail,
and a checkpoint whose data region is a 2.3 GB sparse hole is inspected through the CLI.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.cli import main
from qformat.checkpoint.source import Checkpoint
from qformat.inspection import FORMAT_VERSION, inspect_checkpoint
from qformat.sources import FileSource

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
    return p


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"layers.0.w": rng.standard_normal((64, 128)).astype(np.float32),
            "layers.1.w": rng.standard_normal((32, 256)).astype(np.float32),
            "layers.10.w": rng.standard_normal((16, 64)).astype(np.float32),
            "norm": rng.standard_normal(64).astype(np.float32)}


def quantized(t: dict[str, np.ndarray]) -> dict[str, object]:
    return {"layers.0.w": qformat.quantize(t["layers.0.w"], "int", bits=4, group_size=32, scale_dtype="float16"),
            "layers.1.w": qformat.quantize(t["layers.1.w"], "nf4", block_size=64),
            "layers.10.w": qformat.quantize(t["layers.10.w"], "mxfp4"),
            "norm": t["norm"]}


@pytest.fixture
def qfile(tmp_path: Path) -> Path:
    p = tmp_path / "q.safetensors"
    qformat.save_file(quantized(model()), p)
    return p


def write_sharded(folder: Path, t: dict[str, object]) -> Path:
    """A two-shard qformat checkpoint: each logical tensor with its components in one shard."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(t)
    parts = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    wm = {}
    for fn, part in parts.items():
        qformat.save_file({n: t[n] for n in part}, folder / fn)
        with qformat.safe_open(folder / fn) as f:
            stored = list(f.header.entries)
            wm.update({n: fn for n in list(f.keys()) + stored})
    idx = folder / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return idx


def rows(r) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {t["name"]: t for t in r.to_dict()["tensors"]}


def test_qformat_file_rows_and_totals(qfile: Path) -> None:
    r = inspect_checkpoint(qfile)
    d = r.to_dict()
    assert d["format_version"] == FORMAT_VERSION == 1
    assert d["kind"] == "qformat" and d["source_format"] is None and d["spec_version"] == "1.2"  # written with digests
    assert [t["name"] for t in d["tensors"]] == ["layers.0.w", "layers.1.w", "layers.10.w", "norm"]  # natural order
    t = rows(r)
    w0 = t["layers.0.w"]
    assert w0["shape"] == [64, 128] and w0["dtype"] == "float32" and w0["quantized"]
    assert w0["scheme"] == "int" and w0["scheme_source"] == "descriptor"
    assert w0["element"] == "int4 twos_complement" and w0["granularity"] == "32" and w0["layout"] == "canonical"
    assert w0["block"] == {"type": "grid", "size": [1, 32]}
    assert w0["stored_bytes"] == 64 * 128 // 2 + 64 * 4 * 2  # codes + one fp16 scale per 32
    assert w0["bits_per_weight"] == 4.5
    assert t["layers.10.w"]["bits_per_weight"] == 4.25  # mxfp4: E8M0 scale per 32
    assert t["layers.1.w"]["element"].startswith("codebook4")
    n = t["norm"]
    assert not n["quantized"] and n["scheme"] is None and n["element"] == "F32" and n["bits_per_weight"] == 32
    tot = d["totals"]
    assert tot["tensors"] == 4 and tot["quantized"] == 3 and tot["plain"] == 1
    assert tot["stored_bytes"] == sum(x["stored_bytes"] for x in d["tensors"])
    assert tot["elements"] == 64 * 128 + 32 * 256 + 16 * 64 + 64
    schemes = {s["scheme"]: s for s in d["schemes"]}
    assert set(schemes) == {"int", "nf4", "mxfp4", "plain"} and schemes["int"]["tensors"] == 1
    # every stored byte of the file's tensors is counted once
    with qformat.safe_open(qfile) as f:
        assert tot["stored_bytes"] == sum(e.nbytes for e in f.header.entries.values())


def test_cli_text_and_json(qfile: Path) -> None:
    p = run_cli("inspect", str(qfile))
    assert p.returncode == 0, p.stderr
    assert "qformat checkpoint" in p.stdout and "layers.10.w" in p.stdout and "int4 twos_complement" in p.stdout
    assert "total: 4 tensors (3 quantized, 1 plain)" in p.stdout
    j = run_cli("inspect", "--json", str(qfile))
    d = json.loads(j.stdout)
    assert set(d) == {"format_version", "path", "kind", "source_format", "spec_version", "files", "file_bytes", "gguf", "totals", "schemes", "tensors"}
    assert d["gguf"] is None  # not a GGUF file nor a conversion of one
    assert set(d["tensors"][0]) == {"name", "shape", "dtype", "quantized", "scheme", "scheme_source", "element", "block", "granularity",
                                    "layout", "elements", "stored_bytes", "bits_per_weight", "components"}
    assert set(d["totals"]) == {"tensors", "quantized", "plain", "elements", "stored_bytes", "bits_per_weight",
                                "quantized_elements", "quantized_stored_bytes", "quantized_bits_per_weight"}
    assert set(d["schemes"][0]) == {"scheme", "element", "granularity", "quantized", "tensors", "elements", "stored_bytes", "bits_per_weight"}
    assert d["file_bytes"] == qfile.stat().st_size


def test_plain_file(tmp_path: Path) -> None:
    p = tmp_path / "plain.safetensors"
    qformat.save_file(model(), p)
    d = inspect_checkpoint(p).to_dict()
    assert d["kind"] == "safetensors" and d["spec_version"] is None
    assert d["totals"]["quantized"] == 0 and d["totals"]["bits_per_weight"] == 32
    assert d["schemes"] == [{"scheme": "plain", "element": "F32", "granularity": None, "quantized": False, "tensors": 4,
                             "elements": d["totals"]["elements"], "stored_bytes": d["totals"]["stored_bytes"], "bits_per_weight": 32.0}]


def test_sharded_index_and_folder(tmp_path: Path, qfile: Path) -> None:
    idx = write_sharded(tmp_path / "sharded", quantized(model()))
    single = inspect_checkpoint(qfile).to_dict()
    for path in (idx, idx.parent):
        d = inspect_checkpoint(path).to_dict()
        assert d["kind"] == "qformat" and len(d["files"]) == 2
        assert d["tensors"] == single["tensors"] and d["totals"] == single["totals"]
    p = run_cli("inspect", "--json", str(idx))
    assert p.returncode == 0 and json.loads(p.stdout)["totals"] == single["totals"]


def _gguf(path: Path) -> Path:
    from gguf import GGMLQuantizationType as T

    from .convert.test_gguf import quant_data, write_gguf

    rng = np.random.default_rng(0)
    return write_gguf(path, [("blk.0.attn_q.weight", quant_data(T.Q4_0, (8, 64), rng), T.Q4_0),
                             ("blk.0.ffn_up.weight", quant_data(T.Q4_K, (4, 256), rng), T.Q4_K),
                             ("blk.1.ffn_down.weight", quant_data(T.MXFP4, (4, 64), rng), T.MXFP4),
                             ("output_norm.weight", rng.standard_normal(16).astype(np.float32), None)])


def test_gguf_file_from_tensor_infos_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qformat.convert.gguf_file import GGUFFile

    path = _gguf(tmp_path / "m.gguf")

    def no_payload(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("inspect read tensor payload")

    monkeypatch.setattr(GGUFFile, "raw", no_payload)
    r = inspect_checkpoint(path)
    d = r.to_dict()
    assert d["kind"] == "source" and d["source_format"] == "gguf" and d["spec_version"] == "1.2"  # a conversion records digests
    t = rows(r)
    q = t["blk.0.attn_q.weight"]
    assert q["scheme"] == "gguf_q4_0" and q["element"] == "int4 offset_binary" and q["granularity"] == "32"
    assert q["stored_bytes"] == 8 * 2 * 18 and q["bits_per_weight"] == 4.5 and q["layout"] == "gguf_blocks"
    k = t["blk.0.ffn_up.weight"]
    assert k["scheme"] == "gguf_q4_k" and k["stored_bytes"] == 4 * 144 and k["bits_per_weight"] == 4.5
    assert t["blk.1.ffn_down.weight"]["bits_per_weight"] == 4.25
    assert t["output_norm.weight"]["dtype"] == "float32" and not t["output_norm.weight"]["quantized"]
    assert d["file_bytes"] == path.stat().st_size


def _llama_gguf(path: Path) -> Path:
    """A GGUF file with the keys llama.cpp's converter writes for a llama (gguf-py's writer)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    from .convert.test_gguf import quant_data

    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("Tiny Llama")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"t{i}" for i in range(9000)])  # large enough for its own metadata member once converted
    w.add_token_types([1] * 9000)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}<s>{{ m['content'] }}\n{% endfor %}")
    w.add_tensor("blk.0.ffn_up.weight", quant_data(T.Q4_K, (4, 256), rng), raw_dtype=T.Q4_K)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_metadata_summary(tmp_path: Path) -> None:
    """A GGUF file and its conversion show the same key/value summary, in text and --json."""
    from qformat.convert import convert

    src = _llama_gguf(tmp_path / "m.gguf")
    mid = tmp_path / "m.safetensors"
    convert(src, mid)
    want = {"architecture": "llama", "name": "Tiny Llama", "file_type": {"id": 15, "name": "MOSTLY_Q4_K_M"}, "quantization_version": 2,
            "hyperparameters": {"attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": pytest.approx(1e-5),
                                "block_count": 2, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
                                "rope.freq_base": 500000.0},
            "tokenizer": {"model": "gpt2", "pre": "llama-bpe", "vocab_size": 9000, "special_ids": {"bos": 1, "eos": 2},
                          "flags": {"add_bos_token": True}, "chat_template": "{% for m in messages %}<s>{{ m['content'] }}\n{% endfor %}"},
            "version": 3, "alignment": 32}
    for path in (src, mid):
        g = inspect_checkpoint(path).to_dict()["gguf"]
        assert g["keys"] == 20 and {k: g[k] for k in want} == want, path
        p = run_cli("inspect", str(path))
        assert p.returncode == 0, p.stderr
        assert "GGUF: architecture llama, name 'Tiny Llama', file type MOSTLY_Q4_K_M (15), quantization version 2" in p.stdout
        assert "hyperparameters: attention.head_count 4, attention.head_count_kv 2" in p.stdout and "context_length 4096" in p.stdout
        assert "tokenizer: gpt2, pre-tokenizer llama-bpe, vocabulary 9000" in p.stdout
        assert "special token ids: bos 1, eos 2" in p.stdout and "tokenizer flags: add_bos_token true" in p.stdout
        assert "chat template (57 characters):\n    {% for m in messages %}<s>{{ m['content'] }}\n    {% endfor %}" in p.stdout
        assert json.loads(run_cli("inspect", "--json", str(path)).stdout)["gguf"]["tokenizer"]["vocab_size"] == 9000
    d = inspect_checkpoint(mid).to_dict()
    assert {t["name"] for t in d["tensors"]} == {"blk.0.ffn_up.weight", "output_norm.weight"}  # model tensors only
    assert d["totals"]["elements"] == 4 * 256 + 64  # the vocabulary (its own metadata member) is no tensor


def test_unreadable_gguf_metadata_is_said(tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    qformat.save_file({"w": np.ones((2, 32), np.float32)}, p, metadata={"gguf": "{not json"})
    r = inspect_checkpoint(p)
    assert r.gguf is not None and "is not the JSON object qformat convert records" in r.gguf["error"]
    assert any(line.startswith("  GGUF metadata: ") for line in r.lines()) and r.totals()["tensors"] == 1


def _gptq_source(folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
    from .convert.test_gptq import gptq_config, make_module, write_ckpt

    rng = np.random.default_rng(3)
    t, want = make_module(rng, 40, 96, 4, 32, False, True, "float16")
    src = write_ckpt(folder, {"model.layers.0.mlp.down_proj": t}, gptq_config(4, 32, "gptq_v2", True))
    return src, {"model.layers.0.mlp.down_proj.weight": want}


def test_converter_source_in_place(tmp_path: Path) -> None:
    src, _ = _gptq_source(tmp_path / "gptq")
    before = sorted(os.listdir(src))
    r = inspect_checkpoint(src)
    assert sorted(os.listdir(src)) == before  # nothing written
    d = r.to_dict()
    assert d["kind"] == "source" and d["source_format"] == "gptq"
    w = rows(r)["model.layers.0.mlp.down_proj.weight"]
    assert w["quantized"] and w["shape"] == [40, 96] and w["dtype"] == "float16"
    assert "int4" in w["element"] and w["scheme_source"] in ("descriptor", "derived")
    ck = Checkpoint(src)
    comps = set(w["components"])
    assert {"model.layers.0.mlp.down_proj.qweight", "model.layers.0.mlp.down_proj.scales"} <= comps
    src_bytes = sum(int(np.prod(ck.info(c).shape)) * np.dtype(ck.array(c).dtype).itemsize for c in comps if c in ck)
    assert w["stored_bytes"] >= src_bytes
    p = run_cli("inspect", str(src))
    assert p.returncode == 0 and "gptq checkpoint (read through qformat convert; nothing written)" in p.stdout


def test_no_payload_read(tmp_path: Path, qfile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    idx = write_sharded(tmp_path / "sharded", quantized(model()))
    plain = tmp_path / "plain.safetensors"
    qformat.save_file(model(), plain)

    def no_payload(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("inspect read tensor payload")

    monkeypatch.setattr(FileSource, "array", no_payload)
    monkeypatch.setattr(Checkpoint, "array", no_payload)
    for p in (qfile, idx, idx.parent, plain):
        assert inspect_checkpoint(p).to_dict()["totals"]["tensors"] == 4


def _sparse_checkpoint(path: Path, rows_: int = 32768, cols: int = 65536) -> int:
    """A qformat file of one int4 g32 tensor [rows_, cols] whose data region is a sparse hole."""
    small = qformat.quantize(np.ones((2, 64), np.float32), "int", bits=4, group_size=32, scale_dtype="float16")
    desc = json.loads(json.dumps(small.descriptor))
    desc["shape"] = [rows_, cols]
    desc["codes"]["tensor"], desc["scale"]["tensor"] = "w.codes", "w.scale"
    codes, scales = rows_ * cols // 2, rows_ * (cols // 32) * 2
    header = {"w.codes": {"dtype": "U8", "shape": [rows_, cols // 2], "data_offsets": [0, codes]},
              "w.scale": {"dtype": "F16", "shape": [rows_, cols // 32], "data_offsets": [codes, codes + scales]},
              "__metadata__": {"qformat": json.dumps({"version": "1.0", "tensors": {"w": desc}})}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + codes + scales)
    return codes + scales


def test_sparse_multi_gb_checkpoint(tmp_path: Path) -> None:
    p = tmp_path / "huge.safetensors"
    try:
        total = _sparse_checkpoint(p)
    except OSError as e:  # pragma: no cover - a filesystem without sparse files
        pytest.skip(f"cannot write a sparse file here: {e}")
    assert p.stat().st_size > 1 << 30
    r = run_cli("inspect", "--json", str(p))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    (w,) = d["tensors"]
    assert w["shape"] == [32768, 65536] and w["stored_bytes"] == total and w["bits_per_weight"] == 4.5


def test_unreadable_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing.safetensors")]) == 2
    assert "FILE_UNREADABLE" in capsys.readouterr().err
    j = tmp_path / "config.json"
    j.write_text("{}")
    assert main(["inspect", str(j)]) == 2
    assert "FILE_UNREADABLE" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["inspect", str(empty)]) == 2
    assert "CONVERT_FORMAT_UNKNOWN" in capsys.readouterr().err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x00")
    assert main(["inspect", str(bad)]) == 1  # readable, but malformed: a problem with the input, not usage
    assert "[HEADER_TOO_SMALL]" in capsys.readouterr().err
