"""Importance matrix files written the way llama-imatrix writes them, for tests.

- :func:`write_gguf`: llama-imatrix's GGUF format (``--output-format gguf``, its default): per
  tensor F32 ``<name>.in_sum2`` [experts, columns] and ``<name>.counts`` [experts], and the keys
  ``imatrix.datasets``, ``imatrix.chunk_count``, ``imatrix.chunk_size`` (``drop`` leaves keys out).
- :func:`write_dat`: the legacy format (``--output-format dat``): int32 entry count; per entry
  int32 name length, name, int32 ncall, int32 value count, float32 values; then int32 chunk
  count, int32 dataset length, dataset.

The layouts are llama.cpp's (``tools/imatrix/imatrix.cpp``, ``common/imatrix-loader.cpp``); the
marker test checks them against llama-imatrix's own files.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np


def write_gguf(path: Path, entries: Mapping[str, tuple[np.ndarray, np.ndarray]], datasets: Sequence[str] = ("calibration.txt",),
               chunk_count: int = 4, chunk_size: int = 512, drop: Sequence[str] = ()) -> Path:
    """``entries``: name -> (in_sum2 [experts, columns] or [columns], counts [experts])."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="imatrix")
    if "imatrix.datasets" not in drop:
        w.add_array("imatrix.datasets", list(datasets))
    if "imatrix.chunk_count" not in drop:
        w.add_uint32("imatrix.chunk_count", chunk_count)
    if "imatrix.chunk_size" not in drop:
        w.add_uint32("imatrix.chunk_size", chunk_size)
    for name, (sums, counts) in entries.items():
        counts = np.asarray(counts, np.float32).reshape(-1)
        w.add_tensor(name + ".in_sum2", np.asarray(sums, np.float32).reshape(counts.size, -1))
        w.add_tensor(name + ".counts", counts.reshape(counts.size, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dat_bytes(entries: Mapping[str, tuple[np.ndarray, int]], chunk_count: int | None = 4, dataset: str | None = "calibration.txt") -> bytes:
    """``entries``: name -> (values as stored, ncall)."""
    out = [struct.pack("<i", len(entries))]
    for name, (vals, ncall) in entries.items():
        raw = name.encode()
        v = np.asarray(vals, "<f4").reshape(-1)
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, v.size), v.tobytes()]
    if chunk_count is not None:
        out.append(struct.pack("<i", chunk_count))
        if dataset is not None:
            out += [struct.pack("<i", len(dataset.encode())), dataset.encode()]
    return b"".join(out)


def write_dat(path: Path, entries: Mapping[str, tuple[np.ndarray, int]], chunk_count: int | None = 4,
              dataset: str | None = "calibration.txt") -> Path:
    path.write_bytes(dat_bytes(entries, chunk_count, dataset))
    return path
