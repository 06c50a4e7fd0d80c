"""QLinear, quantize_model / save_model / load_model, and tensor-parallel shard bounds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
from torch import nn  # noqa: E402

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402
from qformat_torch.dtypes import torch_to_numpy  # noqa: E402

from ..backends import same_bits  # noqa: E402


def mlp(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 96, bias=False), nn.Linear(96, 8)).to(dtype)


@pytest.mark.parametrize("scheme,params", [("int", {"bits": 4, "group_size": 32}), ("nf4", {"double_quant": True}),
                                           ("fp8_e4m3", {}), ("mxfp4", {}), ("nvfp4", {})])
def test_quantize_save_load_roundtrip(tmp_path, scheme, params):
    model = qt.quantize_model(mlp(), scheme, min_numel=4096, **params)
    assert isinstance(model[0], qt.QLinear) and isinstance(model[3], qt.QLinear)
    assert type(model[4]) is nn.Linear  # 96 * 8 < 4096 stays plain
    ref = qformat.quantize(torch_to_numpy(mlp()[0].weight), scheme, **params).dequantize()
    assert same_bits(torch_to_numpy(model[0].dequantize_weight()), ref)
    x = torch.randn(5, 64)
    want = model(x)
    path = tmp_path / "m.safetensors"
    qt.save_model(model, path)
    assert qformat.check(path).ok
    with qt.safe_open(path) as f:
        assert f.is_quantized("0.weight") and f.is_quantized("3.weight") and not f.is_quantized("0.bias")
        assert not f.is_quantized("4.weight")
    fresh = qt.load_model(mlp(), path)
    assert isinstance(fresh[0], qt.QLinear) and fresh[3].bias is None
    assert torch.equal(fresh(x), want)
    assert fresh[0].packed_nbytes < 64 * 128 * 4 / 3


def test_qlinear_forward_is_linear_with_the_decoded_weight():
    lin = nn.Linear(256, 32)
    q = qt.QLinear.from_linear(lin, "int", bits=3, group_size=64)
    x = torch.randn(3, 7, 256)
    assert torch.equal(q(x), nn.functional.linear(x, q.weight, lin.bias))
    assert "scheme=int" in repr(q)


def test_dtype_casts_leave_packed_buffers_alone():
    model = qt.quantize_model(mlp(), "fp8_e4m3", min_numel=4096)
    before = torch_to_numpy(model[0].dequantize_weight())
    assert all(not b.is_floating_point() for b in model[0].buffers())
    model = model.to(torch.bfloat16)
    assert same_bits(torch_to_numpy(model[0].dequantize_weight()), before)  # fp8 codes, f32 scales intact
    assert model(torch.randn(2, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_bfloat16_model_keeps_its_logical_dtype(tmp_path):
    model = qt.quantize_model(mlp(torch.bfloat16), "nf4", min_numel=4096)
    assert model[0].descriptor["dtype"] == "bfloat16" and model[0].weight.dtype == torch.bfloat16
    path = tmp_path / "b.safetensors"
    qt.save_model(model, path)
    fresh = qt.load_model(mlp(torch.bfloat16), path)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), model(x))


def _snapshot(model: nn.Module) -> tuple[list[type], dict[str, torch.Tensor]]:
    return [type(m) for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: tuple[list[type], dict[str, torch.Tensor]]) -> bool:
    types, state = _snapshot(model)
    return types == before[0] and state.keys() == before[1].keys() and all(torch.equal(state[k], before[1][k]) for k in state)


@pytest.fixture
def saved_mlp(tmp_path):
    """mlp() with its first two Linears quantized (int8 per channel), saved by save_model."""
    path = tmp_path / "m.safetensors"
    qt.save_model(qt.quantize_model(mlp(), "int", bits=8, group_size=None), path)
    return path


@pytest.mark.parametrize("into_quantized", [False, True])
def test_load_model_selects_each_new_kernel_once(saved_mlp, monkeypatch, into_quantized):
    """Each QLinear load_model builds picks (and repacks) its kernel path once: loading the plain
    tensors after building them would run every QLinear's post-load hook, a second repack."""
    target = qt.quantize_model(mlp(), "int", bits=8, group_size=None) if into_quantized else mlp()
    calls: list[qt.QLinear] = []  # the modules themselves (an id could be reused by a new one)
    real = qt.QLinear._select_kernel
    monkeypatch.setattr(qt.QLinear, "_select_kernel", lambda self: (calls.append(self), real(self))[1])
    fresh = qt.load_model(target, saved_mlp)
    new = [m for m in fresh.modules() if isinstance(m, qt.QLinear)]
    assert len(new) == 2 and [sum(c is m for c in calls) for m in new] == [1, 1]
    x = torch.randn(3, 64)
    assert torch.equal(fresh(x), qt.load_model(mlp(), saved_mlp)(x))
    assert fresh[0].bias is not None and torch.equal(fresh[0].bias, mlp()[0].bias)

