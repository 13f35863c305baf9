//! How many KV blocks fit in a memory budget.
//!
//! The block pool deals in block ids only; what a block *holds* is a property of the model,
//! its [`KvShape`] (`tokenmill_model::KvShape`: standard K/V or DeepSeek's latent row).
//!
//! Sizing: `num_blocks = budget / (block_size · bytes_per_token)` (bytes per element from the
//! `--kv-cache-dtype`: an f16 cache holds twice the tokens), where the budget is either a
//! byte count or a fraction of physical memory ([`KvCacheMemory`], the `--kv-cache-memory`
//! flag's value). Pure functions; the only I/O is [`system_memory_bytes`].

use std::str::FromStr;

use tokenmill_model::{KvDtype, KvShape};

use crate::error::EngineError;

/// The KV cache memory budget: a byte count or a fraction of physical memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvCacheMemory {
    Bytes(u64),
    /// Fraction of total physical memory, in (0, 1].
    FractionOfRam(f64),
}

impl KvCacheMemory {
    /// The budget in bytes given the machine's total memory.
    pub fn resolve(&self, total_ram_bytes: u64) -> u64 {
        match *self {
            KvCacheMemory::Bytes(b) => b,
            KvCacheMemory::FractionOfRam(f) => (total_ram_bytes as f64 * f) as u64,
        }
    }
}

impl FromStr for KvCacheMemory {
    type Err = EngineError;

    /// `0.25` (a fraction of RAM), `4GiB`, `512MiB`, `2GB`, `1000000` (bytes).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || EngineError::InvalidKvCacheMemory(s.to_string());
        let t = s.trim();
        if t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
            let f: f64 = t.parse().map_err(|_| bad())?;
            return if f > 0.0 && f <= 1.0 {
                Ok(KvCacheMemory::FractionOfRam(f))
            } else {
                Err(bad())
            };
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| bad())?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "m" | "mb" => 1_000_000,
            "g" | "gb" => 1_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            _ => return Err(bad()),
        };
        n.checked_mul(mult)
            .filter(|&b| b > 0)
            .map(KvCacheMemory::Bytes)
            .ok_or_else(bad)
    }
}

/// Blocks of `block_size` tokens of `shape` (in a cache of `dtype`) that fit in
/// `budget_bytes`. May be 0: the caller decides whether that is fatal.
pub fn num_blocks_for_memory(
    shape: &KvShape,
    block_size: usize,
    dtype: KvDtype,
    budget_bytes: u64,
) -> usize {
    let per_block = shape.bytes_per_block(block_size, dtype) as u64;
    if per_block == 0 {
        return 0;
    }
    // Block ids are u32; stay clear of the NULL id.
    (budget_bytes / per_block).min(u32::MAX as u64 - 1) as usize
}

/// Total physical memory from `/proc/meminfo` (`MemTotal`), if readable.
pub fn system_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: KvShape = KvShape::Standard {
        n_layers: 30,
        n_kv_heads: 3,
        head_dim: 64,
    };

    #[test]
    fn blocks_from_budget() {
        let one_gib = KvCacheMemory::Bytes(1 << 30).resolve(0);
        assert_eq!(
            num_blocks_for_memory(&SMOLLM2, 16, KvDtype::F32, one_gib),
            1456
        );
        let half = KvCacheMemory::FractionOfRam(0.5).resolve(8 << 30);
        assert_eq!(half, 4 << 30);
        assert_eq!(num_blocks_for_memory(&SMOLLM2, 16, KvDtype::F32, 1000), 0);
        // An f16 cache: twice the blocks in the same budget.
        assert_eq!(
            num_blocks_for_memory(&SMOLLM2, 16, KvDtype::F16, one_gib),
            2 * 1456
        );
    }

    #[test]
    fn parses_budgets() {
        let p = |s: &str| s.parse::<KvCacheMemory>();
        assert_eq!(p("4GiB"), Ok(KvCacheMemory::Bytes(4 << 30)));
        assert_eq!(p("512MiB"), Ok(KvCacheMemory::Bytes(512 << 20)));
        assert_eq!(p("2GB"), Ok(KvCacheMemory::Bytes(2_000_000_000)));
        assert_eq!(p("1000000"), Ok(KvCacheMemory::Bytes(1_000_000)));
        assert_eq!(p("0.25"), Ok(KvCacheMemory::FractionOfRam(0.25)));
        for bad in ["", "0", "1.5", "0.0", "3 parsecs", "GiB"] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_system_memory() {
        if cfg!(target_os = "linux") {
            assert!(system_memory_bytes().unwrap() > 1 << 20);
        }
    }
}
