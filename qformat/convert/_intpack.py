"""Shared pieces of the integer-packed sources (``gptq``, ``awq``): finding the quantized
modules, checking component shapes with messages that name what was expected, and building
the descriptor parts both formats use (unsigned integer codes in 32-bit words, an integer zero
point that is itself packed, a plain scale transposed from ``[groups, N]``)."""

from __future__ import annotations

from typing import Any, Callable

from .base import Checkpoint, Described, source_error

#: Storage dtype of ``scales`` -> logical dtype of the weight.  The runtimes compute the
#: dequantized weight in the scales' dtype (AutoGPTQ, GPTQModel and AutoAWQ multiply an
#: integer tensor by the scales tensor), so that is the dtype the weight decodes to.
SCALE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}

PACKED_SUFFIXES = (".qweight", ".qzeros", ".scales")


def module_prefixes(ck: Checkpoint) -> list[str]:
    """Prefixes ``P`` of every stored ``P.qweight``, in file order."""
    return [n[: -len(".qweight")] for n in ck.names() if n.endswith(".qweight")]


def quant_method_is(qc: Any, method: str) -> bool | None:
    """True/False when the quantization config names a ``quant_method``, None when it names none."""
    if isinstance(qc, dict) and isinstance(qc.get("quant_method"), str):
        return qc["quant_method"].lower() == method
    return None


def describe_modules(ck: Checkpoint, what: str, describe_module: Callable[[Checkpoint, str], tuple[str, dict[str, Any]]]) -> Described:
    """One descriptor per ``<module>.qweight`` prefix, built by ``describe_module``."""
    prefixes = module_prefixes(ck)
    if not prefixes:
        raise source_error(f"no tensor named '<module>.qweight': not {what} checkpoint")
    out = Described()
    for p in prefixes:
        name, desc = describe_module(ck, p)
        out.descriptors[name] = desc
    return out


def packed_modules(ck: Checkpoint) -> list[str]:
    """Prefixes that have all of ``qweight``, ``qzeros`` and ``scales`` (detection only)."""
    return [p for p in module_prefixes(ck) if all(p + s in ck for s in PACKED_SUFFIXES)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def expect_shape(ck: Checkpoint, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...], why: str) -> None:
    """``CONVERT_SOURCE_INVALID`` unless ``name`` exists with one of ``dtypes`` and ``shape``."""
    i = ck.require(name, dtypes, rank=len(shape))
    if tuple(i.shape) != tuple(shape):
        raise source_error(f"shape is {list(i.shape)}, expected {list(shape)} ({why})", tensor=name)


def int_element(bits: int, code_offset: int = 0) -> dict[str, Any]:
    el: dict[str, Any] = {"type": "int", "bits": bits, "signedness": "unsigned"}
    if code_offset:
        el["code_offset"] = code_offset
    return el


def word_packing(axis: int, slot_order: list[int] | None = None) -> dict[str, Any]:
    """32-bit words, LSB-first, the stored grid the transpose ``[1, 0]`` of the logical ``[N, K]``."""
    p: dict[str, Any] = {"container": 32, "bit_order": "lsb_first", "axis": axis, "order": [1, 0]}
    if slot_order is not None:
        p["slot_order"] = slot_order
    return p


def cfg_int(qc: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    """The first of ``keys`` present in ``qc`` as an integer (bool refused), else ``default``."""
    for k in keys:
        if k in qc:
            v = qc[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise source_error(f"quantization config {k} is {v!r}, expected an integer", field=f"quantization_config.{k}")
            return v
    return default


def cfg_bool(qc: dict[str, Any], key: str, default: bool) -> bool:
    if key not in qc or qc[key] is None:
        return default
    v = qc[key]
    if not isinstance(v, bool):
        raise source_error(f"quantization config {key} is {v!r}, expected true or false", field=f"quantization_config.{key}")
    return v


def cfg_str(qc: dict[str, Any], key: str, default: str) -> str:
    if key not in qc or qc[key] is None:
        return default
    v = qc[key]
    if not isinstance(v, str):
        raise source_error(f"quantization config {key} is {v!r}, expected a string", field=f"quantization_config.{key}")
    return v