@pytest.mark.parametrize("case", ["extra-layer", "fewer-layers", "renamed"])
def test_load_model_strict_names_both_sides_and_touches_nothing(saved_mlp, case):
    def make() -> nn.Module:
        torch.manual_seed(1)
        return {"extra-layer": lambda: nn.Sequential(*mlp(), nn.Linear(8, 8)),
                "fewer-layers": lambda: nn.Sequential(*list(mlp())[:4]),
                "renamed": lambda: nn.ModuleDict({"net": mlp()})}[case]()

    model = make()
    before = _snapshot(model)
    with pytest.raises(qformat.QFormatError) as e:
        qt.load_model(model, saved_mlp)
    assert e.value.code == "LOAD_MISMATCH" and _unchanged(model, before)
    msg = str(e.value)
    # torch's own comparison of the same names (the decoded file into the plain model) is the oracle
    want = make().load_state_dict(qt.load_file(saved_mlp), strict=False)
    assert want.unexpected_keys or want.missing_keys
    # checkpoint names in sorted order (load_file returns them in the file's data order), model names in the model's
    for n, names, side in ((len(want.unexpected_keys), sorted(want.unexpected_keys), "checkpoint tensor"),
                           (len(want.missing_keys), want.missing_keys, "model tensor")):
        if n:
            shown = ", ".join(names[:5]) + (f", ... ({n - 5} more)" if n > 5 else "")
            assert f"{n} {side}{'s' if n > 1 else ''} " in msg and shown in msg, (shown, msg)
        else:
            assert side not in msg
    assert e.value.tensor == (sorted(want.unexpected_keys) or want.missing_keys)[0]
    assert "strict=False" in msg


def test_load_model_not_strict_loads_what_matches(saved_mlp):
    loose = qt.load_model(nn.Sequential(*mlp(), nn.Linear(8, 8)), saved_mlp, strict=False)
    assert isinstance(loose[0], qt.QLinear) and isinstance(loose[3], qt.QLinear)
    ref = qt.load_model(mlp(), saved_mlp)
    x = torch.randn(3, 64)
    assert torch.equal(loose[:5](x), ref(x))


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("case", ["quantized-linear", "plain-norm"])
def test_load_model_shape_mismatch_is_load_mismatch(saved_mlp, case, strict):
    """A shape that differs is refused with or without strict (torch's load_state_dict refuses a
    size mismatch even with strict=False), before anything changes."""
    torch.manual_seed(2)
    if case == "quantized-linear":  # the file's 0.weight is [128, 64] (quantized), 0.bias [128]
        model = nn.Sequential(nn.Linear(64, 100), nn.LayerNorm(100), nn.GELU(), nn.Linear(100, 96, bias=False), nn.Linear(96, 8))
        shown = ["0.bias (checkpoint [128], model [100])", "0.weight for Linear 0 (checkpoint [128, 64], model [100, 64])",
                 "1.bias (checkpoint [128], model [100])", "1.weight (checkpoint [128], model [100])",
                 "3.weight for Linear 3 (checkpoint [96, 128], model [96, 100])"]
    else:
        model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128, bias=False), nn.GELU(), nn.Linear(128, 96, bias=False),
                              nn.Linear(96, 8))
        model[1].weight = nn.Parameter(torch.ones(1, 128))
        shown = ["1.weight (checkpoint [128], model [1, 128])"]
    before = _snapshot(model)
    with pytest.raises(qformat.QFormatError) as e:
        qt.load_model(model, saved_mlp, strict=strict)
    assert e.value.code == "LOAD_MISMATCH" and e.value.tensor == shown[0].split()[0]
    assert f"{len(shown)} checkpoint tensor" in str(e.value) and all(s in str(e.value) for s in shown)
    assert "not in the checkpoint" not in str(e.value)  # an entry of the wrong shape is not also missing
    if strict and case == "plain-norm":  # the file's 1.bias has no place in a LayerNorm without bias
        assert "1 checkpoint tensor has no place in the model: 1.bias" in str(e.value)
    assert _unchanged(model, before)


