//! Flash-attention prefill forward: `O = softmax(Q K^T * scale + mask) V` with the online
//! softmax, never materialising the score matrix, plus the log-sum-exp of every row.
//!
//! One source for every matrix unit: the products go through `kernel_dsl::mma` fragments
//! (MFMA on CDNA, WMMA on RDNA3 and RDNA4, `mma.sync` on NVIDIA sm_80+, the VALU fallback
//! on gfx10 and older NVIDIA), so the CPU executor runs every lowering's lane layout.
//!
//! # Layout
//! `q [batch, seq_q, heads, D]`, `k`/`v [batch, seq_k, kv_heads, D]` (candle-flash-attn's
//! layout), `out` like `q`, `lse [batch, heads, seq_q]` (f32, natural log). Variable-length
//! batches ([`host::flash_attn_varlen`]) pack the sequences one after another:
//! `q [total_q, heads, D]`, `k`/`v [total_k, kv_heads, D]`, sequence `b` at rows
//! `cu_q[b]..cu_q[b + 1]`, and `lse [heads, total_q]`.
//!
//! # Work decomposition
//! A work-group of [`WAVES`] waves takes [`block_rows`] query rows of one (sequence, head)
//! and one chunk of value columns; each wave owns [`row_tiles`] x 16 of the rows (on
//! `mma.sync` up to hd128 two row tiles, 128 rows per work-group, so that every K and V
//! fragment read from shared memory feeds two products; one row tile, [`BM`] = 64 rows,
//! elsewhere). The Q tile is staged once in shared memory; key/value tiles of
//! [`prefill_bn`] keys (64 on `mma.sync` up to hd128, 32 elsewhere) stream through
//! shared memory in 16-byte copies ([`copy_tile`]). On NVIDIA sm_80+ the copies are
//! `cp.async` into [`stages`] = 2 K buffers and one V buffer: tile t's values load during
//! its `S = Q K^T` and softmax, tile t + 1's keys during all of tile t; elsewhere tile t's
//! keys and values are copied synchronously into one buffer each. K keeps its row-major
//! `[key][dim]` layout there; `K^T` is read from it by [`load_keys_b`] (`ldmatrix` on
//! NVIDIA, as are Q and V). Per key tile each wave computes `S = Q K^T` (`D / 16 x bn /
//! 16` products per row tile), masks and scales it (tiles that need no mask or modifier
//! only fold the scale into the exponent, [`Score::plain`]; on `mma.sync` tiles that only
//! mask select `-inf`, [`Score::masked_plain`]; each kind is its own copy of the tile
//! step), updates its running row maxima and sums, rescales its output accumulator (on
//! `mma.sync` only when a row maximum moved) and adds `P V` with `P` converted from the
//! accumulator to an A operand in registers ([`FragC::to_a`]). Scores live in the log2
//! domain (`exp2`). Key tiles wholly outside a work-group's causal/sliding window are not
//! visited; query blocks run last first (the causal blocks with the most keys start first).
//!
//! The value columns a work-group accumulates are capped per lowering
//! ([`value_chunk`]: up to 128 on MFMA and `mma.sync`, 32 on WMMA, 16 on the VALU) so that the
//! output accumulator fits the AMD register budget without spills; wider heads are split
//! into chunks along grid y, each work-group recomputing `S` for its chunk (hd256 on
//! MFMA/`mma.sync`: two chunks). Shared memory per work-group: [`smem_elems`] 16-bit
//! elements (Q tile, the K buffers, the V buffer; see `attention/README.md` for the
//! figures).
//!
//! # Masks and options
//! With `off = seq_k - seq_q` (per sequence), query row `i` sees key `j` when `j < seq_k`,
//! `j >= i + off - window_left` (if `window_left >= 0`) and `j <= i + off + window_right`
//! (if `window_right >= 0`): causal is `window_right = 0`, aligned to the bottom right as
//! in Candle and FlashAttention. Scores are `x = scale * q.k`, then
//! `softcap * tanh(x / softcap)` when `softcap > 0`, then minus `slope * |i + off - j|`
//! with an ALiBi slope per head. A row that sees no key gets zeros and `lse = -inf`.
use kernel_dsl::each;
use kernel_dsl::math::exp2_approx;
use kernel_dsl::mma::{self, copy, FragA, FragB, FragC, Lowering, MmaFloat, SharedAddr};
use kernel_dsl::prelude::*;

/// A head dimension, as a type (kernels take no const generics): [`Hd64`], [`Hd80`],
/// [`Hd96`], [`Hd128`], [`Hd256`].
pub trait HeadDim: 'static {
    /// The dimension.
    const D: usize;
}

macro_rules! head_dims {
    ($($name:ident = $d:literal),* $(,)?) => {$(
        #[doc = concat!("Head dimension ", stringify!($d), ".")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name;
        impl HeadDim for $name {
            const D: usize = $d;
        }
    )*};
}
head_dims!(Hd64 = 64, Hd80 = 80, Hd96 = 96, Hd128 = 128, Hd256 = 256);

/// The head dimensions the kernels are built for.
pub const HEAD_DIMS: [usize; 5] = [64, 80, 96, 128, 256];

/// Waves per work-group (each owns [`row_tiles`] x 16 query rows).
pub const WAVES: usize = 4;
/// Query rows per work-group of one row tile per wave ([`block_rows`] is this or twice it).
pub const BM: usize = 16 * WAVES;
/// Keys per streamed K/V tile of the decode kernel, and of the prefill kernel except on
/// `MmaSync` ([`prefill_bn`]).
pub const BN: usize = 32;

/// Keys per prefill K/V tile for head dimension `d`: 64 on `MmaSync` up to hd128 (the
/// per-tile work besides the products, the output rescale, row reductions, barriers and
/// copy issue, then covers twice the keys; its 255 registers hold the wider score tile),
/// [`BN`] elsewhere (the AMD register budgets) and for hd256 (two 64-key stages would need
/// 133 KiB of shared memory, more than sm_86/sm_89 give a work-group).
pub const fn prefill_bn(d: usize, low: Lowering) -> usize {
    match low {
        Lowering::MmaSync if d <= 128 => 64,
        _ => BN,
    }
}
/// Shared-memory row padding in elements (rows stay 16-byte aligned, banks shift).
pub const PAD: usize = 8;
/// Most value columns one work-group accumulates.
pub const MAX_DV: usize = 128;
/// Most 16-column output fragments per wave.
const MAX_OF: usize = MAX_DV / 16;

