//! Target types, and which type each tensor gets (llama.cpp's `llama-quantize` conventions).
//!
//! * Only tensors with 2 or more dims whose name ends in `weight` are quantized; norms
//!   (`*_norm.weight`), biases and every 1-D tensor are copied unchanged
//!   (`tensor_allows_quantization` in `llama-quant.cpp`).
//! * The output projection — `output.weight`, or `token_embd.weight` when the embedding is
//!   tied (no `output.weight`) — becomes Q6_K unless the target is Q8_0, and Q8_0 when its
//!   rows are not a multiple of 256 (`llama_tensor_get_type_impl`'s OUTPUT rule).
//! * Every other quantizable tensor gets the target type. There are no `_M` mixtures: the
//!   result equals `llama-quantize --pure` apart from the output rule above (so `q2_k` is
//!   llama.cpp's Q2_K without its Q4_K/Q3_K attn_v/ffn_down upgrades, `q3_k` is Q3_K_S-like).
//!   `f32`/`f16` are pure in llama-quantize too: no output rule.
//! * A row length that is not a whole number of the chosen type's blocks falls back like
//!   `tensor_type_fallback`: Q2_K/Q3_K → Q4_0, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and F16
//!   if even that does not fit.
//!
//! [`choose_type`] is a pure function of a tensor's name, dims and type; everything else in
//! the crate asks it.

use std::fmt;
use std::str::FromStr;

use tokenmill_gguf::{GgmlType, TensorInfo};

use crate::error::ConvertError;

/// What the weight matrices of the output file become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetType {
    F32,
    F16,
    Q2K,
    Q3K,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl TargetType {
    /// Every target, in the order the command line lists them.
    pub const ALL: [TargetType; 12] = [
        TargetType::F32,
        TargetType::F16,
        TargetType::Q2K,
        TargetType::Q3K,
        TargetType::Q4_0,
        TargetType::Q4_1,
        TargetType::Q5_0,
        TargetType::Q5_1,
        TargetType::Q8_0,
        TargetType::Q4K,
        TargetType::Q5K,
        TargetType::Q6K,
    ];

    /// The lower-case name (`q4_k`), as `--type` spells it.
    pub fn name(self) -> &'static str {
        match self {
            TargetType::F32 => "f32",
            TargetType::F16 => "f16",
            TargetType::Q2K => "q2_k",
            TargetType::Q3K => "q3_k",
            TargetType::Q4_0 => "q4_0",
            TargetType::Q4_1 => "q4_1",
            TargetType::Q5_0 => "q5_0",
            TargetType::Q5_1 => "q5_1",
            TargetType::Q8_0 => "q8_0",
            TargetType::Q4K => "q4_k",
            TargetType::Q5K => "q5_k",
            TargetType::Q6K => "q6_k",
        }
    }

    /// The names of [`TargetType::ALL`].
    pub fn names() -> [&'static str; 12] {
        Self::ALL.map(Self::name)
    }

    /// The ggml type of a matrix that gets this target unchanged.
    pub fn ggml(self) -> GgmlType {
        match self {
            TargetType::F32 => GgmlType::F32,
            TargetType::F16 => GgmlType::F16,
            TargetType::Q2K => GgmlType::Q2_K,
            TargetType::Q3K => GgmlType::Q3_K,
            TargetType::Q4_0 => GgmlType::Q4_0,
            TargetType::Q4_1 => GgmlType::Q4_1,
            TargetType::Q5_0 => GgmlType::Q5_0,
            TargetType::Q5_1 => GgmlType::Q5_1,
            TargetType::Q8_0 => GgmlType::Q8_0,
            TargetType::Q4K => GgmlType::Q4_K,
            TargetType::Q5K => GgmlType::Q5_K,
            TargetType::Q6K => GgmlType::Q6_K,
        }
    }

    /// llama.cpp's `llama_ftype` for a file of mostly this type (`general.file_type`; the `_S`
    /// variant for k-quants).
    pub fn llama_ftype(self) -> u32 {
        match self {
            TargetType::F32 => 0,  // ALL_F32
            TargetType::F16 => 1,  // MOSTLY_F16
            TargetType::Q2K => 10, // MOSTLY_Q2_K
            TargetType::Q3K => 11, // MOSTLY_Q3_K_S
            TargetType::Q4_0 => 2,
            TargetType::Q4_1 => 3,
            TargetType::Q8_0 => 7,
            TargetType::Q5_0 => 8,
            TargetType::Q5_1 => 9,
            TargetType::Q4K => 14, // MOSTLY_Q4_K_S
            TargetType::Q5K => 16, // MOSTLY_Q5_K_S
            TargetType::Q6K => 18, // MOSTLY_Q6_K
        }
    }
}

impl fmt::Display for TargetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses a [`TargetType::name`], ignoring ASCII case (`Q4_K` like llama-quantize).
impl FromStr for TargetType {
    type Err = ConvertError;

    fn from_str(s: &str) -> Result<Self, ConvertError> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ConvertError::UnsupportedType(s.to_owned()))
    }
}

