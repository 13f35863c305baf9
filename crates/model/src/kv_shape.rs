//! [`KvShape`]: what one token caches, per layer — the one description of a model's KV
//! footprint that the engine sizes its block pool from and the reports print.
//!
//! - `Standard`: a K and a V vector per KV head per layer
//!   (`2 · n_layers · n_kv_heads · head_dim` elements per token).
//! - `Latent`: DeepSeek multi-head latent attention caches one compressed row per token per
//!   layer (`kv_lora_rank + rope_dim` elements; K and V are re-expanded from it, so there is
//!   no separate V).
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
    /// One latent row of `kv_lora_rank + rope_dim`.
    Latent {
        n_layers: usize,
        kv_lora_rank: usize,
        rope_dim: usize,
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
            } => n_layers * (kv_lora_rank + rope_dim),
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
        };
        assert_eq!(mla.elems_per_token(), 27 * 576);
        assert_eq!(mla.bytes_per_token(2), 27 * 576 * 2);
    }
}
