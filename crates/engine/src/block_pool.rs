//! [`BlockPool`]: the KV blocks of the cache, by id, with reference counts, an LRU free list
//! and the prefix-cache index.
//!
//! Design (after mistral.rs `paged_attention/block_pool.rs` and vLLM `v1/core/block_pool.py`):
//!
//! - One flat `Vec<Block>`; a block is named by its index, [`BlockId`]`(u32)`.
//! - Free blocks (ref count 0) sit in an intrusive doubly linked list threaded through the
//!   blocks by `u32` indices: allocation pops the head, freeing appends at the tail, and a
//!   prefix-cache hit unlinks a block from the middle — all O(1), no allocation.
//! - The list is the eviction order: the head is the least recently freed block. A freed block
//!   keeps its hash (and stays findable through `cached`) until it is reallocated; only then is
//!   it evicted from the prefix cache. Callers free a request's blocks last-first, so a
//!   sequence's tail (the least shareable part) is evicted before its head.
//! - `cached: hash → BlockId` indexes full blocks whose KV is computed.
//!
//! Invariants (checked by [`BlockPool::check_invariants`]):
//! - a block is in the free list iff its ref count is 0; `num_free` is the list's length;
//! - `cached[h] = b` implies `blocks[b].hash == Some(h)`; a block with a hash is indexed under it;
//! - free + in-use = total.

use std::collections::HashMap;

use crate::block_hash::BlockHash;

/// Index of a KV block in the cache arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    /// Placeholder in a block table for a block freed by a sliding window; a model with that
    /// window never reads it.
    pub const NULL: BlockId = BlockId(u32::MAX);
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Block {
    ref_cnt: u32,
    /// Prefix-cache key while the block is indexed in `cached`.
    hash: Option<BlockHash>,
    /// Free-list links (meaningful only while `ref_cnt == 0`).
    prev: u32,
    next: u32,
}

