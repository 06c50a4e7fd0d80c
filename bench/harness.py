"""The benchmark: ``python -m bench`` (full run, minutes) or ``python -m bench --quick`` (seconds).

Every row is the median of ``--reps`` timed repetitions after one warm-up, on data built in
this run, next to a NumPy memcpy (``np.copyto`` into a preallocated array) of the row's
output size measured in the same run: ``x memcpy`` is memcpy's time over the row's time (1.0 =
as fast as copying the output).  Comparisons with other libraries (gguf-py, bitsandbytes,
torchao, safetensors) decode the same values; the harness checks that the outputs are equal
bit for bit before timing them.  Targets (issue point 2) are evaluated on these ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import qformat
from qformat import decode as qdecode
from qformat.descriptor import parse_descriptor
from qformat.sources import ArraySource

from .common import MB, Run, _ckpt_children, _copy_seconds, _require, _same_bits, _tree_bytes, drop_cache


def _torch_np(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


# -- synthetic quantized tensors (decode speed does not depend on the values) -------------------
def _pk(axis: int = 1) -> dict[str, Any]:
    return {"container": 8, "bit_order": "lsb_first", "axis": axis}


def _scales(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.float16) -> np.ndarray:
    return (rng.random(shape, np.float32) * 0.02 + 1e-3).astype(dtype)


def make_case(kind: str, rows: int, cols: int, rng: np.random.Generator, dtype: str = "float32") -> qformat.QTensor:
    """A quantized tensor of one scheme with random codes and realistic parameters."""
    import ml_dtypes

    def nib() -> np.ndarray:
        return rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)

    g = -(-cols // 32)
    if kind.startswith("int4"):
        gs = 32 if "g32" in kind else 128
        ng = -(-cols // gs)
        sym = "asym" not in kind
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement" if sym else "unsigned"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, gs]}, "op": "multiply", "tensor": "scale"}}
        comps = {"codes": nib(), "scale": _scales(rng, (rows, ng))}
        if not sym:
            d["zero"] = {"blocks": {"type": "grid", "size": [1, gs]}, "tensor": "zero"}
            comps["zero"] = rng.integers(0, 16, (rows, ng), dtype=np.uint8)
        return qformat.QTensor(d, comps)
    if kind == "int8 g32":
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "int", "bits": 8, "signedness": "twos_complement"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
        return qformat.QTensor(d, {"codes": rng.integers(-128, 128, (rows, cols), dtype=np.int8), "scale": _scales(rng, (rows, g))})
    if kind == "nf4 b64":
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "codebook", "bits": 4, "table": "nf4"}, "packing": _pk()},
             "scale": {"blocks": {"type": "flat", "size": 64}, "op": "multiply", "tensor": "scale"}}
        return qformat.QTensor(d, {"codes": nib(), "scale": _scales(rng, (rows * cols // 64,), np.float32)})
    if kind == "mxfp4":
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "float", "format": "e2m1fn"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
        e = rng.integers(117, 130, (rows, g), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
        return qformat.QTensor(d, {"codes": nib(), "scale": e})
    if kind == "nvfp4":
        g16 = cols // 16
        sc = rng.integers(0x20, 0x60, (rows, g16), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "float", "format": "e2m1fn"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, 16]}, "op": "multiply",
                       "encoded": {"shape": [rows, g16], "dtype": "float32",
                                   "codes": {"tensor": "scale.codes", "element": {"type": "float", "format": "e4m3fn"}, "packing": _pk()},
                                   "scale": {"blocks": {"type": "grid", "size": [None, None]}, "op": "multiply", "tensor": "scale.scale"}}}}
        return qformat.QTensor(d, {"codes": nib(), "scale.codes": sc, "scale.scale": np.array(0.0123, np.float32)})
    if kind == "fp8 e4m3 per-row":
        c = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        c[(c & 0x7F) == 0x7F] = 0x30  # no NaN codes
        d = {"shape": [rows, cols], "dtype": dtype,
             "codes": {"tensor": "codes", "element": {"type": "float", "format": "e4m3fn"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, None]}, "op": "multiply", "tensor": "scale"}}
        return qformat.QTensor(d, {"codes": c.view(ml_dtypes.float8_e4m3fn), "scale": _scales(rng, (rows, 1), np.float32)})
    raise KeyError(kind)


DECODE_KINDS = ["int4 g32 sym", "int4 g128 sym", "int4 g32 asym", "int4 g128 asym", "int8 g32", "nf4 b64", "mxfp4", "nvfp4", "fp8 e4m3 per-row"]


def _parsed(q: qformat.QTensor) -> tuple[Any, ArraySource]:
    return parse_descriptor("w", q.descriptor), ArraySource(q.components)


# -- sections -------------------------------------------------------------------------------
def bench_decode(run: Run, rows: int, cols: int) -> None:
    """qformat NumPy (1 and 2 threads), torch CPU and JAX jit decode of each scheme to fp32."""
    import jax
    import torch
    from qformat_jax import decode_on_host
    from qformat_jax.decode import descriptor_json, f32_path_chosen, jitted
    from qformat_torch.decode import decode as tdecode
    from qformat_torch.qtensor import TorchQTensor
    from qformat_torch.sources import TensorSource

    rng = np.random.default_rng(0)
    nbytes = rows * cols * 4
    print(f"\n[decode] {rows}x{cols} -> float32 ({nbytes / MB:.0f} MB); memcpy {nbytes / run.memcpy(nbytes) / 1e9:.2f} GB/s", flush=True)
    for kind in (["int4 g32 asym", "nvfp4"] if run.quick else DECODE_KINDS):
        q = make_case(kind, rows, cols, rng)
        desc, src = _parsed(q)
        out = np.empty((rows, cols), np.float32)
        ref = qdecode.decode(desc, src, out=np.empty_like(out), threads=1)
        sec = f"decode {kind}"
        print(f" {kind}", flush=True)
        run.row(sec, "qformat numpy, 1 thread", run.time(lambda: qdecode.decode(desc, src, out=out, threads=1)), nbytes)
        run.row(sec, "qformat numpy, 2 threads", run.time(lambda: qdecode.decode(desc, src, out=out, threads=2)), nbytes)
        run.row(sec, "qformat numpy, 2 threads, fresh output", run.time(lambda: qdecode.decode(desc, src, threads=2)), nbytes,
                note="a new output array per call, as load_file (its page faults included)")
        tq = TorchQTensor.from_qtensor(q)
        tsrc = TensorSource(tq.components)
        _require(_same_bits(_torch_np(tdecode(desc, tsrc)), ref), f"torch decode of {kind}")
        tout = torch.empty((rows, cols), dtype=torch.float32)
        threads0 = torch.get_num_threads()
        for th in (1, 2):  # into a preallocated output, as the NumPy rows and memcpy
            torch.set_num_threads(th)
            try:
                run.row(sec, f"qformat torch CPU, {th} thread{'s' if th > 1 else ''}", run.time(lambda: tdecode(desc, tsrc, out=tout)), nbytes)
            finally:
                torch.set_num_threads(threads0)
        _require(_same_bits(tout.numpy(), ref), f"torch decode of {kind} into out")
        fn = jitted(descriptor_json(desc))
        comps = {k: jax.device_put(v) for k, v in q.components.items()}
        _require(_same_bits(np.asarray(fn(comps)[0]), ref), f"jax decode of {kind}")
        f32 = f32_path_chosen(desc, comps)
        run.row(sec, "qformat jax jit (exact)", run.time(lambda: fn(comps)[0].block_until_ready()), nbytes,
                note="binary32 path (proved exact for these values)" if f32 else "binary64 path")
        fnx = jitted(descriptor_json(desc), False)
        run.row(sec, "qformat jax jit (exact=False)", run.time(lambda: fnx(comps)[0].block_until_ready()), nbytes, note="not bit-exact by design")
        # what qformat.jax.load_file does for a CPU device: the native kernel on the host into a
        # fresh 64-byte-aligned buffer that XLA takes without a copy (the allocation's page
        # faults included, which the preallocated NumPy rows above do not pay)
        cpu = jax.devices("cpu")[0]
        _require(_same_bits(np.asarray(decode_on_host(q, cpu)), ref), f"jax host decode of {kind}")
        run.row(sec, "qformat jax load, CPU device (native host decode)", run.time(lambda: decode_on_host(q, cpu).block_until_ready()), nbytes)
        del q, src, out, tq, tsrc, comps
        gc.collect()


def _gguf_equivalents(kind: str, data: np.ndarray, rows: int, cols: int) -> dict[str, qformat.QTensor]:
    """qformat tensors holding the same values as GGUF blocks: in place (GGUF nibble order, a
    planes span of 32 as in SPEC §7.12) and canonical (element pairs in bytes)."""
    import ml_dtypes

    nb = cols // 32
    if kind == "Q8_0":
        b = data.reshape(rows, nb, 34)
        d = np.ascontiguousarray(b[..., :2]).view(np.float16).reshape(rows, nb)
        qs = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, cols)
        desc = {"shape": [rows, cols], "dtype": "float32",
                "codes": {"tensor": "codes", "element": {"type": "int", "bits": 8, "signedness": "twos_complement"}, "packing": _pk()},
                "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
        return {"canonical": qformat.QTensor(desc, {"codes": qs, "scale": d})}
    if kind == "Q4_0":
        b = data.reshape(rows, nb, 18)
        scale = np.ascontiguousarray(b[..., :2]).view(np.float16).reshape(rows, nb)
        el = {"type": "int", "bits": 4, "signedness": "offset_binary"}
        qs = b[..., 2:]
    else:  # MXFP4
        b = data.reshape(rows, nb, 17)
        scale = np.ascontiguousarray(b[..., 0]).view(ml_dtypes.float8_e8m0fnu)
        el = {"type": "float", "format": "e2m1fn"}
        qs = b[..., 1:]
    lo, hi = qs & 15, qs >> 4  # GGUF: element j in the low nibble of byte j, element 16+j in the high one
    codes = np.concatenate([lo, hi], axis=-1).reshape(rows, cols)
    canon = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    out = {}
    for name, c, pk in [("canonical", canon, _pk()), ("in place (planes span 32)", np.ascontiguousarray(qs).reshape(rows, cols // 2), dict(_pk(), planes={"span": 32}))]:
        desc = {"shape": [rows, cols], "dtype": "float32", "codes": {"tensor": "codes", "element": el, "packing": pk},
                "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
        out[name] = qformat.QTensor(desc, {"codes": c, "scale": scale})
    return out


def bench_gguf(run: Run, rows: int, cols: int) -> None:
    """gguf-py dequantize against qformat NumPy decode of the same values."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    rng = np.random.default_rng(1)
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    nbytes = rows * cols * 4
    print(f"\n[gguf] {rows}x{cols} -> float32 ({nbytes / MB:.0f} MB)", flush=True)
    for kind, t, ours in [("Q4_0", T.Q4_0, "int4 g32 sym (offset_binary, fp16 scale)"), ("Q8_0", T.Q8_0, "int8 g32"), ("MXFP4", T.MXFP4, "mxfp4")]:
        data = quants.quantize(w, t)
        ref = quants.dequantize(data, t)
        sec = f"gguf {kind} vs {ours}"
        print(f" {sec}", flush=True)
        run.row(sec, f"gguf-py dequantize {kind}", run.time(lambda: quants.dequantize(data, t)), nbytes)
        for name, q in _gguf_equivalents(kind, data, rows, cols).items():
            desc, src = _parsed(q)
            out = np.empty((rows, cols), np.float32)
            _require(_same_bits(qdecode.decode(desc, src, threads=1), ref), f"numpy decode of {kind} ({name})")
            run.row(sec, f"qformat numpy {name}, 1 thread", run.time(lambda: qdecode.decode(desc, src, out=out, threads=1)), nbytes, ref=f"gguf-py dequantize {kind}")
            run.row(sec, f"qformat numpy {name}, 2 threads", run.time(lambda: qdecode.decode(desc, src, out=out, threads=2)), nbytes, ref=f"gguf-py dequantize {kind}")
        del data, ref
        gc.collect()


