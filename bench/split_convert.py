"""Split conversion (issue 27): ``qformat quantize`` of a multi-shard checkpoint in one process
against ``--workers 2`` (two spawned processes, each writing its share of the shards, then the
merge), in the same run.

``python -m bench --only split_convert``.  The source is a sharded fp16 Llama-shaped checkpoint
(4 shards of equal size, random values; int4 g32 encoding time does not depend on them).  Rows:
the single-process quantize, the split one (with the merge), their ratio, and each part's wall
and CPU seconds as the parts record them (their work only, not their interpreter's start);
then the two parts run one after the other in this process, each with the machine to itself
as on its own host, and the merge: the slower part plus the merge estimates two hosts' time.  The
machine's cores may be shared with other work, so CPU seconds are reported next to wall
seconds: two parts each using about half the single run's CPU, in about the single run's wall
time, means the cores were busy, not that the split did not divide the work.  The split output is
checked byte for byte against the single-process output before anything is timed.
"""

from __future__ import annotations

import filecmp
import json
import os
import resource
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

MB = 1 << 20
INT4 = dict(scheme="int", bits=4, group_size=32)


def build(folder: Path, shards: int, per_shard: int, rows: int, cols: int) -> int:
    """``shards`` files of ``per_shard`` [rows, cols] fp16 weights each, index and config.json;
    returns the tensor bytes."""
    from qformat.container import write_file

    rng = np.random.default_rng(27)
    folder.mkdir()
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        arrays = {f"model.layers.{s * per_shard + i}.mlp.up_proj.weight":
                  (rng.standard_normal((rows, cols), np.float32) * 0.02).astype(np.float16) for i in range(per_shard)}
        write_file(folder / name, arrays, {"format": "pt"})
        weight_map.update({n: name for n in arrays})
        total += sum(a.nbytes for a in arrays.values())
        del arrays
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return total


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds (this process and its finished children) and the result."""
    c0, t0 = _self_cpu() + _children_cpu(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, _self_cpu() + _children_cpu() - c0, out


def _same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def bench_split_convert(run: Any, tmp: str, quick: bool) -> None:
    import qformat

    shards, per, rows, cols = (4, 1, 256, 1024) if quick else (4, 8, 4096, 4096)  # full: 1 GiB of fp16
    src = Path(tmp) / "split-src"
    total = build(src, shards, per, rows, cols)
    reps = 1 if quick else max(1, min(run.reps, 3))
    one, two = Path(tmp) / "split-one", Path(tmp) / "split-two"

    def single() -> Any:
        shutil.rmtree(one, ignore_errors=True)
        return qformat.quantize_checkpoint(src, one, **INT4)

    def workers() -> Any:
        shutil.rmtree(two, ignore_errors=True)
        return qformat.quantize_checkpoint(src, two, workers=2, **INT4)

    three = Path(tmp) / "split-three"

    def hosts() -> list[tuple[float, float, Any]]:
        """Parts 1/2 and 2/2 one after the other in this process (each with the machine to
        itself, as on two hosts), then the merge: wall, CPU, result of each."""
        from qformat.checkpoint import split

        shutil.rmtree(three, ignore_errors=True)
        shutil.rmtree(split.staging_folder(three), ignore_errors=True)
        out = [_timed(lambda k=k: qformat.quantize_checkpoint(src, three, part=f"{k}/2", **INT4)) for k in (1, 2)]
        return out + [_timed(lambda: split.merge(three))]

    single()  # warm-up: imports, the source in the page cache
    workers()
    if not _same_tree(one, two):
        raise AssertionError("the --workers 2 output differs from the single-process output")
    rows_single: list[tuple[float, float, Any]] = []
    rows_split: list[tuple[float, float, Any]] = []
    rows_hosts: list[list[tuple[float, float, Any]]] = []
    for _ in range(reps):  # alternated, so both see the same machine
        os.sync()
        rows_single.append(_timed(single))
        os.sync()
        rows_split.append(_timed(workers))
        os.sync()
        rows_hosts.append(hosts())
    t1 = statistics.median(r[0] for r in rows_single)
    c1 = statistics.median(r[1] for r in rows_single)
    t2 = statistics.median(r[0] for r in rows_split)
    c2 = statistics.median(r[1] for r in rows_split)
    parts = min(rows_split, key=lambda r: r[0])[2].parts
    common = {"section": "split_convert", "source_MB": total / MB, "shards": shards, "scheme": "int4 g32",
              "cpus": os.cpu_count(), "reps": reps}
    run.rows.append({**common, "name": "quantize, one process", "ms": t1 * 1e3, "cpu_s": c1})
    run.rows.append({**common, "name": "quantize --workers 2 (spawn + merge)", "ms": t2 * 1e3, "cpu_s": c2,
                     "speedup": t1 / t2, "parts": [{k: p[k] for k in ("part", "bytes", "seconds", "cpu_seconds")} for p in parts]})
    p1 = statistics.median(r[0][0] for r in rows_hosts)
    p2 = statistics.median(r[1][0] for r in rows_hosts)
    mg = statistics.median(r[2][0] for r in rows_hosts)
    pc = [statistics.median(r[i][1] for r in rows_hosts) for i in (0, 1)]
    est = max(p1, p2) + mg
    for k, (t, c) in enumerate(((p1, pc[0]), (p2, pc[1])), 1):
        run.rows.append({**common, "name": f"quantize --part {k}/2 alone (as on its own host)", "ms": t * 1e3, "cpu_s": c})
    run.rows.append({**common, "name": "merge (every byte verified, then hard links)", "ms": mg * 1e3})
    run.rows.append({**common, "name": "two hosts, estimated: slower part alone + merge", "ms": est * 1e3, "speedup": t1 / est})
    print(f"[split_convert] {total / MB:.0f} MB fp16 in {shards} shards -> int4 g32 on {os.cpu_count()} CPUs, median of {reps}", flush=True)
    print(f"[split_convert] one process       {t1:8.2f} s wall  {c1:7.2f} s CPU", flush=True)
    print(f"[split_convert] --workers 2       {t2:8.2f} s wall  {c2:7.2f} s CPU (with both interpreters' start)  "
          f"speed-up {t1 / t2:.2f}x", flush=True)
    for p in parts:
        print(f"[split_convert]   part {p['part']}/{p['parts']}: {p['bytes'] / MB:7.1f} MB written  {p['seconds']:7.2f} s wall  "
              f"{p['cpu_seconds']:7.2f} s CPU", flush=True)
    print(f"[split_convert] parts one after the other, each alone (as on 2 hosts): part 1/2 {p1:.2f} s wall {pc[0]:.2f} s CPU, "
          f"part 2/2 {p2:.2f} s wall {pc[1]:.2f} s CPU, merge {mg * 1e3:.0f} ms -> two hosts about {est:.2f} s, "
          f"speed-up {t1 / est:.2f}x", flush=True)
    for d in (one, two, three, src):
        shutil.rmtree(d, ignore_errors=True)
