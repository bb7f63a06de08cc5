//! cuBLAS (through `cudarc`, `libcublas` loaded at run time) for the GEMMs of an NVIDIA
//! device: one handle per device stream (a cuBLAS handle's workspace must not be shared by
//! work on two streams), bound to that stream before every call.
use super::layout::{ColMajorGemm, MAX_BATCH};
use super::{BlasCall, PerStream};
use candle_core::DType;
use cudarc::cublas::sys::{self, cublasOperation_t as Op, cudaDataType as Ty};
use kernels::runtime::cuda::CudaDevice;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

/// A cuBLAS handle of one device stream (created with the GPU's primary context current).
pub struct Cublas {
    handle: Mutex<sys::cublasHandle_t>,
    version: i32,
}

// SAFETY: the handle is only used under its mutex, with the device's context made current
// first; cuBLAS handles may move between threads that way.
unsafe impl Send for Cublas {}
// SAFETY: as for `Send`: every use locks the mutex.
unsafe impl Sync for Cublas {}

fn status(call: &str, s: sys::cublasStatus_t) -> Result<(), String> {
    if s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call}: {s:?}"))
    }
}

/// The handle of `dev`'s stream, created on first use; the error says why cuBLAS is
/// unavailable (library missing, handle creation failed), the same answer each time.
/// Handles live for the process (a later device whose stream reuses the address gets the
/// same handle, equally valid: same GPU context, stream re-bound before each call).
pub fn for_device(dev: &CudaDevice) -> Result<Arc<Cublas>, String> {
    static HANDLES: PerStream<Cublas> = PerStream::new();
    HANDLES.get((dev.ordinal(), dev.raw_stream() as usize), || create(dev))
}

/// The cuBLAS functions this module calls.
const USED: [&str; 7] = [
    "cublasCreate_v2",
    "cublasGetVersion_v2",
    "cublasSetMathMode",
    "cublasSetStream_v2",
    "cublasSgemmStridedBatched",
    "cublasDgemmStridedBatched",
    "cublasGemmStridedBatchedEx",
];

fn create(dev: &CudaDevice) -> Result<Arc<Cublas>, String> {
    // SAFETY: only tries to dlopen the library names cudarc knows.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcublas not found (cudarc looks for libcublas.so and libcublas.so.12/.11/...; put its directory on LD_LIBRARY_PATH)".into());
    }
    // cudarc resolves each function on first call and panics when it is missing: check
    // every function used here now, so an old or foreign library is "no cuBLAS: ..."
    // instead of a panic in the middle of a matmul.
    for name in USED {
        // SAFETY: looks a symbol up without calling it; the library was found above.
        if unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
            return Err(format!("the loaded libcublas has no {name}"));
        }
    }
    dev.bind_context().map_err(|e| e.to_string())?;
    // Belt and braces: the first calls also run under `catch_unwind`.
    let made = std::panic::catch_unwind(|| -> Result<(sys::cublasHandle_t, i32), String> {
        let mut h: sys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the device's context is current.
        status("cublasCreate", unsafe { sys::cublasCreate_v2(&mut h) })?;
        let mut version = 0;
        // SAFETY: fresh handle, valid out-pointer.
        status("cublasGetVersion", unsafe {
            sys::cublasGetVersion_v2(h, &mut version)
        })?;
        // Default math (f32 stays exact f32: no TF32) with reduced-precision reductions
        // disallowed (flag value 16 on top of the default 0): split-K partial sums of
        // f16/bf16 products stay in f32, so every GEMM accumulates in f32 throughout.
        // SAFETY: fresh handle.
        status("cublasSetMathMode", unsafe {
            sys::cublasSetMathMode(
                h,
                sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        })?;
        Ok((h, version))
    })
    .map_err(|_| "libcublas lacks a symbol cudarc expects".to_string())??;
    Ok(Arc::new(Cublas {
        handle: Mutex::new(made.0),
        version: made.1,
    }))
}

