//! Kernels of an LLM decode step that Candle's op-by-op path splits into many launches:
//!
//! - [`dense_matvec`](fn@dense_matvec): `y = x W^T (+ bias)` for 1..8 activation rows and a
//!   dense `f32`/`f16`/`bf16` weight stored `[N, K]` row-major (as `nn.Linear` holds it),
//!   `f32` accumulation. Decode's products are matrix-vector ones: every weight byte is
//!   read once per step (once for all activation rows), so the kernel is built to stream
//!   the weights at the memory's rate (16-byte streaming loads issued a chunk ahead, tiles
//!   of four weight rows per work-item sharing each activation load, teams sized to the
//!   matrix, shuffle reductions).
//! - [`add_rms_norm`](fn@add_rms_norm): `h = x + residual` and `RMSNorm(h) * weight` in one
//!   pass over the row (both outputs written), the pre-norm transformer's residual step.
//! - [`silu_mul`](fn@silu_mul): `SiLU(gate) * up` from one fused gate/up product
//!   (`[.., 2I] -> [.., I]`).
//! - [`add_rms_norm_q8`](fn@add_rms_norm_q8) and [`silu_mul_q8`](fn@silu_mul_q8): the same
//!   outputs plus their q8_1 codes for the int8 matvec of GGUF weights (the layout and the
//!   values of [`crate::quantized::quantize_q8_1`](fn@crate::quantized::quantize_q8_1)), so
//!   a decode step launches no separate quantization for the products' inputs.
//! - [`dense_matvec_gated`](fn@dense_matvec_gated): the gate/up product and `SiLU(gate) *
//!   up` in one launch for decode (each output reads its gate and its up weight row).
//! - [`sample`](fn@sample): one token per row of logits: repetition penalty, temperature,
//!   top-k, top-p, min-p, then a seeded draw (Gumbel-max with Philox4x32-10 noise); greedy
//!   (argmax) where the temperature is 0.
//!
//! The checked host entry points are in [`ops`].
use kernel_dsl::each;
use crate::random::philox4x32_10;
use crate::reduce::{block_reduce, MAX_WAVES};
use crate::each_lane;
use crate::row::{load_full, store_full, unpack_chunk, used_chunks, vectorizable, whole_chunks, words_chunk, RowTile, CHUNK};
use kernel_dsl::mma::{self, FragA, FragB, FragC, Lowering, MmaFloat};
use kernel_dsl::prelude::*;

/// Work-items of one [`dense_matvec`](fn@dense_matvec) work-group.
pub const MATVEC_BLOCK: u32 = 256;

/// Weight rows one work-item of [`dense_matvec`](fn@dense_matvec) multiplies together: each
/// activation chunk it loads (and converts) serves all of them.
pub const MATVEC_TILE_ROWS: usize = 4;

/// Fewest work-items sharing a row tile (8 x 16 bytes: a whole 128-byte line of each
/// weight row per load instruction).
pub const MATVEC_MIN_TEAM: usize = 8;

/// Work-items [`matvec_team`] aims to start: enough 16-byte loads in flight to cover the
/// memory latency of a large GPU (about 1000 per compute unit on 132).
pub const MATVEC_TARGET_ITEMS: usize = 1 << 17;

/// Activation rows of one [`dense_matvec`](fn@dense_matvec) instance.
pub trait MatvecRows: 'static {
    /// Most activation rows.
    const N: usize;
}
/// One activation row (decode of one sequence).
pub struct Rows1;
impl MatvecRows for Rows1 {
    const N: usize = 1;
}
/// Up to 2 activation rows.
pub struct Rows2;
impl MatvecRows for Rows2 {
    const N: usize = 2;
}
/// Up to 4 activation rows.
pub struct Rows4;
impl MatvecRows for Rows4 {
    const N: usize = 4;
}
/// Up to 8 activation rows.
pub struct Rows8;
impl MatvecRows for Rows8 {
    const N: usize = 8;
}

/// Work-items sharing one tile of [`MATVEC_TILE_ROWS`] weight rows of `cols` elements in
/// [`dense_matvec`](fn@dense_matvec) (a power of two from [`MATVEC_MIN_TEAM`] to
/// [`MATVEC_BLOCK`]): the fewest that start [`MATVEC_TARGET_ITEMS`] work-items in all,
/// no more than the row has chunks. Few rows (small matrices): wide teams, each work-item
/// a chunk or two of every row of its tile; many rows (the LM head): teams of 8, each
/// work-item streaming a long stretch of its rows and many tiles per work-group sharing
/// the activations through the cache.
pub const fn matvec_team(rows: usize, cols: usize) -> usize {
    let tiles = rows.div_ceil(MATVEC_TILE_ROWS);
    let chunks = cols.div_ceil(CHUNK);
    let mut t = MATVEC_MIN_TEAM;
    while t < MATVEC_BLOCK as usize && tiles * t < MATVEC_TARGET_ITEMS && t < chunks {
        t *= 2;
    }
    t
}

/// The 16 (or, for `f32`, 32) bytes of the chunk at `p` as words, loaded with the
/// streaming hint ([`kernel_dsl::hint::load_streaming_u32x4`]): weights are read once.
///
/// # Safety
/// `p` is 16-byte aligned and a whole chunk of `T` from it lies in global memory.
#[device]
#[inline(always)]
unsafe fn load_weights<T: Float>(p: *const T) -> [[u32; 4]; 2] {
    let q = p as *const [u32; 4];
    // SAFETY: the caller's contract; a chunk of a 32-bit type is two 16-byte words.
    unsafe {
        let lo = kernel_dsl::hint::load_streaming_u32x4(q);
        let hi = if core::mem::size_of::<T>() == 4 { kernel_dsl::hint::load_streaming_u32x4(q.add(1)) } else { [0; 4] };
        [lo, hi]
    }
}

/// The two 16-bit elements of word `w` (the low one first) in `f32`, without taking the
/// word apart into 16-bit values first (bf16: a shift and a mask).
#[device]
#[inline(always)]
fn word_f32x2<T: Float>(w: u32) -> [f32; 2] {
    // SAFETY: `T` is a 16-bit float here (the callers check the size); any bits are a
    // valid f16 / bf16.
    let (lo, hi): (T, T) = unsafe { (core::mem::transmute_copy(&(w as u16)), core::mem::transmute_copy(&((w >> 16) as u16))) };
    T::to_f32x2([lo, hi])
}

/// A chunk loaded by [`load_weights`] (or [`load_words`]) in `f32`.
#[device]
#[inline(always)]
fn words_f32<T: Float>(w: [[u32; 4]; 2]) -> [f32; CHUNK] {
    let mut v = [0.0; CHUNK];
    if core::mem::size_of::<T>() == 2 {
        each!(j in [0, 1, 2, 3] {
            [v[2 * j], v[2 * j + 1]] = word_f32x2::<T>(w[0][j]);
        });
    } else {
        each!(j in [0, 1, 2, 3] {
            v[j] = f32::from_bits(w[0][j]);
            v[j + 4] = f32::from_bits(w[1][j]);
        });
    }
    v
}

/// Sixteen bytes read as one aligned vector (an activation chunk).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Words([u32; 4]);

/// A whole chunk of `T` at `p`, plain 16-byte loads (activations: read by every row tile,
/// kept in the caches).
///
/// # Safety
/// As [`load_weights`].
#[device]
#[inline(always)]
unsafe fn load_words<T: Float>(p: *const T) -> [[u32; 4]; 2] {
    let q = p as *const Words;
    // SAFETY: the caller's contract (16-byte aligned, a whole chunk in memory).
    unsafe {
        let lo = core::ptr::read(q).0;
        let hi = if core::mem::size_of::<T>() == 4 { core::ptr::read(q.add(1)).0 } else { [0; 4] };
        [lo, hi]
    }
}

/// `s + sum_j a[j] * b[j]` over a chunk (one chain: the callers interleave many).
#[device]
#[inline(always)]
fn dot_chunk(a: &[f32; CHUNK], b: &[f32; CHUNK], mut s: f32) -> f32 {
    each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
        s = a[j].mul_add(b[j], s);
    });
    s
}

/// One 16x16x16 product of the matrix unit on raw words: `a` the A fragment's first four
/// words, `b` the B fragment's first two (the rest zero), `c` the accumulator's items, for
/// `T` = bf16 or f16 (anything else returns `c`). Only called where the lowering is
/// `MmaSync` (four A words, four B words, eight accumulator items per lane).
#[device]
#[inline(always)]
fn mma_words<T: Float>(a: [u32; 4], b: [u32; 2], c: [f32; 8]) -> [f32; 8] {
    fn go<M: MmaFloat>(a: [u32; 4], b: [u32; 2], c: [f32; 8]) -> [f32; 8] {
        let (mut aw, mut bw) = ([0u32; mma::AB_WORDS], [0u32; mma::AB_WORDS]);
        each!(i in [0, 1, 2, 3] {
            aw[i % mma::AB_WORDS] = a[i];
        });
        each!(i in [0, 1] {
            bw[i % mma::AB_WORDS] = b[i];
        });
        let mut cf = FragC::<f32>::zero();
        let n = cf.v.len();
        each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            cf.v[j % n] = c[j];
        });
        let d = mma::mma(&FragA::<M>::from_words(aw), &FragB::<M>::from_words(bw), cf);
        let mut out = [0f32; 8];
        each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            out[j] = d.v[j % n];
        });
        out
    }
    use core::any::TypeId;
    if TypeId::of::<T>() == TypeId::of::<bf16>() {
        go::<bf16>(a, b, c)
    } else if TypeId::of::<T>() == TypeId::of::<f16>() {
        go::<f16>(a, b, c)
    } else {
        c
    }
}

