//! conv2d through MIOpen (rocm-rs 0.4.2 `miopen` feature) on an AMD device; im2col + GEMM
//! stays the path everywhere else and for what this does not take.
//!
//! NOT RUN: no AMD GPU or ROCm install was available while this was written; it
//! type-checks (`SKIP_BINDGEN=1 cargo check -p candle-rocm --features rocm`, as CI does).
//! The input and kernel are made contiguous (NCHW / OIHW, packed: the layouts every MIOpen
//! forward algorithm takes), the output is contiguous NCHW. The algorithm comes from
//! `miopenFindConvolutionForwardAlgorithm` (MIOpen caches its answers in its find-db);
//! the workspace is a scratch buffer from the device's caching allocator.
use super::{blas_allowed, PerStream};
use crate::buffer::{Buf, BufElem, Region};
use crate::error::{at, invalid};
use crate::ops::{alloc, contiguous, float_dispatch};
use candle_core::conv::ParamsConv2D;
use candle_core::{DType, Layout, Result};
use kernels::runtime::rocm::RocmDevice;
use kernels::runtime::Device;
use rocm_rs::miopen::{self, ffi, ConvolutionDescriptor, TensorDescriptor};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

const OP: &str = "conv2d (MIOpen)";

/// The MIOpen handle of `dev`'s stream, created on first use (the same answer each time).
fn handle(dev: &RocmDevice) -> std::result::Result<Arc<Mutex<miopen::Handle>>, String> {
    static HANDLES: PerStream<Mutex<miopen::Handle>> = PerStream::new();
    HANDLES.get((dev.ordinal(), dev.stream().as_raw() as usize), || {
        dev.bind_device().map_err(|e| e.to_string())?;
        miopen::Handle::new().map(|h| Arc::new(Mutex::new(h))).map_err(|e| format!("miopenCreate: {e}"))
    })
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid(OP, format!("{v} exceeds i32")))
}

fn miopen_err(call: &'static str) -> impl Fn(miopen::Error) -> candle_core::Error {
    move |e| invalid(OP, format!("{call}: {e}"))
}

