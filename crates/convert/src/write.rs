//! The output GGUF: every tensor converted to its planned type row by row and streamed to a
//! [`GgufWriter`], with a [`TensorReport`] per tensor.
//!
//! Conversion dequantizes a source row to f32 and quantizes it with the reference quantizers
//! of `tokenmill_kernels::quant` (byte-identical with ggml's); rows are split across
//! `threads` scoped threads, so the bytes do not depend on the thread count. A tensor whose
//! type does not change is copied byte for byte. Only one converted tensor is held in memory
//! at a time.

use std::borrow::Cow;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use tokenmill_gguf::{GgmlType, GgufWriter, TensorInfo, TensorSpec, Value};
use tokenmill_kernels::quant::{dequantize_row, quantize_row};

use crate::error::{ConvertError, Result};

/// One tensor as it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorReport {
    /// The tensor's name in the output file (llama.cpp's).
    pub name: String,
    /// GGUF dims, innermost first.
    pub dims: Vec<u64>,
    /// The source type and the written type (equal when copied).
    pub from: GgmlType,
    pub to: GgmlType,
    /// Bytes read from the source and written to the file.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// What a conversion wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The output file.
    pub output: PathBuf,
    /// Every tensor, in file order.
    pub tensors: Vec<TensorReport>,
}

impl Report {
    /// Bytes of tensor data read from the source.
    pub fn bytes_in(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_in).sum()
    }

    /// Bytes of tensor data written.
    pub fn bytes_out(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes_out).sum()
    }

    /// The written tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorReport> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// `src` (a tensor of `src_ty` with rows of `row_len` elements) converted to `ty`, row by row,
/// rows split over `threads`. Both types must fit `row_len` (the planner guarantees it:
/// [`crate::choose_type`] falls back until the row is whole blocks, and sources are validated
/// by their readers).
pub(crate) fn convert_tensor(
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

/// The file to write: metadata in order, and per tensor its source (shape and type as read)
/// and its spec (the same name and dims, the planned type).
pub(crate) struct OutputPlan<'p> {
    pub meta: &'p [(String, Value)],
    pub sources: &'p [TensorInfo],
    pub specs: &'p [TensorSpec],
}

/// Writes `plan` to `path`; tensor `i`'s source bytes are `data(i)`. `on_tensor` sees each
/// tensor once it is written.
pub(crate) fn write_gguf<'a>(
    path: &Path,
    plan: &OutputPlan<'_>,
    data: impl Fn(usize) -> Cow<'a, [u8]>,
    threads: usize,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<Report> {
    let out = File::create(path).map_err(|source| ConvertError::Create {
        path: path.to_owned(),
        source,
    })?;
    let mut writer = GgufWriter::new(BufWriter::new(out), plan.meta, plan.specs)?;
    let mut tensors = Vec::with_capacity(plan.specs.len());
    for (i, (t, spec)) in plan.sources.iter().zip(plan.specs).enumerate() {
        let src = data(i);
        let out = convert_tensor(&src, t.ty, spec.ty, t.row_len() as usize, threads);
        writer.write_tensor(&out)?;
        let report = TensorReport {
            name: t.name.clone(),
            dims: t.dims.clone(),
            from: t.ty,
            to: spec.ty,
            bytes_in: src.len() as u64,
            bytes_out: out.len() as u64,
        };
        on_tensor(&report);
        tensors.push(report);
    }
    writer.finish()?;
    Ok(Report {
        output: path.to_owned(),
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenmill_gguf::GgufFile;
    use tokenmill_kernels::quant::testing::{SplitMix64, random_f32_row};

    #[test]
    fn conversion_matches_the_reference_quantizer_for_any_thread_count() {
        let mut rng = SplitMix64::new(9);
        let x = random_f32_row(&mut rng, 256 * 7, 1.0);
        let src: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut want = vec![0u8; 7 * 144];
        for (d, s) in want.chunks_exact_mut(144).zip(x.chunks_exact(256)) {
            quantize_row(GgmlType::Q4_K, s, d);
        }
        for threads in [1, 2, 3, 16] {
            let got = convert_tensor(&src, GgmlType::F32, GgmlType::Q4_K, 256, threads);
            assert_eq!(got, want, "{threads} threads");
        }
        assert_eq!(
            convert_tensor(&src, GgmlType::F32, GgmlType::F32, 256, 2),
            src
        );
    }

    #[test]
    fn writes_the_plan_and_reports_every_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.gguf");
        let info = |name: &str, dims: Vec<u64>| TensorInfo {
            name: name.into(),
            dims,
            ty: GgmlType::F32,
            offset: 0,
            size: 0,
        };
        let sources = [info("a.weight", vec![32, 2]), info("b", vec![3])];
        let specs: Vec<TensorSpec> = sources
            .iter()
            .zip([GgmlType::Q8_0, GgmlType::F32])
            .map(|(t, ty)| TensorSpec {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty,
            })
            .collect();
        let meta = [("general.name".to_owned(), Value::String("t".into()))];
        let plan = OutputPlan {
            meta: &meta,
            sources: &sources,
            specs: &specs,
        };
        let values = [vec![0.5f32; 64], vec![1.0, 2.0, 3.0]];
        let bytes = |i: usize| Cow::Owned(values[i].iter().flat_map(|v| v.to_le_bytes()).collect());
        let mut seen = Vec::new();
        let report =
            write_gguf(&path, &plan, bytes, 2, &mut |t| seen.push(t.name.clone())).unwrap();
        assert_eq!(seen, ["a.weight", "b"]);
        assert_eq!(
            (report.bytes_in(), report.bytes_out()),
            (256 + 12, 2 * 34 + 12)
        );
        assert_eq!(report.tensor("a.weight").unwrap().to, GgmlType::Q8_0);
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.tensor("a.weight").unwrap().ty, GgmlType::Q8_0);
        assert_eq!(g.tensor_data(g.tensor("b").unwrap()), &*bytes(1));
        assert_eq!(g.metadata().get_str("general.name"), Some("t"));
    }

    #[test]
    fn an_uncreatable_output_is_a_create_error_naming_the_path() {
        let plan = OutputPlan {
            meta: &[],
            sources: &[],
            specs: &[],
        };
        let path = Path::new("/nonexistent-dir-for-tokenmill/out.gguf");
        match write_gguf(path, &plan, |_| Cow::Borrowed(&[][..]), 1, &mut |_| {}) {
            Err(ConvertError::Create { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }
}