/// Loads of one step of [`matvec_mma`]: chunks `c0` and `c1` of the lane's two weight rows
/// and of its activation row, zero where out of range.
///
/// # Safety
/// `wa`, `wb` and `xr` point at rows of `chunks` whole 16-byte aligned chunks of a 16-bit
/// type (each used only where its flag says so).
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mma_loads<T: Float>(wa: *const T, wb: *const T, xr: *const T, ok_a: bool, ok_b: bool, ok_x: bool, c0: usize, c1: usize, chunks: usize) -> [[u32; 4]; 6] {
    let mut v = [[0u32; 4]; 6];
    // SAFETY (every load): chunk < chunks of a row the flag says exists; aligned.
    if c0 < chunks {
        if ok_a {
            v[0] = unsafe { kernel_dsl::hint::load_streaming_u32x4(wa.add(c0 * CHUNK) as *const [u32; 4]) };
        }
        if ok_b {
            v[2] = unsafe { kernel_dsl::hint::load_streaming_u32x4(wb.add(c0 * CHUNK) as *const [u32; 4]) };
        }
        if ok_x {
            v[4] = unsafe { load_words(xr.add(c0 * CHUNK)) }[0];
        }
    }
    if c1 < chunks {
        if ok_a {
            v[1] = unsafe { kernel_dsl::hint::load_streaming_u32x4(wa.add(c1 * CHUNK) as *const [u32; 4]) };
        }
        if ok_b {
            v[3] = unsafe { kernel_dsl::hint::load_streaming_u32x4(wb.add(c1 * CHUNK) as *const [u32; 4]) };
        }
        if ok_x {
            v[5] = unsafe { load_words(xr.add(c1 * CHUNK)) }[0];
        }
    }
    v
}

/// [`dense_matvec`](fn@dense_matvec) on NVIDIA's `mma.sync` (and the CPU executor's
/// emulation of it): the work-group's `rb` rows in tiles of 16 (A: 16 weight rows x 16 k),
/// the activations as B (k x batch, columns past the batch zero), `f32` accumulators. A
/// product's sum over k does not depend on the order of k, so each lane's A and B items
/// are taken from its own 16-byte chunks: lane `l` (group `g = l / 4`, `t = l % 4`) loads
/// chunk `t` (and `t + 4`) of a 64-element step from weight rows `g` and `g + 8` and from
/// activation row `g`; words 0-1 of a chunk feed one product, words 2-3 the next, at the
/// positions where `mma.sync`'s layout puts row `g` / `g + 8` and column `g` for the same
/// four k. No conversion, two 16-byte weight loads per lane per 32 k; the tile's warps
/// split the steps and add their sums through shared memory in a fixed order.
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn matvec_mma<T: Float>(w: &[T], x: &[T], bias: &[T], y: &mut [T], rows: usize, cols: usize, batch: usize, team: usize, partials: &mut Shared<f32, 1024>) {
    let tid = flat_thread_idx() as usize;
    let rb = MATVEC_TILE_ROWS * (MATVEC_BLOCK as usize / team);
    let block_row0 = block_idx_x() as usize * rb;
    let nt = rb.div_ceil(16);
    let wpt = (MATVEC_BLOCK as usize / 32) / nt;
    let (warp, lane) = (tid / 32, tid % 32);
    let (tile, ks) = (warp / wpt, warp % wpt);
    let (g, t) = (lane / 4, lane % 4);
    let local = tile * 16 + g;
    let ok_a = local < rb && block_row0 + local < rows;
    let ok_b = local + 8 < rb && block_row0 + local + 8 < rows;
    let ok_x = g < batch;
    let chunks = cols / CHUNK;
    // Rows that do not exist point at row 0 (never loaded).
    let ra = if ok_a { block_row0 + local } else { 0 };
    let rb8 = if ok_b { block_row0 + local + 8 } else { 0 };
    let xrow = if ok_x { g } else { 0 };
    // SAFETY: rows < `rows` (or 0), so each row start lies in w / x (checked by the caller).
    let (wa, wb, xr) = unsafe { (w.as_ptr().add(ra * cols), w.as_ptr().add(rb8 * cols), x.as_ptr().add(xrow * cols)) };
    let mut acc = [0f32; 8];
    let mut s = ks;
    // SAFETY: the pointers and flags above; chunks checked inside.
    let mut next = unsafe { mma_loads(wa, wb, xr, ok_a, ok_b, ok_x, s * 8 + t, s * 8 + 4 + t, chunks) };
    while s * 8 < chunks {
        let cur = next;
        let sn = s + wpt;
        if sn * 8 < chunks {
            // SAFETY: as above.
            next = unsafe { mma_loads(wa, wb, xr, ok_a, ok_b, ok_x, sn * 8 + t, sn * 8 + 4 + t, chunks) };
        }
        each!(h in [0, 1] {
            let (a, b, xv) = (cur[h], cur[2 + h], cur[4 + h]);
            acc = mma_words::<T>([a[0], b[0], a[1], b[1]], [xv[0], xv[1]], acc);
            acc = mma_words::<T>([a[2], b[2], a[3], b[3]], [xv[2], xv[3]], acc);
        });
        s = sn;
    }
    // Items 0-3: rows g (0, 1) and g + 8 (2, 3) of the tile, activation rows 2t, 2t + 1.
    if wpt == 1 {
        each!(j in [0, 1, 2, 3] {
            let (loc, n) = (tile * 16 + g + 8 * (j / 2), 2 * t + j % 2);
            let row = block_row0 + loc;
            if loc < rb && row < rows && n < batch {
                let bv = if bias.is_empty() { 0.0 } else { bias[row].to_f32() };
                y[n * rows + row] = T::from_f32(acc[j] + bv);
            }
        });
        return;
    }
    each!(j in [0, 1, 2, 3] {
        partials[(warp * 16 + g + 8 * (j / 2)) * 8 + 2 * t + j % 2] = acc[j];
    });
    barrier();
    let mut o = tid;
    while o < nt * 128 {
        let (tl, loc, n) = (o / 128, (o / 8) % 16, o % 8);
        let row = block_row0 + tl * 16 + loc;
        if tl * 16 + loc < rb && row < rows && n < batch {
            let mut sum = 0.0f32;
            let mut k = 0;
            while k < wpt {
                sum += partials[((tl * wpt + k) * 16 + loc) * 8 + n];
                k += 1;
            }
            let bv = if bias.is_empty() { 0.0 } else { bias[row].to_f32() };
            y[n * rows + row] = T::from_f32(sum + bv);
        }
        o += MATVEC_BLOCK as usize;
    }
}

