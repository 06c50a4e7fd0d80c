"""qformat for JAX: decode qformat tensors with jax.numpy, packed, jitted or sharded.

* :func:`dequantize` decodes a :class:`QArray`, a :class:`qformat.QTensor` or component arrays
  plus a descriptor; bit-exact with the NumPy reference (``exact=True``, the default), and
  traceable inside ``jax.jit``.
* :class:`QArray` keeps a tensor packed on the device as a pytree (components as leaves, the
  descriptor as static data): ``q.dequantize()`` inside a jitted forward pass.
* :func:`load_file` reads a file into ``jax.Array`` values (or QArrays with ``packed=True``),
  optionally sharded: each device reads and decodes only the blocks of its own shard.  On a
  CPU device the decode runs on the host in qformat's native kernel (:func:`decode_on_host`,
  the reference's bits); ``decoder="jax"`` keeps the jitted jax.numpy decoder.
* :func:`conformance_reader` is the in-process reader of ``qformat conformance run``.
* :mod:`qformat_jax.decode` is the traced decoder itself: :func:`~qformat_jax.decode.jitted`
  (one cached ``jax.jit`` per descriptor JSON, :func:`~qformat_jax.decode.descriptor_json`)
  and :func:`~qformat_jax.decode.f32_path_chosen`, for benchmarks and tests.

Reached as ``qformat.jax``; ``import qformat`` alone never imports JAX.
"""

from .decode import decode_traced, round_to, widen_to_f32
from ._io import DECODERS, conformance_reader, decode_on_host, host_decodes, load_checkpoint, load_file, load_region
from ._qarray import QArray, dequantize

__all__ = ["DECODERS", "QArray", "conformance_reader", "decode_on_host", "decode_traced", "dequantize", "host_decodes",
           "load_checkpoint", "load_file", "load_region",
           "round_to", "widen_to_f32"]
