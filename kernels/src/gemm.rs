//! Matrix multiplication on the matrix units (`kernel_dsl::mma`): `C = act(alpha * A B +
//! bias)`, batched and strided, A and/or B transposed, f32/f16/bf16 in and out, f32
//! accumulation.
//!
//! A work-group of waves ([`waves`]: 4 x 2 on `mma.sync`, 2 x 2 elsewhere) computes a
//! `BM x BN` tile of C; each wave a block of `FM x FN` 16x16 fragments whose shape depends
//! on the lowering ([`wave_frags`]: 4x4 on `mma.sync`, so 256 x 128 tiles, 4x2 on MFMA,
//! 2x2 on WMMA, 2x1 on the VALU fallback, 1x1 there for f32). K advances in steps of `BK`
//! ([`k_step`]: 64 for 16-bit inputs on `mma.sync`, 32 for 16-bit inputs elsewhere, 16 for
//! f32) through a ring of shared-memory buffers ([`stages`]): on NVIDIA sm_80+ three,
//! filled by `cp.async` 16-byte copies two steps ahead into XOR-swizzled tiles
//! ([`swizzled`]), with `ldmatrix` fragment loads; elsewhere two padded ones, filled
//! element by element one step ahead. One barrier per step. Operands that are not
//! contiguous along their rows (transposed A, odd strides) take the element path.
//!
//! The K loop carries almost no address math on `mma.sync`:
//! - Copies: before the loop each work-item fixes its chunks of the A and B tiles
//!   (`Chunks`: first row and column, a constant row step and count); per step it moves
//!   one source pointer by a constant and issues each chunk with one 64-bit add and one
//!   `cp.async` at a constant shared offset. Tiles wholly in range (all rows of A / columns
//!   of B of the block and a full K step) take that path without per-chunk checks; edge
//!   tiles compare constants with two per-step values and zero-fill exactly as before.
//! - Fragment loads: the shared buffers are addressed through 32-bit [`SharedAddr`]s; each
//!   lane's `ldmatrix` row offset is computed once, so a step adds the buffer offset once
//!   and every fragment load is `ldmatrix [addr + constant]`.
//! - The ring: buffer offsets rotate by compare-and-reset (no `%`).
//! - The first slice's fragments of the next step, loaded across the loop's back edge,
//!   are carried as 32-bit words ([`FragA::to_words`]); as 16-bit items LLVM kept them in
//!   twice the registers and repacked them before every product (H100: 330 -> 235 SASS
//!   instructions per K step of the steady loop, and no spills).
//! - Work-groups of 16-bit inputs take their tiles in bands of [`GROUP_M`] tile rows
//!   ([`tile_of_group`]; f32 inputs keep the row-major order), so
//!   the ones resident together share A and B through L2.
//! - Work-groups whose tiles lie wholly in range run their steady state (every refill a
//!   whole K step) in a loop of its own whose copies carry no branch.
//! - The epilogue goes through shared memory ([`stages_epilogue`]): whole rows of the
//!   tile are written with 16-byte stores by a short loop instead of 128 unrolled
//!   scattered stores per work-item.
//!
//! The CPU executor runs the same chunk plans (synchronous copies), so its tests cover
//! them; AMD targets keep the element path (gfx9 scalar-register budget).
//!
//! f32 inputs run as three bf16 products (`hi*hi + hi*lo + lo*hi` with `x = hi + lo`,
//! about 16 significant bits per product, f32 accumulation); without a matrix unit (the
//! VALU lowering) as plain f32 FMAs.
//!
//! On NVIDIA sm_90 (H100) [`host::matmul`] takes 16-bit products whose N is a multiple
//! of 256 and K of 64 (any M, A row-major) to [`gemm_wgmma`](fn@gemm_wgmma) instead: the warpgroup
//! matrix units (`kernel_dsl::mma::wgmma`, only in the crate's `sm_90a` PTX variant), three
//! warpgroups per 192 x 256 tile reading both operands from 128-byte swizzled shared
//! tiles through descriptors (the CPU executor emulates it in its `mma.sync` mode).
//! [`Engine`] picks a kernel explicitly.
//!
//! Also here: [`mma_tile`](fn@mma_tile), [`mma_rows`](fn@mma_rows) and [`mma_pv`](fn@mma_pv), one-wave kernels that exercise the `mma`
//! primitive (a product, accumulator -> A conversion, row reductions) for the tests.
use kernel_dsl::mma::{self, wgmma, FragA, FragB, FragC, Lowering, MmaFloat, SharedAddr, AB_WORDS};
use kernel_dsl::hint::opaque_u32;
use kernel_dsl::prelude::*;
use kernel_dsl::each;

/// Tile rows of C that walk along N together ([`tile_of_group`]).
pub const GROUP_M: u32 = 8;

/// The `(M, N)` tile that work-group `(x, y)` of an `gx x gy` grid (N tiles x M tiles)
/// computes. Work-groups run in order of `y * gx + x`; taken in that order, the tiles go
/// down a band of [`GROUP_M`] tile rows before moving one tile along N (the last band may
/// be narrower), so the work-groups resident at one time share A rows and B columns
/// through L2 instead of each wave of them sweeping all of B. A bijection of the grid.
/// (`y * gx + x` fits 32 bits: `gy` is at most 65535, so more tiles would need a C of
/// over 2^47 elements, which the launcher's buffer checks reject first.)
pub fn tile_of_group(x: u32, y: u32, gx: u32, gy: u32) -> (u32, u32) {
    tile_of_band(x, y, gx, gy, GROUP_M)
}

/// [`tile_of_group`] in bands of `group` tile rows.
#[inline(always)]
pub fn tile_of_band(x: u32, y: u32, gx: u32, gy: u32, group: u32) -> (u32, u32) {
    let id = y * gx + x;
    let band = group * gx;
    let first = id / band * group;
    let rows = (gy - first).min(group);
    let at = id % band;
    (first + at % rows, at / rows)
}

/// The `(M, N)` tile of work-group `(x, y)`: in bands ([`tile_of_group`]) for 16-bit
/// inputs; f32 inputs (three bf16 products, conversion-bound) keep the row-major order,
/// which the H100 ran 19% faster for them (50 against 40.5 TFLOP/s at 4096^3).
#[inline(always)]
fn tile_of<T: GemmElem>(x: u32, y: u32) -> (u32, u32) {
    if T::SPLIT {
        (y, x)
    } else {
        tile_of_group(x, y, grid_dim_x(), grid_dim_y())
    }
}

/// Waves per work-group along M and N for a lowering: 4 x 2 on `mma.sync` (256 x 128
/// tiles: a quarter less L2 traffic per product than 128 x 128, whose copies kept the
/// H100's L2 two-thirds busy at half the tensor units' rate; on the H100 256 x 128 ran
/// 5-8% faster than 128 x 256 and than two work-groups of 128 x 128 at 8192^3), 2 x 2
/// elsewhere.
pub const fn waves(low: Lowering) -> (usize, usize) {
    match low {
        Lowering::MmaSync => (4, 2),
        _ => (2, 2),
    }
}
/// Largest fragment count per wave along M or N.
pub const MAX_F: usize = 4;
/// Shared-memory row padding, in elements (keeps rows 16-byte aligned, shifts banks).
pub const PAD: usize = 8;

/// Work-items per work-group for a lowering ([`waves`] times the wave size).
pub const fn work_group_size(low: Lowering) -> usize {
    let (wm, wn) = waves(low);
    wm * wn * low.wave_lanes() as usize
}

/// Work-items per work-group (a constant on a GPU, so unused chunk slots vanish).
#[inline(always)]
pub(crate) fn block_threads() -> usize {
    work_group_size(mma::lowering())
}

/// 16x16 fragments per wave along M and N for a lowering and element type (f32 inputs
/// hold hi and lo fragments, so they get smaller tiles where registers are scarce).
pub const fn wave_frags<T: GemmElem>(low: Lowering) -> (usize, usize) {
    match (low, T::SPLIT) {
        (Lowering::MmaSync, _) => (4, 4),
        (Lowering::Mfma, _) => (4, 2),
        (Lowering::Wmma | Lowering::Wmma12, _) => (2, 2),
        (Lowering::Valu, false) => (2, 1),
        (Lowering::Valu, true) => (1, 1),
    }
}

/// An element type the GEMM takes: f32, f16 or bf16.
pub trait GemmElem: Float {
    /// K step per shared-memory buffer.
    const BK: usize;
    /// `true` for f32, multiplied as bf16 hi + lo parts.
    const SPLIT: bool;
    /// The 16-bit type fed to the matrix unit.
    type Frag: MmaFloat;
    /// The high part (or the value itself).
    fn hi(self) -> Self::Frag;
    /// The low part (`self - hi`; zero for 16-bit types).
    fn lo(self) -> Self::Frag;
}
impl GemmElem for f16 {
    const BK: usize = 32;
    const SPLIT: bool = false;
    type Frag = f16;
    #[inline(always)]
    fn hi(self) -> f16 { self }
    #[inline(always)]
    fn lo(self) -> f16 { f16::from_bits(0) }
}
impl GemmElem for bf16 {
    const BK: usize = 32;
    const SPLIT: bool = false;
    type Frag = bf16;
    #[inline(always)]
    fn hi(self) -> bf16 { self }
    #[inline(always)]
    fn lo(self) -> bf16 { bf16::from_bits(0) }
}
impl GemmElem for f32 {
    const BK: usize = 16;
    const SPLIT: bool = true;
    type Frag = bf16;
    #[inline(always)]
    fn hi(self) -> bf16 { bf16::from_f32(self) }
    #[inline(always)]
    fn lo(self) -> bf16 { bf16::from_f32(self - bf16::from_f32(self).to_f32()) }
}

