"""The framework extras (``qformat.torch``, ``qformat.jax``, ``qformat.transformers``): each is
an alias of a reader package in ``readers/`` that needs its framework installed.  A missing
framework is said with the install line, not as a bare ``No module named 'torch'``.

Every import here is a plain ``import`` statement of a reader package: nothing is imported by a
computed name (tests/test_never_executes.py), and no framework is imported by the core itself."""

from __future__ import annotations

import importlib.util
from types import ModuleType

#: alias -> (the frameworks it imports, the packaging extra that installs them)
EXTRAS = {
    "torch": (("torch",), "torch"),
    "jax": (("jax",), "jax"),
    "transformers": (("torch", "transformers"), "transformers"),
}


def _require(alias: str) -> None:
    """ModuleNotFoundError with the install line when a framework ``alias`` needs is missing.
    Looked up with find_spec: the neutral core never imports a framework itself (the reader
    package it hands over to does)."""
    for fw in EXTRAS[alias][0]:
        if importlib.util.find_spec(fw) is None:
            cpu = (" (on a machine without a GPU, first pip install torch --index-url "
                   "https://download.pytorch.org/whl/cpu: the CPU build)") if fw == "torch" else ""
            raise ModuleNotFoundError(f"qformat.{alias} needs {fw}, which is not installed: "
                                      f"pip install 'qformat[{EXTRAS[alias][1]}]'{cpu}", name=fw)


def reader(alias: str) -> ModuleType:
    """The reader package behind ``qformat.<alias>``; :class:`ModuleNotFoundError` with the
    ``pip install`` line when a framework it needs is not installed."""
    _require(alias)
    if alias == "torch":
        import qformat_torch

        return qformat_torch
    if alias == "jax":
        import qformat_jax

        return qformat_jax
    import qformat_transformers

    return qformat_transformers
