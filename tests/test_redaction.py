"""The one URL redaction rule (qformat.redact, issue 40): no user-info, no query string (``?...``
says one was cut), no fragment, wherever a URL is shown: CLI text reports and ``--json`` of
check, inspect and diff, the errors of convert, quantize, dequantize and export, library error
messages; in full only with ``--show-secrets``.  Bearer tokens from the environment never appear.

The URLs here carry ``user:password@`` and a signed query (``sig``, ``X-Amz-Signature``,
``token``) and point at a loopback server (tests/range_server.py), which ignores both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import redact, remote
from qformat.cli import main
from qformat.errors import QFormatError

from .range_server import Faults, serve_ranges

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ("pa55word", "SIGsecret1", "AMZsecret2", "TOKsecret3")
QUERY = "?sig=SIGsecret1&X-Amz-Signature=AMZsecret2&token=TOKsecret3"


@pytest.fixture(autouse=True)
def fast_options(monkeypatch):
    monkeypatch.setattr(remote, "DEFAULT_OPTIONS", remote.HttpOptions(connect_timeout=2.0, read_timeout=2.0, retries=1,
                                                                      backoff_s=0.01, deadline_s=10.0))
    for var in ("QFORMAT_HTTP_TOKEN", "HF_TOKEN", "QFORMAT_HTTP_ALLOW_REDIRECTS", "QFORMAT_HTTP_DEADLINE"):
        monkeypatch.delenv(var, raising=False)
    remote.forget_opened()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """m.safetensors (qformat), p.safetensors (plain) and a two-shard qformat checkpoint."""
    d = tmp_path_factory.mktemp("redact")
    rng = np.random.default_rng(3)
    qformat.save_file({"w": qformat.quantize(rng.normal(size=(16, 64)).astype(np.float32), "int", bits=4, group_size=32),
                       "b": rng.normal(size=(16,)).astype(np.float32)}, d / "m.safetensors")
    qformat.save_file({"w": rng.normal(size=(16, 64)).astype(np.float32)}, d / "p.safetensors")
    wm = {}
    for i in (1, 2):
        name = f"model-{i:05d}-of-00002.safetensors"
        qformat.save_file({f"l{i}.w": qformat.quantize(rng.normal(size=(8, 32)).astype(np.float32), "int", bits=4, group_size=32)},
                          d / name)
        with qformat.safe_open(d / name) as f:
            wm.update({n: name for n in [*f.header.entries, *f.keys()]})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return d


def secret_url(base: str, name: str) -> str:
    return base.replace("http://", "http://user:pa55word@") + name + QUERY


def shown_url(base: str, name: str) -> str:
    return base + name + "?..."


def run(capsys, *args: str) -> tuple[int, str]:
    """``qformat ARGS`` in this process: (exit status, stdout + stderr)."""
    remote.forget_opened()
    code = main(list(args))
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return code, text


def hidden(text: str) -> bool:
    return not any(s in text for s in SECRETS)


# -- the rule itself ---------------------------------------------------------------------------
@pytest.mark.parametrize("given, want", [
    ("http://u:p@h:8080/a/b.safetensors?sig=1#frag", "http://h:8080/a/b.safetensors?..."),
    ("https://user@huggingface.co/org/m/resolve/main/model.safetensors", "https://huggingface.co/org/m/resolve/main/model.safetensors"),
    ("https://host/x.safetensors", "https://host/x.safetensors"),
    ("s3://KEY:SECRET@bucket/k/m.safetensors?X-Amz-Signature=zz", "s3://bucket/k/m.safetensors?..."),
    ("hf://org/model/model.safetensors", "hf://org/model/model.safetensors"),
    ("http://h/x?", "http://h/x"),  # an empty query is no query
    ("http://h/x#only-a-fragment", "http://h/x"),
    ("http://h?token=t", "http://h?..."),
    ("http://a@b@c/d", "http://c/d"),  # the user-info ends at the last '@'
    ("http://[::1]:80/x?t=1", "http://[::1]:80/x?..."),
    ("/tmp/a?b@c", "/tmp/a?b@c"),  # not a URL: as given
    ("model.safetensors", "model.safetensors"),
], ids=lambda v: v[:40])
def test_redact_rule(given, want):
    assert redact.redact(given) == want
    assert redact.shown(given) == want
    with redact.showing_secrets():
        assert redact.shown(given) == given


def test_redact_path_objects_as_given(tmp_path):
    assert redact.redact(tmp_path / "a.safetensors") == str(tmp_path / "a.safetensors")


def test_scrub_finds_urls_in_text():
    text = "cannot read 'http://u:pa55word@h/x.json?token=TOKsecret3': 404; see (https://a:b@c/d?sig=SIGsecret1)."
    got = redact.scrub(text)
    assert got == "cannot read 'http://h/x.json?...': 404; see (https://c/d?...)."
    with redact.showing_secrets():
        assert redact.scrub(text) == text


def test_scrub_masks_environment_tokens(monkeypatch):
    monkeypatch.setenv("QFORMAT_HTTP_TOKEN", "tok-abcdefgh-123")
    monkeypatch.setenv("HF_TOKEN", "hf_zyxwvutsrq")
    with redact.showing_secrets():  # shown URLs, never tokens
        assert redact.scrub("a tok-abcdefgh-123 b hf_zyxwvutsrq") == "a *** b ***"


def test_stream_sees_a_url_written_in_pieces(capsys):
    import sys as _sys

    s = redact.RedactingStream(_sys.stdout)
    for piece in ("x http://user:pa55", "word@h/m.safetensors?sig=SIG", "secret1 done\n"):
        s.write(piece)
    s.flush()
    assert capsys.readouterr().out == "x http://h/m.safetensors?... done\n"


# -- the commands' reports ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["m.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_check_hides_secrets(folder, capsys, name, json_out):
    with serve_ranges(folder) as url:
        args = ["check", secret_url(url, name)] + (["--json"] if json_out else [])
        code, text = run(capsys, *args)
        assert code == 0, text
        assert hidden(text), text
        if json_out:
            report = json.loads(text[: text.rindex("}") + 1])
            paths = [f["path"] for f in report["files"]]
            if name == "m.safetensors":
                assert paths == [shown_url(url, name)]
            else:  # the shards: in the index's folder, without its query
                assert paths == [url + f"model-0000{i}-of-00002.safetensors" for i in (1, 2)], paths
        else:
            assert (shown_url(url, name) if name == "m.safetensors" else url + "model-00001-of-00002.safetensors") in text
        code, text = run(capsys, *args, "--show-secrets")
        assert code == 0 and "pa55word" in text, text
        if name == "m.safetensors":
            assert all(s in text for s in SECRETS), text


def test_check_problems_hide_secrets(folder, capsys, tmp_path):
    """A refused remote file (404) and a remote index whose shard is missing: the problems'
    file and message name the URL redacted."""
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with serve_ranges(tmp_path) as url:
        for name in ("missing.safetensors", "model.safetensors.index.json"):
            for json_out in ([], ["--json"]):
                code, text = run(capsys, "check", secret_url(url, name), *json_out)
                assert code != 0 and "REMOTE_HTTP_ERROR" in text, text
                assert hidden(text), text


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_inspect_hides_secrets(folder, capsys, json_out):
    with serve_ranges(folder) as url:
        for name in ("m.safetensors", "model.safetensors.index.json"):
            args = ["inspect", secret_url(url, name)] + (["--json"] if json_out else [])
            code, text = run(capsys, *args)
            assert code == 0, text
            assert hidden(text) and shown_url(url, name) in text, text
            if json_out:
                assert json.loads(text[: text.rindex("}") + 1])["path"] == shown_url(url, name)
            code, text = run(capsys, *args, "--show-secrets")
            assert code == 0 and all(s in text for s in SECRETS), text


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_diff_hides_secrets(folder, capsys, json_out):
    with serve_ranges(folder) as url:
        args = ["diff", secret_url(url, "m.safetensors"), str(folder / "m.safetensors")] + (["--json"] if json_out else [])
        code, text = run(capsys, *args)
        assert code == 0, text
        assert hidden(text) and shown_url(url, "m.safetensors") in text, text
        if json_out:
            assert json.loads(text[: text.rindex("}") + 1])["a"]["path"] == shown_url(url, "m.safetensors")
        code, text = run(capsys, *args, "--show-secrets")
        assert code == 0 and all(s in text for s in SECRETS), text


@pytest.mark.parametrize("args", [
    ["convert", "{src}", "{dst}/c"],
    ["quantize", "{src}", "{dst}/q.safetensors", "--scheme", "int"],
    ["dequantize", "{src}", "{dst}/d.safetensors"],
    ["export", "{src}", "{dst}/e", "--to", "compressed-tensors"],
    ["inspect", "{src}"],
    ["diff", "{src}", "{src}"],
    ["check", "{src}"],
], ids=lambda a: a[0])
def test_command_errors_hide_secrets(folder, capsys, tmp_path, args):
    """Every command's error for a URL it cannot read (a 404) names the URL redacted.  (The
    commands that open a checkpoint through qformat.checkpoint fetch a file URL without its
    query today, so only the user-info is there to show in full.)"""
    with serve_ranges(folder) as url:
        src = secret_url(url, "missing.safetensors")
        argv = [a.format(src=src, dst=tmp_path) for a in args]
        code, text = run(capsys, *argv)
        assert code != 0 and "REMOTE_HTTP_ERROR" in text and "404" in text, text
        assert hidden(text) and url + "missing.safetensors" in text, text
        code, text = run(capsys, *argv, "--show-secrets")
        assert code != 0 and "user:pa55word@" in text, text


def test_remote_error_messages_hide_secrets(folder):
    """Library messages (no CLI in between): a 404, a refused redirect, a deadline."""
    with serve_ranges(folder) as url:
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(secret_url(url, "missing.safetensors"))
        assert e.value.code == "REMOTE_HTTP_ERROR" and hidden(str(e.value)) and shown_url(url, "missing.safetensors") in str(e.value)
        with redact.showing_secrets():
            with pytest.raises(QFormatError) as e:
                qformat.safe_open(secret_url(url, "missing.safetensors"))
            assert all(s in str(e.value) for s in SECRETS)
    with serve_ranges(folder) as other, serve_ranges(folder, Faults(redirect_to=other.replace("127.0.0.1", "localhost"))) as url:
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(secret_url(url, "m.safetensors"))
        assert e.value.code == "REMOTE_REDIRECT_REFUSED" and hidden(str(e.value))
    opts = remote.HttpOptions(connect_timeout=1.0, read_timeout=1.0, retries=0, deadline_s=0.5)
    with serve_ranges(folder, Faults(drip_bytes_per_s=4, drip_piece=1)) as url:
        with pytest.raises(QFormatError) as e:
            remote.fetch_bytes(secret_url(url, "model.safetensors.index.json"), 1 << 20, opts)
        assert e.value.code == "REMOTE_UNREACHABLE" and "deadline" in str(e.value) and hidden(str(e.value))


def test_index_shard_errors_hide_secrets(folder, tmp_path, capsys):
    """A shard URL resolved from an index keeps the index's user-info (its host): its errors
    show it redacted."""
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "gone.safetensors"}}))
    with serve_ranges(tmp_path) as url:
        with pytest.raises(QFormatError) as e:
            qformat.safe_open(secret_url(url, "model.safetensors.index.json"))
        assert e.value.code == "REMOTE_HTTP_ERROR" and hidden(str(e.value)) and url + "gone.safetensors" in str(e.value)
        for cmd in (["inspect"], ["check"], ["check", "--json"]):
            code, text = run(capsys, *cmd[:1], secret_url(url, "model.safetensors.index.json"), *cmd[1:])
            assert code != 0 and hidden(text), text


def test_tokens_never_printed(folder, capsys, monkeypatch):
    """A token from QFORMAT_HTTP_TOKEN or HF_TOKEN is sent, never printed: not in a refusal (401),
    not in a report, not even with --show-secrets when the URL's query carries it too."""
    token = "tok-9f8e7d6c5b4a"
    with serve_ranges(folder, Faults(require_token=token)) as url:
        for var in ("QFORMAT_HTTP_TOKEN", "HF_TOKEN"):
            monkeypatch.delenv("QFORMAT_HTTP_TOKEN", raising=False)
            monkeypatch.setenv(var, token)
            monkeypatch.setattr(remote, "DEFAULT_OPTIONS", None)  # the token from the environment
            code, text = run(capsys, "check", url + "m.safetensors", "--json")
            if var == "QFORMAT_HTTP_TOKEN":  # HF_TOKEN goes to huggingface.co only: 401 here
                assert code == 0, text
            else:
                assert code != 0 and "401" in text, text
            assert token not in text
        monkeypatch.setenv("QFORMAT_HTTP_TOKEN", token)
        code, text = run(capsys, "inspect", url + f"m.safetensors?token={token}", "--show-secrets")
        assert code == 0 and token not in text and "?token=***" in text, text


