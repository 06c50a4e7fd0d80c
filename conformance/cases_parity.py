"""Corpus cases of spec 1.2's safetensors parity (issue 28): every file safetensors' writer
produces and its reader accepts reads in qformat (SPEC.md §2.3, §2.4, §2.6), and empty tensors of
any valid shape either load or are refused with SHAPE_UNREPRESENTABLE (§2.2).

Built like the other case modules: bytes by conformance/build.py, expected outputs by
conformance/spec_reference.py; case ids are stable.  They replace the 1.1 cases that refused
leading whitespace, tab and line-feed padding, an empty tensor name, rank 17 and plain F4/F6
tensors (malformed-leading-whitespace-*, malformed-header-tab-padding,
malformed-header-newline-padding, malformed-empty-tensor-name, malformed-entry-rank-17,
invalid-shape-rank-17, invalid-plain-dtype-f4, invalid-plain-dtype-f6), whose ids are retired.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from . import spec_reference as R
from .build import Built, case, failing, header_entries, q_file, qformat_json, raw_file, valid
from .cases_errors import M, base, header_parts, htext, setf

P = ["container", "parity"]
#: a plain F4 tensor whose last axis is odd: torch holds F4 values only in pairs along the last axis
#: (float4_e2m1fn_x2), so a torch reader refuses it as safetensors' own torch binding does; such a
#: reader runs the corpus with --skip-feature plain:f4-odd
F4_ODD = "plain:f4-odd"
MAX_RANK = 64  # SPEC.md §15, transcribed


def _base_parts(rng: np.random.Generator) -> tuple[Any, Any, Any, dict[str, Any], bytes]:
    """(descriptors, components, plain tensors, header object, data buffer) of the base file."""
    descs, comps, plain = base(rng)
    entries, data = header_entries({**comps, **plain})
    return descs, comps, plain, {"__metadata__": {"qformat": qformat_json(descs)}, **entries}, data


for _name, _ws in (("space", " "), ("newline", "\n"), ("tab", "\t"), ("carriage-return", "\r"), ("mixed", " \r\n\t")):
    @case(f"parity-leading-whitespace-{_name}",
          f"the header begins with JSON whitespace ({_name}) before '{{', as safetensors reads it: read the file "
          "(check --strict reports HEADER_LEADING_WHITESPACE)", ["2.3", "2.4"], P)
    def _(rng, ws=_ws):
        descs, comps, plain, header, data = _base_parts(rng)
        return valid(descs, comps, plain, file_bytes=raw_file(ws + htext(header), data))


def _padded(text: str, pad: str) -> bytes:
    t = text.encode("utf-8") + pad.encode("ascii")
    return t + b" " * (-len(t) % 8)


for _name, _pad in (("tab", "\t\t\t"), ("newline", "\n"), ("crlf", "\r\n"), ("mixed", " \t \n")):
    @case(f"parity-header-padding-{_name}",
          f"the header object is followed by {_name} padding (JSON whitespace, not only spaces), as safetensors reads it: "
          "read the file (check --strict reports HEADER_PADDING_NOT_SPACE)", ["2.1", "2.3", "2.4"], P)
    def _(rng, pad=_pad):
        descs, comps, plain, header, data = _base_parts(rng)
        return valid(descs, comps, plain, file_bytes=raw_file(_padded(htext(header), pad), data, pad=False))


@case("parity-empty-tensor-name", "the plain F32 tensor is named '' (safetensors' save_file writes it and its reader reads it): "
      "read it under the name '' (check --strict reports TENSOR_NAME_INVALID)", ["2.3", "2.4"], P)
def _(rng):
    descs, comps, plain = base(rng)
    plain = {("" if k == "b" else k): v for k, v in plain.items()}
    return valid(descs, comps, plain)


@case("parity-plain-rank-64", f"a plain U8 tensor of rank {MAX_RANK} (sixty-three 1s and 3), max_rank: read it", ["2.3", "15"], P)
def _(rng):
    descs, comps, plain = base(rng)
    plain["r"] = rng.integers(0, 256, size=(1,) * (MAX_RANK - 1) + (3,)).astype(np.uint8)
    return valid(descs, comps, plain)


@case("malformed-entry-rank-65", f"the plain tensor 'b' has rank {MAX_RANK + 1} (sixty-four 1s and 3), above max_rank {MAX_RANK}: "
      "refuse the whole file with TENSOR_ENTRY_INVALID", ["2.3", "4.3", "15"], P)
def _(rng):
    header, data, _ = header_parts(rng)
    header["b"]["shape"] = [1] * MAX_RANK + [3]
    return failing(raw_file(header, data), "TENSOR_ENTRY_INVALID")


@case("invalid-shape-rank-65", f"the logical shape has {MAX_RANK + 1} entries (above max_rank {MAX_RANK}): refuse 'w' with SHAPE_INVALID",
      ["5.2", "5.5", "15"], ["descriptor", "parity"])
def _(rng):
    return M(rng, "SHAPE_INVALID", setf("shape", [1] * (MAX_RANK - 1) + [3, 7]))


@case("parity-plain-f4", "a plain F4 tensor [2, 4] as torch's float4_e2m1fn_x2 and safetensors write it (bytes 21 43 65 87): "
      "read 8 e2m1fn values, element 2k in the low nibble of byte k (0.5, 1, 1.5, 2, 3, 4, 6, -0)", ["2.5", "2.6"], P)
def _(rng):
    raw = bytes([0x21, 0x43, 0x65, 0x87])
    return _with_plain(rng, "f4", ("F4", [2, 4], raw), R.plain_f4(raw, [2, 4]))


@case("parity-plain-f4-odd-axis", "a plain F4 tensor [2, 3] (6 values in 3 bytes, a row ends mid-byte): read 6 e2m1fn values in "
      "row-major order across the byte boundary", ["2.5", "2.6"], P + [F4_ODD])
def _(rng):
    raw = bytes(rng.integers(0, 256, size=3).astype(np.uint8))
    return _with_plain(rng, "f4", ("F4", [2, 3], raw), R.plain_f4(raw, [2, 3]))


for _dt6 in ("F6_E2M3", "F6_E3M2"):
    @case(f"parity-plain-{_dt6.lower().replace('_', '-')}", f"a plain {_dt6} tensor of 4 elements (3 bytes; no framework has the "
          "type and safetensors leaves the bit order open): read its raw bytes, a 1-D U8 array of 3", ["2.5", "2.6"], P)
    def _(rng, dt=_dt6):
        raw = bytes([0x41, 0x10, 0x0C])
        return _with_plain(rng, "f6", (dt, [4], raw), R.plain_f6(raw))


@case("parity-plain-f8-e8m0", "a plain F8_E8M0 tensor (torch float8_e8m0fnu, the MXFP4 scale type) with 2^0, 2^1, 2^-127 and NaN: "
      "read it as ml_dtypes float8_e8m0fnu", ["2.5"], P)
def _(rng):
    raw = bytes([127, 128, 0, 255])
    return _with_plain(rng, "e", ("F8_E8M0", [4], raw), np.frombuffer(raw, ml_dtypes.float8_e8m0fnu).copy())


def _with_plain(rng: np.random.Generator, name: str, stored: tuple[str, list[int], bytes], expect: np.ndarray) -> Built:
    descs, comps, plain = base(rng)
    b = valid(descs, comps, plain, file_bytes=q_file(descs, comps, {**plain, name: stored}))
    b.expected[name] = expect
    return b


def _empty_file(dtype: str, shape: list[int]) -> bytes:
    header = {"z": {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}}
    return raw_file(header)


for _cid, _dt, _shape, _itemsize in (("u8-huge-first", "U8", [2**63 - 1, 0], 1), ("u8-three-axes", "U8", [2**40, 0, 2**20], 1),
                                     ("f32-under-limit", "F32", [0, 2**30, 2**30], 4), ("f4", "F4", [2**61, 0, 3], 1)):
    @case(f"parity-empty-{_cid}", f"a plain {_dt} tensor of shape {_shape} (no element; {_itemsize}-byte elements times the "
          "non-zero entries stay below 2^63): read an empty array of that shape", ["2.2", "2.6"],
          P + ["shape:zero-size"] + ([F4_ODD] if _dt == "F4" and _shape[-1] % 2 else []))
    def _(rng, dt=_dt, shape=_shape, itemsize=_itemsize):
        assert R.empty_representable(shape, itemsize)
        npdt = {"U8": np.uint8, "F32": np.float32, "F4": ml_dtypes.float4_e2m1fn}[dt]
        exp = np.lib.stride_tricks.as_strided(np.zeros(0, npdt), shape=shape, strides=[0] * len(shape))
        return Built({"input.safetensors": _empty_file(dt, shape)}, "input.safetensors", "valid", None, {"z": exp}, [], [])


for _cid, _dt, _shape, _itemsize in (("f32-2-40-2-40", "F32", [0, 2**40, 2**40], 4), ("u8-2-64-1", "U8", [0, 2**64 - 1], 1),
                                     ("f32-2-63-1", "F32", [2**63 - 1, 0], 4), ("f16-2-62-3", "F16", [2**62, 0, 3], 2)):
    @case(f"unsupported-empty-shape-{_cid}", f"a plain {_dt} tensor of shape {_shape}: valid and empty, but {_itemsize}-byte elements "
          "times its non-zero entries reach 2^63, so no array holds it: refuse it with SHAPE_UNREPRESENTABLE (check reports it too)",
          ["2.2"], P + ["shape:zero-size"])
    def _(rng, dt=_dt, shape=_shape, itemsize=_itemsize):
        assert not R.empty_representable(shape, itemsize)
        return failing(_empty_file(dt, shape), "SHAPE_UNREPRESENTABLE")


@case("parity-metadata-null", "__metadata__ is null (what mx.save_safetensors writes; safetensors reads it as no metadata) and "
      "the file holds one plain U8 tensor: read it (check --strict reports METADATA_INVALID)", ["2.3", "2.4"], P)
def _(rng):
    a = rng.integers(0, 256, size=(2, 3)).astype(np.uint8)
    data = raw_file('{"__metadata__":null,"t":{"dtype":"U8","shape":[2,3],"data_offsets":[0,6]}}', a.tobytes())
    return Built({"input.safetensors": data}, "input.safetensors", "valid", None, {"t": a}, [], [])