/// K step per shared-memory buffer: twice the type's [`GemmElem::BK`] for 16-bit inputs
/// on `mma.sync` (64: half the barriers, waits and copy rounds per product), else `BK`.
pub const fn k_step<T: GemmElem>(low: Lowering) -> usize {
    match (low, T::SPLIT) {
        (Lowering::MmaSync, false) => 2 * T::BK,
        _ => T::BK,
    }
}

/// Tile sizes of one launch: `(BM, BN, BK)`.
pub const fn block_tile<T: GemmElem>(low: Lowering) -> (usize, usize, usize) {
    let (fm, fn_) = wave_frags::<T>(low);
    let (wm, wn) = waves(low);
    (wm * 16 * fm, wn * 16 * fn_, k_step::<T>(low))
}

/// Shared-memory buffers in the copy pipeline: 3 where copies are asynchronous
/// (`cp.async`: two K steps in flight during a step's products), else 2.
pub const fn stages(low: Lowering) -> usize {
    match low {
        Lowering::MmaSync => 3,
        _ => 2,
    }
}

/// `true` where the shared-memory tiles are swizzled instead of padded: 16-bit inputs on
/// `mma.sync`. Rows are then whole 128-byte lines (A: `BK` = 64 elements, B: `BN` = 128)
/// and the 16-byte chunk `c` of row `r` sits at chunk `c ^ (r % 8)`, so the 8 work-items
/// that copy 128 consecutive bytes of a row write one aligned line (with padded rows,
/// `cp.async` took 2.6 times the shared-memory wavefronts and 1.5 times the L2 sectors of
/// a whole tile on the H100), and the 8 rows one `ldmatrix` reads still fall in distinct
/// banks.
pub const fn swizzled<T: GemmElem>(low: Lowering) -> bool {
    matches!(low, Lowering::MmaSync) && !T::SPLIT
}

/// Row strides, in elements, of the A and B tiles in shared memory.
pub const fn tile_lds<T: GemmElem>(low: Lowering) -> (usize, usize) {
    let (_, bn, bk) = block_tile::<T>(low);
    if swizzled::<T>(low) {
        (bk, bn)
    } else {
        (bk + PAD, bn + PAD)
    }
}

/// Shared-memory elements of one buffer (A tile + B tile).
pub const fn stage_elems<T: GemmElem>(low: Lowering) -> usize {
    let (bm, _, bk) = block_tile::<T>(low);
    let (lda, ldb) = tile_lds::<T>(low);
    bm * lda + bk * ldb
}

/// Byte offset of element `(r, c)` in a shared tile of row stride `ld` elements, swizzled
/// or not ([`swizzled`]).
#[inline(always)]
pub(crate) fn tile_offset<T>(swz: bool, r: usize, c: usize, ld: usize) -> usize {
    let (size, b) = (core::mem::size_of::<T>(), c * core::mem::size_of::<T>());
    if swz {
        r * ld * size + (((b / 16) ^ (r % 8)) * 16) + b % 16
    } else {
        (r * ld + c) * size
    }
}

/// `true` where the epilogue goes through shared memory (`staged_epilogue`): on
/// `mma.sync`, whose 16 accumulator fragments per wave would otherwise unroll into
/// thousands of straight-line instructions run once each (instruction-cache misses),
/// with scattered 2- or 4-byte global stores.
pub const fn stages_epilogue(low: Lowering) -> bool {
    matches!(low, Lowering::MmaSync)
}

/// f32 row padding of the staged epilogue tile, in words (rows of `BN + EPAD` words: the
/// accumulator pairs of the 8 rows a store covers fall in distinct banks).
pub const EPAD: usize = 8;

/// Shared-memory elements (of `T`) one launch needs: the pipeline's buffers, or the f32
/// `BM x (BN + EPAD)` tile of the staged epilogue where that is larger (it reuses them).
pub const fn smem_elems<T: GemmElem>(low: Lowering) -> usize {
    let pipe = stages(low) * stage_elems::<T>(low);
    let (bm, bn, _) = block_tile::<T>(low);
    let tile = if stages_epilogue(low) { (bm * (bn + EPAD) * 4).div_ceil(core::mem::size_of::<T>()) } else { 0 };
    if tile > pipe { tile } else { pipe }
}

/// `true` when rows of the tile whose element `(r, c)` is `src[base + r * rs + c * cs]`
/// can move as 16-byte chunks: contiguous along `c`, every row and batch entry starting
/// on a 16-byte boundary.
#[inline(always)]
pub(crate) fn chunked<T>(src: &[T], base: usize, rs: usize, cs: usize, batch_stride: usize) -> bool {
    let per = 16 / core::mem::size_of::<T>();
    let aligned = (src.as_ptr() as usize + base * core::mem::size_of::<T>()) % 16 == 0;
    cs == 1 && rs % per == 0 && batch_stride % per == 0 && aligned
}

/// One work-item's share of the 16-byte chunks of a `rows x cols` tile (source row stride
/// `rs`, shared row stride `ld`), fixed for the whole K loop: chunk `i` (of `count`) is
/// tile row `r0 + i * rstep`, columns `c0 .. c0 + 16 bytes`. Work-item `t` takes chunks
/// `t, t + threads, ..` in row-major order, so consecutive work-items read consecutive
/// 16 bytes of a row.
#[derive(Clone, Copy)]
pub(crate) struct Chunks {
    r0: usize,
    c0: usize,
    rstep: usize,
    count: usize,
    /// Elements from the tile's source origin to chunk 0, and between chunks.
    pub(crate) src0: usize,
    src_step: usize,
    /// Bytes from the tile's shared origin to chunk 0, and between chunks.
    dst0: usize,
    dst_step: usize,
}

impl Chunks {
    /// The plan, or `None` when the chunks do not split evenly over the work-group (a
    /// constant on a GPU; such tiles take the element path).
    #[inline(always)]
    pub(crate) fn new<T>((rows, cols): (usize, usize), rs: usize, ld: usize, swz: bool) -> Option<Chunks> {
        let size = core::mem::size_of::<T>();
        let per = 16 / size;
        let (tid, threads) = (flat_thread_idx() as usize, block_threads());
        let per_row = cols / per;
        if cols % per != 0 || per_row == 0 || threads % per_row != 0 || (rows * per_row) % threads != 0 {
            return None;
        }
        // Swizzled, every chunk of a work-item keeps its row's position mod 8.
        if swz && (threads / per_row) % 8 != 0 {
            return None;
        }
        let (r0, c0, rstep) = (tid / per_row, (tid % per_row) * per, threads / per_row);
        Some(Chunks {
            r0,
            c0,
            rstep,
            count: rows * per_row / threads,
            src0: r0 * rs + c0,
            src_step: rstep * rs,
            dst0: tile_offset::<T>(swz, r0, c0, ld),
            dst_step: rstep * ld * size,
        })
    }

    /// Copies this work-item's chunks of a tile that lies wholly in range: `first` is the
    /// source address of chunk 0 (`origin + src0`), `dst` the tile's shared origin. Per
    /// chunk one 64-bit add and one `cp.async` (constant shared offsets).
    ///
    /// # Safety
    /// Every chunk of the tile is readable, 16-byte aligned global memory; the tile fits
    /// in shared memory at `dst`.
    #[inline(always)]
    pub(crate) unsafe fn copy_whole<T>(&self, first: *const T, dst: SharedAddr) {
        let (mut from, to) = (first, dst.add(self.dst0));
        let mut i = 0;
        while i < self.count {
            // SAFETY: the caller's contract.
            unsafe { mma::copy::copy_16_whole_at(to.add(i * self.dst_step), from as *const u8) };
            from = from.wrapping_add(self.src_step);
            i += 1;
        }
    }

    /// Copies this work-item's chunks of the tile at `src[origin..]` whose valid part is
    /// `rows_valid x cols_valid`, zero-filling the rest (per chunk: whole, partial or none).
    /// The checks compare constants with two per-call values (rows left below chunk 0,
    /// valid bytes of this work-item's columns), so nothing per chunk stays live across
    /// the K loop.
    ///
    /// # Safety
    /// Every valid element lies in `src`, valid chunks start 16-byte aligned; the tile fits
    /// in shared memory at `dst`.
    #[inline(always)]
    pub(crate) unsafe fn copy_edge<T>(&self, src: &[T], origin: usize, (rows_valid, cols_valid): (usize, usize), dst: SharedAddr) {
        let size = core::mem::size_of::<T>();
        let per = 16 / size;
        let to = dst.add(self.dst0);
        // Chunk i is in range when r0 + i * rstep < rows_valid.
        let rows_left = rows_valid.saturating_sub(self.r0).min(u32::MAX as usize) as u32;
        let bytes = (cols_valid.saturating_sub(self.c0).min(per) * size) as u32;
        let mut from = src.as_ptr().wrapping_add(origin + self.src0);
        let mut i = 0;
        while i < self.count {
            let valid = if ((i * self.rstep) as u32) < rows_left { bytes } else { 0 };
            // SAFETY: the caller's contract; a chunk with nothing valid reads no bytes.
            unsafe {
                let at = if valid > 0 { from } else { src.as_ptr() };
                mma::copy::copy_16_at(to.add(i * self.dst_step), at as *const u8, valid);
            }
            from = from.wrapping_add(self.src_step);
            i += 1;
        }
    }
}

