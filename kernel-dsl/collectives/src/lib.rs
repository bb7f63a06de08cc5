//! Collectives between devices of `kernel-runtime`: all-reduce, all-gather, broadcast and
//! reduce-scatter on [`DeviceVec`](kernel_runtime::DeviceVec) views, for tensor-parallel
//! models split across GPUs.
//!
//! We do not write our own collectives. On GPUs the work goes to the libraries everyone
//! deploys, loaded at run time so this crate builds and type-checks with neither installed:
//! NCCL on NVIDIA (`cuda` feature, `libnccl.so.2`) and RCCL on AMD (`rocm` feature,
//! `librccl.so`, NCCL's API). Set `NCCL_LIBRARY` / `RCCL_LIBRARY` to a file to load that
//! one instead of the default names ([`Library::load`]). Operations are queued on the
//! device's stream, after the kernels queued before them, so a step with collectives can be
//! recorded with `Device::capture` and replayed as one graph.
//!
//! On CPU-executor devices a [`HostCommunicator`] stands in (ranks as threads, or several
//! devices driven by one thread inside a [`group`]), so code written against
//! [`Collective`] runs in CI without a GPU.
//!
//! ```
//! use kernel_collectives::{Collective, Communicator, ReduceOp};
//! use kernel_runtime::{Device, WaveSize};
//!
//! // Two CPU-executor "GPUs" driven from one thread: the collectives of all ranks go in one group.
//! let devs = [Device::cpu(WaveSize::W32), Device::cpu(WaveSize::W32)];
//! let comms = Communicator::init_all(&devs).unwrap();
//! let mut bufs = [devs[0].upload(&[1.0f32, 2.0]).unwrap(), devs[1].upload(&[10.0f32, 20.0]).unwrap()];
//! kernel_collectives::group(|g| {
//!     for (c, b) in comms.iter().zip(bufs.iter_mut()) {
//!         g.all_reduce_in_place(c, b.view_mut(..)?, ReduceOp::Sum)?;
//!     }
//!     Ok(())
//! })
//! .unwrap();
//! assert_eq!(devs[1].download(&bufs[1]).unwrap(), vec![11.0, 22.0]);
//! ```
mod host;
mod library;
mod nccl;

pub use host::{HostCommunicator, HostGroup};
pub use library::{Backend, Library, UniqueId, UNIQUE_ID_BYTES};
pub use nccl::NcclCommunicator;

use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, LaunchError, MemLocation};
use kernel_runtime::{Device, DeviceView, DeviceViewMut};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

/// What went wrong in a collective; nothing was queued when one is returned (except where
/// a library call itself failed after queueing, which its message says).
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// NCCL/RCCL could not be loaded.
    #[error("{backend} could not be loaded (tried {tried:?}; set {env_var} to the library file): {reason}")]
    LibraryNotFound {
        /// Which library.
        backend: Backend,
        /// The files or names tried.
        tried: Vec<String>,
        /// The loader's messages.
        reason: String,
        /// The environment variable that names the file.
        env_var: &'static str,
    },
    /// The file loaded but lacks an entry point (not NCCL/RCCL, or too old).
    #[error("{path} is not a usable {backend}: symbol `{symbol}` missing ({reason})")]
    MissingSymbol {
        /// Which library.
        backend: Backend,
        /// The file.
        path: String,
        /// The missing entry point.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// A library call failed: its error string (`ncclGetErrorString`) and last error
    /// message (`ncclGetLastError`).
    #[error("{call} failed ({backend} error {code}: {message}){}", detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Library {
        /// Which library.
        backend: Backend,
        /// The entry point.
        call: &'static str,
        /// `ncclResult_t`.
        code: i32,
        /// `ncclGetErrorString(code)`.
        message: String,
        /// `ncclGetLastError`, when the library has it and it says something.
        detail: Option<String>,
    },
    /// The device or build cannot do this (a GPU communicator on the CPU executor, a host
    /// communicator on a GPU, a build without the GPU's feature).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A buffer of another device than the communicator's.
    #[error("`{op}`: buffer lives in {found:?}, the communicator's device {device} uses {expected:?}")]
    WrongDevice {
        /// The collective.
        op: &'static str,
        /// Where the buffer is.
        found: MemLocation,
        /// Where it must be.
        expected: MemLocation,
        /// The communicator's device.
        device: String,
    },
    /// Buffer lengths that do not fit the collective.
    #[error("`{op}`: {reason}")]
    Length {
        /// The collective.
        op: &'static str,
        /// Which lengths.
        reason: String,
    },
    /// A bad rank, root, count or id.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The ranks of a host communicator called different collectives at the same step.
    #[error("ranks disagree at collective #{seq}: {reason}")]
    Mismatch {
        /// The collective's sequence number.
        seq: u64,
        /// What differs.
        reason: String,
    },
    /// A host communicator gave up waiting for the other ranks; it is unusable afterwards.
    #[error("host communicator broken: {0}")]
    Broken(String),
    /// The device runtime refused (a capture on another thread, ...).
    #[error(transparent)]
    Runtime(#[from] LaunchError),
}

