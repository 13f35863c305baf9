//! The paged K/V layout of one layer, and the fused RoPE + cache write.
//!
//! The cache is a pool of blocks of `block_size` token slots; a sequence's `block_table`
//! lists its blocks in order, so position `p` lives in block `block_table[p / block_size]`,
//! slot `p % block_size`. Within a block, each KV head owns one contiguous run:
//!
//! ```text
//! K: [num_blocks, n_kv_heads, head_dim, block_size]   keys transposed: lane = slot
//! V: [num_blocks, n_kv_heads, block_size, head_dim]   one value row per slot
//! ```
//!
//! so a tile of [`KEY_TILE`] consecutive keys of one head is, when `block_size` is a multiple
//! of `KEY_TILE` (the engine's 16, say), `head_dim` rows of 16 contiguous floats of K and 16
//! contiguous value rows of V: the attention kernels read it in place, with no gather and no
//! transposition. Other block sizes (the tiny tests use 4) are gathered into a scratch tile.
//!
//! The store's element type is f32, f16, bf16 or i8 ([`KvElem`]; the engine defaults to f16):
//! values are rounded to it as they are written and widened back as the kernels load them. An
//! int8 store also holds f32 scales ([`crate::kv_elem`]) in two arrays beside it (empty
//! slices for the float types):
//!
//! ```text
//! K scales: [num_blocks, n_kv_heads, 4, block_size]   one per quarter of head_dim
//! V scales: [num_blocks, n_kv_heads, block_size]      one per row
//! ```
//!
//! so a tile's 16 scales of a quarter (or of V) are contiguous, like a row of K.
//!
//! Invariants: a tile never reads past its block (`slot0 + KEY_TILE <= block_size` in the
//! direct case); lanes of a tile past the sequence's last position may hold anything — the
//! kernels never let them reach a result.

use std::ops::Range;

use crate::kv_elem::{K_SCALE_GROUPS, KvElem, absmax_bits, cast_buf, int8_scale};
use crate::ops::{RopeStyle, rotate};
use crate::simd::attn::KEY_TILE;

/// The geometry of a paged K/V store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Element ranges of one in-place tile ([`KvLayout::tile_spans`]).
struct TileSpans {
    k: Range<usize>,
    v: Range<usize>,
    k_scale: Range<usize>,
    v_scale: Range<usize>,
}

impl KvLayout {
    /// Values per token in K (and in V): `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Elements of one block of K (and of V).
    pub fn block_len(&self) -> usize {
        self.block_size * self.kv_dim()
    }

    /// Index in K of element `d` of head `head` at `slot` of `block`.
    #[inline]
    fn k_at(&self, block: usize, head: usize, d: usize, slot: usize) -> usize {
        ((block * self.n_kv_heads + head) * self.head_dim + d) * self.block_size + slot
    }

    /// Index in V of the value row of head `head` at `slot` of `block`.
    #[inline]
    fn v_at(&self, block: usize, head: usize, slot: usize) -> usize {
        ((block * self.n_kv_heads + head) * self.block_size + slot) * self.head_dim
    }

    /// V scales of one block of an int8 store: `n_kv_heads * block_size` (K has
    /// [`K_SCALE_GROUPS`] times as many).
    pub fn block_scales(&self) -> usize {
        self.n_kv_heads * self.block_size
    }

    /// Index in the K scales of quarter `g` of head `head` at `slot` of `block`.
    #[inline]
    fn k_scale_at(&self, block: usize, head: usize, g: usize, slot: usize) -> usize {
        ((block * self.n_kv_heads + head) * K_SCALE_GROUPS + g) * self.block_size + slot
    }

    /// Index in the V scales of head `head` at `slot` of `block`.
    #[inline]
    fn v_scale_at(&self, block: usize, head: usize, slot: usize) -> usize {
        (block * self.n_kv_heads + head) * self.block_size + slot
    }

