"""Corpus cases of spec 1.2's digests (issue 24 item 2, SPEC.md §3.8) and of the points issue 24
item 3 settles in SPEC.md.

Digests are computed by conformance/spec_reference.py (``sha256_hex`` over ``stored_bytes``), never
by the qformat writer.  A file is built twice: once with placeholder digests of the final length
(which fixes the layout), then with the digests of its stored bytes, which the metadata cannot move
(data offsets count from the start of the data buffer).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np

from . import spec_reference as R
from .build import Built, case, failing, q_file, valid
from .cases_errors import base, second

D = ["digests"]
SEC = ["3.8"]


def digest_file(descs: dict, comps: dict, plain: dict | None = None, version: str = "1.2", algorithm: str = "sha256",
                only: list[str] | None = None, edit: Callable[[dict[str, str]], None] | None = None, **top: Any) -> bytes:
    """A file whose qformat object records the §3.8 digest of each stored tensor (``only``: of these);
    ``edit`` changes the digest table before it is written."""
    plain = plain or {}
    names = sorted(only if only is not None else {**comps, **plain})
    draft = q_file(descs, comps, plain, version=version, digests={"algorithm": algorithm, "tensors": {n: "0" * 64 for n in names}}, **top)
    raw = R.stored_bytes(draft)
    table = {n: R.sha256_hex(raw[n]) for n in names}
    if edit is not None:
        edit(table)
    data = q_file(descs, comps, plain, version=version, digests={"algorithm": algorithm, "tensors": table}, **top)
    assert R.stored_bytes(data) == raw
    return data


def flip(a: np.ndarray, index: tuple[int, ...], bit: int) -> np.ndarray:
    a = np.array(a, copy=True)
    a[index] ^= a.dtype.type(1 << bit)
    return a


@case("digests-sha256-valid", "a 1.2 file records the sha256 digest of every stored tensor (components and plain): read it; checkers verify every digest and report nothing",
      SEC + ["3.2"], D)
def _(rng):
    descs, comps, plain = base(rng)
    data = digest_file(descs, comps, plain)
    return valid(descs, comps, plain, file_bytes=data)


@case("digests-sha256-partial-and-empty", "a 1.2 file's digests list only some stored tensors, one of them a plain F32 [0] tensor of zero bytes (digest e3b0c442...b855): valid",
      SEC, D)
def _(rng):
    descs, comps, plain = base(rng)
    plain["e"] = np.zeros((0,), np.float32)
    data = digest_file(descs, comps, plain, only=["w.codes", "e"])
    assert R.sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    return valid(descs, comps, plain, file_bytes=data)


@case("digests-mismatch-flipped-code-bit", "one bit of w's packed codes flipped after the digests were recorded: readers decode the bytes as they are (digests are not needed to decode); checkers report DIGEST_MISMATCH",
      SEC + ["12.4", "12.5"], D + ["error:DIGEST_MISMATCH"])
def _(rng):
    descs, comps, plain = base(rng)
    draft = digest_file(descs, comps, plain)
    damaged = dict(comps)
    damaged["w.codes"] = flip(comps["w.codes"], (1, 1), 2)
    table = R.read_parts(draft)[0]["digests"]["tensors"]
    data = q_file(descs, damaged, plain, version="1.2", digests={"algorithm": "sha256", "tensors": table})
    assert R.digest_codes(data) == ["DIGEST_MISMATCH"]
    return valid(descs, damaged, plain, file_bytes=data, check_codes=["DIGEST_MISMATCH"])


@case("digests-mismatch-wrong-length-and-unknown-name", "a sha256 digest of 62 digits, and a digest for 'ghost', which is no stored tensor: readers decode; checkers report DIGEST_MISMATCH",
      SEC + ["12.4"], D + ["error:DIGEST_MISMATCH"])
def _(rng):
    descs, comps, plain = base(rng)

    def edit(t: dict[str, str]) -> None:
        t["b"] = t["b"][:62]
        t["ghost"] = R.sha256_hex(b"")

    data = digest_file(descs, comps, plain, edit=edit)
    assert R.digest_codes(data) == ["DIGEST_MISMATCH", "DIGEST_MISMATCH"]
    return valid(descs, comps, plain, file_bytes=data, check_codes=["DIGEST_MISMATCH"])


@case("digests-unknown-algorithm", "a 1.2 file's digests name the algorithm 'blake3', which 1.2 does not define: not a schema failure (a later minor may add algorithms); readers decode; checkers report DIGEST_UNSUPPORTED",
      SEC + ["12.4"], D + ["error:DIGEST_UNSUPPORTED"])
def _(rng):
    descs, comps, plain = base(rng)
    data = digest_file(descs, comps, plain, algorithm="blake3")
    assert R.digest_codes(data) == ["DIGEST_UNSUPPORTED"]
    return valid(descs, comps, plain, file_bytes=data, check_codes=["DIGEST_UNSUPPORTED"])


@case("digests-in-1.1-file", "a file declaring 1.1 has the member 'digests' (defined by 1.2): an unknown top-level member of a file not newer than the reader, SCHEMA_VIOLATION for every reader (§3.2 Q3)",
      SEC + ["3.2", "3.4"], D + ["forward-compat"])
def _(rng):
    descs, comps, plain = base(rng)
    data = digest_file(descs, comps, plain, version="1.1")
    return failing(data, "SCHEMA_VIOLATION")


@case("digests-malformed-upper-case", "a 1.2 file's digest is written in upper-case hexadecimal: check Q5 fails, SCHEMA_VIOLATION for the whole file",
      SEC + ["3.2"], D)
def _(rng):
    descs, comps, plain = base(rng)
    data = digest_file(descs, comps, plain, edit=lambda t: t.__setitem__("b", t["b"].upper()))
    return failing(data, "SCHEMA_VIOLATION")


@case("digests-malformed-newer-minor", "a 1.3 file's 'digests' lacks 'tensors': a known top-level member fails the reader's schema in a newer minor, FEATURE_UNSUPPORTED for the whole file (§3.4)",
      SEC + ["3.4"], D + ["forward-compat"])
def _(rng):
    descs, comps, plain = base(rng)
    return failing(q_file(descs, comps, plain, version="1.3", digests={"algorithm": "sha256"}), "FEATURE_UNSUPPORTED")


@case("digests-newer-minor-valid", "a 1.3 file with valid sha256 digests and an unknown top-level member 'producer': a 1.2 reader reads it; checkers verify the digests",
      SEC + ["3.4"], D + ["forward-compat"])
def _(rng):
    descs, comps, plain = base(rng)
    data = digest_file(descs, comps, plain, version="1.3", producer={"name": "x"})
    return valid(descs, comps, plain, file_bytes=data)


@case("digests-mismatch-one-tensor-of-two", "two quantized tensors, the scale of 'v' damaged: checkers report DIGEST_MISMATCH once, for 'v' only; readers decode both",
      SEC + ["12.4"], D + ["error:DIGEST_MISMATCH"])
def _(rng):
    descs, comps, plain = base(rng)
    d2, c2 = second(rng)
    descs = {**descs, "v": d2}
    comps = {**comps, **c2}
    table = R.read_parts(digest_file(descs, comps, plain))[0]["digests"]["tensors"]
    damaged = copy.deepcopy(comps)
    damaged["v.scale"] = damaged["v.scale"].copy()
    damaged["v.scale"].reshape(-1)[0] = np.float16(-damaged["v.scale"].reshape(-1)[0])
    data = q_file(descs, damaged, plain, version="1.2", digests={"algorithm": "sha256", "tensors": table})
    assert R.digest_codes(data) == ["DIGEST_MISMATCH"]
    return valid(descs, damaged, plain, file_bytes=data, check_codes=["DIGEST_MISMATCH"])


# == issue 24 item 3: points SPEC.md settles in 1.2 ===================================================
from .build import header_entries, raw_file, st_file  # noqa: E402
from .cases_errors import codebook_file, header_parts, htext, qfile, setf, sub  # noqa: E402
from .cases_layouts import TG, TGF, layout_file  # noqa: E402

SETTLED = ["clarified", "settled-1.2"]


@case("settled-layout-tinygemm-scale-natural-order", "tinygemm_int4_cuda with its scale stored [N, K/G] (no 'order') and its bias [K/G, N] ('order' [1, 0]): tinygemm requires no order, and scale and bias may differ in it (§11.3)",
      ["11.3", "11.1", "9.2"], ["layout", f"layout:{TG}"] + SETTLED)
def _(rng):
    descs, comps, plain = layout_file(rng, TG, {"inner_k_tiles": 2}, (8, 64), 4, 32, bias=True)
    d = descs["w"]
    del d["scale"]["order"]
    comps["w.scale"] = np.ascontiguousarray(comps["w.scale"].T)
    return valid(descs, comps, plain, version="1.2")


@case("settled-layout-tinygemm-bias-group-size", "tinygemm_int4_cuda, scale per 32, bias per 16: rule 6 applies per parameter, so the bias's disallowed group size is LAYOUT_GROUP_SIZE before the blocks comparison (LAYOUT_MISMATCH) is reached (§11.1)",
      ["11.1", "11.3"], ["layout", "order", "error:LAYOUT_GROUP_SIZE"] + SETTLED)
def _(rng):
    descs, comps, plain = TGF((8, 64), g=32, bias=True)(rng)
    descs["w"]["bias"]["blocks"]["size"] = [1, 16]
    comps["w.bias"] = np.concatenate([comps["w.bias"], comps["w.bias"]])
    return failing(q_file(descs, comps, plain, version="1.2"), "LAYOUT_GROUP_SIZE", check_codes=["LAYOUT_GROUP_SIZE", "LAYOUT_MISMATCH"])


@case("settled-layout-marlin-scale-order-before-group", "marlin_dense's scale lacks its required 'order' [1, 0] and has the disallowed group size 16: within one parameter the order item comes first, LAYOUT_MISMATCH (§11.1 rule 6)",
      ["11.1", "11.4"], ["layout", "order", "error:LAYOUT_MISMATCH"] + SETTLED)
def _(rng):
    from .cases_layouts import MAF

    descs, comps, plain = MAF()(rng)
    del descs["w"]["scale"]["order"]
    descs["w"]["scale"]["blocks"]["size"] = [1, 16]
    return failing(q_file(descs, comps, plain, version="1.2"), "LAYOUT_MISMATCH", check_codes=["LAYOUT_MISMATCH", "LAYOUT_GROUP_SIZE"])


@case("settled-newer-minor-semantic-code-kept", "a 1.3 file whose 4-bit element has code_offset 16 (not below 2^4): the descriptor passes the schema, so the semantic rule of §6.2 keeps its code in a newer minor, ELEMENT_INVALID, not FEATURE_UNSUPPORTED (§3.4)",
      ["3.4", "6.2"], ["descriptor", "forward-compat", "error:ELEMENT_INVALID"] + SETTLED)
def _(rng):
    descs, comps, plain = base(rng)
    descs["w"]["codes"]["element"]["code_offset"] = 16
    return failing(q_file(descs, comps, plain, version="1.3"), "ELEMENT_INVALID")


@case("settled-newer-minor-component-code-kept", "a 1.3 file whose codes component has the wrong shape: COMPONENT_SHAPE in a newer minor too (§3.4)",
      ["3.4", "7.4"], ["descriptor", "forward-compat", "error:COMPONENT_SHAPE"] + SETTLED)
def _(rng):
    descs, comps, plain = base(rng)
    comps["w.codes"] = comps["w.codes"].reshape(-1)
    return failing(q_file(descs, comps, plain, version="1.3"), "COMPONENT_SHAPE")


@case("settled-tensors-fail-at-different-steps", "'a' fails only when decoded (a code past its 10-entry codebook, §10.6), 'z' at step 5.5 (codes component of the wrong shape): a reader loading the file reports z's COMPONENT_SHAPE, the earlier step, though 'a' comes first (§1.4); checkers report both",
      ["1.4", "3.7", "10.6"], ["descriptor", "order", "error:COMPONENT_SHAPE"] + SETTLED)
def _(rng):
    da, ca, _ = codebook_file(rng, [0, 9, 12, 4, 5, 1], table_len=10)
    dz, cz, plain = base(rng)
    da = {"a": dict(da["c"], codes=dict(da["c"]["codes"], tensor="a.codes", element=dict(da["c"]["codes"]["element"], table_tensor="a.table")))}
    ca = {"a.codes": ca["c.codes"], "a.table": ca["c.table"]}
    dz = {"z": dz["w"]}
    for role in ("zero", "scale"):
        dz["z"][role] = dict(dz["z"][role], tensor=f"z.{role}")
    dz["z"]["codes"] = dict(dz["z"]["codes"], tensor="z.codes")
    cz = {"z.codes": cz["w.codes"].reshape(-1), "z.zero": cz["w.zero"], "z.scale": cz["w.scale"]}
    return failing(q_file({**da, **dz}, {**ca, **cz}, plain, version="1.2"), "COMPONENT_SHAPE", check_codes=["CODE_OUT_OF_RANGE", "COMPONENT_SHAPE"])


def _zero_size_at(rng, at: int) -> bytes:
    header, data, _ = header_parts(rng)
    header["e"] = {"dtype": "F32", "shape": [0], "data_offsets": [at, at]}
    return raw_file(header, data)


@case("settled-zero-size-inside-range", "a zero-size tensor 'e' at [4, 4], inside the byte range of the tensor that starts at 0: it breaks the tiling, OFFSETS_INVALID (§2.2)",
      ["2.2", "2.3"], ["container"] + SETTLED)
def _(rng):
    return failing(_zero_size_at(rng, 4), "OFFSETS_INVALID")


@case("settled-zero-size-past-end", "a zero-size tensor 'e' at [E + 4, E + 4], past the end of the data: it breaks the tiling, OFFSETS_INVALID (§2.2)",
      ["2.2", "2.3"], ["container"] + SETTLED)
def _(rng):
    _, data, _ = header_parts(np.random.default_rng(0))
    return failing(_zero_size_at(rng, len(data) + 4), "OFFSETS_INVALID")


@case("settled-zero-size-at-end", "a zero-size tensor 'e' at [E, E], where the data ends: valid (§2.2)",
      ["2.2"], ["container"] + SETTLED)
def _(rng):
    descs, comps, plain = base(rng)
    plain = {**plain, "zz": np.zeros((0,), np.float32)}  # sorted last: [E, E]
    return valid(descs, comps, plain)


@case("settled-duplicate-name-escaped-header", "the header's __metadata__ has members 'a' and '\\u0061': names compare after escapes are resolved, HEADER_DUPLICATE_KEY (§1.2, §2.3)",
      ["1.2", "2.3"], ["container"] + SETTLED)
def _(rng):
    header, data, _ = header_parts(rng)
    return failing(raw_file(sub(htext(header), '{"__metadata__":{', '{"__metadata__":{"a":"1","\\u0061":"2",'), data), "HEADER_DUPLICATE_KEY")


@case("settled-duplicate-name-escaped-qformat", "the qformat JSON's object has members 'version' and '\\u0076ersion': a repeated name after escapes are resolved, QFORMAT_JSON_INVALID (§1.2, §3.1)",
      ["1.2", "3.1"], ["qformat-json"] + SETTLED)
def _(rng):
    from .cases_errors import qtext_file

    descs, comps, plain = base(rng)
    from .build import qformat_json

    text = qformat_json(descs)
    text = text.replace('"version":"1.0"', '"version":"1.0","\\u0076ersion":"1.0"')
    assert "\\u0076ersion" in text
    return failing(qtext_file(text, comps, plain), "QFORMAT_JSON_INVALID")


@case("settled-escaped-tensor-name", "the header writes the component name 'w.codes' as 'w\\u002ecodes': names compare decoded, so it is the component the descriptor references (§1.2, §3.2)",
      ["1.2", "3.2"], ["container"] + SETTLED)
def _(rng):
    descs, comps, plain = base(rng)
    data = q_file(descs, comps, plain)
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n].decode("utf-8").rstrip(" ")
    text = sub(text, '"w.codes":{', '"w\\u002ecodes":{')
    return valid(descs, comps, plain, file_bytes=raw_file(text, data[8 + n :]))


@case("settled-sharded-broken-qformat-json-listing", "the first shard's qformat JSON is cut short and the index places the logical 'w' in it: a shard whose qformat object cannot be read defines no logical tensor, so INDEX_MISMATCH, reported before the shard's QFORMAT_JSON_INVALID (§14); checkers report both",
      ["14", "3.1"], ["sharded", "error:INDEX_MISMATCH"] + SETTLED)
def _(rng):
    from .cases_errors import qtext_file
    from .cases_sharded import S1, S2, _index, _invalid, _parts, _wm

    d1, c1, p1, d2, c2, p2 = _parts(rng)
    from .cases_errors import INDEX

    wm = _wm(([*c1, *p1, "w"], S1), ([*c2, *p2, "v"], S2))
    files = {INDEX: _index(dict(sorted(wm.items()))), S1: qtext_file('{"version":"1.0","tensors":', c1, p1), S2: qfile(d2, c2, p2)}
    return _invalid(files, "INDEX_MISMATCH", ["INDEX_MISMATCH", "QFORMAT_JSON_INVALID"])
