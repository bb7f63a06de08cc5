//! Errors of a launch.

use crate::Dim3;

/// Why a launch failed.
///
/// Coordinates are written `(x,y,z)`; `group` is the work-group index (`block_idx`) and
/// `item` the work-item index inside it (`thread_idx`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// The launch geometry cannot run: a block dimension is 0, the block has more than
    /// [`MAX_BLOCK_SIZE`](crate::MAX_BLOCK_SIZE) work-items, or the grid has more than
    /// `u64::MAX` work-groups. (A grid dimension of 0 is not an error: it is an empty launch.)
    #[error("invalid launch geometry: {reason}")]
    InvalidGeometry {
        /// What is wrong with it.
        reason: String,
    },
    /// A work-item panicked with a bounds-check message (one containing "index out of
    /// bounds", "out of range" or "out of bounds").
    #[error("out-of-bounds access in work-item {item} of work-group {group}: {message}")]
    OutOfBounds {
        /// Work-group of the faulting work-item.
        group: Dim3,
        /// The faulting work-item.
        item: Dim3,
        /// The panic message.
        message: String,
    },
    /// A work-item panicked (with anything other than a bounds-check message).
    #[error("work-item {item} of work-group {group} panicked: {message}")]
    Panic {
        /// Work-group of the panicking work-item.
        group: Dim3,
        /// The panicking work-item.
        item: Dim3,
        /// The panic message (`"non-string panic payload"` when it was neither `&str` nor
        /// `String`).
        message: String,
    },
    /// The work-items of a work-group that are still running wait at barriers of different
    /// call sites, so no barrier can ever be released.
    #[error("barrier divergence in work-group {group}: {detail}")]
    BarrierDivergence {
        /// The stuck work-group.
        group: Dim3,
        /// The call sites (`file:line:column`) and how many work-items wait at each.
        detail: String,
    },
    /// The running lanes of one wave wait at wave operations of different call sites, or
    /// some at a wave operation while others wait at a barrier, so the wave can never
    /// complete its operation.
    #[error("wave divergence in wave {wave} of work-group {group}: {detail}")]
    WaveDivergence {
        /// Work-group of the stuck wave.
        group: Dim3,
        /// The wave's index in the work-group (`flat_thread_idx / wave_size`).
        wave: u32,
        /// The call sites (`file:line:column`) and how many lanes wait at each.
        detail: String,
    },
    /// The executor could not allocate a work-item stack (address space exhausted).
    #[error("could not allocate a {bytes}-byte work-item stack: {message}")]
    StackAllocation {
        /// Requested stack size.
        bytes: usize,
        /// The operating system's error.
        message: String,
    },
}

/// Whether a panic message reports a failed bounds check.
pub(crate) fn is_bounds_message(message: &str) -> bool {
    ["index out of bounds", "out of range", "out of bounds"]
        .iter()
        .any(|needle| message.contains(needle))
}
