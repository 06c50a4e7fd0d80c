"""The architecture table: what llama.cpp's GGUF and transformers' checkpoints of one model
architecture differ in, one module per architecture (:class:`.base.Architecture`), read by
``qformat convert model.gguf out/`` (GGUF -> Hugging Face folder, which checks transformers'
loader against it) and ``qformat export --to gguf`` (folder -> GGUF, which applies it).

An architecture that is not here is refused by name (``EXPORT_UNMAPPABLE``): a GGUF written with
transformers' tensor names, or without the keys llama.cpp reads, does not load there.
"""

from __future__ import annotations

from .base import Architecture, rotary_permutation
from .gemma3 import ARCH as GEMMA3
from .llama import ARCH as LLAMA
from .qwen2 import ARCH as QWEN2

#: GGUF general.architecture -> its entry.
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA, QWEN2, GEMMA3)}
#: config.json model_type -> its entry.
MODEL_TYPES: dict[str, Architecture] = {mt: a for a in ARCHITECTURES.values() for mt in a.model_types}

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "Architecture", "by_gguf", "by_model_type", "rotary_permutation"]


def by_model_type(model_type: object) -> Architecture | None:
    return MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def by_gguf(arch: object) -> Architecture | None:
    return ARCHITECTURES.get(arch) if isinstance(arch, str) else None
