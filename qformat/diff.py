"""``qformat diff``: compare two checkpoints tensor by tensor, streaming.

:func:`diff_checkpoints` opens both sides with :func:`qformat.inspection.open_checkpoint` (a
qformat or plain safetensors file, folder or sharded index, a GGUF file, or any source
``qformat convert`` detects, decoded in memory through its converter: nothing is written), then
for every tensor name present in both decodes A's tensor, decodes B's, compares them and drops
both before the next one, so memory holds one pair of decoded tensors at a time (plus bounded
float64 temporaries: the comparison runs in chunks of :data:`CHUNK` elements).

Per tensor (the definitions, also in docs/cli.md):

* ``bit_exact``: same dtype, same shape and the same bits everywhere, except that a NaN
  matches any NaN (NaN compared by class).  Different dtypes are never bit-exact.
* ``differing_elements``: elements that are not equal in that sense (for different dtypes:
  whose values differ after exact widening to binary64).
* ``max_abs_diff``: the largest ``|a - b|`` (binary64) over elements finite on both sides.
* ``max_ulp_diff``: in the coarser of the two dtypes (fewer mantissa bits; bfloat16 is coarser
  than float16), both values rounded to that dtype (round to nearest even), then the number
  of representable values between them: the difference of their ordinals, where a value's
  ordinal is its bit pattern as a sign-magnitude integer (``+0`` and ``-0`` are both 0,
  ``+Inf`` is one past the largest finite value).  NaN elements are left out; null for
  integer or bool tensors.
* ``nonfinite_mismatches``: elements where either side is NaN or infinite and the two differ
  (NaN against NaN and ``+Inf`` against ``+Inf`` match).
* ``sqnr_db``: ``10 log10(sum a^2 / sum (a - b)^2)`` in binary64 over the elements finite on
  both sides, A being the signal; ``inf`` when the noise is zero, null with no finite element.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np

from .errors import QFormatError, error, raise_first
from .inspection import Opened, natural_key, open_checkpoint, plain_dtype
from .redact import scrub, shown

#: The version of ``qformat diff --json``'s output (new members may be added without a bump).
FORMAT_VERSION = 1
#: Elements compared per step: bounds the binary64 temporaries (a few times 8 MB).
CHUNK = 1 << 20


class _Side:
    """One checkpoint to compare: its tensor names and a decoder for each."""

    def __init__(self, path: str | os.PathLike[str], from_format: str | None = None):
        from .validate import validate_descriptor

        self.path = os.fspath(path)
        self.opened: Opened = open_checkpoint(path, from_format)
        self.descs = self.opened.descriptors()
        self._validate = validate_descriptor
        self.plain = self.opened.plain_names(self.descs)
        self.names = list(self.descs) + [n for n in self.plain if n not in self.descs]

    def header(self, name: str) -> tuple[list[int], str, bool]:
        """(logical shape, dtype name, quantized) without reading the tensor."""
        d = self.descs.get(name)
        if d is not None:
            return list(d.shape), d.dtype, True
        i = self.opened.info(name)
        assert i is not None
        return list(i.shape), plain_dtype(i.dtype), False

    def read(self, name: str) -> np.ndarray:
        """The tensor decoded to its logical dtype (plain tensors: as stored, memory-mapped)."""
        from .decode import decode

        d = self.descs.get(name)
        if d is None:
            return self.opened.array(name)
        raise_first(self._validate(name, d, self.opened))
        return decode(d, self.opened, None, tensor=name)

    def describe(self) -> dict[str, Any]:
        return {"path": shown(self.path), "kind": self.opened.kind, "source_format": self.opened.source_format}


def _is_float(dt: np.dtype) -> bool:
    if dt.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dt)
        return True
    except (ValueError, TypeError):
        return False


def coarser(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The float dtype with fewer mantissa bits (then fewer exponent bits), None unless both are float."""
    if not (_is_float(a) and _is_float(b)):
        return None
    fa, fb = ml_dtypes.finfo(a), ml_dtypes.finfo(b)
    return a if (fa.nmant, fa.nexp) <= (fb.nmant, fb.nexp) else b


def ordinals(x: np.ndarray) -> np.ndarray:
    """Each float's bit pattern as a sign-magnitude integer (int64): ``+0`` and ``-0`` are 0 and
    consecutive representable values differ by 1."""
    n = x.dtype.itemsize * 8
    u = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    mag = (u & np.uint64((1 << (n - 1)) - 1)).astype(np.int64)
    return np.where((u >> np.uint64(n - 1)) != 0, -mag, mag)


