"""Process groups for the multi-controller JAX tests: start one worker process per argv on
this machine (``jax.distributed.initialize`` on a loopback port), wait for all of them, and
kill them all on the first failure or at a timeout (the others would wait for it in a
collective).  Shared by test_jax_multiprocess.py and test_jax_multiprocess_minilm.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(text: str) -> str:
    """The end of a worker's stderr without gloo's connection chatter."""
    return "\n".join(line for line in text.splitlines() if "[Gloo]" not in line)[-4000:]


def run_group(folder: str, tag: str, worker: str, argvs: list[list[str]], local: int, timeout_s: float) -> str | None:
    """Run ``python -m worker`` once per argv (``{port}`` filled in with a free loopback port),
    each process with ``local`` CPU devices, to the end.  None when all exit 0, else what failed
    with each one's stderr (tail).  A port taken between the probe and the coordinator's bind is
    tried once more with another."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={local}",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1")
    env.pop("JAX_NUM_CPU_DEVICES", None)
    for attempt in range(2):
        port = str(free_port())
        procs, errs = [], []
        timed_out = False
        try:
            for i, argv in enumerate(argvs):
                err = open(os.path.join(folder, f"stderr-{tag}-{i}.txt"), "w+")
                errs.append(err)
                procs.append(subprocess.Popen([sys.executable, "-m", worker] + [a.replace("{port}", port) for a in argv],
                                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err))
            deadline = time.monotonic() + timeout_s
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs):
                    break  # the others would wait for it in a collective
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait(timeout=30)
        texts = []
        for err in errs:
            err.seek(0)
            texts.append(err.read())
            err.close()
        rcs = [p.returncode for p in procs]
        if not timed_out and all(rc == 0 for rc in rcs):
            return None
        if attempt == 0 and any("address already in use" in t.lower() for t in texts):
            continue
        why = f"{tag}: return codes {rcs}" + (f", killed after {timeout_s} s" if timed_out else "")
        return why + "\n" + "\n".join(f"--- process {i} stderr (tail) ---\n{tail(t)}" for i, t in enumerate(texts))
    raise AssertionError("unreachable")


def run_worker(fn: Callable[..., Any], *args: Any) -> None:
    """A worker's ``__main__``: run ``fn(*args)``; on any failure print the traceback and exit at
    once.  A normal exit waits in jax.distributed's shutdown barrier for the other processes,
    which wait for this one in their next collective until gloo times out."""
    try:
        fn(*args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def reads_of(log: list) -> dict[str, list]:
    """A ``read_log`` as JSON: tensor -> [{device id, region, reads: [[component, file offset,
    length], ...]}, ...]."""
    out: dict[str, list] = {}
    for r in log:
        out.setdefault(r["tensor"], []).append({
            "device": None if r["device"] is None else r["device"].id,
            "region": None if r["region"] is None else [list(b) for b in r["region"]],
            "reads": [[rd.tensor, rd.offset, rd.length] for rd in r["reads"]]})
    return out
