//! Tensor infos: [`TensorInfo`], how they are read, and the layout checks that make
//! [`crate::GgufFile::tensor_data`] infallible.
//!
//! Per tensor (at read time): the name is UTF-8; `1 <= n_dims <= MAX_DIMS` (checked before any
//! dim is read); the type id is one [`GgmlType`] knows; no dim is zero; the element count and
//! byte size do not overflow; the row length `dims[0]` is a whole number of blocks.
//!
//! Across tensors (once the data section's start is known): names are unique; each relative
//! offset is a multiple of the alignment; `data_offset + offset + size` does not overflow and
//! is at most the file length; sorted by offset, each tensor ends at or before the next starts.

use tokenmill_kernels::quant::GgmlType;

use crate::error::{DimsProblem, GgufError};
use crate::reader::{Reader, bounded_vec};

/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;

/// The smallest encoding of a tensor info: empty name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's name, shape, type and where its data lies in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (fastest-varying), `dims[1]` the row count of
    /// a matrix. A `[n_embd, n_vocab]` embedding has `n_vocab` rows of `n_embd` elements.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file (a multiple of the file's alignment).
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Product of the dims (saturating, though a parsed tensor's count never overflows).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Elements per row: `dims[0]`.
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes per row (`row_len` elements of `ty`).
    pub fn row_size(&self) -> u64 {
        self.ty.bytes_for(self.row_len()).unwrap_or(0)
    }

    /// Absolute end offset of the data (exclusive).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }
}

/// The parsed tensor infos plus an index sorted by name.
#[derive(Clone, Debug, Default)]
pub(crate) struct TensorTable {
    pub(crate) infos: Vec<TensorInfo>,
    /// Positions into `infos`, sorted by name.
    by_name: Vec<usize>,
}

impl TensorTable {
    /// Reads `count` tensor infos (the count stored at `count_offset`). Their `offset`s are
    /// still relative to the data section; [`TensorTable::place`] makes them absolute.
    pub(crate) fn read(
        r: &mut Reader<'_>,
        count: u64,
        count_offset: u64,
    ) -> Result<TensorTable, GgufError> {
        r.check_count(count, MIN_TENSOR_INFO_SIZE, "tensor count", count_offset)?;
        let mut infos = bounded_vec(count, r.remaining());
        for _ in 0..count {
            infos.push(read_info(r)?);
        }
        let mut by_name: Vec<usize> = (0..infos.len()).collect();
        let name = |i: &usize| infos.get(*i).map_or("", |t| t.name.as_str());
        by_name.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        if let Some(pair) = by_name.windows(2).find(|w| name(&w[0]) == name(&w[1])) {
            return Err(GgufError::DuplicateTensor(name(&pair[0]).to_owned()));
        }
        Ok(TensorTable { infos, by_name })
    }

    /// Checks every tensor's alignment and bounds against a data section starting at
    /// `data_offset` in a file of `file_len` bytes, makes offsets absolute, and rejects
    /// overlaps.
    pub(crate) fn place(
        &mut self,
        data_offset: u64,
        alignment: u64,
        file_len: u64,
    ) -> Result<(), GgufError> {
        for t in &mut self.infos {
            // `alignment` is a nonzero power of two (checked by the caller).
            if t.offset % alignment.max(1) != 0 {
                return Err(GgufError::TensorMisaligned {
                    name: t.name.clone(),
                    offset: t.offset,
                    alignment,
                });
            }
            let start = data_offset.checked_add(t.offset);
            match start.and_then(|s| s.checked_add(t.size)) {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        offset: t.offset,
                        size: t.size,
                        data_offset,
                        file_len,
                    });
                }
            }
            t.offset = start.unwrap_or(u64::MAX);
        }
        self.check_overlaps()
    }

    fn check_overlaps(&self) -> Result<(), GgufError> {
        let mut by_offset: Vec<&TensorInfo> = self.infos.iter().collect();
        by_offset.sort_unstable_by_key(|t| (t.offset, t.end()));
        for pair in by_offset.windows(2) {
            if let [a, b] = pair
                && a.end() > b.offset
            {
                return Err(GgufError::TensorsOverlap {
                    a: a.name.clone(),
                    b: b.name.clone(),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&TensorInfo> {
        let name_at = |i: usize| self.infos.get(i).map_or("", |t| t.name.as_str());
        let pos = self
            .by_name
            .binary_search_by(|&i| name_at(i).cmp(name))
            .ok()?;
        let i = *self.by_name.get(pos)?;
        self.infos.get(i)
    }
}

/// Reads and checks one tensor info (offset left relative).
fn read_info(r: &mut Reader<'_>) -> Result<TensorInfo, GgufError> {
    let name = r.string("tensor name")?;
    let n_dims = r.u32("tensor n_dims")?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadDimCount { name, n_dims });
    }
    let mut dims = Vec::with_capacity(MAX_DIMS as usize);
    for _ in 0..n_dims {
        dims.push(r.u64("tensor dims")?);
    }
    let id = r.u32("tensor type")?;
    let offset = r.u64("tensor offset")?;
    let Some(ty) = GgmlType::from_id(id) else {
        return Err(GgufError::UnknownTensorType { name, id });
    };
    match byte_size(&dims, ty) {
        Ok(size) => Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        }),
        Err(problem) => Err(GgufError::BadDims {
            name,
            dims,
            problem,
        }),
    }
}

