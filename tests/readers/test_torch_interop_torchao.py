"""torchao tensors <-> qformat: the qformat decode equals torchao's own dequantize bit for bit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchao_q = pytest.importorskip("torchao.quantization")

import numpy as np  # noqa: E402
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig, Int8WeightOnlyConfig, IntxWeightOnlyConfig, MappingType, PerAxis, PerGroup, PerTensor, quantize_,
    to_nf4,
)

import qformat  # noqa: E402
import qformat_torch as qt  # noqa: E402
from qformat_torch import interop_torchao as ita  # noqa: E402
from qformat_torch.dtypes import torch_to_numpy  # noqa: E402

from ..backends import same_bits  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared machine torch's OpenMP threads only contend."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def check_file(tmp_path, q: qformat.QTensor) -> None:
    path = tmp_path / "t.safetensors"
    qt.save_file({"w": q}, path)
    rep = qformat.check(path)
    assert rep.ok, [p.to_dict() for p in rep.problems]
    assert same_bits(torch_to_numpy(qt.load_file(path)["w"]), q.dequantize())


@pytest.mark.parametrize("dtype", DTYPES)
def test_nf4tensor_decodes_bit_for_bit(tmp_path, dtype):
    torch.manual_seed(0)
    for shape, bs, sbs in [((64, 512), 64, 256), ((32, 256), 32, 128), ((16384,), 64, 256)]:
        t = to_nf4((torch.randn(shape) * 0.05).to(dtype), bs, sbs)
        want = torch_to_numpy(t.get_original_weight())
        q = ita.from_nf4(t)
        assert q.descriptor["scale"]["encoded"]["dtype"] == qt.dtypes.TORCH_LOGICAL[dtype]
        assert same_bits(q.dequantize(), want)
        assert same_bits(torch_to_numpy(qt.TorchQTensor.from_qtensor(q).dequantize()), want)
        back = ita.to_nf4(q)
        assert same_bits(torch_to_numpy(back.get_original_weight()), want)
        assert torch.equal(back.quantized_data, t.quantized_data) and torch.equal(back.quantized_scalers, t.quantized_scalers)
    check_file(tmp_path, q)


def test_nf4tensor_table_differs_from_the_named_nf4():
    """torchao's table is rounded to 4 decimals (and stored in the dtype), so it travels as a
    table tensor: decoding with qformat's named 'nf4' table would differ."""
    t = to_nf4(torch.randn(64, 256, dtype=torch.bfloat16))
    q = ita.from_nf4(t)
    named = np.asarray(qformat.tables.codebook_values("nf4"), np.float32)
    assert not np.array_equal(q.components["nf4"].astype(np.float32), named)


CONFIGS = [
    ("int8", lambda: Int8WeightOnlyConfig(), ita.to_int8),
    ("intx4_g32", lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)), ita.to_intx),
    ("intx4_g32_asym", lambda: IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32), mapping_type=MappingType.ASYMMETRIC), ita.to_intx),
    ("intx2_channel", lambda: IntxWeightOnlyConfig(weight_dtype=torch.int2, granularity=PerAxis(0)), ita.to_intx),
    ("intx8_g64", lambda: IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerGroup(64)), ita.to_intx),
    ("fp8_e4m3_row", lambda: Float8WeightOnlyConfig(), ita.to_float8),
    ("fp8_e5m2_row", lambda: Float8WeightOnlyConfig(weight_dtype=torch.float8_e5m2), ita.to_float8),
    ("fp8_e4m3_tensor", lambda: Float8WeightOnlyConfig(granularity=PerTensor()), ita.to_float8),
]


@pytest.mark.parametrize("name,config,convert", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_configs_decode_bit_for_bit(tmp_path, name, config, convert, dtype):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(256, 48)).to(dtype)
    quantize_(m, config())
    t = m[0].weight
    want = torch_to_numpy(t.dequantize())
    q = ita.from_torchao(t)
    assert same_bits(q.dequantize(), want)
    assert same_bits(torch_to_numpy(qt.TorchQTensor.from_qtensor(q).dequantize()), want)
    back = convert(q)
    assert type(back) is type(t)
    assert same_bits(torch_to_numpy(back.dequantize()), want)
    if dtype == torch.bfloat16:
        check_file(tmp_path, q)


@pytest.mark.parametrize("scheme,params,convert", [
    ("int", {"bits": 8, "group_size": None}, ita.to_int8),
    ("int", {"bits": 8, "group_size": None, "symmetric": False, "dtype": "bfloat16"}, ita.to_int8),
    ("int", {"bits": 4, "group_size": 32, "symmetric": False}, ita.to_intx),
    ("int", {"bits": 3, "group_size": 64, "scale_dtype": "bfloat16", "dtype": "bfloat16"}, ita.to_intx),
    ("fp8_e4m3", {"granularity": "block", "block_size": [32, 64]}, ita.to_float8),
    ("fp8_e5m2", {"granularity": "tensor", "dtype": "float16"}, ita.to_float8),
    ("mxfp8_e4m3", {}, ita.to_float8),  # E8M0 scales widen exactly to torchao's float32 scales
])
def test_qformat_schemes_to_torchao(scheme, params, convert):
    x = np.random.default_rng(4).standard_normal((64, 256)).astype(np.float32)
    q = qformat.quantize(x, scheme, **params)
    t = convert(q)
    assert same_bits(torch_to_numpy(t.dequantize()), q.dequantize())
    assert same_bits(ita.from_torchao(t).dequantize(), q.dequantize())


def test_conversions_refuse_other_arithmetic():
    x = np.random.default_rng(5).standard_normal((64, 256)).astype(np.float32)
    cases = [(ita.to_nf4, qformat.quantize(x, "nf4")), (ita.to_int8, qformat.quantize(x, "int", bits=4)),
             (ita.to_intx, qformat.quantize(x, "mxint8")), (ita.to_float8, qformat.quantize(x, "mxfp4")),
             (ita.to_intx, qformat.quantize(x[:, :250], "int", bits=4, group_size=32))]
    for fn, q in cases:
        with pytest.raises(qformat.QFormatError) as e:
            fn(q)
        assert e.value.code == "FEATURE_UNSUPPORTED"


def test_int4_weight_only_needs_cuda_kernels():
    """Int4WeightOnlyConfig (Int4Tensor, the preshuffled and tile-packed layouts) quantizes and
    dequantizes only through mslk / CUDA kernels: no CPU oracle, so no conversion is offered."""
    from torchao.quantization import Int4WeightOnlyConfig

    m = torch.nn.Sequential(torch.nn.Linear(128, 64)).to(torch.bfloat16)
    with pytest.raises((ImportError, AssertionError, NotImplementedError, RuntimeError)):
        quantize_(m, Int4WeightOnlyConfig(group_size=32))
