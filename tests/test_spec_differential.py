"""Differential fuzzing of the reference reader against the corpus's spec transcription.

Corpus files are mutated with the generators of tests/test_js_differential.py (qformat object
edits, tensor entry edits, payload bytes).  On every mutant the reference reader
(``qformat.load_file``) and conformance/spec_reference.py must agree wherever the transcription
covers the outcome:

- the reference decodes the file: every logical tensor decoded by the transcription has the
  same bits (NaN by class), and every descriptor passes the §5.5 list of the transcription;
- the first descriptor (in the order of ``tensors``) of a file not newer than the reader fails
  the transcription's §5.5 list: the reference, which reports refused tensors in that order,
  refuses the file with the list's code (when it refuses with one of the seven codes §5.5 can
  give; other codes come from earlier steps the transcription lacks);
- the reference refuses with CODE_OUT_OF_RANGE or GROUP_INDEX_RANGE: the transcription's decode
  of some logical tensor refuses too (LookupError).

(The transcription has no container or component checks of its own: mutants refused there are
counted, not compared.)  ``scripts/fuzz_spec.py`` runs the same comparison on more mutants.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

import qformat
from conformance import spec_reference as R
from qformat.conformance import compare
from qformat.errors import QFormatError

STRUCTURAL = {"SCHEMA_VIOLATION", "SHAPE_INVALID", "DTYPE_INVALID", "ELEMENT_INVALID", "PACKING_INVALID",
              "LAYOUT_INVALID", "BLOCKS_INVALID"}
DECODE = {"CODE_OUT_OF_RANGE", "GROUP_INDEX_RANGE"}


def mutants(n: int, seed: int):
    from tests.test_js_differential import _seeds, mutate_entries, mutate_json, mutate_payload
    rng = random.Random(seed)
    seeds = _seeds()
    names = sorted(seeds)
    kinds = [mutate_json, mutate_json, mutate_json, mutate_entries, mutate_payload]
    for i in range(n):
        name = rng.choice(names)
        yield f"{i} (from {name})", rng.choice(kinds)(rng, seeds[name])


def disagreement(data: bytes, path: Path) -> tuple[str, str | None]:
    """(the reference's outcome, a disagreement or None) for one mutant."""
    path.write_bytes(data)
    try:
        got = qformat.load_file(path)
        code = None
    except QFormatError as e:
        got, code = None, e.code
    try:
        q, comps = R.read_parts(data)
    except Exception:  # noqa: BLE001 - not a sound container: the reference must have refused
        return code or "valid", (None if code else "the reference decoded a file whose header the transcription cannot read")
    tensors = q.get("tensors") if isinstance(q, dict) else None
    version = q.get("version") if isinstance(q, dict) else None
    minor = int(version[2:]) if isinstance(version, str) and version.startswith("1.") and version[2:].isdigit() else 0
    newer = minor > 2
    if code is None:
        for name, d in (tensors or {}).items():
            if R.structural_code(d) is not None:
                return "valid", f"the reference decodes {name!r}; the §5.5 list refuses it with {R.structural_code(d)}"
            try:
                want = R.decode(d, comps)
            except LookupError as e:
                return "valid", f"the reference decodes {name!r}; the transcription refuses it: {e}"
            diff = compare({name: want}, {name: got[name]})
            if diff:
                return "valid", diff
        return "valid", None
    if code in STRUCTURAL and isinstance(tensors, dict) and not newer and R.object_code(q, newer, minor) is None \
            and all(k not in ("", "__metadata__") for k in tensors):
        # Several refused tensors may give any of their codes (§1.4); the reference reports them
        # in the order of `tensors`, so when the first tensor fails §5.5 its code is the file's.
        first = next(iter(tensors.values()), None) if tensors else None
        want = R.structural_code(first) if tensors else None
        if want is not None and code != want:
            return code, f"the reference refuses with {code}; the §5.5 list gives the first tensor {want}"
    if code in DECODE and isinstance(tensors, dict):
        for d in tensors.values():
            try:
                R.decode(d, comps)
            except LookupError:
                return code, None
            except Exception:  # noqa: BLE001 - a descriptor the reference refused for another reason
                continue
        return code, f"the reference refuses with {code}; the transcription decodes every tensor"
    return code, None


def run(n: int, seed: int) -> tuple[Counter, list[str]]:
    outcomes: Counter = Counter()
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        for label, data in mutants(n, seed):
            with np.errstate(all="ignore"):
                outcome, problem = disagreement(data, path)
            outcomes[outcome] += 1
            if problem:
                bad.append(f"{label}: {problem}")
    return outcomes, bad


def test_reference_and_transcription_agree() -> None:
    outcomes, bad = run(1500, 20240612)
    assert not bad, f"{len(bad)} disagreements:\n" + "\n".join(bad[:30])
    assert outcomes["valid"] >= 20 and len(outcomes) >= 8, outcomes