def test_cli_subprocess_hides_secrets(folder):
    """As a user runs it: the real entry point, stderr and stdout."""
    with serve_ranges(folder) as url:
        for args in (["check", secret_url(url, "m.safetensors")], ["inspect", secret_url(url, "nope.safetensors")]):
            r = subprocess.run([sys.executable, "-m", "qformat", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
            assert "Traceback" not in r.stderr and hidden(r.stdout + r.stderr), r.stdout + r.stderr
            assert url.replace("http://", "") in r.stdout + r.stderr


def test_invalid_remote_index_message_hides_its_query(tmp_path, capsys):
    (tmp_path / "model.safetensors.index.json").write_text('{"not": "an index"}')
    with serve_ranges(tmp_path) as url:
        code, text = run(capsys, "check", secret_url(url, "model.safetensors.index.json"))
        assert code != 0 and "INDEX_INVALID" in text, text
        assert hidden(text), text


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "no-check"])
def test_invalid_remote_index_of_a_checkpoint_hides_its_query(tmp_path, checked):
    """The checkpoint source (inspect, convert, ...) fetches a remote index with its query (a
    signature signs that one object) and names it by its file name: the query must not come with
    the name (a bare 'name?sig=...' is no URL, so no later scrub would catch it)."""
    from qformat.checkpoint.source import Checkpoint, unchecked
    from qformat.inspection import inspect_checkpoint

    (tmp_path / "model.safetensors.index.json").write_text('{"not": "an index"}')
    with serve_ranges(tmp_path) as url:
        for fn in (lambda u: Checkpoint(u), lambda u: inspect_checkpoint(u)):
            remote.forget_opened()
            with (unchecked() if not checked else redact.showing_secrets(False)):
                with pytest.raises(QFormatError) as e:
                    fn(secret_url(url, "model.safetensors.index.json"))
            assert e.value.code in ("INDEX_INVALID", "CONVERT_SOURCE_INVALID"), e.value
            assert "model.safetensors.index.json" in str(e.value) and hidden(str(e.value)), str(e.value)
        # the index itself was fetched with its query (it may be what signs it)
        assert "/model.safetensors.index.json" + QUERY in {p for _, p, _ in url.log.gets()}


def test_tensor_parallel_refusal_of_a_url_is_coded_and_hides_its_secrets():
    """load_tensor_parallel reads local checkpoints only: a URL is refused with a code
    (FILE_UNREADABLE), shown by the one rule (it was an uncoded ValueError printing it whole)."""
    pytest.importorskip("torch")
    from torch import nn

    from qformat_torch.distributed import load_tensor_parallel

    url = secret_url("http://127.0.0.1:9/", "m.safetensors")
    with pytest.raises(QFormatError) as e:
        load_tensor_parallel(nn.Linear(4, 4), url, rank=0, world=1, plan={})
    assert e.value.code == "FILE_UNREADABLE" and hidden(str(e.value)), str(e.value)
    assert shown_url("http://127.0.0.1:9/", "m.safetensors") in str(e.value)
    with redact.showing_secrets():
        with pytest.raises(QFormatError) as e:
            load_tensor_parallel(nn.Linear(4, 4), url, rank=0, world=1, plan={})
        assert url in str(e.value)