/// Lets collectives be called from code returning [`LaunchError`] (a `StepGraph` step).
impl From<CollectiveError> for LaunchError {
    fn from(e: CollectiveError) -> LaunchError {
        match e {
            CollectiveError::Runtime(e) => e,
            e => LaunchError::InvalidArgument { kernel: "collective", reason: e.to_string() },
        }
    }
}

/// The reduction of an all-reduce or reduce-scatter (`ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Maximum.
    Max = 2,
    /// Minimum.
    Min = 3,
}

/// Element types of collectives (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// `i8`.
    I8 = 0,
    /// `u8`.
    U8 = 1,
    /// `i32`.
    I32 = 2,
    /// `u32`.
    U32 = 3,
    /// `i64`.
    I64 = 4,
    /// `u64`.
    U64 = 5,
    /// `half::f16`.
    F16 = 6,
    /// `f32`.
    F32 = 7,
    /// `f64`.
    F64 = 8,
    /// `half::bf16` (NCCL >= 2.10).
    Bf16 = 9,
}

mod sealed {
    pub trait Sealed {}
}

/// An element type collectives move and reduce: its library type and the host reduction
/// the [`HostCommunicator`] uses (rounded to the type after each step, as NCCL does).
pub trait CollectiveType: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The library's type.
    const DTYPE: DataType;
    /// `op` of two values.
    fn reduce(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! int_type {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl CollectiveType for $t {
            const DTYPE: DataType = DataType::$d;
            fn reduce(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
        }
    )*};
}
int_type!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

macro_rules! float_type {
    ($($t:ty => $d:ident, $to:expr, $from:expr);*) => {$(
        impl sealed::Sealed for $t {}
        impl CollectiveType for $t {
            const DTYPE: DataType = DataType::$d;
            fn reduce(a: Self, b: Self, op: ReduceOp) -> Self {
                let (x, y) = ($to(a), $to(b));
                $from(match op {
                    ReduceOp::Sum => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Max => x.max(y),
                    ReduceOp::Min => x.min(y),
                })
            }
        }
    )*};
}
float_type!(
    f32 => F32, |v: f32| v, |v: f32| v;
    f64 => F64, |v: f64| v, |v: f64| v;
    half::f16 => F16, half::f16::to_f32, half::f16::from_f32;
    half::bf16 => Bf16, half::bf16::to_f32, half::bf16::from_f32
);

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    AllGather,
    Broadcast { root: usize },
    ReduceScatter(ReduceOp),
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::Broadcast { .. } => "broadcast",
            Kind::ReduceScatter(_) => "reduce_scatter",
        }
    }
}

/// A buffer range as the libraries see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) location: MemLocation,
}

fn span(arg: ArgValue) -> Span {
    match arg {
        ArgValue::Slice { addr, len, location } => Span { addr, len, location },
        // Views always give slices.
        _ => unreachable!("a view's kernel argument is a slice"),
    }
}

/// One collective, type-erased: what each backend queues.
#[derive(Clone, Copy)]
pub(crate) struct RawOp {
    pub(crate) kind: Kind,
    pub(crate) dtype: DataType,
    pub(crate) elem: usize,
    pub(crate) send: Span,
    pub(crate) recv: Span,
    /// `acc = op(acc, x)` elementwise on bytes of the element type.
    pub(crate) reduce: fn(&mut [u8], &[u8], ReduceOp),
}

