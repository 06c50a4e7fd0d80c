"""The architecture table (qformat/architectures/): every module of the package is listed, each
entry names a gguf-py architecture and maps names both ways consistently."""

from __future__ import annotations

import pkgutil

import pytest

import qformat.architectures as A


def test_every_module_is_listed() -> None:
    names = {m.name for m in pkgutil.iter_modules(A.__path__)} - {"base"}
    assert names == {m.__name__.rsplit(".", 1)[1] for m in A._MODULES}


@pytest.mark.parametrize("arch", sorted(A.ARCHITECTURES))
def test_entry_names_a_gguf_architecture(arch: str) -> None:
    import gguf

    entry = A.ARCHITECTURES[arch]
    member = gguf.MODEL_ARCH[entry.model_arch]
    assert gguf.MODEL_ARCH_NAMES[member] == entry.name
    assert A.by_gguf(arch) is entry and all(A.by_model_type(mt) is entry for mt in entry.model_types)