    /// Where the in-place tile of head `head` starting at `slot` of `block` lies (a block size
    /// that is a multiple of [`KEY_TILE`]): its transposed K rows, its value rows, and its
    /// scales (four rows of K scales, as K's; a row of V scales), each one contiguous span.
    #[inline]
    fn tile_spans(&self, block: usize, head: usize, slot: usize) -> TileSpans {
        let (k0, v0) = (
            self.k_at(block, head, 0, slot),
            self.v_at(block, head, slot),
        );
        let (ks0, vs0) = (
            self.k_scale_at(block, head, 0, slot),
            self.v_scale_at(block, head, slot),
        );
        TileSpans {
            k: k0..k0 + (self.head_dim - 1) * self.block_size + KEY_TILE,
            v: v0..v0 + KEY_TILE * self.head_dim,
            k_scale: ks0..ks0 + (K_SCALE_GROUPS - 1) * self.block_size + KEY_TILE,
            v_scale: vs0..vs0 + KEY_TILE,
        }
    }

    /// (block, slot) of position `pos` under `block_table`.
    #[inline]
    fn locate(&self, block_table: &[u32], pos: usize) -> (usize, usize) {
        (
            block_table[pos / self.block_size] as usize,
            pos % self.block_size,
        )
    }
}

/// Read view of one layer's paged K/V of element type `T` (see the module docs for the
/// layout).
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a, T = f32> {
    pub k: &'a [T],
    pub v: &'a [T],
    /// The scales of an int8 store (K: `[num_blocks, n_kv_heads, 4, block_size]`, V:
    /// `[num_blocks, n_kv_heads, block_size]`); empty for the float types.
    pub k_scale: &'a [f32],
    pub v_scale: &'a [f32],
    pub layout: KvLayout,
}

/// Write view of one layer's paged K/V of element type `T`.
#[derive(Debug)]
pub struct PagedKvMut<'a, T = f32> {
    pub k: &'a mut [T],
    pub v: &'a mut [T],
    /// As [`PagedKv::k_scale`].
    pub k_scale: &'a mut [f32],
    pub v_scale: &'a mut [f32],
    pub layout: KvLayout,
}

impl<'a, T: KvElem> PagedKv<'a, T> {
    /// A view of a float store (no scales).
    pub fn new(k: &'a [T], v: &'a [T], layout: KvLayout) -> Self {
        assert!(!T::SCALED, "an int8 store needs its scales");
        PagedKv {
            k,
            v,
            k_scale: &[],
            v_scale: &[],
            layout,
        }
    }
}

impl<'a, T: KvElem> PagedKvMut<'a, T> {
    /// A write view of a float store (no scales).
    pub fn new(k: &'a mut [T], v: &'a mut [T], layout: KvLayout) -> Self {
        assert!(!T::SCALED, "an int8 store needs its scales");
        PagedKvMut {
            k,
            v,
            k_scale: &mut [],
            v_scale: &mut [],
            layout,
        }
    }
}

/// RoPE of one token for [`PagedKvMut::write`]: `cos_sin` as [`crate::ops::rope_cos_sin`]
/// makes it (`[cos_0, sin_0, cos_1, sin_1, ...]`, one pair per rotated pair of dims).
#[derive(Clone, Copy, Debug)]
pub struct RopeAt<'a> {
    pub cos_sin: &'a [f32],
    pub style: RopeStyle,
}

