//! Convolutions as im2col/col2im kernels + the backend's GEMM, pools and upsampling.
use super::any::any_dispatch;
use super::matmul::gemm;
use crate::gemm::{GemmOperand, GemmShape};
use super::{alloc, float_dispatch};
use crate::buffer::{Buf, BufElem, Region};
use crate::error::{at, invalid, unsupported};
use candle_core::conv::{ParamsConv1D, ParamsConv2D, ParamsConvTranspose1D, ParamsConvTranspose2D};
use candle_core::{DType, Layout, Result};
use kernels::conv::ops::{self as kc, ConvGeometry};
use kernels::conv_implicit::{self, Conv2dShape, FilterLayout, NhwcKernel};
use kernels::pool::ops::{self as kp, Nchw};
use kernels::runtime::Device;

fn dims4(l: &Layout, op: &'static str) -> Result<([usize; 4], [usize; 4])> {
    match (l.dims(), l.stride()) {
        ([a, b, c, d], [s0, s1, s2, s3]) => Ok(([*a, *b, *c, *d], [*s0, *s1, *s2, *s3])),
        _ => Err(invalid(op, format!("expected 4 dims, got {:?}", l.dims()))),
    }
}

fn dims3(l: &Layout, op: &'static str) -> Result<([usize; 3], [usize; 3])> {
    match (l.dims(), l.stride()) {
        ([a, b, c], [s0, s1, s2]) => Ok(([*a, *b, *c], [*s0, *s1, *s2])),
        _ => Err(invalid(op, format!("expected 3 dims, got {:?}", l.dims()))),
    }
}

/// The whole buffer from offset 0 (kernels taking an explicit offset read through it).
fn whole(buf: &Buf) -> Result<Region> {
    buf.region(0, buf.len())
}

/// The view as a contiguous buffer (the buffer itself or a copy).
fn contiguous_buf(dev: &Device, buf: &Buf, l: &Layout) -> Result<Option<Buf>> {
    if l.is_contiguous() && l.start_offset() == 0 && buf.len() == l.shape().elem_count() {
        return Ok(None);
    }
    let mut copy = Buf::uninit(dev, buf.dtype(), l.shape().elem_count())?;
    super::elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
    Ok(Some(copy))
}

/// `out (b, c_out, spatial) = kernel[:, k0 .. k0 + k] x col^T`, the kernel `(c_out,
/// row_len)` (columns `k0 ..` of each row: one group of input channels, read in place),
/// `col` contiguous `(b, spatial, k)`.
#[allow(clippy::too_many_arguments)]
fn conv_gemm(dev: &Device, col: &Buf, kernel: &Buf, kl: &Layout, (k0, row_len): (usize, usize), b: usize, spatial: usize, k: usize, c_out: usize, op: &'static str) -> Result<Buf> {
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    if kb.len() != c_out * row_len || k0 + k > row_len {
        return Err(invalid(op, format!("kernel has {} elements, {c_out} x {row_len} expected", kb.len())));
    }
    let a = GemmOperand { data: kb.region(k0, kb.len() - k0)?, batch: 0, row: row_len, col: 1 };
    let bm = GemmOperand { data: whole(col)?, batch: spatial * k, row: 1, col: k };
    float_dispatch!(col.dtype(), op, T => {
        let mut out = alloc::<T>(dev, b * c_out * spatial, op)?;
        gemm::<T>(dev, &a, &bm, &mut out, GemmShape { batch: b, m: c_out, n: spatial, k })?;
        Ok(T::wrap(out))
    })
}

