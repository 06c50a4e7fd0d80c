"""Shared fixtures: small and generic (file builders live in tests/filebuild.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

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
