"""SECURITY.md, promise 1: reading a file, folder, manifest or URL never executes code from it.

Checked on the source itself, so a later change cannot slip a deserializer in: no module of the
package or of the Python readers imports a deserializer that runs code (pickle, marshal, shelve,
dill, joblib, yaml's full loader), calls ``eval``/``exec``/``compile``/``torch.load``, asks
transformers or huggingface_hub for remote code (``trust_remote_code=True``), or imports a module
whose name is not a literal the code chose.  Each rule is also tried on a small snippet that
breaks it, so the scan itself is seen to find what it looks for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = [ROOT / "qformat", *sorted(p for p in (ROOT / "readers").iterdir() if p.is_dir() and p.name.startswith("qformat_"))]

#: modules whose loaders run code found in the data they load
CODE_LOADERS = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}
#: builtins that run text as code
RUNS_TEXT = {"eval", "exec", "compile"}
#: dynamic imports allowed with a name the code builds itself (file, reason)
DYNAMIC_IMPORTS = {
    # qformat conformance run --python MODULE:FUNCTION: the user's own reader, named on the command line
    ("qformat/conformance.py", "import_module"),
    # the lazily imported submodules of qformat_torch: f"{__name__}.{name}" for a fixed list of names
    ("readers/qformat_torch/__init__.py", "import_module"),
}


def problems(tree: ast.AST, rel: str) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            out += [f"{where}: imports {a.name}" for a in node.names if a.name.split(".")[0] in CODE_LOADERS]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CODE_LOADERS:
            out.append(f"{where}: imports from {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if isinstance(f, ast.Name) and name in RUNS_TEXT:
                out.append(f"{where}: calls {name}()")
            if owner == "torch" and name == "load":
                out.append(f"{where}: calls torch.load()")
            if owner == "yaml" and name in ("load", "unsafe_load", "full_load"):
                out.append(f"{where}: calls yaml.{name}()")
            if name in ("import_module", "__import__") and (rel, "import_module") not in DYNAMIC_IMPORTS:
                if not (node.args and isinstance(node.args[0], ast.Constant)):
                    out.append(f"{where}: imports a module by a computed name")
            for kw in node.keywords:
                if kw.arg == "trust_remote_code" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    out.append(f"{where}: passes trust_remote_code={ast.unparse(kw.value)}")
    return out


def _sources() -> list[Path]:
    return sorted(p for root in SCANNED for p in root.rglob("*.py"))


def test_the_scan_covers_the_package_and_the_python_readers():
    rels = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert "qformat/io.py" in rels and "qformat/convert/gguf.py" in rels and "qformat/remote.py" in rels
    assert any(r.startswith("readers/qformat_torch/") for r in rels)
    assert any(r.startswith("readers/qformat_transformers/") for r in rels)


def test_no_module_executes_what_it_reads():
    found = [p for src in _sources() for p in problems(ast.parse(src.read_text(encoding="utf-8")), src.relative_to(ROOT).as_posix())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("snippet, what", [
    ("import pickle", "imports pickle"),
    ("from marshal import loads", "imports from marshal"),
    ("x = eval(text)", "calls eval()"),
    ("exec(code)", "calls exec()"),
    ("import torch\nsd = torch.load(path)", "calls torch.load()"),
    ("yaml.load(f)", "calls yaml.load()"),
    ("AutoModel.from_pretrained(p, trust_remote_code=True)", "trust_remote_code=True"),
    ("AutoModel.from_pretrained(p, trust_remote_code=flag)", "trust_remote_code=flag"),
    ("importlib.import_module(meta['module'])", "computed name"),
])
def test_the_scan_finds_each_kind(snippet, what):
    found = problems(ast.parse(snippet), "snippet.py")
    assert len(found) == 1 and what in found[0], found


def test_the_scan_passes_what_is_allowed():
    assert problems(ast.parse("import json\njson.loads(t)\nimportlib.import_module('gguf')\nf(trust_remote_code=False)"), "x.py") == []
