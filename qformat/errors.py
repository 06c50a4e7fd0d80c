"""The qformat error hierarchy.

There is one base class, :class:`QFormatError`.  Every error carries a stable ``code`` from
``tables/errors.json`` (listed in SPEC.md, "Error codes"), the ``tensor`` it concerns (or
None) and a message that says what was expected and what was found.  Subclasses exist per
category so callers can catch, for example, every container failure at once.
"""

from __future__ import annotations

from . import tables
from .redact import scrub


class QFormatError(ValueError):
    """Base of every qformat error; ``code`` is stable, the message is documentation."""

    category = "invalid"

    def __init__(self, code: str, message: str, tensor: str | None = None, field: str | None = None):
        if code not in tables.errors():
            raise KeyError(f"unregistered qformat error code {code!r}")
        # One redaction rule (SECURITY.md): a URL in a message loses its user-info and query,
        # and a bearer token never appears, whichever module built the message.
        message = scrub(message)
        self.code = code
        self.tensor = tensor
        self.field = field
        self.message = message
        where = []
        if tensor is not None:
            where.append(f"tensor {tensor!r}")
        if field:
            where.append(f"field {field}")
        prefix = f"[{code}] " + (", ".join(where) + ": " if where else "")
        super().__init__(prefix + message)


class MalformedFileError(QFormatError):
    """The safetensors container itself is broken."""

    category = "malformed"


class InvalidFileError(QFormatError):
    """The container is sound but its qformat content is wrong."""

    category = "invalid"


class UnsupportedError(QFormatError):
    """Well-formed content beyond this reader (newer major, unknown extension or layout)."""

    category = "unsupported"


class UsageError(QFormatError):
    """The caller asked for something impossible."""

    category = "usage"


_BY_CATEGORY = {
    "malformed": MalformedFileError,
    "invalid": InvalidFileError,
    "unsupported": UnsupportedError,
    "usage": UsageError,
}


def error(code: str, message: str, tensor: str | None = None, field: str | None = None) -> QFormatError:
    """Build the error of the right subclass for ``code``."""
    cls = _BY_CATEGORY[tables.errors()[code]["category"]]
    return cls(code, message, tensor=tensor, field=field)


def raise_first(problems: "list[QFormatError]") -> None:
    """Raise the first of ``problems``, if any: a reader stops at the first problem it finds
    (SPEC.md's check order decides which one that is)."""
    if problems:
        raise problems[0]
