//! DeepSeek V2/V3 weights in a Hugging Face store, shape-checked at load.
//!
//! Matrices stay mapped ([`Linear`]); norms and the router are dequantized once.
//! `kv_b_proj` (rows `h·(nope+v) ..+nope` are `W_UK_h`, the next `v` rows `W_UV_h`, each
//! `[·, kv_lora_rank]`) becomes MLA's per-head matrices for weight absorption
//! ([`HeadMatrices::from_kv_b`]: `W_UK_hᵀ` transposed once at load, `W_UV_h` as it is), and
//! is also kept whole as f32 for the expanded form that prefill runs ([`expansion_matrix`]).

use tokenmill_kernels::matmul::QMatrix;

use super::config::DeepSeekConfig;
use crate::store::{Linear, WeightStore};
use crate::{ModelError, Naming};

/// One small matrix per attention head: MLA's absorbed `W_UK_hᵀ` (`[r, nope]` a head) or
/// `W_UV_h` (`[v, r]`), run over the batch by the kernels' `matmul_per_head`.
pub enum HeadMatrices {
    /// Views of a stored `[H, rows, cols]` tensor, one a head (a GGUF's `attn_k_b` /
    /// `attn_v_b`, in their quantized type).
    Stored(Vec<Linear>),
    /// `[H, rows, cols]` f32 made at load from a whole `kv_b_proj`.
    Owned {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
}

impl HeadMatrices {
    /// Head `h`'s matrix.
    pub fn view<'a>(&'a self, h: usize, store: &'a WeightStore) -> QMatrix<'a> {
        match self {
            HeadMatrices::Stored(heads) => heads[h].view(store),
            HeadMatrices::Owned { data, rows, cols } => {
                QMatrix::from_f32(*rows, *cols, &data[h * rows * cols..(h + 1) * rows * cols])
            }
        }
    }

