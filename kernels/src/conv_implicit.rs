//! Implicit-GEMM 2-D convolution on the matrix units: NCHW input, `(c_out, c_in / groups,
//! k_h, k_w)` weights, stride, padding, dilation and groups, bias fused in the epilogue,
//! f32/f16/bf16 in and out with f32 accumulation. No im2col buffer: the GEMM's B tile is
//! gathered from the input on the fly.
//!
//! Per batch entry `b` and group `g` (grid z), the convolution is the product
//! `Y (c_out/groups x oh*ow) = W_g (c_out/groups x K) * X_cols (K x oh*ow)` with
//! `K = c_in/groups * k_h * k_w`: A is the group's rows of the (contiguous) weights, moved
//! as [`gemm_tiled`](fn@crate::gemm::gemm_tiled) moves a row-major A (16-byte chunks where the
//! copies are asynchronous and the rows aligned, else element by element); B's element
//! `(k, n)`, `k = (ci, ky, kx)`, `n = (oy, ox)`, is `x[b, g*c_in/groups + ci, oy*stride +
//! ky*dilation - pad, ox*stride + kx*dilation - pad]` (zero in the padding), gathered
//! element by element into the shared tile, each work-item on one output position `n`
//! for the whole K loop (so consecutive work-items read consecutive `ox`), stepping its
//! window position `(ci, ky, kx)` along K without divisions, all of a step's loads in
//! flight at once (registers first, then the tile). The products
//! are those of `gemm_tiled` (same tiles per lowering, `mma_k16` / `mma_k32` /
//! `f32_k16_valu` on padded shared tiles), through two shared buffers: K step `s + 1` is
//! copied while step `s` multiplies.
//!
//! 32-bit index arithmetic (the launcher checks that every tensor has fewer than 2^31
//! elements).
use crate::dtype::divmod32;
use kernel_dsl::each;
use crate::gemm::{block_threads, block_tile, chunked, copy_elems, f32_k16_valu, mma_k16, mma_k32, staged_epilogue, swizzled, tile_lds, tile_offset, tiled_body, wave_frags, waves, ATile, Chunks, GemmElem, EPAD, MAX_F, PAD};
use kernel_dsl::hint::opaque_u32;
use kernel_dsl::mma::{self, FragA, FragB, FragC, Lowering, SharedAddr};
use kernel_dsl::prelude::*;

/// Shared-memory buffers of the conv pipeline.
const CONV_STAGES: usize = 2;

/// Row strides, in elements, of the conv's A and B tiles (padded, never swizzled).
pub const fn conv_tile_lds<T: GemmElem>(low: Lowering) -> (usize, usize) {
    let (_, bn, bk) = block_tile::<T>(low);
    (bk + PAD, bn + PAD)
}

/// Shared-memory elements (of `T`) one [`conv2d_implicit`](fn@conv2d_implicit) launch needs.
pub const fn conv_smem_elems<T: GemmElem>(low: Lowering) -> usize {
    let (bm, _, bk) = block_tile::<T>(low);
    let (lda, ldb) = conv_tile_lds::<T>(low);
    CONV_STAGES * (bm * lda + bk * ldb)
}

/// Most B-tile rows one work-item gathers per K step (`BK / (threads / BN)`: 32 on
/// `mma.sync` f16/bf16, 64 rows by 256 work-items over 128 columns).
const GATHER_ROWS: usize = 32;

/// Entries of the `geom` argument of [`conv2d_implicit`](fn@conv2d_implicit).
pub const CONV_GEOM: usize = 18;