impl<T: KvElem> PagedKv<'_, T> {
    /// Blocks in the store.
    pub fn num_blocks(&self) -> usize {
        self.k.len() / self.layout.block_len().max(1)
    }

    /// K of head `head` at position `pos` as f32 (an int8 row times its scale), into `out`
    /// (`head_dim`); for tests and references.
    pub fn read_k(&self, block_table: &[u32], pos: usize, head: usize, out: &mut [f32]) {
        let lay = &self.layout;
        let (block, slot) = lay.locate(block_table, pos);
        let quarter = lay.head_dim / K_SCALE_GROUPS;
        for (d, o) in out.iter_mut().enumerate() {
            let q = self.k[lay.k_at(block, head, d, slot)].to_f32();
            *o = if T::SCALED {
                q * self.k_scale[lay.k_scale_at(block, head, d / quarter, slot)]
            } else {
                q
            };
        }
    }

    /// V of head `head` at position `pos` as f32 (an int8 row times its scale), into `out`
    /// (`head_dim`); for tests and references.
    pub fn read_v(&self, block_table: &[u32], pos: usize, head: usize, out: &mut [f32]) {
        let (block, slot) = self.layout.locate(block_table, pos);
        let scale = if T::SCALED {
            self.v_scale[self.layout.v_scale_at(block, head, slot)]
        } else {
            1.0
        };
        let at = self.layout.v_at(block, head, slot);
        for (o, e) in out.iter_mut().zip(&self.v[at..at + self.layout.head_dim]) {
            *o = e.to_f32() * scale;
        }
    }

    /// Where the kernels read keys `tile * KEY_TILE ..` (the first `n_valid` of them) of head
    /// `head`: in place when blocks hold whole tiles, else gathered into `buf` (`2 * KEY_TILE
    /// * head_dim` floats, borrowed by the returned pointers; an int8 tile's scales go in its
    /// last `5 * KEY_TILE`).
    ///
    /// The caller has checked that the block table covers the tile's valid keys and that
    /// every block id is in the store.
    #[inline]
    pub(crate) fn tile(
        &self,
        block_table: &[u32],
        head: usize,
        tile: usize,
        n_valid: usize,
        buf: &mut [f32],
    ) -> TileSrc<T> {
        let lay = &self.layout;
        let (hd, pos0) = (lay.head_dim, tile * KEY_TILE);
        if lay.block_size.is_multiple_of(KEY_TILE) {
            let (block, slot0) = lay.locate(block_table, pos0);
            // The whole transposed tile and its values lie inside the block (the slicing
            // panics otherwise).
            let spans = lay.tile_spans(block, head, slot0);
            let (k_scale, v_scale) = if T::SCALED {
                // Quarter `g`'s 16 key scales at `k_scale + g * kt_stride`, as K's rows.
                (
                    self.k_scale[spans.k_scale].as_ptr(),
                    self.v_scale[spans.v_scale].as_ptr(),
                )
            } else {
                (std::ptr::null(), std::ptr::null())
            };
            return TileSrc {
                kt: self.k[spans.k].as_ptr(),
                kt_stride: lay.block_size,
                v: self.v[spans.v].as_ptr(),
                v_stride: hd,
                k_scale,
                v_scale,
            };
        }
        let n_scales = if T::SCALED {
            (K_SCALE_GROUPS + 1) * KEY_TILE
        } else {
            0
        };
        let (data, scales) = buf.split_at_mut(buf.len() - n_scales);
        let (kt, v) = cast_buf::<T>(data)[..2 * KEY_TILE * hd].split_at_mut(KEY_TILE * hd);
        let (ks, vs) = scales.split_at_mut(n_scales.saturating_sub(KEY_TILE));
        kt.fill(T::default());
        ks.fill(0.0);
        vs.fill(0.0);
        for j in 0..n_valid {
            let (block, slot) = lay.locate(block_table, pos0 + j);
            for d in 0..hd {
                kt[d * KEY_TILE + j] = self.k[lay.k_at(block, head, d, slot)];
            }
            let at = lay.v_at(block, head, slot);
            v[j * hd..(j + 1) * hd].copy_from_slice(&self.v[at..at + hd]);
            if T::SCALED {
                for g in 0..K_SCALE_GROUPS {
                    ks[g * KEY_TILE + j] = self.k_scale[lay.k_scale_at(block, head, g, slot)];
                }
                vs[j] = self.v_scale[lay.v_scale_at(block, head, slot)];
            }
        }
        TileSrc {
            kt: kt.as_ptr(),
            kt_stride: KEY_TILE,
            v: v.as_ptr(),
            v_stride: hd,
            k_scale: ks.as_ptr(),
            v_scale: vs.as_ptr(),
        }
    }
}

