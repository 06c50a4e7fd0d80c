"""``save_pretrained`` keeps every tensor in the scheme it was loaded with (issue 42 item 5).

A GGUF converted to a Hugging Face folder (``qformat convert model.gguf out/``) holds a Q8_0
embedding; transformers decodes it into the model's embedding on load.  Saving that model must
write the embedding back as the Q8_0 tensor it was (the same component bytes, the same
descriptor), not as float32, and a later ``qformat export --to gguf`` of the save must give the
GGUF's own tensor types and bytes.  An embedding changed after loading is saved as the plain
tensor it now is.  The oracles are the converted folder's own bytes and the export of that
folder, never the code under test.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qformat  # noqa: E402
import qformat.transformers  # noqa: E402,F401  (registers quant_method "qformat")
from qformat.cli import main as cli  # noqa: E402
from qformat.convert.gguf_file import GGUFFile  # noqa: E402
from qformat_transformers.gguf_layout import convert_gguf  # noqa: E402

from ..gguf_models import hf_model, write_gguf  # noqa: E402

IDS = torch.tensor([[1, 5, 9, 42, 7, 3]])


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("save-schemes")


@functools.lru_cache(maxsize=None)
def _converted(tmp: Path, arch: str, tie: bool) -> tuple[Path, Path]:
    """(the GGUF, its converted folder): Q8_0 everywhere but a Q4_K ffn_down (the embedding is Q8_0)."""
    tmp = tmp / arch
    folder = tmp / "hf"
    hf_model(arch, folder, tie=tie)
    src = write_gguf(folder, tmp / f"{arch}.gguf", arch, types={"ffn_down": "Q4_K"})
    out = tmp / "converted"
    convert_gguf(src, out)
    return src, out


def _stored(folder: Path) -> tuple[dict[str, dict], dict[str, tuple[str, bytes]]]:
    """(qformat descriptors, stored tensor -> (dtype, bytes)) of a folder's safetensors files."""
    from safetensors import safe_open

    descs: dict[str, dict] = {}
    raw: dict[str, tuple[str, bytes]] = {}
    for p in sorted(folder.glob("*.safetensors")):
        with safe_open(str(p), framework="np") as f:
            meta = f.metadata() or {}
            if "qformat" in meta:
                descs.update(json.loads(meta["qformat"])["tensors"])
        head = p.read_bytes()
        n = int.from_bytes(head[:8], "little")
        header = json.loads(head[8 : 8 + n])
        for name, e in header.items():
            if name != "__metadata__":
                a, b = e["data_offsets"]
                raw[name] = (e["dtype"], head[8 + n + a : 8 + n + b])
    return descs, raw


def _components(desc: dict, raw: dict[str, tuple[str, bytes]]) -> list[tuple[str, str, bytes]]:
    """(reference key, dtype, bytes) of each component a descriptor names, keyed by where it sits."""
    out = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for k, v in sorted(node.items()):
                if k == "tensor" and isinstance(v, str):
                    out.append((path, *raw[v]))
                else:
                    walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(desc, "")
    return out


def _export(folder: Path, dst: Path) -> GGUFFile:
    assert cli(["export", "--quiet", "--to", "gguf", str(folder), str(dst)]) == 0
    return GGUFFile(dst)


@pytest.mark.parametrize("arch,tie", [("llama", False), ("qwen3", True)])
def test_save_pretrained_keeps_each_tensor_in_its_scheme(root, tmp_path, arch, tie):
    src, conv = _converted(root, arch, tie)
    model = transformers.AutoModelForCausalLM.from_pretrained(conv)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    want_d, want_raw = _stored(conv)
    got_d, got_raw = _stored(saved)
    assert want_d["model.embed_tokens.weight"]["scheme"] == "gguf_q8_0"
    # every logical tensor of the folder, in its scheme, over the same component bytes
    assert sorted(got_d) == sorted(want_d)
    for name, d in want_d.items():
        assert got_d[name].get("scheme") == d.get("scheme"), name
        assert _components(got_d[name], got_raw) == _components(d, want_raw), name
    # nothing decoded next to them: the plain tensors are the folder's plain tensors (a tied
    # head is not written out as float32 either)
    comps = lambda d, raw: {n for x in d.values() for n in raw if any(n == c for c in json.dumps(x).split('"'))}  # noqa: E731
    plain_want = set(want_raw) - comps(want_d, want_raw)
    plain_got = set(got_raw) - comps(got_d, got_raw)
    assert plain_got == plain_want
    assert all(got_raw[n] == want_raw[n] for n in plain_want)
    # the saved model loads back to the same logits, bit for bit
    again = transformers.AutoModelForCausalLM.from_pretrained(saved)
    with torch.no_grad():
        a, b = model(IDS).logits, again(IDS).logits
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    # and exports to the GGUF types and tensor bytes the folder itself exports to
    ref = _export(conv, tmp_path / "ref.gguf")
    out = _export(saved, tmp_path / "out.gguf")
    orig = GGUFFile(src)
    assert {n: t.type_name for n, t in out.tensors.items()} == {n: t.type_name for n, t in ref.tensors.items()}
    assert {n: t.type_name for n, t in out.tensors.items()} == {n: t.type_name for n, t in orig.tensors.items()}
    assert out.tensors["token_embd.weight"].type_name == "Q8_0"
    for n in ref.tensors:
        assert np.array_equal(out.raw(n), ref.raw(n)), n
        assert np.array_equal(out.raw(n), orig.raw(n)), n


def test_save_pretrained_writes_a_changed_embedding_plain(root, tmp_path):
    _, conv = _converted(root, "llama", False)
    model = transformers.AutoModelForCausalLM.from_pretrained(conv)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb[3, 5] += 1.0
    changed = emb.detach().clone()
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    got_d, got_raw = _stored(saved)
    assert "model.embed_tokens.weight" not in got_d
    dtype, data = got_raw["model.embed_tokens.weight"]
    assert dtype == "F32"
    assert np.frombuffer(data, np.float32).tobytes() == changed.numpy().astype(np.float32).tobytes()
