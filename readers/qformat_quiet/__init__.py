"""Known console noise of the libraries qformat runs beside, dropped at its source (issue 24).

Importing transformers' quantizer registry (which qformat.transformers extends, and which
``from_pretrained`` of any model reaches) imports every quantizer's backend that is installed: torchao logs a "Failed to load" line per optional CUDA
extension it cannot load on this machine, torch's pytree logs a deprecation line per Enum that
torchao registers, and bitsandbytes logs that the optional ``kernels`` package is missing (or, where ``kernels``
is installed and the hub is offline, ``kernels`` logs that it skips its publisher check).
None of it concerns qformat, and none of it is an error.  Each is dropped by a filter on the
logger that emits it, matching that message only: every other record of those loggers, and
every Python warning, is shown as before.

This module imports nothing but :mod:`logging`, so it can run at interpreter start:
``qformat.transformers`` installs the filters when it is imported, and the project's own
environment (``scripts/env.sh``) installs them in every interpreter it starts, through a
``qformat_quiet.pth`` file in the environment's site-packages, so that plain transformers,
torchao and bitsandbytes imports there are quiet too.
"""

from __future__ import annotations

import logging

#: logger name -> substrings of the known messages dropped from it.
KNOWN_NOISE: dict[str, tuple[str, ...]] = {
    "torchao": ("Failed to load ",),
    "torch.utils._pytree": ("is an Enum subclass and is now natively supported by torch.compile",),
    "bitsandbytes.backends.cpu.ops": ("from kernels-community",),
    # transformers >= 5.2x requires ``kernels``; bitsandbytes then asks it for its CPU kernel
    # repository, which under HF_HUB_OFFLINE logs that the publisher check is skipped.
    "kernels._internals.hf_hub": ("Skipping publisher trust check for 'kernels-community/",),
}


class KnownNoise(logging.Filter):
    """Drops the records whose message contains one of ``needles``."""

    def __init__(self, needles: tuple[str, ...]):
        super().__init__()
        self.needles = needles

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.needles)


def install() -> None:
    """Add the filters (once each) to the loggers in :data:`KNOWN_NOISE`."""
    for name, needles in KNOWN_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownNoise) for f in logger.filters):
            logger.addFilter(KnownNoise(needles))
