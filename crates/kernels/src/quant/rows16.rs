//! Rows16: tokenmill's interleaved layout of a quantized weight format (Q4_0, Q4_1, Q5_0, Q8_0,
//! Q4_K and Q6_K), repacked once at load so that one SIMD lane holds one weight row — with its
//! packer, unpacker and reference dot product (the plain twin of the SIMD kernels).
//!
//! Why: in ggml's layout a row's block is one vector of 32 quants, so every (weight row,
//! activation row, block) ends in a horizontal sum, a scale multiply and an FMA of its own —
//! about five uops besides the two integer multiply-adds. Interleaving 16 rows puts row `r` in
//! lane `r` of every vector: one `vpdpwssd` (with the activation pair broadcast from memory)
//! advances 16 rows by two elements, a block's 16 integer sums come out in one register, and
//! the scales of 16 rows are applied with one FMA. The same bytes as ggml's, permuted.
//!
//! Layout: the rows are cut into groups of [`GROUP`] = 16 (the last one padded with all-zero
//! rows, which contribute 0); a group is `nb` group-blocks back to back, one per ggml block
//! (32 columns, or 256 for Q4_K and Q6_K), each `16 × type_size` bytes — for row `r` of the group:
//! * `d: [f16; 16]` (the row scales), then for Q4_1 `m: [f16; 16]` (the row offsets);
//! * Q4_0 / Q4_1 / Q5_0 nibbles, 8 chunks of 32 bytes: byte `2r + e` of chunk `c` holds column
//!   `2c + e` in its low nibble and column `16 + 2c + e` in its high nibble;
//! * Q5_0's fifth bits after them, 2 planes of 32 bytes: byte `2r + e` of plane `c / 4` holds
//!   the fifth bit of column `2c + e` as bit `2 (c % 4)` and of column `16 + 2c + e` as bit
//!   `2 (c % 4) + 1` — one plane, widened once, serves four nibble chunks;
//! * Q8_0 quants, 16 chunks of 32 bytes: byte `2r + e` of chunk `c` is column `2c + e`;
//! * Q4_K: `d: [f16; 16]`, `dmin: [f16; 16]`, the 12 packed 6-bit scale bytes as 3 planes of
//!   16 little-endian u32 (plane `k`, lane `r`: bytes `4k..4k + 4` of row `r`'s scales), then
//!   its 8 sub-blocks of 32 columns, each 256 bytes in the Q4 nibble layout above;
//! * Q6_K: `d: [f16; 16]`, its 16 sub-block scales as 16 planes of 16 i8 (plane `s`, byte `r`),
//!   then 8 chunks of 32 columns (values `q + 32`, 0..64), each the low 4 bits in the Q4 nibble
//!   layout (256 bytes) and the top 2 bits as 4 planes of 32 bytes: byte `2r + e` of plane
//!   `c / 2` holds those of column `2c + e` at bit `4 (c % 2)` and of column `16 + 2c + e` at
//!   bit `4 (c % 2) + 2`. Columns 0..16 of a chunk (the low nibbles) are one sub-block,
//!   16..32 (the high nibbles) the next.
//!
//! Widened to i16, a 32-byte chunk is 16 lanes of (row, two consecutive columns) pairs: what
//! `vpmaddwd` / `vpdpwssd` multiply against one broadcast pair of A16 activations.

use super::a8::BlockA8;
use super::a16::BlockA16;
use super::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ6_K, BlockQ8_0, F16Le, K_SCALE_SIZE, QK,
    cast_blocks, get_scale_min_k4,
};
use super::types::{GgmlType, QK_K};

/// Weight rows per interleaved group.
pub const GROUP: usize = 16;

