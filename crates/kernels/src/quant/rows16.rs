//! Rows16: tokenmill's interleaved layout of a 32-element weight format (Q4_0, Q4_1, Q8_0),
//! repacked once at load so that one SIMD lane holds one weight row — with its packer,
//! unpacker and reference dot product (the plain twin of the SIMD kernels).
//!
//! Why: in ggml's layout a row's block is one vector of 32 quants, so every (weight row,
//! activation row, block) ends in a horizontal sum, a scale multiply and an FMA of its own —
//! about five uops besides the two integer multiply-adds. Interleaving 16 rows puts row `r` in
//! lane `r` of every vector: one `vpdpwssd` (with the activation pair broadcast from memory)
//! advances 16 rows by two elements, a block's 16 integer sums come out in one register, and
//! the scales of 16 rows are applied with one FMA. The same bytes as ggml's, permuted.
//!
//! Layout: the rows are cut into groups of [`GROUP`] = 16 (the last one padded with all-zero
//! rows, which contribute 0); a group is `nb` group-blocks back to back, one per block of 32
//! columns, each `16 × type_size` bytes — for row `r` of the group and column `k` of the block:
//! * `d: [f16; 16]` (the row scales), then for Q4_1 `m: [f16; 16]` (the row offsets);
//! * Q4_0 / Q4_1 quants, 8 chunks of 32 bytes: byte `2r + e` of chunk `c` holds column
//!   `2c + e` in its low nibble and column `16 + 2c + e` in its high nibble;
//! * Q8_0 quants, 16 chunks of 32 bytes: byte `2r + e` of chunk `c` is column `2c + e`.
//!
//! Widened to i16, a 32-byte chunk is 16 lanes of (row, two consecutive columns) pairs: what
//! `vpmaddwd` / `vpdpwssd` multiply against one broadcast pair of A16 activations.

use super::a16::BlockA16;
use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, F16Le, QK, cast_blocks};
use super::types::GgmlType;

/// Weight rows per interleaved group.
pub const GROUP: usize = 16;

/// Whether `ty` has a Rows16 layout.
pub fn supports(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// Bytes of a Rows16 matrix of `rows × cols` (rows rounded up to whole groups).
pub fn packed_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
    rows.div_ceil(GROUP) * GROUP * (cols / QK) * ty.type_size()
}

/// Byte offset of the quants in a group-block (after the scales and offsets).
pub const fn quants_offset(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 4 * GROUP,
        _ => 2 * GROUP,
    }
}

