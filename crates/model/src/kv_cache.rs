//! [`KvCache`]: paged K/V storage for every layer, one preallocated arena, every page of it
//! mapped at start-up ([`crate::resident`]).
//!
//! Per layer, K and V each hold `num_blocks` blocks in the layout of
//! [`tokenmill_kernels::attention::PagedKv`] (K transposed per KV head inside a block, so the
//! attention kernels read tiles of keys in place). Which blocks a sequence owns is the
//! caller's business (its block table); this type only stores values. The engine's block
//! pool hands out block ids; `tokenmill generate` uses blocks `0..n`.
//!
//! Elements are f32 (exact; [`KvCache::new`]'s), f16 (the commands' and the engine's default),
//! bf16 ([`KvDtype`]; 16-bit: half the bytes per token, K and V rounded to nearest even as
//! they are written) or int8 (a quarter, plus f32 scales in arenas of their own: four per KV
//! head's row of K, one per row of V — [`PagedKv`]'s layout, `n_layers` times). The arena is
//! one enum and each layer's views come out as a [`LayerKv`] / [`LayerKvMut`] of the matching
//! type, which the forward pass hands to the (generic) kernels.

use half::bf16;
use tokenmill_kernels::attention::{
    K_SCALE_GROUPS, KvDtype, KvElem, KvLayout, PagedKv, PagedKvMut, f16,
};

use crate::{ModelConfig, resident};

/// K and V arenas, `[n_layers, num_blocks, ...]` each (see [`KvCache`]).
enum Arena {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    BF16 {
        k: Vec<bf16>,
        v: Vec<bf16>,
    },
    I8 {
        k: Vec<i8>,
        v: Vec<i8>,
        k_scale: Vec<f32>,
        v_scale: Vec<f32>,
    },
}

pub struct KvCache {
    num_blocks: usize,
    n_layers: usize,
    layout: KvLayout,
    /// K: `[n_layers, num_blocks, n_kv_heads, head_dim, block_size]`,
    /// V: `[n_layers, num_blocks, n_kv_heads, block_size, head_dim]`.
    arena: Arena,
}

