"""The rest of the one GGUF parse for ``qformat convert model.gguf out/`` (issue 42 item 6).

Inside :func:`qformat_transformers.gguf_parse.parsed_once`, transformers' own metadata reader
(``read_gguf_metadata``, which ``AutoTokenizer.from_pretrained(gguf_file=)`` calls twice) must
answer exactly what it answers reading the file (the oracle: the reader itself, unpatched) without
reading it, and ``load_gguf_checkpoint``'s ``config`` must be what the full parse gives while
its parse walks none of the tokenizer's arrays (the vocabulary).  The real models are checked
where they can be had.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from qformat import convert as cv  # noqa: E402
from qformat.checkpoint.source import Checkpoint  # noqa: E402
from qformat.convert.gguf import METADATA_KEY  # noqa: E402
from qformat.convert.gguf_file import GGUFFile  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from qformat_transformers import gguf_hparams, gguf_parse  # noqa: E402
from qformat_transformers.gguf_parse import metadata, parsed_once  # noqa: E402

from ..gguf_models import hf_model, write_gguf  # noqa: E402

STRING_ARRAYS = ((), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (NaN equal to NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _record(src: Path) -> tuple[dict[str, Any], list[str], int]:
    d = cv.get("gguf").describe(Checkpoint(src))
    record = json.loads(d.metadata[METADATA_KEY])
    return gguf_hparams.read_kv(d), [t[0] for t in record["tensors"]], record["version"]


def _check(src: Path, monkeypatch: Any) -> None:
    import transformers.integrations.gguf as gguf_pkg
    import transformers.integrations.gguf.reader as reader
    import transformers.modeling_gguf_pytorch_utils as mg

    real_metadata = reader.read_gguf_metadata
    real_load = mg.load_gguf_checkpoint
    want_meta = {sa: real_metadata(str(src), sa) for sa in STRING_ARRAYS}
    want = real_load(str(src), return_tensors=False)
    kv, names, version = _record(src)
    for sa in STRING_ARRAYS:
        got = metadata(kv, names, sa)
        assert _same(got[0], want_meta[sa][0]) and got[1] == want_meta[sa][1], sa

    built: list[list[str]] = []
    real_reader = gguf_parse.KVReader

    def recording(fields: Any, *a: Any, **k: Any) -> Any:
        built.append(list(fields))
        return real_reader(fields, *a, **k)

    monkeypatch.setattr(gguf_parse, "KVReader", recording)
    with parsed_once(str(src), kv, names, version) as load:
        # both names transformers calls it by answer from the record: the file is not read
        monkeypatch.setattr(reader, "_mapped", lambda *_a: pytest.fail("read_gguf_metadata read the file"))
        from transformers.integrations.gguf import read_gguf_metadata

        for sa in STRING_ARRAYS:
            for fn in (read_gguf_metadata, reader.read_gguf_metadata):
                got = fn(str(src), sa)
                assert _same(got[0], want_meta[sa][0]) and got[1] == want_meta[sa][1]
        monkeypatch.undo()
        monkeypatch.setattr(gguf_parse, "KVReader", recording)
        # the config alone: transformers' own parse over the fields it can read a config value from
        p = load(str(src), return_tensors=False)
        assert _same(p["config"], want["config"])
        assert len(built) == 1 and not [k for k in built[0] if k.startswith("tokenizer.") and kv[k][0] == "array"], built
        # the whole answer, parsed when asked for: what transformers gives reading the file
        assert p == want and want == p and dict(p) == want and set(p) == set(want)
        assert mg.load_gguf_checkpoint(str(src), return_tensors=False) == want
        # each answer's parts are its own
        p["config"]["hidden_size"] = -1
        assert load(str(src), return_tensors=False)["config"] == want["config"]
    assert reader.read_gguf_metadata is real_metadata and mg.load_gguf_checkpoint is real_load
    assert vars(gguf_pkg).get("read_gguf_metadata", real_metadata) is real_metadata


@pytest.mark.parametrize("arch,drop", [("llama", ()), ("gemma3", ()), ("llama", ("llama.vocab_size",))])
def test_metadata_and_config_from_the_record_are_transformers_own(tmp_path, monkeypatch, arch, drop):
    """Synthetic files; without ``llama.vocab_size`` the config takes the token count, as
    transformers' fallback does."""
    hf_model(arch, tmp_path / "hf")
    src = write_gguf(tmp_path / "hf", tmp_path / f"{arch}.gguf", arch, drop=drop)
    _check(src, monkeypatch)


