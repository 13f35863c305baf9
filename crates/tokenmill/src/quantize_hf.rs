//! `tokenmill quantize HF_DIR OUT.gguf --type T`: a Hugging Face Llama-family folder
//! (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM: `config.json`, safetensors —
//! sharded or not — `tokenizer.json`, `tokenizer_config.json`) to a GGUF that tokenmill and
//! llama.cpp load, as llama.cpp's `convert_hf_to_gguf.py` followed by `llama-quantize` would
//! write it.
//!
//! # What is written
//!
//! * Architecture `llama` for Llama and Mistral, `qwen2` for Qwen2, with the keys the
//!   converter writes: `context_length`, `embedding_length`, `block_count`,
//!   `feed_forward_length`, `attention.head_count(_kv)`, `attention.key_length` /
//!   `value_length`, `rope.freq_base`,
//!   `rope.scaling.type/factor` (linear), `attention.layer_norm_rms_epsilon`, `vocab_size`,
//!   `rope.dimension_count`, `general.name/file_type/quantization_version`; Llama 3 RoPE
//!   scaling becomes the `rope_freqs.weight` tensor (F32, the factors `hf_config.rs` computes
//!   like the converter's `generate_extra_tensors`). The values come from the parsed
//!   [`ModelConfig`], so the GGUF describes exactly the model tokenmill runs from the folder.
//! * The tokenizer metadata of [`crate::hf_vocab`].
//! * Tensors under llama.cpp's names (the model crate's [`Naming`] maps them): `token_embd`,
//!   `blk.N.{attn_norm, attn_q, attn_k, attn_v (+ .bias when present), attn_output,
//!   ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, and `output` unless the
//!   embedding is tied (no `lm_head.weight`).
//! * **Q/K permutation (`llama` only)**: HF checkpoints rotate halves of each head (NeoX);
//!   llama.cpp's `llama` graph rotates adjacent pairs, so the converter permutes the rows of
//!   `attn_q`/`attn_k` (and their biases) within each head: GGUF row `2i + j` of a head is HF
//!   row `j · head_dim / 2 + i` (`LlamaModel.permute`: reshape `(heads, 2, hd/2, ·)`, swap
//!   axes 1 and 2). Pairs `(i, i + hd/2)` become `(2i, 2i + 1)`: the same rotation, so the
//!   logits equal the folder's up to float summation order. Qwen2 is NeoX in llama.cpp too
//!   and is not permuted.
//! * Types: 1-D tensors (norms, biases, `rope_freqs`) are F32, as the converter writes them;
//!   matrices get [`choose_type`]'s type for the target (llama-quantize's rules; `f32`/`f16`
//!   convert every matrix). Permutation moves whole rows, so it commutes with the row-wise
//!   quantization and is done on the source bytes.
//!
//! The folder is loaded as a model first (`LlamaModel::load_hf_dir`), so a config that does
//! not match its weights is refused before anything is written.

use std::borrow::Cow;
use std::path::Path;

use anyhow::{Context, bail};
use tokenmill_gguf::{GgmlType, TensorInfo, TensorSpec, Value};
use tokenmill_model::{Arch, LlamaModel, ModelConfig, Naming, RopeScaling, TensorRef, WeightStore};

use crate::quantize::{QuantType, choose_type, write_gguf};

/// Where a GGUF tensor's source bytes come from.
enum Source {
    /// A folder tensor; `permute_heads`: the Q/K row permutation over that many heads.
    Store {
        t: TensorRef,
        permute_heads: Option<usize>,
    },
    /// Generated values (`rope_freqs.weight`).
    F32(Vec<f32>),
}

struct Tensor {
    /// The source as a GGUF tensor: llama.cpp name, GGUF dims (innermost first), source type.
    info: TensorInfo,
    source: Source,
}

/// GGUF rows of a `rows × row_bytes` tensor with each of `heads` heads' rows reordered from
/// HF's halves layout to llama.cpp's interleaved one (see the module doc).
pub fn permute_rows(src: &[u8], rows: usize, heads: usize) -> Vec<u8> {
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

fn tensor(
    store: &WeightStore,
    gguf: String,
    hf: &str,
    permute: Option<usize>,
) -> anyhow::Result<Tensor> {
    let t = store.get(hf)?;
    let info = TensorInfo {
        name: gguf,
        dims: t.shape.iter().rev().copied().collect(),
        ty: t.ty,
        offset: 0,
        size: 0,
    };
    if let Some(heads) = permute {
        let rows = t.shape[0] as usize;
        if !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
            bail!("{hf}: {rows} rows do not split into {heads} heads of even size");
        }
    }
    Ok(Tensor {
        info,
        source: Source::Store {
            t,
            permute_heads: permute,
        },
    })
}

