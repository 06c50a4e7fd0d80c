"""Importance matrices (issue 25, ``--imatrix``): the weighted GGUF quantizers, the imatrix file
readers, and their use by the presets and ``qformat quantize``.

The weighted quantizers' bytes against llama-quantize are checked by the frozen fixture here
(:data:`FIXTURE`, written by the marker test tests/test_llama_cpp_imatrix.py from
``llama-quantize --imatrix`` runs) and, in full, by that marker test.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import gguf_presets, kernels
from qformat.errors import QFormatError
from qformat.imatrix import load_imatrix
from qformat.schemes.ggml_blocks import SIZES, TYPES
from qformat.schemes.ggml_weighted import quantize_rows_weighted

from .imatrix_files import dat_bytes, write_dat, write_gguf
from .test_gguf_scheme import LLAMA3_8B, _llama_shapes

FIXTURE = Path(__file__).parent / "fixtures" / "llama_quantize" / "ggml_weighted.safetensors"


# -- the weighted quantizers ---------------------------------------------------------------------
def _fixture() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(FIXTURE))


def _fixture_cases() -> list[tuple[str, str]]:
    if not FIXTURE.is_file():
        return []
    keys = _fixture()
    return sorted({(k.split(".", 1)[0], k.split(".", 1)[1]) for k in keys if k.split(".", 1)[0] in TYPES})


@pytest.mark.skipif(not FIXTURE.is_file(), reason="the fixture is written by the llama_cpp marker test")
@pytest.mark.parametrize(("qtype", "case"), _fixture_cases())
@pytest.mark.parametrize("path", ["numpy", "native"])
def test_weighted_blocks_equal_llama_quantize(qtype: str, case: str, path: str) -> None:
    """Rows and importance vectors llama-quantize --imatrix quantized (llama-imatrix's own file for
    the trained model, a written one for the awkward rows), against its bytes."""
    f = _fixture()
    x, w, want = f[f"input.{case}"], f[f"importance.{case}"], f[f"{qtype}.{case}"]
    if path == "native":
        if not kernels.ggml_available():
            pytest.skip("the native extension is not built")
        got = kernels.ggml_quantize_weighted(qtype, x, w)
    else:
        got = quantize_rows_weighted(x, qtype, w)
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, f"{bad.size} bytes differ, the first in block {bad[0] // SIZES[qtype][1]}"


def _awkward(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    x = rng.standard_normal((rows, n)).astype(np.float32)
    x[0] = 0
    x[1] = 0.25
    x[2, 3:] = 0
    x[3] = np.abs(x[3])
    x[4] *= 1e-30
    x[5, ::7] *= 100
    return x


def _levels() -> list[int]:
    if not kernels.ggml_available():
        return []
    from qformat.kernels import _ggml

    return [0, 1] + ([2] if _ggml.best_level() == 2 else [])


@pytest.mark.skipif(not kernels.ggml_available(), reason="the native extension is not built")
@pytest.mark.parametrize("qtype", TYPES)
def test_native_weighted_equals_numpy(qtype: str) -> None:
    """Every native level (scalar, lanes, AVX2 lanes where the CPU has AVX2) against the NumPy
    reference, on awkward rows (zero, constant, sparse, tiny, spiked) of 544 columns (17 blocks
    of 32: the Q4_1 / Q5_1 lanes' scalar tail) or 512 for the K types."""
    rng = np.random.default_rng(7)
    n = 512 if SIZES[qtype][0] == 256 else 544
    for weights in (rng.gamma(1.0, 1.0, n), np.zeros(n), np.where(rng.random(n) < 0.9, 0.0, 5.0), rng.gamma(0.2, 1e4, n)):
        x = _awkward(rng, 8, n)
        w = weights.astype(np.float32)
        want = quantize_rows_weighted(x, qtype, w)
        for level in _levels():
            assert np.array_equal(kernels.ggml_quantize_weighted(qtype, x, w, level=level), want), level


@pytest.mark.parametrize("qtype", [t for t in TYPES if t != "Q8_0"])
def test_importance_lowers_the_weighted_error(qtype: str) -> None:
    """What an importance matrix is for: with it, the error weighted by the importance falls
    (columns of high importance are fitted more closely), on 64 rows of Gaussian data with a
    few columns 100 times as important as the rest."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    w = np.ones(512, np.float32)
    w[rng.choice(512, 32, replace=False)] = 100
    plain = qformat.quantize(x, "gguf", type=qtype).dequantize()
    weighted = qformat.quantize(x, "gguf", type=qtype, importance=w).dequantize()
    e_plain, e_weighted = float((w * (plain - x) ** 2).sum()), float((w * (weighted - x) ** 2).sum())
    assert e_weighted < 0.95 * e_plain, (e_weighted, e_plain)


def test_q8_0_ignores_the_importance() -> None:
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    a = qformat.quantize(x, "gguf", type="Q8_0")
    b = qformat.quantize(x, "gguf", type="Q8_0", importance=np.arange(64, dtype=np.float32))
    assert all(np.array_equal(a.components[k], b.components[k]) for k in a.components)


def test_importance_per_expert() -> None:
    """A 3-D tensor of experts takes one vector per expert, each for its own rows."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5, 256)).astype(np.float32)
    w = rng.gamma(1.0, 1.0, (3, 256)).astype(np.float32)
    q = qformat.quantize(x, "gguf", type="Q4_K", importance=w)
    for e in range(3):
        one = qformat.quantize(x[e], "gguf", type="Q4_K", importance=w[e])
        assert np.array_equal(q.dequantize()[e], one.dequantize())


def test_bad_importance_refused() -> None:
    x = np.zeros((2, 256), np.float32)
    for bad, what in ((np.ones(255), "expected 256"), (np.full(256, np.nan), "NaN"), ("heavy", "array of numbers")):
        with pytest.raises(QFormatError) as e:
            qformat.quantize(x, "gguf", type="Q4_K", importance=bad)
        assert e.value.code == "ENCODE_PARAM_INVALID" and e.value.field == "importance" and what in str(e.value)


# -- the file readers --------------------------------------------------------------------------------
def test_gguf_imatrix_values_as_llama_quantize_normalises_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    sums = rng.gamma(1.0, 50.0, (2, 64)).astype(np.float32)
    p = write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_down.weight": (sums, np.array([7.4, 0.0])),
                                         "blk.0.attn_q.weight": (sums[0], np.array([2.5]))}, datasets=("wiki.txt",), chunk_count=9)
    m = load_imatrix(p)
    assert m.format == "gguf" and m.datasets == ["wiki.txt"] and m.chunk_count == 9
    # lround(7.4) = 7, lround(2.5) = 3 (half away from zero); a zero count gives 1s
    want = np.concatenate([sums[0] / np.float32(7), np.ones(64, np.float32)])
    assert np.array_equal(m.entries["blk.0.ffn_down.weight"], want)
    assert np.array_equal(m.entries["blk.0.attn_q.weight"], sums[0] / np.float32(3))
    assert m.for_tensor("blk.0.attn_q.weight", 64) is m.entries["blk.0.attn_q.weight"]
    assert m.for_tensor("blk.0.ffn_down.weight", 64, experts=2) is not None
    assert m.for_tensor("blk.1.attn_q.weight", 64) is None


