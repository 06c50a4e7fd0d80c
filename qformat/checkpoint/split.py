"""A whole-checkpoint command split across processes or hosts by output shard (issue 27).

``qformat quantize`` and ``qformat convert`` plan every output file from the source's headers
before any tensor body exists (:mod:`qformat.checkpoint.writer`).  The plan is the same on every
host given the same source and options, so N processes can share the work without talking:

* :func:`assign` gives each planned output file to one of N parts, from the plan alone
  (largest file first to the part with the fewest bytes so far; ties by name and part number),
  so every host computes the same assignment.
* ``--part K/N`` (:func:`part_job`) runs the command's ordinary streaming pipeline, but the
  writer writes only part K's files, into ``DST.parts/part-K-of-N/`` beside the destination:
  built in a temporary folder (the writer's ``.qformat-convert-*`` with its marker, removed by
  the next run when its process is gone), then renamed into place with its manifest
  (``part.json``: source fingerprint, plan digest, assignment, each file's size and header
  digest).  A part folder therefore exists only complete.  Part 1 also stages what the folder
  holds besides the shards (side files, config.json, the index) under ``tree/``.
* :func:`merge` (``qformat merge DST``), holding a lock on ``DST.parts`` (a second merge into
  the same destination is refused while one runs), checks that parts 1..N are all there, exactly
  once, from the same source, plan and N; that every name a manifest gives stays inside the
  destination and every entry of a part folder is a regular file or folder (no links:
  :mod:`qformat.paths`); and that each file has the size, header and SHA-256 its manifest
  records.  Then it links (or copies) them into a temporary folder beside ``DST``, adds part
  1's tree (the index written last), checks that folder as ``qformat check --digests`` does
  (every recorded tensor digest included) and only then renames it into place: ``DST`` appears
  complete or not at all, the same bytes as a single-process run, and ``DST.parts`` is removed.
* ``--workers N`` (:func:`run` with ``workers``) runs the N parts as N spawned processes on one
  machine and merges them.

Each part is the single-process pipeline restricted to its files, so a worker holds one tensor
at a time as a single run does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from . import writer as w
from .. import paths
from ..atomic import atomic_write, default_mode
from ..errors import QFormatError, error

#: The error code of every refusal of a split run that is not the destination's.
CODE = "SPLIT_PART_INVALID"
#: The manifest inside a finished part folder.
MANIFEST = "part.json"
#: Suffix of the staging folder beside the destination.
STAGING_SUFFIX = ".parts"
_FORMAT = "qformat-split-part"
#: 2: each shard's and tree file's whole-file SHA-256 (``sha256``), the tree as name -> record.
_VERSION = 2
#: The lock file a merge holds inside the staging folder (its holder's host and process id).
LOCK = ".qformat-merge.lock"
#: A part manifest larger than this is refused before it is parsed (real ones are kilobytes).
MAX_MANIFEST_BYTES = 16 << 20
#: Bytes read per step when hashing a staged file.
CHUNK = 8 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Part:
    """Part ``k`` of ``n`` (1-based)."""

    k: int
    n: int

    @property
    def folder(self) -> str:
        """The part's folder name inside the staging folder."""
        return f"part-{self.k}-of-{self.n}"

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def parse_part(value: Any) -> Part:
    """``"K/N"`` (or a :class:`Part`, or a ``(k, n)`` pair) as a :class:`Part` with 1 <= K <= N;
    else SPLIT_PART_INVALID saying what was found."""
    if isinstance(value, Part):
        k, n = value.k, value.n
    elif isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        k, n = value
    else:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(value))
        if not m:
            raise error(CODE, f"--part expects K/N such as 2/8 (part K of N, counting from 1), found {value!r}", field="part")
        k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise error(CODE, f"--part {k}/{n}: K must be between 1 and N (N >= 1), found K={k}, N={n}", field="part")
    return Part(k, n)


def staging_folder(dst: str | os.PathLike[str]) -> str:
    """Where the parts of a split run writing ``dst`` are staged: ``DST.parts`` beside it."""
    return os.path.abspath(os.fspath(dst)).rstrip(os.sep) + STAGING_SUFFIX


def assign(sizes: Sequence[tuple[str, int]], n: int) -> dict[str, int]:
    """File name -> part (1..n), balanced by bytes: the largest file first (ties by name) goes
    to the part with the fewest bytes so far (ties: the lowest part).  Depends on the names and
    sizes alone, so every host computes the same assignment from the same plan."""
    load = [0] * n
    out: dict[str, int] = {}
    for name, size in sorted(sizes, key=lambda s: (-s[1], s[0])):
        k = min(range(n), key=lambda i: (load[i], i))
        load[k] += size
        out[name] = k + 1
    return out


