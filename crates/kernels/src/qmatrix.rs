//! Weight matrices as the kernels see them: [`QMatrix`], a view of `rows × cols` elements of a
//! [`GgmlType`] in a [`Layout`] (GGUF's row-major blocks, or Rows16's interleaved groups), and
//! [`PackedMatrix`], the owned Rows16 repack the model makes once at load. Plain data over
//! the block formats of [`crate::quant`]; the kernel table ([`crate::dispatch`]) and
//! [`crate::matmul`] both build on it.

use crate::quant::{GgmlType, dequantize_row, rows16};

/// How a weight matrix's bytes are arranged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Row after row, as in GGUF.
    #[default]
    Ggml,
    /// Groups of 16 interleaved rows ([`crate::quant::rows16`]; Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), the last
    /// group padded with zero rows.
    Rows16,
}

/// A weight matrix view: `rows` rows of `cols` elements of type `ty`, laid out as `layout`
/// says (GGUF's row-major blocks, or repacked by [`PackedMatrix`]).
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub layout: Layout,
}

impl<'a> QMatrix<'a> {
    /// A view of GGUF-layout bytes.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> QMatrix<'a> {
        QMatrix {
            ty,
            rows,
            cols,
            data,
            layout: Layout::Ggml,
        }
    }

    /// A view of an f32 matrix held as `f32`s (`data.len() == rows * cols`, row-major): type
    /// [`GgmlType::F32`], read in place by the float path (e.g. a router weight kept in f32).
    /// Its bytes are in native order, which is GGUF's little-endian on the x86-64 targets
    /// the kernels are built for (a big-endian target would need a converted copy).
    pub fn from_f32(rows: usize, cols: usize, data: &'a [f32]) -> QMatrix<'a> {
        assert_eq!(data.len(), rows * cols, "not a [{rows}, {cols}] matrix");
        // SAFETY: any initialised f32 is readable as its 4 bytes; u8 has alignment 1, and the
        // byte slice borrows `data` for the same lifetime.
        let bytes =
            unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), data.len() * 4) };
        QMatrix::new(GgmlType::F32, rows, cols, bytes)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// Rows the data holds: `rows`, rounded up to whole groups for [`Layout::Rows16`].
    pub fn stored_rows(&self) -> usize {
        match self.layout {
            Layout::Ggml => self.rows,
            Layout::Rows16 => self.rows.div_ceil(rows16::GROUP) * rows16::GROUP,
        }
    }

    /// Rows a task or tile must start at a multiple of (1, or a Rows16 group).
    pub fn row_align(&self) -> usize {
        match self.layout {
            Layout::Ggml => 1,
            Layout::Rows16 => rows16::GROUP,
        }
    }

    /// The bytes of rows `r0..r1` (`r0` a multiple of [`Self::row_align`]; a Rows16 tile
    /// includes the padding rows of its last group).
    pub fn rows_bytes(&self, r0: usize, r1: usize) -> &'a [u8] {
        let end = match self.layout {
            Layout::Ggml => r1,
            Layout::Rows16 => r1.div_ceil(rows16::GROUP) * rows16::GROUP,
        };
        &self.data[r0 * self.row_bytes()..end * self.row_bytes()]
    }

    /// The GGUF bytes of row `r` — only in [`Layout::Ggml`] (panics otherwise).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert_eq!(self.layout, Layout::Ggml, "row bytes of a repacked matrix");
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `dst` (`dst.len() == cols`), in either layout.
    pub fn dequantize_row_into(&self, r: usize, dst: &mut [f32]) {
        match self.layout {
            Layout::Ggml => dequantize_row(self.ty, self.row(r), dst),
            Layout::Rows16 => {
                assert!(r < self.rows && dst.len() == self.cols, "row {r}");
                let mut block = [0u8; 256];
                let block = &mut block[..self.ty.type_size()];
                for (b, d) in dst.chunks_exact_mut(self.ty.block_size()).enumerate() {
                    let gb = rows16::group_block(self.ty, self.cols, self.data, r, b);
                    rows16::unpack_block(self.ty, gb, r % rows16::GROUP, block);
                    dequantize_row(self.ty, block, d);
                }
            }
        }
    }
}

/// A weight repacked once at load into [`Layout::Rows16`] (owned, 64-byte aligned): what the
/// model keeps for every Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K linear layer, so `matmul` runs the Rows16 kernels.
#[derive(Clone)]
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    lines: Vec<CacheLine>,
    len: usize,
}

/// 64 bytes, 64-aligned: the storage unit of [`PackedMatrix`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl PackedMatrix {
    /// Repacks a GGUF-layout matrix, or `None` when its type has no Rows16 layout (or its
    /// columns are not whole blocks).
    pub fn pack(w: &QMatrix<'_>) -> Option<PackedMatrix> {
        if w.layout != Layout::Ggml
            || !rows16::supports(w.ty)
            || !w.cols.is_multiple_of(w.ty.block_size())
        {
            return None;
        }
        let len = rows16::packed_bytes(w.ty, w.rows, w.cols);
        let mut lines = vec![CacheLine([0; 64]); len.div_ceil(64)];
        // SAFETY: `lines` is `len.div_ceil(64)` initialised 64-byte lines of plain bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), len) };
        rows16::pack_into(w.ty, w.rows, w.cols, w.data, bytes);
        Some(PackedMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            lines,
            len,
        })
    }

    /// The matrix view (layout [`Layout::Rows16`]).
    pub fn view(&self) -> QMatrix<'_> {
        // SAFETY: `lines` is `len.div_ceil(64)` initialised 64-byte lines, plain bytes.
        let data =
            unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) };
        QMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data,
            layout: Layout::Rows16,
        }
    }

    /// Bytes held.
    pub fn n_bytes(&self) -> usize {
        self.len
    }
}