fn reduce_bytes<T: CollectiveType>(acc: &mut [u8], x: &[u8], op: ReduceOp) {
    let n = std::mem::size_of::<T>();
    for (a, b) in acc.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        // SAFETY: each chunk holds the bytes of one `T` (any bit pattern is valid for these types).
        let (va, vb) = unsafe { (std::ptr::read_unaligned(a.as_ptr().cast::<T>()), std::ptr::read_unaligned(b.as_ptr().cast::<T>())) };
        // SAFETY: `a` has room for one `T`.
        unsafe { std::ptr::write_unaligned(a.as_mut_ptr().cast::<T>(), T::reduce(va, vb, op)) };
    }
}

impl RawOp {
    fn new<T: CollectiveType>(kind: Kind, send: Span, recv: Span) -> RawOp {
        RawOp { kind, dtype: T::DTYPE, elem: std::mem::size_of::<T>(), send, recv, reduce: reduce_bytes::<T> }
    }

    /// Checks the buffers against the device and the lengths against the collective.
    pub(crate) fn validate(&self, dev: &Device, nranks: usize) -> Result<(), CollectiveError> {
        let op = self.kind.name();
        for s in [self.send, self.recv] {
            if s.location != dev.memory() {
                return Err(CollectiveError::WrongDevice { op, found: s.location, expected: dev.memory(), device: dev.name() });
            }
        }
        let (s, r) = (self.send.len, self.recv.len);
        let ok = match self.kind {
            Kind::AllReduce(_) | Kind::Broadcast { .. } => s == r,
            Kind::AllGather => s.checked_mul(nranks) == Some(r),
            Kind::ReduceScatter(_) => r.checked_mul(nranks) == Some(s),
        };
        if !ok {
            let want = match self.kind {
                Kind::AllReduce(_) | Kind::Broadcast { .. } => "equal lengths",
                Kind::AllGather => "receive length = send length x ranks",
                Kind::ReduceScatter(_) => "send length = receive length x ranks",
            };
            return Err(CollectiveError::Length { op, reason: format!("send has {s} elements, receive {r}, {nranks} ranks: needs {want}") });
        }
        if let Kind::Broadcast { root } = self.kind {
            if root >= nranks {
                return Err(CollectiveError::InvalidArgument(format!("broadcast root {root} of {nranks} ranks")));
            }
        }
        Ok(())
    }
}

/// Collectives of one rank on its device. Every rank of the communicator calls the same
/// collectives in the same order with the same lengths; each call queues the operation on
/// the device's queue (after the work queued before it) and returns. Buffers are views of
/// this rank's device.
pub trait Collective {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Ranks in the communicator.
    fn world_size(&self) -> usize;
    /// The device the rank's buffers live on.
    fn device(&self) -> &Device;
    #[doc(hidden)]
    /// Checks and queues a type-erased collective (what the methods below build);
    /// `in_group_scope` when it comes through a [`GroupScope`], whose borrows outlive the group.
    fn queue_raw(&self, op: RawOpHandle, in_group_scope: bool) -> Result<(), CollectiveError>;

    /// `recv = op(send of every rank)`, elementwise.
    fn all_reduce<T: CollectiveType>(&self, send: DeviceView<'_, T>, recv: DeviceViewMut<'_, T>, op: ReduceOp) -> Result<(), CollectiveError>
    where
        Self: Sized,
    {
        self.queue_raw(RawOpHandle(RawOp::new::<T>(Kind::AllReduce(op), span(send.kernel_arg()), span(recv.kernel_arg()))), false)
    }

