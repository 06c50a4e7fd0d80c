"""Every remote read has a total deadline (qformat.remote.HttpOptions.deadline_s, issue 40).

A socket's read timeout restarts with every byte, so a server that drips a byte at a time held
a 38-byte index fetch for ~10 s at 4 bytes/s with a 2 s read timeout (and a 44-byte one for 44 s
at 1 byte/s).  Now a read ends with REMOTE_UNREACHABLE once it has taken
``deadline_s + received / min_bytes_per_s``: the drip servers below (tests/range_server.py) hold
an index, a side JSON, a header and a range read, in the body or in the status line and headers,
and each read ends shortly after its deadline, far sooner than the drip would.  The bounds are
generous (the drips would take ten times longer); no test measures speed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import remote
from qformat.cli import main
from qformat.errors import QFormatError

from .range_server import Faults, serve_ranges

DEADLINE = 1.0
SLACK = 3.0  # scheduling on a loaded machine: the drips below take 10 s and more


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    """Per-wait timeouts longer than the deadline, so the deadline is what ends each read."""
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(connect_timeout=5.0, read_timeout=5.0, retries=2,
                                                                      backoff_s=0.01, deadline_s=DEADLINE))
    for var in ("QFORMAT_HTTP_TOKEN", "HF_TOKEN", "QFORMAT_HTTP_DEADLINE", "QFORMAT_HTTP_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    remote.forget_opened()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("deadline")
    rng = np.random.default_rng(5)
    qformat.save_file({"w": qformat.quantize(rng.normal(size=(64, 64)).astype(np.float32), "int", bits=4, group_size=32),
                       "b": rng.normal(size=(2048,)).astype(np.float32)}, d / "m.safetensors")
    with qformat.safe_open(d / "m.safetensors") as f:
        wm = {n: "m.safetensors" for n in [*f.header.entries, *f.keys()]}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return d


def ends_by_deadline(fn, deadline: float = DEADLINE) -> QFormatError:
    t = time.monotonic()
    with pytest.raises(QFormatError) as e:
        fn()
    elapsed = time.monotonic() - t
    assert e.value.code == "REMOTE_UNREACHABLE", e.value
    assert "in time" in str(e.value) and "deadline" in str(e.value), e.value
    assert elapsed < deadline + SLACK, elapsed
    return e.value


def drip(**kw) -> Faults:
    return Faults(drip_bytes_per_s=4, drip_piece=1, **kw)  # a byte every 0.25 s


# -- what each drip would cost without the deadline: the test means something ----------------
def test_drip_is_slow_without_a_deadline(folder):
    """A drip with a generous deadline and rate: the index arrives, after several read timeouts'
    worth (every byte restarts the socket's timeout, so it alone bounds nothing)."""
    size = (folder / "model.safetensors.index.json").stat().st_size
    opts = remote.HttpOptions(connect_timeout=5.0, read_timeout=0.5, retries=0, deadline_s=120.0, min_bytes_per_s=1.0)
    piece = -(-size // 4)  # four pieces, each 0.4 s after the last: under the 0.5 s read timeout
    with serve_ranges(folder, Faults(drip_bytes_per_s=piece / 0.4, drip_piece=piece)) as url:
        t = time.monotonic()
        data = remote.fetch_bytes(url + "model.safetensors.index.json", 1 << 20, opts)
        assert data == (folder / "model.safetensors.index.json").read_bytes()
        assert time.monotonic() - t > 2 * opts.read_timeout  # longer than the read timeout: a drip resets it


# -- each kind of read ends at its deadline ---------------------------------------------------
def test_index_fetch(folder):
    with serve_ranges(folder, drip()) as url:
        ends_by_deadline(lambda: remote.fetch_bytes(url + "model.safetensors.index.json", 1 << 20))
        ends_by_deadline(lambda: qformat.safe_open(url + "model.safetensors.index.json"))


def test_side_json_fetch(folder):
    from qformat.checkpoint.source import read_json_file

    with serve_ranges(folder, drip()) as url:
        ends_by_deadline(lambda: read_json_file(url + "config.json"))


def test_header_read(folder):
    with serve_ranges(folder, drip()) as url:
        ends_by_deadline(lambda: qformat.safe_open(url + "m.safetensors"))


def test_range_read(folder):
    """The header arrives at full speed; then every tensor's bytes drip."""
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + "m.safetensors") as f:
            url.faults.drip_bytes_per_s, url.faults.drip_piece = 4, 1
            ends_by_deadline(lambda: f.get_tensor("b"))


@pytest.mark.parametrize("target", ["model.safetensors.index.json", "m.safetensors"])
def test_status_line_and_headers_drip(folder, target):
    """A drip before the body (status line and headers, inside the HTTP client): ended too."""
    with serve_ranges(folder, drip(drip_headers=True)) as url:
        if target.endswith(".json"):
            ends_by_deadline(lambda: remote.fetch_bytes(url + target, 1 << 20))
        else:
            ends_by_deadline(lambda: qformat.safe_open(url + target))


def test_silent_server(folder):
    """A server that accepts and never answers, with a read timeout far past the deadline."""
    with serve_ranges(folder, Faults(delay_s=30.0)) as url:
        ends_by_deadline(lambda: qformat.safe_open(url + "m.safetensors"))


def test_retries_and_backoff_stay_inside_the_deadline(folder, monkeypatch):
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(retries=50, backoff_s=0.2, deadline_s=DEADLINE))
    with serve_ranges(folder, Faults(fail_5xx_first=1000)) as url:
        ends_by_deadline(lambda: qformat.safe_open(url + "m.safetensors"))
        assert len(url.log.gets()) < 10  # the backoff doubles; the deadline stops the tries, not the 50 retries


