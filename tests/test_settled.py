"""Points SPEC.md settles in 1.2 (issue 24 item 3) that no corpus file can show: the qformat
JSON size limit counts the UTF-8 bytes of the decoded value (§3.1), which a 16 MiB case would
not fit the corpus's size limit to show.  The Python and the JavaScript reader must agree."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import qformat
from qformat import tables
from qformat.errors import QFormatError

from .filebuild import build_file, int4_tensor

ROOT = Path(__file__).resolve().parent.parent
LIMIT = tables.limits()["max_qformat_json_bytes"]


def _file(decoded_bytes: int) -> bytes:
    """A 1.3 file (its unknown top-level member 'pad' is ignored, §3.4) whose qformat value is
    ``decoded_bytes`` UTF-8 bytes long once decoded, and about three times that escaped in the
    header (every 'é' is written \\u00e9: 6 header bytes for 2 decoded ones)."""
    d, c = int4_tensor("w")
    base = json.dumps({"version": "1.3", "tensors": {"w": d}, "pad": ""}, separators=(",", ":"))
    room = decoded_bytes - len(base.encode("utf-8"))
    pad = "é" * (room // 2) + "x" * (room % 2)
    text = base.replace('"pad":""', f'"pad":"{pad}"')
    assert len(text.encode("utf-8")) == decoded_bytes
    data = build_file(c, qformat=text)
    n = int.from_bytes(data[:8], "little")
    head = data[8 : 8 + n].replace("é".encode(), b"\\u00e9")  # escaped in the header: 6 bytes for 2
    assert len(head) > 2 * decoded_bytes
    return len(head).to_bytes(8, "little") + head + data[8 + n :]


@pytest.mark.parametrize("extra, ok", [(0, True), (1, False)])
def test_qformat_size_limit_counts_decoded_utf8_bytes(tmp_path: Path, extra: int, ok: bool) -> None:
    p = tmp_path / "big.safetensors"
    p.write_bytes(_file(LIMIT + extra))
    if ok:
        assert set(qformat.load_file(p)) == {"w"}
    else:
        with pytest.raises(QFormatError) as ei:
            qformat.load_file(p)
        assert ei.value.code == "QFORMAT_JSON_INVALID"
    if shutil.which("node"):
        out = subprocess.run(["node", str(ROOT / "readers/js/bin/qformat-read.mjs"), "--check", str(p)], capture_output=True, text=True,
                             timeout=300)
        codes = [ln.split("\t")[0] for ln in out.stdout.splitlines() if ln.strip()]
        assert codes == ([] if ok else ["QFORMAT_JSON_INVALID"]), out.stdout[:500] + out.stderr[:500]


def test_escaped_member_names_are_decoded_before_comparison(tmp_path: Path) -> None:
    """§1.2: the header entry written "w\\u002ecodes" is the component w.codes."""
    d, c = int4_tensor("w")
    data = build_file(c, qformat=json.dumps({"version": "1.0", "tensors": {"w": d}}))
    n = int.from_bytes(data[:8], "little")
    head = data[8 : 8 + n].replace(b'"w.codes":{', b'"w\\u002ecodes":{')
    assert head != data[8 : 8 + n]
    p, plain = tmp_path / "e.safetensors", tmp_path / "p.safetensors"
    p.write_bytes(len(head).to_bytes(8, "little") + head + data[8 + n :])
    plain.write_bytes(data)
    np.testing.assert_array_equal(qformat.load_file(p)["w"], qformat.load_file(plain)["w"])
    assert qformat.check(p).ok
