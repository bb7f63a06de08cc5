//! Pooling and resizing of NCHW tensors, with candle-core 0.11.1's CPU semantics; inputs
//! are any strided view `(b, c, h, w)` with an element offset, outputs contiguous.
//!
//! * [`max_pool2d_any`](fn@max_pool2d_any): window maximum, every dtype. As in Candle the
//!   running maximum starts at the window's first element and is replaced by any larger
//!   element, so a NaN is returned only when it is the window's first element.
//! * [`avg_pool2d`](fn@avg_pool2d): window sum times `1 / (k_h*k_w)`, f32/f16/bf16 summed
//!   in f32, f64 in f64.
//! * [`upsample_nearest2d_bits`](fn@upsample_nearest2d_bits): source index
//!   `min(n_in - 1, floor(i * (n_in / n_out)))` computed in f64 like Candle; 1-D is the
//!   same kernel with `h = 1`. Every dtype.
//! * [`upsample_bilinear2d_any`](fn@upsample_bilinear2d_any): PyTorch's
//!   `align_corners` true/false and optional scale factors as Candle computes them, in
//!   f64, written back with Candle's `from_f64` rules; every dtype. Equal input and output
//!   sizes copy the input.
use crate::dtype::{decode, encode, Bits, Real, Val};
use kernel_dsl::prelude::*;

/// Maximum over each `k_h x k_w` window at stride `(s_h, s_w)`; `geom` = `[c, h, w, k_h,
/// k_w, s_h, s_w, h_out, w_out, s0, s1, s2, s3, offset]`, dtype code `dt`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn max_pool2d_any<B: Bits>(input: &[B], out: &mut [B], geom: &[usize], dt: u32) {
    let g = &geom[..14];
    let (c, kh, kw, sh, sw, h_out, w_out) = (g[0], g[3], g[4], g[5], g[6], g[7], g[8]);
    let (s0, s1, s2, s3, offset) = (g[9], g[10], g[11], g[12], g[13]);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let ox = i % w_out;
        let t = i / w_out;
        let oy = t % h_out;
        let t = t / h_out;
        let base = offset + (t / c) * s0 + (t % c) * s1 + oy * sh * s2 + ox * sw * s3;
        let mut best = input[base];
        let mut bv = decode(best.to_u64(), dt);
        let mut m = 0;
        while m < kh {
            let mut k = 0;
            while k < kw {
                let e = input[base + m * s2 + k * s3];
                let v = decode(e.to_u64(), dt);
                if less(bv, v) {
                    best = e;
                    bv = v;
                }
                k += 1;
            }
            m += 1;
        }
        out[i] = best;
        i += step;
    }
}

/// `a < b` for two values of one dtype (false when either float is NaN).
#[device]
#[inline(always)]
pub fn less(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => x < y,
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => x < y,
        _ => false,
    }
}

/// Mean over each window (sum times `1 / (k_h*k_w)`); `geom` as for
/// [`max_pool2d_any`](fn@max_pool2d_any).
#[amdgpu_kernel(T = [f32, f16, bf16, f64])]
pub fn avg_pool2d<T: Real>(input: &[T], out: &mut [T], geom: &[usize]) {
    let g = &geom[..14];
    let (c, kh, kw, sh, sw, h_out, w_out) = (g[0], g[3], g[4], g[5], g[6], g[7], g[8]);
    let (s0, s1, s2, s3, offset) = (g[9], g[10], g[11], g[12], g[13]);
    let scale = T::acc(1.0 / (kh * kw) as f64);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let ox = i % w_out;
        let t = i / w_out;
        let oy = t % h_out;
        let t = t / h_out;
        let base = offset + (t / c) * s0 + (t % c) * s1 + oy * sh * s2 + ox * sw * s3;
        let mut acc = T::ACC_ZERO;
        let mut m = 0;
        while m < kh {
            let mut k = 0;
            while k < kw {
                acc = acc + input[base + m * s2 + k * s3].widen();
                k += 1;
            }
            m += 1;
        }
        out[i] = T::narrow(acc * scale);
        i += step;
    }
}

