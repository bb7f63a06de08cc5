//! A CPU executor for GPU-style kernel launches.
//!
//! [`CpuExecutor::run`] calls a closure once per work-item of a grid, with the execution
//! model of a GPU (AMD terminology, CUDA in parentheses):
//!
//! - The grid is `grid.x * grid.y * grid.z` **work-groups** (blocks) of
//!   `block.x * block.y * block.z` **work-items** (threads), at most [`MAX_BLOCK_SIZE`].
//!   Inside a work-item, [`item`] answers who it is: [`item::thread_idx`],
//!   [`item::block_idx`], the flat local id `x + y * block.x + z * block.x * block.y`, ...
//! - Each work-item runs as a stackful coroutine ([`corosensei`]) on a pooled stack
//!   (1 MiB by default, see [`CpuExecutor::with_stack_size`]), not as an OS thread. The
//!   work-items of one work-group run interleaved on one OS thread: each runs until it
//!   returns or reaches a [`item::barrier`] or [`item::wave_exchange`], where it is suspended
//!   until the others catch up.
//! - Work-items form **waves** of 32 or 64 lanes ([`WaveSize`]): lane = flat id % wave size,
//!   wave = flat id / wave size. The last wave of a group may be partial. A wave operation
//!   completes when all lanes of the wave that have not returned reach it; waves are
//!   independent of one another and of the barrier.
//! - A barrier is released when all work-items of the group that have not returned reach
//!   it. Work-items that have returned no longer count (as on AMD hardware, where finished
//!   waves do not hold up `s_barrier`), so an early `return` before a barrier is fine.
//! - Each work-group gets `shared_bytes` of **shared memory** (LDS), 16-byte aligned and
//!   filled with `0xFF` when the group starts, so reading it before writing it shows a
//!   garbage (NaN) pattern as uninitialised LDS would on hardware.
//! - Work-groups run in parallel on [`CpuExecutor::threads`] OS threads; the first failing
//!   work-group stops the launch and its error is returned.
//! - Between two synchronisation points the work-items of a group run one after another,
//!   in ascending flat id by default, or descending
//!   ([`CpuExecutor::with_reversed_items`]). Running a kernel both ways exposes a race
//!   between lanes: code that lets two lanes read and write one location between
//!   synchronisation points gets a different result in one of the orders, where a GPU
//!   would lose one of the writes.
//!
//! # Limits
//!
//! - Barriers and wave operations must be reached in uniform control flow (the whole group,
//!   respectively the whole wave, at the same call site, as identified by `#[track_caller]`).
//!   Divergent ones are reported as [`ExecError::BarrierDivergence`] /
//!   [`ExecError::WaveDivergence`] rather than emulated with execution masks.
//! - Work-items are only switched at barriers and wave operations, never preempted: one that
//!   spins waiting for another work-item of its own group without a barrier hangs. For the
//!   same reason a work-item must not hold a lock (a `Mutex` guard, a `RefCell` borrow)
//!   across a barrier or wave operation: the other work-items of its group run on the same
//!   OS thread and would deadlock on it.
//! - A panic in a work-item becomes an error ([`ExecError::Panic`] or
//!   [`ExecError::OutOfBounds`]); the process-wide panic hook is left alone, so it still
//!   prints the panic message. With `panic = "abort"` a panic aborts the process.
//! - A work-item that overflows its stack hits a guard page and crashes the process;
//!   raise [`CpuExecutor::with_stack_size`] for kernels with large locals.

#![warn(missing_docs)]

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

mod error;
pub mod item;
mod scheduler;
mod stack;

pub use error::ExecError;

use item::{GroupCtx, ItemCtx};
use scheduler::{GroupRunner, Lds};
use stack::{StackCache, StackPool};

/// Most work-items a work-group may have.
pub const MAX_BLOCK_SIZE: u32 = 1024;

/// Default stack size of a work-item, in bytes: unoptimized builds of the matrix-unit
/// kernels (flash attention) keep every unrolled fragment in their frames and overflowed
/// 256 KiB. Stacks are mapped lazily, so untouched pages cost no memory.
pub const DEFAULT_STACK_SIZE: usize = 1024 * 1024;