pub struct BlockPool {
    blocks: Vec<Block>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, BlockId>,
    num_evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks (listed in id order).
    pub fn new(num_blocks: usize) -> BlockPool {
        assert!(num_blocks < NIL as usize, "too many blocks for u32 ids");
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
            })
            .collect();
        BlockPool {
            blocks,
            free_head: if n == 0 { NIL } else { 0 },
            free_tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
            cached: HashMap::new(),
            num_evictions: 0,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with no user (including cached ones that may be evicted).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks in use, 0..=1 (cached free blocks count as free).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free as f64 / self.blocks.len() as f64
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id.0 as usize].ref_cnt
    }

    pub fn block_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks[id.0 as usize].hash
    }

    /// Blocks in the prefix-cache index (used or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Cached blocks reallocated (and so dropped from the prefix cache) so far.
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }

    /// The cached block holding the prefix with key `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Takes the least recently freed block (evicting its cache entry), with ref count 1.
    pub fn allocate(&mut self) -> Option<BlockId> {
        self.allocate_evicting().map(|(id, _)| id)
    }

    /// [`allocate`](Self::allocate), also saying which cache entry it evicted.
    pub fn allocate_evicting(&mut self) -> Option<(BlockId, Option<BlockHash>)> {
        if self.free_head == NIL {
            return None;
        }
        let id = BlockId(self.free_head);
        self.unlink(id);
        let b = &mut self.blocks[id.0 as usize];
        b.ref_cnt = 1;
        let evicted = b.hash.take();
        if let Some(h) = evicted {
            self.cached.remove(&h);
            self.num_evictions += 1;
        }
        Some((id, evicted))
    }

    /// Adds a user to a block (a prefix-cache hit), taking it off the free list if it was free.
    pub fn touch(&mut self, id: BlockId) {
        if self.blocks[id.0 as usize].ref_cnt == 0 {
            self.unlink(id);
        }
        self.blocks[id.0 as usize].ref_cnt += 1;
    }

    /// Drops a user; at zero the block joins the tail of the free list, keeping its hash.
    pub fn free(&mut self, id: BlockId) {
        let b = &mut self.blocks[id.0 as usize];
        assert!(b.ref_cnt > 0, "double free of {id:?}");
        b.ref_cnt -= 1;
        if b.ref_cnt == 0 {
            self.push_tail(id);
        }
    }

    /// Registers a full, computed block under `hash`. If another block already holds that
    /// prefix (two requests computed it concurrently) this one stays unindexed and is simply
    /// reused when freed. Returns whether the block is now indexed.
    pub fn cache(&mut self, id: BlockId, hash: BlockHash) -> bool {
        if self.blocks[id.0 as usize].hash.is_some() {
            return self.blocks[id.0 as usize].hash == Some(hash);
        }
        if self.cached.contains_key(&hash) {
            return false;
        }
        self.cached.insert(hash, id);
        self.blocks[id.0 as usize].hash = Some(hash);
        true
    }

    /// Drops every cached-but-free block from the index (e.g. after a weight reload) and
    /// returns their keys. Blocks in use keep their entries.
    pub fn reset_prefix_cache(&mut self) -> Vec<BlockHash> {
        let blocks = &mut self.blocks;
        let mut dropped = Vec::new();
        self.cached.retain(|&h, id| {
            let b = &mut blocks[id.0 as usize];
            let keep = b.ref_cnt > 0;
            if !keep {
                b.hash = None;
                dropped.push(h);
            }
            keep
        });
        dropped
    }

    /// Keys of every indexed block (any order).
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached.keys().copied()
    }

    /// Free block ids, least recently freed first (eviction order).
    pub fn free_list(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.free_head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let id = BlockId(cur);
            cur = self.blocks[cur as usize].next;
            Some(id)
        })
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id.0 as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id.0 as usize];
        b.prev = NIL;
        b.next = NIL;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.free_tail;
        {
            let b = &mut self.blocks[id.0 as usize];
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.free_head = id.0;
        } else {
            self.blocks[tail as usize].next = id.0;
        }
        self.free_tail = id.0;
        self.num_free += 1;
    }

    /// Checks the invariants in the module doc.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        let mut count = 0;
        let mut prev = NIL;
        for id in self.free_list() {
            let b = &self.blocks[id.0 as usize];
            if seen[id.0 as usize] {
                return Err(format!("free list has a cycle at {id:?}"));
            }
            seen[id.0 as usize] = true;
            if b.ref_cnt != 0 {
                return Err(format!("{id:?} is free with ref count {}", b.ref_cnt));
            }
            if b.prev != prev {
                return Err(format!("{id:?} has a bad prev link"));
            }
            prev = id.0;
            count += 1;
        }
        if prev != self.free_tail {
            return Err("free tail does not end the list".into());
        }
        if count != self.num_free {
            return Err(format!("num_free {} but {count} listed", self.num_free));
        }
        let zero = self.blocks.iter().filter(|b| b.ref_cnt == 0).count();
        if zero != count {
            return Err(format!("{zero} blocks at ref 0 but {count} free"));
        }
        for (h, id) in &self.cached {
            if self.blocks[id.0 as usize].hash != Some(*h) {
                return Err(format!("cache entry {h:#x} → {id:?} is stale"));
            }
        }
        let hashed = self.blocks.iter().filter(|b| b.hash.is_some()).count();
        if hashed != self.cached.len() {
            return Err(format!(
                "{hashed} blocks hashed, {} indexed",
                self.cached.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(p: &BlockPool) -> Vec<u32> {
        p.free_list().map(|b| b.0).collect()
    }

    #[test]
    fn allocates_in_order_and_conserves() {
        let mut p = BlockPool::new(4);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert_eq!((a, b), (BlockId(0), BlockId(1)));
        assert_eq!(p.num_free(), 2);
        assert_eq!(p.usage(), 0.5);
        p.allocate().unwrap();
        p.allocate().unwrap();
        assert_eq!(p.allocate(), None);
        p.free(b);
        assert_eq!(ids(&p), vec![1]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn lru_eviction_order_and_hash_kept_until_reuse() {
        let mut p = BlockPool::new(3);
        let blocks: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        for (i, &b) in blocks.iter().enumerate() {
            assert!(p.cache(b, 100 + i as u64));
        }
        // Free 2, then 0, then 1: that is the eviction order.
        p.free(blocks[2]);
        p.free(blocks[0]);
        p.free(blocks[1]);
        assert_eq!(ids(&p), vec![2, 0, 1]);
        // Freed blocks stay findable.
        assert_eq!(p.lookup(100), Some(BlockId(0)));
        // A hit revives block 0 from the middle of the list.
        p.touch(BlockId(0));
        assert_eq!(ids(&p), vec![2, 1]);
        assert_eq!(p.ref_count(BlockId(0)), 1);
        // Allocation evicts the least recently freed: 2, then 1.
        assert_eq!(p.allocate(), Some(BlockId(2)));
        assert_eq!(p.lookup(102), None);
        assert_eq!(p.block_hash(BlockId(2)), None);
        assert_eq!(p.num_evictions(), 1);
        assert_eq!(p.allocate(), Some(BlockId(1)));
        assert_eq!(p.lookup(100), Some(BlockId(0)));
        p.check_invariants().unwrap();
    }

    #[test]
    fn shared_block_needs_every_user_to_free() {
        let mut p = BlockPool::new(2);
        let a = p.allocate().unwrap();
        p.cache(a, 7);
        p.touch(a);
        assert_eq!(p.ref_count(a), 2);
        p.free(a);
        assert_eq!(p.num_free(), 1);
        p.free(a);
        assert_eq!(p.num_free(), 2);
        p.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_hash_stays_unindexed() {
        let mut p = BlockPool::new(2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert!(p.cache(a, 5));
        assert!(!p.cache(b, 5));
        assert!(p.cache(a, 5));
        assert_eq!(p.lookup(5), Some(a));
        p.free(b);
        p.free(a);
        p.check_invariants().unwrap();
        p.reset_prefix_cache();
        assert_eq!(p.num_cached(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn empty_pool() {
        let mut p = BlockPool::new(0);
        assert_eq!(p.allocate(), None);
        assert_eq!(p.usage(), 0.0);
        p.check_invariants().unwrap();
    }
}
