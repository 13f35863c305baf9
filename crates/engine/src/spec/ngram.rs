//! Prompt lookup: the n-gram proposer. No model — a request's own tokens are the draft.
//!
//! For `n` from `max_n` down to `min_n`, the last `n` tokens are searched for earlier in the
//! sequence (latest occurrence first: nearby text predicts best); the first hit proposes the
//! up to `k` tokens that followed it. Text that is being rewritten, quoted, or code being
//! edited repeats its input, and these proposals are then mostly right.
//!
//! Cost: `O(len · max_n)` comparisons per request and step, no allocation (the proposal goes
//! into a buffer the request keeps).

/// Writes into `out` (cleared first) up to `k` tokens proposed to follow `tokens`.
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = tokens.len();
    if k == 0 || min_n == 0 {
        return;
    }
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        // Start of a match strictly before the suffix itself, latest first.
        let found = (0..len - n).rev().find(|&s| &tokens[s..s + n] == pattern);
        if let Some(s) = found {
            let from = s + n;
            out.extend_from_slice(&tokens[from..len.min(from + k)]);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
        let mut out = vec![99; 3];
        propose(tokens, min_n, max_n, k, &mut out);
        out
    }

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        // Suffix [3 4] occurs at 2 and 6; the latest (6) is followed by 9 9.
        let t = [1, 2, 3, 4, 5, 6, 3, 4, 9, 9, 3, 4];
        assert_eq!(run(&t, 2, 4, 2), [9, 9]);
        // A 3-gram [9 3 4] is not earlier; [3 4] still matches. With min 3, nothing does.
        assert_eq!(run(&t, 3, 4, 2), Vec::<u32>::new());
        // The longer match wins over a later shorter one: [2 3 4] at 1 → 5 6 7.
        let t = [1, 2, 3, 4, 5, 6, 7, 3, 4, 8, 2, 3, 4];
        assert_eq!(run(&t, 2, 3, 3), [5, 6, 7]);
    }

    #[test]
    fn the_proposal_stops_at_the_end_and_may_run_into_the_suffix() {
        // Period-2 text: the match right before the suffix proposes the suffix itself.
        let t = [7, 8, 7, 8, 7, 8];
        assert_eq!(run(&t, 2, 2, 4), [7, 8]);
        assert_eq!(run(&t, 2, 2, 1), [7]);
    }

    #[test]
    fn short_or_unmatched_sequences_and_zero_k_propose_nothing() {
        assert!(run(&[], 1, 3, 4).is_empty());
        assert!(run(&[5], 1, 3, 4).is_empty());
        assert!(run(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        assert!(run(&[1, 1, 1], 1, 3, 0).is_empty());
        assert_eq!(run(&[1, 1], 1, 3, 4), [1]);
    }
}