/// Byte offset of Q5_0's fifth-bit planes in a group-block (after `d` and the nibbles).
pub const Q5_0_HBITS: usize = 2 * GROUP + 8 * 2 * GROUP;
/// Byte offset of Q4_K's `dmin` in a group-block.
pub const Q4_K_DMIN: usize = 2 * GROUP;
/// Byte offset of Q4_K's scale planes in a group-block.
pub const Q4_K_SCALES: usize = 4 * GROUP;
/// Bytes of one Q4_K sub-block's nibbles in a group-block (32 columns of 16 rows).
pub const Q4_K_SUB_BYTES: usize = QK * GROUP / 2;
/// Byte offset of Q6_K's sub-block scales (16 planes of 16 i8) in a group-block.
pub const Q6_K_SCALES: usize = 2 * GROUP;
/// Byte offset of a Q6_K chunk's high-bit planes, after its nibbles.
pub const Q6_K_HBITS: usize = QK * GROUP / 2;
/// Bytes of one Q6_K chunk in a group-block (32 columns of 16 rows: nibbles, high-bit planes).
pub const Q6_K_SUB_BYTES: usize = Q6_K_HBITS + QK * GROUP / 4;

/// Whether `ty` has a Rows16 layout.
pub fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q6_K
    )
}

/// Bytes of a Rows16 matrix of `rows × cols` (rows rounded up to whole groups).
pub fn packed_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP * (cols / ty.block_size()) * ty.type_size()
}

/// Byte offset of the quants in a group-block (after the scales and offsets).
pub const fn quants_offset(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 4 * GROUP,
        GgmlType::Q4_K => Q4_K_SCALES + K_SCALE_SIZE * GROUP,
        GgmlType::Q6_K => Q6_K_SCALES + QK_K / 16 * GROUP,
        _ => 2 * GROUP,
    }
}

/// Repacks `rows` ggml rows of `cols` elements of `ty` (`data`, as in GGUF) into Rows16.
///
/// Panics if `ty` has no Rows16 layout, `cols` is not a multiple of its block or `data` is
/// shorter than the matrix.
pub fn pack(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; packed_bytes(ty, rows, cols)];
    pack_into(ty, rows, cols, data, &mut out);
    out
}

/// [`pack`] into `out` (exactly [`packed_bytes`] bytes; overwritten).
///
/// Panics as [`pack`] does, or if `out` has another length.
pub fn pack_into(ty: GgmlType, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    assert!(supports(ty), "no Rows16 layout for {ty}");
    let bs = ty.block_size();
    assert!(cols.is_multiple_of(bs), "{cols} columns");
    let (nb, ts) = (cols / bs, ty.type_size());
    assert!(data.len() >= rows * nb * ts, "weight bytes");
    assert_eq!(out.len(), packed_bytes(ty, rows, cols), "packed bytes");
    out.fill(0);
    let mut q = [0u8; QK];
    for (r, row) in data[..rows * nb * ts].chunks_exact(nb * ts).enumerate() {
        let (g, lane) = (r / GROUP, r % GROUP);
        for (b, block) in row.chunks_exact(ts).enumerate() {
            let gb = (g * nb + b) * GROUP * ts;
            let dst = &mut out[gb..gb + GROUP * ts];
            match ty {
                GgmlType::Q4_0 => {
                    let blk = &cast_blocks::<BlockQ4_0>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    q.copy_from_slice(&nibble_values(&blk.qs));
                }
                GgmlType::Q4_1 => {
                    let blk = &cast_blocks::<BlockQ4_1>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    dst[2 * GROUP + 2 * lane..][..2].copy_from_slice(&blk.m.0);
                    q.copy_from_slice(&nibble_values(&blk.qs));
                }
                GgmlType::Q5_0 => {
                    let blk = &cast_blocks::<BlockQ5_0>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    let qh = u32::from_le_bytes(blk.qh);
                    let low = nibble_values(&blk.qs);
                    for (k, v) in q.iter_mut().enumerate() {
                        *v = low[k] | (((qh >> k) & 1) as u8) << 4;
                    }
                }
                GgmlType::Q4_K => {
                    let blk = &cast_blocks::<BlockQ4_K>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    dst[Q4_K_DMIN + 2 * lane..][..2].copy_from_slice(&blk.dmin.0);
                    for (k, s) in blk.scales.chunks_exact(4).enumerate() {
                        dst[Q4_K_SCALES + 4 * (GROUP * k + lane)..][..4].copy_from_slice(s);
                    }
                    // ggml: sub-block `2c + h` is nibble `h` of `qs[32c..32c + 32]`, so each
                    // Rows16 byte takes two nibbles of one half from the same ggml bytes.
                    let qs = &mut dst[quants_offset(ty)..];
                    for j in 0..QK_K / QK {
                        let (src, h) = (&blk.qs[32 * (j / 2)..][..32], 4 * (j % 2));
                        write_nibbles(&mut qs[j * Q4_K_SUB_BYTES..], lane, |k| src[k] >> h);
                    }
                    continue;
                }
                GgmlType::Q6_K => {
                    let blk = &cast_blocks::<BlockQ6_K>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    for (s, &sc) in blk.scales.iter().enumerate() {
                        dst[Q6_K_SCALES + GROUP * s + lane] = sc as u8;
                    }
                    let v = blk.quants().map(|q| (q + 32) as u8);
                    let qs = &mut dst[quants_offset(ty)..];
                    for (j, v) in v.chunks_exact(QK).enumerate() {
                        let chunk = &mut qs[j * Q6_K_SUB_BYTES..][..Q6_K_SUB_BYTES];
                        write_nibbles(chunk, lane, |k| v[k]);
                        write_high2(&mut chunk[Q6_K_HBITS..], lane, |k| v[k] >> 4);
                    }
                    continue;
                }
                _ => {
                    let blk = &cast_blocks::<BlockQ8_0>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    q.copy_from_slice(&blk.qs.map(|q| q as u8));
                }
            }
            write_quants(ty, &q, lane, dst);
        }
    }
}