def test_allowance_grows_with_the_bytes_received(tmp_path):
    """A body slower than deadline_s alone but faster than min_bytes_per_s completes: the
    allowance is deadline_s + received / min_bytes_per_s."""
    data = json.dumps({"weight_map": {f"t{i}": "m.safetensors" for i in range(400)}}).encode()
    (tmp_path / "i.json").write_bytes(data)
    opts = remote.HttpOptions(read_timeout=5.0, retries=0, deadline_s=0.3, min_bytes_per_s=1000)
    with serve_ranges(tmp_path, Faults(drip_bytes_per_s=len(data) / 1.0, drip_piece=256)) as url:  # about 1 s in all
        t = time.monotonic()
        assert remote.fetch_bytes(url + "i.json", 1 << 20, opts) == data
        assert time.monotonic() - t > opts.deadline_s  # took longer than deadline_s alone allows
    assert len(data) / opts.min_bytes_per_s > 3  # and the allowance it earned is far past that


def test_fsspec_read_has_the_deadline(folder, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/qformat-deadline/m.safetensors", (folder / "m.safetensors").read_bytes())
    try:
        from fsspec.implementations.memory import MemoryFileSystem

        real = MemoryFileSystem.cat_file

        def stuck(self, path, start=None, end=None, **kw):
            time.sleep(20)  # a backend call that hangs
            return real(self, path, start=start, end=end, **kw)

        monkeypatch.setattr(MemoryFileSystem, "cat_file", stuck)
        ends_by_deadline(lambda: qformat.safe_open("memory://qformat-deadline/m.safetensors"))
    finally:
        monkeypatch.undo()
        fs.rm("/qformat-deadline", recursive=True)


# -- setting it --------------------------------------------------------------------------------
def test_environment_variable(monkeypatch):
    monkeypatch.setenv("QFORMAT_HTTP_DEADLINE", "7.5")
    assert remote.HttpOptions.from_env().deadline_s == 7.5
    assert remote.HttpOptions().deadline_s == 60.0  # the documented default
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv("QFORMAT_HTTP_DEADLINE", bad)
        with pytest.raises(QFormatError) as e:
            remote.HttpOptions.from_env()
        assert e.value.code == "REMOTE_UNREACHABLE" and "QFORMAT_HTTP_DEADLINE" in str(e.value)


@pytest.mark.parametrize("command", [["check"], ["inspect"], ["check", "--json"]])
def test_cli_deadline_option(folder, capsys, monkeypatch, command):
    """``--deadline`` on the command line sets it (the default options here would allow 60 s)."""
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(read_timeout=5.0, retries=1, backoff_s=0.01))
    with serve_ranges(folder, drip()) as url:
        t = time.monotonic()
        code = main([command[0], url + "m.safetensors", *command[1:], "--deadline", "1"])
        out = capsys.readouterr()
        assert code != 0 and "REMOTE_UNREACHABLE" in out.out + out.err, out
        assert time.monotonic() - t < 1.0 + SLACK
    assert remote.DEFAULT_OPTIONS.deadline_s == 60.0  # restored after the command


@pytest.mark.parametrize("bad", ["0", "-3", "x", "inf"])
def test_cli_bad_deadline_is_a_usage_error(capsys, bad):
    with pytest.raises(SystemExit) as e:
        main(["check", "x.safetensors", f"--deadline={bad}"])
    assert e.value.code == 2 and "--deadline" in capsys.readouterr().err
