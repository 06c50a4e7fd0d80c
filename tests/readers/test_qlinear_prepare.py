"""QLinear's kernel preparation (issue 42 item 6): ``kernel_path`` follows the kernel policy in
force (it went stale when the policy changed without a forward), and a layer built with
``prepare=False`` (what ``from_pretrained`` through qformat.transformers builds) prepares at its
first use, to the same path and the same outputs as one prepared at construction."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import qformat  # noqa: E402
from qformat_torch import kernels  # noqa: E402
from qformat_torch.nn import QLinear  # noqa: E402

N, K = 256, 512


def _q() -> qformat.QTensor:
    w = (np.random.default_rng(0).standard_normal((N, K)) * 0.02).astype(np.float32)
    return qformat.quantize(w, "int", bits=4, group_size=32, scale_dtype="bfloat16")


def _native_path() -> str:
    """The path a layer of :func:`_q` takes under "auto" here (skips where none applies)."""
    path = QLinear(_q()).kernel_path
    if path == "decode":
        pytest.skip("no native kernel path for int4 g32 on this machine")
    return path


def test_kernel_path_follows_the_policy_without_a_forward():
    native = _native_path()
    m = QLinear(_q(), torch.randn(N))
    assert m.kernel_path == native
    try:
        kernels.set_kernel_policy("decode")
        assert m.kernel_path == "decode"  # no forward in between: the property itself re-selects
        assert m.kernel_tensors == {} and m.kernel_nbytes == 0
    finally:
        kernels.set_kernel_policy("auto")
    assert m.kernel_path == native and m.kernel_tensors
    # a layer's own policy is not the process policy's to change
    fixed = QLinear(_q(), kernel="decode")
    try:
        kernels.set_kernel_policy("native")
        assert fixed.kernel_path == "decode"
    finally:
        kernels.set_kernel_policy("auto")


def test_prepare_false_waits_for_first_use_and_matches(monkeypatch):
    native = _native_path()
    calls: list[QLinear] = []
    real = QLinear._select_kernel
    monkeypatch.setattr(QLinear, "_select_kernel", lambda self: (calls.append(self), real(self))[1])
    bias = torch.randn(N)
    lazy = QLinear(_q(), bias, prepare=False)
    assert calls == [] and "chosen at first use" in repr(lazy)
    eager = QLinear(_q(), bias)
    assert [c is eager for c in calls] == [True]
    x = torch.randn(3, K, dtype=torch.bfloat16)
    y = lazy(x)
    assert sum(c is lazy for c in calls) == 1 and lazy.kernel_path == native
    assert torch.equal(y, eager(x))
    lazy(x)
    assert sum(c is lazy for c in calls) == 1  # prepared once
    # float32 activations: the decode path's result, bit for bit, either way
    x32 = torch.randn(2, K)
    fresh = QLinear(_q(), bias, prepare=False, kernel="decode")
    assert torch.equal(fresh(x32), F.linear(x32, fresh.weight, bias))
