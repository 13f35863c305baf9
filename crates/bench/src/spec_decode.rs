//! Speculative decoding seen from the client: the server's vLLM-named counters
//! (`vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total`) read from its
//! `/metrics` before and after the measured requests, so the report states the acceptance
//! rate of exactly that run. A server that does not export them (speculation off, another
//! engine, no metrics route) gives `None`, and the report says nothing about speculation.

use serde::Serialize;

/// What the server's speculation did during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SpecDecodeFigures {
    /// Verification steps of a request that carried drafts.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
}

impl SpecDecodeFigures {
    /// Accepted over proposed draft tokens.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted_tokens as f64 / (self.draft_tokens as f64).max(1.0)
    }

    /// Tokens per verification step: its accepted drafts and the token the target adds
    /// (vLLM's "acceptance length").
    pub fn acceptance_length(&self) -> f64 {
        1.0 + self.accepted_tokens as f64 / (self.drafts as f64).max(1.0)
    }

    /// The counters in Prometheus text, summed over label sets; `None` unless all three are
    /// there.
    pub fn parse(text: &str) -> Option<SpecDecodeFigures> {
        let sum = |name: &str| {
            let mut found = false;
            let mut total = 0.0;
            for l in text.lines().filter(|l| !l.starts_with('#')) {
                let Some(rest) = l.strip_prefix(name) else {
                    continue;
                };
                if !rest.starts_with([' ', '{']) {
                    continue;
                }
                if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                    found = true;
                    total += v;
                }
            }
            found.then_some(total as u64)
        };
        Some(SpecDecodeFigures {
            drafts: sum("vllm:spec_decode_num_drafts_total")?,
            draft_tokens: sum("vllm:spec_decode_num_draft_tokens_total")?,
            accepted_tokens: sum("vllm:spec_decode_num_accepted_tokens_total")?,
        })
    }

    /// What happened between two readings.
    pub fn since(&self, before: &SpecDecodeFigures) -> SpecDecodeFigures {
        SpecDecodeFigures {
            drafts: self.drafts.saturating_sub(before.drafts),
            draft_tokens: self.draft_tokens.saturating_sub(before.draft_tokens),
            accepted_tokens: self.accepted_tokens.saturating_sub(before.accepted_tokens),
        }
    }
}

/// The counters at `url` now; `None` if unreadable or absent.
pub async fn read(client: &reqwest::Client, url: &str) -> Option<SpecDecodeFigures> {
    let resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    SpecDecodeFigures::parse(&resp.text().await.ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_labels_and_all_three_are_needed() {
        let text = "# HELP vllm:spec_decode_num_drafts_total x\n\
            vllm:spec_decode_num_drafts_total{model_name=\"a\"} 10.0\n\
            vllm:spec_decode_num_drafts_total{model_name=\"b\"} 2.0\n\
            vllm:spec_decode_num_draft_tokens_total{model_name=\"a\"} 40.0\n\
            vllm:spec_decode_num_accepted_tokens_total{model_name=\"a\"} 30.0\n\
            vllm:spec_decode_num_accepted_tokens_per_pos{position=\"0\"} 9.0\n";
        let f = SpecDecodeFigures::parse(text).unwrap();
        assert_eq!((f.drafts, f.draft_tokens, f.accepted_tokens), (12, 40, 30));
        assert_eq!(f.acceptance_rate(), 0.75);
        assert_eq!(f.acceptance_length(), 3.5);
        let before = SpecDecodeFigures {
            drafts: 2,
            draft_tokens: 10,
            accepted_tokens: 5,
        };
        assert_eq!(f.since(&before).accepted_tokens, 25);
        assert_eq!(
            SpecDecodeFigures::parse("vllm:num_requests_running 1\n"),
            None
        );
    }
}