/// Value columns per work-group for head dimension `d` on a lowering: the largest
/// multiple of 16 that divides `d` and is at most the lowering's cap. The output
/// accumulator (`chunk / 16` fragments per wave) must leave room for the rest within the
/// AMD register budget, which is that of 1024-item work-groups (rustc cannot lower it):
/// 128 VGPRs on gfx10 and 192 on gfx11, where the `Valu` and `Wmma` fragments also hold
/// twice the items of `Mfma`'s and the VALU's emulated products need registers of their
/// own: cap 32 on `Wmma` and `Wmma12` (gfx12), 16 on `Valu` (gfx10);
/// `Mfma` (4 accumulator items per lane) and `MmaSync` (255 registers at 256 threads)
/// cap at 128.
pub const fn value_chunk(d: usize, low: Lowering) -> usize {
    let most = match low {
        Lowering::Mfma | Lowering::MmaSync => MAX_DV,
        Lowering::Wmma | Lowering::Wmma12 => 32,
        Lowering::Valu => 16,
    };
    let mut c = if d < most { d } else { most };
    while c > 16 && !d.is_multiple_of(c) {
        c -= 16;
    }
    c
}

/// Work-groups along the value columns (grid y is `heads` times this).
pub const fn value_chunks(d: usize, low: Lowering) -> usize {
    d / value_chunk(d, low)
}

/// Shared-memory buffers of the K/V tiles: two on `MmaSync` (`cp.async` fills the next
/// tile while the waves work on the current one; the prefill kernel double-buffers only K,
/// see [`smem_elems`]), one elsewhere (the copies are synchronous on AMD and the CPU
/// executor, so a second buffer would only cost LDS).
pub const fn stages(low: Lowering) -> usize {
    match low {
        Lowering::MmaSync => 2,
        _ => 1,
    }
}

/// Shared-memory elements of one K/V stage of `bn` keys: the K tile (`bn x (d + PAD)`,
/// keys as rows) and the V tile (`bn x (chunk + PAD)`).
pub const fn stage_elems(d: usize, bn: usize, low: Lowering) -> usize {
    bn * (d + PAD) + bn * (value_chunk(d, low) + PAD)
}

/// Row tiles of 16 query rows per wave in the prefill kernel: two on `MmaSync` up to
/// hd128, where every K and V fragment read from shared memory then feeds two products
/// (half the `ldmatrix` and copy-issue work per product; the 128 output and 64 score
/// accumulators fit its 255 registers), one elsewhere (the AMD register budgets; hd256,
/// whose 128-row Q tile would not leave room for the K/V tiles in the 99 KiB of sm_86/sm_89).
/// Two exactly where [`prefill_bn`] is 64.
pub const fn row_tiles(d: usize, low: Lowering) -> usize {
    match low {
        Lowering::MmaSync if d <= 128 => 2,
        _ => 1,
    }
}

/// Query rows per prefill work-group: [`WAVES`] waves of [`row_tiles`] x 16 rows ([`BM`] or
/// twice that).
pub const fn block_rows(d: usize, low: Lowering) -> usize {
    16 * WAVES * row_tiles(d, low)
}

/// Shared-memory elements of a prefill work-group of `rows` query rows: the Q tile
/// (`rows x (d + PAD)`), [`stages`] K tiles of [`prefill_bn`] keys (`bn x (d + PAD)`) and one
/// V tile (`bn x (chunk + PAD)`). hd128 on `MmaSync`: 85 KiB (128 rows, 64 keys).
pub const fn smem_elems(d: usize, rows: usize, low: Lowering) -> usize {
    let bn = prefill_bn(d, low);
    rows * (d + PAD) + stages(low) * bn * (d + PAD) + bn * (value_chunk(d, low) + PAD)
}

/// The B operand (k = head dimension, column = key) of the 16 keys whose rows start at
/// `base` in shared memory (row-major `[key][dim]`, row stride `ld`): `K^T` without
/// storing K transposed. On `MmaSync` (and the VALU lowering, which shares its layout)
/// B item `j` is A item `j` with index bits 1 and 2 swapped (A holds (row g + 8b, k 2t +
/// a + 8c), B (k 2t + a + 8b, column g + 8c) for `j = 4c + 2b + a`), so the tile loads as
/// an A fragment: one `ldmatrix.x4` (not `.trans`). Elsewhere element loads. (The prefill
/// loop on NVIDIA and the CPU executor reads K with [`FragB::load_shared_cols_at`]
/// instead, whose `ldmatrix` yields the registers in B order.)
///
/// # Safety
/// The 16 x 16 tile at `base` is readable shared memory; rows 16-byte aligned.
#[inline(always)]
pub unsafe fn load_keys_b<T: MmaFloat>(base: *const T, ld: usize) -> FragB<T> {
    match mma::lowering() {
        Lowering::MmaSync | Lowering::Valu => {
            // SAFETY: the caller's contract.
            let a = unsafe { FragA::<T>::load_shared(base, ld) };
            // Indices modulo the array length: constants on every target, in bounds where
            // the fragments hold 4 items (MFMA, where this arm never runs).
            let mut v = a.v;
            let n = v.len();
            v[2 % n] = a.v[4 % n];
            v[3 % n] = a.v[5 % n];
            v[4 % n] = a.v[2 % n];
            v[5 % n] = a.v[3 % n];
            FragB { v }
        }
        // SAFETY: the caller's contract.
        _ => FragB::from_fn(|k, c| unsafe { *base.add(c * ld + k) }),
    }
}

/// Compiling for AMD GPUs: the copies and fragment loads keep their plain per-row and
/// per-load address arithmetic there (unrolled copy rounds and per-tile shared bases
/// measured register spills on gfx90a-gfx950 and gfx11 with their register budgets);
/// NVIDIA and the CPU executor take the strided forms.
const AMD: bool = cfg!(target_arch = "amdgpu");

/// Issues the 16-byte copies of `rows` rows of `cols` elements (a multiple of 8) from
/// global memory into shared memory at `dst` (row stride `ld` elements), work-item `tid`
/// of `nthreads` taking every `nthreads`-th chunk; `src_row(j)` is row `j`'s source and
/// whether it is valid (an invalid row is filled with zeros and its source not read).
/// `cp.async` on NVIDIA sm_80+ (the caller commits and waits), synchronous elsewhere.
///
/// # Safety
/// Every row's source is 16-byte aligned global memory, and a valid row's has `cols`
/// readable elements; `dst` has `rows` rows of `ld` 16-bit elements (16-byte aligned)
/// in shared memory.
#[inline(always)]
pub unsafe fn copy_rows<T>(dst: SharedAddr, ld: usize, rows: usize, cols: usize, tid: usize, nthreads: usize, src_row: impl Fn(usize) -> (*const T, bool)) {
    let per_row = cols / 8;
    let size = core::mem::size_of::<T>();
    // One chunk: with asynchronous copies an invalid row is the same `cp.async` with a
    // source size of 0 (no branch); elsewhere a whole copy or a zero fill.
    let chunk = |j: usize, c: usize| {
        let at = dst.add((j * ld + c * 8) * size);
        let (p, valid) = src_row(j);
        if copy::is_async() {
            // SAFETY: the caller's contract (an invalid row's source is not read).
            unsafe { copy::copy_16_at(at, p.wrapping_add(if valid { c * 8 } else { 0 }) as *const u8, if valid { 16 } else { 0 }) };
        } else if valid {
            // SAFETY: the caller's contract.
            unsafe { copy::copy_16_whole_at(at, p.wrapping_add(c * 8) as *const u8) };
        } else {
            // SAFETY: the caller's contract (nothing is read).
            unsafe { copy::copy_16_at(at, p as *const u8, 0) };
        }
    };
    if !AMD && nthreads.is_multiple_of(per_row) && (rows * per_row).is_multiple_of(nthreads) && tid < nthreads {
        // Whole rows per round and whole rounds (the usual tiles): every work-item copies
        // the same column chunk of rows `tid / per_row + i * nthreads / per_row`, a loop
        // of constant trip count where `nthreads` is a constant (GPU targets).
        let (j0, c, step) = (tid / per_row, tid % per_row, nthreads / per_row);
        let mut i = 0;
        while i < rows * per_row / nthreads {
            chunk(j0 + i * step, c);
            i += 1;
        }
    } else {
        let mut e = tid;
        while e < rows * per_row {
            chunk(e / per_row, e % per_row);
            e += nthreads;
        }
    }
}

