"""How URLs are shown: the one redaction rule for every report, message and log line (issue 40).

A URL may carry secrets: user-info (``https://user:password@host/...``) and a signed query
(``?X-Amz-Signature=...``, ``?sig=...``, ``?token=...``).  Wherever qformat shows or records a
URL (CLI reports, ``--json`` output, error messages, notices) it shows

    ``scheme://host[:port]/path``, then ``?...`` when the URL had a (non-empty) query string,

with the user-info removed entirely and the fragment dropped.  Nothing else is changed (no
case folding, no percent-decoding), and a path that is not a URL (no ``scheme://`` prefix) is
shown as given.  The JavaScript reader (readers/js) applies the same rule.

:func:`redact` is the rule itself.  :func:`shown` is what messages call: :func:`redact`, unless
the user asked to see URLs in full (``qformat --show-secrets``, :func:`showing_secrets`).
:func:`scrub` applies the rule to every URL inside a text and masks the bearer tokens qformat
reads from the environment (those never appear, whatever the flag says); the CLI passes all of
its output through it (:class:`RedactingStream`), so a message built by any module is covered.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Any, Iterator, TextIO

__all__ = ["TOKEN_VARIABLES", "RedactingStream", "redact", "redacted_output", "scrub", "secrets_shown", "shown", "showing_secrets"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# A URL inside free text runs to the next whitespace, angle bracket or backtick; quotes and
# closing brackets or punctuation at its end are the text's, not the URL's (see _TRAIL).
_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>`]*")
_TRAIL = "'\".,:;!)]}"
#: Environment variables whose values are bearer tokens qformat sends (qformat.remote).
TOKEN_VARIABLES = ("QFORMAT_HTTP_TOKEN", "HF_TOKEN")
_MASK = "***"
_MIN_TOKEN = 8  # shorter values are not masked in text (a one-letter "token" would mangle every line)

_SHOW = [0]  # >0 while showing_secrets() is in effect (process-wide: worker threads see it too)
_SHOW_LOCK = threading.Lock()


def redact(url_or_path: Any) -> str:
    """``url_or_path`` as qformat shows it: a URL as ``scheme://host[:port]/path`` with no
    user-info, no fragment and ``?...`` in place of a non-empty query; anything else as given
    (``os.PathLike`` as its path).  Always redacts (see :func:`shown` for the flag)."""
    text = os.fspath(url_or_path) if isinstance(url_or_path, os.PathLike) else url_or_path
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = str(text)
    m = _SCHEME.match(text)
    if m is None:
        return text
    rest = text[m.end():]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    host = authority.rpartition("@")[2]  # the user-info ends at the last '@' (a host has none)
    tail = tail.split("#", 1)[0]
    path, q, query = tail.partition("?")
    return f"{m.group(0)}{host}{path}" + ("?..." if q and query else "")


def secrets_shown() -> bool:
    """Whether URLs are shown in full now (``--show-secrets``)."""
    return _SHOW[0] > 0


@contextlib.contextmanager
def showing_secrets(on: bool = True) -> Iterator[None]:
    """Within this block :func:`shown` and :func:`scrub` leave URLs whole (``on``; False: no
    change).  Bearer tokens stay masked."""
    if not on:
        yield
        return
    with _SHOW_LOCK:
        _SHOW[0] += 1
    try:
        yield
    finally:
        with _SHOW_LOCK:
            _SHOW[0] -= 1


def shown(url_or_path: Any) -> str:
    """``url_or_path`` as messages and reports show it: :func:`redact`, or the whole URL while
    :func:`showing_secrets` is in effect."""
    if secrets_shown():
        return os.fspath(url_or_path) if isinstance(url_or_path, os.PathLike) else str(url_or_path)
    return redact(url_or_path)


def _tokens() -> list[str]:
    import sys

    out = [os.environ.get(v, "") for v in TOKEN_VARIABLES]
    remote = sys.modules.get("qformat.remote")  # not imported: no options' token to mask
    opts = getattr(remote, "DEFAULT_OPTIONS", None)
    if opts is not None and opts.token:
        out.append(opts.token)
    return sorted({t for t in out if len(t) >= _MIN_TOKEN}, key=len, reverse=True)


def _redact_match(m: re.Match[str]) -> str:
    url = m.group(0)
    end = len(url)
    while end and url[end - 1] in _TRAIL:
        end -= 1
    if url[end - 1 : end + 3] == "?...":  # an already redacted query: its dots are the URL's (redaction is idempotent)
        end += 3
    return redact(url[:end]) + url[end:]


def scrub(text: str) -> str:
    """``text`` with every URL in it shown by :func:`shown`'s rule and every bearer token
    qformat reads (``QFORMAT_HTTP_TOKEN``, ``HF_TOKEN``, the options' token; 8 characters or
    more) replaced by ``***``."""
    if "://" in text and not secrets_shown():
        text = _IN_TEXT.sub(_redact_match, text)
    for t in _tokens():
        if t in text:
            text = text.replace(t, _MASK)
    return text


class RedactingStream:
    """A text stream that passes everything written to it through :func:`scrub`.

    Text is held back until a whitespace character (a URL never spans one) or :meth:`flush`,
    so a URL written in two pieces is still seen whole.  Every other attribute is the wrapped
    stream's (``isatty``, ``fileno``, ``encoding``, ...)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        cut = max(self._pending.rfind(c) for c in " \n\r\t")
        if cut >= 0:
            out, self._pending = self._pending[: cut + 1], self._pending[cut + 1 :]
            self.stream.write(scrub(out))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            out, self._pending = self._pending, ""
            self.stream.write(scrub(out))
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def redacted_output(show_secrets: bool = False) -> Iterator[None]:
    """Within this block ``sys.stdout`` and ``sys.stderr`` are :class:`RedactingStream` s (and
    URLs are shown whole when ``show_secrets``): what the CLI prints goes through one rule."""
    import sys

    with showing_secrets(show_secrets):
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = RedactingStream(old[0]), RedactingStream(old[1])
        try:
            yield
        finally:
            wrapped = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = old
            for w in wrapped:
                if isinstance(w, RedactingStream):
                    try:
                        w.flush()
                    except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
                        pass
