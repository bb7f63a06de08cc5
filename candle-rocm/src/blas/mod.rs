//! Vendor BLAS for the backend's GEMMs: cuBLAS on an NVIDIA device (`cuda` feature),
//! rocBLAS on an AMD device (`rocm` feature); the backend's own kernel everywhere else,
//! for layouts a BLAS cannot take, and when the library cannot be loaded.
//!
//! [`ops::matmul::gemm`](crate::ops::matmul::gemm) asks [`try_gemm`] first. Each device
//! stream gets its own library handle (created on first use), bound to that stream for
//! each call, so BLAS work stays ordered with the kernels.
//!
//! Forcing the backend's kernel (to compare both on one GPU, or to rule the BLAS out):
//! [`with_kernel_gemm`] for the GEMMs issued inside a closure on the current thread, or
//! `CANDLE_ROCM_BLAS=0` in the environment for the whole process.
pub mod layout;

#[cfg(feature = "cuda")]
pub mod cublas;
#[cfg(feature = "rocm")]
pub mod miopen;
#[cfg(feature = "rocm")]
pub mod rocblas;

use crate::buffer::Region;
#[cfg(any(feature = "cuda", feature = "rocm"))]
use crate::error::invalid;
use crate::gemm::{GemmOperand, GemmShape};
use candle_core::{DType, Result};
use kernels::runtime::Device;
use layout::ColMajorGemm;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Library handles by (device ordinal, stream), each created on first use; the same answer
/// (the handle, or why it could not be made) comes back every time. Handles live for the
/// process.
#[cfg(any(feature = "cuda", feature = "rocm"))]
type HandleMap<T> = std::collections::HashMap<(usize, usize), std::result::Result<std::sync::Arc<T>, String>>;

#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) struct PerStream<T>(OnceLock<std::sync::Mutex<HandleMap<T>>>);

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<T> PerStream<T> {
    pub(crate) const fn new() -> Self {
        PerStream(OnceLock::new())
    }

    /// The handle of `key`, made by `create` the first time.
    pub(crate) fn get(
        &self,
        key: (usize, usize),
        create: impl FnOnce() -> std::result::Result<std::sync::Arc<T>, String>,
    ) -> std::result::Result<std::sync::Arc<T>, String> {
        let mut map = self.0.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(key).or_insert_with(create).clone()
    }
}

/// GEMMs handed to a vendor BLAS in this process (one per [`try_gemm`] that ran one).
static BLAS_GEMMS: AtomicU64 = AtomicU64::new(0);

/// How many GEMMs a vendor BLAS has run in this process: lets tests (and logs) tell which
/// path a product took.
pub fn blas_gemm_count() -> u64 {
    BLAS_GEMMS.load(Ordering::Relaxed)
}

thread_local! {
    static KERNEL_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every GEMM it issues on this thread going to the backend's own kernel
/// instead of the vendor BLAS (restored afterwards, also on panic).
pub fn with_kernel_gemm<R>(f: impl FnOnce() -> R) -> R {
    with_thread_flag(&KERNEL_ONLY, f)
}

/// Runs `f` with the thread-local `flag` set, restoring its previous value afterwards (also
/// on panic).
pub(crate) fn with_thread_flag<R>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> R) -> R {
    with_thread_value(flag, true, f)
}

/// Runs `f` with the thread-local `key` holding `value`, restoring its previous value
/// afterwards (also on panic).
pub(crate) fn with_thread_value<T: Copy + 'static, R>(key: &'static std::thread::LocalKey<Cell<T>>, value: T, f: impl FnOnce() -> R) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|k| k.set(self.1));
        }
    }
    let _restore = Restore(key, key.with(|k| k.replace(value)));
    f()
}

/// `CANDLE_ROCM_BLAS=0` (read once): no vendor BLAS in this process.
fn disabled_by_env() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var("CANDLE_ROCM_BLAS").is_ok_and(|v| v == "0"))
}

/// `true` while GEMMs may use the vendor BLAS on this thread.
pub fn blas_allowed() -> bool {
    !disabled_by_env() && !KERNEL_ONLY.with(|k| k.get())
}

/// What runs `dev`'s GEMMs when the layout allows: `"cuBLAS 13.0.1"`, `"rocBLAS"`, or
/// `"no cuBLAS: <why>"` / `"no rocBLAS: <why>"`; `None` for the CPU executor (our kernel).
/// Loads the library on first use.
pub fn describe(dev: &Device) -> Option<String> {
    match dev {
        Device::Cpu(_) => None,
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => Some(match cublas::for_device(d) {
            Ok(b) => {
                let v = b.version();
                format!("cuBLAS {}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
            }
            Err(e) => format!("no cuBLAS: {e}"),
        }),
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => Some(match rocblas::for_device(d) {
            Ok(_) => "rocBLAS".to_string(),
            Err(e) => format!("no rocBLAS: {e}"),
        }),
    }
}

/// `true` when `dev` is a GPU whose vendor BLAS loaded (whether or not it is allowed now).
pub fn available(dev: &Device) -> bool {
    describe(dev).is_some_and(|d| !d.starts_with("no "))
}

/// One strided-batched BLAS GEMM: the plan, the element type and the base addresses of
/// `A'` (the right operand), `B'` (the left operand) and `C`.
pub struct BlasCall {
    pub plan: ColMajorGemm,
    pub batch: usize,
    pub dtype: DType,
    a: u64,
    b: u64,
    c: u64,
    elem: u64,
}

impl BlasCall {
    /// Addresses of `A'`, `B'` and `C` at batch entry `start`.
    pub fn pointers(&self, start: usize) -> (u64, u64, u64) {
        let at = |base: u64, stride: i64| base + start as u64 * stride as u64 * self.elem;
        (
            at(self.a, self.plan.stride_a),
            at(self.b, self.plan.stride_b),
            at(self.c, self.plan.stride_c),
        )
    }
}

/// Runs `c = a * b` through the device's BLAS when it has one, it is allowed
/// ([`blas_allowed`]) and the layouts have a BLAS form; `Ok(false)` leaves the product to
/// the caller's kernel. Operands must already be checked to lie inside their regions.
pub fn try_gemm(
    dev: &Device,
    dtype: DType,
    a: &GemmOperand,
    b: &GemmOperand,
    c: &Region,
    s: GemmShape,
) -> Result<bool> {
    if matches!(dev, Device::Cpu(_)) || !blas_allowed() {
        return Ok(false);
    }
    let Some(plan) = layout::plan(a, b, s) else {
        return Ok(false);
    };
    #[cfg_attr(not(any(feature = "cuda", feature = "rocm")), allow(unused_variables))]
    let call = BlasCall {
        plan,
        batch: s.batch,
        dtype,
        a: b.data.addr(),
        b: a.data.addr(),
        c: c.addr(),
        elem: dtype.size_in_bytes() as u64,
    };
    let ran: bool = match dev {
        Device::Cpu(_) => Ok::<bool, candle_core::Error>(false),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => match cublas::for_device(d) {
            Ok(blas) => blas
                .gemm(d, &call)
                .map(|_| true)
                .map_err(|e| invalid("matmul (cuBLAS)", e)),
            Err(_) => Ok(false),
        },
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => match rocblas::for_device(d) {
            Ok(blas) => blas
                .gemm(d, &call)
                .map(|_| true)
                .map_err(|e| invalid("matmul (rocBLAS)", e)),
            Err(_) => Ok(false),
        },
    }?;
    if ran {
        BLAS_GEMMS.fetch_add(1, Ordering::Relaxed);
    }
    Ok(ran)
}
