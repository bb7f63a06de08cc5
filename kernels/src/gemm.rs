//! Matrix multiplication on the matrix units (`kernel_dsl::mma`): `C = act(alpha * A B +
//! bias)`, batched and strided, A and/or B transposed, f32/f16/bf16 in and out, f32
//! accumulation.
//!
//! A work-group of 4 waves (2 x 2) computes a `BM x BN` tile of C; each wave a block of
//! `FM x FN` 16x16 fragments whose shape depends on the lowering ([`wave_frags`]: 4x4 on
//! `mma.sync`, 4x2 on MFMA, 2x2 on WMMA, 2x1 on the VALU fallback, 1x1 there for f32).
//! K advances in steps of `BK` (32 for 16-bit inputs, 16 for f32) through a ring of
//! shared-memory buffers ([`stages`]): on NVIDIA sm_80+ three, filled by `cp.async`
//! 16-byte copies two steps ahead, with `ldmatrix` fragment loads; elsewhere two, filled
//! element by element one step ahead. One barrier per step. Operands that are not
//! contiguous along their rows (transposed A, odd strides) take the element path.
//!
//! f32 inputs run as three bf16 products (`hi*hi + hi*lo + lo*hi` with `x = hi + lo`,
//! about 16 significant bits per product, f32 accumulation); without a matrix unit (the
//! VALU lowering) as plain f32 FMAs.
//!
//! Also here: [`mma_tile`], [`mma_rows`] and [`mma_pv`], one-wave kernels that exercise the `mma`
//! primitive (a product, accumulator -> A conversion, row reductions) for the tests.
use kernel_dsl::mma::{self, FragA, FragB, FragC, Lowering, MmaFloat};
use kernel_dsl::prelude::*;

/// Waves per work-group along M and N.
pub const WAVES_M: usize = 2;
/// Waves per work-group along N.
pub const WAVES_N: usize = 2;
/// Largest fragment count per wave along M or N.
pub const MAX_F: usize = 4;
/// Shared-memory row padding, in elements (keeps rows 16-byte aligned, shifts banks).
pub const PAD: usize = 8;

/// Runs `$body` with `$i` bound to each listed constant (straight-line code, so fragment
/// arrays are indexed by constants and stay in registers).
macro_rules! each {
    ($i:ident in [$($n:literal),*] $body:block) => {$({
        #[allow(non_upper_case_globals)]
        const $i: usize = $n;
        $body
    })*};
}

/// Work-items per work-group: 4 waves (a constant on a GPU, so unused chunk slots vanish).
#[inline(always)]
fn block_threads() -> usize {
    WAVES_M * WAVES_N * mma::lowering().wave_lanes() as usize
}

