"""MkDocs hooks of the documentation site (mkdocs.yml, ``hooks:``).

The guides live in ``docs/`` and link to the rest of the repository the way GitHub shows it
(``../SPEC.md``, ``../readers/README.md``, ``../libqformat/include/qformat.h``), and the README
links to the guides as ``docs/quantizing.md``.  Both work on GitHub as written.  For the site:

* the README becomes the home page (``index.md``), SPEC.md, SECURITY.md and CHANGELOG.md become
  pages of their own, and every other repository file a page links to (transitively) is added
  under ``source/`` (Markdown as a page, anything else as a file to download);
* every relative link is rewritten from its repository path to that file's place on the site,
  so ``mkdocs build --strict`` still fails on a link to a file that does not exist.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

#: repository files that are pages of their own on the site, and their place there
PAGES = {"README.md": "index.md", "SPEC.md": "spec.md", "SECURITY.md": "security.md", "CHANGELOG.md": "changelog.md"}
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_repo_of: dict[str, str] = {}  # site src_uri -> repository path


def _root(config) -> Path:  # type: ignore[no-untyped-def]
    return Path(config.config_file_path).resolve().parent


def site_uri(repo_path: str) -> str:
    """Where a repository file is on the site."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    return PAGES.get(repo_path, "source/" + repo_path)


def relative_links(markdown: str):  # type: ignore[no-untyped-def]
    """(match, target) for every relative Markdown link outside fenced code blocks."""
    fence = False
    offset = 0
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            for m in _LINK.finditer(line):
                target = m.group(2)
                if not re.match(r"[a-zA-Z][a-zA-Z+.-]*:|#|/", target):
                    yield offset + m.start(2), offset + m.end(2), target
        offset += len(line)


def _resolve(repo_path: str, target: str) -> tuple[str, str]:
    path, _, anchor = target.partition("#")
    return posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), path)), anchor


def on_files(files: Files, config) -> Files:  # type: ignore[no-untyped-def]
    root = _root(config)
    _repo_of.clear()
    for f in files.documentation_pages():
        _repo_of[f.src_uri] = "docs/" + f.src_uri
    queue = list(_repo_of.values()) + list(PAGES)
    added: set[str] = set()

    def add(repo_path: str) -> None:
        if repo_path in added or repo_path.startswith("docs/"):
            return
        added.add(repo_path)
        uri = site_uri(repo_path)
        inclusion = InclusionLevel.UNDEFINED if repo_path in PAGES else InclusionLevel.NOT_IN_NAV
        files.append(File.generated(config, uri, abs_src_path=str(root / repo_path), inclusion=inclusion))
        if repo_path.endswith(".md"):
            _repo_of[uri] = repo_path
            queue.append(repo_path)

    for p in PAGES:
        add(p)
    while queue:
        repo_path = queue.pop()
        for _, _, target in relative_links((root / repo_path).read_text(encoding="utf-8")):
            dest, _ = _resolve(repo_path, target)
            if (root / dest).is_file():
                add(dest)
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # type: ignore[no-untyped-def]
    repo_path = _repo_of.get(page.file.src_uri)
    if repo_path is None:
        return markdown
    here = posixpath.dirname(page.file.src_uri)
    out, last = [], 0
    for start, end, target in relative_links(markdown):
        dest, anchor = _resolve(repo_path, target)
        new = posixpath.relpath(site_uri(dest), here or ".") + (f"#{anchor}" if anchor else "")
        out += [markdown[last:start], new]
        last = end
    markdown = "".join(out) + markdown[last:]
    return markdown if repo_path.startswith("docs/") else _literal_brackets(markdown)


def _literal_brackets(markdown: str) -> str:
    """``[RFC 2119] [RFC 8174]`` and ``[N/8][K/16]`` in SPEC.md are text, not reference links
    (which the cross-reference plugin would report as unresolved): escape such a second bracket,
    outside code."""
    lines, fence = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            parts = re.split(r"(`+[^`]*`+)", line)
            line = "".join(part if i % 2 else re.sub(r"\]( ?)\[", r"]\1\\[", part) for i, part in enumerate(parts))
        lines.append(line)
    return "\n".join(lines)