def bench_nf4(run: Run, rows: int, cols: int) -> None:
    """bitsandbytes dequantize_4bit and torchao NF4 -> bf16 against qformat nf4 on the same data."""
    import bitsandbytes.functional as bnbf
    import torch
    from qformat_torch.decode import decode as tdecode
    from qformat_torch.interop_bnb import from_bnb
    from qformat_torch.interop_torchao import from_nf4
    from qformat_torch.qtensor import TorchQTensor
    from qformat_torch.sources import TensorSource
    from torchao.quantization import to_nf4

    torch.manual_seed(0)
    w = torch.randn(rows, cols, dtype=torch.bfloat16)
    nbytes = rows * cols * 2
    print(f"\n[nf4] {rows}x{cols} -> bfloat16 ({nbytes / MB:.0f} MB)", flush=True)
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    sec = "nf4 vs bitsandbytes"
    ref = bnbf.dequantize_4bit(packed, state)
    run.row(sec, "bitsandbytes dequantize_4bit (CPU)", run.time(lambda: bnbf.dequantize_4bit(packed, state)), nbytes)
    q = from_bnb(packed, state)
    desc, _ = _parsed(q)
    tsrc = TensorSource(TorchQTensor.from_qtensor(q).components)
    _require(_same_bits(_torch_np(tdecode(desc, tsrc)), _torch_np(ref)), "torch nf4 decode against bitsandbytes")
    run.row(sec, "qformat torch nf4 -> bf16", run.time(lambda: tdecode(desc, tsrc)), nbytes, ref="bitsandbytes dequantize_4bit (CPU)")
    src = ArraySource(q.components)
    run.row(sec, "qformat numpy nf4 -> bf16, 2 threads", run.time(lambda: qdecode.decode(desc, src, threads=2)), nbytes, ref="bitsandbytes dequantize_4bit (CPU)")
    sec = "nf4 vs torchao"
    n = to_nf4(w, 64, 256)
    ref = n.get_original_weight()
    run.row(sec, "torchao NF4Tensor.get_original_weight", run.time(lambda: n.get_original_weight()), nbytes)
    q = from_nf4(n)
    desc, _ = _parsed(q)
    tsrc = TensorSource(TorchQTensor.from_qtensor(q).components)
    got = tdecode(desc, tsrc)
    exact = _same_bits(_torch_np(got), _torch_np(ref.to(got.dtype)))
    run.row(sec, "qformat torch nf4 (double quant) -> bf16", run.time(lambda: tdecode(desc, tsrc)), nbytes,
            ref="torchao NF4Tensor.get_original_weight", note="" if exact else "values differ from torchao (see interop_torchao)")


