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
