//! `tokenmill quantize IN OUT --type T`: an F32/F16/BF16 GGUF model — or a Hugging Face
//! folder ([`crate::quantize_hf`]) — to a quantized GGUF that tokenmill and llama.cpp both
//! load. Targets: `f32`, `f16` (every matrix converted, like llama-quantize's F32/F16 ftypes),
//! Q2_K, Q3_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
//!
//! # Which tensor gets which type (llama.cpp's `llama-quantize` conventions)
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
//! The metadata is copied in order, with `general.file_type` (llama.cpp's `llama_ftype`: the
//! `_S` variant for k-quants) and `general.quantization_version = 2` set; tensors keep their
//! order, names and dims. Quantization is row by row through the reference quantizers of
//! `tokenmill_kernels::quant` (byte-identical with ggml's), rows split across threads.
//!
//! # Errors
//!
//! A source tensor that would have to be re-quantized (already Q4_0, Q8_0, ...) is refused
//! ([`QuantizeError::Requantize`]), as llama-quantize does without `--allow-requantize`.
//! Unknown `--type` names are rejected by the argument parser.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::Context;
use tokenmill_gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, TensorSpec, Value};
use tokenmill_kernels::quant::{dequantize_row, quantize_row};

/// The target types `--type` accepts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    #[value(name = "f32")]
    F32,
    #[value(name = "f16")]
    F16,
    #[value(name = "q2_k")]
    Q2K,
    #[value(name = "q3_k")]
    Q3K,
    #[value(name = "q4_0")]
    Q4_0,
    #[value(name = "q4_1")]
    Q4_1,
    #[value(name = "q5_0")]
    Q5_0,
    #[value(name = "q5_1")]
    Q5_1,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_k")]
    Q4K,
    #[value(name = "q5_k")]
    Q5K,
    #[value(name = "q6_k")]
    Q6K,
}

impl QuantType {
    pub fn ggml(self) -> GgmlType {
        match self {
            QuantType::F32 => GgmlType::F32,
            QuantType::F16 => GgmlType::F16,
            QuantType::Q2K => GgmlType::Q2_K,
            QuantType::Q3K => GgmlType::Q3_K,
            QuantType::Q4_0 => GgmlType::Q4_0,
            QuantType::Q4_1 => GgmlType::Q4_1,
            QuantType::Q5_0 => GgmlType::Q5_0,
            QuantType::Q5_1 => GgmlType::Q5_1,
            QuantType::Q8_0 => GgmlType::Q8_0,
            QuantType::Q4K => GgmlType::Q4_K,
            QuantType::Q5K => GgmlType::Q5_K,
            QuantType::Q6K => GgmlType::Q6_K,
        }
    }

    /// llama.cpp's `llama_ftype` for a file of mostly this type (`general.file_type`).
    pub fn llama_ftype(self) -> u32 {
        match self {
            QuantType::F32 => 0,  // ALL_F32
            QuantType::F16 => 1,  // MOSTLY_F16
            QuantType::Q2K => 10, // MOSTLY_Q2_K
            QuantType::Q3K => 11, // MOSTLY_Q3_K_S
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q8_0 => 7,
            QuantType::Q5_0 => 8,
            QuantType::Q5_1 => 9,
            QuantType::Q4K => 14, // MOSTLY_Q4_K_S
            QuantType::Q5K => 16, // MOSTLY_Q5_K_S
            QuantType::Q6K => 18, // MOSTLY_Q6_K
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Source: a GGUF (F32/F16/BF16 weights) or a Hugging Face folder (Llama, Mistral, Qwen2).
    pub input: PathBuf,
    /// Where to write the quantized GGUF.
    pub output: PathBuf,
    /// Target type of the weight matrices.
    #[arg(long = "type", ignore_case = true)]
    pub ty: QuantType,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Why a model cannot be quantized.
#[derive(Debug, PartialEq, Eq)]
pub enum QuantizeError {
    /// The tensor is already quantized; re-quantizing loses precision twice.
    Requantize { name: String, ty: GgmlType },
}

impl fmt::Display for QuantizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantizeError::Requantize { name, ty } => write!(
                f,
                "tensor {name:?} is already quantized ({ty}); quantize from an F32/F16/BF16 model"
            ),
        }
    }
}

