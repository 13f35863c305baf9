//! [`KvCache`]: paged K/V storage for every layer, one preallocated arena.
//!
//! Layout per layer: `[num_blocks, block_size, kv_dim]` for K and the same for V. Which blocks
//! a sequence owns is the caller's business (its block table); this type only stores values.
//! The engine's block pool hands out block ids; `tokenmill generate` uses blocks `0..n`.

use tokenmill_kernels::attention::PagedKv;

use crate::ModelConfig;

pub struct KvCache {
    num_blocks: usize,
    block_size: usize,
    kv_dim: usize,
    /// `[n_layers, num_blocks, block_size, kv_dim]`
    k: Vec<f32>,
    /// `[n_layers, num_blocks, block_size, kv_dim]`
    v: Vec<f32>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, num_blocks: usize, block_size: usize) -> KvCache {
        let len = cfg.n_layers * num_blocks * block_size * cfg.kv_dim();
        KvCache {
            num_blocks,
            block_size,
            kv_dim: cfg.kv_dim(),
            k: vec![0.0; len],
            v: vec![0.0; len],
        }
    }

    /// Blocks needed for `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of K and V held per token across all layers.
    pub fn bytes_per_token(&self) -> usize {
        let n_layers = self.k.len() / (self.num_blocks * self.block_size * self.kv_dim).max(1);
        2 * n_layers * self.kv_dim * std::mem::size_of::<f32>()
    }

    fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.num_blocks * self.block_size * self.kv_dim;
        layer * per_layer..(layer + 1) * per_layer
    }

    /// Read view of one layer for attention.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        let r = self.layer_range(layer);
        PagedKv {
            k: &self.k[r.clone()],
            v: &self.v[r],
            block_size: self.block_size,
            kv_dim: self.kv_dim,
        }
    }

    /// Stores one token's K and V (`kv_dim` each) of `layer` at `pos` of the sequence whose
    /// blocks are `block_table`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        let base = self.layer_range(layer).start;
        let slot =
            block_table[pos / self.block_size] as usize * self.block_size + pos % self.block_size;
        let at = base + slot * self.kv_dim;
        self.k[at..at + self.kv_dim].copy_from_slice(k);
        self.v[at..at + self.kv_dim].copy_from_slice(v);
    }
}
