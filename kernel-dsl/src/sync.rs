//! Work-group synchronisation.

/// Work-group barrier: waits until every work-item of the work-group has reached it, and
/// makes shared-memory writes before it visible to reads after it.
///
/// Must be reached in work-group-uniform control flow. The CPU executor reports work-items
/// waiting at different barriers as an error instead of hanging.
#[inline(always)]
#[track_caller]
pub fn barrier() {
    crate::arch::barrier()
}

/// Work-group barrier that also orders **global** memory between the work-group's
/// work-items: global stores before it are visible to global loads of any work-item of the
/// group after it (for kernels that hand data between work-items through global memory).
///
/// [`barrier`] gives this on NVIDIA (`bar.sync`) and on gfx9 (its wait covers stores), but
/// not on gfx10 and later, where stores have their own counter (`vscnt`) and the two halves
/// of a work-group in WGP mode read through different L0 caches: there a release fence
/// before the barrier waits for the stores and an acquire fence after it invalidates the
/// caches (LLVM's AMDGPU memory model picks the instructions for each generation).
#[inline(always)]
#[track_caller]
pub fn barrier_global() {
    crate::arch::barrier_global()
}
