//! [`Model`]: the architectures behind one type for the engine — a Llama-family model over
//! the paged K/V cache, or a DeepSeek MLA+MoE model over the latent cache — and [`ModelKv`],
//! the matching KV storage. A concrete enum, not a trait: two variants, matched in a few
//! places.

use std::path::Path;

use crate::deepseek::{DeepSeekModel, LatentKvCache};
use crate::{KvCache, KvDtype, KvShape, LlamaModel, ModelError, SeqChunk, Workspace};

pub enum Model {
    Llama(LlamaModel),
    DeepSeek(DeepSeekModel),
}

/// KV storage of a [`Model`], made by [`Model::kv_cache`].
pub enum ModelKv {
    Paged(KvCache),
    Latent(LatentKvCache),
}

impl From<LlamaModel> for Model {
    fn from(m: LlamaModel) -> Model {
        Model::Llama(m)
    }
}

impl From<DeepSeekModel> for Model {
    fn from(m: DeepSeekModel) -> Model {
        Model::DeepSeek(m)
    }
}

impl Model {
    /// A GGUF file (DeepSeek by `general.architecture = deepseek2`, else the Llama family),
    /// or a Hugging Face folder (DeepSeek V2/V3 by `config.json`'s `architectures`, else the
    /// Llama family).
    pub fn open(path: &Path) -> Result<Model, ModelError> {
        if path.is_dir() {
            let cfg = crate::read_config_json(path)?;
            let v: serde_json::Value = serde_json::from_str(&cfg)
                .map_err(|e| ModelError::BadConfig(format!("config.json: {e}")))?;
            let arch = v["architectures"][0].as_str().unwrap_or("");
            if arch.starts_with("Deepseek") {
                return Ok(Model::DeepSeek(DeepSeekModel::load_hf_dir(path)?));
            }
            return Ok(Model::Llama(LlamaModel::open(path)?));
        }
        Model::from_gguf(tokenmill_gguf::GgufFile::open(path)?)
    }

    /// The model of an open GGUF file, by its `general.architecture`.
    pub fn from_gguf(file: tokenmill_gguf::GgufFile) -> Result<Model, ModelError> {
        if file.architecture() == Some(crate::deepseek::GGUF_ARCH) {
            return Ok(Model::DeepSeek(DeepSeekModel::from_gguf(file)?));
        }
        Ok(Model::Llama(LlamaModel::load(file)?))
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Model::Llama(m) => m.config().vocab_size,
            Model::DeepSeek(m) => m.config().vocab_size,
        }
    }

    /// Width of the residual stream (what an embedding of this model holds).
    pub fn hidden_size(&self) -> usize {
        match self {
            Model::Llama(m) => m.config().hidden,
            Model::DeepSeek(m) => m.config().hidden,
        }
    }

    pub fn context_length(&self) -> usize {
        match self {
            Model::Llama(m) => m.config().context_length,
            Model::DeepSeek(m) => m.config().context_length,
        }
    }

    pub fn kv_shape(&self) -> KvShape {
        match self {
            Model::Llama(m) => {
                let c = m.config();
                KvShape::Standard {
                    n_layers: c.n_layers,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                }
            }
            Model::DeepSeek(m) => {
                let c = m.config();
                KvShape::Latent {
                    n_layers: c.n_layers,
                    kv_lora_rank: c.kv_lora_rank,
                    rope_dim: c.qk_rope_head_dim,
                    expanded_dim: c.expanded_kv_dim(),
                }
            }
        }
    }

    /// The f32 KV storage for `num_blocks` blocks of `block_size` positions.
    pub fn kv_cache(&self, num_blocks: usize, block_size: usize) -> ModelKv {
        self.kv_cache_with_dtype(num_blocks, block_size, KvDtype::F32)
    }

    /// The KV storage for `num_blocks` blocks of `block_size` positions, K and V (DeepSeek:
    /// the latent rows) stored as `dtype`.
    pub fn kv_cache_with_dtype(
        &self,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> ModelKv {
        match self {
            Model::Llama(m) => ModelKv::Paged(KvCache::with_dtype(
                m.config(),
                num_blocks,
                block_size,
                dtype,
            )),
            Model::DeepSeek(m) => {
                ModelKv::Latent(m.kv_cache_with_dtype(num_blocks, block_size, dtype))
            }
        }
    }

    /// A workspace for batches within these limits, sized for this model's architecture
    /// (see [`LlamaModel::workspace`], [`DeepSeekModel::workspace`]).
    pub fn workspace(&self, max_batch_tokens: usize, max_seqs: usize) -> Workspace {
        match self {
            Model::Llama(m) => m.workspace(max_batch_tokens, max_seqs),
            Model::DeepSeek(m) => m.workspace(max_batch_tokens, max_seqs),
        }
    }

    /// Runs the batch; the wanted logits `[Σ chunk.n_logits(), vocab]`, in chunk order.
    pub fn forward<'w>(
        &self,
        chunks: &[SeqChunk<'_>],
        kv: &mut ModelKv,
        ws: &'w mut Workspace,
    ) -> Result<&'w mut [f32], ModelError> {
        match (self, kv) {
            (Model::Llama(m), ModelKv::Paged(kv)) => m.forward(chunks, kv, ws),
            (Model::DeepSeek(m), ModelKv::Latent(kv)) => m.forward(chunks, kv, ws),
            _ => Err(ModelError::BadConfig(
                "KV storage does not belong to this model".into(),
            )),
        }
    }
}

impl ModelKv {
    /// Bytes cached per token across all layers (of the cache's element type).
    pub fn bytes_per_token(&self) -> usize {
        match self {
            ModelKv::Paged(kv) => kv.bytes_per_token(),
            ModelKv::Latent(kv) => kv.bytes_per_token(),
        }
    }
}