/// `y[b * rows + r] = sum_k w[r * cols + k] * x[b * cols + k] (+ bias[r])` for
/// `b < batch <= R::N`, accumulated in `f32` and rounded once to `T`; `bias` is empty or
/// has `rows` elements.
///
/// Every weight element is read once per launch, whatever the batch. The weight rows are
/// cut in tiles of [`MATVEC_TILE_ROWS`]; a tile is shared by a `team` of consecutive
/// work-items ([`matvec_team`]; `MATVEC_BLOCK / team` tiles per work-group), work-item `j`
/// taking chunks `j, j + team, ...` of [`CHUNK`] elements of each of the tile's rows (so a
/// load instruction of a wave reads whole contiguous lines of every row). Per chunk it
/// loads the tile's weights (16-byte streaming loads, issued one chunk ahead: the next
/// chunk's loads are in flight while the current one is multiplied) and the same chunk of
/// every activation row (16-byte loads, cached: the tiles of a work-group read the same
/// activations), converts each once and accumulates `MATVEC_TILE_ROWS x batch` sums.
/// A tile's sums: shuffles over the team's lanes, then, for teams wider than a wave, the
/// waves' sums in a fixed order through shared memory. Rows past the end of the matrix
/// read the last row (in bounds, results dropped), so the main loop has no per-row branch.
/// Rows of whole aligned chunks (`cols` a multiple of [`CHUNK`], `w` and `x` on 16 bytes)
/// take the vector path; others one element at a time. (NVIDIA GPUs run 16-bit products
/// on the vector path with [`dense_matvec_mma`](fn@dense_matvec_mma) instead; AMD GPUs run
/// [`dense_matvec_wave`](fn@dense_matvec_wave), and this kernel's AMD code objects are
/// empty.) Launch with [`MATVEC_BLOCK`]
/// work-items and `rows.div_ceil(MATVEC_TILE_ROWS * MATVEC_BLOCK / team)` work-groups.
#[amdgpu_kernel(T = [f32, f16, bf16], R = [Rows1, Rows2, Rows4, Rows8], max_threads = 256)]
pub fn dense_matvec<T: Float, R: MatvecRows>(
    w: &[T],
    x: &[T],
    bias: &[T],
    y: &mut [T],
    rows: usize,
    cols: usize,
    batch: usize,
    team: usize,
    mut partials: Shared<f32, 256>,
) {
    const TR: usize = MATVEC_TILE_ROWS;
    const _: () = assert!(TR == 4 && (MATVEC_BLOCK as usize / 32) * TR * 8 <= 256);
    // AMD GPUs run dense_matvec_wave (this kernel's tiles spill there).
    if cfg!(target_arch = "amdgpu") {
        return;
    }
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let ws = wave::size() as usize;
    // Uniform checks that make the unchecked accesses below in bounds.
    if threads != MATVEC_BLOCK as usize || !team.is_power_of_two() || team < MATVEC_MIN_TEAM || team > threads || batch == 0 || batch > R::N || R::N > 8 {
        return;
    }
    let fits = rows.checked_mul(cols).is_some_and(|n| n <= w.len()) && batch.checked_mul(cols).is_some_and(|n| n <= x.len()) && batch * rows <= y.len();
    if !fits || !(bias.is_empty() || bias.len() == rows) {
        return;
    }
    let tiles = threads / team;
    let (g, j) = (tid / team, tid % team);
    let row0 = (block_idx_x() as usize * tiles + g) * TR;
    let active = row0 < rows;
    // The tile's rows; those past the end repeat the last row.
    let mut rr = [0usize; TR];
    each!(r in [0, 1, 2, 3] {
        rr[r] = if row0 + r < rows { row0 + r } else { rows - 1 };
    });
    let mut acc = [[0f32; 8]; TR];
    let vec = cols % CHUNK == 0 && (w.as_ptr() as usize) % 16 == 0 && (x.as_ptr() as usize) % 16 == 0;
    if active && vec {
        let chunks = cols / CHUNK;
        let mut wp = [w.as_ptr(); TR];
        each!(r in [0, 1, 2, 3] {
            // SAFETY: rr[r] < rows, so the row starts inside w (rows * cols <= w.len()).
            wp[r] = unsafe { w.as_ptr().add(rr[r] * cols) };
        });
        // Activation rows past the batch read the last one (loads stay unconditional).
        let mut xp = [x.as_ptr(); 8];
        each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
            if b < R::N {
                let xr = if b < batch { b } else { batch - 1 };
                // SAFETY: xr < batch and batch * cols <= x.len().
                xp[b] = unsafe { x.as_ptr().add(xr * cols) };
            }
        });
        let mut c = j;
        let mut next = [[[0u32; 4]; 2]; TR];
        if c < chunks {
            each!(r in [0, 1, 2, 3] {
                // SAFETY: chunk c < chunks of a row inside w; aligned as `vec` says.
                next[r] = unsafe { load_weights(wp[r].add(c * CHUNK)) };
            });
        }
        while c < chunks {
            let cur = next;
            let cn = c + team;
            if cn < chunks {
                each!(r in [0, 1, 2, 3] {
                    // SAFETY: as above, chunk cn < chunks.
                    next[r] = unsafe { load_weights(wp[r].add(cn * CHUNK)) };
                });
            }
            let mut xw = [[[0u32; 4]; 2]; 8];
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N {
                    // SAFETY: chunk c < chunks of an activation row; aligned as `vec` says.
                    xw[b] = unsafe { load_words(xp[b].add(c * CHUNK)) };
                }
            });
            let mut wf = [[0f32; CHUNK]; TR];
            each!(r in [0, 1, 2, 3] {
                wf[r] = words_f32::<T>(cur[r]);
            });
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N && b < batch {
                    let xf = words_f32::<T>(xw[b]);
                    each!(r in [0, 1, 2, 3] {
                        acc[r][b] = dot_chunk(&wf[r], &xf, acc[r][b]);
                    });
                }
            });
            c = cn;
        }
    } else if active {
        // Odd widths and misaligned views: element by element, strided like the chunks.
        let mut k = j;
        while k < cols {
            let mut xk = [0f32; 8];
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N && b < batch {
                    xk[b] = x[b * cols + k].to_f32();
                }
            });
            each!(r in [0, 1, 2, 3] {
                let wk = w[rr[r] * cols + k].to_f32();
                each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if b < R::N && b < batch {
                        acc[r][b] = wk.mul_add(xk[b], acc[r][b]);
                    }
                });
            });
            k += team;
        }
    }
    // Sums over the team's lanes (or the whole wave, for teams wider than one): every lane
    // reaches the shuffles (uniform control flow).
    let span = if team < ws { team } else { ws };
    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
        if b < R::N && b < batch {
            each!(r in [0, 1, 2, 3] {
                let mut s = acc[r][b];
                let mut off = span / 2;
                while off > 0 {
                    s += wave::shuffle_xor(s, off as u32);
                    off /= 2;
                }
                acc[r][b] = s;
            });
        }
    });
    if team <= ws {
        if active && j == 0 {
            each!(r in [0, 1, 2, 3] {
                let row = row0 + r;
                if row < rows {
                    let bv = if bias.is_empty() { 0.0 } else { bias[row].to_f32() };
                    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if b < R::N && b < batch {
                            y[b * rows + row] = T::from_f32(acc[r][b] + bv);
                        }
                    });
                }
            });
        }
        return;
    }
    // Teams of several waves: each wave's sums (TR x 8 slots), then per output in order.
    let wave_in_block = tid / ws;
    if tid % ws == 0 {
        each!(r in [0, 1, 2, 3] {
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N {
                    partials[wave_in_block * TR * 8 + r * 8 + b] = acc[r][b];
                }
            });
        });
    }
    barrier();
    // Work-item t < tiles * TR * 8 finishes tile t / (TR * 8), row (t / 8) % TR, activation
    // row t % 8.
    let (gt, r, b) = (tid / (TR * 8), (tid / 8) % TR, tid % 8);
    let per = team / ws;
    let row = (block_idx_x() as usize * tiles + gt) * TR + r;
    if gt < tiles && b < batch && row < rows {
        let mut s = 0.0f32;
        let mut i = 0;
        while i < per {
            s += partials[((gt * per + i) * TR + r) * 8 + b];
            i += 1;
        }
        let bv = if bias.is_empty() { 0.0 } else { bias[row].to_f32() };
        y[b * rows + row] = T::from_f32(s + bv);
    }
}

// The AMD form of the dense matvec: one weight row per team of work-items (whole waves),
// batches of up to 4 activation rows per launch. The row-tile kernel above spills on AMD
// code objects (its 4 x 8 accumulators and per-row pointers pass gfx9's 102 scalar and
// the 128 vector registers of its occupancy target), so AMD GPUs run this one; it is the
// kernel `dense_matvec` was before the row tiles (zero spills on every AMD arch).

/// Chunks (of [`CHUNK`] elements) one work-item of [`dense_matvec_wave`](fn@dense_matvec_wave)
/// has in flight at once.
pub const MATVEC_UNROLL: usize = 4;

/// Weight rows one [`dense_matvec_wave`](fn@dense_matvec_wave) work-group takes for rows of `cols`
/// elements on waves of `wave_lanes`: the fewest (1, 2, 4, 8) that leave each work-item at
/// least [`MATVEC_UNROLL`] chunks of its row, at most one row per wave.
pub const fn matvec_group(cols: usize, wave_lanes: usize) -> usize {
    let chunks = cols.div_ceil(CHUNK);
    let most = MATVEC_BLOCK as usize / wave_lanes;
    let mut g = 1;
    while g < most && g < 8 && (MATVEC_BLOCK as usize / g) * MATVEC_UNROLL > chunks {
        g *= 2;
    }
    g
}


/// A chunk loaded by [`load_weights`] (or [`load_words_v1`]) in `f32` ([`dense_matvec_wave`](fn@dense_matvec_wave)).
#[device]
#[inline(always)]
fn words_f32_v1<T: Float>(w: [[u32; 4]; 2]) -> [f32; CHUNK] {
    if core::mem::size_of::<T>() == 2 {
        unpack_chunk::<T>(&words_chunk::<T>(w[0]))
    } else {
        let mut v = [0.0; CHUNK];
        each!(j in [0, 1, 2, 3] {
            v[j] = f32::from_bits(w[0][j]);
            v[j + 4] = f32::from_bits(w[1][j]);
        });
        v
    }
}

/// A whole chunk of `T` at `p`, plain loads (activations: read by every row).
///
/// # Safety
/// As [`load_weights`].
#[device]
#[inline(always)]
unsafe fn load_words_v1<T: Float>(p: *const T) -> [[u32; 4]; 2] {
    let q = p as *const [u32; 4];
    // SAFETY: the caller's contract.
    unsafe {
        let lo = core::ptr::read(q);
        let hi = if core::mem::size_of::<T>() == 4 { core::ptr::read(q.add(1)) } else { [0; 4] };
        [lo, hi]
    }
}