/// 16x16 fragments per wave along M and N for a lowering and element type (f32 inputs
/// hold hi and lo fragments, so they get smaller tiles where registers are scarce).
pub const fn wave_frags<T: GemmElem>(low: Lowering) -> (usize, usize) {
    match (low, T::SPLIT) {
        (Lowering::MmaSync, _) => (4, 4),
        (Lowering::Mfma, _) => (4, 2),
        (Lowering::Wmma, _) => (2, 2),
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

/// Tile sizes of one launch: `(BM, BN, BK)`.
pub const fn block_tile<T: GemmElem>(low: Lowering) -> (usize, usize, usize) {
    let (fm, fn_) = wave_frags::<T>(low);
    (WAVES_M * 16 * fm, WAVES_N * 16 * fn_, T::BK)
}

/// Shared-memory buffers in the copy pipeline: 3 where copies are asynchronous
/// (`cp.async`: two K steps in flight during a step's products), else 2.
pub const fn stages(low: Lowering) -> usize {
    match low {
        Lowering::MmaSync => 3,
        _ => 2,
    }
}

/// Shared-memory elements of one buffer (A tile + B tile).
pub const fn stage_elems<T: GemmElem>(low: Lowering) -> usize {
    let (bm, bn, bk) = block_tile::<T>(low);
    bm * (bk + PAD) + bk * (bn + PAD)
}

/// `true` when rows of the tile whose element `(r, c)` is `src[base + r * rs + c * cs]`
/// can move as 16-byte chunks: contiguous along `c`, every row and batch entry starting
/// on a 16-byte boundary.
#[inline(always)]
fn chunked<T>(src: &[T], base: usize, rs: usize, cs: usize, batch_stride: usize) -> bool {
    let per = 16 / core::mem::size_of::<T>();
    let aligned = (src.as_ptr() as usize + base * core::mem::size_of::<T>()) % 16 == 0;
    cs == 1 && rs % per == 0 && batch_stride % per == 0 && aligned
}

/// Copies the `rows x cols` tile whose element `(r, c)` is `src[base + r * rs + c * cs]`
/// (zero outside `rows_valid x cols_valid`) to shared memory at `dst` (row stride `ld`):
/// as asynchronous 16-byte chunks when `chunks` ([`chunked`]), else element by element
/// (consecutive work-items on the source's contiguous dimension).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn copy_tile<T: GemmElem>(
    src: &[T],
    base: usize,
    (rs, cs): (usize, usize),
    (rows_valid, cols_valid): (usize, usize),
    (rows, cols): (usize, usize),
    chunks: bool,
    dst: *mut T,
    ld: usize,
) {
    let (tid, threads) = (flat_thread_idx() as usize, block_threads());
    if chunks {
        let per = 16 / core::mem::size_of::<T>();
        let total = rows * cols / per;
        let mut ch = tid;
        while ch < total {
            let (r, c) = (ch / (cols / per), (ch % (cols / per)) * per);
            let valid = if r < rows_valid { cols_valid.saturating_sub(c).min(per) } else { 0 };
            // SAFETY: the launcher checked that every valid element lies in `src`, and
            // `chunked` that valid chunks are 16-byte aligned; (r, c) lies in the tile
            // and the tile in the shared buffer (checked by the kernel).
            unsafe {
                let from = if valid > 0 { src.as_ptr().add(base + r * rs + c) } else { src.as_ptr() };
                mma::copy::copy_16(dst.add(r * ld + c) as *mut u8, from as *const u8, (valid * core::mem::size_of::<T>()) as u32);
            }
            ch += threads;
        }
    } else {
        let along_rows = rs == 1 && cs != 1;
        let mut e = tid;
        while e < rows * cols {
            let (r, c) = if along_rows { (e % rows, e / rows) } else { (e / cols, e % cols) };
            // SAFETY: the kernel checked once that every in-range element lies in `src`.
            let v = if r < rows_valid && c < cols_valid { unsafe { *src.get_unchecked(base + r * rs + c * cs) } } else { T::ZERO };
            // SAFETY: as above.
            unsafe { *dst.add(r * ld + c) = v };
            e += threads;
        }
    }
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

/// `C[z] = act(alpha * A[z] B[z] + bias)` for `z` in the batch (grid z), where
/// `A[z][i][k] = a[z * a_bs + i * a_rs + k * a_cs]`, `B[z][k][j] = b[z * b_bs + k * b_rs +
/// j * b_cs]`, `C[z][i][j] = c[z * c_bs + i * ldc + j]`, `bias` (empty: none) indexed by
/// `j`, `act` 0 none, 1 ReLU, 2 GELU (erf), 3 SiLU. Launch with [`host::matmul`] (it
/// checks the shapes and sizes the grid for the device's lowering).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn gemm_tiled<T: GemmElem>(
    a: &[T],
    b: &[T],
    bias: &[T],
    c: &mut [T],
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
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let (fm, fn_) = wave_frags::<T>(low);
    let (bm, bn, bk) = block_tile::<T>(low);
    let (lda, ldb) = (bk + PAD, bn + PAD);
    let a_tile = bm * lda;
    let stage = stage_elems::<T>(low);
    let nstages = stages(low);
    if smem.len() < nstages * stage {
        panic!("gemm_tiled: shared memory too small for the pipeline");
    }
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let (a_rs, a_cs, b_rs, b_cs) = (a_rs as usize, a_cs as usize, b_rs as usize, b_cs as usize);
    let ldc = ldc as usize;
    // One uniform check that every element the launch touches lies in its buffer, so the
    // loops below index without per-element checks.
    let last = grid_dim_z() as usize - 1;
    let fits = |len: usize, bs: usize, rows: usize, rs: usize, cols: usize, cs: usize| {
        rows == 0 || cols == 0 || last * bs + (rows - 1) * rs + (cols - 1) * cs < len
    };
    if !(fits(a.len(), a_bs, m, a_rs, k, a_cs)
        && fits(b.len(), b_bs, k, b_rs, n, b_cs)
        && fits(c.len(), c_bs, m, ldc, n, 1)
        && (bias.is_empty() || bias.len() >= n))
    {
        panic!("gemm_tiled: a buffer is shorter than the shape and strides need");
    }
    let wave = flat_thread_idx() as usize / wave::size() as usize;
    let (wy, wx) = (wave / WAVES_N, wave % WAVES_N);
    let (m0, n0, z) = (block_idx_y() as usize * bm, block_idx_x() as usize * bn, block_idx_z() as usize);
    let rows_a = m.saturating_sub(m0);
    let cols_b = n.saturating_sub(n0);
    let a_base = z * a_bs + m0 * a_rs;
    let b_base = z * b_bs + n0 * b_cs;
    // Chunked copies only where they are asynchronous (elsewhere the element path alone
    // keeps the kernel within the gfx9 scalar-register budget).
    let a_chunks = mma::copy::is_async() && chunked(a, a_base, a_rs, a_cs, a_bs);
    let b_chunks = mma::copy::is_async() && chunked(b, b_base, b_rs, b_cs, b_bs);
    let smem_ptr = smem.as_ptr();
    let steps = k.div_ceil(bk);
    let mut acc = [[FragC::<f32>::zero(); MAX_F]; MAX_F];

    // Starts the copies of K step `step` into buffer `step % nstages` (one commit group).
    let load = |step: usize| {
        if step < steps {
            let k0 = step * bk;
            // SAFETY: every buffer fits in `smem` (checked above).
            let buf = unsafe { smem_ptr.add((step % nstages) * stage) };
            copy_tile(a, a_base + k0 * a_cs, (a_rs, a_cs), (rows_a, k - k0), (bm, bk), a_chunks, buf, lda);
            // SAFETY: as above.
            let buf_b = unsafe { buf.add(a_tile) };
            copy_tile(b, b_base + k0 * b_rs, (b_rs, b_cs), (k - k0, cols_b), (bk, bn), b_chunks, buf_b, ldb);
        }
        mma::copy::commit();
    };

    for s in 0..nstages - 1 {
        load(s);
    }
    for step in 0..steps {
        // Step `step`'s group is done once at most nstages - 2 younger ones are pending.
        mma::copy::wait_groups(nstages as u32 - 2);
        barrier();
        // Refills the buffer read in step - 1, which every wave has left (barrier above).
        load(step + nstages - 1);
        // SAFETY: as above.
        let sa_ptr = unsafe { smem_ptr.add((step % nstages) * stage) } as *const T;
        // SAFETY: as above.
        let sb_ptr = unsafe { sa_ptr.add(a_tile) };
        for kk in 0..bk / 16 {
            if T::SPLIT && low == Lowering::Valu {
                // No matrix unit: f32 inputs take exact f32 products straight from shared
                // memory, in the accumulator layout (three emulated bf16 products would
                // cost more registers than gfx10 has).
                each!(i in [0, 1, 2, 3] {
                    each!(j in [0, 1, 2, 3] {
                        if i < fm && j < fn_ {
                            let (row0, col0) = ((wy * fm + i) * 16, (wx * fn_ + j) * 16);
                            acc[i][j] = acc[i][j].map(|r, cc, v| {
                                let mut v = v;
                                for q in 0..16 {
                                    // SAFETY: inside the A and B tiles of this buffer.
                                    let (x, y) = unsafe {
                                        ((*sa_ptr.add((row0 + r) * lda + kk * 16 + q)).to_f32(), (*sb_ptr.add((kk * 16 + q) * ldb + col0 + cc)).to_f32())
                                    };
                                    v += x * y;
                                }
                                v
                            });
                        }
                    });
                });
                continue;
            }
            let mut bf = [FragB::<T::Frag>::zero(); MAX_F];
            let mut bl = [FragB::<T::Frag>::zero(); MAX_F];
            each!(j in [0, 1, 2, 3] {
                if j < fn_ {
                    let col0 = (wx * fn_ + j) * 16;
                    // SAFETY: rows kk*16.. + 16 and columns col0..col0 + 16 of the B tile.
                    let bt = |q: usize, cc: usize| unsafe { *sb_ptr.add((kk * 16 + q) * ldb + col0 + cc) };
                    bf[j] = if T::SPLIT {
                        FragB::from_fn(|q, cc| bt(q, cc).hi())
                    } else {
                        // SAFETY: as above; ldb and col0 are multiples of 8.
                        unsafe { FragB::load_shared(sb_ptr.add(kk * 16 * ldb + col0) as *const T::Frag, ldb) }
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
                    let at = |r: usize, q: usize| unsafe { *sa_ptr.add((row0 + r) * lda + kk * 16 + q) };
                    let af = if T::SPLIT {
                        FragA::from_fn(|r, q| at(r, q).hi())
                    } else {
                        // SAFETY: as above; rows are 16-byte aligned (lda, kk*16 multiples of 8).
                        unsafe { FragA::load_shared(sa_ptr.add(row0 * lda + kk * 16) as *const T::Frag, lda) }
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
    }

    let has_bias = !bias.is_empty();
    let c_ptr = c.as_mut_ptr();
    each!(i in [0, 1, 2, 3] {
        each!(j in [0, 1, 2, 3] {
            if i < fm && j < fn_ {
                let (row0, col0) = (m0 + (wy * fm + i) * 16, n0 + (wx * fn_ + j) * 16);
                acc[i][j].for_each(|r, cc, v| {
                    let (row, col) = (row0 + r, col0 + cc);
                    if row < m && col < n {
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

/// One wave: `d = a * b + c` for row-major 16x16 tiles through one `mma` (a test probe
/// of the primitive and its fragment layouts).
#[amdgpu_kernel(T = [f16, bf16])]
pub fn mma_tile<T: MmaFloat>(a: &[T], b: &[T], c: &[f32], d: &mut [f32]) {
    let fa = FragA::from_fn(|r, k| a[r * 16 + k]);
    let fb = FragB::from_fn(|k, col| b[k * 16 + col]);
    let fc = FragC::from_fn(|r, col| c[r * 16 + col]);
    mma::mma(&fa, &fb, fc).for_each(|r, col, v| d[r * 16 + col] = v);
}

/// [`mma_tile`] for i8 inputs with i32 accumulation.
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
