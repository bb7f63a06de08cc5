//! Casts between all ten of Candle's dtypes (u8, u32, i16, i32, i64, bf16, f16, f32, f64,
//! f8e4m3), and `fill` / strided copy for every dtype, with kernels generic over element
//! size (see [`dtype`](crate::dtype)): 16 cast instances (source size x destination size)
//! and 4 each for fill and copy serve every pair.
//!
//! The checked launchers are in [`ops`]: [`ops::cast`] uses the typed vectorized
//! [`elementwise::cast`](fn@crate::elementwise::cast) for the pairs it has (f32, f16, bf16,
//! u8, u32, i64; same results) and [`cast_any`](fn@cast_any) for the rest.
use crate::dtype::{decode_as, encode_as, Bits};
use crate::elementwise::strided_offset;
use kernel_dsl::prelude::*;

/// `out[i] = input[layout(i)]` converted from dtype `src_dt` to `dst_dt` (codes of
/// [`dtype`](crate::dtype)), Candle's rules.
#[amdgpu_kernel(S = [u8, u16, u32, u64], D = [u8, u16, u32, u64])]
pub fn cast_any<S: Bits, D: Bits>(input: &[S], layout: &[usize], out: &mut [D], src_dt: u32, dst_dt: u32) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let v = decode_as(input[strided_offset(i, layout)], src_dt);
        out[i] = encode_as(v, dst_dt);
        i += step;
    }
}

/// `out[i] = value` for any dtype of this size.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn fill_bits<B: Bits>(out: &mut [B], value: B) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = value;
        i += step;
    }
}

/// `out[i] = input[layout(i)]` for any dtype of this size (a strided view made
/// contiguous).
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn copy_strided_bits<B: Bits>(input: &[B], layout: &[usize], out: &mut [B]) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = input[strided_offset(i, layout)];
        i += step;
    }
}

/// `dst[dst_off + i * dst_stride + j] = src[src_off + i * src_stride + j]` for 8-byte
/// elements (the typed [`copy2d`](fn@crate::indexing::copy2d) serves 1, 2 and 4 bytes).
#[amdgpu_kernel(B = [u64])]
pub fn copy2d_bits<B: Bits>(src: &[B], dst: &mut [B], d1: usize, d2: usize, src_stride: usize, dst_stride: usize, src_off: usize, dst_off: usize) {
    let n = d1 * d2;
    let step = global_size_x();
    let mut e = global_idx_x();
    while e < n {
        let (i, j) = (e / d2, e % d2);
        dst[dst_off + i * dst_stride + j] = src[src_off + i * src_stride + j];
        e += step;
    }
}