/// `sum_j a[j] * b[j]` over a chunk, as two interleaved chains (half the dependent
/// latency of one).
#[device]
#[inline(always)]
fn dot_chunk2(a: &[f32; CHUNK], b: &[f32; CHUNK]) -> f32 {
    let (mut s0, mut s1) = (0.0f32, 0.0f32);
    each!(j in [0, 2, 4, 6] {
        s0 = a[j].mul_add(b[j], s0);
        s1 = a[j + 1].mul_add(b[j + 1], s1);
    });
    s0 + s1
}

/// `y[b * rows + r] = sum_k w[r * cols + k] * x[b * cols + k] (+ bias[r])` for
/// `b < batch <= R::N`, accumulated in `f32` and rounded once to `T`; `bias` is empty or
/// has `rows` elements.
///
/// Work-group `g` takes the `group` weight rows `g * group ..` ([`matvec_group`]: 1, 2, 4
/// or 8, whole waves per row); work-item `j` of a row's `team = MATVEC_BLOCK / group`
/// takes chunks `j, j + team, ...` of [`CHUNK`] elements (so each load instruction of a
/// wave reads whole contiguous lines) in rounds of [`MATVEC_UNROLL`] chunks whose weight
/// loads (16-byte, streaming) all go out before any is used; it multiplies each weight
/// chunk with the same chunk of every activation row (the weights are read once for the
/// whole batch). A row's sums: a wave reduction, then, where the row spans several waves,
/// their sums in a fixed order through shared memory. Rows of whole aligned chunks (`cols`
/// a multiple of [`CHUNK`], `w` and `x` on 16 bytes) take the vector path; others one
/// element at a time. Launch with [`MATVEC_BLOCK`] work-items and `rows.div_ceil(group)`
/// work-groups.
#[amdgpu_kernel(T = [f32, f16, bf16], R = [Rows1, Rows2, Rows4], max_threads = 256)]
pub fn dense_matvec_wave<T: Float, R: MatvecRows>(
    w: &[T],
    x: &[T],
    bias: &[T],
    y: &mut [T],
    rows: usize,
    cols: usize,
    batch: usize,
    group: usize,
    mut partials: Shared<f32, 64>,
) {
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let ws = wave::size() as usize;
    // Uniform checks that make the unchecked accesses below in bounds.
    if threads != MATVEC_BLOCK as usize || !(group == 1 || group == 2 || group == 4 || group == 8) || group * ws > threads || batch > R::N || R::N > 8 {
        return;
    }
    let fits = rows.checked_mul(cols).is_some_and(|n| n <= w.len()) && batch.checked_mul(cols).is_some_and(|n| n <= x.len()) && batch * rows <= y.len();
    if !fits || !(bias.is_empty() || bias.len() == rows) {
        return;
    }
    let team = threads / group;
    let (g, j) = (tid / team, tid % team);
    let row = block_idx_x() as usize * group + g;
    let active = row < rows;
    let mut acc = [0f32; 8];
    let vec = cols % CHUNK == 0 && (w.as_ptr() as usize) % 16 == 0 && (x.as_ptr() as usize) % 16 == 0;
    if active && vec {
        let chunks = cols / CHUNK;
        let wrow = row * cols;
        let mut c = j;
        // Full rounds: every chunk in range, no per-chunk branch.
        while c + (MATVEC_UNROLL - 1) * team < chunks {
            let mut wv = [[[0u32; 4]; 2]; MATVEC_UNROLL];
            each!(u in [0, 1, 2, 3] {
                // SAFETY: chunk c + u * team < chunks lies inside row `row` (< rows, and
                // rows * cols <= w.len()); aligned as `vec` says.
                wv[u] = unsafe { load_weights(w.as_ptr().add(wrow + (c + u * team) * CHUNK)) };
            });
            each!(u in [0, 1, 2, 3] {
                let wf = words_f32_v1::<T>(wv[u]);
                each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if b < R::N && b < batch {
                        // SAFETY: b < batch and the chunk is inside a row of x (batch * cols
                        // <= x.len()); aligned as `vec` says.
                        let xf = words_f32_v1::<T>(unsafe { load_words_v1(x.as_ptr().add(b * cols + (c + u * team) * CHUNK)) });
                        acc[b] += dot_chunk2(&wf, &xf);
                    }
                });
            });
            c += MATVEC_UNROLL * team;
        }
        // The last round: up to MATVEC_UNROLL - 1 chunks, loads first as above.
        if c < chunks {
            let mut wv = [[[0u32; 4]; 2]; MATVEC_UNROLL];
            each!(u in [0, 1, 2] {
                if c + u * team < chunks {
                    // SAFETY: as above (checked).
                    wv[u] = unsafe { load_weights(w.as_ptr().add(wrow + (c + u * team) * CHUNK)) };
                }
            });
            each!(u in [0, 1, 2] {
                if c + u * team < chunks {
                    let wf = words_f32_v1::<T>(wv[u]);
                    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if b < R::N && b < batch {
                            // SAFETY: as above.
                            let xf = words_f32_v1::<T>(unsafe { load_words_v1(x.as_ptr().add(b * cols + (c + u * team) * CHUNK)) });
                            acc[b] += dot_chunk2(&wf, &xf);
                        }
                    });
                }
            });
        }
    } else if active {
        // Odd widths and misaligned views: element by element, strided like the chunks.
        let wrow = &w[row * cols..row * cols + cols];
        let mut k = j;
        while k < cols {
            let wk = wrow[k].to_f32();
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N && b < batch {
                    acc[b] = wk.mul_add(x[b * cols + k].to_f32(), acc[b]);
                }
            });
            k += team;
        }
    }
    // Wave sums (every lane reaches them: uniform control flow), then per row in a fixed
    // order.
    let mut sums = [0f32; 8];
    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
        if b < R::N && b < batch {
            sums[b] = wave::sum(acc[b]);
        }
    });
    let per_row = team / ws;
    let wave_in_group = tid / ws;
    if per_row == 1 {
        if active && wave::lane_id() == 0 {
            let bv = if bias.is_empty() { 0.0 } else { bias[row].to_f32() };
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < R::N && b < batch {
                    y[b * rows + row] = T::from_f32(sums[b] + bv);
                }
            });
        }
        return;
    }
    if wave::lane_id() == 0 {
        each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
            if b < R::N {
                partials[wave_in_group * 8 + b] = sums[b];
            }
        });
    }
    barrier();
    // Work-item t < group * 8 finishes (row t / 8, activation row t % 8).
    let (gr, b) = (tid / 8, tid % 8);
    let out_row = block_idx_x() as usize * group + gr;
    if gr < group && b < batch && out_row < rows {
        let mut s = 0.0f32;
        let mut i = 0;
        while i < per_row {
            s += partials[(gr * per_row + i) * 8 + b];
            i += 1;
        }
        let bv = if bias.is_empty() { 0.0 } else { bias[out_row].to_f32() };
        y[b * rows + out_row] = T::from_f32(s + bv);
    }
}

