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
//! Bytes come from the cache's element type (`KvDtype`): `elements · elem_bytes`, plus for
//! int8 the scales (five per KV head's K and V rows; one per
//! [`LATENT_INT8_GROUP`](crate::deepseek::LATENT_INT8_GROUP) values of a latent row).

use tokenmill_kernels::attention::KvDtype;

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

    /// Bytes cached per token in a cache of `dtype` (int8: with its scales).
    pub fn bytes_per_token(&self, dtype: KvDtype) -> usize {
        match *self {
            KvShape::Standard {
                n_layers,
                n_kv_heads,
                head_dim,
            } => n_layers * n_kv_heads * dtype.head_bytes(head_dim),
            KvShape::Latent {
                n_layers,
                kv_lora_rank,
                rope_dim,
                ..
            } => n_layers * crate::deepseek::latent_row_bytes(dtype, kv_lora_rank + rope_dim),
        }
    }

    /// Bytes of one block of `block_size` tokens.
    pub fn bytes_per_block(&self, block_size: usize, dtype: KvDtype) -> usize {
        block_size * self.bytes_per_token(dtype)
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
        assert_eq!(smollm2.bytes_per_token(KvDtype::F32), 46_080);
        assert_eq!(smollm2.bytes_per_block(16, KvDtype::F32), 737_280);
        assert_eq!(smollm2.bytes_per_token(KvDtype::F16), 23_040);
        // DeepSeek-V2-Lite: 27 layers · (512 + 64), no separate V.
        let mla = KvShape::Latent {
            n_layers: 27,
            kv_lora_rank: 512,
            rope_dim: 64,
            expanded_dim: 16 * (128 + 64 + 128),
        };
        assert_eq!(mla.elems_per_token(), 27 * 576);
        assert_eq!(mla.bytes_per_token(KvDtype::BF16), 27 * 576 * 2);
        // int8: a byte an element, plus scales (SmolLM2: 4 for each head's K, 1 for its V)
        // or one per 64 latent values (9 groups).
        assert_eq!(smollm2.bytes_per_token(KvDtype::I8), 30 * 3 * (128 + 5 * 4));
        assert_eq!(mla.bytes_per_token(KvDtype::I8), 27 * (576 + 9 * 4));
        // Expanded: 5120 values per layer, 8.9 times the latent row.
        assert_eq!(mla.expanded_elems_per_token(), 27 * 5120);
        assert_eq!(
            smollm2.expanded_elems_per_token(),
            smollm2.elems_per_token()
        );
    }
}
