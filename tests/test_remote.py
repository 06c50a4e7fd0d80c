"""Reading http(s):// checkpoints by byte ranges (qformat.remote) against a loopback server.

Every remote result is compared with the same call on the local file (bit-identical arrays,
equal reports); byte counts are the server's own (tests/range_server.py counts what it sent);
each fault mode of the server gives its coded error, or succeeds after a retry.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import remote
from qformat.check import check
from qformat.errors import QFormatError
from qformat.inspection import inspect_checkpoint

from .range_server import Faults, serve_ranges

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fast_options(monkeypatch):
    """Short timeouts and backoff (the faults are on loopback); ranges coalesced only when
    adjacent, so byte counts are exact."""
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(
        connect_timeout=2.0, read_timeout=2.0, retries=2, backoff_s=0.01, coalesce_gap=0))
    for var in ("QFORMAT_HTTP_TOKEN", "HF_TOKEN", "QFORMAT_HTTP_ALLOW_REDIRECTS"):
        monkeypatch.delenv(var, raising=False)
    remote.forget_opened()  # each test opens its files anew


def _tensors(rng: np.random.Generator, prefix: str = "") -> dict:
    return {
        prefix + "w1": qformat.quantize(rng.normal(size=(64, 96)).astype(np.float32), "int", bits=4, group_size=32),
        prefix + "b1": rng.normal(size=(64, 4)).astype(np.float32),
        prefix + "w2": qformat.quantize(rng.normal(size=(16, 64)).astype(np.float32), "nf4", double_quant=True),
        prefix + "w3": qformat.quantize(rng.normal(size=(16, 32)).astype(np.float32), "nvfp4", dtype="bfloat16"),
        prefix + "steps": np.arange(3, dtype=np.int64),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """m.safetensors (one file) and a two-shard checkpoint (model.safetensors.index.json)."""
    d = tmp_path_factory.mktemp("remote")
    rng = np.random.default_rng(7)
    qformat.save_file(_tensors(rng), d / "m.safetensors")
    weight_map = {}
    for i, prefix in enumerate(("a.", "b.")):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        qformat.save_file(_tensors(rng, prefix), d / name)
        with qformat.safe_open(d / name) as f:
            weight_map.update({n: name for n in f.header.entries})  # every stored tensor ...
            weight_map.update({n: name for n in f.keys()})  # ... and every logical one
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical: same dtype, shape and bytes."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def code_of(fn) -> str:
    with pytest.raises(QFormatError) as e:
        fn()
    return e.value.code


# -- equal results ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.safetensors", "model.safetensors.index.json"])
def test_safe_open_url_equals_local(folder, name):
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + name) as r, qformat.safe_open(folder / name) as f:
            assert r.keys() == f.keys() and r.metadata() == f.metadata()
            for n in f.keys():
                assert same(r.get_tensor(n), f.get_tensor(n)), n
                if f.is_quantized(n):
                    assert r.descriptor(n) == f.descriptor(n)


@pytest.mark.parametrize("name", ["m.safetensors", "model.safetensors.index.json"])
def test_slices_url_equal_local(folder, name):
    p = "a." if "index" in name else ""
    keys = {
        p + "w1": [(slice(8, 16),), (slice(3, 40), slice(5, 70)), (5, Ellipsis), (slice(0, 64, 3), slice(None))],
        p + "w2": [(slice(1, 9), slice(60, 64)), (0,)],
        p + "w3": [(slice(2, 5), slice(16, 32))],
        p + "b1": [(slice(3, 9),), (slice(None), 2)],
    }
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + name) as r, qformat.safe_open(folder / name) as f:
            for n, ks in keys.items():
                for k in ks:
                    assert same(r.get_slice(n)[k], f.get_slice(n)[k]), (n, k)
            qr, qf = r.get_qtensor_slice(p + "w1", (slice(8, 16),)), f.get_qtensor_slice(p + "w1", (slice(8, 16),))
            assert qr.descriptor == qf.descriptor
            assert sorted(qr.components) == sorted(qf.components)
            for c in qf.components:
                assert same(qr.components[c], qf.components[c]), c


def test_one_tensor_slice_fetches_only_its_rows(folder):
    """Rows 8..16 of w1: the server sends the header plus those rows of each of w1's stored
    components (each row-major with 64 rows), not one byte more."""
    with qformat.safe_open(folder / "m.safetensors") as f:
        header = f.header
        comps = sorted({c for _, c in f.validated_descriptor("w1").references()})
    entries = [header.entries[c] for c in comps]
    assert all(e.shape[0] == 64 for e in entries), [e.shape for e in entries]
    expected = header.data_start + sum(e.nbytes // 64 * 8 for e in entries)
    data = header.file_size - header.data_start
    assert expected - header.data_start < data // 4  # the test means something: far less than the data
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + "m.safetensors") as r:
            r.get_slice("w1")[8:16]
            assert url.log.bytes_sent == expected
            assert r.source.bytes_fetched == expected
            before = url.log.bytes_sent
            r.get_slice("w1")[9:15]  # inside what is fetched: nothing more
            assert url.log.bytes_sent == before


def test_plain_rows_fetch_only_those_rows(folder):
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + "m.safetensors") as r:
            url.log.reset()
            r.get_slice("b1")[10:20]
            assert url.log.bytes_sent == 10 * 4 * 4  # ten rows of four float32


def test_header_fetched_first_and_alone(folder):
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + "m.safetensors") as r:
            ranges = [rng for _, _, rng in url.log.gets()]
            assert ranges == ["bytes=0-7", f"bytes=8-{r.header.data_start - 1}"]


@pytest.mark.parametrize("data", [b"", b"\x05\x00\x00"], ids=["empty", "3-bytes"])
def test_file_shorter_than_the_prefix(tmp_path, data):
    (tmp_path / "short.safetensors").write_bytes(data)
    with serve_ranges(tmp_path) as url:
        assert code_of(lambda: qformat.safe_open(url + "short.safetensors")) == "HEADER_TOO_SMALL"
    assert code_of(lambda: qformat.safe_open(tmp_path / "short.safetensors")) == "HEADER_TOO_SMALL"


def test_header_length_over_the_limit_fetches_8_bytes(tmp_path):
    from qformat import tables

    n = tables.limits()["max_header_bytes"] + 1
    (tmp_path / "big.safetensors").write_bytes(struct.pack("<Q", n) + b"{}" + b" " * 100)
    with serve_ranges(tmp_path) as url:
        assert code_of(lambda: qformat.safe_open(url + "big.safetensors")) == "HEADER_TOO_LARGE"
        assert url.log.bytes_sent == 8


def test_inspect_and_check_url_equal_local(folder):
    with serve_ranges(folder) as url:
        for name in ("m.safetensors", "model.safetensors.index.json"):
            a, b = inspect_checkpoint(url + name).to_dict(), inspect_checkpoint(folder / name).to_dict()
            a.pop("path"), b.pop("path")
            assert a == b
            url.log.reset()
            ra, rb = check(url + name), check(str(folder / name))
            assert ra.ok and rb.ok
            assert [len(x.tensors) if hasattr(x, "tensors") else None for x in ra.files] == \
                   [len(x.tensors) if hasattr(x, "tensors") else None for x in rb.files]
            assert [p.code for p in ra.problems] == [p.code for p in rb.problems] == []


def test_inspect_reads_headers_only(folder):
    """inspect of a sharded URL asks for the index and the shards' headers, no tensor byte."""
    starts = {}
    for i in (1, 2):
        name = f"model-0000{i}-of-00002.safetensors"
        with qformat.safe_open(folder / name) as f:
            starts["/" + name] = f.header.data_start
    with serve_ranges(folder) as url:
        inspect_checkpoint(url + "model.safetensors.index.json")
        shard_gets = [(p, rng) for _, p, rng in url.log.gets() if p in starts]
        assert {p for p, _ in shard_gets} == set(starts)
        for p, rng in shard_gets:
            assert int(rng.rsplit("-", 1)[1]) < starts[p], (p, rng)  # ends inside the header
        index_size = (folder / "model.safetensors.index.json").stat().st_size
        # the index is read twice (the checkpoint and check's index rules), each shard's header once
        assert url.log.bytes_sent <= 2 * index_size + sum(starts.values())


