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
pub mod elementwise;
pub mod indexing;
pub mod norm;
pub mod reduce;
pub mod row;
pub mod rope;
pub mod softmax;

kernel_dsl::embed_kernels!();

/// Devices and buffers (the `kernel-runtime` crate): [`runtime::Device`], [`runtime::DeviceVec`].
pub use kernel_runtime as runtime;

pub use kernel_dsl::host::{CpuExecutor, Executor, LaunchConfig, LaunchError, WaveSize};
