"""The framework extras (``qformat.torch``, ``qformat.jax``, ``qformat.transformers``): each is
an alias of a reader package in ``readers/`` that needs its framework installed.  A missing
framework is said with the install line, not as a bare ``No module named 'torch'``.

Every import here is a plain ``import`` statement: nothing is imported by a computed name
(tests/test_never_executes.py holds the package to that)."""

from __future__ import annotations

from types import ModuleType

#: alias -> (the frameworks it imports, the packaging extra that installs them)
EXTRAS = {
    "torch": (("torch",), "torch"),
    "jax": (("jax",), "jax"),
    "transformers": (("torch", "transformers"), "transformers"),
}


def _missing(alias: str, fw: str, e: ModuleNotFoundError) -> ModuleNotFoundError:
    if e.name != fw:  # the framework is there but broken: its own error says more
        return e
    cpu = (" (on a machine without a GPU, first pip install torch --index-url "
           "https://download.pytorch.org/whl/cpu: the CPU build)") if fw == "torch" else ""
    return ModuleNotFoundError(f"qformat.{alias} needs {fw}, which is not installed: pip install 'qformat[{EXTRAS[alias][1]}]'{cpu}",
                               name=fw)


def _require_torch(alias: str) -> None:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:
        raise _missing(alias, "torch", e) from None


def reader(alias: str) -> ModuleType:
    """The reader package behind ``qformat.<alias>``; :class:`ModuleNotFoundError` with the
    ``pip install`` line when a framework it needs is not installed."""
    if alias == "torch":
        _require_torch(alias)
        import qformat_torch

        return qformat_torch
    if alias == "jax":
        try:
            import jax  # noqa: F401
        except ModuleNotFoundError as e:
            raise _missing(alias, "jax", e) from None
        import qformat_jax

        return qformat_jax
    if alias == "transformers":
        _require_torch(alias)
        try:
            import transformers  # noqa: F401
        except ModuleNotFoundError as e:
            raise _missing(alias, "transformers", e) from None
        import qformat_transformers

        return qformat_transformers
    raise KeyError(f"no framework extra {alias!r}")