impl std::error::Error for QuantizeError {}

/// The type tensor `t` gets in a `target` file (see the module doc). `tied`: the model has no
/// `output.weight`, so `token_embd.weight` is the output projection too.
pub fn choose_type(t: &TensorInfo, target: QuantType, tied: bool) -> GgmlType {
    let quantizable =
        t.dims.len() >= 2 && t.name.ends_with("weight") && !t.name.contains("_norm.weight");
    if !quantizable {
        return t.ty;
    }
    let is_output = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
    let row_len = t.row_len();
    let mut ty = match target {
        QuantType::F32 | QuantType::F16 | QuantType::Q8_0 => target.ggml(),
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

/// The output file's tensor specs, checking that every converted source is a float type.
pub fn plan(file: &GgufFile, target: QuantType) -> Result<Vec<TensorSpec>, QuantizeError> {
    let tied = file.tensor("output.weight").is_none();
    file.tensors()
        .iter()
        .map(|t| {
            let ty = choose_type(t, target, tied);
            let float_src = matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            if ty != t.ty && !float_src {
                return Err(QuantizeError::Requantize {
                    name: t.name.clone(),
                    ty: t.ty,
                });
            }
            Ok(TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty,
            })
        })
        .collect()
}

/// The source metadata with `general.file_type` and `general.quantization_version` set.
pub fn output_metadata(file: &GgufFile, target: QuantType) -> Vec<(String, Value)> {
    let mut meta: Vec<(String, Value)> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    for (key, value) in [
        ("general.file_type", Value::U32(target.llama_ftype())),
        ("general.quantization_version", Value::U32(2)),
    ] {
        match meta.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => meta.push((key.to_owned(), value)),
        }
    }
    meta
}

/// `src` (a tensor of `src_ty`) converted to `ty`, row by row, rows split over `threads`.
pub fn convert(
    src: &[u8],
    src_ty: GgmlType,
    ty: GgmlType,
    row_len: usize,
    threads: usize,
) -> Vec<u8> {
    if src_ty == ty {
        return src.to_vec();
    }
    let (src_row, dst_row) = (
        src_ty.bytes_for(row_len as u64),
        ty.bytes_for(row_len as u64),
    );
    let (src_row, dst_row) = (
        src_row.expect("validated shape") as usize,
        dst_row.expect("planned type fits the row") as usize,
    );
    let n_rows = src.len() / src_row;
    let mut dst = vec![0u8; n_rows * dst_row];
    let rows_per_thread = n_rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (dst, src) in dst
            .chunks_mut(rows_per_thread * dst_row)
            .zip(src.chunks(rows_per_thread * src_row))
        {
            s.spawn(move || {
                let mut row = vec![0f32; row_len];
                for (d, s) in dst.chunks_exact_mut(dst_row).zip(src.chunks_exact(src_row)) {
                    dequantize_row(src_ty, s, &mut row);
                    quantize_row(ty, &row, d);
                }
            });
        }
    });
    dst
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if args.input.is_dir() {
        return crate::quantize_hf::run(&args.input, &args.output, args.ty, threads);
    }
    let file =
        GgufFile::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let specs = plan(&file, args.ty)?;
    let meta = output_metadata(&file, args.ty);
    let sources = file.tensors();
    let data = |i: usize| Cow::Borrowed(file.tensor_data(&sources[i]));
    write_gguf(&args.output, &meta, sources, &specs, data, threads)
}

