"""Generate SPEC.md's data tables from ``qformat/tables/`` (the single source of truth).

SPEC.md marks each generated table with a pair of lines::

    <!-- BEGIN GENERATED: errors -->
    ...
    <!-- END GENERATED: errors -->

Everything between the two lines is owned by this module and rewritten by
``python -m qformat.specgen``; ``python -m qformat.specgen --check`` exits 1 when SPEC.md
differs from what the tables say (the test suite runs the same comparison).  The prose around
the markers is hand-written and never touched.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import struct
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from qformat import tables
from qformat.atomic import atomic_write

#: Names of the generated sections, in the order they appear in SPEC.md.
SECTION_NAMES = ("dtypes", "float_formats", "codebooks", "layouts", "limits", "errors", "schemes", "mapping", "export_mapping")

#: Default location of the specification: the repository root, next to the package.
SPEC_PATH = Path(__file__).resolve().parent.parent / "SPEC.md"

_MARKER = re.compile(r"^<!-- (BEGIN|END) GENERATED: ([A-Za-z0-9_]+) -->$", re.MULTILINE)


# -- table rendering -----------------------------------------------------------------------
_DUNDER = re.compile(r"(?<![`\w])(__\w+__)(?![`\w])")


def _cell(value: Any) -> str:
    """One markdown table cell: pipes escaped, line breaks flattened, ``__names__`` in code spans."""
    text = str(value).replace("\r", " ").replace("\n", " ")
    text = _DUNDER.sub(r"`\1`", text)
    return text.replace("|", "\\|")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (no trailing newline)."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`{text}`"


def _number(v: Any) -> str:
    """A table number: integers plainly, large powers of two as 2^k, other floats by repr."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        frac, exp = math.frexp(v)
        if frac == 0.5:
            return f"2^{exp - 1}"
        return repr(v)
    return str(v)


def _f32(hex_bits: str) -> str:
    """Decimal value of a binary32 bit pattern, 9 significant digits (enough to round-trip)."""
    value = struct.unpack("<f", struct.pack("<I", int(hex_bits, 16)))[0]
    if value == 0.0:
        return "-0" if hex_bits.upper().startswith("8") else "0"
    return f"{value:.9g}"


#: The processing steps of the error table (tables/errors.json "step"), in reading order.
ERROR_STEPS = (
    ("container", "The container (§2), whole file"),
    ("qformat object", "The qformat object (§3.1 to §3.5; §3.7 steps 1 to 4)"),
    ("descriptor", "Descriptors (§3.7 step 5: §5, §6, §7.11, §8, §9.3, §11)"),
    ("components", "Components and names (§3.7 steps 5 to 7: §2.6, §4.3, §7.4, §9.2)"),
    ("payload", "Payload (§10.6, §12.4)"),
    ("sharded", "Sharded checkpoints (§14)"),
    ("usage", "Usage (API calls, not file contents)"),
)


def _render_errors() -> str:
    errors = tables.errors()
    known = {step for step, _ in ERROR_STEPS}
    unknown = sorted({e["step"] for e in errors.values()} - known)
    if unknown:
        raise ValueError(f"tables/errors.json: unknown step {unknown}")
    parts = []
    for step, title in ERROR_STEPS:
        rows = [(_code(code), e["category"], e["meaning"]) for code, e in errors.items() if e["step"] == step]
        parts += [f"**{title}**", "", _table(("code", "category", "meaning"), rows), ""]
    return "\n".join(parts).rstrip("\n")


def _render_dtypes() -> str:
    rows = []
    how = {"nibbles": "{t}, one per element, unpacked (§2.6)", "bytes": "raw bytes: 1-D {t} of the stored bytes (§2.6)"}
    for name, d in tables.dtypes().items():
        view = d["numpy"] if d["numpy"] is not None else "(none)"
        plain = how[d["plain"]].format(t=d["plain_numpy"]) if "plain" in d else view
        rows.append((_code(name), d["bits"], d["kind"], view, plain))
    return _table(("safetensors dtype", "bits per element", "kind", "NumPy / ml_dtypes view", "a plain tensor reads as"), rows)


