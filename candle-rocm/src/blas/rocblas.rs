//! rocBLAS (rocm-rs 0.4.2 bindings) for the GEMMs of an AMD device: one handle per device
//! stream (a handle's workspace must not be shared by two streams), bound to that stream
//! before every call.
//!
//! NOT RUN: no AMD GPU or ROCm install was available while this was written; it
//! type-checks (`SKIP_BINDGEN=1 cargo check -p candle-rocm --features rocm`, as CI does)
//! and follows the same layout plan as the cuBLAS path, which was run on an H100.
use super::layout::{ColMajorGemm, MAX_BATCH};
use super::{BlasCall, PerStream};
use candle_core::DType;
use kernels::runtime::rocm::RocmDevice;
use rocm_rs::rocblas::{ffi, Handle};
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

// rocm-rs 0.4.2 binds `rocblas_gemm_strided_batched_ex` but does not re-export it (its
// bindings module is crate-private), so it is declared here, as `rocblas.h` (ROCm 6.x)
// declares it; the library is linked by rocm-rs's build script.
#[link(name = "rocblas")]
unsafe extern "C" {
    fn rocblas_gemm_strided_batched_ex(
        handle: ffi::rocblas_handle,
        trans_a: ffi::rocblas_operation,
        trans_b: ffi::rocblas_operation,
        m: ffi::rocblas_int,
        n: ffi::rocblas_int,
        k: ffi::rocblas_int,
        alpha: *const c_void,
        a: *const c_void,
        a_type: ffi::rocblas_datatype,
        lda: ffi::rocblas_int,
        stride_a: ffi::rocblas_stride,
        b: *const c_void,
        b_type: ffi::rocblas_datatype,
        ldb: ffi::rocblas_int,
        stride_b: ffi::rocblas_stride,
        beta: *const c_void,
        c: *const c_void,
        c_type: ffi::rocblas_datatype,
        ldc: ffi::rocblas_int,
        stride_c: ffi::rocblas_stride,
        d: *mut c_void,
        d_type: ffi::rocblas_datatype,
        ldd: ffi::rocblas_int,
        stride_d: ffi::rocblas_stride,
        batch_count: ffi::rocblas_int,
        compute_type: ffi::rocblas_datatype,
        algo: ffi::rocblas_gemm_algo,
        solution_index: i32,
        flags: u32,
    ) -> ffi::rocblas_status;
}

/// A rocBLAS handle of one device stream.
pub struct Rocblas {
    handle: Mutex<Handle>,
}

fn status(call: &str, s: ffi::rocblas_status) -> Result<(), String> {
    if s == ffi::rocblas_status__rocblas_status_success {
        Ok(())
    } else {
        Err(format!("{call}: {}", rocm_rs::rocblas::Error::new(s)))
    }
}

/// The handle of `dev`'s stream, created on first use (the same answer each time).
pub fn for_device(dev: &RocmDevice) -> Result<Arc<Rocblas>, String> {
    static HANDLES: PerStream<Rocblas> = PerStream::new();
    HANDLES.get((dev.ordinal(), dev.stream().as_raw() as usize), || {
        dev.bind_device().map_err(|e| e.to_string())?;
        let h = Handle::new().map_err(|e| format!("rocblas_create_handle: {e}"))?;
        Ok(Arc::new(Rocblas { handle: Mutex::new(h) }))
    })
}

impl Rocblas {
    /// Runs `call` (all batches, in calls of at most [`MAX_BATCH`]) on `dev`'s stream.
    pub fn gemm(&self, dev: &RocmDevice, call: &BlasCall) -> Result<(), String> {
        let h = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        dev.bind_device().map_err(|e| e.to_string())?;
        h.set_stream(dev.stream())
            .map_err(|e| format!("rocblas_set_stream: {e}"))?;
        let mut start = 0;
        while start < call.batch {
            let nb = (call.batch - start).min(MAX_BATCH);
            let (a, b, c) = call.pointers(start);
            for addr in [a, b, c] {
                dev.note_graph_use(addr);
            }
            // SAFETY: the caller checked that every element the plan addresses in `nb`
            // batches from `start` lies inside the operands and the output, which stay
            // alive until the queued call has run (stream-ordered allocator).
            unsafe { launch(h.as_raw(), &call.plan, call.dtype, a, b, c, nb as i32)? };
            start += nb;
        }
        Ok(())
    }
}

fn op(t: bool) -> ffi::rocblas_operation {
    if t {
        ffi::rocblas_operation__rocblas_operation_transpose
    } else {
        ffi::rocblas_operation__rocblas_operation_none
    }
}

unsafe fn launch(
    h: ffi::rocblas_handle,
    p: &ColMajorGemm,
    dtype: DType,
    a: u64,
    b: u64,
    c: u64,
    nb: i32,
) -> Result<(), String> {
    let (ta, tb) = (op(p.trans_a), op(p.trans_b));
    let (av, bv, cv) = (
        a as usize as *const c_void,
        b as usize as *const c_void,
        c as usize as *mut c_void,
    );
    // The typed (f32, f64) calls: same arguments, alpha = 1 and beta = 0 of the type.
    macro_rules! typed {
        ($f:ident, $t:ty) => {{
            let (one, zero): ($t, $t) = (1.0, 0.0);
            status(stringify!($f), ffi::$f(h, ta, tb, p.m, p.n, p.k, &one, av.cast(), p.lda, p.stride_a, bv.cast(), p.ldb, p.stride_b, &zero, cv.cast(), p.ldc, p.stride_c, nb))
        }};
    }
    // SAFETY: the caller's contract; alpha/beta are host values (default pointer mode).
    unsafe {
        match dtype {
            DType::F32 => typed!(rocblas_sgemm_strided_batched, f32),
            DType::F64 => typed!(rocblas_dgemm_strided_batched, f64),
            DType::F16 | DType::BF16 => {
                let ty = if dtype == DType::F16 {
                    ffi::rocblas_datatype__rocblas_datatype_f16_r
                } else {
                    ffi::rocblas_datatype__rocblas_datatype_bf16_r
                };
                // f32 compute type, so alpha/beta are f32; D = C (beta = 0, C not read).
                let (one, zero) = (1f32, 0f32);
                status(
                    "rocblas_gemm_strided_batched_ex",
                    rocblas_gemm_strided_batched_ex(
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
                        cv,
                        ty,
                        p.ldc,
                        p.stride_c,
                        nb,
                        ffi::rocblas_datatype__rocblas_datatype_f32_r,
                        ffi::rocblas_gemm_algo__rocblas_gemm_algo_standard,
                        0,
                        0,
                    ),
                )
            }
            d => Err(format!("no rocBLAS GEMM for {d:?}")),
        }
    }
}
