"""Shared checks for converter tests: convert in place and with --repack, then prove it.

:func:`assert_converts` is what every converter test calls once it has built a source
checkpoint and knows the values the source library itself decodes to.  It checks, for both
modes, that ``qformat check`` (with payload checks) passes, and that the NumPy reference, the
torch reader and the JAX reader all decode every converted tensor bit for bit (NaN by class)
to ``expected``.  In place it also checks that every source tensor is still in the output
with its dtype, shape and bytes unchanged, so the source's own runtime still loads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

import qformat
from qformat.convert import convert

try:  # the readers are packaging extras; the suite installs both
    import qformat_jax
    import qformat_torch
    import torch
except ImportError:  # pragma: no cover
    qformat_jax = qformat_torch = torch = None  # type: ignore[assignment]


def bits_equal(got: np.ndarray, want: np.ndarray) -> tuple[bool, str]:
    """Bit-exact equality with NaN matched by class; (ok, first difference)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    u = np.dtype(f"u{got.dtype.itemsize}")
    g, w = got.view(u), want.view(u)
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    bad = (g != w) & ~(gn & wn)
    if not bad.any():
        return True, ""
    i = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    return False, f"{int(bad.sum())} of {bad.size} differ; first at {i}: got {got[i]!r} want {want[i]!r}"


def _stored(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    from qformat.container import read_header

    out = {}
    paths = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    for p in paths:
        h = read_header(p)
        with open(p, "rb") as f:
            for e in h.entries.values():
                f.seek(h.data_start + e.begin)
                out[e.name] = (e.dtype, e.shape, f.read(e.nbytes))
    return out


def _decoders(path: Path) -> dict[str, dict[str, np.ndarray]]:
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    got: dict[str, dict[str, np.ndarray]] = {"numpy": {}, "torch": {}, "jax": {}}
    for f in files:
        got["numpy"].update(qformat.load_file(f))
        if qformat_torch is not None:
            for k, v in qformat_torch.load_file(f).items():
                got["torch"][k] = _torch_np(v)
        if qformat_jax is not None:
            for k, v in qformat_jax.load_file(f).items():
                got["jax"][k] = np.asarray(v)
    return got


def _torch_np(t) -> np.ndarray:  # type: ignore[no-untyped-def]
    import ml_dtypes

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def assert_converts(src: str | os.PathLike[str], expected: Mapping[str, np.ndarray], tmp_path: Path,
                    from_format: str | None = None, detect_as: str | None = None, in_place: bool = True) -> dict[str, Path]:
    """Convert ``src`` both ways and check everything; returns {"in_place": path, "repack": path}.

    ``expected`` maps each logical tensor the conversion must expose to the values the source
    library decodes to (in the logical dtype the converter declares).  ``detect_as``: the id
    detection must pick when ``from_format`` is not given.  ``in_place=False`` for sources
    that are not safetensors (GGUF), which only convert by repacking into new tensors.
    """
    src = Path(src)
    if detect_as is not None:
        ck, conv, _ = qformat.convert.describe(src)
        assert conv.name == detect_as, f"detected {conv.name}, expected {detect_as}"
    single = src.is_file() and not src.name.endswith(".index.json")
    out: dict[str, Path] = {}
    for mode in ("in_place", "repack"):
        dst = tmp_path / (f"out-{mode}.safetensors" if single else f"out-{mode}")
        convert(src, dst, from_format=from_format, repack=(mode == "repack"))
        out[mode] = dst
        report = qformat.check([dst])
        assert report.ok, [(p.code, p.tensor, p.message) for f in report.files for p in f.problems] + [(p.code, p.message) for p in report.problems]
        got = _decoders(dst)
        for reader, tensors in got.items():
            if reader != "numpy" and not tensors:
                continue
            for name, want in expected.items():
                assert name in tensors, f"{mode}/{reader}: {name} missing; have {sorted(tensors)[:20]}"
                ok, why = bits_equal(tensors[name], want)
                assert ok, f"{mode}/{reader}: {name}: {why}"
        if mode == "in_place" and in_place and src.suffix != ".gguf":
            before = _stored(src if single else (src.parent if src.is_file() else src))
            after = _stored(dst)
            for name, (dt, shape, data) in before.items():
                assert name in after, f"in place: source tensor {name} was dropped"
                assert after[name][:2] == (dt, shape), f"in place: {name} changed from {dt}{list(shape)} to {after[name][0]}{list(after[name][1])}"
                assert after[name][2] == data, f"in place: the bytes of {name} changed"
    return out