def _render_float_formats() -> str:
    rows = []
    for name, f in tables.float_formats().items():
        rows.append((
            _code(name), f["bits"], f["exponent_bits"], f["mantissa_bits"], f["bias"],
            _number(f["signed"]), _code(f["specials"]), _number(f["inf"]), f["nan"],
            _number(f["max"]), _code(f["safetensors"]), f["ml_dtypes"],
        ))
    header = ("format", "bits b", "E", "M", "bias B", "signed", "specials", "Inf", "NaN",
              "largest finite", "safetensors dtype", "ml_dtypes name")
    return _table(header, rows)


def _render_codebooks() -> str:
    parts = []
    for name, cb in tables.codebooks().items():
        parts.append(f"Codebook {_code(name)} ({cb['bits']} bits, {len(cb['values_f32'])} entries): "
                     f"{_cell(cb['description'])}")
        parts.append("")
        rows = [(u, _code(h.upper()), _f32(h)) for u, h in enumerate(cb["values_f32"])]
        parts.append(_table(("code u", "table[u] as binary32 bits (hex)", "value"), rows))
        parts.append("")
    return "\n".join(parts).rstrip("\n")


def _render_layouts() -> str:
    rows = []
    for name, lay in tables.layouts().items():
        params = json.dumps(lay["parameters"], sort_keys=True)
        rows.append((_code(name), lay["status"], _code(params), lay["description"]))
    return _table(("layout name", "status", "parameters", "meaning"), rows)


def _render_limits() -> str:
    rows = [(_code(name), _number(lim["value"]), lim["meaning"]) for name, lim in tables.limits_table().items()]
    return _table(("limit", "value", "meaning"), rows)


def _render_schemes() -> str:
    rows = []
    for sid, s in tables.schemes().items():
        params = ", ".join(_code(p) for p in s["parameters"])
        rows.append((_code(sid), s["description"], params))
    return _table(("scheme id", "what the encoder writes", "encoder parameters"), rows)


_RENDERERS: dict[str, Callable[[], str]] = {
    "errors": _render_errors,
    "dtypes": _render_dtypes,
    "float_formats": _render_float_formats,
    "codebooks": _render_codebooks,
    "layouts": _render_layouts,
    "limits": _render_limits,
    "schemes": _render_schemes,
    "mapping": lambda: _render_mapping(),
    "export_mapping": lambda: _render_export_mapping(),
}

#: The per-source mapping texts (Appendix C), one Markdown file per converter, beside the code.
MAPPING_DIR = Path(__file__).resolve().parent / "convert" / "mapping"


def _render_appendix(names: Iterable[str], folder: Path, letter: str) -> str:
    """An appendix made of one Markdown file per registered name (``folder/<name>.md``, each
    starting with a ``### Title`` line), in registry order, numbered ``<letter>.1``, ..."""
    parts = []
    for name in names:
        f = folder / f"{name}.md"
        if not f.is_file():
            continue
        text = f.read_text(encoding="utf-8").strip()
        lines = text.splitlines()
        if not lines or not lines[0].startswith("### "):
            raise ValueError(f"{f} must start with a '### Title' line")
        lines[0] = f"### {letter}.{len(parts) + 1} {lines[0][4:].strip()}"
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _render_mapping() -> str:
    """Appendix C: each converter's mapping file, in registry order, numbered C.1, C.2, ..."""
    from qformat.convert.registry import REGISTRY

    return _render_appendix(REGISTRY, MAPPING_DIR, "C")


#: The per-target export mapping texts (Appendix D), one Markdown file per target, beside the code.
EXPORT_MAPPING_DIR = Path(__file__).resolve().parent / "export" / "mapping"


