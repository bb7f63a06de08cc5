//! The host stand-in for CPU-executor devices: the ranks meet in process memory.
//!
//! Each collective of a rank has a sequence number (its n-th call). A call *deposits* a copy
//! of the rank's input under that number, then *completes*: waits until every rank has
//! deposited, checks that they all called the same collective, and writes the rank's result
//! (reduced in rank order, rounded to the type after each step). Ranks in separate threads
//! complete at once; one thread driving several ranks deposits all of them inside a
//! [`group`](crate::group) and completes them when the group ends.
use crate::{Collective, CollectiveError, DataType, Kind, RawOp, RawOpHandle};
use kernel_runtime::Device;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What every rank must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Desc {
    kind: Kind,
    dtype: DataType,
    send: usize,
    recv: usize,
}

/// A rank's deposit: what it called and its input bytes.
type Deposit = Option<(Desc, Arc<Vec<u8>>)>;

struct Round {
    ops: Vec<Deposit>,
    deposited: usize,
    finished: usize,
    /// The reduced or gathered bytes, computed by the first rank to complete.
    result: Option<Result<Arc<Vec<u8>>, String>>,
}

struct State {
    rounds: HashMap<u64, Round>,
    broken: Option<String>,
}

struct Shared {
    nranks: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The ranks of one host communicator: make one [`HostCommunicator`] per rank with
/// [`HostGroup::communicator`] (or all of them with `Communicator::init_all` on
/// CPU-executor devices).
#[derive(Clone)]
pub struct HostGroup {
    shared: Arc<Shared>,
}

impl HostGroup {
    /// A group of `nranks` ranks that wait up to 60 s for each other.
    pub fn new(nranks: usize) -> Result<HostGroup, CollectiveError> {
        Self::with_timeout(nranks, Duration::from_secs(60))
    }

    /// A group whose ranks give up waiting for the others after `timeout` (then every rank
    /// gets [`CollectiveError::Broken`]): a rank that never calls, or one thread driving
    /// several ranks outside a [`group`](crate::group), fails instead of hanging.
    pub fn with_timeout(nranks: usize, timeout: Duration) -> Result<HostGroup, CollectiveError> {
        if nranks == 0 {
            return Err(CollectiveError::InvalidArgument("a host group of 0 ranks".into()));
        }
        Ok(HostGroup {
            shared: Arc::new(Shared { nranks, timeout, state: Mutex::new(State { rounds: HashMap::new(), broken: None }), cv: Condvar::new() }),
        })
    }