/// Writes the 32 quants `q` (one block of lane `lane` of a 32-element type, column order) into
/// group-block `gb` (zeroed where they go): chunk by chunk, the inverse of [`raw_quant`].
fn write_quants(ty: GgmlType, q: &[u8; QK], lane: usize, gb: &mut [u8]) {
    let qs = &mut gb[quants_offset(ty)..];
    if ty == GgmlType::Q8_0 {
        for (pair, v) in q.chunks_exact(2).enumerate() {
            qs[pair * 2 * GROUP + 2 * lane..][..2].copy_from_slice(v);
        }
        return;
    }
    write_nibbles(qs, lane, |k| q[k]);
    if ty == GgmlType::Q5_0 {
        for c in 0..8 {
            for e in 0..2 {
                let (lo, hi) = (q[2 * c + e] >> 4, q[16 + 2 * c + e] >> 4);
                let bit = 2 * (c % 4);
                gb[Q5_0_HBITS + (c / 4) * 2 * GROUP + 2 * lane + e] |=
                    (lo << bit) | (hi << (bit + 1));
            }
        }
    }
}

/// Writes lane `lane` of 32 columns in the Q4 nibble layout into `chunks` (8 chunks of 32
/// bytes): `nibble(k)`'s low 4 bits are column `k` (see [`nibble_position`]).
#[inline]
fn write_nibbles(chunks: &mut [u8], lane: usize, nibble: impl Fn(usize) -> u8) {
    for c in 0..8 {
        for e in 0..2 {
            let (lo, hi) = (nibble(2 * c + e) & 0x0F, nibble(16 + 2 * c + e) & 0x0F);
            chunks[c * 2 * GROUP + 2 * lane + e] = lo | (hi << 4);
        }
    }
}

/// Ors lane `lane`'s top 2 bits of 32 columns (`high(k)`, 0..4, column `k`) into the 4
/// high-bit planes of a Q6_K chunk at `planes` (see [`high2_position`]).
#[inline]
fn write_high2(planes: &mut [u8], lane: usize, high: impl Fn(usize) -> u8) {
    for c in 0..8 {
        for e in 0..2 {
            let (lo, hi) = (high(2 * c + e) & 3, high(16 + 2 * c + e) & 3);
            planes[(c / 2) * 2 * GROUP + 2 * lane + e] |= (lo | (hi << 2)) << (4 * (c % 2));
        }
    }
}

