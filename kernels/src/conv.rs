//! Convolution data layouts for conv = im2col + GEMM and conv_transpose = GEMM + col2im,
//! with Candle's `ParamsConv1D`/`ParamsConv2D`/`ParamsConvTranspose*` geometry (one
//! padding, stride and dilation for both spatial dims; groups are split by the caller).
//!
//! * [`im2col2d`](fn@im2col2d): input `(b, c, h, w)` (any strides, an element offset) to
//!   columns `(b, h_out, w_out, c, k_h, k_w)` (contiguous, Candle's `Im2Col` order), zero
//!   where the window reaches into the padding; conv2d is then
//!   `cols (b, h_out*w_out, c*k_h*k_w) x weight^T (c*k_h*k_w, c_out)`. Pure data movement,
//!   one instance per element size, every dtype. 1-D is the same kernel with `h = k_h = 1`.
//! * [`col2im2d`](fn@col2im2d): columns `(b, h_in, w_in, c_out, k_h, k_w)` (the GEMM
//!   `input^T (b, h_in*w_in, c_in) x weight (c_in, c_out*k_h*k_w)`) to the transposed
//!   convolution's output `(b, c_out, h_out, w_out)`,
//!   `h_out = (h_in - 1) * stride - 2 * padding + dilation * (k_h - 1) + output_padding + 1`:
//!   each output element gathers its contributions (no atomics, deterministic), summed in
//!   f32 (f32/f16/bf16) or f64.
use crate::dtype::{Bits, Real};
use kernel_dsl::prelude::*;

/// `out (b, h_out, w_out, c, k_h, k_w) = input (b, c, h, w)` windows, zero in the padding;
/// `input` element `(b, c, y, x)` is at `offset + b*s0 + c*s1 + y*s2 + x*s3`. `geom` =
/// `[c, h, w, k_h, k_w, h_out, w_out, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
/// s0, s1, s2, s3, offset]`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn im2col2d<B: Bits>(input: &[B], out: &mut [B], geom: &[usize]) {
    let g = &geom[..18];
    let (c, h, w, kh, kw, h_out, w_out) = (g[0], g[1], g[2], g[3], g[4], g[5], g[6]);
    let (sh, sw, ph, pw, dh, dw) = (g[7], g[8], g[9], g[10], g[11], g[12]);
    let (s0, s1, s2, s3, offset) = (g[13], g[14], g[15], g[16], g[17]);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let kx = i % kw;
        let t = i / kw;
        let ky = t % kh;
        let t = t / kh;
        let ci = t % c;
        let t = t / c;
        let ox = t % w_out;
        let t = t / w_out;
        let oy = t % h_out;
        let bi = t / h_out;
        let y = oy * sh + ky * dh;
        let x = ox * sw + kx * dw;
        out[i] = if y < ph || y >= h + ph || x < pw || x >= w + pw {
            B::from_u64(0)
        } else {
            input[offset + bi * s0 + ci * s1 + (y - ph) * s2 + (x - pw) * s3]
        };
        i += step;
    }
}

/// `out (b, c_out, h_out, w_out)`: the sum of the columns `col (b, h_in, w_in, c_out, k_h,
/// k_w)` that land on each output position (`y = iy*stride_h + ky*dil_h - pad_h`, same
/// for x). `geom` = `[h_in, w_in, c_out, k_h, k_w, h_out, w_out, stride_h, stride_w,
/// pad_h, pad_w, dil_h, dil_w]`.
#[amdgpu_kernel(T = [f32, f16, bf16, f64])]
pub fn col2im2d<T: Real>(col: &[T], out: &mut [T], geom: &[usize]) {
    let g = &geom[..13];
    let (h_in, w_in, c_out, kh, kw, h_out, w_out) = (g[0], g[1], g[2], g[3], g[4], g[5], g[6]);
    let (sh, sw, ph, pw, dh, dw) = (g[7], g[8], g[9], g[10], g[11], g[12]);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let x = i % w_out;
        let t = i / w_out;
        let y = t % h_out;
        let t = t / h_out;
        let co = t % c_out;
        let bi = t / c_out;
        let mut acc = T::ACC_ZERO;
        let mut ky = 0;
        while ky < kh {
            let ty = y + ph;
            let oy = ky * dh;
            if ty >= oy && (ty - oy) % sh == 0 && (ty - oy) / sh < h_in {
                let iy = (ty - oy) / sh;
                let mut kx = 0;
                while kx < kw {
                    let tx = x + pw;
                    let ox = kx * dw;
                    if tx >= ox && (tx - ox) % sw == 0 && (tx - ox) / sw < w_in {
                        let ix = (tx - ox) / sw;
                        acc = acc + col[((((bi * h_in + iy) * w_in + ix) * c_out + co) * kh + ky) * kw + kx].widen();
                    }
                    kx += 1;
                }
            }
            ky += 1;
        }
        out[i] = T::narrow(acc);
        i += step;
    }
}

