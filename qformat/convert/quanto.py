"""Source ``quanto``: placeholder until its converter lands (issue 5); it detects nothing."""

from __future__ import annotations

from .base import Checkpoint, Converter, Described, unsupported


class Quanto(Converter):
    name = "quanto"
    title = "quanto (not yet implemented)"

    def detect(self, ck: Checkpoint) -> bool:
        return False

    def describe(self, ck: Checkpoint) -> Described:
        raise unsupported("the quanto converter is not implemented yet")
