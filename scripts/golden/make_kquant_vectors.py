#!/usr/bin/env python3
"""Golden vectors for tokenmill's k-quant weight quantizers (Q2_K..Q6_K), from ggml itself.

The Python `gguf` package cannot quantize k-quants, so this script calls ggml's reference
quantizers `quantize_row_q{2,3,4,5,6}_K_ref` -- what `llama-quantize` runs without an importance
matrix -- from the peer llama.cpp build's `libggml-base.so` through ctypes
(`../shared/peers/llama-cpp.sh` prints the folder; override with LIBGGML_BASE=/path/to/so).

Writes crates/kernels/tests/fixtures/kquant/<type>.bin, read by
crates/kernels/tests/kquant_quantize.rs (all little-endian):
    magic   b"TMKQ"
    u32     version = 1
    u32     ggml type id
    u32     n_rows
    u32     n_cols                  (elements per row, a multiple of 256)
    f32     src[n_rows * n_cols]
    u8      bytes[n_rows * row_bytes]   ggml's quantization of each row of src

Run with any python that has numpy (the golden venv has it):
    /root/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_kquant_vectors.py
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "kernels" / "tests" / "fixtures" / "kquant"
MAGIC = b"TMKQ"
VERSION = 1
SEED = 20261129
QK_K = 256
# name, ggml type id, bytes per 256-element block
TYPES = [("q4_K", 12, 144), ("q5_K", 13, 176), ("q6_K", 14, 210), ("q2_K", 10, 84), ("q3_K", 11, 110)]


def libggml() -> ctypes.CDLL:
    path = os.environ.get("LIBGGML_BASE")
    if not path:
        peer = ROOT.parent / "shared" / "peers" / "llama-cpp.sh"
        folder = subprocess.run([str(peer)], check=True, capture_output=True, text=True).stdout.strip()
        path = str(Path(folder) / "libggml-base.so")
    return ctypes.CDLL(path)


def source_rows(rng: np.random.Generator, n_rows: int, n_cols: int) -> np.ndarray:
    """Rows exercising the scale searches: normal, spread magnitudes, heavy tails, specials."""
    x = np.empty((n_rows, n_cols), dtype=np.float32)
    x[0] = rng.standard_normal(n_cols)
    mags = 10.0 ** rng.uniform(-4, 3, size=n_cols // 32).repeat(32)
    x[1] = rng.standard_normal(n_cols) * mags
    x[2] = rng.standard_t(2.0, size=n_cols)
    r = rng.uniform(-1, 1, size=n_cols).astype(np.float32)
    r[0:32] = 0.0                      # an all-zero sub-block
    r[32:64] = -0.75                   # a constant negative sub-block
    r[64:96] = np.abs(r[64:96]) + 2.0  # all positive (min clamps to 0)
    r[256:512] = 0.0                   # an all-zero super-block
    r[512:528] = np.arange(16) - 8.0   # small integers
    x[3] = r
    x[4] = rng.standard_normal(n_cols) * 0.02  # weight-like magnitudes
    x[5] = np.abs(rng.standard_normal(n_cols))  # all positive
    return x


def main() -> int:
    lib = libggml()
    OUT.mkdir(parents=True, exist_ok=True)
    n_rows, n_cols = 6, 1024
    for i, (name, type_id, block_bytes) in enumerate(TYPES):
        rng = np.random.default_rng([SEED, i])
        src = np.ascontiguousarray(source_rows(rng, n_rows, n_cols))
        row_bytes = n_cols // QK_K * block_bytes
        data = np.zeros((n_rows, row_bytes), dtype=np.uint8)
        fn = getattr(lib, f"quantize_row_{name}_ref")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn.restype = None
        for r in range(n_rows):
            row = np.ascontiguousarray(src[r])
            out = np.zeros(row_bytes, dtype=np.uint8)
            fn(row.ctypes.data, out.ctypes.data, n_cols)
            data[r] = out
        blob = MAGIC + struct.pack("<4I", VERSION, type_id, n_rows, n_cols)
        blob += src.astype("<f4").tobytes() + data.tobytes()
        path = OUT / f"{name.lower()}.bin"
        path.write_bytes(blob)
        print(f"{name}: {n_rows}x{n_cols} -> {len(blob)} bytes ({path.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