/// `SiLU(g) * u` in `f32` (`g / (1 + e^-g)`, as [`silu_mul`](fn@silu_mul)).
#[device]
#[inline(always)]
fn silu_times(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `y[b * inter + r] = SiLU(g) * u` with `g = x_b . w[r] (+ bias[r])` and `u = x_b .
/// w[inter + r] (+ bias[inter + r])` for `r < inter`, `b < batch <= R::N`: the gated MLP's
/// gate/up product and activation in one launch, for a weight holding the gate rows and
/// then the up rows (`[2 inter, cols]`, the stacked `[gate; up]` of a Llama MLP); `bias`
/// is empty or has `2 inter` elements. Both sums accumulate in `f32`; the activation is
/// taken from them in `f32` and rounded once to `T` (no `[batch, 2 inter]` intermediate,
/// no separate activation launch).
///
/// The shape of [`dense_matvec_wave`](fn@dense_matvec_wave): work-group `g` takes the
/// `group` outputs `g * group ..` ([`matvec_group`] of `cols`), each by a team of whole
/// waves that streams both of its weight rows: per round every work-item issues the
/// 16-byte streaming loads of [`MATVEC_UNROLL`] chunks of the gate row and as many of the
/// up row (half as many chunks of each for `f32`, whose chunks are two loads) before it
/// uses any, so twice the wave kernel's bytes are in flight per work-item for 16-bit
/// weights. Each activation chunk serves both rows. Sums: wave reductions, then, for rows
/// spanning several waves, a fixed order through shared memory. Rows of whole aligned
/// chunks take the vector path; others one element at a time. Launch with
/// [`MATVEC_BLOCK`] work-items and `inter.div_ceil(group)` work-groups.
#[amdgpu_kernel(T = [f32, f16, bf16], R = [Rows1, Rows2, Rows4], max_threads = 256)]
pub fn dense_matvec_gated<T: Float, R: MatvecRows>(
    w: &[T],
    x: &[T],
    bias: &[T],
    y: &mut [T],
    inter: usize,
    cols: usize,
    batch: usize,
    group: usize,
    mut partials: Shared<f32, 64>,
) {
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let ws = wave::size() as usize;
    // Uniform checks that make the unchecked accesses below in bounds.
    if threads != MATVEC_BLOCK as usize || !(group == 1 || group == 2 || group == 4 || group == 8) || group * ws > threads || batch > R::N || R::N > 4 {
        return;
    }
    let fits = inter.checked_mul(2).and_then(|r| r.checked_mul(cols)).is_some_and(|n| n <= w.len())
        && batch.checked_mul(cols).is_some_and(|n| n <= x.len())
        && batch.checked_mul(inter).is_some_and(|n| n <= y.len());
    if !fits || !(bias.is_empty() || bias.len() == 2 * inter) {
        return;
    }
    let team = threads / group;
    let (g, j) = (tid / team, tid % team);
    let row = block_idx_x() as usize * group + g;
    let active = row < inter;
    // acc[0]: the gate row's sums, acc[1]: the up row's, per activation row.
    let mut acc = [[0f32; 4]; 2];
    let vec = cols % CHUNK == 0 && (w.as_ptr() as usize) % 16 == 0 && (x.as_ptr() as usize) % 16 == 0;
    if active && vec {
        let chunks = cols / CHUNK;
        // Chunks of each row per round: 2 x 4 loads in flight for 16-bit weights, 2 x 2
        // chunks (of two loads each) for f32.
        let unroll = if core::mem::size_of::<T>() == 4 { MATVEC_UNROLL / 2 } else { MATVEC_UNROLL };
        // SAFETY: row < inter, so rows `row` and `inter + row` lie inside w (2 * inter *
        // cols <= w.len()).
        let wr = unsafe { [w.as_ptr().add(row * cols), w.as_ptr().add((inter + row) * cols)] };
        let mut c = j;
        // Full rounds: every chunk in range, no per-chunk branch.
        while c + (unroll - 1) * team < chunks {
            let mut wv = [[[[0u32; 4]; 2]; MATVEC_UNROLL]; 2];
            each!(u in [0, 1, 2, 3] {
                if u < unroll {
                    each!(h in [0, 1] {
                        // SAFETY: chunk c + u * team < chunks of a row inside w; aligned as
                        // `vec` says.
                        wv[h][u] = unsafe { load_weights(wr[h].add((c + u * team) * CHUNK)) };
                    });
                }
            });
            each!(u in [0, 1, 2, 3] {
                if u < unroll {
                    let (gf, uf) = (words_f32_v1::<T>(wv[0][u]), words_f32_v1::<T>(wv[1][u]));
                    each!(b in [0, 1, 2, 3] {
                        if b < R::N && b < batch {
                            // SAFETY: b < batch and the chunk is inside a row of x (batch *
                            // cols <= x.len()); aligned as `vec` says.
                            let xf = words_f32_v1::<T>(unsafe { load_words_v1(x.as_ptr().add(b * cols + (c + u * team) * CHUNK)) });
                            acc[0][b] += dot_chunk2(&gf, &xf);
                            acc[1][b] += dot_chunk2(&uf, &xf);
                        }
                    });
                }
            });
            c += unroll * team;
        }
        // The last round: up to unroll - 1 chunks of each row, loads first as above.
        if c < chunks {
            let mut wv = [[[[0u32; 4]; 2]; MATVEC_UNROLL]; 2];
            each!(u in [0, 1, 2] {
                if u + 1 < unroll && c + u * team < chunks {
                    each!(h in [0, 1] {
                        // SAFETY: as above (checked).
                        wv[h][u] = unsafe { load_weights(wr[h].add((c + u * team) * CHUNK)) };
                    });
                }
            });
            each!(u in [0, 1, 2] {
                if u + 1 < unroll && c + u * team < chunks {
                    let (gf, uf) = (words_f32_v1::<T>(wv[0][u]), words_f32_v1::<T>(wv[1][u]));
                    each!(b in [0, 1, 2, 3] {
                        if b < R::N && b < batch {
                            // SAFETY: as above.
                            let xf = words_f32_v1::<T>(unsafe { load_words_v1(x.as_ptr().add(b * cols + (c + u * team) * CHUNK)) });
                            acc[0][b] += dot_chunk2(&gf, &xf);
                            acc[1][b] += dot_chunk2(&uf, &xf);
                        }
                    });
                }
            });
        }
    } else if active {
        // Odd widths and misaligned views: element by element, strided like the chunks.
        let (wg, wu) = (&w[row * cols..row * cols + cols], &w[(inter + row) * cols..(inter + row) * cols + cols]);
        let mut k = j;
        while k < cols {
            let (gk, uk) = (wg[k].to_f32(), wu[k].to_f32());
            each!(b in [0, 1, 2, 3] {
                if b < R::N && b < batch {
                    let xk = x[b * cols + k].to_f32();
                    acc[0][b] = gk.mul_add(xk, acc[0][b]);
                    acc[1][b] = uk.mul_add(xk, acc[1][b]);
                }
            });
            k += team;
        }
    }
    // Wave sums (every lane reaches them: uniform control flow), then per row in a fixed
    // order.
    let mut sums = [[0f32; 4]; 2];
    each!(h in [0, 1] {
        each!(b in [0, 1, 2, 3] {
            if b < R::N && b < batch {
                sums[h][b] = wave::sum(acc[h][b]);
            }
        });
    });
    let per_row = team / ws;
    if per_row == 1 {
        if active && wave::lane_id() == 0 {
            let (bg, bu) = if bias.is_empty() { (0.0, 0.0) } else { (bias[row].to_f32(), bias[inter + row].to_f32()) };
            each!(b in [0, 1, 2, 3] {
                if b < R::N && b < batch {
                    y[b * inter + row] = T::from_f32(silu_times(sums[0][b] + bg, sums[1][b] + bu));
                }
            });
        }
        return;
    }
    // A wave's 8 slots: the gate sums of its (up to 4) activation rows, then the up sums.
    if wave::lane_id() == 0 {
        let wave_in_group = tid / ws;
        each!(h in [0, 1] {
            each!(b in [0, 1, 2, 3] {
                if b < R::N {
                    partials[wave_in_group * 8 + h * 4 + b] = sums[h][b];
                }
            });
        });
    }
    barrier();
    // Work-item t < group * 4 finishes (row t / 4, activation row t % 4).
    let (gr, b) = (tid / 4, tid % 4);
    let out_row = block_idx_x() as usize * group + gr;
    if gr < group && b < batch && out_row < inter {
        let (mut sg, mut su) = (0.0f32, 0.0f32);
        let mut i = 0;
        while i < per_row {
            sg += partials[(gr * per_row + i) * 8 + b];
            su += partials[(gr * per_row + i) * 8 + 4 + b];
            i += 1;
        }
        let (bg, bu) = if bias.is_empty() { (0.0, 0.0) } else { (bias[out_row].to_f32(), bias[inter + out_row].to_f32()) };
        y[b * inter + out_row] = T::from_f32(silu_times(sg + bg, su + bu));
    }
}

/// [`dense_matvec`](fn@dense_matvec) for 16-bit weights on NVIDIA's matrix units
/// (`matvec_mma`): the same arguments and launch shape (`team` sets the rows per
/// work-group), any batch up to 8 in one launch, `cols` a multiple of [`CHUNK`] and `w`,
/// `x` on 16 bytes (else nothing is written; the launcher checks). A kernel of its own so
/// that its register count (and so the work-groups in flight per multiprocessor) is not
/// the element-wise path's. Where the lowering is not `mma.sync` (AMD code objects, the CPU
/// executor's other matrix units) it writes nothing: the launcher picks it on CUDA devices
/// only.
#[amdgpu_kernel(T = [f16, bf16], max_threads = 256)]
pub fn dense_matvec_mma<T: Float>(
    w: &[T],
    x: &[T],
    bias: &[T],
    y: &mut [T],
    rows: usize,
    cols: usize,
    batch: usize,
    team: usize,
    mut partials: Shared<f32, 1024>,
) {
    if cfg!(target_arch = "amdgpu") {
        return;
    }
    let threads = flat_block_dim() as usize;
    if threads != MATVEC_BLOCK as usize || !team.is_power_of_two() || team < MATVEC_MIN_TEAM || team > threads || batch == 0 || batch > 8 || wave::size() != 32 {
        return;
    }
    let fits = rows.checked_mul(cols).is_some_and(|n| n <= w.len()) && batch.checked_mul(cols).is_some_and(|n| n <= x.len()) && batch * rows <= y.len();
    let vec = cols % CHUNK == 0 && (w.as_ptr() as usize) % 16 == 0 && (x.as_ptr() as usize) % 16 == 0;
    if !fits || !vec || !(bias.is_empty() || bias.len() == rows) || core::mem::size_of::<T>() != 2 {
        return;
    }
    if mma::lowering() == Lowering::MmaSync {
        matvec_mma(w, x, bias, y, rows, cols, batch, team, &mut partials);
    }
}

/// The row prologue of the residual-norm kernels: the elements `start..end` of the
/// work-group's row (row `block_idx_x`, `cols` wide) when it lies inside every buffer of
/// `lens` (`x`, `residual`, `res_out`, `out`, ...) and `weight_len` is 0 (no scaling) or
/// `cols`; `None` (the kernel writes nothing) otherwise.
#[device]
#[inline(always)]
fn norm_row(lens: [usize; 4], weight_len: usize, cols: usize) -> Option<(usize, usize)> {
    let start = block_idx_x() as usize * cols;
    let end = start + cols;
    let inside = end <= lens[0] && end <= lens[1] && end <= lens[2] && end <= lens[3];
    if inside && (weight_len == 0 || weight_len == cols) {
        Some((start, end))
    } else {
        None
    }
}

/// Elements per work-item that [`add_rms_norm`](fn@add_rms_norm) keeps in registers: rows
/// of up to `ADD_NORM_REGS * threads` elements (8192 at 1024 work-items) take one pass over
/// memory.
pub const ADD_NORM_REGS: usize = 8;

/// Residual add and RMSNorm of one row per work-group: `h = x + residual` (rounded to `T`,
/// as Candle's add), `res_out = h`, `out = h / sqrt(mean(h^2) + eps) * weight` (in `f32`,
/// rounded once); `weight` has `cols` elements or is empty (no scaling). The sum of
/// squares is taken from the rounded `h` (what a separate norm would read). Work-item `t`
/// takes elements `t, t + threads, ...`. Where that is at most [`ADD_NORM_REGS`] elements
/// (decode's hidden sizes), every load (`x`, `residual`, `weight`) is issued before the
/// reduction and `h` stays in registers, so the kernel waits on memory once; longer rows
/// read their own `res_out` back in a second pass (no other work-item wrote them).
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn add_rms_norm<T: Float>(x: &[T], residual: &[T], weight: &[T], res_out: &mut [T], out: &mut [T], cols: u32, eps: f32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let Some((start, end)) = norm_row([x.len(), residual.len(), res_out.len(), out.len()], weight.len(), cols) else {
        return;
    };
    let (xr, rr) = (&x[start..end], &residual[start..end]);
    let mut s = 0.0f32;
    if cols <= ADD_NORM_REGS * threads {
        let (mut h, mut wv) = ([0f32; ADD_NORM_REGS], [1f32; ADD_NORM_REGS]);
        each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            let e = tid + j * threads;
            if e < cols {
                h[j] = T::from_f32(xr[e].to_f32() + rr[e].to_f32()).to_f32();
                if !weight.is_empty() {
                    wv[j] = weight[e].to_f32();
                }
            }
        });
        // The same order of accumulation as the two-pass path below.
        each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            let e = tid + j * threads;
            if e < cols {
                res_out[start + e] = T::from_f32(h[j]);
                s = h[j].mul_add(h[j], s);
            }
        });
        let ss = block_reduce(s, &mut partials, |a, b| a + b);
        let scale = (ss / cols as f32 + eps).rsqrt();
        each!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            let e = tid + j * threads;
            if e < cols {
                out[start + e] = T::from_f32(h[j] * scale * wv[j]);
            }
        });
        return;
    }
    let mut e = tid;
    while e < cols {
        let h = T::from_f32(xr[e].to_f32() + rr[e].to_f32()).to_f32();
        res_out[start + e] = T::from_f32(h);
        s = h.mul_add(h, s);
        e += threads;
    }
    let ss = block_reduce(s, &mut partials, |a, b| a + b);
    let scale = (ss / cols as f32 + eps).rsqrt();
    let mut e = tid;
    while e < cols {
        let h = res_out[start + e].to_f32();
        let wv = if weight.is_empty() { 1.0 } else { weight[e].to_f32() };
        out[start + e] = T::from_f32(h * scale * wv);
        e += threads;
    }
}

