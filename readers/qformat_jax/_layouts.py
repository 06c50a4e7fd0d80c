"""Device layouts in the JAX reader (SPEC.md §11): the device tensor is turned into its
canonical component inside the traced computation by static gathers (index maps from
:func:`qformat.layouts.code_positions` / :func:`qformat.layouts.scale_gather`, plain NumPy
index math), so a jitted decode of a ``tinygemm_int4_cuda`` or ``marlin_dense`` tensor gives
the NumPy reader's bits.  Unknown and forbidden layouts never reach here: the core refuses them
with LAYOUT_UNKNOWN / LAYOUT_FORBIDDEN when the file is opened."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from qformat.descriptor import Descriptor
from qformat.layouts import CANONICAL, CANONICAL_PACKING, code_positions, scale_gather
from qformat.packing import Packing, slot_shifts

_CANONICAL_PACKING = Packing.from_dict(CANONICAL_PACKING)


def canonical(desc: Descriptor, comps: Mapping[str, jax.Array], bits_of: Any) -> tuple[Descriptor, dict[str, jax.Array]]:
    """(canonical descriptor, components with the canonical codes (and Marlin scale))."""
    n, k = desc.shape
    b = desc.codes.element.bits
    per = _CANONICAL_PACKING.slots_per_word(b)
    pos = code_positions(desc)
    words = bits_of(comps[desc.codes.tensor]).astype(jnp.uint32).reshape(-1)
    codes = (words[jnp.asarray(pos // per)] >> jnp.asarray((b * (pos % per)).astype(np.uint32))) & jnp.uint32((1 << b) - 1)
    fields = codes.reshape(n, k // per, per)
    shifts = jnp.asarray(slot_shifts(_CANONICAL_PACKING, b))
    canon = jnp.sum(fields << shifts, axis=-1, dtype=jnp.uint32)  # disjoint fields: sum == or
    out = dict(comps)
    out[desc.codes.tensor] = canon.astype(jnp.uint32)
    g = scale_gather(desc)
    if g is not None:
        s = comps[desc.scale.tensor]  # type: ignore[union-attr]
        out[desc.scale.tensor] = s.reshape(-1)[jnp.asarray(g)].reshape(s.shape)  # type: ignore[union-attr]
    return dataclasses.replace(desc, layout=CANONICAL, layout_parameters={}), out
