"""Source ``qformat``: an existing qformat checkpoint, re-described as it is.

With ``--repack`` this rewrites any qformat file into the canonical layout; in place it is a
verified copy.
"""

from __future__ import annotations

import json

from ..model import METADATA_KEY
from .base import Checkpoint, Converter, Described, source_error


class QFormatSource(Converter):
    name = "qformat"
    title = "qformat files (re-described as they are; --repack canonicalizes them)"
    priority = 0

    def detect(self, ck: Checkpoint) -> bool:
        return ck.kind == "safetensors" and ck.has_qformat()

    def describe(self, ck: Checkpoint) -> Described:
        out = Described()
        for f in ck.files:
            raw = ck.metadata(f).get(METADATA_KEY)
            if raw is None:
                continue
            try:
                obj = json.loads(raw)
                tensors = obj["tensors"]
                assert isinstance(tensors, dict)
            except (ValueError, KeyError, TypeError, AssertionError):
                raise source_error(f"{f} has a qformat object without a 'tensors' object") from None
            for name, d in tensors.items():
                out.descriptors[name] = d
        return out
