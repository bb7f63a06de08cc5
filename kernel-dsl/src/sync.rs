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