/// Issues the 16-byte copies of a tile of `rows` rows of `cols` elements (a multiple of 8)
/// whose row `j` starts at `src + j * stride` in global memory, into shared memory at `dst`
/// (row stride `ld` elements); rows `valid..rows` are filled with zeros and their sources
/// not read. Work-item `tid` of `nthreads` takes every `nthreads`-th chunk, as in
/// [`copy_rows`]; where whole rows make whole rounds (the usual tiles) each work-item
/// steps one pointer and one shared address by constant strides instead of computing
/// every row's address.
///
/// # Safety
/// `src` and `stride` keep rows 16-byte aligned, rows below `valid` have `cols` readable
/// elements; `dst` has `rows` rows of `ld` 16-bit elements (16-byte aligned) in shared
/// memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn copy_tile<T>(dst: SharedAddr, ld: usize, rows: usize, cols: usize, tid: usize, nthreads: usize, src: *const T, stride: usize, valid: usize) {
    let per_row = cols / 8;
    let size = core::mem::size_of::<T>();
    if !AMD && nthreads.is_multiple_of(per_row) && (rows * per_row).is_multiple_of(nthreads) && tid < nthreads {
        let (j0, c, step) = (tid / per_row, tid % per_row, nthreads / per_row);
        let mut at = dst.add((j0 * ld + c * 8) * size);
        let mut p = src.wrapping_add(j0 * stride + c * 8);
        let rounds = rows * per_row / nthreads;
        if valid >= rows {
            // A whole tile (every tile but a sequence's last): no row checks (the loop
            // unrolls, a constant count on GPUs; the shared addresses fold into immediates).
            let mut i = 0;
            while i < rounds {
                // SAFETY: the caller's contract.
                unsafe { copy::copy_16_whole_at(at, p as *const u8) };
                at = at.add(step * ld * size);
                p = p.wrapping_add(step * stride);
                i += 1;
            }
            return;
        }
        // Row indices are below `rows` (a tile): 32-bit compares.
        let (mut j, valid) = (j0 as u32, if valid < rows { valid as u32 } else { rows as u32 });
        let mut i = 0;
        while i < rounds {
            let ok = j < valid;
            if copy::is_async() {
                // SAFETY: the caller's contract (an invalid row's source is not read: size 0).
                unsafe { copy::copy_16_at(at, (if ok { p } else { src }) as *const u8, if ok { 16 } else { 0 }) };
            } else if ok {
                // SAFETY: the caller's contract.
                unsafe { copy::copy_16_whole_at(at, p as *const u8) };
            } else {
                // SAFETY: the caller's contract (nothing is read).
                unsafe { copy::copy_16_at(at, src as *const u8, 0) };
            }
            at = at.add(step * ld * size);
            p = p.wrapping_add(step * stride);
            j += step as u32;
            i += 1;
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe {
            copy_rows::<T>(dst, ld, rows, cols, tid, nthreads, |j| {
                let ok = j < valid;
                (if ok { src.wrapping_add(j * stride) } else { src }, ok)
            })
        };
    }
}

/// Runs `$body` with `$j` = 0, 1, .. `$len - 1` (at most 8: the accumulator items of a
/// lane) as straight-line code, so the fragments' items are indexed by constants and stay
/// in registers (a loop over them was not unrolled for NVPTX, which put the whole state
/// in local memory). On the host a plain loop (the unrolled form makes unoptimised test
/// builds' frames overflow the CPU executor's work-item stacks).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
macro_rules! each_item {
    ($j:ident < $len:expr, $body:block) => {
        for $j in 0..$len $body
    };
}
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
macro_rules! each_item {
    ($j:ident < $len:expr, $body:block) => {{
        let len = $len;
        each_item!(@ $j, len, $body, 0 1 2 3 4 5 6 7)
    }};
    (@ $j:ident, $len:ident, $body:block, $($n:literal)*) => {{
        $(if $n < $len {
            let $j = $n % $len;
            $body
        })*
    }};
}

/// Turns a raw score `x = q.k` of row `r` of a wave's 16 and key `jt` of the tile into
/// its log2-domain softmax input, or `-inf` for a masked key. A trait with an
/// always-inlined method rather than a closure: a closure called at every accumulator item
/// was left out of line on some targets (a call with its captures on the scratch stack).
pub trait Score {
    /// The softmax input of `x` at row `r`, tile key `jt`.
    fn score(&self, r: usize, jt: usize, x: f32) -> f32;
    /// `Some(c)` when every score of the tile is `c * x` with `c > 0` (no key masked, no
    /// modifier), for all the wave's rows: the tile then skips [`score`](Self::score) and
    /// folds `c` into the exponent (`exp2(c x - m)`). Must be wave-uniform. The prefill
    /// and decode scores answer `None` except on `MmaSync` (AMD SGPR budgets).
    fn plain(&self) -> Option<f32>;
    /// `Some(c)` when every score of the tile is `c * x` with `c > 0` where the key is
    /// [`seen`](Self::seen) and `-inf` elsewhere (a mask, no modifier): the tile then masks
    /// without [`score`](Self::score) and folds `c` into the exponent. Must be
    /// wave-uniform. `None` by default.
    fn masked_plain(&self) -> Option<f32> {
        None
    }
    /// Whether row `r` sees tile key `jt` (asked only where
    /// [`masked_plain`](Self::masked_plain) is `Some`).
    fn seen(&self, _r: usize, _jt: usize) -> bool {
        true
    }
}

