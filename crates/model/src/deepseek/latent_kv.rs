//! [`LatentKvCache`]: paged storage of MLA's compressed KV — per token per layer only the
//! normalised latent `c` (`kv_lora_rank`) and the rotated shared rope key `k_pe`
//! (`qk_rope_head_dim`), never the expanded per-head K and V.
//!
//! Layout `[n_layers, num_blocks, block_size, latent_dim]`, row-major: position `p` of a
//! sequence is row `block_table[p / block_size] · block_size + p % block_size` of its layer.
//! Block ownership is the caller's, as for [`KvCache`](crate::KvCache).
//!
//! Rows are f32 (exact; `Model::kv_cache`'s), f16 (the commands' and `EngineConfig`'s default)
//! or bf16 ([`KvDtype`], `--kv-cache-dtype f32|f16|bf16`; 16-bit:
//! half the bytes per token and half the bytes MLA reads per key). A 16-bit row is rounded to
//! nearest even once, when it is written, and widened back to f32 exactly when MLA reads it
//! ([`LatentKvCache::gather`]), so attention over a 16-bit cache is the f32 computation over
//! the rounded rows, as for the Llama family's [`KvCache`](crate::KvCache).
//!
//! int8 rows (`--kv-cache-dtype int8`) are quantized in groups of [`LATENT_INT8_GROUP`]
//! values, each with its own f32 scale (the kernels' [`quantize_int8_row`]), so at
//! DeepSeek's widths the rope key (the last 64) never shares a scale with the latent; a
//! row is `dim` bytes plus a scale per group, dequantized as it is gathered.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use tokenmill_kernels::attention::{KvDtype, KvElem, quantize_int8_row};

use crate::resident;

/// The rows of every layer, `[n_layers, num_blocks, block_size, dim]`, of the cache's type.
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// Quants, and the scales `[n_layers, num_blocks, block_size, groups]`.
    I8 {
        q: Vec<i8>,
        scale: Vec<f32>,
    },
}

/// Values of a latent row that share one int8 scale (the last group may be shorter).
pub const LATENT_INT8_GROUP: usize = 64;

pub struct LatentKvCache {
    num_blocks: usize,
    block_size: usize,
    n_layers: usize,
    /// `kv_lora_rank + qk_rope_head_dim`
    dim: usize,
    rows: Rows,
}

impl LatentKvCache {
    /// An f32 cache.
    pub fn new(n_layers: usize, dim: usize, num_blocks: usize, block_size: usize) -> Self {
        Self::with_dtype(n_layers, dim, num_blocks, block_size, KvDtype::F32)
    }