def test_cli_on_urls_no_traceback(folder):
    with serve_ranges(folder) as url:
        for args in (["inspect", url + "model.safetensors.index.json"], ["check", url + "m.safetensors"],
                     ["diff", url + "m.safetensors", str(folder / "m.safetensors")]):
            r = subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
            assert r.returncode == 0, (args, r.stdout, r.stderr)
            assert "Traceback" not in r.stderr + r.stdout
            assert "HTTP request" in r.stderr and "fetched" in r.stderr
        r = subprocess.run([sys.executable, "-m", "qformat", "inspect", url + "missing.safetensors"], capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
        assert r.returncode != 0 and "[REMOTE_HTTP_ERROR]" in r.stderr and "404" in r.stderr
        assert "Traceback" not in r.stderr + r.stdout



def test_cli_fetch_note_counts_each_command_alone(folder, capsys):
    """In one process, a command on a local file after one on a URL says nothing about fetching
    (the note is the command's own fetches, not the process's running total)."""
    from qformat.cli import main

    remote.forget_opened()
    with serve_ranges(folder) as url:
        assert main(["inspect", url + "m.safetensors"]) == 0
    assert "fetched" in capsys.readouterr().err
    assert main(["inspect", str(folder / "m.safetensors")]) == 0
    assert capsys.readouterr().err == ""

# -- fault modes ------------------------------------------------------------------------------
def _read_all(url: str) -> dict[str, np.ndarray]:
    with qformat.safe_open(url) as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def _local(folder: Path) -> dict[str, np.ndarray]:
    with qformat.safe_open(folder / "m.safetensors") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


@pytest.mark.parametrize("faults", [Faults(drop_first=2), Faults(fail_5xx_first=2), Faults(delay_s=3.0, delay_first=1)],
                         ids=["dropped", "5xx", "slow-once"])
def test_transient_faults_are_retried(folder, faults):
    with serve_ranges(folder, faults) as url:
        got = _read_all(url + "m.safetensors")
        assert len(url.log.gets()) > 2  # the faulty answers were retried
    want = _local(folder)
    assert got.keys() == want.keys() and all(same(got[n], want[n]) for n in want)


@pytest.mark.parametrize("faults, code", [
    (Faults(drop_first=100), "REMOTE_UNREACHABLE"),
    (Faults(fail_5xx_first=100), "REMOTE_HTTP_ERROR"),
    (Faults(status=403), "REMOTE_HTTP_ERROR"),
    (Faults(status=401), "REMOTE_HTTP_ERROR"),
    (Faults(wrong_length=True), "REMOTE_RANGE_INVALID"),
    (Faults(huge_length=True), "REMOTE_RANGE_INVALID"),
    (Faults(ignore_range=True), "REMOTE_RANGE_IGNORED"),
    (Faults(many_headers=1000), "REMOTE_UNREACHABLE"),  # the HTTP client caps header lines (100)
], ids=["dropped", "5xx", "403", "401", "wrong-length", "huge-length", "ignores-range", "endless-headers"])
def test_persistent_faults_are_coded(folder, faults, code):
    with serve_ranges(folder, faults) as url:
        assert code_of(lambda: _read_all(url + "m.safetensors")) == code
        assert code_of(lambda: inspect_checkpoint(url + "m.safetensors")) == code


def test_404_is_coded(folder):
    with serve_ranges(folder) as url:
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(url + "nope.safetensors")
        assert e.value.code == "REMOTE_HTTP_ERROR" and "404" in str(e.value)
        assert code_of(lambda: qformat.safe_open(url + "nope.safetensors.index.json")) == "REMOTE_HTTP_ERROR"


def test_slow_server_times_out(folder, monkeypatch):
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(connect_timeout=1, read_timeout=0.3, retries=1, backoff_s=0.01))
    with serve_ranges(folder, Faults(delay_s=2.0)) as url:
        t = time.monotonic()
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(url + "m.safetensors")
        assert e.value.code == "REMOTE_UNREACHABLE" and "timed out" in str(e.value)
        assert time.monotonic() - t < 1.9  # two tries of 0.3 s, not the server's 2 s each


