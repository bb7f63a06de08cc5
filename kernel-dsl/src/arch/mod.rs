//! Backend primitives: one implementation per target, the same signatures everywhere.
#[cfg(target_arch = "amdgpu")]
mod amdgpu;
#[cfg(target_arch = "amdgpu")]
pub use amdgpu::*;

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host;
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;

#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
mod gpu_math;