    /// A cache of `dtype` rows.
    pub fn with_dtype(
        n_layers: usize,
        dim: usize,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Self {
        let len = n_layers * num_blocks * block_size * dim;
        let rows = match dtype {
            KvDtype::F32 => Rows::F32(resident::filled(len, 0.0)),
            KvDtype::F16 => Rows::F16(resident::filled(len, f16::ZERO)),
            KvDtype::BF16 => Rows::BF16(resident::filled(len, bf16::ZERO)),
            KvDtype::I8 => Rows::I8 {
                q: resident::filled(len, 0),
                scale: resident::filled(len / dim.max(1) * groups(dim), 0.0),
            },
        };
        LatentKvCache {
            num_blocks,
            block_size,
            n_layers,
            dim,
            rows,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The element type of the rows.
    pub fn dtype(&self) -> KvDtype {
        match self.rows {
            Rows::F32(_) => KvDtype::F32,
            Rows::F16(_) => KvDtype::F16,
            Rows::BF16(_) => KvDtype::BF16,
            Rows::I8 { .. } => KvDtype::I8,
        }
    }

    /// Blocks needed for `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Bytes held per token across all layers: `n_layers` rows of `kv_lora_rank + rope dim`
    /// elements of the cache's type (4 bytes for f32, 2 for f16 and bf16, 1 for int8 plus
    /// its scales: [`row_bytes`]).
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * row_bytes(self.dtype(), self.dim)
    }

    /// The element range of the row of `layer` at `pos` of the sequence with `block_table`.
    fn range(&self, layer: usize, block_table: &[u32], pos: usize) -> std::ops::Range<usize> {
        let block = block_table[pos / self.block_size] as usize;
        let row = (layer * self.num_blocks + block) * self.block_size + pos % self.block_size;
        row * self.dim..(row + 1) * self.dim
    }

    /// Stores `row` (`dim` values) as the row of `layer` at `pos` (rounded for f16 and bf16).
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, row: &[f32]) {
        let r = self.range(layer, block_table, pos);
        match &mut self.rows {
            Rows::F32(d) => d[r].copy_from_slice(row),
            Rows::F16(d) => d[r].convert_from_f32_slice(row),
            Rows::BF16(d) => d[r].convert_from_f32_slice(row),
            Rows::I8 { q, scale } => {
                let g0 = r.start / self.dim * groups(self.dim);
                let groups = row.chunks(LATENT_INT8_GROUP);
                for ((src, dst), s) in groups
                    .zip(q[r].chunks_mut(LATENT_INT8_GROUP))
                    .zip(&mut scale[g0..])
                {
                    *s = quantize_int8_row(src, dst);
                }
            }
        }
    }

    /// Row `r` (an element range) of an int8 cache, dequantized into `out`.
    fn dequantize(&self, q: &[i8], scale: &[f32], r: std::ops::Range<usize>, out: &mut [f32]) {
        let g0 = r.start / self.dim * groups(self.dim);
        let groups = out
            .chunks_mut(LATENT_INT8_GROUP)
            .zip(q[r].chunks(LATENT_INT8_GROUP));
        for ((out, q), &s) in groups.zip(&scale[g0..]) {
            for (o, &q) in out.iter_mut().zip(q) {
                *o = q.to_f32() * s;
            }
        }
    }

    /// The row of `layer` at `pos` as f32: the cache's own slice (f32), or widened into `buf`
    /// (`dim` values; f16 and bf16; int8 dequantized).
    pub fn row<'a>(
        &'a self,
        layer: usize,
        block_table: &[u32],
        pos: usize,
        buf: &'a mut [f32],
    ) -> &'a [f32] {
        let r = self.range(layer, block_table, pos);
        match &self.rows {
            Rows::F32(d) => &d[r],
            Rows::F16(d) => {
                d[r].convert_to_f32_slice(buf);
                buf
            }
            Rows::BF16(d) => {
                d[r].convert_to_f32_slice(buf);
                buf
            }
            Rows::I8 { q, scale } => {
                self.dequantize(q, scale, r, buf);
                buf
            }
        }
    }

    /// Copies the rows of `layer` at `j0, j0 + 1, ...` as f32 into consecutive `dim`-value
    /// rows of `dst` (as many as it holds; 16-bit rows widened exactly).
    pub fn gather(&self, layer: usize, block_table: &[u32], j0: usize, dst: &mut [f32]) {
        for (i, out) in dst.chunks_exact_mut(self.dim).enumerate() {
            let r = self.range(layer, block_table, j0 + i);
            match &self.rows {
                Rows::F32(d) => out.copy_from_slice(&d[r]),
                Rows::F16(d) => d[r].convert_to_f32_slice(out),
                Rows::BF16(d) => d[r].convert_to_f32_slice(out),
                Rows::I8 { q, scale } => self.dequantize(q, scale, r, out),
            }
        }
    }
}

/// int8 scales of a row of `dim` values.
fn groups(dim: usize) -> usize {
    dim.div_ceil(LATENT_INT8_GROUP)
}