/// Most work-items of an [`add_rms_norm_tile`](fn@add_rms_norm_tile) or
/// [`add_rms_norm_q8`](fn@add_rms_norm_q8) work-group: 512, so that decode's rows of 4096
/// columns take one chunk per work-item (a decode row is one work-group, whose latency is
/// a work-item's serial work), with the registers for three [`RowTile`]s (`x`, `residual`
/// and the weights, all loaded before the reduction) in the budget of 512 work-items.
pub const ADD_NORM_TILE_THREADS: usize = 512;

/// [`add_rms_norm`](fn@add_rms_norm) for rows that fit a work-group's register tiles
/// ([`RowTile`], [`used_chunks`] chunks of 8 elements per work-item, at most
/// [`ADD_NORM_TILE_THREADS`] work-items: bf16 rows up to 16384 columns on NVIDIA, 8192 on
/// AMD; launch with [`crate::row::row_threads_for`] work-items, one row per work-group).
/// Decode's rows (1..64 of 2048 or 4096) take 256 or 512 work-items, each with 16-byte
/// loads of `x`, `residual` and `weight` all issued at once, one wave-sum and one barrier
/// for the reduction, and 16-byte stores; many small work-groups stay in flight where the
/// rows are many. The results are [`add_rms_norm`](fn@add_rms_norm)'s (the same
/// roundings; the sum of squares in another order). Rows that are not whole aligned
/// chunks (odd widths, misaligned views) take a loop over the elements instead.
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 512)]
pub fn add_rms_norm_tile<T: Float>(x: &[T], residual: &[T], weight: &[T], res_out: &mut [T], out: &mut [T], cols: u32, eps: f32, mut partials: Shared<f32, MAX_WAVES>) {
    let cols = cols as usize;
    let (part, parts) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let Some((start, end)) = norm_row([x.len(), residual.len(), res_out.len(), out.len()], weight.len(), cols) else {
        return;
    };
    let (xr, rr) = (&x[start..end], &residual[start..end]);
    let (ho, oo) = (&mut res_out[start..end], &mut out[start..end]);
    let chunks = used_chunks(core::mem::size_of::<T>(), cols, parts);
    let whole = whole_chunks(xr) && whole_chunks(rr) && whole_chunks(ho) && whole_chunks(oo) && whole_chunks(weight);
    if whole && RowTile::fits_with(cols, chunks) {
        // Every load before the reduction: past the row `x` and `residual` read as 0 (no
        // part of the sum of squares), the weights (all of an empty weight row) as 1.
        let mut h = RowTile::load_as::<T, true>(xr, 0.0, part, parts, chunks);
        let r = RowTile::load_as::<T, true>(rr, 0.0, part, parts, chunks);
        let w = RowTile::load_as::<T, true>(weight, 1.0, part, parts, chunks);
        let mut s = 0.0f32;
        crate::each_tile_chunk!(k, chunks, {
            each_lane!(j, {
                let v = T::from_f32(h.v[k][j] + r.v[k][j]).to_f32();
                h.v[k][j] = v;
                s = v.mul_add(v, s);
            });
        });
        h.store_as::<T, true>(ho, |v, _| *v);
        let ss = block_reduce(s, &mut partials, |a, b| a + b);
        let scale = (ss / cols as f32 + eps).rsqrt();
        crate::each_tile_chunk!(k, chunks, {
            let e = h.start(k);
            if e + CHUNK <= cols {
                let mut o = [0f32; CHUNK];
                each_lane!(j, {
                    o[j] = h.v[k][j] * scale * w.v[k][j];
                });
                // SAFETY: in bounds (checked); 16-byte aligned by `whole_chunks(oo)`.
                unsafe { store_full(oo, e, &o, true) };
            }
        });
        return;
    }
    let mut s = 0.0f32;
    let mut e = part;
    while e < cols {
        let h = T::from_f32(xr[e].to_f32() + rr[e].to_f32()).to_f32();
        ho[e] = T::from_f32(h);
        s = h.mul_add(h, s);
        e += parts;
    }
    let ss = block_reduce(s, &mut partials, |a, b| a + b);
    let scale = (ss / cols as f32 + eps).rsqrt();
    let mut e = part;
    while e < cols {
        let wv = if weight.is_empty() { 1.0 } else { weight[e].to_f32() };
        oo[e] = T::from_f32(ho[e].to_f32() * scale * wv);
        e += parts;
    }
}

/// `out[r, j] = SiLU(gu[r, j]) * gu[r, inter + j]` for `j < inter`: the gated MLP's
/// activation from one fused gate/up product (`gu` is `[rows, 2 * inter]`, `out`
/// `[rows, inter]`), in `f32`, rounded once. A grid-stride loop over the outputs.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn silu_mul<T: Float>(gu: &[T], out: &mut [T], inter: usize) {
    if inter == 0 || gu.len() / 2 < out.len() {
        return;
    }
    let mut i = global_idx_x();
    let step = global_size_x();
    while i < out.len() {
        let (r, j) = (i / inter, i % inter);
        let g = gu[r * 2 * inter + j].to_f32();
        let u = gu[r * 2 * inter + inter + j].to_f32();
        out[i] = T::from_f32(g / (1.0 + (-g).exp()) * u);
        i += step;
    }
}