thread_local! {
    static IMPLICIT_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the conv2d calls it issues taking the implicit-GEMM kernel (unless
/// `CANDLE_ROCM_CONV=im2col`): on the CPU executor (emulated lane by lane, as on a GPU)
/// instead of im2col + `matmul_simple`, tests of the GPU path without a GPU; on a GPU
/// also where im2col + the vendor BLAS would run.
pub fn with_implicit_conv_on_cpu<R>(f: impl FnOnce() -> R) -> R {
    crate::blas::with_thread_flag(&IMPLICIT_ON_CPU, f)
}

/// `true` where conv2d takes the implicit-GEMM kernel (f16/bf16, not 1x1): by default
/// on a GPU without a vendor BLAS (the kernel against im2col + our GEMM kernels), and
/// inside [`with_implicit_conv_on_cpu`]. A GPU whose vendor BLAS is
/// loaded and allowed takes im2col + that BLAS instead: on an H200 (session s1, f16, SD
/// 1.5 layers) the implicit kernel reached 3-63 TFLOP/s against cuDNN's 100-764, below
/// what a vendor GEMM on the im2col buffer gives. `CANDLE_ROCM_CONV` (read once; the whole
/// process) overrides: `implicit` takes the kernel on every GPU, `im2col` never (1x1
/// convolutions included, see `conv2d_pointwise`); `nhwc` takes the channels-last kernel
/// on every GPU wherever it can, where `Auto` takes it only where its layout copies pay;
/// `tiled` is `Auto` with the channels-last convolutions kept off Hopper's wgmma kernel
/// ([`conv2d_channels_last`](kernels::conv_implicit::conv2d_channels_last); this one as `Auto` elsewhere).
pub fn implicit_conv_allowed(dev: &Device) -> bool {
    match conv_choice() {
        ConvChoice::Im2col => false,
        ConvChoice::Implicit => dev.is_gpu() || IMPLICIT_ON_CPU.with(|k| k.get()),
        ConvChoice::Auto | ConvChoice::Tiled | ConvChoice::Nhwc => IMPLICIT_ON_CPU.with(|k| k.get()) || (dev.is_gpu() && !(crate::blas::blas_allowed() && crate::blas::available(dev))),
    }
}

/// The `CANDLE_ROCM_CONV` override.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConvChoice {
    Auto,
    Implicit,
    Nhwc,
    /// As `Auto`, with the channels-last convolutions on the GEMM pipeline's kernel
    /// where Hopper's wgmma kernel would run (an A/B switch for benchmarks).
    Tiled,
    Im2col,
}

fn conv_choice() -> ConvChoice {
    static CHOICE: std::sync::OnceLock<ConvChoice> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("CANDLE_ROCM_CONV").as_deref() {
        Ok("im2col") => ConvChoice::Im2col,
        Ok("implicit") => ConvChoice::Implicit,
        Ok("nhwc") => ConvChoice::Nhwc,
        Ok("tiled") => ConvChoice::Tiled,
        _ => ConvChoice::Auto,
    })
}

/// `true` with `CANDLE_ROCM_CONV=im2col` in the environment (read once): every conv2d
/// takes im2col + GEMM, 1x1 ones included (the path before the implicit-GEMM kernel).
fn im2col_forced() -> bool {
    conv_choice() == ConvChoice::Im2col
}

/// The stride between consecutive positions of the flattened `h x w` plane of a view
/// with strides `s2`, `s3` (`None` when the plane does not flatten to one stride): 1 for
/// NCHW, `c` for a channels-last view.
fn plane_stride(h: usize, w: usize, s2: usize, s3: usize) -> Option<usize> {
    match (h, w) {
        _ if h * w <= 1 => Some(1),
        (_, 1) => Some(s2),
        (1, _) => Some(s3),
        _ if s2 == w * s3 => Some(s3),
        _ => None,
    }
}

/// A 1x1 convolution with stride 1 and no padding whose input's spatial plane flattens to
/// one stride (NCHW, or a channels-last view such as a transformer block's output seen as
/// `(b, c, h, w)`), as one batched GEMM `y[b] (c_out x hw) = W (c_out x c_in) x[b] (c_in x
/// hw)` on the input in place (no copy, no im2col; a channels-last `x[b]` is a transposed
/// operand); `None` for other convolutions and dtypes.
fn conv2d_pointwise(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConv2D) -> Result<Option<Buf>> {
    const OP: &str = "conv2d";
    let (dims, [s0, s1, s2, s3]) = dims4(l, OP)?;
    let [b, c_in, h, w] = dims;
    let Some(cs) = plane_stride(h, w, s2, s3) else { return Ok(None) };
    if im2col_forced() || p.k_h != 1 || p.k_w != 1 || p.stride != 1 || p.padding != 0 || !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    if kb.len() != p.c_out * c_in {
        return Err(invalid(OP, format!("kernel has {} elements, {} x {c_in} expected", kb.len(), p.c_out)));
    }
    let hw = h * w;
    let a = GemmOperand { data: whole(kb)?, batch: 0, row: c_in, col: 1 };
    let bm = GemmOperand { data: x.region(l.start_offset(), x.len() - l.start_offset().min(x.len()))?, batch: s0, row: s1, col: cs };
    float_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, b * p.c_out * hw, OP)?;
        gemm::<T>(dev, &a, &bm, &mut out, GemmShape { batch: b, m: p.c_out, n: hw, k: c_in })?;
        Ok(Some(T::wrap(out)))
    })
}

