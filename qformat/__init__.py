"""qformat: a framework-neutral format for quantized tensors inside safetensors files.

The public API (SPEC.md describes the file format it reads and writes):

* :func:`quantize` encodes a NumPy array with a registered scheme into a :class:`QTensor`;
* :func:`save_file` / :func:`load_file` write and read whole files;
* :func:`safe_open` reads lazily from a memory map, with ``get_slice`` decoding only the
  blocks asked for;
* :func:`check` validates a file, a folder or a sharded checkpoint and reports every problem
  with its stable error code.

This package imports NumPy, ml_dtypes and jsonschema only: never torch or jax.
"""

from .check import Problem, Report, check
from .errors import InvalidFileError, MalformedFileError, QFormatError, UnsupportedError, UsageError
from .index import load_checkpoint
from .io import iter_tensors, load_file, safe_open, save_file
from .model import required_version
from .qtensor import QTensor

__version__ = "0.2.0"
#: The qformat spec version this implementation reads (SPEC.md).  Files record the lowest
#: version whose features they use: ``required_version`` ("1.0" unless a 1.1 layout appears).
SPEC_VERSION = "1.1"


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``qformat.torch`` and ``qformat.jax``: the framework readers, imported on first use."""
    if name == "torch":
        import qformat_torch

        return qformat_torch
    if name == "jax":
        import qformat_jax

        return qformat_jax
    raise AttributeError(f"module 'qformat' has no attribute {name!r}")


def quantize(array, scheme: str, **params) -> QTensor:  # type: ignore[no-untyped-def]
    """Encode ``array`` with the registered ``scheme`` (see :mod:`qformat.schemes`)."""
    from .schemes import quantize as _quantize

    return _quantize(array, scheme, **params)


__all__ = [
    "InvalidFileError", "MalformedFileError", "Problem", "QFormatError", "QTensor", "Report", "SPEC_VERSION",
    "UnsupportedError", "UsageError", "__version__", "check", "iter_tensors", "load_checkpoint", "load_file", "quantize", "required_version",
    "safe_open", "save_file",
]