/// A 3-D size or index (grid, block, work-group index, work-item index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dim3 {
    /// Fastest-varying dimension.
    pub x: u32,
    /// Middle dimension.
    pub y: u32,
    /// Slowest-varying dimension.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Self { x, y, z }
    }

    /// `(x, 1, 1)`: a 1-D size.
    pub const fn x(x: u32) -> Self {
        Self::new(x, 1, 1)
    }

    /// `x * y * z` (saturating at `u64::MAX`, which no real launch approaches).
    pub const fn volume(self) -> u64 {
        (self.x as u64).saturating_mul(self.y as u64).saturating_mul(self.z as u64)
    }
}

impl fmt::Display for Dim3 {
    /// Writes `(x,y,z)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({},{},{})", self.x, self.y, self.z)
    }
}

/// Lanes per wave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaveSize {
    /// 32 lanes (RDNA wave32, CUDA warps).
    W32,
    /// 64 lanes (CDNA / GCN).
    W64,
}

impl WaveSize {
    /// The number of lanes: 32 or 64.
    pub const fn lanes(self) -> u32 {
        match self {
            Self::W32 => 32,
            Self::W64 => 64,
        }
    }
}

/// Which GPU matrix unit the executor emulates for `kernel_dsl::mma`: each has its own
/// per-lane layout of matrix fragments, so a kernel that mixes layouts fails here too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatrixUnit {
    /// AMD CDNA `v_mfma_*` (gfx90a, gfx942): waves of 64.
    Mfma,
    /// AMD RDNA3 `v_wmma_*` (gfx11): waves of 32.
    Wmma,
    /// AMD RDNA4 `v_wmma_*` (gfx12): waves of 32, its own lane layout (8 items per lane).
    Wmma12,
    /// NVIDIA `mma.sync` (sm_80+): waves (warps) of 32.
    MmaSync,
    /// No matrix unit (gfx1030): shuffles and FMAs in the `mma.sync` layout, waves of 32.
    Valu,
}

impl MatrixUnit {
    /// The unit a wave size implies by default: 64 -> MFMA, 32 -> WMMA.
    pub const fn default_for(wave: WaveSize) -> Self {
        match wave {
            WaveSize::W64 => Self::Mfma,
            WaveSize::W32 => Self::Wmma,
        }
    }

    /// Lanes per wave this unit works with.
    pub const fn wave_lanes(self) -> u32 {
        match self {
            Self::Mfma => 64,
            Self::Wmma | Self::Wmma12 | Self::MmaSync | Self::Valu => 32,
        }
    }
}

/// Shape of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Work-groups per grid dimension.
    pub grid: Dim3,
    /// Work-items per work-group dimension.
    pub block: Dim3,
}

/// What a successful launch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Work-groups run.
    pub work_groups: u64,
    /// Work-items run.
    pub work_items: u64,
    /// Barrier releases, summed over work-groups.
    pub barriers: u64,
    /// Completed wave operations (one per wave per [`item::wave_exchange`] call site reached).
    pub wave_ops: u64,
}

impl RunStats {
    fn add(&mut self, other: RunStats) {
        self.work_groups += other.work_groups;
        self.work_items += other.work_items;
        self.barriers += other.barriers;
        self.wave_ops += other.wave_ops;
    }
}

/// Runs kernel launches on the CPU; see the [crate documentation](crate) for the model.
///
/// Cheap to clone; clones share their cache of coroutine stacks.
#[derive(Clone, Debug)]
pub struct CpuExecutor {
    wave: WaveSize,
    matrix: MatrixUnit,
    threads: usize,
    reversed: bool,
    stacks: Arc<StackCache>,
}

impl CpuExecutor {
    /// An executor with waves of `wave` lanes, one OS thread per available core, and
    /// [`DEFAULT_STACK_SIZE`] work-item stacks.
    pub fn new(wave: WaveSize) -> Self {
        let threads = thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let matrix = MatrixUnit::default_for(wave);
        Self { wave, matrix, threads, reversed: false, stacks: Arc::new(StackCache::new(DEFAULT_STACK_SIZE)) }
    }

    /// Runs the work-items of a group in descending flat id between synchronisation
    /// points (`true`) instead of ascending (see the [crate documentation](crate)).
    pub fn with_reversed_items(mut self, reversed: bool) -> Self {
        self.reversed = reversed;
        self
    }

    /// Whether work-items run in descending flat id.
    pub fn reversed_items(&self) -> bool {
        self.reversed
    }

