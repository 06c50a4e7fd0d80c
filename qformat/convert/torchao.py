"""Source ``torchao``: safetensors written by torchao 0.18's ``flatten_tensor_state_dict``
(torchao/prototype/safetensors/safetensors_support.py; also what transformers saves for a
torchao-quantized model).

A tensor subclass ``M.p`` is flattened into stored tensors ``M._p_FIELD`` (one per inner tensor
listed in ``_tensor_data_names``) and one ``__metadata__`` member ``M.p`` holding JSON
``{"_type": CLASS, "_data": {constructor attributes}, "_tensor_data_names": [...]}``;
``__metadata__["tensor_names"]`` lists every ``M.p`` (plain tensors have ``{"_type": "Tensor"}``).
The metadata is parsed as strict JSON (never evaluated, never deserialized as objects) and only the classes below
are accepted; any other class is ``CONVERT_UNSUPPORTED``.

Decoding, per class (torchao's ``dequantize()``; mapping/torchao.md gives the descriptors):

- ``IntxUnpackedToInt8Tensor`` / ``Int8Tensor``: ``(q.to(dt) - zero_point.to(dt)) * scale``
  per block (quant_primitives ``_dequantize_affine_no_dtype_check``), ``q`` int8 in ``I8``.
- ``Float8Tensor``: ``(qdata.to(float32) * scale).to(dt)`` (``_dequantize_affine_float8``).
- ``Int4Tensor`` (mslk ``int4_row_quantize_zp`` + ``pack_int4``; no CPU dequantize in torchao):
  element ``2k`` of a row in the low nibble of byte ``k`` as a two's complement int4 ``v``,
  ``w = v * scale + zero_point`` with scale and zero point stored ``[..., K/gs, N]``.
- ``NF4Tensor`` (torchao cannot save it; this converter defines its on-disk form the same way,
  see mapping/torchao.md): ``w = nf4[code] * ((q / factor).to(dt) + mean)`` in ``dt``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import Checkpoint, Converter, Described, parse_json_text, source_error, unsupported

_FLOAT = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_LOGICAL = {"float32", "float16", "bfloat16"}
#: Each supported class: its attributes (``_data`` members) and inner tensors (required, optional).
#: Inner tensors and attributes that concern activations or kernels only (``act_pre_scale``,
#: ``act_quant_*``, ``mm_config``, ``kernel_preference``) leave the weight's values unchanged.
CLASSES: dict[str, tuple[set[str], set[str], set[str]]] = {
    "Int4Tensor": ({"block_size", "shape", "activation_dtype"}, {"qdata", "scale", "zero_point"}, {"act_pre_scale"}),
    "IntxUnpackedToInt8Tensor": ({"target_dtype", "block_size", "dtype", "activation_quantization"}, {"qdata", "scale", "zero_point"}, set()),
    "Int8Tensor": ({"block_size", "dtype", "act_quant_kwargs", "reduce_range"}, {"qdata", "scale"},
                   {"zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale"}),
    "Float8Tensor": ({"block_size", "mm_config", "act_quant_kwargs", "kernel_preference", "dtype"}, {"qdata", "scale"}, set()),
    "NF4Tensor": ({"block_size", "n_blocks", "scaler_block_size", "shape", "dtype"},
                  {"quantized_data", "scaler_mean", "quantization_factor", "quantized_scalers", "nf4"}, set()),
}
#: Classes torchao can save that this converter refuses, with the reason.
REFUSED = {
    "Int4TilePackedTo4dTensor": "the tinygemm tile layout (SPEC §11.5 forbids tinygemm_int4_cpu; the CUDA tiling is not described)",
    "Int4PlainInt32Tensor": "int32-packed int4 for XPU/NPU kernels",
    "Int4PreshuffledTensor": "the preshuffled mslk layout",
    "IntxOpaqueTensor": "an opaque kernel-specific layout",
    "MXTensor": "torchao.prototype MX tensors",
    "NVFP4Tensor": "torchao.prototype NVFP4 tensors",
}
_INTX = {f"int{b}": b for b in range(1, 9)}
_MAX_NAMES = 1 << 20


class _Meta:
    """One parsed ``__metadata__`` entry: class name, attributes and inner tensor names."""

    def __init__(self, name: str, raw: Any):
        self.name = name
        if not isinstance(raw, dict) or not isinstance(raw.get("_type"), str):
            raise source_error(f"metadata entry {name!r} is not an object with a string '_type'", field=name)
        self.type: str = raw["_type"]
        self.data: dict[str, Any] = {}
        self.fields: list[str] = []
        if self.type == "Tensor":
            return
        if self.type in REFUSED:
            raise unsupported(f"{name} is a torchao {self.type}: {REFUSED[self.type]}", tensor=name, field=name)
        if self.type not in CLASSES:
            raise unsupported(f"{name} has class {self.type!r}, which is not one of the supported torchao classes "
                              f"{sorted(CLASSES)} (nor a plain 'Tensor')", tensor=name, field=name)
        extra = sorted(set(raw) - {"_type", "_data", "_tensor_data_names"})
        if extra:
            raise unsupported(f"metadata entry {name!r} has members {extra} this converter does not know", tensor=name, field=name)
        data, fields = raw.get("_data"), raw.get("_tensor_data_names")
        if not isinstance(data, dict):
            raise source_error(f"metadata entry {name!r} has no '_data' object", tensor=name, field=f"{name}._data")
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields) or len(set(fields)) != len(fields):
            raise source_error(f"metadata entry {name!r} has no '_tensor_data_names' list of distinct strings", tensor=name, field=f"{name}._tensor_data_names")
        attrs, required, optional = CLASSES[self.type]
        unknown = sorted(set(data) - attrs)
        if unknown:
            raise unsupported(f"{self.type} {name} has attributes {unknown} this converter does not know (known: {sorted(attrs)})",
                              tensor=name, field=f"{name}._data")
        missing = sorted(required - set(fields))
        if missing or set(fields) - required - optional:
            raise source_error(f"{self.type} {name} lists inner tensors {fields}; expected {sorted(required)} and optionally "
                               f"{sorted(optional)}", tensor=name, field=f"{name}._tensor_data_names")
        self.data, self.fields = data, fields

    def dtype(self, key: str) -> str:
        v = self.data.get(key)
        if not (isinstance(v, dict) and v.get("_type") == "torch.dtype" and isinstance(v.get("_data"), str) and set(v) == {"_type", "_data"}):
            raise source_error(f"{self.type} {self.name}: {key} is {v!r}, expected {{'_type': 'torch.dtype', '_data': NAME}}",
                               tensor=self.name, field=f"{self.name}._data.{key}")
        return v["_data"]

    def ints(self, key: str, rank: int | None = None) -> list[int]:
        v = self.data.get(key)
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 2**53 - 1 for x in v) \
                or (rank is not None and len(v) != rank) or len(v) > 8:
            want = f"a list of {rank} non-negative integers" if rank is not None else "a list of non-negative integers"
            raise source_error(f"{self.type} {self.name}: {key} is {v!r}, expected {want}", tensor=self.name, field=f"{self.name}._data.{key}")
        return list(v)

    def integer(self, key: str) -> int:
        v = self.data.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise source_error(f"{self.type} {self.name}: {key} is {v!r}, expected a positive integer", tensor=self.name, field=f"{self.name}._data.{key}")
        return v


def _entries(ck: Checkpoint) -> list[tuple[str, _Meta]]:
    """Every (file, parsed entry) named by a ``tensor_names`` member, strictly validated."""
    out = []
    seen: dict[str, str] = {}  # a sharded save may repeat an entry in every shard's metadata
    for f in ck.files:
        md = ck.metadata(f)
        if "tensor_names" not in md:
            continue
        names = parse_json_text(md["tensor_names"], f"{f}: __metadata__ tensor_names", field="tensor_names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > _MAX_NAMES:
            raise source_error(f"{f}: __metadata__ tensor_names is not a list of strings", field="tensor_names")
        for n in names:
            if n not in md:
                raise source_error(f"{f}: tensor_names lists {n!r}, but __metadata__ has no entry of that name", field=n)
            if n in seen:
                if seen[n] != md[n]:
                    raise source_error(f"{f}: the metadata of {n!r} differs from another shard's", field=n)
                continue
            seen[n] = md[n]
            out.append((f, _Meta(n, parse_json_text(md[n], f"{f}: __metadata__[{n!r}]", tensor=n, field=n))))
    return out


def _is_torchao(ck: Checkpoint) -> bool:
    for f in ck.files:
        md = ck.metadata(f)
        if "tensor_names" in md and any(isinstance(v, str) and v.startswith('{"_type"') for k, v in md.items() if k != "tensor_names"):
            return True
    return False


class TorchAO(Converter):
    name = "torchao"
    title = "torchao safetensors (Int4Tensor, IntxUnpackedToInt8Tensor, Int8Tensor, Float8Tensor, NF4Tensor)"
    priority = 40

    def detect(self, ck: Checkpoint) -> bool:
        if ck.kind != "safetensors":
            return False
        if _is_torchao(ck):
            return True
        qc = ck.quantization_config()
        return isinstance(qc, dict) and qc.get("quant_method") == "torchao"

    def describe(self, ck: Checkpoint) -> Described:
        entries = _entries(ck)
        if not entries:
            raise source_error("no safetensors file has torchao's __metadata__ 'tensor_names' (flatten_tensor_state_dict); "
                               "older torchao checkpoints are pickled .bin files, which are not read")
        out = Described()
        for _f, m in entries:
            if m.type == "Tensor":
                continue
            if "." not in m.name:
                raise source_error(f"{m.name!r} has no '.': torchao names a subclass tensor MODULE.PARAM", tensor=m.name)
            module, param = m.name.rsplit(".", 1)
            t = {fld: f"{module}._{param}_{fld}" for fld in m.fields}
            for fld, stored in t.items():
                if stored not in ck:
                    raise source_error(f"{m.type} {m.name} lists inner tensor {fld!r}, but the checkpoint has no tensor {stored!r}", tensor=stored)
            if m.name in ck:
                raise source_error(f"{m.name} is both a stored tensor and a torchao {m.type}", tensor=m.name)
            getattr(self, "_" + m.type.lower())(ck, out, m, t)
        return out

    # -- affine integers --------------------------------------------------------------------
    def _affine(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str], zero_required: bool) -> None:
        qi = ck.require(t["qdata"], ["I8"])
        shape = list(qi.shape)
        dt = m.dtype("dtype")
        if dt not in _LOGICAL:
            raise unsupported(f"{m.type} {m.name}: dtype {dt!r}, expected one of {sorted(_LOGICAL)}", tensor=m.name)
        if m.type == "IntxUnpackedToInt8Tensor" and m.dtype("target_dtype") not in _INTX:
            raise unsupported(f"{m.name}: target_dtype {m.dtype('target_dtype')!r}, expected int1..int8", tensor=m.name)
        bs = m.ints("block_size", len(shape))
        if any(b < 1 or s % b for b, s in zip(bs, shape)):
            raise source_error(f"{m.type} {m.name}: block_size {bs} does not divide the shape {shape}", tensor=m.name)
        grid = [s // b for s, b in zip(shape, bs)]
        si = ck.require(t["scale"], list(_FLOAT))
        if math.prod(si.shape) != math.prod(grid):
            raise source_error(f"has {math.prod(si.shape)} values, expected one per block {bs} of {shape}: {grid}", tensor=t["scale"])
        blocks = {"type": "grid", "size": bs}
        desc: dict[str, Any] = {"shape": shape, "dtype": dt,
                                "codes": {"tensor": t["qdata"], "element": {"type": "int", "bits": 8, "signedness": "twos_complement"},
                                          "packing": {"container": 8, "bit_order": "lsb_first", "axis": len(shape) - 1 if shape else None}}}
        if "zero_point" in t:
            zi = ck.require(t["zero_point"], ["I8", *_FLOAT])
            if math.prod(zi.shape) != math.prod(grid):
                raise source_error(f"has {math.prod(zi.shape)} values, expected the scale's {math.prod(grid)}", tensor=t["zero_point"])
            if zi.dtype != "I8" and dt != "float32":
                # torchao subtracts in dt: exact (as qformat's binary32) only for small integers.
                z = np.asarray(ck.array(t["zero_point"]), np.float64)
                if not (np.array_equal(z, np.round(z)) and np.abs(z).max(initial=0) <= 128):
                    raise unsupported(f"a float zero point that is not an integer in [-128, 128]: torchao computes q - zero_point "
                                      f"in {dt}, rounding where SPEC §10 does not", tensor=t["zero_point"])
            desc["zero"] = {"blocks": blocks, "tensor": t["zero_point"]}
        elif zero_required:
            raise source_error(f"{m.type} {m.name} has no zero_point", tensor=m.name)
        desc["scale"] = {"blocks": blocks, "op": "multiply", "tensor": t["scale"]}
        desc["scheme"] = "int"
        out.descriptors[m.name] = desc

    def _intxunpackedtoint8tensor(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str]) -> None:
        self._affine(ck, out, m, t, zero_required=True)

    def _int8tensor(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str]) -> None:
        self._affine(ck, out, m, t, zero_required=False)

    # -- float8 -----------------------------------------------------------------------------
    def _float8tensor(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str]) -> None:
        qi = ck.require(t["qdata"], ["F8_E4M3", "F8_E5M2"])
        shape = list(qi.shape)
        dt = m.dtype("dtype")
        if dt not in _LOGICAL:
            raise unsupported(f"Float8Tensor {m.name}: dtype {dt!r}, expected one of {sorted(_LOGICAL)}", tensor=m.name)
        si = ck.require(t["scale"], list(_FLOAT))
        # torchao expands the scale by the ratio of the shapes (_maybe_expand_scale_to_tensor_shape).
        if math.prod(si.shape) == 1:
            size: list[int | None] = [None] * len(shape)
        elif len(si.shape) == len(shape) and all(g >= 1 and s % g == 0 for g, s in zip(si.shape, shape)):
            size = [None if g == 1 else s // g for g, s in zip(si.shape, shape)]
        else:
            raise source_error(f"shape is {list(si.shape)}, expected one scale, or a shape whose entries divide the weight's {shape}", tensor=t["scale"])
        fmt = "e4m3fn" if qi.dtype == "F8_E4M3" else "e5m2"
        out.descriptors[m.name] = {
            "shape": shape, "dtype": dt, "scheme": f"fp8_{fmt[:4]}",
            "codes": {"tensor": t["qdata"], "element": {"type": "float", "format": fmt},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": len(shape) - 1 if shape else None}},
            "scale": {"blocks": {"type": "grid", "size": size}, "op": "multiply", "tensor": t["scale"]}}

    # -- int4 -------------------------------------------------------------------------------
    def _int4tensor(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str]) -> None:
        shape = m.ints("shape")
        r = len(shape)
        if r not in (2, 3):
            raise unsupported(f"Int4Tensor {m.name}: shape {shape}; only 2-D and 3-D weights are known", tensor=m.name)
        n, k = shape[-2], shape[-1]
        bs = m.ints("block_size", r)
        gs = bs[-1]
        if any(b != 1 for b in bs[:-1]) or gs < 1:
            raise source_error(f"Int4Tensor {m.name}: block_size {bs}, expected [1, ..., group_size]", tensor=m.name)
        if k % 2:
            raise source_error(f"Int4Tensor {m.name}: K = {k} is odd; pack_int4 packs pairs", tensor=m.name)
        qi = ck.require(t["qdata"], ["I8", "U8"])
        if list(qi.shape) != shape[:-1] + [k // 2]:
            raise source_error(f"shape is {list(qi.shape)}, expected {shape[:-1] + [k // 2]} (two int4 per byte along K)", tensor=t["qdata"])
        ng = -(-k // gs)
        want = shape[:-2] + [ng, n]
        si = ck.require(t["scale"], list(_FLOAT))
        zi = ck.require(t["zero_point"], [si.dtype])
        for name, i in ((t["scale"], si), (t["zero_point"], zi)):
            if list(i.shape) != want:
                raise source_error(f"shape is {list(i.shape)}, expected {want} ([..., K/group_size, N])", tensor=name)
        blocks = {"type": "grid", "size": [1] * (r - 1) + [gs]}
        order = list(range(r - 2)) + [r - 1, r - 2]
        out.descriptors[m.name] = {
            "shape": shape, "dtype": _FLOAT[si.dtype], "scheme": "int",
            "codes": {"tensor": t["qdata"], "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": r - 1}},
            "scale": {"blocks": blocks, "op": "multiply", "tensor": t["scale"], "order": order},
            "bias": {"blocks": blocks, "op": "add", "tensor": t["zero_point"], "order": order}}

    # -- nf4 --------------------------------------------------------------------------------
    def _nf4tensor(self, ck: Checkpoint, out: Described, m: _Meta, t: dict[str, str]) -> None:
        shape = m.ints("shape")
        dt = m.dtype("dtype")
        if dt not in _LOGICAL:
            raise unsupported(f"NF4Tensor {m.name}: dtype {dt!r}, expected one of {sorted(_LOGICAL)}", tensor=m.name)
        st = {v: k for k, v in _FLOAT.items()}[dt]
        bs, nb, sbs = m.integer("block_size"), m.integer("n_blocks"), m.integer("scaler_block_size")
        numel = math.prod(shape)
        if numel % bs or numel // bs != nb or nb % sbs or numel % 2:
            raise source_error(f"NF4Tensor {m.name}: shape {shape} ({numel} elements), block_size {bs}, n_blocks {nb} and "
                               f"scaler_block_size {sbs} disagree (need numel = n_blocks * block_size, even, and n_blocks a multiple "
                               f"of scaler_block_size)", tensor=m.name)
        expect = {"quantized_data": (["U8"], [numel // 2]), "quantized_scalers": (["I8"], [nb]),
                  "quantization_factor": ([st], [nb // sbs]), "scaler_mean": ([st], []), "nf4": ([st], [16])}
        for fld, (dts, shp) in expect.items():
            i = ck.require(t[fld], dts)
            if math.prod(i.shape) != math.prod(shp) or len(i.shape) > max(1, len(shp)):
                raise source_error(f"shape is {list(i.shape)}, expected {shp}", tensor=t[fld])
        factor = np.asarray(ck.array(t["quantization_factor"]), np.float32)
        # E2 = (q / factor) rounded to dt (torchao's division in dt); E1 = (1 * E2 + mean) rounded
        # to dt (its "+ scaler_mean" in dt); w = nf4[code] * E1 rounded to dt.  The constant 1 is
        # a 1-bit code with code_offset 1 over an added all-zero tensor.
        one = out.add(f"{m.name}.qformat_one", np.zeros(-(-nb // 8), np.uint8))
        e2: dict[str, Any] = {
            "shape": [nb], "dtype": dt,
            "codes": {"tensor": t["quantized_scalers"], "element": {"type": "int", "bits": 8, "signedness": "twos_complement"},
                      "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
            "scale": {"blocks": {"type": "grid", "size": [sbs]}, "op": "divide", "tensor": t["quantization_factor"]}}
        if not np.isfinite(factor).all():
            e2["allow_nonfinite_params"] = True  # a scaler block of equal absmax values: factor 256/0 = Inf
        e1 = {"shape": [nb], "dtype": dt,
              "codes": {"tensor": one, "element": {"type": "int", "bits": 1, "signedness": "unsigned", "code_offset": 1},
                        "packing": {"container": 8, "bit_order": "lsb_first", "axis": 0}},
              "scale": {"blocks": {"type": "grid", "size": [1]}, "op": "multiply", "encoded": e2},
              "bias": {"blocks": {"type": "grid", "size": [None]}, "op": "add", "tensor": t["scaler_mean"]}}
        out.descriptors[m.name] = {
            "shape": shape, "dtype": dt, "scheme": "nf4",
            "codes": {"tensor": t["quantized_data"], "element": {"type": "codebook", "bits": 4, "table_tensor": t["nf4"]},
                      "packing": {"container": 8, "bit_order": "msb_first", "axis": None}},
            "scale": {"blocks": {"type": "flat", "size": bs}, "op": "multiply", "encoded": e1}}