impl<T: KvElem> PagedKv<'_, T> {
    /// Asks the CPU to start loading keys and values `tile * KEY_TILE ..` of head `head` into
    /// L2 (a hint: no effect on results, nothing if the tile is not read in place or lies
    /// past the table). Attention streams each sequence's K/V from memory once per step in
    /// 4 KiB runs of scattered blocks, which the hardware prefetchers do not follow across
    /// blocks; requesting the tile after next while the current one is computed overlaps
    /// the two. Into L2, not L1: the L1 prefetcher follows a tile's contiguous lines on its
    /// own, and a request into L1 holds a miss buffer per line.
    #[inline]
    pub(crate) fn prefetch_tile(&self, block_table: &[u32], head: usize, tile: usize) {
        let lay = &self.layout;
        let pos0 = tile * KEY_TILE;
        if !lay.block_size.is_multiple_of(KEY_TILE) || pos0 >= block_table.len() * lay.block_size {
            return;
        }
        let (block, slot0) = lay.locate(block_table, pos0);
        let spans = lay.tile_spans(block, head, slot0);
        let (Some(k), Some(v)) = (self.k.get(spans.k), self.v.get(spans.v)) else {
            return;
        };
        prefetch_lines(k);
        prefetch_lines(v);
        if T::SCALED
            && let (Some(ks), Some(vs)) = (
                self.k_scale.get(spans.k_scale),
                self.v_scale.get(spans.v_scale),
            )
        {
            prefetch_lines(ks);
            prefetch_lines(vs);
        }
    }
}

/// Requests every cache line `span` touches, twice each, one line after the other.
///
/// Twice, by measurement on Zen 5 (`attention/decode_b32_ctx192_30_layers_{f16,int8}` and
/// `decode_b16_ctx1024_10_layers_{f16,int8}`, interleaved runs), against the request per key
/// row this replaced (which asked for an f16 K line twice, an int8 one four times, and each V
/// line once): once per line was 1.3–1.5× slower on f16; twice per line is as fast on f16 and
/// 1.1–1.2× faster on int8; four requests per line of K or of V, or K and V lines alternated
/// once each, were slower again. Presumably a request that finds the miss buffers full is
/// dropped, and its repeat, a few cycles on, finds one free. Not measured on other CPUs.
#[inline(always)]
fn prefetch_lines<T>(span: &[T]) {
    let p = span.as_ptr().cast::<u8>();
    let lead = p as usize & 63;
    let mut o = 0;
    while o < lead + std::mem::size_of_val(span) {
        let line = p.wrapping_sub(lead).wrapping_add(o);
        prefetch(line);
        prefetch(line);
        o += 64;
    }
}

/// A hint to load the cache line holding `p` into L2 (`_mm_prefetch` `T1`; no architectural
/// effect).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and does not change memory; `p` points into a slice.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The read pointers of one tile, as [`crate::simd::attn::AttnTile`] takes them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileSrc<T> {
    pub kt: *const T,
    pub kt_stride: usize,
    pub v: *const T,
    pub v_stride: usize,
    /// The tile's key scales (quarter `g`'s `KEY_TILE` at `k_scale + g * kt_stride`) and
    /// value scales (int8; null for the float types).
    pub k_scale: *const f32,
    pub v_scale: *const f32,
}

