"""Files of many tiny tensors: every header walk against safetensors' NumPy reader (issue 40).

``python -m bench --only headers`` (not in the default run; ``--headers-tensors`` sets the count,
default 10^5).  A file of N two-element float32 tensors written by safetensors, and a qformat 1.2
file of one int4 tensor plus N such plain tensors (N + 2 recorded digests), each read by:
safetensors' ``load_file`` and ``safe_open`` + ``get_tensor`` per name (the references), qformat's
``load_file``, ``safe_open`` + ``get_tensor``, ``load_file(verify=True)``, ``check`` (header only,
with payload, with digests) and ``inspect``.  Every row is the median of ``--reps`` runs after a
warm-up, with its ratio to safetensors' ``load_file`` of the same file measured in the same run: the
walks are linear in N when these ratios stay flat as N grows (they were quadratic: 191 s at 10^5).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .common import Run


def _plain_file(path: str, n: int) -> None:
    from safetensors.numpy import save_file

    save_file({f"model.layers.{i}.t": np.full(2, i, np.float32) for i in range(n)}, path)


def _qformat_file(path: str, n: int) -> None:
    import qformat

    rng = np.random.default_rng(3)
    d = {"shape": [4, 64], "dtype": "float32",
         "codes": {"tensor": "w.codes", "element": {"type": "int", "bits": 4, "signedness": "twos_complement"},
                   "packing": {"container": 8, "bit_order": "lsb_first", "axis": 1}},
         "scale": {"blocks": {"type": "grid", "size": [1, 32]}, "op": "multiply", "tensor": "w.scale"}}
    w = qformat.QTensor(d, {"w.codes": rng.integers(0, 256, (4, 32), dtype=np.uint8),
                            "w.scale": np.full((4, 2), 0.5, np.float16)})
    qformat.save_file({"w": w, **{f"model.layers.{i}.t": np.full(2, i, np.float32) for i in range(n)}}, path)


def _each(open_: Callable[..., Any], path: str, **kw: Any) -> Callable[[], None]:
    def go() -> None:
        with open_(path, **kw) as f:
            for k in f.keys():
                f.get_tensor(k)
    return go


def bench_headers(run: Run, tmp: str, n: int) -> None:
    """Rows of section ``headers (N tensors)``: seconds of each reader and ``x safetensors``."""
    import contextlib
    import io

    from safetensors import safe_open as st_open
    from safetensors.numpy import load_file as st_load

    import qformat
    from qformat.cli import main as cli

    plain = os.path.join(tmp, "many-plain.safetensors")
    qf = os.path.join(tmp, "many-qformat.safetensors")
    _plain_file(plain, n)
    _qformat_file(qf, n)
    sec = f"headers ({n} tensors)"
    print(f"\n[{sec}] {os.path.getsize(plain) / 1e6:.1f} MB plain file; {os.path.getsize(qf) / 1e6:.1f} MB qformat 1.2 file "
          f"(one int4 tensor, {n} plain, {n + 2} digests)", flush=True)
    ref = {p: st_load(p) for p in (plain, qf)}
    got = qformat.load_file(qf, verify=True)
    plain_ref = {k: v for k, v in ref[qf].items() if not k.startswith("w.")}  # safetensors also returns the components
    if set(got) != set(plain_ref) | {"w"} or any(not np.array_equal(got[k], v) for k, v in plain_ref.items()):
        raise RuntimeError("qformat.load_file and safetensors' load_file disagree")

    def inspect(path: str) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            if cli(["inspect", path]) != 0:
                raise RuntimeError(f"qformat inspect {path} failed")

    def checked(path: str, **kw: Any) -> Callable[[], None]:
        def go() -> None:
            if not qformat.check(path, **kw).ok:
                raise RuntimeError(f"qformat check {path} {kw} found problems")
        return go

    cases: list[tuple[str, str, Callable[[], Any]]] = []
    for tag, path in (("plain", plain), ("qformat 1.2", qf)):
        cases += [(tag, "safetensors load_file (numpy)", lambda p=path: st_load(p)),
                  (tag, "safetensors safe_open + get_tensor each", _each(st_open, path, framework="numpy")),
                  (tag, "qformat load_file", lambda p=path: qformat.load_file(p)),
                  (tag, "qformat safe_open + get_tensor each", _each(qformat.safe_open, path)),
                  (tag, "qformat check (header only)", checked(path, payload=False)),
                  (tag, "qformat check (payload)", checked(path)),
                  (tag, "qformat inspect (CLI)", lambda p=path: inspect(p))]
    cases += [("qformat 1.2", "qformat load_file(verify=True)", lambda: qformat.load_file(qf, verify=True)),
              ("qformat 1.2", "qformat safe_open(verify=True) + get_tensor each", _each(qformat.safe_open, qf, verify=True)),
              ("qformat 1.2", "qformat check --digests", checked(qf, digests=True))]
    base: dict[str, float] = {}
    for tag, name, fn in cases:
        s = run.time(fn)
        if name == "safetensors load_file (numpy)":
            base[tag] = s
        x = s / base[tag]
        run.rows.append({"section": sec, "name": f"{name}, {tag} file", "ms": s * 1e3, "tensors": n,
                         "us_per_tensor": s / n * 1e6, "x_safetensors_load_file": x})
        print(f"  {name + ', ' + tag + ' file':<64} {s * 1e3:10.1f} ms {s / n * 1e6:8.2f} us/tensor {x:8.1f}x safetensors load_file",
              flush=True)
    for p in (plain, qf):
        os.remove(p)
