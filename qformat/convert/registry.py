"""The registered source formats: one module per format, one class per module, keyed by the
stable id that ``qformat convert --from`` takes.  A new converter joins every parametrized
converter test by being listed here."""

from __future__ import annotations

from .awq import AWQ
from .base import Converter
from .bitsandbytes import BitsAndBytes
from .compressed_tensors import CompressedTensors
from .gguf import GGUF
from .gpt_oss import GptOss
from .gptq import GPTQ
from .mlx import MLX
from .modelopt import ModelOpt
from .qformat_ import QFormatSource
from .quanto import Quanto
from .torchao import TorchAO

REGISTRY: dict[str, type[Converter]] = {
    c.name: c
    for c in (QFormatSource, GPTQ, AWQ, CompressedTensors, BitsAndBytes, MLX, ModelOpt, GptOss, Quanto, TorchAO, GGUF)
}
