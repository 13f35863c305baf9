//! [`KvCacheManager`]: per-request block tables over a [`BlockPool`], with automatic prefix
//! caching and sliding-window release.
//!
//! Design (vLLM v1 `kv_cache_manager.py`, simplified to one KV cache group):
//!
//! - A request's block table maps position `p` to block `table[p / block_size]`, slot
//!   `p % block_size`. Tables grow lazily: [`allocate_slots`](KvCacheManager::allocate_slots)
//!   adds exactly the blocks the next chunk needs, or returns `None` — all or nothing — when the
//!   pool (counting evictable cached blocks as free) cannot supply them.
//! - Prefix caching: a full block whose KV is *computed* is registered in the pool under its
//!   chained hash ([`crate::block_hash`]) by [`cache_blocks`](KvCacheManager::cache_blocks),
//!   which the scheduler calls after each step — never at allocation, so a hit can never read
//!   KV that is still being written (and a request preempted before its step ran cannot leave
//!   garbage behind under a valid key). At admission
//!   [`find_cached_prefix`](KvCacheManager::find_cached_prefix) walks the request's hashes to
//!   the first miss, stopping one token short of the whole sequence so that at least the last
//!   token is recomputed (its logits are needed to sample).
//! - Freed blocks go to the pool's LRU list last-block-first and keep their hash until reused.
//! - Sliding window: blocks entirely before the window are freed and replaced by
//!   [`BlockId::NULL`] so table indices stay positional.
//!
//! Invariant: every non-NULL entry of every table holds one reference on its block, and those
//! are the only references ([`check_invariants`](KvCacheManager::check_invariants)).

use std::collections::HashMap;

use crate::block_hash::BlockHash;
use crate::block_pool::{BlockId, BlockPool};
use crate::kv_events::KvEvent;
use crate::request::RequestId;

/// Tokens asked for and found in the prefix cache, summed over admitted requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub num_requests: u64,
    pub query_tokens: u64,
    pub hit_tokens: u64,
}

#[derive(Default)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// Leading blocks already registered in the prefix cache (or NULL).
    num_cached: usize,
}

/// A longest cached prefix found at admission: blocks to share and the tokens they cover.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    pub blocks: Vec<BlockId>,
    pub num_tokens: usize,
}

pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    enable_caching: bool,
    tables: HashMap<RequestId, RequestBlocks>,
    stats: PrefixCacheStats,
    /// What entered and left the prefix cache since the last drain, once recording is on.
    events: Option<Vec<KvEvent>>,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_caching: bool) -> KvCacheManager {
        assert!(block_size > 0);
        KvCacheManager {
            pool: BlockPool::new(num_blocks),
            block_size,
            enable_caching,
            tables: HashMap::new(),
            stats: PrefixCacheStats::default(),
            events: None,
        }
    }

    /// Starts recording [`KvEvent`]s (for [`take_events`](Self::take_events)).
    pub fn enable_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events since the last call, in order (none unless recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn removed(&mut self, hashes: Vec<BlockHash>) {
        if let Some(ev) = &mut self.events
            && !hashes.is_empty()
        {
            // Consecutive evictions make one event.
            if let Some(KvEvent::BlockRemoved { block_hashes }) = ev.last_mut() {
                block_hashes.extend(hashes);
            } else {
                ev.push(KvEvent::BlockRemoved {
                    block_hashes: hashes,
                });
            }
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Fraction of blocks in use (cached free blocks count as free).
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Blocks that hold `num_tokens` positions.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// The block table of a request (empty if it holds none).
    pub fn block_table(&self, id: RequestId) -> &[BlockId] {
        self.tables.get(&id).map_or(&[], |t| &t.blocks)
    }

    /// Longest run of cached blocks matching `hashes` (the request's full-block keys), covering
    /// at most `num_tokens - 1` tokens. Empty when caching is off.
    pub fn find_cached_prefix(&self, hashes: &[BlockHash], num_tokens: usize) -> CachedPrefix {
        if !self.enable_caching || num_tokens == 0 {
            return CachedPrefix::default();
        }
        let max_blocks = (num_tokens - 1) / self.block_size;
        let blocks: Vec<BlockId> = hashes
            .iter()
            .take(max_blocks)
            .map_while(|&h| self.pool.lookup(h))
            .collect();
        CachedPrefix {
            num_tokens: blocks.len() * self.block_size,
            blocks,
        }
    }

    /// Records one admission's prefix-cache query for the metrics.
    pub fn record_prefix_query(&mut self, query_tokens: usize, hit_tokens: usize) {
        self.stats.num_requests += 1;
        self.stats.query_tokens += query_tokens as u64;
        self.stats.hit_tokens += hit_tokens as u64;
    }

    /// Makes room for `num_new_tokens` positions after `num_computed_tokens` (which include a
    /// `prefix` just found by [`find_cached_prefix`](Self::find_cached_prefix); pass an empty
    /// prefix for a request already holding blocks). Returns the number of blocks newly
    /// allocated, or `None` — changing nothing — when the pool is short.
    pub fn allocate_slots(
        &mut self,
        id: RequestId,
        num_computed_tokens: usize,
        num_new_tokens: usize,
        prefix: &[BlockId],
    ) -> Option<usize> {
        let have = self.tables.get(&id).map_or(0, |t| t.blocks.len()) + prefix.len();
        let need = self.blocks_for(num_computed_tokens + num_new_tokens);
        let num_new_blocks = need.saturating_sub(have);
        // Touching a cached free block takes it off the free list too.
        let revived = prefix
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == 0)
            .count();
        if num_new_blocks + revived > self.pool.num_free() {
            return None;
        }
        let table = self.tables.entry(id).or_default();
        if !prefix.is_empty() {
            debug_assert!(table.blocks.is_empty(), "prefix given to a running request");
            for &b in prefix {
                self.pool.touch(b);
            }
            table.blocks.extend_from_slice(prefix);
            table.num_cached = prefix.len();
        }
        let mut evicted = Vec::new();
        for _ in 0..num_new_blocks {
            let (b, h) = self
                .pool
                .allocate_evicting()
                .expect("free count checked above");
            table.blocks.push(b);
            evicted.extend(h.filter(|_| self.events.is_some()));
        }
        self.removed(evicted);
        Some(num_new_blocks)
    }

    /// Registers the request's full blocks among its first `num_computed_tokens` positions in
    /// the prefix cache (`hashes` are its full-block keys). Call once their KV is written.
    pub fn cache_blocks(
        &mut self,
        id: RequestId,
        hashes: &[BlockHash],
        tokens: &[u32],
        num_computed_tokens: usize,
    ) {
        if !self.enable_caching {
            return;
        }
        let Some(table) = self.tables.get_mut(&id) else {
            return;
        };
        let num_full = (num_computed_tokens / self.block_size)
            .min(hashes.len())
            .min(table.blocks.len());
        let start = table.num_cached.min(num_full);
        for (i, &b) in table.blocks.iter().enumerate().take(num_full).skip(start) {
            let newly = b != BlockId::NULL
                && self.pool.block_hash(b).is_none()
                && self.pool.cache(b, hashes[i]);
            if newly && let Some(ev) = &mut self.events {
                stored(ev, hashes, tokens, i, self.block_size);
            }
        }
        table.num_cached = table.num_cached.max(num_full);
    }

    /// Releases all of a request's blocks (last block first, so its tail is evicted first).
    pub fn free(&mut self, id: RequestId) {
        if let Some(table) = self.tables.remove(&id) {
            for &b in table.blocks.iter().rev() {
                if b != BlockId::NULL {
                    self.pool.free(b);
                }
            }
        }
    }

    /// Frees the blocks a request with a sliding `window` no longer needs: the next query is at
    /// position `num_computed_tokens` and sees positions `> num_computed_tokens - window`, so
    /// blocks ending at or before that are dead. Returns how many blocks were freed.
    pub fn free_out_of_window(
        &mut self,
        id: RequestId,
        num_computed_tokens: usize,
        window: usize,
    ) -> usize {
        let Some(table) = self.tables.get_mut(&id) else {
            return 0;
        };
        let first_live = (num_computed_tokens + 1).saturating_sub(window);
        let num_dead = (first_live / self.block_size).min(table.blocks.len());
        let mut freed = 0;
        for b in &mut table.blocks[..num_dead] {
            if *b != BlockId::NULL {
                self.pool.free(*b);
                *b = BlockId::NULL;
                freed += 1;
            }
        }
        freed
    }

    /// Drops cached free blocks from the prefix cache.
    pub fn reset_prefix_cache(&mut self) {
        let dropped = self.pool.reset_prefix_cache();
        self.removed(dropped);
    }

    /// Pool invariants, plus: ref counts equal the number of table entries naming each block.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (id, t) in &self.tables {
            let mut seen = std::collections::HashSet::new();
            for &b in &t.blocks {
                if b == BlockId::NULL {
                    continue;
                }
                if !seen.insert(b) {
                    return Err(format!("request {id} lists {b:?} twice"));
                }
                refs[b.0 as usize] += 1;
            }
        }
        for (i, &r) in refs.iter().enumerate() {
            let b = BlockId(i as u32);
            if self.pool.ref_count(b) != r {
                return Err(format!(
                    "{b:?} has ref count {} but {r} table entries",
                    self.pool.ref_count(b)
                ));
            }
        }
        let used = refs.iter().filter(|&&r| r > 0).count();
        if used + self.pool.num_free() != self.pool.num_blocks() {
            return Err(format!(
                "{used} used + {} free != {} blocks",
                self.pool.num_free(),
                self.pool.num_blocks()
            ));
        }
        Ok(())
    }
}

