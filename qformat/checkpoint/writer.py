"""Writing whole checkpoints, streaming: plan every file first, then produce tensors one by one.

A checkpoint is planned from :class:`~qformat.container.TensorSpec` s (name, dtype, shape)
before any tensor body exists: which file each tensor goes to, every file's header and size,
the index.  Then each file is written in header order, each tensor body produced by its own
callable only when its turn comes, written in bounded chunks and released, so peak memory is
bounded by the largest tensor, not by the checkpoint.  Everything is written into a
temporary file or folder beside the destination, each file is verified (``verify``), and
only then is the result moved into place in one rename; on any failure nothing is left
behind and an existing destination is unchanged.

Interruptions: Ctrl-C (KeyboardInterrupt) or any other exception removes the temporary folder.
A hard kill cannot, so the folder records who writes it (``.qformat-writer.json``: process id,
host, destination); the next write into the same folder finds temporary folders whose writer
is gone (:func:`stale_temporaries`), removes them and reports each through ``notice``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import container, paths
from ..atomic import atomic_write, default_mode, fsync_path
from ..container import FilePlan, TensorSpec, plan_file
from ..errors import error

#: Prefix of the temporary folder a checkpoint is written into, beside the destination.
TEMP_PREFIX = ".qformat-convert-"
#: The file inside that folder naming its writer (removed before the folder becomes the destination).
MARKER = ".qformat-writer.json"

#: The error code for a destination that cannot be used (exists without overwrite, wrong kind, no
#: folder), by command: the writer is one for every command, the code names the command the user ran.
DESTINATION_CODES = {"convert": "CONVERT_DESTINATION_INVALID", "quantize": "QUANTIZE_DESTINATION_INVALID",
                     "dequantize": "DEQUANTIZE_DESTINATION_INVALID", "export": "EXPORT_DESTINATION_INVALID"}
_COMMAND: contextvars.ContextVar[str] = contextvars.ContextVar("qformat_writing_command", default="convert")
#: The part of a split run being written (:mod:`qformat.checkpoint.split`), None for a whole write.
_PART: contextvars.ContextVar[Any] = contextvars.ContextVar("qformat_writing_part", default=None)


@contextlib.contextmanager
def writing_for(command: str):
    """Within this block, destination errors carry ``command``'s code (:data:`DESTINATION_CODES`)."""
    token = _COMMAND.set(command)
    try:
        yield
    finally:
        _COMMAND.reset(token)


def destination_error(message: str, **kw: Any) -> Exception:
    """The coded error for an unusable destination of the command being run (:func:`writing_for`)."""
    return error(DESTINATION_CODES[_COMMAND.get()], message, **kw)


@dataclass(frozen=True)
class OutTensor:
    """One tensor of an output file: its spec and a callable producing its array (lazily)."""

    spec: TensorSpec
    produce: Callable[[], np.ndarray]
    #: (path, offset) of the tensor's bytes, unchanged, in another file: copied file to file.
    copy_from: tuple[str, int] | None = None
    #: Run after a copied tensor is written (its source pages still hot): the source's
    #: ``qformat check`` payload rules (:class:`qformat.check.Admission`); raising aborts the write.
    admit: Callable[[], None] | None = None


@dataclass
class OutFile:
    """One output file: its name (relative to the destination folder), ``__metadata__``
    (None for none), its tensors (any order: the plan sorts them) and the logical tensor names
    it holds, which the index's ``weight_map`` also lists."""

    name: str
    metadata: dict[str, str] | None
    tensors: list[OutTensor] = field(default_factory=list)
    logical: list[str] = field(default_factory=list)

    #: Tensors produced together (all components of one encoded tensor): each group's
    #: producer runs once and its arrays are written at their planned offsets.
    groups: list["OutGroup"] = field(default_factory=list)

    def plan(self) -> FilePlan:
        return plan_file([t.spec for t in self.tensors], self.metadata)

    @property
    def data_bytes(self) -> int:
        return sum(t.spec.nbytes for t in self.tensors)