/// Writes a GGUF of `meta` and `specs` to `path`; tensor `i` is `data(i)`, a tensor shaped
/// and typed as `sources[i]`, converted to `specs[i].ty`.
pub fn write_gguf<'a>(
    path: &Path,
    meta: &[(String, Value)],
    sources: &[TensorInfo],
    specs: &[TensorSpec],
    data: impl Fn(usize) -> Cow<'a, [u8]>,
    threads: usize,
) -> anyhow::Result<()> {
    let out = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = GgufWriter::new(BufWriter::new(out), meta, specs)?;
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for (i, (t, spec)) in sources.iter().zip(specs).enumerate() {
        let src = data(i);
        let out = convert(&src, t.ty, spec.ty, t.row_len() as usize, threads);
        writer.write_tensor(&out)?;
        bytes_in += src.len() as u64;
        bytes_out += out.len() as u64;
        if spec.ty != t.ty {
            eprintln!("{:<40} {:>5} -> {:<5} {:?}", t.name, t.ty, spec.ty, t.dims);
        }
    }
    writer.finish()?;
    eprintln!(
        "wrote {}: {:.2} MiB of tensors -> {:.2} MiB",
        path.display(),
        bytes_in as f64 / (1 << 20) as f64,
        bytes_out as f64 / (1 << 20) as f64
    );
    Ok(())
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
            assert_eq!(choose_type(&t, QuantType::Q4K, false), f32, "{}", t.name);
        }
        let w = info("blk.0.attn_q.weight", &[256, 256], GgmlType::F16);
        assert_eq!(choose_type(&w, QuantType::Q4K, false), GgmlType::Q4_K);
    }

    #[test]
    fn output_rule_and_fallbacks_follow_llama_cpp() {
        let f32 = GgmlType::F32;
        let out = info("output.weight", &[256, 1000], f32);
        let emb = info("token_embd.weight", &[256, 1000], f32);
        assert_eq!(choose_type(&out, QuantType::Q4_0, false), GgmlType::Q6_K);
        assert_eq!(choose_type(&out, QuantType::Q8_0, false), GgmlType::Q8_0);
        assert_eq!(choose_type(&emb, QuantType::Q4_0, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&emb, QuantType::Q4_0, true), GgmlType::Q6_K);
        let narrow_out = info("output.weight", &[576, 1000], f32);
        assert_eq!(
            choose_type(&narrow_out, QuantType::Q4K, false),
            GgmlType::Q8_0
        );
        let w = |n| info("blk.0.ffn_up.weight", &[n, 64], f32);
        assert_eq!(choose_type(&w(576), QuantType::Q4K, false), GgmlType::Q5_0);
        assert_eq!(choose_type(&w(576), QuantType::Q5K, false), GgmlType::Q5_1);
        assert_eq!(choose_type(&w(576), QuantType::Q6K, false), GgmlType::Q8_0);
        assert_eq!(choose_type(&w(48), QuantType::Q4K, false), GgmlType::F16);
        assert_eq!(choose_type(&w(48), QuantType::Q4_1, false), GgmlType::F16);
        assert_eq!(choose_type(&w(576), QuantType::Q2K, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&w(576), QuantType::Q3K, false), GgmlType::Q4_0);
        assert_eq!(choose_type(&w(512), QuantType::Q2K, false), GgmlType::Q2_K);
        assert_eq!(choose_type(&w(512), QuantType::Q3K, false), GgmlType::Q3_K);
        assert_eq!(choose_type(&w(48), QuantType::Q3K, false), GgmlType::F16);
    }

    #[test]
    fn float_targets_convert_every_matrix_without_the_output_rule() {
        let f32 = GgmlType::F32;
        let out = info("output.weight", &[256, 1000], f32);
        let w = info("blk.0.ffn_up.weight", &[48, 64], GgmlType::BF16);
        let norm = info("blk.0.ffn_norm.weight", &[48], GgmlType::BF16);
        for (target, ty) in [(QuantType::F32, f32), (QuantType::F16, GgmlType::F16)] {
            assert_eq!(choose_type(&out, target, false), ty);
            assert_eq!(choose_type(&w, target, false), ty);
            assert_eq!(choose_type(&norm, target, false), GgmlType::BF16);
        }
    }

    #[test]
    fn conversion_matches_the_reference_quantizer_for_any_thread_count() {
        let mut rng = tokenmill_kernels::quant::testing::SplitMix64::new(9);
        let x = tokenmill_kernels::quant::testing::random_f32_row(&mut rng, 256 * 7, 1.0);
        let src: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut want = vec![0u8; 7 * 144];
        for (d, s) in want.chunks_exact_mut(144).zip(x.chunks_exact(256)) {
            quantize_row(GgmlType::Q4_K, s, d);
        }
        for threads in [1, 2, 3, 16] {
            let got = convert(&src, GgmlType::F32, GgmlType::Q4_K, 256, threads);
            assert_eq!(got, want, "{threads} threads");
        }
        assert_eq!(convert(&src, GgmlType::F32, GgmlType::F32, 256, 2), src);
    }
}
