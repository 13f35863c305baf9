//! The checkpoint layouts of AWQ and GPTQ int4 weights, decoded element by element.
//!
//! Both store a linear layer `y = x W` with `W: [in_features K, out_features N]` as 4-bit codes
//! `q` with per-group f16 `scales` and 4-bit `zeros`; the dequantized weight is
//! `W[k, n] = (q[k, n] - z[g(k), n]) * s[g(k), n]`. Tensors are little-endian.
//!
//! # AWQ (AutoAWQ "GEMM" format, as HF transformers / vLLM `awq` read it)
//!
//! * `qweight`: int32 `[K, N / 8]`. Word `(k, c)` packs the 8 output columns `8c..8c + 8` of
//!   input row `k`; nibble `i` (bits `4i..4i + 4`) holds column `8c + AWQ_ORDER[i]` with
//!   `AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]` — so column `8c + j` sits in nibble
//!   `AWQ_REVERSE_ORDER[j]`, `AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`.
//! * `qzeros`: int32 `[K / group, N / 8]`, the same interleaved packing; zeros are stored as
//!   they are (no offset).
//! * `scales`: f16 `[K / group, N]`. `g(k) = k / group`.
//!
//! Spec: AutoAWQ `awq/modules/linear/gemm.py` (`WQLinear_GEMM.from_linear` packs with
//! `order_map = [0, 2, 4, 6, 1, 3, 5, 7]`), vLLM `awq_triton.py` / `AWQ_REVERSE_ORDER`.
//!
//! # GPTQ (AutoGPTQ / GPTQModel "gptq" checkpoint format)
//!
//! * `qweight`: int32 `[K / 8, N]`. Word `(r, n)` packs input rows `8r..8r + 8` of column `n`,
//!   row `8r + i` in nibble `i` (sequential).
//! * `qzeros`: int32 `[n_groups, N / 8]`, sequential nibbles: column `8c + j` in nibble `j`.
//!   The classic format stores **zero − 1** (AutoGPTQ's `pack` does `zeros -= 1` before
//!   packing and every kernel adds 1 back: `qlinear_cuda_old.py`, vLLM `gptq` kernels'
//!   `zero + 1`, HF `GPTQConfig` with `checkpoint_format="gptq"`); the nibble is read and
//!   1 added, so a stored 15 reads as 16 (exactly what those kernels compute). GPTQModel's
//!   `gptq_v2` format stores the zero itself: [`ZeroFormat::V2`].
//! * `scales`: f16 `[n_groups, N]`.
//! * `g_idx`: int32 `[K]`, the group of each input row. Without act-order it is `k / group`;
//!   with act-order (`desc_act=True`) the rows were quantized in a permuted order and
//!   `g_idx` is an arbitrary assignment in which every group still has `group` members.
//!
//! Every decoder here checks the tensor sizes first and returns an [`super::Int4Error`]
//! instead of indexing out of bounds.

use half::f16;

use super::Int4Error;

/// Which output column each nibble of an AWQ word holds.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// Which nibble of an AWQ word holds output column `8c + j`.
pub const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// How a GPTQ checkpoint stores its zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroFormat {
    /// The classic "gptq" format: the nibble holds `zero - 1`.
    Classic,
    /// GPTQModel's "gptq_v2": the nibble holds the zero.
    V2,
}

/// The raw tensors of one AWQ linear layer (little-endian bytes as in the safetensors file).
#[derive(Clone, Copy, Debug)]
pub struct AwqTensors<'a> {
    pub qweight: &'a [u8],
    pub qzeros: &'a [u8],
    pub scales: &'a [u8],
    pub in_features: usize,
    pub out_features: usize,
    pub group_size: usize,
}

/// The raw tensors of one GPTQ linear layer (little-endian bytes as in the safetensors file).
#[derive(Clone, Copy, Debug)]
pub struct GptqTensors<'a> {
    pub qweight: &'a [u8],
    pub qzeros: &'a [u8],
    pub scales: &'a [u8],
    /// `None` when the checkpoint has no `g_idx` (groups are `k / group_size`).
    pub g_idx: Option<&'a [u8]>,
    pub in_features: usize,
    pub out_features: usize,
    pub group_size: usize,
    pub zero_format: ZeroFormat,
}

