"""Source ``awq``: AutoAWQ GEMM checkpoints (also what transformers' ``AwqConfig`` loads), in place.

Per quantized module ``P`` (K = in features, N = out features, G = group size, 4 bits):

- ``P.qweight`` ``I32 [K, N/8]``: eight 4-bit codes per word along N; nibble ``i`` (bits
  ``4i..4i+3``) holds column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]`` (AutoAWQ
  ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear``; undone by ``reverse_awq_order``
  in ``awq/utils/packing_utils.py``): SPEC ``slot_order`` ``[0, 2, 4, 6, 1, 3, 5, 7]``;
- ``P.qzeros`` ``I32 [K/G, N/8]``: the zero points, packed the same way, stored as they are;
- ``P.scales`` ``F16 [K/G, N]``.

The logical tensor ``P.weight`` (``[N, K]``, the scales' dtype) decodes as
``W[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]`` (AutoAWQ ``dequantize_gemm``): an exact
integer difference times an fp16 scale, rounded once, so qformat's binary32 product rounded to
fp16 gives the same bits (see ``mapping/awq.md``).

Refused with ``CONVERT_UNSUPPORTED``: ``zero_point`` false (WQLinear_GEMM always has zero
points), widths other than 4, and the GEMV, GEMV-fast and Marlin versions, whose tensors have
other shapes (GEMV-fast interleaves codes for the kernel).
"""

from __future__ import annotations

from typing import Any

from .base import Checkpoint, Converter, Described, source_error, unsupported
from ._intpack import (SCALE_DTYPES, ceil_div, cfg_bool, cfg_int, cfg_str, describe_modules, expect_shape, int_element,
                       packed_modules, quant_method_is, word_packing)

#: Nibble i of each word holds column 8c + AWQ_ORDER[i] (AutoAWQ AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]).
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
#: Versions whose checkpoints have the GEMM layout ("exllama" loads GEMM checkpoints and
#: repacks them in memory, transformers AwqConfig).
GEMM_VERSIONS = ("gemm", "exllama")


def _is_awq_module(ck: Checkpoint, p: str) -> bool:
    """AWQ GEMM has no g_idx and 8 scale columns per qweight column (GPTQ: one)."""
    if p + ".g_idx" in ck:
        return False
    qw, sc = ck.info(p + ".qweight"), ck.info(p + ".scales")
    return (qw is not None and sc is not None and len(qw.shape) == 2 and len(sc.shape) == 2
            and qw.shape[1] > 0 and ceil_div(sc.shape[1], 8) == qw.shape[1] and sc.shape[1] != qw.shape[1])


class AWQ(Converter):
    """AutoAWQ GEMM: 4-bit, zero point, groups along K, interleaved nibbles along N."""

    name = "awq"
    title = "AWQ (AutoAWQ GEMM qweight, qzeros, scales)"
    priority = 50

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        qc = ck.quantization_config()
        named = quant_method_is(qc, "awq")
        if named is not None:
            return named
        if isinstance(qc, dict) and "w_bit" in qc and "q_group_size" in qc:  # AutoAWQ quant_config.json
            return True
        mods = packed_modules(ck)
        return bool(mods) and all(_is_awq_module(ck, p) for p in mods)

    def describe(self, ck: Checkpoint) -> Described:
        qc = ck.quantization_config()
        gs = _config(qc if isinstance(qc, dict) else None)
        return describe_modules(ck, "an AWQ", lambda c, p: _describe_module(c, p, gs))


