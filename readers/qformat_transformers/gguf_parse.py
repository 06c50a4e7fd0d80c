"""One parse of a GGUF's key/values for the whole ``hf`` conversion.

transformers reads a GGUF's metadata with gguf-py's ``GGUFReader`` (``load_gguf_checkpoint``),
which makes a NumPy memmap view per array element: seconds for a 100k-token vocabulary, and
hundreds of MB of views.  :func:`convert_gguf <.gguf_layout.convert_gguf>` used to pay that
twice (once for the config, once more inside ``AutoTokenizer.from_pretrained(gguf_file=)``),
on top of the core's own parse.

:func:`parsed_once` makes both go through one call of transformers' own
``load_gguf_checkpoint`` whose reader is :class:`KVReader`: the same ``fields`` / ``tensors``
interface, built from the key/values the core already parsed (the ``gguf`` converter's record,
:func:`.gguf_hparams.read_kv`), so every value transformers derives (config, tokenizer fields)
is what it derives from the file itself, without reading the file again.  Nested arrays (no
model transformers loads has them) fall back to gguf-py's reader.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any, Iterator

import numpy as np

#: GGUF value type names (the core's record) -> ids (gguf-py's ``GGUFValueType``).
TYPE_IDS = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6, "bool": 7,
            "string": 8, "array": 9, "uint64": 10, "int64": 11, "float64": 12}


class _Field:
    """gguf-py's ``ReaderField`` as transformers reads it: ``parts[i]`` for ``i`` in ``data``
    is one value (a 1-element sequence for a number, the UTF-8 bytes for a string), ``types``
    the value type ids (``[9, element]`` for an array)."""

    __slots__ = ("name", "parts", "data", "types")

    def __init__(self, name: str, type_: str, value: Any, element: str | None):
        key = name.encode("utf-8")
        head: list[Any] = [np.array([len(key)], np.uint64), np.frombuffer(key, np.uint8), np.array([TYPE_IDS[type_]], np.uint32)]
        self.name = name
        if type_ == "array":
            assert element is not None
            items = [_part(element, v) for v in value]
            head += [np.array([TYPE_IDS[element]], np.uint32), np.array([len(items)], np.uint64)]
            self.parts = head + items
            self.data = list(range(len(head), len(head) + len(items)))
            self.types = [9, TYPE_IDS[element]]
        else:
            self.parts = head + [_part(type_, value)]
            self.data = [len(head)]
            self.types = [TYPE_IDS[type_]]


def _part(type_: str, value: Any) -> Any:
    if type_ == "string":
        return value.encode("utf-8")
    return (value,)


class _Tensor:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class KVReader:
    """A stand-in for ``gguf.GGUFReader`` over already parsed key/values (key -> (type, value,
    element type), file order) and tensor names (file order): ``fields`` and ``tensors[i].name``,
    what ``load_gguf_checkpoint(return_tensors=False)`` reads."""

    def __init__(self, kv: dict[str, tuple[str, Any, str | None]], tensor_names: list[str], version: int):
        # gguf-py's reader lists the header's counts first, as fields of their own
        head = {"GGUF.version": ("uint32", version, None), "GGUF.tensor_count": ("uint64", len(tensor_names), None),
                "GGUF.kv_count": ("uint64", len(kv), None)}
        self.fields = {k: _Field(k, t, v, e) for k, (t, v, e) in {**head, **kv}.items()}
        self.tensors = [_Tensor(n) for n in tensor_names]


def nested(kv: dict[str, tuple[str, Any, str | None]]) -> bool:
    """Whether any value is an array of arrays (:class:`KVReader` does not model those)."""
    return any(t == "array" and e == "array" for t, _, e in kv.values())


@contextlib.contextmanager
def parsed_once(path: str, kv: dict[str, tuple[str, Any, str | None]], tensor_names: list[str], version: int) -> Iterator[Any]:
    """Within the block, transformers' ``load_gguf_checkpoint(path, return_tensors=False)``
    (called by us or by ``AutoTokenizer``/``AutoConfig`` with ``gguf_file=``) is answered from
    one call over :class:`KVReader` (a copy each time: callers may change the dict).  Yields
    that function.  Other paths and ``return_tensors=True`` go to transformers unchanged."""
    import transformers.modeling_gguf_pytorch_utils as mg

    real = mg.load_gguf_checkpoint
    target = os.path.realpath(path)
    cache: dict[str, Any] = {}

    def once(gguf_checkpoint_path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        if return_tensors or args or kwargs or os.path.realpath(os.fspath(gguf_checkpoint_path)) != target:
            return real(gguf_checkpoint_path, return_tensors, *args, **kwargs)
        if "parsed" not in cache:
            if nested(kv):
                cache["parsed"] = real(gguf_checkpoint_path, False)
            else:
                import gguf

                fake = KVReader(kv, tensor_names, version)
                saved = gguf.GGUFReader
                gguf.GGUFReader = lambda *_a, **_k: fake  # load_gguf_checkpoint imports it from gguf when called
                try:
                    cache["parsed"] = real(gguf_checkpoint_path, False)
                finally:
                    gguf.GGUFReader = saved
        p = cache["parsed"]
        # the big tokenizer lists are shared (nobody here changes them); the rest is copied
        return {k: (dict(v) if k == "tokenizer" else copy.deepcopy(v)) for k, v in p.items()}

    mg.load_gguf_checkpoint = once
    try:
        yield once
    finally:
        mg.load_gguf_checkpoint = real