/// Bytes of one latent row of `dim` values in a cache of `dtype` (an int8 row: a scale per
/// [`LATENT_INT8_GROUP`]).
pub fn row_bytes(dtype: KvDtype, dim: usize) -> usize {
    match dtype {
        KvDtype::I8 => dim + 4 * groups(dim),
        d => dim * d.bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rows_round_once_and_widen_exactly() {
        sixteen_bit_rows(KvDtype::F16, |v| f16::from_f32(v).to_f32());
    }

    #[test]
    fn bf16_rows_round_once_and_widen_exactly() {
        sixteen_bit_rows(KvDtype::BF16, |v| bf16::from_f32(v).to_f32());
    }

    #[test]
    fn int8_rows_keep_a_scale_per_group() {
        // 150 values: groups of 64, 64 and 22, of very different magnitudes.
        let (dim, table) = (150, [1u32, 0]);
        let mut c = LatentKvCache::with_dtype(2, dim, 2, 3, KvDtype::I8);
        assert_eq!(c.dtype(), KvDtype::I8);
        assert_eq!(c.bytes_per_token(), 2 * (150 + 3 * 4));
        let row_at = |pos: usize| -> Vec<f32> {
            let mag = |i: usize| [1.0, 1e-3, 50.0][i / 64];
            (0..dim)
                .map(|i| mag(i) * ((i * 7 + pos * 3) % 23) as f32 / 11.0 - mag(i))
                .collect()
        };
        for pos in 0..6 {
            c.write(0, &table, pos, &row_at(pos));
        }
        let mut all = vec![0f32; 6 * dim];
        c.gather(0, &table, 0, &mut all);
        let mut one = vec![0f32; dim];
        for (pos, got) in all.chunks_exact(dim).enumerate() {
            let want = row_at(pos);
            let mut q = vec![0i8; dim];
            for ((w, q), g) in want.chunks(64).zip(q.chunks_mut(64)).zip(got.chunks(64)) {
                let s = quantize_int8_row(w, q);
                let deq: Vec<f32> = q.iter().map(|&q| q as f32 * s).collect();
                assert_eq!(g, &deq[..], "row {pos}");
                // Each group is within half a step of its own scale.
                for (x, y) in w.iter().zip(g) {
                    assert!((x - y).abs() <= 0.5 * s * 1.0001, "row {pos}: {x} vs {y}");
                }
            }
            assert_eq!(c.row(0, &table, pos, &mut one), got);
        }
    }

    /// A cache of `dtype` holds each written row as `round` rounds it, read back whole or
    /// gathered, beside an f32 cache that holds it exactly.
    fn sixteen_bit_rows(dtype: KvDtype, round: fn(f32) -> f32) {
        let (dim, table) = (6, [2u32, 0, 1]);
        let mut f32c = LatentKvCache::new(2, dim, 3, 4);
        let mut c16 = LatentKvCache::with_dtype(2, dim, 3, 4, dtype);
        assert_eq!(c16.dtype(), dtype);
        assert_eq!(2 * c16.bytes_per_token(), f32c.bytes_per_token());
        for pos in 0..12 {
            let row: Vec<f32> = (0..dim)
                .map(|i| (pos * dim + i) as f32 / 7.0 - 3.0)
                .collect();
            f32c.write(1, &table, pos, &row);
            c16.write(1, &table, pos, &row);
        }
        let mut one = vec![0f32; dim];
        for (j0, n) in [(0, 12), (3, 5), (11, 1)] {
            let (mut a, mut b) = (vec![0f32; n * dim], vec![0f32; n * dim]);
            f32c.gather(1, &table, j0, &mut a);
            c16.gather(1, &table, j0, &mut b);
            for (i, (x, y)) in a.chunks_exact(dim).zip(b.chunks_exact(dim)).enumerate() {
                let pos = j0 + i;
                let want: Vec<f32> = (0..dim)
                    .map(|k| (pos * dim + k) as f32 / 7.0 - 3.0)
                    .collect();
                let rounded: Vec<f32> = want.iter().map(|&v| round(v)).collect();
                assert!(rounded != want, "row {pos}: rounding changed nothing");
                assert_eq!(x, &want[..], "row {pos}");
                assert_eq!(y, &rounded[..], "row {pos}");
                assert_eq!(c16.row(1, &table, pos, &mut one), &rounded[..]);
                assert_eq!(f32c.row(1, &table, pos, &mut []), x);
            }
        }
    }
}
