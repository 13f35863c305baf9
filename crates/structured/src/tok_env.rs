//! The tokenizer as llguidance sees it: every token's bytes in a trie (special tokens behind
//! the 0xFF marker byte, so no grammar text can spell them), EOS, and a tokenize function.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tokenmill_tokenizer::Tokenizer;

use crate::error::StructuredError;

struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text through the real tokenizer; bytes that are not UTF-8 greedily through the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Builds llguidance's view of `tokenizer`. EOS is the tokenizer's EOS, else its first stop
/// token.
pub fn tok_env(tokenizer: &Tokenizer) -> Result<TokEnv, StructuredError> {
    let vocab = tokenizer.vocab_size();
    let words = token_words(tokenizer)?;
    let eos = tokenizer
        .eos_token_id()
        .or_else(|| tokenizer.stop_token_ids().first().copied())
        .ok_or_else(|| StructuredError::Tokenizer("the tokenizer has no EOS token".into()))?;
    let mut info = TokRxInfo::new(vocab as u32, eos);
    info.tok_bos = tokenizer.bos_token_id();
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(Env {
        trie,
        tokenizer: tokenizer.clone(),
    }))
}

/// Each token's bytes; a special token is `0xFF` followed by its text.
fn token_words(tokenizer: &Tokenizer) -> Result<Vec<Vec<u8>>, StructuredError> {
    let vocab = tokenizer.vocab_size();
    // Tokenizers whose pieces are not known byte by byte: llguidance reads tokenizer.json.
    let from_json = if tokenizer.token_bytes(0).is_none() {
        let json = tokenizer
            .hf_tokenizer()
            .to_string(false)
            .map_err(|e| StructuredError::Tokenizer(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| StructuredError::Tokenizer(e.to_string()))?;
        Some(
            llguidance::token_bytes_from_tokenizer_json(&json)
                .map_err(|e| StructuredError::Tokenizer(e.to_string()))?,
        )
    } else {
        None
    };
    let mut words = Vec::with_capacity(vocab);
    for id in 0..vocab as u32 {
        let word = if tokenizer.is_special(id) {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend(tokenizer.token_to_piece(id).unwrap_or_default().bytes());
            w
        } else if let Some(b) = tokenizer.token_bytes(id) {
            b.to_vec()
        } else {
            from_json
                .as_ref()
                .and_then(|all| all.get(id as usize).cloned())
                .unwrap_or_default()
        };
        words.push(word);
    }
    Ok(words)
}
