//! Ops for every dtype on the dtype-generic kernels (`kernels::{cmp, convert, arith,
//! reduce_any, unary_f64, indexing_any, random}`): comparisons, casts, integer and f64
//! arithmetic and reductions, indexing of any dtype, random numbers. The f32/f16/bf16
//! paths of [`super::elementwise`] and friends stay on the typed (faster) kernels.
use super::alloc;
use crate::buffer::{coalesce_pair, Buf, BufElem, Region};
use crate::error::{at, invalid, unsupported};
use candle_core::{DType, Layout, Result};
use kernels::convert::ops::Strided;
use kernels::runtime::{Device, DeviceVec};

/// Runs `$body` with `$T` the element type of `$dtype`, for every dtype a [`Buf`] holds.
macro_rules! any_dispatch {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::U8 => { type $T = u8; $body }
            DType::U32 => { type $T = u32; $body }
            DType::I16 => { type $T = i16; $body }
            DType::I32 => { type $T = i32; $body }
            DType::I64 => { type $T = i64; $body }
            DType::BF16 => { type $T = half::bf16; $body }
            DType::F16 => { type $T = half::f16; $body }
            DType::F32 => { type $T = f32; $body }
            DType::F64 => { type $T = f64; $body }
            DType::F8E4M3 => { type $T = kernels::dtype::host::F8E4M3; $body }
            d => Err(unsupported($op, d)),
        }
    };
}
pub(crate) use any_dispatch;

/// A kernel input: the view's data from its start offset and, unless contiguous, its
/// dims and strides.
pub struct Input<'a> {
    pub data: Region,
    pub view: Strided<'a>,
}

pub fn input<'a>(buf: &Buf, l: &'a Layout) -> Result<Input<'a>> {
    if l.is_contiguous() {
        Ok(Input { data: buf.region(l.start_offset(), l.shape().elem_count())?, view: None })
    } else {
        Ok(Input { data: buf.from_offset(l)?, view: Some((l.dims(), l.stride())) })
    }
}

/// Candle's `cmp`: u8 0/1 of the same shape.
pub fn cmp(dev: &Device, op: candle_core::op::CmpOp, a: &Buf, al: &Layout, b: &Buf, bl: &Layout) -> Result<Buf> {
    use candle_core::op::CmpOp as C;
    use kernels::cmp::ops::CmpOp as K;
    const OP: &str = "cmp";
    if a.dtype() != b.dtype() || al.dims() != bl.dims() {
        return Err(invalid(OP, format!("{:?}{:?} vs {:?}{:?}", a.dtype(), al.dims(), b.dtype(), bl.dims())));
    }
    let k = match op {
        C::Eq => K::Eq,
        C::Ne => K::Ne,
        C::Lt => K::Lt,
        C::Le => K::Le,
        C::Gt => K::Gt,
        C::Ge => K::Ge,
    };
    let n = al.shape().elem_count();
    let (al, bl) = coalesce_pair(al, bl);
    let (x, y) = (input(a, &al)?, input(b, &bl)?);
    let mut out = alloc::<u8>(dev, n, OP)?;
    any_dispatch!(a.dtype(), OP, T => {
        kernels::cmp::ops::cmp::<T>(dev, k, (&x.data, x.view), (&y.data, y.view), &mut out).map_err(at(OP))
    })?;
    Ok(Buf::U8(out))
}

/// Cast between any two of the stored dtypes (Candle's `to_dtype` rules).
pub fn to_dtype(dev: &Device, buf: &Buf, l: &Layout, dtype: DType) -> Result<Buf> {
    const OP: &str = "to_dtype";
    let n = l.shape().elem_count();
    let x = input(buf, l)?;
    any_dispatch!(buf.dtype(), OP, S => {
        any_dispatch!(dtype, OP, D => {
            let mut y = alloc::<D>(dev, n, OP)?;
            kernels::convert::ops::cast::<S, D>(dev, &x.data, x.view, &mut y).map_err(at(OP))?;
            Ok(D::wrap(y))
        })
    })
}

/// Binary ops of the integer dtypes and f64.
pub fn binary(dev: &Device, a: &Buf, al: &Layout, b: &Buf, bl: &Layout, name: &'static str) -> Result<Buf> {
    use kernels::arith::ops::BinaryOp as K;
    let op = match name {
        "add" => K::Add,
        "sub" => K::Sub,
        "mul" => K::Mul,
        "div" => K::Div,
        "maximum" => K::Maximum,
        "minimum" => K::Minimum,
        _ => return Err(invalid(name, "no kernel for this binary op")),
    };
    let n = al.shape().elem_count();
    let (al, bl) = coalesce_pair(al, bl);
    let (x, y) = (input(a, &al)?, input(b, &bl)?);
    any_dispatch!(a.dtype(), name, T => {
        let mut out = alloc::<T>(dev, n, name)?;
        kernels::arith::ops::binary::<T>(dev, op, (&x.data, x.view), (&y.data, y.view), &mut out).map_err(at(name))?;
        Ok(T::wrap(out))
    })
}

