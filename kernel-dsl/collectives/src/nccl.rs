//! Communicators over NCCL (CUDA devices) and RCCL (HIP devices).
use crate::library::{Backend, Comm, Library, Stream, UniqueId};
use crate::{Collective, CollectiveError, Kind, RawOpHandle};
use kernel_dsl::host::Executor;
use kernel_runtime::Device;
use std::ffi::c_int;
use std::sync::Arc;

/// One rank of an NCCL/RCCL communicator, bound to one GPU [`Device`]; collectives are
/// queued on the device's stream (so `Device::capture` records them). Destroyed on drop
/// (`ncclCommDestroy`, after waiting for the device's queued work): drop graphs that
/// recorded its collectives first. Use it from one thread at a time.
pub struct NcclCommunicator {
    lib: Arc<Library>,
    comm: Comm,
    dev: Device,
    rank: usize,
    nranks: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time (`&self` methods
// are not `Sync`-safe, so the type is `Send` only).
unsafe impl Send for NcclCommunicator {}

/// The library for `dev`'s backend, or why there is none.
fn backend_of(dev: &Device) -> Result<Backend, CollectiveError> {
    match dev {
        Device::Cpu(_) => Err(CollectiveError::Unsupported(format!(
            "{} is the CPU executor: NCCL/RCCL need a GPU (use Communicator::init_all or a HostGroup for CPU-executor devices)",
            dev.name()
        ))),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Ok(Backend::Nccl),
        #[cfg(feature = "rocm")]
        Device::Rocm(_) => Ok(Backend::Rccl),
    }
}

/// Makes `dev` current on this thread (NCCL/RCCL use the current device) and returns its
/// stream; counts as a hand-out of the raw stream.
fn bind_and_stream(dev: &Device) -> Result<Stream, CollectiveError> {
    match dev {
        Device::Cpu(_) => backend_of(dev).map(|_| std::ptr::null_mut()),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            d.bind_context()?;
            Ok(d.raw_stream() as Stream)
        }
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => {
            d.bind_device()?;
            Ok(d.stream().as_raw() as Stream)
        }
    }
}

fn bind(dev: &Device) -> Result<(), CollectiveError> {
    match dev {
        Device::Cpu(_) => backend_of(dev).map(|_| ()),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => Ok(d.bind_context()?),
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => Ok(d.bind_device()?),
    }
}

/// The GPU ordinal of `dev`.
fn ordinal(dev: &Device) -> Result<usize, CollectiveError> {
    match dev {
        Device::Cpu(_) => backend_of(dev).map(|_| 0),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => Ok(d.ordinal()),
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => Ok(d.ordinal()),
    }
}

/// Tells a capture under way on `dev` that the library's work uses the buffer at `addr`.
fn note_graph_use(dev: &Device, addr: u64) {
    match dev {
        Device::Cpu(_) => {
            let _ = addr;
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => d.note_graph_use(addr),
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => d.note_graph_use(addr),
    }
}

fn int(what: &str, v: usize) -> Result<c_int, CollectiveError> {
    c_int::try_from(v).map_err(|_| CollectiveError::InvalidArgument(format!("{what} {v} does not fit a C int")))
}

impl NcclCommunicator {
    /// Rank `rank` of `nranks` on GPU `dev`, joining the communicator named by `id`
    /// (`ncclCommInitRank`; blocks until all `nranks` ranks have joined, so call it from
    /// one process or thread per rank). Loads the backend's library at first use.
    pub fn init_rank(dev: &Device, nranks: usize, rank: usize, id: &UniqueId) -> Result<NcclCommunicator, CollectiveError> {
        let backend = backend_of(dev)?;
        if nranks == 0 || rank >= nranks {
            return Err(CollectiveError::InvalidArgument(format!("rank {rank} of {nranks} ranks")));
        }
        let (n, r) = (int("nranks", nranks)?, int("rank", rank)?);
        let lib = Library::load(backend)?;
        bind(dev)?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id is passed by value as `ncclUniqueId`.
        let res = unsafe { (lib.fns.comm_init_rank)(&mut comm, n, id.raw(), r) };
        lib.check("ncclCommInitRank", res, None)?;
        Ok(NcclCommunicator { lib, comm, dev: dev.clone(), rank, nranks })
    }

    /// One communicator per GPU of this process, rank `i` on `devs[i]` (`ncclCommInitAll`):
    /// distinct GPUs of one backend.
    pub fn init_all(devs: &[Device]) -> Result<Vec<NcclCommunicator>, CollectiveError> {
        let Some(first) = devs.first() else {
            return Err(CollectiveError::InvalidArgument("init_all of no devices".into()));
        };
        let backend = backend_of(first)?;
        let mut ords = Vec::with_capacity(devs.len());
        for d in devs {
            if backend_of(d)? != backend {
                return Err(CollectiveError::Unsupported("init_all of GPUs of different vendors".into()));
            }
            let o = ordinal(d)?;
            if ords.contains(&o) {
                return Err(CollectiveError::InvalidArgument(format!("GPU {o} appears twice in init_all (one rank per GPU)")));
            }
            ords.push(o);
        }
        let ords: Vec<c_int> = ords.into_iter().map(|o| int("ordinal", o)).collect::<Result<_, _>>()?;
        let n = int("devices", devs.len())?;
        let lib = Library::load(backend)?;
        bind(first)?;
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for `n` communicators, `ords` holds `n` device ordinals.
        let res = unsafe { (lib.fns.comm_init_all)(comms.as_mut_ptr(), n, ords.as_ptr()) };
        lib.check("ncclCommInitAll", res, None)?;
        Ok(comms
            .into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (comm, d))| NcclCommunicator { lib: lib.clone(), comm, dev: d.clone(), rank, nranks: devs.len() })
            .collect())
    }