/// conv2d on the implicit-GEMM kernel (`kernels::conv_implicit`: input patches
/// gathered on the fly, no im2col buffer) for f16/bf16; `None` for other dtypes. (The
/// kernel takes f32 too, as three bf16 products of about 16 significant bits each; f32
/// convolutions stay on im2col + GEMM, whose vendor BLAS keeps full f32 precision.)
fn conv2d_implicit(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConv2D) -> Result<Option<Buf>> {
    const OP: &str = "conv2d";
    // An im2col buffer past 32-bit indexing (SDXL's VAE at 1024x1024: 2.4e9 elements)
    // would go in input-channel groups (`conv2d`): a GPU takes the implicit kernel there
    // unless im2col is forced.
    let too_big_for_im2col = dev.is_gpu() && !matches!(conv_choice(), ConvChoice::Im2col) && im2col_elems(p) > i32::MAX as usize;
    if !(implicit_conv_allowed(dev) || too_big_for_im2col) || !matches!(x.dtype(), DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let (dims, strides) = dims4(l, OP)?;
    let [b, c_in, h, w] = dims;
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let shape = Conv2dShape { batch: b, c_in, h, w, c_out: p.c_out, k_h: p.k_h, k_w: p.k_w, groups: 1 };
    let (oh, ow) = shape.out_hw(g).map_err(at(OP))?;
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    let (src, wr) = (whole(x)?, whole(kb)?);
    float_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, b * p.c_out * oh * ow, OP)?;
        conv_implicit::conv2d::<T>(dev, &src, strides, l.start_offset(), &wr, None, shape, g, &mut out).map_err(at(OP))?;
        Ok(Some(T::wrap(out)))
    })
}