/// Nearest-neighbour resize; `geom` = `[c, h, w, h_out, w_out, s0, s1, s2, s3, offset]`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn upsample_nearest2d_bits<B: Bits>(input: &[B], out: &mut [B], geom: &[usize]) {
    let g = &geom[..10];
    let (c, h, w, h_out, w_out) = (g[0], g[1], g[2], g[3], g[4]);
    let (s0, s1, s2, s3, offset) = (g[5], g[6], g[7], g[8], g[9]);
    let (fh, fw) = (h as f64 / h_out as f64, w as f64 / w_out as f64);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let ox = i % w_out;
        let t = i / w_out;
        let oy = t % h_out;
        let t = t / h_out;
        let y = min_usize(h - 1, (oy as f64 * fh) as usize);
        let x = min_usize(w - 1, (ox as f64 * fw) as usize);
        out[i] = input[offset + (t / c) * s0 + (t % c) * s1 + y * s2 + x * s3];
        i += step;
    }
}

/// `min(a, b)`.
#[device]
#[inline(always)]
pub fn min_usize(a: usize, b: usize) -> usize {
    if a < b { a } else { b }
}

/// Source position, neighbour and weight along one axis of a bilinear resize (Candle's
/// formula): `(i0, i1, weight of i1)`.
#[device]
#[inline(always)]
pub fn bilinear_axis(o: usize, n_in: usize, scale: f64, align_corners: bool) -> (usize, usize, f64) {
    let src = if align_corners { scale * o as f64 } else { scale * (o as f64 + 0.5) - 0.5 };
    let src = if src > 0.0 { src } else { 0.0 };
    // `src >= 0`, so truncation is floor; clamped to the input (Candle would index out of
    // bounds there, with a scale factor much smaller than the size ratio).
    let i0 = min_usize(src as usize, n_in - 1);
    let i1 = min_usize(i0 + 1, n_in - 1);
    let wgt = src - i0 as f64;
    let wgt = if wgt < 0.0 { 0.0 } else if wgt > 1.0 { 1.0 } else { wgt };
    (i0, i1, wgt)
}

/// Bilinear resize in f64; `geom` = `[c, h, w, h_out, w_out, s0, s1, s2, s3, offset,
/// align_corners]`, `scale_h`/`scale_w` the source step per output step (Candle's
/// `scale_h`/`scale_w`), dtype code `dt`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn upsample_bilinear2d_any<B: Bits>(input: &[B], out: &mut [B], geom: &[usize], dt: u32, scale_h: f64, scale_w: f64) {
    let g = &geom[..11];
    let (c, h, w, h_out, w_out) = (g[0], g[1], g[2], g[3], g[4]);
    let (s0, s1, s2, s3, offset) = (g[5], g[6], g[7], g[8], g[9]);
    let align = g[10] != 0;
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let ox = i % w_out;
        let t = i / w_out;
        let oy = t % h_out;
        let t = t / h_out;
        let base = offset + (t / c) * s0 + (t % c) * s1;
        if h == h_out && w == w_out {
            out[i] = input[base + oy * s2 + ox * s3];
        } else {
            let (h0, h1, wh) = bilinear_axis(oy, h, scale_h, align);
            let (w0, w1, ww) = bilinear_axis(ox, w, scale_w, align);
            let v = |y: usize, x: usize| crate::dtype::val_to_f64(decode(input[base + y * s2 + x * s3].to_u64(), dt));
            let top = v(h0, w0) * (1.0 - ww) + v(h0, w1) * ww;
            let bottom = v(h1, w0) * (1.0 - ww) + v(h1, w1) * ww;
            let value = top * (1.0 - wh) + bottom * wh;
            out[i] = B::from_u64(encode(Val::Wide(value), dt));
        }
        i += step;
    }
}

