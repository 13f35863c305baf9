//! KV-cache events: what enters and leaves the prefix cache, for a router that wants to know
//! which worker holds which prefix (vLLM's `KVEventBatch`: llm-d's prefix-cache scorer, SGLang's
//! and vLLM's routers follow these).
//!
//! The [`KvCacheManager`](crate::KvCacheManager) records them once asked to
//! ([`enable_events`](crate::KvCacheManager::enable_events)); the engine thread drains them
//! after every step into one [`KvEventBatch`] for its subscriber
//! ([`EngineHandle::subscribe_kv_events`](crate::EngineHandle::subscribe_kv_events)). Recording
//! is off otherwise, and costs nothing then. The wire format is the publisher's business
//! (`tokenmill-server`'s `kv_events`).

use crate::block_hash::BlockHash;

/// One change to the set of cached blocks, in the order it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive full blocks of one sequence entered the cache: their hashes, the hash of
    /// the block before the first (`None`: the first is the sequence's block 0), their
    /// `block_hashes.len() × block_size` tokens.
    BlockStored {
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
    },
    /// Blocks left the cache (evicted for reuse, or dropped by a reset).
    BlockRemoved { block_hashes: Vec<BlockHash> },
    /// Everything left the cache.
    AllBlocksCleared,
}

/// The events of one engine step, stamped with the wall-clock time they were drained.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// Seconds since the Unix epoch.
    pub ts: f64,
    pub events: Vec<KvEvent>,
}