    /// Emulates `unit`'s fragment layouts in `kernel_dsl::mma` (default:
    /// [`MatrixUnit::default_for`] the wave size). A unit whose wave size differs from the
    /// executor's makes every `mma` call fail.
    pub fn with_matrix_unit(mut self, unit: MatrixUnit) -> Self {
        self.matrix = unit;
        self
    }

    /// The matrix unit emulated.
    pub fn matrix_unit(&self) -> MatrixUnit {
        self.matrix
    }

    /// Runs work-groups on `threads` OS threads (0 is taken as 1).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Gives every work-item a stack of `bytes` bytes (plus a guard page).
    pub fn with_stack_size(mut self, bytes: usize) -> Self {
        if bytes != self.stacks.size() {
            self.stacks = Arc::new(StackCache::new(bytes));
        }
        self
    }

    /// Lanes per wave.
    pub fn wave_size(&self) -> WaveSize {
        self.wave
    }

    /// OS threads a launch uses (at most; never more than it has work-groups).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work_item` once per work-item of the grid.
    ///
    /// Inside, [`item`] tells the work-item who it is and gives it barriers, wave operations
    /// and the work-group's `shared_bytes` of shared memory. Returns what was run, or the
    /// first error seen (with several failing work-groups, any one of their errors); a
    /// failing launch stops starting new work-groups. A grid with a 0 dimension runs nothing.
    pub fn run(
        &self,
        geometry: Geometry,
        shared_bytes: usize,
        work_item: &(dyn Fn() + Sync),
    ) -> Result<RunStats, ExecError> {
        validate(geometry)?;
        let groups = geometry.grid.volume();
        if groups == 0 {
            return Ok(RunStats::default());
        }
        let workers = u64::try_from(self.threads).unwrap_or(u64::MAX).min(groups) as usize;
        let next_group = AtomicU64::new(0);
        let failed = AtomicBool::new(false);
        let worker = || {
            let result = self.worker(geometry, shared_bytes, work_item, &next_group, &failed);
            if result.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            result
        };
        if workers == 1 {
            return worker();
        }
        thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(worker)).collect();
            // The calling thread works too.
            let mut results = vec![worker()];
            for helper in helpers {
                results.push(helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            }
            let mut total = RunStats::default();
            for result in results {
                total.add(result?);
            }
            Ok(total)
        })
    }

    /// One OS thread's share of a launch: takes work-groups until none (or an error) is left.
    fn worker(
        &self,
        geometry: Geometry,
        shared_bytes: usize,
        work_item: &(dyn Fn() + Sync),
        next_group: &AtomicU64,
        failed: &AtomicBool,
    ) -> Result<RunStats, ExecError> {
        let groups = geometry.grid.volume();
        let items = geometry.block.volume() as u32;
        // Declared before the runner, so they outlive its coroutines.
        let lds = Lds::new(shared_bytes);
        let group = GroupCtx {
            block_idx: std::cell::Cell::new(Dim3::default()),
            block_dim: geometry.block,
            grid_dim: geometry.grid,
            wave_lanes: self.wave.lanes(),
            matrix_unit: self.matrix,
            shared_ptr: lds.ptr(),
            shared_len: shared_bytes,
        };
        let ctxs: Vec<ItemCtx> = (0..items).map(|flat| ItemCtx::new(&group, flat)).collect();
        let mut runner =
            GroupRunner::new(work_item, geometry.grid, &group, &lds, &ctxs, StackPool::new(&self.stacks), self.reversed);
        let mut stats = RunStats::default();
        while !failed.load(Ordering::Relaxed) {
            let linear = next_group.fetch_add(1, Ordering::Relaxed);
            if linear >= groups {
                break;
            }
            stats.add(runner.run_group(linear)?);
        }
        Ok(stats)
    }
}

/// Checks what [`ExecError::InvalidGeometry`] documents.
fn validate(geometry: Geometry) -> Result<(), ExecError> {
    let Geometry { grid, block } = geometry;
    let invalid = |reason: String| Err(ExecError::InvalidGeometry { reason });
    if block.x == 0 || block.y == 0 || block.z == 0 {
        return invalid(format!("block {block} has a zero dimension"));
    }
    if block.volume() > u64::from(MAX_BLOCK_SIZE) {
        return invalid(format!(
            "block {block} has {} work-items, more than the maximum of {MAX_BLOCK_SIZE}",
            block.volume()
        ));
    }
    if grid.volume() == u64::MAX {
        return invalid(format!("grid {grid} has too many work-groups"));
    }
    Ok(())
}
