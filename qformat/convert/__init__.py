"""Converters from existing quantized checkpoint formats to qformat (``qformat convert``).

Each source format is one module of this package holding one :class:`~.base.Converter`
subclass, registered below under its stable id (what ``--from`` takes).  A converter only
*describes* the source: it returns descriptors over the source's own tensors (and any tensor
the source kept outside its files, such as a value from config.json).  :mod:`.writer` writes
the result, the same way for every source: in place (the source's names and bytes kept, so
its own runtime still loads the file) or, with ``repack``, in qformat's canonical layout
(:mod:`.repack`).  SPEC.md Appendix C documents what each converter writes.
"""

from __future__ import annotations

import os
from typing import TextIO

from ..errors import error
from .base import Checkpoint, Converter, Described
from .registry import REGISTRY
from .repack import describe_recorded
from .writer import Summary, write

def formats() -> list[str]:
    """Registered converter ids."""
    return sorted(REGISTRY)


def get(name: str) -> Converter:
    cls = REGISTRY.get(name)
    if cls is None:
        raise error("CONVERT_FORMAT_UNKNOWN", f"no converter named {name!r}; known: {', '.join(formats())}")
    return cls()


def detect(ck: Checkpoint) -> Converter:
    """The converter whose ``detect`` accepts the checkpoint (lowest priority value first)."""
    convs = sorted((get(n) for n in REGISTRY), key=lambda c: (c.priority, c.name))
    for c in convs:
        if c.detect(ck):
            return c
    raise error("CONVERT_FORMAT_UNKNOWN", f"cannot tell the format of {ck.path}; pass --from (one of {', '.join(formats())})")


def describe(src: str | os.PathLike[str], from_format: str | None = None) -> tuple[Checkpoint, Converter, Described]:
    """Open ``src``, pick its converter and return what it describes (nothing is written), with
    the source tensors and side files it consumed recorded (what ``--repack`` leaves out)."""
    ck = Checkpoint(src)
    conv = get(from_format) if from_format else detect(ck)
    return ck, conv, describe_recorded(conv, ck)


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], from_format: str | None = None,
            repack: bool = False, overwrite: bool = False, progress: TextIO | None = None) -> Summary:
    """Convert the checkpoint at ``src`` into a qformat checkpoint at ``dst``.

    ``src`` is a safetensors file, a folder (with config.json and side files), a sharded
    index (``*.safetensors.index.json``) or a GGUF file.  ``dst`` is a file for a single-file
    source and a folder otherwise; it is written atomically and must not exist unless
    ``overwrite``.  ``progress`` (a text stream) receives a progress bar for multi-file output.
    """
    ck, conv, described = describe(src, from_format)
    return write(ck, described, os.fspath(dst), repack=repack, overwrite=overwrite, progress=progress)


__all__ = ["Checkpoint", "Converter", "Described", "Summary", "convert", "describe", "detect", "formats", "get"]
