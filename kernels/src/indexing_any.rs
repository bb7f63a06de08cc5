//! Indexing ops for every Candle dtype and every Candle index dtype (u8, u32, i64), plus
//! Candle's `scatter_set`: the dtype-generic counterparts of [`indexing`](crate::indexing)
//! (whose typed, vectorized `index_select` and `where_cond` the checked launchers here
//! call for the f32/f16/bf16/u8/u32 values with u32/i64 ids / u8/u32 conditions they
//! cover, contiguous). One instance per value size x index size.
//!
//! Index rules (Candle's CPU backend): an id equal to its type's maximum (255 for u8,
//! `u32::MAX`, `i64::MAX`) is Candle's "no index" marker: gathers write zero, scatters skip
//! it. Other out-of-range ids (Candle raises an error) are treated the same way here, so no
//! kernel touches memory outside its buffers.
//!
//! * [`index_select_any`](fn@index_select_any), [`gather_any`](fn@gather_any): pure data
//!   movement, every dtype.
//! * [`scatter_set`](fn@scatter_set): `dst[l, ids[l, i, r], r] = src[l, i, r]`, `i` in
//!   order, so the last write in index order wins (deterministic: one work-item per
//!   `(l, r)` column, as Candle's loop).
//! * [`scatter_add_any`](fn@scatter_add_any), [`index_add_any`](fn@index_add_any): the
//!   adds for every dtype, in index order like Candle's loop: integers wrap, floats round
//!   to their type after each add (f64 in f64).
//! * [`where_cond_any`](fn@where_cond_any): any dtype of values with a condition of any
//!   integer dtype (nonzero is true), strided/broadcast layouts.
use crate::dtype::{decode, encode, Bits, Val};
use crate::elementwise::strided_offset;
use kernel_dsl::prelude::*;

/// Raw storage of an index dtype: `u8`, `u32`, or `u64` holding an `i64`.
pub trait IndexBits: Bits {
    /// Candle's "no index" marker of the index dtype, as bits.
    const NONE: u64;
}
impl IndexBits for u8 {
    const NONE: u64 = u8::MAX as u64;
}
impl IndexBits for u32 {
    const NONE: u64 = u32::MAX as u64;
}
impl IndexBits for u64 {
    const NONE: u64 = i64::MAX as u64;
}

/// The position an id addresses in a dimension of `len`, or `None` (marker, negative or
/// out of range).
#[device]
#[inline(always)]
pub fn slot<I: IndexBits>(id: I, len: usize) -> Option<usize> {
    let v = id.to_u64();
    // A negative i64 has the top bit set: larger than any length.
    if v == I::NONE || v >= len as u64 { None } else { Some(v as usize) }
}

/// `a + b` for an accumulating scatter: integers wrap, small floats round once to their
/// type when written back, f64 stays f64.
#[device]
#[inline(always)]
pub fn add_val(a: Val, b: Val) -> Val {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Val::Int(x.wrapping_add(y)),
        (Val::Wide(x), Val::Wide(y)) => Val::Wide(x + y),
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => Val::Float(x + y),
        _ => a,
    }
}

/// `out[l, i, r] = src[l, ids[i], r]` (zero for "no index"); `src` contiguous `(left,
/// src_dim, right)`, `out` contiguous `(left, ids.len(), right)`.
#[amdgpu_kernel(B = [u8, u16, u32, u64], I = [u8, u32, u64])]
pub fn index_select_any<B: Bits, I: IndexBits>(src: &[B], ids: &[I], out: &mut [B], src_dim: usize, right: usize) {
    let n = ids.len();
    let total = out.len();
    let step = global_size_x();
    let mut e = global_idx_x();
    while e < total {
        let r = e % right;
        let row = e / right;
        let (l, k) = (row / n, row % n);
        out[e] = match slot(ids[k], src_dim) {
            Some(id) => src[(l * src_dim + id) * right + r],
            None => B::from_u64(0),
        };
        e += step;
    }
}

/// `out[l, i, r] = src[l, ids[l, i, r], r]` (zero for "no index"); `src` contiguous
/// `(left, src_dim, right)`, `ids` and `out` contiguous `(left, n, right)`.
#[amdgpu_kernel(B = [u8, u16, u32, u64], I = [u8, u32, u64])]
pub fn gather_any<B: Bits, I: IndexBits>(src: &[B], ids: &[I], out: &mut [B], src_dim: usize, n: usize, right: usize) {
    let total = out.len();
    let step = global_size_x();
    let mut e = global_idx_x();
    while e < total {
        let r = e % right;
        let l = e / right / n;
        out[e] = match slot(ids[e], src_dim) {
            Some(id) => src[(l * src_dim + id) * right + r],
            None => B::from_u64(0),
        };
        e += step;
    }
}

