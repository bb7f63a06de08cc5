//! Casts between all ten of Candle's dtypes (u8, u32, i16, i32, i64, bf16, f16, f32, f64,
//! f8e4m3), and `fill` / strided copy for every dtype, with kernels generic over element
//! size (see [`dtype`](crate::dtype)): 16 cast instances (source size x destination size)
//! and 4 each for fill and copy serve every pair.
//!
//! The checked launchers are in [`ops`]: [`ops::cast`] uses the typed vectorized
//! [`elementwise::cast`](fn@crate::elementwise::cast) for the pairs it has (f32, f16, bf16,
//! u8, u32, i64; same results) and [`cast_any`](fn@cast_any) for the rest.
use crate::dtype::{decode, encode, Bits};
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
        let v = decode(input[strided_offset(i, layout)].to_u64(), src_dt);
        out[i] = D::from_u64(encode(v, dst_dt));
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
    pub(crate) struct LayoutArg(Option<DeviceVec<usize>>);

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
            Ok(LayoutArg(if layout.is_empty() { None } else { Some(dev.upload(&layout)?) }))
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
}
