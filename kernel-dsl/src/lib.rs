//! Device-side API for GPU kernels written as plain Rust functions.
//!
//! A kernel is a function marked [`amdgpu_kernel`]; its body uses the items of this crate
//! (usually through [`prelude`]) for everything GPU-specific:
//!
//! | need                         | API                                                        |
//! |------------------------------|------------------------------------------------------------|
//! | indices and dimensions       | [`thread_idx`], [`block_idx`], [`block_dim`], [`grid_dim`], [`global_idx_x`] |
//! | work-group barrier           | [`barrier`]                                                |
//! | shared memory (LDS)          | [`Shared`] (size fixed at compile time), [`SharedDyn`] (sized at launch) |
//! | wave (warp) operations       | [`wave`]: lane id, wave size, shuffles, ballot, reductions |
//! | atomics                      | [`atomic`]                                                 |
//! | 8-bit integer dot products   | [`dot`]: `dot4_i8`, `dot4_i8_u8` (dp4a, `v_dot4_i32_i8`)      |
//! | fast math                    | [`math::FloatMath`] (`x.exp()`, `x.rsqrt()`, `x.erf()` ...) |
//! | matrix units (MFMA, WMMA, mma.sync) | [`mma`]: 16x16x16 fragments, `mma`, accumulator -> A, row reductions |
//! | half precision               | [`f16`](struct@f16), [`bf16`] (the `half` crate's types on the host), [`Float`] |
//!
//! The same source compiles three ways: for `amdgcn-amd-amdhsa` and `nvptx64-nvidia-cuda`
//! (by `build-support`, where this crate is `no_std` and has no dependencies), and for the
//! host, where every call is served by the CPU executor (`cpu-executor`) that emulates the
//! kernel model: work-groups, barriers, LDS and waves of 32 or 64 lanes.
#![cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), no_std)]
#![cfg_attr(
    any(target_arch = "amdgpu", target_arch = "nvptx64"),
    feature(

        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem,
        link_llvm_intrinsics,
        abi_unadjusted,
        repr_simd,
        simd_ffi,
        f16
    ),
    allow(internal_features)
)]
#![cfg_attr(target_arch = "amdgpu", feature(stdarch_amdgpu))]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]
#![warn(missing_docs)]

/// NVIDIA inline assembly of one four-word vector load: `$template` names the address
/// operand `{p}` (an input of register class `$class`) and the destinations `{a}`..`{d}`;
/// evaluates to the four words. Memory is only read. Use inside `unsafe`.
#[cfg(target_arch = "nvptx64")]
macro_rules! asm_load_u32x4 {
    ($template:literal, $class:ident, $p:expr) => {{
        let (a, b, c, d): (u32, u32, u32, u32);
        core::arch::asm!(
            $template,
            p = in($class) $p,
            a = out(reg32) a,
            b = out(reg32) b,
            c = out(reg32) c,
            d = out(reg32) d,
            options(nostack, readonly, preserves_flags),
        );
        [a, b, c, d]
    }};
}

mod arch;
pub mod atomic;
pub mod dot;
pub mod grid;
pub mod hint;
mod index;
pub mod math;
pub mod mma;
mod shared;
mod sync;
mod types;
pub mod wave;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;

pub use index::*;
pub use shared::{Shared, SharedDyn};
pub use sync::{barrier, barrier_global};
pub use types::{bf16, f16, CastFrom, Element, Float};

/// Marks a function as a GPU kernel.
///
/// On the host this keeps the function, checks that the DSL can compile it for a GPU, and
/// generates a module of the same name holding the typed launcher (`NAME::launch`), the
/// argument layout the launcher packs (`NAME::ABI`) and the CPU-executor entry. The device
/// build (`build-support`) turns the same source into an `extern "gpu-kernel"` entry point.
///
/// Generic kernels list their instances: `#[amdgpu_kernel(T = [f32, f16, bf16])]`; every
/// combination becomes one GPU symbol named `fn_t1_t2...` (snake case).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use kernel_dsl_macros::amdgpu_kernel;

/// Marks a device helper function (callable from kernels; inlined, no launcher).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use kernel_dsl_macros::device;

/// Everything a kernel body usually needs: `use kernel_dsl::prelude::*;`.
pub mod prelude {
    pub use crate::atomic::{AtomicF32, AtomicI32, AtomicU32, AtomicU64, Ordering};
    pub use crate::dot::{dot4_i8, dot4_i8_u8};
    pub use crate::index::*;
    pub use crate::math::FloatMath;
    pub use crate::shared::{Shared, SharedDyn};
    pub use crate::sync::{barrier, barrier_global};
    pub use crate::types::{bf16, f16, CastFrom, Element, Float};
    pub use crate::wave;
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    pub use kernel_dsl_macros::{amdgpu_kernel, device};
}

/// Support items used by code that `#[amdgpu_kernel]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::shared::shared_base;
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    pub use cpu_executor;
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    pub use inventory;

    /// Rounds `offset` up to a multiple of `align` (a power of two).
    pub const fn align_up(offset: usize, align: usize) -> usize {
        (offset + align - 1) & !(align - 1)
    }
}

/// Panic handler of the device build: a panic (failed bounds check, `unwrap` on `None`)
/// stops the wave with a trap, which the runtime reports as a failed launch.
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::intrinsics::abort()
}

/// Embeds the code objects and PTX that `build-support` built for this crate. Put it once
/// at the crate root of every crate that defines kernels; launchers find it there.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
#[macro_export]
macro_rules! embed_kernels {
    () => {
        /// Code objects, PTX and resource figures of this crate's kernels.
        pub static __KERNEL_BINARIES: $crate::host::EmbeddedKernels =
            include!(concat!(env!("OUT_DIR"), "/kernel_binaries.rs"));
    };
}

/// Device-side stand-ins so `use kernel_dsl::{amdgpu_kernel, device};` resolves in the
/// device build (which removes the attributes before compiling).
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[doc(hidden)]
pub mod amdgpu_kernel {}
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[doc(hidden)]
pub mod device {}