/// The prefill scores: scale, soft-cap, ALiBi, causal/sliding-window mask.
#[derive(Clone, Copy)]
pub struct PrefillScore {
    /// Query index (in its sequence) of the wave's row 0, plus the diagonal offset.
    pub diag0: i32,
    /// Query rows of the wave (16 per row tile).
    pub rows: i32,
    /// Key index of the tile's key 0.
    pub k0: i32,
    /// Keys of the tile.
    pub bn: i32,
    /// Keys of the sequence.
    pub len_k: i32,
    /// Left window (negative: unbounded).
    pub window_left: i32,
    /// Right window (negative: unbounded).
    pub window_right: i32,
    /// Softmax scale.
    pub scale: f32,
    /// Soft cap (`<= 0`: none) and its inverse.
    pub softcap: f32,
    /// `1 / softcap`.
    pub inv_cap: f32,
    /// ALiBi slope (0: none).
    pub slope: f32,
}

impl Score for PrefillScore {
    #[inline(always)]
    fn plain(&self) -> Option<f32> {
        // AMD keeps the per-item path: the extra uniform values of this test took gfx90a's
        // hd256 instance past its 100 SGPRs (3 spills).
        if mma::lowering() != Lowering::MmaSync {
            return None;
        }
        // The wave's rows see keys diag0 + r - left ..= diag0 + r + right, r in 0..rows.
        let inside = self.k0 + self.bn <= self.len_k
            && (self.window_left < 0 || self.k0 >= self.diag0 + self.rows - 1 - self.window_left)
            && (self.window_right < 0 || self.k0 + self.bn - 1 <= self.diag0 + self.window_right);
        if inside && self.softcap <= 0.0 && self.slope == 0.0 && self.scale > 0.0 {
            Some(self.scale * core::f32::consts::LOG2_E)
        } else {
            None
        }
    }
    #[inline(always)]
    fn masked_plain(&self) -> Option<f32> {
        // As `plain`: `MmaSync` only.
        if mma::lowering() == Lowering::MmaSync && self.softcap <= 0.0 && self.slope == 0.0 && self.scale > 0.0 {
            Some(self.scale * core::f32::consts::LOG2_E)
        } else {
            None
        }
    }
    #[inline(always)]
    fn seen(&self, r: usize, jt: usize) -> bool {
        let diag = self.diag0 + r as i32;
        let j = self.k0 + jt as i32;
        j < self.len_k && (self.window_left < 0 || j >= diag - self.window_left) && (self.window_right < 0 || j <= diag + self.window_right)
    }
    #[inline(always)]
    fn score(&self, r: usize, jt: usize, x: f32) -> f32 {
        let diag = self.diag0 + r as i32;
        let j = self.k0 + jt as i32;
        let seen = j < self.len_k
            && (self.window_left < 0 || j >= diag - self.window_left)
            && (self.window_right < 0 || j <= diag + self.window_right);
        if seen {
            let mut y = x * self.scale;
            if self.softcap > 0.0 {
                y = self.softcap * (y * self.inv_cap).tanh();
            }
            if self.slope != 0.0 {
                y -= self.slope * (diag - j).abs() as f32;
            }
            y * core::f32::consts::LOG2_E
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// The first accumulator item of this lane in the same row as item `j` (`j` itself when
/// no earlier item shares its row): on `MmaSync` and the VALU lowering items 0, 1, 4, 5
/// hold row `g` and 2, 3, 6, 7 row `g + 8`; the AMD layouts give each item of a lane its
/// own row.
#[inline(always)]
fn row_first(j: usize) -> usize {
    match mma::lowering() {
        Lowering::MmaSync | Lowering::Valu => j & 2,
        _ => j,
    }
}

/// The running online-softmax state of one wave's 16 query rows: the output accumulator
/// (`chunk / 16` fragments of 16 value columns), the row maxima (log2 units) and the row
/// sums, item by item in the accumulator layout (every item holds its row's values).
#[derive(Clone, Copy)]
pub struct RowState {
    /// Unnormalised output, 16 value columns per fragment.
    pub o: [FragC<f32>; MAX_OF],
    /// Row maxima of the scores seen (log2 units; `-inf` before any key).
    pub m: FragC<f32>,
    /// Row sums of `exp2(score - m)`.
    pub l: FragC<f32>,
}

impl RowState {
    /// Nothing seen yet.
    #[inline(always)]
    pub fn new() -> Self {
        let mut m = FragC::<f32>::zero();
        each_item!(j < m.v.len(), {
            m.v[j] = f32::NEG_INFINITY;
        });
        RowState { o: [FragC::<f32>::zero(); MAX_OF], m, l: FragC::<f32>::zero() }
    }

    /// Adds one key tile of `16 NK` keys (a wave operation) to the wave's 16 query rows:
    /// [`add_tile_rows`] with one row tile.
    ///
    /// # Safety
    /// As [`add_tile_rows`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn add_tile<T: MmaFloat, const NK: usize>(
        &mut self,
        q: *const T,
        ldq: usize,
        kt: *const T,
        ldk: usize,
        v: *const T,
        ldv: usize,
        d: usize,
        nof: usize,
        score: &impl Score,
    ) {
        // SAFETY: the caller's contract.
        unsafe { add_tile_rows::<T, NK, 1>(core::array::from_mut(self), q, ldq, kt, ldk, v, ldv, d, nof, score, &|| {}) }
    }

    /// The online-softmax step of one key tile for these 16 rows: `s` holds the tile's
    /// scores (`exp2` inputs once multiplied by `c`); afterwards it holds the
    /// probabilities, and the maxima, sums and output are rescaled to the new maxima.
    /// A row that has seen no key keeps max -inf and uses 0 as its reference, so every
    /// exp2 is of -inf: zeros, never NaN.
    #[inline(always)]
    fn softmax<const NK: usize>(&mut self, s: &mut [FragC<f32>; NK], c: f32, nof: usize) {
        let mut tmax = s[0];
        each!(nf in [1, 2, 3] {
            if nf < NK {
                each_item!(j < tmax.v.len(), {
                    tmax.v[j] = tmax.v[j].max(s[nf].v[j]);
                });
            }
        });
        let tmax = tmax.row_max();
        // The row state once per row a lane holds: an item whose row an earlier item of the
        // lane shares ([`row_first`]) copies that item's values (on `MmaSync` 2 rows per
        // lane, not 8 items; the copies keep the state's items equal, so the compiler
        // merges them).
        let mut alpha = FragC::<f32>::zero();
        let mut mu = FragC::<f32>::zero();
        // Whether no maximum of the lane's rows moved (then every alpha is exp2(0) = 1, or 0
        // for a row that has seen nothing, whose output is still 0).
        let mut same = true;
        each_item!(j < self.m.v.len(), {
            let first = row_first(j);
            if first == j {
                let mn = self.m.v[j].max(tmax.v[j] * c);
                same &= mn == self.m.v[j] || mn == f32::NEG_INFINITY;
                mu.v[j] = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
                alpha.v[j] = exp2_approx(self.m.v[j] - mu.v[j]);
                self.m.v[j] = mn;
            } else {
                mu.v[j] = mu.v[first];
                alpha.v[j] = alpha.v[first];
                self.m.v[j] = self.m.v[first];
            }
            // One fused multiply-add per score (`c x - mu`).
            each!(nf in [0, 1, 2, 3] {
                if nf < NK {
                    s[nf].v[j] = exp2_approx(FloatMath::mul_add(s[nf].v[j], c, -mu.v[j]));
                }
            });
        });
        let mut psum = s[0];
        each!(nf in [1, 2, 3] {
            if nf < NK {
                each_item!(j < psum.v.len(), {
                    psum.v[j] += s[nf].v[j];
                });
            }
        });
        let psum = psum.row_sum();
        each_item!(j < self.l.v.len(), {
            let first = row_first(j);
            self.l.v[j] = if first == j { self.l.v[j] * alpha.v[j] + psum.v[j] } else { self.l.v[first] };
        });
        // On `MmaSync` the wave skips the output rescale (2 multiplies per value column and
        // row) when no row's maximum moved, as in most tiles after the first few (one vote);
        // the AMD targets keep the straight-line form (their scalar register budgets).
        if mma::lowering() == Lowering::MmaSync && wave::all(same) {
            return;
        }
        each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
            if of < nof {
                each_item!(j < self.o[of].v.len(), {
                    self.o[of].v[j] *= alpha.v[j];
                });
            }
        });
    }