/// Bytes taken by a tensor of shape `dims` and type `ty`, or why the shape is unusable.
fn byte_size(dims: &[u64], ty: GgmlType) -> Result<u64, DimsProblem> {
    if dims.contains(&0) {
        return Err(DimsProblem::ZeroDim);
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or(DimsProblem::Overflow)?;
    let block_size = ty.block_size() as u64;
    let row_len = dims.first().copied().unwrap_or(1);
    if row_len % block_size != 0 {
        return Err(DimsProblem::RowNotBlockMultiple { block_size });
    }
    ty.bytes_for(n_elements).ok_or(DimsProblem::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, offset: u64, size: u64) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: vec![size],
            ty: GgmlType::F32,
            offset,
            size,
        }
    }

    #[test]
    fn shapes() {
        assert_eq!(byte_size(&[64, 2], GgmlType::Q4_1), Ok(80));
        assert_eq!(byte_size(&[4, 0], GgmlType::F32), Err(DimsProblem::ZeroDim));
        assert_eq!(
            byte_size(&[33], GgmlType::Q8_0),
            Err(DimsProblem::RowNotBlockMultiple { block_size: 32 })
        );
        assert_eq!(
            byte_size(&[1 << 32, 1 << 32, 1 << 32], GgmlType::F32),
            Err(DimsProblem::Overflow)
        );
        // Element count fits, byte size does not.
        assert_eq!(
            byte_size(&[1 << 32, 1 << 31], GgmlType::F32),
            Err(DimsProblem::Overflow)
        );
    }

    #[test]
    fn placement_checks_alignment_bounds_and_overlap() {
        let table = |infos: Vec<TensorInfo>| TensorTable {
            infos,
            by_name: Vec::new(),
        };
        let mut ok = table(vec![info("b", 32, 8), info("a", 0, 32)]);
        ok.place(64, 32, 104).unwrap();
        assert_eq!(ok.infos[0].offset, 96);

        let mut mis = table(vec![info("a", 4, 4)]);
        assert!(matches!(
            mis.place(64, 32, 1000),
            Err(GgufError::TensorMisaligned { .. })
        ));

        let mut oob = table(vec![info("a", 32, 8)]);
        assert!(matches!(
            oob.place(64, 32, 100),
            Err(GgufError::TensorOutOfBounds { .. })
        ));

        let mut wrap = table(vec![info("a", u64::MAX - 31, 8)]);
        assert!(matches!(
            wrap.place(64, 32, 100),
            Err(GgufError::TensorOutOfBounds { .. })
        ));

        let mut overlap = table(vec![info("a", 0, 40), info("b", 32, 8)]);
        assert!(matches!(
            overlap.place(0, 32, 100),
            Err(GgufError::TensorsOverlap { a, b }) if a == "a" && b == "b"
        ));
    }

    #[test]
    fn counts_accessors() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![64, 3],
            ty: GgmlType::Q4_1,
            offset: 0,
            size: 120,
        };
        assert_eq!(
            (t.n_elements(), t.row_len(), t.n_rows(), t.row_size()),
            (192, 64, 3, 40)
        );
    }
}
