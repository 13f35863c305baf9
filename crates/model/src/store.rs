//! [`WeightStore`]: where a model's weights live — one GGUF file or the safetensors shards of
//! a Hugging Face folder, memory-mapped either way — and the store-agnostic [`TensorRef`] /
//! [`Linear`] handles the forward pass uses.
//!
//! A handle records only the element type, the shape and `(shard, byte range)`, resolved and
//! bounds-checked once at load; `Linear::view` is then one slice of the shard's map, the same
//! cost as the GGUF path always had. Shapes are in PyTorch order (outermost first): a GGUF
//! tensor's `ne` dims are reversed, so `[rows = out features, cols = in features]` reads the
//! same from both formats.
//!
//! safetensors element types map to the kernels' float types (F32, F16, BF16); any other
//! dtype is rejected at load with [`ModelError::UnsupportedDtype`]. [`WeightStore::raw`] is
//! the one way to other dtypes: the raw bytes of a safetensors tensor (int4 checkpoints).

use std::ops::Range;
use std::path::Path;

use std::sync::Arc;
use tokenmill_gguf::{GgufFile, TensorInfo};

use tokenmill_kernels::matmul::{PackedMatrix, QMatrix};
use tokenmill_kernels::quant::{GgmlType, dequantize_row};
use tokenmill_safetensors::{Dtype, SafetensorsSet};

use crate::ModelError;

/// The mapped bytes behind a model.
#[derive(Debug)]
pub enum WeightStore {
    Gguf(GgufFile),
    Safetensors(SafetensorsSet),
}

/// One tensor, located in its store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    pub ty: GgmlType,
    /// Outermost first.
    pub shape: Vec<u64>,
    loc: Loc,
}

/// Where a tensor's bytes are: a GGUF tensor (read through `GgufFile::tensor_data`, exactly
/// as before the store existed) or a byte range of a safetensors shard.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Loc {
    Gguf(TensorInfo),
    Shard { shard: u32, range: Range<usize> },
}

impl WeightStore {
    /// The Hugging Face folder's safetensors weights (single file or sharded).
    pub fn open_hf_dir(dir: &Path) -> Result<WeightStore, ModelError> {
        Ok(WeightStore::Safetensors(SafetensorsSet::open_dir(dir)?))
    }

    /// The tensor `name`, if the store has it.
    pub fn find(&self, name: &str) -> Result<Option<TensorRef>, ModelError> {
        match self {
            WeightStore::Gguf(f) => Ok(f.tensor(name).map(|t| TensorRef {
                ty: t.ty,
                shape: t.dims.iter().rev().copied().collect(),
                loc: Loc::Gguf(t.clone()),
            })),
            WeightStore::Safetensors(s) => {
                let Some((shard, t)) = s.tensor(name) else {
                    return Ok(None);
                };
                let ty = match t.dtype {
                    Dtype::F32 => GgmlType::F32,
                    Dtype::F16 => GgmlType::F16,
                    Dtype::BF16 => GgmlType::BF16,
                    other => {
                        return Err(ModelError::UnsupportedDtype {
                            name: name.into(),
                            dtype: format!("{other:?}"),
                        });
                    }
                };
                Ok(Some(TensorRef {
                    ty,
                    shape: t.shape.clone(),
                    loc: Loc::Shard {
                        shard: shard as u32,
                        range: t.range.clone(),
                    },
                }))
            }
        }
    }

