//! Elementwise ops: unary maps, binary ops (broadcast through zero strides), affine, powf,
//! elu, casts, fills and copies.
use super::float_dispatch;
use crate::buffer::{coalesce_pair, Buf, BufElem, StridedInput};
use crate::error::{at, invalid, unsupported};
use candle_core::{DType, Layout, Result};
use kernels::elementwise as ew;
use kernels::indexing::ops as ix;
use kernels::permute as perm;
use kernels::runtime::{Device, DeviceVec};

/// Allocates the contiguous output of `n` elements, uninitialized: every caller's kernel
/// writes all of them (a zero fill would be one more queued memset per op).
fn out<T: Copy>(dev: &Device, n: usize, op: &'static str) -> Result<DeviceVec<T>> {
    dev.alloc_uninit::<T>(n).map_err(at(op))
}

/// Candle's unary op `name` (`UnaryOpT::NAME`) on the view `l`.
///
/// A strided view of at most three dimensions whose innermost size is a multiple of 8 (a
/// GEGLU half, a narrowed activation) takes `unary_runs`; other views the general kernel.
pub fn unary(dev: &Device, buf: &Buf, l: &Layout, name: &'static str) -> Result<Buf> {
    let n = l.shape().elem_count();
    let runs = if l.is_contiguous() {
        None
    } else {
        let (c, _) = coalesce_pair(l, l);
        ew::RunView::new(c.dims(), [c.stride()]).map(|v| (v, c))
    };
    macro_rules! run {
        ($T:ty, $wrap:ident, $($name:literal => $Op:ident),*) => {{
            let mut y = out::<$T>(dev, n, name)?;
            if n > 0 {
                match runs {
                    Some((v, c)) => {
                        let x = buf.from_offset(&c)?;
                        let [[s0, s1, s2]] = v.strides;
                        match name {
                            $($name => ew::unary_runs::launch::<$T, ew::$Op>(dev, ew::launch_config(n), &x, &mut y, v.d1, v.d2, s0, s1, s2),)*
                            _ => return Err(invalid(name, "no kernel for this unary op")),
                        }
                    }
                    None => {
                        let input = StridedInput::new(dev, buf, l)?;
                        match name {
                            $($name => ew::unary::launch::<$T, ew::$Op>(dev, ew::launch_config(n), &input.data, &input.layout, &mut y),)*
                            _ => return Err(invalid(name, "no kernel for this unary op")),
                        }
                    }
                }
                .map_err(at(name))?;
            }
            Ok(Buf::$wrap(y))
        }};
    }
    macro_rules! all {
        ($T:ty, $wrap:ident) => {
            run!($T, $wrap, "neg" => Neg, "exp" => Exp, "log" => Log, "sqrt" => Sqrt, "abs" => Abs,
                "sqr" => Sqr, "recip" => Recip, "relu" => Relu, "gelu" => Gelu, "gelu_erf" => GeluErf,
                "silu" => Silu, "tanh" => Tanh, "sigmoid" => Sigmoid, "erf" => Erf, "sin" => Sin,
                "cos" => Cos, "floor" => Floor, "ceil" => Ceil, "round" => Round, "sign" => Sign)
        };
    }
    match buf.dtype() {
        DType::F32 => all!(f32, F32),
        DType::F16 => all!(half::f16, F16),
        DType::BF16 => all!(half::bf16, BF16),
        DType::F64 => super::any::unary_f64(dev, buf, l, name, 0.0),
        d => Err(unsupported(name, d)),
    }
}