def _ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|ordinal(a) - ordinal(b)| as uint64 (exact even where the int64 difference wraps)."""
    oa, ob = ordinals(a), ordinals(b)
    with np.errstate(over="ignore"):
        d = np.where(oa >= ob, oa - ob, ob - oa)
    return d.view(np.uint64)


@dataclass
class TensorDiff:
    """The comparison of one tensor name (see the module docstring for each member)."""

    name: str
    status: str  # "compared", "shape_mismatch" or "error"
    shape_a: list[int] | None = None
    shape_b: list[int] | None = None
    dtype_a: str | None = None
    dtype_b: str | None = None
    quantized_a: bool | None = None
    quantized_b: bool | None = None
    elements: int = 0
    bit_exact: bool = False
    differing_elements: int = 0
    nonfinite_mismatches: int = 0
    max_abs_diff: float | None = None
    max_ulp_diff: int | None = None
    ulp_dtype: str | None = None
    sqnr_db: float | None = None
    error: str | None = None

    def below(self, threshold: float) -> bool:
        """Whether this tensor fails a ``--fail-below`` gate: SQNR under ``threshold``, shapes
        that differ, a tensor that could not be read, or non-finite values that differ."""
        if self.status != "compared" or self.nonfinite_mismatches:
            return True
        return self.sqnr_db is not None and self.sqnr_db < threshold

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "shape_a": self.shape_a, "shape_b": self.shape_b,
                "dtype_a": self.dtype_a, "dtype_b": self.dtype_b, "quantized_a": self.quantized_a, "quantized_b": self.quantized_b,
                "elements": self.elements, "bit_exact": self.bit_exact, "differing_elements": self.differing_elements,
                "nonfinite_mismatches": self.nonfinite_mismatches, "max_abs_diff": _num(self.max_abs_diff),
                "max_ulp_diff": self.max_ulp_diff, "ulp_dtype": self.ulp_dtype, "sqnr_db": _num(self.sqnr_db, 4), "error": self.error}


def _num(x: float | None, digits: int | None = None) -> float | str | None:
    """JSON has no infinities: they are the strings ``"inf"`` / ``"-inf"``."""
    if x is None:
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return round(x, digits) if digits is not None else x


def compare(a: np.ndarray, b: np.ndarray, out: TensorDiff) -> TensorDiff:
    """Fill ``out``'s metrics from two arrays of the same shape, in chunks of :data:`CHUNK`."""
    af, bf = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    same = af.dtype == bf.dtype
    ulp_dt = coarser(af.dtype, bf.dtype)
    out.ulp_dtype = None if ulp_dt is None else plain_dtype_name(ulp_dt)
    out.elements = int(af.size)
    differ = nonfinite = 0
    max_abs = 0.0
    max_ulp = 0
    sig = noise = 0.0
    finite_seen = False
    for i in range(0, af.size, CHUNK):
        x, y = af[i : i + CHUNK], bf[i : i + CHUNK]
        with np.errstate(invalid="ignore", over="ignore"):
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            xn, yn = np.isnan(x64), np.isnan(y64)
            both_nan = xn & yn
            if same:
                u = np.dtype(f"u{x.dtype.itemsize}") if x.dtype.itemsize in (1, 2, 4, 8) else None
                neq = (x.view(u) != y.view(u)) if u is not None else (x64 != y64)
            else:
                neq = x64 != y64
            differ += int((neq & ~both_nan).sum())
            fin = np.isfinite(x64) & np.isfinite(y64)
            nonfinite += int((~fin & ~both_nan & (x64 != y64)).sum())
            if fin.any():
                finite_seen = True
                d = x64[fin] - y64[fin]
                max_abs = max(max_abs, float(np.abs(d).max()))
                sig += float(np.square(x64[fin]).sum())
                noise += float(np.square(d).sum())
            if ulp_dt is not None:
                keep = ~(xn | yn)
                if keep.any():
                    xc = x[keep].astype(ulp_dt) if x.dtype != ulp_dt else x[keep]
                    yc = y[keep].astype(ulp_dt) if y.dtype != ulp_dt else y[keep]
                    max_ulp = max(max_ulp, int(_ulp_distance(xc, yc).max()))
    out.differing_elements, out.nonfinite_mismatches = differ, nonfinite
    out.bit_exact = same and differ == 0
    out.max_abs_diff = max_abs if finite_seen else None
    out.max_ulp_diff = max_ulp if ulp_dt is not None and out.elements else None
    if finite_seen:
        if noise == 0:
            out.sqnr_db = math.inf
        elif sig == 0:
            out.sqnr_db = -math.inf
        else:
            out.sqnr_db = 10 * math.log10(sig / noise)
    return out


def plain_dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt == np.dtype(ml_dtypes.bfloat16) else str(dt)