/// The type tensor `t` gets in a `target` file (see the module doc). `tied`: the model has no
/// `output.weight`, so `token_embd.weight` is the output projection too.
pub fn choose_type(t: &TensorInfo, target: TargetType, tied: bool) -> GgmlType {
    let quantizable =
        t.dims.len() >= 2 && t.name.ends_with("weight") && !t.name.contains("_norm.weight");
    if !quantizable {
        return t.ty;
    }
    let is_output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
    let row_len = t.row_len();
    let mut ty = match target {
        TargetType::F32 | TargetType::F16 | TargetType::Q8_0 => target.ggml(),
        _ if is_output && row_len.is_multiple_of(256) => GgmlType::Q6_K,
        _ if is_output => GgmlType::Q8_0,
        other => other.ggml(),
    };
    if !row_len.is_multiple_of(ty.block_size() as u64) {
        ty = match ty {
            GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
            GgmlType::Q4_K => GgmlType::Q5_0,
            GgmlType::Q5_K => GgmlType::Q5_1,
            GgmlType::Q6_K => GgmlType::Q8_0,
            other => other,
        };
    }
    if !row_len.is_multiple_of(ty.block_size() as u64) {
        ty = GgmlType::F16;
    }
    ty
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dims: &[u64], ty: GgmlType) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            offset: 0,
            size: 0,
        }
    }

    #[test]
    fn norms_biases_and_vectors_stay() {
        let f32 = GgmlType::F32;
        for t in [
            info("blk.0.attn_norm.weight", &[256], f32),
            info("blk.0.attn_q.bias", &[256, 1], f32),
            info("blk.0.ffn_norm.weight", &[256, 2], f32),
        ] {
            assert_eq!(choose_type(&t, TargetType::Q4K, false), f32, "{}", t.name);
        }
        let w = info("blk.0.attn_q.weight", &[256, 256], GgmlType::F16);
        assert_eq!(choose_type(&w, TargetType::Q4K, false), GgmlType::Q4_K);
    }

    #[test]
    fn output_rule_and_fallbacks_follow_llama_cpp() {
        let f32 = GgmlType::F32;
        let out = info("output.weight", &[256, 1000], f32);
        let emb = info("token_embd.weight", &[256, 1000], f32);
        assert_eq!(choose_type(&out, TargetType::Q4_0, false), GgmlType::Q6_K);
        assert_eq!(choose_type(&out, TargetType::Q8_0, false), GgmlType::Q8_0);
        assert_eq!(choose_type(&emb, TargetType::Q4_0, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&emb, TargetType::Q4_0, true), GgmlType::Q6_K);
        let narrow_out = info("output.weight", &[576, 1000], f32);
        assert_eq!(
            choose_type(&narrow_out, TargetType::Q4K, false),
            GgmlType::Q8_0
        );
        let w = |n| info("blk.0.ffn_up.weight", &[n, 64], f32);
        assert_eq!(choose_type(&w(576), TargetType::Q4K, false), GgmlType::Q5_0);
        assert_eq!(choose_type(&w(576), TargetType::Q5K, false), GgmlType::Q5_1);
        assert_eq!(choose_type(&w(576), TargetType::Q6K, false), GgmlType::Q8_0);
        assert_eq!(choose_type(&w(48), TargetType::Q4K, false), GgmlType::F16);
        assert_eq!(choose_type(&w(48), TargetType::Q4_1, false), GgmlType::F16);
        assert_eq!(choose_type(&w(576), TargetType::Q2K, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&w(576), TargetType::Q3K, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&w(512), TargetType::Q2K, false), GgmlType::Q2_K);
        assert_eq!(choose_type(&w(512), TargetType::Q3K, false), GgmlType::Q3_K);
        assert_eq!(choose_type(&w(48), TargetType::Q3K, false), GgmlType::F16);
    }

    #[test]
    fn float_targets_convert_every_matrix_without_the_output_rule() {
        let f32 = GgmlType::F32;
        let out = info("output.weight", &[256, 1000], f32);
        let w = info("blk.0.ffn_up.weight", &[48, 64], GgmlType::BF16);
        let norm = info("blk.0.ffn_norm.weight", &[48], GgmlType::BF16);
        for (target, ty) in [(TargetType::F32, f32), (TargetType::F16, GgmlType::F16)] {
            assert_eq!(choose_type(&out, target, false), ty);
            assert_eq!(choose_type(&w, target, false), ty);
            assert_eq!(choose_type(&norm, target, false), GgmlType::BF16);
        }
    }

    #[test]
    fn every_target_is_its_ggml_type_on_whole_blocks() {
        // 256-wide rows fit every block size, so a plain matrix gets exactly the target, and
        // the target's name is the ggml type's (k-quants spelled lower-case).
        let w = info("blk.3.attn_v.weight", &[256, 8], GgmlType::F32);
        for t in TargetType::ALL {
            assert_eq!(choose_type(&w, t, false), t.ggml(), "{t}");
            assert!(t.ggml().name().eq_ignore_ascii_case(t.name()), "{t}");
        }
    }

    #[test]
    fn names_parse_back_ignoring_case_and_unknown_ones_are_typed_errors() {
        for t in TargetType::ALL {
            assert_eq!(t.name().parse::<TargetType>().unwrap(), t);
            assert_eq!(t.name().to_uppercase().parse::<TargetType>().unwrap(), t);
        }
        assert_eq!(TargetType::names()[9], "q4_k");
        for bad in ["iq2_xxs", "q4_k_m", "bf16", ""] {
            match bad.parse::<TargetType>() {
                Err(ConvertError::UnsupportedType(s)) => assert_eq!(s, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let msg = "q1_0".parse::<TargetType>().unwrap_err().to_string();
        assert!(
            msg.contains("\"q1_0\"") && msg.contains("f32, f16, q2_k"),
            "{msg}"
        );
    }

    #[test]
    fn file_types_are_llama_cpps() {
        let ftypes: Vec<u32> = TargetType::ALL.map(TargetType::llama_ftype).to_vec();
        assert_eq!(ftypes, [0, 1, 10, 11, 2, 3, 8, 9, 7, 14, 16, 18]);
    }
}
