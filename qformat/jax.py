"""``from qformat.jax import load_file``: the jax reader, spelled as ``safetensors.jax`` is.

The reader itself lives in ``readers/qformat_jax`` (the ``jax`` packaging extra); this module
only makes ``qformat.jax`` *be* that package, so both spellings name one module object (one
set of classes and caches).  ``import qformat`` alone never imports it, so the neutral core
still loads no framework.
"""

import sys

from .extras import reader

sys.modules[__name__] = reader("jax")
