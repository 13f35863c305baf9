//! AWQ / GPTQ int4 linear layers of Hugging Face checkpoints, and [`Weight`]: a linear layer
//! that is either a stored matrix ([`Linear`], any GGUF / float type) or an [`Int4Matrix`].
//!
//! # Configuration
//!
//! [`Int4Config::from_hf`] reads `config.json`'s `quantization_config` (transformers'
//! `AwqConfig` / `GPTQConfig`, and AutoAWQ's `w_bit` / `q_group_size` spellings):
//! * `quant_method` `"awq"` with `version` `"gemm"` and `zero_point` true (AutoAWQ GEMM), or
//!   `"gptq"` with `checkpoint_format` `"gptq"` (stored zero − 1) or `"gptq_v2"`;
//! * `bits` 4; `group_size` > 0, or −1 for one group per column (the whole input);
//! * GPTQ `desc_act` (act-order: `g_idx` required) and `sym` (no effect on the layout: the
//!   zeros are stored either way).
//!
//! Anything else is [`ModelError::UnsupportedQuantization`].
//!
//! # Loading
//!
//! A linear layer `<base>` is int4 when the store has `<base>.qweight`; its `qzeros`, `scales`
//! (and GPTQ `g_idx`) are dtype- and shape-checked against the layer's `[out, in]` shape, then
//! repacked by [`Int4Matrix::from_awq`] / [`Int4Matrix::from_gptq`] — never dequantized to
//! float. Layers without `qweight` (AWQ's `modules_to_not_convert`, usually the LM head)
//! stay stored floats; embeddings and norms always are. Bad tensors are typed errors ([`ModelError::Int4`], `BadShape`,
//! `UnsupportedQuantization` for a wrong dtype, `MissingTensor`), never panics.
//!
//! # Running
//!
//! [`Weight::matmul`] dispatches to `tokenmill_kernels::matmul` or `int4::matmul` (f32
//! activations, weight rows split across the kernels' pool). [`matmul_multi`] and
//! [`matmul_silu_mul`] keep the fused single-pass kernels when every weight is stored (no
//! allocation, as before); with an int4 weight among them they run one matmul per weight into
//! a thread-local scratch and scatter / apply SiLU·up. `int4::matmul` itself still allocates
//! its scratch (gathered activations, group sums, transposed result) per call, so an int4
//! forward is not allocation-free yet.

use std::cell::RefCell;

use serde_json::Value;
use tokenmill_kernels::glu;
use tokenmill_kernels::int4::{self, AwqTensors, GptqTensors, Int4Matrix, ZeroFormat};
use tokenmill_kernels::matmul::{self, QMatrix};
use tokenmill_kernels::ops::silu_mul;
use tokenmill_safetensors::Dtype;

use crate::ModelError;
use crate::config::MAX_DIM;
use crate::store::{Linear, WeightStore};

/// Which int4 checkpoint layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Method {
    /// AutoAWQ GEMM.
    Awq,
    /// AutoGPTQ / GPTQModel, with the checkpoint's zero convention.
    Gptq { zero_format: ZeroFormat },
}

/// `config.json`'s `quantization_config` for an int4 checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Int4Config {
    pub method: Int4Method,
    /// Inputs per group; `None` (`group_size: -1`) is one group per column.
    pub group_size: Option<usize>,
    /// GPTQ act-order: every layer must carry `g_idx`.
    pub desc_act: bool,
}

fn unsupported(msg: impl Into<String>) -> ModelError {
    ModelError::UnsupportedQuantization(msg.into())
}

/// `qc[key]` (or its alias) as a lower-case string.
fn text(qc: &Value, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| qc.get(*k).and_then(Value::as_str))
        .map(str::to_ascii_lowercase)
}

fn flag(qc: &Value, key: &str, default: bool) -> Result<bool, ModelError> {
    match qc.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(unsupported(format!("{key} = {v} is not a boolean"))),
    }
}

