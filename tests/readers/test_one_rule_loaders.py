"""Issue 24, item 1, for the model loaders: ``qformat.torch.load_model`` and ``from_pretrained``
through qformat.transformers refuse what ``qformat check`` refuses (a scale set to infinity, a
header check fails), with check's code, before the model is returned;
``qformat.checkpoint.source.unchecked()`` reads the file as it is.  The readers' own
``load_file``/``safe_open`` keep decoding such a file with IEEE semantics (SPEC.md §12.5)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qformat  # noqa: E402
import qformat.torch as qtorch  # noqa: E402
import qformat.transformers  # noqa: E402,F401  (registers the quantizer)
from qformat import check  # noqa: E402
from qformat.checkpoint.source import unchecked  # noqa: E402
from qformat.errors import QFormatError  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: E402

from tests.readers.test_transformers import tiny_config  # noqa: E402

TARGET = "model.layers.0.mlp.down_proj.weight"


def _set_scale(path: Path, logical: str, value: float) -> None:
    """Overwrite the first value of ``logical``'s scale component in place."""
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    desc = json.loads(header["__metadata__"]["qformat"])["tensors"][logical]
    e = header[desc["scale"]["tensor"]]
    npdt = {"F16": np.float16, "BF16": None, "F32": np.float32}[e["dtype"]]
    raw = np.array([value], npdt).tobytes() if npdt is not None else np.array([value], np.float32).tobytes()[2:]
    off = 8 + n + e["data_offsets"][0]
    data[off:off + len(raw)] = raw
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    base = tmp_path_factory.mktemp("one_rule")
    fp = base / "fp"
    LlamaForCausalLM(tiny_config()).eval().save_pretrained(fp)
    good = base / "int4"
    qformat.quantize_checkpoint(fp, good, scheme="int", bits=4, group_size=32)
    bad = base / "inf"
    shutil.copytree(good, bad)
    _set_scale(bad / "model.safetensors", TARGET, float("inf"))
    return {"good": good, "bad": bad}


def test_the_file_is_what_check_refuses(folders) -> None:
    assert check(str(folders["good"])).ok
    rep = check(str(folders["bad"]))
    assert [p.code for p in rep.problems] == ["PARAM_NONFINITE"] and rep.problems[0].tensor == TARGET


def test_from_pretrained_refuses_it(folders) -> None:
    with pytest.raises(QFormatError) as e:
        AutoModelForCausalLM.from_pretrained(folders["bad"])
    assert e.value.code == "PARAM_NONFINITE" and e.value.tensor == TARGET
    model = AutoModelForCausalLM.from_pretrained(folders["good"])  # the control loads
    assert torch.isfinite(model.model.layers[0].mlp.down_proj.weight).all()


def test_from_pretrained_unchecked_reads_it(folders) -> None:
    with unchecked():
        model = AutoModelForCausalLM.from_pretrained(folders["bad"])
    assert not torch.isfinite(model.model.layers[0].mlp.down_proj.weight).all()


def test_load_model_refuses_it(folders, tmp_path) -> None:
    model = LlamaForCausalLM(tiny_config()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(QFormatError) as e:
        qtorch.load_model(model, folders["bad"] / "model.safetensors")
    assert e.value.code == "PARAM_NONFINITE" and e.value.tensor == TARGET
    after = model.state_dict()  # the model is left as it was
    assert all(torch.equal(before[k], after[k]) for k in before)
    with unchecked():
        loaded = qtorch.load_model(LlamaForCausalLM(tiny_config()).eval(), folders["bad"] / "model.safetensors")
    assert not torch.isfinite(loaded.model.layers[0].mlp.down_proj.weight).all()


def test_load_model_refuses_a_header_problem(folders, tmp_path) -> None:
    """A header rule: a tensor entry whose data range runs past the file (TENSOR_OFFSETS_INVALID
    or the like, whichever code check reports) is refused with check's code."""
    src = folders["good"] / "model.safetensors"
    data = bytearray(src.read_bytes())
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(bytes(data[:-16]))  # the last tensor's bytes run past the end
    want = check(str(bad)).problems[0].code
    with pytest.raises(QFormatError) as e:
        qtorch.load_model(LlamaForCausalLM(tiny_config()).eval(), bad)
    assert e.value.code == want


def test_readers_still_decode_it(folders) -> None:
    """SPEC.md §12.5: a reader decodes a non-finite scale with IEEE semantics; only applications
    that apply a checker's rules (the commands, the model loaders) refuse it."""
    w = qtorch.load_file(folders["bad"] / "model.safetensors")[TARGET]
    assert not torch.isfinite(w).all()
