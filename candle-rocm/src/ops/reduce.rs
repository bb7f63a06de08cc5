//! Reductions (sum, max, min, argmax, argmin) over any set of dimensions of a strided view.
use super::{alloc, float_dispatch};
use crate::buffer::{Buf, BufElem};
use crate::error::{at, invalid};
use candle_core::op::ReduceOp;
use candle_core::{Layout, Result};
use kernels::reduce as kr;
use kernels::runtime::{Device, DeviceVec};

/// Candle's `reduce_op`: the output keeps the reduced dimensions with size 1 (contiguous).
pub fn reduce(dev: &Device, buf: &Buf, l: &Layout, op: ReduceOp, dims: &[usize]) -> Result<Buf> {
    let name = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::ArgMax => "argmax",
        ReduceOp::ArgMin => "argmin",
    };
    if !matches!(buf.dtype(), candle_core::DType::F32 | candle_core::DType::F16 | candle_core::DType::BF16) {
        return super::any::reduce(dev, buf, l, op, dims);
    }
    let outputs: usize =
        l.dims().iter().enumerate().filter(|(d, _)| !dims.contains(d)).map(|(_, &s)| s).product();
    float_dispatch!(buf.dtype(), name, T => {
        // The kernels read strided views but take no start offset: offset views are copied.
        let mut keep: Option<DeviceVec<T>> = None;
        let (x, strides) = if l.start_offset() == 0 {
            (T::get(buf).ok_or_else(|| invalid(name, "dtype"))?, l.stride().to_vec())
        } else {
            let c = super::contiguous::<T>(dev, buf, l, &mut keep, name)?;
            (c, super::row_major_strides(l.dims()))
        };
        let run = |e| at(name)(e);
        match op {
            ReduceOp::ArgMin | ReduceOp::ArgMax => {
                let mut y = alloc::<u32>(dev, outputs, name)?;
                if op == ReduceOp::ArgMax {
                    kr::arg_reduce::<T, kr::ArgMax>(dev, x, l.dims(), &strides, dims, &mut y)
                } else {
                    kr::arg_reduce::<T, kr::ArgMin>(dev, x, l.dims(), &strides, dims, &mut y)
                }
                .map_err(run)?;
                Ok(Buf::U32(y))
            }
            _ => {
                let mut y = alloc::<T>(dev, outputs, name)?;
                match op {
                    ReduceOp::Sum => kr::reduce::<T, kr::Sum>(dev, x, l.dims(), &strides, dims, &mut y),
                    ReduceOp::Max => kr::reduce::<T, kr::Max>(dev, x, l.dims(), &strides, dims, &mut y),
                    _ => kr::reduce::<T, kr::Min>(dev, x, l.dims(), &strides, dims, &mut y),
                }
                .map_err(run)?;
                Ok(T::wrap(y))
            }
        }
    })
}