/// Read view of one layer, of the cache's element type.
#[derive(Clone, Copy, Debug)]
pub enum LayerKv<'a> {
    F32(PagedKv<'a, f32>),
    F16(PagedKv<'a, f16>),
    BF16(PagedKv<'a, bf16>),
    I8(PagedKv<'a, i8>),
}

/// Write view of one layer, of the cache's element type.
#[derive(Debug)]
pub enum LayerKvMut<'a> {
    F32(PagedKvMut<'a, f32>),
    F16(PagedKvMut<'a, f16>),
    BF16(PagedKvMut<'a, bf16>),
    I8(PagedKvMut<'a, i8>),
}

impl KvCache {
    /// An f32 cache.
    pub fn new(cfg: &ModelConfig, num_blocks: usize, block_size: usize) -> KvCache {
        KvCache::with_dtype(cfg, num_blocks, block_size, KvDtype::F32)
    }

    /// A cache of `dtype` elements.
    pub fn with_dtype(
        cfg: &ModelConfig,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> KvCache {
        let layout = KvLayout {
            block_size,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
        };
        let len = cfg.n_layers * num_blocks * layout.block_len();
        let arena = match dtype {
            KvDtype::F32 => Arena::F32 {
                k: resident::filled(len, 0.0),
                v: resident::filled(len, 0.0),
            },
            KvDtype::F16 => Arena::F16 {
                k: resident::filled(len, f16::ZERO),
                v: resident::filled(len, f16::ZERO),
            },
            KvDtype::BF16 => Arena::BF16 {
                k: resident::filled(len, bf16::ZERO),
                v: resident::filled(len, bf16::ZERO),
            },
            KvDtype::I8 => {
                let scales = cfg.n_layers * num_blocks * layout.block_scales();
                Arena::I8 {
                    k: resident::filled(len, 0),
                    v: resident::filled(len, 0),
                    k_scale: resident::filled(K_SCALE_GROUPS * scales, 0.0),
                    v_scale: resident::filled(scales, 0.0),
                }
            }
        };
        KvCache {
            num_blocks,
            n_layers: cfg.n_layers,
            layout,
            arena,
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

    /// The element type.
    pub fn dtype(&self) -> KvDtype {
        match self.arena {
            Arena::F32 { .. } => KvDtype::F32,
            Arena::F16 { .. } => KvDtype::F16,
            Arena::BF16 { .. } => KvDtype::BF16,
            Arena::I8 { .. } => KvDtype::I8,
        }
    }

    /// Bytes of K and V held per token across all layers (an int8 cache's scales included).
    pub fn bytes_per_token(&self) -> usize {
        let lay = &self.layout;
        self.n_layers * lay.n_kv_heads * self.dtype().head_bytes(lay.head_dim)
    }

    fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.num_blocks * self.layout.block_len();
        layer * per_layer..(layer + 1) * per_layer
    }

    /// The V scales of `layer` (an int8 cache's; K has [`K_SCALE_GROUPS`] times as many).
    fn scale_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.num_blocks * self.layout.block_scales();
        layer * per_layer..(layer + 1) * per_layer
    }

    fn k_scale_range(&self, layer: usize) -> std::ops::Range<usize> {
        let r = self.scale_range(layer);
        K_SCALE_GROUPS * r.start..K_SCALE_GROUPS * r.end
    }

    /// Read view of one layer for attention.
    pub fn layer(&self, layer: usize) -> LayerKv<'_> {
        let r = self.layer_range(layer);
        let layout = self.layout;
        match &self.arena {
            Arena::F32 { k, v } => LayerKv::F32(PagedKv::new(&k[r.clone()], &v[r], layout)),
            Arena::F16 { k, v } => LayerKv::F16(PagedKv::new(&k[r.clone()], &v[r], layout)),
            Arena::BF16 { k, v } => LayerKv::BF16(PagedKv::new(&k[r.clone()], &v[r], layout)),
            Arena::I8 {
                k,
                v,
                k_scale,
                v_scale,
            } => {
                let (ksr, sr) = (self.k_scale_range(layer), self.scale_range(layer));
                LayerKv::I8(PagedKv {
                    k: &k[r.clone()],
                    v: &v[r],
                    k_scale: &k_scale[ksr],
                    v_scale: &v_scale[sr],
                    layout,
                })
            }
        }
    }

    /// Write view of one layer (RoPE fused into the K write: [`PagedKvMut::write`]).
    pub fn layer_mut(&mut self, layer: usize) -> LayerKvMut<'_> {
        let (r, sr) = (self.layer_range(layer), self.scale_range(layer));
        let ksr = self.k_scale_range(layer);
        let layout = self.layout;
        match &mut self.arena {
            Arena::F32 { k, v } => {
                LayerKvMut::F32(PagedKvMut::new(&mut k[r.clone()], &mut v[r], layout))
            }
            Arena::F16 { k, v } => {
                LayerKvMut::F16(PagedKvMut::new(&mut k[r.clone()], &mut v[r], layout))
            }
            Arena::BF16 { k, v } => {
                LayerKvMut::BF16(PagedKvMut::new(&mut k[r.clone()], &mut v[r], layout))
            }
            Arena::I8 {
                k,
                v,
                k_scale,
                v_scale,
            } => LayerKvMut::I8(PagedKvMut {
                k: &mut k[r.clone()],
                v: &mut v[r],
                k_scale: &mut k_scale[ksr],
                v_scale: &mut v_scale[sr],
                layout,
            }),
        }
    }

    /// Stores one token's K and V (`kv_dim` each, already rotated) of `layer` at `pos` of the
    /// sequence whose blocks are `block_table`.
    pub fn write(&mut self, layer: usize, block_table: &[u32], pos: usize, k: &[f32], v: &[f32]) {
        fn put<T: KvElem>(mut w: PagedKvMut<'_, T>, t: &[u32], p: usize, k: &[f32], v: &[f32]) {
            w.write(t, p, k, v, None);
        }
        match self.layer_mut(layer) {
            LayerKvMut::F32(w) => put(w, block_table, pos, k, v),
            LayerKvMut::F16(w) => put(w, block_table, pos, k, v),
            LayerKvMut::BF16(w) => put(w, block_table, pos, k, v),
            LayerKvMut::I8(w) => put(w, block_table, pos, k, v),
        }
    }
}