/// The 32 nibbles of a Q4 block in column order (ggml: byte `j` = columns `j`, `j + 16`).
fn nibble_values(qs: &[u8; QK / 2]) -> [u8; QK] {
    std::array::from_fn(|k| {
        if k < 16 {
            qs[k] & 0x0F
        } else {
            qs[k - 16] >> 4
        }
    })
}

/// Where column `k` of lane `lane` lives in a group-block's quants: (byte, bit shift).
#[inline]
fn quant_position(ty: GgmlType, lane: usize, k: usize) -> (usize, u32) {
    match ty {
        GgmlType::Q8_0 => ((k / 2) * 2 * GROUP + 2 * lane + k % 2, 0),
        // Sub-block `k / 32`, each in the 32-column nibble layout.
        GgmlType::Q4_K => {
            let (i, shift) = nibble_position(lane, k % QK);
            (k / QK * Q4_K_SUB_BYTES + i, shift)
        }
        GgmlType::Q6_K => {
            let (i, shift) = nibble_position(lane, k % QK);
            (k / QK * Q6_K_SUB_BYTES + i, shift)
        }
        _ => nibble_position(lane, k),
    }
}

/// Columns 0..16 in the low nibbles of chunks 0..8, 16..32 in the high nibbles.
#[inline]
fn nibble_position(lane: usize, k: usize) -> (usize, u32) {
    let (pair, e) = (k / 2, k % 2);
    (
        (pair % 8) * 2 * GROUP + 2 * lane + e,
        if k < 16 { 0 } else { 4 },
    )
}

/// Where Q5_0's fifth bit of column `k` of lane `lane` lives in a group-block: (byte, bit).
#[inline]
fn high_bit_position(lane: usize, k: usize) -> (usize, u32) {
    let c = (k / 2) % 8;
    (
        Q5_0_HBITS + (c / 4) * 2 * GROUP + 2 * lane + k % 2,
        2 * (c % 4) as u32 + (k >= 16) as u32,
    )
}

/// Where Q6_K's top 2 bits of column `k` of lane `lane` live in a group-block: (byte, shift).
#[inline]
fn high2_position(lane: usize, k: usize) -> (usize, u32) {
    let (j, kk) = (k / QK, k % QK);
    let c = (kk / 2) % 8;
    (
        quants_offset(GgmlType::Q6_K)
            + j * Q6_K_SUB_BYTES
            + Q6_K_HBITS
            + (c / 2) * 2 * GROUP
            + 2 * lane
            + kk % 2,
        4 * (c % 2) as u32 + 2 * (kk >= 16) as u32,
    )
}

/// The raw quant of column `k` of lane `lane` in group-block `gb` (0..16 for Q4 and Q4_K,
/// 0..32 for Q5_0, 0..64 for Q6_K, i8 for Q8_0).
#[inline]
fn raw_quant(ty: GgmlType, gb: &[u8], lane: usize, k: usize) -> i32 {
    let (i, shift) = quant_position(ty, lane, k);
    let byte = gb[quants_offset(ty) + i];
    match ty {
        GgmlType::Q8_0 => byte as i8 as i32,
        GgmlType::Q5_0 => {
            let (i, bit) = high_bit_position(lane, k);
            (((byte >> shift) & 0x0F) | (((gb[i] >> bit) & 1) << 4)) as i32
        }
        GgmlType::Q6_K => {
            let (i, hs) = high2_position(lane, k);
            (((byte >> shift) & 0x0F) | (((gb[i] >> hs) & 3) << 4)) as i32
        }
        _ => ((byte >> shift) & 0x0F) as i32,
    }
}

/// The 12 scale bytes of lane `lane` of a Q4_K group-block.
fn k4_scale_bytes(gb: &[u8], lane: usize) -> [u8; K_SCALE_SIZE] {
    std::array::from_fn(|i| gb[Q4_K_SCALES + 4 * (GROUP * (i / 4) + lane) + i % 4])
}

#[inline]
fn f16_at(gb: &[u8], i: usize) -> f32 {
    F16Le([gb[i], gb[i + 1]]).to_f32()
}

