"""QLinear's fast forward path (issue 45 item 6): the native call with its arguments bound once
(``kernels.Prepared.run``) and forward's per-call checks reduced to a record made when the kernel
is selected.  It must give what the path's own ``forward`` gives, bit for bit, and must follow
everything the full checks followed: the process policy, the layer's own policy, replaced or
reloaded buffers, inputs that need a gradient, other dtypes and shapes."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import qformat  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.nn import QLinear, quantize_model  # noqa: E402

N, K = 96, 256


@pytest.fixture(autouse=True)
def _reader_ops_path():
    """Overrides the readers' conftest fixture (which keeps decodes off the native kernels): the
    fast path is the native kernels' (qformat's own matmul included)."""
    from qformat import kernels as qk

    with qk.use("auto"):
        yield

SCHEMES = [
    ("int4 g32", "int", {"bits": 4, "group_size": 32, "scale_dtype": "bfloat16"}),
    ("int8", "int", {"bits": 8, "group_size": None, "scale_dtype": "bfloat16"}),
    ("int4 asym", "int", {"bits": 4, "group_size": 32, "symmetric": False, "scale_dtype": "bfloat16"}),
    ("nf4", "nf4", {}),
    ("mxfp4", "mxfp4", {}),
    ("fp8", "fp8_e4m3", {}),
]


def _w(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((N, K)) * 0.02).astype(np.float32)


def _layer(scheme: str, params: dict, seed: int = 0, bias: bool = True, **kw) -> QLinear:
    b = torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16) if bias else None
    m = QLinear(qformat.quantize(_w(seed), scheme, **params), b, **kw)
    if m.kernel_path == "decode":
        pytest.skip(f"no native kernel for {scheme} {params} here")
    return m


def _reference(m: QLinear, x: torch.Tensor) -> torch.Tensor:
    """The path's own forward (the per-call code the fast path replaces), plus the bias."""
    p = m._prepared
    y = p.path.forward(p, x.reshape(-1, K).contiguous()).reshape(x.shape[:-1] + (N,))
    return y if m.bias is None else y.add_(m.bias.to(x.dtype))  # as QLinear._forward adds it


def _decoded(m: QLinear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, m.dequantize_weight().to(x.dtype), None if m.bias is None else m.bias.to(x.dtype))