thread_local! {
    static CHANNELS_LAST_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the conv2d calls it issues taking the channels-last implicit GEMM
/// ([`conv2d_channels_last`](kernels::conv_implicit::conv2d_channels_last)) wherever that kernel takes the convolution, on the CPU
/// executor as on a GPU (tests of the GPU path without a GPU).
pub fn with_channels_last_conv_on_cpu<R>(f: impl FnOnce() -> R) -> R {
    crate::blas::with_thread_flag(&CHANNELS_LAST_ON_CPU, f)
}

/// `true` where conv2d (f16/bf16, a shape [`conv_implicit::nhwc_refusal`] accepts) takes
/// the channels-last kernel: inside [`with_channels_last_conv_on_cpu`], on every GPU with
/// `CANDLE_ROCM_CONV=nhwc`, and by default on a GPU where the layout copies it needs are
/// cheap beside the convolution: Candle hands NCHW tensors and a `(c_out, c_in, k, k)`
/// filter to every call, so the route copies the input and the output (NCHW <-> NHWC) and
/// rearranges the filter each time. [`copies_pay`] decides; the other layers take
/// im2col + the vendor GEMM (or, without one, the NCHW implicit kernel).
fn channels_last_allowed(dev: &Device, s: &Conv2dShape, out_hw: (usize, usize)) -> bool {
    let on_cpu = CHANNELS_LAST_ON_CPU.with(|k| k.get());
    match conv_choice() {
        ConvChoice::Im2col => false,
        ConvChoice::Nhwc => dev.is_gpu() || on_cpu,
        ConvChoice::Implicit => on_cpu,
        ConvChoice::Auto | ConvChoice::Tiled => on_cpu || (dev.is_gpu() && copies_pay(s, out_hw)),
    }
}

/// Whether the channels-last route beats im2col + the vendor GEMM for a convolution:
/// when the activations it copies (input and output) are at least twice the filter it
/// rearranges. Large images with few channels (SD's VAE, SDXL's 128x128 level) qualify;
/// the 8x8-32x32 levels of a UNet, whose filters outweigh their activations, do not
/// (`benches/results/h200-2026-11-27z`: the per-layer table and the SD steps).
fn copies_pay(s: &Conv2dShape, (oh, ow): (usize, usize)) -> bool {
    let act = s.batch * (s.h * s.w * s.c_in + oh * ow * s.c_out);
    let filter = s.c_out * s.c_in * s.k_h * s.k_w;
    act >= 2 * filter
}

/// conv2d on the channels-last implicit GEMM (`kernels::conv_implicit::conv2d_channels_last`:
/// the GEMM pipeline gathering input patches straight from NHWC): the input viewed as
/// NHWC (in place when it already is channels-last in memory, else one strided copy), the
/// filter rearranged into the layout the kernel takes, and the NHWC result copied back to the
/// contiguous NCHW Candle expects. `None` where the kernel does not take the convolution.
fn conv2d_channels_last(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConv2D) -> Result<Option<Buf>> {
    const OP: &str = "conv2d";
    if !matches!(x.dtype(), DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let (dims, _) = dims4(l, OP)?;
    let [b, c_in, h, w] = dims;
    let shape = Conv2dShape { batch: b, c_in, h, w, c_out: p.c_out, k_h: p.k_h, k_w: p.k_w, groups: 1 };
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let (oh, ow) = shape.out_hw(g).map_err(at(OP))?;
    if !channels_last_allowed(dev, &shape, (oh, ow)) || conv_implicit::nhwc_refusal::<half::f16>(dev, &shape).is_some() {
        return Ok(None);
    }
    // The input as NHWC: in place when that view is contiguous from a 16-byte boundary.
    let xl = l.permute(&[0, 2, 3, 1])?;
    let (xc, x_off) = if xl.is_contiguous() && xl.start_offset() % 8 == 0 {
        (None, xl.start_offset())
    } else {
        let mut copy = Buf::uninit(dev, x.dtype(), xl.shape().elem_count())?;
        super::elementwise::copy_strided(dev, x, &xl, &mut copy, 0)?;
        (Some(copy), 0)
    };
    let xb = xc.as_ref().unwrap_or(x);
    let kernel_choice = if conv_choice() == ConvChoice::Tiled { NhwcKernel::Tiled } else { NhwcKernel::Auto };
    let layout = conv_implicit::nhwc_filter_layout::<half::f16>(dev, &shape, g, kernel_choice);
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    let (kk, n_w) = (p.k_h * p.k_w, p.c_out * c_in * p.k_h * p.k_w);
    // Both layouts start from (c_out, c_in k_h k_w) transposed whole, which moves whole
    // tiles (a pass that moved only k_h k_w would tile along those 9 columns, mostly idle),
    // then, for more than one tap, reorder that (c_in, k_h k_w, c_out): to (c_out, k_h k_w,
    // c_in) transposed again per tap (tiles of c_out x c_in), or to (k_h k_w, c_in, c_out)
    // moving whole rows of c_out. A 1x1 filter already is (c_out, c_in).
    let wp = if layout == FilterLayout::Ohwi && kk == 1 {
        None
    } else {
        let mut wt = Buf::uninit(dev, kernel.dtype(), n_w)?;
        super::elementwise::copy_strided(dev, kb, &Layout::new((c_in * kk, p.c_out).into(), vec![1, c_in * kk], 0), &mut wt, 0)?;
        if kk == 1 {
            Some(wt)
        } else {
            let reorder = match layout {
                FilterLayout::Ohwi => Layout::new((p.c_out, kk, c_in).into(), vec![1, p.c_out, kk * p.c_out], 0),
                FilterLayout::Hwio => Layout::new((kk, c_in, p.c_out).into(), vec![p.c_out, kk * p.c_out, 1], 0),
            };
            let mut wp = Buf::uninit(dev, kernel.dtype(), n_w)?;
            super::elementwise::copy_strided(dev, &wt, &reorder, &mut wp, 0)?;
            Some(wp)
        }
    };
    let wp = wp.as_ref().unwrap_or(kb);
    let n_y = b * oh * ow * p.c_out;
    let y: Buf = float_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, n_y, OP)?;
        conv_implicit::conv2d_channels_last_with::<T>(dev, &whole(xb)?, x_off, &whole(wp)?, layout, None, shape, g, &mut out, None, kernel_choice).map_err(at(OP))?;
        Ok(T::wrap(out))
    })?;
    // NHWC -> NCHW.
    let yl = Layout::new((b, p.c_out, oh, ow).into(), vec![oh * ow * p.c_out, 1, ow * p.c_out, p.c_out], 0);
    let mut nchw = Buf::uninit(dev, y.dtype(), n_y)?;
    super::elementwise::copy_strided(dev, &y, &yl, &mut nchw, 0)?;
    Ok(Some(nchw))
}

