"""``import qformat.transformers``: qformat checkpoints in transformers' ``from_pretrained`` and
``save_pretrained`` (registers ``quant_method: "qformat"``; :class:`QFormatConfig`).

The integration itself lives in ``readers/qformat_transformers`` (the ``transformers``
packaging extra); this module only makes ``qformat.transformers`` *be* that package, so both
spellings name one module object.  ``import qformat`` alone never imports it, so the neutral
core still loads no framework.
"""

import sys

from .extras import reader

sys.modules[__name__] = reader("transformers")