/// `y (batch, c_out, oh, ow) = conv2d(x, w) + bias`, `bias` (empty: none) per output
/// channel. `geom` = `[c_in/groups, h, w, k_h, k_w, oh, ow, stride, pad, dilation,
/// c_out/groups, groups, s0, s1, s2, s3, offset, splits]`: input element `(b, c, y, x)`
/// at `offset + b*s0 + c*s1 + y*s2 + x*s3`; `w` contiguous, `y` contiguous. Grid: x the
/// tiles of `oh*ow` ([`block_tile`]'s BN), y the tiles of `c_out/groups` (BM), z
/// `batch * groups * splits`.
///
/// Split K (`splits > 1`, for launches of fewer work-groups than the GPU has compute
/// units): work-group `s` of a tile sums only its share of the K steps and writes the f32
/// partial tile, without bias, to `part[s * len(y) + i]` (`y` untouched);
/// [`conv2d_split_sum`](fn@conv2d_split_sum) then adds the partials and the bias into `y`.
/// Launch with [`conv2d`] (it checks everything).
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 256)]
#[inline(always)]
pub fn conv2d_implicit<T: GemmElem>(x: &[T], w: &[T], bias: &[T], y: &mut [T], part: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    let low = mma::lowering();
    let (fm, fn_) = wave_frags::<T>(low);
    let (bm, bn, bk) = block_tile::<T>(low);
    let (lda, ldb) = conv_tile_lds::<T>(low);
    let a_tile = bm * lda;
    let stage = a_tile + bk * ldb;
    if smem.len() < conv_smem_elems::<T>(low) {
        panic!("conv2d_implicit: shared memory too small for the pipeline");
    }
    let g = &geom[..CONV_GEOM];
    let (cin, h, wd, kh, kw, oh, ow) = (g[0], g[1], g[2], g[3], g[4], g[5], g[6]);
    let (st, pad, dil, m, groups) = (g[7], g[8], g[9], g[10], g[11]);
    let (s0, s1, s2, s3, off, splits) = (g[12], g[13], g[14], g[15], g[16], g[17]);
    let taps = kh * kw;
    let k = cin * taps;
    let n = oh * ow;
    let batch = grid_dim_z() / (groups * splits).max(1);
    let n_y = batch * groups * m * n;
    // One uniform check that every element the launch touches lies in its buffer (the
    // launcher's checks, again), so the loops index without per-element checks.
    let x_last = off + (batch - 1) * s0 + (groups * cin - 1) * s1 + (h - 1) * s2 + (wd - 1) * s3;
    if groups == 0
        || cin == 0
        || taps == 0
        || (x_last as usize) >= x.len()
        || (groups * m * k) as usize > w.len()
        || n_y as usize > y.len()
        || splits == 0
        || (splits > 1 && (splits * n_y) as usize > part.len())
        || !(bias.is_empty() || bias.len() >= (groups * m) as usize)
    {
        panic!("conv2d_implicit: a buffer is shorter than the geometry needs");
    }
    let (bg, _) = divmod32(block_idx_z(), splits);
    let (bi, gi) = divmod32(bg, groups);
    let (m0, n0) = (block_idx_y() as usize * bm, block_idx_x() as usize * bn);
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let wave = flat_thread_idx() as usize / wave::size() as usize;
    let (wy, wx) = (wave / waves(low).1, wave % waves(low).1);
    let rows_a = m.saturating_sub(m0);
    let a_base = (gi as usize * m + m0) * k;
    let chunks_here = mma::copy::is_async() || cfg!(not(any(target_arch = "amdgpu", target_arch = "nvptx64")));
    let a_plan = if chunks_here && chunked(w, a_base, k, 1, 0) { Chunks::new::<T>((bm, bk), k, lda, false) } else { None };

    // This work-item's output position: column `nc` of the B tile, for the whole K loop;
    // its rows are `kr0, kr0 + rstep, ..`.
    let (tid, threads) = (flat_thread_idx() as usize, block_threads());
    let (nc, kr0, rstep) = (tid % bn, tid / bn, threads / bn);
    // B-tile rows per work-item and K step (`bk` is a multiple of `rstep` for every tile).
    let rows = bk / rstep;
    if rows > GATHER_ROWS || rows * rstep != bk {
        panic!("conv2d_implicit: the B tile does not split into the gather's rows");
    }
    let col_n = n0 + nc;
    let col_ok = col_n < n;
    let (oy, ox) = divmod32(col_n as u32, ow);
    // Window origin (wrapping below zero: the unsigned compares below reject it).
    let (iy0, ix0) = ((oy * st).wrapping_sub(pad), (ox * st).wrapping_sub(pad));
    let x_base = off + bi * s0 + gi * cin * s1;
    let xp = x.as_ptr();

    let size = core::mem::size_of::<T>();
    let smem_ptr = smem.as_ptr();
    let smem_at = SharedAddr::new(smem_ptr);
    let stage_bytes = stage * size;
    // This work-group's K steps: all of them, or its share under split K.
    let all_steps = k.div_ceil(bk);
    let per_split = all_steps.div_ceil(splits as usize);
    let (_, si) = divmod32(block_idx_z(), splits);
    let first = (si as usize * per_split).min(all_steps);
    let steps = (all_steps - first).min(per_split);
    let mut acc = [[FragC::<f32>::zero(); MAX_F]; MAX_F];

    // Copies K step `first + step` into the buffer at byte offset `at` (one commit group).
    let load = |step: usize, at: usize| {
        let k0 = (first + step) * bk;
        let buf_a = smem_at.add(at);
        let elems_a = (smem_ptr as *mut u8).wrapping_add(at) as *mut T;
        // SAFETY (A): every buffer fits in `smem` (checked above), every valid element of
        // the weights lies in `w` (checked above), and `chunked` checked the alignment.
        match a_plan {
            Some(p) if m0 + bm <= m && k0 + bk <= k => unsafe { p.copy_whole(w.as_ptr().wrapping_add(a_base + k0 + p.src0), buf_a) },
            Some(p) => unsafe { p.copy_edge(w, a_base + k0, (rows_a, k - k0), buf_a) },
            None => copy_elems(w, a_base + k0, (k, 1), (rows_a, k - k0), (bm, bk), elems_a, lda, false),
        }
        let elems_b = elems_a.wrapping_add(a_tile);
        // This work-item's first row of the step as (ci, ky, kx): two divisions per step;
        // each next row (`rstep` further along K) steps the window position forward with
        // compares, not divisions. All of the step's loads are issued first, into
        // registers (straight-line code, `rows` a constant on a GPU), and only then stored
        // to the tile: a store right after its load would wait out one memory latency per
        // element.
        let mut kg = (k0 + kr0) as u32;
        let (mut ci, t) = divmod32(kg, taps);
        let (mut ky, mut kx) = divmod32(t, kw);
        let rs = rstep as u32;
        let mut vals = [T::ZERO; GATHER_ROWS];
        // The VALU fallback (gfx10, older NVIDIA) has the fewest registers to spare: each
        // element is stored as it arrives there.
        let direct = low == Lowering::Valu;
        each!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            if i < rows {
                let (iy, ix) = (iy0.wrapping_add(ky * dil), ix0.wrapping_add(kx * dil));
                let mut v = T::ZERO;
                if col_ok && (kg as usize) < k && iy < h && ix < wd {
                    // SAFETY: (bi, gi*cin + ci, iy, ix) is an element of the input view,
                    // which lies in `x` (checked above).
                    v = unsafe { *xp.add((x_base + ci * s1 + iy * s2 + ix * s3) as usize) };
                }
                if direct {
                    // SAFETY: (kr0 + i * rstep, nc) lies in the B tile of this buffer.
                    unsafe { *elems_b.add((kr0 + i * rstep) * ldb + nc) = v };
                } else {
                    vals[i] = v;
                }
                if i + 1 < rows {
                    kg += rs;
                    kx += rs;
                    while kx >= kw {
                        kx -= kw;
                        ky += 1;
                    }
                    while ky >= kh {
                        ky -= kh;
                        ci += 1;
                    }
                }
            }
        });
        // (The last unrolled row's window step is never used.)
        let _ = (kg, ci);
        each!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            if !direct && i < rows {
                // SAFETY: (kr0 + i * rstep, nc) lies in the B tile of this buffer.
                unsafe { *elems_b.add((kr0 + i * rstep) * ldb + nc) = vals[i] };
            }
        });
        mma::copy::commit();
    };

    let a_lane = ((wy * fm * 16) * lda + FragA::<T::Frag>::lane_offset(lda)) * size;
    let b_lane = (a_tile + wx * fn_ * 16 + FragB::<T::Frag>::lane_offset(ldb)) * size;
    let tiles = (smem_ptr as *const T, smem_at, a_tile, (a_lane, b_lane));
    if low == Lowering::Valu {
        // VALU (gfx10): a prologue load, then wait / load next / multiply current. Its
        // gather stores each element as it arrives, so two call sites of `load` inline;
        // the one-call-site order below kept more values live and spilled f32 on gfx1030.
        if steps > 0 {
            load(0, 0);
        }
        let mut step = 0;
        while step < steps {
            mma::copy::wait_groups(0);
            barrier();
            let read = (step % 2) * stage_bytes;
            if step + 1 < steps {
                load(step + 1, stage_bytes - read);
            }
            k_step_product::<T>(&mut acc, tiles, read, (fm, fn_), (lda, ldb), (wy, wx), bk);
            step += 1;
        }
    } else {
        // Iteration `j` loads K step `j` (while there is one) into buffer `j % 2` and
        // multiplies step `j - 1` from the other: the order of a prologue load followed by
        // load-next/multiply-current steps, with one call site of `load` (so it is inlined;
        // two call sites left a call in the main loop once the gather grew).
        let mut j = 0;
        while j <= steps {
            if j > 0 {
                // Step `j - 1`'s copies are done (the only group pending), and every wave is
                // past step `j - 2`'s products, so buffer `j % 2` is free for step `j`.
                mma::copy::wait_groups(0);
                barrier();
            }
            if j < steps {
                load(j, (j % 2) * stage_bytes);
            }
            if j > 0 {
                k_step_product::<T>(&mut acc, tiles, ((j - 1) % 2) * stage_bytes, (fm, fn_), (lda, ldb), (wy, wx), bk);
            }
            j += 1;
        }
    }

    // Epilogue: straight from the accumulators, bias per output channel (row); under split
    // K the f32 partial tile instead.
    let has_bias = !bias.is_empty();
    let (m0, n0) = (opaque_u32(block_idx_y()) as usize * bm, opaque_u32(block_idx_x()) as usize * bn);
    let (bg, si) = divmod32(opaque_u32(block_idx_z()), splits);
    let (bi, gi) = divmod32(bg, groups);
    let ch0 = gi as usize * m;
    let y_ptr = y.as_mut_ptr();
    let part_ptr = part.as_mut_ptr();
    let y_base = (bi as usize * groups as usize * m + ch0) * n;
    let part_base = si as usize * n_y as usize + y_base;
    let split = splits > 1;
    each!(i in [0, 1, 2, 3] {
        each!(j in [0, 1, 2, 3] {
            if i < fm && j < fn_ {
                let (row0, col0) = (m0 + (wy * fm + i) * 16, n0 + (wx * fn_ + j) * 16);
                acc[i][j].for_each(|r, cc, v| {
                    let (row, col) = (row0 + r, col0 + cc);
                    if row < m && col < n {
                        let mut v = v;
                        // SAFETY: row < m, col < n: inside `y`, `bias` and (split) `part`
                        // (checked above).
                        unsafe {
                            if split {
                                *part_ptr.add(part_base + row * n + col) = v;
                            } else {
                                if has_bias {
                                    v += bias.get_unchecked(ch0 + row).to_f32();
                                }
                                *y_ptr.add(y_base + row * n + col) = T::from_f32(v);
                            }
                        }
                    }
                });
            }
        });
    });
}

/// One K step's products from the shared buffer at byte offset `read`; `tiles` = (shared
/// base, its address, A-tile elements, this lane's A and B byte offsets).
#[inline(always)]
fn k_step_product<T: GemmElem>(
    acc: &mut [[FragC<f32>; MAX_F]; MAX_F],
    (smem_ptr, smem_at, a_tile, (a_lane, b_lane)): (*const T, SharedAddr, usize, (usize, usize)),
    read: usize,
    (fm, fn_): (usize, usize),
    (lda, ldb): (usize, usize),
    (wy, wx): (usize, usize),
    bk: usize,
) {
    let low = mma::lowering();
    // SAFETY: the buffer at `read` lies in `smem`.
    let sa_ptr = unsafe { (smem_ptr as *const u8).add(read) } as *const T;
    // SAFETY: as above.
    let sb_ptr = unsafe { sa_ptr.add(a_tile) };
    let (sa_lane, sb_lane) = (smem_at.add(read + a_lane), smem_at.add(read + b_lane));
    each!(kk in [0, 1, 2, 3] {
        if kk < bk / 16 {
            if T::SPLIT && low == Lowering::Valu {
                f32_k16_valu::<T>(acc, (fm, fn_), (sa_ptr, sb_ptr), (lda, ldb), (wy, wx), kk);
            } else if !T::SPLIT && mma::pairs_k::<T::Frag>() && (bk / 16) % 2 == 0 {
                if kk % 2 == 0 {
                    mma_k32::<T>(acc, (fm, fn_), (sa_lane, sb_lane), (lda, ldb), kk);
                }
            } else {
                mma_k16::<T>(acc, (fm, fn_), (sa_ptr, sb_ptr), (sa_lane, sb_lane), (lda, ldb), (wy, wx), kk);
            }
        }
    });
}

/// The second pass of a split-K [`conv2d_implicit`](fn@conv2d_implicit): `y[i] = sum_s
/// part[s * len(y) + i] + bias[channel of i]` (`bias` empty: none), rounded once to `T`.
/// `geom` = `[splits, oh*ow, c_out]`. Grid-stride over `y`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn conv2d_split_sum<T: GemmElem>(part: &[f32], bias: &[T], y: &mut [T], geom: &[u32]) {
    let (splits, n, c_out) = (geom[0] as usize, geom[1] as usize, geom[2] as usize);
    let len = y.len();
    if part.len() < splits * len || n == 0 || !(bias.is_empty() || bias.len() >= c_out) {
        panic!("conv2d_split_sum: a buffer is shorter than the geometry needs");
    }
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < len {
        let mut v = 0f32;
        let mut s = 0;
        while s < splits {
            v += part[s * len + i];
            s += 1;
        }
        if !bias.is_empty() {
            v += bias[(i / n) % c_out].to_f32();
        }
        y[i] = T::from_f32(v);
        i += step;
    }
}


/// Entries of the `geom` argument of [`conv2d_nhwc`](fn@conv2d_nhwc).
pub const NHWC_GEOM: usize = 16;

