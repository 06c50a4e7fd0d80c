"""``qformat dequantize``: any checkpoint qformat reads to a plain safetensors checkpoint, streaming.

The source is described by the convert machinery (:func:`qformat.convert.writer.items`): a
qformat checkpoint (written by ``qformat quantize``, ``qformat.save_file``, or ``qformat
convert`` in place, where descriptors reference the source format's own tensors) through its
descriptors; every logical tensor becomes one plain tensor of its logical dtype (or ``dtype``)
under its logical name, in the file of its codes; the components it references are dropped and
plain tensors are copied.  Same files (same sharding), no qformat metadata, config.json without
``quantization_config``.  Each tensor is decoded only when the writer reaches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import numpy as np

from . import output as out_
from . import writer as checkpoint_writer
from .. import dtypes as _dt
from .writer import OutFile, OutTensor
from ..container import TensorSpec
from ..errors import error

_STORAGE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass
class DequantizeSummary:
    files: list[str] = field(default_factory=list)
    dequantized: int = 0
    kept: int = 0
    bytes: int = 0
    source_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "dequantized": self.dequantized, "kept": self.kept, "bytes": self.bytes, "source_bytes": self.source_bytes}


@checkpoint_writer.writing_for("dequantize")
def dequantize_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], dtype: str | None = None, *,
                          overwrite: bool = False, progress: TextIO | None = None,
                          notice: Callable[[str], None] | None = None) -> DequantizeSummary:
    """Decode every quantized tensor of ``src`` into a plain checkpoint at ``dst`` (a folder for
    a folder or sharded source, else a file).  ``dtype`` (float32, float16, bfloat16) casts the
    decoded tensors; default each one's logical dtype.  Plain tensors are copied unchanged, and so
    are a folder's other files and subfolders (:func:`qformat.checkpoint.output.side_files`)."""
    from .source import Checkpoint
    from ..convert.base import Described
    from ..convert.qformat_ import QFormatSource
    from ..convert.writer import CombinedSource, items
    from ..decode import decode_full

    if dtype is not None and dtype not in _STORAGE:
        raise error("ENCODE_PARAM_INVALID", f"dtype must be one of {', '.join(_STORAGE)}, found {dtype!r}", field="dtype")
    ck = Checkpoint(src)
    if ck.kind != "safetensors":
        raise error("CONVERT_UNSUPPORTED", f"{ck.path} is a {ck.kind} file; convert it with `qformat convert` first")
    described = QFormatSource().describe(ck) if ck.has_qformat() else Described()
    as_folder = os.path.isdir(ck.path) or ck.sharded
    dst = checkpoint_writer.resolve_destination(dst, as_folder, ck.files[0])
    if dst == ck.path or (not as_folder and dst in [os.path.join(ck.folder, f) for f in ck.files]):
        raise checkpoint_writer.destination_error(f"the destination {dst} is the source itself")
    checkpoint_writer.check_destination(dst, as_folder, overwrite)

    combined = CombinedSource(ck, described)
    summary = DequantizeSummary(source_bytes=sum(TensorSpec(n, *_info(ck, n)).nbytes for n in ck.names()))
    files: dict[str, OutFile] = {f: OutFile(f, out_.file_metadata(ck.metadata(f), {})) for f in ck.files}
    for item in items(ck, described):
        f = files[item.file]
        if item.descriptor is None:
            f.tensors += [OutTensor(c.spec, c.produce) for c in item.components.values()]
            summary.kept += 1
            continue
        desc = item.parsed
        target = dtype or desc.dtype
        spec = TensorSpec(item.name, _STORAGE[target], tuple(desc.shape))

        def produce(desc: Any = desc, name: str = item.name, target: str = target) -> np.ndarray:
            # check's payload rules first: a tensor with no element reads no stored byte, so the
            # per-read guard would never see it (an empty tensor's out-of-range group index)
            ck.admit(name)
            a = decode_full(desc, combined, tensor=name)
            return a if desc.dtype == target else a.astype(_dt.logical_numpy(target))

        f.tensors.append(OutTensor(spec, produce))
        summary.dequantized += 1
    outs = [files[f] for f in ck.files if files[f].tensors or len(ck.files) == 1]
    if not as_folder:
        outs[0].name = os.path.basename(dst)
    summary.bytes = sum(f.data_bytes for f in outs)
    extra: dict[str, bytes] = {}
    side: list[checkpoint_writer.SideFile] = []
    if as_folder:
        side = out_.source_side_files(ck, dst, skip={"config.json"})  # the model folder's tree, config.json rewritten
        if isinstance(ck.config, dict):
            extra["config.json"] = out_.config_bytes(ck.config, None)
    bar = out_.ByteProgress(summary.bytes, progress, "dequantize")
    try:
        summary.files = checkpoint_writer.write_checkpoint(
            dst, outs, as_folder=as_folder, overwrite=overwrite, side_files=side, index=out_.index_spec(ck, resharded=False),
            verify=_verify_plain, written=out_.release_after(ck.release, bar), extra_files=extra, notice=notice)
    finally:
        bar.close()
    return summary


def _info(ck: Any, name: str) -> tuple[str, tuple[int, ...]]:
    i = ck.info(name)
    return i.dtype, tuple(i.shape)


def _verify_plain(path: str) -> None:
    """A written file must be a plain safetensors file qformat check accepts."""
    from ..check import check_file

    rep = check_file(path, payload=False)
    if not rep.ok:
        p = rep.problems[0]
        raise error("SAVE_INVALID", f"the written file fails qformat check: {p.code}: {p.message}", tensor=p.tensor)
