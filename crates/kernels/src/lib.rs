//! tokenmill-kernels: the compute layer.
//!
//! Owns the quantized block formats (`quant`), matrix multiplication over weights in their
//! native format (`matmul`), and the element-wise / normalisation / attention ops the model
//! layers call. Kernels are infallible: shapes are checked at the layer boundary, and a kernel
//! only `debug_assert!`s them.

pub mod attention;
pub mod matmul;
pub mod ops;
pub mod quant;