@pytest.mark.llama_cpp  # the real model is a 253 MB download (tests/real_models.py), as for the other real-model tests
def test_real_gemma3(monkeypatch):
    from .. import real_models

    _check(real_models.require_gemma3(), monkeypatch)


def test_real_smollm2(monkeypatch):
    p = os.environ.get("QFORMAT_SMOLLM2_GGUF") or os.path.expanduser("~/.cache/qformat/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(p):
        pytest.skip(f"SmolLM2-135M GGUF not here ({p}; QFORMAT_SMOLLM2_GGUF names one)")
    _check(Path(p), monkeypatch)


def test_metadata_gives_non_finite_floats_as_floats():
    """The record spells non-finite floats as text (JSON has none); the reader gives floats."""
    kv = {"general.architecture": ("string", "llama", None), "a.f": ("float32", "-inf", None),
          "a.g": ("float64", "nan", None), "a.arr": ("array", [1.5, "inf", "nan"], "float32"),
          "a.ints": ("array", [1, 2], "int32"), "a.flag": ("bool", True, None), "a.strs": ("array", ["x", "y"], "string")}
    meta, names = metadata(kv, ["t"], ("a.strs",))
    assert meta["a.f"] == -math.inf and math.isnan(meta["a.g"]) and isinstance(meta["a.f"], float)
    assert meta["a.arr"][:2] == [1.5, math.inf] and math.isnan(meta["a.arr"][2])
    assert meta["a.ints"] == [1, 2] and meta["a.flag"] is True and meta["a.strs"] == ["x", "y"] and names == ("t",)
    assert metadata(kv, ["t"])[0]["a.strs"] == 2


def _gguf_with_strings(path: Path, items: list[bytes], cut: int = 0) -> Path:
    """A GGUF v3 holding one key, a string array of ``items`` (raw bytes), no tensors; ``cut``
    bytes taken off the end."""
    key = b"tokenizer.ggml.tokens"
    body = struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, len(items))
    body += b"".join(struct.pack("<Q", len(s)) + s for s in items)
    path.write_bytes(body[: len(body) - cut] if cut else body)
    return path


def test_string_arrays_read_in_one_loop_keep_their_checks(tmp_path):
    items = [b"a", "\u2581b".encode(), b"", "\U0001f999".encode()]
    f = GGUFFile(_gguf_with_strings(tmp_path / "ok.gguf", items))
    assert f.kv["tokenizer.ggml.tokens"].value == [s.decode() for s in items]
    with pytest.raises(QFormatError, match=r"kv\[tokenizer\.ggml\.tokens\]\[3\]: expected 4 bytes at offset"):
        GGUFFile(_gguf_with_strings(tmp_path / "cut.gguf", items, cut=1))
    with pytest.raises(QFormatError, match=r"kv\[tokenizer\.ggml\.tokens\]\[2\] length: expected 8 bytes at offset"):
        GGUFFile(_gguf_with_strings(tmp_path / "cut2.gguf", [b"abcdefgh" * 2, b"x", b""], cut=8))
    with pytest.raises(QFormatError, match=r"kv\[tokenizer\.ggml\.tokens\]\[1\]: expected UTF-8 text, found invalid start byte at byte 0"):
        GGUFFile(_gguf_with_strings(tmp_path / "utf8.gguf", [b"a", b"\xff", b"c"]))