/// Most 16-byte chunks of an A tile one work-item gathers per K step (`mma.sync` f16/bf16:
/// 256 rows x 64 channels over 256 work-items).
const NHWC_CHUNKS: usize = 8;

/// Where one work-item's chunks of a [`PatchA`] tile go: rows `r0 + i * rstep` (`i <
/// count`), column `c0`, K `bk` per step; chunk `i` at byte `dst0 + i * dst_step` of a stage.
#[derive(Clone, Copy)]
struct PatchLayout {
    r0: usize,
    c0: usize,
    rstep: usize,
    count: usize,
    bk: usize,
    dst0: usize,
    dst_step: usize,
}

/// The A tile of the NHWC convolution's GEMM ([`conv2d_nhwc`](fn@conv2d_nhwc)): row `p`
/// (output pixel `(b, oy, ox)`) and column `kg = tap * c_in + ci` (`tap = ky * k_w + kx`)
/// hold `x[b, oy*stride + ky*dil - pad, ox*stride + kx*dil - pad, ci]`, zero in the
/// padding. Channels are innermost in both, so the 8 columns of a 16-byte chunk (`c_in` a
/// multiple of 8) are 16 contiguous bytes of one pixel: the tile moves as the GEMM's
/// chunks do (`cp.async` on NVIDIA), consecutive work-items on consecutive chunks of a
/// pixel, with padding and rows past the end predicated to zero.
///
/// Each work-item keeps one column `c0` of the tile for the whole K loop, so one window
/// position `(tap, ci)` per step serves all of its chunks; per chunk it keeps the pixel's
/// window origin as an element offset (wrapping below zero) and a mask of the taps that
/// fall inside the image (at most 32 taps).
#[derive(Clone, Copy)]
pub(crate) struct PatchA<T> {
    x: *const T,
    off: [u32; NHWC_CHUNKS],
    mask: [u32; NHWC_CHUNKS],
    dst0: usize,
    dst_step: usize,
    count: usize,
    c0: usize,
    /// K per step.
    bk: u32,
    /// Column `c0`'s window position at the next step: channel, tap bit, filter x,
    /// element offset from the window origin.
    ci: u32,
    bit: u32,
    kx: u32,
    ky: u32,
    tap_off: u32,
    /// `c_in`, `w * c_in`, `dil`, `k_w`.
    cin: u32,
    row: u32,
    dil: u32,
    kw: u32,
}

impl<T: GemmElem> PatchA<T> {
    /// The source of the tile of rows from `m0`, K from `k_begin`, in the GEMM pipeline's
    /// tile ([`block_tile`], [`tile_offset`]). `g` is the kernel's checked geometry.
    #[inline(always)]
    fn new(x: &[T], g: &[u32], m0: usize, k_begin: usize) -> Self {
        let low = mma::lowering();
        let (bm, _, bk) = block_tile::<T>(low);
        let (lda, _) = tile_lds::<T>(low);
        let size = core::mem::size_of::<T>();
        let per = 16 / size;
        let (tid, threads) = (flat_thread_idx() as usize, block_threads());
        let per_row = bk / per;
        let (r0, c0, rstep) = (tid / per_row, (tid % per_row) * per, threads / per_row);
        let count = bm * per_row / threads;
        let swz = swizzled::<T>(low);
        if count > NHWC_CHUNKS || count * threads != bm * per_row || (swz && rstep % 8 != 0) {
            panic!("conv2d_nhwc: the A tile does not split into the gather's chunks");
        }
        let layout = PatchLayout { r0, c0, rstep, count, bk, dst0: tile_offset::<T>(swz, r0, c0, lda), dst_step: rstep * lda * size };
        Self::with_layout(x, g, m0, k_begin, layout)
    }

    /// The source of a tile of rows from `m0`, K from `k_begin`, in the shared layout
    /// `layout` (this work-item's chunks).
    #[inline(always)]
    fn with_layout(x: &[T], g: &[u32], m0: usize, k_begin: usize, layout: PatchLayout) -> Self {
        let PatchLayout { r0, c0, rstep, count, bk, dst0, dst_step } = layout;
        let (batch, h, wd, cin, oh, ow, kh, kw, st, pad, dil, xoff) = (g[0], g[1], g[2], g[3], g[4], g[5], g[7], g[8], g[9], g[10], g[11], g[12]);
        let _ = kh;
        let m = (batch * oh * ow) as usize;
        let mut off = [0u32; NHWC_CHUNKS];
        let mut mask = [0u32; NHWC_CHUNKS];
        each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            let p = m0 + r0 + i * rstep;
            if i < count && p < m {
                let (b, rem) = divmod32(p as u32, oh * ow);
                let (oy, ox) = divmod32(rem, ow);
                let (iy0, ix0) = ((oy * st).wrapping_sub(pad), (ox * st).wrapping_sub(pad));
                off[i] = xoff.wrapping_add(((b * h).wrapping_add(iy0).wrapping_mul(wd).wrapping_add(ix0)).wrapping_mul(cin));
                let mut bits = 0u32;
                let mut t = 0;
                let mut ky = 0;
                while ky < kh {
                    let mut kx = 0;
                    while kx < kw {
                        if iy0.wrapping_add(ky * dil) < h && ix0.wrapping_add(kx * dil) < wd {
                            bits |= 1 << t;
                        }
                        t += 1;
                        kx += 1;
                    }
                    ky += 1;
                }
                mask[i] = bits;
            }
        });
        let (tap, ci) = divmod32((k_begin + c0) as u32, cin);
        let (ky, kx) = divmod32(tap, kw);
        let row = wd * cin;
        PatchA {
            x: x.as_ptr(),
            off,
            mask,
            dst0,
            dst_step,
            count,
            c0,
            bk: bk as u32,
            ci,
            // Zero past tap 31 (none there: the kernel checked at most 32 taps).
            bit: if tap < 32 { 1 << tap } else { 0 },
            kx,
            ky,
            tap_off: (ky * dil * row).wrapping_add(kx * dil * cin).wrapping_add(ci),
            cin,
            row,
            dil,
            kw,
        }
    }

    /// Copies this work-item's chunks of the step (`col_ok`: its column lies in K), then
    /// moves the window position on by one K step.
    #[inline(always)]
    fn gather(&mut self, col_ok: bool, buf: SharedAddr) {
        let to = buf.add(self.dst0);
        each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            if i < self.count {
                let dst = to.add(i * self.dst_step);
                if col_ok && self.mask[i] & self.bit != 0 {
                    let src = self.x.wrapping_add(self.off[i].wrapping_add(self.tap_off) as usize);
                    // SAFETY: the tap lies in the image (mask) and the channels in the
                    // pixel (col_ok, c_in a multiple of 8), so the 16 bytes are an
                    // element run of the input (checked in the kernel), 16-byte aligned.
                    unsafe { mma::copy::copy_16_whole_at(dst, src as *const u8) };
                } else {
                    // SAFETY: the chunk lies in the tile (a zero chunk: padding, rows past
                    // the end, columns past K); an asynchronous copy of no bytes reads
                    // nothing and zero-fills.
                    unsafe {
                        if mma::copy::is_async() {
                            mma::copy::copy_16_at(dst, self.x as *const u8, 0);
                        } else {
                            core::ptr::write(dst.as_ptr::<[u32; 4]>(), [0; 4]);
                        }
                    }
                }
            }
        });
        let bk = self.bk;
        self.ci += bk;
        let mut moved = false;
        while self.ci >= self.cin {
            self.ci -= self.cin;
            self.bit <<= 1;
            self.kx += 1;
            if self.kx == self.kw {
                self.kx = 0;
                self.ky += 1;
            }
            moved = true;
        }
        if moved {
            self.tap_off = (self.ky * self.dil * self.row).wrapping_add(self.kx * self.dil * self.cin).wrapping_add(self.ci);
        } else {
            self.tap_off += bk;
        }
    }
}

impl<T: GemmElem> ATile<T> for PatchA<T> {
    #[inline(always)]
    fn load(&mut self, _k0: usize, k_left: usize, buf: SharedAddr, _elems: *mut T) {
        self.gather(self.c0 < k_left, buf);
    }

    #[inline(always)]
    fn whole(&self) -> bool {
        true
    }

    #[inline(always)]
    unsafe fn load_whole(&mut self, buf: SharedAddr) {
        self.gather(true, buf);
    }
}

