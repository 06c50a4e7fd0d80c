"""Loader for the data tables in ``qformat/tables/`` and the JSON Schema.

These JSON files are the single source of truth: the code reads them here, and SPEC.md's
tables are generated from them (``python -m qformat.specgen``), with a test that fails when
the two drift apart.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np


def _load(name: str) -> dict[str, Any]:
    text = resources.files("qformat").joinpath(name).read_text(encoding="utf-8")
    data = json.loads(text)
    data.pop("_comment", None)
    return data


@lru_cache(maxsize=None)
def errors() -> dict[str, dict[str, str]]:
    """Error code -> {category, meaning}."""
    return _load("tables/errors.json")


@lru_cache(maxsize=None)
def dtypes() -> dict[str, dict[str, Any]]:
    """safetensors dtype name -> {bits, kind, numpy}."""
    return _load("tables/dtypes.json")


@lru_cache(maxsize=None)
def float_formats() -> dict[str, dict[str, Any]]:
    """Float mini-format name -> its parameters."""
    return _load("tables/float_formats.json")


@lru_cache(maxsize=None)
def codebooks() -> dict[str, dict[str, Any]]:
    """Named codebook -> {bits, description, values_f32 (hex bit patterns)}."""
    return _load("tables/codebooks.json")


@lru_cache(maxsize=None)
def codebook_values(name: str) -> np.ndarray:
    """The float32 values of a named codebook, exact to the bit."""
    hexes = codebooks()[name]["values_f32"]
    return np.array([int(h, 16) for h in hexes], dtype=np.uint32).view(np.float32)


@lru_cache(maxsize=None)
def layouts() -> dict[str, dict[str, Any]]:
    """Device layout name -> {status, parameters, description}."""
    return _load("tables/layouts.json")


@lru_cache(maxsize=None)
def limits() -> dict[str, int]:
    """Limit name -> value."""
    return {k: v["value"] for k, v in _load("tables/limits.json").items()}


@lru_cache(maxsize=None)
def limits_table() -> dict[str, dict[str, Any]]:
    return _load("tables/limits.json")


@lru_cache(maxsize=None)
def schemes() -> dict[str, dict[str, Any]]:
    """Encoder scheme id -> {description, parameters}."""
    return _load("tables/schemes.json")


@lru_cache(maxsize=None)
def gguf_presets() -> dict[str, dict[str, Any]]:
    """llama-quantize preset -> {ftype, type, per-category rules} (qformat.gguf_presets)."""
    return _load("tables/gguf_presets.json")


@lru_cache(maxsize=None)
def schema() -> dict[str, Any]:
    """The JSON Schema of the qformat metadata object (this major version)."""
    return _load("schema/qformat-1.0.schema.json")
