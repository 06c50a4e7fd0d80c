"""A deliberately naive, element-by-element transcription of SPEC.md's packing formulas.

It shares no code with qformat.packing: each code is located bit by bit from the formulas in
SPEC.md ("Packing"), so the vectorised implementation is tested against the text, not against
itself.  Only for small inputs.
"""

from __future__ import annotations

import numpy as np


def word_bit(words: np.ndarray, container: int, k: int, bit_order: str) -> int:
    """Stream bit k of a row of words."""
    w = int(words[k // container])
    pos = k % container if bit_order == "lsb_first" else container - 1 - (k % container)
    return (w >> pos) & 1


def slow_unpack_row(words: np.ndarray, bits: int, container: int, bit_order: str, length: int,
                    straddle: bool = True, slot_order=None, planes_span=None) -> list[int]:
    words = [int(w) for w in words]
    out = [None] * length
    slots_mode = container % bits == 0 or not straddle
    if not slots_mode:
        for i in range(length):
            v = 0
            for j in range(bits):
                b = word_bit(np.array(words, dtype=object), container, i * bits + j, bit_order)
                v |= b << (j if bit_order == "lsb_first" else bits - 1 - j)
            out[i] = v
        return out
    n = container // bits
    pi = list(slot_order) if slot_order is not None else list(range(n))

    def slot(word: int, s: int) -> int:
        shift = s * bits if bit_order == "lsb_first" else container - (s + 1) * bits
        return (word >> shift) & ((1 << bits) - 1)

    if planes_span is None:
        for w, word in enumerate(words):
            for s in range(n):
                e = w * n + pi[s]
                if e < length:
                    out[e] = slot(word, s)
        return out
    t = planes_span
    wbase = 0
    g = 0
    while g * t < length:
        tg = min(t, length - g * t)
        mg = -(-tg // n)
        for w in range(mg):
            for s in range(n):
                off = pi[s] * mg + w
                if off < tg:
                    out[g * t + off] = slot(words[wbase + w], s)
        wbase += mg
        g += 1
    return out
