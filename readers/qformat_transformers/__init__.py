"""qformat for transformers: ``from_pretrained`` and ``save_pretrained`` of qformat checkpoints.

Importing this package registers ``quant_method: "qformat"`` with transformers' public
``register_quantization_config`` / ``register_quantizer``; then

* ``AutoModelForCausalLM.from_pretrained(dir)`` loads a checkpoint written by ``qformat
  quantize`` (its config.json says ``quantization_config: {"quant_method": "qformat", ...}``):
  every ``nn.Linear`` whose weight is a qformat logical tensor becomes a
  :class:`qformat_torch.nn.QLinear` holding the packed components (never decoded to full
  precision in memory); everything else loads as transformers loads it;
* ``from_pretrained(fp_dir, quantization_config=QFormatConfig(scheme="nf4"))`` (or
  ``recipe=``) quantizes a plain checkpoint on load with ``qformat quantize``'s rules and
  encoders, one weight at a time;
* a checkpoint ``qformat convert`` described in place keeps its source's quantization_config;
  read it through qformat's descriptors with :func:`qformat_config` (a model config whose
  quantization_config is a :class:`QFormatConfig`, passed as ``config=``);
* ``save_pretrained`` writes what ``qformat quantize`` writes (descriptors and component bytes);
* loading is strict: a checkpoint whose tensors do not fit the model (names the model has no
  place for, model weights left unfilled, shapes) raises LOAD_MISMATCH before anything is read,
  names compared as transformers maps them; ``QFormatConfig(strict=False)`` leaves that to
  transformers' loading report.  transformers keeps a qformat checkpoint's own
  quantization_config over a ``quantization_config=`` argument, so there it goes through
  ``config=qformat_config(path, QFormatConfig(strict=False))``.

Reach it as ``qformat.transformers`` or ``import qformat_transformers``.
"""

from __future__ import annotations

from typing import Any, Mapping

import qformat_quiet

qformat_quiet.install()  # before transformers imports its quantizers' backends (torchao, bitsandbytes)

from transformers.quantizers import register_quantization_config, register_quantizer  # noqa: E402
from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING  # noqa: E402

from .config import QUANT_METHOD, QFormatConfig
from .quantizer import MISMATCH_CODE, PendingQLinear, QFormatHfQuantizer

# Registration happens once per process (the registry refuses a second registration).
if AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is not QFormatConfig:
    register_quantization_config(QUANT_METHOD)(QFormatConfig)
if AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD) is not QFormatHfQuantizer:
    register_quantizer(QUANT_METHOD)(QFormatHfQuantizer)


def qformat_config(pretrained: Any, quantization_config: QFormatConfig | None = None, **kwargs: Any) -> Any:
    """The model config of ``pretrained`` (a folder or hub id, as ``AutoConfig.from_pretrained``
    takes it) with its quantization_config replaced by ``quantization_config`` (default
    ``QFormatConfig()``), for ``from_pretrained(pretrained, config=...)``.

    This is the route for a checkpoint ``qformat convert`` described in place: its config.json
    still names GPTQ, AWQ, bitsandbytes or compressed-tensors, and transformers refuses a
    ``quantization_config=`` argument of another kind than the one in config.json.  It is also
    how loading options such as ``strict=False`` reach a qformat checkpoint, whose own
    quantization_config transformers prefers to an argument; the recipe and spec version that
    config.json records are kept (a later ``save_pretrained`` writes them again).
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, **kwargs)
    new = quantization_config if quantization_config is not None else QFormatConfig()
    old = getattr(config, "quantization_config", None)
    if isinstance(old, Mapping) and old.get("quant_method") == QUANT_METHOD and not new.quantizes and new.rules is None:
        recorded = QFormatConfig.from_dict({k: v for k, v in old.items() if k != "strict"})
        new.rules, new.default = recorded.rules, recorded.default
        new.spec_version = new.spec_version or recorded.spec_version
    config.quantization_config = new
    return config


__all__ = ["MISMATCH_CODE", "PendingQLinear", "QFormatConfig", "QFormatHfQuantizer", "qformat_config"]