/// `x * mul + add` in the element type, integer dtypes and f64.
pub fn affine(dev: &Device, buf: &Buf, l: &Layout, mul: f64, add: f64) -> Result<Buf> {
    const OP: &str = "affine";
    let n = l.shape().elem_count();
    let x = input(buf, l)?;
    any_dispatch!(buf.dtype(), OP, T => {
        let mut out = alloc::<T>(dev, n, OP)?;
        kernels::arith::ops::affine::<T>(dev, &x.data, x.view, &mut out, mul, add).map_err(at(OP))?;
        Ok(T::wrap(out))
    })
}

/// Candle's unary op `name` (or "elu"/"powf" with `param`) on f64 values.
pub fn unary_f64(dev: &Device, buf: &Buf, l: &Layout, name: &'static str, param: f64) -> Result<Buf> {
    use kernels::unary_f64 as u;
    if buf.dtype() != DType::F64 {
        return Err(unsupported(name, buf.dtype()));
    }
    let code = match name {
        "neg" => u::U_NEG,
        "exp" => u::U_EXP,
        "log" => u::U_LOG,
        "sqrt" => u::U_SQRT,
        "abs" => u::U_ABS,
        "sqr" => u::U_SQR,
        "recip" => u::U_RECIP,
        "relu" => u::U_RELU,
        "gelu" => u::U_GELU,
        "gelu_erf" => u::U_GELU_ERF,
        "silu" => u::U_SILU,
        "tanh" => u::U_TANH,
        "sigmoid" => u::U_SIGMOID,
        "erf" => u::U_ERF,
        "sin" => u::U_SIN,
        "cos" => u::U_COS,
        "floor" => u::U_FLOOR,
        "ceil" => u::U_CEIL,
        "round" => u::U_ROUND,
        "sign" => u::U_SIGN,
        "elu" => u::U_ELU,
        "powf" => u::U_POWF,
        _ => return Err(invalid(name, "no f64 kernel for this unary op")),
    };
    let n = l.shape().elem_count();
    let x = input(buf, l)?;
    let mut out = alloc::<f64>(dev, n, name)?;
    kernels::unary_f64::ops::unary_f64(dev, code, param, &x.data, x.view, &mut out).map_err(at(name))?;
    Ok(Buf::F64(out))
}

/// Sum/max/min/argmax/argmin of the integer dtypes and f64 (reduced dims kept as size 1).
pub fn reduce(dev: &Device, buf: &Buf, l: &Layout, op: candle_core::op::ReduceOp, dims: &[usize]) -> Result<Buf> {
    use candle_core::op::ReduceOp as R;
    use kernels::reduce_any::ops::ReduceOp as K;
    const OP: &str = "reduce";
    let outputs: usize = l.dims().iter().enumerate().filter(|(d, _)| !dims.contains(d)).map(|(_, &s)| s).product();
    let x = buf.from_offset(l)?;
    any_dispatch!(buf.dtype(), OP, T => {
        match op {
            R::ArgMax | R::ArgMin => {
                let mut out = alloc::<u32>(dev, outputs, OP)?;
                kernels::reduce_any::ops::arg_reduce::<T>(dev, &x, l.dims(), l.stride(), dims, op == R::ArgMax, &mut out).map_err(at(OP))?;
                Ok(Buf::U32(out))
            }
            _ => {
                let k = match op { R::Sum => K::Sum, R::Max => K::Max, _ => K::Min };
                let mut out = alloc::<T>(dev, outputs, OP)?;
                kernels::reduce_any::ops::reduce::<T>(dev, &x, l.dims(), l.stride(), dims, k, &mut out).map_err(at(OP))?;
                Ok(T::wrap(out))
            }
        }
    })
}

/// `n` random values of a float dtype from the counter-based generator at `(seed, offset)`.
#[allow(clippy::too_many_arguments)] // Candle's rand_uniform/rand_normal arguments, plus the generator's
pub fn rand(dev: &Device, dtype: DType, n: usize, seed: u64, offset: u64, normal: bool, a: f64, b: f64) -> Result<Buf> {
    let op = if normal { "rand_normal" } else { "rand_uniform" };
    macro_rules! go {
        ($T:ty) => {{
            let mut out: DeviceVec<$T> = alloc::<$T>(dev, n, op)?;
            if normal {
                kernels::random::ops::rand_normal::<$T>(dev, &mut out, seed, offset, a, b)
            } else {
                kernels::random::ops::rand_uniform::<$T>(dev, &mut out, seed, offset, a, b)
            }
            .map_err(at(op))?;
            Ok(<$T>::wrap(out))
        }};
    }
    match dtype {
        DType::F32 => go!(f32),
        DType::F16 => go!(half::f16),
        DType::BF16 => go!(half::bf16),
        DType::F64 => go!(f64),
        d => Err(unsupported(op, d)),
    }
}
