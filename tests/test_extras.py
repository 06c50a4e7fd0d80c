"""The framework extras say how to install what they miss (issue 44), and ``qformat --version``."""

from __future__ import annotations

import subprocess
import sys

import pytest

import qformat
from qformat.extras import EXTRAS


@pytest.mark.parametrize("alias", sorted(EXTRAS))
def test_a_missing_framework_names_the_install_line(alias: str) -> None:
    """Each framework the alias needs, made unimportable in a fresh interpreter: the import fails
    with ModuleNotFoundError naming that framework and the extra to install, and no traceback
    from inside the reader package."""
    frameworks, extra = EXTRAS[alias]
    for fw in frameworks:
        code = (f"import sys; sys.modules[{fw!r}] = None\n"
                f"try:\n    import qformat.{alias}\n"
                f"except ModuleNotFoundError as e:\n    print(e.name, '|', e)\nelse:\n    print('imported')")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        name, _, message = p.stdout.strip().partition(" | ")
        assert name == fw, p.stdout
        assert f"pip install 'qformat[{extra}]'" in message and f"qformat.{alias} needs {fw}" in message, message


def test_the_alias_is_the_reader_package() -> None:
    import qformat.torch
    import qformat_torch

    assert qformat.torch is qformat_torch


def test_version() -> None:
    p = subprocess.run([sys.executable, "-m", "qformat", "--version"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"qformat {qformat.__version__} (SPEC.md {qformat.SPEC_REVISION})"


def test_an_interrupt_while_the_command_starts_exits_130_without_a_traceback() -> None:
    """Ctrl-C during the ``qformat`` command's imports (most of a second: NumPy, ml_dtypes):
    qformat_entry catches it, exit status 130 and no traceback.  The interrupt is made to land
    exactly there, inside ``import qformat.cli``, rather than timed with a signal."""
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'qformat.cli' or (name == 'qformat' and 'qformat.cli' not in sys.modules and a and a[2]):\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "import qformat_entry\n"
            "qformat_entry.entry()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 130 and "Traceback" not in p.stderr, (p.returncode, p.stderr)


def test_the_console_script_is_the_light_entry() -> None:
    """The installed ``qformat`` script starts in qformat_entry (a stale install points at qformat.cli)."""
    from pathlib import Path

    script = Path(sys.executable).parent / "qformat"
    if not script.is_file():
        pytest.skip(f"no console script beside {sys.executable}")
    assert "from qformat_entry import entry" in script.read_text(encoding="utf-8", errors="replace")
