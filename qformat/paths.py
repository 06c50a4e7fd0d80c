"""The one path policy: names that come from INSIDE a file or folder (issue 40).

A part manifest's ``tree``/``assignment``/``files``, a sharded index's ``weight_map`` shard
names, the entries of a model folder carried as side files, the links of a huggingface_hub
cache snapshot: each is a path a stranger wrote.  Every command that turns one into a path
goes through this module, so the rule is the same everywhere:

* a name is relative, '/'-separated, made of plain segments: no absolute path, drive letter,
  backslash, NUL, empty segment, ``.`` or ``..`` (:func:`parts`);
* the resolved path stays inside the root the user named: ``realpath(root/name)`` lies under
  ``realpath(root)`` (:func:`within`);
* a link is followed only where the layout defines it: inside the root, or from a
  huggingface_hub cache snapshot (``.../models--org--name/snapshots/<rev>/``) to a regular file
  directly in that same repository's real ``blobs/`` folder (not a link to one)
  (:func:`source_file`, :func:`link_target`, :func:`hub_blobs`); a layout that holds no links
  (a part folder qformat wrote: :func:`qformat.checkpoint.split.merge`) refuses every link;
* what qformat reads must be a regular file; an OS error on reading is ``FILE_UNREADABLE`` naming
  the path (:func:`unreadable`);
* a copy never gets wider permission bits than its source: it gets the user's default mode
  intersected with the source's (:func:`copy_mode`).

A refusal carries the caller's code (SPLIT_PART_INVALID for merge manifests, INDEX_INVALID for
an index's shard names, CONVERT_SOURCE_INVALID for a source folder's side files and links, the
command's ``*_DESTINATION_INVALID`` for destinations) and names the entry, the root and what was
found.  The checks are made when the name is used; a folder that another process changes
between the check and the read is outside what this guards (qformat reads what strangers
wrote, it does not race them).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from .atomic import default_mode
from .errors import QFormatError, error

_DRIVE = re.compile(r"^[A-Za-z]:")


def _refuse(code: str, what: str, rel: Any, root: str, why: str, field: str | None) -> QFormatError:
    return error(code, f"{what} {rel!r} (in {root}) {why}", field=field)


def parts(rel: Any, *, code: str, root: str, what: str = "name", field: str | None = None, single: bool = False) -> list[str]:
    """The segments of a relative name read from inside ``root``, or the caller's ``code``.

    Refused: a non-string, an empty name, NUL, a backslash (a separator on Windows, never in a
    name qformat or the safetensors ecosystem writes), an absolute path or a drive letter, an
    empty, ``.`` or ``..`` segment; with ``single`` any '/' (a plain file name)."""
    if not isinstance(rel, str) or not rel:
        raise _refuse(code, what, rel, root, "is not a file name (expected a non-empty relative name)", field)
    if "\0" in rel:
        raise _refuse(code, what, rel, root, "holds a NUL character", field)
    if "\\" in rel:
        raise _refuse(code, what, rel, root, "holds a backslash; names are '/'-separated", field)
    if rel.startswith("/") or _DRIVE.match(rel):
        raise _refuse(code, what, rel, root, "is an absolute path or starts with a drive letter; only a name relative to "
                      "the folder is allowed", field)
    segs = rel.split("/")
    if single and len(segs) > 1:
        raise _refuse(code, what, rel, root, "must be a plain file name in the folder, without '/'", field)
    for s in segs:
        if s in ("", ".", ".."):
            raise _refuse(code, what, rel, root, f"has a {s or 'empty'!r} segment; it must stay inside the folder"
                          if s else "has an empty segment ('//' or a trailing '/')", field)
    return segs


def within(path: str, root: str) -> bool:
    """Whether the real path ``path`` is ``root`` or lies under it (both already real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def hub_blobs(root: str | os.PathLike[str]) -> str | None:
    """``realpath(repo)/blobs`` when ``root`` is a snapshot of a huggingface_hub cache repository
    (``.../models--org--name/snapshots/<revision>``) and that ``blobs`` is a real folder of the
    repository (not a link: a ``blobs`` that links elsewhere, say to a home folder, would let a
    snapshot's links read anything there); else None."""
    real = os.path.realpath(os.fspath(root))
    snapshots = os.path.dirname(real)
    if os.path.basename(snapshots) != "snapshots":
        return None
    blobs = os.path.join(os.path.dirname(snapshots), "blobs")
    try:
        st = os.lstat(blobs)
    except OSError:
        return None
    return blobs if stat.S_ISDIR(st.st_mode) else None


def link_target(root: str | os.PathLike[str], path: str, rel: str, *, code: str, what: str = "file",
                field: str | None = None, blobs: str | None = None) -> str:
    """The real path a link ``path`` (the entry ``rel`` of ``root``) may be followed to: a regular
    file inside ``realpath(root)``, or directly in ``blobs`` (:func:`hub_blobs` of the root, for a
    huggingface_hub snapshot).  Anything else is refused with ``code``: a link leaving the root,
    to a folder, broken, or to something that is not a regular file."""
    root = os.fspath(root)
    target = os.path.realpath(path)
    if not (within(target, os.path.realpath(root)) or (blobs is not None and os.path.dirname(target) == blobs)):
        where = "outside the folder" + (" and not directly in its huggingface_hub cache repository's blobs/" if blobs else "")
        raise _refuse(code, what, rel, root, f"is a link to {target}, {where}, which qformat does not follow", field)
    try:
        st = os.stat(target)
    except OSError:
        raise _refuse(code, what, rel, root, "is a broken link", field) from None
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(code, what, rel, root, "is a link to a folder, which qformat does not follow", field)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(code, what, rel, root, "is a link to something that is not a regular file (a device, pipe or socket)", field)
    return target


def source_file(root: str | os.PathLike[str], rel: Any, *, code: str, what: str = "file", field: str | None = None,
                single: bool = False, missing: str | None = None) -> str | None:
    """The path to read for the entry ``rel`` (:func:`parts`' rules) of the folder ``root``: the
    lexical path of a regular file whose folder lies inside ``realpath(root)``, or a link's target
    (:func:`link_target`: inside the root, or a hub snapshot's blob).  A missing entry: None when
    ``missing`` is None, else refused with the reason ``missing``.  Anything that is not a regular
    file is refused.  Every refusal carries ``code``; an OS error is :func:`unreadable`'s."""
    root = os.path.abspath(os.fspath(root))
    segs = parts(rel, code=code, root=root, what=what, field=field, single=single)
    path = os.path.join(root, *segs)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if missing is None:
            return None
        raise _refuse(code, what, rel, root, missing, field) from None
    except NotADirectoryError:
        raise _refuse(code, what, rel, root, "lies under something that is not a folder", field) from None
    except OSError as e:
        raise unreadable(path, e) from None
    real_parent = os.path.realpath(os.path.dirname(path))
    if not within(real_parent, os.path.realpath(root)):  # a folder on the way is a link that leaves the root
        raise _refuse(code, what, rel, root, f"lies in {real_parent}, outside the folder", field)
    if stat.S_ISLNK(st.st_mode):
        return link_target(root, path, "/".join(segs), code=code, what=what, field=field, blobs=hub_blobs(root))
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise _refuse(code, what, rel, root, f"is {kind}", field)
    return path


def unreadable(path: str | os.PathLike[str], e: OSError, code: str = "FILE_UNREADABLE") -> QFormatError:
    """The coded error for an OS error met reading ``path`` (permission denied, I/O error, a
    folder that cannot be listed), naming the path and the system's reason."""
    return error(code, f"cannot read {os.fspath(path)}: {e.strerror or e}")


def copy_mode(source_mode: int) -> int:
    """Permission bits of a copy of a file whose mode is ``source_mode``: the user's default
    mode (what ``open()`` gives under the umask) intersected with the source's, so a copy is
    never readable by more people than its source (a 0600 key stays 0600)."""
    return default_mode() & stat.S_IMODE(source_mode)