/// `dst[l, ids[l, i, r], r] = src[l, i, r]` for `i = 0, 1, ...` in order (last wins;
/// "no index" skipped); `dst` contiguous `(left, dst_dim, right)`, `src`, `ids` contiguous
/// `(left, n, right)`. One work-item per `(l, r)`.
#[amdgpu_kernel(B = [u8, u16, u32, u64], I = [u8, u32, u64])]
pub fn scatter_set<B: Bits, I: IndexBits>(src: &[B], ids: &[I], dst: &mut [B], left: usize, n: usize, dst_dim: usize, right: usize) {
    let cols = left * right;
    let step = global_size_x();
    let mut c = global_idx_x();
    while c < cols {
        let (l, r) = (c / right, c % right);
        let mut i = 0;
        while i < n {
            let k = (l * n + i) * right + r;
            if let Some(id) = slot(ids[k], dst_dim) {
                dst[(l * dst_dim + id) * right + r] = src[k];
            }
            i += 1;
        }
        c += step;
    }
}

/// `dst[l, ids[l, i, r], r] += src[l, i, r]` for `i` in order ("no index" skipped), dtype
/// code `dt`; shapes as [`scatter_set`](fn@scatter_set).
#[amdgpu_kernel(B = [u8, u16, u32, u64], I = [u8, u32, u64])]
pub fn scatter_add_any<B: Bits, I: IndexBits>(src: &[B], ids: &[I], dst: &mut [B], left: usize, n: usize, dst_dim: usize, right: usize, dt: u32) {
    let cols = left * right;
    let step = global_size_x();
    let mut c = global_idx_x();
    while c < cols {
        let (l, r) = (c / right, c % right);
        let mut i = 0;
        while i < n {
            let k = (l * n + i) * right + r;
            if let Some(id) = slot(ids[k], dst_dim) {
                let o = (l * dst_dim + id) * right + r;
                let sum = add_val(decode(dst[o].to_u64(), dt), decode(src[k].to_u64(), dt));
                dst[o] = B::from_u64(encode(sum, dt));
            }
            i += 1;
        }
        c += step;
    }
}

/// `dst[l, ids[i], r] += src[l, i, r]` for `i` in order ("no index" skipped), dtype code
/// `dt`; `dst` contiguous `(left, dst_dim, right)`, `src` contiguous `(left, ids.len(),
/// right)`.
#[amdgpu_kernel(B = [u8, u16, u32, u64], I = [u8, u32, u64])]
pub fn index_add_any<B: Bits, I: IndexBits>(src: &[B], ids: &[I], dst: &mut [B], left: usize, dst_dim: usize, right: usize, dt: u32) {
    let n = ids.len();
    let cols = left * right;
    let step = global_size_x();
    let mut c = global_idx_x();
    while c < cols {
        let (l, r) = (c / right, c % right);
        let mut i = 0;
        while i < n {
            if let Some(id) = slot(ids[i], dst_dim) {
                let o = (l * dst_dim + id) * right + r;
                let sum = add_val(decode(dst[o].to_u64(), dt), decode(src[(l * n + i) * right + r].to_u64(), dt));
                dst[o] = B::from_u64(encode(sum, dt));
            }
            i += 1;
        }
        c += step;
    }
}

/// `out[i] = if cond[cl(i)] != 0 { t[tl(i)] } else { f[fl(i)] }` with each input read
/// through its layout (`[dims..., strides...]`, empty: contiguous).
#[amdgpu_kernel(B = [u8, u16, u32, u64], C = [u8, u32, u64])]
pub fn where_cond_any<B: Bits, C: Bits>(cond: &[C], cond_layout: &[usize], t: &[B], t_layout: &[usize], f: &[B], f_layout: &[usize], out: &mut [B]) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = if cond[strided_offset(i, cond_layout)].to_u64() != 0 {
            t[strided_offset(i, t_layout)]
        } else {
            f[strided_offset(i, f_layout)]
        };
        i += step;
    }
}

