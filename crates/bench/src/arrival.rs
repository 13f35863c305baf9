//! When requests are sent.
//!
//! As in `vllm bench serve`, one mechanism covers both loops: each request has a send offset
//! from the start of the run, and at most `max_concurrency` requests are in flight (a request
//! whose offset has passed waits for a slot).
//! - Closed loop (`--concurrency N`): every offset is 0 and `max_concurrency = N`, so N
//!   clients each send their next request as soon as the previous one finishes.
//! - Open loop (`--request-rate R`): gaps between sends are drawn from a gamma distribution
//!   with shape `burstiness` and mean `1/R` (burstiness 1 = a Poisson process; below 1 is
//!   burstier, above 1 more regular), optionally capped by `--max-concurrency`.
//!
//! Invariants: offsets are non-decreasing, start at the first gap, and the same seed gives
//! the same schedule.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Gamma};

/// How requests arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrival {
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
    /// Requests per second (∞ = all at once), gamma-distributed gaps, optional cap.
    Open {
        rate: f64,
        burstiness: f64,
        max_concurrency: Option<usize>,
    },
}

impl Arrival {
    /// Send offsets for `n` requests, from `seed`.
    pub fn offsets(&self, n: usize, seed: u64) -> Result<Vec<Duration>, String> {
        match *self {
            Arrival::Closed { .. } => Ok(vec![Duration::ZERO; n]),
            Arrival::Open {
                rate, burstiness, ..
            } => gamma_offsets(n, rate, burstiness, seed),
        }
    }

    /// The cap on requests in flight (`None` = unlimited).
    pub fn max_concurrency(&self) -> Option<usize> {
        match *self {
            Arrival::Closed { concurrency } => Some(concurrency.max(1)),
            Arrival::Open {
                max_concurrency, ..
            } => max_concurrency.map(|c| c.max(1)),
        }
    }

    /// The request rate, `None` when unlimited.
    pub fn rate(&self) -> Option<f64> {
        match *self {
            Arrival::Open { rate, .. } if rate.is_finite() => Some(rate),
            _ => None,
        }
    }
}

/// Cumulative gamma-distributed gaps with mean `1/rate` and shape `burstiness`.
pub fn gamma_offsets(
    n: usize,
    rate: f64,
    burstiness: f64,
    seed: u64,
) -> Result<Vec<Duration>, String> {
    if rate.is_infinite() && rate > 0.0 {
        return Ok(vec![Duration::ZERO; n]);
    }
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(format!("request rate {rate} must be positive"));
    }
    if !(burstiness > 0.0 && burstiness.is_finite()) {
        return Err(format!("burstiness {burstiness} must be positive"));
    }
    let gamma = Gamma::new(burstiness, 1.0 / (rate * burstiness)).map_err(|e| e.to_string())?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0f64;
    Ok((0..n)
        .map(|_| {
            t += gamma.sample(&mut rng);
            Duration::from_secs_f64(t)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(offsets: &[Duration]) -> Vec<f64> {
        let mut prev = 0.0;
        offsets
            .iter()
            .map(|o| {
                let g = o.as_secs_f64() - prev;
                prev = o.as_secs_f64();
                g
            })
            .collect()
    }

    fn mean_cv(g: &[f64]) -> (f64, f64) {
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        let var = g.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / g.len() as f64;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_gaps_have_the_rate_and_unit_cv() {
        // 20k draws: the sample mean's relative standard error is 1/sqrt(20000) ≈ 0.7%, so 5%
        // is > 7 standard errors; the seed makes the test deterministic anyway.
        let o = gamma_offsets(20_000, 4.0, 1.0, 1).unwrap();
        assert!(o.windows(2).all(|w| w[0] <= w[1]));
        let (mean, cv) = mean_cv(&gaps(&o));
        assert!((mean - 0.25).abs() < 0.25 * 0.05, "{mean}");
        assert!((cv - 1.0).abs() < 0.05, "{cv}");
        assert_eq!(o, gamma_offsets(20_000, 4.0, 1.0, 1).unwrap());
        assert_ne!(o, gamma_offsets(20_000, 4.0, 1.0, 2).unwrap());
    }

    #[test]
    fn burstiness_sets_the_spread_not_the_rate() {
        // Gamma(k): CV = 1/sqrt(k).
        for k in [0.25, 4.0] {
            let (mean, cv) = mean_cv(&gaps(&gamma_offsets(20_000, 10.0, k, 3).unwrap()));
            assert!((mean - 0.1).abs() < 0.1 * 0.05, "k {k}: mean {mean}");
            assert!(
                (cv - 1.0 / f64::sqrt(k)).abs() < 0.1 / f64::sqrt(k),
                "k {k}: cv {cv}"
            );
        }
    }

    #[test]
    fn closed_loop_and_infinite_rate_send_at_once() {
        let closed = Arrival::Closed { concurrency: 0 };
        assert_eq!(closed.offsets(3, 0).unwrap(), vec![Duration::ZERO; 3]);
        assert_eq!(closed.max_concurrency(), Some(1));
        let inf = Arrival::Open {
            rate: f64::INFINITY,
            burstiness: 1.0,
            max_concurrency: Some(4),
        };
        assert_eq!(inf.offsets(2, 0).unwrap(), vec![Duration::ZERO; 2]);
        assert_eq!((inf.rate(), inf.max_concurrency()), (None, Some(4)));
        assert!(gamma_offsets(1, 0.0, 1.0, 0).is_err());
        assert!(gamma_offsets(1, f64::NAN, 1.0, 0).is_err());
        assert!(gamma_offsets(1, 1.0, 0.0, 0).is_err());
    }
}
