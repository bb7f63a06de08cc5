//! Collectives of `kernel-collectives` on Candle tensors of this backend: the two a
//! tensor-parallel model needs (a sum across ranks after a row-parallel product, and a
//! gather of vocabulary-parallel logits). Each takes one rank's tensor on that rank's device
//! and returns a new tensor there; the collective is queued on the device's queue after
//! the ops before it, like a kernel.
use crate::buffer::BufElem;
use crate::error::invalid;
use crate::tensor_access::{input, output, rocm_device};
use candle_core::{DType, Result, Shape, Tensor};
use kernel_collectives::{Collective, CollectiveType, ReduceOp};

fn lib_err(op: &str, e: kernel_collectives::CollectiveError) -> candle_core::Error {
    invalid(op, e.to_string())
}

fn launch_err(op: &str, e: kernel_dsl::host::LaunchError) -> candle_core::Error {
    invalid(op, e.to_string())
}

fn typed<T: BufElem + CollectiveType, C: Collective>(op: &'static str, comm: &C, x: &Tensor, out_shape: Shape) -> Result<Tensor> {
    let dev = rocm_device(op, "x", x)?;
    let (s, l) = x.storage_and_layout();
    let inp = input::<T>(op, "x", dev, &s, l)?;
    let mut out = dev.kernels().alloc_uninit::<T>(out_shape.elem_count()).map_err(|e| launch_err(op, e))?;
    let send = inp.view(..).map_err(|e| launch_err(op, e))?;
    let recv = out.view_mut(..).map_err(|e| launch_err(op, e))?;
    match op {
        "all_reduce_sum" => comm.all_reduce(send, recv, ReduceOp::Sum),
        _ => comm.all_gather(send, recv),
    }
    .map_err(|e| lib_err(op, e))?;
    drop(inp);
    drop(s);
    Ok(output(dev, out, out_shape))
}

/// The elementwise sum of `x` over every rank of `comm` (each rank passes its own `x` of
/// the same shape): f32, f16 or bf16.
pub fn all_reduce_sum<C: Collective>(comm: &C, x: &Tensor) -> Result<Tensor> {
    let op = "all_reduce_sum";
    let shape = x.shape().clone();
    match x.dtype() {
        DType::F32 => typed::<f32, C>(op, comm, x, shape),
        DType::F16 => typed::<half::f16, C>(op, comm, x, shape),
        DType::BF16 => typed::<half::bf16, C>(op, comm, x, shape),
        d => Err(invalid(op, format!("dtype {d:?} (f32, f16, bf16)"))),
    }
}

/// Every rank's `x` stacked in rank order: `[world, x.shape...]` (each rank passes an `x`
/// of the same shape): f32, f16 or bf16.
pub fn all_gather<C: Collective>(comm: &C, x: &Tensor) -> Result<Tensor> {
    let op = "all_gather";
    let mut dims = vec![comm.world_size()];
    dims.extend_from_slice(x.dims());
    let shape = Shape::from(dims);
    match x.dtype() {
        DType::F32 => typed::<f32, C>(op, comm, x, shape),
        DType::F16 => typed::<half::f16, C>(op, comm, x, shape),
        DType::BF16 => typed::<half::bf16, C>(op, comm, x, shape),
        d => Err(invalid(op, format!("dtype {d:?} (f32, f16, bf16)"))),
    }
}
