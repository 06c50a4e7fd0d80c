"""SPEC.md stays in step with the data tables, the JSON Schema and the package version.

The tables in ``qformat/tables/`` are the single source of truth: SPEC.md's generated sections
must equal what :mod:`qformat.specgen` renders from them, every error code must be specified in
the prose, and the schema's enumerations must list exactly the names the tables define.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import qformat
from qformat import specgen, tables

SPEC = Path(__file__).resolve().parent.parent / "SPEC.md"


@pytest.fixture(scope="module")
def spec_text() -> str:
    return SPEC.read_text(encoding="utf-8")


def _prose(text: str) -> str:
    """SPEC.md without its generated sections (the hand-written, normative text)."""
    sections = specgen.extract(text)
    for body in sections.values():
        text = text.replace(body, "")
    return text


def _element_variant(schema: dict[str, Any], type_name: str) -> dict[str, Any]:
    for variant in schema["$defs"]["element"]["oneOf"]:
        if variant["properties"]["type"].get("const") == type_name:
            return variant
    raise AssertionError(f"schema has no element variant of type {type_name!r}")


# -- (a) generated sections ----------------------------------------------------------------
def test_every_generated_section_has_markers(spec_text: str) -> None:
    assert specgen.missing_sections(spec_text) == []


@pytest.mark.parametrize("name", specgen.SECTION_NAMES)
def test_generated_section_is_current(spec_text: str, name: str) -> None:
    current = specgen.extract(spec_text)[name]
    fresh = specgen.generated_sections()[name]
    assert current.strip("\n") == fresh.strip("\n"), (
        f"SPEC.md section {name!r} is out of date: run python -m qformat.specgen")


def test_render_is_a_fixed_point(spec_text: str) -> None:
    assert specgen.render(spec_text) == spec_text


def test_check_mode_passes() -> None:
    assert specgen.main(["--check", "--spec", str(SPEC)]) == 0


def test_check_mode_detects_drift(tmp_path: Path, spec_text: str) -> None:
    stale = tmp_path / "SPEC.md"
    name = "limits"
    body = specgen.extract(spec_text)[name]
    stale.write_text(spec_text.replace(body, "\n| stale |\n\n"), encoding="utf-8")
    assert specgen.main(["--check", "--spec", str(stale)]) == 1
    assert specgen.main(["--spec", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == spec_text


def test_render_rejects_broken_markers() -> None:
    with pytest.raises(ValueError):
        specgen.render("<!-- BEGIN GENERATED: errors -->\nno end\n")
    with pytest.raises(ValueError):
        specgen.render("<!-- BEGIN GENERATED: nosuch -->\n<!-- END GENERATED: nosuch -->\n")


# -- (b) error codes -----------------------------------------------------------------------
@pytest.mark.parametrize("code", sorted(tables.errors()))
def test_error_code_in_spec(spec_text: str, code: str) -> None:
    assert f"`{code}`" in spec_text


@pytest.mark.parametrize("code", sorted(tables.errors()))
def test_error_code_specified_in_prose(spec_text: str, code: str) -> None:
    """Each code is used by a rule in the hand-written text, not only listed in the table."""
    assert re.search(rf"\b{code}\b", _prose(spec_text)), f"{code} appears only in the generated table"


def test_every_code_mentioned_exists(spec_text: str) -> None:
    """No upper-case code in backticks that the errors table does not define."""
    known = set(tables.errors())
    candidates = set(re.findall(r"`([A-Z]{2,}(?:_[A-Z0-9]{2,})+)`", spec_text))
    dtypes = set(tables.dtypes())
    unknown = sorted(candidates - known - dtypes)
    assert unknown == []


# -- (c) schema enumerations against the tables --------------------------------------------
def test_schema_logical_dtypes() -> None:
    enum = tables.schema()["$defs"]["descriptor"]["properties"]["dtype"]["enum"]
    assert enum == ["float32", "float16", "bfloat16"]


def test_schema_float_formats() -> None:
    enum = _element_variant(tables.schema(), "float")["properties"]["format"]["enum"]
    assert sorted(enum) == sorted(tables.float_formats())


def test_schema_codebook_names() -> None:
    enum = _element_variant(tables.schema(), "codebook")["properties"]["table"]["enum"]
    assert sorted(enum) == sorted(tables.codebooks())


def test_schema_containers() -> None:
    enum = tables.schema()["$defs"]["packing"]["properties"]["container"]["enum"]
    assert enum == [8, 16, 32]
    widths = {d["bits"] for name, d in tables.dtypes().items() if d["kind"] == "uint"}
    assert set(enum) <= widths, "every container width needs an unsigned storage dtype"


def test_named_codebooks_fit_their_bits() -> None:
    for name, cb in tables.codebooks().items():
        assert 1 <= len(cb["values_f32"]) <= 2 ** cb["bits"], name


def test_schema_limits_match_tables() -> None:
    s = tables.schema()["$defs"]
    lim = tables.limits()
    assert s["descriptor"]["properties"]["shape"]["maxItems"] == lim["max_rank"]
    assert s["extensions"]["maxItems"] == lim["max_extensions"]


# -- (d) version ---------------------------------------------------------------------------
def test_title_states_spec_version(spec_text: str) -> None:
    first = spec_text.splitlines()[0]
    m = re.fullmatch(r"# qformat (\d+\.\d+) \(revision (\d+\.\d+\.\d+)\)", first)
    assert m, f"SPEC.md must start with '# qformat MAJOR.MINOR (revision MAJOR.MINOR.PATCH)', found {first!r}"
    assert m.group(1) == "1.2" and m.group(2) == "1.2.1"
    assert m.group(1) == qformat.SPEC_VERSION and m.group(2) == qformat.SPEC_REVISION
    assert m.group(2).startswith(m.group(1) + ".")


@pytest.mark.parametrize("path", ["qformat/schema/qformat-1.0.schema.json", "qformat/schema/qformat-1.2.schema.json"])
def test_spec_cites_schema_file(spec_text: str, path: str) -> None:
    assert path in spec_text
    assert (SPEC.parent / path).is_file()


def test_schema_1_2_is_1_0_plus_digests() -> None:
    """qformat-1.2 accepts every 1.0 document and adds only the optional member 'digests' (§3.2)."""
    import json

    a = json.loads((SPEC.parent / "qformat/schema/qformat-1.0.schema.json").read_text(encoding="utf-8"))
    b = json.loads((SPEC.parent / "qformat/schema/qformat-1.2.schema.json").read_text(encoding="utf-8"))
    assert a["$defs"] == b["$defs"] and a["required"] == b["required"]
    extra = {k: v for k, v in b["properties"].items() if k not in a["properties"]}
    assert list(extra) == ["digests"]
    assert {k: v for k, v in b["properties"].items() if k != "digests"} == a["properties"]


def test_bcp14_boilerplate(spec_text: str) -> None:
    assert "BCP 14 [RFC 2119] [RFC 8174]" in spec_text
