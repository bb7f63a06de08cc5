//! Comparisons `eq`, `ne`, `lt`, `le`, `gt`, `ge` for every dtype, with strided and
//! broadcast layouts, writing `u8` (1 true, 0 false), as Candle's `cmp`. Floats compare as
//! IEEE values (any comparison with NaN is false except `ne`; `-0.0 == 0.0`); integers by
//! value. One kernel instance per element size serves every dtype (see
//! [`dtype`](crate::dtype)).
use crate::dtype::{decode, Bits, Val};
use crate::elementwise::strided_offset;
use kernel_dsl::prelude::*;

/// Op code of `==`.
pub const CMP_EQ: u32 = 0;
/// Op code of `!=`.
pub const CMP_NE: u32 = 1;
/// Op code of `<`.
pub const CMP_LT: u32 = 2;
/// Op code of `<=`.
pub const CMP_LE: u32 = 3;
/// Op code of `>`.
pub const CMP_GT: u32 = 4;
/// Op code of `>=`.
pub const CMP_GE: u32 = 5;

/// `a op b` on widened values of one dtype.
#[device]
#[inline(always)]
pub fn compare(a: Val, b: Val, op: u32) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => match op {
            CMP_EQ => x == y,
            CMP_NE => x != y,
            CMP_LT => x < y,
            CMP_LE => x <= y,
            CMP_GT => x > y,
            _ => x >= y,
        },
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => match op {
            CMP_EQ => x == y,
            CMP_NE => x != y,
            CMP_LT => x < y,
            CMP_LE => x <= y,
            CMP_GT => x > y,
            _ => x >= y,
        },
        // Both sides always have the same dtype.
        _ => false,
    }
}

/// `out[i] = lhs[lhs_layout(i)] op rhs[rhs_layout(i)]` as 0/1, for dtype code `dt` and
/// op code `op`.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn cmp_any<B: Bits>(lhs: &[B], lhs_layout: &[usize], rhs: &[B], rhs_layout: &[usize], out: &mut [u8], dt: u32, op: u32) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let a = decode(lhs[strided_offset(i, lhs_layout)].to_u64(), dt);
        let b = decode(rhs[strided_offset(i, rhs_layout)].to_u64(), dt);
        out[i] = compare(a, b, op) as u8;
        i += step;
    }
}

/// Checked launch.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::{grid, LayoutArg, Strided};
    use crate::dtype::host::{arg_len, DType, Raw};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// A comparison.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CmpOp {
        /// `==`
        Eq,
        /// `!=`
        Ne,
        /// `<`
        Lt,
        /// `<=`
        Le,
        /// `>`
        Gt,
        /// `>=`
        Ge,
    }

    impl CmpOp {
        fn code(self) -> u32 {
            match self {
                CmpOp::Eq => super::CMP_EQ,
                CmpOp::Ne => super::CMP_NE,
                CmpOp::Lt => super::CMP_LT,
                CmpOp::Le => super::CMP_LE,
                CmpOp::Gt => super::CMP_GT,
                CmpOp::Ge => super::CMP_GE,
            }
        }
    }

    /// `out[i] = (lhs op rhs) as u8` over `out.len()` elements; each input contiguous of
    /// that length or read through its view (zero strides broadcast).
    pub fn cmp<T: DType>(
        dev: &Device,
        op: CmpOp,
        lhs: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        rhs: (&(impl KernelArgSlice<T> + ?Sized), Strided<'_>),
        out: &mut (impl KernelArgSliceMut<u8> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "cmp";
        let n = arg_len(out);
        let ll = LayoutArg::new(dev, K, "lhs", lhs.1, n, arg_len(lhs.0))?;
        let rl = LayoutArg::new(dev, K, "rhs", rhs.1, n, arg_len(rhs.0))?;
        if n == 0 {
            return Ok(());
        }
        let (a, b) = (Raw(lhs.0.kernel_arg()), Raw(rhs.0.kernel_arg()));
        let (la, lb) = (ll.arg(), rl.arg());
        let (dt, oc) = (T::CODE, op.code());
        match std::mem::size_of::<T::Bits>() {
            1 => super::cmp_any::launch::<u8>(dev, grid(n), &a, &la, &b, &lb, out, dt, oc),
            2 => super::cmp_any::launch::<u16>(dev, grid(n), &a, &la, &b, &lb, out, dt, oc),
            4 => super::cmp_any::launch::<u32>(dev, grid(n), &a, &la, &b, &lb, out, dt, oc),
            _ => super::cmp_any::launch::<u64>(dev, grid(n), &a, &la, &b, &lb, out, dt, oc),
        }
    }
}
