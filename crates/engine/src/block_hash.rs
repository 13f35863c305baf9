//! Prefix-cache keys: a hash per *full* KV block, chained over all earlier blocks.
//!
//! `hash(block i) = H(hash(block i-1), tokens of block i)`, with a fixed root for block 0, so
//! equal hashes mean equal token prefixes (up to 64-bit collisions: with a million cached
//! blocks the chance of any collision is ~3e-8). The function is FNV-1a over the token bytes
//! followed by a splitmix64 finaliser — fixed constants, no random keys, so keys are identical
//! across runs and processes.

/// Key of a full block in the prefix cache.
pub type BlockHash = u64;

const ROOT: u64 = 0x7f4a_7c15_9e37_79b9;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Hash of a block of `tokens` whose preceding blocks hash to `parent` (`None` for block 0).
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = parent.unwrap_or(ROOT) ^ 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
        }
    }
    h ^= tokens.len() as u64;
    // splitmix64 finaliser: avalanche so that nearby inputs spread over the whole range.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Extends `hashes` to cover every full block of `tokens` (blocks of `block_size`).
pub fn extend_block_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
    let num_full = tokens.len() / block_size;
    while hashes.len() < num_full {
        let i = hashes.len();
        let parent = hashes.last().copied();
        hashes.push(hash_block(
            parent,
            &tokens[i * block_size..(i + 1) * block_size],
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_and_deterministic() {
        let a = hash_block(None, &[1, 2, 3, 4]);
        assert_eq!(a, hash_block(None, &[1, 2, 3, 4]));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5]));
        assert_ne!(a, hash_block(None, &[4, 3, 2, 1]));
        // Same tokens under a different parent: a different key.
        assert_ne!(
            hash_block(Some(a), &[9, 9]),
            hash_block(Some(a + 1), &[9, 9])
        );
        // Pinned value: a change of function silently invalidating caches is caught here.
        assert_eq!(a, 0x18d7_87cb_6161_7daf, "{a:#x}");
    }

    #[test]
    fn extends_only_full_blocks() {
        let toks: Vec<u32> = (0..10).collect();
        let mut h = Vec::new();
        extend_block_hashes(&mut h, &toks, 4);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0], hash_block(None, &[0, 1, 2, 3]));
        assert_eq!(h[1], hash_block(Some(h[0]), &[4, 5, 6, 7]));
        extend_block_hashes(&mut h, &toks, 4);
        assert_eq!(h.len(), 2);
    }
}