    /// Divides the output by the row sums (zero rows where nothing was seen) and returns
    /// the natural log-sum-exp of each row (`-inf` where nothing was seen).
    #[inline(always)]
    pub fn finish(&mut self, nof: usize) -> FragC<f32> {
        let mut lse = FragC::<f32>::zero();
        each_item!(j < self.l.v.len(), {
            let seen = self.l.v[j] > 0.0;
            let inv = if seen { 1.0 / self.l.v[j] } else { 0.0 };
            lse.v[j] = if seen { (self.m.v[j] + self.l.v[j].log2()) * core::f32::consts::LN_2 } else { f32::NEG_INFINITY };
            each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
                if of < nof {
                    self.o[of].v[j] *= inv;
                }
            });
        });
        lse
    }
}

impl Default for RowState {
    fn default() -> Self {
        Self::new()
    }
}

/// Adds one key tile of `16 NK` keys (a wave operation) to the `16 MT` query rows of a wave
/// (`MT` row tiles of 16, `st[mt]` the state of rows `16 mt .. 16 mt + 16`): `S = Q K^T`
/// from the rows at `q` (row stride `ldq`, `d` columns) and the keys at `kt` (`16 NK` rows
/// of stride `ldk`, `d` columns; read as `K^T`), each score through [`Score::score`] (row
/// of the wave's `16 MT`, the key's index in the tile, raw score) unless the tile is
/// [`Score::plain`], then the online-softmax update, `before_pv()` (a work-group
/// operation: the prefill kernel waits there for the V tile; once per call, twice where WMMA
/// splits the tile) and `O += P V` with the values at `v` (`16 NK` rows of stride `ldv`,
/// `nof * 16` columns). Each K and V fragment read from
/// shared memory feeds `MT` products (two row tiles on `MmaSync` halve the `ldmatrix`
/// per product). Fully masked rows stay at max `-inf`, sum 0, output 0.
///
/// # Safety
/// The three tiles lie in shared memory as described, rows 16-byte aligned.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn add_tile_rows<T: MmaFloat, const NK: usize, const MT: usize>(
    st: &mut [RowState; MT],
    q: *const T,
    ldq: usize,
    kt: *const T,
    ldk: usize,
    v: *const T,
    ldv: usize,
    d: usize,
    nof: usize,
    score: &impl Score,
    before_pv: &impl Fn(),
) {
    // WMMA fragments hold twice the items of MFMA's: there the tile goes in two halves
    // of 16 keys, which keeps gfx11 within its 192 VGPRs (on the VALU, gfx10, halves
    // spilled more than whole tiles).
    // SAFETY (both): the caller's contract.
    if mma::lowering() == Lowering::Wmma {
        let mut half = 0;
        while half < NK {
            unsafe { add_keys::<T, 1, MT>(st, q, ldq, kt, ldk, v, ldv, d, nof, half * 16, score, before_pv) };
            half += 1;
        }
    } else {
        unsafe { add_keys::<T, NK, MT>(st, q, ldq, kt, ldk, v, ldv, d, nof, 0, score, before_pv) };
    }
}

/// [`add_tile_rows`] for the `NK` 16-key fragments from key `key0` of the tile.
///
/// # Safety
/// As [`add_tile_rows`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn add_keys<T: MmaFloat, const NK: usize, const MT: usize>(
    st: &mut [RowState; MT],
    q: *const T,
    ldq: usize,
    kt: *const T,
    ldk: usize,
    v: *const T,
    ldv: usize,
    d: usize,
    nof: usize,
    key0: usize,
    score: &impl Score,
    before_pv: &impl Fn(),
) {
    // A plain tile keeps its raw scores and folds the scale `c` into the exponent; the
    // others go through the score function. Two whole copies of the tile step rather than
    // a branch around the score pass: the masked copy's registers (the score parameters
    // live beside the scores and the output) then do not shape the plain copy's, which
    // runs the most tiles (on `MmaSync` a shared tail kept scores in local memory).
    // SAFETY (both): the caller's contract.
    // A tile that only masks (causal diagonal, window edges, a sequence's last keys; no
    // modifier) takes a third copy that selects `-inf` per key.
    match (score.plain(), score.masked_plain()) {
        (Some(c), _) => unsafe { tile_step::<T, NK, MT, PLAIN>(st, q, ldq, kt, ldk, v, ldv, d, nof, key0, c, score, before_pv) },
        (None, Some(c)) => unsafe { tile_step::<T, NK, MT, MASK>(st, q, ldq, kt, ldk, v, ldv, d, nof, key0, c, score, before_pv) },
        (None, None) => unsafe { tile_step::<T, NK, MT, SCORE>(st, q, ldq, kt, ldk, v, ldv, d, nof, key0, 1.0, score, before_pv) },
    }
}

/// [`tile_step`] mode: softmax inputs `c x` ([`Score::plain`]).
const PLAIN: u8 = 0;
/// [`tile_step`] mode: softmax inputs `c x` or `-inf` ([`Score::masked_plain`]).
const MASK: u8 = 1;
/// [`tile_step`] mode: softmax inputs [`Score::score`], `c` = 1.
const SCORE: u8 = 2;

