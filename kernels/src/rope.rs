//! Rotary position embeddings (RoPE) in Candle's three layouts, for `f32`, `f16` and `bf16`
//! (half types compute in `f32`):
//!
//! | kernel | `x` (contiguous) | the pair `i` of a row of `d` elements |
//! |---|---|---|
//! | [`rope_i`](fn@rope_i) | `(b, h, t, d)` | `x[2i]`, `x[2i + 1]` (interleaved) |
//! | [`rope`](fn@rope) | `(b, h, t, d)` | `x[i]`, `x[i + d/2]` (half-split) |
//! | [`rope_thd`](fn@rope_thd) | `(b, t, h, d)` | `x[i]`, `x[i + d/2]` (half-split) |
//!
//! A pair `(x0, x1)` of a row at position `p` (its `t` index) becomes
//! `(x0 c - x1 s, x0 s + x1 c)` with `c = cos[p][i]`, `s = sin[p][i]`. `cos` and `sin` have
//! `x`'s element type and are `(t, d/2)` contiguous tables shared by the batch
//! (`table_batch_stride = 0`), or one table per batch entry `table_batch_stride` elements
//! apart (`t * d/2` for a contiguous `(b, t, d/2)` table). Rows past `t` in a table are not
//! read, so a table built for a longer maximum length can be passed as is.
//!
//! Work split: the tensor is a sequence of rows of `d` elements and each work-item owns
//! [`pairs_per_item`] pairs of one row (`f32`: 4, `f16`/`bf16`: 8, i.e. 16 bytes of each
//! half). On the main path it moves the two 16-byte blocks of `x` at offsets `i0` and
//! `i0 + d/2` of its row with one vector load and one vector store each, so every memory
//! instruction of a wave covers contiguous bytes: for the half-split layouts these are the
//! two halves of pairs `i0..`; for the interleaved layout each block holds whole pairs
//! (`i0/2..` and `d/4 + i0/2..`). That path needs `d/2` and the table batch stride to be
//! multiples of [`pairs_per_item`] and every buffer to start on 16 bytes (head sizes 64, 80,
//! 96, 128, 256 with fresh allocations); otherwise the same work-items go pair by pair.
//!
//! Host side: [`apply_rope_i`], [`apply_rope`] and [`apply_rope_thd`] check shapes and
//! buffer lengths (a typed [`LaunchError::InvalidArgument`](kernel_dsl::host::LaunchError)
//! before anything runs) and launch with [`launch_config`].
use crate::elementwise::Bytes16;
use crate::unroll8;
use kernel_dsl::prelude::*;

/// Pairs one work-item rotates: 16 bytes of elements (`f32`: 4, `f16`/`bf16`: 8).
pub const fn pairs_per_item<T>() -> usize {
    16 / core::mem::size_of::<T>()
}

/// The rotation of one pair: `(x0 c - x1 s, x0 s + x1 c)` (fused multiply-adds).
#[device]
#[inline(always)]
pub fn rotate(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (FloatMath::mul_add(x0, c, -(x1 * s)), FloatMath::mul_add(x0, s, x1 * c))
}

/// 8 bytes, aligned: half a block of table entries for the interleaved layout.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Bytes8([u8; 8]);

/// Reads the first `size_of::<V>()` bytes of `s` as one vector access. The caller passes a
/// bounds-checked subslice of exactly that many bytes, aligned to them (`vector_path`
/// checked the base pointers; offsets are multiples of the size).
#[device]
#[inline(always)]
fn load<V: Copy, T>(s: &[T]) -> V {
    // SAFETY: see above: in bounds and aligned.
    unsafe { core::ptr::read(s.as_ptr() as *const V) }
}

/// Writes `v` to the first 16 bytes of `s` (as [`load`]).
#[device]
#[inline(always)]
fn store16<T>(s: &mut [T], v: Bytes16) {
    // SAFETY: as in `load`.
    unsafe { core::ptr::write(s.as_mut_ptr() as *mut Bytes16, v) }
}

/// `true` when every work-item can move whole aligned 16-byte blocks: `d/2` and the table
/// batch stride are multiples of [`pairs_per_item`] and all four buffers start on 16 bytes.
/// The same for every work-item (uniform).
#[device]
#[inline(always)]
fn vector_path<T>(x: &[T], cos: &[T], sin: &[T], out: &[T], d2: usize, table_batch_stride: usize) -> bool {
    let vp = pairs_per_item::<T>();
    let addrs = x.as_ptr() as usize | cos.as_ptr() as usize | sin.as_ptr() as usize | out.as_ptr() as usize;
    d2.is_multiple_of(vp) && table_batch_stride.is_multiple_of(vp) && addrs.is_multiple_of(16)
}

