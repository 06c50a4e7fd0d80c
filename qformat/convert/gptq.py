"""Source ``gptq``: GPTQ checkpoints (AutoGPTQ, GPTQModel, transformers/optimum), described in place.

Per quantized module ``P`` the checkpoint stores (K = in features, N = out features, b = bits,
G = group size, ``ng = ceil(K/G)``):

- ``P.qweight`` ``I32 [K*b/32, N]``: codes packed along K, LSB-first; 3-bit codes form one
  continuous bit stream over each column's words (AutoGPTQ ``qlinear_cuda_old.pack``);
- ``P.qzeros`` ``I32 [ng, N*b/32]``: zero points packed the same way along N; the original
  format (``checkpoint_format`` ``"gptq"``, "v1") stores ``z - 1`` modulo ``2^b``, described by
  ``code_offset`` 1 (SPEC §6.2), ``"gptq_v2"`` stores ``z``;
- ``P.scales`` ``F16``/``BF16 [ng, N]``;
- ``P.g_idx`` ``I32 [K]``: the group of every input row.

The logical tensor ``P.weight`` (``[N, K]``, the scales' dtype) decodes as
``W[n, k] = s[g(k), n] * (q[k, n] - z[g(k), n])``, the dequantization of AutoGPTQ's
``QuantLinear`` torch path and GPTQModel.  ``g(k)`` is ``g_idx[k]`` when the checkpoint uses
activation order (``desc_act``), read from ``P.g_idx`` as a SPEC §8.2 group index shared by the
scale and the zero point; otherwise ``k // G``, which is what the ExLlama/Marlin kernels compute
when ``desc_act`` is false (they ignore ``g_idx``).  A checkpoint whose ``g_idx`` disagrees with
``k // G`` while ``desc_act`` is false decodes differently in different runtimes and is refused.

Bit-exactness: ``q - z`` is an exact small integer in every runtime and in qformat's binary32
arithmetic; its product with an fp16/bf16 scale has at most 8 + 11 significant bits, so the
binary32 product is exact and its single rounding to the scale's dtype (SPEC §10.3) is the
correctly rounded product that the runtimes' fp16/bf16 multiply returns.
See ``mapping/gptq.md`` for the descriptors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Checkpoint, Converter, Described, source_error, unsupported
from ._intpack import (SCALE_DTYPES, ceil_div, cfg_bool, cfg_int, cfg_str, describe_modules, expect_shape, int_element,
                       packed_modules, quant_method_is, word_packing)

BITS = (2, 3, 4, 8)
FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> code_offset of the stored zero points
GIDX_DTYPES = ("I32", "I64", "I16")


def _is_gptq_module(ck: Checkpoint, p: str) -> bool:
    """Tensor-based detection: GPTQ's ``scales`` have as many columns as ``qweight`` (N);
    AWQ's ``qweight`` is ``[K, N/8]``, so its scales have 8 times more.  A ``g_idx`` is GPTQ only."""
    if p + ".g_idx" in ck:
        return True
    qw, sc = ck.info(p + ".qweight"), ck.info(p + ".scales")
    return (qw is not None and sc is not None and len(qw.shape) == 2 and len(sc.shape) == 2
            and qw.shape[1] == sc.shape[1] and qw.shape[1] > 0)


class GPTQ(Converter):
    """GPTQ v1 (``gptq``) and v2 (``gptq_v2``), 2/3/4/8 bits, grouped, per-channel or act-order."""

    name = "gptq"
    title = "GPTQ (AutoGPTQ / GPTQModel qweight, qzeros, scales, g_idx; v1 and v2)"
    priority = 50

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        qc = ck.quantization_config()
        named = quant_method_is(qc, "gptq")
        if named is not None:
            return named
        mods = packed_modules(ck)
        return bool(mods) and all(_is_gptq_module(ck, p) for p in mods)

    def describe(self, ck: Checkpoint) -> Described:
        qc = ck.quantization_config()
        cfg = _config(qc if isinstance(qc, dict) else None)
        return describe_modules(ck, "a GPTQ", lambda c, p: _describe_module(c, p, cfg))


def _config(qc: dict[str, Any] | None) -> dict[str, Any]:
    """The settings that matter, checked; None values are inferred per module from shapes."""
    if qc is None:
        return {"bits": None, "group_size": None, "desc_act": None, "offset": 1}
    qm = qc.get("quant_method")
    if qm is not None and (not isinstance(qm, str) or qm.lower() != "gptq"):
        raise source_error(f"quant_method is {qm!r}, expected 'gptq'", field="quantization_config.quant_method")
    bits = cfg_int(qc, ("bits",), None)
    if bits is None:
        raise source_error("the quantization config has no 'bits'", field="quantization_config.bits")
    if bits not in BITS:
        raise unsupported(f"bits is {bits}, expected one of {', '.join(map(str, BITS))}", field="quantization_config.bits")
    gs = cfg_int(qc, ("group_size",), -1)
    if gs != -1 and gs <= 0:
        raise source_error(f"group_size is {gs}, expected -1 or a positive integer", field="quantization_config.group_size")
    fmt = cfg_str(qc, "checkpoint_format", "gptq").lower()
    if cfg_bool(qc, "is_marlin_format", False):
        fmt = "marlin"
    if fmt not in FORMATS:
        raise unsupported(f"checkpoint_format is {fmt!r}: a device layout this converter does not describe; expected 'gptq' or 'gptq_v2'",
                          field="quantization_config.checkpoint_format")
    pack = cfg_str(qc, "pack_dtype", "int32").replace("torch.", "")
    if pack != "int32":
        raise unsupported(f"pack_dtype is {pack!r}; only int32 words are described", field="quantization_config.pack_dtype")
    if qc.get("dynamic"):
        raise unsupported("'dynamic' per-module overrides (GPTQModel) are not described", field="quantization_config.dynamic")
    return {"bits": bits, "group_size": gs, "desc_act": cfg_bool(qc, "desc_act", False), "offset": FORMATS[fmt]}


