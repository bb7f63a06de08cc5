//! Binary ops (`add`, `sub`, `mul`, `div`, `maximum`, `minimum`) and `affine` for the
//! dtypes the typed f32/f16/bf16 kernels of [`elementwise`](crate::elementwise) do not
//! cover: the integers u8, u32, i16, i32, i64 and f64 (computed in f64), with strided and
//! broadcast layouts. One instance per element size (see [`dtype`](crate::dtype)).
//!
//! Integer semantics (Candle's CPU backend computes `v1 op v2` in the narrow type, which in
//! a release build wraps on overflow; division by zero panics there): add, sub and mul
//! wrap; `MIN / -1` wraps to `MIN`; **division by zero gives 0** (a kernel cannot panic;
//! Candle's CPU backend aborts the program instead). f64 `maximum`/`minimum` return NaN if
//! either side is NaN, like the f32 kernels. `affine` is Candle's `v * mul + add` in the
//! element type: `mul` and `add` converted with `as` (saturating), integer arithmetic
//! wrapping, f64 not fused.
use crate::dtype::{decode, encode, Bits, Val};
use crate::elementwise::strided_offset;
use kernel_dsl::prelude::*;

/// Op code of `a + b`.
pub const BIN_ADD: u32 = 0;
/// Op code of `a - b`.
pub const BIN_SUB: u32 = 1;
/// Op code of `a * b`.
pub const BIN_MUL: u32 = 2;
/// Op code of `a / b`.
pub const BIN_DIV: u32 = 3;
/// Op code of `maximum(a, b)`.
pub const BIN_MAX: u32 = 4;
/// Op code of `minimum(a, b)`.
pub const BIN_MIN: u32 = 5;

/// `a op b` on widened values of one dtype (integers wrap when written back).
#[device]
#[inline(always)]
pub fn binary_val(a: Val, b: Val, op: u32) -> Val {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Val::Int(match op {
            BIN_ADD => x.wrapping_add(y),
            BIN_SUB => x.wrapping_sub(y),
            BIN_MUL => x.wrapping_mul(y),
            BIN_DIV => {
                if y == 0 {
                    0
                } else {
                    x.wrapping_div(y)
                }
            }
            BIN_MAX => {
                if x < y {
                    y
                } else {
                    x
                }
            }
            _ => {
                if x > y {
                    y
                } else {
                    x
                }
            }
        }),
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => Val::Wide(match op {
            BIN_ADD => x + y,
            BIN_SUB => x - y,
            BIN_MUL => x * y,
            BIN_DIV => x / y,
            BIN_MAX => {
                if x != x || y != y {
                    f64::NAN
                } else if x < y {
                    y
                } else {
                    x
                }
            }
            _ => {
                if x != x || y != y {
                    f64::NAN
                } else if x > y {
                    y
                } else {
                    x
                }
            }
        }),
        _ => a,
    }
}

/// `out[i] = lhs[lhs_layout(i)] op rhs[rhs_layout(i)]` for dtype code `dt`, op code `op`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn binary_any<B: Bits>(lhs: &[B], lhs_layout: &[usize], rhs: &[B], rhs_layout: &[usize], out: &mut [B], dt: u32, op: u32) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let a = decode(lhs[strided_offset(i, lhs_layout)].to_u64(), dt);
        let b = decode(rhs[strided_offset(i, rhs_layout)].to_u64(), dt);
        out[i] = B::from_u64(encode(binary_val(a, b, op), dt));
        i += step;
    }
}

/// `out[i] = input[layout(i)] * mul + add` in dtype `dt` (Candle's `affine`).
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn affine_any<B: Bits>(input: &[B], layout: &[usize], out: &mut [B], dt: u32, mul: f64, add: f64) {
    // The factors as the element type (`as`: saturating for integers), widened again.
    let m = decode(encode(Val::Wide(mul), dt), dt);
    let a = decode(encode(Val::Wide(add), dt), dt);
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let v = decode(input[strided_offset(i, layout)].to_u64(), dt);
        let r = binary_val(binary_val(v, m, BIN_MUL), a, BIN_ADD);
        out[i] = B::from_u64(encode(r, dt));
        i += step;
    }
}