/// Copies the `rows x cols` tile whose element `(r, c)` is `src[base + r * rs + c * cs]`
/// (zero outside `rows_valid x cols_valid`) to shared memory at `dst` (row stride `ld`)
/// element by element, consecutive work-items on the source's contiguous dimension.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_elems<T: GemmElem>(
    src: &[T],
    base: usize,
    (rs, cs): (usize, usize),
    (rows_valid, cols_valid): (usize, usize),
    (rows, cols): (usize, usize),
    dst: *mut T,
    ld: usize,
    swz: bool,
) {
    let (tid, threads) = (flat_thread_idx() as usize, block_threads());
    let along_rows = rs == 1 && cs != 1;
    let mut e = tid;
    while e < rows * cols {
        let (r, c) = if along_rows { (e % rows, e / rows) } else { (e / cols, e % cols) };
        // SAFETY: the kernel checked once that every in-range element lies in `src`.
        let v = if r < rows_valid && c < cols_valid { unsafe { *src.get_unchecked(base + r * rs + c * cs) } } else { T::ZERO };
        // SAFETY: (r, c) lies in the tile and the tile in the shared buffer.
        unsafe { *((dst as *mut u8).add(tile_offset::<T>(swz, r, c, ld)) as *mut T) = v };
        e += threads;
    }
}

/// The fragments of slice `kk` (16 deep) of a swizzled K-step buffer for this wave:
/// `fm` A and `fn` B fragments through [`FragA::load_segments`], from this lane's segment
/// offsets `(a_seg, b_seg)` in the buffer for `kk = 0`, `j = 0`: chunk `2 kk + h` of a
/// row sits at chunk `(2 kk + h) ^ (row % 8)`, so slice `kk` is at `a_seg ^ 32 kk` and B
/// fragment `j` at `b_seg ^ 32 j` (rows are whole 128-byte lines), plus constants.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
fn load_slice<T: GemmElem>(
    (fm, fn_): (usize, usize),
    smem: SharedAddr,
    (a_seg, b_seg): (usize, usize),
    (lda, ldb): (usize, usize),
    kk: usize,
) -> ([FragA<T::Frag>; MAX_F], [FragB<T::Frag>; MAX_F]) {
    let size = core::mem::size_of::<T>();
    let mut a = [FragA::<T::Frag>::zero(); MAX_F];
    let mut b = [FragB::<T::Frag>::zero(); MAX_F];
    each!(j in [0, 1, 2, 3] {
        if j < fn_ {
            // SAFETY: this lane's segment of B fragment j in rows kk*16.. (swizzled:
            // chunk 2j + h of k row r sits at chunk (2j + h) ^ (r % 8)).
            b[j] = unsafe { FragB::load_segments(smem.add((b_seg ^ (j * 32)) + kk * 16 * ldb * size)) };
        }
    });
    each!(i in [0, 1, 2, 3] {
        if i < fm {
            // SAFETY: this lane's segment of A fragment i in columns kk*16.. (chunk
            // 2 kk + h of row r sits at chunk (2 kk + h) ^ (r % 8)).
            a[i] = unsafe { FragA::load_segments(smem.add((a_seg ^ (kk * 32)) + i * 16 * lda * size)) };
        }
    });
    (a, b)
}

/// A slice's A and B fragments as words ([`FragA::to_words`]).
type SliceWords = ([[u32; AB_WORDS]; MAX_F], [[u32; AB_WORDS]; MAX_F]);

#[inline(always)]
fn words_of<T: GemmElem>((a, b): &([FragA<T::Frag>; MAX_F], [FragB<T::Frag>; MAX_F])) -> SliceWords {
    (core::array::from_fn(|i| a[i].to_words()), core::array::from_fn(|j| b[j].to_words()))
}

#[inline(always)]
fn frags_of<T: GemmElem>((a, b): &SliceWords) -> ([FragA<T::Frag>; MAX_F], [FragB<T::Frag>; MAX_F]) {
    (core::array::from_fn(|i| FragA::from_words(a[i])), core::array::from_fn(|j| FragB::from_words(b[j])))
}

/// `acc[i][j] += a[i] b[j]` over this wave's `fm x fn` fragments.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
fn mma_slice<T: GemmElem>(
    acc: &mut [[FragC<f32>; MAX_F]; MAX_F],
    (fm, fn_): (usize, usize),
    (a, b): &([FragA<T::Frag>; MAX_F], [FragB<T::Frag>; MAX_F]),
) {
    each!(i in [0, 1, 2, 3] {
        each!(jj in [0, 1, 2, 3] {
            // Serpentine: odd rows walk the columns backwards, so the B fragment of a
            // row's last product is the next row's first.
            let j = if i % 2 == 1 { fn_.wrapping_sub(1 + jj) } else { jj };
            if i < fm && jj < fn_ {
                acc[i][j] = mma::mma(&a[i], &b[j], acc[i][j]);
            }
        });
    });
}

/// [`mma_k16`] without a matrix unit for f32 inputs: exact f32 products straight from
/// shared memory, in the accumulator layout (three emulated bf16 products would cost more
/// registers than gfx10 has).
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
pub(crate) fn f32_k16_valu<T: GemmElem>(
    acc: &mut [[FragC<f32>; MAX_F]; MAX_F],
    (fm, fn_): (usize, usize),
    (sa, sb): (*const T, *const T),
    (lda, ldb): (usize, usize),
    (wy, wx): (usize, usize),
    kk: usize,
) {
    each!(i in [0, 1, 2, 3] {
        each!(j in [0, 1, 2, 3] {
            if i < fm && j < fn_ {
                let (row0, col0) = ((wy * fm + i) * 16, (wx * fn_ + j) * 16);
                acc[i][j] = acc[i][j].map(|r, cc, v| {
                    let mut v = v;
                    for q in 0..16 {
                        // SAFETY: inside the A and B tiles of this buffer.
                        let (x, y) = unsafe {
                            ((*sa.add((row0 + r) * lda + kk * 16 + q)).to_f32(), (*sb.add((kk * 16 + q) * ldb + col0 + cc)).to_f32())
                        };
                        v += x * y;
                    }
                    v
                });
            }
        });
    });
}

/// One 16-deep slice `kk` of a K step: this wave's `fm x fn` fragments of A and B read
/// from the buffer and multiplied into `acc`. 16-bit inputs load through
/// [`FragA::load_shared_at`] from the lane addresses `sa_lane`/`sb_lane` plus constant
/// offsets; f32 inputs (split into bf16 hi + lo) element by element from `sa`/`sb`, as
/// three products. (Swizzled tiles take [`load_slice`] and [`mma_slice`] instead.) (Not inlined on the CPU executor, whose work-item stacks would
/// otherwise hold every unrolled copy's locals.)
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_k16<T: GemmElem>(
    acc: &mut [[FragC<f32>; MAX_F]; MAX_F],
    (fm, fn_): (usize, usize),
    (sa, sb): (*const T, *const T),
    (sa_lane, sb_lane): (SharedAddr, SharedAddr),
    (lda, ldb): (usize, usize),
    (wy, wx): (usize, usize),
    kk: usize,
) {
    let size = core::mem::size_of::<T>();
    let mut bf = [FragB::<T::Frag>::zero(); MAX_F];
    let mut bl = [FragB::<T::Frag>::zero(); MAX_F];
    each!(j in [0, 1, 2, 3] {
        if j < fn_ {
            let col0 = (wx * fn_ + j) * 16;
            // SAFETY: rows kk*16.. + 16 and columns col0..col0 + 16 of the B tile.
            let bt = |q: usize, cc: usize| unsafe { *sb.add((kk * 16 + q) * ldb + col0 + cc) };
            bf[j] = if T::SPLIT {
                FragB::from_fn(|q, cc| bt(q, cc).hi())
            } else {
                // SAFETY: as above (sb_lane is this wave's column block plus the lane
                // offset); ldb and the columns are multiples of 8.
                unsafe { FragB::load_shared_at(sb_lane.add((kk * 16 * ldb + j * 16) * size), ldb) }
            };
            if T::SPLIT {
                bl[j] = FragB::from_fn(|q, cc| bt(q, cc).lo());
            }
        }
    });
    // One A fragment (and its row of products) at a time keeps fewer registers live.
    each!(i in [0, 1, 2, 3] {
        if i < fm {
            let row0 = (wy * fm + i) * 16;
            // SAFETY: rows row0..row0 + 16 and columns kk*16..kk*16 + 16 of the A tile.
            let at = |r: usize, q: usize| unsafe { *sa.add((row0 + r) * lda + kk * 16 + q) };
            let af = if T::SPLIT {
                FragA::from_fn(|r, q| at(r, q).hi())
            } else {
                // SAFETY: as above (sa_lane is this wave's row block plus the lane offset);
                // rows are 16-byte aligned (lda, kk*16 multiples of 8).
                unsafe { FragA::load_shared_at(sa_lane.add((i * 16 * lda + kk * 16) * size), lda) }
            };
            let al = if T::SPLIT { FragA::from_fn(|r, q| at(r, q).lo()) } else { FragA::zero() };
            each!(j in [0, 1, 2, 3] {
                if j < fn_ {
                    acc[i][j] = mma::mma(&af, &bf[j], acc[i][j]);
                    if T::SPLIT {
                        acc[i][j] = mma::mma(&af, &bl[j], acc[i][j]);
                        acc[i][j] = mma::mma(&al, &bf[j], acc[i][j]);
                    }
                }
            });
        }
    });
}

