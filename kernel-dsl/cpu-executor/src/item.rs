//! Hooks for code running inside a work-item (used by the kernel DSL's host backend).
//!
//! Every function here reads the context of the work-item that the calling OS thread is
//! currently running. Called anywhere else (outside [`CpuExecutor::run`](crate::CpuExecutor::run),
//! or on another thread spawned by a work-item) they panic with
//! `"cpu_executor::item::<name> called outside a kernel launch"`, except [`in_launch`], which
//! says whether such a context exists.
//!
//! [`barrier`] and [`wave_exchange`] suspend the work-item (a coroutine) and hand control
//! back to its work-group's scheduler; they are `#[track_caller]`, because the call site is
//! what identifies "the same" barrier or wave operation for all participants.

use std::cell::Cell;
use std::panic::Location;
use std::ptr;

use corosensei::Yielder;

use crate::{Dim3, MatrixUnit};

/// Every lane's contribution to one [`wave_exchange`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveLanes {
    /// `values[lane]` is the value lane `lane` passed; 0 for lanes that did not take part.
    pub values: [u64; 64],
    /// Bit `lane` is set when lane `lane` took part (it exists and had not returned).
    pub active: u64,
    /// Lanes per wave (32 or 64); only `values[..lanes]` can be active.
    pub lanes: u32,
}

/// What a suspended work-item is given when it is resumed.
pub(crate) enum Resume {
    /// Start, or continue after a barrier.
    Run,
    /// Continue after a completed wave operation, with its result (owned by the scheduler,
    /// valid for the duration of the resume; passed by pointer to spare 528-byte copies).
    Wave(*const WaveLanes),
}

/// Why a work-item suspended itself.
pub(crate) enum Suspend {
    /// It waits at the work-group barrier called at this site.
    Barrier(&'static Location<'static>),
    /// It waits at the wave operation called at `site`, contributing `value`.
    Wave { site: &'static Location<'static>, value: u64 },
}

/// The yielder of a work-item coroutine.
pub(crate) type ItemYielder = Yielder<Resume, Suspend>;

/// What the work-items of the work-group being run on one OS thread share.
pub(crate) struct GroupCtx {
    pub(crate) block_idx: Cell<Dim3>,
    pub(crate) block_dim: Dim3,
    pub(crate) grid_dim: Dim3,
    pub(crate) wave_lanes: u32,
    pub(crate) matrix_unit: MatrixUnit,
    pub(crate) shared_ptr: *mut u8,
    pub(crate) shared_len: usize,
}

/// One work-item slot of a work-group; reused by the same slot of every group of a launch.
pub(crate) struct ItemCtx {
    /// The group context (outlives every coroutine that can see this item context).
    pub(crate) group: *const GroupCtx,
    pub(crate) thread_idx: Dim3,
    pub(crate) flat: u32,
    /// The yielder of the coroutine running in this slot; null when none is running.
    pub(crate) yielder: Cell<*const ItemYielder>,
}

impl ItemCtx {
    /// The slot of flat local id `flat` in a group of shape `group.block_dim`.
    pub(crate) fn new(group: &GroupCtx, flat: u32) -> Self {
        let block = group.block_dim;
        let thread_idx = Dim3::new(flat % block.x, flat / block.x % block.y, flat / (block.x * block.y));
        Self { group, thread_idx, flat, yielder: Cell::new(ptr::null()) }
    }
}

thread_local! {
    /// The work-item this OS thread is running right now (null when none).
    static CURRENT: Cell<*const ItemCtx> = const { Cell::new(ptr::null()) };
}

/// Makes `item` the current work-item until dropped (then restores the previous one,
/// which is non-null only for a launch nested inside a work-item).
pub(crate) struct Entered {
    previous: *const ItemCtx,
}

impl Entered {
    /// Marks `item` current for the duration of a resume of its coroutine.
    pub(crate) fn new(item: &ItemCtx) -> Self {
        Self { previous: CURRENT.with(|current| current.replace(item)) }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|current| current.set(self.previous));
    }
}

#[cold]
#[track_caller]
fn outside(hook: &str) -> ! {
    panic!("cpu_executor::item::{hook} called outside a kernel launch")
}

/// Runs `f` on the current work-item's context; panics when there is none.
#[inline]
#[track_caller]
fn with_current<R>(hook: &str, f: impl FnOnce(&ItemCtx, &GroupCtx) -> R) -> R {
    let item = CURRENT.with(Cell::get);
    if item.is_null() {
        outside(hook)
    }
    // SAFETY: CURRENT is non-null only while this thread's scheduler resumes (or unwinds)
    // the coroutine of this slot (see `Entered`). The scheduler owns the item and group
    // contexts and keeps them alive, at a fixed address, until all its coroutines are done.
    unsafe {
        let item = &*item;
        f(item, &*item.group)
    }
}

