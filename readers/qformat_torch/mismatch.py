"""LOAD_MISMATCH: the one error of a checkpoint whose tensors do not fit the model's.

Both loaders that put a checkpoint into an existing model, :func:`qformat_torch.load_model` and
``from_pretrained`` through :mod:`qformat_transformers`, compare the two sides before anything is
read and raise this error, which names the first few tensors on each side and counts them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from qformat.errors import QFormatError, error

#: The code of "the checkpoint does not fit the model".
MISMATCH_CODE = "LOAD_MISMATCH"
#: How many names of each kind the message shows.
SHOWN = 5


@dataclass
class Mismatch:
    """What does not fit, in the names a user recognises.

    * ``unused``: checkpoint tensors the model has no place for (a quantized tensor under its
      logical name, never its components);
    * ``missing``: the model's state_dict entries nothing in the checkpoint fills;
    * ``shapes``: (checkpoint tensor, model entry, checkpoint shape, model shape).
    """

    unused: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    shapes: list[tuple[str, str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.unused or self.missing or self.shapes)

    def error(self, model: str, hint: str = "") -> QFormatError:
        """The LOAD_MISMATCH error; ``tensor`` is the first tensor with a wrong shape, else the
        first unused checkpoint tensor, else the first missing model entry."""
        parts = []
        if self.shapes:
            shown = ", ".join(_shape(*s) for s in self.shapes[:SHOWN])
            parts.append(f"{_count(len(self.shapes), 'checkpoint tensor', 'differs', 'differ')} in shape from the model: "
                         f"{shown}{_more(self.shapes)}")
        if self.unused:
            parts.append(f"{_count(len(self.unused), 'checkpoint tensor', 'has', 'have')} no place in the model: "
                         f"{_names(self.unused)}")
        if self.missing:
            parts.append(f"{_count(len(self.missing), 'model tensor', 'is', 'are')} not in the checkpoint: "
                         f"{_names(self.missing)}")
        first = (self.shapes[0][0] if self.shapes else self.unused[0] if self.unused
                 else self.missing[0] if self.missing else None)
        message = f"the checkpoint does not fit {model}: " + "; ".join(parts) + ". Nothing was loaded"
        return error(MISMATCH_CODE, message + (f". {hint}" if hint else ""), tensor=first)


def _count(n: int, what: str, verb: str, verb_plural: str) -> str:
    return f"{n} {what} {verb}" if n == 1 else f"{n} {what}s {verb_plural}"


def _shape(ckpt: str, target: str, have: tuple[int, ...], want: tuple[int, ...]) -> str:
    where = "" if ckpt == target else f" for {target}"
    return f"{ckpt}{where} (checkpoint {list(have)}, model {list(want)})"


def _more(items: Sequence[object]) -> str:
    return f", ... ({len(items) - SHOWN} more)" if len(items) > SHOWN else ""


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:SHOWN]) + _more(names)
