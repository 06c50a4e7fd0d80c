"""One parse of a GGUF for ``qformat convert model.gguf out/`` (issue 42 item 6).

transformers' ``load_gguf_checkpoint(return_tensors=False)`` answered from the key/values the
core already parsed (:mod:`qformat_transformers.gguf_parse`) must give exactly what it gives
reading the file with gguf-py (the oracle: transformers itself, unpatched), and a conversion
must call gguf-py's reader no more.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from qformat import convert as cv  # noqa: E402
from qformat.checkpoint.source import Checkpoint  # noqa: E402
from qformat.convert.gguf import METADATA_KEY  # noqa: E402
from qformat_transformers import gguf_hparams  # noqa: E402
from qformat_transformers.gguf_layout import convert_gguf  # noqa: E402
from qformat_transformers.gguf_parse import parsed_once  # noqa: E402

from ..gguf_models import count_gguf_readers, hf_model, write_gguf  # noqa: E402


@pytest.mark.parametrize("arch,tie", [("llama", False), ("gemma3", True)])
def test_one_parse_gives_what_gguf_py_gives_and_is_the_only_one(tmp_path, monkeypatch, arch, tie):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    hf_model(arch, tmp_path / "hf", tie=tie)
    src = write_gguf(tmp_path / "hf", tmp_path / f"{arch}.gguf", arch)
    want = load_gguf_checkpoint(str(src), return_tensors=False)
    d = cv.get("gguf").describe(Checkpoint(src))
    record = json.loads(d.metadata[METADATA_KEY])
    with parsed_once(str(src), gguf_hparams.read_kv(d), [t[0] for t in record["tensors"]], record["version"]) as load:
        assert load(str(src), return_tensors=False) == want
        # what AutoConfig / AutoTokenizer call inside the block is the same answer
        import transformers.modeling_gguf_pytorch_utils as mg

        assert mg.load_gguf_checkpoint(str(src), return_tensors=False) == want
    assert mg.load_gguf_checkpoint is load_gguf_checkpoint  # restored
    # a whole conversion opens no gguf-py reader
    opened = count_gguf_readers(monkeypatch)
    convert_gguf(src, tmp_path / "out")
    assert opened == []
    assert Path(tmp_path / "out" / "config.json").is_file()