impl Int4Config {
    /// The int4 scheme of a parsed `config.json`; `None` when it has no
    /// `quantization_config` (module doc for what is accepted).
    pub fn from_hf(cfg: &Value) -> Result<Option<Int4Config>, ModelError> {
        let qc = match cfg.get("quantization_config") {
            None | Some(Value::Null) => return Ok(None),
            Some(qc @ Value::Object(_)) => qc,
            Some(v) => return Err(unsupported(format!("quantization_config = {v}"))),
        };
        let method = text(qc, &["quant_method"]).unwrap_or_default();
        let bits = qc.get("bits").or_else(|| qc.get("w_bit"));
        if bits.and_then(Value::as_u64) != Some(4) {
            let bits = bits.map_or("missing".into(), Value::to_string);
            return Err(unsupported(format!("{method}: bits {bits} (4 only)")));
        }
        let group_size = match qc.get("group_size").or_else(|| qc.get("q_group_size")) {
            None | Some(Value::Null) => Some(128), // transformers' default for both
            Some(v) => match v.as_i64() {
                Some(-1) => None,
                Some(g) if g > 0 && g as u64 <= MAX_DIM => Some(g as usize),
                _ => return Err(unsupported(format!("group_size {v}"))),
            },
        };
        let (method, desc_act) = match method.as_str() {
            "awq" => {
                let version = text(qc, &["version"]).unwrap_or_else(|| "gemm".into());
                if version != "gemm" {
                    return Err(unsupported(format!("awq version '{version}' (gemm only)")));
                }
                if !flag(qc, "zero_point", true)? {
                    return Err(unsupported("awq without zero_point"));
                }
                (Int4Method::Awq, false)
            }
            "gptq" => {
                let format = text(qc, &["checkpoint_format", "format"]);
                let zero_format = match format.as_deref().unwrap_or("gptq") {
                    "gptq" => ZeroFormat::Classic,
                    "gptq_v2" => ZeroFormat::V2,
                    other => return Err(unsupported(format!("gptq checkpoint_format '{other}'"))),
                };
                flag(qc, "sym", true)?;
                (
                    Int4Method::Gptq { zero_format },
                    flag(qc, "desc_act", false)?,
                )
            }
            other => return Err(unsupported(format!("quant_method '{other}'"))),
        };
        Ok(Some(Int4Config {
            method,
            group_size,
            desc_act,
        }))
    }
}

/// Whether the layer whose full weight name is `name` (`<base>.weight`) is stored as int4
/// (`<base>.qweight` exists).
pub(crate) fn has_int4(store: &WeightStore, name: &str) -> bool {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    store.raw(&format!("{base}.qweight")).is_some()
}

/// A linear layer's weight `[rows = out features, cols = in features]`.
#[derive(Clone, Debug)]
pub enum Weight {
    /// A matrix in the store's memory map, in its native type.
    Stored(Linear),
    /// AWQ / GPTQ int4, repacked at load.
    Int4(Int4Matrix),
}

impl Weight {
    /// The layer whose full weight name is `name` (`<base>.weight`): int4 when the store has
    /// `<base>.qweight`, else the stored matrix `name`.
    pub fn load(
        store: &WeightStore,
        name: &str,
        rows: usize,
        cols: usize,
        quant: Option<&Int4Config>,
    ) -> Result<Weight, ModelError> {
        if !has_int4(store, name) {
            return store.linear(name, rows, cols).map(Weight::Stored);
        }
        let base = name.strip_suffix(".weight").unwrap_or(name);
        let Some(q) = quant else {
            return Err(unsupported(format!(
                "'{base}.qweight' but config.json has no quantization_config"
            )));
        };
        load_int4(store, base, rows, cols, q).map(Weight::Int4)
    }

    pub fn rows(&self) -> usize {
        match self {
            Weight::Stored(l) => l.rows,
            Weight::Int4(m) => m.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weight::Stored(l) => l.cols,
            Weight::Int4(m) => m.cols(),
        }
    }

