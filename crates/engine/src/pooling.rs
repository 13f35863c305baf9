//! Embedding requests: a prompt's final hidden states (after the final norm) pooled into one
//! vector instead of generating — vLLM's pooling requests, llama.cpp's `--pooling`.
//!
//! Such a request runs its prompt like any other (chunked, preemptible) but its chunks want
//! [`LogitsWanted::Hidden`](tokenmill_model::LogitsWanted::Hidden) rows instead of logits;
//! the runner folds each chunk's rows into the request's [`Pooler`] and, at the prompt's last
//! chunk, returns the vector; the scheduler then finishes the request without sampling.

/// How the prompt's hidden states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every prompt token (needs every token computed: no prefix-cache hits).
    Mean,
    /// The last prompt token's (what a causal model has read the whole prompt by).
    Last,
}

/// One request's pooled state across its prompt's chunks.
#[derive(Debug)]
pub(crate) struct Pooler {
    kind: Pooling,
    /// The sum of the rows so far (`Mean`), or the latest row (`Last`).
    acc: Vec<f32>,
}

impl Pooler {
    pub(crate) fn new(kind: Pooling) -> Pooler {
        Pooler {
            kind,
            acc: Vec::new(),
        }
    }

    /// Folds in a chunk's rows `[n, hidden]` of positions `start_pos..`. A chunk at
    /// position 0 starts over (a recompute after preemption).
    pub(crate) fn add(&mut self, start_pos: usize, rows: &[f32], hidden: usize) {
        if start_pos == 0 || self.acc.len() != hidden {
            self.acc.clear();
            self.acc.resize(hidden, 0.0);
        }
        match self.kind {
            Pooling::Mean => {
                for row in rows.chunks_exact(hidden) {
                    for (a, &x) in self.acc.iter_mut().zip(row) {
                        *a += x;
                    }
                }
            }
            Pooling::Last => {
                if let Some(row) = rows.chunks_exact(hidden).next_back() {
                    self.acc.copy_from_slice(row);
                }
            }
        }
    }

    /// The pooled vector of a prompt of `num_tokens` tokens, all folded in.
    pub(crate) fn finish(&mut self, num_tokens: usize) -> Vec<f32> {
        let mut v = std::mem::take(&mut self.acc);
        if self.kind == Pooling::Mean {
            let n = num_tokens.max(1) as f32;
            v.iter_mut().for_each(|x| *x /= n);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pools_across_chunks_and_restarts_at_position_zero() {
        let mut p = Pooler::new(Pooling::Mean);
        p.add(0, &[9.0, 9.0], 2); // a first try, preempted
        p.add(0, &[1.0, 2.0, 3.0, 4.0], 2);
        p.add(2, &[5.0, 6.0], 2);
        assert_eq!(p.finish(3), vec![3.0, 4.0]);
    }

    #[test]
    fn last_keeps_the_last_row_of_the_last_chunk() {
        let mut p = Pooler::new(Pooling::Last);
        p.add(4, &[1.0, 2.0, 3.0, 4.0], 2);
        p.add(6, &[5.0, 6.0], 2);
        assert_eq!(p.finish(7), vec![5.0, 6.0]);
    }
}