/// Checked launches for every dtype ([`DType`](crate::dtype::host::DType)): lengths and
/// views are validated first (a rejected call returns `InvalidArgument` and writes
/// nothing); empty tensors are a no-op.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::dtype::host::{arg_len, view_layout, DType, Raw};
    use crate::runtime::{Device, DeviceVec};
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// A strided input view: `(dims, strides)` in elements (row-major, stride 0
    /// broadcasts). `None` reads the buffer contiguously.
    pub type Strided<'a> = Option<(&'a [usize], &'a [usize])>;

    /// The layout argument of a view, uploaded to `dev` (empty for contiguous reads).
    pub(crate) struct LayoutArg(Option<std::sync::Arc<DeviceVec<usize>>>);

    impl LayoutArg {
        /// Checks `view` against `elems` and `len` and uploads it.
        pub(crate) fn new(dev: &Device, kernel: &'static str, arg: &str, view: Strided<'_>, elems: usize, len: usize) -> Result<LayoutArg, LaunchError> {
            let layout = match view {
                Some((d, s)) => view_layout(kernel, arg, d, s, elems, len)?,
                None => {
                    crate::dtype::host::expect_len(kernel, arg, len, elems)?;
                    Vec::new()
                }
            };
            Ok(LayoutArg(if layout.is_empty() { None } else { Some(dev.upload_shared(&layout)?) }))
        }

        /// The kernel argument.
        pub(crate) fn arg(&self) -> Raw {
            Raw(match &self.0 {
                Some(b) => b.kernel_arg(),
                None => KernelArgSlice::<usize>::kernel_arg(&[0usize; 0]),
            })
        }
    }

    /// Launch shape for `n` independent elements (grid-stride kernels).
    pub(crate) fn grid(n: usize) -> kernel_dsl::host::LaunchConfig {
        crate::indexing::elements_config(n)
    }

    fn raw<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> Raw {
        Raw(b.kernel_arg())
    }

    /// `out = input as D` elementwise, Candle's `to_dtype` rules (see
    /// [`dtype`](crate::dtype)); `input` contiguous with `out.len()` elements or read
    /// through `view`.
    pub fn cast<S: DType, D: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<S> + ?Sized),
        view: Strided<'_>,
        out: &mut (impl KernelArgSliceMut<D> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "cast";
        let n = arg_len(out);
        let layout = LayoutArg::new(dev, K, "input", view, n, arg_len(input))?;
        if n == 0 {
            return Ok(());
        }
        if let Some(r) = typed_cast::<S, D>(dev, input, &layout, out, n) {
            return r;
        }
        let (i, l, o) = (raw(input), layout.arg(), raw(out));
        macro_rules! go {
            ($($s:ty),*) => {{
                $(
                    if std::mem::size_of::<S::Bits>() == std::mem::size_of::<$s>() {
                        return match std::mem::size_of::<D::Bits>() {
                            1 => super::cast_any::launch::<$s, u8>(dev, grid(n), &i, &l, &mut Raw(o.0), S::CODE, D::CODE),
                            2 => super::cast_any::launch::<$s, u16>(dev, grid(n), &i, &l, &mut Raw(o.0), S::CODE, D::CODE),
                            4 => super::cast_any::launch::<$s, u32>(dev, grid(n), &i, &l, &mut Raw(o.0), S::CODE, D::CODE),
                            _ => super::cast_any::launch::<$s, u64>(dev, grid(n), &i, &l, &mut Raw(o.0), S::CODE, D::CODE),
                        };
                    }
                )*
                unreachable!("dtype sizes are 1, 2, 4 or 8 bytes")
            }};
        }
        go!(u8, u16, u32, u64)
    }

    /// The vectorized typed cast for pairs of f32/f16/bf16/u8/u32/i64 (the same results as
    /// `cast_any`); `None` for other pairs.
    fn typed_cast<S: DType, D: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<S> + ?Sized),
        layout: &LayoutArg,
        out: &mut (impl KernelArgSliceMut<D> + ?Sized),
        n: usize,
    ) -> Option<Result<(), LaunchError>> {
        use half::{bf16, f16};
        use std::any::TypeId;
        let (i, l, o) = (raw(input), layout.arg(), raw(out));
        let cfg = crate::elementwise::launch_config(n);
        macro_rules! pairs {
            ($($s:ty),*) => {$(
                if TypeId::of::<S>() == TypeId::of::<$s>() {
                    return pairs!(@d $s; f32, f16, bf16, u8, u32, i64);
                }
            )*};
            (@d $s:ty; $($d:ty),*) => {{
                $(
                    if TypeId::of::<D>() == TypeId::of::<$d>() {
                        return Some(crate::elementwise::cast::launch::<$s, $d>(dev, cfg, &i, &l, &mut Raw(o.0)));
                    }
                )*
                None
            }};
        }
        pairs!(f32, f16, bf16, u8, u32, i64);
        None
    }

    /// `out[i] = value` for every element, any dtype.
    pub fn fill<T: DType>(dev: &Device, out: &mut (impl KernelArgSliceMut<T> + ?Sized), value: T) -> Result<(), LaunchError> {
        let n = arg_len(out);
        if n == 0 {
            return Ok(());
        }
        let o = Raw(out.kernel_arg());
        let bits = value.to_bits();
        use crate::dtype::Bits;
        let v = bits.to_u64();
        match std::mem::size_of::<T::Bits>() {
            1 => super::fill_bits::launch::<u8>(dev, grid(n), &mut Raw(o.0), v as u8),
            2 => super::fill_bits::launch::<u16>(dev, grid(n), &mut Raw(o.0), v as u16),
            4 => super::fill_bits::launch::<u32>(dev, grid(n), &mut Raw(o.0), v as u32),
            _ => super::fill_bits::launch::<u64>(dev, grid(n), &mut Raw(o.0), v),
        }
    }

    /// `out = input` read through `view` (`dims`, `strides`), made contiguous; any dtype.
    pub fn copy_strided<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        view: Strided<'_>,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "copy_strided";
        let n = arg_len(out);
        let layout = LayoutArg::new(dev, K, "input", view, n, arg_len(input))?;
        if n == 0 {
            return Ok(());
        }
        let (i, l, o) = (raw(input), layout.arg(), out.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => super::copy_strided_bits::launch::<u8>(dev, grid(n), &i, &l, &mut Raw(o)),
            2 => super::copy_strided_bits::launch::<u16>(dev, grid(n), &i, &l, &mut Raw(o)),
            4 => super::copy_strided_bits::launch::<u32>(dev, grid(n), &i, &l, &mut Raw(o)),
            _ => super::copy_strided_bits::launch::<u64>(dev, grid(n), &i, &l, &mut Raw(o)),
        }
    }

    /// Candle's `copy2d` for every dtype: `dst[dst_off + i * dst_stride + j] =
    /// src[src_off + i * src_stride + j]` for `i < d1`, `j < d2`, with the checks of
    /// [`indexing::ops::copy2d`](crate::indexing::ops::copy2d) (regions inside their
    /// buffers, destination rows not overlapping).
    #[allow(clippy::too_many_arguments)]
    pub fn copy2d<T: DType>(
        dev: &Device,
        src: &(impl KernelArgSlice<T> + ?Sized),
        dst: &mut (impl KernelArgSliceMut<T> + ?Sized),
        d1: usize,
        d2: usize,
        src_stride: usize,
        dst_stride: usize,
        src_off: usize,
        dst_off: usize,
    ) -> Result<(), LaunchError> {
        use crate::indexing::ops::copy2d as typed;
        let (s, d) = (raw(src), dst.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => typed::<u8>(dev, &s, &mut Raw(d), d1, d2, src_stride, dst_stride, src_off, dst_off),
            2 => typed::<half::f16>(dev, &s, &mut Raw(d), d1, d2, src_stride, dst_stride, src_off, dst_off),
            4 => typed::<u32>(dev, &s, &mut Raw(d), d1, d2, src_stride, dst_stride, src_off, dst_off),
            _ => {
                // The same validation as the typed launcher, on an empty 4-byte stand-in of
                // the same lengths, then the 8-byte kernel.
                let lens = |a: kernel_dsl::host::ArgValue| match a {
                    kernel_dsl::host::ArgValue::Slice { len, .. } => len,
                    _ => 0,
                };
                let (sl, dl) = (lens(s.0), lens(d));
                check_copy2d(d1, d2, src_stride, dst_stride, src_off, dst_off, sl, dl)?;
                if d1 == 0 || d2 == 0 {
                    return Ok(());
                }
                super::copy2d_bits::launch::<u64>(dev, grid(d1 * d2), &s, &mut Raw(d), d1, d2, src_stride, dst_stride, src_off, dst_off)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_copy2d(d1: usize, d2: usize, src_stride: usize, dst_stride: usize, src_off: usize, dst_off: usize, sl: usize, dl: usize) -> Result<(), LaunchError> {
        use crate::dtype::host::invalid;
        const K: &str = "copy2d";
        if d1 == 0 || d2 == 0 {
            return Ok(());
        }
        if d1 > 1 && d2 > dst_stride {
            return Err(invalid(K, format!("rows of {d2} elements overlap at dst_stride {dst_stride}")));
        }
        for (arg, len, stride, off) in [("src", sl, src_stride, src_off), ("dst", dl, dst_stride, dst_off)] {
            let end = (d1 - 1).checked_mul(stride).and_then(|v| v.checked_add(off)).and_then(|v| v.checked_add(d2));
            if !matches!(end, Some(e) if e <= len) {
                return Err(invalid(K, format!("{d1} rows of {d2} at offset {off}, stride {stride} do not fit `{arg}` of {len} elements")));
            }
        }
        Ok(())
    }
}
