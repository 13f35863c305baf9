//! An F32/F16/BF16 GGUF to a GGUF of a [`TargetType`].
//!
//! Every tensor gets [`choose_type`]'s type and keeps its order, name and dims. The metadata
//! is copied in order, with `general.file_type` (llama.cpp's `llama_ftype`) and
//! `general.quantization_version = 2` set (replaced in place when present, else appended).
//! A source tensor that would have to be re-quantized (already Q4_0, Q8_0, ...) is refused
//! ([`ConvertError::Requantize`]) before anything is written, as llama-quantize does without
//! `--allow-requantize`; with [`QuantizeOptions::allow_requantize`] it is dequantized to f32
//! and quantized again (its error adds to the source's).

use std::borrow::Cow;
use std::path::Path;

use tokenmill_gguf::{GgmlType, GgufFile, TensorSpec, Value};

use crate::QuantizeOptions;
use crate::error::{ConvertError, Result};
use crate::types::{TargetType, choose_type};
use crate::write::{OutputPlan, Report, TensorReport, write_gguf};

/// The output file's tensor specs, checking that every converted source is a float type.
pub(crate) fn plan(
    file: &GgufFile,
    target: TargetType,
    allow_requantize: bool,
) -> Result<Vec<TensorSpec>> {
    let tied = file.tensor("output.weight").is_none();
    file.tensors()
        .iter()
        .map(|t| {
            let ty = choose_type(t, target, tied);
            let float_src = matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            if ty != t.ty && !float_src && !allow_requantize {
                return Err(ConvertError::Requantize {
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
pub(crate) fn output_metadata(file: &GgufFile, target: TargetType) -> Vec<(String, Value)> {
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

/// Converts the GGUF `input` to `output` (see the module doc).
pub(crate) fn convert(
    input: &Path,
    output: &Path,
    options: &QuantizeOptions,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<Report> {
    let file = GgufFile::open(input).map_err(|source| ConvertError::OpenGguf {
        path: input.to_owned(),
        source,
    })?;
    let specs = plan(&file, options.target, options.allow_requantize)?;
    let meta = output_metadata(&file, options.target);
    let sources = file.tensors();
    let plan = OutputPlan {
        meta: &meta,
        sources,
        specs: &specs,
    };
    let data = |i: usize| Cow::Borrowed(file.tensor_data(&sources[i]));
    write_gguf(output, &plan, data, options.threads, on_tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_gguf::GgufError;

    fn tiny_llama() -> std::path::PathBuf {
        tokenmill_testutil::fixtures_dir("tiny").join("llama.gguf")
    }

    #[test]
    fn the_tiny_model_plans_llama_quantize_types() {
        // Hidden 64: Q4_K falls back to Q5_0; output.weight (64 wide) becomes Q8_0.
        let file = GgufFile::open(tiny_llama()).unwrap();
        let specs = plan(&file, TargetType::Q4K, false).unwrap();
        let ty = |name: &str| specs.iter().find(|s| s.name == name).unwrap().ty;
        assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q5_0);
        assert_eq!(ty("output.weight"), GgmlType::Q8_0);
        assert_eq!(ty("blk.1.ffn_norm.weight"), GgmlType::F32);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let src: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, src);
    }

    #[test]
    fn metadata_is_copied_with_the_file_type_replaced() {
        let file = GgufFile::open(tiny_llama()).unwrap();
        let meta = output_metadata(&file, TargetType::Q3K);
        let src: Vec<&str> = file.metadata().iter().map(|(k, _)| k).collect();
        let keys: Vec<&str> = meta.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys[..src.len()], src[..], "source keys keep their order");
        let get = |key: &str| meta.iter().filter(|(k, _)| k == key).collect::<Vec<_>>();
        for (key, want) in [
            ("general.file_type", 11),
            ("general.quantization_version", 2),
        ] {
            let found = get(key);
            assert_eq!(found.len(), 1, "{key} once");
            assert!(matches!(found[0].1, Value::U32(v) if v == want), "{key}");
        }
    }

    #[test]
    fn a_missing_input_is_an_open_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let opts = QuantizeOptions::new(TargetType::Q8_0);
        match convert(&missing, &dir.path().join("o.gguf"), &opts, &mut |_| {}) {
            Err(ConvertError::OpenGguf {
                path,
                source: GgufError::Io(e),
            }) => {
                assert_eq!(path, missing);
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
        assert!(!dir.path().join("o.gguf").exists());
    }

    #[test]
    fn a_quantized_source_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let (q8, out) = (dir.path().join("q8.gguf"), dir.path().join("out.gguf"));
        let opts = QuantizeOptions::new(TargetType::Q8_0);
        let report = convert(&tiny_llama(), &q8, &opts, &mut |_| {}).unwrap();
        assert_eq!(
            report.tensor("token_embd.weight").unwrap().to,
            GgmlType::Q8_0
        );
        // Same target again: nothing to convert, so the Q8_0 file is accepted and copied.
        let again = convert(&q8, &out, &opts, &mut |_| {}).unwrap();
        assert!(again.tensors.iter().all(|t| t.from == t.to));
        let opts = QuantizeOptions::new(TargetType::Q4_0);
        std::fs::remove_file(&out).unwrap();
        match convert(&q8, &out, &opts, &mut |_| {}) {
            Err(ConvertError::Requantize { name, ty }) => {
                assert_eq!((name.as_str(), ty), ("token_embd.weight", GgmlType::Q8_0));
            }
            other => panic!("{other:?}"),
        }
        assert!(!out.exists());
        // --allow-requantize: Q8_0 → F16 keeps the Q8_0 values (to f16 precision).
        let mut opts = QuantizeOptions::new(TargetType::F16);
        opts.allow_requantize = true;
        let f16 = dir.path().join("f16.gguf");
        let r = convert(&q8, &f16, &opts, &mut |_| {}).unwrap();
        assert_eq!(r.tensor("token_embd.weight").unwrap().to, GgmlType::F16);
        let q8_file = GgufFile::open(&q8).unwrap();
        let f16_file = GgufFile::open(&f16).unwrap();
        let row = |f: &GgufFile| {
            let t = f.tensor("blk.0.attn_q.weight").unwrap();
            let n = t.row_len() as usize;
            let bytes = f.tensor_data(t);
            let row_bytes = t.ty.bytes_for(n as u64).unwrap() as usize;
            let mut v = vec![0f32; n];
            tokenmill_kernels::quant::dequantize_row(t.ty, &bytes[..row_bytes], &mut v);
            v
        };
        let (a, b) = (row(&q8_file), row(&f16_file));
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= scale * 1e-3, "{x} vs {y}");
        }
    }
}