def source_fingerprint(src: str | os.PathLike[str]) -> str:
    """A digest of what the output is made from, cheap to compute on every host: each source
    file's name, size and header bytes (for safetensors; the first MiB for GGUF), the index and
    config.json.  Weight bytes are not read (the headers of qformat files carry their digests)."""
    from .source import MAX_SIDE_JSON_BYTES, Checkpoint, unchecked

    with unchecked():  # the command itself applies check's rules; this only reads
        ck = Checkpoint(src)
    h = hashlib.sha256()
    path = ck.folder
    try:
        for f in ck.files:
            path = os.path.join(ck.folder, f)
            h.update(f"{f}\0{os.path.getsize(path)}\0".encode())
            h.update(_header_bytes(path) if ck.kind == "safetensors" else _head(path, 1 << 20))
        for side in filter(None, [ck.index_name, "config.json"]):
            # the path policy: a config.json that links out of the folder is refused, not read
            p = paths.source_file(ck.folder, side, code="CONVERT_SOURCE_INVALID", what="side file")
            if p is not None:
                path = p
                h.update(side.encode() + b"\0" + _head(p, MAX_SIDE_JSON_BYTES))
    except OSError as e:
        raise paths.unreadable(path, e) from None
    return h.hexdigest()


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _header_bytes(path: str) -> bytes:
    """A safetensors file's length prefix and header (the length read is bounded by the file's
    size, whatever the prefix says)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return prefix
        return prefix + f.read(min(int.from_bytes(prefix, "little"), os.fstat(f.fileno()).st_size - 8))


def _file_sha(path: str) -> str:
    """The SHA-256 of a whole file, read in bounded chunks (FILE_UNREADABLE naming it on an OS error)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while b := f.read(CHUNK):
                h.update(b)
    except OSError as e:
        raise paths.unreadable(path, e) from None
    return h.hexdigest()


def _stable_header(plan: Any) -> bytes:
    """A planned header with its digest placeholders (random per planning, SPEC.md §3.8) zeroed:
    the same bytes for the same plan on every host."""
    h = bytearray(plan.header)
    hexdigits = b"0123456789abcdef"
    for _name, at in plan.digest_slots:
        end = at
        while end < len(h) and h[end] in hexdigits:
            end += 1
        h[at:end] = b"0" * (end - at)
    return bytes(h)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The request's options as JSON (for messages and the manifest): paths and objects as text."""
    skip = {"src", "dst", "overwrite", "progress", "notice", "part", "workers"}
    return {k: _jsonable(v) for k, v in sorted(kwargs.items()) if k not in skip}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "to_dict"):
        return _jsonable(v.to_dict())
    return os.fspath(v) if isinstance(v, os.PathLike) else repr(v)


