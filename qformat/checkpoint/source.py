"""The core's checkpoint abstraction: a source checkpoint read tensor by tensor.

:class:`Checkpoint` is what every whole-checkpoint command reads through (quantize,
dequantize, convert, export, inspect, diff): one safetensors file, a folder of them, a sharded
index, or a GGUF file, with its side files (config.json and the rest).  Tensors are
memory-mapped, never copied, and :meth:`Checkpoint.release` drops their resident pages so that
a pass over the checkpoint holds one tensor at a time.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os
from typing import Any, Iterable, Iterator

import numpy as np

from ..container import Header, TensorSpec, strict_json
from ..remote import read_header
from ..errors import QFormatError, error
from ..paths import parts, source_file, unreadable
from ..model import METADATA_KEY
from ..pipeline import Component
from ..sources import FileSource, TensorInfo


#: Whether checkpoints opened now get ``qformat check``'s rules (see :func:`unchecked`).
_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("qformat_checked", default=True)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Open checkpoints inside this block without ``qformat check``'s rules (the CLI's
    ``--no-check``): a damaged qformat file is then read as it is, at the user's risk."""
    token = _CHECKED.set(False)
    try:
        yield
    finally:
        _CHECKED.reset(token)


def admit_files(paths: Iterable[str], index: str | None = None, digests: bool = False) -> Any:
    """``qformat check``'s rules for the safetensors files a model loader reads (the one rule,
    issue 24): header rules now (raising check's first problem, with its code), payload rules per
    logical tensor through the returned ``Admission``'s ``check_logical``, recorded digests
    verified only with ``digests`` (they cost a read of every byte; SPEC.md §12.5 leaves
    verifying to the user's request); None inside :func:`unchecked`.  Each file's header is read
    and parsed once: ``qformat.io.open_admitted(admission, path)`` gives the loader a ``SafeOpen`` over that same
    parse and memory map (never a fresh read a replaced file could answer differently)."""
    if not _CHECKED.get():
        return None
    from ..check import Admission

    adm = Admission([os.fspath(p) for p in paths], index, digests=digests)
    adm.headers()
    return adm


#: The code of a source the path policy refuses (a shard or side file leaving the folder).
SOURCE_CODE = "CONVERT_SOURCE_INVALID"

#: Side files (config.json, quanto_qmap.json, index files) larger than this are refused.
MAX_SIDE_JSON_BYTES = 64 << 20


def source_error(message: str, tensor: str | None = None, field: str | None = None) -> QFormatError:
    """A ``CONVERT_SOURCE_INVALID`` error: the source breaks a rule of its own format."""
    return error("CONVERT_SOURCE_INVALID", message, tensor=tensor, field=field)


def parse_json_text(text: str, what: str, tensor: str | None = None, field: str | None = None) -> Any:
    """Strictly parse JSON text from a side file, a tensor or a metadata string (never eval):
    exactly one value, no repeated member names, no NaN/Infinity, bounded depth; else
    ``CONVERT_SOURCE_INVALID`` naming ``what``."""
    from ..container import _Dup

    try:
        value, end = strict_json(text)
    except _Dup as e:
        raise source_error(f"{what} repeats the member name {e.key!r}", tensor=tensor, field=field) from None
    except (ValueError, RecursionError) as e:
        raise source_error(f"{what} is not valid JSON: {e}", tensor=tensor, field=field) from None
    if text[end:].strip(" \t\r\n"):
        raise source_error(f"{what} has text after its JSON value", tensor=tensor, field=field)
    return value


