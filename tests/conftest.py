"""Shared fixtures: small and generic (file builders live in tests/filebuild.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import qformat

from .filebuild import valid_file


@pytest.fixture
def write_bytes(tmp_path: Path) -> Callable[..., Path]:
    """``write_bytes(data, name="t.safetensors") -> Path``: write raw bytes into tmp_path."""

    def _write(data: bytes, name: str = "t.safetensors") -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    return _write


@pytest.fixture
def valid_path(write_bytes: Callable[..., Path]) -> Path:
    """A small valid qformat file (int4 tensor "w" [4, 8] plus a plain F32 tensor "b")."""
    return write_bytes(valid_file(), "valid.safetensors")


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory) -> Path:
    """A file of three quantized tensors (int4 g32, nf4 with double quantization, nvfp4 in
    bfloat16) and two plain ones (float32, int64): an MLP's worth of every kind."""
    rng = np.random.default_rng(0)
    tensors = {
        "w1": qformat.quantize(rng.normal(size=(64, 96)).astype(np.float32), "int", bits=4, group_size=32),
        "b1": rng.normal(size=64).astype(np.float32),
        "w2": qformat.quantize(rng.normal(size=(16, 64)).astype(np.float32), "nf4", double_quant=True),
        "w3": qformat.quantize(rng.normal(size=(16, 16)).astype(np.float32), "nvfp4", dtype="bfloat16"),
        "steps": np.arange(3, dtype=np.int64),
    }
    path = tmp_path_factory.mktemp("mixed") / "mixed.safetensors"
    qformat.save_file(tensors, path)
    return path
