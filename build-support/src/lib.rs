//! Compiles a crate's GPU kernels from its `build.rs`.
//!
//! ```no_run
//! // build.rs, in `fn main`:
//! build_support::KernelBuild::new().module("elementwise").build();
//! ```
//! and at the crate root: `kernel_dsl::embed_kernels!();`.
//!
//! For each listed module file (`src/<name>.rs`), the build
//! 1. finds a rustc that can build GPU code ([`toolchain`]): `$KERNEL_RUSTC`, rustup's
//!    nightly, or the current rustc with `RUSTC_BOOTSTRAP=1`;
//! 2. provides `core` for the GPU targets ([`sysroot`]): from `rust-src` when installed,
//!    otherwise rebuilt from the source pages of the toolchain's `rust-docs`; cached per
//!    toolchain and target CPU so later builds reuse it;
//! 3. expands the kernels for the device (`kernel-dsl-codegen`, the code the proc macro
//!    uses for the host) and compiles them for every configured AMD architecture (code
//!    objects) and for PTX ([`compile`]), in parallel, skipping work whose inputs did not
//!    change;
//! 4. reads each code object's metadata ([`metadata`]) and PTX entry list ([`ptx`]) and
//!    **fails the build** when a kernel's argument layout differs from what its launcher
//!    packs ([`check`]);
//! 5. writes `$OUT_DIR/kernel_binaries.rs`, which `embed_kernels!()` includes: the code
//!    objects, the PTX and each kernel's VGPR/SGPR/LDS/scratch/spill figures.
//!
//! Environment: `KERNEL_ARCHS` (comma list, default
//! `gfx90a,gfx942,gfx950,gfx1030,gfx1100,gfx1101,gfx1151,gfx1200,gfx1201`; gfx12 has no
//! WMMA lowering yet, its `mma` kernels use the VALU lowering, see `kernel_dsl::mma`),
//! `KERNEL_PTX` (`0` to skip PTX), `KERNEL_PTX_ARCH` (default `sm_80`), `KERNEL_RUSTC`,
//! `KERNEL_SYSROOT_CACHE`, `KERNEL_SKIP_GPU_BUILD=1` (embed nothing; CPU executor only).
pub mod check;
pub mod compile;
pub mod metadata;
pub mod ptx;
pub mod sysroot;
pub mod toolchain;

mod build;
mod error;

pub use build::{BuildReport, KernelBuild};
pub use error::BuildError;

/// AMD architectures built when `KERNEL_ARCHS` is not set.
pub const DEFAULT_ARCHS: &[&str] = &["gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201"];

/// PTX target when `KERNEL_PTX_ARCH` is not set (Ampere and newer, H100 included).
pub const DEFAULT_PTX_ARCH: &str = "sm_80";

/// Largest work-group a kernel can be launched with unless it gives a smaller bound
/// (`#[amdgpu_kernel(max_threads = N)]`). Each PTX entry gets `.maxntid` of its bound, so
/// that `ptxas` keeps it within the registers a block of that size has (64 per thread at
/// 1024, 255 at 256) instead of failing such launches with
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`. Each AMDGPU kernel is compiled with
/// `amdgpu-flat-work-group-size` `1,bound` ([`compile::launch_bounds_csv`]), so LLVM gives
/// it the registers a work-group of that size allows (on gfx11 wave32: 128 VGPRs at 1024,
/// 256 at 256 or fewer) and its code object states the bound
/// (`.max_flat_workgroup_size`, checked by the build). The launcher rejects larger
/// work-groups (`LaunchError::BlockTooLarge`).
pub const MAX_WORK_GROUP: u32 = 1024;