/// [`add_keys`] for a tile of one of the modes [`PLAIN`], [`MASK`], [`SCORE`].
///
/// # Safety
/// As [`add_tile_rows`].
// Out of line on the CPU executor (and its `each!` loops not unrolled there):
// inlined, the unoptimised copies of every mode and tile shape overflowed the work-item
// stacks.
#[cfg_attr(any(target_arch = "amdgpu", target_arch = "nvptx64"), inline(always))]
#[cfg_attr(not(any(target_arch = "amdgpu", target_arch = "nvptx64")), inline(never))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_step<T: MmaFloat, const NK: usize, const MT: usize, const MODE: u8>(
    st: &mut [RowState; MT],
    q: *const T,
    ldq: usize,
    kt: *const T,
    ldk: usize,
    v: *const T,
    ldv: usize,
    d: usize,
    nof: usize,
    key0: usize,
    c: f32,
    score: &impl Score,
    before_pv: &impl Fn(),
) {
    // The three tiles' shared addresses with this lane's `ldmatrix` row, once: every
    // fragment below is a constant offset from them (folded into the loads' immediates
    // on NVIDIA rather than a 64-bit pointer converted per load).
    // (AMD: a plain pointer per load, see [`AMD`].)
    let size = core::mem::size_of::<T>();
    let qa = SharedAddr::new(q).add(FragA::<T>::lane_offset(ldq) * size);
    let ka = SharedAddr::new(kt).add((FragB::<T>::cols_lane_offset(ldk) + key0 * ldk) * size);
    let va = SharedAddr::new(v).add((FragB::<T>::lane_offset(ldv) + key0 * ldv) * size);
    let mut s = [[FragC::<f32>::zero(); NK]; MT];
    // The Q fragment of row tile `mt` at column `ks`, the K^T fragment of key fragment `nf`
    // at row `ks`. SAFETY (both): the caller's contract (16 x 16 tiles inside the Q and K
    // tiles).
    macro_rules! q_frag {
        ($mt:expr, $ks:expr) => {{
            let at = $mt * 16 * ldq + $ks;
            unsafe { if AMD { FragA::<T>::load_shared(q.add(at), ldq) } else { FragA::<T>::load_shared_at(qa.add(at * size), ldq) } }
        }};
    }
    macro_rules! k_frag {
        ($nf:expr, $ks:expr) => {
            unsafe {
                if AMD {
                    load_keys_b::<T>(kt.add((key0 + $nf * 16) * ldk + $ks), ldk)
                } else {
                    FragB::<T>::load_shared_cols_at(ka.add(($nf * 16 * ldk + $ks) * size), ldk)
                }
            }
        };
    }
    // gfx950 (and the CPU executor's MFMA mode) multiplies two 16-deep slices per
    // instruction ([`mma::mma_pair`]): 32 columns per step while two remain.
    let pairs = mma::pairs_k::<T>();
    let mut ks = 0;
    while ks < d {
        let two = pairs && ks + 32 <= d;
        let mut a = [FragA::<T>::zero(); MT];
        let mut a1 = [FragA::<T>::zero(); MT];
        each!(mt in [0, 1] {
            if mt < MT {
                a[mt] = q_frag!(mt, ks);
                if two {
                    a1[mt] = q_frag!(mt, ks + 16);
                }
            }
        });
        each!(nf in [0, 1, 2, 3] {
            if nf < NK {
                let bk = k_frag!(nf, ks);
                if two {
                    let bk1 = k_frag!(nf, ks + 16);
                    each!(mt in [0, 1] {
                        if mt < MT {
                            s[mt][nf] = mma::mma_pair(&a[mt], &bk, &a1[mt], &bk1, s[mt][nf]);
                        }
                    });
                } else {
                    each!(mt in [0, 1] {
                        if mt < MT {
                            s[mt][nf] = mma::mma(&a[mt], &bk, s[mt][nf]);
                        }
                    });
                }
            }
        });
        // One step's operands at a time (the unrolled loop would otherwise load them all
        // ahead and run out of registers on the 128-VGPR targets).
        mma::schedule_fence();
        ks += if two { 32 } else { 16 };
    }
    // Masked scores go through the score function item by item (rather than through
    // `FragC::map`: its closure, called for 8 items on the wave-32 targets, was left out of
    // line there and the scores' parameters went through scratch memory).
    if MODE != PLAIN {
        each!(mt in [0, 1] {
            if mt < MT {
                each!(nf in [0, 1, 2, 3] {
                    if nf < NK {
                        each_item!(j < s[mt][nf].len(), {
                            let (r, col) = s[mt][nf].coord(j);
                            let (r, jt, x) = (mt * 16 + r, key0 + nf * 16 + col, s[mt][nf].v[j]);
                            s[mt][nf].v[j] = if MODE == MASK {
                                if score.seen(r, jt) { x } else { f32::NEG_INFINITY }
                            } else {
                                score.score(r, jt, x)
                            };
                        });
                    }
                });
            }
        });
    }
    each!(mt in [0, 1] {
        if mt < MT {
            st[mt].softmax::<NK>(&mut s[mt], c, nof);
        }
    });
    before_pv();
    // O += P V, P rounded to T in registers; each V fragment feeds every row tile. Where
    // slices pair (gfx950), two key fragments per instruction.
    if pairs && NK.is_multiple_of(2) {
        each!(nf in [0, 2] {
            if nf < NK {
                let mut pa = [FragA::<T>::zero(); MT];
                let mut pa1 = [FragA::<T>::zero(); MT];
                each!(mt in [0, 1] {
                    if mt < MT {
                        pa[mt] = s[mt][nf].to_a::<T>();
                        pa1[mt] = s[mt][(nf + 1) % NK].to_a::<T>();
                    }
                });
                each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if of < nof {
                        // SAFETY: the caller's contract (16 x 16 tiles inside the V tile).
                        let (vb, vb1) = unsafe {
                            if AMD {
                                (
                                    FragB::<T>::load_shared(v.add((key0 + nf * 16) * ldv + of * 16), ldv),
                                    FragB::<T>::load_shared(v.add((key0 + nf * 16 + 16) * ldv + of * 16), ldv),
                                )
                            } else {
                                (
                                    FragB::<T>::load_shared_at(va.add((nf * 16 * ldv + of * 16) * size), ldv),
                                    FragB::<T>::load_shared_at(va.add(((nf * 16 + 16) * ldv + of * 16) * size), ldv),
                                )
                            }
                        };
                        each!(mt in [0, 1] {
                            if mt < MT {
                                st[mt].o[of] = mma::mma_pair(&pa[mt], &vb, &pa1[mt], &vb1, st[mt].o[of]);
                            }
                        });
                    }
                });
                mma::schedule_fence();
            }
        });
        return;
    }
    each!(nf in [0, 1, 2, 3] {
        if nf < NK {
            let mut pa = [FragA::<T>::zero(); MT];
            each!(mt in [0, 1] {
                if mt < MT {
                    pa[mt] = s[mt][nf].to_a::<T>();
                }
            });
            each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
                if of < nof {
                    // SAFETY: the caller's contract (a 16 x 16 tile inside the V tile).
                    let vb = unsafe {
                        if AMD {
                            FragB::<T>::load_shared(v.add((key0 + nf * 16) * ldv + of * 16), ldv)
                        } else {
                            FragB::<T>::load_shared_at(va.add((nf * 16 * ldv + of * 16) * size), ldv)
                        }
                    };
                    each!(mt in [0, 1] {
                        if mt < MT {
                            st[mt].o[of] = mma::mma(&pa[mt], &vb, st[mt].o[of]);
                        }
                    });
                }
            });
            mma::schedule_fence();
        }
    });
}