/// The tensors of the GGUF, in the converter's order.
fn tensors(store: &WeightStore, cfg: &ModelConfig) -> anyhow::Result<Vec<Tensor>> {
    let (g, h) = (Naming::Gguf, Naming::Hf);
    let permute = cfg.arch != Arch::Qwen2;
    let mut out = vec![tensor(
        store,
        g.global("token_embd"),
        &h.global("token_embd"),
        None,
    )?];
    if let RopeScaling::FreqFactors(ff) = &cfg.rope_scaling {
        let info = TensorInfo {
            name: "rope_freqs.weight".into(),
            dims: vec![ff.len() as u64],
            ty: GgmlType::F32,
            offset: 0,
            size: 0,
        };
        out.push(Tensor {
            info,
            source: Source::F32(ff.clone()),
        });
    }
    for i in 0..cfg.n_layers {
        for name in [
            "attn_norm",
            "attn_q",
            "attn_q.bias",
            "attn_k",
            "attn_k.bias",
            "attn_v",
            "attn_v.bias",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            let hf = h.layer(i, name);
            if name.ends_with(".bias") && store.find(&hf)?.is_none() {
                continue;
            }
            let heads = match name.split('.').next() {
                Some("attn_q") if permute => Some(cfg.n_heads),
                Some("attn_k") if permute => Some(cfg.n_kv_heads),
                _ => None,
            };
            out.push(tensor(store, g.layer(i, name), &hf, heads)?);
        }
    }
    out.push(tensor(
        store,
        g.global("output_norm"),
        &h.global("output_norm"),
        None,
    )?);
    if store.find(&h.global("output"))?.is_some() {
        out.push(tensor(
            store,
            g.global("output"),
            &h.global("output"),
            None,
        )?);
    }
    Ok(out)
}

/// The architecture metadata (see the module doc) for `cfg`, named `name`.
fn arch_metadata(cfg: &ModelConfig, name: &str, target: QuantType) -> Vec<(String, Value)> {
    let arch = if cfg.arch == Arch::Qwen2 {
        "qwen2"
    } else {
        "llama"
    };
    let u = |v: usize| Value::U32(v as u32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.type".into(), Value::String("model".into())),
        ("general.name".into(), Value::String(name.into())),
    ];
    let mut keys: Vec<(&str, Value)> = vec![
        ("block_count", u(cfg.n_layers)),
        ("context_length", u(cfg.context_length)),
        ("embedding_length", u(cfg.hidden)),
        ("feed_forward_length", u(cfg.ffn_hidden)),
        ("attention.head_count", u(cfg.n_heads)),
        ("attention.head_count_kv", u(cfg.n_kv_heads)),
        ("rope.freq_base", Value::F32(cfg.rope_theta)),
        ("attention.layer_norm_rms_epsilon", Value::F32(cfg.rms_eps)),
    ];
    keys.push(("attention.key_length", u(cfg.head_dim)));
    keys.push(("attention.value_length", u(cfg.head_dim)));
    if let RopeScaling::Linear { factor } = cfg.rope_scaling {
        keys.push(("rope.scaling.type", Value::String("linear".into())));
        keys.push(("rope.scaling.factor", Value::F32(factor)));
    }
    keys.push(("vocab_size", u(cfg.vocab_size)));
    keys.push(("rope.dimension_count", u(cfg.rope_dim)));
    md.extend(keys.into_iter().map(|(k, v)| (format!("{arch}.{k}"), v)));
    md.push(("general.file_type".into(), Value::U32(target.llama_ftype())));
    md.push(("general.quantization_version".into(), Value::U32(2)));
    md
}

/// The bytes of `t` in GGUF row order.
fn source_bytes<'a>(store: &'a WeightStore, t: &'a Tensor) -> Cow<'a, [u8]> {
    match &t.source {
        Source::Store {
            t: r,
            permute_heads: None,
        } => Cow::Borrowed(store.data(r)),
        Source::Store {
            t: r,
            permute_heads: Some(heads),
        } => Cow::Owned(permute_rows(store.data(r), r.shape[0] as usize, *heads)),
        Source::F32(v) => Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    }
}

/// Exports the folder `dir` to `out` with matrices of `target` (see the module doc).
pub fn run(dir: &Path, out: &Path, target: QuantType, threads: usize) -> anyhow::Result<()> {
    // Loading the model checks the config and every weight's shape against it.
    let model =
        LlamaModel::load_hf_dir(dir).with_context(|| format!("loading {}", dir.display()))?;
    let (cfg, store) = (model.config(), model.store());
    if cfg.arch == Arch::Qwen2 && matches!(cfg.rope_scaling, RopeScaling::FreqFactors(_)) {
        bail!(
            "Llama 3 RoPE scaling on a Qwen2 model has no GGUF form (llama.cpp's qwen2 has no rope_freqs)"
        );
    }
    let tensors = tensors(store, cfg)?;
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let mut meta = arch_metadata(cfg, &name, target);
    meta.extend(crate::hf_vocab::tokenizer_metadata(dir, cfg.vocab_size)?);
    let tied = tensors.iter().all(|t| t.info.name != "output.weight");
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|t| TensorSpec {
            name: t.info.name.clone(),
            dims: t.info.dims.clone(),
            ty: match t.info.dims.len() {
                1 => GgmlType::F32,
                _ => choose_type(&t.info, target, tied),
            },
        })
        .collect();
    let infos: Vec<TensorInfo> = tensors.iter().map(|t| t.info.clone()).collect();
    write_gguf(
        out,
        &meta,
        &infos,
        &specs,
        |i| source_bytes(store, &tensors[i]),
        threads,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_each_heads_halves() {
        // 2 heads of 4 rows, 1 byte per row: head rows [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let src: Vec<u8> = (0..8).collect();
        assert_eq!(permute_rows(&src, 8, 2), [0, 2, 1, 3, 4, 6, 5, 7]);
        // Rows of several bytes move whole.
        let src: Vec<u8> = (0..12).collect();
        assert_eq!(
            permute_rows(&src, 4, 1),
            [0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]
        );
    }

    #[test]
    fn permutation_matches_the_converters_reshape() {
        // LlamaModel.permute: w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2).reshape(w.shape).
        let (heads, hd, cols) = (3, 8, 2);
        let src: Vec<u8> = (0..(heads * hd * cols) as u8).collect();
        let got = permute_rows(&src, heads * hd, heads);
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
}
