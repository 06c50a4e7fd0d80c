"""Every decoding backend behind one interface, for the shared suite (tests/test_backends.py).

A :class:`Backend` names a decoder and says, through the backend's PUBLIC API only, how to
decode an in-memory :class:`qformat.QTensor`, load a file or a sharded checkpoint, open a file
and cut slices from it, run the conformance protocol and save a file; every result comes back
as a NumPy array with the logical dtype (bfloat16 as ml_dtypes.bfloat16), so one bit-exact
comparison (:func:`same_bits`, NaN by class) serves them all.

* ``numpy``: the reference decoder (qformat/decode.py) through qformat.load_file / safe_open;
* ``torch``: qformat.torch (readers/qformat_torch), on CPU;
* ``jax``: qformat.jax (readers/qformat_jax), jitted, on CPU.

A later reader adds one entry to :data:`BACKENDS`; a backend whose framework is not importable
is skipped (the ``backend`` fixture of tests/conftest.py).  Backend-specific behaviour (JAX
``exact=False``, sharding, jit of packed pytrees; torch devices, QLinear) stays in
tests/readers/.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

import qformat

def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype and shape, and the same bits everywhere except that any NaN matches any NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    ua = a.view(np.uint32 if a.itemsize == 4 else np.uint16)
    ub = b.view(np.uint32 if b.itemsize == 4 else np.uint16)
    fa, fb = a.astype(np.float32), b.astype(np.float32)
    return bool(((ua == ub) | (np.isnan(fa) & np.isnan(fb))).all())


def equal_values(a: np.ndarray, b: np.ndarray) -> bool:
    """:func:`same_bits` for floating-point arrays, exact equality (dtype and shape too) otherwise."""
    if np.dtype(a.dtype).kind in "fV" and a.dtype.itemsize in (2, 4):
        return same_bits(a, b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return bool(np.array_equal(a, b))


# -- conversions to NumPy (public framework API only) -----------------------------------------
def torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def jax_to_numpy(x: Any) -> np.ndarray:
    return np.asarray(x)


def _np_dict(d: Mapping[str, Any], conv: Callable[[Any], np.ndarray]) -> dict[str, np.ndarray]:
    return {k: (v if isinstance(v, np.ndarray) else conv(v)) for k, v in d.items()}


# -- open files ------------------------------------------------------------------------------
class Handle:
    """An open file: ``keys()``, ``descriptor(name)``, ``slice(name, key)`` (``key``: an int or a
    tuple of unit-step slices, as ``get_slice(name)[key]``) and ``qtensor(name)`` (the tensor's
    packed form, decoded), all decoded by the backend and returned as NumPy."""

    def __init__(self, f: Any, conv: Callable[[Any], np.ndarray]):
        self.f, self.conv = f, conv

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()

    def keys(self) -> list[str]:
        return self.f.keys()

    def descriptor(self, name: str) -> Any:
        return self.f.descriptor(name)

    def slice(self, name: str, key: Any) -> np.ndarray:
        return self.conv(self.f.get_slice(name)[key])

    def qtensor(self, name: str) -> np.ndarray:
        return self.conv(self.f.get_qtensor(name).dequantize())


class JaxHandle(Handle):
    """qformat.jax has no safe_open: slices are qformat.jax.load_region boxes of a core handle,
    packed tensors the QArrays of qformat.jax.load_file(packed=True)."""

    def __init__(self, path: Any):
        super().__init__(qformat.safe_open(path), jax_to_numpy)
        self.path = path

    def slice(self, name: str, key: Any) -> np.ndarray:
        shape = self.f.shape(name)
        if isinstance(key, int):
            region = ((key, key + 1),) + tuple((0, n) for n in shape[1:])
            return self.conv(qformat.jax.load_region(self.f, name, region))[0]
        region = []
        for s, n in zip(key, shape):
            lo, hi, step = s.indices(n)
            assert step == 1
            region.append((lo, max(lo, hi)))
        region += [(0, n) for n in shape[len(key):]]
        return self.conv(qformat.jax.load_region(self.f, name, tuple(region)))

    def qtensor(self, name: str) -> np.ndarray:
        return self.conv(qformat.jax.load_file(self.path, packed=True)[name].dequantize())


# -- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    name: str
    framework: str | None  #: module that must import, else the backend's tests are skipped
    decode: Callable[[qformat.QTensor], np.ndarray]  #: an in-memory QTensor, decoded
    load_file: Callable[[Any], dict[str, np.ndarray]]
    load_checkpoint: Callable[[Any], dict[str, np.ndarray]]
    open: Callable[[Any], Handle]
    save_file: Callable[[Mapping[str, Any], Any], None]  #: QTensors and NumPy arrays
    conformance_reader: Callable[[str], dict[str, np.ndarray]]
    #: hypothesis examples: in-memory decode (per logical dtype), file round trip + slices
    examples: int
    file_examples: int
    #: (module, attribute) of the backend's chunk size in elements, None when it has none
    chunk_knob: tuple[str, str] | None = None
    #: a slice decodes (and checks) only the payload of its own elements, so a bad code or group
    #: index outside it is not seen; False: a whole block-aligned box is decoded and checked
    exact_box_payload: bool = True
    #: corpus feature tags this reader does not claim (the conformance runner's --skip-feature)
    corpus_skip_features: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Backend({self.name})"


def _numpy() -> Backend:
    return Backend(
        "numpy", None,
        decode=lambda q: q.dequantize(),
        load_file=qformat.load_file,
        load_checkpoint=qformat.load_checkpoint,
        open=lambda p: Handle(qformat.safe_open(p), np.asarray),
        save_file=qformat.save_file,
        conformance_reader=lambda p: importlib.import_module("qformat.conformance").reference_reader(p),
        examples=84, file_examples=250,  # 3 x 84 ~ the reference's former 250 of each
        chunk_knob=("qformat.decode", "CHUNK_ELEMENTS"),
    )


def _torch() -> Backend:
    def save(tensors: Mapping[str, Any], path: Any) -> None:
        import torch

        conv = {k: (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
                    if isinstance(v, np.ndarray) and v.dtype == ml_dtypes.bfloat16
                    else torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v) for k, v in tensors.items()}
        qformat.torch.save_file(conv, path)

    return Backend(
        "torch", "torch",
        decode=lambda q: torch_to_numpy(qformat.torch.TorchQTensor.from_qtensor(q).dequantize()),
        load_file=lambda p: _np_dict(qformat.torch.load_file(p), torch_to_numpy),
        load_checkpoint=lambda p: _np_dict(qformat.torch.load_checkpoint(p), torch_to_numpy),
        open=lambda p: Handle(qformat.torch.safe_open(p, framework="pt"), torch_to_numpy),
        save_file=save,
        conformance_reader=lambda p: qformat.torch.conformance_reader(p),
        examples=67, file_examples=200,  # 3 x 67 ~ torch's former 200 of each
        chunk_knob=("qformat_torch.decode", "CHUNK_ELEMENTS"),
        # torch holds F4 only in pairs along the last axis (float4_e2m1fn_x2); safetensors' torch
        # binding refuses those files too, and the reader refuses them with PLAIN_DTYPE_UNSUPPORTED
        corpus_skip_features=("plain:f4-odd",),
    )


def _jax() -> Backend:
    return Backend(
        "jax", "jax",
        decode=lambda q: jax_to_numpy(qformat.jax.dequantize(q)),  # one jitted computation; raises like the core
        load_file=lambda p: _np_dict(qformat.jax.load_file(p), jax_to_numpy),
        load_checkpoint=lambda p: _np_dict(qformat.jax.load_checkpoint(p), jax_to_numpy),
        open=JaxHandle,
        save_file=qformat.save_file,
        conformance_reader=lambda p: qformat.jax.conformance_reader(p),
        examples=50, file_examples=15,  # every file and slice compiles: few examples
        exact_box_payload=False,  # load_region decodes whole block-aligned boxes
    )


#: name -> factory; the factories only touch a framework when a test runs with it.
BACKENDS: dict[str, Callable[[], Backend]] = {"numpy": _numpy, "torch": _torch, "jax": _jax}


def get(name: str) -> Backend:
    """The backend ``name``; skips the calling test when its framework is not importable."""
    b = BACKENDS[name]()
    if b.framework is not None:
        import pytest

        pytest.importorskip(b.framework)
    return b


def names() -> Iterator[str]:
    return iter(BACKENDS)
