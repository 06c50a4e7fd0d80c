"""Real GGUF metadata through ``qformat convert`` and back: llama.cpp's own vocabulary files.

llama.cpp ships ``models/ggml-vocab-*.gguf``, written by its converter from real tokenizers
(tokens, merges, token types, special ids: megabytes of key/values, no tensors); the
llama-cpp-python sdist carries them (tests/llama_cpp_source.py).  Each is converted as it is
(a file of metadata and no tensors), and with one small F32 tensor added by editing the bytes as
ggml's docs/gguf.md lays them out, so the source is still llama.cpp's bytes.  The conversion
keeps every key/value in ``__metadata__`` (the large ones in their own members), its only
tensors are the model's, ``qformat inspect`` reports the vocabulary, and the export gives the
source back byte for byte.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat.container import read_header
from qformat.convert import convert
from qformat.convert.gguf import MAX_METADATA_BYTES, header_bytes
from qformat.export import export
from qformat.inspection import inspect_checkpoint

from .. import llama_cpp_source as lcs

#: GGUF value type id -> size of a scalar of it (ggml docs/gguf.md); 8 string, 9 array.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip(b: bytes, off: int, t: int) -> int:
    """The offset after a value of type ``t`` at ``off``."""
    if t in _FIXED:
        return off + _FIXED[t]
    if t == 8:
        return off + 8 + struct.unpack_from("<Q", b, off)[0]
    assert t == 9, t
    et, n = struct.unpack_from("<IQ", b, off)
    off += 12
    if et in _FIXED:
        return off + n * _FIXED[et]
    for _ in range(n):
        off = _skip(b, off, et)
    return off


def _with_a_tensor(src: Path, dst: Path) -> Path:
    """``src`` (no tensors, alignment 32) with one F32 tensor ``output_norm.weight`` of 16 values."""
    b = src.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    assert magic == b"GGUF" and version == 3 and n_tensors == 0
    off = 24
    for _ in range(n_kv):
        off = off + 8 + struct.unpack_from("<Q", b, off)[0]  # the key
        (t,) = struct.unpack_from("<I", b, off)
        off = _skip(b, off + 4, t)
    assert b[off:] == b"\0" * (len(b) - off)  # nothing after the key/values but padding
    name = b"output_norm.weight"
    info = struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 16, 0, 0)  # 1 dim of 16, F32, offset 0
    head = b[:8] + struct.pack("<QQ", 1, n_kv) + b[24:off] + info
    head += b"\0" * (-len(head) % 32)
    dst.write_bytes(head + np.arange(16, dtype="<f4").tobytes())
    return dst


@pytest.mark.parametrize("with_tensor", [False, True], ids=["as shipped", "with a tensor"])
@pytest.mark.parametrize("name,pre,n_tokens", [("llama-bpe", "llama-bpe", 128256), ("qwen2", "qwen2", 151936)])
def test_real_vocabulary_round_trip(name: str, pre: str, n_tokens: int, with_tensor: bool, tmp_path: Path) -> None:
    models = lcs.require(f"models/ggml-vocab-{name}.gguf") / "models"
    src = models / f"ggml-vocab-{name}.gguf"
    if with_tensor:
        src = _with_a_tensor(src, tmp_path / "src.gguf")
    mid = tmp_path / "mid.safetensors"
    convert(src, mid)
    meta = read_header(mid).metadata
    kv = json.loads(meta["gguf"])["kv"]
    members = {k for k in meta if k.startswith("gguf.kv.")}
    assert {"gguf.kv.tokenizer.ggml.tokens", "gguf.kv.tokenizer.ggml.merges", "gguf.kv.tokenizer.ggml.token_type"} <= members
    assert kv["tokenizer.ggml.tokens"]["length"] == n_tokens and kv["tokenizer.ggml.pre"] == {"type": "string", "value": pre}
    assert sum(header_bytes(k, v) for k, v in meta.items() if k.startswith("gguf")) < MAX_METADATA_BYTES
    assert list(qformat.load_file(mid)) == (["output_norm.weight"] if with_tensor else [])
    g = inspect_checkpoint(mid).gguf
    assert g is not None and {k: g["tokenizer"][k] for k in ("model", "pre", "vocab_size")} == {"model": "gpt2", "pre": pre, "vocab_size": n_tokens}
    assert inspect_checkpoint(src).gguf == g  # the GGUF file itself says the same
    out = tmp_path / "out.gguf"
    export(mid, out, to="gguf")
    assert out.read_bytes() == src.read_bytes()
