"""What every device layout implements, and the registry of layouts by their stable name.

A device layout (SPEC.md §11) is a permutation of a descriptor's *canonical component*: the
codes that the same descriptor describes with layout ``canonical`` (and, for some layouts, the
scale grid in natural order).  A :class:`DeviceLayout` says which descriptors it accepts
(:meth:`~DeviceLayout.problems`), the device tensor's shape, and converts exactly both ways.
One module per layout defines a subclass and registers an instance with :func:`register`.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..descriptor import Descriptor, Param

#: Report one problem: (code, field, message).
Add = Callable[[str, str, str], None]

#: The packing of the canonical component of every defined device layout (SPEC.md §11.2).
CANONICAL_PACKING = {"container": 32, "bit_order": "lsb_first", "axis": 1}


class DeviceLayout:
    """One named device layout for a rank-2 weight ``[N, K]`` of offset-binary int codes.

    Subclasses set the class attributes and implement the four conversions; the common checks
    (element, packing, parameters' form and group sizes) are here, driven by the attributes.
    """

    name: str = ""
    #: Code widths the layout stores.
    bits: tuple[int, ...] = ()
    #: Group sizes along K it allows (each must divide K); ``per_channel``: also one group.
    group_sizes: tuple[int, ...] = ()
    per_channel: bool = False
    #: Whether an additive ``bias`` parameter (stored as pairs with the scale) is allowed.
    bias: bool = False
    #: The ``order`` the scale (and bias) component must have, when the layout fixes one.
    param_order: tuple[int, ...] | None = None

    # -- to implement -------------------------------------------------------------------
    def shape_problems(self, desc: Descriptor, add: Add) -> None:
        """Report LAYOUT_SHAPE when ``[N, K]`` does not fit the layout's tiles."""
        raise NotImplementedError

    def device_shape(self, desc: Descriptor) -> tuple[int, ...]:
        """The exact shape of the codes component (replaces SPEC.md §7.4)."""
        raise NotImplementedError

    def unpack(self, desc: Descriptor, device: np.ndarray) -> np.ndarray:
        """The device tensor -> logical codes ``[N, K]`` (uint8)."""
        raise NotImplementedError

    def pack(self, desc: Descriptor, codes: np.ndarray) -> np.ndarray:
        """Logical codes ``[N, K]`` -> the device tensor (uint32); the inverse of :meth:`unpack`."""
        raise NotImplementedError

    def code_positions(self, desc: Descriptor) -> np.ndarray:
        """``pos[n, k]``: where code ``q[n, k]`` sits in the device tensor, counted in fields
        (word ``pos // P`` of the row-major flat codes component, bits ``b * (pos % P)``..)."""
        raise NotImplementedError

    # -- optional: layouts that permute the scale -----------------------------------------
    def scale_to_canonical(self, desc: Descriptor, stored: np.ndarray) -> np.ndarray | None:
        """The scale component in natural order, or None when the layout stores it as is."""
        return None

    def scale_from_canonical(self, desc: Descriptor, natural: np.ndarray) -> np.ndarray | None:
        """The inverse of :meth:`scale_to_canonical` (None: stored as is)."""
        return None

    def scale_gather(self, desc: Descriptor) -> np.ndarray | None:
        """``g`` with ``natural_flat = stored_flat[g]`` for the scale, or None."""
        return None

    # -- common checks ------------------------------------------------------------------
    def problems(self, desc: Descriptor, add: Add) -> None:
        """Everything the layout requires of a rank-2 descriptor except the component shapes."""
        el = desc.codes.element
        if el.type != "int" or el.bits not in self.bits or el.signedness != "offset_binary" or el.code_offset or el.frac_bits:
            add("LAYOUT_MISMATCH", "codes.element", f"layout {self.name!r} needs an int element of {' or '.join(map(str, self.bits))} bits, offset_binary, without code_offset or frac_bits, found {el.to_dict()}")
        p = desc.codes.packing
        if p.container != 32 or p.bit_order != "lsb_first" or p.axis != 1 or p.order not in (None, (0, 1)) or p.slot_order is not None or p.planes_span is not None or p.row_alignment != 1:
            add("LAYOUT_MISMATCH", "codes.packing", f"layout {self.name!r} needs the canonical packing {CANONICAL_PACKING} (no order, slot_order, planes or row_alignment), found {p.to_dict()}")
        self.shape_problems(desc, add)
        self._param_problems(desc, add)

    def _param_problems(self, desc: Descriptor, add: Add) -> None:
        name, k = self.name, desc.shape[1]
        if desc.zero is not None:
            add("LAYOUT_MISMATCH", "zero", f"layout {name!r} has no zero point (its codes are offset_binary); found a 'zero' parameter")
        if not self.bias and desc.bias is not None:
            add("LAYOUT_MISMATCH", "bias", f"layout {name!r} has no bias; found a 'bias' parameter")
        s = desc.scale
        if s is None:
            add("LAYOUT_MISMATCH", "scale", f"layout {name!r} needs a 'scale' parameter")
            return
        roles: tuple[tuple[str, str], ...] = (("scale", "multiply"),) + ((("bias", "add"),) if self.bias else ())
        for role, op in roles:
            prm: Param | None = getattr(desc, role)
            if prm is not None:
                self._one_param_problems(prm, role, op, k, add)
        if self.bias and desc.bias is not None and desc.bias.blocks.to_dict() != s.blocks.to_dict():
            add("LAYOUT_MISMATCH", "bias.blocks", f"layout {name!r} stores scale and bias as pairs: their blocks must be equal, found {s.blocks.to_dict()} and {desc.bias.blocks.to_dict()}")

    def _one_param_problems(self, prm: Param, role: str, op: str, k: int, add: Add) -> None:
        name, b = self.name, prm.blocks
        if prm.tensor is None or prm.op != op or b.type != "grid" or b.index is not None or len(b.size) != 2 or b.size[0] != 1:  # type: ignore[arg-type]
            add("LAYOUT_MISMATCH", role, f"layout {name!r} needs '{role}' as a plain tensor with op {op!r} and grid blocks [1, G] without a group index, found {prm.to_dict()}")
            return
        if self.param_order is not None and prm.order != self.param_order:
            add("LAYOUT_MISMATCH", f"{role}.order", f"layout {name!r} stores the scale as [K/G, N]: 'order' must be {list(self.param_order)}, found {list(prm.order) if prm.order else None}")
        g = b.size[1]  # type: ignore[index]
        ok = self.per_channel and (g is None or g >= k)
        if not ok and not (g in self.group_sizes and k % g == 0):
            allowed = (["null"] if self.per_channel else []) + [str(x) for x in self.group_sizes]
            add("LAYOUT_GROUP_SIZE", f"{role}.blocks.size", f"layout {name!r} allows a group size along K of {', '.join(allowed)} (dividing K = {k}), found {g}")


_REGISTRY: dict[str, DeviceLayout] = {}


def register(layout: DeviceLayout) -> DeviceLayout:
    """Register ``layout`` under its name (each name once)."""
    if layout.name in _REGISTRY:
        raise ValueError(f"device layout {layout.name!r} is registered twice")
    _REGISTRY[layout.name] = layout
    return layout


def registered() -> Mapping[str, DeviceLayout]:
    """The registered device layouts by name (``canonical`` and forbidden names have none)."""
    return dict(_REGISTRY)


def get(name: str) -> DeviceLayout | None:
    return _REGISTRY.get(name)