/// Flash-attention forward for one (query block, sequence, head, value chunk): see the
/// module docs. Grid: x = query blocks of [`block_rows`]`(D, lowering)` rows (of the longest
/// sequence), y = `heads * value_chunks(D, lowering)`, z = sequences; [`WAVES`] waves per
/// work-group; dynamic shared memory of [`smem_elems`]`(D, block_rows(D, lowering),
/// lowering)` elements. `cu` empty: fixed
/// lengths `seq_q`/`seq_k`; else the cumulative query offsets (`batch + 1`) followed by
/// the key offsets (`batch + 1`). `alibi` empty or slopes at `alibi[b * alibi_bs + h]`.
/// `window_*` negative: unbounded. `softcap <= 0`: none. Launch through
/// [`host::flash_attn`] / [`host::flash_attn_varlen`], which check every size first; the
/// kernel checks once per work-group that the rows it touches lie in the buffers and then
/// indexes them without per-element checks.
#[amdgpu_kernel(T = [f16, bf16], H = [Hd64, Hd80, Hd96, Hd128, Hd256], max_threads = 256)]
#[allow(clippy::too_many_arguments)]
pub fn flash_fwd<T: MmaFloat, H: HeadDim>(
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: &mut [f32],
    cu: &[u32],
    alibi: &[f32],
    seq_q: u32,
    seq_k: u32,
    heads: u32,
    kv_heads: u32,
    total_q: u32,
    alibi_bs: u32,
    scale: f32,
    softcap: f32,
    window_left: i32,
    window_right: i32,
    smem: SharedDyn<T>,
) {
    let low = mma::lowering();
    let d = H::D;
    let dv = value_chunk(d, low);
    let (ldq, ldk, ldv) = (d + PAD, d + PAD, dv + PAD);
    let (rows, mt) = (block_rows(d, low), row_tiles(d, low));
    if smem.len() < smem_elems(d, rows, low) {
        panic!("flash_fwd: shared memory too small");
    }
    let chunks = value_chunks(d, low);
    let (h, vc) = (block_idx_y() as usize / chunks, block_idx_y() as usize % chunks);
    let nof = dv / 16;
    let b = block_idx_z() as usize;
    let heads_n = heads as usize;
    let hk = h / (heads / kv_heads) as usize;
    let varlen = !cu.is_empty();
    let (q_row0, len_q, k_row0, len_k) = if varlen {
        let nb = grid_dim_z() as usize + 1;
        let (q0, q1, k0, k1) = (cu[b] as usize, cu[b + 1] as usize, cu[nb + b] as usize, cu[nb + b + 1] as usize);
        (q0, q1 - q0, k0, k1 - k0)
    } else {
        (b * seq_q as usize, seq_q as usize, b * seq_k as usize, seq_k as usize)
    };
    // Query blocks in reverse order: with a causal mask the last blocks see the most keys,
    // so they start first and the short ones fill in at the end.
    let q0 = (grid_dim_x() - 1 - block_idx_x()) as usize * rows;
    if q0 >= len_q {
        // The whole work-group: no row of this sequence here.
        return;
    }
    let q_hi = if q0 + rows < len_q { q0 + rows } else { len_q };
    let q_stride = heads_n * d;
    let kv_stride = kv_heads as usize * d;
    // Every element this work-group touches lies in its buffer (one uniform check).
    let q_end = (q_row0 + q_hi) * q_stride;
    let k_end = (k_row0 + len_k) * kv_stride;
    let lse_end = if varlen { h * total_q as usize + q_row0 + q_hi } else { (b * heads_n + h) * seq_q as usize + q_hi };
    if q_end > q.len() || q_end > out.len() || k_end > k.len() || k_end > v.len() || lse_end > lse.len() || h >= heads_n {
        panic!("flash_fwd: a buffer is shorter than the shape needs");
    }
    let (qp, kp, vp, op) = (q.as_ptr(), k.as_ptr(), v.as_ptr(), out.as_mut_ptr());
    let lse_p = lse.as_mut_ptr();
    // The diagonal offset (bottom-right alignment) and the keys any row of the block sees.
    let off = len_k as i32 - len_q as i32;
    let mut kv_lo = 0i32;
    let mut kv_hi = len_k as i32;
    if window_left >= 0 {
        kv_lo = (q0 as i32 + off - window_left).max(0);
    }
    if window_right >= 0 {
        kv_hi = kv_hi.min(q_hi as i32 + off + window_right);
    }
    let bn = prefill_bn(d, low);
    let n_tiles = if kv_hi > kv_lo { ((kv_hi - kv_lo) as usize).div_ceil(bn) } else { 0 };

    let tid = flat_thread_idx() as usize;
    // The launchers' work-group size, a constant on the GPU targets (the copy loops then
    // have constant trip counts).
    let nthreads = if AMD { flat_block_dim() as usize } else { WAVES * wave::size() as usize };
    if !AMD {
        if flat_block_dim() as usize != nthreads {
            panic!("flash_fwd: work-group size is not WAVES waves");
        }
        // SAFETY: a work-item index is below the work-group size (checked just above), so
        // the copies' fallback for work-items past `nthreads` is dead code.
        unsafe { core::hint::assert_unchecked(tid < nthreads) };
    }
    let wave = tid / wave::size() as usize;
    let sp = smem.as_ptr();
    let q_lds = sp;
    let kbufs = stages(low);
    let size = core::mem::size_of::<T>();
    // Shared memory: the Q tile, `kbufs` K tiles, one V tile (see [`smem_elems`]).
    let k_lds = sp.wrapping_add(rows * ldq);
    let v_lds = k_lds.wrapping_add(kbufs * bn * ldk);
    let (k_sa, v_sa) = (SharedAddr::new(k_lds), SharedAddr::new(v_lds));

    // The Q tile, zero past the sequence (the first copy group, with K tile 0).
    let q_base = (q_row0 + q0) * q_stride + h * d;
    // SAFETY: rows below q_hi lie in q (checked above), 16-byte aligned (d and the strides
    // are multiples of 8 elements); the Q region holds `rows` rows of ldq.
    unsafe {
        if AMD {
            copy_rows::<T>(SharedAddr::new(q_lds), ldq, rows, d, tid, nthreads, |r| {
                let ok = q0 + r < len_q;
                (if ok { qp.wrapping_add(q_base + r * q_stride) } else { qp }, ok)
            })
        } else {
            copy_tile::<T>(SharedAddr::new(q_lds), ldq, rows, d, tid, nthreads, qp.wrapping_add(q_base), q_stride, len_q - q0)
        }
    };

    // The wave's rows: `mt` row tiles of 16 from row0.
    let row0 = q0 + wave * 16 * mt;
    let mut st = [RowState::new(); 2];
    let slope = if alibi.is_empty() { 0.0 } else { alibi[b * alibi_bs as usize + h] };
    let inv_cap = if softcap > 0.0 { 1.0 / softcap } else { 0.0 };
    let k_base = k_row0 * kv_stride + hk * d;
    let v_base = k_base + vc * dv;
    // Issue the copies of key tile `t` into K buffer `t % kbufs`, and of its values into
    // the V buffer (keys and values past the sequence are zeros: their probabilities are
    // 0, and 0 * garbage could be NaN).
    // SAFETY (both): keys below len_k lie in k and v (checked above), rows 16-byte
    // aligned; a K buffer holds bn rows of ldk, the V buffer bn rows of ldv.
    let issue_k = |t: usize| {
        let k0 = kv_lo as usize + t * bn;
        let dst = k_sa.add((t % kbufs) * bn * ldk * size);
        unsafe {
            if AMD {
                copy_rows::<T>(dst, ldk, bn, d, tid, nthreads, |j| {
                    let ok = k0 + j < len_k;
                    (if ok { kp.wrapping_add(k_base + (k0 + j) * kv_stride) } else { kp }, ok)
                });
            } else {
                copy_tile::<T>(dst, ldk, bn, d, tid, nthreads, kp.wrapping_add(k_base + k0 * kv_stride), kv_stride, len_k - k0);
            }
        }
    };
    let issue_v = |t: usize| {
        let k0 = kv_lo as usize + t * bn;
        unsafe {
            if AMD {
                copy_rows::<T>(v_sa, ldv, bn, dv, tid, nthreads, |j| {
                    let ok = k0 + j < len_k;
                    (if ok { vp.wrapping_add(v_base + (k0 + j) * kv_stride) } else { vp }, ok)
                });
            } else {
                copy_tile::<T>(v_sa, ldv, bn, dv, tid, nthreads, vp.wrapping_add(v_base + k0 * kv_stride), kv_stride, len_k - k0);
            }
        }
    };
    // With two K buffers (`MmaSync`) the copies run ahead: key tile 0 goes with Q; at the
    // top of iteration t (every wave done with tile t - 1) the values of tile t and the
    // keys of tile t + 1 are issued as two groups, so the value copy overlaps `S = Q K^T`
    // and the softmax, and the key copy the whole tile; before `P V` the waves wait for
    // the values (the group before the last). With one buffer (synchronous copies) tile
    // t's keys and values are copied at the top and the waves meet again at the end.
    if kbufs > 1 && n_tiles > 0 {
        issue_k(0);
    }
    copy::commit();
    let before_pv = || {
        if kbufs > 1 {
            copy::wait_groups(1);
            barrier();
        }
    };
    let mut t = 0;
    while t < n_tiles {
        let k0 = kv_lo as usize + t * bn;
        if kbufs == 1 {
            issue_k(t);
            issue_v(t);
            copy::commit();
        }
        copy::wait_groups(0);
        barrier();
        if kbufs > 1 {
            issue_v(t);
            copy::commit();
            if t + 1 < n_tiles {
                issue_k(t + 1);
            }
            copy::commit();
        }
        // Scale, soft-cap, ALiBi and mask, into the log2 domain.
        let score = PrefillScore {
            diag0: row0 as i32 + off,
            rows: (16 * mt) as i32,
            k0: k0 as i32,
            bn: bn as i32,
            len_k: len_k as i32,
            window_left,
            window_right,
            scale,
            softcap,
            inv_cap,
            slope,
        };
        let kt_lds = k_lds.wrapping_add((t % kbufs) * bn * ldk);
        let q_w = q_lds.wrapping_add(wave * 16 * mt * ldq);
        // SAFETY: the tiles lie in `smem` with rows 16-byte aligned (strides and offsets
        // multiples of 8 elements).
        unsafe {
            // 64-key tiles come with two row tiles ([`row_tiles`]).
            if bn == 64 {
                add_tile_rows::<T, 4, 2>(&mut st, q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score, &before_pv);
            } else {
                add_tile_rows::<T, 2, 1>(core::array::from_mut(&mut st[0]), q_w, ldq, kt_lds, ldk, v_lds, ldv, d, nof, &score, &before_pv);
            }
        }
        if kbufs == 1 {
            // Every wave is done with the tiles before they are refilled.
            barrier();
        }
        t += 1;
    }
    // Nothing is left in flight (with no key tile, the Q copies were never waited for).
    copy::commit();
    copy::wait_groups(0);

    // Normalise, write the rows of this sequence and (first value chunk) the LSE.
    let o_base = q_row0 * q_stride + h * d + vc * dv;
    let lse_base = if varlen { h * total_q as usize + q_row0 } else { (b * heads_n + h) * seq_q as usize };
    // SAFETY: rows below q_hi lie in out, and their LSE entries below lse_end (checked above).
    unsafe { write_rows(&mut st, mt, nof, row0, len_q, (op, o_base, q_stride), (lse_p, lse_base, vc == 0)) };
}

