"""Loading files into JAX: whole tensors, packed QArrays, or sharded over devices."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Mapping

import jax
import numpy as np

import qformat
from qformat.descriptor import Descriptor
from qformat.dtypes import logical_numpy
from qformat.errors import error, raise_first
from qformat.index import is_index
from qformat.remote_slicing import remote_slice
from qformat.io import parse_index
from qformat.slicing import RecordingSource, aligned_region, describe_alignment, is_aligned, slice_qtensor

from .decode import descriptor_json, jitted
from ._qarray import QArray, ShardInfo, group_index_params, raise_if_bad, host_components, lead_axes_of

ShardingSpec = Any  # a jax.sharding.Sharding, a mapping name -> Sharding, or a callable

#: How :func:`load_file` and :func:`load_region` decode a quantized tensor that they return
#: decoded: ``"auto"`` (the default) decodes on the host with qformat's native kernel
#: (:func:`qformat.decode.decode`, the reference's own bits) and puts the result on the device
#: where that device is a CPU and the kernel is on (``qformat.kernels.enabled()``), else with the
#: jitted jax.numpy decoder on the device; ``"jax"`` always takes the jitted decoder.  Both give
#: the reference's bits (``exact=False`` applies to the jitted decoder only).
DECODERS = ("auto", "jax")


def _platforms(device: Any) -> set[str]:
    if device is None:
        return {jax.devices()[0].platform}
    if hasattr(device, "device_set"):  # a Sharding
        return {d.platform for d in device.device_set}
    return {getattr(device, "platform", "?")}


def _check_decoder(decoder: str) -> None:
    if decoder not in DECODERS:  # an API misuse, a ValueError as set_kernel_policy's
        raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, found {decoder!r}")


def host_decodes(device: Any, decoder: str = "auto") -> bool:
    """Whether a tensor bound for ``device`` is decoded on the host by the native kernel (see
    :data:`DECODERS`): on a CPU device the jitted decoder is 3-10x slower than the kernel
    (bench ``decode``), and the host's memory is the device's."""
    _check_decoder(decoder)
    from qformat import kernels

    return decoder == "auto" and kernels.enabled() and _platforms(device) == {"cpu"}


#: Alignment of the host buffers decoded for a CPU device: at 64 bytes XLA's CPU client takes a
#: NumPy array without copying it (measured: a 64 MB device_put of a 16-byte-aligned array ran
#: at 0.13x memcpy, five times the decode itself; of a 64-byte-aligned one, no copy).
HOST_ALIGNMENT = 64


def _aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + HOST_ALIGNMENT, np.uint8)
    off = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[off:off + n].view(dtype).reshape(shape)


def _host_decode(desc: Descriptor, source: Any, device: Any, region: Any = None, tensor: str | None = None) -> jax.Array:
    """``region`` of ``desc`` decoded by :func:`qformat.decode.decode` into a 64-byte-aligned host
    buffer, handed to ``device`` (a CPU device: without a copy)."""
    from qformat.decode import decode
    from qformat.dtypes import logical_numpy

    shape = desc.shape if region is None else tuple(hi - lo for lo, hi in region)
    out = _aligned_empty(shape, logical_numpy(desc.dtype))
    decode(desc, source, region, tensor=tensor, out=out)
    return jax.device_put(out, device)


def decode_on_host(q: qformat.QTensor, device: Any = None) -> jax.Array:
    """``q`` decoded by :func:`qformat.decode.decode` (the native kernel where it is on; the
    reference's bits) and put on ``device`` (default: JAX's default device; a CPU device takes
    the decoded buffer without copying it)."""
    from qformat.descriptor import parse_descriptor
    from qformat.sources import ArraySource

    return _host_decode(parse_descriptor("tensor", q.descriptor), ArraySource(q.components), device)


def _has_table(desc: Descriptor) -> bool:
    if desc.codes.element.table_tensor is not None:
        return True
    return any(p.encoded is not None and _has_table(p.encoded) for p in desc.params())


def _jax_holds(dtype: np.dtype) -> bool:
    """True when JAX keeps this dtype as is (64-bit types need jax_enable_x64)."""
    return jax.dtypes.canonicalize_dtype(dtype) == np.dtype(dtype)


def _sharding_for(sharding: ShardingSpec, name: str, shape: tuple[int, ...]) -> Any:
    if sharding is None:
        return None
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    if isinstance(sharding, Mapping):
        return sharding.get(name)
    return sharding(name, shape)


def _region_of(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The box of a device's index (step-1 slices) into a tensor of ``shape``."""
    return parse_index(shape, tuple(index))[0]


