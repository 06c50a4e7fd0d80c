"""Source ``gpt-oss``: placeholder until its converter lands (issue 5); it detects nothing."""

from __future__ import annotations

from .base import Checkpoint, Converter, Described, unsupported


class GptOss(Converter):
    name = "gpt-oss"
    title = "gpt-oss (not yet implemented)"

    def detect(self, ck: Checkpoint) -> bool:
        return False

    def describe(self, ck: Checkpoint) -> Described:
        raise unsupported("the gpt-oss converter is not implemented yet")
