"""One parse of a GGUF's key/values for the whole ``hf`` conversion.

transformers reads a GGUF's metadata twice over: gguf-py's ``GGUFReader`` in
``load_gguf_checkpoint`` (the config; a NumPy memmap view per array element: seconds for a
100k-token vocabulary, and hundreds of MB of views) and its own ``read_gguf_metadata``
(``transformers.integrations.gguf.reader``), which ``AutoTokenizer.from_pretrained(gguf_file=)``
calls twice (the config, then the vocabulary), walking every string of the file each time.
:func:`convert_gguf <.gguf_layout.convert_gguf>` would pay all of that on top of the core's own
parse.

:func:`parsed_once` answers both from the key/values the core already parsed (the ``gguf``
converter's record, :func:`.gguf_hparams.read_kv`):

* ``load_gguf_checkpoint(return_tensors=False)`` is transformers' own function over
  :class:`KVReader` (the ``fields`` / ``tensors`` interface of gguf-py's reader), so every value
  transformers derives is what it derives from the file itself.  Its answer is a
  :class:`Parsed` mapping: the ``config`` (what a conversion reads) comes from a reader holding
  the fields transformers' config mapping reads (every scalar, and the arrays it maps: the
  vocabulary's hundreds of thousands of strings are not walked for it), the rest from the
  whole file's fields, parsed only when asked for (the first read of ``tokenizer``, of the
  items, or a comparison);
* ``read_gguf_metadata(path, string_arrays)`` is :func:`metadata`, the same dict and tensor
  names built from the record.

Nested arrays (no model transformers loads has them) fall back to the readers themselves.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np

#: GGUF value type names (the core's record) -> ids (gguf-py's ``GGUFValueType``).
TYPE_IDS = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "uint32": 4, "int32": 5, "float32": 6, "bool": 7,
            "string": 8, "array": 9, "uint64": 10, "int64": 11, "float64": 12}
_INTS = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
_FLOATS = ("float32", "float64")
KV = dict[str, tuple[str, Any, "str | None"]]


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
    what ``load_gguf_checkpoint(return_tensors=False)`` reads.  ``kv_count``: the file's key
    count, when ``kv`` holds only some of its keys."""

    def __init__(self, kv: KV, tensor_names: list[str], version: int, kv_count: int | None = None):
        # gguf-py's reader lists the header's counts first, as fields of their own
        head = {"GGUF.version": ("uint32", version, None), "GGUF.tensor_count": ("uint64", len(tensor_names), None),
                "GGUF.kv_count": ("uint64", len(kv) if kv_count is None else kv_count, None)}
        self.fields = {k: _Field(k, t, v, e) for k, (t, v, e) in {**head, **kv}.items()}
        self.tensors = [_Tensor(n) for n in tensor_names]


def nested(kv: KV) -> bool:
    """Whether any value is an array of arrays (:class:`KVReader` does not model those)."""
    return any(t == "array" and e == "array" for t, _, e in kv.values())


def config_fields(kv: KV) -> KV:
    """The key/values ``load_gguf_checkpoint`` takes a ``config`` value from: all but the
    tokenizer's arrays (``tokenizer.*`` keys that name no config key: the vocabulary, its
    scores, types and merges, which go only to the ``tokenizer`` part of the answer).  The one
    thing the config takes from them, the token count as ``vocab_size`` where the file gives
    none, is :func:`parsed_once`'s to add."""
    import transformers.modeling_gguf_pytorch_utils as mg

    mapped = mg.GGUF_TO_TRANSFORMERS_MAPPING["config"].get("tokenizer", {})
    arch = kv.get("general.architecture", (None, "", None))[1]

    def tokenizer_array(key: str, v: tuple[str, Any, str | None]) -> bool:
        return (v[0] == "array" and key.startswith("tokenizer.") and key[len("tokenizer."):] not in mapped
                and not (isinstance(arch, str) and arch and arch in key))

    return {k: v for k, v in kv.items() if not tokenizer_array(k, v)}


#: What ``load_gguf_checkpoint`` logs when the fields it was given hold no token list for the
#: config's ``vocab_size`` (over :func:`config_fields`, where :func:`parsed_once` adds it).
_NO_VOCAB = "Can't find a way to retrieve missing config vocab_size"