def _holds_part(shard: Any) -> bool:
    """Whether this process holds any part of a tensor placed with ``shard`` (None: all of it).

    Under JAX's multi-controller runtime a sharding may span other processes' devices only
    (a pipeline stage, a sub-mesh); such a process builds the global array without reading
    any of the tensor's bytes."""
    return shard is None or bool(shard.addressable_devices)


def _descriptor(f: qformat.io.SafeOpen, name: str, reads: bool) -> Descriptor:
    """The validated descriptor; its digests (``verify``) are checked only when the tensor's
    bytes will be read here: a process that holds no part of a tensor reads none of them."""
    if reads:
        return f.validated_descriptor(name)
    f.require(name)
    raise_first(f.model.tensor_problems.get(name, []))
    return f.model.descriptors[name]


def _global_dtype(dtype: Any) -> np.dtype:
    """The dtype JAX gives an array of ``dtype`` (what a process with no shard must declare)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _load_logical(f: qformat.io.SafeOpen, name: str, shard: Any, device: Any, packed: bool, exact: bool,
                  read_log: list | None, decoder: str = "auto") -> Any:
    desc = _descriptor(f, name, _holds_part(shard))
    if shard is None and read_log is not None:
        read_log.append({"tensor": name, "device": device, "region": None, "aligned": None, "reads": _whole_reads(f, desc)})
    if shard is None and not packed and host_decodes(device, decoder):
        return _host_decode(desc, f.source, device, tensor=name)
    if shard is None:
        comps = f.get_qtensor(name).components  # memory-mapped views
        q = QArray(desc, jax.device_put(host_components(desc, comps, name), device))
        if packed:
            return q.check() if _has_table(desc) else q
        out, ok = jitted(q._desc_json, exact)(q.components)
        raise_if_bad(ok, name)
        return out
    if packed:
        return _load_packed_sharded(f, name, desc, shard, read_log)
    shape = desc.shape
    pending: dict[tuple, list] = {}
    # Only this process's devices: under the multi-controller runtime each process calls this
    # with the same global sharding, and make_array_from_callback asks each for its own shards.
    for dev, idx in shard.addressable_devices_indices_map(shape).items():
        pending.setdefault(_region_of(idx, shape), []).append(dev)

    def cb(index: tuple[slice, ...]) -> jax.Array:
        region = _region_of(index, shape)
        devs = pending.get(region)
        dev = devs.pop(0) if devs else None  # callbacks come in the map's device order
        return load_region(f, name, region, device=dev, exact=exact, read_log=read_log, decoder=decoder, _desc=desc)

    if not pending:
        return _no_local_part(shape, shard, logical_numpy(desc.dtype))
    return jax.make_array_from_callback(shape, shard, cb)


def _no_local_part(shape: tuple[int, ...], shard: Any, dtype: Any) -> jax.Array:
    """The global array of a tensor none of whose shards this process addresses, built from
    shape and dtype alone.  Not make_array_from_callback: for a fully replicated sharding (a
    sub-mesh of one device, say) it calls the callback once even with no addressable device,
    which would read and decode the whole tensor for nothing."""
    return jax.make_array_from_single_device_arrays(shape, shard, [], dtype=_global_dtype(dtype))


def load_region(f: qformat.io.SafeOpen, name: str, region: Any, device: Any = None, exact: bool = True,
                read_log: list | None = None, decoder: str = "auto", _desc: Descriptor | None = None) -> jax.Array:
    """Decode one box of a logical tensor on ``device``, reading only its aligned blocks.

    The box is widened to the smallest block-aligned box (qformat.slicing.aligned_region); only
    the packed bytes and parameters of that box are read from the memory map
    (qformat.slicing.slice_qtensor), put on ``device``, decoded there by the jitted decoder and
    cut to the box (on a CPU device: decoded on the host by the native kernel, cut, then put
    there; ``decoder``, :data:`DECODERS`).  With ``read_log`` (a list), one record per call is appended: the tensor,
    device, box, aligned box and the file byte ranges read (qformat.slicing.Read).
    """
    desc = _desc if _desc is not None else f.validated_descriptor(name)
    region = tuple((int(lo), int(hi)) for lo, hi in region)
    A = aligned_region(desc, region)
    src = RecordingSource(f.source) if read_log is not None else f.source
    if f.source.remote is not None and read_log is None:
        sub, comps = remote_slice(f.source, desc, A)  # an http(s) file: only the box's bytes are fetched
    else:
        sub, comps = slice_qtensor(desc, src, A)
    sub_desc = Descriptor.from_dict(sub)
    cut = None if A == region else tuple((lo - alo, hi - alo) for (lo, hi), (alo, _) in zip(region, A))
    if host_decodes(device, decoder):
        from qformat.sources import ArraySource

        out = _host_decode(sub_desc, ArraySource(comps), device, cut, tensor=name)
    else:
        host = host_components(sub_desc, comps, name)  # only the jitted decoder takes them
        out, ok = jitted(descriptor_json(sub), exact, cut)(jax.device_put(host, device))
        raise_if_bad(ok, name)
    if read_log is not None:
        read_log.append({"tensor": name, "device": device, "region": region, "aligned": A, "reads": list(src.reads)})
    return out


def _load_packed_sharded(f: qformat.io.SafeOpen, name: str, desc: Descriptor, shard: Any,
                         read_log: list | None = None) -> QArray:
    """A QArray whose components are sharded: each device holds only its block, still packed.

    Needs a NamedSharding whose per-device boxes are block-aligned and all cut to the same
    local descriptor (evenly divided, aligned shards); else SLICE_INVALID.  Both are decided
    from the whole sharding (every device of the mesh, from shapes alone) before any byte of
    the tensor is read, so under JAX's multi-controller runtime every process refuses the same
    tensor (none is left waiting for the others in a collective) and a process reads only the
    blocks of its addressable devices.  With ``read_log``, one record per addressable device is
    appended, as :func:`load_region` appends (``aligned`` equals ``region`` here).
    """
    if not isinstance(shard, jax.sharding.NamedSharding):
        raise error("SLICE_INVALID", f"packed sharded loading needs a NamedSharding, found {type(shard).__name__}", tensor=name)
    shape = desc.shape
    spec = tuple(shard.spec) + (None,) * (len(shape) - len(shard.spec))
    lead_axes = lead_axes_of(spec)
    mesh = shard.mesh
    regions = {dev: _region_of(idx, shape) for dev, idx in shard.devices_indices_map(shape).items()}
    for dev in sorted(regions, key=lambda d: d.id):
        region = regions[dev]
        if not is_aligned(desc, region):
            raise error("SLICE_INVALID", f"device {dev.id} (process {dev.process_index})'s box {list(region)} is not block-aligned, "
                        "so it cannot stay packed: " + describe_alignment(desc, region)
                        + "; load it decoded (packed=False) or choose a sharding on aligned bounds", tensor=name)
    # The local descriptor of every distinct box: slice_qtensor returns views of the memory
    # map, so this reads no component bytes (a group index's sub-range excepted); for an
    # http(s) file, deferred() keeps them views of the unfetched mirror (nothing is fetched).
    local: dict[tuple, tuple[str, dict[str, np.ndarray]]] = {}
    deferred = getattr(f.source, "deferred", None)
    with deferred() if deferred is not None else contextlib.nullcontext():
        for region in sorted(set(regions.values())):
            sub, comps = slice_qtensor(desc, f.source, region)
            local[region] = (descriptor_json(sub), comps)
    if len({j for j, _ in local.values()}) > 1:
        raise error("SLICE_INVALID", "the devices' boxes cut to different local descriptors (uneven shards); load it decoded (packed=False)", tensor=name)
    local_json, any_comps = next(iter(local.values()))
    local_desc = Descriptor.from_dict(json.loads(local_json))
    per_device: dict[Any, dict[str, np.ndarray]] = {}
    for dev in shard.addressable_devices_indices_map(shape):
        region = regions[dev]
        src = RecordingSource(f.source) if read_log is not None else f.source
        _, comps = slice_qtensor(desc, src, region)
        per_device[dev] = host_components(local_desc, comps, name)
        if read_log is not None:
            read_log.append({"tensor": name, "device": dev, "region": region, "aligned": region, "reads": list(src.reads)})
    # Each leaf's per-block shape and dtype, from the local descriptor (group indices become
    # int32 in host_components); a process with no addressable device declares them.
    gidx = group_index_params(local_desc)
    avals = {n: (tuple(a.shape), _global_dtype(np.int32 if n in gidx else a.dtype)) for n, a in any_comps.items()}
    lead_shape = tuple(mesh.shape[a] for a in lead_axes)
    comp_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*lead_axes))
    leaves = {}
    for n in sorted(avals):
        local_shape, dtype = avals[n]
        arrays = [jax.device_put(np.ascontiguousarray(c[n]).reshape((1,) * len(lead_axes) + local_shape), dev) for dev, c in per_device.items()]
        leaves[n] = jax.make_array_from_single_device_arrays(lead_shape + local_shape, comp_sharding, arrays,
                                                             dtype=None if arrays else dtype)
    q = QArray(json.loads(local_json), leaves, ShardInfo(shape, mesh, jax.sharding.PartitionSpec(*spec), lead_axes))
    # The codebook check decodes on the sharding's devices; a process with none of them takes
    # no part in that computation (the processes holding the blocks check them).
    return q.check() if _has_table(desc) and per_device else q


def _load_plain(f: qformat.io.SafeOpen, name: str, shard: Any, device: Any, read_log: list | None = None) -> Any:
    from qformat.sources import plain_reading, plain_shape

    if not _holds_part(shard):  # shape and dtype alone: no byte of it (nor its digest) is read here
        f.require(name)
        raise_first(f.model.tensor_problems.get(name, []))
        e = f.header.entries[name]
        dt = plain_reading(e.dtype)[0]
        if _jax_holds(dt):
            return _no_local_part(plain_shape(e.dtype, e.shape), shard, dt)
    arr = f.plain_array(name)
    if not _jax_holds(arr.dtype) or shard is None:
        if read_log is not None:
            read_log.append({"tensor": name, "device": device, "region": None, "aligned": None, "reads": _plain_reads(f, name, arr, None)})
        if not _jax_holds(arr.dtype):
            return np.array(arr)  # a 64-bit plain tensor without jax_enable_x64: kept exact, in NumPy
        return jax.device_put(np.array(arr), device)
    pending: dict[tuple, list] = {}
    for dev, idx in shard.addressable_devices_indices_map(arr.shape).items():
        pending.setdefault(_region_of(idx, arr.shape), []).append(dev)

    def cb(idx: tuple[slice, ...]) -> np.ndarray:
        if read_log is not None:
            region = _region_of(idx, arr.shape)
            devs = pending.get(region)
            read_log.append({"tensor": name, "device": devs.pop(0) if devs else None, "region": region, "aligned": region,
                             "reads": _plain_reads(f, name, arr, idx)})
        return np.array(arr[idx])

    return jax.make_array_from_callback(arr.shape, shard, cb)


def _plain_reads(f: qformat.io.SafeOpen, name: str, arr: np.ndarray, idx: Any) -> list:
    """The file byte ranges (qformat.slicing.Read) that reading ``arr[idx]`` (``None``: all of
    it) of a plain tensor touches; one not viewed in place (F4, F6_*) is read whole to unpack."""
    from qformat.sources import plain_reading
    from qformat.slicing import Read

    rec = RecordingSource(f.source)
    e = f.header.entries[name]
    if idx is None or plain_reading(e.dtype)[1] != "view":
        return [Read(name, rec.component_offset(name), e.nbytes)] if e.nbytes else []
    rec.take(name, arr, arr[tuple(idx)])
    return rec.reads


def _whole_reads(f: qformat.io.SafeOpen, desc: Descriptor) -> list:
    """Every stored byte of a quantized tensor's components (qformat.slicing.Read), for
    ``read_log`` where a tensor is loaded whole."""
    from qformat.slicing import Read

    rec = RecordingSource(f.source)
    ents = f.header.entries
    return [Read(c, rec.component_offset(c), ents[c].nbytes) for c in sorted({c for _, c in desc.references()}) if ents[c].nbytes]


def load_file(path: str | os.PathLike[str], sharding: ShardingSpec = None, *, packed: bool = False,
              device: Any = None, exact: bool = True, read_log: list | None = None, verify: bool = False,
              decoder: str = "auto") -> dict[str, Any]:
    """Every tensor of a qformat (or plain safetensors) file as JAX arrays.

    * Quantized tensors are decoded on the device by the jitted jax.numpy decoder, bit-exact
      with :func:`qformat.load_file` when ``exact`` (the default); on a CPU device, by
      qformat's native kernel on the host (the same bits, several times faster), unless
      ``decoder="jax"`` (:data:`DECODERS`).
    * ``packed=True`` returns quantized tensors as :class:`QArray` pytrees instead, kept packed
      on ``device`` (call ``.dequantize()`` inside ``jax.jit``).  With a ``NamedSharding``
      whose device boxes are block-aligned and even, each device keeps only its own block,
      packed, and ``.dequantize()`` decodes every block on its device (``jax.shard_map``)
      into an array with that sharding; other shardings are SLICE_INVALID.
    * ``sharding`` (a ``jax.sharding.Sharding`` for every tensor, a mapping name -> Sharding,
      or a callable ``(name, shape) -> Sharding | None``): each tensor becomes a global
      ``jax.Array`` built with ``jax.make_array_from_callback``; each device's callback widens
      its index to the block-aligned box, reads only that box's packed bytes and parameters
      from the memory map, decodes on that device and cuts its exact index.
    * Plain tensors are returned as stored; 64-bit ones stay NumPy arrays unless
      ``jax_enable_x64`` is on (JAX would otherwise narrow them).
    * Under JAX's multi-controller runtime (``jax.distributed.initialize``, one process per
      host), every process calls this with the same arguments and a sharding over the global
      mesh; each gets the same global arrays and reads and decodes only the block-aligned boxes
      of its own (addressable) devices.  A tensor whose sharding has no device in this process
      (a sub-mesh of other hosts) is built from its shape and dtype alone: none of its bytes are
      read, nor its digests checked (``verify``), here.  Every header and the index are read by
      every process.  ``packed=True`` decides alignment from every device of the mesh, so all
      processes refuse (SLICE_INVALID) or accept the same tensors.
    * ``read_log`` (a list): one record per read is appended (tensor, device, box, aligned box,
      the file byte ranges: :class:`qformat.slicing.Read`), for sharded boxes, for packed blocks
      and for tensors loaded whole.

    A sharded checkpoint's ``*.safetensors.index.json`` loads every shard (:func:`load_checkpoint`).
    Errors are :class:`qformat.QFormatError` with the core's codes, as for ``qformat.load_file``.
    ``verify``: check the digests a 1.2 file records (SPEC.md §3.8) of each tensor's stored bytes
    before it is read (DIGEST_MISMATCH, DIGEST_UNSUPPORTED).
    """
    _check_decoder(decoder)
    if is_index(path):
        return load_checkpoint(path, sharding=sharding, packed=packed, device=device, exact=exact, read_log=read_log, verify=verify,
                               decoder=decoder)
    with qformat.safe_open(path, verify=verify) as f:
        for probs in f.model.tensor_problems.values():
            raise_first(probs)
        out: dict[str, Any] = {}
        for name in f.file_order():
            shape = f.shape(name)
            shard = _sharding_for(sharding, name, shape)
            if f.is_quantized(name):
                out[name] = _load_logical(f, name, shard, device, packed, exact, read_log, decoder)
            else:
                out[name] = _load_plain(f, name, shard, device, read_log)
        return out


def load_checkpoint(path: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
    """:func:`load_file` for a file, or for a sharded checkpoint given its index.json.

    The index is validated against each shard as :func:`qformat.load_checkpoint` does
    (INDEX_INVALID, INDEX_MISMATCH); ``kwargs`` go to :func:`load_file`.
    """
    from qformat.checkpoint import load_checkpoint as load_shards

    return load_shards(path, lambda p: load_file(p, **kwargs))


def conformance_reader(path: str) -> dict[str, np.ndarray]:
    """The in-process conformance protocol: decode with JAX (CPU), NumPy only at the end.

    Returns name -> NumPy array; a refused file or tensor raises :class:`qformat.QFormatError`
    (its ``code`` is the error code).
    """
    tensors = load_checkpoint(path, device=jax.devices("cpu")[0])
    return {name: np.asarray(a) for name, a in tensors.items()}