/// Writes row `r` of a Rows16 matrix (`cols` elements of `ty`) back in ggml's layout into
/// `dst` (`cols / block_size · type_size` bytes): the inverse of [`pack`].
///
/// Panics if `r` or a length does not fit.
pub fn unpack_row(ty: GgmlType, cols: usize, packed: &[u8], r: usize, dst: &mut [u8]) {
    let (nb, ts) = (cols / ty.block_size(), ty.type_size());
    assert_eq!(dst.len(), nb * ts, "row bytes");
    for (b, out) in dst.chunks_exact_mut(ts).enumerate() {
        unpack_block(ty, group_block(ty, cols, packed, r, b), r % GROUP, out);
    }
}

/// The group-block holding block `b` of row `r` of a Rows16 matrix of `cols` columns.
pub fn group_block(ty: GgmlType, cols: usize, packed: &[u8], r: usize, b: usize) -> &[u8] {
    let (nb, gbytes) = (cols / ty.block_size(), GROUP * ty.type_size());
    &packed[(r / GROUP * nb + b) * gbytes..][..gbytes]
}

/// Writes lane `lane` of group-block `gb` as one ggml block of `ty` into `out`
/// (`type_size` bytes).
///
/// Panics if `ty` has no Rows16 layout or a length does not fit.
pub fn unpack_block(ty: GgmlType, gb: &[u8], lane: usize, out: &mut [u8]) {
    assert!(supports(ty), "no Rows16 layout for {ty}");
    assert!(lane < GROUP && gb.len() == GROUP * ty.type_size() && out.len() == ty.type_size());
    let mut q = [0u8; QK_K];
    let q = &mut q[..ty.block_size()];
    for (k, v) in q.iter_mut().enumerate() {
        *v = raw_quant(ty, gb, lane, k) as u8;
    }
    let q = &*q;
    if ty == GgmlType::Q6_K {
        // ggml: element `128c + 32k + l` is nibble `k / 2` of `ql[64c + 32 (k % 2) + l]` and
        // bits `2k..2k + 2` of `qh[32c + l]`; then the 16 scales and `d`.
        let (ql, rest) = out.split_at_mut(QK_K / 2);
        let (qh, rest) = rest.split_at_mut(QK_K / 4);
        ql.fill(0);
        qh.fill(0);
        for (e, &v) in q.iter().enumerate() {
            let (c, k, l) = (e / 128, (e / 32) % 4, e % 32);
            ql[64 * c + 32 * (k % 2) + l] |= (v & 0x0F) << (4 * (k / 2));
            qh[32 * c + l] |= (v >> 4) << (2 * k);
        }
        for (s, o) in rest[..QK_K / 16].iter_mut().enumerate() {
            *o = gb[Q6_K_SCALES + GROUP * s + lane];
        }
        rest[QK_K / 16..].copy_from_slice(&gb[2 * lane..2 * lane + 2]);
        return;
    }
    out[..2].copy_from_slice(&gb[2 * lane..2 * lane + 2]);
    // Q4 nibbles in ggml's order: byte `j` holds columns `j` and `j + 16`.
    let pack_nibbles = |q: &[u8], qs: &mut [u8]| {
        for (j, o) in qs.iter_mut().enumerate() {
            *o = (q[j] & 0x0F) | (q[j + 16] << 4);
        }
    };
    match ty {
        GgmlType::Q8_0 => out[2..].copy_from_slice(q),
        GgmlType::Q4_0 => pack_nibbles(q, &mut out[2..]),
        GgmlType::Q4_1 => {
            out[2..4].copy_from_slice(&gb[2 * GROUP + 2 * lane..][..2]);
            pack_nibbles(q, &mut out[4..]);
        }
        GgmlType::Q5_0 => {
            let qh = q
                .iter()
                .enumerate()
                .fold(0u32, |h, (k, &v)| h | (u32::from(v >> 4) << k));
            out[2..6].copy_from_slice(&qh.to_le_bytes());
            pack_nibbles(q, &mut out[6..]);
        }
        _ => {
            // Q4_K: element `64c + 32h + l` is nibble `h` of `qs[32c + l]`.
            out[2..4].copy_from_slice(&gb[Q4_K_DMIN + 2 * lane..][..2]);
            out[4..4 + K_SCALE_SIZE].copy_from_slice(&k4_scale_bytes(gb, lane));
            for (i, o) in out[4 + K_SCALE_SIZE..].iter_mut().enumerate() {
                let (c, l) = (i / 32, i % 32);
                *o = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
            }
        }
    }
}