impl Cublas {
    /// `libcublas`'s version number (e.g. 130001 for 13.0.1).
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Runs `call` (all batches, in calls of at most [`MAX_BATCH`]) on `dev`'s stream.
    pub fn gemm(&self, dev: &CudaDevice, call: &BlasCall) -> Result<(), String> {
        let h = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        dev.bind_context().map_err(|e| e.to_string())?;
        // SAFETY: valid handle; the stream lives as long as `dev`, and cuBLAS only queues on it.
        status("cublasSetStream", unsafe {
            sys::cublasSetStream_v2(*h, dev.raw_stream() as sys::cudaStream_t)
        })?;
        let p = &call.plan;
        let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
        let mut start = 0;
        while start < call.batch {
            let nb = (call.batch - start).min(MAX_BATCH);
            let (a, b, c) = call.pointers(start);
            for addr in [a, b, c] {
                dev.note_graph_use(addr);
            }
            // SAFETY: `call` was checked by the caller: every element the plan addresses in
            // `nb` batches from `start` lies inside the operand regions and the output,
            // which stay alive until the queued call has run (stream-ordered allocator).
            let s = unsafe {
                launch(
                    *h,
                    p,
                    op(p.trans_a),
                    op(p.trans_b),
                    call.dtype,
                    a,
                    b,
                    c,
                    nb as i32,
                )?
            };
            status(s.0, s.1)?;
            start += nb;
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    h: sys::cublasHandle_t,
    p: &ColMajorGemm,
    ta: Op,
    tb: Op,
    dtype: DType,
    a: u64,
    b: u64,
    c: u64,
    nb: i32,
) -> Result<(&'static str, sys::cublasStatus_t), String> {
    let (av, bv, cv) = (
        a as usize as *const c_void,
        b as usize as *const c_void,
        c as usize as *mut c_void,
    );
    // The typed (f32, f64) calls: same arguments, alpha = 1 and beta = 0 of the type.
    macro_rules! typed {
        ($f:ident, $t:ty) => {{
            let (one, zero): ($t, $t) = (1.0, 0.0);
            (stringify!($f), sys::$f(h, ta, tb, p.m, p.n, p.k, &one, av.cast(), p.lda, p.stride_a, bv.cast(), p.ldb, p.stride_b, &zero, cv.cast(), p.ldc, p.stride_c, nb))
        }};
    }
    // SAFETY: the caller's contract (valid pointers and sizes); alpha/beta are host values
    // (the handle's default pointer mode).
    unsafe {
        Ok(match dtype {
            DType::F32 => typed!(cublasSgemmStridedBatched, f32),
            DType::F64 => typed!(cublasDgemmStridedBatched, f64),
            DType::F16 | DType::BF16 => {
                let ty = if dtype == DType::F16 {
                    Ty::CUDA_R_16F
                } else {
                    Ty::CUDA_R_16BF
                };
                // f32 accumulation and f32 alpha/beta (CUBLAS_COMPUTE_32F).
                let (one, zero) = (1f32, 0f32);
                (
                    "cublasGemmStridedBatchedEx",
                    sys::cublasGemmStridedBatchedEx(
                        h,
                        ta,
                        tb,
                        p.m,
                        p.n,
                        p.k,
                        (&one as *const f32).cast(),
                        av,
                        ty,
                        p.lda,
                        p.stride_a,
                        bv,
                        ty,
                        p.ldb,
                        p.stride_b,
                        (&zero as *const f32).cast(),
                        cv,
                        ty,
                        p.ldc,
                        p.stride_c,
                        nb,
                        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    ),
                )
            }
            d => return Err(format!("no cuBLAS GEMM for {d:?}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every function this module calls resolves in the libcublas on the search path (no
    /// GPU needed: only dlopen/dlsym). Without a libcublas it is skipped, loudly.
    #[test]
    fn every_function_used_is_in_libcublas() {
        // SAFETY: only tries to dlopen the library names cudarc knows.
        if !unsafe { sys::is_culib_present() } {
            eprintln!("SKIPPED: no libcublas on the library search path (LD_LIBRARY_PATH)");
            return;
        }
        for name in USED {
            // SAFETY: looks a symbol up without calling it.
            let found = unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) };
            assert!(found.is_ok(), "libcublas has no {name}");
        }
        eprintln!("all {} cuBLAS functions found", USED.len());
    }
}
