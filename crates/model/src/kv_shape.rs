//! [`KvShape`]: what one token caches, per layer — the one description of a model's KV
//! footprint that the engine sizes its block pool from and the reports print.
//!
//! - `Standard`: a K and a V vector per KV head per layer
//!   (`2 · n_layers · n_kv_heads · head_dim` elements per token).
//! - `Latent`: DeepSeek multi-head latent attention caches one compressed row per token per
//!   layer (`kv_lora_rank + rope_dim` elements; K and V are re-expanded from it, so there is
//!   no separate V). It also knows what an implementation that expands K and V would cache
//!   (`expanded_dim`), for reports of the saving.
//!
//! Bytes per element come from the cache's element type (`KvDtype`), so a size is always
//! `elements · elem_bytes`.

/// What each token caches, per layer (for sizing and reporting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvShape {
    /// Separate K and V of `n_kv_heads · head_dim` each.
    Standard {
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
    },
    /// One latent row of `kv_lora_rank + rope_dim`; expanded, K and V would be `expanded_dim`
    /// values per layer (`n_heads · (nope + rope + v)`).
    Latent {
        n_layers: usize,
        kv_lora_rank: usize,
        rope_dim: usize,
        expanded_dim: usize,
    },
}

impl KvShape {
    /// Elements cached per token, all layers together.
    pub fn elems_per_token(&self) -> usize {
        match *self {
            KvShape::Standard {
                n_layers,
                n_kv_heads,
                head_dim,
            } => 2 * n_layers * n_kv_heads * head_dim,
            KvShape::Latent {
                n_layers,
                kv_lora_rank,
                rope_dim,
                ..
            } => n_layers * (kv_lora_rank + rope_dim),
        }
    }

    /// Elements per token of a cache of the expanded K and V, all layers (for `Standard`, the
    /// same as [`Self::elems_per_token`]).
    pub fn expanded_elems_per_token(&self) -> usize {
        match *self {
            KvShape::Standard { .. } => self.elems_per_token(),
            KvShape::Latent {
                n_layers,
                expanded_dim,
                ..
            } => n_layers * expanded_dim,
        }
    }

    /// Bytes cached per token with elements of `elem_bytes` (4 for f32, 2 for f16).
    pub fn bytes_per_token(&self, elem_bytes: usize) -> usize {
        self.elems_per_token() * elem_bytes
    }

    /// Bytes of one block of `block_size` tokens.
    pub fn bytes_per_block(&self, block_size: usize, elem_bytes: usize) -> usize {
        block_size * self.bytes_per_token(elem_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_and_latent_sizes() {
        // SmolLM2: 2 (K,V) · 30 layers · 3 heads · 64 dims = 11520 elements = 46080 f32 bytes.
        let smollm2 = KvShape::Standard {
            n_layers: 30,
            n_kv_heads: 3,
            head_dim: 64,
        };
        assert_eq!(smollm2.bytes_per_token(4), 46_080);
        assert_eq!(smollm2.bytes_per_block(16, 4), 737_280);
        assert_eq!(smollm2.bytes_per_token(2), 23_040);
        // DeepSeek-V2-Lite: 27 layers · (512 + 64), no separate V.
        let mla = KvShape::Latent {
            n_layers: 27,
            kv_lora_rank: 512,
            rope_dim: 64,
            expanded_dim: 16 * (128 + 64 + 128),
        };
        assert_eq!(mla.elems_per_token(), 27 * 576);
        assert_eq!(mla.bytes_per_token(2), 27 * 576 * 2);
        // Expanded: 5120 values per layer, 8.9 times the latent row.
        assert_eq!(mla.expanded_elems_per_token(), 27 * 5120);
        assert_eq!(
            smollm2.expanded_elems_per_token(),
            smollm2.elems_per_token()
        );
    }
}