/// The body shared by the three kernels: finds this work-item's row and pairs, its table
/// row, and rotates. `thd` selects the `(b, t, h, d)` row order, `interleaved` the pair
/// layout.
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn rope_rows<T: Float>(
    x: &[T],
    cos: &[T],
    sin: &[T],
    out: &mut [T],
    dims: [u32; 4],
    table_batch_stride: u32,
    thd: bool,
    interleaved: bool,
) {
    let [b, h, t, d] = dims;
    let vp = pairs_per_item::<T>() as u32;
    let d2 = d / 2;
    // Work-items per row; the launch has b * h * t * per_row of them (all below 2^32).
    let per_row = d2.div_ceil(vp);
    let items = b as usize * h as usize * t as usize * per_row as usize;
    let g = global_idx_x();
    if g >= items {
        return;
    }
    // 32-bit index arithmetic: the host checked that every count fits.
    let g = g as u32;
    let row = g / per_row;
    let i0 = (g - row * per_row) * vp;
    // Position and batch entry of the row: rows run (b, h, t) or, for thd, (b, t, h).
    let (pos, batch) = if thd {
        let bt = row / h;
        (bt % t, if table_batch_stride == 0 { 0 } else { bt / t })
    } else {
        (row % t, if table_batch_stride == 0 { 0 } else { row / (h * t) })
    };
    let (d, d2, i0) = (d as usize, d2 as usize, i0 as usize);
    // Start of the row's table and of the row in x.
    let tab = batch as usize * table_batch_stride as usize + pos as usize * d2;
    let xrow = row as usize * d;
    if vector_path(x, cos, sin, out, d2, table_batch_stride as usize) {
        // Whole 16-byte blocks of `lanes` (= pairs_per_item) elements: this work-item moves
        // x blocks at xrow + i0 and xrow + i0 + d/2, so each load and store instruction of a
        // wave covers contiguous bytes in both layouts. Half-split: the blocks hold the first
        // and second halves of pairs i0.. (table block at i0). Interleaved: each block holds
        // lanes/2 whole pairs, i0/2.. and d/4 + i0/2.. (table halves of 8 bytes).
        let lanes = vp as usize;
        let (a, b) = (xrow + i0, xrow + i0 + d2);
        let (xa, xb): (Bytes16, Bytes16) = (load(&x[a..a + lanes]), load(&x[b..b + lanes]));
        let (pa, pb) = (&xa as *const Bytes16 as *const T, &xb as *const Bytes16 as *const T);
        let (mut ra, mut rb) = (Bytes16([0; 16]), Bytes16([0; 16]));
        let (qa, qb) = (&mut ra as *mut Bytes16 as *mut T, &mut rb as *mut Bytes16 as *mut T);
        if interleaved {
            let half = lanes / 2;
            let (ta, tb) = (tab + i0 / 2, tab + i0 / 2 + d2 / 2);
            let (ca, sa): (Bytes8, Bytes8) = (load(&cos[ta..ta + half]), load(&sin[ta..ta + half]));
            let (cb, sb): (Bytes8, Bytes8) = (load(&cos[tb..tb + half]), load(&sin[tb..tb + half]));
            let (pca, psa) = (&ca as *const Bytes8 as *const T, &sa as *const Bytes8 as *const T);
            let (pcb, psb) = (&cb as *const Bytes8 as *const T, &sb as *const Bytes8 as *const T);
            unroll8!(k, half, {
                // SAFETY: 2k + 1 < lanes (16-byte blocks) and k < half (8-byte halves).
                unsafe {
                    let (y0, y1) = rotate((*pa.add(2 * k)).to_f32(), (*pa.add(2 * k + 1)).to_f32(), (*pca.add(k)).to_f32(), (*psa.add(k)).to_f32());
                    *qa.add(2 * k) = T::from_f32(y0);
                    *qa.add(2 * k + 1) = T::from_f32(y1);
                    let (y0, y1) = rotate((*pb.add(2 * k)).to_f32(), (*pb.add(2 * k + 1)).to_f32(), (*pcb.add(k)).to_f32(), (*psb.add(k)).to_f32());
                    *qb.add(2 * k) = T::from_f32(y0);
                    *qb.add(2 * k + 1) = T::from_f32(y1);
                }
            });
        } else {
            let to = tab + i0;
            let (cv, sv): (Bytes16, Bytes16) = (load(&cos[to..to + lanes]), load(&sin[to..to + lanes]));
            let (pc, ps) = (&cv as *const Bytes16 as *const T, &sv as *const Bytes16 as *const T);
            unroll8!(k, lanes, {
                // SAFETY: k < lanes: inside the 16-byte blocks.
                unsafe {
                    let (y0, y1) = rotate((*pa.add(k)).to_f32(), (*pb.add(k)).to_f32(), (*pc.add(k)).to_f32(), (*ps.add(k)).to_f32());
                    *qa.add(k) = T::from_f32(y0);
                    *qb.add(k) = T::from_f32(y1);
                }
            });
        }
        store16(&mut out[a..a + lanes], ra);
        store16(&mut out[b..b + lanes], rb);
    } else {
        // Pair by pair, pairs i0.. of the row: the last work-item of a row may have fewer
        // than vp pairs.
        let (to, xo) = (tab + i0, xrow + if interleaved { 2 * i0 } else { i0 });
        let n = (d2 - i0).min(vp as usize);
        let mut k = 0;
        while k < n {
            let (j0, j1) = if interleaved { (xo + 2 * k, xo + 2 * k + 1) } else { (xo + k, xo + d2 + k) };
            let (y0, y1) = rotate(x[j0].to_f32(), x[j1].to_f32(), cos[to + k].to_f32(), sin[to + k].to_f32());
            out[j0] = T::from_f32(y0);
            out[j1] = T::from_f32(y1);
            k += 1;
        }
    }
}

