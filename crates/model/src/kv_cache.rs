//! [`KvCache`]: paged K/V storage for every layer, one preallocated arena.
//!
//! Per layer, K and V each hold `num_blocks` blocks in the layout of
//! [`tokenmill_kernels::attention::PagedKv`] (K transposed per KV head inside a block, so the
//! attention kernels read tiles of keys in place). Which blocks a sequence owns is the
//! caller's business (its block table); this type only stores values. The engine's block
//! pool hands out block ids; `tokenmill generate` uses blocks `0..n`.

use tokenmill_kernels::attention::{KvLayout, PagedKv, PagedKvMut};

use crate::ModelConfig;

pub struct KvCache {
    num_blocks: usize,
    n_layers: usize,
    layout: KvLayout,
    /// `[n_layers, num_blocks, n_kv_heads, head_dim, block_size]`
    k: Vec<f32>,
    /// `[n_layers, num_blocks, n_kv_heads, block_size, head_dim]`
    v: Vec<f32>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, num_blocks: usize, block_size: usize) -> KvCache {
        let layout = KvLayout {
            block_size,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
        };
        let len = cfg.n_layers * num_blocks * layout.block_len();
        KvCache {
            num_blocks,
            n_layers: cfg.n_layers,
            layout,
            k: vec![0.0; len],
            v: vec![0.0; len],
        }
    }

    /// Blocks needed for `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.layout.block_size)
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    /// Bytes of K and V held per token across all layers.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.layout.kv_dim() * std::mem::size_of::<f32>()
    }

    fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.num_blocks * self.layout.block_len();
        layer * per_layer..(layer + 1) * per_layer
    }

    /// Read view of one layer for attention.
    pub fn layer(&self, layer: usize) -> PagedKv<'_> {
        let r = self.layer_range(layer);
        PagedKv {
            k: &self.k[r.clone()],
            v: &self.v[r],
            layout: self.layout,
        }
    }

    /// Write view of one layer (RoPE fused into the K write: [`PagedKvMut::write`]).
    pub fn layer_mut(&mut self, layer: usize) -> PagedKvMut<'_> {
        let r = self.layer_range(layer);
        PagedKvMut {
            k: &mut self.k[r.clone()],
            v: &mut self.v[r],
            layout: self.layout,
        }
    }

    /// Stores one token's K and V (`kv_dim` each, already rotated) of `layer` at `pos` of the
    /// sequence whose blocks are `block_table`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        self.layer_mut(layer).write(block_table, pos, k, v, None);
    }
}