def _config(qc: dict[str, Any] | None) -> int | None:
    """The group size (-1 per channel; None: infer per module), after refusing what is not GEMM."""
    if qc is None:
        return None
    qm = qc.get("quant_method")
    if qm is not None and (not isinstance(qm, str) or qm.lower() != "awq"):
        raise source_error(f"quant_method is {qm!r}, expected 'awq'", field="quantization_config.quant_method")
    bits = cfg_int(qc, ("bits", "w_bit"), 4)
    if bits != 4:
        raise unsupported(f"bits is {bits}; AWQ GEMM checkpoints are 4-bit", field="quantization_config.bits")
    version = cfg_str(qc, "version", "gemm").lower()
    if version not in GEMM_VERSIONS:
        raise unsupported(f"version is {version!r}; only the GEMM layout ({', '.join(GEMM_VERSIONS)}) is described "
                          "(GEMV stores qweight as [N, K/8] with padded zeros and scales; GEMV-fast and Marlin interleave for their kernels)",
                          field="quantization_config.version")
    if not cfg_bool(qc, "zero_point", True):
        raise unsupported("zero_point is false: AWQ GEMM layers always carry qzeros, a checkpoint without zero points is not the GEMM format",
                          field="quantization_config.zero_point")
    gs = cfg_int(qc, ("group_size", "q_group_size"), 128)
    if gs != -1 and gs <= 0:
        raise source_error(f"group_size is {gs}, expected -1 or a positive integer", field="quantization_config.group_size")
    return gs


def _describe_module(ck: Checkpoint, p: str, gs: int | None) -> tuple[str, dict[str, Any]]:
    qwn, qzn, scn = p + ".qweight", p + ".qzeros", p + ".scales"
    if p + ".g_idx" in ck:
        raise source_error(f"{p}.g_idx is a GPTQ tensor; AWQ has none (convert with --from gptq?)", tensor=p + ".g_idx")
    qw = ck.require(qwn, ("I32",), rank=2)
    sc = ck.require(scn, tuple(SCALE_DTYPES), rank=2)
    ck.require(qzn, ("I32",), rank=2)
    k, words = qw.shape
    ng, n = sc.shape
    if words != ceil_div(n, 8):
        raise source_error(f"shape is {list(qw.shape)}, expected [{k}, {ceil_div(n, 8)}] (N = {n} columns of {scn}, 8 codes per word)", tensor=qwn)
    if gs is None:  # no config: groups from the scales' rows
        if ng < 1 or k % ng:
            raise source_error(f"cannot tell the group size: K = {k} is not a multiple of the {ng} rows of {scn}; add config.json", tensor=scn)
        gs = -1 if ng == 1 else k // ng
    gsz = k if gs == -1 else gs
    if gsz > 0 and k % gsz:  # WQLinear_GEMM asserts in_features % group_size == 0
        raise source_error(f"shape is {list(qw.shape)}: K = {k} is not a multiple of group_size {gsz}, which AWQ GEMM requires", tensor=qwn)
    want = k // gsz if gsz > 0 else 0
    if ng != want:
        raise source_error(f"shape is {list(sc.shape)}, expected [{want}, {n}] (ceil(K / group_size) = ceil({k} / {gsz}) groups, N = {n})", tensor=scn)
    expect_shape(ck, qzn, ("I32",), (ng, ceil_div(n, 8)), f"{ng} groups by ceil(N / 8) = {ceil_div(n, 8)} words")
    blocks = {"type": "grid", "size": [1, None if gs == -1 else gs]}
    desc = {
        "shape": [n, k],
        "dtype": SCALE_DTYPES[sc.dtype],
        "codes": {"tensor": qwn, "element": int_element(4), "packing": word_packing(axis=1, slot_order=AWQ_ORDER)},
        "zero": {"blocks": blocks, "encoded": {
            "shape": [n, ng], "dtype": "float32",
            "codes": {"tensor": qzn, "element": int_element(4), "packing": word_packing(axis=1, slot_order=AWQ_ORDER)}}},
        "scale": {"blocks": dict(blocks), "op": "multiply", "tensor": scn, "order": [1, 0]},
    }
    name = p + ".weight"
    if name in ck:
        raise source_error(f"the logical weight {name!r} would take the name of a stored tensor", tensor=name)
    return name, desc
