"""``from qformat.torch import load_file``: the torch reader, spelled as ``safetensors.torch`` is.

The reader itself lives in ``readers/qformat_torch`` (the ``torch`` packaging extra); this module
only makes ``qformat.torch`` *be* that package, so both spellings name one module object (one
set of classes and caches).  ``import qformat`` alone never imports it, so the neutral core
still loads no framework.
"""

import sys

from .extras import reader

sys.modules[__name__] = reader("torch")
