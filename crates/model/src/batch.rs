//! What one forward pass computes: plain data, built by the caller (the engine's scheduler
//! output, or `generate`'s loop).
//!
//! A batch is a list of [`SeqChunk`]s. Each chunk is a run of consecutive tokens of one
//! sequence — a whole prompt, a prefill chunk, or one decode token — starting at `start_pos`
//! and attending to all earlier positions of that sequence through its block table. There is
//! no prefill or decode mode: a decode step is a chunk of length 1.

use tokenmill_kernels::attention::BlockRun;

/// Which logits a chunk wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last token's (to sample the next token).
    Last,
    /// Every token's (prompt logprobs, teacher forcing).
    All,
    /// No logits: every token's final hidden state (after the final norm), in
    /// [`Workspace::hidden`](crate::Workspace::hidden) — what embeddings pool.
    Hidden,
}

#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    /// Token ids, `[len]`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]` in its sequence; earlier positions are already in the cache.
    pub start_pos: usize,
    /// The sequence's KV blocks, covering at least `start_pos + tokens.len()` positions.
    pub block_table: &'a [u32],
    pub logits: LogitsWanted,
}

impl SeqChunk<'_> {
    /// Rows of logits this chunk produces.
    pub fn n_logits(&self) -> usize {
        match self.logits {
            LogitsWanted::None | LogitsWanted::Hidden => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => self.tokens.len(),
        }
    }

    /// Rows of final hidden states this chunk produces.
    pub fn n_hidden(&self) -> usize {
        match self.logits {
            LogitsWanted::Hidden => self.tokens.len(),
            _ => 0,
        }
    }
}

/// Checks a batch before a forward pass: every token inside the vocabulary, and every chunk's
/// block table covering its positions with blocks that exist in a cache of `num_blocks`
/// blocks of `block_size` positions.
pub(crate) fn validate_chunks(
    chunks: &[SeqChunk<'_>],
    vocab_size: usize,
    num_blocks: usize,
    block_size: usize,
) -> Result<(), crate::ModelError> {
    for c in chunks {
        if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(crate::ModelError::TokenOutOfRange {
                token: t,
                vocab_size,
            });
        }
        let end = c.start_pos + c.tokens.len();
        if end.div_ceil(block_size) > c.block_table.len()
            || c.block_table.iter().any(|&b| b as usize >= num_blocks)
        {
            return Err(crate::ModelError::BadBlockTable { positions: end });
        }
    }
    Ok(())
}

/// The batch's tokens (`tok_pos`: chunk, position per token) cut into runs that each write
/// into one cache block of `block_size` slots, in token order, into `out` (cleared): what
/// [`PagedKvMut::par_runs`](tokenmill_kernels::attention::PagedKvMut::par_runs) splits the
/// cache writes by.
pub(crate) fn block_runs(
    chunks: &[SeqChunk<'_>],
    tok_pos: &[(usize, usize)],
    block_size: usize,
    out: &mut Vec<BlockRun>,
) {
    out.clear();
    for (t, &(ci, pos)) in tok_pos.iter().enumerate() {
        let block = chunks[ci].block_table[pos / block_size];
        match out.last_mut() {
            // The same chunk's next slot of the same block.
            Some(r) if r.block == block && pos % block_size != 0 && r.t1 as usize == t => r.t1 += 1,
            _ => out.push(BlockRun {
                block,
                t0: t as u32,
                t1: t as u32 + 1,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_break_at_block_ends_and_between_chunks() {
        let (a_table, b_table) = ([7u32, 3, 9], [2u32, 4]);
        let chunk = |table, start_pos, tokens| SeqChunk {
            tokens,
            start_pos,
            block_table: table,
            logits: LogitsWanted::Last,
        };
        // Chunk 0 starts mid-block (positions 5..=10, 4 slots a block); chunk 1 writes
        // positions 3 and 4, either side of a block end.
        let chunks = [
            chunk(&a_table[..], 5, &[0; 6][..]),
            chunk(&b_table[..], 3, &[0; 2]),
        ];
        let tok_pos: Vec<(usize, usize)> =
            (5..11).map(|p| (0, p)).chain([(1, 3), (1, 4)]).collect();
        let mut runs = vec![BlockRun {
            block: 0,
            t0: 0,
            t1: 0,
        }];
        block_runs(&chunks, &tok_pos, 4, &mut runs);
        let run = |block, t0, t1| BlockRun { block, t0, t1 };
        assert_eq!(
            runs,
            [run(3, 0, 3), run(9, 3, 6), run(2, 6, 7), run(4, 7, 8)]
        );
        // One token, one run; none, none.
        block_runs(&chunks[1..], &[(0, 4)], 4, &mut runs);
        assert_eq!(runs, [run(4, 0, 1)]);
        block_runs(&chunks, &[], 4, &mut runs);
        assert!(runs.is_empty());
    }
}