/// The epilogue of the prefill kernels ([`flash_fwd`](fn@flash_fwd) and the paged
/// prefill): normalises the output of a wave's `mt` row tiles (`st[m]` holds the
/// sequence's rows `row0 + 16 m ..`, `nof` fragments of 16 value columns), writes the rows
/// below `len_q`, row `i` at `out + o_base + i * stride`, and, when `write_lse`, row `i`'s
/// natural log-sum-exp at `lse + lse_base + i`.
///
/// # Safety
/// Every row below `len_q` of the wave's rows has `nof * 16` writable elements at its
/// output offset and, when `write_lse`, one writable f32 at its LSE offset.
#[inline(always)]
pub unsafe fn write_rows<T: MmaFloat>(
    st: &mut [RowState; 2],
    mt: usize,
    nof: usize,
    row0: usize,
    len_q: usize,
    (out, o_base, stride): (*mut T, usize, usize),
    (lse, lse_base, write_lse): (*mut f32, usize, bool),
) {
    each!(m in [0, 1] {
        if m < mt {
            let lse_f = st[m].finish(nof);
            let r0 = row0 + m * 16;
            each!(of in [0, 1, 2, 3, 4, 5, 6, 7] {
                if of < nof {
                    st[m].o[of].for_each(|r, c, x| {
                        let i = r0 + r;
                        if i < len_q {
                            // SAFETY: the caller's contract.
                            unsafe { *out.add(o_base + i * stride + of * 16 + c) = T::from_f32(x) };
                        }
                    });
                }
            });
            if write_lse {
                lse_f.for_each(|r, c, x| {
                    let i = r0 + r;
                    if c == 0 && i < len_q {
                        // SAFETY: the caller's contract.
                        unsafe { *lse.add(lse_base + i) = x };
                    }
                });
            }
        }
    });
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host;