/// Checked launches. Shapes follow Candle's conv parameter structs; a rejected call
/// returns `InvalidArgument` and writes nothing.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::grid;
    use crate::dtype::host::{arg_len, expect_len, invalid, product, DType, Raw};
    use crate::dtype::Real;
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// Padding, stride and dilation of a convolution (Candle's `ParamsConv*D`; the same for
    /// every spatial dim).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ConvGeometry {
        /// Zero padding on each side.
        pub padding: usize,
        /// Step between windows (>= 1).
        pub stride: usize,
        /// Step between kernel taps (>= 1).
        pub dilation: usize,
    }

    fn out_size(k: &'static str, what: &str, len: usize, kernel: usize, g: ConvGeometry) -> Result<usize, LaunchError> {
        if g.stride == 0 || g.dilation == 0 || kernel == 0 {
            return Err(invalid(k, format!("stride {}, dilation {} and kernel size {kernel} must be at least 1", g.stride, g.dilation)));
        }
        let span = g.dilation.checked_mul(kernel - 1).and_then(|s| s.checked_add(1));
        let padded = g.padding.checked_mul(2).and_then(|p| p.checked_add(len));
        match (span, padded) {
            (Some(s), Some(p)) if p >= s => Ok((p - s) / g.stride + 1),
            _ => Err(invalid(k, format!("{what}: input of {len} with padding {} is shorter than the dilated kernel ({kernel} taps, dilation {})", g.padding, g.dilation))),
        }
    }

    /// Output length of a convolution over `len` with `kernel` taps (Candle's `l_out`).
    pub fn conv_out_len(len: usize, kernel: usize, g: ConvGeometry) -> Result<usize, LaunchError> {
        out_size("conv", "length", len, kernel, g)
    }

    /// Output length of a transposed convolution (Candle's `ParamsConvTranspose*::l_out`).
    pub fn conv_transpose_out_len(len: usize, kernel: usize, g: ConvGeometry, output_padding: usize) -> Result<usize, LaunchError> {
        const K: &str = "conv_transpose";
        if g.stride == 0 || g.dilation == 0 || kernel == 0 || len == 0 {
            return Err(invalid(K, format!("stride {}, dilation {}, kernel {kernel} and input length {len} must be at least 1", g.stride, g.dilation)));
        }
        let full = (len - 1)
            .checked_mul(g.stride)
            .and_then(|v| v.checked_add(g.dilation.checked_mul(kernel - 1)?))
            .and_then(|v| v.checked_add(output_padding + 1))
            .ok_or_else(|| invalid(K, "output size overflows usize".into()))?;
        full.checked_sub(2 * g.padding)
            .filter(|&v| v > 0)
            .ok_or_else(|| invalid(K, format!("padding {} removes the whole output of {full}", g.padding)))
    }

    /// im2col for conv2d: `input` `(b, c, h, w)` read at `offset + b*s0 + c*s1 + y*s2 +
    /// x*s3` (`strides = [s0, s1, s2, s3]`); `out` contiguous `(b, h_out, w_out, c, k_h,
    /// k_w)`. Returns `(h_out, w_out)`.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col2d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        dims: [usize; 4],
        strides: [usize; 4],
        offset: usize,
        kernel: (usize, usize),
        g: ConvGeometry,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        const K: &str = "im2col2d";
        let [_, _, h, w] = dims;
        let h_out = out_size(K, "height", h, kernel.0, g)?;
        let w_out = out_size(K, "width", w, kernel.1, g)?;
        launch_im2col(dev, K, input, dims, strides, offset, [kernel.0, kernel.1, h_out, w_out], [g.stride, g.stride, g.padding, g.padding, g.dilation, g.dilation], out)?;
        Ok((h_out, w_out))
    }

    /// im2col for conv1d: `input` `(b, c, l)` read at `offset + b*s0 + c*s1 + x*s2`; `out`
    /// contiguous `(b, l_out, c, k)`. Returns `l_out`.
    #[allow(clippy::too_many_arguments)]
    pub fn im2col1d<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        dims: [usize; 3],
        strides: [usize; 3],
        offset: usize,
        kernel: usize,
        g: ConvGeometry,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<usize, LaunchError> {
        const K: &str = "im2col1d";
        let [b, c, l] = dims;
        let l_out = out_size(K, "length", l, kernel, g)?;
        launch_im2col(dev, K, input, [b, c, 1, l], [strides[0], strides[1], 0, strides[2]], offset, [1, kernel, 1, l_out], [1, g.stride, 0, g.padding, 1, g.dilation], out)?;
        Ok(l_out)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_im2col<T: DType>(
        dev: &Device,
        k: &'static str,
        input: &(impl KernelArgSlice<T> + ?Sized),
        [b, c, h, w]: [usize; 4],
        [s0, s1, s2, s3]: [usize; 4],
        offset: usize,
        [kh, kw, h_out, w_out]: [usize; 4],
        [sh, sw, ph, pw, dh, dw]: [usize; 6],
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        let n = product(k, &[b, h_out, w_out, c, kh, kw])?;
        expect_len(k, "out", arg_len(out), n)?;
        if product(k, &[b, c, h, w])? > 0 {
            let last = [(b, s0), (c, s1), (h, s2), (w, s3)]
                .iter()
                .try_fold(offset, |a, &(d, s)| (d - 1).checked_mul(s).and_then(|o| a.checked_add(o)))
                .ok_or_else(|| invalid(k, "input offsets overflow usize".into()))?;
            if last >= arg_len(input) {
                return Err(invalid(k, format!("input view reaches element {last} of a buffer of {}", arg_len(input))));
            }
        }
        if n == 0 {
            return Ok(());
        }
        let geom = dev.upload(&[c, h, w, kh, kw, h_out, w_out, sh, sw, ph, pw, dh, dw, s0, s1, s2, s3, offset])?;
        let (i, o) = (Raw(input.kernel_arg()), out.kernel_arg());
        match std::mem::size_of::<T::Bits>() {
            1 => super::im2col2d::launch::<u8>(dev, grid(n), &i, &mut Raw(o), &geom),
            2 => super::im2col2d::launch::<u16>(dev, grid(n), &i, &mut Raw(o), &geom),
            4 => super::im2col2d::launch::<u32>(dev, grid(n), &i, &mut Raw(o), &geom),
            _ => super::im2col2d::launch::<u64>(dev, grid(n), &i, &mut Raw(o), &geom),
        }
    }

    /// col2im for conv_transpose2d: `col` contiguous `(b, h_in, w_in, c_out, k_h, k_w)`,
    /// `out` contiguous `(b, c_out, h_out, w_out)` (sizes from
    /// [`conv_transpose_out_len`]). Returns `(h_out, w_out)`.
    #[allow(clippy::too_many_arguments)]
    pub fn col2im2d<T: Real + DType>(
        dev: &Device,
        col: &(impl KernelArgSlice<T> + ?Sized),
        (b, h_in, w_in, c_out): (usize, usize, usize, usize),
        kernel: (usize, usize),
        g: ConvGeometry,
        output_padding: usize,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(usize, usize), LaunchError> {
        const K: &str = "col2im2d";
        let h_out = conv_transpose_out_len(h_in, kernel.0, g, output_padding)?;
        let w_out = conv_transpose_out_len(w_in, kernel.1, g, output_padding)?;
        launch_col2im(dev, K, col, [b, h_in, w_in, c_out, kernel.0, kernel.1, h_out, w_out], [g.stride, g.stride, g.padding, g.padding, g.dilation, g.dilation], out)?;
        Ok((h_out, w_out))
    }

    /// col2im for conv_transpose1d: `col` contiguous `(b, l_in, c_out, k)`, `out`
    /// contiguous `(b, c_out, l_out)`. Returns `l_out`.
    #[allow(clippy::too_many_arguments)]
    pub fn col2im1d<T: Real + DType>(
        dev: &Device,
        col: &(impl KernelArgSlice<T> + ?Sized),
        (b, l_in, c_out): (usize, usize, usize),
        kernel: usize,
        g: ConvGeometry,
        output_padding: usize,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<usize, LaunchError> {
        const K: &str = "col2im1d";
        let l_out = conv_transpose_out_len(l_in, kernel, g, output_padding)?;
        launch_col2im(dev, K, col, [b, 1, l_in, c_out, 1, kernel, 1, l_out], [1, g.stride, 0, g.padding, 1, g.dilation], out)?;
        Ok(l_out)
    }

    fn launch_col2im<T: Real + DType>(
        dev: &Device,
        k: &'static str,
        col: &(impl KernelArgSlice<T> + ?Sized),
        [b, h_in, w_in, c_out, kh, kw, h_out, w_out]: [usize; 8],
        [sh, sw, ph, pw, dh, dw]: [usize; 6],
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        expect_len(k, "col", arg_len(col), product(k, &[b, h_in, w_in, c_out, kh, kw])?)?;
        let n = product(k, &[b, c_out, h_out, w_out])?;
        expect_len(k, "out", arg_len(out), n)?;
        if n == 0 {
            return Ok(());
        }
        let geom = dev.upload(&[h_in, w_in, c_out, kh, kw, h_out, w_out, sh, sw, ph, pw, dh, dw])?;
        super::col2im2d::launch::<T>(dev, grid(n), col, out, &geom)
    }
}