/// The q8_1 codes of one [`CHUNK`] of 8 values `v` (the values as stored, in `f32`) whose
/// block of 32 is the chunks of this lane and of lanes `lane ^ 1`, `lane ^ 2`, `lane ^ 3`
/// (the lane's place in its group of four is the chunk's place in the block): the two
/// code words of the chunk (four codes each, the first in the low byte), and the block's
/// `d = max|v| / 127` and `d * sum(codes)`, every value as
/// [`quantize_q8_1`](fn@crate::quantized::quantize_q8_1) computes it (the maximum and the
/// integer sum do not depend on the order). Every lane of the wave calls it (shuffles).
#[device]
#[inline(always)]
pub fn q8_1_chunk(v: &[f32; CHUNK]) -> ([u32; 2], f32, f32) {
    let mut amax = 0.0f32;
    each_lane!(j, {
        amax = amax.max(v[j].abs());
    });
    amax = amax.max(wave::shuffle_xor(amax, 1));
    amax = amax.max(wave::shuffle_xor(amax, 2));
    let d = amax / 127.0;
    let (mut words, mut sum) = ([0u32; 2], 0i32);
    each_lane!(j, {
        let q = if d > 0.0 { (v[j] / d).round() as i32 } else { 0 };
        sum += q;
        words[j / 4] |= ((q as u32) & 0xff) << (8 * (j % 4));
    });
    sum += wave::shuffle_xor(sum, 1);
    sum += wave::shuffle_xor(sum, 2);
    (words, d, d * sum as f32)
}

/// Writes [`q8_1_chunk`]'s results for the chunk at element `e` (a multiple of
/// [`CHUNK`]) of the flat activations: its two words at `xq[e / 4]`, and where the chunk
/// opens its block (`e % 32 == 0`) the block's `(d, d * sum)` at `xds[e / 16]`.
///
/// # Safety
/// `e + CHUNK <= xq.len() * 4` and `e + 32 <= xds.len() * 16` where `e % 32 == 0`.
#[device]
#[inline(always)]
unsafe fn store_q8_1_chunk(xq: &mut [u32], xds: &mut [f32], e: usize, (words, d, s): ([u32; 2], f32, f32)) {
    // SAFETY: in bounds by the contract.
    unsafe {
        *xq.as_mut_ptr().add(e / 4) = words[0];
        *xq.as_mut_ptr().add(e / 4 + 1) = words[1];
        if e.is_multiple_of(32) {
            *xds.as_mut_ptr().add(e / 16) = d;
            *xds.as_mut_ptr().add(e / 16 + 1) = s;
        }
    }
}

/// [`add_rms_norm_tile`](fn@add_rms_norm_tile) that also writes `out`'s q8_1 codes
/// (`xq`: `cols / 4` words per row, `xds`: `cols / 16` floats per row, the layout and the
/// values of [`quantize_q8_1`](fn@crate::quantized::quantize_q8_1) on `out`), the input of
/// a GGUF int8 matvec, in the same pass. With `residual` empty it is a plain RMSNorm of
/// `x` (`h = x`; `res_out` may then be empty and is not written). Only whole aligned rows
/// ([`whole_chunks`] of every row and of `weight`) of a multiple of 32 columns that fit
/// the tiles, on work-groups of a multiple of 4 work-items, are written (the launcher
/// checks; anything else writes nothing). Rows of 2048 or 4096 bf16 columns run on 256 or
/// 512 work-items (one chunk each): the row's latency is its work-items' serial work.
#[amdgpu_kernel(T = [f32, f16, bf16], max_threads = 512)]
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_q8<T: Float>(
    x: &[T],
    residual: &[T],
    weight: &[T],
    res_out: &mut [T],
    out: &mut [T],
    xq: &mut [u32],
    xds: &mut [f32],
    cols: u32,
    eps: f32,
    mut partials: Shared<f32, MAX_WAVES>,
) {
    // The matvec after this one may start its weight copies (it waits for this kernel's
    // end before it reads the codes).
    kernel_dsl::grid::release_next();
    let cols = cols as usize;
    let (part, parts) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let add = !residual.is_empty();
    // Without a residual, `residual` and `res_out` are not read or written.
    let opt = |s: usize| if add { s } else { usize::MAX };
    let Some((start, end)) = norm_row([x.len(), opt(residual.len()), opt(res_out.len()), out.len()], weight.len(), cols) else {
        return;
    };
    let chunks = used_chunks(core::mem::size_of::<T>(), cols, parts);
    let codes = end <= xq.len() * 4 && end <= xds.len() * 16;
    if cols % 32 != 0 || parts % 4 != 0 || !codes || !RowTile::fits_with(cols, chunks) {
        return;
    }
    let xr = &x[start..end];
    let rr = if add { &residual[start..end] } else { &residual[0..0] };
    let whole = whole_chunks(xr) && whole_chunks(rr) && whole_chunks(&out[start..end]) && whole_chunks(weight) && (!add || whole_chunks(&res_out[start..end]));
    if !whole {
        return;
    }
    let mut h = RowTile::load_as::<T, true>(xr, 0.0, part, parts, chunks);
    let r = RowTile::load_as::<T, true>(rr, 0.0, part, parts, chunks);
    let w = RowTile::load_as::<T, true>(weight, 1.0, part, parts, chunks);
    let mut s = 0.0f32;
    crate::each_tile_chunk!(k, chunks, {
        each_lane!(j, {
            let v = if add { T::from_f32(h.v[k][j] + r.v[k][j]).to_f32() } else { h.v[k][j] };
            h.v[k][j] = v;
            s = v.mul_add(v, s);
        });
    });
    if add {
        h.store_as::<T, true>(&mut res_out[start..end], |v, _| *v);
    }
    let ss = block_reduce(s, &mut partials, |a, b| a + b);
    let scale = (ss / cols as f32 + eps).rsqrt();
    let oo = &mut out[start..end];
    crate::each_tile_chunk!(k, chunks, {
        // Uniform over the work-group: chunk slots wholly past the row (2048 columns on
        // 256 work-items) skip the shuffles. A block of 32 is all inside or all outside.
        if k * parts * CHUNK < cols {
            let e = h.start(k);
            let mut o = [0f32; CHUNK];
            each_lane!(j, {
                // The value as stored: the codes are those of `out`.
                o[j] = T::from_f32(h.v[k][j] * scale * w.v[k][j]).to_f32();
            });
            let q = q8_1_chunk(&o);
            if e + CHUNK <= cols {
                // SAFETY: in bounds (checked); 16-byte aligned by `whole_chunks(oo)`; the
                // codes of element `start + e` lie inside `xq`, `xds` (`codes`).
                unsafe {
                    store_full(oo, e, &o, true);
                    store_q8_1_chunk(xq, xds, start + e, q);
                }
            }
        }
    });
}

/// [`silu_mul`](fn@silu_mul) that also writes `out`'s q8_1 codes (`xq`, `xds`: the layout
/// and values of [`quantize_q8_1`](fn@crate::quantized::quantize_q8_1) on `out`), the
/// input of the down product's int8 matvec, in the same pass. Each lane takes a chunk of 8
/// outputs (16-byte loads of its gate and up values where `gu` starts on 16 bytes), four
/// lanes a q8_1 block; a wave-uniform loop over the chunks. `inter` a multiple of 32 and
/// the codes' lengths are checked (else nothing is written).
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn silu_mul_q8<T: Float>(gu: &[T], out: &mut [T], xq: &mut [u32], xds: &mut [f32], inter: usize) {
    kernel_dsl::grid::release_next();
    let n = out.len();
    if inter == 0 || inter % 32 != 0 || n % inter != 0 || gu.len() / 2 < n || n > xq.len() * 4 || n > xds.len() * 16 {
        return;
    }
    let (vg, vo) = (vectorizable(gu.as_ptr()), vectorizable(out.as_ptr()));
    let ws = wave::size() as usize;
    let lane = wave::lane_id() as usize;
    let waves = global_size_x() / ws;
    let chunks = n / CHUNK;
    let mut base = (global_idx_x() / ws) * ws;
    while base < chunks {
        let c = base + lane;
        let e = c * CHUNK;
        let mut o = [0f32; CHUNK];
        if c < chunks {
            let (r, j) = (e / inter, e % inter);
            // SAFETY: `r < rows` and `j + CHUNK <= inter` (`inter` is a multiple of CHUNK),
            // so both chunks lie in row `r` of `gu` (checked long enough); their offsets are
            // multiples of CHUNK (16-byte aligned where `gu` starts on 16 bytes).
            let (g, u) = unsafe { (load_full(gu, r * 2 * inter + j, vg), load_full(gu, r * 2 * inter + inter + j, vg)) };
            each_lane!(l, {
                o[l] = T::from_f32(g[l] / (1.0 + (-g[l]).exp()) * u[l]).to_f32();
            });
        }
        // Every lane (the shuffles); chunks past the end are zeros and write nothing.
        let q = q8_1_chunk(&o);
        if c < chunks {
            // SAFETY: `e + CHUNK <= n`, within `out` and the codes (checked above).
            unsafe {
                store_full(out, e, &o, vo);
                store_q8_1_chunk(xq, xds, e, q);
            }
        }
        base += waves * ws;
    }
}

