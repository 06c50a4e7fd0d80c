"""Source ``bitsandbytes``: 4-bit (NF4 / FP4) weights saved from ``bnb.nn.Params4bit``.

A 4-bit weight ``P.weight`` of logical shape ``S`` (``n`` elements) is saved by
``QuantState.as_dict(packed=True)`` (bitsandbytes/functional.py) as:

- ``P.weight``: the packed codes, ``ceil(n/2)`` bytes over the *flattened* tensor, element
  ``2k`` in the high nibble of byte ``k`` (``U8 [ceil(n/2), 1]``; with ``quant_storage`` another
  dtype the same bytes are viewed as that dtype, e.g. ``BF16 [ceil(n/2)/2, 1]``);
- ``P.weight.absmax``: one scale per ``blocksize`` elements of the flattened tensor (``F32``),
  or with double quantization (``compress_statistics``) an 8-bit code per block (``U8``) into
  ``P.weight.nested_quant_map`` (``F32 [256]``), times ``P.weight.nested_absmax`` (``F32``, one
  per ``nested_blocksize`` blocks), plus ``nested_offset``;
- ``P.weight.quant_map``: the 16-entry codebook (``F32``);
- ``P.weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``): a ``U8`` tensor holding UTF-8
  JSON with ``quant_type``, ``blocksize``, ``dtype``, ``shape`` and, when nested,
  ``nested_blocksize``, ``nested_dtype`` and ``nested_offset``.

Decoding (bitsandbytes ``dequantize_4bit``): ``w[f] = table[code[f]] * absmax[f // blocksize]``
in float32, rounded to ``dtype``; nested: ``absmax[j] = nested_quant_map[a[j]] *
nested_absmax[j // nested_blocksize] + nested_offset`` (two float32 roundings).  The runtime
uses its built-in table for ``quant_type``; ``quant_map`` must hold the same bits.

Described in place (see mapping/bitsandbytes.md): the logical tensor is ``P.weight`` itself
(its own codes component, SPEC §4.3); ``nested_offset``, kept only in the JSON blob, becomes
the added ``F32 []`` tensor ``P.weight.nested_offset``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import tables
from .base import Checkpoint, Converter, Described, lazy, parse_json_text, source_error, unsupported

#: The JSON blob's tensor suffix, per quant_type.
BLOB = ".quant_state.bitsandbytes__"
#: quant_type -> named codebook of SPEC §6.4.
NAMED = {"nf4": "nf4", "fp4": "bnb_fp4"}
#: Block sizes bitsandbytes' dequantize_4bit accepts (functional.py).
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: The blob is a few hundred bytes; anything far larger is not a quant state.
MAX_BLOB_BYTES = 64 << 10
_DTYPES = ("float32", "float16", "bfloat16")
#: Storage dtype of ``P.weight`` -> container width (SPEC §7.2).
_CONTAINER = {"U8": 8, "I8": 8, "U16": 16, "I16": 16, "F16": 16, "BF16": 16, "U32": 32, "I32": 32, "F32": 32}
_KEYS = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset"}


def _int(v: Any, what: str, blob: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise source_error(f"{what} is {v!r}, expected an integer", tensor=blob, field=what)
    return v


def read_quant_state(ck: Checkpoint, blob: str, quant_type: str) -> dict[str, Any]:
    """The validated quant state of one weight, from its ``U8`` JSON blob tensor."""
    info = ck.require(blob, ["U8"], rank=1)
    if info.shape[0] > MAX_BLOB_BYTES:
        raise source_error(f"the quant state is {info.shape[0]} bytes, more than the {MAX_BLOB_BYTES} allowed", tensor=blob)
    try:
        text = bytes(ck.array(blob)).decode("utf-8")
    except UnicodeDecodeError as e:
        raise source_error(f"the quant state is not UTF-8 text: {e}", tensor=blob) from None
    qs = parse_json_text(text, "the quant state", tensor=blob)
    if not isinstance(qs, dict):
        raise source_error(f"the quant state is a JSON {type(qs).__name__}, expected an object", tensor=blob)
    extra = sorted(set(qs) - _KEYS)
    if extra:
        raise unsupported(f"the quant state has members {extra} that this converter does not know (known: {sorted(_KEYS)})", tensor=blob)
    for k in ("quant_type", "blocksize", "dtype", "shape"):
        if k not in qs:
            raise source_error(f"the quant state has no {k!r}", tensor=blob, field=k)
    if qs["quant_type"] != quant_type:
        raise source_error(f"quant_type is {qs['quant_type']!r}, but the tensor name says {quant_type!r}", tensor=blob, field="quant_type")
    bs = _int(qs["blocksize"], "blocksize", blob)
    if bs not in BLOCKSIZES:
        raise source_error(f"blocksize is {bs}, expected one of {BLOCKSIZES}", tensor=blob, field="blocksize")
    dt = qs["dtype"]
    if isinstance(dt, str) and dt.startswith("torch."):
        dt = dt[len("torch."):]
    if dt not in _DTYPES:
        raise unsupported(f"dtype is {qs['dtype']!r}, expected one of {_DTYPES}", tensor=blob, field="dtype")
    shape = qs["shape"]
    if not isinstance(shape, list) or len(shape) > 8:
        raise source_error(f"shape is {shape!r}, expected a list of at most 8 integers", tensor=blob, field="shape")
    shape = [_int(s, "shape", blob) for s in shape]
    if any(s < 0 or s > 2**53 - 1 for s in shape) or math.prod(shape) >= 2**63:
        raise source_error(f"shape {shape} has a negative or too large extent", tensor=blob, field="shape")
    out: dict[str, Any] = {"quant_type": quant_type, "blocksize": bs, "dtype": dt, "shape": shape, "nested": False}
    nested_keys = [k for k in ("nested_blocksize", "nested_dtype", "nested_offset") if k in qs]
    if nested_keys:
        if len(nested_keys) != 3:
            missing = sorted({"nested_blocksize", "nested_dtype", "nested_offset"} - set(nested_keys))
            raise source_error(f"the quant state of a double-quantized weight lacks {missing}", tensor=blob)
        nbs = _int(qs["nested_blocksize"], "nested_blocksize", blob)
        if nbs < 1 or nbs > 1 << 20:
            raise source_error(f"nested_blocksize is {nbs}, expected a positive block size", tensor=blob, field="nested_blocksize")
        if qs["nested_dtype"] not in ("float32", "torch.float32"):
            raise unsupported(f"nested_dtype is {qs['nested_dtype']!r}; only float32 is known", tensor=blob, field="nested_dtype")
        off = qs["nested_offset"]
        if isinstance(off, bool) or not isinstance(off, (int, float)) or not math.isfinite(off):
            raise source_error(f"nested_offset is {off!r}, expected a finite number", tensor=blob, field="nested_offset")
        # bitsandbytes' QuantState.from_dict: torch.tensor(float(offset)), a float32 (RNE).
        out.update(nested=True, nested_blocksize=nbs, nested_offset=np.float32(off))
    return out


def _weights(ck: Checkpoint) -> list[tuple[str, str, str]]:
    """(weight name, blob name, quant_type) for every 4-bit quant-state blob of the checkpoint."""
    out = []
    for n in ck.names():
        i = n.rfind(BLOB)
        if i > 0:
            out.append((n[:i], n, n[i + len(BLOB):]))
    return out


class BitsAndBytes(Converter):
    name = "bitsandbytes"
    title = "bitsandbytes 4-bit (nf4, fp4; double quantization; any quant_storage)"
    priority = 40

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        if _weights(ck):
            return True
        qc = ck.quantization_config()
        return isinstance(qc, dict) and qc.get("quant_method") == "bitsandbytes"

    def describe(self, ck: Checkpoint) -> Described:
        found = _weights(ck)
        if not found:
            qc = ck.quantization_config() or {}
            if qc.get("load_in_8bit") or any(n.endswith(".SCB") for n in ck.names()):
                raise unsupported("bitsandbytes 8-bit (LLM.int8, weight + SCB) checkpoints are not supported; only 4-bit")
            raise source_error(f"no tensor named '<module>.weight{BLOB}nf4' or '...fp4' (a 4-bit quant state) in the checkpoint")
        out = Described()
        for weight, blob, qt in found:
            if qt not in NAMED:
                raise unsupported(f"quant_type {qt!r} in the tensor name; supported: {sorted(NAMED)}", tensor=blob)
            self._one(ck, out, weight, blob, qt)
        return out

    def _one(self, ck: Checkpoint, out: Described, w: str, blob: str, qt: str) -> None:
        qs = read_quant_state(ck, blob, qt)
        shape, bs = qs["shape"], qs["blocksize"]
        n = math.prod(shape)
        nbytes = -(-n // 2)
        nb = -(-n // bs)
        info = ck.require(w, list(_CONTAINER))
        c = _CONTAINER[info.dtype]
        count = math.prod(info.shape)
        if count * c // 8 != nbytes:
            raise source_error(f"holds {count} x {c}-bit words = {count * c // 8} bytes, but the quant state's shape {shape} "
                               f"({n} elements, two per byte) needs {nbytes}", tensor=w)
        # The quant map must be the table bitsandbytes' kernels use for quant_type (they ignore the
        # stored map); a different map makes the checkpoint decode differently in different runtimes.
        table = tables.codebook_values(NAMED[qt])
        qm_name = f"{w}.quant_map"
        if qm_name in ck:
            ck.require(qm_name, ["F32"])
            qm = np.asarray(ck.array(qm_name)).reshape(-1)
            if qm.shape != (16,) or not np.array_equal(qm.view(np.uint32), table.view(np.uint32)):
                raise source_error(f"quant_map differs from bitsandbytes' built-in {qt} table (which its dequantize_4bit uses): "
                                   f"expected the 16 float32 values of SPEC codebook {NAMED[qt]!r}, found {qm.size} values "
                                   f"{np.asarray(qm[:4]).tolist()}...", tensor=qm_name)
        if c == 8:
            packing: dict[str, Any] = {"container": 8, "bit_order": "msb_first", "axis": None}
        else:
            # The bytes viewed as little-endian c-bit words: byte k is bits [8k, 8k+8), its high
            # nibble (element 2k) slot 2k+1, its low nibble (element 2k+1) slot 2k (SPEC §7.7).
            packing = {"container": c, "bit_order": "lsb_first", "axis": None,
                       "slot_order": [s ^ 1 for s in range(c // 4)]}
        codes_name = w
        if n % 2 and int(np.asarray(ck.array(w)).reshape(-1).view(np.uint8)[-1]) & 0x0F:
            # bitsandbytes pads an odd tail with the code of 0.0 (nf4: 7), but SPEC §7.10 wants zero
            # padding, so the stored bytes cannot be the codes: add them with the padding cleared.
            # The logical name stays the runtime's, so the source tensor of that name must go.
            def cleared(w: str = w) -> np.ndarray:
                b = np.array(ck.array(w)).reshape(-1).view(np.uint8).copy()
                b[-1] &= 0xF0
                return b

            codes_name = out.add(f"{w}.qformat_codes", lazy("U8", (nbytes,), cleared))  # made when written
            packing = {"container": 8, "bit_order": "msb_first", "axis": None}
            out.dropped.add(w)
        desc: dict[str, Any] = {
            "shape": shape, "dtype": qs["dtype"],
            "codes": {"tensor": codes_name, "element": {"type": "codebook", "bits": 4, "table": NAMED[qt]}, "packing": packing},
        }
        if qt == "nf4":
            desc["scheme"] = "nf4"
        blocks = {"type": "flat", "size": bs}
        am = f"{w}.absmax"
        if not qs["nested"]:
            i = ck.require(am, ["F32", "F16", "BF16"])
            if math.prod(i.shape) != nb:
                raise source_error(f"has {math.prod(i.shape)} values, expected one per block of {bs}: ceil({n}/{bs}) = {nb}", tensor=am)
            desc["scale"] = {"blocks": blocks, "op": "multiply", "tensor": am}
        else:
            i = ck.require(am, ["U8"])
            if list(i.shape) != [nb]:
                raise source_error(f"shape is {list(i.shape)}, expected [{nb}]: one 8-bit code per block of {bs} (double quantization)", tensor=am)
            nqm, nam = f"{w}.nested_quant_map", f"{w}.nested_absmax"
            i = ck.require(nqm, ["F32"])
            if list(i.shape) != [256]:
                raise source_error(f"shape is {list(i.shape)}, expected [256]", tensor=nqm)
            nnb = -(-nb // qs["nested_blocksize"])
            i = ck.require(nam, ["F32"])
            if math.prod(i.shape) != nnb:
                raise source_error(f"has {math.prod(i.shape)} values, expected ceil({nb}/{qs['nested_blocksize']}) = {nnb}", tensor=nam)
            off = out.add(f"{w}.nested_offset", np.asarray(qs["nested_offset"], np.float32).reshape(()))
            desc["scale"] = {"blocks": blocks, "op": "multiply", "encoded": {
                "shape": [nb], "dtype": "float32",
                "codes": {"tensor": am, "element": {"type": "codebook", "bits": 8, "table_tensor": nqm},
                          "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
                "scale": {"blocks": {"type": "flat", "size": qs["nested_blocksize"]}, "op": "multiply", "tensor": nam},
                "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": off}}}
        out.descriptors[w] = desc