/// Candle's binary op `name` (`BinaryOpT::NAME`): both views have the output's shape,
/// coalesced first ([`coalesce_pair`]) so the kernel walks as few dimensions as the two
/// views allow. Two contiguous operands take the vector map; views of at most three
/// dimensions whose innermost size is a multiple of 8 (broadcast biases, residuals and
/// group statistics over image and token shapes) take `binary_runs`; any other view the
/// general strided kernel.
pub fn binary(dev: &Device, lhs: &Buf, ll: &Layout, rhs: &Buf, rl: &Layout, name: &'static str) -> Result<Buf> {
    if ll.dims() != rl.dims() {
        return Err(invalid(name, format!("shapes {:?} and {:?} differ", ll.dims(), rl.dims())));
    }
    let n = ll.shape().elem_count();
    let (cl, cr) = coalesce_pair(ll, rl);
    let runs = if cl.is_contiguous() && cr.is_contiguous() { None } else { ew::RunView::new(cl.dims(), [cl.stride(), cr.stride()]) };
    macro_rules! launch {
        ($T:ty, $y:expr, $($name:literal => $Op:ident),*) => {{
            let y: &mut DeviceVec<$T> = $y;
            match runs {
                Some(v) => {
                    let (a, b) = (lhs.from_offset(&cl)?, rhs.from_offset(&cr)?);
                    let [[l0, l1, l2], [r0, r1, r2]] = v.strides;
                    match name {
                        $($name => ew::binary_runs::launch::<$T, ew::$Op>(dev, ew::launch_config(n), &a, &b, y, v.d1, v.d2, l0, l1, l2, r0, r1, r2),)*
                        _ => return Err(invalid(name, "no kernel for this binary op")),
                    }
                }
                None => {
                    let (a, b) = (StridedInput::new(dev, lhs, &cl)?, StridedInput::new(dev, rhs, &cr)?);
                    match name {
                        $($name => ew::binary::launch::<$T, ew::$Op>(dev, ew::launch_config(n), &a.data, &a.layout, &b.data, &b.layout, y),)*
                        _ => return Err(invalid(name, "no kernel for this binary op")),
                    }
                }
            }
            .map_err(at(name))?
        }};
    }
    macro_rules! run {
        ($T:ty, $wrap:ident) => {{
            let mut y = out::<$T>(dev, n, name)?;
            if n > 0 {
                launch!($T, &mut y, "add" => Add, "sub" => Sub, "mul" => Mul, "div" => Div,
                    "minimum" => Minimum, "maximum" => Maximum);
            }
            Ok(Buf::$wrap(y))
        }};
    }
    match (lhs.dtype(), rhs.dtype()) {
        (DType::F32, DType::F32) => run!(f32, F32),
        (DType::F16, DType::F16) => run!(half::f16, F16),
        (DType::BF16, DType::BF16) => run!(half::bf16, BF16),
        (a, b) if a != b => Err(invalid(name, format!("dtypes {a:?} and {b:?} differ"))),
        _ => super::any::binary(dev, lhs, ll, rhs, rl, name),
    }
}

/// `x * mul + add`.
pub fn affine(dev: &Device, buf: &Buf, l: &Layout, mul: f64, add: f64) -> Result<Buf> {
    if !matches!(buf.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return super::any::affine(dev, buf, l, mul, add);
    }
    let n = l.shape().elem_count();
    let x = StridedInput::new(dev, buf, l)?;
    float_dispatch!(buf.dtype(), "affine", T => {
        let mut y = out::<T>(dev, n, "affine")?;
        if n > 0 {
            ew::affine::launch::<T>(dev, ew::launch_config(n), &x.data, &x.layout, &mut y, mul as f32, add as f32)
                .map_err(at("affine"))?;
        }
        Ok(T::wrap(y))
    })
}