/// Elements of conv2d's im2col buffer (`batch * out_h * out_w` rows of `c_in * k_h * k_w`).
fn im2col_elems(p: &ParamsConv2D) -> usize {
    p.b_size * p.out_h() * p.out_w() * p.c_in * p.k_h * p.k_w
}

pub fn conv2d(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConv2D) -> Result<Buf> {
    const OP: &str = "conv2d";
    #[cfg(feature = "rocm")]
    if let Some(y) = crate::blas::miopen::conv2d(dev, x, l, kernel, kl, p)? {
        return Ok(y);
    }
    if let Some(y) = conv2d_pointwise(dev, x, l, kernel, kl, p)? {
        return Ok(y);
    }
    if let Some(y) = conv2d_channels_last(dev, x, l, kernel, kl, p)? {
        return Ok(y);
    }
    if let Some(y) = conv2d_implicit(dev, x, l, kernel, kl, p)? {
        return Ok(y);
    }
    let (dims, strides) = dims4(l, OP)?;
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let (h_out, w_out) = (p.out_h(), p.out_w());
    let kk = p.k_h * p.k_w;
    // The column buffer is indexed with 32 bits: past that (SDXL's VAE at 1024x1024 in
    // f32: up to 4.8e9 elements) the input channels go in groups whose buffers fit, each
    // group's product (the filter's matching columns, read in place) added to the output
    // (f16/bf16 outputs then round once per group).
    let per_channel = p.b_size * h_out * w_out * kk;
    let cap = IM2COL_CAP.with(|c| c.get());
    if per_channel > cap {
        return Err(invalid(OP, format!("one input channel's im2col columns ({per_channel} elements) exceed the {cap}-element limit")));
    }
    let group = (cap / per_channel.max(1)).clamp(1, p.c_in.max(1));
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    let src = whole(x)?;
    let mut y: Option<Buf> = None;
    // One group at least (no input channels: one empty product).
    for c0 in (0..p.c_in.max(1)).step_by(group) {
        let cg = group.min(p.c_in - c0);
        // im2col writes every element (zeros in the padding): no fill first.
        let mut col = Buf::uninit(dev, x.dtype(), per_channel * cg)?;
        let mut cr = col.region_mut(0, col.len())?;
        let part_dims = [dims[0], cg, dims[2], dims[3]];
        let offset = l.start_offset() + c0 * strides[1];
        any_dispatch!(x.dtype(), OP, T => {
            kc::im2col2d::<T>(dev, &src, part_dims, strides, offset, (p.k_h, p.k_w), g, &mut cr).map(|_| ()).map_err(at(OP))
        })?;
        let part = conv_gemm(dev, &col, kb, &Layout::contiguous(kb.len()), (c0 * kk, p.c_in * kk), p.b_size, h_out * w_out, cg * kk, p.c_out, OP)?;
        let n = part.len();
        y = Some(match y {
            None => part,
            Some(acc) => super::elementwise::binary(dev, &acc, &Layout::contiguous(n), &part, &Layout::contiguous(n), "add")?,
        });
    }
    Ok(y.expect("one group at least"))
}

thread_local! {
    static IM2COL_CAP: std::cell::Cell<usize> = const { std::cell::Cell::new(i32::MAX as usize) };
}

/// Runs `f` with conv2d's im2col column buffers limited to `cap` elements (the 32-bit
/// limit otherwise), so that small convolutions take the channel-grouped path that large
/// ones need (tests without a large GPU).
pub fn with_im2col_cap<R>(cap: usize, f: impl FnOnce() -> R) -> R {
    crate::blas::with_thread_value(&IM2COL_CAP, cap.max(1), f)
}

