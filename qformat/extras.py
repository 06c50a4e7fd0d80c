"""The framework extras (``qformat.torch``, ``qformat.jax``, ``qformat.transformers``): each is
an alias of a reader package in ``readers/`` that needs its framework installed.  A missing
framework is said with the install line, not as a bare ``No module named 'torch'``."""

from __future__ import annotations

import importlib
from types import ModuleType

#: alias -> (reader package, the frameworks it imports, the packaging extra that installs them)
EXTRAS = {
    "torch": ("qformat_torch", ("torch",), "torch"),
    "jax": ("qformat_jax", ("jax",), "jax"),
    "transformers": ("qformat_transformers", ("torch", "transformers"), "transformers"),
}


def reader(alias: str) -> ModuleType:
    """Import the reader package behind ``qformat.<alias>``; raise :class:`ModuleNotFoundError`
    with the ``pip install`` line when a framework it needs is not installed."""
    package, frameworks, extra = EXTRAS[alias]
    for fw in frameworks:
        try:
            importlib.import_module(fw)
        except ModuleNotFoundError as e:
            if e.name != fw:  # the framework is there but broken: its own error says more
                raise
            cpu = (" (on a machine without a GPU, first pip install torch --index-url "
                   "https://download.pytorch.org/whl/cpu: the CPU build)") if fw == "torch" else ""
            raise ModuleNotFoundError(f"qformat.{alias} needs {fw}, which is not installed: pip install 'qformat[{extra}]'{cpu}",
                                      name=fw) from None
    return importlib.import_module(package)