/// `y (batch, oh, ow, c_out) = conv2d(x, w) + bias` for channels-last (NHWC) activations:
/// [`gemm_tiled`](fn@crate::gemm::gemm_tiled)'s pipeline, products and epilogue with the A
/// tile gathered from the input (`PatchA`). The GEMM is `Y (batch*oh*ow x c_out) =
/// X_patches (batch*oh*ow x K) * W (K x c_out)`, `K = k_h*k_w*c_in` in (tap, channel)
/// order, so `w` is the filter as `(k_h, k_w, c_in, c_out)` contiguous
/// ([`host::FilterLayout::Hwio`]); `x` is `(batch, h, w, c_in)` contiguous from element
/// `x_off`, 16-byte aligned, `c_in` a multiple of 8; `bias` (empty: none) per output
/// channel. `geom` = `[batch, h, w, c_in, oh, ow, c_out, k_h, k_w, stride, pad, dilation,
/// x_off, splits, stages, tile_n]` (`stages`, `tile_n`: [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma)'s
/// ring and tile width; not read here). Grid: x the tiles of `c_out` (BN), y the tiles of `batch*oh*ow` (BM),
/// z `splits` (split K as `gemm_tiled`: f32 partial tiles into `ws`, summed by
/// [`gemm_split_sum`](fn@crate::gemm::gemm_split_sum)). Launch with [`host::conv2d_channels_last`].
#[amdgpu_kernel(T = [f16, bf16], max_threads = 256)]
#[inline(always)]
pub fn conv2d_nhwc<T: GemmElem>(x: &[T], w: &[T], bias: &[T], y: &mut [T], ws: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    let low = mma::lowering();
    let g = &geom[..NHWC_GEOM];
    let (batch, h, wd, cin, oh, ow, cout, kh, kw) = (g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]);
    let (xoff, splits) = (g[12], g[13]);
    // No matrix unit (gfx10, NVIDIA before sm_80): not taken (`nhwc_refusal`); its gather
    // state on top of the emulated products spilled on gfx1030's 128 registers.
    if low == Lowering::Valu {
        panic!("conv2d_nhwc: this target has no matrix unit");
    }
    let splits = splits.max(1) as usize;
    let taps = kh * kw;
    let per = (16 / core::mem::size_of::<T>()) as u32;
    let x_end = xoff as usize + (batch * h * wd * cin) as usize;
    if taps == 0 || taps > 32 || cin == 0 || cin % per != 0 || x_end > x.len() || (x.as_ptr() as usize + xoff as usize * core::mem::size_of::<T>()) % 16 != 0 {
        panic!("conv2d_nhwc: the geometry does not fit the input, or it is not aligned");
    }
    let (m, k) = (batch * oh * ow, taps * cin);
    let a_of = |_z: usize, m0: usize, k_begin: usize| PatchA::new(x, g, m0, k_begin);
    tiled_body::<T, _>(a_of, w, bias, y, ws, (m, cout, k), (cout, 1, cout), (0, 0), (1.0, 0), splits, smem);
}

/// Warpgroups per work-group of [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma), each 64 rows
/// (output pixels) x the tile's output channels.
pub const CW_GROUPS: usize = 2;
/// Work-items per work-group of [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma).
pub const CW_THREADS: usize = CW_GROUPS * 128;
/// Output pixels per work-group of [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma).
pub const CW_BM: usize = 64 * CW_GROUPS;
/// Output channels per work-group [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma) is built for:
/// 128 (`m64n128k16`) or 160 (`m64n160k16`: SD's 320-channel layers in whole tiles, where
/// 128 leaves a partial one, and fewer rounds of tiles on some 640- and 1280-channel ones).
pub const CW_BN_CHOICES: [usize; 2] = [128, 160];
/// K per stage (one 128-byte swizzled row of 16-bit items).
pub const CW_BK: usize = 64;
/// Stages of the ring the launcher picks by default; the kernel takes 3, 4 or 6
/// ([`CW_STAGE_CHOICES`]): copies run `stages - 1` K steps ahead. Three stages let two
/// 128-wide work-groups share a multiprocessor, which beat the deeper rings of one
/// work-group on the SD layers (`benches/results/h200-2026-11-28`).
pub const CW_STAGES: usize = 3;
/// Ring sizes [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma) is built for.
pub const CW_STAGE_CHOICES: [usize; 3] = [3, 4, 6];
const CW_A_BYTES: usize = CW_BM * CW_BK * 2;

/// Bytes of one stage (A tile, then the `bn`-row B tile) of a ring of `bn`-wide tiles.
const fn cw_stage_bytes(bn: usize) -> usize {
    CW_A_BYTES + bn * CW_BK * 2
}

/// Shared-memory elements (16-bit) [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma) needs with a
/// ring of `stages` and tiles `bn` channels wide: the larger of the ring and the
/// epilogue's f32 tile, plus 1024 bytes to align the swizzle.
pub const fn conv_wgmma_smem_elems(stages: usize, bn: usize) -> usize {
    let ring = stages * cw_stage_bytes(bn);
    let tile = CW_BM * (bn + EPAD) * 4;
    (if ring > tile { ring } else { tile } + 1024) / 2
}

/// [`conv2d_nhwc`](fn@conv2d_nhwc) on the warpgroup matrix units of NVIDIA sm_90a
/// (`kernel_dsl::mma::wgmma`; only the crate's `sm_90a` PTX variant has it, the CPU
/// executor emulates it in its `mma.sync` mode, elsewhere the kernel returns at once and
/// [`host::conv2d_channels_last`] never picks it). Same arguments and `geom` (`c_out` a
/// multiple of 8 as well). A work-group of [`CW_GROUPS`] warpgroups computes [`CW_BM`]
/// output pixels x `geom[15]` = 128 output channels (160 in
/// [`conv2d_nhwc_wgmma_n160`](fn@conv2d_nhwc_wgmma_n160), which takes the filter K-major:
/// [`host::FilterLayout::Ohwi`]): K steps of 64 flow through a ring of 128-byte swizzled
/// stages filled by `cp.async`, the A rows gathered from the input as `conv2d_nhwc`
/// gathers them (zero in the padding, past the last pixel and past K), the B tile zero
/// past K and past `c_out`; one `m64n128k16` (`m64n160k16`) per 16-deep slice. `geom[14]` is the ring's stage
/// count (3, 4 or 6; the copies run that many steps ahead, less one). Grid: x the tiles
/// of `c_out`, y the tiles of pixels, z `splits` (split K: f32 partial tiles into `ws`,
/// summed by [`gemm_split_sum`](fn@crate::gemm::gemm_split_sum)).
#[amdgpu_kernel(T = [f16, bf16], max_threads = 256)]
#[inline(always)]
pub fn conv2d_nhwc_wgmma<T: GemmElem>(x: &[T], w: &[T], bias: &[T], y: &mut [T], ws: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    wgmma_conv_rings::<T, 128>(x, w, bias, y, ws, geom, smem);
}

/// [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma) for tiles 160 channels wide (`geom[15]` =
/// 160), reading the filter as `(c_out, k_h, k_w, c_in)` (K-major: a 160-wide tile is no
/// whole number of the 64-column swizzle atoms an MN-major B needs). Its own entry, so
/// that its 80 accumulators do not raise the 128-wide kernel's register count.
#[amdgpu_kernel(T = [f16, bf16], max_threads = 256)]
#[inline(always)]
pub fn conv2d_nhwc_wgmma_n160<T: GemmElem>(x: &[T], w: &[T], bias: &[T], y: &mut [T], ws: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    wgmma_conv_rings::<T, 160>(x, w, bias, y, ws, geom, smem);
}

/// The wgmma convolution of `BN`-wide tiles with the ring `geom[14]` names (nothing where
/// the target has no `wgmma`).
#[inline(always)]
fn wgmma_conv_rings<T: GemmElem, const BN: usize>(x: &[T], w: &[T], bias: &[T], y: &mut [T], ws: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    if !mma::wgmma::available() {
        return;
    }
    match (geom[NHWC_GEOM - 2], geom[NHWC_GEOM - 1] == BN as u32) {
        (3, true) => wgmma_conv_body::<T, 3, BN>(x, w, bias, y, ws, geom, smem),
        (4, true) => wgmma_conv_body::<T, 4, BN>(x, w, bias, y, ws, geom, smem),
        (6, true) => wgmma_conv_body::<T, 6, BN>(x, w, bias, y, ws, geom, smem),
        _ => panic!("conv2d_nhwc_wgmma: the ring has 3, 4 or 6 stages of this entry's tile width"),
    }
}