/// A checkpoint decoded into plain per-element arrays (what the repacker consumes).
pub(crate) struct Decoded {
    /// `q[k * N + n]`, 0..=15.
    pub q: Vec<u8>,
    /// `z[g * N + n]` (0..=16: GPTQ classic can read 16).
    pub z: Vec<u8>,
    /// `s[g * N + n]`.
    pub s: Vec<f32>,
    /// `g(k)` for every input row.
    pub g_idx: Vec<u32>,
    pub k: usize,
    pub n: usize,
    pub n_groups: usize,
    pub group_size: usize,
}

fn words(name: &'static str, bytes: &[u8], expected: usize) -> Result<Vec<u32>, Int4Error> {
    if bytes.len() != 4 * expected {
        return Err(Int4Error::TensorSize {
            name,
            expected: 4 * expected,
            got: bytes.len(),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn halfs(name: &'static str, bytes: &[u8], expected: usize) -> Result<Vec<f32>, Int4Error> {
    if bytes.len() != 2 * expected {
        return Err(Int4Error::TensorSize {
            name,
            expected: 2 * expected,
            got: bytes.len(),
        });
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect())
}

/// Shape rules shared by both formats: `K % group == 0`, `group % 8 == 0`, `N % 8 == 0`,
/// nothing zero. Returns the number of groups.
fn check_shape(k: usize, n: usize, group: usize) -> Result<usize, Int4Error> {
    let ok = k > 0
        && n > 0
        && group > 0
        && group.is_multiple_of(8)
        && k.is_multiple_of(group)
        && n.is_multiple_of(8);
    if !ok {
        return Err(Int4Error::Shape {
            in_features: k,
            out_features: n,
            group_size: group,
        });
    }
    Ok(k / group)
}

/// Decodes an AWQ layer (module doc).
pub(crate) fn decode_awq(t: &AwqTensors<'_>) -> Result<Decoded, Int4Error> {
    let (k, n, group) = (t.in_features, t.out_features, t.group_size);
    let n_groups = check_shape(k, n, group)?;
    let qw = words("qweight", t.qweight, k * n / 8)?;
    let qz = words("qzeros", t.qzeros, n_groups * n / 8)?;
    let s = halfs("scales", t.scales, n_groups * n)?;
    let nibble = |w: &[u32], row: usize, col: usize| {
        let word = w[row * (n / 8) + col / 8];
        ((word >> (4 * AWQ_REVERSE_ORDER[col % 8])) & 0xF) as u8
    };
    let q = (0..k * n).map(|i| nibble(&qw, i / n, i % n)).collect();
    let z = (0..n_groups * n)
        .map(|i| nibble(&qz, i / n, i % n))
        .collect();
    let g_idx = (0..k).map(|r| (r / group) as u32).collect();
    Ok(Decoded {
        q,
        z,
        s,
        g_idx,
        k,
        n,
        n_groups,
        group_size: group,
    })
}

/// Decodes a GPTQ layer (module doc).
pub(crate) fn decode_gptq(t: &GptqTensors<'_>) -> Result<Decoded, Int4Error> {
    let (k, n, group) = (t.in_features, t.out_features, t.group_size);
    let n_groups = check_shape(k, n, group)?;
    let qw = words("qweight", t.qweight, k / 8 * n)?;
    let qz = words("qzeros", t.qzeros, n_groups * n / 8)?;
    let s = halfs("scales", t.scales, n_groups * n)?;
    let q = (0..k * n)
        .map(|i| {
            let (row, col) = (i / n, i % n);
            ((qw[(row / 8) * n + col] >> (4 * (row % 8))) & 0xF) as u8
        })
        .collect();
    let plus = u8::from(t.zero_format == ZeroFormat::Classic);
    let z = (0..n_groups * n)
        .map(|i| {
            let (g, col) = (i / n, i % n);
            ((qz[g * (n / 8) + col / 8] >> (4 * (col % 8))) & 0xF) as u8 + plus
        })
        .collect();
    let g_idx = match t.g_idx {
        None => (0..k).map(|r| (r / group) as u32).collect(),
        Some(bytes) => {
            let raw = words("g_idx", bytes, k)?;
            if let Some(pos) = raw.iter().position(|&g| g as usize >= n_groups) {
                return Err(Int4Error::GroupIndex {
                    row: pos,
                    group: raw[pos] as i32,
                    n_groups,
                });
            }
            raw
        }
    };
    Ok(Decoded {
        q,
        z,
        s,
        g_idx,
        k,
        n,
        n_groups,
        group_size: group,
    })
}