def test_load_model_tied_parameters_count_as_filled(tmp_path):
    """A parameter shared by two modules is filled when the file holds it under either name
    (transformers' save_pretrained keeps one of them)."""
    def tied() -> nn.Module:
        torch.manual_seed(3)
        m = nn.ModuleDict({"emb": nn.Embedding(300, 64), "body": nn.Linear(64, 64), "head": nn.Linear(64, 300, bias=False)})
        m["head"].weight = m["emb"].weight
        return m

    src = tied()
    path = tmp_path / "t.safetensors"
    q = qformat.quantize(torch_to_numpy(src["body"].weight.detach()), "int", bits=4, group_size=32)
    qt.save_file({"emb.weight": src["emb"].weight, "body.weight": q, "body.bias": src["body"].bias}, path)
    model = qt.load_model(tied(), path)
    assert torch.equal(model["head"].weight, src["emb"].weight) and model["head"].weight is model["emb"].weight
    assert isinstance(model["body"], qt.QLinear)


def test_load_plain_quantized_non_linear_decodes_into_the_parameter(tmp_path):
    emb = nn.Embedding(300, 32)
    path = tmp_path / "e.safetensors"
    q = qformat.quantize(torch_to_numpy(emb.weight.detach()), "int", bits=8, group_size=None)
    qt.save_file({"weight": q}, path)
    fresh = qt.load_model(nn.Embedding(300, 32), path)
    assert same_bits(torch_to_numpy(fresh.weight.detach()), q.dequantize())


# -- tensor-parallel bounds ---------------------------------------------------------------
def _cover(shape, dim, world, descriptor=None):
    bounds = [qt.shard_bounds(shape, dim, r, world, descriptor=descriptor) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == shape[dim]
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    return bounds


def test_shard_bounds_are_block_aligned_where_possible():
    w = np.random.default_rng(0).standard_normal((96, 320)).astype(np.float32)
    g32 = qformat.quantize(w, "int", bits=4, group_size=32)
    assert qt.shard_period(g32, 1) == 32 and qt.shard_period(g32, 0) == 1
    b1 = _cover((96, 320), 1, 4, g32)
    assert all(lo % 32 == 0 for lo, _ in b1) and [hi - lo for lo, hi in b1] == [96, 96, 64, 64]
    assert _cover((96, 320), 0, 4, g32) == [(0, 24), (24, 48), (48, 72), (72, 96)]
    nf4 = qformat.quantize(w, "nf4")  # flat blocks of 64 over rows of 320: cut rows at multiples of 1
    assert qt.shard_period(nf4, 0) == 1 and qt.shard_period(nf4, 1) is None
    assert _cover((96, 320), 1, 4, nf4) == [(0, 80), (80, 160), (160, 240), (240, 320)]  # element split
    assert _cover((10,), 0, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(qformat.QFormatError):
        qt.shard_bounds((4, 4), 2, 0, 2)


@pytest.mark.parametrize("dim", [0, 1])
def test_get_shard_decodes_and_packs_just_that_part(tmp_path, dim):
    w = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    q = qformat.quantize(w, "int", bits=4, group_size=32)
    path = tmp_path / "w.safetensors"
    qt.save_file({"w": q}, path)
    full = q.dequantize()
    with qt.safe_open(path) as f:
        for rank in range(3):
            lo, hi = qt.shard_bounds((64, 256), dim, rank, 3, descriptor=f.descriptor("w"))
            key = (slice(lo, hi), slice(None)) if dim == 0 else (slice(None), slice(lo, hi))
            assert same_bits(torch_to_numpy(f.get_shard("w", dim, rank, 3)), full[key])
            packed = f.get_shard("w", dim, rank, 3, packed=True)
            assert isinstance(packed, qt.TorchQTensor) and tuple(packed.shape) == full[key].shape
            assert same_bits(torch_to_numpy(packed.dequantize()), full[key])
            assert packed.nbytes < q.nbytes