@dataclass
class DiffReport:
    """What ``qformat diff`` found (:meth:`to_dict` is the ``--json`` output)."""

    a: dict[str, Any]
    b: dict[str, Any]
    tensors: list[TensorDiff] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    fail_below: float | None = None

    def failing(self) -> list[str]:
        """Tensors that fail the ``--fail-below`` gate (empty without a threshold)."""
        if self.fail_below is None:
            return []
        return [t.name for t in self.tensors if t.below(self.fail_below)]

    @property
    def ok(self) -> bool:
        return not self.failing()

    def worst(self) -> TensorDiff | None:
        c = [t for t in self.tensors if t.sqnr_db is not None]
        return min(c, key=lambda t: t.sqnr_db) if c else None  # type: ignore[arg-type, return-value]

    def summary(self) -> dict[str, Any]:
        w = self.worst()
        return {"compared": sum(t.status == "compared" for t in self.tensors),
                "bit_exact": sum(t.bit_exact for t in self.tensors),
                "shape_mismatches": [t.name for t in self.tensors if t.status == "shape_mismatch"],
                "errors": [t.name for t in self.tensors if t.status == "error"],
                "only_in_a": self.only_in_a, "only_in_b": self.only_in_b,
                "worst_sqnr_db": None if w is None else {"name": w.name, "sqnr_db": _num(w.sqnr_db, 4)},
                "fail_below_db": self.fail_below, "failing": self.failing(), "ok": self.ok}

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "a": self.a, "b": self.b,
                "tensors": [t.to_dict() for t in self.tensors], "summary": self.summary()}

    def lines(self) -> list[str]:
        """The text report: one row per tensor, then the summary."""
        def side(s: dict[str, Any]) -> str:
            return s["path"] + (f" ({s['source_format']}, via qformat convert)" if s["source_format"] else f" ({s['kind']})")

        out = [f"A: {side(self.a)}", f"B: {side(self.b)}", ""]
        rows = []
        for t in self.tensors:
            shape = "x".join(map(str, t.shape_a or [])) or "scalar"
            if t.status == "shape_mismatch":
                shape = f"{'x'.join(map(str, t.shape_a or []))} vs {'x'.join(map(str, t.shape_b or []))}"
            dt = t.dtype_a if t.dtype_a == t.dtype_b else f"{t.dtype_a}/{t.dtype_b}"
            if t.status != "compared":
                rows.append([t.name, shape, dt or "-", "-", "-", "-", t.error or "shapes differ"])
                continue
            sq = "-" if t.sqnr_db is None else ("inf" if math.isinf(t.sqnr_db) and t.sqnr_db > 0 else f"{t.sqnr_db:.2f}")
            rows.append([t.name, shape, dt or "-", "yes" if t.bit_exact else "no",
                         "-" if t.max_abs_diff is None else f"{t.max_abs_diff:.3g}",
                         "-" if t.max_ulp_diff is None else str(t.max_ulp_diff), sq])
        from .inspection import text_table

        out += text_table(["tensor", "shape", "dtype", "bit-exact", "max abs", "max ulp", "SQNR dB"], rows, right={4, 5, 6})
        s = self.summary()
        out.append("")
        out.append(f"{s['compared']} tensors compared, {s['bit_exact']} bit-exact"
                   + (f", {len(s['shape_mismatches'])} with different shapes" if s["shape_mismatches"] else "")
                   + (f", {len(s['errors'])} unreadable" if s["errors"] else ""))
        if s["worst_sqnr_db"] is not None and s["worst_sqnr_db"]["sqnr_db"] == "inf":
            out.append("worst SQNR: inf (no compared tensor differs in value)")
        elif s["worst_sqnr_db"] is not None:
            out.append(f"worst SQNR: {s['worst_sqnr_db']['sqnr_db']} dB ({s['worst_sqnr_db']['name']})")
        for label, names in (("only in A", self.only_in_a), ("only in B", self.only_in_b)):
            if names:
                shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
                out.append(f"{label}: {len(names)} tensor(s): {shown}")
        if self.fail_below is not None:
            f = self.failing()
            out.append(f"gate --fail-below {self.fail_below:g} dB: " + ("pass" if not f else f"FAIL ({len(f)} tensor(s): {', '.join(f[:8])}"
                                                                   + (", ..." if len(f) > 8 else "") + ")"))
        return out