    /// The library it runs on.
    pub fn library(&self) -> &Library {
        &self.lib
    }
}

impl Collective for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.nranks
    }
    fn device(&self) -> &Device {
        &self.dev
    }
    fn queue_raw(&self, op: RawOpHandle, _in_group_scope: bool) -> Result<(), CollectiveError> {
        let op = op.0;
        op.validate(&self.dev, self.nranks)?;
        let stream = bind_and_stream(&self.dev)?;
        if self.dev.is_capturing() {
            for s in [op.send, op.recv] {
                if s.len > 0 {
                    note_graph_use(&self.dev, s.addr);
                }
            }
        }
        let (send, recv) = (op.send.addr as usize as *const std::ffi::c_void, op.recv.addr as usize as *mut std::ffi::c_void);
        let dt = op.dtype as c_int;
        let f = &self.lib.fns;
        // SAFETY: `send`/`recv` are live device ranges of this communicator's GPU with the
        // lengths `validate` checked (counts in elements of `dt`); the stream is the device's,
        // valid while `self.dev` lives; the stream-ordered caching allocator keeps the
        // buffers' memory for the queued work.
        let (call, res) = unsafe {
            match op.kind {
                Kind::AllReduce(r) => ("ncclAllReduce", (f.all_reduce)(send, recv, op.send.len, dt, r as c_int, self.comm, stream)),
                Kind::AllGather => ("ncclAllGather", (f.all_gather)(send, recv, op.send.len, dt, self.comm, stream)),
                Kind::Broadcast { root } => ("ncclBroadcast", (f.broadcast)(send, recv, op.send.len, dt, root as c_int, self.comm, stream)),
                Kind::ReduceScatter(r) => ("ncclReduceScatter", (f.reduce_scatter)(send, recv, op.recv.len, dt, r as c_int, self.comm, stream)),
            }
        };
        self.lib.check(call, res, Some(self.comm))
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        // Queued collectives still use the communicator (refused, and skipped, while the
        // device captures a graph).
        let _ = self.dev.synchronize();
        let _ = bind(&self.dev);
        // SAFETY: a communicator created by this library, destroyed once.
        let _ = unsafe { (self.lib.fns.comm_destroy)(self.comm) };
    }
}