/// `x^e` (`Powf`) or ELU with `alpha` (`Elu`).
pub fn unary_param(dev: &Device, buf: &Buf, l: &Layout, p: f64, op: &'static str) -> Result<Buf> {
    if buf.dtype() == DType::F64 {
        return super::any::unary_f64(dev, buf, l, op, p);
    }
    let n = l.shape().elem_count();
    let x = StridedInput::new(dev, buf, l)?;
    float_dispatch!(buf.dtype(), op, T => {
        let mut y = out::<T>(dev, n, op)?;
        if n > 0 {
            let cfg = ew::launch_config(n);
            match op {
                "powf" => ew::unary_param::launch::<T, ew::Powf>(dev, cfg, &x.data, &x.layout, &mut y, p as f32),
                _ => ew::unary_param::launch::<T, ew::Elu>(dev, cfg, &x.data, &x.layout, &mut y, p as f32),
            }
            .map_err(at(op))?;
        }
        Ok(T::wrap(y))
    })
}

/// Cast of the view `l` to `dtype` (every stored dtype each way, Candle's rules).
pub fn to_dtype(dev: &Device, buf: &Buf, l: &Layout, dtype: DType) -> Result<Buf> {
    super::any::to_dtype(dev, buf, l, dtype)
}

/// Runs `$body` with `$B` = a kernel element type of the same size as `dtype`'s elements
/// (copies and fills move bits, so any same-size type serves).
macro_rules! by_size {
    ($dtype:expr, $op:expr, $B:ident => $body:expr) => {
        match $dtype.size_in_bytes() {
            1 => {
                type $B = u8;
                $body
            }
            2 => {
                type $B = half::f16;
                $body
            }
            4 => {
                type $B = u32;
                $body
            }
            8 => {
                type $B = i64;
                $body
            }
            _ => Err(unsupported($op, $dtype)),
        }
    };
}

/// Copies the view `l` of `src` to `dst` from element `dst_offset`, contiguously.
pub fn copy_strided(dev: &Device, src: &Buf, l: &Layout, dst: &mut Buf, dst_offset: usize) -> Result<()> {
    const OP: &str = "copy_strided_src";
    if src.dtype() != dst.dtype() {
        return Err(invalid(OP, format!("dtypes {:?} and {:?} differ", src.dtype(), dst.dtype())));
    }
    let n = l.shape().elem_count();
    let mut y = dst.region_mut(dst_offset, n)?;
    if n == 0 {
        return Ok(());
    }
    if !l.is_contiguous() {
        let (c, _) = coalesce_pair(l, l);
        // A permutation whose output-innermost dimension is strided (NCHW <-> NHWC, a
        // transposed matrix or filter): tiles through shared memory.
        if let Some(t) = perm::TransposeView::new(c.dims(), c.stride()) {
            let x = src.from_offset(&c)?;
            let ([d0, d1, d2], [s0, s1, s2]) = (t.dims, t.strides);
            return by_size!(src.dtype(), OP, B => {
                perm::transpose_copy::launch::<B>(dev, t.launch_config(), &x, &mut y, d0, d1, d2, s0, s1, s2, t.y).map_err(at(OP))
            });
        }
        // Rows of a multiple of 8 elements (narrowed, sliced, broadcast): runs.
        if let Some(v) = ew::RunView::new(c.dims(), [c.stride()]) {
            let x = src.from_offset(&c)?;
            let [[s0, s1, s2]] = v.strides;
            return by_size!(src.dtype(), OP, B => {
                ew::copy_runs::launch::<B>(dev, ew::launch_config(n), &x, &mut y, v.d1, v.d2, s0, s1, s2).map_err(at(OP))
            });
        }
    }
    let x = StridedInput::new(dev, src, l)?;
    by_size!(src.dtype(), OP, B => {
        ew::copy_strided::launch::<B>(dev, ew::launch_config(n), &x.data, &x.layout, &mut y).map_err(at(OP))
    })
}