def test_legacy_imatrix_values(tmp_path: Path) -> None:
    vals = np.array([3.0, 6.0, 9.0, 1e-3], np.float32)
    p = write_dat(tmp_path / "m.dat", {"blk.0.attn_k.weight": (vals, 3), "output.weight": (vals, 0)}, chunk_count=5, dataset="d.txt")
    m = load_imatrix(p)
    assert m.format == "legacy" and m.chunk_count == 5 and m.datasets == ["d.txt"]
    assert np.array_equal(m.entries["blk.0.attn_k.weight"], vals / np.float32(3))
    assert np.array_equal(m.entries["output.weight"], vals)  # ncall 0: as stored
    m2 = load_imatrix(write_dat(tmp_path / "n.dat", {"x": (vals, 1)}, chunk_count=None))
    assert m2.chunk_count == 0 and m2.datasets == []


def _refused(path: Path, *words: str) -> QFormatError:
    with pytest.raises(QFormatError) as e:
        load_imatrix(path)
    assert e.value.code == "IMATRIX_INVALID", e.value
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return e.value


def test_bad_gguf_imatrix_files_refused(tmp_path: Path) -> None:
    s = np.ones((1, 32), np.float32)
    _refused(write_gguf(tmp_path / "a.gguf", {"t": (s, [1])}, drop=("imatrix.chunk_size",)), "imatrix.chunk_size", "requires")
    _refused(write_gguf(tmp_path / "b.gguf", {"t": (np.full((1, 32), np.inf, np.float32), [1])}), "finite")
    _refused(write_gguf(tmp_path / "c.gguf", {}), "no entries")
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "d.gguf"), arch="imatrix")
    for k, v in (("imatrix.chunk_count", 1), ("imatrix.chunk_size", 1)):
        w.add_uint32(k, v)
    w.add_array("imatrix.datasets", ["x"])
    w.add_tensor("t.in_sum2", s)
    w.add_tensor("u.in_sum2", s)
    w.add_tensor("u.counts", np.ones((1, 1), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(tmp_path / "d.gguf", "no .counts")
    raw = (tmp_path / "a.gguf").read_bytes()
    (tmp_path / "e.gguf").write_bytes(raw[:40])
    _refused(tmp_path / "e.gguf", "not a readable GGUF file")


def test_bad_legacy_files_refused(tmp_path: Path) -> None:
    good = dat_bytes({"blk.0.attn_q.weight": (np.ones(8, np.float32), 1)})
    cases = {
        "empty": (b"", "entry count"),
        "zero entries": (struct.pack("<i", 0), "entry count is 0"),
        "huge count": (struct.pack("<i", 2**31 - 1) + good[4:], "entry count"),
        "negative name": (good[:4] + struct.pack("<i", -5) + good[8:], "name length is -5"),
        "long name": (good[:4] + struct.pack("<i", 10**6) + good[8:], "name length is 1000000"),
        "huge nval": (good[:4 + 4 + 19 + 4] + struct.pack("<i", 2**30) + good[4 + 4 + 19 + 8:], "value count is 1073741824"),
        "truncated values": (good[:4 + 4 + 19 + 8 + 16], "value count is 8, expected 1 to 4"),
        "text": (b"hello, this is not an imatrix file at all", "entry count"),
    }
    for name, (data, words) in cases.items():
        p = tmp_path / f"{name}.dat"
        p.write_bytes(data)
        _refused(p, words)
    _refused(tmp_path / "missing.dat", "cannot read")


def test_legacy_counts_checked_before_anything_is_read(tmp_path: Path) -> None:
    """Counts claiming more than the file holds are refused before a read or an allocation."""
    import tracemalloc

    good = dat_bytes({"blk.0.attn_q.weight": (np.ones(8, np.float32), 1)})
    cases = {
        "entry count 2^31-1": (struct.pack("<i", 2**31 - 1) + good[4:], "entry count is 2147483647"),
        "value count 2^31-1": (good[:4 + 4 + 19 + 4] + struct.pack("<i", 2**31 - 1) + good[4 + 4 + 19 + 8:], "value count is 2147483647"),
        "name length 2^31-1": (good[:4] + struct.pack("<i", 2**31 - 1) + good[8:], "name length is 2147483647"),
        "dataset name 2^31-1": (good[:-(4 + 15)] + struct.pack("<i", 2**31 - 1) + b"x" * 15, "dataset name length is 2147483647"),
    }
    for name, (data, words) in cases.items():
        p = tmp_path / f"{name}.dat"
        p.write_bytes(data)
        tracemalloc.start()
        try:
            _refused(p, words)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, (name, peak)


_PEAK = """
import sys
from qformat.imatrix import load_imatrix
if len(sys.argv) > 1:
    m = load_imatrix(sys.argv[1])
    assert len(m.entries) == 1
with open("/proc/self/status") as f:
    print(next(line for line in f if line.startswith("VmHWM:")).split()[1])
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_legacy_file_is_read_entry_by_entry(tmp_path: Path) -> None:
    """A valid entry followed by 1 GiB the reader has no use for (sparse: no disk taken) is read
    without that GiB: the reader took the whole file into memory first (+1 GB here, and 3.9 GB
    for an entry claiming the GiB as values) before this was fixed."""
    import subprocess
    import sys

    p = write_dat(tmp_path / "m.dat", {"blk.0.attn_q.weight": (np.ones(8, np.float32), 1)})
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size + (1 << 30))

    def peak(*args: str) -> int:
        r = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(r.stdout.split()[-1]) * 1024

    base, read = peak(), peak(str(p))
    assert read - base < 64 << 20, (base >> 20, read >> 20)


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
@pytest.mark.parametrize(("value", "words"), [(np.inf, "value 5 is inf"), (np.nan, "value 5 is nan"), (-1.0, "value 5 is -1"),
                                              (1e36, "value 5 is 1e+36"), (2.0**65, "overflow binary32")])
def test_importance_values_out_of_range_name_the_entry(tmp_path: Path, fmt: str, value: float, words: str) -> None:
    v = np.ones(64, np.float32)
    v[5] = value
    name = "blk.3.ffn_down.weight"
    p = (write_gguf(tmp_path / "m.gguf", {name: (v, np.array([1.0]))}) if fmt == "gguf" else
         write_dat(tmp_path / "m.dat", {name: (v, 1)}))
    e = _refused(p, words, "expected a mean square of activations from 0 to 1.84467e+19")
    assert e.tensor == name


def test_largest_importance_value_is_taken(tmp_path: Path) -> None:
    v = np.full(64, 2.0**64, np.float32)
    assert np.array_equal(load_imatrix(write_dat(tmp_path / "m.dat", {"t": (v, 1)})).entries["t"], v)


def test_gguf_imatrix_tensors_may_not_share_bytes(tmp_path: Path) -> None:
    """Two entries' tensors naming the same bytes (a small file claiming much more): refused by
    the GGUF reader, as an IMATRIX_INVALID."""
    p = write_gguf(tmp_path / "m.gguf", {"a": (np.ones(64, np.float32), np.array([1.0])), "b": (np.ones(64, np.float32), np.array([1.0]))})
    from .gguf_hostile import read_parts, to_bytes

    parts = read_parts(p)
    for t in parts.tensors:
        t.data = b""
    raw = bytearray(to_bytes(parts))  # every tensor at offset 0, claiming its full size over no data
    raw += bytes(1024)
    (tmp_path / "n.gguf").write_bytes(bytes(raw))
    _refused(tmp_path / "n.gguf", "overlaps tensor", "not a readable GGUF file")


# -- presets and checkpoints ------------------------------------------------------------------------
def test_presets_take_the_imatrix_branches() -> None:
    shapes = _llama_shapes(16, 256, 128, 512, 64)
    cfg = dict(LLAMA3_8B, num_hidden_layers=16)
    names = gguf_presets.gguf_names(list(shapes), cfg)
    for preset, legacy in (("Q4_0", "Q4_1"), ("Q5_0", "Q5_1")):
        plain = gguf_presets.resolve(preset, shapes, cfg, names)
        with_im = gguf_presets.resolve(preset, shapes, cfg, names, has_imatrix=True)
        down = [with_im.types[f"model.layers.{i}.mlp.down_proj.weight"] for i in range(16)]
        assert down == [legacy] * 2 + [preset] * 14  # llama.cpp: the first n_layer / 8 ffn_down
        assert {k: v for k, v in with_im.types.items() if "down_proj" not in k} == {k: v for k, v in plain.types.items() if "down_proj" not in k}
    r = gguf_presets.resolve("Q2_K_S", shapes, cfg, names, has_imatrix=True)
    assert r.types["model.layers.0.mlp.down_proj.weight"] == "Q4_K" and r.types["model.layers.2.mlp.down_proj.weight"] == "Q2_K"
    assert r.types["model.layers.0.self_attn.v_proj.weight"] == "Q4_K"  # 32 / 8 heads: GQA 4
    assert r.types["lm_head.weight"] == "Q6_K"
    assert "model.layers.3.self_attn.q_proj.weight" in r.needs_imatrix and "lm_head.weight" not in r.needs_imatrix
    assert "model.embed_tokens.weight" not in r.needs_imatrix and "model.layers.0.mlp.down_proj.weight" not in r.needs_imatrix


def _llama_folder(tmp_path: Path, layers: int = 2) -> tuple[Path, dict, dict[str, np.ndarray]]:
    from safetensors.numpy import save_file

    cfg = {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
           "intermediate_size": 512, "vocab_size": 64, "architectures": ["LlamaForCausalLM"]}
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    ts = {n: rng.standard_normal(s).astype(np.float32) for n, s in _llama_shapes(layers, 256, 128, 512, 64).items()}
    save_file(ts, str(src / "model.safetensors"))
    return src, cfg, ts


def _imatrix_for(ts: dict[str, np.ndarray], cfg: dict, skip: tuple[str, ...] = ()) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    names = gguf_presets.gguf_names(list(ts), cfg)
    return {g: (rng.gamma(1.0, 30.0, ts[n].shape[-1]).astype(np.float32), np.array([6.0]))
            for n, g in names.items() if g and ts[n].ndim == 2 and g != "token_embd.weight" and g not in skip}


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_quantize_checkpoint_applies_the_imatrix(tmp_path: Path, fmt: str) -> None:
    """``qformat quantize --preset Q4_0 --imatrix``: every tensor with an entry is quantized with
    its vector (sums / count, computed here), the first ffn_down takes Q4_1, config.json records
    the file."""
    from safetensors.numpy import load_file

    from qformat.cli import main

    src, cfg, ts = _llama_folder(tmp_path, layers=8)
    entries = _imatrix_for(ts, cfg)
    if fmt == "gguf":
        im = write_gguf(tmp_path / "imatrix.gguf", entries, chunk_count=3)
    else:  # legacy: values stored as sum / count * ncall
        im = write_dat(tmp_path / "imatrix.dat", {g: (s / c[0] * 2, 2) for g, (s, c) in entries.items()}, chunk_count=3)
    assert main(["quantize", str(src), str(tmp_path / "dst"), "--preset", "Q4_0", "--imatrix", str(im), "--quiet"]) == 0
    qc = json.loads((tmp_path / "dst" / "config.json").read_text())["quantization_config"]
    assert qc["imatrix"] == {"file": im.name, "format": "gguf" if fmt == "gguf" else "legacy", "entries": len(entries), "chunks": 3,
                             "datasets": ["calibration.txt"], "applied": len(entries)}
    got = qformat.load_file(str(tmp_path / "dst" / "model.safetensors"))
    plain = load_file(str(src / "model.safetensors"))
    names = gguf_presets.gguf_names(list(ts), cfg)
    types = gguf_presets.resolve("Q4_0", {n: a.shape for n, a in ts.items()}, cfg, names, has_imatrix=True).types
    assert types["model.layers.0.mlp.down_proj.weight"] == "Q4_1" and types["model.layers.1.mlp.down_proj.weight"] == "Q4_0"
    differs = 0
    for n, t in types.items():
        g = names[n]
        w = None
        if g in entries:
            s, c = entries[g]
            w = s / np.float32(6) if fmt == "gguf" else (s / c[0] * 2).astype(np.float32) / np.float32(2)
        ref = qformat.quantize(plain[n], "gguf", type=t, importance=w).dequantize()
        assert np.array_equal(got[n], ref), n
        differs += w is not None and not np.array_equal(ref, qformat.quantize(plain[n], "gguf", type=t).dequantize())
    assert differs == len(entries)


def test_imatrix_refusals(tmp_path: Path) -> None:
    from qformat.checkpoint.quantize import quantize_checkpoint

    src, cfg, ts = _llama_folder(tmp_path)
    entries = _imatrix_for(ts, cfg, skip=("blk.1.attn_q.weight",))
    im = write_gguf(tmp_path / "imatrix.gguf", entries)
    with pytest.raises(QFormatError) as e:  # Q2_K_S: a Q2_K tensor without an entry
        quantize_checkpoint(src, tmp_path / "a", preset="Q2_K_S", imatrix=im)
    assert e.value.code == "IMATRIX_INVALID" and "blk.1.attn_q.weight" in str(e.value)
    with pytest.raises(QFormatError) as e:  # an importance matrix does nothing for other schemes
        quantize_checkpoint(src, tmp_path / "b", scheme="int", imatrix=im)
    assert e.value.code == "ENCODE_PARAM_INVALID" and "gguf" in str(e.value)
    short = dict(entries, **{"blk.0.attn_q.weight": (np.ones(128, np.float32), np.array([1.0]))})
    with pytest.raises(QFormatError) as e:  # made for another model
        quantize_checkpoint(src, tmp_path / "c", preset="Q4_K_M", imatrix=write_gguf(tmp_path / "short.gguf", short))
    assert e.value.code == "IMATRIX_INVALID" and "128 values, expected 256" in str(e.value)
    assert not any((tmp_path / d).exists() for d in "abc")
    # Q2_K_S with every entry present
    full = write_gguf(tmp_path / "full.gguf", _imatrix_for(ts, cfg))
    s = quantize_checkpoint(src, tmp_path / "d", preset="Q2_K_S", imatrix=full)
    assert s.quantized_tensors == 16


@pytest.mark.parametrize("preset", ["Q4_K_M", "Q4_0"])
def test_overflowing_importance_is_blamed_on_the_imatrix(tmp_path: Path, preset: str) -> None:
    """Importance values that make ggml's weighted quantizers overflow (1e36 for ordinary
    weights) are the importance matrix's fault, named by entry: before, quantize refused the
    weights (ENCODE_INPUT_INVALID, "its values are too large") and named no tensor."""
    from qformat.checkpoint.quantize import quantize_checkpoint

    src, cfg, ts = _llama_folder(tmp_path)
    entries = _imatrix_for(ts, cfg)
    s, _ = entries["blk.0.attn_q.weight"]
    s = s.copy()
    s[5] = 1e36
    entries["blk.0.attn_q.weight"] = (s, np.array([1.0]))
    with pytest.raises(QFormatError) as e:
        quantize_checkpoint(src, tmp_path / "o", preset=preset, imatrix=write_gguf(tmp_path / "im.gguf", entries))
    assert e.value.code == "IMATRIX_INVALID" and e.value.tensor == "blk.0.attn_q.weight" and "1e+36" in str(e.value)
    assert not (tmp_path / "o").exists()


def test_cli_imatrix_errors_are_coded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from qformat.cli import main

    src, _, _ = _llama_folder(tmp_path)
    (tmp_path / "junk.dat").write_bytes(b"\x01\x00\x00\x00\xff\xff\xff\x7f")
    assert main(["quantize", str(src), str(tmp_path / "o"), "--preset", "Q4_K_M", "--imatrix", str(tmp_path / "junk.dat")]) != 0
    err = capsys.readouterr().err
    assert "IMATRIX_INVALID" in err and "Traceback" not in err


def test_weights_that_overflow_are_named(tmp_path: Path) -> None:
    """Weights too large for a type's F16 block scales are the weights' fault (ENCODE_INPUT_INVALID),
    and the refusal names the tensor (before, the encoder's message named none)."""
    from safetensors.numpy import save_file

    from qformat.checkpoint.quantize import quantize_checkpoint

    src = tmp_path / "src"
    src.mkdir()
    name = "model.layers.0.mlp.up_proj.weight"
    save_file({name: (np.random.default_rng(0).standard_normal((8, 256)) * 1e6).astype(np.float32)}, str(src / "model.safetensors"))
    (tmp_path / "r.toml").write_text('[[rules]]\nglob = "*"\nscheme = "gguf"\ntype = "Q4_0"\n')
    with pytest.raises(QFormatError) as e:
        quantize_checkpoint(src, tmp_path / "o", recipe=tmp_path / "r.toml")
    assert e.value.code == "ENCODE_INPUT_INVALID" and e.value.tensor == name
    assert not (tmp_path / "o").exists()


def test_an_encoder_failure_only_with_the_importance_is_the_imatrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the weighted quantizer refuses and the same weights encode without the importance
    vector, the refusal is IMATRIX_INVALID naming the tensor.  (In-range importance values have not
    been seen to do this with ggml's quantizers, so the weighted encoder's refusal is simulated.)"""
    import qformat.schemes as schemes_mod
    from qformat.checkpoint.quantize import quantize_checkpoint
    from qformat.errors import error

    real = schemes_mod.quantize

    def weighted_fails(x, scheme, **kw):
        if "importance" in kw:
            raise error("ENCODE_INPUT_INVALID", "simulated overflow of the weighted quantizer")
        return real(x, scheme, **kw)

    monkeypatch.setattr(schemes_mod, "quantize", weighted_fails)
    src, cfg, ts = _llama_folder(tmp_path)
    with pytest.raises(QFormatError) as e:
        quantize_checkpoint(src, tmp_path / "o", preset="Q4_0", imatrix=write_gguf(tmp_path / "im.gguf", _imatrix_for(ts, cfg)))
    assert e.value.code == "IMATRIX_INVALID" and e.value.tensor in ts and "simulated overflow" in str(e.value)
    assert not (tmp_path / "o").exists()