pub fn conv1d(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConv1D) -> Result<Buf> {
    const OP: &str = "conv1d";
    let (dims, strides) = dims3(l, OP)?;
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let l_out = p.l_out();
    let k = p.c_in * p.k_size;
    let mut col = Buf::uninit(dev, x.dtype(), p.b_size * l_out * k)?;
    let mut cr = col.region_mut(0, col.len())?;
    let src = whole(x)?;
    any_dispatch!(x.dtype(), OP, T => {
        kc::im2col1d::<T>(dev, &src, dims, strides, l.start_offset(), p.k_size, g, &mut cr).map(|_| ()).map_err(at(OP))
    })?;
    conv_gemm(dev, &col, kernel, kl, (0, k), p.b_size, l_out, k, p.c_out, OP)
}

/// `col (b, spatial_in, c_out * taps) = x^T (spatial_in, c_in) x kernel (c_in, c_out * taps)`.
#[allow(clippy::too_many_arguments)] // the geometry of one transposed convolution
fn transpose_col(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, b: usize, c_in: usize, spatial: usize, n: usize, op: &'static str) -> Result<Buf> {
    let xc = contiguous_buf(dev, x, l)?;
    let xb = xc.as_ref().unwrap_or(x);
    let kc = contiguous_buf(dev, kernel, kl)?;
    let kb = kc.as_ref().unwrap_or(kernel);
    if kb.len() != c_in * n {
        return Err(invalid(op, format!("kernel has {} elements, {c_in} x {n} expected", kb.len())));
    }
    let a = GemmOperand { data: whole(xb)?, batch: c_in * spatial, row: 1, col: spatial };
    let bm = GemmOperand { data: whole(kb)?, batch: 0, row: n, col: 1 };
    float_dispatch!(x.dtype(), op, T => {
        let mut out = alloc::<T>(dev, b * spatial * n, op)?;
        gemm::<T>(dev, &a, &bm, &mut out, GemmShape { batch: b, m: spatial, n, k: c_in })?;
        Ok(T::wrap(out))
    })
}

/// Half-type transposed convolutions run in f32 (the intermediate column buffer would
/// otherwise be rounded before col2im sums it), then round once: `f` on f32 copies.
fn via_f32(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, f: impl Fn(&Buf, &Layout, &Buf, &Layout) -> Result<Buf>) -> Result<Buf> {
    let (xf, kf) = (super::any::to_dtype(dev, x, l, DType::F32)?, super::any::to_dtype(dev, kernel, kl, DType::F32)?);
    let y = f(&xf, &Layout::contiguous(l.shape()), &kf, &Layout::contiguous(kl.shape()))?;
    super::any::to_dtype(dev, &y, &Layout::contiguous(y.len()), x.dtype())
}

