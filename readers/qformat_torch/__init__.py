"""qformat for PyTorch: read, write and run quantized safetensors files with torch.

* :func:`load_file`, :func:`save_file`, :func:`safe_open` (``keys``, ``descriptor``,
  ``get_tensor``, ``get_slice(name)[...]``, ``get_qtensor``, ``get_shard``): the core's file
  handling, with quantized tensors decoded by torch ops on the requested device, bit-identical to
  the NumPy reference on CPU;
* :class:`TorchQTensor`: a packed tensor in torch memory; :class:`QLinear`,
  :func:`quantize_model`, :func:`save_model`, :func:`load_model`: models whose Linear weights
  stay packed and dequantize on use;
* :func:`shard_bounds`: tensor-parallel bounds, block-aligned where the descriptor allows;
* :func:`load_tensor_parallel` (:mod:`qformat_torch.distributed`): a torch.distributed
  tensor-parallel load, each rank reading only its block-aligned slice of the packed weights
  into :class:`ColwiseQLinear` / :class:`RowwiseQLinear`;
* interop with bitsandbytes (:mod:`qformat_torch.interop_bnb`) and torchao
  (:mod:`qformat_torch.interop_torchao`), imported on first use;
* :func:`conformance_reader`: the conformance runner's in-process protocol;
* device layouts (SPEC.md §11, :mod:`qformat_torch.layouts`): tensors stored in
  ``tinygemm_int4_cuda`` or ``marlin_dense`` decode like any other; ``save_file(...,
  canonical=True)`` unpacks them; :class:`~qformat_torch.layouts.TinyGemmLinear` repacks
  canonical int4 weights into tinygemm for the running device at load time.

Reach it as ``qformat.torch`` or ``import qformat_torch``.
"""

from __future__ import annotations

from .io import SafeOpen, conformance_reader, load_checkpoint, load_file, safe_open, save_file
from .nn import QLinear, load_model, quantize_model, save_model
from .qtensor import TorchQTensor
from .slicing import shard_bounds, shard_period
from .distributed import ColwiseQLinear, RowwiseQLinear, TPStats, load_tensor_parallel


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``interop_bnb`` / ``interop_torchao`` load their libraries only when asked for."""
    if name in ("interop_bnb", "interop_torchao", "layouts"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ColwiseQLinear", "QLinear", "RowwiseQLinear", "SafeOpen", "TPStats", "load_tensor_parallel", "TorchQTensor", "conformance_reader", "load_checkpoint", "load_file",
    "load_model", "quantize_model", "safe_open", "save_file", "save_model", "shard_bounds", "shard_period",
]
