//! Permuted copies through shared-memory tiles: a view whose output-innermost dimension
//! is strided in the source (NCHW <-> NHWC, a transposed matrix, a convolution filter
//! rearranged as `(k_h, k_w, c_in, c_out)`) is read along the source's unit-stride
//! dimension and written along the output's, both coalesced, by way of a tile in shared
//! memory. The element-by-element strided copy (`elementwise::copy_strided`) reads such a
//! view with one scattered load per element.
use kernel_dsl::prelude::*;

/// Edge of the square tile a work-group moves, in elements.
pub const TILE: usize = 32;
/// Rows of work-items in a work-group: `TILE` x `ROWS` work-items, each moving
/// `TILE / ROWS` elements of the tile.
pub const ROWS: usize = 8;
/// Shared elements of a tile: one padding column, so a column of the tile falls in
/// `TILE` different banks.
pub const TILE_ELEMS: usize = TILE * (TILE + 1);

/// `out = src` viewed as `[d0, d1, d2]` with element strides `[s0, s1, s2]` (`out`
/// contiguous, `d0 d1 d2` elements), where dimension `y` (0 or 1) is the one the source
/// steps through contiguously (its stride is usually 1) and the output's innermost
/// dimension 2 is strided in the source. The other of dimensions 0 and 1 is a batch.
///
/// Work-group `(bx, by, bz)` of `TILE` x `ROWS` work-items moves the tile of `TILE` source
/// positions along `y` (tile `by`) by `TILE` along dimension 2 (tile `bx`), for the batch
/// indices `bz, bz + grid_z, ...`: it reads the tile with consecutive work-items on
/// consecutive `y`, and writes it with consecutive work-items on consecutive outputs.
/// The launch shape comes from [`launch_config`]. Traps when `out.len() != d0 d1 d2`,
/// `y > 1`, the work-group is not `TILE` x `ROWS`, or the view reaches past `src`.
#[allow(clippy::too_many_arguments)]
#[amdgpu_kernel(T = [u8, f16, bf16, u32, i64], max_threads = 256)]
pub fn transpose_copy<T: Element>(
    src: &[T],
    out: &mut [T],
    d0: u32,
    d1: u32,
    d2: u32,
    s0: u32,
    s1: u32,
    s2: u32,
    y: u32,
    mut tile: Shared<T, TILE_ELEMS>,
) {
    let (d0, d1, d2) = (d0 as usize, d1 as usize, d2 as usize);
    let (s0, s1, s2) = (s0 as usize, s1 as usize, s2 as usize);
    let n = d0.saturating_mul(d1).saturating_mul(d2);
    assert!(out.len() == n && y <= 1 && block_dim_x() as usize == TILE && block_dim_y() as usize == ROWS);
    if n == 0 {
        return;
    }
    let last = ((d0 - 1) * s0).saturating_add((d1 - 1) * s1).saturating_add((d2 - 1) * s2);
    assert!(last < src.len());
    // The tiled dimension `y` and the batch dimension `z`: sizes, source strides and
    // output strides (the output is contiguous: d1 d2 for dimension 0, d2 for 1).
    let (dy, sy, oy, dz, sz, oz) = if y == 0 { (d0, s0, d1 * d2, d1, s1, d2) } else { (d1, s1, d2, d0, s0, d1 * d2) };
    let (tx, ty) = (thread_idx_x() as usize, thread_idx_y() as usize);
    let x0 = block_idx_x() as usize * TILE;
    // Batches along the grid's z and tiles along its y, each looping past the grid's
    // extent (65535 at most on some GPUs); every work-item of a group takes the same
    // trips, so the barriers are uniform.
    let mut z = block_idx_z() as usize;
    while z < dz {
        let mut y0 = block_idx_y() as usize * TILE;
        while y0 < dy {
            // Read: work-item tx on source position y0 + tx, rows ty, ty + ROWS, .. along
            // dimension 2.
            let mut r = ty;
            while r < TILE {
                let (yy, xx) = (y0 + tx, x0 + r);
                if yy < dy && xx < d2 {
                    // SAFETY: yy < dy, xx < d2 and z < dz: at most `last`, checked above.
                    tile[r * (TILE + 1) + tx] = unsafe { *src.get_unchecked(z * sz + yy * sy + xx * s2) };
                }
                r += ROWS;
            }
            barrier();
            // Write: work-item tx on output x0 + tx of rows y0 + ty, y0 + ty + ROWS, ..
            let mut r = ty;
            while r < TILE {
                let (yy, xx) = (y0 + r, x0 + tx);
                if yy < dy && xx < d2 {
                    // SAFETY: an index of the contiguous [d0, d1, d2] output: below n.
                    unsafe { *out.get_unchecked_mut(z * oz + yy * oy + xx) = tile[tx * (TILE + 1) + r] };
                }
                r += ROWS;
            }
            barrier();
            y0 += grid_dim_y() as usize * TILE;
        }
        z += grid_dim_z() as usize;
    }
}

/// The arguments of [`transpose_copy`](fn@transpose_copy) for a view `dims`/`strides` (at
/// most three dimensions, coalesced first), when it applies: the innermost dimension
/// strided in the source (not 1, not 0), a dimension of stride 1 among the other two, and
/// every size and offset below 2^32. `None` otherwise.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransposeView {
    /// The sizes `[d0, d1, d2]` (leading ones added to fewer dimensions).
    pub dims: [u32; 3],
    /// The source strides.
    pub strides: [u32; 3],
    /// The dimension (0 or 1) of source stride 1.
    pub y: u32,
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
impl TransposeView {
    /// See [`TransposeView`].
    pub fn new(dims: &[usize], strides: &[usize]) -> Option<TransposeView> {
        if dims.len() < 2 || dims.len() > 3 || strides.len() != dims.len() || dims.contains(&0) {
            return None;
        }
        let pad = 3 - dims.len();
        let (mut d, mut s) = ([1u32; 3], [0u32; 3]);
        for k in 0..dims.len() {
            d[pad + k] = u32::try_from(dims[k]).ok()?;
            s[pad + k] = u32::try_from(strides[k]).ok()?;
        }
        let n: u64 = d.iter().map(|&v| v as u64).product();
        let last: u64 = d.iter().zip(&s).map(|(&d, &s)| (d as u64 - 1) * s as u64).sum();
        if n > u32::MAX as u64 || last > u32::MAX as u64 || s[2] <= 1 || d[2] == 1 {
            return None;
        }
        let y = if s[1] == 1 && d[1] > 1 {
            1
        } else if s[0] == 1 && d[0] > 1 {
            0
        } else {
            return None;
        };
        Some(TransposeView { dims: d, strides: s, y })
    }

    /// Launch shape: `TILE` x `ROWS` work-items, tiles along dimensions 2 (grid x) and `y`
    /// (grid y), the batch dimension in the grid's z (y and z at most 65535; the kernel
    /// loops past them).
    pub fn launch_config(&self) -> kernel_dsl::host::LaunchConfig {
        let [d0, d1, d2] = self.dims.map(|v| v as usize);
        let (dy, dz) = if self.y == 0 { (d0, d1) } else { (d1, d0) };
        let grid = kernel_dsl::Dim3 { x: d2.div_ceil(TILE) as u32, y: dy.div_ceil(TILE).min(65535) as u32, z: dz.min(65535) as u32 };
        kernel_dsl::host::LaunchConfig::new(grid, kernel_dsl::Dim3 { x: TILE as u32, y: ROWS as u32, z: 1 })
    }
}