def test_range_ignored_body_is_not_read(tmp_path):
    """A 32 MiB file served whole for a range request: refused after the status line, so the
    client counts no bytes and the server could not send them all."""
    rng = np.random.default_rng(1)
    qformat.save_file({"big": rng.integers(0, 255, size=(32, 1 << 20), dtype=np.uint8)}, tmp_path / "big.safetensors")
    size = (tmp_path / "big.safetensors").stat().st_size
    with serve_ranges(tmp_path, Faults(ignore_range=True)) as url:
        reader = remote.HttpRangeReader(url + "big.safetensors")
        assert code_of(lambda: reader.read(0, 8)) == "REMOTE_RANGE_IGNORED"
        assert reader.bytes_fetched == 0
        time.sleep(0.3)
        assert url.log.bytes_sent < size


@pytest.mark.parametrize("validators", [dict(), dict(etag=False)], ids=["etag", "last-modified"])
def test_changed_file_is_refused(folder, validators):
    # Requests 0 and 1 read the header; every later answer comes from a changed file.
    with serve_ranges(folder, Faults(change_after=2, **validators)) as url:
        with qformat.safe_open(url + "m.safetensors") as r:
            assert code_of(lambda: r.get_tensor("w1")) == "REMOTE_CHANGED"
            sent = [h.get("If-Range") for h in url.log.headers[2:]]
            assert sent and all(s for s in sent)  # the first answer's validator went with every later request
        # the refused file is not reused: opening it again reads the (new) header again
        assert qformat.safe_open(url + "m.safetensors").keys()


def test_range_past_the_end_is_416(folder):
    with serve_ranges(folder) as url:
        reader = remote.HttpRangeReader(url + "m.safetensors")
        reader.read(0, 8)
        with pytest.raises(QFormatError) as e:
            reader.read(reader.size + 10, 4)
        assert e.value.code == "REMOTE_HTTP_ERROR" and "416" in str(e.value)


def test_cross_host_redirect(folder, monkeypatch):
    with serve_ranges(folder, host="127.0.0.1") as target:
        other = target.replace("127.0.0.1", "localhost")  # the same server under another host name
        with serve_ranges(folder, Faults(redirect_to=other)) as origin:
            assert code_of(lambda: qformat.safe_open(origin + "m.safetensors")) == "REMOTE_REDIRECT_REFUSED"
            assert target.log.requests == []
            monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "s3cret-token")
            monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(allow_cross_host=True, retries=0, coalesce_gap=0,
                                                                              token=None))
            monkeypatch.setattr(remote.HttpOptions, "from_env", classmethod(lambda cls: remote.DEFAULT_OPTIONS))
            origin.log.reset()
            got = _read_all(origin + "m.safetensors")
            want = _local(folder)
            assert all(same(got[n], want[n]) for n in want)
            assert all(h.get("Authorization") == "Bearer s3cret-token" for h in origin.log.headers)
            assert target.log.headers and not any("Authorization" in h for h in target.log.headers)


def test_redirect_to_another_port_is_another_host(folder, tmp_path):
    with serve_ranges(folder) as target:
        with serve_ranges(tmp_path, Faults(redirect_to=target)) as origin:
            # the same host name (127.0.0.1), another port: another origin, refused by default
            assert code_of(lambda: qformat.safe_open(origin + "m.safetensors")) == "REMOTE_REDIRECT_REFUSED"