@dataclass(frozen=True)
class OutGroup:
    """Tensors of one file made by one call: ``produce()`` returns every one of ``names``."""

    names: tuple[str, ...]
    produce: Callable[[], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class SideFile:
    """A file copied unchanged into an output folder: the regular file at ``source`` becomes
    ``name``, a path relative to the folder ('/'-separated; subfolders are created)."""

    source: str
    name: str


@dataclass
class IndexSpec:
    """The ``*.safetensors.index.json`` to write: its file name and every member but
    ``weight_map`` (``metadata.total_size`` is set to the bytes of all tensor data)."""

    name: str = "model.safetensors.index.json"
    base: dict[str, Any] = field(default_factory=dict)


#: Endings that make a destination a file (the one destination rule, :func:`resolve_destination`).
FILE_SUFFIXES = (".safetensors", ".gguf")


def resolve_destination(dst: str | os.PathLike[str], as_folder: bool, file_name: str) -> str:
    """The one destination rule of every writing command (issue 24), as an absolute path.

    ``dst`` ending in ``/`` or naming an existing folder is a folder; ending in ``.safetensors``
    or ``.gguf`` it is a file.  A command whose output is a folder (``as_folder``) refuses a
    file name; one whose output is a single file writes ``file_name`` into a folder, and
    refuses a name that is neither (the command's ``*_DESTINATION_INVALID``, saying how to write it).
    """
    raw = os.fspath(dst)
    path = os.path.abspath(raw)
    is_folder = raw.endswith(("/", os.sep)) or os.path.isdir(path)
    is_file = not is_folder and raw.lower().endswith(FILE_SUFFIXES)
    if as_folder:
        if is_file:
            raise destination_error(f"the destination {raw!r} names a file ({os.path.splitext(raw)[1]}), but this source "
                        f"gives a folder (a folder or sharded checkpoint): name a folder, such as {os.path.splitext(raw)[0] + '/'!r}")
        return path
    if is_folder:
        return os.path.join(path, file_name)
    if is_file:
        return path
    raise destination_error(f"the destination {raw!r} is neither a file ending in {' or '.join(FILE_SUFFIXES)} nor a "
                f"folder: this source gives one file; write {os.path.join(raw, '')!r} to put {file_name} in that folder, "
                f"or name the file, such as {raw + os.path.splitext(file_name)[1]!r}")


def check_destination(dst: str, as_folder: bool, overwrite: bool) -> None:
    """Refuse a destination that exists (unless ``overwrite``), is of the wrong kind, or whose
    folder does not exist (the command's ``*_DESTINATION_INVALID``)."""
    if os.path.exists(dst) and not overwrite:
        raise destination_error(f"{dst} exists; pass --overwrite to replace it")
    if os.path.exists(dst) and as_folder != os.path.isdir(dst):
        raise destination_error(f"{dst} is a {'file' if as_folder else 'folder'}, expected a {'folder' if as_folder else 'file'} for this source")
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise destination_error(f"the destination's folder {parent} does not exist")


def write_checkpoint(dst: str | os.PathLike[str], files: Iterable[OutFile], *, as_folder: bool, overwrite: bool = False,
                     side_files: Iterable[SideFile | str] = (), index: IndexSpec | None = None,
                     verify: Callable[[str], None] | None = None,
                     written: Callable[[TensorSpec], None] | None = None,
                     file_done: Callable[[str, int], None] | None = None,
                     extra_files: Mapping[str, bytes] | None = None,
                     notice: Callable[[str], None] | None = None) -> list[str]:
    """Write ``files`` (in the order given) as a checkpoint at ``dst``; returns the paths written.

    ``as_folder`` False: exactly one file, written to ``dst`` itself.  Otherwise ``dst`` is a
    folder holding the files, copies of ``side_files`` (:class:`SideFile` s, or paths copied
    under their base names; one the write produces itself, a file, the index or an
    ``extra_files`` name, is not copied) and, with ``index``, an index whose ``weight_map``
    maps every stored and logical tensor name to its file.  ``verify(path)``
    runs on each written file before anything is moved into place; ``written(spec)`` after each
    tensor body (release source pages there); ``file_done(name, nbytes)`` after each file.
    ``extra_files`` (folder only): more files by name and content (a rewritten config.json),
    written after the side files.  ``notice(message)`` reports temporary folders of killed
    writers found (and removed) beside the destination.
    """
    dst = os.path.abspath(os.fspath(dst))
    files = list(files)
    part = _PART.get()
    if part is not None:  # one part of a split run (qformat.checkpoint.split): its share, into the staging folder
        return part.write(dst, files, as_folder=as_folder, overwrite=overwrite, side_files=side_files, index=index,
                          verify=verify, written=written, file_done=file_done, extra_files=extra_files, notice=notice)
    check_destination(dst, as_folder, overwrite)
    if not as_folder and len(files) != 1:
        raise destination_error(f"a single-file destination needs exactly one file, the plan has {len(files)}")
    plans = [f.plan() for f in files]  # every header before any body
    parent = os.path.dirname(dst)
    clean_stale(parent, notice)
    tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
    try:
        _mark(tmp, dst)
        write_files(tmp, files, plans, verify=verify, written=written, file_done=file_done)
        os.unlink(os.path.join(tmp, MARKER))
        if not as_folder:
            os.replace(os.path.join(tmp, files[0].name), dst)
            shutil.rmtree(tmp, ignore_errors=True)
            return [dst]
        os.chmod(tmp, default_mode(folder=True))  # mkdtemp made it 0700
        write_tree(tmp, files, plans, side_files=side_files, index=index, extra_files=extra_files)
        replace_folder(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [os.path.join(dst, f.name) for f in files]


def write_files(folder: str, files: Iterable[OutFile], plans: Iterable[FilePlan], *, verify: Callable[[str], None] | None = None,
                written: Callable[[TensorSpec], None] | None = None, file_done: Callable[[str, int], None] | None = None) -> None:
    """Write each planned file into ``folder`` (the streaming loop every command shares: tensor
    bodies produced one at a time, in header order), each flushed to the device by a background
    thread while the next is written (the device's write-back then overlaps the work), all
    durable when this returns.  ``verify(path)`` runs on each file once written."""
    syncer = ThreadPoolExecutor(1, thread_name_prefix="qformat-fsync")
    pending: list[Future[None]] = []
    try:
        for f, plan in zip(files, plans):
            path = os.path.join(folder, f.name)
            producers = {t.spec.name: t.produce for t in f.tensors}
            if f.groups:
                write_grouped(path, plan, producers, f.groups, written, sync=False)
            else:
                copies = {t.spec.name: t.copy_from for t in f.tensors if t.copy_from is not None}
                admits = {t.spec.name: t.admit for t in f.tensors if t.copy_from is not None and t.admit is not None}
                write_planned(path, plan, lambda s, p=producers: p[s.name](), _admitting(admits, written), copies, sync=False)
            pending.append(syncer.submit(fsync_path, path))
            if verify is not None:
                verify(path)
            if file_done is not None:
                file_done(f.name, plan.data_bytes)
        for fut in pending:
            fut.result()  # an fsync error is the write's error
    except BaseException:
        for fut in pending:
            fut.cancel()
        syncer.shutdown(wait=True)  # no fsync may still hold a file of the folder the caller removes next
        raise
    syncer.shutdown(wait=False)


def write_tree(folder: str, files: list[OutFile], plans: list[FilePlan], *, side_files: Iterable[SideFile | str] = (),
               index: IndexSpec | None = None, extra_files: Mapping[str, bytes] | None = None) -> None:
    """What an output folder holds besides its tensor files: the side files, ``extra_files``
    (each synced) and the index over ``files``, written last."""
    produced = {f.name for f in files} | set(extra_files or {}) | ({index.name} if index is not None else set())
    copy_side_files(folder, side_files, skip=produced)
    for n, data in (extra_files or {}).items():
        with open(os.path.join(folder, n), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    if index is not None:
        with atomic_write(os.path.join(folder, index.name), "wb") as fh:
            fh.write(index_bytes(files, plans, index))


def replace_folder(tmp: str, dst: str) -> None:
    """Move the finished folder ``tmp`` to ``dst`` in one rename; an existing ``dst`` is moved
    aside first and removed after."""
    if os.path.exists(dst):
        old = tempfile.mkdtemp(prefix=".qformat-old-", dir=os.path.dirname(dst))
        os.rmdir(old)
        os.replace(dst, old)
        os.replace(tmp, dst)
        if os.path.islink(old) or not os.path.isdir(old):
            # a destination that was a link (or a file) is replaced itself, never what it points
            # at: the moved-aside link is removed, not followed (rmtree refuses links)
            with contextlib.suppress(OSError):
                os.unlink(old)
        else:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)


def _admitting(admits: Mapping[str, Callable[[], None]], written: Callable[[TensorSpec], None] | None) -> Callable[[TensorSpec], None] | None:
    """``written`` preceded by each copied tensor's ``admit`` (the source's payload rules, run
    per tensor as it is copied: no extra pass over the source)."""
    if not admits:
        return written

    def done(spec: TensorSpec) -> None:
        a = admits.get(spec.name)
        if a is not None:
            a()
        if written is not None:
            written(spec)

    return done


def copy_side_files(folder: str, side_files: Iterable[SideFile | str], skip: Iterable[str] = ()) -> list[str]:
    """Copy each side file's bytes into ``folder`` under its relative name (:func:`copy_file`;
    subfolders made as ``mkdir`` makes them), each synced; names in ``skip`` are left out.
    A name that is not a relative path inside ``folder`` (:func:`qformat.paths.parts`) is the
    command's ``*_DESTINATION_INVALID``.  Returns the relative names copied."""
    skip = set(skip)
    done = []
    for s in side_files:
        if not isinstance(s, SideFile):
            s = SideFile(os.fspath(s), os.path.basename(os.fspath(s)))
        if s.name in skip:
            continue
        parts = paths.parts(s.name, code=DESTINATION_CODES[_COMMAND.get()], root=folder, what="side file name")
        path = os.path.join(folder, *parts)
        if len(parts) > 1:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        copy_file(s.source, path)
        done.append(s.name)
    return done


#: Bytes read per step when copying a file.
COPY_CHUNK = 1 << 20


def copy_file(source: str, path: str) -> None:
    """Copy the regular file ``source`` to the new file ``path`` (which must not exist) in
    bounded chunks, synced, with :func:`qformat.paths.copy_mode` of the source's mode: the
    user's default mode, never wider than the source's (a 0600 file stays 0600).  An OS error
    reading ``source`` is FILE_UNREADABLE naming it."""
    try:
        fin = open(source, "rb")
        st = os.fstat(fin.fileno())
    except OSError as e:
        raise paths.unreadable(source, e) from None
    with fin:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # private until its bytes and mode are final
        with os.fdopen(fd, "wb") as fout:
            while True:
                try:
                    b = fin.read(COPY_CHUNK)
                except OSError as e:
                    raise paths.unreadable(source, e) from None
                if not b:
                    break
                fout.write(b)
            fout.flush()
            os.fchmod(fd, paths.copy_mode(st.st_mode))
            os.fsync(fd)


def _mark(tmp: str, dst: str) -> None:
    with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as fh:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "destination": dst, "started": time.time()}, fh)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def stale_temporaries(parent: str) -> list[tuple[str, str]]:
    """Temporary folders in ``parent`` left by a writer that is gone: (path, destination).

    A folder counts when its marker names a process of this host that no longer runs.  A
    folder without a readable marker (or of another host, or of a running process) is left
    alone: it may belong to a write in progress."""
    out = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    for n in names:
        path = os.path.join(parent, n)
        if not n.startswith(TEMP_PREFIX) or not os.path.isdir(path):
            continue
        try:
            with open(os.path.join(path, MARKER), encoding="utf-8") as fh:
                m = json.load(fh)
            pid, host, dest = int(m["pid"]), str(m["host"]), str(m.get("destination", "?"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if host == socket.gethostname() and pid != os.getpid() and not _alive(pid):
            out.append((path, dest))
    return out


def clean_stale(parent: str, notice: Callable[[str], None] | None = None) -> list[str]:
    """Remove the temporary folders of killed writers in ``parent`` (:func:`stale_temporaries`),
    reporting each through ``notice``; returns the folders removed."""
    removed = []
    for path, dest in stale_temporaries(parent):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        if notice is not None:
            notice(f"removed {path}, the temporary folder of an interrupted write of {dest}")
    return removed


def write_grouped(path: str, plan: FilePlan, producers: Mapping[str, Callable[[], np.ndarray]],
                  groups: Iterable[OutGroup], written: Callable[[TensorSpec], None] | None = None, sync: bool = True) -> None:
    """Write a planned file whose tensors come in groups (every component of one encoded
    tensor from one encoding): walking the planned order, the first tensor of a group not yet
    written makes the whole group, and each of its arrays is written at its planned offset,
    then dropped.  Memory holds one group at a time whatever the order of the header."""
    by_name = {}
    for g in groups:
        for n in g.names:
            by_name[n] = g
    offsets, off = {}, len(plan.header)
    for t in plan.order:
        offsets[t.name] = off
        off += t.nbytes
    done: set[str] = set()
    specs = {s.name: s for s in plan.order}
    found: dict[str, Any] = {}  # stored name -> its digest (SPEC.md §3.8), computed as it is written
    with atomic_write(path, "wb", sync=sync) as f:
        f.write(plan.header)
        f.truncate(plan.size)
        for t in plan.order:
            if t.name in done:
                continue
            g = by_name.get(t.name)
            if g is None:
                arrays: Mapping[str, Any] = {t.name: producers[t.name]()}
            else:
                arrays = g.produce()
                if set(arrays) != set(g.names):
                    raise error("SAVE_INVALID", f"produced tensors {sorted(arrays)}, planned {sorted(g.names)}", tensor=t.name)
            for n in list(arrays):
                f.seek(offsets[n])
                container.write_array(container.digest_sink(f, n, plan, found), container.checked_array(specs[n], arrays[n]))
                done.add(n)
                if written is not None:
                    written(specs[n])
            del arrays
        container.write_digests(f, plan, found)


def write_planned(path: str, plan: FilePlan, produce: Callable[[TensorSpec], np.ndarray],
                  written: Callable[[TensorSpec], None] | None = None,
                  copy_from: Mapping[str, tuple[str, int]] | None = None, sync: bool = True) -> None:
    """One file of the checkpoint (:func:`qformat.container.write_planned`; ``copy_from``:
    tensors whose bytes are copied file to file from ``(path, offset)``)."""
    container.write_planned(path, plan, produce, written, copy_from, sync)


def index_bytes(files: list[OutFile], plans: list[FilePlan], spec: IndexSpec) -> bytes:
    """The index's bytes: ``spec``'s members, ``metadata.total_size`` and a ``weight_map`` of
    every stored and logical tensor name of ``files`` (the same bytes for the same plan)."""
    weight_map: dict[str, str] = {}
    for f in files:
        for t in f.tensors:
            weight_map[t.spec.name] = f.name
        for n in f.logical:
            weight_map.setdefault(n, f.name)
    idx = {k: v for k, v in spec.base.items() if k != "weight_map"}
    md = dict(idx.get("metadata") or {}) if isinstance(idx.get("metadata"), dict) else {}
    md["total_size"] = sum(p.data_bytes for p in plans)
    idx["metadata"] = md
    idx["weight_map"] = dict(sorted(weight_map.items()))
    return (json.dumps(idx, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def arrays_file(name: str, arrays: Mapping[str, np.ndarray], metadata: dict[str, str] | None) -> OutFile:
    """An :class:`OutFile` over arrays already in memory (storage dtypes)."""
    from .. import dtypes as _dt

    out = OutFile(name, metadata)
    for n, a in arrays.items():
        st = _dt.storage_name(a.dtype)
        if st is None:
            raise error("SAVE_INVALID", f"array dtype {a.dtype} has no safetensors dtype", tensor=n)
        out.tensors.append(OutTensor(TensorSpec(n, st, tuple(a.shape)), lambda a=a: a))
    return out