/// Repacks `rows` ggml rows of `cols` elements of `ty` (`data`, as in GGUF) into Rows16.
///
/// Panics if `ty` has no Rows16 layout, `cols` is not a multiple of 32 or `data` is shorter
/// than the matrix.
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
    assert!(cols.is_multiple_of(QK), "{cols} columns");
    let (nb, ts) = (cols / QK, ty.type_size());
    assert!(data.len() >= rows * nb * ts, "weight bytes");
    assert_eq!(out.len(), packed_bytes(ty, rows, cols), "packed bytes");
    out.fill(0);
    for (r, row) in data[..rows * nb * ts].chunks_exact(nb * ts).enumerate() {
        let (g, lane) = (r / GROUP, r % GROUP);
        for (b, block) in row.chunks_exact(ts).enumerate() {
            let gb = (g * nb + b) * GROUP * ts;
            let dst = &mut out[gb..gb + GROUP * ts];
            let q = match ty {
                GgmlType::Q4_0 => {
                    let blk = &cast_blocks::<BlockQ4_0>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    nibble_values(&blk.qs)
                }
                GgmlType::Q4_1 => {
                    let blk = &cast_blocks::<BlockQ4_1>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    dst[2 * GROUP + 2 * lane..][..2].copy_from_slice(&blk.m.0);
                    nibble_values(&blk.qs)
                }
                _ => {
                    let blk = &cast_blocks::<BlockQ8_0>(block)[0];
                    dst[2 * lane..2 * lane + 2].copy_from_slice(&blk.d.0);
                    blk.qs.map(|q| q as u8)
                }
            };
            let qs = &mut dst[quants_offset(ty)..];
            for (k, &v) in q.iter().enumerate() {
                let (i, shift) = quant_position(ty, lane, k);
                qs[i] |= v << shift;
            }
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
    let (pair, e) = (k / 2, k % 2);
    match ty {
        GgmlType::Q8_0 => (pair * 2 * GROUP + 2 * lane + e, 0),
        // Columns 0..16 in the low nibbles of chunks 0..8, 16..32 in the high nibbles.
        _ => (
            (pair % 8) * 2 * GROUP + 2 * lane + e,
            if k < 16 { 0 } else { 4 },
        ),
    }
}

/// The raw quant of column `k` of lane `lane` in group-block `gb` (0..16 for Q4, i8 for Q8_0).
#[inline]
fn raw_quant(ty: GgmlType, gb: &[u8], lane: usize, k: usize) -> i32 {
    let (i, shift) = quant_position(ty, lane, k);
    let byte = gb[quants_offset(ty) + i];
    match ty {
        GgmlType::Q8_0 => byte as i8 as i32,
        _ => ((byte >> shift) & 0x0F) as i32,
    }
}

#[inline]
fn f16_at(gb: &[u8], i: usize) -> f32 {
    F16Le([gb[i], gb[i + 1]]).to_f32()
}

/// Writes row `r` of a Rows16 matrix (`cols` elements of `ty`) back in ggml's layout into
/// `dst` (`cols / 32 · type_size` bytes): the inverse of [`pack`].
///
/// Panics if `r` or a length does not fit.
pub fn unpack_row(ty: GgmlType, cols: usize, packed: &[u8], r: usize, dst: &mut [u8]) {
    let (nb, ts) = (cols / QK, ty.type_size());
    assert_eq!(dst.len(), nb * ts, "row bytes");
    for (b, out) in dst.chunks_exact_mut(ts).enumerate() {
        unpack_block(ty, group_block(ty, cols, packed, r, b), r % GROUP, out);
    }
}

/// The group-block holding block `b` of row `r` of a Rows16 matrix of `cols` columns.
pub fn group_block(ty: GgmlType, cols: usize, packed: &[u8], r: usize, b: usize) -> &[u8] {
    let (nb, gbytes) = (cols / QK, GROUP * ty.type_size());
    &packed[(r / GROUP * nb + b) * gbytes..][..gbytes]
}

/// Writes lane `lane` of group-block `gb` as one ggml block of `ty` into `out`
/// (`type_size` bytes).
///
/// Panics if `ty` has no Rows16 layout or a length does not fit.
pub fn unpack_block(ty: GgmlType, gb: &[u8], lane: usize, out: &mut [u8]) {
    assert!(supports(ty), "no Rows16 layout for {ty}");
    assert!(lane < GROUP && gb.len() == GROUP * ty.type_size() && out.len() == ty.type_size());
    out[..2].copy_from_slice(&gb[2 * lane..2 * lane + 2]);
    let q: [i32; QK] = std::array::from_fn(|k| raw_quant(ty, gb, lane, k));
    match ty {
        GgmlType::Q8_0 => {
            for (o, &v) in out[2..].iter_mut().zip(&q) {
                *o = v as i8 as u8;
            }
        }
        _ => {
            let qs = if ty == GgmlType::Q4_1 {
                out[2..4].copy_from_slice(&gb[2 * GROUP + 2 * lane..][..2]);
                &mut out[4..]
            } else {
                &mut out[2..]
            };
            for (j, o) in qs.iter_mut().enumerate() {
                *o = (q[j] | (q[j + 16] << 4)) as u8;
            }
        }
    }
}

/// Reference dot product of lane `lane` of a Rows16 group (`nb` group-blocks at `group`) with
/// an A16 activation row — exactly the A16 reference dot of the unpacked row
/// ([`super::a16`]): `Σ_b d_w · d_a · sumi (+ m · s)`, the integer sums exact, in block order.
pub fn vec_dot_a16(ty: GgmlType, nb: usize, group: &[u8], lane: usize, a: &[BlockA16]) -> f32 {
    let ts = ty.type_size();
    assert!(group.len() >= nb * GROUP * ts && a.len() >= nb && lane < GROUP);
    let mut sumf = 0f32;
    for (b, ba) in a[..nb].iter().enumerate() {
        let gb = &group[b * GROUP * ts..(b + 1) * GROUP * ts];
        let qa = ba.quants();
        let offset = if ty == GgmlType::Q4_0 { 8 } else { 0 };
        let sumi: i32 = (0..QK)
            .map(|k| (raw_quant(ty, gb, lane, k) - offset) * qa[k] as i32)
            .sum();
        let d = f16_at(gb, 2 * lane);
        sumf += if ty == GgmlType::Q4_1 {
            d * ba.d() * sumi as f32 + f16_at(gb, 2 * GROUP + 2 * lane) * ba.s()
        } else {
            d * ba.d() * sumi as f32
        };
    }
    sumf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testing::{SplitMix64, random_weight_row};
    use crate::quant::{quantize_row_a16, vec_dot_q4_0_a16, vec_dot_q4_1_a16, vec_dot_q8_0_a16};

    #[test]
    fn pack_then_unpack_gives_every_row_back() {
        let mut rng = SplitMix64::new(3);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for (rows, cols) in [(1, 32), (15, 64), (16, 96), (17, 32), (40, 160)] {
                let data: Vec<u8> = (0..rows)
                    .flat_map(|_| random_weight_row(&mut rng, ty, cols))
                    .collect();
                let packed = pack(ty, rows, cols, &data);
                assert_eq!(packed.len(), packed_bytes(ty, rows, cols));
                let rb = cols / QK * ty.type_size();
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
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (19, 128);
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_weight_row(&mut rng, ty, cols))
                .collect();
            let packed = pack(ty, rows, cols, &data);
            let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
            let mut a = vec![BlockA16::ZERO; cols / QK];
            quantize_row_a16(&x, &mut a);
            let (nb, rb) = (cols / QK, cols / QK * ty.type_size());
            for r in 0..rows {
                let group = &packed[(r / GROUP) * nb * GROUP * ty.type_size()..];
                let got = vec_dot_a16(ty, nb, group, r % GROUP, &a);
                let w = &data[r * rb..(r + 1) * rb];
                let want = match ty {
                    GgmlType::Q4_0 => vec_dot_q4_0_a16(cols, w, &a),
                    GgmlType::Q4_1 => vec_dot_q4_1_a16(cols, w, &a),
                    _ => vec_dot_q8_0_a16(cols, w, &a),
                };
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} row {r}");
            }
        }
    }
}
