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
from .io import iter_tensors, load_checkpoint, load_file, safe_open, save_file
from .model import required_version
from .qtensor import QTensor

__version__ = "0.2.0"
#: The qformat spec version this implementation reads (SPEC.md).  Files record the lowest
#: version whose features they use: ``required_version`` ("1.0" unless a 1.1 layout appears).
SPEC_VERSION = "1.2"
#: the revision of SPEC.md this package follows (a patch settles readings; files declare SPEC_VERSION)
SPEC_REVISION = "1.2.1"


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``qformat.torch`` and ``qformat.jax``: the framework readers, imported on first use
    (``from qformat.torch import load_file`` works too: see :mod:`qformat.torch`)."""
    import sys

    if name == "torch":
        import qformat.torch  # noqa: F401  (the module replaces itself with qformat_torch)

        return sys.modules["qformat.torch"]
    if name == "jax":
        import qformat.jax  # noqa: F401

        return sys.modules["qformat.jax"]
    raise AttributeError(f"module 'qformat' has no attribute {name!r}")


def quantize(array, scheme: str, **params) -> QTensor:  # type: ignore[no-untyped-def]
    """Encode ``array`` with the registered ``scheme`` (see :mod:`qformat.schemes`)."""
    from .schemes import quantize as _quantize

    return _quantize(array, scheme, **params)


def dequantize(qtensor: QTensor, out=None, *, threads=None):  # type: ignore[no-untyped-def]
    """Decode ``qtensor`` to a NumPy array of its logical shape and dtype (bit-exact), into
    ``out`` when given: a writable, C-contiguous NumPy array of exactly that shape and dtype,
    written in place by the native kernels (refused otherwise: TypeError for a non-array,
    ValueError naming what differs).  ``threads``: decoding threads (default: one per CPU, at
    most 8; the bits never depend on it).  The same as ``qtensor.dequantize(out)``."""
    if not isinstance(qtensor, QTensor):
        raise TypeError(f"dequantize takes a QTensor, found {type(qtensor).__name__}")
    return qtensor.dequantize(out, threads=threads)


def quantize_checkpoint(src, dst, scheme=None, recipe=None, **kwargs):  # type: ignore[no-untyped-def]
    """Quantize a plain checkpoint into a qformat checkpoint, streaming (``qformat quantize``;
    see :func:`qformat.checkpoint.quantize.quantize_checkpoint`)."""
    from .checkpoint.quantize import quantize_checkpoint as _q

    return _q(src, dst, scheme=scheme, recipe=recipe, **kwargs)


def dequantize_checkpoint(src, dst, dtype=None, **kwargs):  # type: ignore[no-untyped-def]
    """Decode a qformat checkpoint into a plain safetensors checkpoint, streaming (``qformat
    dequantize``; see :func:`qformat.checkpoint.dequantize.dequantize_checkpoint`)."""
    from .checkpoint.dequantize import dequantize_checkpoint as _d

    return _d(src, dst, dtype=dtype, **kwargs)


__all__ = [
    "InvalidFileError", "MalformedFileError", "Problem", "QFormatError", "QTensor", "Report", "SPEC_REVISION", "SPEC_VERSION",
    "UnsupportedError", "UsageError", "__version__", "check", "dequantize", "dequantize_checkpoint", "iter_tensors", "load_checkpoint", "load_file", "quantize", "quantize_checkpoint", "required_version",
    "safe_open", "save_file",
]
