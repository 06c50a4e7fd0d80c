"""Generate the conformance corpus (deterministic; gold files are frozen once written).

    python -m conformance.generate              # write cases that are missing, rewrite the manifest
    python -m conformance.generate --check      # regenerate in memory; exit 1 if any file differs
    python -m conformance.generate --regenerate ID [ID ...]   # overwrite these cases: an explicit act

Each case is built from a random generator seeded by the sha256 of its id, so adding a case
never changes another.  Expected outputs come from conformance/spec_reference.py, never from
the qformat reader under test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np

from . import cases_errors, cases_layouts, cases_valid  # noqa: F401  (register the cases)
from . import cases_clarified  # noqa: F401,E402  (corpus 1.2: registered last, so earlier ids keep their order)
from . import cases_sharded  # noqa: F401,E402  (corpus 1.3: after 1.2's cases, for the same reason)
from . import cases_parity  # noqa: F401,E402  (spec 1.2's safetensors parity, issue 28: after the others, for the same reason)
from . import cases_digests  # noqa: F401,E402  (spec 1.2's digests and settled points, issue 24: after the others, likewise)
from . import cases_settled  # noqa: F401,E402  (corpus 1.5, spec 1.2.1: the points issue 43 settles; after the others, likewise)
from .build import CASES, Built, seed_of, st_file

CORPUS_VERSION = "1.5.0"
SPEC_VERSION = "1.2"
#: the revision of SPEC.md the expectations follow (a patch settles readings; files still declare 1.2)
SPEC_REVISION = "1.2.1"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "v1")


def build(case_id: str) -> tuple[Built, dict[str, bytes]]:
    """(built case, every file of the case folder as bytes, expected output included)."""
    c = CASES[case_id]
    b = c.build(np.random.default_rng(seed_of(case_id)))
    files = dict(b.files)
    if b.expect == "valid":
        assert b.expected is not None, case_id
        files["expected.safetensors"] = st_file(b.expected)
    return b, files


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_entry(case_id: str, b: Built, files: dict[str, bytes]) -> dict:
    c = CASES[case_id]
    base = f"cases/{case_id}"
    entry = {
        "id": case_id,
        "description": c.description,
        "spec": c.spec,
        "features": sorted(set(c.features) | set(b.features)),
        "input": f"{base}/{b.input}",
        "files": [{"path": f"{base}/{n}", "sha256": sha256(d)} for n, d in sorted(files.items()) if n != "expected.safetensors"],
        "expect": b.expect,
        "error": b.error,
        "expected": ({"path": f"{base}/expected.safetensors", "sha256": sha256(files["expected.safetensors"])}
                     if b.expect == "valid" else None),
        "check": sorted(b.check_codes),
        "strict": strict_codes(b, files),
    }
    return entry


def strict_codes(b: Built, files: dict[str, bytes]) -> list[str]:
    """What a strict checker (`qformat check --strict --digests`) reports: the checker's codes and,
    for every safetensors file of the case whose container is sound, the strict-only codes
    (SPEC.md §2.3 checks 5 and 9, §2.4), computed by conformance/spec_reference.py."""
    from . import spec_reference as R

    codes = set(b.check_codes)
    if b.expect != "malformed":
        for name, data in files.items():
            if name.endswith(".safetensors") and name != "expected.safetensors":
                codes.update(R.strict_only_codes(data))
    return sorted(codes)


def manifest(entries: list[dict]) -> dict:
    return {
        "corpus_version": CORPUS_VERSION,
        "spec_version": SPEC_VERSION,
        "spec_revision": SPEC_REVISION,
        "description": "qformat conformance corpus. Paths are relative to this file. See conformance/README.md.",
        "cases": entries,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="generate the qformat conformance corpus")
    ap.add_argument("--check", action="store_true", help="regenerate in memory and compare with the committed files")
    ap.add_argument("--regenerate", nargs="+", metavar="ID", default=[], help="overwrite these cases")
    ap.add_argument("--root", default=ROOT)
    args = ap.parse_args(argv)
    unknown = [i for i in args.regenerate if i not in CASES]
    if unknown:
        print(f"unknown case ids: {unknown}", file=sys.stderr)
        return 2
    entries, differ, written = [], [], 0
    for case_id in CASES:
        b, files = build(case_id)
        entries.append(manifest_entry(case_id, b, files))
        folder = os.path.join(args.root, "cases", case_id)
        for name, data in files.items():
            path = os.path.join(folder, name)
            exists = os.path.exists(path)
            if exists:
                with open(path, "rb") as f:
                    same = f.read() == data
            else:
                same = False
            if args.check:
                if not same:
                    differ.append(os.path.relpath(path, args.root))
                continue
            if exists and same:
                continue
            if exists and case_id not in args.regenerate:
                differ.append(os.path.relpath(path, args.root))  # frozen: never overwritten silently
                continue
            os.makedirs(folder, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            written += 1
    text = json.dumps(manifest(entries), indent=1, sort_keys=False) + "\n"
    mpath = os.path.join(args.root, "manifest.json")
    if args.check:
        with open(mpath, encoding="utf-8") as f:
            if f.read() != text:
                differ.append("manifest.json")
    elif not differ:
        os.makedirs(args.root, exist_ok=True)
        with open(mpath, "w", encoding="utf-8") as f:
            f.write(text)
    if differ:
        print(f"{len(differ)} corpus files differ from what the generator produces (gold files are frozen; "
              f"use --regenerate ID to overwrite deliberately):", file=sys.stderr)
        for d in differ[:50]:
            print(f"  {d}", file=sys.stderr)
        return 1
    if not args.check:
        print(f"{len(CASES)} cases; {written} files written; manifest: {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