def test_same_host_redirect_is_followed(folder, tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir()
    (real / "m.safetensors").write_bytes((folder / "m.safetensors").read_bytes())
    monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "s3cret-token")
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", None)
    with serve_ranges(tmp_path, Faults(redirect_from="/alias/")) as url:
        url.faults.redirect_to = url + "real/"
        got = _read_all(url + "alias/m.safetensors")
        paths = [p for _, p, _ in url.log.gets()]
        assert "/alias/m.safetensors" in paths and "/real/m.safetensors" in paths
        assert all(h.get("Authorization") == "Bearer s3cret-token" for h in url.log.headers)  # same host: kept
    want = _local(folder)
    assert all(same(got[n], want[n]) for n in want)


def test_token_from_environment_never_in_messages(folder, monkeypatch):
    with serve_ranges(folder, Faults(require_token="s3cret-token")) as url:
        assert code_of(lambda: qformat.safe_open(url + "m.safetensors")) == "REMOTE_HTTP_ERROR"
        monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "wrong-token")
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(url + "m.safetensors")
        assert "401" in str(e.value) and "wrong-token" not in str(e.value)
        monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "s3cret-token")
        monkeypatch.setattr(remote, "DEFAULT_OPTIONS", None)  # options (and token) from the environment
        got = _read_all(url + "m.safetensors")
    want = _local(folder)
    assert all(same(got[n], want[n]) for n in want)


def test_index_shards_resolve_relative_to_the_index_url(folder, tmp_path):
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    for p in folder.iterdir():
        if p.name.startswith("model"):
            (sub / p.name).write_bytes(p.read_bytes())
    with serve_ranges(tmp_path) as url:
        with qformat.safe_open(url + "deep/er/model.safetensors.index.json") as r:
            assert len(r.shards) == 2
            paths = {p for _, p, _ in url.log.gets()}
            assert paths == {"/deep/er/model.safetensors.index.json", "/deep/er/model-00001-of-00002.safetensors",
                             "/deep/er/model-00002-of-00002.safetensors"}


def test_fuzz_mutants_same_codes_as_disk(tmp_path):
    """A handful of the fuzz corpus's mutants: the code read over HTTP is the code read from disk."""
    from .fuzz import mutants

    d = tmp_path / "m"
    d.mkdir()
    codes = []
    with serve_ranges(d) as url:
        for i, (label, data) in enumerate(mutants(40, seed=3)):
            (d / f"{i}.safetensors").write_bytes(data)

            def local(p=d / f"{i}.safetensors"):
                with qformat.safe_open(p) as f:
                    return {n: f.get_tensor(n) for n in f.keys()}

            def over_http(u=url + f"{i}.safetensors"):
                with qformat.safe_open(u) as f:
                    return {n: f.get_tensor(n) for n in f.keys()}

            try:
                want = ("ok", local())
            except QFormatError as e:
                want = ("code", e.code)
            try:
                got = ("ok", over_http())
            except QFormatError as e:
                got = ("code", e.code)
            assert got[0] == want[0], (label, got, want)
            if got[0] == "code":
                assert got[1] == want[1], label
                codes.append(got[1])
            else:
                assert got[1].keys() == want[1].keys() and all(same(got[1][n], want[1][n]) for n in want[1]), label
    assert len(set(codes)) >= 3, codes  # the handful covers several kinds of damage


# -- framework readers ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.safetensors", "model.safetensors.index.json"])
def test_torch_reader_over_http(folder, name):
    torch = pytest.importorskip("torch")
    from qformat.torch import load_file, safe_open

    p = "a." if "index" in name else ""
    with serve_ranges(folder) as url:
        if "index" not in name:
            with safe_open(url + name) as r, safe_open(folder / name) as f:
                for n in f.keys():
                    assert torch.equal(r.get_tensor(n), f.get_tensor(n)), n
                for k in [(slice(8, 16),), (slice(3, 40), slice(5, 70))]:
                    assert torch.equal(r.get_slice(p + "w1")[k], f.get_slice(p + "w1")[k]), k
                qr, qf = r.get_qtensor_slice(p + "w1", (slice(8, 16),)), f.get_qtensor_slice(p + "w1", (slice(8, 16),))
                assert all(torch.equal(qr.components[c], qf.components[c]) for c in qf.components)
        got, want = load_file(url + name), load_file(folder / name)
        assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)