    /// Bytes a matmul streams: the stored matrix, or the repacked int4 matrix (nibbles,
    /// per-group scales / mins / zeros, act-order permutation).
    pub fn n_bytes(&self) -> usize {
        match self {
            Weight::Stored(l) => l.n_bytes(),
            Weight::Int4(m) => m.size_bytes(),
        }
    }

    pub fn is_int4(&self) -> bool {
        matches!(self, Weight::Int4(_))
    }

    fn view<'a>(&'a self, store: &'a WeightStore) -> Option<QMatrix<'a>> {
        match self {
            Weight::Stored(l) => Some(l.view(store)),
            Weight::Int4(_) => None,
        }
    }

    /// `out = x · Wᵀ`, `x: [m, cols]`, `out: [m, rows]`.
    pub fn matmul(&self, store: &WeightStore, x: &[f32], out: &mut [f32]) {
        match self {
            Weight::Stored(l) => matmul::matmul(x, &l.view(store), out),
            Weight::Int4(m) => int4::matmul(x, m, out),
        }
    }
}

/// `out = x · [W0; W1; …]ᵀ`: each row of `out` is the weights' outputs side by side. One
/// fused pass when every weight is stored.
pub fn matmul_multi<const N: usize>(
    store: &WeightStore,
    x: &[f32],
    ws: [&Weight; N],
    out: &mut [f32],
) {
    let views = ws.map(|w| w.view(store));
    if views.iter().all(Option::is_some) {
        return matmul::matmul_multi(x, &views.map(Option::unwrap), out);
    }
    let width: usize = ws.iter().map(|w| w.rows()).sum();
    let m = out.len() / width;
    let mut col = 0;
    for w in ws {
        with_scratch(m * w.rows(), |part| {
            w.matmul(store, x, part);
            for (dst, src) in out.chunks_exact_mut(width).zip(part.chunks_exact(w.rows())) {
                dst[col..col + w.rows()].copy_from_slice(src);
            }
        });
        col += w.rows();
    }
}

thread_local! {
    /// One weight's output in the unfused paths, reused across calls (the engine thread runs
    /// every forward, so this is one buffer per model in practice).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `f` on `len` floats of this thread's scratch (contents unspecified).
fn with_scratch(len: usize, f: impl FnOnce(&mut [f32])) {
    SCRATCH.with_borrow_mut(|v| {
        if v.len() < len {
            v.resize(len, 0.0);
        }
        f(&mut v[..len]);
    });
}

/// `out = silu(x · Wgᵀ) ⊙ (x · Wuᵀ)`; the fused kernel when both are stored.
pub fn matmul_silu_mul(
    store: &WeightStore,
    x: &[f32],
    gate: &Weight,
    up: &Weight,
    out: &mut [f32],
) {
    if let (Some(g), Some(u)) = (gate.view(store), up.view(store)) {
        return glu::matmul_silu_mul(x, &g, &u, out);
    }
    gate.matmul(store, x, out);
    with_scratch(out.len(), |u| {
        up.matmul(store, x, u);
        silu_mul(out, u);
    });
}

/// A checkpoint tensor `<base>.<suffix>` of exactly `dtype` and `shape`.
fn tensor<'a>(
    store: &'a WeightStore,
    base: &str,
    suffix: &str,
    dtype: Dtype,
    shape: &[usize],
) -> Result<&'a [u8], ModelError> {
    let name = format!("{base}.{suffix}");
    let t = store
        .raw(&name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.clone() })?;
    if t.dtype != dtype {
        let got = t.dtype;
        return Err(unsupported(format!(
            "'{name}' has dtype {got:?}, expected {dtype:?}"
        )));
    }
    let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    if t.shape != want {
        let found = t.shape.to_vec();
        return Err(ModelError::BadShape {
            name,
            expected: want,
            found,
        });
    }
    Ok(t.data)
}

