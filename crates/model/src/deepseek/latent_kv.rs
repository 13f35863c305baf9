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

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use tokenmill_kernels::attention::KvDtype;

use crate::resident;

/// The rows of every layer, `[n_layers, num_blocks, block_size, dim]`, of the cache's type.
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

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
        }
    }

    /// Blocks needed for `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Bytes held per token across all layers: `n_layers · (kv_lora_rank + rope dim)` elements
    /// of the cache's type (4 bytes for f32, 2 for f16 and bf16).
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * self.dim * self.dtype().bytes()
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
        }
    }

    /// The row of `layer` at `pos` as f32: the cache's own slice (f32), or widened into `buf`
    /// (`dim` values; f16 and bf16).
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
            }
        }
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
