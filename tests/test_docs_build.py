"""The documentation (issue 44 item 7): the README is a front door of at most 300 lines, the
guides under docs/ are all in mkdocs.yml's nav and linked from the README, every relative link
in them resolves to a file of the repository (as GitHub shows it), and ``mkdocs build --strict``
builds the site (broken links, a nav entry without its page and an API reference to a missing
object all fail it) without importing torch, JAX or transformers."""

from __future__ import annotations

import importlib.util
import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300


def _hooks():  # type: ignore[no-untyped-def]
    """scripts/mkdocs_hooks.py: the link rule the site build uses, so both read links alike."""
    spec = importlib.util.spec_from_file_location("qformat_mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def _nav_files(nav) -> list[str]:  # type: ignore[no-untyped-def]
    out: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _nav_files(value) if isinstance(value, list) else [value]
    return out


def _broken_links(rel: str, text: str) -> list[str]:
    """The relative links of ``text`` (the file ``rel`` of the repository) to no file of it."""
    broken = []
    for _, _, target in _hooks().relative_links(text):
        dest = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target.partition("#")[0]))
        if dest.startswith("..") or not (ROOT / dest).exists():
            broken.append(f"{rel}: {target}")
    return broken


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into a guide under docs/"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for step in ("./demo.sh", "./test.sh", "qformat quantize", "qformat check", "qformat inspect",
                 "from_pretrained", "--to gguf", "```js"):
        assert step in readme, step


def test_every_guide_is_in_the_nav_and_linked_from_the_readme() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_files(config["nav"])
    generated = set(_hooks().PAGES.values())  # README.md, SPEC.md, ... placed on the site by the hook
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in _pages()]
    assert sorted(set(pages) - set(nav)) == [], "docs/ pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages) - generated) == [], "nav entries without a page"
    assert len(nav) == len(set(nav)), "a page listed twice in the nav"
    readme_targets = {t.partition("#")[0] for _, _, t in _hooks().relative_links((ROOT / "README.md").read_text(encoding="utf-8"))}
    assert sorted(f"docs/{p}" for p in pages if f"docs/{p}" not in readme_targets) == [], "guides the README does not link to"


def test_relative_links_resolve() -> None:
    pages = [ROOT / "README.md", *_pages()]
    broken = [b for p in pages for b in _broken_links(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))]
    assert broken == []


def test_the_link_check_sees_a_broken_link() -> None:
    """The negative control of the check above; a link inside a code block is not a link."""
    text = ("See [a](missing.md), [b](quantizing.md#x), [c](../SPEC.md), [d](../../outside.md) and "
            "[e](https://example.org).\n\n```text\n[f](gone.md)\n```\n")
    assert _broken_links("docs/probe.md", text) == ["docs/probe.md: missing.md", "docs/probe.md: ../../outside.md"]
    hooks = _hooks()
    assert hooks.site_uri("README.md") == "index.md" and hooks.site_uri("docs/cli.md") == "cli.md"
    assert hooks.site_uri("readers/README.md") == "source/readers/README.md"


def test_the_site_builds_strict_without_frameworks(tmp_path: Path) -> None:
    # torch, jax and transformers made unimportable: the API reference is read from the sources
    code = ("import sys; sys.modules.update(torch=None, jax=None, transformers=None); "
            "from mkdocs.__main__ import cli; sys.argv = ['mkdocs'] + sys.argv[1:]; cli()")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run([sys.executable, "-c", code, "build", "--strict", "--quiet", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    site = tmp_path / "site"
    for page in ["index.html", "quantizing/index.html", "api/index.html", "spec/index.html", "security/index.html"]:
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ["qformat.load_file", "qformat.save_file", "qformat.safe_open", "qformat.check.check", "qformat.quantize",
                 "qformat.errors.QFormatError", "qformat_torch.QLinear", "qformat_transformers.QFormatConfig"]:
        assert f'id="{name}"' in api, name
