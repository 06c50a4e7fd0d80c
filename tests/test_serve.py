"""``qformat serve DIR`` (issue 44): the byte ranges, validators and CORS the remote readers
need, and nothing outside DIR."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from pathlib import Path

import numpy as np
import pytest
import requests

import qformat
from qformat.serve import make_server


@contextmanager
def _served(root: Path) -> Iterator[str]:
    server = make_server(root, port=0, quiet=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def site(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "site"
    root.mkdir()
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    with _served(root) as url:
        yield root, url


def test_qformat_reads_a_checkpoint_it_serves(tmp_path: Path) -> None:
    """The remote reader (byte ranges only) loads a quantized file and a sharded checkpoint from it."""
    root = tmp_path / "m"
    root.mkdir()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    qformat.save_file({"w": qformat.quantize(w, "int", bits=4, group_size=32), "b": w[0]}, root / "model.safetensors")
    with _served(root) as url:
        got = qformat.load_file(url + "model.safetensors")
        want = qformat.load_file(root / "model.safetensors")
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)), k
        p = subprocess.run([sys.executable, "-m", "qformat", "check", url + "model.safetensors"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr


def test_ranges(site: tuple[Path, str]) -> None:
    root, url = site
    data = (root / "data.bin").read_bytes()
    r = requests.get(url + "data.bin", headers={"Range": "bytes=10-19"}, timeout=10)
    assert r.status_code == 206 and r.content == data[10:20] and r.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    r = requests.get(url + "data.bin", headers={"Range": "bytes=1000-"}, timeout=10)
    assert r.status_code == 206 and r.content == data[1000:]
    r = requests.get(url + "data.bin", headers={"Range": "bytes=-5"}, timeout=10)
    assert r.status_code == 206 and r.content == data[-5:]
    r = requests.get(url + "data.bin", headers={"Range": "bytes=1020-5000"}, timeout=10)  # cut at the end
    assert r.status_code == 206 and r.content == data[1020:] and r.headers["Content-Range"] == f"bytes 1020-1023/{len(data)}"
    r = requests.get(url + "data.bin", headers={"Range": f"bytes={len(data)}-"}, timeout=10)
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"
    r = requests.get(url + "data.bin", headers={"Range": "bytes=0-1,5-6"}, timeout=10)  # several: the whole file
    assert r.status_code == 200 and r.content == data
    h = requests.head(url + "data.bin", timeout=10)
    assert h.status_code == 200 and h.headers["Content-Length"] == str(len(data)) and h.headers["Accept-Ranges"] == "bytes"
    assert h.content == b""


def test_validators(site: tuple[Path, str]) -> None:
    root, url = site
    first = requests.head(url + "data.bin", timeout=10)
    etag, modified = first.headers["ETag"], first.headers["Last-Modified"]
    assert requests.get(url + "data.bin", headers={"If-None-Match": etag}, timeout=10).status_code == 304
    assert requests.get(url + "data.bin", headers={"If-Modified-Since": modified}, timeout=10).status_code == 304
    r = requests.get(url + "data.bin", headers={"Range": "bytes=0-3", "If-Range": etag}, timeout=10)
    assert r.status_code == 206 and len(r.content) == 4
    # the file changes: its ETag changes, and a range sent with the old one gets the whole new file
    p = root / "data.bin"
    p.write_bytes(b"new bytes")
    os.utime(p, (time.time() + 5, time.time() + 5))
    r = requests.get(url + "data.bin", headers={"Range": "bytes=0-3", "If-Range": etag}, timeout=10)
    assert r.status_code == 200 and r.content == b"new bytes" and r.headers["ETag"] != etag
    old = formatdate(time.time() - 3600, usegmt=True)
    assert requests.get(url + "data.bin", headers={"If-Modified-Since": old}, timeout=10).status_code == 200


def test_cors_and_media_types(site: tuple[Path, str]) -> None:
    root, url = site
    (root / "m.wasm").write_bytes(b"\0asm\1\0\0\0")
    r = requests.get(url + "m.wasm", headers={"Origin": "http://elsewhere.example"}, timeout=10)
    assert r.headers["Access-Control-Allow-Origin"] == "*" and r.headers["Content-Type"] == "application/wasm"
    assert "Content-Range" in r.headers["Access-Control-Expose-Headers"]
    pre = requests.options(url + "data.bin", headers={"Origin": "http://elsewhere.example", "Access-Control-Request-Method": "GET",
                                                      "Access-Control-Request-Headers": "range"}, timeout=10)
    assert pre.status_code == 204 and "Range" in pre.headers["Access-Control-Allow-Headers"]


def test_nothing_outside_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "site"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "out-link").symlink_to(tmp_path / "secret.txt")
    (root / "in-link").symlink_to(root / "sub" / "ok.txt")
    (root / "dir-out").symlink_to(tmp_path)
    (root / "with-index").mkdir()
    (root / "with-index" / "index.html").write_text("<p>index</p>")
    with _served(root) as url:
        def get(path: str) -> requests.Response:
            return requests.get(url.rstrip("/") + path, timeout=10)
        assert get("/sub/ok.txt").text == "inside"
        assert get("/in-link").text == "inside"
        for bad in ("/out-link", "/dir-out/secret.txt", "/sub", "/nope", "/sub/ok.txt%00", "/%2e%2e/secret.txt",
                    "/sub/%2e%2e/%2e%2e/secret.txt", "/sub%5c..%5c..%5csecret.txt"):
            r = get(bad)
            assert r.status_code == 404 and "outside" not in r.text, (bad, r.status_code)
        assert get("/with-index/").text == "<p>index</p>"
        # a request line that keeps its dots (requests normalizes /../ away): raw socket
        import socket

        host, port = url.split("//")[1].rstrip("/").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /../secret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 404") and b"outside" not in answer


def test_the_command_serves_until_interrupted(tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 100)
    # Ctrl-C as a shell delivers it: a pytest worker may run with SIGINT ignored (some test before
    # it in the same worker), which a child inherits, and Python then installs no KeyboardInterrupt
    # handler; that would test the worker, not the command. The child restores the handler itself
    # (a preexec_fn would fork a worker that may hold JAX's threads) and runs `python -m qformat`.
    run = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); sys.argv[0] = 'qformat'; "
           "runpy.run_module('qformat', run_name='__main__', alter_sys=True)")
    p = subprocess.Popen([sys.executable, "-c", run, "serve", str(tmp_path), "--port", "0", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        url = line.split(" at ")[1].split(" ")[0]
        r = requests.get(url + "f.bin", headers={"Range": "bytes=0-9"}, timeout=10)
        assert r.status_code == 206 and r.content == b"x" * 10
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err, err
    bad = subprocess.run([sys.executable, "-m", "qformat", "serve", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not a folder" in bad.stderr and "Traceback" not in bad.stderr