/// Checked launches: `input` `(b, c, h, w)` at `offset + b*s0 + c*s1 + y*s2 + x*s3`
/// (`strides = [s0, s1, s2, s3]`), `out` contiguous `(b, c, h_out, w_out)`. A rejected
/// call returns `InvalidArgument` and writes nothing.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::grid;
    use crate::dtype::host::{arg_len, expect_len, invalid, product, DType, Raw};
    use crate::dtype::Real;
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// An NCHW input view.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Nchw {
        /// `[b, c, h, w]`.
        pub dims: [usize; 4],
        /// Element strides of the four dims.
        pub strides: [usize; 4],
        /// Element offset of `(0, 0, 0, 0)`.
        pub offset: usize,
    }

    impl Nchw {
        /// A contiguous `(b, c, h, w)` tensor at offset 0.
        pub fn contiguous(dims: [usize; 4]) -> Nchw {
            let [_, c, h, w] = dims;
            Nchw { dims, strides: [c * h * w, h * w, w, 1], offset: 0 }
        }

        fn check(&self, k: &'static str, len: usize) -> Result<(), LaunchError> {
            if product(k, &self.dims)? > 0 {
                let last = self
                    .dims
                    .iter()
                    .zip(self.strides)
                    .try_fold(self.offset, |a, (&d, s)| (d - 1).checked_mul(s).and_then(|o| a.checked_add(o)))
                    .ok_or_else(|| invalid(k, "input offsets overflow usize".into()))?;
                if last >= len {
                    return Err(invalid(k, format!("input view {self:?} reaches element {last} of a buffer of {len}")));
                }
            }
            Ok(())
        }
    }

    fn pooled(k: &'static str, x: &Nchw, kernel: (usize, usize), stride: (usize, usize)) -> Result<(usize, usize), LaunchError> {
        let [_, _, h, w] = x.dims;
        if kernel.0 == 0 || kernel.1 == 0 || stride.0 == 0 || stride.1 == 0 {
            return Err(invalid(k, format!("kernel {kernel:?} and stride {stride:?} must be at least 1")));
        }
        if h < kernel.0 || w < kernel.1 {
            return Err(invalid(k, format!("input {h}x{w} is smaller than the kernel {kernel:?}")));
        }
        Ok(((h - kernel.0) / stride.0 + 1, (w - kernel.1) / stride.1 + 1))
    }

    fn pool_geom(dev: &Device, x: &Nchw, kernel: (usize, usize), stride: (usize, usize), (h_out, w_out): (usize, usize)) -> Result<crate::runtime::DeviceVec<usize>, LaunchError> {
        let [_, c, h, w] = x.dims;
        let [s0, s1, s2, s3] = x.strides;
        dev.upload(&[c, h, w, kernel.0, kernel.1, stride.0, stride.1, h_out, w_out, s0, s1, s2, s3, x.offset])
    }

    /// Candle's `max_pool2d(kernel, stride)`, any dtype. Returns `(h_out, w_out)`.
    pub fn max_pool2d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        x: Nchw,
        kernel: (usize, usize),
        stride: (usize, usize),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        const K: &str = "max_pool2d";
        let hw = pooled(K, &x, kernel, stride)?;
        x.check(K, arg_len(input))?;
        let n = product(K, &[x.dims[0], x.dims[1], hw.0, hw.1])?;
        expect_len(K, "out", arg_len(out), n)?;
        if n == 0 {
            return Ok(hw);
        }
        let geom = pool_geom(dev, &x, kernel, stride, hw)?;
        let (i, o) = (Raw(input.kernel_arg()), out.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => super::max_pool2d_any::launch::<u8>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE),
            2 => super::max_pool2d_any::launch::<u16>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE),
            4 => super::max_pool2d_any::launch::<u32>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE),
            _ => super::max_pool2d_any::launch::<u64>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE),
        }?;
        Ok(hw)
    }

    /// Candle's `avg_pool2d(kernel, stride)` for f32, f16, bf16 and f64. Returns `(h_out, w_out)`.
    pub fn avg_pool2d<T: Real + DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        x: Nchw,
        kernel: (usize, usize),
        stride: (usize, usize),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        const K: &str = "avg_pool2d";
        let hw = pooled(K, &x, kernel, stride)?;
        x.check(K, arg_len(input))?;
        let n = product(K, &[x.dims[0], x.dims[1], hw.0, hw.1])?;
        expect_len(K, "out", arg_len(out), n)?;
        if n == 0 {
            return Ok(hw);
        }
        let geom = pool_geom(dev, &x, kernel, stride, hw)?;
        super::avg_pool2d::launch::<T>(dev, grid(n), input, out, &geom)?;
        Ok(hw)
    }

    fn resize_check(k: &'static str, x: &Nchw, h_out: usize, w_out: usize, len: usize, out_len: usize) -> Result<usize, LaunchError> {
        let [b, c, h, w] = x.dims;
        x.check(k, len)?;
        let n = product(k, &[b, c, h_out, w_out])?;
        if n > 0 && (h == 0 || w == 0) {
            return Err(invalid(k, format!("cannot resize an empty {h}x{w} image to {h_out}x{w_out}")));
        }
        expect_len(k, "out", out_len, n)?;
        Ok(n)
    }

    /// Candle's `upsample_nearest2d(h_out, w_out)` (and `upsample_nearest1d` with `h = 1`,
    /// `h_out = 1`), any dtype.
    pub fn upsample_nearest2d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        x: Nchw,
        (h_out, w_out): (usize, usize),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "upsample_nearest2d";
        let n = resize_check(K, &x, h_out, w_out, arg_len(input), arg_len(out))?;
        if n == 0 {
            return Ok(());
        }
        let [_, c, h, w] = x.dims;
        let [s0, s1, s2, s3] = x.strides;
        let geom = dev.upload(&[c, h, w, h_out, w_out, s0, s1, s2, s3, x.offset])?;
        let (i, o) = (Raw(input.kernel_arg()), out.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => super::upsample_nearest2d_bits::launch::<u8>(dev, grid(n), &i, &mut Raw(o), &geom),
            2 => super::upsample_nearest2d_bits::launch::<u16>(dev, grid(n), &i, &mut Raw(o), &geom),
            4 => super::upsample_nearest2d_bits::launch::<u32>(dev, grid(n), &i, &mut Raw(o), &geom),
            _ => super::upsample_nearest2d_bits::launch::<u64>(dev, grid(n), &i, &mut Raw(o), &geom),
        }
    }

    /// Candle's `upsample_nearest1d(l_out)`: `input` `(b, c, l)` at `offset + b*s0 + c*s1 +
    /// x*s2`, `out` contiguous `(b, c, l_out)`.
    pub fn upsample_nearest1d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        dims: [usize; 3],
        strides: [usize; 3],
        offset: usize,
        l_out: usize,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        let x = Nchw { dims: [dims[0], dims[1], 1, dims[2]], strides: [strides[0], strides[1], 0, strides[2]], offset };
        upsample_nearest2d::<T>(dev, input, x, (1, l_out), out)
    }

    /// Candle's `upsample_bilinear2d(h_out, w_out, align_corners, scale_h, scale_w)`, any
    /// dtype: computed in f64 and written back with Candle's `from_f64` rules.
    #[allow(clippy::too_many_arguments)]
    pub fn upsample_bilinear2d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        x: Nchw,
        (h_out, w_out): (usize, usize),
        align_corners: bool,
        scale_h: Option<f64>,
        scale_w: Option<f64>,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "upsample_bilinear2d";
        let n = resize_check(K, &x, h_out, w_out, arg_len(input), arg_len(out))?;
        for s in [scale_h, scale_w].into_iter().flatten() {
            if !(s.is_finite() && s > 0.0) {
                return Err(invalid(K, format!("scale factor {s} must be finite and positive")));
            }
        }
        if n == 0 {
            return Ok(());
        }
        let [_, c, h, w] = x.dims;
        // Candle's (PyTorch's) source step per output step.
        let step = |n_in: usize, n_out: usize, factor: Option<f64>| -> f64 {
            if align_corners {
                if n_out > 1 { (n_in - 1) as f64 / (n_out - 1) as f64 } else { 0.0 }
            } else if let Some(f) = factor {
                1.0 / f
            } else {
                n_in as f64 / n_out as f64
            }
        };
        let (sh, sw) = (step(h, h_out, scale_h), step(w, w_out, scale_w));
        let [s0, s1, s2, s3] = x.strides;
        let geom = dev.upload(&[c, h, w, h_out, w_out, s0, s1, s2, s3, x.offset, align_corners as usize])?;
        let (i, o) = (Raw(input.kernel_arg()), out.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => super::upsample_bilinear2d_any::launch::<u8>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE, sh, sw),
            2 => super::upsample_bilinear2d_any::launch::<u16>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE, sh, sw),
            4 => super::upsample_bilinear2d_any::launch::<u32>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE, sh, sw),
            _ => super::upsample_bilinear2d_any::launch::<u64>(dev, grid(n), &i, &mut Raw(o), &geom, T::CODE, sh, sw),
        }
    }
}
