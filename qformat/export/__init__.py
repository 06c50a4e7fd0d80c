"""Export: qformat checkpoints out to other ecosystems' formats, bit-exact or refused.

``export(src, dst, to=...)`` reads anything qformat reads (a qformat file, folder or index,
a source converted in place, or any format ``qformat convert`` recognises, described the
same way) and writes the checkpoint in the target's own format: ``gguf``,
``compressed-tensors``, ``mlx`` or ``bitsandbytes`` (one module each, :mod:`.registry`).

Every tensor is planned from its descriptor before anything is written: the target either
has a form for it (:class:`~.base.Mapped`) or refuses it (``EXPORT_UNMAPPABLE``, naming the
tensor, the target and the reason).  Then each tensor is built, decoded again by the target's
own rule and compared with qformat's binary32 values bit for bit (:func:`~.base.checked`);
a difference is ``EXPORT_NOT_EXACT``.  With ``allow_rounding`` a tensor with no exact form is
re-encoded with a scheme the target holds (:meth:`~.base.Target.fallback`) and every inexact
tensor is reported with its max abs difference and SQNR.  One tensor at a time (GGUF's block
types one slice of rows at a time, built, checked and written as they come:
:func:`~.base.checked_chunks`), written atomically: on any refusal nothing is left at ``dst``.  SPEC.md Appendix D gives each
target's mapping table.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from ..checkpoint.writer import check_destination, destination_error, resolve_destination, writing_for
from ..errors import error
from .base import (Context, ExportPlan, Mapped, Parts, Refusal, Report, TensorExport, Target, checked, checked_chunks, plain_mapped,
                   row_chunkable, unmappable)
from .registry import get, targets


def open_source(src: str | os.PathLike[str]) -> tuple[Any, Any]:
    """(checkpoint, what it describes) for any source qformat reads: a qformat checkpoint
    through its descriptors, another format through its converter, a plain one as is."""
    from ..convert import detect
    from ..checkpoint.source import Checkpoint
    from ..convert.base import Described

    ck = Checkpoint(src)
    try:
        conv = detect(ck)
    except Exception as e:  # noqa: BLE001 - an unrecognised source is a plain checkpoint
        from ..errors import QFormatError

        if isinstance(e, QFormatError) and e.code == "CONVERT_FORMAT_UNKNOWN" and ck.kind == "safetensors":
            return ck, Described()
        raise
    return ck, conv.describe(ck)


def plan_export(target: Target, ck: Any, described: Any, ctx: Context, report: Report) -> ExportPlan:
    """Every tensor's target form, from descriptors alone (nothing is read or written)."""
    from ..convert.writer import items
    from ..descriptor import parse_descriptor
    from ..schemes import plan as scheme_plan

    tensors: list[TensorExport] = []
    for item in items(ck, described):
        desc = item.parsed
        name = item.name
        if desc is None:
            try:
                mapped = target.map(name, None, ctx)
            except Refusal as r:
                raise unmappable(name, target.name, r.reason) from None
            tensors.append(TensorExport(name, mapped, item.file, checked(
                name, target.name, mapped, lambda n=name: Parts(None, ctx.source, n), lambda p: p.decoded(), ctx.allow_rounding, report)))
            continue
        try:
            mapped = target.map(name, desc, ctx)
        except Refusal as r:
            fb = target.fallback(name, desc, ctx) if ctx.allow_rounding else None
            if fb is None:
                if hasattr(ck, "admit"):
                    ck.admit(name)  # a tensor `qformat check` refuses is refused with check's code first
                raise unmappable(name, target.name, r.reason) from None
            scheme, params = fb
            planned, _ = scheme_plan(desc.shape, scheme, desc.dtype, **params)
            pdesc = parse_descriptor(name, planned)
            mapped = target.map(name, pdesc, ctx)  # a fallback scheme maps by construction
            label = f"{scheme} " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
            tensors.append(TensorExport(name, mapped, item.file, _reencoded(name, target, mapped, desc, ctx, report, scheme, params, label),
                                        reencoded=label.strip()))
            continue
        make_parts = (lambda d=desc, n=name: Parts(d, ctx.source, n))
        want = (lambda p, m=mapped: p.decoded(own_dtype=m.in_dtype))
        chunks = checked_chunks(name, target.name, mapped, make_parts, want, report) if row_chunkable(mapped, desc, ctx.allow_rounding) else None
        tensors.append(TensorExport(name, mapped, item.file, checked(name, target.name, mapped, make_parts, want, ctx.allow_rounding, report),
                                    chunks=chunks))
    return ExportPlan(tensors, report)


def _reencoded(name: str, target: Target, mapped: Mapped, desc: Any, ctx: Context, report: Report,
               scheme: str, params: dict[str, Any], label: str) -> Any:
    """The producer of a tensor re-encoded for ``--allow-rounding``: qformat's values of the
    source, encoded with the fallback scheme, built into the target, compared with the source."""
    from ..descriptor import parse_descriptor
    from ..schemes import quantize
    from ..sources import ArraySource

    source_parts = Parts(desc, ctx.source, name)
    values: dict[str, Any] = {}

    def parts() -> Parts:
        x = source_parts.decoded(own_dtype=True)
        values["want"] = x if mapped.in_dtype else source_parts.decoded()
        q = quantize(x, scheme, dtype=desc.dtype, **params)
        return Parts(parse_descriptor(name, q.descriptor), ArraySource(q.components), name)

    return checked(name, target.name, mapped, parts, lambda _p: values.pop("want"), True, report, reencoded=label.strip())


@writing_for("export")
def export(src: str | os.PathLike[str], dst: str | os.PathLike[str], to: str, *, allow_rounding: bool = False,
           overwrite: bool = False, progress: TextIO | None = None, **options: Any) -> Report:
    """Export the checkpoint at ``src`` to ``dst`` in the format ``to`` (see :func:`targets`).

    Every tensor maps exactly, verified bit for bit on its data, or the export fails with
    ``EXPORT_UNMAPPABLE`` / ``EXPORT_NOT_EXACT`` and nothing is written; ``allow_rounding``
    re-encodes what does not map and reports each rounded tensor.  ``options`` are the
    target's own: ``gguf_pre`` names the GGUF pre-tokenizer (``--gguf-pre``) where the
    tokenizer's fingerprint is not in llama.cpp's table.  Returns the :class:`~.base.Report`.
    """
    target = get(to)
    ck, described = open_source(src)
    from ..convert.writer import CombinedSource

    # the destination first: a wrong one is refused before any tensor is planned or read
    as_folder = target.name != "gguf" and ck.kind == "safetensors" and (os.path.isdir(ck.path) or ck.sharded)
    stem = ck.files[0] if ck.kind == "safetensors" else os.path.splitext(ck.files[0])[0] + ".safetensors"
    dst = resolve_destination(dst, as_folder, os.path.splitext(stem)[0] + ".gguf" if target.name == "gguf" else stem)
    if dst == ck.path or dst in [os.path.join(ck.folder, f) for f in ck.files]:
        raise destination_error(f"the destination {dst} is the source itself")
    check_destination(dst, as_folder, overwrite)  # the target's writer checks again when it writes
    ctx = Context(ck, CombinedSource(ck, described), allow_rounding=allow_rounding, options=dict(options, progress=progress, overwrite=overwrite))
    report = Report(target=target.name)
    plan = plan_export(target, ck, described, ctx, report)
    report.files = target.write(dst, plan, ctx)
    report.bytes = sum(os.path.getsize(f) for f in report.files if os.path.isfile(f))
    return report


__all__ = ["Report", "Target", "export", "get", "open_source", "plan_export", "targets"]
