"""Fixtures of the framework readers' tests."""

from __future__ import annotations

import pytest

from qformat import kernels


@pytest.fixture(autouse=True)
def _reader_ops_path():
    """These tests check the readers' own decode steps (the torch reader's torch ops, the path
    CUDA tensors take): CPU decodes stay off the core's native kernel, which the torch reader
    otherwise hands them to.  tests/test_kernels.py checks that route against these steps."""
    with kernels.use("numpy"):
        yield