/// The body of [`conv2d_nhwc_wgmma`](fn@conv2d_nhwc_wgmma) with a ring of `S` stages and
/// tiles `BN` output channels wide.
#[inline(always)]
fn wgmma_conv_body<T: GemmElem, const S: usize, const BN: usize>(x: &[T], w: &[T], bias: &[T], y: &mut [T], ws: &mut [f32], geom: &[u32], smem: SharedDyn<T>) {
    use mma::wgmma::{self, descriptor, sw128_offset};
    let g = &geom[..NHWC_GEOM];
    let (batch, h, wd, cin, oh, ow, cout, kh, kw) = (g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]);
    let (xoff, splits) = (g[12], g[13].max(1) as usize);
    let taps = kh * kw;
    let x_end = xoff as usize + (batch * h * wd * cin) as usize;
    let (m, k, n) = ((batch * oh * ow) as usize, (taps * cin) as usize, cout as usize);
    let stage_bytes = cw_stage_bytes(BN);
    if taps == 0
        || taps > 32
        || cin % 8 != 0
        || n % 8 != 0
        || m == 0
        || x_end > x.len()
        || (x.as_ptr() as usize + xoff as usize * core::mem::size_of::<T>()) % 16 != 0
        || (w.as_ptr() as usize) % 16 != 0
        || w.len() < k * n
        || y.len() < m * n
        || !(bias.is_empty() || bias.len() >= n)
        || (splits > 1 && ws.len() < splits * m * n)
        || block_dim_x() as usize != CW_THREADS
        || smem.len() < conv_wgmma_smem_elems(S, BN)
    {
        panic!("conv2d_nhwc_wgmma: the geometry, buffers or shared memory do not fit");
    }
    let tid = flat_thread_idx() as usize;
    let wg = tid / wgmma::WARPGROUP;
    let (n0, m0, zs) = (block_idx_x() as usize * BN, block_idx_y() as usize * CW_BM, block_idx_z() as usize);
    // This split's K steps.
    let steps_all = k.div_ceil(CW_BK);
    let per_split = steps_all.div_ceil(splits);
    let first = (zs * per_split).min(steps_all);
    let last = (first + per_split).min(steps_all);
    let ring = SharedAddr::new(smem.as_ptr()).align_up(1024);
    // A: rows tid / 8 + i * 32 (a multiple of 8 apart: one swizzle), chunk tid % 8.
    let rows_apart = CW_THREADS / 8;
    let layout = PatchLayout { r0: tid / 8, c0: (tid % 8) * 8, rstep: rows_apart, count: CW_BM / rows_apart, bk: CW_BK, dst0: sw128_offset(tid / 8, tid % 8), dst_step: rows_apart * 128 };
    let mut patch = PatchA::with_layout(x, g, m0, first * CW_BK, layout);
    // B, 160-wide tiles (c_out x K, K-major, as A): channel rows n0 + tid / 8 + j * 32,
    // chunk tid % 8 (K columns 8 (tid % 8) ..): eight work-items read one row's 128
    // contiguous bytes. 128-wide tiles (K x c_out, MN-major): k rows tid / 16 + j * 16,
    // columns n0 + 8 (tid % 16) ..: the 64-column group (tid % 16) / 8 of the stage (8192
    // bytes apart), chunk tid % 8.
    let k_major = BN == 160;
    let (b_row0, b_rows_apart) = if k_major { (tid / 8, rows_apart) } else { (tid / 16, CW_THREADS / 16) };
    let b_col = if k_major { (tid % 8) * 8 } else { n0 + (tid % 16) * 8 };
    let b_dst = if k_major { CW_A_BYTES } else { CW_A_BYTES + (tid % 16) / 8 * 8192 };
    let b_chunks = BN * CW_BK / 8 / CW_THREADS;
    let mut load = |step: usize, stage: usize| {
        if step < last {
            let buf = ring.add(stage * stage_bytes);
            let k0 = step * CW_BK;
            patch.gather(layout.c0 + k0 < k, buf);
            each!(j in [0, 1, 2, 3, 4] {
                if j < b_chunks {
                    let row = b_row0 + j * b_rows_apart;
                    let dst = buf.add(b_dst + sw128_offset(row, tid % 8));
                    // Channel n0 + row, K columns k0 + b_col ..; or K row k0 + row,
                    // channels b_col ...
                    let (ok, at) = if k_major { (k0 + b_col < k && n0 + row < n, (n0 + row) * k + k0 + b_col) } else { (k0 + row < k && b_col < n, (k0 + row) * n + b_col) };
                    // SAFETY: a chunk inside K and c_out (both multiples of 8) lies in `w`
                    // (checked above), 16-byte aligned (`w` aligned, rows of a multiple of
                    // 8 elements); any other is zero-filled from no bytes.
                    unsafe {
                        if ok {
                            mma::copy::copy_16_whole_at(dst, w.as_ptr().add(at) as *const u8);
                        } else {
                            mma::copy::copy_16_at(dst, w.as_ptr() as *const u8, 0);
                        }
                    }
                }
            });
        }
        mma::copy::commit();
    };
    // Accumulators of the widest tile; a 128-wide one uses the first 64 (`acc_coord`'s
    // first 128 columns).
    // SAFETY: all-zero bits are 0.0.
    let mut acc: [f32; wgmma::ACC_N160] = unsafe { core::mem::zeroed() };
    // Copies run S - 1 steps ahead: the stage refilled at step `step` is that of step - 1,
    // free once every warpgroup has waited for its products (the second barrier).
    let mut pre = 0;
    while pre + 1 < S {
        load(first + pre, pre);
        pre += 1;
    }
    let mut stage = 0;
    for step in first..last {
        // Step `step`'s copies are done once at most S - 2 younger groups are pending;
        // the fence hands them to the tensor units, the barrier to the other warpgroups.
        mma::copy::wait_groups(S as u32 - 2);
        wgmma::fence_proxy_async();
        barrier();
        let buf = ring.add(stage * stage_bytes);
        let da = descriptor(buf.add(wg * 64 * 128), 16, 1024);
        let db = if k_major { descriptor(buf.add(CW_A_BYTES), 16, 1024) } else { descriptor(buf.add(CW_A_BYTES), 8192, 1024) };
        wgmma::fence();
        each!(s in [0, 1, 2, 3] {
            // SAFETY: sm_90a or its emulation (checked above); the stage is complete
            // (waited, fenced, barrier) and not rewritten until every warpgroup has waited
            // for these products (its refill comes after the second barrier of the next
            // step). Slice s: 32 bytes on along A's rows (and a K-major B's); 16 rows (2
            // atoms) down an MN-major B.
            unsafe {
                if k_major {
                    wgmma::mma_m64n160k16::<T::Frag, false>(&mut acc, da + (s * 2) as u64, db + (s * 2) as u64);
                } else if let Some(acc) = acc.first_chunk_mut::<{ wgmma::ACC_N128 }>() {
                    wgmma::mma_m64n128k16::<T::Frag, true>(acc, da + (s * 2) as u64, db + (s * 128) as u64);
                }
            }
        });
        wgmma::commit();
        // This warpgroup's products of step - 1 are done; after the barrier, everyone's.
        wgmma::wait::<1>();
        barrier();
        load(step + S - 1, (stage + S - 1) % S);
        stage = (stage + 1) % S;
    }
    wgmma::wait::<0>();
    mma::copy::wait_groups(0);
    barrier();
    // Epilogue through shared memory: the accumulators as an f32 tile, then whole rows.
    let ldt = BN + EPAD;
    let tile = ring.as_ptr::<f32>();
    // SAFETY: this warpgroup's 64 rows of the CW_BM x (BN + EPAD) f32 tile
    // (conv_wgmma_smem_elems); ldt even, the ring 1024-byte aligned.
    unsafe { wgmma::stage_accumulators(&acc, BN, tile, ldt, (wg, tid % wgmma::WARPGROUP)) };
    barrier();
    let (rows, cols) = (m.saturating_sub(m0).min(CW_BM), n.saturating_sub(n0).min(BN));
    if splits == 1 {
        // SAFETY: the tile holds this work-group's results; its valid rows and columns
        // are elements of `y` (checked above), `bias` empty or covering c_out.
        unsafe { staged_epilogue::<T>(CW_THREADS, tile, ldt, (rows, cols), (CW_BM, BN), y.as_mut_ptr().add(m0 * n + n0), n, bias, n0, 1.0, 0) };
    } else {
        // This split's raw sums into its dense m x c_out slice of `ws`.
        let mut idx = tid;
        while idx < CW_BM * BN {
            let (r, c) = (idx / BN, idx % BN);
            if r < rows && c < cols {
                // SAFETY: (r, c) lies in the tile; the slice was checked above.
                unsafe { *ws.as_mut_ptr().add(zs * m * n + (m0 + r) * n + n0 + c) = *tile.add(r * ldt + c) };
            }
            idx += CW_THREADS;
        }
    }
}