impl<T: KvElem> PagedKvMut<'_, T> {
    /// The read view.
    pub fn as_ref(&self) -> PagedKv<'_, T> {
        PagedKv {
            k: self.k,
            v: self.v,
            k_scale: self.k_scale,
            v_scale: self.v_scale,
            layout: self.layout,
        }
    }

    /// Stores one token's K and V (`kv_dim` each, head-major as a matmul produces them) at
    /// position `pos` of the sequence whose blocks are `block_table`, rotating K by `rope` on
    /// the way (RoFormer, <https://arxiv.org/abs/2104.09864>): one pass over K, and the same
    /// arithmetic as [`crate::ops::rope`] ([`rotate`]). Each stored value is rounded to `T`
    /// (f16: to nearest, ties to even) after the rotation; an int8 value row is first scaled
    /// by [`int8_scale`] of its largest magnitude, an int8 key each quarter of it by its own
    /// (after the rotation: the key is rotated once to find them and once to store it), and
    /// the scales stored.
    ///
    /// A value row is converted in one run ([`KvElem::from_f32_slice`]; int8: in
    /// [`WRITE_RUN`]-element pieces after its scale); a key goes through
    /// [`WRITE_RUN`]-element pieces, each rotated and converted in a stack buffer, then
    /// scattered down its transposed column (one element every `block_size`).
    ///
    /// Panics if the table does not cover `pos` or a length does not match.
    pub fn write(
        &mut self,
        block_table: &[u32],
        pos: usize,
        k: &[f32],
        v: &[f32],
        rope: Option<RopeAt<'_>>,
    ) {
        let (block, slot) = self.layout.locate(block_table, pos);
        self.write_at(block, slot, k, v, rope);
    }

    /// [`Self::write`] at slot `slot` of block `block`. Panics if the block is not in the
    /// store, the slot not in the block, or a length does not match.
    pub fn write_at(
        &mut self,
        block: usize,
        slot: usize,
        k: &[f32],
        v: &[f32],
        rope: Option<RopeAt<'_>>,
    ) {
        let lay = self.layout;
        let (hd, bs) = (lay.head_dim, lay.block_size);
        assert!(k.len() == lay.kv_dim() && v.len() == lay.kv_dim());
        assert!(slot < bs, "slot {slot} of a block of {bs}");
        assert!((block + 1) * lay.block_len() <= self.k.len().min(self.v.len()));
        let rot = rope.map_or(0, |r| r.cos_sin.len());
        assert!(rot <= hd && rot.is_multiple_of(2));
        let quarter = hd / K_SCALE_GROUPS;
        for h in 0..lay.n_kv_heads {
            let at = lay.v_at(block, h, slot);
            let (vh, kh) = (&v[h * hd..(h + 1) * hd], &k[h * hd..(h + 1) * hd]);
            let mut k_inv = [1.0; K_SCALE_GROUPS];
            if T::SCALED {
                let v_inv;
                let si = lay.v_scale_at(block, h, slot);
                (self.v_scale[si], v_inv) = int8_scale(f32::from_bits(absmax_bits(vh)));
                for (d0, run) in (0..hd).step_by(WRITE_RUN).zip(vh.chunks(WRITE_RUN)) {
                    store_strided(&mut self.v[at + d0..], 1, run, d0, hd, &[v_inv]);
                }
                // The key's quarters' largest magnitudes, from a first rotation.
                let mut m = [0u32; K_SCALE_GROUPS];
                rotated_runs(kh, rope, |d0, run| {
                    by_group(d0, run.len(), quarter, |g, r| {
                        m[g] = m[g].max(absmax_bits(&run[r]));
                    });
                });
                for (g, &m) in m.iter().enumerate() {
                    let si = lay.k_scale_at(block, h, g, slot);
                    (self.k_scale[si], k_inv[g]) = int8_scale(f32::from_bits(m));
                }
            } else {
                T::from_f32_slice(vh, &mut self.v[at..at + hd]);
            }
            // Element `d` of this head's key lives at `col[d * bs]`.
            let k0 = lay.k_at(block, h, 0, slot);
            let col = &mut self.k[k0..k0 + (hd - 1) * bs + 1];
            rotated_runs(kh, rope, |d0, run| {
                store_strided(&mut col[d0 * bs..], bs, run, d0, quarter, &k_inv)
            });
        }
    }
}