    /// The tensor `name`, or [`ModelError::MissingTensor`].
    pub fn get(&self, name: &str) -> Result<TensorRef, ModelError> {
        self.find(name)?.ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })
    }

    /// The bytes of `t`, a tensor of this store.
    ///
    /// # Panics
    /// If `t` came from another store (its location does not exist here).
    pub fn data(&self, t: &TensorRef) -> &[u8] {
        match (self, &t.loc) {
            (WeightStore::Gguf(f), Loc::Gguf(info)) => f.tensor_data(info),
            (WeightStore::Safetensors(s), Loc::Shard { shard, range }) => {
                &s.shards()[*shard as usize].bytes()[range.clone()]
            }
            _ => panic!("tensor of another weight store"),
        }
    }

    /// A 2-D weight `name` of `rows × cols`, shape-checked.
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        let t = self.get(name)?;
        check_shape(name, &t, &[rows as u64, cols as u64])?;
        if !cols.is_multiple_of(t.ty.block_size()) {
            return Err(ModelError::BadConfig(format!(
                "'{name}': {cols} columns are not whole {:?} blocks",
                t.ty
            )));
        }
        Ok(self.linear_of(t, rows, cols))
    }

    /// A [`Linear`] over `t`, repacked into Rows16 when its type has that layout (the mapped
    /// pages of the original are then released: nothing reads them again).
    fn linear_of(&self, t: TensorRef, rows: usize, cols: usize) -> Linear {
        let packed = PackedMatrix::pack(&QMatrix::new(t.ty, rows, cols, self.data(&t)));
        if let (Some(_), WeightStore::Gguf(f), Loc::Gguf(info)) = (&packed, self, &t.loc) {
            f.release_tensor_pages(info);
        }
        Linear {
            t,
            rows,
            cols,
            packed: packed.map(Arc::new),
        }
    }

    /// The `n` matrices of `rows × cols` stacked in one 3-D weight `name` of shape
    /// `[n, rows, cols]` (GGUF `ffn_*_exps`: all experts in one tensor), one [`Linear`] per
    /// matrix over its own byte range of the tensor — no copy. The ranges lie inside the
    /// whole tensor, whose bounds the store validated at open.
    pub fn linear_stack(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<Linear>, ModelError> {
        let t = self.get(name)?;
        check_shape(name, &t, &[n as u64, rows as u64, cols as u64])?;
        if !cols.is_multiple_of(t.ty.block_size()) {
            return Err(ModelError::BadConfig(format!(
                "'{name}': {cols} columns are not whole {:?} blocks",
                t.ty
            )));
        }
        let bytes = rows * (cols / t.ty.block_size()) * t.ty.type_size();
        let part = |i: usize| match &t.loc {
            Loc::Gguf(info) => Loc::Gguf(TensorInfo {
                name: info.name.clone(),
                dims: vec![cols as u64, rows as u64],
                ty: info.ty,
                offset: info.offset + (i * bytes) as u64,
                size: bytes as u64,
            }),
            Loc::Shard { shard, range } => Loc::Shard {
                shard: *shard,
                range: range.start + i * bytes..range.start + (i + 1) * bytes,
            },
        };
        Ok((0..n)
            .map(|i| {
                let ti = TensorRef {
                    ty: t.ty,
                    shape: vec![rows as u64, cols as u64],
                    loc: part(i),
                };
                self.linear_of(ti, rows, cols)
            })
            .collect())
    }

    /// A tensor of exactly `shape`, dequantized to f32 (norms, biases, small tables).
    pub fn dense(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name)?;
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        check_shape(name, &t, &want)?;
        let len: usize = shape.iter().product();
        if !len.is_multiple_of(t.ty.block_size()) {
            return Err(ModelError::BadConfig(format!(
                "'{name}': {len} values are not whole {:?} blocks",
                t.ty
            )));
        }
        let mut out = vec![0f32; len];
        dequantize_row(t.ty, self.data(&t), &mut out);
        Ok(out)
    }

    /// [`Self::dense`] when the tensor exists.
    pub fn dense_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Vec<f32>>, ModelError> {
        match self.find(name)? {
            Some(_) => self.dense(name, shape).map(Some),
            None => Ok(None),
        }
    }

    /// A safetensors tensor of any dtype, as its raw little-endian bytes (the I32 / F16
    /// tensors of AWQ / GPTQ int4 layers, read by `int4_linear`); `None` when absent or when
    /// the store is a GGUF file.
    pub fn raw(&self, name: &str) -> Option<RawTensor<'_>> {
        let WeightStore::Safetensors(s) = self else {
            return None;
        };
        let (shard, t) = s.tensor(name)?;
        Some(RawTensor {
            dtype: t.dtype,
            shape: &t.shape,
            data: &s.shards()[shard].bytes()[t.range.clone()],
        })
    }
}

/// A tensor of any dtype in a safetensors store ([`WeightStore::raw`]).
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub dtype: Dtype,
    /// Outermost first.
    pub shape: &'a [u64],
    pub data: &'a [u8],
}

fn check_shape(name: &str, t: &TensorRef, want: &[u64]) -> Result<(), ModelError> {
    if t.shape != want {
        return Err(ModelError::BadShape {
            name: name.into(),
            expected: want.to_vec(),
            found: t.shape.clone(),
        });
    }
    Ok(())
}

/// A linear layer's weight `[rows = out features, cols = in features]`, in its store — and,
/// for Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K, repacked once at load into the interleaved Rows16 layout that
/// `matmul`'s fastest kernels read (`tokenmill_kernels::quant::rows16`; the same bytes,
/// permuted, held beside the mapped file).
#[derive(Clone, Debug)]
pub struct Linear {
    t: TensorRef,
    pub rows: usize,
    pub cols: usize,
    packed: Option<Arc<PackedMatrix>>,
}

impl Linear {
    /// The matrix `matmul` runs on: the Rows16 copy when there is one, else the store's bytes.
    pub fn view<'a>(&'a self, store: &'a WeightStore) -> QMatrix<'a> {
        match &self.packed {
            Some(p) => p.view(),
            None => QMatrix::new(self.t.ty, self.rows, self.cols, store.data(&self.t)),
        }
    }

    pub fn ty(&self) -> GgmlType {
        self.t.ty
    }

    /// Bytes of the weight.
    pub fn n_bytes(&self) -> usize {
        self.rows * (self.cols / self.t.ty.block_size()) * self.t.ty.type_size()
    }
}