def read_json_file(path: str) -> Any:
    """Strictly parse a JSON side file (size-bounded; see :func:`parse_json_text`)."""
    from ..remote import fetch_bytes, is_url, url_basename

    if is_url(path):
        raw = fetch_bytes(path, MAX_SIDE_JSON_BYTES)
        name = url_basename(path)  # never its query: a signature is a credential
        if len(raw) > MAX_SIDE_JSON_BYTES:
            raise source_error(f"{name} is more than the {MAX_SIDE_JSON_BYTES} bytes allowed for a side file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise source_error(f"cannot read {name} as UTF-8 text: {e}") from None
        return parse_json_text(text.lstrip("\ufeff \t\r\n"), name)
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        if size > MAX_SIDE_JSON_BYTES:
            raise source_error(f"{name} is {size} bytes, more than the {MAX_SIDE_JSON_BYTES} allowed for a side file")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise unreadable(path, e) from None
    except UnicodeDecodeError as e:
        raise source_error(f"cannot read {name} as UTF-8 text: {e}") from None
    return parse_json_text(text.lstrip("\ufeff \t\r\n"), name)


class Checkpoint:
    """A source checkpoint: one safetensors file, a folder of them, a sharded index, or a GGUF file.

    For safetensors sources every stored tensor of every file is reachable by name
    (:meth:`info`, :meth:`array`, :meth:`file_of`), memory-mapped and never copied;
    ``config`` is the folder's ``config.json`` (or None) and :meth:`side_json` reads other
    JSON files beside the weights (``quanto_qmap.json``).  Names are unique across files.
    """

    def __init__(self, path: str | os.PathLike[str]):
        from ..remote import is_url, url_basename, url_folder

        remote = is_url(os.fspath(path))
        self.path = os.fspath(path) if remote else os.path.abspath(os.fspath(path))
        self.kind = "safetensors"
        self.folder: str
        self.files: list[str] = []  # safetensors file names, relative to folder
        self.index: dict[str, Any] | None = None  # the parsed index.json, for sharded sources
        self.index_name: str | None = None
        if remote:  # an http(s) safetensors file or index: its "folder" is its URL up to the last '/'
            self.folder = url_folder(self.path)
            base = url_basename(self.path)
            if base.endswith(".safetensors.index.json"):
                self._read_index(base)
            else:
                self.files = [base]
        elif os.path.isdir(self.path):
            self.folder = self.path
            try:
                listed = sorted(os.listdir(self.path))
            except OSError as e:
                raise unreadable(self.path, e) from None
            idx = [n for n in listed if n.endswith(".safetensors.index.json")]
            if idx:
                self._read_index(idx[0])
            else:
                # files found in the folder follow the path policy: a link leaving it is refused
                self.files = [n for n in listed if n.endswith(".safetensors") and self._entry(n, "weight file")]
                if not self.files:
                    gg = [n for n in listed if n.endswith(".gguf") and self._entry(n, "weight file")]
                    if len(gg) == 1:
                        self.kind = "gguf"
                        self.files = gg
                    else:
                        raise error("CONVERT_FORMAT_UNKNOWN", f"{self.path} holds no .safetensors, index or single .gguf file")
        elif os.path.isfile(self.path):
            self.folder = os.path.dirname(self.path)
            base = os.path.basename(self.path)
            if base.endswith(".safetensors.index.json"):
                self._read_index(base)
            elif base.endswith(".gguf") or _is_gguf(self.path):
                self.kind = "gguf"
                self.files = [base]
            else:
                from ..check import not_safetensors

                other = not_safetensors(self.path)  # a README or a .bin: said so, as check says it
                if other is not None:
                    raise other
                self.files = [base]
        else:
            raise error("FILE_UNREADABLE", f"{self.path} does not exist")
        self._headers: dict[str, Header] = {}
        self._sources: dict[str, FileSource] = {}
        self._maps: list[mmap.mmap] = []  # other memory maps of the source (GGUF), see release()
        self._where: dict[str, str] = {}
        self._config: Any = None
        self._config_read = False
        twice: QFormatError | None = None
        if self.kind == "safetensors":
            for f in self.files:
                # other ecosystems' files: null metadata is what the safetensors library reads
                h = read_header(self.file_path(f), null_metadata_ok=True)
                self._headers[f] = h
                for name in h.entries:
                    if name in self._where:
                        twice = twice or source_error(f"tensor {name!r} is stored in both {self._where[name]} and {f}", tensor=name)
                    self._where[name] = f
        #: ``qformat check``'s rules for a qformat checkpoint (None: not one, or :func:`unchecked`).
        self.admission: Any = None
        if self.kind == "safetensors" and self.files and _CHECKED.get():
            self._admit()
        if twice is not None:
            raise twice

    def _admit(self) -> None:
        """The one rule (issue 24): a qformat checkpoint that ``qformat check`` refuses is refused
        by every command that reads it, with check's code.  Header rules run here, for every
        file (and the index); payload rules run per logical tensor when a command first reads one
        of its stored tensors (:meth:`array`, :meth:`component`), on the pages it reads anyway."""
        from ..check import Admission

        index = self.file_path(self.index_name) if self.index_name else None
        adm = Admission([self.file_path(f) for f in self.files], index)
        adm.headers()
        # Payload rules guard the tensors of qformat checkpoints; a plain or other-format
        # checkpoint (whose bytes a converter validates by its own format's rules) gets the header rules.
        self.admission = adm if self.has_qformat() else None

    def _read_index(self, name: str) -> None:
        try:
            self._parse_index(name)
        except QFormatError:
            if _CHECKED.get():  # the index rules of `qformat check`, with its codes (INDEX_INVALID, ...)
                from ..check import check_index

                _, probs = check_index(self.file_path(name), payload=False)
                for p in probs:
                    if p.code.startswith("INDEX_"):
                        raise error(p.code, p.message, tensor=p.tensor, field=p.field) from None
            raise

    def _parse_index(self, name: str) -> None:
        from ..remote import is_url

        idx = read_json_file(self.file_path(name))
        wm = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise source_error(f"{name} has no weight_map object of tensor name -> file name")
        files = sorted(set(wm.values()))
        for f in files:  # the path policy (qformat.paths): a plain name, a regular file, no link leaving the folder
            what = f"{name} names shard"
            parts(f, code=SOURCE_CODE, root=self.folder, what=what, field="weight_map", single=True)
            if not is_url(self.folder):  # remote: its open says
                source_file(self.folder, f, code=SOURCE_CODE, what=what, field="weight_map", single=True, missing="does not exist")
        self.index, self.index_name, self.files = idx, name, files

    def file_path(self, name: str) -> str:
        """Where the checkpoint's file ``name`` (a weight file, its index, a side file) is: a path
        in its folder, or for a remote checkpoint a URL.  The URL the user gave is used as given,
        query and all (a signature signs that one object); every other remote file is
        :func:`qformat.remote.sibling_url` of it: directly in its folder, on its origin, the name
        percent-encoded whole (so '%2e%2e%2f' is never '../'), without the query."""
        from ..remote import is_url, sibling_url, url_basename

        if not is_url(self.path):
            return os.path.join(self.folder, name)
        if name == url_basename(self.path):
            return self.path
        return sibling_url(self.path, name)

    def _entry(self, name: str, what: str) -> bool:
        """Whether the folder's entry ``name`` is a regular file the path policy lets a command
        read (inside the folder, or a hub snapshot's link into its blobs); a link that leaves
        the folder, or a folder or device by a weight file's name, is CONVERT_SOURCE_INVALID."""
        return source_file(self.folder, name, code=SOURCE_CODE, what=what, single=True) is not None

    # -- tensors --------------------------------------------------------------------------
    @property
    def sharded(self) -> bool:
        return self.index is not None

    def names(self) -> list[str]:
        """Every stored tensor, in file order then offset order."""
        out = []
        for f in self.files:
            h = self._headers.get(f)
            if h is not None:
                out += [e.name for e in sorted(h.entries.values(), key=lambda e: e.begin)]
        return out

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def info(self, name: str) -> TensorInfo | None:
        f = self._where.get(name)
        if f is None:
            return None
        e = self._headers[f].entries[name]
        return TensorInfo(e.dtype, e.shape)

    def file_of(self, name: str) -> str:
        return self._where[name]

    def array(self, name: str) -> np.ndarray:
        """The stored tensor viewed (memory-mapped) in its storage dtype; in a qformat checkpoint
        the payload rules of ``qformat check`` for the tensors it belongs to run first (once)."""
        if self.admission is not None and self.admission.guards(name):
            self.admission.tensor(name, _Unguarded(self))
        return self._array(name)

    def admit(self, name: str) -> None:
        """Run ``qformat check``'s payload rules for the logical tensor ``name`` now (once), if
        this is a checked qformat checkpoint: see :meth:`Admission.logical`."""
        if self.admission is not None:
            self.admission.logical(name, _Unguarded(self))

    def _array(self, name: str) -> np.ndarray:
        f = self._where.get(name)
        if f is None:
            raise source_error(f"tensor {name!r} is not in the checkpoint", tensor=name)
        src = self._sources.get(f)
        if src is None:
            src = self._sources[f] = FileSource(self.file_path(f), self._headers[f])
        return src.array(name)

    def component(self, name: str) -> Component:
        """The stored tensor as a pipeline component (spec now, memory-mapped array when produced)."""
        i = self.info(name)
        if i is None:
            raise source_error(f"tensor {name!r} is not in the checkpoint", tensor=name)
        f = self._where[name]
        h = self._headers[f]
        where = (self.file_path(f), h.data_start + h.entries[name].begin)
        admit = None
        if self.admission is not None and self.admission.guards(name):  # copied bytes: checked as they are copied
            admit = lambda: self.admission.tensor(name, _Unguarded(self)) if self.admission.guards(name) else None  # noqa: E731
        return Component(TensorSpec(name, i.dtype, tuple(i.shape)), lambda: self.array(name), where, admit)

    def track(self, mm: mmap.mmap) -> None:
        """Have :meth:`release` drop the resident pages of another memory map of the source."""
        self._maps.append(mm)

    def release(self) -> None:
        """Drop the resident pages of every memory map of the source (they are read again from
        the page cache or disk when touched): reading a checkpoint tensor by tensor then keeps
        the process's resident memory bounded instead of growing to the checkpoint's size."""
        for mm in [getattr(s, "_mm", None) for s in self._sources.values()] + self._maps:
            drop_pages(mm)

    def metadata(self, file: str) -> dict[str, str]:
        return dict(self._headers[file].metadata or {})

    def require(self, name: str, dtypes: Iterable[str] | None = None, rank: int | None = None) -> TensorInfo:
        """The tensor's info, or ``CONVERT_SOURCE_INVALID`` naming what was expected."""
        i = self.info(name)
        if i is None:
            raise source_error(f"expected a tensor {name!r}, found none", tensor=name)
        allowed = list(dtypes) if dtypes is not None else None
        if allowed is not None and i.dtype not in allowed:
            raise source_error(f"dtype is {i.dtype}, expected one of {', '.join(allowed)}", tensor=name)
        if rank is not None and len(i.shape) != rank:
            raise source_error(f"shape is {list(i.shape)}, expected rank {rank}", tensor=name)
        return i

    # -- side files -----------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any] | None:
        """config.json of the source folder (None when absent)."""
        if not self._config_read:
            self._config = self.side_json("config.json")
            self._config_read = True
        return self._config

    def side_json(self, name: str) -> Any:
        """The JSON side file ``name`` of the source folder (None when absent): read where the path
        policy allows (a link leaving the folder, or a folder by that name, is CONVERT_SOURCE_INVALID)."""
        from ..remote import is_url

        if is_url(self.folder):
            # Side files of a remote checkpoint are not fetched: a missing one would be an HTTP
            # error, not an absent file (this never asked: the old os.path.isfile(URL) was False).
            return None
        if source_file(self.folder, name, code=SOURCE_CODE, what="side file") is None:
            return None
        return read_json_file(os.path.join(self.folder, name))  # by its own name (a hub snapshot's link: its blob)

    def quantization_config(self) -> dict[str, Any] | None:
        """config.json's ``quantization_config`` (or a ``quantize_config.json`` / ``quant_config.json``)."""
        cfg = self.config
        if isinstance(cfg, dict) and isinstance(cfg.get("quantization_config"), dict):
            return cfg["quantization_config"]
        for side in ("quantize_config.json", "quant_config.json"):
            v = self.side_json(side)
            if isinstance(v, dict):
                return v
        return None

    def has_qformat(self) -> bool:
        return any(METADATA_KEY in (h.metadata or {}) for h in self._headers.values())


class _Unguarded:
    """A checkpoint's tensors read without the payload guard (the guard's own reads)."""

    def __init__(self, ck: Checkpoint):
        self.ck = ck

    def info(self, name: str) -> TensorInfo | None:
        return self.ck.info(name)

    def array(self, name: str) -> np.ndarray:
        return self.ck._array(name)


def drop_pages(mm: mmap.mmap | None) -> None:
    """``madvise(MADV_DONTNEED)`` over a read-only file map (a no-op where unsupported)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mm is None or advice is None or getattr(mm, "closed", False):
        return
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        pass


def _is_gguf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
