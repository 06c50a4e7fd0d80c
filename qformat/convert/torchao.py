"""Source ``torchao``: placeholder until its converter lands (issue 5); it detects nothing."""

from __future__ import annotations

from .base import Checkpoint, Converter, Described, unsupported


class TorchAO(Converter):
    name = "torchao"
    title = "torchao (not yet implemented)"

    def detect(self, ck: Checkpoint) -> bool:
        return False

    def describe(self, ck: Checkpoint) -> Described:
        raise unsupported("the torchao converter is not implemented yet")
