//! The Q/K row permutation of llama.cpp's `llama` architecture.
//!
//! HF checkpoints rotate halves of each head (NeoX); llama.cpp's `llama` graph rotates
//! adjacent pairs, so the converter permutes the rows of `attn_q`/`attn_k` (and their biases)
//! within each head: GGUF row `2i + j` of a head is HF row `j · head_dim / 2 + i`
//! (`LlamaModel.permute` in `convert_hf_to_gguf.py`: reshape `(heads, 2, hd/2, ·)`, swap axes
//! 1 and 2). Pairs `(i, i + hd/2)` become `(2i, 2i + 1)`: the same rotation, so the logits
//! equal the folder's up to float summation order. The permutation moves whole rows, so it
//! commutes with row-wise quantization and is applied to the source bytes.

use crate::error::{ConvertError, Result};

/// Checks that `rows` rows of the tensor `name` split into `heads` heads of even size.
pub fn check_head_split(name: &str, rows: usize, heads: usize) -> Result<()> {
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ConvertError::BadHeadSplit {
            name: name.to_owned(),
            rows,
            heads,
        });
    }
    Ok(())
}

/// The rows of a `rows × row_bytes` tensor (`src`) with each of `heads` heads' rows reordered
/// from HF's halves layout to llama.cpp's interleaved one (see the module doc). The split
/// must have passed [`check_head_split`].
pub fn permute_qk_rows(src: &[u8], rows: usize, heads: usize) -> Vec<u8> {
    let row_bytes = src.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(src.len());
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = h * head_dim + j * half + i;
                out.extend_from_slice(&src[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse, written the other way round: HF row `j · hd/2 + i` of a head is GGUF row
    /// `2i + j`.
    fn unpermute(src: &[u8], rows: usize, heads: usize) -> Vec<u8> {
        let (row_bytes, hd) = (src.len() / rows, rows / heads);
        let mut out = vec![0u8; src.len()];
        for h in 0..heads {
            for j in 0..2 {
                for i in 0..hd / 2 {
                    let (to, from) = (h * hd + j * hd / 2 + i, h * hd + 2 * i + j);
                    out[to * row_bytes..(to + 1) * row_bytes]
                        .copy_from_slice(&src[from * row_bytes..(from + 1) * row_bytes]);
                }
            }
        }
        out
    }

    #[test]
    fn permutation_interleaves_each_heads_halves() {
        // 2 heads of 4 rows, 1 byte per row: head rows [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let src: Vec<u8> = (0..8).collect();
        assert_eq!(permute_qk_rows(&src, 8, 2), [0, 2, 1, 3, 4, 6, 5, 7]);
        // Rows of several bytes move whole.
        let src: Vec<u8> = (0..12).collect();
        assert_eq!(
            permute_qk_rows(&src, 4, 1),
            [0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]
        );
    }

    #[test]
    fn permutation_matches_the_converters_reshape() {
        // LlamaModel.permute: w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(w.shape).
        let (heads, hd, cols) = (3, 8, 2);
        let src: Vec<u8> = (0..(heads * hd * cols) as u8).collect();
        let got = permute_qk_rows(&src, heads * hd, heads);
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    for c in 0..cols {
                        let out = ((h * hd / 2 + i) * 2 + j) * cols + c;
                        let inp = ((h * 2 + j) * hd / 2 + i) * cols + c;
                        assert_eq!(got[out], src[inp]);
                    }
                }
            }
        }
    }

    #[test]
    fn unpermuting_gives_the_matrix_back() {
        // 4 heads of 6 rows of 3 bytes; a head of 2 rows is already interleaved (identity).
        let src: Vec<u8> = (0..72).collect();
        let permuted = permute_qk_rows(&src, 24, 4);
        assert_ne!(permuted, src);
        assert_eq!(unpermute(&permuted, 24, 4), src);
        assert_eq!(permute_qk_rows(&src, 24, 12), src);
    }

    #[test]
    fn head_splits_must_be_whole_and_even() {
        check_head_split("q", 64, 4).unwrap();
        for (rows, heads) in [(64, 3), (12, 4), (8, 0)] {
            match check_head_split("blk.0.attn_q.weight", rows, heads) {
                Err(ConvertError::BadHeadSplit {
                    name,
                    rows: r,
                    heads: h,
                }) => {
                    assert_eq!((name.as_str(), r, h), ("blk.0.attn_q.weight", rows, heads));
                }
                other => panic!("{rows}/{heads}: {other:?}"),
            }
        }
    }
}
