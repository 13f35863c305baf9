//! AWQ and GPTQ int4 weights: repacked at load into one row-major layout, multiplied by int4
//! kernels (never dequantized to an f16/f32 matrix).
//!
//! # Pipeline
//!
//! 1. [`formats`] decodes a checkpoint's `qweight` / `qzeros` / `scales` (/ `g_idx`) exactly
//!    as AutoAWQ / AutoGPTQ store them (the spec is in that module's doc).
//! 2. [`Int4Matrix::from_awq`] / [`Int4Matrix::from_gptq`] repack into tokenmill's layout,
//!    one **row per output feature** (like a GGUF weight, `rows = N`, `cols = K`):
//!    * `qs: [N, K / 2]` nibbles in *storage order*: byte `i` of a row holds storage columns
//!      `2i` (low nibble) and `2i + 1` (high nibble);
//!    * `scales: [N, n_groups]` and `mins: [N, n_groups]` f32, with `w = q * scale - min`
//!      (`min = zero * scale`), so one group's contribution is
//!      `scale * Σ x_j q_j - min * Σ x_j`;
//!    * `perm: Option<[K]>`: storage column `j` is input feature `perm[j]`. Act-order GPTQ
//!      (`g_idx` not `k / group`) is sorted by group (stably) so every group is a contiguous
//!      run of `group_size` storage columns; the activation is gathered through `perm` once
//!      per call. Identity orders store `None`.
//! 3. [`matmul`] runs the kernel: per activation row, the group sums `Σ x_j` once; per weight
//!    row and group, the nibbles unpacked to f32 and multiplied into up to [`TILE_ROWS`]
//!    activation rows at once (f32 FMA on unpacked nibbles), weight rows split across the
//!    thread pool. [`matmul_ref`] is its plain twin: dequantize each row to f32 in input
//!    order, then a sequential f32 dot.
//!
//! # Invariants
//!
//! A constructed [`Int4Matrix`] satisfies: `group_size % 8 == 0`, `cols % group_size == 0`,
//! `rows % 8 == 0`, every group of storage columns shares one `g_idx` value, and the
//! buffers have exactly the sizes above; so [`matmul`] only `debug_assert!`s the caller's
//! `x` / `out` lengths (kernels are infallible; shapes are checked at the layer boundary).
//! Bad checkpoint tensors are [`Int4Error`]s, never panics.

mod formats;
mod kernel;

use std::fmt;

pub use formats::{AWQ_ORDER, AWQ_REVERSE_ORDER, AwqTensors, GptqTensors, ZeroFormat};
pub use kernel::{Int4Kernel, TILE_ROWS, matmul, matmul_ref, matmul_with};

use formats::Decoded;

/// Why a checkpoint's int4 tensors were rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Int4Error {
    /// A tensor's byte size does not match the layer's shape.
    TensorSize {
        name: &'static str,
        expected: usize,
        got: usize,
    },
    /// The shape breaks a rule (see the module doc of `formats`).
    Shape {
        in_features: usize,
        out_features: usize,
        group_size: usize,
    },
    /// `g_idx[row]` names a group that does not exist.
    GroupIndex {
        row: usize,
        group: i32,
        n_groups: usize,
    },
    /// After sorting by `g_idx`, a group does not have exactly `group_size` members.
    UnevenGroups { group: usize, members: usize },
}

impl fmt::Display for Int4Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Int4Error::TensorSize {
                name,
                expected,
                got,
            } => write!(f, "int4 {name}: expected {expected} bytes, got {got}"),
            Int4Error::Shape {
                in_features,
                out_features,
                group_size,
            } => write!(
                f,
                "int4 layer {in_features}x{out_features} with group size {group_size}: need \
                 group % 8 == 0, in % group == 0, out % 8 == 0"
            ),
            Int4Error::GroupIndex {
                row,
                group,
                n_groups,
            } => write!(f, "g_idx[{row}] = {group}, but there are {n_groups} groups"),
            Int4Error::UnevenGroups { group, members } => {
                write!(f, "g_idx gives group {group} {members} members")
            }
        }
    }
}

impl std::error::Error for Int4Error {}

