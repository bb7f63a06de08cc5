//! GPU kernels written as Rust functions, one module per family.
//!
//! Every `#[amdgpu_kernel]` below is compiled three ways: for the host (its launcher and
//! the CPU executor), for each configured AMD architecture (code objects embedded in
//! [`__KERNEL_BINARIES`]) and for NVPTX. Launch one with any
//! [`Executor`]:
//!
//! ```
//! use kernels::elementwise::{self, Exp};
//! use kernel_dsl::host::{CpuExecutor, LaunchConfig, WaveSize};
//!
//! let exec = CpuExecutor::new(WaveSize::W64);
//! let x = vec![0.0f32, 1.0, 2.0];
//! let mut y = vec![0.0f32; 3];
//! elementwise::unary::launch::<f32, Exp>(&exec, LaunchConfig::for_elements(3, 64), &x, &[], &mut y).unwrap();
//! assert!((y[2] - 2.0f32.exp()).abs() < 1e-6);
//! ```
// The kernels' alignment tests are written `x % n == 0` (about 60 of them, device code);
// moving them to `is_multiple_of` is a separate change, since each edit rebuilds every code object.
#![allow(clippy::manual_is_multiple_of)]
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
#[allow(clippy::eq_op)]
pub mod arith;
pub mod cmp;
pub mod conv;
pub mod conv_implicit;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::too_many_arguments)]
pub mod convert;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
#[allow(clippy::eq_op)]
pub mod dtype;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
#[allow(clippy::eq_op)]
pub mod elementwise;
// Fragment arrays of the unrolled K loop are spelled out where the register layout matters.
#[allow(clippy::type_complexity)]
pub mod gemm;
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host_args;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::too_many_arguments)]
pub mod indexing;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
// `x == x` is the not-NaN test of device code.
#[allow(clippy::too_many_arguments, clippy::eq_op)]
pub mod llm;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::too_many_arguments)]
pub mod matmul_simple;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::too_many_arguments)]
pub mod indexing_any;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::too_many_arguments)]
pub mod norm;
pub mod permute;
// Candle's bilinear weight clamp, written as its CPU code writes it.
#[allow(clippy::manual_clamp)]
pub mod pool;
pub mod random;
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
// Unit loops index several per-lane register arrays with one counter (unrolled on the GPU);
// shared-memory stages are raw pointers of the device code.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop, clippy::not_unsafe_ptr_arg_deref)]
pub mod quantized;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
#[allow(clippy::eq_op)]
pub mod reduce;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
// Kernels take every buffer, size and stride as an argument (the kernel ABI).
#[allow(clippy::eq_op, clippy::too_many_arguments)]
pub mod reduce_any;
pub mod row;
pub mod rope;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
#[allow(clippy::eq_op)]
pub mod softmax;
// `x != x` is the NaN test of element-generic device code (its traits have no `is_nan`).
// Polynomial coefficients as published; `!(x < y)` keeps NaN on the intended side.
#[allow(clippy::eq_op, clippy::excessive_precision, clippy::neg_cmp_op_on_partial_ord)]
pub mod unary_f64;

kernel_dsl::embed_kernels!();

/// Devices and buffers (the `kernel-runtime` crate): [`runtime::Device`], [`runtime::DeviceVec`].
pub use kernel_runtime as runtime;

pub use kernel_dsl::host::{CpuExecutor, Executor, LaunchConfig, LaunchError, WaveSize};
