//! Work-item indices and launch dimensions.
use crate::arch;

/// A three-component size or index (x fastest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dim3 {
    /// Fastest-varying component.
    pub x: u32,
    /// Middle component.
    pub y: u32,
    /// Slowest-varying component.
    pub z: u32,
}

macro_rules! dim3_fn {
    ($(#[$doc:meta])* $name:ident, $x:ident, $y:ident, $z:ident) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> Dim3 {
            Dim3 { x: arch::$x(), y: arch::$y(), z: arch::$z() }
        }
    };
}

dim3_fn!(
    /// This work-item's index inside its work-group (CUDA `threadIdx`).
    thread_idx, thread_idx_x, thread_idx_y, thread_idx_z
);
dim3_fn!(
    /// This work-group's index inside the grid (CUDA `blockIdx`).
    block_idx, block_idx_x, block_idx_y, block_idx_z
);
dim3_fn!(
    /// Work-items per work-group (CUDA `blockDim`).
    block_dim, block_dim_x, block_dim_y, block_dim_z
);
dim3_fn!(
    /// Work-groups in the grid (CUDA `gridDim`).
    grid_dim, grid_dim_x, grid_dim_y, grid_dim_z
);

pub use arch::{
    block_dim_x, block_dim_y, block_dim_z, block_idx_x, block_idx_y, block_idx_z, grid_dim_x,
    grid_dim_y, grid_dim_z, thread_idx_x, thread_idx_y, thread_idx_z,
};

/// Global x index: `block_idx_x * block_dim_x + thread_idx_x`, as `usize`.
#[inline(always)]
pub fn global_idx_x() -> usize {
    block_idx_x() as usize * block_dim_x() as usize + thread_idx_x() as usize
}

/// Global y index: `block_idx_y * block_dim_y + thread_idx_y`, as `usize`.
#[inline(always)]
pub fn global_idx_y() -> usize {
    block_idx_y() as usize * block_dim_y() as usize + thread_idx_y() as usize
}

/// Total work-items along x (`grid_dim_x * block_dim_x`): the step of a grid-stride loop.
#[inline(always)]
pub fn global_size_x() -> usize {
    grid_dim_x() as usize * block_dim_x() as usize
}

/// Flat index of this work-item inside its work-group (`x + y*bx + z*bx*by`).
#[inline(always)]
pub fn flat_thread_idx() -> u32 {
    thread_idx_x() + block_dim_x() * (thread_idx_y() + block_dim_y() * thread_idx_z())
}

/// Number of work-items in the work-group.
#[inline(always)]
pub fn flat_block_dim() -> u32 {
    block_dim_x() * block_dim_y() * block_dim_z()
}