def iter_diff(a: _Side, b: _Side) -> Iterator[TensorDiff]:
    """Compare the tensors present on both sides, one pair in memory at a time (natural name order)."""
    common = sorted(set(a.names) & set(b.names), key=natural_key)
    for name in common:
        sa, da, qa = a.header(name)
        sb, db, qb = b.header(name)
        t = TensorDiff(name, "compared", sa, sb, da, db, qa, qb)
        if sa != sb:
            t.status = "shape_mismatch"
            yield t
            continue
        try:
            for side in (a, b):  # check's payload rules even where the decode reads no stored byte
                side.opened.ck.admit(name)
            x = a.read(name)
            y = b.read(name)
            compare(x, y, t)
        except QFormatError as e:
            for side in (a, b):  # a payload rule of `qformat check` refuses the whole checkpoint (issue 24)
                adm = side.opened.ck.admission
                if adm is not None and adm.refused is e:
                    raise
            t.status, t.error = "error", scrub(str(e))  # recorded in --json: URLs redacted
        finally:
            x = y = None  # noqa: F841  (drop the pair before the next one)
            a.opened.release()
            b.opened.release()
        yield t


def diff_checkpoints(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str], fail_below: float | None = None,
                     from_a: str | None = None, from_b: str | None = None,
                     progress: Callable[[TensorDiff], None] | None = None) -> DiffReport:
    """Compare the checkpoints at ``path_a`` (the signal) and ``path_b``, streaming.

    ``fail_below`` (dB) sets the gate that :meth:`DiffReport.failing` reports; ``from_a`` /
    ``from_b`` name a converter instead of detecting the format; ``progress`` is called with
    each tensor's result as it is made.  Raises :class:`~qformat.errors.QFormatError` when a
    side cannot be opened; a tensor that cannot be decoded is reported with status ``error``.
    """
    a, b = _Side(path_a, from_a), _Side(path_b, from_b)
    r = DiffReport(a.describe(), b.describe(), fail_below=fail_below)
    sa, sb = set(a.names), set(b.names)
    r.only_in_a = sorted(sa - sb, key=natural_key)
    r.only_in_b = sorted(sb - sa, key=natural_key)
    for t in iter_diff(a, b):
        r.tensors.append(t)
        if progress is not None:
            progress(t)
    return r


def require_matplotlib() -> Any:
    """matplotlib's Agg canvas and Figure, or ``DEPENDENCY_MISSING`` saying how to install it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise error("DEPENDENCY_MISSING", "--plot needs matplotlib, an optional extra: pip install 'qformat[plot]' (or pip install matplotlib)") from None
    return FigureCanvasAgg, Figure


def plot(report: DiffReport, path: str | os.PathLike[str], title: str | None = None) -> int:
    """Draw per-tensor SQNR as a horizontal bar chart into ``path`` (PNG, by its extension).

    Tensors with a finite SQNR get a bar (in name order, layer by layer); bit-exact ones and
    those without a value are counted in the subtitle.  ``--fail-below``'s threshold is drawn as
    a line and bars under it are red.  Returns the number of bars.  Needs matplotlib
    (``DEPENDENCY_MISSING`` otherwise); pyplot's global state is not used.
    """
    FigureCanvasAgg, Figure = require_matplotlib()
    rows = [t for t in report.tensors if t.sqnr_db is not None and math.isfinite(t.sqnr_db)]
    exact = sum(1 for t in report.tensors if t.sqnr_db is not None and math.isinf(t.sqnr_db) and t.sqnr_db > 0)
    n = max(1, len(rows))
    fig = Figure(figsize=(9, 1.6 + 0.22 * n), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    vals = [float(t.sqnr_db) for t in rows]  # type: ignore[arg-type]
    thr = report.fail_below
    colors = ["#c0392b" if thr is not None and v < thr else "#2e86c1" for v in vals]
    y = np.arange(len(rows))
    ax.barh(y, vals, color=colors, height=0.7)
    ax.set_yticks(y)
    ax.set_yticklabels([t.name for t in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first tensor on top, no empty band
    ax.set_xlabel("SQNR (dB), signal = A")
    if thr is not None:
        ax.axvline(thr, color="#c0392b", linestyle="--", linewidth=1)
    for yi, v in zip(y, vals):
        ax.text(v, yi, f" {v:.1f}", va="center", fontsize=6)
    ax.grid(axis="x", alpha=0.3)
    sub = f"{len(rows)} tensors differ; {exact} bit-exact (infinite SQNR) not drawn"
    if thr is not None:
        sub += f"; dashed line: --fail-below {thr:g} dB"
    a, b = os.path.basename(report.a["path"].rstrip("/")), os.path.basename(report.b["path"].rstrip("/"))
    ax.set_title((title or f"{b} vs {a}") + f"\n{sub}", fontsize=9)
    if vals:
        ax.set_xlim(min(0.0, min(vals)), max(vals) * 1.08 + 1)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
    return len(rows)