def _render_export_mapping() -> str:
    """Appendix D: each export target's mapping file, in registry order, numbered D.1, D.2, ..."""
    from qformat.export.registry import REGISTRY

    return _render_appendix(REGISTRY, EXPORT_MAPPING_DIR, "D")


def generated_sections() -> dict[str, str]:
    """Render every generated section from ``qformat.tables``.

    Returns a dict from section name (``errors``, ``dtypes``, ``float_formats``,
    ``codebooks``, ``layouts``, ``limits``, ``schemes``) to its markdown text, without a
    trailing newline.
    """
    return {name: _RENDERERS[name]() for name in SECTION_NAMES}


# -- marker handling -----------------------------------------------------------------------
def _blocks(spec_text: str) -> list[tuple[str, int, int]]:
    """(name, content start, content end) of every marker pair; ValueError when unbalanced."""
    out = []
    open_name: str | None = None
    start = 0
    for m in _MARKER.finditer(spec_text):
        kind, name = m.group(1), m.group(2)
        if name not in _RENDERERS:
            raise ValueError(f"unknown generated section {name!r}; expected one of {', '.join(SECTION_NAMES)}")
        if kind == "BEGIN":
            if open_name is not None:
                raise ValueError(f"BEGIN GENERATED: {name} inside the unfinished section {open_name!r}")
            open_name, start = name, m.end() + 1  # content starts after the marker's newline
        else:
            if open_name != name:
                raise ValueError(f"END GENERATED: {name} without a matching BEGIN")
            out.append((name, start, m.start()))
            open_name = None
    if open_name is not None:
        raise ValueError(f"BEGIN GENERATED: {open_name} has no END line")
    return out


def extract(spec_text: str) -> dict[str, str]:
    """The current content of each generated section of ``spec_text`` (markers excluded)."""
    return {name: spec_text[a:b] for name, a, b in _blocks(spec_text)}


def _content(body: str) -> str:
    return "\n" + body.rstrip("\n") + "\n\n"


def render(spec_text: str) -> str:
    """Return ``spec_text`` with the content of every marker pair replaced by fresh tables.

    Text outside the markers is returned unchanged.  Raises ValueError when a marker names an
    unknown section or the markers are not properly paired.
    """
    sections = generated_sections()
    pieces = []
    pos = 0
    for name, a, b in _blocks(spec_text):
        pieces.append(spec_text[pos:a])
        pieces.append(_content(sections[name]))
        pos = b
    pieces.append(spec_text[pos:])
    return "".join(pieces)


def missing_sections(spec_text: str) -> list[str]:
    """Names of generated sections that have no marker pair in ``spec_text``."""
    present = {name for name, _, _ in _blocks(spec_text)}
    return [n for n in SECTION_NAMES if n not in present]


def _write_atomic(path: Path, text: str) -> None:
    with atomic_write(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: rewrite SPEC.md's generated sections, or ``--check`` that they are current.

    Exit status: 0 up to date (or rewritten), 1 out of date under ``--check``, 2 when the file
    cannot be read or its markers are broken.
    """
    ap = argparse.ArgumentParser(prog="python -m qformat.specgen", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if SPEC.md is out of date; change nothing")
    ap.add_argument("--spec", type=Path, default=SPEC_PATH, help=f"path of the spec (default {SPEC_PATH})")
    args = ap.parse_args(argv)
    path: Path = args.spec
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        new = render(text)
        missing = missing_sections(text)
    except (OSError, ValueError) as e:
        print(f"specgen: {path}: {e}", file=sys.stderr)
        return 2
    if missing:
        print(f"specgen: {path}: no markers for {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            old, fresh = extract(text), extract(new)
            stale = [n for n in fresh if old.get(n) != fresh[n]]
            print(f"specgen: {path} is out of date in: {', '.join(stale)}; run python -m qformat.specgen",
                  file=sys.stderr)
            return 1
        return 0
    if new != text:
        _write_atomic(path, new)
        print(f"specgen: rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