class Parsed(Mapping):
    """What ``load_gguf_checkpoint(return_tensors=False)`` returns (its parts: ``keys``), each
    part made when read: ``config`` by ``config()``, every other part from ``full()`` (the
    answer over the whole file's fields, parsed once for the block, on the first read of such a
    part, of the items, or a comparison).  A dict in every way transformers reads one (``[]``,
    ``get``, ``in``, the items, ``==``); each answer's parts are its own copies (callers may
    change them), but for the tokenizer's big lists, shared."""

    def __init__(self, keys: tuple[str, ...], config: Callable[[], dict[str, Any]], full: Callable[[], dict[str, Any]]):
        self._keys, self._config, self._full = keys, config, full
        self._own: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._own:
            if key not in self._keys:
                raise KeyError(key)
            part = self._config() if key == "config" else self._full()[key]
            self._own[key] = dict(part) if key == "tokenizer" else copy.deepcopy(part)
        return self._own[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Parsed({dict(self.items())!r})"


def _value(type_: str, v: Any) -> Any:
    """A recorded value as transformers' reader gives it (the record spells non-finite floats as text)."""
    if type_ in _FLOATS:
        return float(v)
    if type_ == "bool":
        return bool(v)
    if type_ in _INTS:
        return int(v)
    return v


def metadata(kv: KV, tensor_names: list[str], string_arrays: Any = ()) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What transformers' ``read_gguf_metadata(path, string_arrays)`` gives for the file: every
    key's value in file order (numbers, bools and strings as Python values, a number array as a
    list, a string array as a list when its key is in ``string_arrays`` and as its length
    otherwise), and the tensor names.  Callers fall back to the reader for nested arrays."""
    out: dict[str, Any] = {}
    for key, (t, v, e) in kv.items():
        if t == "array":
            if e == "string":
                out[key] = list(v) if key in string_arrays else len(v)
            elif e in _FLOATS and any(isinstance(x, str) for x in v):
                out[key] = [float(x) for x in v]
            else:
                out[key] = list(v)  # ints and bools as the record holds them (JSON: int, bool)
        else:
            out[key] = _value(t, v)
    return out, tuple(tensor_names)


class _Without:
    """A logging filter dropping the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def parsed_once(path: str, kv: KV, tensor_names: list[str], version: int) -> Iterator[Any]:
    """Within the block, transformers' ``load_gguf_checkpoint(path, return_tensors=False)`` and
    ``read_gguf_metadata(path, ...)`` (called by us or by ``AutoTokenizer``/``AutoConfig`` with
    ``gguf_file=``) are answered from ``kv`` (see the module docstring): the former by a
    :class:`Parsed` each time, over one parse of each kind for the whole block.  Yields that
    function.  Other paths and ``return_tensors=True`` go to transformers unchanged."""
    import transformers.integrations.gguf as gguf_pkg
    import transformers.integrations.gguf.reader as gguf_reader
    import transformers.modeling_gguf_pytorch_utils as mg

    real = mg.load_gguf_checkpoint
    real_metadata = gguf_reader.read_gguf_metadata
    target = os.path.realpath(path)
    cache: dict[str, Any] = {}
    deep = nested(kv)

    def mine(p: Any) -> bool:
        return os.path.realpath(os.fspath(p)) == target

    def parse(fields: KV) -> dict[str, Any]:
        import gguf

        fake = KVReader(fields, tensor_names, version, kv_count=len(kv))
        saved = gguf.GGUFReader
        gguf.GGUFReader = lambda *_a, **_k: fake  # load_gguf_checkpoint imports it from gguf when called
        try:
            return real(path, False)
        finally:
            gguf.GGUFReader = saved

    def full() -> dict[str, Any]:
        if "full" not in cache:
            cache["full"] = real(path, False) if deep else parse(kv)
        return cache["full"]

    def config() -> dict[str, Any]:
        if "config" not in cache:
            tokens = kv.get("tokenizer.ggml.tokens")
            if "full" in cache or not isinstance(tokens, tuple) or tokens[0] != "array" or len(tokens[1]) < 2:
                cache["config"] = full()["config"]
            else:
                quiet = _Without(_NO_VOCAB)
                mg.logger.addFilter(quiet)
                try:
                    c = parse(config_fields(kv))["config"]
                finally:
                    mg.logger.removeFilter(quiet)
                if "vocab_size" not in c:
                    # transformers' own fallback for a file without {arch}.vocab_size (its issue
                    # 32526): the length of the token list (a list of two or more: one token
                    # would be unwrapped to its string, left to the full parse above)
                    c["vocab_size"] = len(tokens[1])
                cache["config"] = c
        return cache["config"]

    def once(gguf_checkpoint_path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        if return_tensors or args or kwargs or not mine(gguf_checkpoint_path):
            return real(gguf_checkpoint_path, return_tensors, *args, **kwargs)
        if deep:
            p = full()
            return {k: (dict(v) if k == "tokenizer" else copy.deepcopy(v)) for k, v in p.items()}
        # the parts load_gguf_checkpoint always returns (return_tensors adds "tensors")
        return Parsed(tuple(mg.GGUF_TO_TRANSFORMERS_MAPPING), config, full)

    def read_metadata(gguf_path: Any, string_arrays: Any = ()) -> tuple[dict[str, Any], tuple[str, ...]]:
        if deep or not mine(gguf_path) or "general.architecture" not in kv:
            return real_metadata(gguf_path, string_arrays)
        return metadata(kv, tensor_names, string_arrays)

    pkg_had = "read_gguf_metadata" in vars(gguf_pkg)
    pkg_old = vars(gguf_pkg).get("read_gguf_metadata")
    mg.load_gguf_checkpoint = once
    gguf_reader.read_gguf_metadata = read_metadata
    gguf_pkg.read_gguf_metadata = read_metadata  # `from transformers.integrations.gguf import read_gguf_metadata`
    try:
        yield once
    finally:
        mg.load_gguf_checkpoint = real
        gguf_reader.read_gguf_metadata = real_metadata
        if pkg_had:
            gguf_pkg.read_gguf_metadata = pkg_old
        else:
            del gguf_pkg.read_gguf_metadata
