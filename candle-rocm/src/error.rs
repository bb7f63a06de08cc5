//! Candle errors for this backend: unsupported dtypes, kernel launch failures, bad input.
use candle_core::{DType, Error};
use kernel_dsl::host::LaunchError;

/// `op` has no kernel for `dtype` (yet): a clear error instead of a fallback.
pub fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDTypeForOp(dtype, op).bt()
}

/// A kernel launch or buffer operation of `op` failed.
pub fn launch(op: &str, e: LaunchError) -> Error {
    Error::Msg(format!("rocm-kernels: {op}: {e}")).bt()
}

/// Bad input to `op` (shape, layout, operand from another device).
pub fn invalid(op: &str, reason: impl std::fmt::Display) -> Error {
    Error::Msg(format!("rocm-kernels: {op}: {reason}")).bt()
}

/// `.map_err(at("op"))` for launcher results.
pub fn at(op: &'static str) -> impl Fn(LaunchError) -> Error {
    move |e| launch(op, e)
}