/// Suspends the current work-item with `request`; returns what the scheduler resumes it with.
#[track_caller]
fn suspend(hook: &str, request: Suspend) -> Resume {
    let yielder = with_current(hook, |item, _| item.yielder.get());
    debug_assert!(!yielder.is_null(), "work-item context without a running coroutine");
    // SAFETY: the yielder lives in the root frame of the coroutine that CURRENT belongs to,
    // which is the coroutine executing this very code; it stays valid while it runs.
    unsafe { (*yielder).suspend(request) }
}

/// Index of the current work-item inside its work-group (`threadIdx`).
#[track_caller]
pub fn thread_idx() -> Dim3 {
    with_current("thread_idx", |item, _| item.thread_idx)
}

/// Index of the current work-group in the grid (`blockIdx`).
#[track_caller]
pub fn block_idx() -> Dim3 {
    with_current("block_idx", |_, group| group.block_idx.get())
}

/// Shape of a work-group (`blockDim`).
#[track_caller]
pub fn block_dim() -> Dim3 {
    with_current("block_dim", |_, group| group.block_dim)
}

/// Shape of the grid, in work-groups (`gridDim`).
#[track_caller]
pub fn grid_dim() -> Dim3 {
    with_current("grid_dim", |_, group| group.grid_dim)
}

/// Flat local id: `x + y * block_dim.x + z * block_dim.x * block_dim.y`.
#[track_caller]
pub fn flat_thread_idx() -> u32 {
    with_current("flat_thread_idx", |item, _| item.flat)
}

/// Lanes per wave of the running launch (32 or 64).
#[track_caller]
pub fn wave_size() -> u32 {
    with_current("wave_size", |_, group| group.wave_lanes)
}

/// The matrix unit the running launch emulates.
#[track_caller]
pub fn matrix_unit() -> MatrixUnit {
    with_current("matrix_unit", |_, group| group.matrix_unit)
}

/// Lane of the current work-item in its wave: `flat_thread_idx() % wave_size()`.
#[track_caller]
pub fn lane_id() -> u32 {
    with_current("lane_id", |item, group| item.flat % group.wave_lanes)
}

/// Wave of the current work-item in its work-group: `flat_thread_idx() / wave_size()`.
#[track_caller]
pub fn wave_id() -> u32 {
    with_current("wave_id", |item, group| item.flat / group.wave_lanes)
}

/// Whether the calling code runs inside a work-item of a launch on this thread.
pub fn in_launch() -> bool {
    !CURRENT.with(Cell::get).is_null()
}

/// Work-group barrier: waits until every work-item of the group that has not returned yet
/// reaches this same call site, then all continue.
///
/// Work-items that have returned do not take part (as on AMD hardware, where finished waves
/// do not hold up `s_barrier`). If the waiting work-items wait at different call sites, the
/// launch fails with [`ExecError::BarrierDivergence`](crate::ExecError::BarrierDivergence).
#[track_caller]
pub fn barrier() {
    match suspend("barrier", Suspend::Barrier(Location::caller())) {
        Resume::Run => {}
        Resume::Wave(_) => unreachable!("a barrier was resumed with a wave result"),
    }
}

/// Start of the current work-group's shared memory (LDS).
///
/// 16-byte aligned and valid for reads and writes of [`shared_len`] bytes until the
/// work-group ends (dangling but aligned when that is 0). Its bytes are `0xFF` when the
/// work-group starts. The region is shared by the work-items of one group only; accesses
/// of different work-items must be ordered by [`barrier`] (or be atomic) as on a GPU.
#[track_caller]
pub fn shared_ptr() -> *mut u8 {
    with_current("shared_ptr", |_, group| group.shared_ptr)
}

/// Size in bytes of the current work-group's shared memory.
#[track_caller]
pub fn shared_len() -> usize {
    with_current("shared_len", |_, group| group.shared_len)
}

/// Wave-wide exchange: every lane of the wave that has not returned yet passes a value, and
/// each receives all of them once the last one has arrived at this same call site.
///
/// This is the primitive behind shuffles, ballots and wave reductions. Lanes that have
/// returned (or lie beyond the end of a partial last wave) read as 0 with their `active`
/// bit clear. If the waiting lanes of a wave wait at different call sites, or some at a
/// barrier, the launch fails with
/// [`ExecError::WaveDivergence`](crate::ExecError::WaveDivergence).
#[track_caller]
pub fn wave_exchange(value: u64) -> WaveLanes {
    match suspend("wave_exchange", Suspend::Wave { site: Location::caller(), value }) {
        // SAFETY: the scheduler keeps the result alive while it resumes this work-item,
        // which is now; it is copied out before the next suspension.
        Resume::Wave(lanes) => unsafe { *lanes },
        Resume::Run => unreachable!("a wave operation was resumed without a wave result"),
    }
}
