//! Kernels that exist only to be measured.
use kernel_dsl::prelude::*;

/// Does nothing: its time is the launch overhead.
#[amdgpu_kernel]
pub fn empty(_out: &mut [u32]) {}