/// Slices `kk` and `kk + 1` of a K step for 16-bit inputs where [`mma::pairs_k`]: as
/// [`mma_k16`] twice, with each pair of products in one [`mma::mma_pair`] (gfx950's
/// double-rate `v_mfma_f32_16x16x32_*`).
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
pub(crate) fn mma_k32<T: GemmElem>(
    acc: &mut [[FragC<f32>; MAX_F]; MAX_F],
    (fm, fn_): (usize, usize),
    (sa_lane, sb_lane): (SharedAddr, SharedAddr),
    (lda, ldb): (usize, usize),
    kk: usize,
) {
    let size = core::mem::size_of::<T>();
    let mut b0 = [FragB::<T::Frag>::zero(); MAX_F];
    let mut b1 = [FragB::<T::Frag>::zero(); MAX_F];
    each!(j in [0, 1, 2, 3] {
        if j < fn_ {
            // SAFETY: rows kk*16.. + 32 of this wave's column block of the B tile (sb_lane
            // plus the lane offset); ldb and the columns are multiples of 8.
            unsafe {
                b0[j] = FragB::load_shared_at(sb_lane.add((kk * 16 * ldb + j * 16) * size), ldb);
                b1[j] = FragB::load_shared_at(sb_lane.add(((kk + 1) * 16 * ldb + j * 16) * size), ldb);
            }
        }
    });
    each!(i in [0, 1, 2, 3] {
        if i < fm {
            // SAFETY: rows i*16.. + 16, columns kk*16.. + 32 of this wave's row block of the
            // A tile (sa_lane plus the lane offset); rows are 16-byte aligned.
            let (a0, a1) = unsafe {
                (
                    FragA::load_shared_at(sa_lane.add((i * 16 * lda + kk * 16) * size), lda),
                    FragA::load_shared_at(sa_lane.add((i * 16 * lda + (kk + 1) * 16) * size), lda),
                )
            };
            each!(j in [0, 1, 2, 3] {
                if j < fn_ {
                    acc[i][j] = mma::mma_pair(&a0, &b0[j], &a1, &b1[j], acc[i][j]);
                }
            });
        }
    });
}

#[inline(always)]
fn activate(x: f32, act: u32) -> f32 {
    match act {
        1 => x.max(0.0),
        2 => 0.5 * x * (1.0 + FloatMath::erf(x * core::f32::consts::FRAC_1_SQRT_2)),
        3 => x / (1.0 + FloatMath::exp(-x)),
        _ => x,
    }
}

/// The 16-bit pattern of a 16-bit element.
#[inline(always)]
fn bits16<T: Float>(x: T) -> u32 {
    // SAFETY: only called for 2-byte T (f16, bf16), whose values are their bits.
    unsafe { core::mem::transmute_copy::<T, u16>(&x) as u32 }
}

/// Writes a work-group's results (its `threads` work-items) from the f32 tile in shared
/// memory (`rows x cols` valid of `bm x bn`, row stride `ldt` words) to `C` at `out` (row
/// stride `ldc`), applying `alpha`, the bias and the activation: each work-item takes
/// 16-byte chunks of a row (8 columns of f16/bf16, 4 of f32), read as two or one 16-byte
/// shared loads and written as one 16-byte store where `C`'s rows allow, so a wave writes
/// whole rows.
///
/// # Safety
/// `tile` holds `bm x ldt` f32 in shared memory; `out[r * ldc + c]` is writable for every
/// valid `(r, c)`; `bias` is empty or covers columns `n0 .. n0 + cols`.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn staged_epilogue<T: GemmElem>(
    threads: usize,
    tile: *const f32,
    ldt: usize,
    (rows, cols): (usize, usize),
    (bm, bn): (usize, usize),
    out: *mut T,
    ldc: usize,
    bias: &[T],
    n0: usize,
    alpha: f32,
    act: u32,
) {
    let size = core::mem::size_of::<T>();
    let per = 16 / size;
    let (tid, threads) = (flat_thread_idx() as usize, threads);
    let per_row = bn / per;
    // 16-byte stores where every row of C starts 16-byte aligned (a uniform test).
    let vec_rows = (out as usize) % 16 == 0 && ldc % per == 0;
    let has_bias = !bias.is_empty();
    let mut idx = tid;
    while idx < bm * per_row {
        let (r, c0) = (idx / per_row, (idx % per_row) * per);
        if r < rows && c0 < cols {
            let mut v = [0f32; 8];
            // SAFETY: (r, c0 .. c0 + per) lies in the tile; rows are 16-byte aligned.
            let src = unsafe { tile.add(r * ldt + c0) } as *const crate::indexing::Words4;
            each!(h in [0, 1] {
                if h * 4 < per {
                    // SAFETY: as above.
                    let w = unsafe { crate::indexing::ld4(src.wrapping_add(h)) };
                    each!(q in [0, 1, 2, 3] {
                        v[h * 4 + q] = f32::from_bits(w[q]);
                    });
                }
            });
            each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                if q < per {
                    let mut x = v[q] * alpha;
                    if has_bias && c0 + q < cols {
                        // SAFETY: the caller's contract.
                        x += unsafe { bias.get_unchecked(n0 + c0 + q) }.to_f32();
                    }
                    v[q] = activate(x, act);
                }
            });
            // SAFETY: (r, c0 ..) is a valid position of C (caller's contract).
            let dst = unsafe { out.add(r * ldc + c0) };
            if vec_rows && c0 + per <= cols {
                let mut w = [0u32; 4];
                each!(q in [0, 1, 2, 3] {
                    w[q] = if size == 2 {
                        let p = T::from_f32x2([v[2 * q], v[2 * q + 1]]);
                        bits16(p[0]) | (bits16(p[1]) << 16)
                    } else {
                        v[q].to_bits()
                    };
                });
                // SAFETY: 16 bytes of row r from column c0, 16-byte aligned (vec_rows).
                unsafe { crate::indexing::st4(dst as *mut crate::indexing::Words4, w) };
            } else {
                each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if q < per && c0 + q < cols {
                        // SAFETY: column c0 + q < cols is valid.
                        unsafe { *dst.add(q) = T::from_f32(v[q]) };
                    }
                });
            }
        }
        idx += threads;
    }
}

/// `C[z] = act(alpha * A[z] B[z] + bias)` for `z` in the batch, where
/// `A[z][i][k] = a[z * a_bs + i * a_rs + k * a_cs]`, `B[z][k][j] = b[z * b_bs + k * b_rs +
/// j * b_cs]`, `C[z][i][j] = c[z * c_bs + i * ldc + j]`, `bias` (empty: none) indexed by
/// `j`, `act` 0 none, 1 ReLU, 2 GELU (erf), 3 SiLU. Grid z is `batch x splits`: with
/// `splits > 1` (split-K) work-group `(z, s)` multiplies the `s`-th of `splits` equal runs
/// of K steps and writes its raw f32 sums to `ws[(z * splits + s) * m * n ..]` (dense
/// `m x n`), and [`gemm_split_sum`](fn@gemm_split_sum) adds them up in order and applies the epilogue.
/// Launch with [`host::matmul`] (it checks the shapes and sizes the grid for the device's
/// lowering).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn gemm_tiled<T: GemmElem>(
    a: &[T],
    b: &[T],
    bias: &[T],
    c: &mut [T],
    ws: &mut [f32],
    m: u32,
    n: u32,
    k: u32,
    a_rs: u32,
    a_cs: u32,
    b_rs: u32,
    b_cs: u32,
    ldc: u32,
    a_bs: usize,
    b_bs: usize,
    c_bs: usize,
    alpha: f32,
    act: u32,
    splits: u32,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    // Split-K runs on the matrix units only ([`host::splits_for`]): on the VALU lowering
    // `splits` is the constant 1, so none of its arithmetic competes for the registers
    // the emulated products need (gfx1030 sits at its 128-VGPR cap there).
    let splits = if low == Lowering::Valu { 1 } else { splits.max(1) as usize };
    let (m_, k_, a_rs, a_cs) = (m as usize, k as usize, a_rs as usize, a_cs as usize);
    let last = grid_dim_z() as usize / splits - 1;
    if !(m_ == 0 || k_ == 0 || last * a_bs + (m_ - 1) * a_rs + (k_ - 1) * a_cs < a.len()) {
        panic!("gemm_tiled: a buffer is shorter than the shape and strides need");
    }
    let a_of = |z: usize, m0: usize, k_begin: usize| MatrixA::new(a, z * a_bs + m0 * a_rs + k_begin * a_cs, (a_rs, a_cs), a_bs, m_.saturating_sub(m0));
    tiled_body::<T, _>(a_of, b, bias, c, ws, (m, n, k), (b_rs, b_cs, ldc), (b_bs, c_bs), (alpha, act), splits, smem);
}

