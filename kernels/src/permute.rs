//! Permuted copies through shared-memory tiles: a view whose output-innermost dimension
//! is strided in the source (NCHW <-> NHWC, a transposed matrix, a convolution filter
//! rearranged as `(k_h, k_w, c_in, c_out)`) is read along the source's unit-stride
//! dimension and written along the output's, both coalesced, by way of a tile in shared
//! memory. The element-by-element strided copy (`elementwise::copy_strided`) reads such a
//! view with one scattered load per element.
use kernel_dsl::prelude::*;

/// Edge of the square tile a work-group moves, in elements.
pub const TILE: usize = 64;
/// Rows of work-items in a work-group: `TILE` x `ROWS` work-items, each moving
/// `TILE / ROWS` elements of the tile.
pub const ROWS: usize = 8;
/// Shared elements of a tile: rows padded by 4 bytes (1 element of 4 or 8 bytes, 2 of 2
/// bytes, 4 of 1), so the work-items reading down a column hit different banks.
pub const TILE_ELEMS: usize = TILE * (TILE + 4);

/// `out = src` viewed as `[d0, d1, d2]` with element strides `[s0, s1, s2]` (`out`
/// contiguous, `d0 d1 d2` elements), where dimension `y` (0 or 1) is the one the source
/// steps through contiguously (its stride is usually 1) and the output's innermost
/// dimension 2 is strided in the source. The other of dimensions 0 and 1 is a batch.
///
/// Work-group `(bx, by, bz)` of `TILE` x `ROWS` work-items moves the tile of `TILE` source
/// positions along `y` (tiles `by, by + grid_y, ...`) by `TILE` along dimension 2 (tile
/// `bx`), for the batch indices `bz, bz + grid_z, ...`: it reads the tile with consecutive work-items on
/// consecutive `y`, and writes it with consecutive work-items on consecutive outputs.
/// The launch shape comes from [`TransposeView::launch_config`]. Traps when `out.len() != d0 d1 d2`,
/// `y > 1`, the work-group is not `TILE` x `ROWS` x 1, or the view reaches past `src` or
/// 2^32 elements.
#[allow(clippy::too_many_arguments)]
#[amdgpu_kernel(T = [u8, f16, bf16, u32, i64], max_threads = 512)]
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
    tile: Shared<T, TILE_ELEMS>,
) {
    let (d0, d1, d2) = (d0 as usize, d1 as usize, d2 as usize);
    let n = d0.saturating_mul(d1).saturating_mul(d2);
    assert!(out.len() == n && y <= 1 && block_dim_x() as usize == TILE && block_dim_y() as usize == ROWS && block_dim_z() == 1);
    if n == 0 {
        return;
    }
    let last = ((d0 - 1) * s0 as usize).saturating_add((d1 - 1) * s1 as usize).saturating_add((d2 - 1) * s2 as usize);
    // One check: every source and output offset below fits 32 bits and is in bounds.
    assert!(last < src.len() && last <= u32::MAX as usize && n <= u32::MAX as usize);
    let (d0, d1, d2) = (d0 as u32, d1 as u32, d2 as u32);
    // The tiled dimension `y` and the batch dimension `z`: sizes, source strides and
    // output strides (the output is contiguous: d1 d2 for dimension 0, d2 for 1).
    let (dy, sy, oy, dz, sz, oz) = if y == 0 { (d0, s0, d1 * d2, d1, s1, d2) } else { (d1, s1, d2, d0, s0, d1 * d2) };
    let (tx, ty) = (thread_idx_x(), thread_idx_y());
    let (sp, op, tp) = (src.as_ptr(), out.as_mut_ptr(), tile.as_ptr());
    const TL: u32 = TILE as u32;
    const R: u32 = ROWS as u32;
    // Row pitch of the tile in shared memory (see TILE_ELEMS).
    let pitch = TL + if core::mem::size_of::<T>() >= 4 { 1 } else { 4 / core::mem::size_of::<T>() as u32 };
    let x0 = block_idx_x() as usize * TILE;
    if x0 >= d2 as usize {
        // Past the last tile (a larger grid than `launch_config`'s): nothing to move.
        return;
    }
    let x0 = x0 as u32;
    // Positions of this tile that exist along dimension 2 (all TILE but at the edge).
    let xs = d2 - x0;
    // Batches along the grid's z and tiles along its y, each looping past the grid's
    // extent (65535 at most on some GPUs); every work-item of a group takes the same
    // trips, so the barriers are uniform.
    let mut zi = block_idx_z() as usize;
    while zi < dz as usize {
        let z = zi as u32;
        let mut yi = block_idx_y() as usize * TILE;
        while yi < dy as usize {
            let y0 = yi as u32;
            let ys = dy - y0;
            let full = ys >= TL && xs >= TL;
            // Read: work-item tx on source position y0 + tx, rows ty, ty + ROWS, .. along
            // dimension 2; write: work-item tx on output x0 + tx of rows y0 + ty, ...
            // SAFETY (all accesses): source offsets with yy < dy, xx < d2, z < dz are at
            // most `last` (checked); output offsets index the [d0, d1, d2] output (below
            // n); shared indices are below TILE * pitch <= TILE_ELEMS.
            let base = z * sz + y0 * sy + x0 * s2;
            let obase = z * oz + y0 * oy + x0;
            if full {
                // A whole tile: no bounds checks, every load issued before the first
                // store (TILE / ROWS of each per work-item).
                let src_at = base + tx * sy + ty * s2;
                let out_at = obase + ty * oy + tx;
                let mut v = [unsafe { *sp.add(src_at as usize) }; TILE / ROWS];
                crate::unroll8!(k, TILE / ROWS, {
                    v[k] = unsafe { *sp.add((src_at + k as u32 * R * s2) as usize) };
                });
                crate::unroll8!(k, TILE / ROWS, {
                    unsafe { *tp.add(((ty + k as u32 * R) * pitch + tx) as usize) = v[k] };
                });
                barrier();
                crate::unroll8!(k, TILE / ROWS, {
                    v[k] = unsafe { *tp.add((tx * pitch + ty + k as u32 * R) as usize) };
                });
                crate::unroll8!(k, TILE / ROWS, {
                    unsafe { *op.add((out_at + k as u32 * R * oy) as usize) = v[k] };
                });
            } else {
                let mut r = ty;
                while r < TL {
                    if tx < ys && r < xs {
                        unsafe { *tp.add((r * pitch + tx) as usize) = *sp.add((base + tx * sy + r * s2) as usize) };
                    }
                    r += R;
                }
                barrier();
                let mut r = ty;
                while r < TL {
                    if r < ys && tx < xs {
                        unsafe { *op.add((obase + r * oy + tx) as usize) = *tp.add((tx * pitch + r) as usize) };
                    }
                    r += R;
                }
            }
            barrier();
            yi += grid_dim_y() as usize * TILE;
        }
        zi += grid_dim_z() as usize;
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
        if dims.len() < 2 || dims.contains(&0) {
            return None;
        }
        let (d, s) = crate::elementwise::view3(dims, strides)?;
        if s[2] <= 1 || d[2] == 1 {
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