def _infer_bits(ck: Checkpoint, p: str, rows: int, n: int, k: int | None) -> int:
    """Without a config: the widths that fit ``qzeros`` (``ceil(N*b/32)`` words) and ``qweight``."""
    qz = ck.require(p + ".qzeros", ("I32",), rank=2)
    fits = [b for b in BITS if qz.shape[1] == ceil_div(n * b, 32)
            and (rows == ceil_div(k * b, 32) if k is not None else (rows * 32) % b == 0)]
    if len(fits) != 1:
        raise source_error(f"cannot tell the bit width from the shapes (qweight rows {rows}, qzeros {list(qz.shape)}, N {n}): "
                           f"{'several fit: ' + str(fits) if fits else 'none of 2, 3, 4, 8 fits'}; add config.json with a quantization_config",
                           tensor=p + ".qzeros")
    return fits[0]


def _describe_module(ck: Checkpoint, p: str, cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    qwn, qzn, scn, gin = p + ".qweight", p + ".qzeros", p + ".scales", p + ".g_idx"
    qw = ck.require(qwn, ("I32",), rank=2)
    rows, n = qw.shape
    sc = ck.require(scn, tuple(SCALE_DTYPES), rank=2)
    ck.require(qzn, ("I32",), rank=2)
    has_g = gin in ck
    k_from_g = ck.require(gin, GIDX_DTYPES, rank=1).shape[0] if has_g else None
    bits = cfg["bits"] or _infer_bits(ck, p, rows, n, k_from_g)
    if k_from_g is not None:
        k = k_from_g
        if rows != ceil_div(k * bits, 32):
            raise source_error(f"shape is {list(qw.shape)}, expected [{ceil_div(k * bits, 32)}, {n}] (K = {k} rows of g_idx at {bits} bits, 32 per word)", tensor=qwn)
    else:
        if (rows * 32) % bits:
            raise source_error(f"shape is {list(qw.shape)}: {rows} words of 32 bits do not hold a whole number of {bits}-bit codes", tensor=qwn)
        k = rows * 32 // bits
    if sc.shape[1] != n:
        raise source_error(f"shape is {list(sc.shape)}, expected [groups, {n}] (N = {n} columns of {qwn})", tensor=scn)
    ng = sc.shape[0]
    gs = cfg["group_size"]
    g = np.asarray(ck.array(gin), dtype=np.int64) if has_g else None
    if gs is None:  # no config: the group size from g_idx or from the scales' rows
        if g is not None and k > 0:
            g0 = int(np.count_nonzero(g == 0))
            gs = g0 if g0 and np.array_equal(g, np.arange(k) // g0) else None
        elif ng >= 1 and k % ng == 0:
            gs = k // ng
        if gs is None and g is None:
            raise source_error(f"cannot tell the group size: K = {k} is not a multiple of the {ng} rows of {scn}; add config.json", tensor=scn)
        desc_act = gs is None
        if gs is None:  # act-order: the groups are whatever g_idx says; only their count matters
            gs = -1 if ng == 1 else ceil_div(k, ng)
    else:
        desc_act = cfg["desc_act"]
    gsz = k if gs == -1 else gs
    want_ng = ceil_div(k, gsz) if gsz > 0 else 0
    if ng != want_ng and not (desc_act and cfg["group_size"] is None):
        raise source_error(f"shape is {list(sc.shape)}, expected [{want_ng}, {n}] (ceil(K / group_size) = ceil({k} / {gsz}) groups, N = {n})", tensor=scn)
    expect_shape(ck, qzn, ("I32",), (ng, ceil_div(n * bits, 32)), f"{ng} groups by ceil(N * bits / 32) = ceil({n} * {bits} / 32) words")
    if g is not None:
        bad = np.flatnonzero((g < 0) | (g >= ng))
        if bad.size:
            i = int(bad[0])
            raise source_error(f"g_idx[{i}] is {int(g[i])}, expected a group in [0, {ng})", tensor=gin)
        if not desc_act and not np.array_equal(g, np.arange(k) // gsz):
            i = int(np.flatnonzero(g != np.arange(k) // gsz)[0])
            raise source_error(f"desc_act is false, so kernels that ignore g_idx (ExLlama, Marlin) use k // {gsz}, but g_idx[{i}] is {int(g[i])}, "
                               f"not {i // gsz}: runtimes disagree on this checkpoint", tensor=gin)
    elif desc_act:
        raise source_error("desc_act is true (activation order) but there is no g_idx", tensor=gin)

    if desc_act:
        blocks: dict[str, Any] = {"type": "grid", "size": [1, None], "index": {"axis": 1, "tensor": gin, "count": ng}}
    else:
        blocks = {"type": "grid", "size": [1, None if gs == -1 else gs]}
    desc = {
        "shape": [n, k],
        "dtype": SCALE_DTYPES[sc.dtype],
        "codes": {"tensor": qwn, "element": int_element(bits), "packing": word_packing(axis=0)},
        "zero": {"blocks": blocks, "encoded": {
            "shape": [n, ng], "dtype": "float32",
            "codes": {"tensor": qzn, "element": int_element(bits, cfg["offset"]), "packing": word_packing(axis=1)}}},
        "scale": {"blocks": dict(blocks), "op": "multiply", "tensor": scn, "order": [1, 0]},
    }
    name = p + ".weight"
    if name in ck:
        raise source_error(f"the logical weight {name!r} would take the name of a stored tensor", tensor=name)
    return name, desc