/// conv2d of `x` (view `l`) with `kernel` (view `kl`) through MIOpen, or `None` when the
/// device is not an AMD GPU, the vendor libraries are switched off
/// ([`with_kernel_gemm`](super::with_kernel_gemm), `CANDLE_ROCM_BLAS=0`), the dtype is not
/// f32/f16/bf16, a size exceeds i32, or MIOpen cannot be initialised.
pub fn conv2d(
    dev: &Device,
    x: &Buf,
    l: &Layout,
    kernel: &Buf,
    kl: &Layout,
    p: &ParamsConv2D,
) -> Result<Option<Buf>> {
    let Device::Rocm(rd) = dev else {
        return Ok(None);
    };
    if !blas_allowed() || !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Ok(None);
    }
    let dims = l.dims();
    if dims.len() != 4 || kl.dims().len() != 4 || l.shape().elem_count() > i32::MAX as usize {
        return Ok(None);
    }
    let Ok(h) = handle(rd) else { return Ok(None) };
    let h = h.lock().unwrap_or_else(PoisonError::into_inner);
    rd.bind_device().map_err(at(OP))?;
    h.set_stream(rd.stream())
        .map_err(miopen_err("miopenSetStream"))?;
    let ty = match x.dtype() {
        DType::F16 => ffi::miopenDataType_t_miopenHalf,
        DType::BF16 => ffi::miopenDataType_t_miopenBFloat16,
        _ => ffi::miopenDataType_t_miopenFloat,
    };
    let (h_out, w_out) = (p.out_h(), p.out_w());
    let mut xd = TensorDescriptor::new().map_err(miopen_err("miopenCreateTensorDescriptor"))?;
    xd.set_4d(
        ty,
        i32_of(dims[0])?,
        i32_of(dims[1])?,
        i32_of(dims[2])?,
        i32_of(dims[3])?,
    )
    .map_err(miopen_err("miopenSet4dTensorDescriptor"))?;
    let mut wd = TensorDescriptor::new().map_err(miopen_err("miopenCreateTensorDescriptor"))?;
    wd.set_4d(
        ty,
        i32_of(p.c_out)?,
        i32_of(p.c_in)?,
        i32_of(p.k_h)?,
        i32_of(p.k_w)?,
    )
    .map_err(miopen_err("miopenSet4dTensorDescriptor"))?;
    let mut yd = TensorDescriptor::new().map_err(miopen_err("miopenCreateTensorDescriptor"))?;
    yd.set_4d(
        ty,
        i32_of(p.b_size)?,
        i32_of(p.c_out)?,
        i32_of(h_out)?,
        i32_of(w_out)?,
    )
    .map_err(miopen_err("miopenSet4dTensorDescriptor"))?;
    let mut cd =
        ConvolutionDescriptor::new().map_err(miopen_err("miopenCreateConvolutionDescriptor"))?;
    let (pad, st, dil) = (i32_of(p.padding)?, i32_of(p.stride)?, i32_of(p.dilation)?);
    cd.init_2d(
        ffi::miopenConvolutionMode_t_miopenConvolution,
        pad,
        pad,
        st,
        st,
        dil,
        dil,
    )
    .map_err(miopen_err("miopenInitConvolutionDescriptor"))?;
    let ws_bytes =
        miopen::convolution::get_convolution_forward_workspace_size(&h, &wd, &xd, &cd, &yd)
            .map_err(miopen_err("miopenConvolutionForwardGetWorkSpaceSize"))?;
    let ws = dev.scratch::<u8>(ws_bytes.max(1)).map_err(at(OP))?;
    let ws_ptr = Region::of::<u8>(&ws).addr() as usize as *mut c_void;
    float_dispatch!(x.dtype(), OP, T => {
        let mut keep_x = None;
        let xc = contiguous::<T>(dev, x, l, &mut keep_x, OP)?;
        let x_ptr = Region::of::<T>(xc).addr() as usize as *const c_void;
        let mut keep = None;
        let kc = contiguous::<T>(dev, kernel, kl, &mut keep, OP)?;
        if kc.len() != p.c_out * p.c_in * p.k_h * p.k_w {
            return Err(invalid(OP, format!("kernel has {} elements, {:?} expected", kc.len(), (p.c_out, p.c_in, p.k_h, p.k_w))));
        }
        let w_ptr = Region::of::<T>(kc).addr() as usize as *const c_void;
        let out = alloc::<T>(dev, p.b_size * p.c_out * h_out * w_out, OP)?;
        let y_ptr = Region::of::<T>(&out).addr() as usize as *mut c_void;
        // SAFETY: the descriptors describe the live buffers behind the pointers (input
        // view, contiguous kernel, fresh output, workspace of `ws_bytes`), all of this
        // device and alive until the queued work has run (stream-ordered allocator).
        let algo = unsafe {
            let (n, perf) = miopen::find_convolution_forward_algorithm(&h, &xd, x_ptr, &wd, w_ptr, &cd, &yd, y_ptr, 1, ws_ptr, ws_bytes, false)
                .map_err(miopen_err("miopenFindConvolutionForwardAlgorithm"))?;
            if n < 1 {
                return Err(invalid(OP, "MIOpen found no forward algorithm"));
            }
            perf[0].__bindgen_anon_1.fwd_algo
        };
        let (one, zero) = (1f32.to_ne_bytes(), 0f32.to_ne_bytes());
        // SAFETY: as above; alpha/beta are f32 for every data type.
        unsafe {
            miopen::convolution_forward(&h, &one, &xd, x_ptr, &wd, w_ptr, &cd, algo, &zero, &yd, y_ptr, ws_ptr, ws_bytes)
                .map_err(miopen_err("miopenConvolutionForward"))?;
        }
        drop(ws);
        Ok(Some(T::wrap(out)))
    })
}