    /// Rank `rank`'s communicator on the CPU-executor device `dev`. Make each rank once.
    pub fn communicator(&self, rank: usize, dev: Device) -> Result<HostCommunicator, CollectiveError> {
        if rank >= self.shared.nranks {
            return Err(CollectiveError::InvalidArgument(format!("rank {rank} of {} ranks", self.shared.nranks)));
        }
        if dev.is_gpu() {
            return Err(CollectiveError::Unsupported(format!(
                "{} is a GPU: the host communicator serves CPU-executor devices (use Communicator::init_rank/init_all for GPUs)",
                kernel_dsl::host::Executor::name(&dev)
            )));
        }
        Ok(HostCommunicator { shared: self.shared.clone(), rank, dev, seq: AtomicU64::new(0) })
    }
}

/// One rank of a [`HostGroup`] on a CPU-executor device: collectives run on the host when
/// every rank has called them (the CPU executor has no queue to defer them to).
pub struct HostCommunicator {
    shared: Arc<Shared>,
    rank: usize,
    dev: Device,
    seq: AtomicU64,
}

/// A deposited collective waiting for its group to end.
pub(crate) struct Pending {
    shared: Arc<Shared>,
    rank: usize,
    seq: u64,
    op: RawOp,
}

thread_local! {
    /// Pending collectives of the group scope queueing now.
    static SINK: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` (one queue through a group scope) and moves what it deposited into `pending`.
pub(crate) fn with_scope(pending: &RefCell<Vec<Pending>>, f: impl FnOnce() -> Result<(), CollectiveError>) -> Result<(), CollectiveError> {
    let out = f();
    pending.borrow_mut().extend(SINK.with(|s| std::mem::take(&mut *s.borrow_mut())));
    out
}

/// Completes the collectives of a group (all deposited by now); the first error.
pub(crate) fn complete_all(pending: Vec<Pending>) -> Result<(), CollectiveError> {
    let mut first = None;
    for p in pending {
        if let Err(e) = complete(&p.shared, p.rank, p.seq, &p.op) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// The bytes of a host range.
///
/// # Safety
/// `addr..addr + bytes` is live host memory.
unsafe fn host_bytes(addr: u64, bytes: usize) -> Vec<u8> {
    if bytes == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as usize as *const u8, bytes) }.to_vec()
}

fn deposit(shared: &Shared, rank: usize, seq: u64, op: &RawOp) -> Result<(), CollectiveError> {
    let desc = Desc { kind: op.kind, dtype: op.dtype, send: op.send.len, recv: op.recv.len };
    // Only the root's bytes of a broadcast are read.
    let bytes = match op.kind {
        Kind::Broadcast { root } if root != rank => Vec::new(),
        // SAFETY: `send` is a view of host memory (validated against the CPU device), live
        // for the call or, in a group scope, until the group ends.
        _ => unsafe { host_bytes(op.send.addr, op.send.len * op.elem) },
    };
    let mut st = shared.lock();
    if let Some(b) = &st.broken {
        return Err(CollectiveError::Broken(b.clone()));
    }
    let n = shared.nranks;
    let round = st.rounds.entry(seq).or_insert_with(|| Round { ops: vec![None; n], deposited: 0, finished: 0, result: None });
    round.ops[rank] = Some((desc, Arc::new(bytes)));
    round.deposited += 1;
    shared.cv.notify_all();
    Ok(())
}

/// The result every rank's output is cut from, or why the ranks disagree.
fn combine(ops: &[Deposit], op: &RawOp) -> Result<Arc<Vec<u8>>, String> {
    let all: Vec<&(Desc, Arc<Vec<u8>>)> = ops.iter().map(|o| o.as_ref().expect("all deposited")).collect();
    let d0 = all[0].0;
    for (r, (d, _)) in all.iter().enumerate() {
        if *d != d0 {
            return Err(format!("rank 0 called {d0:?}, rank {r} {d:?}"));
        }
    }
    Ok(Arc::new(match op.kind {
        Kind::AllReduce(r) | Kind::ReduceScatter(r) => {
            let mut acc = all[0].1.as_ref().clone();
            for (_, b) in &all[1..] {
                (op.reduce)(&mut acc, b, r);
            }
            acc
        }
        Kind::AllGather => all.iter().flat_map(|(_, b)| b.iter().copied()).collect(),
        Kind::Broadcast { root } => all[root].1.as_ref().clone(),
    }))
}

fn complete(shared: &Shared, rank: usize, seq: u64, op: &RawOp) -> Result<(), CollectiveError> {
    let n = shared.nranks;
    let deadline = Instant::now() + shared.timeout;
    let mut st = shared.lock();
    loop {
        if let Some(b) = &st.broken {
            return Err(CollectiveError::Broken(b.clone()));
        }
        if st.rounds.get(&seq).is_some_and(|r| r.deposited == n) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = st.rounds.get(&seq).map(|r| (0..n).filter(|&i| r.ops[i].is_none()).collect()).unwrap_or_default();
            let why = format!(
                "rank {rank} waited {:?} at collective #{seq} for ranks {missing:?} (several ranks driven by one thread must queue inside kernel_collectives::group)",
                shared.timeout
            );
            st.broken = Some(why.clone());
            shared.cv.notify_all();
            return Err(CollectiveError::Broken(why));
        }
        st = shared.cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
    }
    let round = st.rounds.get_mut(&seq).expect("checked above");
    let result = match &round.result {
        Some(r) => r.clone(),
        None => {
            let r = combine(&round.ops, op);
            round.result = Some(r.clone());
            r
        }
    };
    round.finished += 1;
    if round.finished == n {
        st.rounds.remove(&seq);
    }
    drop(st);
    let result = result.map_err(|reason| CollectiveError::Mismatch { seq, reason })?;
    let bytes = op.recv.len * op.elem;
    let from = match op.kind {
        Kind::ReduceScatter(_) => rank * bytes,
        _ => 0,
    };
    if bytes > 0 {
        // SAFETY: `recv` is a writable view of `bytes` bytes of host memory, live for the call
        // or, in a group scope, until the group ends; `result` holds at least `from + bytes`
        // bytes (the descriptors of all ranks match this rank's validated lengths).
        unsafe { std::ptr::copy_nonoverlapping(result[from..from + bytes].as_ptr(), op.recv.addr as usize as *mut u8, bytes) };
    }
    Ok(())
}

impl Collective for HostCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.nranks
    }
    fn device(&self) -> &Device {
        &self.dev
    }
    fn queue_raw(&self, op: RawOpHandle, in_group_scope: bool) -> Result<(), CollectiveError> {
        let op = op.0;
        op.validate(&self.dev, self.shared.nranks)?;
        let depth = crate::group_depth();
        if depth > 0 && !in_group_scope {
            return Err(CollectiveError::Unsupported(
                "inside kernel_collectives::group, queue host collectives through the GroupScope (its borrows outlive the group)".into(),
            ));
        }
        if depth > 1 {
            // The buffers are borrowed for the inner group only, but the ranks this thread
            // drives would complete when the outermost group ends.
            return Err(CollectiveError::Unsupported("host collectives in a nested kernel_collectives::group".into()));
        }
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        deposit(&self.shared, self.rank, seq, &op)?;
        if in_group_scope {
            SINK.with(|s| s.borrow_mut().push(Pending { shared: self.shared.clone(), rank: self.rank, seq, op }));
            Ok(())
        } else {
            complete(&self.shared, self.rank, seq, &op)
        }
    }
}