/// Records block `i` of a sequence (`hashes`, `tokens`) entering the cache: it extends the
/// last event when that one stored block `i - 1` of the same sequence, so a run of blocks
/// is one event with one parent, as vLLM sends them.
fn stored(ev: &mut Vec<KvEvent>, hashes: &[BlockHash], tokens: &[u32], i: usize, bs: usize) {
    let parent = i.checked_sub(1).map(|p| hashes[p]);
    let block = &tokens[i * bs..(i + 1) * bs];
    if let Some(KvEvent::BlockStored {
        block_hashes,
        token_ids,
        ..
    }) = ev.last_mut()
        && block_hashes.last().copied() == parent
        && parent.is_some()
    {
        block_hashes.push(hashes[i]);
        token_ids.extend_from_slice(block);
        return;
    }
    ev.push(KvEvent::BlockStored {
        block_hashes: vec![hashes[i]],
        parent_block_hash: parent,
        token_ids: block.to_vec(),
        block_size: bs,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::extend_block_hashes;

    fn hashes(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
        let mut h = Vec::new();
        extend_block_hashes(&mut h, tokens, bs);
        h
    }

    #[test]
    fn allocates_lazily_and_all_or_nothing() {
        let mut m = KvCacheManager::new(4, 4, true);
        let a = RequestId(1);
        assert_eq!(m.allocate_slots(a, 0, 5, &[]), Some(2));
        assert_eq!(m.allocate_slots(a, 5, 3, &[]), Some(0));
        assert_eq!(m.allocate_slots(a, 8, 1, &[]), Some(1));
        assert_eq!(m.block_table(a).len(), 3);
        // Needs 2 more blocks, only 1 free: nothing changes.
        assert_eq!(m.allocate_slots(RequestId(2), 0, 5, &[]), None);
        assert_eq!(m.num_free_blocks(), 1);
        assert!(m.block_table(RequestId(2)).is_empty());
        m.check_invariants().unwrap();
        m.free(a);
        assert_eq!(m.num_free_blocks(), 4);
        m.check_invariants().unwrap();
    }

    #[test]
    fn prefix_hit_shares_blocks_and_leaves_the_last_token() {
        let mut m = KvCacheManager::new(8, 4, true);
        let prompt: Vec<u32> = (0..12).collect();
        let h = hashes(&prompt, 4);
        let a = RequestId(1);
        m.allocate_slots(a, 0, 12, &[]).unwrap();
        // Nothing is cached until the KV is computed.
        assert_eq!(m.find_cached_prefix(&h, 12).num_tokens, 0);
        m.cache_blocks(a, &h, &prompt, 12);
        // Same prompt: 3 full blocks cached, but the last token must be recomputed → 2 blocks.
        let hit = m.find_cached_prefix(&h, 12);
        assert_eq!(hit.num_tokens, 8);
        assert_eq!(hit.blocks, m.block_table(a)[..2].to_vec());
        // A longer prompt sharing the first 12 tokens hits all 3 blocks.
        let mut longer = prompt.clone();
        longer.extend([50, 51]);
        let hl = hashes(&longer, 4);
        assert_eq!(m.find_cached_prefix(&hl, 14).num_tokens, 12);
        // A prompt diverging in block 1 hits block 0 only.
        let mut other = prompt.clone();
        other[5] = 99;
        assert_eq!(m.find_cached_prefix(&hashes(&other, 4), 12).num_tokens, 4);

        let b = RequestId(2);
        assert_eq!(m.allocate_slots(b, 8, 4, &hit.blocks), Some(1));
        assert_eq!(m.pool().ref_count(hit.blocks[0]), 2);
        assert_eq!(m.num_free_blocks(), 4);
        m.check_invariants().unwrap();
        m.free(a);
        m.free(b);
        m.check_invariants().unwrap();
        // Freed blocks are still cached and revivable.
        let hit = m.find_cached_prefix(&hl, 14);
        assert_eq!(hit.num_tokens, 12);
        assert_eq!(m.allocate_slots(RequestId(3), 12, 2, &hit.blocks), Some(1));
        m.check_invariants().unwrap();
    }

    /// Replays events into a set of cached hashes (as a subscriber would).
    fn replay(m: &mut KvCacheManager, set: &mut std::collections::HashSet<BlockHash>) {
        for e in m.take_events() {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    block_size,
                    ..
                } => {
                    assert_eq!(token_ids.len(), block_hashes.len() * block_size);
                    set.extend(block_hashes);
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        assert!(set.remove(&h), "removed a block never stored");
                    }
                }
                KvEvent::AllBlocksCleared => set.clear(),
            }
        }
        let truth: std::collections::HashSet<BlockHash> = m.pool().cached_hashes().collect();
        assert_eq!(*set, truth);
    }

    /// The set the events describe is the pool's index, through stores, evictions and a
    /// reset; a run of a sequence's blocks is one event whose parent is the block before.
    #[test]
    fn events_rebuild_the_cached_set() {
        let mut m = KvCacheManager::new(6, 2, true);
        m.enable_events();
        let a: Vec<u32> = (0..7).collect();
        let ha = hashes(&a, 2);
        m.allocate_slots(RequestId(1), 0, 7, &[]).unwrap();
        m.cache_blocks(RequestId(1), &ha, &a, 4);
        m.cache_blocks(RequestId(1), &ha, &a, 7);
        let stored = |hs: &[BlockHash], parent, tokens: &[u32]| KvEvent::BlockStored {
            block_hashes: hs.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens.to_vec(),
            block_size: 2,
        };
        // Block 2, cached by a later call, continues the run of blocks 0-1: one event.
        assert_eq!(m.take_events(), vec![stored(&ha[..3], None, &a[..6])]);
        let c: Vec<u32> = (0..4).chain([77, 78]).collect();
        let hc = hashes(&c, 2);
        m.allocate_slots(
            RequestId(3),
            4,
            2,
            &m.find_cached_prefix(&hc, 6).blocks.clone(),
        )
        .unwrap();
        m.cache_blocks(RequestId(3), &hc, &c, 6);
        // A sequence sharing blocks 0-1 stores only its own block 2, under block 1.
        assert_eq!(
            m.take_events(),
            vec![stored(&hc[2..3], Some(hc[1]), &c[4..6])]
        );
        m.free(RequestId(3));
        let mut set: std::collections::HashSet<BlockHash> =
            ha[..3].iter().chain(&hc[2..3]).copied().collect();
        m.free(RequestId(1));
        // B needs 5 of the 6 blocks: A's cached free blocks are evicted for it.
        let b: Vec<u32> = (100..110).collect();
        let hb = hashes(&b, 2);
        m.allocate_slots(RequestId(2), 0, 10, &[]).unwrap();
        m.cache_blocks(RequestId(2), &hb, &b, 10);
        replay(&mut m, &mut set);
        assert!(m.pool().num_evictions() > 0);
        m.free(RequestId(2));
        m.reset_prefix_cache();
        replay(&mut m, &mut set);
        assert!(set.is_empty());
        // Off: nothing recorded.
        let mut off = KvCacheManager::new(4, 2, true);
        off.allocate_slots(RequestId(1), 0, 4, &[]).unwrap();
        off.cache_blocks(RequestId(1), &hashes(&a[..4], 2), &a[..4], 4);
        assert!(off.take_events().is_empty());
    }

    #[test]
    fn caching_off_never_hits() {
        let mut m = KvCacheManager::new(4, 2, false);
        let t = [1, 2, 3, 4, 5];
        let h = hashes(&t, 2);
        m.allocate_slots(RequestId(1), 0, 5, &[]).unwrap();
        m.cache_blocks(RequestId(1), &h, &t, 5);
        assert_eq!(m.find_cached_prefix(&h, 5), CachedPrefix::default());
        assert_eq!(m.pool().num_cached(), 0);
    }

    #[test]
    fn revived_blocks_count_against_free_space() {
        // 3 blocks; A caches 2 and frees them. B hits both and needs 2 more: 2 + 2 > 3.
        let mut m = KvCacheManager::new(3, 2, true);
        let t: Vec<u32> = (0..5).collect();
        let h = hashes(&t, 2);
        m.allocate_slots(RequestId(1), 0, 5, &[]).unwrap();
        m.cache_blocks(RequestId(1), &h, &t, 5);
        m.free(RequestId(1));
        let hit = m.find_cached_prefix(&h, 5);
        assert_eq!(hit.blocks.len(), 2);
        assert_eq!(m.allocate_slots(RequestId(2), 4, 3, &hit.blocks), None);
        assert_eq!(m.allocate_slots(RequestId(2), 4, 2, &hit.blocks), Some(1));
        m.check_invariants().unwrap();
    }

    #[test]
    fn sliding_window_frees_dead_blocks() {
        let mut m = KvCacheManager::new(8, 4, true);
        let a = RequestId(1);
        m.allocate_slots(a, 0, 20, &[]).unwrap();
        assert_eq!(m.num_free_blocks(), 3);
        // Next query at position 20 with window 8 sees 13..=20: blocks 0..3 (positions 0..12)
        // are dead, block 3 (12..16) still holds 13..16.
        assert_eq!(m.free_out_of_window(a, 20, 8), 3);
        let t = m.block_table(a);
        assert_eq!(&t[..3], &[BlockId::NULL; 3]);
        assert!(t[3..].iter().all(|&b| b != BlockId::NULL));
        assert_eq!(m.num_free_blocks(), 6);
        assert_eq!(m.free_out_of_window(a, 20, 8), 0);
        // Growing the table still works positionally.
        m.allocate_slots(a, 20, 1, &[]).unwrap();
        assert_eq!(m.block_table(a).len(), 6);
        m.check_invariants().unwrap();
        m.free(a);
        assert_eq!(m.num_free_blocks(), 8);
        m.check_invariants().unwrap();
    }
}