/// An activation block as the reference dots read it: [`BlockA16`] or [`BlockA8`].
pub trait ActBlock {
    /// The scale.
    fn scale(&self) -> f32;
    /// `d · Σ q`.
    fn scaled_sum(&self) -> f32;
    /// The 32 quants, in column order.
    fn quant_values(&self) -> [i32; QK];
}

impl ActBlock for BlockA16 {
    fn scale(&self) -> f32 {
        self.d()
    }
    fn scaled_sum(&self) -> f32 {
        self.s()
    }
    fn quant_values(&self) -> [i32; QK] {
        self.quants().map(i32::from)
    }
}

impl ActBlock for BlockA8 {
    fn scale(&self) -> f32 {
        self.d()
    }
    fn scaled_sum(&self) -> f32 {
        self.s()
    }
    fn quant_values(&self) -> [i32; QK] {
        self.quants()
    }
}

/// Reference dot product of lane `lane` of a Rows16 group (`nb` group-blocks at `group`) with
/// an A16 activation row (`nb · block_size / 32` blocks) — exactly the A16 reference dot of
/// the unpacked row ([`super::a16`]): per 32 columns `d_w · d_a · sumi` (`+ m · s` for Q4_1;
/// for Q4_K `d · sc · d_a · sumi + dmin · m · (−s)` per sub-block), the integer sums exact, in
/// column order.
pub fn vec_dot_a16(ty: GgmlType, nb: usize, group: &[u8], lane: usize, a: &[BlockA16]) -> f32 {
    vec_dot_blocks(ty, nb, group, lane, a)
}

/// The reference dot of lane `lane` of a Rows16 group (`nb` group-blocks of Q4_0, Q4_1, Q5_0,
/// Q8_0, Q4_K or Q6_K) with A8 activations `a` ([`crate::quant::a8`]), the same sums as
/// [`vec_dot_a16`]'s. The plain twin of the A8 SIMD kernels.
///
/// Panics for another type, or if a length does not fit.
pub fn vec_dot_a8(ty: GgmlType, nb: usize, group: &[u8], lane: usize, a: &[BlockA8]) -> f32 {
    assert!(supports_a8(ty), "{ty} has no A8 dot");
    vec_dot_blocks(ty, nb, group, lane, a)
}

/// [`vec_dot_a16`] and [`vec_dot_a8`]: per 32-column block the exact
/// `sumi = Σ (q_w − offset) · q_a`, then `d_w · d_a · sumi` (Q4_1: `+ m · s_a`; Q4_K and Q6_K:
/// each sub-block as [`k4_dot`] and [`k6_dot`]).
fn vec_dot_blocks<A: ActBlock>(ty: GgmlType, nb: usize, group: &[u8], lane: usize, a: &[A]) -> f32 {
    let (ts, subs) = (ty.type_size(), ty.block_size() / QK);
    assert!(group.len() >= nb * GROUP * ts && a.len() >= nb * subs && lane < GROUP);
    let offset = match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        GgmlType::Q6_K => 32,
        _ => 0,
    };
    let mut sumf = 0f32;
    for b in 0..nb {
        let gb = &group[b * GROUP * ts..(b + 1) * GROUP * ts];
        let d = f16_at(gb, 2 * lane);
        for (j, ba) in a[b * subs..(b + 1) * subs].iter().enumerate() {
            let qa = ba.quant_values();
            let half = |h: usize| -> i32 {
                (16 * h..16 * h + 16)
                    .map(|k| (raw_quant(ty, gb, lane, QK * j + k) - offset) * qa[k])
                    .sum()
            };
            sumf += match ty {
                GgmlType::Q6_K => {
                    let sc = |h: usize| gb[Q6_K_SCALES + GROUP * (2 * j + h) + lane] as i8;
                    k6_dot(d, [sc(0), sc(1)], ba, [half(0), half(1)])
                }
                GgmlType::Q4_1 => {
                    let sumi = half(0) + half(1);
                    d * ba.scale() * sumi as f32
                        + f16_at(gb, 2 * GROUP + 2 * lane) * ba.scaled_sum()
                }
                GgmlType::Q4_K => {
                    let (sc, m) = get_scale_min_k4(j, &k4_scale_bytes(gb, lane));
                    let dmin = f16_at(gb, Q4_K_DMIN + 2 * lane);
                    k4_dot(d, dmin, sc, m, ba, half(0) + half(1))
                }
                _ => d * ba.scale() * (half(0) + half(1)) as f32,
            };
        }
    }
    sumf
}