/// Interleaved RoPE: `x` is `(b, h, t, d)`; pair `i` of a row is `x[2i]`, `x[2i + 1]`.
/// `b, h, t, d` are the sizes (`d` even); the tables are `(t, d/2)`, one per batch entry
/// `table_batch_stride` elements apart when that is not 0. Launch with
/// [`launch_config::<T>`](launch_config) of the same shape, which also checks that the
/// counts fit the kernel's 32-bit indexing ([`apply_rope_i`] does all of this).
#[amdgpu_kernel(T = [f32, f16, bf16])]
#[allow(clippy::too_many_arguments)]
pub fn rope_i<T: Float>(x: &[T], cos: &[T], sin: &[T], out: &mut [T], b: u32, h: u32, t: u32, d: u32, table_batch_stride: u32) {
    rope_rows(x, cos, sin, out, [b, h, t, d], table_batch_stride, false, true);
}

/// Half-split RoPE: `x` is `(b, h, t, d)`; pair `i` of a row is `x[i]`, `x[i + d/2]`.
/// Arguments as in [`rope_i`](fn@rope_i).
#[amdgpu_kernel(T = [f32, f16, bf16])]
#[allow(clippy::too_many_arguments)]
pub fn rope<T: Float>(x: &[T], cos: &[T], sin: &[T], out: &mut [T], b: u32, h: u32, t: u32, d: u32, table_batch_stride: u32) {
    rope_rows(x, cos, sin, out, [b, h, t, d], table_batch_stride, false, false);
}