def test_torch_slice_fetches_only_the_box(folder):
    pytest.importorskip("torch")
    from qformat.torch import safe_open

    with serve_ranges(folder) as url:
        with safe_open(url + "m.safetensors") as r:
            head = url.log.bytes_sent
            r.get_slice("w1")[8:16]
            with qformat.safe_open(folder / "m.safetensors") as f:
                comps = {c for _, c in f.validated_descriptor("w1").references()}
                rows = sum(f.header.entries[c].nbytes // 64 * 8 for c in comps)
            assert url.log.bytes_sent - head == rows


def test_jax_reader_over_http(folder):
    pytest.importorskip("jax")
    from qformat.jax import load_file, load_region

    with serve_ranges(folder) as url:
        for name in ("m.safetensors", "model.safetensors.index.json"):
            got, want = load_file(url + name), load_file(folder / name)
            assert got.keys() == want.keys()
            assert all(same(np.asarray(got[n]), np.asarray(want[n])) for n in want), name
        remote.forget_opened()  # load_file fetched every byte: open the file afresh
        with qformat.safe_open(url + "m.safetensors") as r, qformat.safe_open(folder / "m.safetensors") as f:
            head = url.log.bytes_sent
            a = load_region(r, "w1", ((8, 16), (0, 96)))
            assert same(np.asarray(a), np.asarray(load_region(f, "w1", ((8, 16), (0, 96)))))
            comps = {c for _, c in f.validated_descriptor("w1").references()}
            assert url.log.bytes_sent - head == sum(f.header.entries[c].nbytes // 64 * 8 for c in comps)


def test_bench_remote_section_quick(tmp_path):
    """bench/remote.py in --quick form: its rows exist and slice < inspect+data < download."""
    from bench.harness import main

    out = tmp_path / "r.json"
    assert main(["--quick", "--only", "remote", "--json", str(out), "--tmp", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"] if r["section"] == "remote"}
    assert len(rows) == 5
    by = {n.split(" (")[0].split(",")[0]: r for n, r in rows.items()}
    download = by["download every shard whole"]["MB_fetched"]
    assert by["qformat inspect"]["MB_fetched"] < download / 2
    assert by["qformat check"]["MB_fetched"] >= download  # every payload byte (and the index)
    sliced = next(r for n, r in rows.items() if "get_slice" in n)["MB_fetched"]
    assert sliced < next(r for n, r in rows.items() if "whole" in n and "layer" in n)["MB_fetched"]


def test_large_tensor_fetched_once(tmp_path):
    """A tensor large enough for the decoder's worker threads: each byte is fetched once (the
    threads asking for the same component wait for one fetch)."""
    from bench.remote import _layer

    qformat.save_file({"w": _layer(np.random.default_rng(2), 4096, 8192)}, tmp_path / "big.safetensors")
    with qformat.safe_open(tmp_path / "big.safetensors") as f:
        want = f.get_tensor("w")
        size = f.header.file_size
    with serve_ranges(tmp_path) as url:
        with qformat.safe_open(url + "big.safetensors") as r:
            assert same(r.get_tensor("w"), want)
        assert url.log.bytes_sent == size


def test_messages_hide_credentials_in_the_url(folder):
    with serve_ranges(folder) as url:
        signed = url.replace("http://", "http://user:pa55word@") + "nope.safetensors?X-Signature=abc123secret"
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(signed)
        assert e.value.code == "REMOTE_HTTP_ERROR"
        assert "pa55word" not in str(e.value) and "abc123secret" not in str(e.value) and "nope.safetensors" in str(e.value)


def test_malformed_url_is_coded():
    assert code_of(lambda: qformat.safe_open("http://")) == "REMOTE_UNREACHABLE"


def test_slow_drip_is_cut_off(folder, monkeypatch):
    """A server sending bodies at 4 KB/s: each answer is cut off at the deadline (read timeout +
    size / min_bytes_per_s), so the whole attempt ends long before the drip would."""
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(read_timeout=0.3, retries=1, backoff_s=0.01,
                                                                      min_bytes_per_s=100_000))
    size = (folder / "m.safetensors").stat().st_size
    with serve_ranges(folder, Faults(drip_bytes_per_s=4000)) as url:
        t = time.monotonic()
        with pytest.raises(QFormatError) as e:
            _read_all(url + "m.safetensors")
        assert e.value.code == "REMOTE_UNREACHABLE" and "bytes/s" in str(e.value)
        assert time.monotonic() - t < size / 4000 / 2  # well under the drip's own time


def test_verify_digests_over_http(folder, tmp_path):
    """verify=True hashes the stored bytes fetched by ranges: equal tensors for the intact
    file, DIGEST_MISMATCH for one whose payload byte was flipped, as from disk."""
    with serve_ranges(folder) as url:
        with qformat.safe_open(url + "m.safetensors", verify=True) as r, qformat.safe_open(folder / "m.safetensors") as f:
            assert f.model.digests is not None  # the file records digests, so verify checks something
            for n in f.keys():
                assert same(r.get_tensor(n), f.get_tensor(n)), n
    data = bytearray((folder / "m.safetensors").read_bytes())
    with qformat.safe_open(folder / "m.safetensors") as f:
        e = f.header.entries["b1"]
        data[f.header.data_start + e.begin] ^= 0x40
    (tmp_path / "bad.safetensors").write_bytes(bytes(data))
    with serve_ranges(tmp_path) as url:
        with qformat.safe_open(url + "bad.safetensors", verify=True) as r:
            assert code_of(lambda: r.get_tensor("b1")) == "DIGEST_MISMATCH"
    with qformat.safe_open(tmp_path / "bad.safetensors", verify=True) as f:
        assert code_of(lambda: f.get_tensor("b1")) == "DIGEST_MISMATCH"


def test_threads_reading_one_file_get_right_values(folder):
    """Slices (whose dry run views unfetched bytes) and whole tensors read from one open file
    by several threads at once: every result equals the local one."""
    from concurrent.futures import ThreadPoolExecutor

    with qformat.safe_open(folder / "m.safetensors") as f:
        want = {n: f.get_tensor(n) for n in f.keys()}
        want_slice = f.get_slice("w1")[8:16]
    for _ in range(3):
        with serve_ranges(folder) as url:
            with qformat.safe_open(url + "m.safetensors") as r:
                jobs = [lambda: ("slice", r.get_slice("w1")[8:16])] * 4 + [lambda n=n: (n, r.get_tensor(n)) for n in want]
                with ThreadPoolExecutor(6) as pool:
                    results = list(pool.map(lambda j: j(), jobs))
        for n, a in results:
            assert same(a, want_slice if n == "slice" else want[n]), n


# -- fsspec URLs (s3://, gs://, hf://, ...), through fsspec's in-memory file system -------------
def test_fsspec_memory_urls_equal_local(folder):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in folder.iterdir():
        fs.pipe(f"/qformat-test/{p.name}", p.read_bytes())
    try:
        base = "memory://qformat-test/"
        for name in ("m.safetensors", "model.safetensors.index.json"):
            with qformat.safe_open(base + name) as r, qformat.safe_open(folder / name) as f:
                assert r.keys() == f.keys()
                for n in f.keys():
                    assert same(r.get_tensor(n), f.get_tensor(n)), n
        remote.forget_opened()
        with qformat.safe_open(base + "m.safetensors") as r, qformat.safe_open(folder / "m.safetensors") as f:
            assert same(r.get_slice("w1")[8:16], f.get_slice("w1")[8:16])
            comps = {c for _, c in f.validated_descriptor("w1").references()}
            assert r.source.bytes_fetched == f.header.data_start + sum(f.header.entries[c].nbytes // 64 * 8 for c in comps)
        a, b = inspect_checkpoint(base + "model.safetensors.index.json").to_dict(), inspect_checkpoint(folder / "model.safetensors.index.json").to_dict()
        a.pop("path"), b.pop("path")
        assert a == b
        assert code_of(lambda: qformat.safe_open(base + "missing.safetensors")) == "FILE_UNREADABLE"
    finally:
        fs.rm("/qformat-test", recursive=True)


def test_token_choice_and_no_token_after_downgrade(monkeypatch):
    monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "general")
    monkeypatch.setenv("HF_TOKEN", "hub")
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", None)
    hub = remote.HttpRangeReader("https://huggingface.co/org/m/resolve/main/model.safetensors")
    other = remote.HttpRangeReader("https://example.org/model.safetensors")
    assert hub._headers(hub.url, 0, 8)["Authorization"] == "Bearer hub"
    assert other._headers(other.url, 0, 8)["Authorization"] == "Bearer general"
    # the same host over plain http (a redirect's downgrade), or another host: no token
    assert "Authorization" not in other._headers("http://example.org/model.safetensors", 0, 8)
    assert "Authorization" not in hub._headers("https://cdn-lfs.hf.co/blob", 0, 8)


def test_redirect_loop_is_coded(folder):
    with serve_ranges(folder, Faults(redirect_from="/loop/")) as url:
        url.faults.redirect_to = url + "loop/"
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(url + "loop/m.safetensors")
        assert e.value.code == "REMOTE_HTTP_ERROR" and "redirects" in str(e.value)


# -- coded refusals of what a server claims (issue 40) -----------------------------------------
def _claiming_file(folder: Path, size: int, count: int = 1) -> tuple[str, int]:
    """A file holding only a header whose ``count`` U8 tensors of ``size`` bytes each claim
    the data: a server that states the total file size serves it as a file that large."""
    entries, at = {}, 0
    for i in range(count):
        entries[f"t{i}"] = {"dtype": "U8", "shape": [size], "data_offsets": [at, at + size]}
        at += size
    head = json.dumps(entries).encode()
    head += b" " * (-len(head) % 8)
    (folder / "claims.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
    return "claims.safetensors", 8 + len(head) + at


@pytest.mark.parametrize("size, count", [(16 << 40, 1), (1 << 60, 7)], ids=["16TiB", "8EiB"])
def test_file_larger_than_the_mirror_is_coded(tmp_path, size, count):
    """16 TiB was `OSError: EFBIG` (ext4's largest file) from the sparse mirror's truncate; 7 *
    2^60 bytes is past any filesystem's and address space's reach.  A filesystem that holds a
    16 TiB sparse file opens it (nothing is fetched but the header)."""
    name, total = _claiming_file(tmp_path, size, count)
    with serve_ranges(tmp_path, Faults(total=str(total))) as url:
        try:
            with qformat.safe_open(url + name) as f:
                assert size == 16 << 40 and f.header.file_size == total
        except QFormatError as e:
            assert e.code == "FILE_UNREADABLE" and "local mirror" in str(e) and f"{total:,}" in str(e), e
        assert url.log.bytes_sent < 4096  # the header only


@pytest.mark.parametrize("total", ["-5", "+136", "0x88", "1_36", "\u00b2", "", "*", "5", str(10 ** 30)],
                         ids=["negative", "plus", "hex", "underscore", "superscript-two", "empty", "star", "below-the-end", "30-digits"])
def test_bad_content_range_total_is_range_invalid(folder, total):
    """A negative total said HEADER_TOO_SMALL; every total that is not ASCII digits past the
    range's end is REMOTE_RANGE_INVALID, for a header read and an index fetch alike."""
    with serve_ranges(folder, Faults(total=total)) as url:
        assert code_of(lambda: qformat.safe_open(url + "m.safetensors")) == "REMOTE_RANGE_INVALID"
        assert code_of(lambda: remote.fetch_bytes(url + "model.safetensors.index.json", 1 << 20)) == "REMOTE_RANGE_INVALID"


@pytest.mark.parametrize("faults, codes", [
    (Faults(range_shift=1), {"REMOTE_RANGE_INVALID"}),  # other bytes than asked
    (Faults(range_shift=-1), {"REMOTE_RANGE_INVALID"}),
    # the body ends early: the connection closed (a body that ends early), or reset (dropped, retried)
    (Faults(short_body=5), {"REMOTE_RANGE_INVALID", "REMOTE_UNREACHABLE"}),
    (Faults(reset_after=3), {"REMOTE_RANGE_INVALID", "REMOTE_UNREACHABLE"}),
    (Faults(reset_after=0), {"REMOTE_RANGE_INVALID", "REMOTE_UNREACHABLE"}),
], ids=["shift+1", "shift-1", "short-body", "reset", "reset-at-once"])
def test_wrong_short_or_reset_answers_are_coded(folder, faults, codes):
    with serve_ranges(folder, faults) as url:
        assert code_of(lambda: qformat.safe_open(url + "m.safetensors")) in codes
        # the index fetch too: it validated nothing before (a shifted range was taken as the file's start)
        assert code_of(lambda: remote.fetch_bytes(url + "model.safetensors.index.json", 1 << 20)) in codes


def test_whole_small_file_answered_200_is_read(folder):
    """An index or side JSON from a server without ranges (200, the whole file) is read (at most
    limit + 1 bytes are kept); a safetensors file is not (REMOTE_RANGE_IGNORED)."""
    index = (folder / "model.safetensors.index.json").read_bytes()
    with serve_ranges(folder, Faults(ignore_range=True)) as url:
        assert remote.fetch_bytes(url + "model.safetensors.index.json", 1 << 20) == index
        assert remote.fetch_bytes(url + "model.safetensors.index.json", 10) == index[:11]
        assert code_of(lambda: qformat.safe_open(url + "m.safetensors")) == "REMOTE_RANGE_IGNORED"


def test_index_url_with_a_query(folder):
    """'...index.json?download=1' was read as a safetensors file (HEADER_TOO_LARGE).  Index URLs
    are told by their path; the query goes with the index's own fetch, not to its shards (a
    signature signs one object)."""
    name = "model.safetensors.index.json"
    want = check([str(folder / name)])
    with serve_ranges(folder) as url:
        for query in ("?download=1", "?download=true&x=1#frag"):
            remote.forget_opened()
            url.log.reset()
            got = check([url + name + query])
            assert got.ok and [(f.quantized, f.plain) for f in got.files] == [(f.quantized, f.plain) for f in want.files]
            paths = [p for _, p, _ in url.log.gets()]
            assert "/" + name + query.split("#")[0] in paths
            assert all("?" not in p for p in paths if "model-" in p), paths
            assert inspect_checkpoint(url + name + query).to_dict()["tensors"] == inspect_checkpoint(folder / name).to_dict()["tensors"]
            with qformat.safe_open(url + name + query) as r, qformat.safe_open(folder / name) as f:
                assert r.keys() == f.keys()


@pytest.mark.parametrize("shard", ["http://127.0.0.2/x.safetensors", "//127.0.0.2/x.safetensors", "../../x.safetensors",
                                   "/abs.safetensors", "..", ".", "", "a\\b.safetensors", "sub/x.safetensors"])
def test_index_shard_names_never_leave_the_folder(tmp_path, shard, monkeypatch):
    """A remote index's weight_map entry that could name another origin or a file outside the
    index's folder is INDEX_INVALID, with no request but the index's (so no token goes anywhere)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "tok-never-elsewhere")
    with serve_ranges(tmp_path) as url:
        index = url + "sub/model.safetensors.index.json"
        assert code_of(lambda: qformat.safe_open(index)) == "INDEX_INVALID"
        assert code_of(lambda: inspect_checkpoint(index)) == "INDEX_INVALID"
        assert [p.code for p in check([index]).problems] == ["INDEX_INVALID"]
        assert {p for _, p, _ in url.log.gets()} == {"/sub/model.safetensors.index.json"}


@pytest.mark.parametrize("reader", ["check", "safe_open", "inspect"])
def test_encoded_dot_segments_stay_in_the_folder(tmp_path, reader):
    """'%2e%2e%2fsecret.safetensors' is a plain file name (no '/'): it must be fetched as that
    name, percent-encoded, never as '../secret.safetensors' (which a server resolves outside
    the index's folder)."""
    sub = tmp_path / "sub"
    sub.mkdir()
    qformat.save_file({"w": np.zeros((4, 4), np.float32)}, tmp_path / "secret.safetensors")
    (sub / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "%2e%2e%2fsecret.safetensors"}}))
    from qformat.checkpoint.source import unchecked

    with serve_ranges(tmp_path) as url:
        index = url + "sub/model.safetensors.index.json"
        try:
            with unchecked():  # --no-check: nothing else stops the read
                {"check": lambda: check([index]), "safe_open": lambda: qformat.safe_open(index),
                 "inspect": lambda: inspect_checkpoint(index)}[reader]()
        except QFormatError:
            pass
        import posixpath
        from urllib.parse import unquote, urlsplit

        paths = [p for _, p, _ in url.log.gets()]
        # as the server resolves them (percent-decoded, dot-segments applied): all inside /sub/
        assert paths and all(posixpath.normpath(unquote(urlsplit(p).path)).startswith("/sub/") for p in paths), paths


@pytest.mark.parametrize("name", ["m.safetensors", "model-00001-of-00002.safetensors"])
def test_signed_file_url_keeps_its_query(folder, name):
    """A single-file URL is read as given: its query (a signature signs that one object) goes
    with every request for it.  The checkpoint source (inspect, convert, dequantize, export) cut
    it off, so a signed file URL was answered 403 by the store."""
    from qformat.checkpoint.source import Checkpoint

    query = "?sig=abc%2Fdef&X-Amz-Expires=60"
    with serve_ranges(folder) as url:
        want = inspect_checkpoint(folder / name).to_dict()["tensors"]
        assert inspect_checkpoint(url + name + query).to_dict()["tensors"] == want
        remote.forget_opened()
        ck = Checkpoint(url + name + query)
        assert ck.files == [name]
        local = Checkpoint(folder / name)
        assert ck.names() == local.names()
        for n in ck.names():  # the payload too, not only the header
            assert ck.array(n).tobytes() == local.array(n).tobytes(), n
        paths = {p for _, p, _ in url.log.gets()}
        assert paths == {"/" + name + query}, paths


def test_sibling_url():
    base = "https://user:pw@host:8443/org/m/resolve/main/model.safetensors.index.json?download=1#x"
    assert remote.sibling_url(base, "model-00001.safetensors") == "https://user:pw@host:8443/org/m/resolve/main/model-00001.safetensors"
    assert remote.sibling_url(base, "a b?c#d%2e.safetensors").endswith("/main/a%20b%3Fc%23d%252e.safetensors")
    for bad in ("http://other/x", "//other/x", "../x", "/abs", "..", ".", "", "a\\b", "a\0b"):
        assert code_of(lambda: remote.sibling_url(base, bad)) == "INDEX_INVALID", bad
    assert remote.url_folder(base) == "https://user:pw@host:8443/org/m/resolve/main/"
    assert remote.url_basename(base) == "model.safetensors.index.json"


def test_is_index_by_the_url_path():
    """A URL is an index by its path's last segment, never by its query or fragment."""
    from qformat.index import is_index

    assert is_index("https://h/m/model.safetensors.index.json?download=1#x")
    for url in ("https://h/m/m.safetensors?f=x.json", "https://h/m/m.safetensors#x.json", "https://h/x.json/m.safetensors"):
        assert not is_index(url), url


def test_redirect_to_another_loopback_address_is_another_host(folder, monkeypatch):
    """127.0.0.2 is another host than 127.0.0.1: refused by default; allowed, the token stays home."""
    with serve_ranges(folder, host="127.0.0.2") as other:
        with serve_ranges(folder, Faults(redirect_to=other)) as origin:
            assert code_of(lambda: qformat.safe_open(origin + "m.safetensors")) == "REMOTE_REDIRECT_REFUSED"
            assert code_of(lambda: remote.fetch_bytes(origin + "model.safetensors.index.json", 1 << 20)) == "REMOTE_REDIRECT_REFUSED"
            assert other.log.requests == []
            monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(allow_cross_host=True, retries=0, coalesce_gap=0,
                                                                              token="tok-stays-home"))
            remote.forget_opened()
            assert _read_all(origin + "m.safetensors").keys() == _local(folder).keys()
            assert other.log.headers and not any("Authorization" in h for h in other.log.headers)


def test_fault_server_every_mode(folder, monkeypatch):
    """The fuzz harness's server (tests/fault_server.py): every mode, a few parameters each,
    ends in the local file's values or a coded refusal, in bounded time, never at the other host."""
    from .fault_server import MODES, REMOTE_CODES, FaultServer

    seen: dict[str, set[str]] = {}
    with FaultServer(folder) as fs:
        monkeypatch.setattr(remote, "DEFAULT_OPTIONS", fs.options)
        for i, mode in enumerate(MODES):
            for params in (b"\x00\x00\x00", b"\x80\x07\x05", bytes([0x13, 200, 3])):
                outcome = fs.read("m.safetensors") if fs.use_bytes(bytes([i]) + params) == mode else "?"
                # a remote code, or (a lying total) the header parser's code for the file the server claims
                assert outcome == "ok" or outcome in REMOTE_CODES or (mode == "huge_total" and outcome == "TRAILING_BYTES"), \
                    (mode, params, outcome)
                seen.setdefault(mode, set()).add(outcome)
    assert seen["ok"] == {"ok"} and seen["redirect"] == {"REMOTE_REDIRECT_REFUSED"}
    assert seen["negative_total"] == {"REMOTE_RANGE_INVALID"} and seen["ignore_range"] == {"REMOTE_RANGE_IGNORED"}
    assert seen["drip"] == {"REMOTE_UNREACHABLE"} and seen["drip_headers"] == {"REMOTE_UNREACHABLE"}