/// Values of one row of [`sample`](fn@sample)'s `params` (`f32`, [`SAMPLE_PARAMS`] per row).
pub const SAMPLE_PARAMS: usize = 5;

/// The order-preserving key of a (non-NaN) `f32`: `a < b` exactly when `key(a) < key(b)`
/// (`-0` just below `+0`).
#[device]
#[inline(always)]
pub fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// [`order_key`]'s inverse.
#[device]
#[inline(always)]
pub fn from_order_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7fff_ffff } else { !k })
}

/// The Gumbel noise of token `i` under Philox key `key`: `-ln(-ln u)` with `u` the top 24
/// bits of the first word of Philox block `(i, 0, 0, 0)`, centred in `(0, 1)`.
#[device]
#[inline(always)]
pub fn gumbel(key: [u32; 2], i: u32) -> f32 {
    let r = philox4x32_10([i, 0, 0, 0], key);
    let u = ((r[0] >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0);
    -(-u.ln()).ln()
}

/// `(value, index)` of the largest value over the work-group, the smallest index among
/// equal values; every work-item gets it. Values that are NaN never win (`-inf` with
/// index `u32::MAX` is the identity). `pv`/`pi` are scratch, free again on return.
#[device]
#[inline(always)]
fn block_argmax(v: f32, i: u32, pv: &mut Shared<f32, MAX_WAVES>, pi: &mut Shared<u32, MAX_WAVES>) -> (f32, u32) {
    let better = |av: f32, ai: u32, bv: f32, bi: u32| bv > av || (bv == av && bi < ai);
    let (mut bv, mut bi) = (v, i);
    let mut off = wave::size() / 2;
    while off > 0 {
        let (ov, oi) = (wave::shuffle_xor(bv, off), wave::shuffle_xor(bi, off));
        if better(bv, bi, ov, oi) {
            (bv, bi) = (ov, oi);
        }
        off /= 2;
    }
    if wave::lane_id() == 0 {
        pv[wave::wave_id() as usize] = bv;
        pi[wave::wave_id() as usize] = bi;
    }
    barrier();
    let waves = (flat_block_dim() / wave::size()) as usize;
    let (mut rv, mut ri) = (pv[0], pi[0]);
    let mut k = 1;
    while k < waves {
        if better(rv, ri, pv[k], pi[k]) {
            (rv, ri) = (pv[k], pi[k]);
        }
        k += 1;
    }
    barrier();
    (rv, ri)
}

/// Sum over the work-group of `f(z)` for this work-item's elements `z` of `row`
/// (`tid, tid + threads, ...`) with `key(z) >= at`; NaN elements are skipped.
#[device]
#[inline(always)]
fn masked_sum(row: &[f32], at: u32, partials: &mut Shared<f32, MAX_WAVES>, f: impl Fn(f32) -> f32) -> f32 {
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let mut s = 0.0f32;
    let mut i = tid;
    while i < row.len() {
        let z = row[i];
        if z == z && order_key(z) >= at {
            s += f(z);
        }
        i += threads;
    }
    block_reduce(s, partials, |a, b| a + b)
}

/// One token per row of `logits` (`[rows, vocab]`) into `out[row]`, each row by one
/// work-group. `params[row]` holds [`SAMPLE_PARAMS`] values: temperature, top-k (an
/// integer; 0: off), top-p (1: off), min-p (0: off), repetition penalty (1: off).
/// `penalized` is `[rows, n_pen]` token ids (ids `>= vocab` are padding; repeats count
/// once); `keys` is `[rows, 2]`, the row's Philox key (for instance a request's seed and
/// its step). `work` is `[rows, vocab]` `f32` scratch.
///
/// 1. `z = logit` with the repetition penalty on the penalized ids (`z / p` where
///    positive, `z * p` otherwise, as Hugging Face's processor), divided by the
///    temperature (a temperature of 0 or less: greedy, `out` = the first largest `z`).
/// 2. Filters, in Hugging Face's order, each a threshold on `z` (ties at a threshold are
///    all kept): top-k keeps `z >=` the k-th largest; top-p keeps the fewest largest values
///    whose probability (softmax over what top-k kept) reaches `top_p`; min-p keeps
///    probabilities `>= min_p` times the largest. Thresholds are found by bisection over
///    the ordered bit patterns of `z` (exact: 32 rounds of counts or sums).
/// 3. The token: the kept `i` with the largest `z_i + g_i`, `g_i` Gumbel noise from
///    Philox4x32-10 keyed by the row's key ([`gumbel`]): a draw from the softmax of the
///    kept `z` (the Gumbel-max trick), the same for a given key whatever the launch shape.
///
/// NaN logits are never picked; a row of only NaN gives `u32::MAX`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn sample<T: Float>(
    logits: &[T],
    params: &[f32],
    penalized: &[u32],
    keys: &[u32],
    out: &mut [u32],
    work: &mut [f32],
    vocab: u32,
    n_pen: u32,
    mut partials: Shared<f32, MAX_WAVES>,
    mut indices: Shared<u32, MAX_WAVES>,
) {
    let (v, np) = (vocab as usize, n_pen as usize);
    let row = block_idx_x() as usize;
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    if v == 0 || (row + 1) * v > logits.len() || (row + 1) * v > work.len() || row >= out.len() || (row + 1) * SAMPLE_PARAMS > params.len() || (row + 1) * np > penalized.len() || (row + 1) * 2 > keys.len() {
        return;
    }
    let p = &params[row * SAMPLE_PARAMS..(row + 1) * SAMPLE_PARAMS];
    let (temp, top_k, top_p, min_p, penalty) = (p[0], p[1], p[2], p[3], p[4]);
    let inv_t = if temp > 0.0 { 1.0 / temp } else { 1.0 };
    let lrow = &logits[row * v..(row + 1) * v];
    // 1. z into the scratch row: everything, then the penalized ids again from their logits
    // (so a repeated id is penalized once; equal writes from several work-items).
    let mut i = tid;
    while i < v {
        work[row * v + i] = lrow[i].to_f32() * inv_t;
        i += threads;
    }
    barrier_global();
    if penalty != 1.0 {
        let mut k = tid;
        while k < np {
            let id = penalized[row * np + k] as usize;
            if id < v {
                let l = lrow[id].to_f32();
                work[row * v + id] = (if l > 0.0 { l / penalty } else { l * penalty }) * inv_t;
            }
            k += threads;
        }
    }
    barrier_global();
    let z = &work[row * v..(row + 1) * v];
    let (mut best, mut best_i) = (f32::NEG_INFINITY, u32::MAX);
    let mut i = tid;
    while i < v {
        if z[i] > best || (best_i == u32::MAX && z[i] == f32::NEG_INFINITY) {
            (best, best_i) = (z[i], i as u32);
        }
        i += threads;
    }
    let (zmax, arg) = block_argmax(best, best_i, &mut partials, &mut indices);
    if temp <= 0.0 || arg == u32::MAX || zmax == f32::INFINITY {
        // Greedy, or nothing to draw from (all NaN), or an infinite logit (it takes all the
        // probability).
        if tid == 0 {
            out[row] = arg;
        }
        return;
    }
    // 2. The threshold key: every non-NaN z at first.
    let mut lo = 0u32;
    let kk = if top_k >= 1.0 { top_k as usize } else { 0 };
    if kk > 0 && kk < v {
        // The largest key with at least k elements at or above it.
        let (mut a, mut b) = (lo, order_key(zmax));
        while a < b {
            let mid = a + (b - a) / 2 + 1;
            let count = masked_sum(z, mid, &mut partials, |_| 1.0);
            if count >= kk as f32 {
                a = mid;
            } else {
                b = mid - 1;
            }
        }
        lo = a;
    }
    if top_p < 1.0 && top_p > 0.0 {
        let mass = |at: u32, partials: &mut Shared<f32, MAX_WAVES>| masked_sum(z, at, partials, |x| (x - zmax).exp());
        let target = top_p * mass(lo, &mut partials);
        // The largest key whose mass at or above it reaches the target.
        let (mut a, mut b) = (lo, order_key(zmax));
        while a < b {
            let mid = a + (b - a) / 2 + 1;
            if mass(mid, &mut partials) >= target {
                a = mid;
            } else {
                b = mid - 1;
            }
        }
        lo = a;
    }
    if min_p > 0.0 {
        let t = order_key(zmax + min_p.ln());
        if t > lo {
            lo = if t > order_key(zmax) { order_key(zmax) } else { t };
        }
    }
    // 3. Gumbel-max over the kept tokens.
    let key = [keys[row * 2], keys[row * 2 + 1]];
    let (mut best, mut best_i) = (f32::NEG_INFINITY, u32::MAX);
    let mut i = tid;
    while i < v {
        let zi = z[i];
        if zi == zi && order_key(zi) >= lo {
            let s = zi + gumbel(key, i as u32);
            if best_i == u32::MAX || s > best {
                (best, best_i) = (s, i as u32);
            }
        }
        i += threads;
    }
    let (_, pick) = block_argmax(best, best_i, &mut partials, &mut indices);
    if tid == 0 {
        out[row] = pick;
    }
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops;