/// Half-split RoPE on a `(b, t, h, d)` tensor; pair `i` of a row is `x[i]`, `x[i + d/2]`.
/// Arguments as in [`rope_i`](fn@rope_i) (`b, h, t, d` name the sizes, not their order in memory).
#[amdgpu_kernel(T = [f32, f16, bf16])]
#[allow(clippy::too_many_arguments)]
pub fn rope_thd<T: Float>(x: &[T], cos: &[T], sin: &[T], out: &mut [T], b: u32, h: u32, t: u32, d: u32, table_batch_stride: u32) {
    rope_rows(x, cos, sin, out, [b, h, t, d], table_batch_stride, true, false);
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use host::*;

/// Host side: shapes, checks, launch shape and checked launches.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host {
    use super::pairs_per_item;
    use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError};
    use kernel_dsl::{Dim3, Float};

    /// Work-group size of RoPE launches.
    pub const BLOCK: u32 = 256;

    /// Sizes of one RoPE launch, in elements. `x` and `out` hold `b * h * t * d` elements
    /// (ordered `(b, h, t, d)` for `rope_i`/`rope`, `(b, t, h, d)` for `rope_thd`); `cos` and
    /// `sin` hold `(t, d/2)` tables, one shared by the batch when `table_batch_stride` is 0,
    /// else one per batch entry, `table_batch_stride` (at least `t * d/2`) elements apart.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RopeShape {
        /// Batch size.
        pub b: usize,
        /// Heads.
        pub h: usize,
        /// Positions (sequence length).
        pub t: usize,
        /// Head size (even).
        pub d: usize,
        /// Elements between the tables of consecutive batch entries; 0 = one shared table.
        pub table_batch_stride: usize,
    }

    impl RopeShape {
        /// `(b, h, t, d)` with one `(t, d/2)` table shared by the batch.
        pub const fn new(b: usize, h: usize, t: usize, d: usize) -> Self {
            RopeShape { b, h, t, d, table_batch_stride: 0 }
        }

        /// The same shape with contiguous per-batch `(b, t, d/2)` tables.
        pub const fn per_batch_tables(self) -> Self {
            self.with_table_batch_stride(self.t * (self.d / 2))
        }

        /// The same shape with per-batch tables `stride` elements apart (0: shared).
        pub const fn with_table_batch_stride(mut self, stride: usize) -> Self {
            self.table_batch_stride = stride;
            self
        }

        /// Elements of `x` and `out`, or `None` on overflow.
        pub fn elems(&self) -> Option<usize> {
            self.b.checked_mul(self.h)?.checked_mul(self.t)?.checked_mul(self.d)
        }

        /// Elements `cos` and `sin` must each have at least (0 for an empty tensor), or
        /// `None` on overflow.
        pub fn table_len(&self) -> Option<usize> {
            if self.elems()? == 0 {
                return Some(0);
            }
            let one = self.t.checked_mul(self.d / 2)?;
            match self.table_batch_stride {
                0 => Some(one),
                s => (self.b - 1).checked_mul(s)?.checked_add(one),
            }
        }

        /// Checks the shape alone for `kernel` (names the error): `d` even, per-batch tables
        /// that do not overlap, every count within the kernels' 32-bit index range.
        pub fn validate(&self, kernel: &'static str) -> Result<(), LaunchError> {
            let bad = |reason: String| Err(LaunchError::InvalidArgument { kernel, reason });
            let RopeShape { b, h, t, d, table_batch_stride: stride } = *self;
            if !d.is_multiple_of(2) {
                return bad(format!("head size d = {d} is odd; RoPE rotates pairs"));
            }
            let Some(n) = self.elems() else {
                return bad(format!("shape ({b}, {h}, {t}, {d}) overflows usize"));
            };
            if stride != 0 && stride < t * (d / 2) {
                return bad(format!(
                    "table_batch_stride {stride} is smaller than one (t, d/2) = ({t}, {}) table; use 0 for a shared table",
                    d / 2
                ));
            }
            if n == 0 {
                return Ok(());
            }
            let items = (b * h * t) as u128 * (d / 2).div_ceil(pairs_per_item::<f32>()) as u128;
            let max = u32::MAX as u128;
            if [b, h, t, d, stride].iter().any(|&v| v as u128 > max) || (b * h * t) as u128 > max || items > max {
                return bad(format!(
                    "shape ({b}, {h}, {t}, {d}) with table_batch_stride {stride} exceeds the kernels' 32-bit indexing"
                ));
            }
            if self.table_len().is_none() {
                return bad(format!("per-batch tables of {b} x {stride} elements overflow usize"));
            }
            Ok(())
        }

        /// Checks the shape and the buffer lengths: `x` and `out` exactly
        /// [`elems`](Self::elems), `cos` and `sin` at least [`table_len`](Self::table_len).
        pub fn check(&self, kernel: &'static str, x: usize, cos: usize, sin: usize, out: usize) -> Result<(), LaunchError> {
            self.validate(kernel)?;
            let bad = |reason: String| Err(LaunchError::InvalidArgument { kernel, reason });
            let n = self.elems().unwrap_or(0);
            let RopeShape { b, h, t, d, .. } = *self;
            for (name, len) in [("x", x), ("out", out)] {
                if len != n {
                    return bad(format!("{name} has {len} elements; shape ({b}, {h}, {t}, {d}) has {n}"));
                }
            }
            let need = self.table_len().unwrap_or(usize::MAX);
            for (name, len) in [("cos", cos), ("sin", sin)] {
                if len < need {
                    return bad(format!(
                        "{name} has {len} elements; (t, d/2) = ({t}, {}) tables with batch stride {} need {need}",
                        d / 2,
                        self.table_batch_stride
                    ));
                }
            }
            Ok(())
        }
    }

    /// Launch shape for `shape` with elements of type `T` (any of the three kernels): one
    /// work-item per [`pairs_per_item::<T>()`](pairs_per_item) pairs of a row, in work-groups
    /// of [`BLOCK`]. Checks the shape as [`RopeShape::validate`]; an empty tensor gets an
    /// empty grid.
    pub fn launch_config<T: Float>(shape: &RopeShape) -> Result<LaunchConfig, LaunchError> {
        shape.validate("rope")?;
        let per_row = (shape.d / 2).div_ceil(pairs_per_item::<T>());
        let items = shape.b * shape.h * shape.t * per_row;
        let groups = items.div_ceil(BLOCK as usize) as u32;
        Ok(LaunchConfig::new(Dim3::x(groups), Dim3::x(BLOCK)))
    }

    fn len_of<T>(s: &(impl KernelArgSlice<T> + ?Sized)) -> usize {
        match s.kernel_arg() {
            ArgValue::Slice { len, .. } => len,
            _ => 0,
        }
    }

    /// The three kernels' launchers, named.
    #[derive(Clone, Copy)]
    enum Kind {
        Interleaved,
        HalfSplit,
        Thd,
    }

    fn apply<T: Float + 'static>(
        kind: Kind,
        exec: &(impl Executor + ?Sized),
        x: &(impl KernelArgSlice<T> + ?Sized),
        cos: &(impl KernelArgSlice<T> + ?Sized),
        sin: &(impl KernelArgSlice<T> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        shape: &RopeShape,
    ) -> Result<(), LaunchError> {
        let name = match kind {
            Kind::Interleaved => "rope_i",
            Kind::HalfSplit => "rope",
            Kind::Thd => "rope_thd",
        };
        shape.check(name, len_of(x), len_of(cos), len_of(sin), len_of(out))?;
        if shape.elems() == Some(0) {
            return Ok(());
        }
        let cfg = launch_config::<T>(shape)?;
        // validate() checked that all of these fit u32.
        let RopeShape { b, h, t, d, table_batch_stride: s } = *shape;
        let (b, h, t, d, s) = (b as u32, h as u32, t as u32, d as u32, s as u32);
        match kind {
            Kind::Interleaved => super::rope_i::launch::<T>(exec, cfg, x, cos, sin, out, b, h, t, d, s),
            Kind::HalfSplit => super::rope::launch::<T>(exec, cfg, x, cos, sin, out, b, h, t, d, s),
            Kind::Thd => super::rope_thd::launch::<T>(exec, cfg, x, cos, sin, out, b, h, t, d, s),
        }
    }

    /// Interleaved RoPE ([`rope_i`](fn@super::rope_i)) of the `(b, h, t, d)` tensor `x` into
    /// `out`, after checking `shape` and every buffer length ([`RopeShape::check`]); an
    /// empty tensor launches nothing. On an error nothing runs and `out` is unchanged.
    pub fn apply_rope_i<T: Float + 'static>(
        exec: &(impl Executor + ?Sized),
        x: &(impl KernelArgSlice<T> + ?Sized),
        cos: &(impl KernelArgSlice<T> + ?Sized),
        sin: &(impl KernelArgSlice<T> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        shape: &RopeShape,
    ) -> Result<(), LaunchError> {
        apply(Kind::Interleaved, exec, x, cos, sin, out, shape)
    }

    /// Half-split RoPE ([`rope`](fn@super::rope)) of the `(b, h, t, d)` tensor `x`, checked as
    /// [`apply_rope_i`].
    pub fn apply_rope<T: Float + 'static>(
        exec: &(impl Executor + ?Sized),
        x: &(impl KernelArgSlice<T> + ?Sized),
        cos: &(impl KernelArgSlice<T> + ?Sized),
        sin: &(impl KernelArgSlice<T> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        shape: &RopeShape,
    ) -> Result<(), LaunchError> {
        apply(Kind::HalfSplit, exec, x, cos, sin, out, shape)
    }

    /// Half-split RoPE ([`rope_thd`](fn@super::rope_thd)) of the `(b, t, h, d)` tensor `x`
    /// (sizes still given as `shape.b, h, t, d`), checked as [`apply_rope_i`].
    pub fn apply_rope_thd<T: Float + 'static>(
        exec: &(impl Executor + ?Sized),
        x: &(impl KernelArgSlice<T> + ?Sized),
        cos: &(impl KernelArgSlice<T> + ?Sized),
        sin: &(impl KernelArgSlice<T> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        shape: &RopeShape,
    ) -> Result<(), LaunchError> {
        apply(Kind::Thd, exec, x, cos, sin, out, shape)
    }
}
