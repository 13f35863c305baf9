//! [`LatentKvCache`]: paged storage of MLA's compressed KV — per token per layer only the
//! normalised latent `c` (`kv_lora_rank`) and the rotated shared rope key `k_pe`
//! (`qk_rope_head_dim`), never the expanded per-head K and V.
//!
//! Layout `[n_layers, num_blocks, block_size, latent_dim]`, row-major: position `p` of a
//! sequence is row `block_table[p / block_size] · block_size + p % block_size` of its layer.
//! Block ownership is the caller's, as for [`KvCache`](crate::KvCache).

pub struct LatentKvCache {
    num_blocks: usize,
    block_size: usize,
    n_layers: usize,
    /// `kv_lora_rank + qk_rope_head_dim`
    dim: usize,
    /// `[n_layers, num_blocks, block_size, dim]`
    data: Vec<f32>,
}

impl LatentKvCache {
    pub fn new(n_layers: usize, dim: usize, num_blocks: usize, block_size: usize) -> Self {
        LatentKvCache {
            num_blocks,
            block_size,
            n_layers,
            dim,
            data: vec![0.0; n_layers * num_blocks * block_size * dim],
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks needed for `n_tokens` positions.
    pub fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Bytes held per token across all layers: `n_layers · (kv_lora_rank + rope dim) · 4`.
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * self.dim * std::mem::size_of::<f32>()
    }

    fn row_index(&self, layer: usize, block_table: &[u32], pos: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        (layer * self.num_blocks + block) * self.block_size + pos % self.block_size
    }

    /// The cached row of `layer` at `pos` of the sequence with `block_table`.
    pub fn row(&self, layer: usize, block_table: &[u32], pos: usize) -> &[f32] {
        let r = self.row_index(layer, block_table, pos) * self.dim;
        &self.data[r..r + self.dim]
    }

    pub fn row_mut(&mut self, layer: usize, block_table: &[u32], pos: usize) -> &mut [f32] {
        let r = self.row_index(layer, block_table, pos) * self.dim;
        &mut self.data[r..r + self.dim]
    }
}
