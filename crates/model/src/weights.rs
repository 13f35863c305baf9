//! The weights of a Llama-family model, located in the GGUF file and shape-checked at load.
//!
//! Matrices stay in the file's memory map in their native quantized format ([`Linear`] only
//! records where); norms and biases are small and are dequantized to f32 once.

use tokenmill_gguf::{GgufFile, TensorInfo};
use tokenmill_kernels::matmul::QMatrix;
use tokenmill_kernels::quant::dequantize_row;

use crate::{ModelConfig, ModelError};

/// A linear layer's weight `[rows = out features, cols = in features]`, in the file.
#[derive(Clone, Debug)]
pub struct Linear {
    info: TensorInfo,
    pub rows: usize,
    pub cols: usize,
}

impl Linear {
    /// The matrix view over `file`'s bytes.
    pub fn view<'a>(&self, file: &'a GgufFile) -> QMatrix<'a> {
        QMatrix {
            ty: self.info.ty,
            rows: self.rows,
            cols: self.cols,
            data: file.tensor_data(&self.info),
        }
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    /// Qwen2's Q/K/V biases.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Linear,
    pub w_up: Linear,
    pub w_down: Linear,
}

pub struct Weights {
    pub token_embd: Linear,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or the token embedding when tied.
    pub output: Linear,
}

impl Weights {
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, ModelError> {
        let (h, q_dim, kv_dim) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.kv_dim());
        let token_embd = linear(file, "token_embd.weight", cfg.vocab_size, h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias = |s: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
                match file.tensor(&n(s)) {
                    Some(_) => vector(file, &n(s), len).map(Some),
                    None => Ok(None),
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm.weight"), h)?,
                wq: linear(file, &n("attn_q.weight"), q_dim, h)?,
                wk: linear(file, &n("attn_k.weight"), kv_dim, h)?,
                wv: linear(file, &n("attn_v.weight"), kv_dim, h)?,
                bq: bias("attn_q.bias", q_dim)?,
                bk: bias("attn_k.bias", kv_dim)?,
                bv: bias("attn_v.bias", kv_dim)?,
                wo: linear(file, &n("attn_output.weight"), h, q_dim)?,
                ffn_norm: vector(file, &n("ffn_norm.weight"), h)?,
                w_gate: linear(file, &n("ffn_gate.weight"), cfg.ffn_hidden, h)?,
                w_up: linear(file, &n("ffn_up.weight"), cfg.ffn_hidden, h)?,
                w_down: linear(file, &n("ffn_down.weight"), h, cfg.ffn_hidden)?,
            });
        }
        let output = match file.tensor("output.weight") {
            Some(_) => linear(file, "output.weight", cfg.vocab_size, h)?,
            None => token_embd.clone(),
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: vector(file, "output_norm.weight", h)?,
            output,
        })
    }
}

fn find<'a>(file: &'a GgufFile, name: &str) -> Result<&'a TensorInfo, ModelError> {
    file.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })
}

/// A 2-D weight of `rows × cols` (ggml dims `[cols, rows]`).
fn linear(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
    let info = find(file, name)?;
    let want = [cols as u64, rows as u64];
    if info.dims != want {
        return Err(ModelError::BadShape {
            name: name.into(),
            expected: want.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(Linear {
        info: info.clone(),
        rows,
        cols,
    })
}

/// A 1-D tensor of `len` values, dequantized to f32.
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let info = find(file, name)?;
    if info.dims != [len as u64] {
        return Err(ModelError::BadShape {
            name: name.into(),
            expected: vec![len as u64],
            found: info.dims.clone(),
        });
    }
    let mut out = vec![0f32; len];
    dequantize_row(info.ty, file.tensor_data(info), &mut out);
    Ok(out)
}
