"""Sharded loading (qformat.jax.load_file with a sharding) on 8 simulated CPU devices.

XLA's device count is fixed when JAX starts, so the checks run in a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``.  For several schemes and three meshes
(8 devices splitting rows, 8 splitting columns, 2 x 4 splitting both) the worker checks that

* the global array equals the NumPy decode bit for bit, and each shard lives on its device;
* each device's callback (decoded by the native kernel on the host and put on that device,
  the default on CPU devices, or by the jitted decoder on the device: ``decoder="jax"``; both
  are run) read exactly the bytes that an
  independent per-element transcription of SPEC.md says its block-aligned box needs
  (tests/test_slicing.py ``needed``), with the aligned box itself computed here from the
  scheme's block sizes, not by qformat.slicing;
* with rows split, different devices read disjoint bytes (per-tensor scalars excepted);
* loaded ``packed=True`` with the same sharding, a tensor whose device boxes are all aligned
  becomes a QArray whose leaves hold, on each device, exactly as many bytes as that device's
  box needs (the same independent count), and whose jitted ``dequantize()`` (shard_map) gives
  the reference bits with the requested sharding; a misaligned one is SLICE_INVALID.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: scheme -> (quantize kwargs, column period of its aligned cuts: block size along K; None: whole rows)
SCHEMES = {
    "int": ({"bits": 4, "group_size": 32}, 32),
    "nf4": ({}, None),
    "mxfp4": ({}, 32),
    "nvfp4": ({}, 16),
    "fp8_e4m3": ({"granularity": "channel"}, 1),
}
SHAPES = {"w": (16, 256), "u": (16, 320)}  # u: 40 columns per device, not a multiple of 32
WITH_U = ("int",)  # u (misaligned column shards) with this scheme only: each shard shape compiles per device


@pytest.mark.parametrize("decoder", ["auto", "jax"])
def test_sharded_load_reads_only_each_shard(tmp_path, decoder):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.abspath(__file__), str(tmp_path), decoder], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["checked"] == (len(SCHEMES) + len(WITH_U)) * 3, summary


def _worker(tmp: str, decoder: str) -> None:
    import numpy as np
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import qformat
    from qformat.errors import QFormatError
    from tests.backends import same_bits
    from tests.test_slicing import needed

    assert len(jax.devices()) == 8, jax.devices()
    from qformat import kernels

    assert qformat.jax.host_decodes(jax.devices()[0], decoder) == (decoder == "auto" and kernels.enabled())
    devs = np.array(jax.devices())
    meshes = {
        "rows": NamedSharding(Mesh(devs, ("x",)), P("x", None)),
        "cols": NamedSharding(Mesh(devs, ("x",)), P(None, "x")),
        "2x4": NamedSharding(Mesh(devs.reshape(2, 4), ("x", "y")), P("x", "y")),
    }
    rng = np.random.default_rng(0)
    checked = 0
    packed_refused: list[str] = []
    for scheme, (kw, col_period) in SCHEMES.items():
        path = os.path.join(tmp, f"{scheme}.safetensors")
        shapes = {n: s for n, s in SHAPES.items() if n == "w" or scheme in WITH_U}
        qformat.save_file({n: qformat.quantize(rng.normal(size=s).astype(np.float32), scheme, **kw) for n, s in shapes.items()}, path)
        ref = qformat.load_file(path)
        with qformat.safe_open(path) as f:
            raw = {n: f.descriptor(n) for n in shapes}
            comps = {c: f.source.array(c) for c in f.header.entries}
            entries = f.header.entries
            start = f.header.data_start
        for mesh_name, sharding in meshes.items():
            log: list = []
            out = qformat.jax.load_file(path, sharding, read_log=log, decoder=decoder)
            for name, shape in shapes.items():
                arr = out[name]
                assert arr.sharding == sharding
                assert same_bits(np.asarray(arr), ref[name]), (scheme, mesh_name, name)
                recs = [r for r in log if r["tensor"] == name]
                index_map = sharding.addressable_devices_indices_map(shape)
                assert sorted(d.id for d in index_map) == sorted(r["device"].id for r in recs)
                for shard in arr.addressable_shards:
                    want = np.asarray(ref[name])[shard.index]
                    assert same_bits(np.asarray(shard.data), want)
                seen: dict[int, int] = {}
                need_bytes: dict[int, int] = {}
                for r in recs:
                    region = r["region"]
                    assert tuple(s.indices(n)[:2] for s, n in zip(index_map[r["device"]], shape)) == region
                    # the aligned box, from the scheme's block size alone
                    rows = region[0]
                    if col_period is None:
                        cols = (0, shape[1])
                    else:
                        lo, hi = region[1]
                        cols = (lo - lo % col_period, min(shape[1], -(-hi // col_period) * col_period))
                    assert r["aligned"] == (rows, cols), (scheme, mesh_name, name, r["aligned"], rows, cols)
                    idx = np.stack(np.meshgrid(np.arange(*rows), np.arange(*cols), indexing="ij"), -1).reshape(-1, 2)
                    need: dict = {}
                    needed(raw[name], comps, idx, need)
                    want_bytes = set()
                    for c, elems in need.items():
                        item = comps[c].itemsize
                        off = start + entries[c].begin
                        e = np.fromiter(elems, np.int64)
                        want_bytes.update((off + e[:, None] * item + np.arange(item)).reshape(-1).tolist())
                    got_bytes = set()
                    for rd in r["reads"]:
                        e = entries[rd.tensor]
                        assert start + e.begin <= rd.offset and rd.end <= start + e.end
                        got_bytes.update(range(rd.offset, rd.end))
                    assert got_bytes == want_bytes, (scheme, mesh_name, name, len(got_bytes), len(want_bytes))
                    need_bytes[r["device"].id] = len(want_bytes)
                    if mesh_name == "rows":
                        for rd in r["reads"]:
                            if entries[rd.tensor].end - entries[rd.tensor].begin <= 4:
                                continue  # a per-tensor scalar: every shard needs it
                            for b in range(rd.offset, rd.end):
                                assert seen.setdefault(b, r["device"].id) == r["device"].id, (scheme, name, b)
                # the same sharding, kept packed
                aligned = all(r["aligned"] == r["region"] for r in recs)
                try:
                    q = qformat.jax.load_file(path, lambda n, s, name=name, sharding=sharding: sharding if n == name else None, packed=True)[name]
                except QFormatError as e:
                    assert not aligned and e.code == "SLICE_INVALID", (scheme, mesh_name, name, e)
                    packed_refused.append(f"{scheme}/{mesh_name}/{name}")
                else:
                    assert aligned, (scheme, mesh_name, name)
                    y = jax.jit(lambda q: q.dequantize())(q)
                    assert y.sharding.is_equivalent_to(sharding, 2)
                    assert same_bits(np.asarray(y), ref[name])
                    held: dict[int, int] = {}
                    for leaf in jax.tree_util.tree_leaves(q):
                        for sh in leaf.addressable_shards:
                            held[sh.device.id] = held.get(sh.device.id, 0) + sh.data.nbytes
                    assert held == need_bytes, (scheme, mesh_name, name, held, need_bytes)
                checked += 1
    assert sorted(packed_refused) == ["int/2x4/u", "int/cols/u", "nf4/2x4/w", "nf4/cols/w"], packed_refused
    print(json.dumps({"checked": checked}))


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