    /// `(W_UKᵀ, W_UV)` per head, `[H, r, nope]` and `[H, v, r]`, from a whole `kv_b`
    /// `[H·(nope + v), r]`.
    pub fn from_kv_b(c: &DeepSeekConfig, kv_b: &[f32]) -> (HeadMatrices, HeadMatrices) {
        let (nh, nope, v, r) = (c.n_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
        let (mut k_b, mut v_b) = (vec![0f32; nh * r * nope], vec![0f32; nh * v * r]);
        for (hd, head) in kv_b.chunks_exact((nope + v) * r).enumerate() {
            let (w_uk, w_uv) = head.split_at(nope * r); // [nope, r], [v, r]
            let kt = &mut k_b[hd * r * nope..(hd + 1) * r * nope]; // [r, nope]
            for (d, row) in w_uk.chunks_exact(r).enumerate() {
                row.iter()
                    .enumerate()
                    .for_each(|(j, &w)| kt[j * nope + d] = w);
            }
            v_b[hd * v * r..(hd + 1) * v * r].copy_from_slice(w_uv);
        }
        let owned = |data, rows, cols| HeadMatrices::Owned { data, rows, cols };
        (owned(k_b, r, nope), owned(v_b, v, r))
    }
}

/// `kv_b_proj` `[H·(nope + v), r]` as f32 (head `h`'s rows: `W_UK_h` `[nope, r]`, then
/// `W_UV_h` `[v, r]`), rebuilt from the per-head matrices in whatever type they are stored:
/// the matrix that expands cached latents into per-head keys and values
/// (`super::mla_expanded`). A GGUF stores `W_UK_h` transposed, so this is the one place its
/// rows are turned back. Costs `H·(nope + v)·r·4` bytes a layer (8 MiB at V2-Lite's widths).
pub fn expansion_matrix(
    c: &DeepSeekConfig,
    k_b: &HeadMatrices,
    v_b: &HeadMatrices,
    store: &WeightStore,
) -> Vec<f32> {
    let (nh, nope, v, r) = (c.n_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    let mut kv_b = vec![0f32; nh * (nope + v) * r];
    let mut row = vec![0f32; nope];
    for (h, head) in kv_b.chunks_exact_mut((nope + v) * r).enumerate() {
        let (w_uk, w_uv) = head.split_at_mut(nope * r);
        let k = k_b.view(h, store); // [r, nope]
        for j in 0..r {
            k.dequantize_row_into(j, &mut row);
            for (d, &w) in row.iter().enumerate() {
                w_uk[d * r + j] = w;
            }
        }
        let vm = v_b.view(h, store); // [v, r]
        for (i, dst) in w_uv.chunks_exact_mut(r).enumerate() {
            vm.dequantize_row_into(i, dst);
        }
    }
    kv_b
}

pub enum QProj {
    Full(Linear),
    /// `q = W_qb · rms_norm(W_qa · x)`
    Lora {
        a: Linear,
        norm: Vec<f32>,
        b: Linear,
    },
}

pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

pub struct Moe {
    /// `[n_experts, hidden]`
    pub router: Vec<f32>,
    /// V3's `e_score_correction_bias` `[n_experts]`.
    pub bias: Option<Vec<f32>>,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: QProj,
    /// `[kv_lora_rank + rope, hidden]`
    pub kv_a: Linear,
    pub kv_a_norm: Vec<f32>,
    /// `W_UK_hᵀ` `[kv_lora_rank, nope]` and `W_UV_h` `[v, kv_lora_rank]` per head.
    pub k_b: HeadMatrices,
    pub v_b: HeadMatrices,
    /// `kv_b_proj` `[H·(nope + v), kv_lora_rank]` in f32 ([`expansion_matrix`]).
    pub kv_b: Vec<f32>,
    pub o: Linear,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

pub struct Weights {
    pub embed: Linear,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    pub lm_head: Linear,
}

fn mlp(s: &WeightStore, p: &str, h: usize, f: usize) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: s.linear(&format!("{p}.gate_proj.weight"), f, h)?,
        up: s.linear(&format!("{p}.up_proj.weight"), f, h)?,
        down: s.linear(&format!("{p}.down_proj.weight"), h, f)?,
    })
}

fn ffn(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Ffn, ModelError> {
    let p = format!("model.layers.{l}.mlp");
    let h = c.hidden;
    if !c.is_moe(l) {
        return Ok(Ffn::Dense(mlp(s, &p, h, c.ffn_hidden)?));
    }
    let e = c.n_routed_experts;
    let experts = (0..e)
        .map(|i| mlp(s, &format!("{p}.experts.{i}"), h, c.moe_hidden))
        .collect::<Result<_, _>>()?;
    let shared = (c.n_shared_experts > 0)
        .then(|| {
            mlp(
                s,
                &format!("{p}.shared_experts"),
                h,
                c.moe_hidden * c.n_shared_experts,
            )
        })
        .transpose()?;
    Ok(Ffn::Moe(Moe {
        router: s.dense(&format!("{p}.gate.weight"), &[e, h])?,
        bias: s.dense_opt(&format!("{p}.gate.e_score_correction_bias"), &[e])?,
        experts,
        shared,
    }))
}

fn layer(s: &WeightStore, c: &DeepSeekConfig, l: usize) -> Result<Layer, ModelError> {
    let n = |k: &str| format!("model.layers.{l}.{k}");
    let h = c.hidden;
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    let q_out = c.n_heads * qk;
    let q = match c.q_lora_rank {
        None => QProj::Full(s.linear(&n("self_attn.q_proj.weight"), q_out, h)?),
        Some(r) => QProj::Lora {
            a: s.linear(&n("self_attn.q_a_proj.weight"), r, h)?,
            norm: s.dense(&n("self_attn.q_a_layernorm.weight"), &[r])?,
            b: s.linear(&n("self_attn.q_b_proj.weight"), q_out, r)?,
        },
    };
    let r = c.kv_lora_rank;
    let kv_b = s.dense(
        &n("self_attn.kv_b_proj.weight"),
        &[c.n_heads * (c.qk_nope_head_dim + c.v_head_dim), r],
    )?;
    let (k_b, v_b) = HeadMatrices::from_kv_b(c, &kv_b);
    Ok(Layer {
        kv_b,
        attn_norm: s.dense(&n("input_layernorm.weight"), &[h])?,
        q,
        kv_a: s.linear(&n("self_attn.kv_a_proj_with_mqa.weight"), c.latent_dim(), h)?,
        kv_a_norm: s.dense(&n("self_attn.kv_a_layernorm.weight"), &[r])?,
        k_b,
        v_b,
        o: s.linear(&n("self_attn.o_proj.weight"), h, c.n_heads * c.v_head_dim)?,
        ffn_norm: s.dense(&n("post_attention_layernorm.weight"), &[h])?,
        ffn: ffn(s, c, l)?,
    })
}

impl Weights {
    pub fn load(s: &WeightStore, c: &DeepSeekConfig) -> Result<Weights, ModelError> {
        let names = Naming::Hf;
        let embed = s.linear(&names.global("token_embd"), c.vocab_size, c.hidden)?;
        let layers = (0..c.n_layers)
            .map(|l| layer(s, c, l))
            .collect::<Result<_, _>>()?;
        let head = names.global("output");
        let lm_head = match s.find(&head)? {
            Some(_) => s.linear(&head, c.vocab_size, c.hidden)?,
            None => embed.clone(),
        };
        Ok(Weights {
            embed,
            layers,
            norm: s.dense(&names.global("output_norm"), &[c.hidden])?,
            lm_head,
        })
    }
}