/// Where [`tiled_body`] gets each K step's `BM x BK` A tile from: a strided matrix
/// ([`MatrixA`], [`gemm_tiled`](fn@gemm_tiled)) or a gather (the NHWC convolution's input patches,
/// `crate::conv_implicit`). The B tile, the products, the pipeline and the epilogue are
/// the same for every source.
pub(crate) trait ATile<T: GemmElem> {
    /// Copies columns `k0 .. k0 + BK` of this work-group's A tile (`k_left` valid columns
    /// from `k0`, zero past them) into the buffer at `buf` (`elems`: the same as a
    /// pointer), starting its copies in the current commit group; then moves on to the
    /// next step. Called for steps 0, 1, .. in order.
    fn load(&mut self, k0: usize, k_left: usize, buf: SharedAddr, elems: *mut T);
    /// `true` when the steady loop may copy whole steps with [`ATile::load_whole`].
    fn whole(&self) -> bool;
    /// [`ATile::load`] of a whole K step without edge checks.
    ///
    /// # Safety
    /// The step is whole (`k0 + BK <= k`) and [`ATile::whole`] holds.
    unsafe fn load_whole(&mut self, buf: SharedAddr);
}

/// The A tile of a strided matrix: `A[i][k] = a[base + i * rs + k * cs]` from the tile's
/// origin, `rows` rows in range; 16-byte chunks where they are asynchronous (and on the
/// CPU executor, which checks the same plan) and the rows allow, else element by element.
#[derive(Clone, Copy)]
pub(crate) struct MatrixA<'a, T> {
    a: &'a [T],
    base: usize,
    rs: usize,
    cs: usize,
    rows: usize,
    plan: Option<Chunks>,
    next: *const T,
}

impl<'a, T: GemmElem> MatrixA<'a, T> {
    /// The source of the tile at `a[base..]` (strides `(rs, cs)`, batch stride `bs`,
    /// `rows` of its rows in range).
    #[inline(always)]
    pub(crate) fn new(a: &'a [T], base: usize, (rs, cs): (usize, usize), bs: usize, rows: usize) -> Self {
        let low = mma::lowering();
        let (bm, _, bk) = block_tile::<T>(low);
        let (lda, _) = tile_lds::<T>(low);
        // Chunked copies where they are asynchronous, and on the CPU executor (which checks
        // the same plan); on AMD the element path alone keeps the kernel within the gfx9
        // scalar-register budget.
        let chunks_here = mma::copy::is_async() || cfg!(not(any(target_arch = "amdgpu", target_arch = "nvptx64")));
        let plan = if chunks_here && chunked(a, base, rs, cs, bs) { Chunks::new::<T>((bm, bk), rs, lda, swizzled::<T>(low)) } else { None };
        let next = a.as_ptr().wrapping_add(base + plan.map_or(0, |p| p.src0));
        MatrixA { a, base, rs, cs, rows, plan, next }
    }
}

impl<T: GemmElem> ATile<T> for MatrixA<'_, T> {
    #[inline(always)]
    fn load(&mut self, k0: usize, k_left: usize, buf: SharedAddr, elems: *mut T) {
        let low = mma::lowering();
        let (bm, _, bk) = block_tile::<T>(low);
        let (lda, _) = tile_lds::<T>(low);
        // SAFETY (all arms): the tile's valid elements lie in `a` (the kernel checked),
        // `chunked` checked the alignment of a chunked operand, and whole tiles lie wholly
        // in range.
        match self.plan {
            Some(p) if bm <= self.rows && bk <= k_left => unsafe { p.copy_whole(self.next, buf) },
            Some(p) => unsafe { p.copy_edge(self.a, self.base + k0, (self.rows, k_left), buf) },
            None => copy_elems(self.a, self.base + k0 * self.cs, (self.rs, self.cs), (self.rows, k_left), (bm, bk), elems, lda, swizzled::<T>(low)),
        }
        self.next = self.next.wrapping_add(bk);
    }

    #[inline(always)]
    fn whole(&self) -> bool {
        self.plan.is_some() && block_tile::<T>(mma::lowering()).0 <= self.rows
    }

    #[inline(always)]
    unsafe fn load_whole(&mut self, buf: SharedAddr) {
        if let Some(p) = self.plan {
            // SAFETY: the caller's contract (a whole step of whole rows).
            unsafe { p.copy_whole(self.next, buf) };
        }
        self.next = self.next.wrapping_add(block_tile::<T>(mma::lowering()).2);
    }
}

