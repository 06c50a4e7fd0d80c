"""Tensor-parallel shard bounds, block-aligned where the descriptor allows (qformat.slicing)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import qformat
from qformat.descriptor import Descriptor, parse_descriptor
from qformat.errors import error
from qformat.slicing import axis_periods


def _descriptor(d: Any) -> Descriptor | None:
    from .qtensor import TorchQTensor

    if d is None or isinstance(d, Descriptor):
        return d
    if isinstance(d, TorchQTensor):
        return d.parsed
    if isinstance(d, qformat.QTensor):
        return parse_descriptor("<qtensor>", d.descriptor)
    if isinstance(d, Mapping):
        return parse_descriptor("<descriptor>", d)
    raise TypeError(f"expected a descriptor (dict or parsed), a QTensor or a TorchQTensor, found {type(d).__name__}")


def shard_period(descriptor: Any, dim: int) -> int | None:
    """The period of block-aligned cuts along logical axis ``dim`` (qformat.slicing.axis_periods):
    a cut at a multiple of it keeps every packed container and parameter cell whole; None when
    only 0 and the axis end are aligned."""
    desc = _descriptor(descriptor)
    if desc is None:
        return 1
    return axis_periods(desc)[dim]


def shard_bounds(shape: Sequence[int], dim: int, rank: int, world: int, *, descriptor: Any = None) -> tuple[int, int]:
    """``(start, stop)`` of shard ``rank`` of ``world`` along ``dim`` of a tensor of ``shape``.

    With a ``descriptor`` (dict, parsed Descriptor, QTensor or TorchQTensor) the bounds fall on
    block-aligned positions (multiples of :func:`shard_period`, or the axis end), balanced so
    that shards differ by at most one period; without one, or when the descriptor allows no
    inner cut along ``dim``, the axis is split as evenly as possible element by element (a
    decode of such a shard is still exact, it just reads the straddling blocks twice).
    Shards may be empty when there are fewer periods than ranks.
    """
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise error("SLICE_INVALID", "a rank-0 tensor has no axis to shard")
    if not -len(shape) <= dim < len(shape):
        raise error("SLICE_INVALID", f"dim {dim} is out of range for a {len(shape)}-D tensor")
    dim %= len(shape)
    if world < 1 or not 0 <= rank < world:
        raise error("SLICE_INVALID", f"expected 0 <= rank < world, found rank {rank}, world {world}")
    n = shape[dim]
    m = shard_period(descriptor, dim) if descriptor is not None else 1
    if m is None:
        m = 1
    units = -(-n // m)
    base, extra = divmod(units, world)
    u0 = rank * base + min(rank, extra)
    u1 = u0 + base + (1 if rank < extra else 0)
    return min(n, u0 * m), min(n, u1 * m)
