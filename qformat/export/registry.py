"""The registered export targets: one module per target format, one class per module, keyed
by the stable id that ``qformat export --to`` takes.  Modules are imported when first used, so
a target's import cost is paid only by an export to it.  A new target joins every
parametrized export test by being listed here."""

from __future__ import annotations

from typing import Callable

from ..errors import error
from .base import Target


# Each target's module is imported only when the target is used (its tables, and the cost of
# building them, are paid by an export to it alone).
def _gguf() -> type[Target]:
    from .gguf import GGUF

    return GGUF


def _compressed_tensors() -> type[Target]:
    from .compressed_tensors import CompressedTensors

    return CompressedTensors


def _mlx() -> type[Target]:
    from .mlx import MLX

    return MLX


def _bitsandbytes() -> type[Target]:
    from .bitsandbytes import BitsAndBytes

    return BitsAndBytes


#: target id -> the function returning its class
REGISTRY: dict[str, Callable[[], type[Target]]] = {
    "gguf": _gguf,
    "compressed-tensors": _compressed_tensors,
    "mlx": _mlx,
    "bitsandbytes": _bitsandbytes,
}


def targets() -> list[str]:
    """Registered target ids, in registry order."""
    return list(REGISTRY)


def get(name: str) -> Target:
    """A new instance of the target ``name`` (``EXPORT_TARGET_UNKNOWN`` when none)."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise error("EXPORT_TARGET_UNKNOWN", f"no export target named {name!r}; known: {', '.join(targets())}", field="to")
    return factory()()