/// The body of [`gemm_tiled`](fn@gemm_tiled) for any A source: `a_of(z, m0, k_begin)`
/// gives the source of batch entry `z`'s tile of rows from `m0`, K from `k_begin` (this
/// work-group's split). `splits` is already 1 on the VALU lowering; the caller checked A.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tiled_body<T: GemmElem, A: ATile<T>>(
    a_of: impl FnOnce(usize, usize, usize) -> A,
    b: &[T],
    bias: &[T],
    c: &mut [T],
    ws: &mut [f32],
    (m, n, k): (u32, u32, u32),
    (b_rs, b_cs, ldc): (u32, u32, u32),
    (b_bs, c_bs): (usize, usize),
    (alpha, act): (f32, u32),
    splits: usize,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let (fm, fn_) = wave_frags::<T>(low);
    let (bm, bn, bk) = block_tile::<T>(low);
    let (lda, ldb) = tile_lds::<T>(low);
    let swz = swizzled::<T>(low);
    let a_tile = bm * lda;
    let stage = stage_elems::<T>(low);
    let nstages = stages(low);
    if smem.len() < smem_elems::<T>(low) {
        panic!("gemm_tiled: shared memory too small for the pipeline");
    }
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let (b_rs, b_cs) = (b_rs as usize, b_cs as usize);
    let ldc = ldc as usize;
    // One uniform check that every element the launch touches lies in its buffer, so the
    // loops below index without per-element checks.
    let last = grid_dim_z() as usize / splits - 1;
    let fits = |len: usize, bs: usize, rows: usize, rs: usize, cols: usize, cs: usize| {
        rows == 0 || cols == 0 || last * bs + (rows - 1) * rs + (cols - 1) * cs < len
    };
    if !(fits(b.len(), b_bs, k, b_rs, n, b_cs)
        && fits(c.len(), c_bs, m, ldc, n, 1)
        && (bias.is_empty() || bias.len() >= n)
        && (splits == 1 || ws.len() >= (last + 1) * splits * m * n)
        && (splits > 1 || ws.is_empty()))
    {
        panic!("gemm_tiled: a buffer is shorter than the shape and strides need");
    }
    let wave = flat_thread_idx() as usize / wave::size() as usize;
    let (wy, wx) = (wave / waves(low).1, wave % waves(low).1);
    let (tile_m, tile_n) = tile_of::<T>(block_idx_x(), block_idx_y());
    let (m0, n0) = (tile_m as usize * bm, tile_n as usize * bn);
    let (z, split) = (block_idx_z() as usize / splits, block_idx_z() as usize % splits);
    // This work-group's run of K steps (all of K without split-K); `k` is its length
    // from here on.
    let per_split = k.div_ceil(bk).div_ceil(splits) * bk;
    let k_begin = (split * per_split).min(k);
    let k = (k_begin + per_split).min(k) - k_begin;
    let cols_b = n.saturating_sub(n0);
    let mut a_src = a_of(z, m0, k_begin);
    let b_base = z * b_bs + n0 * b_cs + k_begin * b_rs;
    // Chunked copies where they are asynchronous, and on the CPU executor (which checks
    // the same plan); on AMD the element path alone keeps the kernel within the gfx9
    // scalar-register budget.
    let chunks_here = mma::copy::is_async() || cfg!(not(any(target_arch = "amdgpu", target_arch = "nvptx64")));
    let b_plan = if chunks_here && chunked(b, b_base, b_rs, b_cs, b_bs) { Chunks::new::<T>((bk, bn), b_rs, ldb, swz) } else { None };
    // Tiles whose columns (B) all lie in range: with a full K step, their chunks copy
    // without per-chunk checks (A: [`ATile::whole`]).
    let b_cols_full = n0 + bn <= n;
    let size = core::mem::size_of::<T>();
    let smem_ptr = smem.as_ptr();
    let smem_at = SharedAddr::new(smem_ptr);
    let stage_bytes = stage * size;
    let ring_bytes = nstages * stage_bytes;
    // The next buffer of the ring after the one at byte offset `at`.
    let next = |at: usize| if at + stage_bytes == ring_bytes { 0 } else { at + stage_bytes };
    let steps = k.div_ceil(bk);
    let mut acc = [[FragC::<f32>::zero(); MAX_F]; MAX_F];

    // Source address of this work-item's first B chunk in the next K step to load (each
    // step moves it by a constant; the A source moves itself).
    let mut b_next = b.as_ptr().wrapping_add(b_base + b_plan.map_or(0, |p| p.src0));
    // Starts the copies of K step `step` into the buffer at byte offset `at` (one commit
    // group, empty past the last step), moving the source addresses to the next step.
    // Called for steps 0, 1, 2, .. in order.
    let load = |step: usize, at: usize, a_src: &mut A, b_next: &mut *const T| {
        if step < steps {
            let k0 = step * bk;
            let k_full = k0 + bk <= k;
            let buf_a = smem_at.add(at);
            let buf_b = buf_a.add(a_tile * size);
            // The element path stores through a pointer derived from `smem` itself, which
            // the compiler knows to be shared memory (shared stores, no conversion).
            let elems_a = (smem_ptr as *mut u8).wrapping_add(at) as *mut T;
            // SAFETY (all arms): every buffer fits in `smem` (checked above), every valid
            // element lies in its buffer (checked above), and `chunked` checked the
            // alignment of chunked operands; whole tiles lie wholly in range.
            a_src.load(k0, k - k0, buf_a, elems_a);
            match b_plan {
                Some(p) if b_cols_full && k_full => unsafe { p.copy_whole(*b_next, buf_b) },
                Some(p) => unsafe { p.copy_edge(b, b_base + k0 * b_rs, (k - k0, cols_b), buf_b) },
                None => copy_elems(b, b_base + k0 * b_rs, (b_rs, b_cs), (k - k0, cols_b), (bk, bn), elems_a.wrapping_add(a_tile), ldb, swz),
            }
            *b_next = b_next.wrapping_add(bk * b_rs);
        }
        mma::copy::commit();
    };

    // This lane's fragment-load addresses relative to a buffer (ldmatrix rows on
    // `mma.sync`, else the tile origins): per step one add, per load a constant offset.
    let a_lane = ((wy * fm * 16) * lda + FragA::<T::Frag>::lane_offset(lda)) * size;
    let b_lane = (a_tile + wx * fn_ * 16 + FragB::<T::Frag>::lane_offset(ldb)) * size;
    // Swizzled tiles: the byte offsets of this lane's A and B segments (rows, and k rows,
    // are multiples of 8 plus the segment's row, so its position mod 8 is the segment's).
    let (sr, sc) = mma::segment();
    let a_seg = tile_offset::<T>(true, wy * fm * 16 + sr, sc, lda);
    let b_seg = a_tile * size + tile_offset::<T>(true, sr, wx * fn_ * 16 + sc, ldb);
    let mut fill = 0;
    for s in 0..nstages - 1 {
        load(s, fill, &mut a_src, &mut b_next);
        fill = next(fill);
    }
    let mut read = 0;
    // The refill of the buffer read in step - 1 (which every wave has left: the barrier at
    // the top of the step, or on the pipelined path the one before slice 2 of step - 1,
    // after which nothing reads that buffer) is issued after the first 16-deep slice's
    // products, so its copies queue behind work the tensor units already have (a single
    // slice: before it).
    let refill_at = if bk / 16 > 1 { 1 } else { 0 };
    // One K step: wait for its buffer, then the products of its 16-deep slices, with
    // `$refill` (the copies of the step `nstages - 1` ahead) issued at slice `refill_at`.
    macro_rules! k_step {
        ($refill:block) => {{
            // Step `step`'s group is done once at most nstages - 2 younger ones are pending.
            mma::copy::wait_groups(nstages as u32 - 2);
            barrier();
            // SAFETY: as above.
            let sa_ptr = unsafe { (smem_ptr as *const u8).add(read) } as *const T;
            // SAFETY: as above.
            let sb_ptr = unsafe { sa_ptr.add(a_tile) };
            let (sa_lane, sb_lane) = (smem_at.add(read + a_lane), smem_at.add(read + b_lane));
            read = next(read);
            each!(kk in [0, 1, 2, 3] {
                if kk == refill_at {
                    $refill
                    fill = next(fill);
                }
                if kk < bk / 16 {
                    if T::SPLIT && low == Lowering::Valu {
                        f32_k16_valu::<T>(&mut acc, (fm, fn_), (sa_ptr, sb_ptr), (lda, ldb), (wy, wx), kk);
                    } else if !T::SPLIT && mma::pairs_k::<T::Frag>() && (bk / 16) % 2 == 0 {
                        // Slice pairs (kk, kk + 1) in one product each; odd kk done.
                        if kk % 2 == 0 {
                            mma_k32::<T>(&mut acc, (fm, fn_), (sa_lane, sb_lane), (lda, ldb), kk);
                        }
                    } else {
                        mma_k16::<T>(&mut acc, (fm, fn_), (sa_ptr, sb_ptr), (sa_lane, sb_lane), (lda, ldb), (wy, wx), kk);
                    }
                }
            });
        }};
    }
    // The swizzled (16-bit `mma.sync`) path, software-pipelined: the fragments of slice
    // kk + 1 load while slice kk multiplies, and the wait and barrier for the next step
    // come before the products of the second-to-last slice (whose fragments, and the
    // last slice's, are already in registers), so the tensor units have work across the
    // barrier and the next step's first fragments load behind the last slice.
    let mut frags = [([FragA::<T::Frag>::zero(); MAX_F], [FragB::<T::Frag>::zero(); MAX_F]); 2];
    // The first slice's fragments, carried from one step to the next as words
    // (`to_words`: as 16-bit items they took twice the registers across the loop and
    // were unpacked and repacked for every product).
    let mut carried: SliceWords;
    // This lane's segment offsets in the buffer being multiplied (set before first use).
    let (mut cur_a, mut cur_b): (usize, usize);
    macro_rules! k_step_pipelined {
        ($refill:block) => {{
            each!(kk in [0, 1, 2, 3] {
                if kk == refill_at {
                    $refill
                    fill = next(fill);
                }
                if kk == 0 {
                    frags[0] = frags_of::<T>(&carried);
                }
                if kk == 3 {
                    // From the next step's buffer (the barrier at slice 2 made it ready).
                    carried = words_of::<T>(&load_slice::<T>((fm, fn_), smem_at, (cur_a, cur_b), (lda, ldb), 0));
                } else {
                    frags[(kk + 1) % 2] = load_slice::<T>((fm, fn_), smem_at, (cur_a, cur_b), (lda, ldb), kk + 1);
                }
                if kk == 2 {
                    mma::copy::wait_groups(nstages as u32 - 2);
                    barrier();
                    (cur_a, cur_b) = (read + a_seg, read + b_seg);
                    read = next(read);
                }
                mma_slice::<T>(&mut acc, (fm, fn_), &frags[kk % 2]);
            });
        }};
    }
    // Runs every K step with `$k_step`: first, for a work-group whose tiles lie wholly in
    // range, the steady state where every refill is a whole K step, copied without a
    // branch (the copies of a branchy refill came out of ptxas as one and a half times the
    // L2 sectors and 2.6 times the shared-memory wavefronts a whole tile needs); then the
    // remaining steps with the general copies.
    macro_rules! run_steps {
        ($k_step:ident) => {{
            let mut step = 0;
            if let Some(bp) = b_plan {
                if a_src.whole() && b_cols_full {
                    let steady = (k / bk).saturating_sub(nstages - 1);
                    while step < steady {
                        $k_step!({
                            let buf_a = smem_at.add(fill);
                            // SAFETY: step + nstages - 1 < k / bk: a whole K step of whole tiles.
                            unsafe {
                                a_src.load_whole(buf_a);
                                bp.copy_whole(b_next, buf_a.add(a_tile * size));
                            }
                            b_next = b_next.wrapping_add(bk * b_rs);
                            mma::copy::commit();
                        });
                        step += 1;
                    }
                }
            }
            while step < steps {
                $k_step!({
                    load(step + nstages - 1, fill, &mut a_src, &mut b_next);
                });
                step += 1;
            }
        }};
    }
    if swz && bk == 64 {
        // Step 0's buffer, and its first slice's fragments.
        mma::copy::wait_groups(nstages as u32 - 2);
        barrier();
        (cur_a, cur_b) = (read + a_seg, read + b_seg);
        read = next(read);
        carried = words_of::<T>(&load_slice::<T>((fm, fn_), smem_at, (cur_a, cur_b), (lda, ldb), 0));
        run_steps!(k_step_pipelined);
    } else {
        run_steps!(k_step);
    }

    let has_bias = !bias.is_empty();
    let c_ptr = c.as_mut_ptr();
    // The tile's origin again, from the block index read anew (`opaque_u32` keeps the
    // compilers from carrying the first result through the K loop in two registers).
    let (tile_m, tile_n) = tile_of::<T>(opaque_u32(block_idx_x()), opaque_u32(block_idx_y()));
    let (m0, n0) = (tile_m as usize * bm, tile_n as usize * bn);
    let (rows_a, cols_b) = (m.saturating_sub(m0), n.saturating_sub(n0));
    if stages_epilogue(low) {
        // Every wave is done with the pipeline buffers (the copies still pending are the
        // empty groups past the last step) before the tile overwrites them.
        mma::copy::wait_groups(0);
        barrier();
        let ldt = bn + EPAD;
        let tile = smem_ptr as *mut f32;
        each!(i in [0, 1, 2, 3] {
            each!(j in [0, 1, 2, 3] {
                if i < fm && j < fn_ {
                    let (row0, col0) = ((wy * fm + i) * 16, (wx * fn_ + j) * 16);
                    // SAFETY: inside the BM x (BN + EPAD) f32 tile (smem_elems).
                    acc[i][j].for_each(|r, cc, v| unsafe { *tile.add((row0 + r) * ldt + col0 + cc) = v });
                }
            });
        });
        barrier();
        let valid = (rows_a.min(bm), cols_b.min(bn));
        // (The epilogue derives what it needs from the kernel's arguments and block index
        // again, so nothing of split-K stays live through the K loop.)
        if !ws.is_empty() {
            // SAFETY: as below, for the dense m x n partial sums of (z, split) = grid z in
            // `ws` (only split-K launches pass a workspace).
            unsafe {
                let out = ws.as_mut_ptr().add(block_idx_z() as usize * m * n + m0 * n + n0);
                staged_epilogue::<f32>(block_threads(), tile, ldt, valid, (bm, bn), out, n, &[], n0, 1.0, 0);
            }
        } else {
            // SAFETY: the tile holds this work-group's BM x BN results; every element
            // written lies in `c` (checked at the start).
            unsafe { staged_epilogue::<T>(block_threads(), tile, ldt, valid, (bm, bn), c_ptr.add(block_idx_z() as usize * c_bs + m0 * ldc + n0), ldc, bias, n0, alpha, act) };
        }
        return;
    }
    let ws_ptr = ws.as_mut_ptr();
    each!(i in [0, 1, 2, 3] {
        each!(j in [0, 1, 2, 3] {
            if i < fm && j < fn_ {
                let (row0, col0) = (m0 + (wy * fm + i) * 16, n0 + (wx * fn_ + j) * 16);
                acc[i][j].for_each(|r, cc, v| {
                    let (row, col) = (row0 + r, col0 + cc);
                    if row < m && col < n && !ws.is_empty() {
                        // SAFETY: row < m, col < n: inside (z, split)'s partial sums.
                        unsafe { *ws_ptr.add(block_idx_z() as usize * m * n + row * n + col) = v };
                    } else if row < m && col < n {
                        let mut x = v * alpha;
                        // SAFETY: row < m, col < n: inside the buffers (checked at the start).
                        unsafe {
                            if has_bias {
                                x += bias.get_unchecked(col).to_f32();
                            }
                            *c_ptr.add(z * c_bs + row * ldc + col) = T::from_f32(activate(x, act));
                        }
                    }
                });
            }
        });
    });
}

