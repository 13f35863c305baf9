//! Admission control: a bounded waiting queue in front of the engine.
//!
//! A request is *waiting* from the moment it is admitted until its engine request produces
//! its first output (or is dropped). Both the number of waiting requests and the sum of their
//! prompt tokens are bounded (`--max-waiting-requests`, `--max-waiting-tokens`); a request
//! that would exceed either is rejected at once with 429 and `Retry-After`, so an overloaded
//! server answers in milliseconds instead of queueing without bound. Requests already running
//! are never counted: they hold KV blocks and will finish.
//!
//! Invariant: the counters equal the sum over live [`WaitingTicket`]s (a ticket releases its
//! share exactly once: on [`WaitingTicket::release`] or on drop).

use std::sync::{Arc, Mutex};

use crate::error::ApiError;
use crate::metrics::{Metrics, RejectReason};

/// The waiting-queue bounds and the current counts.
pub struct Admission {
    max_requests: usize,
    max_tokens: usize,
    /// `(waiting requests, waiting prompt tokens)`.
    waiting: Mutex<(usize, usize)>,
}

impl Admission {
    pub fn new(max_requests: usize, max_tokens: usize) -> Admission {
        Admission {
            max_requests,
            max_tokens,
            waiting: Mutex::new((0, 0)),
        }
    }

    /// `(requests, prompt tokens)` waiting now.
    pub fn waiting(&self) -> (usize, usize) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cheap early check (before tokenizing) that `n` more requests could fit.
    pub fn precheck(&self, n: usize, metrics: &Metrics) -> Result<(), ApiError> {
        if n > self.max_requests {
            // Could never be admitted, however long the client waits.
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "the request asks for {n} sequences (prompts × n); the server admits at \
                     most {} at once",
                    self.max_requests
                ),
            ));
        }
        let (reqs, _) = self.waiting();
        if reqs + n > self.max_requests {
            metrics.reject(RejectReason::WaitingRequests);
            return Err(self.full_requests());
        }
        Ok(())
    }

    /// Admits `prompts.len()` requests with these prompt lengths at once, or none.
    pub fn admit(
        self: &Arc<Self>,
        prompt_lens: &[usize],
        metrics: &Metrics,
    ) -> Result<Vec<WaitingTicket>, ApiError> {
        let tokens: usize = prompt_lens.iter().sum();
        {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if w.0 + prompt_lens.len() > self.max_requests {
                metrics.reject(RejectReason::WaitingRequests);
                return Err(self.full_requests());
            }
            // A lone request is always admitted on tokens (it could never get in otherwise).
            if w.0 > 0 && w.1 + tokens > self.max_tokens {
                metrics.reject(RejectReason::WaitingTokens);
                return Err(ApiError::overloaded(format!(
                    "too many prompt tokens waiting ({} + {tokens} > {}); retry later",
                    w.1, self.max_tokens
                )));
            }
            w.0 += prompt_lens.len();
            w.1 += tokens;
        }
        Ok(prompt_lens
            .iter()
            .map(|&t| WaitingTicket {
                admission: Some(self.clone()),
                tokens: t,
            })
            .collect())
    }

    fn full_requests(&self) -> ApiError {
        ApiError::overloaded(format!(
            "too many requests waiting (limit {}); retry later",
            self.max_requests
        ))
    }

    fn release(&self, tokens: usize) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.0 = w.0.saturating_sub(1);
        w.1 = w.1.saturating_sub(tokens);
    }
}

/// One admitted request's share of the waiting queue.
pub struct WaitingTicket {
    admission: Option<Arc<Admission>>,
    tokens: usize,
}

impl WaitingTicket {
    /// The request started running: it no longer counts as waiting.
    pub fn release(&mut self) {
        if let Some(a) = self.admission.take() {
            a.release(self.tokens);
        }
    }
}

impl Drop for WaitingTicket {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_requests_and_tokens() {
        let m = Metrics::new("m".into());
        let a = Arc::new(Admission::new(3, 100));
        let t1 = a.admit(&[60], &m).unwrap();
        assert!(a.admit(&[50], &m).is_err(), "tokens over the bound");
        let mut t2 = a.admit(&[10, 10], &m).unwrap();
        assert_eq!(a.waiting(), (3, 80));
        assert!(a.precheck(1, &m).is_err());
        t2[0].release();
        t2[0].release(); // idempotent
        assert_eq!(a.waiting(), (2, 70));
        drop(t2);
        drop(t1);
        assert_eq!(a.waiting(), (0, 0));
        // A lone request bigger than the token bound still gets in.
        let _big = a.admit(&[1000], &m).unwrap();
    }
}