/// An int4 weight matrix in tokenmill's layout (module doc): `rows` output features of
/// `cols` input features.
#[derive(Clone, Debug)]
pub struct Int4Matrix {
    rows: usize,
    cols: usize,
    group_size: usize,
    /// `[rows, cols / 2]` nibbles in storage order.
    qs: Vec<u8>,
    /// `[rows, n_groups]`
    scales: Vec<f32>,
    /// `[rows, n_groups]`, `zero * scale`.
    mins: Vec<f32>,
    /// `[rows, n_groups]`, the zero codes (for the reference decoder).
    zeros: Vec<u8>,
    /// Storage column `j` is input feature `perm[j]`; `None` for the identity.
    perm: Option<Vec<u32>>,
}

impl Int4Matrix {
    /// Repacks an AWQ layer (`formats` module doc for the layout).
    pub fn from_awq(t: &AwqTensors<'_>) -> Result<Int4Matrix, Int4Error> {
        Self::repack(formats::decode_awq(t)?)
    }

    /// Repacks a GPTQ layer, act-order included (`formats` module doc for the layout).
    pub fn from_gptq(t: &GptqTensors<'_>) -> Result<Int4Matrix, Int4Error> {
        Self::repack(formats::decode_gptq(t)?)
    }

    fn repack(d: Decoded) -> Result<Int4Matrix, Int4Error> {
        let (k, n, gs) = (d.k, d.n, d.group_size);
        // Storage order: inputs sorted by group, stably (identity when g_idx is k / gs).
        let mut order: Vec<u32> = (0..k as u32).collect();
        order.sort_by_key(|&r| d.g_idx[r as usize]);
        for (g, run) in order.chunks(gs).enumerate() {
            if let Some(&r) = run.iter().find(|&&r| d.g_idx[r as usize] as usize != g) {
                let group = d.g_idx[r as usize] as usize;
                let members = d.g_idx.iter().filter(|&&x| x as usize == group).count();
                return Err(Int4Error::UnevenGroups { group, members });
            }
        }
        let identity = order.iter().enumerate().all(|(j, &r)| j == r as usize);
        let mut qs = vec![0u8; n * k / 2];
        let (mut scales, mut mins) = (vec![0f32; n * d.n_groups], vec![0f32; n * d.n_groups]);
        let mut zeros = vec![0u8; n * d.n_groups];
        for col in 0..n {
            let row = &mut qs[col * k / 2..(col + 1) * k / 2];
            for (i, b) in row.iter_mut().enumerate() {
                let (lo, hi) = (order[2 * i] as usize, order[2 * i + 1] as usize);
                *b = d.q[lo * n + col] | (d.q[hi * n + col] << 4);
            }
            for g in 0..d.n_groups {
                let s = d.s[g * n + col];
                let z = d.z[g * n + col];
                scales[col * d.n_groups + g] = s;
                mins[col * d.n_groups + g] = f32::from(z) * s;
                zeros[col * d.n_groups + g] = z;
            }
        }
        Ok(Int4Matrix {
            rows: n,
            cols: k,
            group_size: gs,
            qs,
            scales,
            mins,
            zeros,
            perm: (!identity).then_some(order),
        })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn group_size(&self) -> usize {
        self.group_size
    }

    pub fn n_groups(&self) -> usize {
        self.cols / self.group_size
    }

    /// Whether the input features are stored permuted (act-order GPTQ).
    pub fn is_permuted(&self) -> bool {
        self.perm.is_some()
    }

    /// Bytes held (nibbles, scales, mins, permutation).
    pub fn size_bytes(&self) -> usize {
        self.qs.len()
            + self.zeros.len()
            + 4 * (self.scales.len() + self.mins.len())
            + self.perm.as_ref().map_or(0, |p| 4 * p.len())
    }

    /// Row `r` (output feature) dequantized into `dst` in **input order**, `W[k, r]` for
    /// `k < cols` (the reference decoder; `(q - z) * s` as the checkpoint defines it).
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) {
        assert!(
            r < self.rows && dst.len() == self.cols,
            "row {r}, {} cols",
            dst.len()
        );
        let ng = self.n_groups();
        let row = &self.qs[r * self.cols / 2..(r + 1) * self.cols / 2];
        for j in 0..self.cols {
            let q = (row[j / 2] >> (4 * (j % 2))) & 0xF;
            let g = j / self.group_size;
            let (s, z) = (self.scales[r * ng + g], self.zeros[r * ng + g]);
            let k = self.perm.as_ref().map_or(j, |p| p[j] as usize);
            dst[k] = (f32::from(q) - f32::from(z)) * s;
        }
    }
}