/// Warpgroups per work-group of [`gemm_wgmma`](fn@gemm_wgmma), each computing 64 rows x [`WG_BN`]. Three
/// (192 x 256 tiles, 224 KiB of stages, 168 registers) ran 11-18% faster than two
/// (128 x 256) on the H100 at 8192^3, 4096^3 and 4096 x 14336 x 4096 (measured with the
/// earlier, unrolled epilogue).
pub const WG_GROUPS: usize = 3;
/// Work-items per work-group of [`gemm_wgmma`](fn@gemm_wgmma).
pub const WG_THREADS: usize = WG_GROUPS * 128;
/// Tile rows per band of [`gemm_wgmma`](fn@gemm_wgmma)'s tile order ([`tile_of_band`]; 4 ran 1-3%
/// slower on the H100, 16 the same).
pub const WG_GROUP_M: u32 = 8;
/// Rows of C per work-group of [`gemm_wgmma`](fn@gemm_wgmma).
pub const WG_BM: usize = 64 * WG_GROUPS;
/// Columns of C per work-group of [`gemm_wgmma`](fn@gemm_wgmma).
pub const WG_BN: usize = 256;
/// K per shared-memory stage of [`gemm_wgmma`](fn@gemm_wgmma) (one 128-byte swizzled row of 16-bit items).
pub const WG_BK: usize = 64;
/// Stages in [`gemm_wgmma`](fn@gemm_wgmma)'s ring: the copies run two K steps ahead, and a warpgroup's
/// products of one step overlap the next step's wait and barrier. (Per-stage `mbarrier`s
/// in place of the per-step barrier, and each slice as two `m64n128k16` products, ran
/// within 1% on the H100: not kept.)
pub const WG_STAGES: usize = 4;
const WG_A_BYTES: usize = WG_BM * WG_BK * 2;
const WG_STAGE_BYTES: usize = WG_A_BYTES + WG_BN * WG_BK * 2;
/// 16-byte chunks of a stage's A and B tiles per work-item (B's last one only for some).
const WG_A_CHUNKS: usize = WG_BM * 8 / WG_THREADS;
const WG_B_CHUNKS: usize = (WG_BN * 8).div_ceil(WG_THREADS);

/// Shared-memory elements (16-bit) [`gemm_wgmma`](fn@gemm_wgmma) needs: the larger of the ring and the
/// epilogue's f32 tile (which reuses it), plus 1024 bytes to align it for the swizzle.
pub const fn wgmma_smem_elems() -> usize {
    let ring = WG_STAGES * WG_STAGE_BYTES;
    let tile = WG_BM * (WG_BN + EPAD) * 4;
    (if ring > tile { ring } else { tile } + 1024) / 2
}

/// `C[z] = act(alpha * A[z] B[z] + bias)` on the H100's warpgroup matrix units (NVIDIA
/// sm_90a `wgmma`, built into the crate's `sm_90a` PTX variant; emulated by the CPU
/// executor in its `mma.sync` mode; a no-op elsewhere, where [`host::matmul`] never picks
/// it). `n % 256` and `k % 64` are zero (any `m`), A
/// row-major (`A[z][i][kk] = a[z * a_bs + i * lda + kk]`), B either row-major
/// (`b_mn_major = 1`: `B[z][kk][j] = b[z * b_bs + kk * ldb + j]`) or stored transposed
/// (`0`: `b[z * b_bs + j * ldb + kk]`), every row 16-byte aligned; C row-major, written
/// by `staged_epilogue` (any alignment; the launcher still asks for 4-byte aligned rows,
/// a requirement of the first, register-direct epilogue). Bias and activation as
/// [`gemm_tiled`](fn@gemm_tiled).
///
/// A work-group of [`WG_GROUPS`] warpgroups computes a [`WG_BM`] x 256 tile, each
/// warpgroup 64 x 256 with one `m64n256k16` per 16-deep slice (128 f32 accumulators per
/// work-item). K steps of 64 flow through a ring of [`WG_STAGES`] 128-byte swizzled
/// stages filled by `cp.async` (each work-item a few A and B chunks per step at constant
/// offsets; A rows past `m` are zero-filled and their results not stored); the tensor
/// units read the stages through descriptors ([`mma::wgmma::descriptor`]).
#[amdgpu_kernel(T = [f16, bf16], max_threads = 384)]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn gemm_wgmma<T: GemmElem>(
    a: &[T],
    b: &[T],
    bias: &[T],
    c: &mut [T],
    m: u32,
    n: u32,
    k: u32,
    lda: u32,
    ldb: u32,
    b_mn_major: u32,
    ldc: u32,
    a_bs: usize,
    b_bs: usize,
    c_bs: usize,
    alpha: f32,
    act: u32,
    smem: SharedDyn<T>,
) {
    if !wgmma::available() {
        return;
    }
    let (m, n, k, lda, ldb, ldc) = (m as usize, n as usize, k as usize, lda as usize, ldb as usize, ldc as usize);
    let last = grid_dim_z() as usize - 1;
    let (b_rows, b_cols) = if b_mn_major != 0 { (k, n) } else { (n, k) };
    let fits = |len: usize, bs: usize, rows: usize, ld: usize, cols: usize| last * bs + (rows - 1) * ld + cols <= len;
    if m == 0
        || n % WG_BN != 0
        || k % WG_BK != 0
        || k == 0
        || block_dim_x() as usize != WG_THREADS
        || smem.len() < wgmma_smem_elems()
        || !(fits(a.len(), a_bs, m, lda, k) && fits(b.len(), b_bs, b_rows, ldb, b_cols) && fits(c.len(), c_bs, m, ldc, n))
        || !(bias.is_empty() || bias.len() >= n)
    {
        panic!("gemm_wgmma: shape, buffers or shared memory do not fit");
    }
    if b_mn_major != 0 {
        wgmma_tile::<T, true>(a, b, bias, c, m, k, (lda, ldb, ldc), (a_bs, b_bs, c_bs), alpha, act, smem);
    } else {
        wgmma_tile::<T, false>(a, b, bias, c, m, k, (lda, ldb, ldc), (a_bs, b_bs, c_bs), alpha, act, smem);
    }
}

