//! Model conversion to GGUF files that tokenmill and llama.cpp both load: what
//! `tokenmill quantize` does.
//!
//! * An F32/F16/BF16 GGUF → a GGUF of a [`TargetType`] ([`gguf_to_gguf`]), as
//!   `llama-quantize --pure` with llama.cpp's output-projection rule would write it.
//! * A Hugging Face Llama/Mistral/Qwen2 folder → a GGUF ([`hf`]), as `convert_hf_to_gguf.py`
//!   followed by `llama-quantize` would: llama.cpp's names and metadata, the Q/K permutation
//!   of the `llama` architecture ([`permute`]) and the tokenizer metadata ([`vocab`]).
//! * A Hugging Face DeepSeek V2/V3 folder → a `deepseek2` GGUF ([`hf_deepseek`]), as the
//!   converter's `DeepseekV2Model` writes it: `kv_b_proj` split per head into `attn_k_b` /
//!   `attn_v_b`, the routed experts stacked into 3-D tensors.
//!
//! Targets: `f32`, `f16` (every matrix converted), Q2_K, Q3_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K; which tensor gets which type is [`choose_type`] ([`types`]).
//!
//! # Layout
//!
//! One concept per module, imports pointing one way: [`types`] (target types and the
//! per-tensor type rules) and [`error`] depend on nothing here; `write` (row-by-row
//! conversion into a streamed [`tokenmill_gguf::GgufWriter`]) uses them; [`gguf_to_gguf`],
//! [`hf`] (which also uses [`permute`] and [`vocab`]) and [`hf_deepseek`] (which uses [`vocab`]
//! and `hf`'s folder name) plan a file and hand it to `write`; this file only picks
//! the path by the kind of input (a folder's kind by its config.json's `architectures`).
//!
//! The library prints nothing: the per-tensor [`TensorReport`]s go to the caller's callback
//! ([`quantize_with_progress`]) as each tensor is written and come back in the [`Report`].
//! Tensor bytes are byte-identical with llama-quantize's for the same types (the reference
//! quantizers of `tokenmill_kernels::quant`), whatever the thread count.

pub mod error;
mod gguf_to_gguf;
mod hf;
mod hf_deepseek;
pub mod permute;
pub mod types;
pub mod vocab;
mod write;

#[cfg(test)]
mod testing;

use std::path::Path;

pub use error::{ConvertError, Result};
pub use permute::permute_qk_rows;
pub use types::{TargetType, choose_type};
pub use vocab::tokenizer_metadata;
pub use write::{Report, TensorReport};

/// How to convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The type of the weight matrices.
    pub target: TargetType,
    /// Threads the rows of a tensor are split over (0 counts as 1).
    pub threads: usize,
    /// Quantize tensors that are already quantized (dequantized to f32 first), as
    /// llama-quantize's `--allow-requantize`; refused otherwise.
    pub allow_requantize: bool,
}

impl QuantizeOptions {
    /// `target` on every available core.
    pub fn new(target: TargetType) -> QuantizeOptions {
        QuantizeOptions {
            target,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            allow_requantize: false,
        }
    }
}

/// Converts `input` — a GGUF file, or a Hugging Face folder when it is a directory — to the
/// GGUF `output` (created or truncated).
pub fn quantize(input: &Path, output: &Path, options: &QuantizeOptions) -> Result<Report> {
    quantize_with_progress(input, output, options, |_| {})
}

/// [`quantize`], calling `on_tensor` after each tensor is written (in file order).
pub fn quantize_with_progress(
    input: &Path,
    output: &Path,
    options: &QuantizeOptions,
    mut on_tensor: impl FnMut(&TensorReport),
) -> Result<Report> {
    if input.is_dir() && is_deepseek_folder(input) {
        hf_deepseek::convert(input, output, options, &mut on_tensor)
    } else if input.is_dir() {
        hf::convert(input, output, options, &mut on_tensor)
    } else {
        gguf_to_gguf::convert(input, output, options, &mut on_tensor)
    }
}

/// Whether the folder's config.json names a DeepSeek V2/V3 class (anything unreadable goes
/// the Llama-family way, whose loader reports it).
fn is_deepseek_folder(dir: &Path) -> bool {
    let Ok(text) = tokenmill_model::read_config_json(dir) else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["architectures"][0]
        .as_str()
        .is_some_and(|a| a.starts_with("Deepseek"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_gguf::{GgmlType, GgufFile};

    #[test]
    fn quantize_picks_the_path_by_the_kind_of_input() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let opts = QuantizeOptions {
            target: TargetType::Q8_0,
            threads: 2,
            allow_requantize: false,
        };
        // A folder is exported (llama.cpp names, tokenizer metadata written)...
        let mut seen = 0;
        let report =
            quantize_with_progress(&testing::hf_fixture("mistral"), &out, &opts, |_| seen += 1)
                .unwrap();
        assert_eq!(seen, report.tensors.len());
        assert_eq!(report.output, out);
        let g = GgufFile::open(&out).unwrap();
        assert_eq!(g.metadata().get_str("tokenizer.ggml.model"), Some("gpt2"));
        assert_eq!(
            g.tensor("blk.0.ffn_down.weight").unwrap().ty,
            GgmlType::Q8_0
        );
        assert_eq!(
            report.bytes_out(),
            g.tensors().iter().map(|t| t.size).sum::<u64>()
        );
        // ...and a file is read as a GGUF.
        let tiny = tokenmill_testutil::fixtures_dir("tiny").join("llama.gguf");
        let report = quantize(&tiny, &out, &opts).unwrap();
        assert!(report.bytes_in() > 3 * report.bytes_out());
        let err = quantize(&dir.path().join("none"), &out, &opts).unwrap_err();
        assert!(matches!(err, ConvertError::OpenGguf { .. }), "{err:?}");
    }
}
