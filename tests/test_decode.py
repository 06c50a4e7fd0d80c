"""The reference decoder's own pieces, over random descriptors (tests/strategies.py).

The reference's decode itself is checked bit for bit against conformance/spec_reference.py (a
per-element transcription of SPEC.md that shares no code with qformat's decoder) with every
other backend in tests/test_backends.py (the ``numpy`` backend): in memory, through files
(save_file / check / load_file / safe_open.get_slice / get_qtensor), with a tiny chunk size, on
random bit patterns.  Here: the codes qformat's unpacker reads back are the canonical codes
the strategy packed, for the tensor and every encoded parameter.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from qformat import decode as decode_mod

from .strategies import descriptors

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def canonical_codes(desc, comps):
    """Codes of every (nested) descriptor, re-derived from the components by qformat."""
    from qformat.descriptor import Descriptor
    from qformat.sources import ArraySource

    out = {}

    def walk(d):
        D = Descriptor.from_dict(d)
        out[d["codes"]["tensor"]] = decode_mod.read_codes(D, ArraySource(comps), decode_mod.full_region(D.shape))
        for role in ("zero", "scale", "bias"):
            if role in d and "encoded" in d[role]:
                walk(d[role]["encoded"])

    walk(desc)
    return out


@SETTINGS
@given(descriptors())
def test_read_codes_recovers_the_canonical_codes(case):
    desc, comps, codes = case
    sub = canonical_codes(desc, comps)
    np.testing.assert_array_equal(sub[desc["codes"]["tensor"]], codes)