/// Whether Rows16 `ty` has an A8 dot ([`vec_dot_a8`]): every Rows16 format.
pub fn supports_a8(ty: GgmlType) -> bool {
    supports(ty)
}

/// One Q4_K sub-block's term against an activation block: `d·sc · d_a · sumi + dmin·m · (−s_a)`,
/// with `d·sc` and `dmin·m` exact in f32 (an f16 times a 6-bit integer).
#[inline]
pub(crate) fn k4_dot<A: ActBlock>(d: f32, dmin: f32, sc: u8, m: u8, a: &A, sumi: i32) -> f32 {
    (d * sc as f32) * a.scale() * sumi as f32 + (dmin * m as f32) * -a.scaled_sum()
}

/// One activation block's term of a Q6_K row: its two 16-column sub-blocks, `d·sc_h · d_a · sumi_h`
/// each, with `d·sc` exact in f32 (an f16 times an i8).
#[inline]
pub(crate) fn k6_dot<A: ActBlock>(d: f32, sc: [i8; 2], a: &A, sumi: [i32; 2]) -> f32 {
    (d * sc[0] as f32) * a.scale() * sumi[0] as f32
        + (d * sc[1] as f32) * a.scale() * sumi[1] as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{SplitMix64, random_weight_row};
    use crate::quant::{
        dequantize_row, quantize_row_a16, vec_dot_q4_0_a16, vec_dot_q4_1_a16, vec_dot_q4_K_a16,
        vec_dot_q5_0_a16, vec_dot_q6_K_a16, vec_dot_q8_0_a16,
    };

    const TYPES: [GgmlType; 6] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    #[test]
    fn pack_then_unpack_gives_every_row_back() {
        let mut rng = SplitMix64::new(3);
        for ty in TYPES {
            for (rows, blocks) in [(1, 1), (15, 2), (16, 3), (17, 1), (40, 5)] {
                let cols = blocks * ty.block_size();
                let data: Vec<u8> = (0..rows)
                    .flat_map(|_| random_weight_row(&mut rng, ty, cols))
                    .collect();
                let packed = pack(ty, rows, cols, &data);
                assert_eq!(packed.len(), packed_bytes(ty, rows, cols));
                let rb = cols / ty.block_size() * ty.type_size();
                let mut row = vec![0u8; rb];
                for r in 0..rows {
                    unpack_row(ty, cols, &packed, r, &mut row);
                    assert_eq!(
                        row,
                        data[r * rb..(r + 1) * rb],
                        "{ty} {rows}x{cols} row {r}"
                    );
                }
                // Padding rows are all zero.
                for r in rows..rows.div_ceil(GROUP) * GROUP {
                    unpack_row(ty, cols, &packed, r, &mut row);
                    assert!(row.iter().all(|&b| b == 0));
                }
            }
        }
    }

    #[test]
    fn reference_dot_equals_the_a16_reference_of_the_unpacked_row() {
        let mut rng = SplitMix64::new(4);
        for ty in TYPES {
            let (rows, cols) = (19, 512);
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_weight_row(&mut rng, ty, cols))
                .collect();
            let packed = pack(ty, rows, cols, &data);
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut a = vec![BlockA16::ZERO; cols / QK];
            quantize_row_a16(&x, &mut a);
            let nb = cols / ty.block_size();
            let rb = nb * ty.type_size();
            for r in 0..rows {
                let group = &packed[(r / GROUP) * nb * GROUP * ty.type_size()..];
                let got = vec_dot_a16(ty, nb, group, r % GROUP, &a);
                let w = &data[r * rb..(r + 1) * rb];
                let want = match ty {
                    GgmlType::Q4_0 => vec_dot_q4_0_a16(cols, w, &a),
                    GgmlType::Q4_1 => vec_dot_q4_1_a16(cols, w, &a),
                    GgmlType::Q5_0 => vec_dot_q5_0_a16(cols, w, &a),
                    GgmlType::Q4_K => vec_dot_q4_K_a16(cols, w, &a),
                    GgmlType::Q6_K => vec_dot_q6_K_a16(cols, w, &a),
                    _ => vec_dot_q8_0_a16(cols, w, &a),
                };
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} row {r}");
            }
        }
    }

    /// The A8 reference is the dot of the dequantized weight row with the dequantized A8
    /// activations, up to f32 rounding (the integer sums are exact).
    #[test]
    fn a8_reference_dot_is_the_dequantized_dot() {
        use crate::quant::{BlockA8, dequantize_row_a8, quantize_row_a8};
        let mut rng = SplitMix64::new(6);
        for ty in TYPES.into_iter().filter(|&t| supports_a8(t)) {
            let (rows, cols) = (19, 512);
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_weight_row(&mut rng, ty, cols))
                .collect();
            let packed = pack(ty, rows, cols, &data);
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let zero = BlockA8 {
                d: [0; 4],
                s: [0; 4],
                sums: [0; 4],
                qs: [0; QK],
            };
            let mut a = vec![zero; cols / QK];
            quantize_row_a8(&x, &mut a);
            let mut xa = vec![0f32; cols];
            dequantize_row_a8(&a, &mut xa);
            let nb = cols / ty.block_size();
            let rb = nb * ty.type_size();
            for r in 0..rows {
                let group = &packed[(r / GROUP) * nb * GROUP * ty.type_size()..];
                let got = vec_dot_a8(ty, nb, group, r % GROUP, &a) as f64;
                let mut wd = vec![0f32; cols];
                dequantize_row(ty, &data[r * rb..(r + 1) * rb], &mut wd);
                let terms = wd.iter().zip(&xa).map(|(&w, &x)| w as f64 * x as f64);
                let want: f64 = terms.clone().sum();
                let mag: f64 = terms.map(f64::abs).sum();
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-6,
                    "{ty} row {r}: {got} vs {want}"
                );
            }
        }
    }

    /// The k-quant references (ggml layout, A16) are the dequantized row's f32 dot within the
    /// activation quantization step and f32 rounding: what makes them references at all.
    #[test]
    fn k_quant_a16_references_are_the_dequantized_dot() {
        let mut rng = SplitMix64::new(5);
        let cols = 1024;
        for (ty, _) in (0..8).flat_map(|i| [(GgmlType::Q4_K, i), (GgmlType::Q6_K, i)]) {
            let w = random_weight_row(&mut rng, ty, cols);
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut a = vec![BlockA16::ZERO; cols / QK];
            quantize_row_a16(&x, &mut a);
            let mut wd = vec![0f32; cols];
            dequantize_row(ty, &w, &mut wd);
            let exact: f64 = wd.iter().zip(&x).map(|(&w, &x)| w as f64 * x as f64).sum();
            let mag: f64 = wd
                .iter()
                .zip(&x)
                .map(|(&w, &x)| (w as f64 * x as f64).abs())
                .sum();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            let wsum: f64 = wd.iter().map(|&w| (w as f64).abs()).sum();
            let budget = wsum * amax / crate::quant::A16_QMAX as f64 + 1e-5 * mag;
            let got = match ty {
                GgmlType::Q4_K => vec_dot_q4_K_a16(cols, &w, &a),
                _ => vec_dot_q6_K_a16(cols, &w, &a),
            } as f64;
            assert!(
                (got - exact).abs() <= budget,
                "{ty}: {got} vs {exact} ({budget})"
            );
        }
    }
}