def bench_load(run: Run, tmp: str, layers: int, rows: int, cols: int) -> None:
    """safetensors loading a bf16 checkpoint against loading its 4-bit qformat checkpoint into bf16."""
    import safetensors.torch
    import torch

    import qformat_torch

    rng = np.random.default_rng(2)
    q4, bf = os.path.join(tmp, "model-int4.safetensors"), os.path.join(tmp, "model-bf16.safetensors")
    tensors = {f"layers.{i}.weight": make_case("int4 g32 sym", rows, cols, rng, dtype="bfloat16") for i in range(layers)}
    qformat.save_file(tensors, q4)
    decoded = qformat_torch.load_file(q4)
    safetensors.torch.save_file(decoded, bf)  # the same model, as bf16 (the 4-bit values)
    nbytes = sum(t.numel() * 2 for t in decoded.values())
    del tensors, decoded
    gc.collect()
    print(f"\n[load] {layers} x {rows}x{cols}: bf16 file {os.path.getsize(bf) / MB:.0f} MB, int4 file {os.path.getsize(q4) / MB:.0f} MB", flush=True)
    a, b = safetensors.torch.load_file(bf), qformat_torch.load_file(q4)
    _require(all(_same_bits(_torch_np(a[k]), _torch_np(b[k])) for k in a), "qformat.torch.load_file against safetensors")
    del a, b
    for cache in ("warm", "cold"):
        sec = f"load to bf16 ({cache} page cache)"
        reps = run.reps if cache == "warm" else max(3, run.reps // 2)

        def timed(fn: Callable[[], Any], path: str) -> float:
            ts = []
            fn()
            for _ in range(reps):
                if cache == "cold":
                    drop_cache(path)
                gc.collect()
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts)

        # safetensors' load_file maps the file lazily: clone() makes every value resident in
        # memory, as qformat's decoded tensors are (and as load_state_dict's copy would)
        st = "safetensors.torch.load_file(bf16) + clone"
        run.row(sec, st, timed(lambda: {k: v.clone() for k, v in safetensors.torch.load_file(bf).items()}, bf), nbytes)
        run.row(sec, "qformat.torch.load_file(int4) -> bf16", timed(lambda: qformat_torch.load_file(q4), q4), nbytes, ref=st)
        run.row(sec, "qformat.load_file(int4) -> bf16 (numpy)", timed(lambda: qformat.load_file(q4), q4), nbytes, ref=st)
    for p in (q4, bf):
        os.remove(p)