/// Calls `f(d0, run)` over the key `kh` rotated by `rope` ([`rotate`], as
/// [`crate::ops::rope`]): runs of at most [`WRITE_RUN`] consecutive elements from `d0`,
/// rotated in a stack buffer (NeoX: a run of the low half, then its partners in the high
/// half), then the elements past the rotary dims as they are.
#[inline]
fn rotated_runs(kh: &[f32], rope: Option<RopeAt<'_>>, mut f: impl FnMut(usize, &[f32])) {
    let rot = rope.map_or(0, |r| r.cos_sin.len());
    if let Some(r) = rope {
        let (mut lo, mut hi) = ([0f32; WRITE_RUN], [0f32; WRITE_RUN]);
        match r.style {
            RopeStyle::Interleaved => {
                for d0 in (0..rot).step_by(WRITE_RUN) {
                    let n = WRITE_RUN.min(rot - d0);
                    let pairs = kh[d0..d0 + n].chunks_exact(2);
                    let cs = r.cos_sin[d0..d0 + n].chunks_exact(2);
                    for (o, (x, cs)) in lo[..n].chunks_exact_mut(2).zip(pairs.zip(cs)) {
                        (o[0], o[1]) = rotate(x[0], x[1], cs[0], cs[1]);
                    }
                    f(d0, &lo[..n]);
                }
            }
            RopeStyle::NeoX => {
                let half = rot / 2;
                for i0 in (0..half).step_by(WRITE_RUN) {
                    let n = WRITE_RUN.min(half - i0);
                    let cs = r.cos_sin[2 * i0..2 * (i0 + n)].chunks_exact(2);
                    let (x0, x1) = (&kh[i0..i0 + n], &kh[half + i0..half + i0 + n]);
                    for (j, cs) in cs.enumerate() {
                        (lo[j], hi[j]) = rotate(x0[j], x1[j], cs[0], cs[1]);
                    }
                    f(i0, &lo[..n]);
                    f(half + i0, &hi[..n]);
                }
            }
        }
    }
    for d0 in (rot..kh.len()).step_by(WRITE_RUN) {
        f(d0, &kh[d0..kh.len().min(d0 + WRITE_RUN)]);
    }
}

/// Splits elements `d0..d0 + n` of a row into pieces that each lie in one group of `group`
/// elements: `f(g, i..end)` with indices relative to `d0`.
#[inline]
fn by_group(d0: usize, n: usize, group: usize, mut f: impl FnMut(usize, std::ops::Range<usize>)) {
    let mut i = 0;
    while i < n {
        let g = (d0 + i) / group;
        let end = ((g + 1) * group - d0).min(n);
        f(g, i..end);
        i = end;
    }
}

/// Elements of a key converted at once by [`PagedKvMut::write`] (a stack buffer's length).
const WRITE_RUN: usize = 32;

