"""Writing a safetensors target (compressed-tensors, MLX, bitsandbytes): the source's
sharding and side files, a rewritten config.json, one tensor group at a time, atomically.

Each exported tensor's target arrays are one :class:`~qformat.checkpoint.writer.OutGroup`
(built and verified once, written at their planned offsets, dropped), so memory holds one
source tensor's work at a time.  File names follow the source: a single file stays a single
file (``dst`` is then a file); a folder or sharded source gives a folder with the same file
names, the source folder's whole side tree but config.json copied (subfolders included:
:func:`qformat.checkpoint.output.side_files`), and an index (for sharded sources) listing the
target's tensor names.  A written file must pass ``qformat check`` as a plain safetensors
file before anything is moved into place.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import numpy as np

from ..checkpoint import output as out_
from ..checkpoint import writer as checkpoint_writer
from ..checkpoint.writer import OutFile, OutGroup, OutTensor
from ..errors import error
from .base import Context, ExportPlan


def write_safetensors(dst: str, plan: ExportPlan, ctx: Context, *, label: str,
                      config: Callable[[dict[str, Any] | None], dict[str, Any] | None] | None = None,
                      metadata: Mapping[str, str] | None = None, extra_files: Mapping[str, bytes] | None = None) -> list[str]:
    """Write ``plan`` as safetensors files at ``dst``.  ``config(source config)`` gives the
    config.json to write (None: copy the source's, if any); ``metadata`` is every file's
    ``__metadata__`` (default ``{"format": "pt"}``)."""
    ck = ctx.checkpoint
    as_folder = ck.kind == "safetensors" and (os.path.isdir(ck.path) or ck.sharded)
    overwrite = bool(ctx.options.get("overwrite"))
    checkpoint_writer.check_destination(dst, as_folder, overwrite)
    names = ck.files if ck.kind == "safetensors" else [os.path.splitext(ck.files[0])[0] + ".safetensors"]
    meta = dict(metadata) if metadata is not None else {"format": "pt"}
    files: dict[str, OutFile] = {f: OutFile(f, meta) for f in names}
    seen: set[str] = set()
    for t in plan.tensors:
        f = files.setdefault(t.file, OutFile(t.file, meta))
        for s in t.mapped.specs:
            if s.name in seen:
                raise error("EXPORT_UNMAPPABLE", f"{label}: two tensors would be written as {s.name!r}", tensor=t.name)
            seen.add(s.name)
            f.tensors.append(OutTensor(s, _never(s.name)))
        f.groups.append(OutGroup(tuple(s.name for s in t.mapped.specs), t.produce))
    outs = [files[f] for f in files if files[f].tensors or len(files) == 1]
    if not as_folder:
        outs[0].name = os.path.basename(dst)
    extra: dict[str, bytes] = dict(extra_files or {})
    side: list[checkpoint_writer.SideFile] = []
    if as_folder:
        side = out_.source_side_files(ck, os.path.abspath(dst), skip={"config.json", *extra})
        cfg = config(ck.config) if config is not None else ck.config
        if isinstance(cfg, dict):
            extra["config.json"] = (json.dumps(cfg, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    total = sum(f.data_bytes for f in outs)
    bar = out_.ByteProgress(total, ctx.options.get("progress"), f"export {label}")
    try:
        return checkpoint_writer.write_checkpoint(
            dst, outs, as_folder=as_folder, overwrite=overwrite, side_files=side, index=out_.index_spec(ck, resharded=False),
            verify=_verify_plain, written=out_.release_after(ck.release, bar), extra_files=extra)
    finally:
        bar.close()


def _never(name: str) -> Callable[[], np.ndarray]:
    def never() -> np.ndarray:  # grouped: made by its group
        raise AssertionError(name)

    return never


def _verify_plain(path: str) -> None:
    """A written file must be a well-formed safetensors file (qformat's container rules)."""
    from ..check import check_file

    rep = check_file(path, payload=False)
    if not rep.ok:
        p = rep.problems[0]
        raise error("SAVE_INVALID", f"the exported file fails qformat check: {p.code}: {p.message}", tensor=p.tensor)