/// Checked launches.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host {
    use super::{conv2d_implicit, conv2d_nhwc, conv2d_nhwc_wgmma, conv2d_nhwc_wgmma_n160, conv2d_split_sum, conv_smem_elems, conv_wgmma_smem_elems, CONV_GEOM, CW_BK, CW_BM, CW_BN_CHOICES, CW_STAGES, CW_STAGE_CHOICES, CW_THREADS, NHWC_GEOM};
    use crate::conv::ops::{conv_out_len, ConvGeometry};
    use crate::dtype::host::{arg_len, fits_i32, invalid, product};
    use crate::gemm::{block_tile, gemm_split_sum, lowering_of, smem_elems, splits_for, work_group_size, GemmElem, GemmShape};
    use kernel_dsl::host::ArgValue;
    use kernel_dsl::mma::Lowering;
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError, ScalarArg};
    use kernel_dsl::Dim3;

    const K: &str = "conv2d_implicit";

    const KN: &str = "conv2d_nhwc";

    const KW: &str = "conv2d_nhwc_wgmma";

    /// Checks that an argument of `kernel` (`what` in the error) holds exactly the
    /// elements of a contiguous tensor of shape `dims`; returns that count. One message
    /// form for every entry and layout: `"<what> has <have> elements; shape (<dims>)
    /// needs <n>"`.
    fn check_len(kernel: &'static str, what: &str, have: usize, dims: &[usize]) -> Result<usize, LaunchError> {
        let n = product(kernel, dims)?;
        if have != n {
            return Err(invalid(kernel, format!("{what} has {have} elements; shape ({}) needs {n}", shape_text(dims))));
        }
        Ok(n)
    }

    /// Checks that the input view of shape `dims` (in the entry's layout), element `i` at
    /// `offset + sum(i_j * strides[j])`, lies in a buffer of `have` elements; returns one
    /// past the last element it reads (`offset` for an empty view, which reads nothing).
    fn check_input(kernel: &'static str, dims: [usize; 4], strides: [usize; 4], offset: usize, have: usize) -> Result<usize, LaunchError> {
        let n = product(kernel, &dims)?;
        let end = if n == 0 {
            offset
        } else {
            dims.iter()
                .zip(strides)
                .try_fold(offset, |a, (&d, st)| (d - 1).checked_mul(st).and_then(|o| a.checked_add(o)))
                .and_then(|last| last.checked_add(1))
                .ok_or_else(|| invalid(kernel, "input offsets overflow usize".into()))?
        };
        if end > have {
            return Err(invalid(kernel, format!("input view ({}) from element {offset} needs {end} elements; the buffer has {have}", shape_text(&dims))));
        }
        Ok(end)
    }

    /// `dims` as `a, b, c` for the messages above.
    fn shape_text(dims: &[usize]) -> String {
        dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// The filter layouts the channels-last kernels take (PyTorch and Candle hand
    /// `(c_out, c_in, k_h, k_w)`); on the wgmma kernel the layout names the tile width.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum FilterLayout {
        /// `(k_h, k_w, c_in, c_out)`: the GEMM's B as K x `c_out` rows
        /// ([`NhwcKernel::Tiled`], and the wgmma kernel's 128-channel tiles).
        Hwio,
        /// `(c_out, k_h, k_w, c_in)`: one K-long row per output channel, the wgmma
        /// kernel's 160-channel tiles (`conv2d_nhwc_wgmma_n160`); from PyTorch's layout a
        /// per-channel transpose of `(c_in, k_h k_w)`, none at all for 1x1 filters.
        Ohwi,
    }

    impl FilterLayout {
        /// Output channels per wgmma work-group with a filter in this layout.
        const fn wgmma_width(self) -> usize {
            match self {
                FilterLayout::Hwio => 128,
                FilterLayout::Ohwi => 160,
            }
        }

        /// The layout wgmma tiles `bn` channels wide read.
        const fn of_wgmma_width(bn: usize) -> FilterLayout {
            if bn == FilterLayout::Ohwi.wgmma_width() {
                FilterLayout::Ohwi
            } else {
                FilterLayout::Hwio
            }
        }
    }

    /// The filter `(c_out, c_in, k_h, k_w)` (PyTorch's and Candle's layout) rearranged as
    /// `layout`: done once per weight, at load.
    pub fn nhwc_weight<T: Copy>(w: &[T], [c_out, c_in, k_h, k_w]: [usize; 4], layout: FilterLayout) -> Result<Vec<T>, LaunchError> {
        let n = check_len(KN, "weight", w.len(), &[c_out, c_in, k_h, k_w])?;
        let at = |co: usize, ci: usize, ky: usize, kx: usize| w[((co * c_in + ci) * k_h + ky) * k_w + kx];
        let mut out = Vec::with_capacity(n);
        match layout {
            FilterLayout::Hwio => {
                for ky in 0..k_h {
                    for kx in 0..k_w {
                        for ci in 0..c_in {
                            out.extend((0..c_out).map(|co| at(co, ci, ky, kx)));
                        }
                    }
                }
            }
            FilterLayout::Ohwi => {
                for co in 0..c_out {
                    for ky in 0..k_h {
                        for kx in 0..k_w {
                            out.extend((0..c_in).map(|ci| at(co, ci, ky, kx)));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The filter layout [`conv2d_channels_last_with`] should get for this convolution and
    /// `kernel` on `dev`: [`FilterLayout::Ohwi`] where the wgmma kernel runs it on
    /// 160-channel tiles (the launcher's plan, or `tile_n` 160), else
    /// [`FilterLayout::Hwio`].
    pub fn nhwc_filter_layout<T: GemmElem>(dev: &Device, s: &Conv2dShape, g: ConvGeometry, kernel: NhwcKernel) -> FilterLayout {
        if kernel == NhwcKernel::Tiled || wgmma_refusal::<T>(dev, s).is_some() {
            return FilterLayout::Hwio;
        }
        let width = match kernel {
            NhwcKernel::WgmmaWith { tile_n: Some(bn), .. } => bn,
            _ => match s.out_hw(g) {
                Ok((oh, ow)) => wgmma_plan(dev, s.batch * oh * ow, s.c_out, (s.k_h * s.k_w * s.c_in).div_ceil(CW_BK), None, None).0,
                Err(_) => FilterLayout::Hwio.wgmma_width(),
            },
        };
        FilterLayout::of_wgmma_width(width)
    }

    /// Why [`conv2d_channels_last`] cannot take this convolution on `dev` (no matrix unit,
    /// element type, groups, channels, taps), or `None` when it can (sizes and buffers are
    /// checked at the launch).
    pub fn nhwc_refusal<T: GemmElem>(dev: &Device, s: &Conv2dShape) -> Option<String> {
        if lowering_of(dev) == Lowering::Valu {
            return Some("the NHWC kernel needs a matrix unit (MFMA, WMMA or mma.sync)".into());
        }
        if T::SPLIT {
            return Some("the NHWC kernel takes f16 and bf16 only".into());
        }
        if s.groups != 1 {
            return Some(format!("the NHWC kernel takes dense convolutions only ({} groups)", s.groups));
        }
        if s.c_in == 0 || s.c_in % 8 != 0 {
            return Some(format!("the NHWC kernel needs input channels in multiples of 8 ({})", s.c_in));
        }
        if s.k_h * s.k_w == 0 || s.k_h * s.k_w > 32 {
            return Some(format!("the NHWC kernel takes 1 to 32 filter taps ({} x {})", s.k_h, s.k_w));
        }
        None
    }

    /// `y = conv2d(x, weight) + bias` for channels-last activations on the matrix units of
    /// `dev`: the GEMM pipeline with the input patches gathered straight from `x`
    /// ([`conv2d_nhwc_wgmma`](fn@super::conv2d_nhwc_wgmma) on NVIDIA sm_90,
    /// [`conv2d_nhwc`](fn@super::conv2d_nhwc) elsewhere). `x` is `(batch, h, w, c_in)`
    /// contiguous from element `offset` of its buffer (16-byte aligned there), `weight`
    /// the filter in `layout` ([`nhwc_filter_layout`] with [`NhwcKernel::Auto`] says which;
    /// [`nhwc_weight`] arranges it), `bias` `c_out` elements, `y` `(batch, oh, ow, c_out)`
    /// contiguous. A device with a matrix unit, f16/bf16, `groups` 1, `c_in` a multiple of
    /// 8, at most 32 taps ([`nhwc_refusal`]). Returns `(oh, ow)`. Checks everything first: a
    /// bad size is `InvalidArgument` and nothing runs. Small grids split K.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_channels_last<T: GemmElem + ScalarArg>(
        dev: &Device,
        x: &(impl KernelArgSlice<T> + ?Sized),
        offset: usize,
        weight: &(impl KernelArgSlice<T> + ?Sized),
        layout: FilterLayout,
        bias: Option<&(dyn KernelArgSlice<T> + '_)>,
        s: Conv2dShape,
        g: ConvGeometry,
        y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        conv2d_channels_last_with(dev, x, offset, weight, layout, bias, s, g, y, None, NhwcKernel::Auto)
    }

    /// Which kernel runs a channels-last convolution.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum NhwcKernel {
        /// [`NhwcKernel::Wgmma`] where it can take the convolution ([`wgmma_refusal`]), else
        /// [`NhwcKernel::Tiled`].
        #[default]
        Auto,
        /// [`conv2d_nhwc`](fn@super::conv2d_nhwc): the GEMM pipeline of every matrix unit
        /// ([`FilterLayout::Hwio`]).
        Tiled,
        /// [`conv2d_nhwc_wgmma`](fn@super::conv2d_nhwc_wgmma): NVIDIA sm_90a's warpgroup
        /// matrix units (an error where it cannot run), with a ring of [`CW_STAGES`] and
        /// tiles as wide as the filter's layout says.
        Wgmma,
        /// [`NhwcKernel::Wgmma`] with a ring of `stages` (one of [`CW_STAGE_CHOICES`]) and,
        /// when given, tiles `tile_n` channels wide (one of [`CW_BN_CHOICES`]): benchmarks
        /// and tests.
        WgmmaWith {
            /// Stages of the ring.
            stages: usize,
            /// Output channels per work-group (`None`: the launcher's choice).
            tile_n: Option<usize>,
        },
    }

    /// Why [`conv2d_nhwc_wgmma`](fn@super::conv2d_nhwc_wgmma) cannot take this convolution
    /// on `dev` (beyond [`nhwc_refusal`]), or `None` when it can.
    pub fn wgmma_refusal<T: GemmElem>(dev: &Device, s: &Conv2dShape) -> Option<String> {
        if !crate::gemm::wgmma_runs(dev, "conv2d_nhwc_wgmma_f16") {
            return Some("wgmma needs an NVIDIA sm_90 device and the sm_90a PTX variant (or the CPU executor's mma.sync mode)".into());
        }
        if T::SPLIT {
            return Some("wgmma takes 16-bit inputs only".into());
        }
        if s.c_out % 8 != 0 {
            return Some(format!("the wgmma kernel needs output channels in multiples of 8 ({})", s.c_out));
        }
        None
    }

    /// [`conv2d_channels_last`] on the kernel `kernel` names, with the number of K splits
    /// given (`None`: the launcher's choice; clamped to 1 ..= the K steps). The filter's
    /// `layout` must be the kernel's ([`nhwc_filter_layout`]).
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_channels_last_with<T: GemmElem + ScalarArg>(
        dev: &Device,
        x: &(impl KernelArgSlice<T> + ?Sized),
        offset: usize,
        weight: &(impl KernelArgSlice<T> + ?Sized),
        layout: FilterLayout,
        bias: Option<&(dyn KernelArgSlice<T> + '_)>,
        s: Conv2dShape,
        g: ConvGeometry,
        y: &mut (impl KernelArgSliceMut<T> + ?Sized),
        splits: Option<usize>,
        kernel: NhwcKernel,
    ) -> Result<(usize, usize), LaunchError> {
        if let Some(why) = nhwc_refusal::<T>(dev, &s) {
            return Err(invalid(KN, why));
        }
        let addr_of = |v: ArgValue| match v {
            ArgValue::Slice { addr, .. } => addr as usize,
            _ => 0,
        };
        let (stages, tile_n) = match kernel {
            NhwcKernel::WgmmaWith { stages, tile_n } => (stages, tile_n),
            _ => (CW_STAGES, None),
        };
        if !CW_STAGE_CHOICES.contains(&stages) {
            return Err(invalid(KW, format!("the ring has {CW_STAGE_CHOICES:?} stages, not {stages}")));
        }
        if let Some(bn) = tile_n.filter(|bn| !CW_BN_CHOICES.contains(bn)) {
            return Err(invalid(KW, format!("tiles are {CW_BN_CHOICES:?} channels wide, not {bn}")));
        }
        let wgmma = match kernel {
            NhwcKernel::Tiled if layout == FilterLayout::Ohwi => {
                return Err(invalid(KN, "the tiled kernel takes the filter as (k_h, k_w, c_in, c_out) (FilterLayout::Hwio)".into()));
            }
            NhwcKernel::Tiled => false,
            NhwcKernel::Auto if layout == FilterLayout::Hwio => wgmma_refusal::<T>(dev, &s).is_none() && addr_of(weight.kernel_arg()) % 16 == 0,
            _ => {
                if let Some(why) = wgmma_refusal::<T>(dev, &s) {
                    return Err(invalid(KW, why));
                }
                if addr_of(weight.kernel_arg()) % 16 != 0 {
                    return Err(invalid(KW, "the weight is not 16-byte aligned".into()));
                }
                if let Some(bn) = tile_n.filter(|&bn| bn != layout.wgmma_width()) {
                    return Err(invalid(KW, format!("{bn}-channel tiles take the filter as {:?}, not {layout:?}", FilterLayout::of_wgmma_width(bn))));
                }
                true
            }
        };
        let Conv2dShape { batch, c_in, h, w, c_out, k_h, k_w, .. } = s;
        let (oh, ow) = s.out_hw(g)?;
        let w_dims = match layout {
            FilterLayout::Hwio => [k_h, k_w, c_in, c_out],
            FilterLayout::Ohwi => [c_out, k_h, k_w, c_in],
        };
        let n_w = check_len(KN, "weight", arg_len(weight), &w_dims)?;
        let n_y = check_len(KN, "output", arg_len(y), &[batch, oh, ow, c_out])?;
        if let Some(b) = bias {
            check_len(KN, "bias", arg_len(b), &[c_out])?;
        }
        // Contiguous (batch, h, w, c_in): the strides are below the element count, which
        // `check_input`'s product bounds first (only an empty view could overflow them, and
        // it never reads them).
        let strides = [h.wrapping_mul(w).wrapping_mul(c_in), w.wrapping_mul(c_in), c_in, 1];
        let x_end = check_input(KN, [batch, h, w, c_in], strides, offset, arg_len(x))?;
        if (addr_of(x.kernel_arg()) + offset * core::mem::size_of::<T>()) % 16 != 0 {
            return Err(invalid(KN, format!("the input at element {offset} is not 16-byte aligned")));
        }
        let pad_span = g.padding.saturating_mul(2).saturating_add(h.max(w));
        fits_i32(KN, &[n_y, n_w, x_end, pad_span, oh.saturating_mul(g.stride).saturating_add(k_h.max(k_w).saturating_mul(g.dilation))])?;
        if n_y == 0 {
            return Ok((oh, ow));
        }
        let low = lowering_of(dev);
        let (m, k) = (batch * oh * ow, k_h * k_w * c_in);
        let (bn, gx, gy, steps, splits) = if wgmma {
            let steps = k.div_ceil(CW_BK);
            let (bn, splits) = wgmma_plan(dev, m, c_out, steps, Some(layout.wgmma_width()), splits);
            (bn, c_out.div_ceil(bn), m.div_ceil(CW_BM), steps, splits)
        } else {
            let (bm, bn, bk) = block_tile::<T>(low);
            let steps = k.div_ceil(bk);
            let splits = splits.unwrap_or_else(|| splits_for::<T>(low, GemmShape { batch: 1, m, n: c_out, k }));
            (bn, c_out.div_ceil(bn), m.div_ceil(bm), steps, splits)
        };
        let splits = splits.clamp(1, steps);
        // The partials are indexed with 32 bits too.
        let splits = if splits.saturating_mul(n_y) < 1 << 31 { splits } else { 1 };
        if gy > 65535 || splits > 65535 {
            return Err(invalid(KN, format!("{m} output pixels ({gy} tiles) exceed the 65535 grid limit")));
        }
        let u = |v: usize| v as u32;
        let geom: [u32; NHWC_GEOM] = [
            u(batch), u(h), u(w), u(c_in), u(oh), u(ow), u(c_out), u(k_h), u(k_w), u(g.stride), u(g.padding), u(g.dilation), u(offset), u(splits), u(stages), u(bn),
        ];
        let geom = dev.upload(&geom)?;
        let none: [T; 0] = [];
        let bias: &dyn KernelArgSlice<T> = bias.unwrap_or(&none);
        let mut ws = dev.alloc_uninit::<f32>(if splits > 1 { splits * n_y } else { 0 })?;
        if wgmma {
            let cfg = LaunchConfig::new(Dim3::new(gx as u32, gy as u32, splits as u32), Dim3::x(CW_THREADS as u32)).with_dynamic_shared(conv_wgmma_smem_elems(stages, bn));
            if bn == 160 {
                conv2d_nhwc_wgmma_n160::launch::<T>(dev, cfg, x, weight, bias, y, &mut ws, &geom)?;
            } else {
                conv2d_nhwc_wgmma::launch::<T>(dev, cfg, x, weight, bias, y, &mut ws, &geom)?;
            }
        } else {
            let cfg = LaunchConfig::new(Dim3::new(gx as u32, gy as u32, splits as u32), Dim3::x(work_group_size(low) as u32))
                .with_dynamic_shared(smem_elems::<T>(low));
            conv2d_nhwc::launch::<T>(dev, cfg, x, weight, bias, y, &mut ws, &geom)?;
        }
        if splits > 1 {
            let cfg = LaunchConfig::new(Dim3::new(u(n_y.div_ceil(256)), 1, 1), Dim3::x(256));
            gemm_split_sum::launch::<T>(dev, cfg, &ws, bias, y, u(m), u(c_out), u(c_out), 0, u(splits), 1.0, 0)?;
        }
        Ok((oh, ow))
    }

    /// Tile width and K splits of a wgmma launch over `m` pixels, `c_out` channels and
    /// `steps` K steps (either given, or the launcher's choice): the cheapest width by an
    /// estimate of the launch's time (the narrower on a tie), its splits by
    /// [`wgmma_splits`]. A multiprocessor gets through about one tile at a time (the
    /// 160-wide kernel holds one work-group, the 128-wide two at about half speed each),
    /// so the launch takes `ceil(tiles * splits / SMs)` rounds of `steps / splits` K
    /// steps, each step costing its tile's width plus 64 columns' worth (the A tile's
    /// gather), and a split launch adds its f32 partials' write and sum,
    /// `splits * m * c_out / 640` in those units. The constants fit the SD layer
    /// table of `benches/results/h200-2026-11-28b` (every layer's faster width, listed
    /// there): 160-wide tiles take SD's 320-channel layers at 64x64 in one round (128
    /// tiles, against 192 in two).
    fn wgmma_plan(dev: &Device, m: usize, c_out: usize, steps: usize, tile_n: Option<usize>, splits: Option<usize>) -> (usize, usize) {
        let sms = kernel_dsl::host::Executor::compute_units(dev).unwrap_or(1).max(1) as usize;
        let widths: &[usize] = match &tile_n {
            Some(bn) => core::slice::from_ref(bn),
            None => &CW_BN_CHOICES,
        };
        let mut best: Option<(f64, usize, usize)> = None;
        for &bn in widths {
            let tiles = c_out.div_ceil(bn) * m.div_ceil(CW_BM);
            let sp = splits.unwrap_or_else(|| wgmma_splits(sms, tiles, steps)).clamp(1, steps.max(1));
            let rounds = (tiles * sp).div_ceil(sms) * steps.div_ceil(sp);
            let partials = if sp > 1 { (sp * m * c_out) as f64 / 640.0 } else { 0.0 };
            let cost = (rounds * (bn + 64)) as f64 + partials;
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, bn, sp));
            }
        }
        best.map_or((CW_BN_CHOICES[0], 1), |(_, bn, sp)| (bn, sp))
    }

    /// K splits of a wgmma launch of `tiles` work-groups over `steps` K steps on `sms`
    /// multiprocessors: none once the tiles give every multiprocessor one. Below that,
    /// work-groups beyond one per multiprocessor share one (two fit with three stages) at
    /// about half speed each, so a launch of `tiles * s` work-groups takes about
    /// `ceil(tiles * s / SMs) / s` of the unsplit tile's time; the smallest such cost wins
    /// where it beats the fewer splits' by 15% (the partial sums cost a pass), with at
    /// least 16 K steps per split and at most 16 splits.
    fn wgmma_splits(sms: usize, tiles: usize, steps: usize) -> usize {
        if tiles >= sms {
            return 1;
        }
        let cost = |s: usize| (tiles * s).div_ceil(sms) as f64 / s as f64;
        let mut best = 1;
        for s in 2..=(steps / 16).min(16) {
            if cost(s) < 0.85 * cost(best) {
                best = s;
            }
        }
        best
    }

    /// Sizes of one 2-D convolution (Candle's `ParamsConv2D` plus groups).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Conv2dShape {
        /// Batch entries.
        pub batch: usize,
        /// Input channels (all groups).
        pub c_in: usize,
        /// Input height and width.
        pub h: usize,
        /// Input width.
        pub w: usize,
        /// Output channels (all groups).
        pub c_out: usize,
        /// Kernel height.
        pub k_h: usize,
        /// Kernel width.
        pub k_w: usize,
        /// Channel groups (1: a dense convolution); divides `c_in` and `c_out`.
        pub groups: usize,
    }

    impl Conv2dShape {
        /// `(oh, ow)` under `g`, or an error when the dilated kernel does not fit.
        pub fn out_hw(&self, g: ConvGeometry) -> Result<(usize, usize), LaunchError> {
            Ok((conv_out_len(self.h, self.k_h, g)?, conv_out_len(self.w, self.k_w, g)?))
        }
    }

    /// `y = conv2d(x, weight) + bias` on the matrix units of `dev` without an im2col
    /// buffer ([`conv2d_implicit`](fn@super::conv2d_implicit)). `x` is the `(batch, c_in,
    /// h, w)` view at `offset + b*s0 + c*s1 + y*s2 + x*s3` (`strides = [s0, s1, s2,
    /// s3]`, any strides) of its buffer; `weight` contiguous `(c_out, c_in/groups, k_h,
    /// k_w)`; `bias` `c_out` elements; `y` contiguous `(batch, c_out, oh, ow)`. Returns
    /// `(oh, ow)`. Checks every size first: a bad one is `InvalidArgument` and nothing
    /// runs. A launch of fewer work-groups than `dev` has compute units splits K
    /// ([`split_k`]).
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d<T: GemmElem + ScalarArg>(
        dev: &Device,
        x: &(impl KernelArgSlice<T> + ?Sized),
        strides: [usize; 4],
        offset: usize,
        weight: &(impl KernelArgSlice<T> + ?Sized),
        bias: Option<&(dyn KernelArgSlice<T> + '_)>,
        s: Conv2dShape,
        g: ConvGeometry,
        y: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        conv2d_split(dev, x, strides, offset, weight, bias, s, g, y, None)
    }

    /// Least K steps per split of [`split_k`].
    const MIN_SPLIT_STEPS: usize = 4;

    /// How many ways a launch of `blocks` work-groups over `steps` K steps splits K on a
    /// device of `cus` compute units: enough for one work-group per compute unit (the
    /// deep, small-image layers of a UNet launch a handful of tiles), each split at least
    /// `MIN_SPLIT_STEPS` steps; 1 (no split) when the grid already fills the device or
    /// the unit count is unknown. Every split of the result gets at least one step.
    pub fn split_k(cus: Option<u32>, blocks: usize, steps: usize) -> usize {
        let cus = cus.unwrap_or(0) as usize;
        if blocks == 0 || blocks >= cus {
            return 1;
        }
        let want = cus.div_ceil(blocks).min(steps / MIN_SPLIT_STEPS).max(1);
        steps.div_ceil(steps.div_ceil(want).max(1)).max(1)
    }

    /// [`conv2d`] with the number of K splits given (`None`: [`split_k`]'s choice; a count
    /// above the K steps is reduced to it, one step per split). With more than one split,
    /// the work-groups write f32 partial sums to a scratch buffer of `splits` outputs and
    /// [`conv2d_split_sum`](fn@super::conv2d_split_sum) adds them (and the bias) into `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_split<T: GemmElem + ScalarArg>(
        dev: &Device,
        x: &(impl KernelArgSlice<T> + ?Sized),
        strides: [usize; 4],
        offset: usize,
        weight: &(impl KernelArgSlice<T> + ?Sized),
        bias: Option<&(dyn KernelArgSlice<T> + '_)>,
        s: Conv2dShape,
        g: ConvGeometry,
        y: &mut (impl KernelArgSliceMut<T> + ?Sized),
        splits: Option<usize>,
    ) -> Result<(usize, usize), LaunchError> {
        let Conv2dShape { batch, c_in, h, w, c_out, k_h, k_w, groups } = s;
        if groups == 0 || c_in % groups != 0 || c_out % groups != 0 || c_in == 0 {
            return Err(invalid(K, format!("{c_in} input and {c_out} output channels do not split into {groups} groups")));
        }
        let (oh, ow) = s.out_hw(g)?;
        let (cin_g, m) = (c_in / groups, c_out / groups);
        let n_w = check_len(K, "weight", arg_len(weight), &[c_out, cin_g, k_h, k_w])?;
        let n_y = check_len(K, "output", arg_len(y), &[batch, c_out, oh, ow])?;
        if let Some(b) = bias {
            check_len(K, "bias", arg_len(b), &[c_out])?;
        }
        if product(K, &[batch, c_in, h, w])? == 0 && n_y > 0 {
            return Err(invalid(K, format!("empty input ({batch}, {c_in}, {h}, {w}) for a non-empty output")));
        }
        let x_end = check_input(K, [batch, c_in, h, w], strides, offset, arg_len(x))?;
        // 32-bit indexing inside (every index below 2^31, so sums of two stay below 2^32).
        let pad_span = g.padding.saturating_mul(2).saturating_add(h.max(w));
        fits_i32(K, &[n_y, n_w, x_end, arg_len(x), pad_span, oh.saturating_mul(g.stride).saturating_add(k_h.max(k_w).saturating_mul(g.dilation))])?;
        if n_y == 0 {
            return Ok((oh, ow));
        }
        let low = lowering_of(dev);
        let (bm, bn, bk) = block_tile::<T>(low);
        let (gx, gy) = ((oh * ow).div_ceil(bn), m.div_ceil(bm));
        let steps = (cin_g * k_h * k_w).div_ceil(bk).max(1);
        let splits = match splits {
            Some(sp) => {
                let sp = sp.clamp(1, steps);
                steps.div_ceil(steps.div_ceil(sp))
            }
            None => split_k(kernel_dsl::host::Executor::compute_units(dev), gx * gy * batch * groups, steps),
        };
        // The partials are indexed with 32 bits too.
        let splits = if splits.saturating_mul(n_y) < 1 << 31 { splits } else { 1 };
        let gz = batch * groups * splits;
        if gy > 65535 || gz > 65535 {
            return Err(invalid(K, format!("{m} channels per group or {gz} batch x groups x K splits exceed the 65535 grid limit")));
        }
        let u = |v: usize| v as u32;
        let geom: [u32; CONV_GEOM] = [
            u(cin_g), u(h), u(w), u(k_h), u(k_w), u(oh), u(ow), u(g.stride), u(g.padding), u(g.dilation), u(m), u(groups),
            u(strides[0]), u(strides[1]), u(strides[2]), u(strides[3]), u(offset), u(splits),
        ];
        let geom = dev.upload(&geom)?;
        let none: [T; 0] = [];
        let bias: &dyn KernelArgSlice<T> = bias.unwrap_or(&none);
        let cfg = LaunchConfig::new(Dim3::new(gx as u32, gy as u32, gz as u32), Dim3::x(work_group_size(low) as u32))
            .with_dynamic_shared(conv_smem_elems::<T>(low));
        if splits == 1 {
            let mut no_part: [f32; 0] = [];
            conv2d_implicit::launch::<T>(dev, cfg, x, weight, bias, y, &mut no_part, &geom)?;
            return Ok((oh, ow));
        }
        // Every partial is written before it is read: no zeroing.
        let mut part = dev.alloc_uninit::<f32>(product(K, &[splits, n_y])?)?;
        conv2d_implicit::launch::<T>(dev, cfg, x, weight, bias, y, &mut part, &geom)?;
        let sum_geom = dev.upload(&[u(splits), u(oh * ow), u(c_out)])?;
        conv2d_split_sum::launch::<T>(dev, crate::indexing::elements_config(n_y), &part, bias, y, &sum_geom)?;
        Ok((oh, ow))
    }
}
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;
