//! tokenmill-kernels: the compute layer.
//!
//! Owns the quantized block formats (`quant`), matrix multiplication over weights in their
//! native format (`matmul`, with several matrices over one input in one pass), the fused
//! SwiGLU gate (`glu`), AWQ/GPTQ int4 weights and their matmul (`int4`), paged flash-style attention (`attention`), and the element-wise /
//! normalisation ops the model layers call (`ops`). Kernels are infallible: shapes are checked at the layer boundary, and a kernel
//! only `debug_assert!`s them. Plain data at the bottom, under both the kernel table and the
//! ops: the weight view `QMatrix` (`qmatrix`) and the K/V element types (`kv_elem`).
//!
//! Performance plumbing, both process-wide and initialised lazily on first use:
//! * [`dispatch`]: the kernel table of the best SIMD tier this CPU supports (AVX-512 VNNI,
//!   AVX-VNNI, AVX2, scalar), detected once; the raw SIMD kernels live in the private `simd`
//!   module and are only reachable through it;
//! * [`pool`]: one persistent thread pool (`parallel_for`) for every op; the binary may call
//!   [`pool::set_num_threads`] once at start-up (`--threads`), default = available cores.

pub mod attention;
pub mod dispatch;
pub mod glu;
pub mod grouped;
pub mod int4;
pub mod kv_elem;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod qmatrix;
pub mod quant;
mod simd;

pub use simd::MAX_ROWS;