def _x(*shape: int, dtype=torch.bfloat16, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("sid,scheme,params", SCHEMES, ids=[s[0] for s in SCHEMES])
@pytest.mark.parametrize("bias", [True, False])
def test_fast_path_equals_the_paths_forward(sid, scheme, params, bias):
    m = _layer(scheme, params, bias=bias)
    xs = [_x(1, 1, K), _x(1, K, seed=2), _x(2, 3, K, seed=3), _x(3, K, 2, seed=4).transpose(1, 2),  # not contiguous
          _x(1, 1, K, dtype=torch.float32, seed=5), _x(1, 1, K, dtype=torch.float16, seed=6)]
    with torch.inference_mode():
        for x in xs:
            if x.dtype not in m._prepared.path.dtypes:
                continue
            assert m._fast is not None
            y = m(x)
            assert y.shape == x.shape[:-1] + (N,) and y.dtype == x.dtype
            assert torch.equal(y, _reference(m, x)), (sid, x.shape, x.dtype)
    # outside inference mode too (no_grad, as generate runs)
    with torch.no_grad():
        x = _x(1, 1, K, seed=7)
        assert torch.equal(m(x), _reference(m, x))


def test_fast_path_follows_the_process_policy():
    m = _layer(*SCHEMES[0][1:])
    x = _x(1, 1, K)
    native = m(x)
    assert torch.equal(native, _reference(m, x))
    try:
        kernels.set_kernel_policy("decode")
        assert torch.equal(m(x), _decoded(m, x))  # no other call in between: forward itself re-selects
        assert m.kernel_path == "decode"
    finally:
        kernels.set_kernel_policy("auto")
    assert torch.equal(m(x), native)
    # set and set back without a forward between: the same kernel, the fast path again
    kernels.set_kernel_policy("decode")
    kernels.set_kernel_policy("auto")
    assert torch.equal(m(x), native) and m._fast is not None


def test_fast_path_follows_the_layers_own_policy():
    m = _layer(*SCHEMES[0][1:])
    x = _x(1, 1, K)
    native = m(x)
    m.kernel = "decode"
    assert torch.equal(m(x), _decoded(m, x)) and m.kernel_path == "decode"
    m.kernel = None
    assert torch.equal(m(x), native)


def test_fast_path_follows_new_buffers():
    sid, scheme, params = SCHEMES[0]
    m = _layer(scheme, params, seed=0)
    other = _layer(scheme, params, seed=3)
    x = _x(1, 1, K)
    m(x)
    # load_state_dict writes the buffers in place (same pointers): the post-load hook re-selects
    m.load_state_dict(other.state_dict())
    assert torch.equal(m(x), other(x))
    # a buffer replaced by assignment: another data pointer
    m2 = _layer(scheme, params, seed=0)
    m2(x)
    for b, _ in m2._components.values():
        setattr(m2, b, getattr(other, b).clone())
    m2.bias = torch.nn.Parameter(other.bias.clone(), requires_grad=False)
    assert torch.equal(m2(x), other(x))


def test_input_that_needs_a_gradient_takes_the_decode_path():
    m = _layer(*SCHEMES[0][1:])
    x = _x(1, 1, K).requires_grad_(True)
    y = m(x)
    assert torch.equal(y.detach(), _decoded(m, x.detach()))
    y.float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_wrong_width_still_raises():
    m = _layer(*SCHEMES[0][1:])
    with pytest.raises(RuntimeError):
        m(_x(1, 1, K + 32))


def test_deepcopy_after_use_runs_its_own_tensors():
    m = _layer(*SCHEMES[0][1:])
    x = _x(1, 1, K)
    y = m(x)
    m2 = copy.deepcopy(m)
    assert torch.equal(m2(x), y)
    # the copy's kernel reads the copy's tensors: the original's changed in place do not move it
    m.load_state_dict(_layer(*SCHEMES[0][1:], seed=3).state_dict())
    assert not torch.equal(m(x), y)
    assert torch.equal(m2(x), y)


def _steps(model, policy: str, steps: int = 3) -> list[torch.Tensor]:
    kernels.set_kernel_policy(policy)
    try:
        prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))
        out = []
        with torch.inference_mode():
            o = model(prompt, use_cache=True)
            out.append(o.logits.clone())
            cache, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                o = model(tok, past_key_values=cache, use_cache=True)
                out.append(o.logits.clone())
                cache, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        return out
    finally:
        kernels.set_kernel_policy("auto")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' rename of past_key_values
@pytest.mark.parametrize("policy", ["auto", "decode"])
@pytest.mark.parametrize("sid,scheme,params", [SCHEMES[0], SCHEMES[3]], ids=[SCHEMES[0][0], SCHEMES[3][0]])
def test_decoding_logits_equal_those_of_the_per_call_path(monkeypatch, policy, sid, scheme, params):
    """A tiny Llama's logits over a prompt and a few one-token steps: with the fast path, and with
    every layer on the path's own per-call forward (no fast record, ``Prepared.run`` the plain
    ``path.forward``): equal, under both policies."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, num_hidden_layers=2, intermediate_size=256, vocab_size=256,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    quantize_model(model, scheme, min_numel=4096, **params)
    layers = [m for m in model.modules() if isinstance(m, QLinear)]
    assert layers
    fast = _steps(model, policy)
    if policy == "auto":
        assert all(m._fast is not None for m in layers)
    monkeypatch.setattr(QLinear, "_make_fast", lambda self: None)
    monkeypatch.setattr(kernels.Prepared, "run", property(lambda p: functools.partial(p.path.forward, p)))
    for m in layers:
        m._fast = None
    slow = _steps(model, policy)
    assert all(m._fast is None for m in layers)
    assert len(fast) == len(slow) and all(torch.equal(a, b) for a, b in zip(fast, slow))
