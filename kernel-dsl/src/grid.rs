//! Ordering between consecutive kernels on a stream (NVIDIA's programmatic dependent
//! launch, `sm_90` and later): a kernel launched with
//! [`LaunchConfig::overlapping_prior`](crate::host::LaunchConfig::overlapping_prior) may
//! start while the previous kernel still runs, doing work that needs nothing from it
//! (issuing loads of constant data), and calls [`wait_prior`] before it touches what the
//! previous kernel writes or reads. Everywhere else (AMD, the CPU executor, PTX for
//! earlier targets, ordinary launches) kernels run one after the other and both calls do
//! nothing.

/// Waits until the kernels launched before this one on the stream have finished and their
/// memory writes are visible (`griddepcontrol.wait`). Returns at once where kernels do not
/// overlap.
#[inline(always)]
pub fn wait_prior() {
    #[cfg(all(target_arch = "nvptx64", any(target_feature = "sm_90", target_feature = "sm_90a")))]
    // SAFETY: no operands; a compiler memory barrier (no `nomem`), so no access moves above it.
    unsafe {
        core::arch::asm!("griddepcontrol.wait;", options(nostack))
    }
}

/// Lets the next kernel on the stream, if it was launched to overlap this one, start now
/// rather than when this kernel ends (`griddepcontrol.launch_dependents`). It still waits
/// for this kernel's end in its [`wait_prior`], so calling this early is always safe.
#[inline(always)]
pub fn release_next() {
    #[cfg(all(target_arch = "nvptx64", any(target_feature = "sm_90", target_feature = "sm_90a")))]
    // SAFETY: no operands.
    unsafe {
        core::arch::asm!("griddepcontrol.launch_dependents;", options(nostack))
    }
}
