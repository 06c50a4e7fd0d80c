"""Element tables: every code of every float format equals ml_dtypes' reading of the same bits;
named codebooks equal the tables the originating libraries ship."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from qformat import tables
from qformat.elements import float_lut, int_lut


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | both_nan).all())


@pytest.mark.parametrize("fmt", sorted(tables.float_formats()))
def test_float_lut_matches_ml_dtypes(fmt):
    spec = tables.float_formats()[fmt]
    n = 1 << spec["bits"]
    codes = np.arange(n, dtype=np.uint8)
    ref = codes.view(getattr(ml_dtypes, spec["ml_dtypes"])).astype(np.float32)
    assert _same_bits(float_lut(fmt), ref)


@pytest.mark.parametrize("fmt", sorted(tables.float_formats()))
def test_float_table_facts(fmt):
    spec = tables.float_formats()[fmt]
    lut = float_lut(fmt)
    finite = lut[np.isfinite(lut)]
    assert finite.max() == spec["max"]
    assert np.isinf(lut).any() == spec["inf"]
    info = ml_dtypes.finfo(getattr(ml_dtypes, spec["ml_dtypes"]))
    assert float(info.max) == spec["max"]


def test_int_luts():
    assert int_lut(4, "unsigned").tolist() == list(range(16))
    assert int_lut(4, "twos_complement").tolist() == list(range(8)) + list(range(-8, 0))
    assert int_lut(4, "offset_binary").tolist() == list(range(-8, 8))
    # GPTQ v1 stores z - 1: code_offset 1 reads code 15 as 0 and code 7 as 8.
    v1 = int_lut(4, "unsigned", code_offset=1)
    assert v1[15] == 0 and v1[7] == 8
    # MXINT8: two's complement with 6 fraction bits.
    mx = int_lut(8, "twos_complement", frac_bits=6)
    assert mx[0x7F] == 127 / 64 and mx[0x80] == -2.0
    assert int_lut(1, "twos_complement").tolist() == [0, -1]


@pytest.mark.parametrize("name,bnb_name", [("nf4", "nf4"), ("bnb_fp4", "fp4")])
def test_codebooks_match_bitsandbytes(name, bnb_name):
    pytest.importorskip("torch")
    F = pytest.importorskip("bitsandbytes.functional")
    ref = F.get_4bit_type(bnb_name, device="cpu").numpy().astype(np.float32)
    assert _same_bits(tables.codebook_values(name), ref)
