"""Per-stored-tensor digests (SPEC.md §3.8, version 1.2).

A qformat object of version 1.2 or later may carry ``"digests": {"algorithm": "sha256",
"tensors": {STORED_NAME: HEX, ...}}``: the digest of exactly the bytes of each stored tensor
(its ``data_offsets`` range, nothing else).  Writers record them while the bytes stream out;
``qformat check`` verifies them; readers verify them only when asked (``verify=True``).

Why SHA-256: it is in every standard library that matters here (Python's ``hashlib``,
node's ``crypto``, and the only digest of the browsers' WebCrypto), and on CPUs with SHA
instructions (x86 since about 2017, ARMv8) it is the fastest of hashlib's guaranteed digests
(measured 1.25 GB/s against BLAKE2b's 0.71 GB/s on this project's build machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from typing import Any, Callable, Iterable, Mapping

from .errors import QFormatError, error

#: Algorithms this reader implements -> length of their hexadecimal digest.
ALGORITHMS: dict[str, int] = {"sha256": 64}
#: The algorithm qformat's writers record.
DEFAULT_ALGORITHM = "sha256"
#: The first minor version (of major 1) whose files may carry ``digests``.
SINCE_MINOR = 2

ALGORITHM_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
HEX_RE = re.compile(r"^[0-9a-f]{1,128}$")
#: Bytes read per step when hashing a stored tensor from its file.
CHUNK = 8 << 20


def written_version(version: str) -> str:
    """The version a file declares once qformat's writers add digests to a qformat object whose
    descriptors need ``version`` (SPEC.md §17.1: the lowest version whose features it uses;
    ``digests`` is a 1.2 feature)."""
    major, minor = (int(x) for x in version.split("."))
    return version if (major, minor) >= (1, SINCE_MINOR) else f"1.{SINCE_MINOR}"


def structure_failures(d: Any) -> list[str]:
    """Why ``d`` is not a well-formed ``digests`` member (schema qformat-1.2, SPEC.md §3.2 Q5)."""
    if not isinstance(d, Mapping):
        return ["'digests' must be an object"]
    out = []
    extra = sorted(k for k in d if k not in ("algorithm", "tensors"))
    if extra:
        out.append(f"'digests' has unknown members {extra}")
    alg = d.get("algorithm")
    if not (isinstance(alg, str) and ALGORITHM_RE.fullmatch(alg)):
        out.append(f"'digests.algorithm' must be a name matching {ALGORITHM_RE.pattern}, found {alg!r}"[:200])
    ts = d.get("tensors")
    if not isinstance(ts, Mapping):
        out.append("'digests.tensors' must be an object of stored tensor name -> hexadecimal digest")
    else:
        for k, v in ts.items():
            if not (isinstance(v, str) and HEX_RE.fullmatch(v)):
                out.append(f"'digests.tensors[{k!r}]' must be 1 to 128 lower-case hexadecimal digits, found {v!r}"[:200])
                break
    return out


def hasher(algorithm: str = DEFAULT_ALGORITHM) -> Any:
    return hashlib.new(algorithm)


#: qformat.remote's ``hash_remote_range``, registered when it is imported (a URL is only ever
#: hashed after qformat.remote opened it); a hook, so this module does not import the reader.
_REMOTE: list[Callable[..., None]] = []


def register_remote_hasher(fn: Callable[..., None]) -> None:
    """Have :func:`hash_range` hash URLs with ``fn(url, offset, nbytes, hasher, chunk)``."""
    _REMOTE[:] = [fn]


def hash_range(path: str, offset: int, nbytes: int, algorithm: str = DEFAULT_ALGORITHM) -> str:
    """The digest of ``nbytes`` of file ``path`` from ``offset``, read in bounded chunks
    (``pread``: resident memory stays at one chunk however large the tensor is)."""
    h = hasher(algorithm)
    if _REMOTE and isinstance(path, str) and "://" in path[:12]:  # a URL: fetched by ranges, a chunk at a time
        _REMOTE[0](path, offset, nbytes, h, CHUNK)
        return str(h.hexdigest())
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            b = os.pread(fd, min(CHUNK, nbytes - done), offset + done)
            if not b:
                raise OSError(f"{path}: file ended inside a tensor")
            h.update(b)
            done += len(b)
    finally:
        os.close(fd)
    return str(h.hexdigest())


def with_digests(qformat_json: str, found: Mapping[str, str], algorithm: str = DEFAULT_ALGORITHM) -> str:
    """A qformat object (JSON text) that records the digests ``found`` (stored name -> hex
    digest, or a placeholder of the same length that the writer overwrites in place) and
    declares at least version 1.2 (the version that defines ``digests``, SPEC.md §3.8, §17.1)."""
    obj = json.loads(qformat_json)
    obj["version"] = written_version(obj["version"])
    obj["digests"] = {"algorithm": algorithm, "tensors": dict(sorted(found.items()))}
    return json.dumps(obj, separators=(",", ":"))


def placeholders(names: Iterable[str]) -> dict[str, str]:
    """A distinct random 64-digit placeholder per stored tensor: a writer plans its header
    with these (the header's length is then final) and overwrites each one in place with the
    real digest once that tensor's bytes have been written (see container.write_planned)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in names:
        p = secrets.token_hex(ALGORITHMS[DEFAULT_ALGORITHM] // 2)
        while p in used:
            p = secrets.token_hex(ALGORITHMS[DEFAULT_ALGORITHM] // 2)
        used.add(p)
        out[n] = p
    return out


def verify(path: str, header: Any, digests: Mapping[str, Any] | None, owner: Callable[[str], str | None] | None = None,
           names: Iterable[str] | None = None) -> list[QFormatError]:
    """DIGEST_UNSUPPORTED / DIGEST_MISMATCH problems of one file (SPEC.md §3.8).

    ``header`` is the file's container header, ``digests`` the qformat object's validated
    ``digests`` member (None: nothing to verify).  ``owner(stored)`` names the logical tensor
    a problem refuses (default: the stored name).  ``names`` limits the check to these stored
    tensors (default: every one ``digests`` lists)."""
    if not digests:
        return []
    alg = digests["algorithm"]
    if alg not in ALGORITHMS:
        return [error("DIGEST_UNSUPPORTED", f"digest algorithm {alg!r} is not one this reader implements (expected one of "
                                            f"{sorted(ALGORITHMS)}); the file's digests cannot be verified", field="digests.algorithm")]
    want = digests["tensors"]
    todo = list(want) if names is None else [n for n in names if n in want]
    probs = []
    for stored in todo:
        tensor = (owner(stored) if owner else None) or stored
        fld = f"digests.tensors[{stored!r}]"
        e = header.entries.get(stored)
        if e is None:
            probs.append(error("DIGEST_MISMATCH", f"'digests' lists stored tensor {stored!r}, which the file does not have (expected "
                                                  "a digest only for a stored tensor of the file)", tensor=tensor, field=fld))
            continue
        exp = want[stored]
        if len(exp) != ALGORITHMS[alg]:
            probs.append(error("DIGEST_MISMATCH", f"stored tensor {stored!r}: expected a {alg} digest of {ALGORITHMS[alg]} "
                                                  f"hexadecimal digits, found {len(exp)}", tensor=tensor, field=fld))
            continue
        got = hash_range(path, header.data_start + e.begin, e.nbytes, alg)
        if got != exp:
            probs.append(error("DIGEST_MISMATCH", f"stored tensor {stored!r}: its bytes have {alg} {got}, the file records "
                                                  f"{exp} (the bytes were damaged or changed after writing)", tensor=tensor, field=fld))
    return probs