/// The body of [`gemm_wgmma`](fn@gemm_wgmma) for one B layout.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn wgmma_tile<T: GemmElem, const B_MN: bool>(
    a: &[T],
    b: &[T],
    bias: &[T],
    c: &mut [T],
    m: usize,
    k: usize,
    (lda, ldb, ldc): (usize, usize, usize),
    (a_bs, b_bs, c_bs): (usize, usize, usize),
    alpha: f32,
    act: u32,
    smem: SharedDyn<T>,
) {
    use mma::wgmma::{descriptor, sw128_offset};
    let tid = flat_thread_idx() as usize;
    let wg = tid / wgmma::WARPGROUP;
    let (tile_m, tile_n) = tile_of_band(block_idx_x(), block_idx_y(), grid_dim_x(), grid_dim_y(), WG_GROUP_M);
    let (m0, n0) = (tile_m as usize * WG_BM, tile_n as usize * WG_BN);
    let z = block_idx_z() as usize;
    let ring = SharedAddr::new(smem.as_ptr()).align_up(1024);
    // This work-item's chunks. A: rows tid / 8 + j * THREADS / 8, chunk tid % 8; rows a
    // multiple of 8 apart share their swizzle, so chunk j sits THREADS / 8 rows after
    // chunk 0. Rows past `m` copy nothing (zero-filled).
    let a_rows_apart = WG_THREADS / 8;
    let a_dst = sw128_offset(tid / 8, tid % 8);
    let mut a_src = a.as_ptr().wrapping_add(z * a_bs + (m0 + tid / 8) * lda + (tid % 8) * 8) as *const u8;
    let a_row_step = a_rows_apart * lda * 2;
    let a_rows_left = m.saturating_sub(m0 + tid / 8);
    // B, MN-major (K x N): k row tid / 32 + j * THREADS / 32, columns 8 (tid % 32) ..:
    // 64-column group g = (tid % 32) / 8 in atoms of 8 k rows ((8 g + row / 8) * 1024).
    // K-major (N x K): as A, 256 rows. Chunk j exists while its row is in the tile.
    let (b_first_row, b_rows_apart, b_rows) = if B_MN { (tid / 32, WG_THREADS / 32, WG_BK) } else { (tid / 8, WG_THREADS / 8, WG_BN) };
    let b_col_chunk = if B_MN { (tid % 32) / 8 * 8192 } else { 0 };
    let b_row_step = b_rows_apart * ldb * 2;
    let b_k_step = if B_MN { WG_BK * ldb * 2 } else { WG_BK * 2 };
    let mut b_src = if B_MN {
        b.as_ptr().wrapping_add(z * b_bs + (tid / 32) * ldb + n0 + (tid % 32) * 8)
    } else {
        b.as_ptr().wrapping_add(z * b_bs + (n0 + tid / 8) * ldb + (tid % 8) * 8)
    } as *const u8;
    let steps = k / WG_BK;
    // Copies K step `step` into stage `stage` (one commit group; empty past the end).
    let mut load = |step: usize, stage: usize| {
        if step < steps {
            let buf = ring.add(stage * WG_STAGE_BYTES);
            // SAFETY: the chunks lie in the checked buffers (whole N tiles, whole K steps,
            // rows past `m` not read, 16-byte aligned rows: the launcher's contract) and
            // in the ring.
            unsafe {
                each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if j < WG_A_CHUNKS {
                        let dst = buf.add(a_dst + j * a_rows_apart * 128);
                        let src = a_src.wrapping_add(j * a_row_step);
                        if j * a_rows_apart < a_rows_left {
                            mma::copy::copy_16_whole_at(dst, src);
                        } else {
                            mma::copy::copy_16_at(dst, src, 0);
                        }
                    }
                });
                each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let row = b_first_row + j * b_rows_apart;
                    if j < WG_B_CHUNKS && (j * b_rows_apart + b_rows_apart <= b_rows || row < b_rows) {
                        mma::copy::copy_16_whole_at(buf.add(WG_A_BYTES + b_col_chunk + sw128_offset(row, tid % 8)), b_src.wrapping_add(j * b_row_step));
                    }
                });
            }
            a_src = a_src.wrapping_add(WG_BK * 2);
            b_src = b_src.wrapping_add(b_k_step);
        }
        mma::copy::commit();
    };
    // SAFETY: all-zero bits are 0.0 (a memset, which LLVM splits into registers; the
    // array-repeat form came out as a store loop that kept `acc` in local memory).
    let mut acc: [f32; wgmma::ACC_N256] = unsafe { core::mem::zeroed() };
    load(0, 0);
    load(1, 1);
    let mut stage = 0;
    for step in 0..steps {
        // Step `step`'s copies are done once at most one younger group is pending; the
        // fence hands them to the tensor units, the barrier to the other warpgroups.
        mma::copy::wait_groups(1);
        wgmma::fence_proxy_async();
        barrier();
        let buf = ring.add(stage * WG_STAGE_BYTES);
        // Slice s of the A rows of this warpgroup: 32 bytes on along the swizzled rows.
        let da = descriptor(buf.add(wg * 64 * 128), 16, 1024);
        let db = if B_MN { descriptor(buf.add(WG_A_BYTES), 8192, 1024) } else { descriptor(buf.add(WG_A_BYTES), 16, 1024) };
        // Address steps of one slice, in descriptor units of 16 bytes.
        let db_slice = if B_MN { 2 * 1024 / 16 } else { 32 / 16 };
        wgmma::fence();
        each!(s in [0, 1, 2, 3] {
            // SAFETY: sm_90a (checked above); every warpgroup passes the same-shaped
            // descriptors of this stage, complete (waited, fenced, barrier) and not
            // rewritten until every warpgroup has waited for these products (the refill
            // of this stage comes two steps later, after the barrier of that step).
            unsafe { wgmma::mma_m64n256k16::<T::Frag, B_MN>(&mut acc, da + (s * 2) as u64, db + (s * db_slice) as u64) };
        });
        wgmma::commit();
        // The stage of step - 2: every warpgroup has waited for its products (the wait
        // below, before the barrier above).
        load(step + 2, (stage + 2) % WG_STAGES);
        wgmma::wait::<1>();
        stage = (stage + 1) % WG_STAGES;
    }
    wgmma::wait::<0>();

    // Epilogue through shared memory (the ring is free once every product and copy is
    // done): the accumulators as an f32 tile, then whole rows of C with 16-byte stores by
    // the compact loop `gemm_tiled` uses. Written straight from the accumulators, with the
    // bias and activation unrolled for all 128 of them, the kernel was 500 KB of code and
    // its warps stalled on instruction fetch.
    mma::copy::wait_groups(0);
    barrier();
    let ldt = WG_BN + EPAD;
    let tile = ring.as_ptr::<f32>();
    // SAFETY: this warpgroup's 64 rows of the WG_BM x (WG_BN + EPAD) f32 tile, which fits
    // the ring (wgmma_smem_elems); ldt even, the ring 1024-byte aligned.
    unsafe { wgmma::stage_accumulators(&acc, WG_BN, tile, ldt, (wg, tid % wgmma::WARPGROUP)) };
    barrier();
    let (tile_m, tile_n) = tile_of_band(opaque_u32(block_idx_x()), opaque_u32(block_idx_y()), grid_dim_x(), grid_dim_y(), WG_GROUP_M);
    let (m0, n0) = (tile_m as usize * WG_BM, tile_n as usize * WG_BN);
    // SAFETY: the tile holds this work-group's results; rows below `m` of C[z] from
    // (m0, n0) are in `c` (checked at the start).
    unsafe {
        staged_epilogue::<T>(WG_THREADS, tile, ldt, (m.saturating_sub(m0).min(WG_BM), WG_BN), (WG_BM, WG_BN), c.as_mut_ptr().add(z * c_bs + m0 * ldc + n0), ldc, bias, n0, alpha, act)
    };
}

/// The second pass of split-K: `C[z][i][j] = act(alpha * sum_s ws[(z * splits + s) * m *
/// n + i * n + j] + bias[j])`, the partial sums added in split order (the result does not
/// depend on timing). One work-item per element of `C[z]` (grid x), `z` = grid z.
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_split_sum<T: GemmElem>(ws: &[f32], bias: &[T], c: &mut [T], m: u32, n: u32, ldc: u32, c_bs: usize, splits: u32, alpha: f32, act: u32) {
    let (m, n, ldc, splits) = (m as usize, n as usize, ldc as usize, splits as usize);
    let (e, z) = (global_idx_x(), block_idx_z() as usize);
    if e >= m * n {
        return;
    }
    let (i, j) = (e / n, e % n);
    let mut sum = ws[z * splits * m * n + e];
    for s in 1..splits {
        sum += ws[(z * splits + s) * m * n + e];
    }
    let mut x = sum * alpha;
    if !bias.is_empty() {
        x += bias[j].to_f32();
    }
    c[z * c_bs + i * ldc + j] = T::from_f32(activate(x, act));
}

/// One wave: `d = a * b + c` for row-major 16x16 tiles through one `mma` (a test probe
/// of the primitive and its fragment layouts).
#[amdgpu_kernel(T = [f16, bf16])]
pub fn mma_tile<T: MmaFloat>(a: &[T], b: &[T], c: &[f32], d: &mut [f32]) {
    let fa = FragA::from_fn(|r, k| a[r * 16 + k]);
    let fb = FragB::from_fn(|k, col| b[k * 16 + col]);
    let fc = FragC::from_fn(|r, col| c[r * 16 + col]);
    mma::mma(&fa, &fb, fc).for_each(|r, col, v| d[r * 16 + col] = v);
}

/// [`mma_tile`](fn@mma_tile) for i8 inputs with i32 accumulation.
#[amdgpu_kernel]
pub fn mma_tile_i8(a: &[i8], b: &[i8], c: &[i32], d: &mut [i32]) {
    let fa = FragA::from_fn(|r, k| a[r * 16 + k]);
    let fb = FragB::from_fn(|k, col| b[k * 16 + col]);
    let fc = FragC::from_fn(|r, col| c[r * 16 + col]);
    mma::mma(&fa, &fb, fc).for_each(|r, col, v| d[r * 16 + col] = v);
}

/// One wave, the first half of the attention pattern: `s = q kt` (f32) and the row
/// maxima and sums of `s` reduced over the lanes holding each row (16 values each).
#[amdgpu_kernel(T = [f16, bf16])]
pub fn mma_rows<T: MmaFloat>(q: &[T], kt: &[T], s: &mut [f32], rowmax: &mut [f32], rowsum: &mut [f32]) {
    let fq = FragA::from_fn(|r, k| q[r * 16 + k]);
    let fk = FragB::from_fn(|k, col| kt[k * 16 + col]);
    let acc = mma::mma(&fq, &fk, FragC::zero());
    acc.for_each(|r, col, x| s[r * 16 + col] = x);
    // One writer per row: the lane holding column 0.
    acc.row_max().for_each(|r, col, x| if col == 0 { rowmax[r] = x });
    acc.row_sum().for_each(|r, col, x| if col == 0 { rowsum[r] = x });
}

/// One wave, the second half: the accumulator `p` (row-major 16x16 f32) converted in
/// registers to an A operand (`to_a`, rounding to `T`), then `o = P v`.
#[amdgpu_kernel(T = [f16, bf16])]
pub fn mma_pv<T: MmaFloat>(p: &[f32], v: &[T], o: &mut [f32]) {
    let acc = FragC::from_fn(|r, col| p[r * 16 + col]);
    let pa = acc.to_a::<T>();
    let fv = FragB::from_fn(|k, col| v[k * 16 + col]);
    mma::mma(&pa, &fv, FragC::zero()).for_each(|r, col, x| o[r * 16 + col] = x);
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host;
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;
