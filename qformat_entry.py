"""The ``qformat`` command's first code, outside the ``qformat`` package on purpose.

Importing ``qformat.cli`` takes most of a second (NumPy, ml_dtypes, jsonschema); a Ctrl-C in that
time raised KeyboardInterrupt in the middle of an import and printed a traceback.  This module
imports nothing heavy, so the interrupt lands here: exit status 130, no traceback, and nothing
has been written yet.  Once the command runs, :func:`qformat.cli.entry` handles interrupts the
same way.
"""

import sys


def entry() -> None:
    """The console script ``qformat``."""
    try:
        from qformat.cli import entry as run
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        raise SystemExit(130) from None
    run()
