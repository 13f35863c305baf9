#!/usr/bin/env python3
"""Golden vectors for tokenmill's quantized block formats, from the Python `gguf` package.

For each GGUF weight type, writes crates/kernels/tests/fixtures/quant/<type>.bin holding
raw block bytes and `gguf.quants.dequantize` of them; for the types the package can quantize
(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) also the f32 source that `gguf.quants.quantize`
turned into those bytes. The k-quants (Q2_K..Q6_K), which the package can only dequantize, get
random bytes -- every bit pattern is a valid block -- with their f16 super-block scales
(d, dmin) replaced by moderate finite values.

Run with the golden venv (numpy + gguf):
    /root/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_quant_vectors.py

File format (all little-endian), read by crates/kernels/tests/quant_dequant.rs:
    magic   b"TMQV"
    u32     version = 1
    u32     ggml type id
    u32     n_rows
    u32     n_cols                  (elements per row)
    u32     flags                   bit 0: the bytes were quantized from `src` by the package
    f32     src[n_rows * n_cols]    only if flags & 1
    u8      bytes[n_rows * row_bytes]
    f32     dequant[n_rows * n_cols]
"""

from __future__ import annotations

import struct
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "kernels" / "tests" / "fixtures" / "quant"
MAGIC = b"TMQV"
VERSION = 1
SEED = 20240601

# Types the package quantizes (bytes from `src`) and types it only dequantizes (random bytes).
QUANTIZED = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
RANDOM_BLOCKS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]

# Byte offsets of the f16 super-block scales inside each k-quant block (ggml-common.h).
F16_FIELDS = {
    T.Q2_K: [80, 82],   # scales[16] qs[64] | d dmin
    T.Q3_K: [108],      # hmask[32] qs[64] scales[12] | d
    T.Q4_K: [0, 2],     # d dmin | scales[12] qs[128]
    T.Q5_K: [0, 2],     # d dmin | scales[12] qh[32] qs[128]
    T.Q6_K: [208],      # ql[128] qh[64] scales[16] | d
}


def source_rows(rng: np.random.Generator, qtype: T, n_rows: int, n_cols: int) -> np.ndarray:
    """f32 rows exercising the quantizers' corner cases."""
    x = np.empty((n_rows, n_cols), dtype=np.float32)
    # Row 0: standard normal.
    x[0] = rng.standard_normal(n_cols)
    # Row 1: per-32-block magnitudes spread over 1e-4 .. 1e3.
    mags = 10.0 ** rng.uniform(-4, 3, size=n_cols // 32).repeat(32)
    x[1] = rng.standard_normal(n_cols) * mags
    # Row 2: heavy tails (one outlier per block) and mixed signs of the extreme.
    x[2] = rng.standard_t(2.0, size=n_cols)
    # Row 3: special blocks: all zero, constant, negative extreme, exact .5 ties of Q8_0
    # (max 127 makes the scale 1, so x * id = k + 0.5), small integers; rest uniform.
    r = rng.uniform(-1, 1, size=n_cols).astype(np.float32)
    r[0:32] = 0.0
    r[32:64] = -0.75
    r[64:96] = rng.uniform(-1, 0.5, size=32)
    r[64] = -3.0
    r[96:128] = np.arange(32) - 15.5
    r[96] = 127.0
    r[128:160] = np.arange(32) - 16.0
    x[3] = r
    if qtype in (T.F32, T.F16, T.BF16):
        # Float specials: infinities, a quiet NaN, signed zero, subnormals, overflow to inf,
        # values needing round-to-nearest-even.
        specials = np.array(
            [np.inf, -np.inf, np.nan, -0.0, 1e-40, -3e-45, 6e-8, 65520.0, 1e5, 3.4e38,
             1.00048828125, 1.0009765625 + 2.0**-12, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8],
            dtype=np.float32,
        )
        x[3, : len(specials)] = specials
    return x


def random_kquant_blocks(rng: np.random.Generator, qtype: T, n_rows: int, n_cols: int) -> np.ndarray:
    """Random valid blocks with moderate f16 super-block scales."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = n_rows * n_cols // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        mag = 10.0 ** rng.uniform(-3, -1, size=n_blocks)
        sign = rng.choice([-1.0, 1.0], size=n_blocks)
        blocks[:, off : off + 2] = (sign * mag).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    # A few fixed corner blocks: all-zero and all-ones quant/scale bytes.
    blocks[0, :] = 0
    for off in F16_FIELDS[qtype]:
        blocks[0, off : off + 2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    keep = {o + i for o in F16_FIELDS[qtype] for i in range(2)}
    blocks[1, [i for i in range(type_size) if i not in keep]] = 0xFF
    return blocks.reshape(n_rows, -1)


def write(qtype: T, n_rows: int, n_cols: int, src: np.ndarray | None, data: np.ndarray) -> int:
    deq = gguf.quants.dequantize(data, qtype).astype(np.float32, copy=False)
    assert deq.shape == (n_rows, n_cols), (qtype.name, deq.shape)
    flags = 1 if src is not None else 0
    out = bytearray()
    out += MAGIC + struct.pack("<5I", VERSION, int(qtype), n_rows, n_cols, flags)
    if src is not None:
        out += src.astype("<f4").tobytes()
    out += np.ascontiguousarray(data).view(np.uint8).tobytes()
    out += deq.astype("<f4").tobytes()
    path = OUT / f"{qtype.name.lower()}.bin"
    path.write_bytes(bytes(out))
    return len(out)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, qtype in enumerate(QUANTIZED + RANDOM_BLOCKS):
        rng = np.random.default_rng([SEED, i])
        if qtype in QUANTIZED:
            n_rows, n_cols = 4, 512
            src = source_rows(rng, qtype, n_rows, n_cols)
            with np.errstate(over="ignore", invalid="ignore"):
                data = gguf.quants.quantize(src, qtype)
            if qtype in (T.F32, T.F16):  # the package returns float arrays for these
                data = np.ascontiguousarray(data).view(np.uint8).reshape(n_rows, -1)
        else:
            n_rows, n_cols = 4, 1024
            src = None
            data = random_kquant_blocks(rng, qtype, n_rows, n_cols)
        size = write(qtype, n_rows, n_cols, src, data)
        total += size
        print(f"{qtype.name:>5}: {n_rows}x{n_cols} {'quantized' if src is not None else 'random blocks'} -> {size} bytes")
    print(f"total {total} bytes in {OUT.relative_to(ROOT)} (gguf {version('gguf')}, numpy {np.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
