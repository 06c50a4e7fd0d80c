"""The architecture table: what llama.cpp's GGUF and transformers' checkpoints of one model
architecture differ in, one module per architecture (:class:`.base.Architecture`), read by
``qformat convert model.gguf out/`` (GGUF -> Hugging Face folder, which checks transformers'
loader against it) and ``qformat export --to gguf`` (folder -> GGUF, which applies it).

Every module of this package except ``base`` is one entry: it defines ``ARCH`` (or ``ARCHS``, a
tuple, for a module holding several related entries) and is listed in ``_MODULES`` below
(tests/test_architectures.py checks that every module is listed: no module is imported by a
name computed at run time).

An architecture that is not here is refused by name (``EXPORT_UNMAPPABLE``): a GGUF written with
transformers' tensor names, or without the keys llama.cpp reads, does not load there.
"""

from __future__ import annotations

from types import ModuleType

from . import bloom, gemma2, gemma3, gpt2, llama, phi3, qwen2, qwen3, stablelm, starcoder2
from .base import Architecture, rotary_permutation

_MODULES: tuple[ModuleType, ...] = (bloom, gemma2, gemma3, gpt2, llama, phi3, qwen2, qwen3, stablelm, starcoder2)


def _entries() -> list[Architecture]:
    found: list[Architecture] = []
    for mod in _MODULES:
        found.extend(getattr(mod, "ARCHS", ()) or (getattr(mod, "ARCH"),))
    return found


#: GGUF general.architecture -> its entry.
ARCHITECTURES: dict[str, Architecture] = {}
for _a in _entries():
    if _a.name in ARCHITECTURES:
        raise RuntimeError(f"two architecture modules define {_a.name!r}")
    ARCHITECTURES[_a.name] = _a
#: config.json model_type -> its entry.
MODEL_TYPES: dict[str, Architecture] = {mt: a for a in ARCHITECTURES.values() for mt in a.model_types}

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "Architecture", "by_gguf", "by_model_type", "rotary_permutation"]


def by_model_type(model_type: object) -> Architecture | None:
    """The entry whose config.json ``model_type`` is ``model_type`` (None: not in the table)."""
    return MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def by_gguf(arch: object) -> Architecture | None:
    """The entry whose GGUF ``general.architecture`` is ``arch`` (None: not in the table)."""
    return ARCHITECTURES.get(arch) if isinstance(arch, str) else None