/// Checked launches for every value dtype and index dtype (`u8`, `u32`, `i64`). Shapes and
/// lengths are validated first (a rejected call returns `InvalidArgument` and writes
/// nothing); empty tensors are a no-op.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::{grid, LayoutArg, Strided};
    use crate::dtype::host::{arg_len, expect_len, invalid, product, DType, Raw};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// A Candle index dtype: `u8`, `u32` or `i64`.
    pub trait IdType: DType {}
    impl IdType for u8 {}
    impl IdType for u32 {}
    impl IdType for i64 {}

    /// Runs `$call` with `$b` the value storage type and `$i` the id storage type.
    macro_rules! by_size {
        ($t:ty, $id:ty, |$b:ident, $i:ident| $call:expr) => {{
            macro_rules! ids {
                ($bb:ty) => {
                    match std::mem::size_of::<<$id as DType>::Bits>() {
                        1 => { type $b = $bb; type $i = u8; $call }
                        4 => { type $b = $bb; type $i = u32; $call }
                        _ => { type $b = $bb; type $i = u64; $call }
                    }
                };
            }
            match std::mem::size_of::<<$t as DType>::Bits>() {
                1 => ids!(u8),
                2 => ids!(u16),
                4 => ids!(u32),
                _ => ids!(u64),
            }
        }};
    }

    fn raw<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> Raw {
        Raw(b.kernel_arg())
    }

    fn is<A: 'static, B: 'static>() -> bool {
        std::any::TypeId::of::<A>() == std::any::TypeId::of::<B>()
    }

    /// `true` for the value types of the typed kernels in [`indexing`](crate::indexing).
    fn typed<T: 'static>() -> bool {
        is::<T, f32>() || is::<T, half::f16>() || is::<T, half::bf16>() || is::<T, u8>() || is::<T, u32>()
    }

    /// `out (left, ids.len(), right) = src (left, src_dim, right)` rows picked by `ids`;
    /// all contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn index_select<T: DType, I: IdType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        src_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "index_select";
        let n = arg_len(ids);
        expect_len(K, "src", arg_len(src), product(K, &[left, src_dim, right])?)?;
        let total = product(K, &[left, n, right])?;
        expect_len(K, "out", arg_len(out), total)?;
        if total == 0 {
            return Ok(());
        }
        let (s, d, o) = (raw(src), raw(ids), out.kernel_arg());
        if typed::<T>() && (is::<I, u32>() || is::<I, i64>()) {
            macro_rules! fast {
                ($($t:ty),*) => {$(
                    if is::<T, $t>() {
                        return if is::<I, u32>() {
                            crate::indexing::ops::index_select::<$t, u32>(dev, &s, None, &d, &mut Raw(o), left, src_dim, right)
                        } else {
                            crate::indexing::ops::index_select::<$t, i64>(dev, &s, None, &d, &mut Raw(o), left, src_dim, right)
                        };
                    }
                )*};
            }
            fast!(f32, half::f16, half::bf16, u8, u32);
        }
        by_size!(T, I, |B, X| super::index_select_any::launch::<B, X>(dev, grid(total), &s, &d, &mut Raw(o), src_dim, right))
    }

    /// `out[l, i, r] = src[l, ids[l, i, r], r]`: `src` `(left, src_dim, right)`, `ids` and
    /// `out` `(left, n, right)`, all contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn gather<T: DType, I: IdType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        src_dim: usize,
        n: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "gather";
        let total = product(K, &[left, n, right])?;
        expect_len(K, "src", arg_len(src), product(K, &[left, src_dim, right])?)?;
        expect_len(K, "ids", arg_len(ids), total)?;
        expect_len(K, "out", arg_len(out), total)?;
        if total == 0 {
            return Ok(());
        }
        let (s, d, o) = (raw(src), raw(ids), out.kernel_arg());
        by_size!(T, I, |B, X| super::gather_any::launch::<B, X>(dev, grid(total), &s, &d, &mut Raw(o), src_dim, n, right))
    }

    fn check_scatter(k: &'static str, lens: [usize; 3], [left, n, dst_dim, right]: [usize; 4]) -> Result<bool, LaunchError> {
        let src_elems = product(k, &[left, n, right])?;
        let dst_elems = product(k, &[left, dst_dim, right])?;
        expect_len(k, "src", lens[0], src_elems)?;
        expect_len(k, "ids", lens[1], src_elems)?;
        expect_len(k, "dst", lens[2], dst_elems)?;
        Ok(src_elems > 0 && dst_elems > 0)
    }

    /// Candle's `scatter_set`: `dst[l, ids[l, i, r], r] = src[l, i, r]`, the last `i`
    /// winning; `dst` `(left, dst_dim, right)`, `src` and `ids` `(left, n, right)`, all
    /// contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_set<T: DType, I: IdType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        n: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        if !check_scatter("scatter_set", [arg_len(src), arg_len(ids), arg_len(dst)], [left, n, dst_dim, right])? {
            return Ok(());
        }
        let (s, d, o) = (raw(src), raw(ids), dst.kernel_arg());
        by_size!(T, I, |B, X| super::scatter_set::launch::<B, X>(dev, grid(left * right), &s, &d, &mut Raw(o), left, n, dst_dim, right))
    }

    /// Candle's `scatter_add_set` for every dtype: `dst[l, ids[l, i, r], r] += src[l, i,
    /// r]` in index order; shapes as [`scatter_set`].
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add<T: DType, I: IdType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        n: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        if !check_scatter("scatter_add", [arg_len(src), arg_len(ids), arg_len(dst)], [left, n, dst_dim, right])? {
            return Ok(());
        }
        let (s, d, o) = (raw(src), raw(ids), dst.kernel_arg());
        by_size!(T, I, |B, X| super::scatter_add_any::launch::<B, X>(dev, grid(left * right), &s, &d, &mut Raw(o), left, n, dst_dim, right, T::CODE))
    }

    /// Candle's `index_add` for every dtype: `dst[l, ids[i], r] += src[l, i, r]` in index
    /// order; `dst` `(left, dst_dim, right)`, `src` `(left, ids.len(), right)`, contiguous.
    #[allow(clippy::too_many_arguments)]
    pub fn index_add<T: DType, I: IdType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        ids: &(impl KernelArgSlice<I> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        left: usize,
        dst_dim: usize,
        right: usize,
    ) -> Result<(), LaunchError> {
        const K: &str = "index_add";
        let n = arg_len(ids);
        expect_len(K, "src", arg_len(src), product(K, &[left, n, right])?)?;
        let dst_elems = product(K, &[left, dst_dim, right])?;
        expect_len(K, "dst", arg_len(dst), dst_elems)?;
        if left * n * right == 0 || dst_elems == 0 {
            return Ok(());
        }
        let (s, d, o) = (raw(src), raw(ids), dst.kernel_arg());
        by_size!(T, I, |B, X| super::index_add_any::launch::<B, X>(dev, grid(left * right), &s, &d, &mut Raw(o), left, dst_dim, right, T::CODE))
    }

    /// Candle's `where_cond` for every value dtype and an integer condition dtype (`u8`,
    /// `u32`, `i64`, or any integer dtype of those sizes): `out.len()` elements, each
    /// input contiguous of that length or read through its view.
    pub fn where_cond<T: DType, C: DType>(
        dev: &Device,
        cond: (&(impl KernelArgSlice<C> + ?Sized), Strided<'_>),
        on_true: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        on_false: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "where_cond";
        if !crate::dtype::is_int(C::CODE) || std::mem::size_of::<C::Bits>() == 2 {
            return Err(invalid(K, format!("condition dtype {} must be u8, u32, i32 or i64", C::NAME)));
        }
        let n = arg_len(out);
        let cl = LayoutArg::new(dev, K, "cond", cond.1, n, arg_len(cond.0))?;
        let tl = LayoutArg::new(dev, K, "on_true", on_true.1, n, arg_len(on_true.0))?;
        let fl = LayoutArg::new(dev, K, "on_false", on_false.1, n, arg_len(on_false.0))?;
        if n == 0 {
            return Ok(());
        }
        let (c, t, f, o) = (raw(cond.0), raw(on_true.0), raw(on_false.0), out.kernel_arg());
        if typed::<T>() && (is::<C, u8>() || is::<C, u32>()) && cond.1.is_none() && on_true.1.is_none() && on_false.1.is_none() {
            macro_rules! fast {
                ($($t:ty),*) => {$(
                    if is::<T, $t>() {
                        return if is::<C, u8>() {
                            crate::indexing::ops::where_cond::<$t, u8>(dev, (&c, None), (&t, None), (&f, None), &mut Raw(o))
                        } else {
                            crate::indexing::ops::where_cond::<$t, u32>(dev, (&c, None), (&t, None), (&f, None), &mut Raw(o))
                        };
                    }
                )*};
            }
            fast!(f32, half::f16, half::bf16, u8, u32);
        }
        let (a, b, d) = (cl.arg(), tl.arg(), fl.arg());
        by_size!(T, C, |B, X| super::where_cond_any::launch::<B, X>(dev, grid(n), &c, &a, &t, &b, &f, &d, &mut Raw(o)))
    }
}
