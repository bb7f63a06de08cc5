//! Host-side helpers the checked launchers share for kernel arguments.
use kernel_dsl::host::{ArgValue, KernelArgSlice, KernelArgSliceMut};

/// A checked part of a kernel argument (a batch tile), passed as is.
pub(crate) struct Part(pub(crate) ArgValue);

impl<T> KernelArgSlice<T> for Part {
    fn kernel_arg(&self) -> ArgValue {
        self.0
    }
}
impl<T> KernelArgSliceMut<T> for Part {}

/// The slice argument `a` advanced by `bytes`, `len` elements long (inside `a`: the callers
/// checked the lengths).
pub(crate) fn offset(a: ArgValue, bytes: usize, len: usize) -> ArgValue {
    match a {
        ArgValue::Slice { addr, location, .. } => ArgValue::Slice { addr: addr + bytes as u64, len, location },
        other => other,
    }
}
