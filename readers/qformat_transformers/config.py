"""QFormatConfig: ``quantization_config={"quant_method": "qformat", ...}`` for transformers.

The same parameters and recipe language as ``qformat quantize`` (:mod:`qformat.recipe`):
``QFormatConfig(scheme="int", bits=4, group_size=32)`` quantizes under the default selection
rule, ``recipe=`` takes a TOML path, TOML text, a :class:`qformat.recipe.Recipe` or its dict.
``QFormatConfig()`` with neither reads a checkpoint that is already in qformat (including one
``qformat convert`` described in place, whose config.json still names its source format).
Loading is strict unless ``strict=False``: a checkpoint whose tensors do not fit the model
raises LOAD_MISMATCH before anything is read.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping

from transformers.utils.quantization_config import QuantizationConfigMixin

QUANT_METHOD = "qformat"


def _recipe_text(recipe: str) -> bool:
    """A recipe string is TOML text (rather than a path) when it holds a newline or a table."""
    return "\n" in recipe or "[" in recipe or "=" in recipe


class QFormatConfig(QuantizationConfigMixin):
    """The quantization config of qformat checkpoints.

    * ``scheme`` and ``**params`` (``bits``, ``group_size``, ``block_size``, ``dtype``, ... as
      :func:`qformat.quantize` takes them): the default choice, applied under the default
      selection rule (as ``qformat quantize --scheme``).  Fast by default: scheme ``"int"`` on a
      bfloat16 checkpoint stores bfloat16 scales unless ``scale_dtype`` says otherwise (the
      scheme's default for a bfloat16 logical dtype), the dtype torch's native CPU kernels take,
      so ``QFormatConfig(scheme="int", bits=4, group_size=32)`` (or ``bits=8, group_size=None``)
      runs those kernels with bfloat16 activations under the default kernel policy, each weight
      they multiply being ``q * s`` exactly as stored (see :mod:`qformat_torch.kernels` for the
      bound against the decode path);
    * ``kernel`` (default None: the process policy, :func:`qformat_torch.kernels.set_kernel_policy`,
      itself ``"auto"`` by default): the kernel policy of every QLinear the load makes;
      ``"decode"`` keeps the exact path (bit-identical to F.linear on the decoded weights).  A
      runtime choice: config.json does not record it;
    * ``recipe``: ordered rules (a TOML path or text, a Recipe, or its dict);
    * ``rules`` / ``default`` / ``spec_version``: what config.json records (``qformat quantize``
      writes them; they are kept for saving and are informative when loading);
    * ``strict`` (default True): before anything is read, compare the checkpoint's tensors with
      the model's as transformers maps names, and raise LOAD_MISMATCH (naming the first few on
      each side) for checkpoint tensors the model has no place for, model weights the checkpoint
      does not fill (which transformers would initialise randomly) and shapes that differ.
      ``strict=False`` leaves all of that to transformers' own loading report (to load a base
      checkpoint into a model with a new head, say).  config.json records it only when False.
    """

    def __init__(self, scheme: str | None = None, recipe: Any = None, *, rules: list[Any] | None = None,
                 default: Mapping[str, Any] | None = None, spec_version: str | None = None, strict: bool = True,
                 kernel: str | None = None, quant_method: str = QUANT_METHOD, **params: Any):
        if quant_method != QUANT_METHOD:
            raise ValueError(f"QFormatConfig is for quant_method {QUANT_METHOD!r}, found {quant_method!r}")
        if not isinstance(strict, bool):
            raise ValueError(f"QFormatConfig(strict=...) takes True or False, found {strict!r}")
        if kernel is not None and kernel not in ("auto", "native", "decode"):  # qformat_torch.kernels.POLICIES
            raise ValueError(f"QFormatConfig(kernel=...) takes 'auto', 'native', 'decode' or None, found {kernel!r}")
        self.kernel = kernel
        self.quant_method = QUANT_METHOD
        self.strict = strict
        self.scheme = scheme
        self.params = dict(params)
        if isinstance(recipe, str) and not _recipe_text(recipe):
            recipe = os.fspath(recipe)
        self.recipe = recipe
        self.rules = list(rules) if rules is not None else None
        self.default = dict(default) if default is not None else None
        self.spec_version = spec_version

    # transformers' get_hf_quantizer reads ``config.quantization_config`` with ``.get``: a
    # QFormatConfig set on a model config (the route for in-place converted checkpoints, whose
    # config.json names their source format) answers as the dict it stands for.
    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    @property
    def quantizes(self) -> bool:
        """Whether this config asks to quantize on load (a scheme or a recipe was given)."""
        return self.scheme is not None or self.recipe is not None

    def build_recipe(self) -> Any:
        """The :class:`qformat.recipe.Recipe` of ``scheme``/``params``/``recipe`` (as ``qformat
        quantize`` resolves them; QUANTIZE_RECIPE_INVALID, SCHEME_UNKNOWN, ENCODE_PARAM_INVALID)."""
        from qformat.checkpoint.quantize import resolve_recipe
        from qformat.recipe import Recipe

        recipe = self.recipe
        if isinstance(recipe, str) and _recipe_text(recipe):
            recipe = Recipe.from_toml(recipe)
        if recipe is None and self.scheme is None and (self.rules or self.default):
            # A recorded config.json recipe: its [default] carries "selection": "default".
            recipe = {"rules": list(self.rules or [])}
            if self.default:
                recipe["default"] = {k: v for k, v in self.default.items() if k != "selection"}
        return resolve_recipe(self.scheme, recipe, self.params)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"quant_method": QUANT_METHOD}
        if self.spec_version is not None:
            d["spec_version"] = self.spec_version
        if self.rules is not None or self.default is not None:
            d["rules"] = copy.deepcopy(self.rules if self.rules is not None else [])
            if self.default is not None:
                d["default"] = copy.deepcopy(self.default)
        elif self.quantizes:
            d.update(self.build_recipe().to_dict())
        if not self.strict:
            d["strict"] = False
        return d

    def to_diff_dict(self) -> dict[str, Any]:
        return self.to_dict()

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.to_dict().items()

    @classmethod
    def from_dict(cls, config_dict: Mapping[str, Any], return_unused_kwargs: bool = False, **kwargs: Any) -> Any:
        cfg = cls(**dict(config_dict))
        if return_unused_kwargs:
            return cfg, kwargs
        return cfg