    /// `buf = op(buf of every rank)`, elementwise, in place.
    fn all_reduce_in_place<T: CollectiveType>(&self, buf: DeviceViewMut<'_, T>, op: ReduceOp) -> Result<(), CollectiveError>
    where
        Self: Sized,
    {
        let s = span(buf.kernel_arg());
        self.queue_raw(RawOpHandle(RawOp::new::<T>(Kind::AllReduce(op), s, s)), false)
    }

    /// `recv = send of rank 0, then rank 1, ...` (`recv` holds `world_size()` times `send`).
    fn all_gather<T: CollectiveType>(&self, send: DeviceView<'_, T>, recv: DeviceViewMut<'_, T>) -> Result<(), CollectiveError>
    where
        Self: Sized,
    {
        self.queue_raw(RawOpHandle(RawOp::new::<T>(Kind::AllGather, span(send.kernel_arg()), span(recv.kernel_arg()))), false)
    }

    /// `buf = buf of rank root` on every rank, in place.
    fn broadcast<T: CollectiveType>(&self, buf: DeviceViewMut<'_, T>, root: usize) -> Result<(), CollectiveError>
    where
        Self: Sized,
    {
        let s = span(buf.kernel_arg());
        self.queue_raw(RawOpHandle(RawOp::new::<T>(Kind::Broadcast { root }, s, s)), false)
    }

    /// `recv = block rank() of op(send of every rank)` (`send` holds `world_size()` blocks
    /// of `recv`'s length).
    fn reduce_scatter<T: CollectiveType>(&self, send: DeviceView<'_, T>, recv: DeviceViewMut<'_, T>, op: ReduceOp) -> Result<(), CollectiveError>
    where
        Self: Sized,
    {
        self.queue_raw(RawOpHandle(RawOp::new::<T>(Kind::ReduceScatter(op), span(send.kernel_arg()), span(recv.kernel_arg()))), false)
    }
}

/// A type-erased collective (an implementation detail of [`Collective`]).
#[doc(hidden)]
#[derive(Clone, Copy)]
pub struct RawOpHandle(pub(crate) RawOp);

/// One rank's communicator on any device: NCCL/RCCL on a GPU, the host stand-in on the CPU
/// executor. What an engine keeps per rank.
pub enum Communicator {
    /// NCCL (NVIDIA) or RCCL (AMD).
    Nccl(NcclCommunicator),
    /// The host stand-in for CPU-executor devices.
    Host(HostCommunicator),
}

impl Communicator {
    /// Rank `rank` of `nranks` on GPU `dev`, joining the communicator named by `id` (one
    /// process or thread per rank; blocks until every rank has joined). An error on the CPU
    /// executor (use [`Communicator::init_all`] or a [`HostGroup`] there).
    pub fn init_rank(dev: &Device, nranks: usize, rank: usize, id: &UniqueId) -> Result<Communicator, CollectiveError> {
        NcclCommunicator::init_rank(dev, nranks, rank, id).map(Communicator::Nccl)
    }

    /// One communicator per device, rank `i` on `devs[i]`, for one process driving all of
    /// them: `ncclCommInitAll` for GPUs (distinct GPUs of one backend), a [`HostGroup`] for
    /// CPU-executor devices. Drive the ranks from one thread through [`group`], or move each
    /// communicator to its own thread.
    pub fn init_all(devs: &[Device]) -> Result<Vec<Communicator>, CollectiveError> {
        if devs.is_empty() {
            return Err(CollectiveError::InvalidArgument("init_all of no devices".into()));
        }
        if devs.iter().all(|d| !d.is_gpu()) {
            let g = HostGroup::new(devs.len())?;
            return devs.iter().enumerate().map(|(r, d)| g.communicator(r, d.clone()).map(Communicator::Host)).collect();
        }
        Ok(NcclCommunicator::init_all(devs)?.into_iter().map(Communicator::Nccl).collect())
    }
}

impl Collective for Communicator {
    fn rank(&self) -> usize {
        match self {
            Communicator::Nccl(c) => c.rank(),
            Communicator::Host(c) => c.rank(),
        }
    }
    fn world_size(&self) -> usize {
        match self {
            Communicator::Nccl(c) => c.world_size(),
            Communicator::Host(c) => c.world_size(),
        }
    }
    fn device(&self) -> &Device {
        match self {
            Communicator::Nccl(c) => c.device(),
            Communicator::Host(c) => c.device(),
        }
    }
    fn queue_raw(&self, op: RawOpHandle, in_group_scope: bool) -> Result<(), CollectiveError> {
        match self {
            Communicator::Nccl(c) => c.queue_raw(op, in_group_scope),
            Communicator::Host(c) => c.queue_raw(op, in_group_scope),
        }
    }
}

thread_local! {
    /// Depth of [`group`] calls on this thread.
    static GROUP: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many [`group`] calls this thread is inside.
pub(crate) fn group_depth() -> usize {
    GROUP.with(|g| g.get())
}

/// Leaves a [`group`] level on drop (also when its closure panics).
struct Level;

impl Level {
    fn enter() -> Level {
        GROUP.with(|g| g.set(g.get() + 1));
        Level
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        GROUP.with(|g| g.set(g.get() - 1));
    }
}

/// Runs `f` as one group of collectives (`ncclGroupStart` ... `ncclGroupEnd`): the way one
/// thread drives several ranks (each rank's call alone would wait for the others), and the
/// way to fuse several collectives into one launch. Queue the collectives through the
/// [`GroupScope`] (its borrows last until the group ends, when the host stand-in runs
/// them); they are issued when `f` returns, even when it fails. Groups nest (NCCL/RCCL
/// collectives only: the host stand-in refuses collectives in a nested group).
pub fn group<'b, R>(f: impl FnOnce(&GroupScope<'b>) -> Result<R, CollectiveError>) -> Result<R, CollectiveError> {
    let libs: Vec<Arc<Library>> = [Backend::Nccl, Backend::Rccl].into_iter().filter_map(Library::loaded).collect();
    let mut started = Vec::new();
    let mut err = None;
    for lib in libs {
        // SAFETY: no arguments; pairs with the `ncclGroupEnd` below.
        let r = unsafe { (lib.fns.group_start)() };
        match lib.check("ncclGroupStart", r, None) {
            Ok(()) => started.push(lib),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let level = Level::enter();
    let scope = GroupScope { pending: RefCell::new(Vec::new()), _b: PhantomData };
    let out = match err {
        Some(e) => Err(e),
        None => f(&scope),
    };
    drop(level);
    let mut end_err = None;
    for lib in started.iter().rev() {
        // SAFETY: ends the group started above.
        let r = unsafe { (lib.fns.group_end)() };
        if let Err(e) = lib.check("ncclGroupEnd", r, None) {
            end_err.get_or_insert(e);
        }
    }
    // Host collectives of this scope (only the outermost group takes them): run them now.
    if let Err(e) = host::complete_all(scope.pending.into_inner()) {
        end_err.get_or_insert(e);
    }
    let out = out?;
    match end_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The collectives of a [`group`]: their buffers stay borrowed until the group ends.
pub struct GroupScope<'b> {
    pending: RefCell<Vec<host::Pending>>,
    // Invariant in 'b, like `std::thread::Scope`.
    _b: PhantomData<&'b mut &'b ()>,
}

impl<'b> GroupScope<'b> {
    fn queue<C: Collective>(&self, comm: &C, op: RawOp) -> Result<(), CollectiveError> {
        host::with_scope(&self.pending, || comm.queue_raw(RawOpHandle(op), true))
    }

    /// [`Collective::all_reduce`] in the group.
    pub fn all_reduce<C: Collective, T: CollectiveType>(&self, comm: &C, send: DeviceView<'b, T>, recv: DeviceViewMut<'b, T>, op: ReduceOp) -> Result<(), CollectiveError> {
        self.queue(comm, RawOp::new::<T>(Kind::AllReduce(op), span(send.kernel_arg()), span(recv.kernel_arg())))
    }

    /// [`Collective::all_reduce_in_place`] in the group.
    pub fn all_reduce_in_place<C: Collective, T: CollectiveType>(&self, comm: &C, buf: DeviceViewMut<'b, T>, op: ReduceOp) -> Result<(), CollectiveError> {
        let s = span(buf.kernel_arg());
        self.queue(comm, RawOp::new::<T>(Kind::AllReduce(op), s, s))
    }

    /// [`Collective::all_gather`] in the group.
    pub fn all_gather<C: Collective, T: CollectiveType>(&self, comm: &C, send: DeviceView<'b, T>, recv: DeviceViewMut<'b, T>) -> Result<(), CollectiveError> {
        self.queue(comm, RawOp::new::<T>(Kind::AllGather, span(send.kernel_arg()), span(recv.kernel_arg())))
    }

    /// [`Collective::broadcast`] in the group.
    pub fn broadcast<C: Collective, T: CollectiveType>(&self, comm: &C, buf: DeviceViewMut<'b, T>, root: usize) -> Result<(), CollectiveError> {
        let s = span(buf.kernel_arg());
        self.queue(comm, RawOp::new::<T>(Kind::Broadcast { root }, s, s))
    }

    /// [`Collective::reduce_scatter`] in the group.
    pub fn reduce_scatter<C: Collective, T: CollectiveType>(&self, comm: &C, send: DeviceView<'b, T>, recv: DeviceViewMut<'b, T>, op: ReduceOp) -> Result<(), CollectiveError> {
        self.queue(comm, RawOp::new::<T>(Kind::ReduceScatter(op), span(send.kernel_arg()), span(recv.kernel_arg())))
    }
}