class PartJob:
    """The writer's hook for one part (set by :func:`part_job`): writes the part's share of
    the planned files into its part folder of the staging folder."""

    def __init__(self, part: Part, command: str, source: str, options: Mapping[str, Any]):
        self.part, self.command, self.source, self.options = part, command, source, dict(options)
        self.started = time.time()
        self.cpu0 = _cpu_seconds()
        self.written: list[str] = []
        self.folder: str | None = None
        self.bytes = 0

    def write(self, dst: str, files: list[w.OutFile], *, as_folder: bool, overwrite: bool, side_files: Iterable[Any],
              index: w.IndexSpec | None, verify: Callable[[str], None] | None, written: Callable[[Any], None] | None,
              file_done: Callable[[str, int], None] | None, extra_files: Mapping[str, bytes] | None,
              notice: Callable[[str], None] | None) -> list[str]:
        """:func:`qformat.checkpoint.writer.write_checkpoint` for this part (same arguments)."""
        if not as_folder:
            raise error(CODE, "--part and --workers split a checkpoint written as a folder by its shards; this source gives "
                        "one file: give --max-shard-size to shard the output, or run without --part/--workers", field="part")
        w.check_destination(dst, as_folder, overwrite)  # the final destination must be writable by the merge
        plans = [f.plan() for f in files]
        assignment = assign([(f.name, p.size) for f, p in zip(files, plans)], self.part.n)
        idx = w.index_bytes(files, plans, index) if index is not None else None
        extra = dict(extra_files or {})
        side = [s if isinstance(s, w.SideFile) else w.SideFile(os.fspath(s), os.path.basename(os.fspath(s))) for s in side_files]
        produced = {f.name for f in files} | set(extra) | ({index.name} if index is not None else set())
        side = [s for s in side if s.name not in produced]
        # Everything the merged folder will hold, by name and bytes (side files by name): equal
        # digests mean the parts were planned from the same source with the same options.
        plan_digest = _sha(json.dumps({
            "files": [[f.name, _sha(_stable_header(p)), p.size] for f, p in zip(files, plans)],
            "index": [index.name, _sha(idx)] if idx is not None else None,
            "extra": {n: _sha(b) for n, b in sorted(extra.items())},
            "side": sorted(s.name for s in side)}, sort_keys=True).encode())
        staging = staging_folder(dst)
        os.makedirs(staging, exist_ok=True)
        w.clean_stale(staging, notice)
        tmp = tempfile.mkdtemp(prefix=w.TEMP_PREFIX, dir=staging)
        try:
            w._mark(tmp, dst)
            os.mkdir(os.path.join(tmp, "shards"))
            mine = [(f, p) for f, p in zip(files, plans) if assignment[f.name] == self.part.k]
            w.write_files(os.path.join(tmp, "shards"), [f for f, _ in mine], [p for _, p in mine],
                          verify=verify, written=written, file_done=file_done)
            tree: dict[str, dict[str, Any]] = {}
            if self.part.k == 1:  # the rest of the folder, staged once, so the merge needs no source
                os.mkdir(os.path.join(tmp, "tree"))
                w.write_tree(os.path.join(tmp, "tree"), files, plans, side_files=side, index=index, extra_files=extra)
                for rel in sorted(_walk(os.path.join(tmp, "tree"))):
                    fp = os.path.join(tmp, "tree", *rel.split("/"))
                    tree[rel] = {"size": os.path.getsize(fp), "sha256": _file_sha(fp)}
            # what the merge verifies each staged file against (a copy between hosts can be cut short or damaged)
            shards = {f.name: {"size": p.size, "header_sha256": _sha(_header_bytes(os.path.join(tmp, "shards", f.name))),
                               "sha256": _file_sha(os.path.join(tmp, "shards", f.name))} for f, p in mine}
            usage = _cpu_seconds()  # this part's work: planning, encoding, writing (not the interpreter's start)
            manifest = {"format": _FORMAT, "version": _VERSION, "part": self.part.k, "parts": self.part.n,
                        "command": self.command, "destination": dst, "source": {"path": self.source,
                        "fingerprint": source_fingerprint(self.source)},
                        "options": self.options, "plan": plan_digest, "assignment": assignment,
                        "files": shards, "tree": tree, "index": index.name if index is not None else None,
                        "host": socket.gethostname(), "pid": os.getpid(),
                        "seconds": time.time() - self.started, "cpu_seconds": usage - self.cpu0, "process_cpu_seconds": usage}
            with atomic_write(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=2, sort_keys=True)
                fh.write("\n")
            os.unlink(os.path.join(tmp, w.MARKER))
            for sub in ("", "shards", "tree"):
                if os.path.isdir(os.path.join(tmp, sub)):
                    os.chmod(os.path.join(tmp, sub), default_mode(folder=True))
            final = os.path.join(staging, self.part.folder)
            w.replace_folder(tmp, final)  # a part folder exists only complete: a rerun replaces it whole
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(staging)  # only when no other part is (or was) there: nothing is left of a refused first part
            raise
        self.folder = final
        self.bytes = sum(p.data_bytes for _, p in mine)
        self.written = [os.path.join(final, "shards", f.name) for f, _ in mine]
        return self.written


def _cpu_seconds() -> float:
    """User plus system CPU seconds of this process so far."""
    t = os.times()
    return t.user + t.system


def _walk(root: str) -> Iterator[str]:
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            yield os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/")


@contextlib.contextmanager
def part_job(part: Any, src: str | os.PathLike[str], command: str, options: Mapping[str, Any]) -> Iterator[PartJob]:
    """Within this block the writer writes only ``part``'s share of a checkpoint, into the
    staging folder (see the module's description)."""
    from ..remote import is_url

    p = parse_part(part)
    if is_url(os.fspath(src)):
        raise error(CODE, f"a split run reads a local source (each host its own copy or a shared folder), found {os.fspath(src)!r}",
                    field="part")
    job = PartJob(p, command, os.path.abspath(os.fspath(src)), options)
    token = w._PART.set(job)
    try:
        yield job
    finally:
        w._PART.reset(token)


@dataclass
class PartResult:
    """What one part wrote: its folder, files, data bytes, wall and CPU seconds of its work
    (planning, encoding, writing; a spawned worker's interpreter start and imports not counted)."""

    part: int
    parts: int
    folder: str
    files: list[str]
    bytes: int
    seconds: float
    cpu_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run(fn: Callable[..., Any], kwargs: Mapping[str, Any], *, command: str, part: Any = None, workers: int | None = None,
        notice: Callable[[str], None] | None = None) -> Any:
    """Run ``fn(**kwargs)`` (``quantize_checkpoint``, ``convert``: a function writing a
    checkpoint from ``kwargs["src"]`` to ``kwargs["dst"]``) split by output shard.

    ``part`` ("K/N"): only part K, into the staging folder; returns ``fn``'s result with
    ``parts`` set to this part's :class:`PartResult`.  ``workers`` (N >= 1): parts 1..N in N
    spawned processes, then :func:`merge`; returns part 1's result with ``files`` the merged
    files and ``parts`` every part's :class:`PartResult`.  Given both: SPLIT_PART_INVALID."""
    if part is not None and workers is not None:
        raise error(CODE, "give --part (this process writes one part) or --workers (this machine writes every part), not both",
                    field="workers")
    if part is not None:
        with part_job(part, kwargs["src"], command, _options(kwargs)) as job:
            result = fn(**kwargs)
        _attach(result, [_result_of(job)])
        return result
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise error(CODE, f"--workers expects a number of processes >= 1, found {workers!r}", field="workers")
    return _run_workers(fn, kwargs, command, workers, notice)