/// `dst[i * stride] = T::from_f32(x[i])` for `x` of at most [`WRITE_RUN`] values, elements
/// `d0..` of a row (an int8 store's `T::from_f32(x[i] * inv[(d0 + i) / group])`).
#[inline]
fn store_strided<T: KvElem>(
    dst: &mut [T],
    stride: usize,
    x: &[f32],
    d0: usize,
    group: usize,
    inv: &[f32],
) {
    let mut c = [T::default(); WRITE_RUN];
    let c = &mut c[..x.len()];
    if T::SCALED {
        let mut scaled = [0f32; WRITE_RUN];
        by_group(d0, x.len(), group, |g, r| {
            for (s, &x) in scaled[r.clone()].iter_mut().zip(&x[r]) {
                *s = x * inv[g];
            }
        });
        T::from_f32_slice(&scaled[..x.len()], c);
    } else {
        T::from_f32_slice(x, c);
    }
    for (d, &e) in dst.iter_mut().step_by(stride).zip(c.iter()) {
        *d = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{rope, rope_cos_sin};

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri perturbs every sin/cos call, so two computations of one rotation differ"
    )]
    fn write_then_read_matches_rope_in_place() {
        let lay = KvLayout {
            block_size: 4,
            n_kv_heads: 2,
            head_dim: 6,
        };
        let (mut k, mut v) = (
            vec![0f32; 3 * lay.block_len()],
            vec![0f32; 3 * lay.block_len()],
        );
        let mut kv = PagedKvMut::new(&mut k, &mut v, lay);
        let table = [2u32, 0, 1];
        let inv_freq = [1.0, 0.1];
        for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
            for pos in [0, 3, 5, 9] {
                let kt: Vec<f32> = (0..12).map(|i| (i * 7 % 5) as f32 - pos as f32).collect();
                let vt: Vec<f32> = (0..12).map(|i| i as f32 + pos as f32).collect();
                let mut cs = [0f32; 4];
                rope_cos_sin(pos, &inv_freq, 1.0, &mut cs);
                let rope_at = RopeAt {
                    cos_sin: &cs,
                    style,
                };
                kv.write(&table, pos, &kt, &vt, Some(rope_at));
                let mut want = kt.clone();
                rope(&mut want, 6, pos, &inv_freq, style);
                let r = kv.as_ref();
                let mut got = [0f32; 6];
                for h in 0..2 {
                    r.read_k(&table, pos, h, &mut got);
                    assert_eq!(got[..], want[h * 6..(h + 1) * 6]);
                    let (block, slot) = lay.locate(&table, pos);
                    let at = lay.v_at(block, h, slot);
                    assert_eq!(r.v[at..at + 6], vt[h * 6..(h + 1) * 6]);
                }
            }
        }
    }

    #[test]
    fn f16_write_is_the_f32_write_rounded_to_nearest_even() {
        use half::f16;
        let lay = KvLayout {
            block_size: 5,
            n_kv_heads: 2,
            head_dim: 8,
        };
        let n = 2 * lay.block_len();
        let (mut k32, mut v32) = (vec![0f32; n], vec![0f32; n]);
        let (mut k16, mut v16) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
        let table = [1u32, 0];
        let inv_freq = [1.0, 0.3, 0.01];
        for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
            for pos in [0, 4, 7] {
                let kt: Vec<f32> = (0..16).map(|i| (i as f32 * 0.377 - 2.9) * 1.01).collect();
                let vt: Vec<f32> = (0..16).map(|i| 1.0 / (i as f32 + 0.3)).collect();
                let mut cs = [0f32; 6];
                rope_cos_sin(pos, &inv_freq, 1.0, &mut cs);
                let r = Some(RopeAt {
                    cos_sin: &cs,
                    style,
                });
                let mut w32 = PagedKvMut::new(&mut k32, &mut v32, lay);
                w32.write(&table, pos, &kt, &vt, r);
                let mut w16 = PagedKvMut::new(&mut k16, &mut v16, lay);
                w16.write(&table, pos, &kt, &vt, r);
            }
            for (a, b) in k32.iter().zip(&k16).chain(v32.iter().zip(&v16)) {
                assert_eq!(f16::from_f32(*a).to_bits(), b.to_bits());
            }
        }
    }

    /// Keys longer than one conversion run ([`WRITE_RUN`]), partly rotated, in each element
    /// type: every stored element is [`crate::ops::rope`]'s value rounded by `T::from_f32`,
    /// at its transposed place.
    fn long_heads_are_rotated_and_rounded_element_by_element<T: KvElem>() {
        let lay = KvLayout {
            block_size: 3,
            n_kv_heads: 2,
            head_dim: 104,
        };
        let n = 4 * lay.block_len();
        let (mut k, mut v) = (vec![T::default(); n], vec![T::default(); n]);
        let table = [3u32, 1, 0, 2];
        // 88 rotated dims (44 pairs: two runs, the second partial), 16 left as they are.
        let inv_freq: Vec<f32> = (0..44).map(|i| 0.9f32.powi(i)).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
            for pos in [0, 2, 4, 11] {
                let kt: Vec<f32> = (0..208).map(|i| (i as f32 * 0.61 - 50.0) / 7.0).collect();
                let vt: Vec<f32> = (0..208).map(|i| 3.0 / (i as f32 - 99.5)).collect();
                let mut cs = vec![0f32; 88];
                rope_cos_sin(pos, &inv_freq, 1.0, &mut cs);
                let mut kv = PagedKvMut::new(&mut k, &mut v, lay);
                kv.write(
                    &table,
                    pos,
                    &kt,
                    &vt,
                    Some(RopeAt {
                        cos_sin: &cs,
                        style,
                    }),
                );
                let mut want = kt.clone();
                rope(&mut want, 104, pos, &inv_freq, style);
                let (block, slot) = lay.locate(&table, pos);
                for h in 0..2 {
                    for d in 0..104 {
                        let (got, exp) = (k[lay.k_at(block, h, d, slot)], want[h * 104 + d]);
                        let (got, exp) = (got.to_f32(), T::from_f32(exp).to_f32());
                        assert_eq!(got.to_bits(), exp.to_bits(), "{style:?} {pos} {h} {d}");
                    }
                    let at = lay.v_at(block, h, slot);
                    for d in 0..104 {
                        let exp = T::from_f32(vt[h * 104 + d]).to_f32();
                        assert_eq!(v[at + d].to_f32().to_bits(), exp.to_bits());
                    }
                }
            }
        }
    }

    /// An int8 store: each head's rotated key and its value are [`quantize_int8_row`]'s
    /// quants and scale of the reference row, the key's at its transposed place.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri perturbs every sin/cos call, so two computations of one rotation differ"
    )]
    fn int8_rows_are_the_rotated_reference_rows_quantized() {
        use crate::kv_elem::quantize_int8_row;
        let lay = KvLayout {
            block_size: 3,
            n_kv_heads: 2,
            head_dim: 40,
        };
        let n = 2 * lay.block_len();
        let (mut k, mut v) = (vec![0i8; n], vec![0i8; n]);
        let ns = 2 * lay.block_scales();
        let (mut ks, mut vs) = (vec![0f32; K_SCALE_GROUPS * ns], vec![0f32; ns]);
        let table = [1u32, 0];
        let inv_freq: Vec<f32> = (0..16).map(|i| 0.8f32.powi(i)).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::NeoX] {
            for pos in [0, 2, 5] {
                // Head 1 is 1000 times smaller: each row has its own scale.
                let mag = |i: usize| if i < 40 { 3.0 } else { 3e-3 };
                let kt: Vec<f32> = (0..80)
                    .map(|i| mag(i) * ((i * 13 % 17) as f32 - 8.3))
                    .collect();
                let vt: Vec<f32> = (0..80).map(|i| mag(i) / (i as f32 - 39.5)).collect();
                let mut cs = vec![0f32; 32];
                rope_cos_sin(pos, &inv_freq, 1.0, &mut cs);
                let mut kv = PagedKvMut {
                    k: &mut k,
                    v: &mut v,
                    k_scale: &mut ks,
                    v_scale: &mut vs,
                    layout: lay,
                };
                let r = RopeAt {
                    cos_sin: &cs,
                    style,
                };
                kv.write(&table, pos, &kt, &vt, Some(r));
                let mut want = kt.clone();
                rope(&mut want, 40, pos, &inv_freq, style);
                let (block, slot) = lay.locate(&table, pos);
                let rv = kv.as_ref();
                let mut q = [0i8; 40];
                for h in 0..2 {
                    // Each quarter of the key (10 values) is its own int8 row.
                    for g in 0..4 {
                        let si = lay.k_scale_at(block, h, g, slot);
                        let d0 = h * 40 + g * 10;
                        let scale = quantize_int8_row(&want[d0..d0 + 10], &mut q[..10]);
                        assert_eq!(rv.k_scale[si], scale, "{style:?} {pos} {h} {g}");
                        for (d, &q) in q[..10].iter().enumerate() {
                            let got = rv.k[lay.k_at(block, h, g * 10 + d, slot)];
                            assert_eq!(got, q, "{style:?} {pos} {h} {g} {d}");
                        }
                    }
                    let si = lay.v_scale_at(block, h, slot);
                    let scale = quantize_int8_row(&vt[h * 40..(h + 1) * 40], &mut q);
                    assert_eq!(rv.v_scale[si], scale);
                    let at = lay.v_at(block, h, slot);
                    assert_eq!(rv.v[at..at + 40], q);
                    // Read back, dequantized.
                    let mut got = [0f32; 40];
                    rv.read_k(&table, pos, h, &mut got);
                    for (d, (g, w)) in got.iter().zip(&want[h * 40..]).enumerate() {
                        let s = rv.k_scale[lay.k_scale_at(block, h, d / 10, slot)];
                        assert!((g - w).abs() <= 0.5 * s * 1.001, "{g} {w}");
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri perturbs every sin/cos call, so two computations of one rotation differ"
    )]
    fn long_heads_are_written_as_the_reference_in_every_element_type() {
        long_heads_are_rotated_and_rounded_element_by_element::<f32>();
        long_heads_are_rotated_and_rounded_element_by_element::<half::f16>();
        long_heads_are_rotated_and_rounded_element_by_element::<half::bf16>();
    }
}
