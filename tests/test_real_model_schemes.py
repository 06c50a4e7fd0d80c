"""The real Gemma 3 270M Q4_K_M through transformers (issue 42 items 5 and 6), marker ``llama_cpp``.

``qformat convert model.gguf out/`` opens no gguf-py reader; ``from_pretrained(out)`` prepares
no kernel while loading (each layer prepares at its first use); ``save_pretrained`` writes the
Q8_0 embedding back as Q8_0 over the same bytes, and the save exports to the original file's
tensor types and tensor bytes.  Timings are the bench's (``python -m bench --only
real_models``): a shared machine makes them no test.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from . import real_models
from .gguf_models import count_gguf_readers

pytestmark = pytest.mark.llama_cpp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


def _descriptors(path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(json.loads(f.read(n))["__metadata__"]["qformat"])["tensors"]


def test_gemma3_convert_load_save_export_keep_every_type(tmp_path, monkeypatch):
    import qformat.transformers  # noqa: F401
    from qformat.cli import main as cli
    from qformat.convert.gguf_file import GGUFFile
    from qformat_torch.nn import QLinear

    src = real_models.require_gemma3()
    opened = count_gguf_readers(monkeypatch)
    out = tmp_path / "hf"
    assert cli(["convert", "--quiet", str(src), str(out)]) == 0
    assert opened == []
    assert _descriptors(out / "model.safetensors")["model.embed_tokens.weight"]["scheme"] == "gguf_q8_0"

    prepared: list[object] = []
    select = QLinear._select_kernel
    monkeypatch.setattr(QLinear, "_select_kernel", lambda self: (prepared.append(self), select(self))[1])
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    layers = [m for m in model.modules() if isinstance(m, QLinear)]
    assert layers and prepared == []  # nothing unpacked or scanned while loading
    with torch.no_grad():
        a = model(torch.tensor([[2, 105, 2364, 107]])).logits
    assert len(prepared) == len(layers)

    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    want, got = _descriptors(out / "model.safetensors"), _descriptors(saved / "model.safetensors")
    assert {k: v.get("scheme") for k, v in got.items()} == {k: v.get("scheme") for k, v in want.items()}
    assert (saved / "model.safetensors").stat().st_size < 1.1 * (out / "model.safetensors").stat().st_size
    again = transformers.AutoModelForCausalLM.from_pretrained(saved)
    with torch.no_grad():
        b = again(torch.tensor([[2, 105, 2364, 107]])).logits
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))

    assert cli(["export", "--quiet", "--to", "gguf", str(saved), str(tmp_path / "saved.gguf")]) == 0
    orig, back = GGUFFile(src), GGUFFile(tmp_path / "saved.gguf")
    assert {n: t.type_name for n, t in back.tensors.items()} == {n: t.type_name for n, t in orig.tensors.items()}
    for n in orig.tensors:
        assert np.array_equal(back.raw(n), orig.raw(n)), n