def _result_of(job: PartJob) -> PartResult:
    return PartResult(job.part.k, job.part.n, job.folder or "", job.written, job.bytes, time.time() - job.started,
                      _cpu_seconds() - job.cpu0)


def _attach(result: Any, parts: Sequence[PartResult | dict[str, Any]]) -> None:
    with contextlib.suppress(AttributeError, TypeError):
        result.parts = [p.to_dict() if isinstance(p, PartResult) else dict(p) for p in parts]


def _worker(conn: Any, fn: Callable[..., Any], kwargs: dict[str, Any], command: str, part: str, threads: int) -> None:
    """One spawned part: its result, or its coded error, goes back through ``conn``.  The
    encoders' threads (a single process uses every core for each tensor) are shared out among
    the workers so N workers do not run N times the cores' threads; the bytes never depend on it."""
    import signal

    from ..schemes import _common

    _common.THREADS = threads

    def _term(signum: int, frame: Any) -> None:  # the writer then removes its temporary folder
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        result = run(fn, kwargs, command=command, part=part)
        conn.send(("ok", result))
    except QFormatError as e:
        conn.send(("error", e.code, e.message, e.tensor, e.field))
    except KeyboardInterrupt:
        conn.send(("interrupted",))
    except BaseException as e:  # noqa: BLE001 - reported by the parent as the part's failure
        conn.send(("exception", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _run_workers(fn: Callable[..., Any], kwargs: Mapping[str, Any], command: str, n: int,
                 notice: Callable[[str], None] | None) -> Any:
    import multiprocessing as mp

    dst = os.fspath(kwargs["dst"])
    with w.writing_for(command):
        # Refuse a destination the merge could not write before N processes plan the checkpoint.
        if os.path.exists(dst) and not kwargs.get("overwrite"):
            raise w.destination_error(f"{os.path.abspath(dst)} exists; pass --overwrite to replace it")
    staging = staging_folder(dst)
    # This run writes every part: finished parts of an earlier run in the staging folder would
    # only be replaced or, for another N, refused by the merge.
    for old in _part_folders(staging):
        shutil.rmtree(old, ignore_errors=True)
    ctx = mp.get_context("spawn")  # a fresh interpreter per part: no fork of a process holding maps and threads
    child_kwargs = {k: v for k, v in kwargs.items() if k not in ("progress", "notice")}
    from ..schemes import _common

    threads = max(1, _common.THREADS // n)
    procs = []
    try:
        for k in range(1, n + 1):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(send, fn, child_kwargs, command, f"{k}/{n}", threads), name=f"qformat-part-{k}-of-{n}")
            p.start()
            send.close()
            procs.append((k, p, recv))
        outcomes: dict[int, tuple[Any, ...]] = {}
        for k, p, recv in procs:
            try:
                outcomes[k] = recv.recv()
            except EOFError:  # the process died without a word (killed, out of memory)
                outcomes[k] = ("died",)
            p.join()
            if outcomes[k][0] == "died":
                outcomes[k] = ("died", p.exitcode)
    except BaseException:
        for _, p, _ in procs:
            if p.is_alive():
                p.terminate()
        for _, p, _ in procs:
            p.join()
        raise
    for k in sorted(outcomes):  # a coded error of any part is the run's error (the first part's)
        o = outcomes[k]
        if o[0] == "error":
            # the same request fails the same way on a rerun: no part of this run is worth keeping
            shutil.rmtree(staging, ignore_errors=True)
            raise error(o[1], o[2], tensor=o[3], field=o[4])
    for k in sorted(outcomes):
        o = outcomes[k]
        if o[0] != "ok":
            why = {"died": f"its process ended with status {o[1] if len(o) > 1 else '?'} before finishing",
                   "interrupted": "it was interrupted", "exception": f"internal error: {o[1] if len(o) > 1 else '?'}"}[o[0]]
            raise error(CODE, f"part {k}/{n} did not finish ({why}); the destination was not written; the other parts are in "
                        f"{staging}: rerun the same command with --part {k}/{n}, then `qformat merge {dst}`", field="part")
    merged = merge(dst, overwrite=bool(kwargs.get("overwrite")), notice=notice)
    result = outcomes[1][1]
    with contextlib.suppress(AttributeError, TypeError):
        result.files = merged.files
    _attach(result, merged.parts)
    if notice is not None:
        for wng in getattr(result, "warnings", None) or []:
            notice(f"warning: [{wng['code']}] {wng['message']}")
    return result


def _part_folders(staging: str) -> list[str]:
    if not os.path.isdir(staging):
        return []
    return [os.path.join(staging, n) for n in sorted(os.listdir(staging))
            if not n.startswith(".") and os.path.isfile(os.path.join(staging, n, MANIFEST))]


@dataclass
class MergeSummary:
    """What :func:`merge` wrote: the command the parts ran, the files in the destination, the
    data bytes, and each part's :class:`PartResult` as a dict (wall and CPU seconds)."""

    command: str
    destination: str
    files: list[str]
    bytes: int
    parts: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def merge(dst: str | os.PathLike[str], overwrite: bool = False, notice: Callable[[str], None] | None = None) -> MergeSummary:
    """Put the parts staged in ``DST.parts`` together as the checkpoint ``dst``.

    Refused (SPLIT_PART_INVALID, naming the part and what differs; nothing written) while
    another merge into ``dst`` runs (:func:`merge_lock`), and unless the staging folder holds
    parts 1..N exactly once, each finished (a folder with its manifest; a temporary folder of a
    part still running or killed is named), all of the same command, N, source fingerprint and
    plan, each holding exactly the files the assignment gives it; each part folder holding only
    regular files and folders (a link, device or pipe is refused), each name its manifest gives
    a relative path inside the destination (:mod:`qformat.paths`), each file of the size, header
    digest and SHA-256 recorded.  A destination that exists without ``overwrite`` is the
    command's ``*_DESTINATION_INVALID``.  The files are hard-linked (copied across file systems)
    into a temporary folder beside ``dst`` with part 1's tree (side files, config.json, the
    index); that folder must pass ``qformat check --digests`` (:func:`qformat.check.check`,
    every recorded tensor digest verified) and is then renamed into place in one step; then the
    staging folder is removed.  Memory holds one chunk or one tensor at a time.
    """
    dst = os.path.abspath(os.fspath(dst))
    staging = staging_folder(dst)
    if not os.path.isdir(staging):
        raise error(CODE, f"no parts to merge: {staging} does not exist (run the command with --part K/N for K = 1..N first)",
                    field="part")
    with merge_lock(staging, dst):
        return _merge(dst, staging, overwrite, notice)


def _merge(dst: str, staging: str, overwrite: bool, notice: Callable[[str], None] | None) -> MergeSummary:
    manifests: dict[int, tuple[str, dict[str, Any]]] = {}
    first: dict[str, Any] | None = None
    try:
        listed = sorted(os.listdir(staging))
    except OSError as e:
        raise paths.unreadable(staging, e) from None
    running = [n for n in listed if n.startswith(w.TEMP_PREFIX)]
    for name in listed:
        path = os.path.join(staging, name)
        if name.startswith("."):
            continue
        try:
            st = os.lstat(path)
        except OSError as e:
            raise paths.unreadable(path, e) from None
        if stat.S_ISLNK(st.st_mode):
            raise error(CODE, f"{path} is a link (to {os.readlink(path)!r}); a part folder is copied into {staging}, not "
                        "linked: qformat merges only what lies in the staging folder", field="part")
        if not stat.S_ISDIR(st.st_mode):
            continue
        m = _read_manifest(path)
        k = m["part"]
        if k in manifests:
            raise error(CODE, f"part {k}/{m['parts']} appears twice, in {manifests[k][0]} and {path}; remove one", field="part")
        if first is None:
            first = m
        for key, what in (("parts", "N"), ("command", "command"), ("source", "source"), ("plan", "plan")):
            a, b = (first[key]["fingerprint"], m[key]["fingerprint"]) if key == "source" else (first[key], m[key])
            if a != b:
                ref = manifests[min(manifests)][0] if manifests else path
                detail = {"parts": f"{first['parts']} parts against {m['parts']}",
                          "command": f"{first['command']!r} against {m['command']!r}",
                          "source": f"source {first['source']['path']} against {m['source']['path']} (their headers, index or "
                                    "config.json differ)",
                          "plan": f"options {json.dumps(first['options'], sort_keys=True)} against "
                                  f"{json.dumps(m['options'], sort_keys=True)}: the planned files differ"}[key]
                raise error(CODE, f"part {k}/{m['parts']} in {path} is not of the same run as {ref}: {what} differs ({detail}); "
                            "rerun it with the same source and options", field=key)
        manifests[k] = (path, m)
    if first is None:
        more = f"; {', '.join(running)} is a part still being written, or killed" if running else ""
        raise error(CODE, f"no finished part in {staging}{more}", field="part")
    n = first["parts"]
    missing = [k for k in range(1, n + 1) if k not in manifests]
    if missing:
        more = (f"; {staging} holds {', '.join(running)}, the temporary folder of a part still being written or killed"
                if running else "")
        which = ", ".join(f"{k}/{n}" for k in missing)
        raise error(CODE, f"{'part' if len(missing) == 1 else 'parts'} {which} {'is' if len(missing) == 1 else 'are'} missing from {staging}{more}: run the same {first['command']} command with "
                    f"--part {missing[0]}/{n}{' (and the others)' if len(missing) > 1 else ''}, then merge again", field="part")
    assignment: dict[str, int] = first["assignment"]
    one = manifests[1][1]  # part 1 staged the rest of the folder
    _check_names(dst, manifests[1][0], assignment, one)
    for k, (path, m) in sorted(manifests.items()):
        want = sorted(f for f, p in assignment.items() if p == k)
        if sorted(m["files"]) != want or m["assignment"] != assignment:
            raise error(CODE, f"part {k}/{n} in {path} records files {sorted(m['files'])}, the plan assigns it {want}", field="part")
        found = _part_entries(path)
        for f, rec in sorted(m["files"].items()):
            _verify_staged(found, path, "shards/" + f, rec, f"part {k}/{n}", header=True)
        for rel, rec in sorted(m["tree"].items()) if k == 1 else ():
            _verify_staged(found, path, "tree/" + rel, rec, f"part 1/{n}", header=False)
    tree_root = os.path.join(manifests[1][0], "tree")
    with w.writing_for(first["command"]):
        w.check_destination(dst, True, overwrite)
    order = sorted(assignment)
    parent = os.path.dirname(dst)
    w.clean_stale(parent, notice)
    tmp = tempfile.mkdtemp(prefix=w.TEMP_PREFIX, dir=parent)
    origin: dict[str, str] = {}  # file in the merged folder -> the staged file it comes from
    try:
        w._mark(tmp, dst)
        for f in order:
            origin[f] = os.path.join(manifests[assignment[f]][0], "shards", f)
            _place(origin[f], os.path.join(tmp, f))
        index = one.get("index")
        for rel in sorted(one["tree"], key=lambda r: r == index):  # the index last
            parts = rel.split("/")
            target = os.path.join(tmp, *parts)
            if len(parts) > 1:
                os.makedirs(os.path.dirname(target), exist_ok=True)
            origin[rel] = os.path.join(tree_root, *parts)
            _place(origin[rel], target)
        os.unlink(os.path.join(tmp, w.MARKER))
        _check_merged(tmp, origin)
        os.chmod(tmp, default_mode(folder=True))
        w.replace_folder(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    parts = [PartResult(k, n, p, [os.path.join(dst, f) for f in sorted(m["files"])], 0, m["seconds"], m["cpu_seconds"]).to_dict()
             for k, (p, m) in sorted(manifests.items())]
    total = 0
    for d, (k, (_, m)) in zip(parts, sorted(manifests.items())):
        d["bytes"] = sum(r["size"] for r in m["files"].values())
        total += d["bytes"]
    shutil.rmtree(staging, ignore_errors=True)
    return MergeSummary(first["command"], dst, [os.path.join(dst, f) for f in order], total, parts)


@contextlib.contextmanager
def merge_lock(staging: str, dst: str) -> Iterator[None]:
    """Hold the merge lock of ``staging`` (:data:`LOCK`: an advisory lock on a file that names
    its holder's host and process) for the block, or SPLIT_PART_INVALID at once when another
    merge holds it.  The system releases the lock when its holder ends, however it ends (no
    stale lock survives a kill); the holder removes the file when done, and an acquirer that
    finds the file it locked removed (the staging folder of a merge that just finished) tries
    again, or says there is nothing to merge."""
    path = os.path.join(staging, LOCK)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileNotFoundError:
            raise error(CODE, f"no parts to merge: {staging} does not exist (another merge into {dst} just finished?)",
                        field="part") from None
        except OSError as e:
            raise error(CODE, f"cannot open the merge lock {path}: {e.strerror or e}", field="part") from None
        if not _try_lock(fd):
            try:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "a process that has just started"
            finally:
                os.close(fd)
            raise error(CODE, f"another qformat merge into {dst} is running ({holder}, holding {path}); this one wrote "
                        "nothing: wait for that merge to finish", field="part")
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)  # the file locked was removed by the merge that held it: lock the current one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on host {socket.gethostname()}".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting: flock (POSIX; NFS maps it to a byte-range
    lock) or a byte lock (Windows)."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True


def _check_names(dst: str, part1: str, assignment: Mapping[str, int], one: Mapping[str, Any]) -> None:
    """Every name the manifests give is a relative path inside the destination (the path
    policy: no absolute path, ``..``, empty segment, backslash or NUL; a shard name has no
    '/'), none is qformat's own temporary name, and no two of them are the same file or a
    file and a folder above another."""
    files: set[str] = set()
    for f in sorted(assignment):
        paths.parts(f, code=CODE, root=dst, what=f"the planned file name of {part1}/{MANIFEST},", field="assignment", single=True)
        files.add(f)
    for rel in sorted(one["tree"]):
        paths.parts(rel, code=CODE, root=dst, what=f"the tree entry of {part1}/{MANIFEST},", field="tree")
        if rel in files:
            raise error(CODE, f"{part1}/{MANIFEST} lists {rel!r} both as a planned file and in its tree", field="tree")
        files.add(rel)
    folders = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    for f in sorted(files):
        if f in folders:
            raise error(CODE, f"{part1}/{MANIFEST} lists {f!r} as a file and as a folder holding others", field="tree")
        if f.startswith(".qformat-"):
            raise error(CODE, f"{part1}/{MANIFEST} lists {f!r}, a name of qformat's own temporary files", field="tree")
    idx = one.get("index")
    if idx is not None and idx not in one["tree"]:
        raise error(CODE, f"{part1}/{MANIFEST} names the index {idx!r}, which its tree does not list", field="index")


def _part_entries(folder: str) -> dict[str, os.stat_result]:
    """Every file of a part folder by its '/'-separated path, with its ``lstat``: a part folder
    qformat wrote holds only regular files and folders, so a link (inside or out), device, pipe
    or socket anywhere in it is refused (SPLIT_PART_INVALID naming it)."""
    out: dict[str, os.stat_result] = {}

    def walk(path: str, rel: str) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise paths.unreadable(path, e) from None
        for e in entries:
            name = rel + e.name
            st = e.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise error(CODE, f"{e.path} is a link (to {os.readlink(e.path)!r}); a part folder qformat writes holds "
                            "none: copy the part again", field="part")
            if stat.S_ISDIR(st.st_mode):
                walk(e.path, name + "/")
            elif stat.S_ISREG(st.st_mode):
                out[name] = st
            else:
                raise error(CODE, f"{e.path} is not a regular file (a device, pipe or socket); a part folder qformat writes "
                            "holds none: copy the part again", field="part")

    walk(folder, "")
    return out


def _verify_staged(found: Mapping[str, os.stat_result], folder: str, rel: str, rec: Mapping[str, Any], part: str,
                   header: bool) -> None:
    """A staged file (``rel`` in the part ``folder``) is there as a regular file with the size,
    header digest (shards) and SHA-256 its manifest records: read once, in chunks."""
    fp = os.path.join(folder, *rel.split("/"))
    st = found.get(rel)
    if st is None:
        raise error(CODE, f"{part}: {fp} is missing; its manifest records {rec['size']} bytes (an incomplete copy?); rerun "
                    "or copy the part again", field="part")
    if st.st_size != rec["size"]:
        raise error(CODE, f"{part}: {fp} is {st.st_size} bytes, its manifest records {rec['size']} bytes (an incomplete "
                    "copy?); rerun or copy the part again", field="part")
    try:
        head = _header_bytes(fp) if header else b""
    except OSError as e:
        raise paths.unreadable(fp, e) from None
    if header and _sha(head) != rec["header_sha256"]:
        raise error(CODE, f"{part}: the header of {fp} differs from the one its manifest records", field="part")
    got = _file_sha(fp)
    if got != rec["sha256"]:
        raise error(CODE, f"{part}: the bytes of {fp} have SHA-256 {got}, its manifest records {rec['sha256']} (damaged "
                    "in a copy, or changed after the part was written); rerun or copy the part again", field="part")


def _check_merged(folder: str, origin: Mapping[str, str]) -> None:
    """The merged folder passes ``qformat check --digests`` (header and payload rules, every
    recorded tensor digest) before it is moved into place; else SPLIT_PART_INVALID with the
    check's code and message, naming the staged file the problem comes from."""
    from ..check import check

    report = check([folder], payload=True, digests=True)
    if report.ok:
        return
    p = report.problems[0]
    rel = os.path.relpath(p.file, folder).replace(os.sep, "/") if p.file else ""
    where = origin.get(rel, p.file or folder)
    what = f"tensor {p.tensor!r}: " if p.tensor else ""
    raise error(CODE, f"the merged folder fails qformat check ({len(report.problems)} problem(s)); the first, in {where}: "
                f"[{p.code}] {what}{p.message}; the destination was not written: rerun or copy that part again", field="part")


def _place(src: str, dst: str) -> None:
    """``src`` (a regular file: checked again here, never a link) at the new path ``dst``: a
    hard link (instant, the staged part left intact until the merge succeeded), or a synced
    copy where the file system refuses links; either way with permission bits no wider than
    the user's default mode (:func:`qformat.paths.copy_mode`)."""
    st = os.lstat(src)
    if not stat.S_ISREG(st.st_mode):
        raise error(CODE, f"{src} is not a regular file (it changed during the merge?)", field="part")
    if os.path.lexists(dst):
        raise error(CODE, f"two files of the parts would both be {dst}", field="part")
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise error(CODE, f"two files of the parts would both be {dst}", field="part") from None
    except OSError:
        w.copy_file(src, dst)
        return
    mode = stat.S_IMODE(st.st_mode)
    if paths.copy_mode(mode) != mode:  # a staged file made wider than the default: the merged one is not
        os.chmod(dst, paths.copy_mode(mode))


def _read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of the part folder ``folder``, its structure validated (:func:`_manifest_problem`)."""
    from ..container import _Dup, strict_json

    path = os.path.join(folder, MANIFEST)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise paths.unreadable(path, e) from None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise error(CODE, f"{folder} has no {MANIFEST}{'' if st is None else ' that is a regular file'}: it is not a finished "
                    "part (a part folder appears only complete; an interrupted copy of one?); remove it or copy the part again",
                    field="part")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise paths.unreadable(path, e) from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise error(CODE, f"{path} is larger than {MAX_MANIFEST_BYTES} bytes: not a part manifest", field="part")
    try:
        m, end = strict_json(raw.decode("utf-8"))
        if raw[end:].strip():
            raise ValueError("text follows the JSON object")
    except (_Dup, ValueError, UnicodeDecodeError, RecursionError) as e:
        msg = f"member {e.key!r} appears twice" if isinstance(e, _Dup) else str(e)
        raise error(CODE, f"{path} cannot be read as a part manifest: {msg}"[:400], field="part") from None
    if not isinstance(m, dict) or m.get("format") != _FORMAT:
        raise error(CODE, f"{path} is not a qformat part manifest (format {_FORMAT} version {_VERSION})", field="part")
    if m.get("version") == 1:
        raise error(CODE, f"{path} is a part manifest of version 1 (an older qformat), which records no SHA-256 of its files; "
                    f"this qformat merges version {_VERSION}: rerun that part with this qformat", field="part")
    if m.get("version") != _VERSION:
        raise error(CODE, f"{path} is a part manifest of version {m.get('version')!r}; this qformat merges version {_VERSION}",
                    field="part")
    why = _manifest_problem(m)
    if why:
        raise error(CODE, f"{path} is not a valid part manifest: {why}"[:400], field="part")
    return m


def _manifest_problem(m: Mapping[str, Any]) -> str | None:
    """Why a parsed version-2 manifest cannot be used (None: its members have the types the
    merge relies on).  Names are checked against the path policy later (:func:`_check_names`)."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not (is_int(m.get("part")) and is_int(m.get("parts")) and 1 <= m["part"] <= m["parts"]):
        return f"'part' and 'parts' must be integers with 1 <= part <= parts, found {m.get('part')!r} and {m.get('parts')!r}"
    if not isinstance(m.get("command"), str) or m["command"] not in w.DESTINATION_CODES:
        return f"'command' must be one of {sorted(w.DESTINATION_CODES)}, found {m.get('command')!r}"
    src = m.get("source")
    if not (isinstance(src, dict) and isinstance(src.get("path"), str) and isinstance(src.get("fingerprint"), str)):
        return "'source' must be an object with the strings 'path' and 'fingerprint'"
    if not isinstance(m.get("plan"), str) or not isinstance(m.get("options"), dict):
        return "'plan' must be a string and 'options' an object"
    a = m.get("assignment")
    if not (isinstance(a, dict) and all(is_int(v) and 1 <= v <= m["parts"] for v in a.values())):
        return f"'assignment' must map file names to parts 1..{m['parts']}"
    for key, rec_keys in (("files", ("size", "header_sha256", "sha256")), ("tree", ("size", "sha256"))):
        d = m.get(key)
        if not isinstance(d, dict):
            return f"'{key}' must be an object of file name -> record"
        for name, rec in d.items():
            if not (isinstance(rec, dict) and set(rec) == set(rec_keys) and is_int(rec["size"]) and rec["size"] >= 0
                    and all(isinstance(rec[h], str) and _HEX64.fullmatch(rec[h]) for h in rec_keys[1:])):
                return f"'{key}' record of {name!r} must be {{{', '.join(rec_keys)}}}: a size >= 0 and SHA-256 digests in hex"
    if not (m.get("index") is None or isinstance(m.get("index"), str)):
        return "'index' must be a file name or null"
    if not (is_num(m.get("seconds")) and is_num(m.get("cpu_seconds"))):
        return "'seconds' and 'cpu_seconds' must be numbers"
    return None


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, part: Any = None, workers: int | None = None,
            **kwargs: Any) -> Any:
    """:func:`qformat.convert.convert` (``from_format``, ``repack``, ``overwrite``, ...) split by
    output shard: ``part`` "K/N" or ``workers`` N, as :func:`run`."""
    from ..convert import convert as convert_

    return run(convert_, dict(src=src, dst=dst, **kwargs), command="convert", part=part, workers=workers)
