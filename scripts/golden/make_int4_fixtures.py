#!/usr/bin/env python3
"""Golden fixtures for tokenmill's AWQ / GPTQ int4 kernels (crates/kernels/tests/int4_matmul.rs).

From fixed-seed fp32 weights W [K, N] (in_features x out_features) and activations x [m, K],
quantizes W to 4 bits per group (asymmetric, f16 scales) and packs the codes the way the
checkpoints store them:

  AWQ  (AutoAWQ GEMM):  qweight int32 [K, N/8], nibble i of word (k, c) = column 8c + [0,2,4,6,1,3,5,7][i]
                        qzeros  int32 [K/group, N/8], same interleave, zeros as they are
                        scales  f16   [K/group, N]
  GPTQ (AutoGPTQ):      qweight int32 [K/8, N], nibble i of word (r, n) = row 8r + i
                        qzeros  int32 [n_groups, N/8], nibble j = column 8c + j, storing zero - 1
                        ("classic") or zero ("v2")
                        scales  f16   [n_groups, N]
                        g_idx   int32 [K] (act-order: a random permutation of the rows makes
                        the groups)

The reference is computed from the *packed* tensors by an independent numpy unpacker
(readers' semantics: GPTQ classic zero = stored nibble + 1, so a zero of 0 reads 16 -- one
case exercises that quirk) as W_deq = (q - z) * s in f32, and out = x @ W_deq in float64
rounded to f32. The pair awq_same/gptq_same packs the same codes in both formats.

File format (little-endian), tests/fixtures/int4/<name>.bin:
    magic b"TMI4", u32 version = 1
    u32 format (0 AWQ, 1 GPTQ), u32 zero_format (0 classic, 1 v2), u32 has_g_idx
    u32 K, u32 N, u32 group, u32 m
    u8  qweight[], u8 qzeros[], u8 scales[], u8 g_idx[] (if has_g_idx)   raw tensor bytes
    f32 x[m*K], f32 w_deq[K*N] (input order), f32 out[m*N]

Run: /root/.cache/tokenmill-golden-venv/bin/python scripts/golden/make_int4_fixtures.py
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "int4"
SEED = 20261129
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def quantize(w: np.ndarray, g_idx: np.ndarray, n_groups: int, zero_floor: int):
    """Asymmetric 4-bit per (group, column): codes q [K, N], zeros z [G, N], f16 scales [G, N]."""
    K, N = w.shape
    q = np.zeros((K, N), dtype=np.uint8)
    z = np.zeros((n_groups, N), dtype=np.uint8)
    s = np.zeros((n_groups, N), dtype=np.float16)
    for g in range(n_groups):
        rows = np.nonzero(g_idx == g)[0]
        wg = w[rows]
        lo, hi = np.minimum(wg.min(0), 0), np.maximum(wg.max(0), 0)
        scale = ((hi - lo) / 15).astype(np.float16)
        sf = scale.astype(np.float32)
        sf[sf == 0] = 1.0
        zero = np.clip(np.round(-lo / sf), zero_floor, 15).astype(np.uint8)
        q[rows] = np.clip(np.round(wg / sf) + zero, 0, 15).astype(np.uint8)
        z[g], s[g] = zero, scale
    return q, z, s


def pack_awq_cols(a: np.ndarray) -> np.ndarray:
    """[R, N] codes -> int32 [R, N/8] with AWQ's interleaved nibble order."""
    R, N = a.shape
    out = np.zeros((R, N // 8), dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        out |= (a[:, col::8].astype(np.uint32) & 0xF) << (4 * i)
    return out.view(np.int32)


def pack_seq_cols(a: np.ndarray) -> np.ndarray:
    """[R, N] codes -> int32 [R, N/8], column 8c + j in nibble j."""
    R, N = a.shape
    out = np.zeros((R, N // 8), dtype=np.uint32)
    for j in range(8):
        out |= (a[:, j::8].astype(np.uint32) & 0xF) << (4 * j)
    return out.view(np.int32)


def pack_gptq_rows(q: np.ndarray) -> np.ndarray:
    """[K, N] codes -> int32 [K/8, N], row 8r + i in nibble i."""
    K, N = q.shape
    out = np.zeros((K // 8, N), dtype=np.uint32)
    for i in range(8):
        out |= q[i::8].astype(np.uint32) << (4 * i)
    return out.view(np.int32)


def unpack_reference(fmt, zero_fmt, qweight, qzeros, scales, g_idx, K, N, group):
    """Independent unpacker (readers' semantics) -> W_deq f32 [K, N]."""
    qw = qweight.view(np.uint32)
    qz = qzeros.view(np.uint32)
    if fmt == 0:
        rev = [AWQ_ORDER.index(j) for j in range(8)]
        q = np.stack([(qw[:, c // 8] >> (4 * rev[c % 8])) & 0xF for c in range(N)], axis=1)
        z = np.stack([(qz[:, c // 8] >> (4 * rev[c % 8])) & 0xF for c in range(N)], axis=1)
        gi = np.arange(K) // group
    else:
        q = np.stack([(qw[k // 8] >> (4 * (k % 8))) & 0xF for k in range(K)], axis=0)
        z = np.stack([(qz[:, c // 8] >> (4 * (c % 8))) & 0xF for c in range(N)], axis=1)
        if zero_fmt == 0:
            z = z + 1
        gi = g_idx if g_idx is not None else np.arange(K) // group
    s = scales.astype(np.float32)
    return ((q.astype(np.float32) - z[gi].astype(np.float32)) * s[gi]).astype(np.float32)


def write(name, fmt, zero_fmt, K, N, group, m, q, z, s, g_idx, x, act_g_idx):
    if fmt == 0:
        qweight, qzeros = pack_awq_cols(q), pack_awq_cols(z)
    else:
        qweight = pack_gptq_rows(q)
        stored = (z.astype(np.int32) - (1 if zero_fmt == 0 else 0)) & 0xF
        qzeros = pack_seq_cols(stored.astype(np.uint8))
    w_deq = unpack_reference(fmt, zero_fmt, qweight, qzeros, s, act_g_idx, K, N, group)
    out = (x.astype(np.float64) @ w_deq.astype(np.float64)).astype(np.float32)
    blob = b"TMI4" + struct.pack("<8I", 1, fmt, zero_fmt, int(g_idx is not None), K, N, group, m)
    blob += qweight.astype("<i4").tobytes() + qzeros.astype("<i4").tobytes() + s.astype("<f2").tobytes()
    if g_idx is not None:
        blob += g_idx.astype("<i4").tobytes()
    blob += x.astype("<f4").tobytes() + w_deq.astype("<f4").tobytes() + out.astype("<f4").tobytes()
    (OUT / f"{name}.bin").write_bytes(blob)
    print(f"{name}: K={K} N={N} group={group} m={m} -> {len(blob)} bytes")


def case(name, fmt, zero_fmt, K, N, group, m, act_order=False, store_g_idx=False, force_zero0=False, seed=0):
    rng = np.random.default_rng([SEED, seed])
    w = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    w[:, 1] += 0.03  # an all-positive-ish column (zero near 0)
    x = rng.standard_normal((m, K)).astype(np.float32)
    n_groups = K // group
    if act_order:
        perm = rng.permutation(K)
        g_idx = np.empty(K, dtype=np.int32)
        g_idx[perm] = np.arange(K) // group
    else:
        g_idx = (np.arange(K) // group).astype(np.int32)
    q, z, s = quantize(w, g_idx, n_groups, zero_floor=0 if force_zero0 else 1)
    if force_zero0:
        z[0, :] = 0  # GPTQ classic stores 15, readers read 16
    write(name, fmt, zero_fmt, K, N, group, m, q, z, s,
          g_idx if (act_order or store_g_idx) else None, x, g_idx)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    case("awq_g32_m1", 0, 0, 64, 16, 32, 1, seed=1)
    case("awq_g128_m3", 0, 0, 256, 24, 128, 3, seed=2)
    case("awq_g64_m5", 0, 0, 128, 8, 64, 5, seed=3)
    case("gptq_g32_m1_zero_quirk", 1, 0, 128, 16, 32, 1, force_zero0=True, seed=4)
    case("gptq_g64_m4_act_order", 1, 0, 256, 16, 64, 4, act_order=True, seed=5)
    case("gptq_g128_m2_identity_g_idx", 1, 0, 128, 24, 128, 2, store_g_idx=True, seed=6)
    case("gptq_v2_g32_m2_act_order", 1, 1, 64, 8, 32, 2, act_order=True, seed=7)
    # The same weights and codes in both formats.
    case("same_awq", 0, 0, 128, 16, 32, 2, seed=8)
    case("same_gptq", 1, 0, 128, 16, 32, 2, seed=8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
