"""The code blocks of README.md and docs/*.md, and a runner that runs them as a reader would
(issue 44 item 8; tests/test_doc_snippets.py).

A fenced block whose language is ``sh``, ``bash``, ``python``, ``js`` or ``mjs`` is a snippet.
The snippets of one Markdown file run in file order, in one scratch folder, as one reader's
session: a shell block's working directory and variables carry over to the next block (the
README's tour does ``MODEL=...`` and ``cd out/tour`` in one block and uses both in the next),
and a Python or JavaScript block runs as a script saved in that working directory. A block
fails when any command in it fails (``set -e -o pipefail``; a script's exit status). A ``text``
block that follows a snippet with only blank lines between is that snippet's output: each of
its lines, except ``...`` elisions, must appear in what the snippet printed on stdout, in order.

A block that is not run as written says why, in an HTML comment on the line before its fence
(invisible on GitHub and in MkDocs)::

    <!-- snippet: skip (needs a CUDA GPU) -->       not run; the reason is required
    <!-- snippet: slow (builds llama.cpp) -->       run only with QF_SLOW_TESTS=1
    <!-- snippet: options (placeholder paths) -->   not run; every ``qformat ...`` line is parsed
                                                    by the CLI's own argument parser instead, so a
                                                    stale command or option still fails
    <!-- snippet: output unchecked (reason) -->     on a text block: not compared
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGS = {"sh": "sh", "bash": "sh", "python": "python", "js": "js", "mjs": "js"}
KINDS = ("skip", "slow", "options")
_FENCE = re.compile(r"^(\s*)```+\s*([\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*snippet:\s*(?P<kind>[\w ]+?)\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")


class MarkerError(ValueError):
    """A ``<!-- snippet: ... -->`` comment this module does not understand, or one without the
    reason it needs."""


@dataclasses.dataclass
class Block:
    path: str                      # relative to the repository, "README.md", "docs/cli.md"
    line: int                      # 1-based line of the opening fence
    lang: str                      # "sh", "python", "js"
    code: str
    kind: str = "run"              # "run", "skip", "slow", "options"
    reason: str = ""
    output: str | None = None      # the text block that shows what it prints, when compared
    output_line: int = 0

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def parse(text: str, path: str) -> list[Block]:
    """Every snippet of one Markdown file, in file order, with its marker and shown output."""
    lines = text.split("\n")
    fences: list[tuple[int, str, str, str | None, str]] = []   # (line index, lang, code, marker kind, reason)
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            mark = _MARK.match(lines[i])
            if "<!--" in lines[i] and "snippet" in lines[i] and not mark:
                raise MarkerError(f"{path}:{i + 1}: malformed snippet marker: {lines[i].strip()}")
            i += 1
            continue
        lang, j = m.group(2), i + 1
        while j < len(lines) and not re.match(r"^\s*```+\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise MarkerError(f"{path}:{i + 1}: unclosed code fence")
        indent = len(m.group(1))
        code = "\n".join(line[indent:] if line[:indent].isspace() else line for line in lines[i + 1:j]) + "\n"
        kind = reason = None
        if i > 0 and (mark := _MARK.match(lines[i - 1])):
            kind, reason = mark.group("kind"), (mark.group("reason") or "").strip()
        fences.append((i, lang, code, kind, reason or ""))
        i = j + 1
    blocks: list[Block] = []
    for n, (i, lang, code, kind, reason) in enumerate(fences):
        if lang in LANGS:
            if kind is not None and kind not in KINDS:
                raise MarkerError(f"{path}:{i + 1}: unknown snippet marker {kind!r} (one of {', '.join(KINDS)})")
            if kind in ("skip", "options") and not reason:
                raise MarkerError(f"{path}:{i + 1}: `snippet: {kind}` needs a reason in parentheses")
            block = Block(path, i + 1, LANGS[lang], code, kind or "run", reason)
            if n + 1 < len(fences):
                k, nlang, ncode, nkind, nreason = fences[n + 1]
                between = lines[_end_of(lines, i) + 1:k]
                if nlang == "text" and all(not s.strip() or _MARK.match(s) for s in between):
                    if nkind == "output unchecked":
                        if not nreason:
                            raise MarkerError(f"{path}:{k + 1}: `snippet: output unchecked` needs a reason")
                    elif nkind is not None:
                        raise MarkerError(f"{path}:{k + 1}: unknown marker {nkind!r} on a text block")
                    else:
                        block.output, block.output_line = ncode, k + 1
            blocks.append(block)
        elif kind is not None and not (lang == "text" and kind == "output unchecked"):
            raise MarkerError(f"{path}:{i + 1}: a snippet marker on a ```{lang} block, which is never run")
    return blocks


def _end_of(lines: list[str], start: int) -> int:
    j = start + 1
    while not re.match(r"^\s*```+\s*$", lines[j]):
        j += 1
    return j


def collect(root: Path = ROOT) -> dict[str, list[Block]]:
    """{"README.md": [...], "docs/cli.md": [...], ...}: the files with at least one snippet."""
    out = {}
    for f in doc_files(root):
        rel = f.relative_to(root).as_posix()
        blocks = parse(f.read_text(encoding="utf-8"), rel)
        if blocks:
            out[rel] = blocks
    return out


# -- checking a block's `qformat ...` lines against the CLI's parser ----------------------------
def command_lines(code: str) -> list[str]:
    """The ``qformat ...`` commands of a shell block (comments and ``[optional]`` brackets
    removed), one per line."""
    out = []
    for raw in code.splitlines():
        words = shlex.split(raw, comments=True)
        if words and words[0] == "qformat":
            out.append(" ".join(shlex.quote(w.strip("[]")) for w in words if w.strip("[]")))
    return out


def parse_problem(command: str) -> str | None:
    """None when the CLI's own parser accepts ``command`` (a ``qformat ...`` line), else what
    it said. Nothing is run: the parser only."""
    import contextlib
    import io

    from qformat.cli import _parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = _parser().parse_args(shlex.split(command)[1:])
    except SystemExit as e:
        return None if e.code == 0 else (err.getvalue().strip().splitlines() or [f"exit {e.code}"])[-1]
    if not getattr(args, "command", None):
        return "no command"
    # the names the commands look up only when they run
    from qformat import convert, export, gguf_presets

    for attr, known in (("to", export.targets), ("from_format", convert.formats), ("preset", lambda: list(gguf_presets.presets()))):
        value = getattr(args, attr, None)
        if value is not None and value not in known():
            return f"{attr.split('_')[0]} {value!r} is none of {', '.join(known())}"
    return None


# -- running -------------------------------------------------------------------------------
_SAVE = r"""
__qf_save() {
  {
    local v d flags
    for v in $(compgen -v); do
      case $v in
        BASH*|SHELLOPTS|BASHOPTS|PIPESTATUS|FUNCNAME|GROUPS|DIRSTACK|HIST*|LINENO|RANDOM|SECONDS|SRANDOM|EPOCH*|PPID|UID|EUID|OPT*|_|__qf_*|PWD|OLDPWD|SHLVL|COLUMNS|LINES|IFS|PS1|PS2|PS4|COMP*) continue ;;
      esac
      d=$(declare -p "$v" 2>/dev/null) || continue
      flags=${d#declare -}; flags=${flags%% *}
      case $flags in *r*) continue ;; esac
      printf '%s\n' "$d"
    done
    printf 'cd %q\n' "$PWD"
  } > "$__qf_state"
}
"""


def _wrapper(block_file: Path, state: Path, lang: str) -> str:
    """A bash script that restores the session (variables, working directory), runs the block,
    and saves the session again."""
    if lang == "sh":
        body = f"set -e -o pipefail\nsource {shlex.quote(str(block_file))}\n"
    else:
        ext, cmd = (".py", "python") if lang == "python" else (".mjs", "node")
        name = f"_snippet_{block_file.stem}{ext}"
        body = (f"cp {shlex.quote(str(block_file))} ./{name}\n"
                f"trap 'rm -f ./{name}; __qf_save' EXIT\n"
                f"{cmd} ./{name}\n")
    return (f"__qf_state={shlex.quote(str(state))}\n{_SAVE}\n"
            f"[ -f \"$__qf_state\" ] && source \"$__qf_state\"\n"
            "trap __qf_save EXIT\n" + body)


@dataclasses.dataclass
class Result:
    block: Block
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_block(block: Block, work: Path, session: Path, env: dict[str, str], timeout: float = 600) -> Result:
    """Run one block in the session kept under ``session`` (started in ``work``)."""
    import time

    session.mkdir(parents=True, exist_ok=True)
    state = session / "state.sh"
    if not state.exists():
        state.write_text(f"cd {shlex.quote(str(work))}\n")
    src = session / f"L{block.line}.{ {'sh': 'sh', 'python': 'py', 'js': 'mjs'}[block.lang] }"
    src.write_text(block.code)
    script = session / f"L{block.line}.run.sh"
    script.write_text(_wrapper(src, state, block.lang))
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(block, p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def output_mismatch(shown: str, printed: str) -> str | None:
    """None when every line of ``shown`` (a doc's text block; ``...`` lines elide) appears in
    ``printed`` in the same order (trailing spaces ignored), else the first missing line."""
    got = [s.rstrip() for s in printed.splitlines()]
    pos = 0
    for want in (s.rstrip() for s in shown.splitlines()):
        if not want or want.strip() == "...":
            continue
        try:
            pos = got.index(want, pos) + 1
        except ValueError:
            return want
    return None


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment with the repository's .venv first on PATH (``qformat``,
    ``python``), as after ``source .venv/bin/activate``."""
    env = dict(os.environ)
    venv_bin = Path(sys.executable).parent
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv_bin.parent)
    env.pop("PYTHONPATH", None)
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("HF_HUB_OFFLINE", "1")        # the snippets run on local folders; never wait on the network
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def scratch(work: Path, root: Path = ROOT) -> Path:
    """A folder that looks like the repository's root to a reader's commands (each top-level
    entry linked, so ``.venv/bin/activate``, ``scripts/``, ``readers/js/src`` resolve) but whose
    ``out/`` and anything the snippets write are its own."""
    work.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        if entry.name in {"out", ".git", "site", "build", ".pytest_cache", ".venv"} or entry.name.startswith(".tools"):
            continue
        (work / entry.name).symlink_to(entry)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)   # the environment running the tests
    return work