/// Checked launches.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::{grid, LayoutArg, Strided};
    use crate::dtype::host::{arg_len, DType, Raw};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// A binary op.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum BinaryOp {
        /// `a + b`
        Add,
        /// `a - b`
        Sub,
        /// `a * b`
        Mul,
        /// `a / b`
        Div,
        /// `maximum(a, b)`
        Maximum,
        /// `minimum(a, b)`
        Minimum,
    }

    impl BinaryOp {
        fn code(self) -> u32 {
            match self {
                BinaryOp::Add => super::BIN_ADD,
                BinaryOp::Sub => super::BIN_SUB,
                BinaryOp::Mul => super::BIN_MUL,
                BinaryOp::Div => super::BIN_DIV,
                BinaryOp::Maximum => super::BIN_MAX,
                BinaryOp::Minimum => super::BIN_MIN,
            }
        }
    }

    /// `out[i] = lhs op rhs` over `out.len()` elements, any dtype (meant for the integers
    /// and f64; f32/f16/bf16 have the faster typed [`binary`](fn@crate::elementwise::binary)).
    /// Each input contiguous of that length or read through its view.
    pub fn binary<T: DType>(
        dev: &Device,
        op: BinaryOp,
        lhs: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        rhs: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "binary";
        let n = arg_len(out);
        let ll = LayoutArg::new(dev, K, "lhs", lhs.1, n, arg_len(lhs.0))?;
        let rl = LayoutArg::new(dev, K, "rhs", rhs.1, n, arg_len(rhs.0))?;
        if n == 0 {
            return Ok(());
        }
        let (a, b, o) = (Raw(lhs.0.kernel_arg()), Raw(rhs.0.kernel_arg()), out.kernel_arg());
        let (la, lb) = (ll.arg(), rl.arg());
        let (dt, oc) = (T::CODE, op.code());
        match std::mem::size_of::<T::Bits>() {
            1 => super::binary_any::launch::<u8>(dev, grid(n), &a, &la, &b, &lb, &mut Raw(o), dt, oc),
            2 => super::binary_any::launch::<u16>(dev, grid(n), &a, &la, &b, &lb, &mut Raw(o), dt, oc),
            4 => super::binary_any::launch::<u32>(dev, grid(n), &a, &la, &b, &lb, &mut Raw(o), dt, oc),
            _ => super::binary_any::launch::<u64>(dev, grid(n), &a, &la, &b, &lb, &mut Raw(o), dt, oc),
        }
    }

    /// `out[i] = input[i] * mul + add` in the element type (Candle's `affine`), any dtype.
    pub fn affine<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        view: Strided<'_>,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
        mul: f64,
        add: f64,
    ) -> Result<(), LaunchError> {
        const K: &str = "affine";
        let n = arg_len(out);
        let l = LayoutArg::new(dev, K, "input", view, n, arg_len(input))?;
        if n == 0 {
            return Ok(());
        }
        let (i, o, la) = (Raw(input.kernel_arg()), out.kernel_arg(), l.arg());
        let dt = T::CODE;
        match std::mem::size_of::<T::Bits>() {
            1 => super::affine_any::launch::<u8>(dev, grid(n), &i, &la, &mut Raw(o), dt, mul, add),
            2 => super::affine_any::launch::<u16>(dev, grid(n), &i, &la, &mut Raw(o), dt, mul, add),
            4 => super::affine_any::launch::<u32>(dev, grid(n), &i, &la, &mut Raw(o), dt, mul, add),
            _ => super::affine_any::launch::<u64>(dev, grid(n), &i, &la, &mut Raw(o), dt, mul, add),
        }
    }
}