/// The int4 layer `<base>` of `rows` outputs × `cols` inputs.
fn load_int4(
    store: &WeightStore,
    base: &str,
    rows: usize,
    cols: usize,
    q: &Int4Config,
) -> Result<Int4Matrix, ModelError> {
    let (k, n) = (cols, rows);
    let group = q.group_size.unwrap_or(k);
    let int4_err = |source| ModelError::Int4 {
        name: base.to_string(),
        source,
    };
    let shape_ok =
        group > 0 && group.is_multiple_of(8) && k.is_multiple_of(group) && n.is_multiple_of(8);
    if !shape_ok {
        return Err(int4_err(int4::Int4Error::Shape {
            in_features: k,
            out_features: n,
            group_size: group,
        }));
    }
    let ng = k / group;
    let qzeros = tensor(store, base, "qzeros", Dtype::I32, &[ng, n / 8])?;
    let scales = tensor(store, base, "scales", Dtype::F16, &[ng, n])?;
    let matrix = match q.method {
        Int4Method::Awq => Int4Matrix::from_awq(&AwqTensors {
            qweight: tensor(store, base, "qweight", Dtype::I32, &[k, n / 8])?,
            qzeros,
            scales,
            in_features: k,
            out_features: n,
            group_size: group,
        }),
        Int4Method::Gptq { zero_format } => {
            let g_idx = match store.raw(&format!("{base}.g_idx")) {
                None if !q.desc_act => None,
                _ => Some(tensor(store, base, "g_idx", Dtype::I32, &[k])?),
            };
            Int4Matrix::from_gptq(&GptqTensors {
                qweight: tensor(store, base, "qweight", Dtype::I32, &[k / 8, n])?,
                qzeros,
                scales,
                g_idx,
                in_features: k,
                out_features: n,
                group_size: group,
                zero_format,
            })
        }
    };
    matrix.map_err(int4_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(qc: Value) -> Result<Option<Int4Config>, ModelError> {
        Int4Config::from_hf(&serde_json::json!({ "quantization_config": qc }))
    }

    #[test]
    fn parses_awq_and_gptq_configs() {
        let awq = serde_json::json!({"quant_method": "awq", "bits": 4, "group_size": 64,
            "version": "GEMM", "zero_point": true});
        let got = parse(awq).unwrap().unwrap();
        assert_eq!(got.method, Int4Method::Awq);
        assert_eq!(got.group_size, Some(64));
        let autoawq = serde_json::json!({"quant_method": "awq", "w_bit": 4, "q_group_size": 128});
        assert_eq!(parse(autoawq).unwrap().unwrap().group_size, Some(128));
        let v2 = serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": -1,
            "desc_act": true, "sym": false, "checkpoint_format": "gptq_v2"});
        let got = parse(v2).unwrap().unwrap();
        let zero_format = ZeroFormat::V2;
        assert_eq!(got.method, Int4Method::Gptq { zero_format });
        assert_eq!((got.group_size, got.desc_act), (None, true));
        let classic = serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32});
        let got = parse(classic).unwrap().unwrap();
        let zero_format = ZeroFormat::Classic;
        assert_eq!(got.method, Int4Method::Gptq { zero_format });
        assert!(!got.desc_act);
        assert_eq!(Int4Config::from_hf(&serde_json::json!({})).unwrap(), None);
    }

    #[test]
    fn rejects_unsupported_configs() {
        let bad = [
            serde_json::json!({"quant_method": "gptq", "bits": 8, "group_size": 32}),
            serde_json::json!({"quant_method": "gptq", "group_size": 32}),
            serde_json::json!({"quant_method": "awq", "bits": 4, "version": "gemv"}),
            serde_json::json!({"quant_method": "awq", "bits": 4, "zero_point": false}),
            serde_json::json!({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}),
            serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 0}),
            serde_json::json!({"quant_method": "gptq", "bits": 4, "desc_act": "yes"}),
            serde_json::json!({"quant_method": "bitsandbytes", "bits": 4}),
            serde_json::json!("awq"),
        ];
        for qc in bad {
            let err = parse(qc.clone()).unwrap_err();
            assert!(
                matches!(err, ModelError::UnsupportedQuantization(_)),
                "{qc}: {err}"
            );
        }
    }
}
