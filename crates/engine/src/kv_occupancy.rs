//! [`KvOccupancy`]: how full the paged KV allocator's blocks are — the slots the running
//! requests hold (their block tables × block size) against the tokens whose KV they hold.
//!
//! Paging wastes at most the unfilled tail of each request's last block (vLLM's PagedAttention
//! paper, <https://arxiv.org/abs/2309.06180>, §4: under 4% against 60–80% for contiguous
//! per-request reservations); this is the measured figure. The scheduler samples it after
//! every step's KV is written; `bench-engine` prints the peak and the mean. Blocks that only
//! the prefix cache keeps (free, evictable) are cache, not waste, and are not counted; a block
//! that several requests share counts once for each of them.

/// Slots held against slots filled, now and over the run (in token slots; multiply by the
/// cache's bytes per token for bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvOccupancy {
    /// Steps sampled.
    pub samples: u64,
    /// At the last sample: slots in the running requests' blocks, and positions filled.
    pub allocated: usize,
    pub used: usize,
    /// The sample with the most slots allocated, and its filled positions.
    pub peak_allocated: usize,
    pub used_at_peak: usize,
    /// Sums over all samples (for the mean waste).
    pub sum_allocated: u128,
    pub sum_used: u128,
}

impl KvOccupancy {
    /// Records one step: `requests` yields each running request's (blocks held, positions
    /// filled), blocks of `block_size` slots.
    pub fn record(&mut self, block_size: usize, requests: impl Iterator<Item = (usize, usize)>) {
        let (mut allocated, mut used) = (0, 0);
        for (blocks, filled) in requests {
            allocated += blocks * block_size;
            used += filled;
        }
        self.samples += 1;
        self.allocated = allocated;
        self.used = used;
        if allocated > self.peak_allocated {
            self.peak_allocated = allocated;
            self.used_at_peak = used;
        }
        self.sum_allocated += allocated as u128;
        self.sum_used += used as u128;
    }

    /// Allocated minus filled slots at the peak.
    pub fn waste_at_peak(&self) -> usize {
        self.peak_allocated.saturating_sub(self.used_at_peak)
    }

    /// The fraction of allocated slots left unfilled, over all samples (0 when nothing was
    /// allocated).
    pub fn mean_waste_fraction(&self) -> f64 {
        if self.sum_allocated == 0 {
            return 0.0;
        }
        self.sum_allocated.saturating_sub(self.sum_used) as f64 / self.sum_allocated as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waste_is_the_unfilled_tails() {
        let mut o = KvOccupancy::default();
        assert_eq!(o.mean_waste_fraction(), 0.0);
        // Two requests in blocks of 16: 33 positions in 3 blocks, 16 in 1.
        o.record(16, [(3, 33), (1, 16)].into_iter());
        assert_eq!((o.allocated, o.used), (64, 49));
        assert_eq!(o.waste_at_peak(), 15);
        // A smaller step does not move the peak.
        o.record(16, [(1, 1)].into_iter());
        assert_eq!(
            (o.peak_allocated, o.used_at_peak, o.waste_at_peak()),
            (64, 49, 15)
        );
        assert_eq!(o.samples, 2);
        let mean = (64.0 + 16.0 - 49.0 - 1.0) / (64.0 + 16.0);
        assert!((o.mean_waste_fraction() - mean).abs() < 1e-12);
    }
}