/// Candle's `copy2d`: `d1` rows of `d2` elements, strides and offsets in elements.
#[allow(clippy::too_many_arguments)]
pub fn copy2d(dev: &Device, src: &Buf, dst: &mut Buf, d1: usize, d2: usize, ss: usize, ds: usize, so: usize, dso: usize) -> Result<()> {
    const OP: &str = "copy2d";
    if src.dtype() != dst.dtype() {
        return Err(invalid(OP, format!("dtypes {:?} and {:?} differ", src.dtype(), dst.dtype())));
    }
    let (s, mut d) = (src.region(0, src.len())?, dst.region_mut(0, dst.len())?);
    // 8-byte elements move as pairs of u32 (copy2d has no 8-byte instance).
    let k = if src.dtype().size_in_bytes() == 8 { 2 } else { 1 };
    match src.dtype().size_in_bytes() {
        1 => ix::copy2d::<u8>(dev, &s, &mut d, d1, d2, ss, ds, so, dso),
        2 => ix::copy2d::<half::f16>(dev, &s, &mut d, d1, d2, ss, ds, so, dso),
        4 | 8 => {
            let (s, mut d) = (s.split_elems(k), d.split_elems(k));
            ix::copy2d::<u32>(dev, &s, &mut d, d1, d2 * k, ss * k, ds * k, so * k, dso * k)
        }
        _ => return Err(unsupported(OP, src.dtype())),
    }
    .map_err(at(OP))
}

/// Sets every element of the view `l` to `v`.
pub fn const_set(dev: &Device, buf: &mut Buf, l: &Layout, v: candle_core::scalar::Scalar) -> Result<()> {
    const OP: &str = "const_set";
    use candle_core::scalar::Scalar;
    if v.dtype() != buf.dtype() {
        return Err(invalid(OP, format!("value of {:?} for a {:?} tensor", v.dtype(), buf.dtype())));
    }
    // The value's bits as the same-size kernel type.
    let bits: u64 = match v {
        Scalar::U8(x) => x as u64,
        Scalar::U32(x) => x as u64,
        Scalar::I16(x) => x as u16 as u64,
        Scalar::I32(x) => x as u32 as u64,
        Scalar::I64(x) => x as u64,
        Scalar::BF16(x) => x.to_bits() as u64,
        Scalar::F16(x) => x.to_bits() as u64,
        Scalar::F32(x) => x.to_bits() as u64,
        Scalar::F64(x) => x.to_bits(),
        Scalar::F8E4M3(x) => x.to_bits() as u64,
    };
    let blocks = contiguous_blocks(l);
    // Check every block before writing any.
    let regions = blocks.iter().map(|&(o, n)| buf.region_mut(o, n)).collect::<Result<Vec<_>>>()?;
    for mut r in regions {
        let n = r.len();
        if n == 0 {
            continue;
        }
        let cfg = ew::launch_config(n);
        match buf.dtype().size_in_bytes() {
            1 => ew::fill::launch::<u8>(dev, cfg, &mut r, bits as u8),
            2 => ew::fill::launch::<half::f16>(dev, cfg, &mut r, half::f16::from_bits(bits as u16)),
            4 => ew::fill::launch::<u32>(dev, cfg, &mut r, bits as u32),
            8 => ew::fill::launch::<i64>(dev, cfg, &mut r, bits as i64),
            _ => return Err(unsupported(OP, buf.dtype())),
        }
        .map_err(at(OP))?;
    }
    Ok(())
}

/// The view `l` as `(offset, len)` runs of contiguous elements (trailing dimensions whose
/// strides are row-major form one run).
fn contiguous_blocks(l: &Layout) -> Vec<(usize, usize)> {
    let (dims, strides) = (l.dims(), l.stride());
    let mut block = 1;
    let mut inner = dims.len();
    while inner > 0 && (dims[inner - 1] == 1 || strides[inner - 1] == block) {
        block *= dims[inner - 1];
        inner -= 1;
    }
    let outer: usize = dims[..inner].iter().product();
    (0..outer)
        .map(|mut i| {
            let mut off = l.start_offset();
            for d in (0..inner).rev() {
                off += (i % dims[d]) * strides[d];
                i /= dims[d];
            }
            (off, block)
        })
        .collect()
}