def write_big_checkpoint(path: str, layers: int, rows: int, cols_list: list[int]) -> int:
    """A qformat int4 g32 checkpoint written in a stream (random codes, fp16 scales); returns
    the number of packed code bytes.  The header comes from qformat's own save path
    (qformat.io.prepare and qformat.container.plan_file); qformat.container.write_planned
    writes one tensor body at a time, so the data never sits in memory at once."""
    from qformat.container import TensorSpec, plan_file, write_planned
    from qformat.dtypes import storage_name
    from qformat.io import prepare

    rng = np.random.default_rng(3)
    tensors = {}
    for i in range(layers):
        cols = cols_list[i % len(cols_list)]
        ng = -(-cols // 32)
        d = {"shape": [rows, cols], "dtype": "bfloat16",
             "codes": {"tensor": "codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"}, "packing": _pk()},
             "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "scale"}}
        # zero-stride views (no memory): QTensor keeps component arrays as given
        comps = {"codes": np.broadcast_to(np.uint8(0), (rows, -(-cols // 2))), "scale": np.broadcast_to(np.float16(0.01), (rows, ng))}
        tensors[f"layers.{i}.weight"] = qformat.QTensor(d, comps)
    arrays, meta = prepare(tensors)
    plan = plan_file([TensorSpec(name, str(storage_name(a.dtype)), tuple(a.shape)) for name, a in arrays.items()], meta)

    def produce(t: TensorSpec) -> np.ndarray:
        if t.dtype == "U8":
            return rng.integers(0, 256, t.shape, dtype=np.uint8)
        return (rng.random(t.shape, np.float32) * 0.02 + 1e-3).astype(np.float16)

    write_planned(path, plan, produce)
    return sum(t.nbytes for t in plan.order if t.dtype == "U8")


def _padding_free(path: str) -> None:
    """Zero the padding nibble of rows with an odd number of codes (writers must)."""
    with qformat.safe_open(path) as f:
        names = [n for n in f.keys()]
        descs = {n: f.descriptor(n) for n in names}
    import mmap

    from qformat.container import read_header

    h = read_header(path)
    with open(path, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
        for n, d in descs.items():
            cols = d["shape"][1]
            if cols % 2:
                e = h.entries[n + ".codes"]
                a = np.frombuffer(mm, np.uint8, count=e.nbytes, offset=h.data_start + e.begin).reshape(e.shape)
                a[:, -1] &= 0x0F
                del a
        mm.flush()
        mm.close()


CHILD = r"""
import json, resource, sys, time
import qformat
path, payload = sys.argv[1], sys.argv[2] == "1"
def hwm():  # peak resident set of this process (VmHWM; ru_maxrss may include the parent's at fork)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
t0 = time.perf_counter()
rep = qformat.check(path, payload=payload)
dt = time.perf_counter() - t0
print(json.dumps({"ok": rep.ok, "seconds": dt, "maxrss_kb": hwm(),
                  "problems": [p.code for p in rep.problems][:5]}))
"""

DECODE_CHILD = r"""
import json, resource, sys, time
import numpy as np, qformat
path = sys.argv[1]
def hwm():  # peak resident set of this process (VmHWM; ru_maxrss may include the parent's at fork)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
f = qformat.safe_open(path)
name = f.keys()[0] if isinstance(f.keys(), list) else sorted(f.keys())[0]
before = hwm()
t0 = time.perf_counter()
x = f.get_tensor(name)
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "out_bytes": int(x.nbytes), "maxrss_kb": hwm(),
                  "before_kb": before}))
"""


def _child(code: str, *args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                       cwd=str(Path(__file__).resolve().parents[1]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_check(run: Run, tmp: str, layers: int, rows: int) -> None:
    """``qformat check`` header-only and with payload on a multi-GB file; peak RSS in a child."""
    path = os.path.join(tmp, "big.safetensors")
    cols_list = [16384, 16383] if not run.quick else [256, 255]
    packed = write_big_checkpoint(path, layers, rows, cols_list)
    _padding_free(path)
    size = os.path.getsize(path)
    print(f"\n[check] {size / 2**30:.2f} GiB file, {layers} int4 tensors (half with odd rows: padding scanned), {packed / 2**30:.2f} GiB packed codes", flush=True)
    res: dict[str, Any] = {}
    for payload in (False, True):
        for cache in ("warm", "cold"):
            if cache == "cold":
                drop_cache(path)
            else:
                _child(CHILD, path, "1" if payload else "0")  # warms the page cache
            r = _child(CHILD, path, "1" if payload else "0")
            _require(r["ok"], r)
            key = f"{'payload' if payload else 'header-only'} {cache}"
            res[key] = r
            rss = r["maxrss_kb"] / 1024
            gbps = packed / r["seconds"] / 1e9
            run.rows.append({"section": "qformat check", "name": f"qformat check ({key})", "ms": r["seconds"] * 1e3,
                             "GBps": gbps, "packed_GB": packed / 1e9, "file_GB": size / 1e9, "peak_rss_MB": rss, "note": "GB/s of packed code bytes"})
            print(f"  qformat check ({key:<20}) {r['seconds']:8.3f} s  {gbps:7.2f} GB/s packed  peak RSS {rss:7.1f} MB", flush=True)
    run.target("qformat check with payload: GB/s of packed bytes (warm cache)", packed / res["payload warm"]["seconds"] / 1e9, 1.0, "GB/s")
    run.target("qformat check with payload: GB/s of packed bytes (cold cache)", packed / res["payload cold"]["seconds"] / 1e9, 1.0, "GB/s")
    worst = max(r["maxrss_kb"] for r in res.values()) / 1024
    run.target(f"qformat check peak RSS on a {size / 2**30:.1f} GiB file, MB (at most)", -worst, -256.0, "-MB")
    os.remove(path)


def bench_memory(run: Run, tmp: str, rows: int, cols: int) -> None:
    """Peak memory of decoding one tensor from a file, in a child process."""
    path = os.path.join(tmp, "one.safetensors")
    rng = np.random.default_rng(4)
    qformat.save_file({"w": make_case("int4 g32 sym", rows, cols, rng)}, path)
    r = _child(DECODE_CHILD, path)
    out_mb = r["out_bytes"] / MB
    extra = r["maxrss_kb"] / 1024 - r["before_kb"] / 1024 - out_mb
    mapped = os.path.getsize(path) / MB  # the packed input, memory-mapped: page cache, counted in RSS
    print(f"\n[memory] decode of a {out_mb:.0f} MB float32 tensor from a {mapped:.0f} MB file: peak RSS {r['maxrss_kb'] / 1024:.0f} MB, "
          f"{r['before_kb'] / 1024:.0f} MB before; {extra:.1f} MB above the output, {extra - mapped:.1f} MB beyond the mapped file", flush=True)
    run.rows.append({"section": "decode memory", "name": "qformat decode peak RSS above (RSS before + output)", "extra_MB": extra,
                     "mapped_file_MB": mapped, "out_MB": out_mb, "note": "mapped packed pages count in RSS"})
    run.target("decode peak memory above the output size, excluding the mapped file's pages, MB (at most 64)", -(extra - mapped), -64.0, "-MB")
    run.target("decode peak memory above the output size, all RSS, MB (at most 64)", -extra, -64.0, "-MB")
    os.remove(path)


def bench_scaling(run: Run, sizes_mb: list[int]) -> None:
    """int4 g32 NumPy decode from 1 MB to 2 GB of output, 1 and 2 threads."""
    rng = np.random.default_rng(5)
    print("\n[scaling] int4 g32 sym -> float32, NumPy", flush=True)
    for mb in sizes_mb:
        cols = 4096
        rows = max(1, mb * MB // 4 // cols)
        q = make_case("int4 g32 sym", rows, cols, rng)
        desc, src = _parsed(q)
        out = np.empty((rows, cols), np.float32)
        nbytes = out.nbytes
        reps = run.reps if mb <= 256 else 3
        for th in (1, 2):
            r = run.row("scaling", f"{nbytes / MB:7.0f} MB, {th} thread{'s' if th > 1 else ''}",
                        run.time(lambda: qdecode.decode(desc, src, out=out, threads=th), reps), nbytes)
            r["size_MB"], r["threads"] = nbytes / MB, th
        del q, src, out
        gc.collect()


# -- whole checkpoints (issue 11, item 7) --------------------------------------------------------
def _ckpt_sources(tmp: str, nbytes: int, quick: bool) -> dict[str, str]:
    """Synthetic sources of about ``nbytes`` each, written one tensor at a time from one random
    tensor reused (speed does not depend on the values): a plain fp16 checkpoint in two shards
    (quantize), a qformat int4 g32 checkpoint in two shards with fp16 tensors beside (in place,
    --repack, check), and a GGUF of Q4_0, Q8_0 and Q4_K tensors (convert)."""
    import gguf

    from qformat.container import write_file

    rng = np.random.default_rng(11)
    rows, cols = (64, 256) if quick else (4096, 4096)
    out: dict[str, str] = {}
    # plain fp16 "Llama" checkpoint: projection weights, an embedding, norms
    w = (rng.standard_normal((rows, cols), np.float32) * 0.02).astype(np.float16)
    n = max(2, round(nbytes / w.nbytes))
    folder = os.path.join(tmp, "plain")
    os.makedirs(folder)
    wm: dict[str, str] = {}
    for s, layers in enumerate((range(0, n // 2), range(n // 2, n))):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        arrays = {f"model.layers.{i}.mlp.down_proj.weight": w for i in layers}
        arrays.update({f"model.layers.{i}.input_layernorm.weight": np.ones(cols, np.float16) for i in layers})
        if s == 0:
            arrays["model.embed_tokens.weight"] = w.reshape(rows * 2, cols // 2)  # not the projections' shape (a tied head would be kept)
        write_file(os.path.join(folder, fname), arrays, {"format": "pt"})
        wm.update({k: fname for k in arrays})
    Path(folder, "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    Path(folder, "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float16"}))
    out["plain"] = folder
    # qformat int4 g32 checkpoint (codes + fp16 scales) with fp16 tensors beside
    qrows, qcols = (rows * 2, cols * 2)
    codes = rng.integers(0, 256, (qrows, qcols // 2), dtype=np.uint8)
    scale = (rng.random((qrows, qcols // 32), np.float32) * 0.01 + 1e-3).astype(np.float16)
    per = codes.nbytes + scale.nbytes + w.nbytes
    n = max(2, round(nbytes / per))
    folder = os.path.join(tmp, "int4")
    os.makedirs(folder)
    wm = {}
    for s, layers in enumerate((range(0, n // 2), range(n // 2, n))):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        arrays, descs = {}, {}
        for i in layers:
            q = f"model.layers.{i}.mlp.down_proj.weight"
            arrays[q + ".codes"], arrays[q + ".scale"] = codes, scale
            arrays[f"model.layers.{i}.self_attn.o_proj.weight"] = w
            descs[q] = {"shape": [qrows, qcols], "dtype": "bfloat16",
                        "codes": {"tensor": q + ".codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"}, "packing": _pk()},
                        "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": q + ".scale"}}
        write_file(os.path.join(folder, fname), arrays, {"qformat": json.dumps({"version": "1.0", "tensors": descs})})
        wm.update({k: fname for k in list(arrays) + list(descs)})
    Path(folder, "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    Path(folder, "config.json").write_text(json.dumps({"model_type": "llama"}))
    out["int4"] = folder
    # GGUF: Q4_0, Q8_0 and Q4_K tensors in turn (random blocks, finite fp16 scales)
    path = os.path.join(tmp, "model.gguf")
    gw = gguf.GGUFWriter(path, arch="llama")
    T = gguf.GGMLQuantizationType
    kinds = []
    for name, bs, ts, d in (("Q4_0", 32, 18, (0,)), ("Q8_0", 32, 34, (0,)), ("Q4_K", 256, 144, (0, 2))):
        raw = rng.integers(0, 256, (qrows, qcols // bs * ts), dtype=np.uint8)
        for off in d:
            raw.reshape(qrows, -1, ts)[:, :, off + 1] &= 0x3B  # exponent below Inf/NaN
        kinds.append((name, raw))
    per = sum(r.nbytes for _, r in kinds) / len(kinds)
    for i in range(max(3, round(nbytes / per))):
        name, raw = kinds[i % 3]
        gw.add_tensor(f"blk.{i}.ffn_down.weight", raw, raw_dtype=getattr(T, name))
    gw.add_tensor("output_norm.weight", np.ones(cols, np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    out["gguf"] = path
    return out


def bench_checkpoint(run: Run, tmp: str, sizes_gb: list[float]) -> None:
    """Whole-checkpoint commands (qformat quantize, dequantize, convert, check) on synthetic
    sources of each size: MB/s of source bytes, the ratio to a plain copy of the same source
    measured just before (x copy: copy seconds / command seconds), and the child's peak RSS.
    Seconds are the command's own (in the child, after its imports)."""
    import shutil

    for gb in sizes_gb:
        base = os.path.join(tmp, f"ckpt-{gb}")
        os.makedirs(base)
        t0 = time.perf_counter()
        src = _ckpt_sources(base, int(gb * 2**30), run.quick)
        sizes = {k: _tree_bytes(v) for k, v in src.items()}
        print(f"\n[checkpoint {gb} GB] sources: " + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in sizes.items())
              + f" (built in {time.perf_counter() - t0:.0f} s)", flush=True)
        o = lambda n: os.path.join(base, n)  # noqa: E731
        q4 = o("q-int4")
        ops = [  # (row name, source key or path, command)
            ("quantize int4 g32", "plain", ["quantize", "--quiet", src["plain"], q4, "--scheme", "int", "--bits", "4", "--group-size", "32"]),
            ("quantize nf4", "plain", ["quantize", "--quiet", src["plain"], o("q-nf4"), "--scheme", "nf4"]),
            ("dequantize (int4 g32 -> fp16)", q4, ["dequantize", "--quiet", q4, o("dq"), "--dtype", "float16"]),
            ("convert GGUF (Q4_0, Q8_0, Q4_K)", "gguf", ["convert", "--quiet", src["gguf"], o("g.safetensors")]),
            ("convert in place (qformat, sharded)", "int4", ["convert", "--quiet", src["int4"], o("ip")]),
            ("convert --repack (qformat, sharded)", "int4", ["convert", "--quiet", "--repack", src["int4"], o("rp")]),
            ("check (payload)", "int4", ["check", *sorted(os.path.join(src["int4"], n) for n in os.listdir(src["int4"]) if n.endswith(".safetensors"))]),
        ]
        results = []
        if run.quick:  # one child for every command, copies measured after
            res = _ckpt_children([c for _, _, c in ops], one_each=False)
            results = [(n, src.get(k, k), _copy_seconds(src.get(k, k), base, 1), _copy_seconds(src.get(k, k), base, 1, True), r)
                       for (n, k, _), r in zip(ops, res)]
        for name, key, cmd in ([] if run.quick else ops):
            path = src.get(key, key)
            copy_s = _copy_seconds(path, base, 1 if gb >= 2 else 2)
            durable_s = _copy_seconds(path, base, 1 if gb >= 2 else 2, durable=True)
            os.sync()
            results.append((name, path, copy_s, durable_s, _ckpt_children([cmd], one_each=True)[0]))
            if name.startswith(("dequantize", "convert")):
                for n in ("dq", "g.safetensors", "ip", "rp"):
                    if os.path.exists(o(n)):
                        shutil.rmtree(o(n)) if os.path.isdir(o(n)) else os.remove(o(n))
        for name, path, copy_s, durable_s, r in results:
            nbytes = _tree_bytes(path)
            row = {"section": "checkpoint", "name": f"{name}, {gb:g} GB", "op": name, "size_GB": gb, "src_MB": nbytes / MB,
                   "seconds": r["seconds"], "MBps": nbytes / MB / r["seconds"], "copy_seconds": copy_s,
                   "x_copy": copy_s / r["seconds"], "durable_copy_seconds": durable_s, "x_durable_copy": durable_s / r["seconds"],
                   "peak_rss_MB": r["maxrss_kb"] / 1024}
            run.rows.append(row)
            print(f"  {row['name']:<46} {nbytes / MB:8.0f} MB {r['seconds']:8.2f} s {row['MBps']:8.1f} MB/s "
                  f"{row['x_copy']:6.3f}x copy {row['x_durable_copy']:6.3f}x copy+fsync  peak RSS {row['peak_rss_MB']:6.0f} MB", flush=True)
        if not run.quick:
            for name, req in (("convert GGUF (Q4_0, Q8_0, Q4_K)", 0.2), ("convert in place (qformat, sharded)", 0.5), ("convert --repack (qformat, sharded)", 0.2)):
                r = next(x for x in run.rows if x["section"] == "checkpoint" and x["name"] == f"{name}, {gb:g} GB")
                run.target(f"{name}, {gb:g} GB: x copy", r["x_copy"], req)
        shutil.rmtree(base)


def _targets_from_rows(run: Run) -> None:
    def get(section: str, name: str) -> dict[str, Any]:
        return next(r for r in run.rows if r["section"] == section and r["name"] == name)

    for k in ("int4 g32 sym", "int4 g128 sym", "int4 g32 asym", "int4 g128 asym"):
        for th in ("1 thread", "2 threads"):
            run.target(f"NumPy {k} -> fp32, {th}: x memcpy", get(f"decode {k}", f"qformat numpy, {th}")["x_memcpy"], 0.4)
    sec = "gguf Q4_0 vs int4 g32 sym (offset_binary, fp16 scale)"
    for name in ("canonical", "in place (planes span 32)"):
        for th in ("1 thread", "2 threads"):
            run.target(f"NumPy Q4_0-equivalent ({name}), {th}: x gguf-py", get(sec, f"qformat numpy {name}, {th}")["x_vs"], 4.0)
    run.target("torch nf4 -> bf16: x bitsandbytes", get("nf4 vs bitsandbytes", "qformat torch nf4 -> bf16")["x_vs"], 1.0)
    run.target("torch nf4 -> bf16: x torchao", get("nf4 vs torchao", "qformat torch nf4 (double quant) -> bf16")["x_vs"], 1.0)
    for k in DECODE_KINDS:
        if k.startswith("int4"):
            run.target(f"JAX jit (exact) {k} -> fp32: x memcpy", get(f"decode {k}", "qformat jax jit (exact)")["x_memcpy"], 0.5)
        # issue 23 item 5: the JAX reader's CPU decode at least the NumPy reference's speed
        host = get(f"decode {k}", "qformat jax load, CPU device (native host decode)")
        ref2 = get(f"decode {k}", "qformat numpy, 2 threads, fresh output")
        run.target(f"JAX load on CPU {k} -> fp32: x NumPy reference (2 threads, fresh output)", host["x_memcpy"] / ref2["x_memcpy"], 1.0)
    for cache in ("warm", "cold"):
        for who in ("qformat.torch.load_file(int4) -> bf16", "qformat.load_file(int4) -> bf16 (numpy)"):
            run.target(f"load int4 -> bf16 ({cache}): {who.split('(')[0]} x safetensors bf16", get(f"load to bf16 ({cache} page cache)", who)["x_vs"], 1.0)


# -- encoders (issue 11, item 4) ------------------------------------------------------------------
ENCODE_CASES = [
    ("int4 g32 sym (fp16 scale)", "int", {"bits": 4, "group_size": 32}),
    ("int8 per channel", "int", {"bits": 8, "group_size": None}),
    ("int4 g128 asym", "int", {"bits": 4, "group_size": 128, "symmetric": False}),
    ("nf4 b64", "nf4", {}), ("nf4 b64 double quant", "nf4", {"double_quant": True}),
    ("fp8_e4m3 per channel", "fp8_e4m3", {}), ("fp8_e5m2 per channel", "fp8_e5m2", {}),
    ("mxfp4", "mxfp4", {}), ("mxfp6_e2m3", "mxfp6_e2m3", {}), ("mxfp8_e4m3", "mxfp8_e4m3", {}), ("mxint8", "mxint8", {}),
    ("nvfp4", "nvfp4", {}), ("codebook 16 b64", "codebook", {"values": [float(v) for v in np.linspace(-1, 1, 16)]}),
]


def _sqnr(x: np.ndarray, y: Any) -> float:
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(10 * np.log10(np.sum(x64 * x64) / np.sum((x64 - y64) ** 2)))


def bench_encode(run: Run, rows: int, cols: int) -> None:
    """qformat's encoders against gguf-py's NumPy Q4_0 quantize and bitsandbytes' CPU
    quantize_4bit on the same float32 data: values/s, ratios in this run, SQNR of each."""
    import bitsandbytes.functional as bnbf
    import gguf
    import torch

    x = (np.random.default_rng(0).standard_normal((rows, cols)) * 0.02).astype(np.float32)
    n = x.size
    sec = "encode"
    print(f"\n[encode] {rows}x{cols} float32 ({n * 4 / MB:.0f} MB in)", flush=True)
    T = gguf.GGMLQuantizationType

    def add(name: str, seconds: float, sqnr: float, **extra: Any) -> dict[str, Any]:
        r = {"section": sec, "name": name, "ms": seconds * 1e3, "Mvalues_per_s": n / seconds / 1e6, "sqnr_dB": sqnr, **extra}
        run.rows.append(r)
        more = "".join(f"  {v:6.2f}x {k[2:]}" for k, v in extra.items() if k.startswith("x_"))
        print(f"  {name:<44} {r['ms']:9.2f} ms {r['Mvalues_per_s']:8.1f} Mval/s  SQNR {sqnr:6.2f} dB{more}", flush=True)
        return r

    q40 = gguf.quants.quantize(x, T.Q4_0)
    t_q40 = run.time(lambda: gguf.quants.quantize(x, T.Q4_0))
    add("gguf-py quantize Q4_0", t_q40, _sqnr(x, gguf.quants.dequantize(q40, T.Q4_0)))
    xt = torch.from_numpy(x)
    packed, state = bnbf.quantize_4bit(xt, blocksize=64, quant_type="nf4", compress_statistics=False)
    t_bnb = run.time(lambda: bnbf.quantize_4bit(xt, blocksize=64, quant_type="nf4", compress_statistics=False))
    add("bitsandbytes quantize_4bit nf4 (CPU)", t_bnb, _sqnr(x, bnbf.dequantize_4bit(packed, state).numpy()))
    for name, scheme, params in ENCODE_CASES:
        qt = qformat.quantize(x, scheme, **params)
        t = run.time(lambda: qformat.quantize(x, scheme, **params), max(1, min(run.reps, 3)))
        add(f"qformat {name}", t, _sqnr(x, qt.dequantize()), x_vs_q4_0=t_q40 / t, x_vs_bnb=t_bnb / t)
        if not run.quick:
            req = 1.0 if scheme == "int" and name.startswith("int4 g32") else 0.5
            if scheme == "nf4" and "double" not in name:
                run.target(f"encode {name}: x bitsandbytes quantize_4bit", t_bnb / t, 1.0)
            else:
                run.target(f"encode {name}: x gguf-py Q4_0", t_q40 / t, req)
    if not run.quick:
        ours = next(r for r in run.rows if r["section"] == sec and r["name"].startswith("qformat int4 g32"))
        theirs = next(r for r in run.rows if r["section"] == sec and r["name"] == "gguf-py quantize Q4_0")
        run.target("encode int4 g32 SQNR - Q4_0 SQNR (dB)", ours["sqnr_dB"] - theirs["sqnr_dB"], 0.0, unit="dB")
    del x
    gc.collect()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repetition (the test suite's smoke run)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per row (default 7; --quick 1)")
    ap.add_argument("--json", default=None, help="where to write the results (default: merged into bench/results.json, "
                    "replacing only the sections this run measured; with --quick a scratch file in the temporary folder, "
                    "so a smoke run never touches the committed results)")
    ap.add_argument("--only", default="decode,kernels,libqformat,gguf,nf4,load,check,memory,scaling,checkpoint,encode",
                    help="comma-separated sections (also, not in the default run: generate, bench/generate.py; llama, bench/llama.py; "
                         "gguf_hf, bench/gguf_hf.py; gguf_quantize, bench/gguf_quantize.py; real_models, bench/real_models.py; remote, bench/remote.py; "
                         "headers, bench/headers.py; "
                         "llama_cpp_speed, bench/llama_cpp_speed.py; kernels_vs_ggml, bench/kernels_vs_ggml.py; "
                         "multihost_jax, tp_torch, split_convert: bench/multihost_jax.py, tp_torch.py, split_convert.py, or all three as multihost)")
    ap.add_argument("--checkpoint-gb", default="0.5,1,2,4", help="source sizes of the checkpoint section (GiB, comma-separated)")
    ap.add_argument("--llama-gb", type=float, default=1.5, help="size of the llama section's fp16 checkpoint (GiB)")
    ap.add_argument("--gguf-hf-layers", type=int, default=4, help="layers of the gguf_hf section's Llama-shaped GGUF")
    ap.add_argument("--gguf-hf-type", default="Q4_0", help="ggml type of the gguf_hf section's weights (Q4_0, Q8_0, Q4_K, ...)")
    ap.add_argument("--gguf-quantize-layers", type=int, default=2, help="layers of the gguf_quantize section's Llama-shaped model")
    ap.add_argument("--gguf-quantize-presets", default=None,
                    help="presets of the gguf_quantize section (comma-separated; P+imatrix: with an importance matrix; "
                    "default: bench/gguf_quantize.py's DEFAULT_PRESETS)")
    ap.add_argument("--headers-tensors", type=int, default=100_000, help="tensors per file of the headers section (--quick: 1000)")
    ap.add_argument("--check-gb", type=float, default=4.0, help="size of the checked file (GiB)")
    ap.add_argument("--tmp", default=None, help="folder for the big temporary files (default: the system's)")
    a = ap.parse_args(argv)
    run = Run(a.reps or (1 if a.quick else 7), a.quick)
    only = set(a.only.split(","))
    t_start = time.time()
    info = {"python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
            "quick": a.quick, "reps": run.reps, "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(info), flush=True)
    with tempfile.TemporaryDirectory(dir=a.tmp, prefix="qformat-bench-") as tmp:
        if "decode" in only:
            bench_decode(run, *((32, 256) if a.quick else (2048, 8192)))
            from .kernels import bench_decode_out

            bench_decode_out(run, *((64, 512) if a.quick else (2048, 8192)))
        if "kernels" in only:
            from .kernels import bench_kernels

            bench_kernels(run, *((32, 256) if a.quick else (2048, 8192)))
        if "libqformat" in only:
            from .libqformat import bench_libqformat

            bench_libqformat(run, tmp, *((32, 512) if a.quick else (2048, 8192)))
        if "gguf" in only:
            bench_gguf(run, *((32, 256) if a.quick else (2048, 8192)))
        if "nf4" in only:
            bench_nf4(run, *((64, 256) if a.quick else (4096, 4096)))
        if "load" in only:
            bench_load(run, tmp, *((2, 64, 256) if a.quick else (16, 4096, 8192)))
        if "check" in only:
            # 16384 x 16384 int4 with fp16 g32 scales: 144 MB per tensor
            per = 16384 * 8192 + 16384 * 512 * 2
            layers = 2 if a.quick else max(2, int(round(a.check_gb * 2**30 / per)))
            bench_check(run, tmp, layers, 64 if a.quick else 16384)
        if "memory" in only:
            bench_memory(run, tmp, *((64, 256) if a.quick else (65536, 4096)))
        if "scaling" in only:
            bench_scaling(run, [1, 4] if a.quick else [1, 4, 16, 64, 256, 1024, 2048])
        if "encode" in only:
            bench_encode(run, *((64, 256) if a.quick else (4096, 4096)))
        if "checkpoint" in only:
            bench_checkpoint(run, tmp, [0.002] if a.quick else [float(x) for x in a.checkpoint_gb.split(",")])
        if "llama" in only:
            from .llama import bench_llama

            bench_llama(run, tmp, 0.02 if a.quick else a.llama_gb)
        if "gguf_hf" in only:
            from .gguf_hf import bench_gguf_hf

            bench_gguf_hf(run, tmp, a.gguf_hf_layers, a.gguf_hf_type)
        if "gguf_quantize" in only:
            from .gguf_quantize import bench_gguf_quantize

            bench_gguf_quantize(run, tmp, a.gguf_quantize_layers, a.gguf_quantize_presets.split(",") if a.gguf_quantize_presets else None)
        if "real_models" in only:
            from .real_models import bench_real_models

            bench_real_models(run, tmp)
        if "remote" in only:
            from .remote import bench_remote

            bench_remote(run, tmp, a.quick)
        if "headers" in only:
            from .headers import bench_headers

            bench_headers(run, tmp, 1000 if a.quick else a.headers_tensors)
        # issue 27: several processes (each section starts its own; "multihost" runs all three)
        if only & {"multihost", "multihost_jax"}:
            from .multihost_jax import bench_multihost_jax

            bench_multihost_jax(run, tmp, a.quick)
        if only & {"multihost", "tp_torch"}:
            from .tp_torch import bench_tp_torch

            bench_tp_torch(run, tmp, a.quick)
        if only & {"multihost", "split_convert"}:
            from .split_convert import bench_split_convert

            bench_split_convert(run, tmp, a.quick)
        if "generate" in only:
            from .generate import bench_generate

            bench_generate(run, tmp)
        if "kernels_vs_ggml" in only:
            from .kernels_vs_ggml import bench_kernels_vs_ggml

            bench_kernels_vs_ggml(run, a.quick)
        if "llama_cpp_speed" in only:
            from .llama_cpp_speed import bench_llama_cpp_speed

            bench_llama_cpp_speed(run, tmp)
    if not a.quick and {"decode", "gguf", "nf4", "load"} <= only:
        _targets_from_rows(run)
    print("\n[targets]")
    for t in run.targets:
        m, req = t["measured"], t["required"]
        if t["unit"] == "-MB":
            m, req = -m, -req
        print(f"  {'MET ' if t['met'] else 'MISS'} {t['target']:<70} {m:9.3f} (required {req})")
    res = {"info": info, "seconds": time.time() - t_start, "rows": run.rows, "targets": run.targets}
    if a.json is not None:
        out = Path(a.json)
    elif a.quick:
        out = Path(tempfile.gettempdir()) / "qformat-bench-quick.json"
    else:
        out = RESULTS
        res = merge_results(json.loads(out.read_text()) if out.is_file() else None, res)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_name(out.name + ".tmp")
    tmp_out.write_text(json.dumps(res, indent=1))
    os.replace(tmp_out, out)
    print(f"\nwrote {out} ({time.time() - t_start:.0f} s)")
    return 0


#: The committed results: every section's latest full run (``merged_runs`` says which run gave which).
RESULTS = Path(__file__).resolve().parent / "results.json"


def merge_results(old: dict | None, new: dict) -> dict:
    """``old`` with the sections of ``new`` replaced by ``new``'s rows (and targets of the same
    name), the run recorded in ``merged_runs``; ``new`` alone when there is no ``old``."""
    if old is None:
        return new
    sections = sorted({r["section"] for r in new["rows"]})
    names = {t["target"] for t in new["targets"]}
    return {**old,
            "rows": [r for r in old.get("rows", []) if r.get("section") not in sections] + new["rows"],
            "targets": [t for t in old.get("targets", []) if t.get("target") not in names] + new["targets"],
            "merged_runs": old.get("merged_runs", []) + [{"info": new["info"], "seconds": new["seconds"], "sections": sections}]}