pub fn conv_transpose2d(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConvTranspose2D) -> Result<Buf> {
    const OP: &str = "conv_transpose2d";
    if matches!(x.dtype(), DType::F16 | DType::BF16) {
        return via_f32(dev, x, l, kernel, kl, |x, l, k, kl| conv_transpose2d(dev, x, l, k, kl, p));
    }
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let taps = p.k_h * p.k_w;
    let col = transpose_col(dev, x, l, kernel, kl, p.b_size, p.c_in, p.i_h * p.i_w, p.c_out * taps, OP)?;
    let (h_out, w_out) = (p.out_h(), p.out_w());
    let cr = col.region(0, col.len())?;
    float_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, p.b_size * p.c_out * h_out * w_out, OP)?;
        kc::col2im2d::<T>(dev, &cr, (p.b_size, p.i_h, p.i_w, p.c_out), (p.k_h, p.k_w), g, p.output_padding, &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

pub fn conv_transpose1d(dev: &Device, x: &Buf, l: &Layout, kernel: &Buf, kl: &Layout, p: &ParamsConvTranspose1D) -> Result<Buf> {
    const OP: &str = "conv_transpose1d";
    if matches!(x.dtype(), DType::F16 | DType::BF16) {
        return via_f32(dev, x, l, kernel, kl, |x, l, k, kl| conv_transpose1d(dev, x, l, k, kl, p));
    }
    let g = ConvGeometry { padding: p.padding, stride: p.stride, dilation: p.dilation };
    let col = transpose_col(dev, x, l, kernel, kl, p.b_size, p.c_in, p.l_in, p.c_out * p.k_size, OP)?;
    let l_out = p.l_out();
    let cr = col.region(0, col.len())?;
    float_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, p.b_size * p.c_out * l_out, OP)?;
        kc::col2im1d::<T>(dev, &cr, (p.b_size, p.l_in, p.c_out), p.k_size, g, p.output_padding, &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

fn nchw(l: &Layout, op: &'static str) -> Result<Nchw> {
    let (dims, strides) = dims4(l, op)?;
    Ok(Nchw { dims, strides, offset: l.start_offset() })
}

pub fn max_pool2d(dev: &Device, x: &Buf, l: &Layout, k: (usize, usize), s: (usize, usize)) -> Result<Buf> {
    const OP: &str = "max_pool2d";
    let v = nchw(l, OP)?;
    let (h, w) = (v.dims[2], v.dims[3]);
    if k.0 == 0 || k.1 == 0 || s.0 == 0 || s.1 == 0 || h < k.0 || w < k.1 {
        return Err(invalid(OP, format!("kernel {k:?} stride {s:?} on {h}x{w}")));
    }
    let n = v.dims[0] * v.dims[1] * ((h - k.0) / s.0 + 1) * ((w - k.1) / s.1 + 1);
    let src = whole(x)?;
    any_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, n, OP)?;
        kp::max_pool2d::<T>(dev, &src, v, k, s, &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

pub fn avg_pool2d(dev: &Device, x: &Buf, l: &Layout, k: (usize, usize), s: (usize, usize)) -> Result<Buf> {
    const OP: &str = "avg_pool2d";
    let v = nchw(l, OP)?;
    let (h, w) = (v.dims[2], v.dims[3]);
    if k.0 == 0 || k.1 == 0 || s.0 == 0 || s.1 == 0 || h < k.0 || w < k.1 {
        return Err(invalid(OP, format!("kernel {k:?} stride {s:?} on {h}x{w}")));
    }
    let n = v.dims[0] * v.dims[1] * ((h - k.0) / s.0 + 1) * ((w - k.1) / s.1 + 1);
    let src = whole(x)?;
    macro_rules! go {
        ($T:ty) => {{
            let mut out = alloc::<$T>(dev, n, OP)?;
            kp::avg_pool2d::<$T>(dev, &src, v, k, s, &mut out).map_err(at(OP))?;
            Ok(<$T>::wrap(out))
        }};
    }
    match x.dtype() {
        DType::F32 => go!(f32),
        DType::F16 => go!(half::f16),
        DType::BF16 => go!(half::bf16),
        DType::F64 => go!(f64),
        d => Err(unsupported(OP, d)),
    }
}

pub fn upsample_nearest2d(dev: &Device, x: &Buf, l: &Layout, h_out: usize, w_out: usize) -> Result<Buf> {
    const OP: &str = "upsample_nearest2d";
    let v = nchw(l, OP)?;
    let src = whole(x)?;
    any_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, v.dims[0] * v.dims[1] * h_out * w_out, OP)?;
        kp::upsample_nearest2d::<T>(dev, &src, v, (h_out, w_out), &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

pub fn upsample_nearest1d(dev: &Device, x: &Buf, l: &Layout, l_out: usize) -> Result<Buf> {
    const OP: &str = "upsample_nearest1d";
    let (dims, strides) = dims3(l, OP)?;
    let src = whole(x)?;
    any_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, dims[0] * dims[1] * l_out, OP)?;
        kp::upsample_nearest1d::<T>(dev, &src, dims, strides, l.start_offset(), l_out, &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

#[allow(clippy::too_many_arguments)]
pub fn upsample_bilinear2d(dev: &Device, x: &Buf, l: &Layout, h_out: usize, w_out: usize, align: bool, sh: Option<f64>, sw: Option<f64>) -> Result<Buf> {
    const OP: &str = "upsample_bilinear2d";
    let v = nchw(l, OP)?;
    let src = whole(x)?;
    any_dispatch!(x.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, v.dims[0] * v.dims[1] * h_out * w_out, OP)?;
        kp::upsample_bilinear2d::<T>(dev, &src, v, (h_out, w_out), align, sh, sw, &mut out).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}
