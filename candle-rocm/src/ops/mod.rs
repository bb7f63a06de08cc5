//! The backend's ops, by family. Each takes the kernels device, buffers and Candle layouts
//! and returns a new buffer (or writes one in place); dtypes without a kernel are errors.
pub mod any;
pub mod conv;
pub mod elementwise;
pub mod fused;
pub mod indexing;
pub mod matmul;
pub mod reduce;

/// Runs `$body` with `$T` the element type of float `$dtype` (f32, f16, bf16); other
/// dtypes: an unsupported-dtype error naming `$op`.
macro_rules! float_dispatch {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $T = f32;
                $body
            }
            candle_core::DType::F16 => {
                type $T = half::f16;
                $body
            }
            candle_core::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            d => Err($crate::error::unsupported($op, d)),
        }
    };
}
pub(crate) use float_dispatch;

use crate::buffer::{Buf, BufElem};
use crate::error::{at, invalid};
use candle_core::{Layout, Result};
use kernels::runtime::{Device, DeviceVec, DeviceView};

/// The view `l` of `buf` as an exactly-sized contiguous buffer of `T`: the buffer itself
/// when it already is one, else a copy (`copy_strided`). `Cow`-like: `keep` owns the copy.
pub fn contiguous<'a, T: BufElem>(dev: &Device, buf: &'a Buf, l: &Layout, keep: &'a mut Option<DeviceVec<T>>, op: &'static str) -> Result<&'a DeviceVec<T>> {
    let v = T::get(buf).ok_or_else(|| invalid(op, format!("operand of dtype {:?}", buf.dtype())))?;
    let n = l.shape().elem_count();
    if l.is_contiguous() && l.start_offset() == 0 && v.len() == n {
        return Ok(v);
    }
    let mut copy = Buf::uninit(dev, buf.dtype(), n)?;
    elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
    *keep = T::take(copy);
    keep.as_ref().ok_or_else(|| invalid(op, "copy of another dtype"))
}

/// The view `l` of `buf` as an exactly-sized contiguous range of `T`: no copy when the
/// layout is contiguous at any start offset (a narrowed table, a row range), else a copy
/// kept in `keep` ([`contiguous`]). For kernels that take any start alignment.
pub fn contiguous_view<'a, T: BufElem>(dev: &Device, buf: &'a Buf, l: &Layout, keep: &'a mut Option<DeviceVec<T>>, op: &'static str) -> Result<DeviceView<'a, T>> {
    let (start, n) = (l.start_offset(), l.shape().elem_count());
    match T::get(buf) {
        Some(v) if l.is_contiguous() && start + n <= v.len() => v.view(start..start + n).map_err(at(op)),
        // Strided layouts, and a buffer of another dtype (`contiguous` says so).
        _ => contiguous(dev, buf, l, keep, op)?.view(..).map_err(at(op)),
    }
}

/// Allocates `n` elements of `T` for `op`'s output, uninitialized: every caller's kernel
/// writes all of them.
pub fn alloc<T: Copy>(dev: &Device, n: usize, op: &'static str) -> Result<DeviceVec<T>> {
    dev.alloc_uninit::<T>(n).map_err(at(op))
}

/// Row-major (contiguous) strides of `dims`.
pub fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}
