//! Graphs: a sequence of launches and copies recorded once and replayed with one call.
//!
//! A decode step of an LLM queues hundreds of small kernels; launched one by one from the
//! host, the step is bound by launch overhead, not by the GPU. Recording the step into a
//! graph (CUDA graphs through the driver API, HIP graphs) and replaying it queues the
//! whole step at once. A graph replays *the same work on the same addresses*: kernel
//! arguments, grid sizes and buffer addresses are frozen at capture. So:
//!
//! - every value that changes between steps (token ids, positions, sequence lengths, block
//!   tables) lives in device buffers allocated *before* the capture and written before each
//!   replay ([`Device::write`]);
//! - buffers allocated *during* the capture come from the graph's capture pool (see
//!   [`CachingAllocator`](crate::CachingAllocator)): replays see the same addresses, and
//!   the pool's memory is kept until the graph drops;
//! - nothing inside the capture may wait for the device or read it back: [`Device::read`],
//!   [`Device::download`], [`Device::synchronize`], [`Device::record_event`],
//!   [`Device::write`] / [`Device::upload`] (a copy from pageable host memory cannot be
//!   recorded), and a miss of [`Device::upload_shared`]'s cache give
//!   [`LaunchError::Capture`] and queue nothing;
//! - the capturing thread owns the device's queue until the capture ends: launches and
//!   copies from other threads are refused ([`LaunchError::Capture`]);
//! - buffers allocated before the capture that the graph's launches and copies use (its
//!   inputs, outputs, weights) stay reserved for it: the capture records their addresses,
//!   and such a block freed while the graph lives joins the graph's pool instead of being
//!   handed to another buffer. Work a library queues on the raw stream (cuBLAS, rocBLAS)
//!   is seen only through `note_graph_use` (`CudaDevice`, `RocmDevice`) on its buffers;
//!   otherwise keep them alive as long as the graph. [`StepGraph`] owns the step's state
//!   with the graph.
//!
//! Launches that may overlap the kernel before them (programmatic dependent launch, CUDA)
//! are queued plainly inside a capture: the graph runs its kernels in order.
//!
//! The CPU executor has no graphs ([`Device::supports_graphs`] is `false`): [`StepGraph`]
//! runs the step eagerly there, so callers write one code path.
use crate::{Device, DeviceVec};
use kernel_dsl::host::LaunchError;
use std::sync::Arc;

/// A recorded sequence of device work ([`Device::capture`]), replayed with
/// [`Graph::replay`]. Dropping it frees the executable graph and gives its capture pool
/// back to the device's cache.
pub struct Graph {
    exec: Option<Exec>,
    pool: u64,
    dev: Device,
    /// Layout arrays of [`Device::upload_shared`] the graph reads (cache hits during the
    /// capture): kept alive with it.
    _kept: Vec<Arc<DeviceVec<usize>>>,
}

/// The backend's executable graph.
pub(crate) enum Exec {
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaGraph),
    #[cfg(feature = "rocm")]
    Rocm(crate::rocm::RocmGraph),
}

impl Graph {
    /// Queues the recorded work on the device's queue (one call, however many launches it
    /// holds), ordered after the work queued before it, like any launch.
    pub fn replay(&self) -> Result<(), LaunchError> {
        self.dev.allocator().check_capture_thread("replay")?;
        match &self.exec {
            #[cfg(feature = "cuda")]
            Some(Exec::Cuda(g)) => g.launch(),
            #[cfg(feature = "rocm")]
            Some(Exec::Rocm(g)) => g.launch(),
            #[allow(unreachable_patterns)]
            _ => Err(LaunchError::Capture { op: "replay", reason: "the graph was released".into() }),
        }
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // The executable graph first (a replay still queued finishes first), then the pool:
        // its blocks are reused only by work queued after the replays.
        self.exec = None;
        self.dev.allocator().retire_pool(self.pool);
    }
}

/// Ends a capture that did not complete (the closure failed or panicked): the stream stops
/// capturing, the partial graph and the pool are released.
struct Abort<'a> {
    dev: &'a Device,
    pool: u64,
    armed: bool,
}

impl Drop for Abort<'_> {
    fn drop(&mut self) {
        if self.armed {
            drop(self.dev.end_stream_capture());
            self.dev.shared_uploads().end_capture();
            self.dev.allocator().retire_pool(self.pool);
        }
    }
}

impl Device {
    /// Whether this device records graphs ([`Device::capture`]): CUDA and HIP devices do;
    /// the CPU executor runs every launch as it comes (use [`StepGraph`] for one code path).
    pub fn supports_graphs(&self) -> bool {
        self.is_gpu()
    }

    /// Whether a graph is being captured on this device now.
    pub fn is_capturing(&self) -> bool {
        self.allocator().capturing()
    }

    /// Records the work `f` queues on this device into a [`Graph`], *without running it*,
    /// and returns the graph with `f`'s result (buffers allocated inside `f` come from the
    /// graph's pool; outputs returned from `f` keep their addresses for every replay).
    ///
    /// Run the work once eagerly before capturing it: kernels get loaded and layout arrays
    /// uploaded outside the capture. See the [module docs](crate::graph) for what a capture
    /// may do. An error on the CPU executor ([`Device::supports_graphs`]), while another
    /// capture is under way, and when `f` fails (the partial capture is discarded).
    pub fn capture<R>(&self, f: impl FnOnce(&Device) -> Result<R, LaunchError>) -> Result<(Graph, R), LaunchError> {
        if !self.supports_graphs() {
            return Err(LaunchError::Capture {
                op: "capture",
                reason: format!("{} has no graphs (supports_graphs() is false); StepGraph runs the step eagerly there", crate::Executor::name(self)),
            });
        }
        let pool = self.allocator().begin_capture()?;
        self.shared_uploads().begin_capture();
        if let Err(e) = self.begin_stream_capture() {
            self.shared_uploads().end_capture();
            self.allocator().retire_pool(pool);
            return Err(e);
        }
        let mut abort = Abort { dev: self, pool, armed: true };
        let out = f(self);
        abort.armed = false;
        let ended = self.end_stream_capture();
        let kept = self.shared_uploads().end_capture();
        self.allocator().end_capture();
        match (out, ended) {
            (Ok(r), Ok(exec)) => Ok((Graph { exec: Some(exec), pool, dev: self.clone(), _kept: kept }, r)),
            // The closure's error first: it usually explains an invalidated capture. The
            // partial graph (if any) is dropped here, before the pool.
            (Err(e), _) | (Ok(_), Err(e)) => {
                self.allocator().retire_pool(pool);
                Err(e)
            }
        }
    }

    fn begin_stream_capture(&self) -> Result<(), LaunchError> {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.begin_capture(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.begin_capture(),
            _ => Err(LaunchError::Capture { op: "capture", reason: "no graphs on this device".into() }),
        }
    }

    /// Ends the stream capture and instantiates the graph.
    fn end_stream_capture(&self) -> Result<Exec, LaunchError> {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.end_capture().map(Exec::Cuda),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.end_capture().map(Exec::Rocm),
            _ => Err(LaunchError::Capture { op: "capture", reason: "no graphs on this device".into() }),
        }
    }

    /// [`LaunchError::Capture`] for `op` while a graph is being captured on this device.
    pub(crate) fn refuse_in_capture(&self, op: &'static str, reason: &str) -> Result<(), LaunchError> {
        refuse_in_capture(self.allocator(), op, reason)
    }
}

/// [`LaunchError::Capture`] for `op` while `alloc`'s device is capturing a graph.
pub(crate) fn refuse_in_capture(alloc: &crate::CachingAllocator, op: &'static str, reason: &str) -> Result<(), LaunchError> {
    if alloc.capturing() {
        Err(LaunchError::Capture { op, reason: reason.to_string() })
    } else {
        Ok(())
    }
}

/// Why a host-to-device copy is refused during a capture.
pub(crate) const NO_UPLOAD: &str = "a copy from host memory cannot be recorded into a graph (it would replay the bytes of the capture); write per-step values into device buffers before each replay";
/// Why a wait or a read-back is refused during a capture.
pub(crate) const NO_WAIT: &str = "waiting for the device or reading it back would break the capture (nothing runs until the graph is replayed)";

/// The mutable step function of a [`StepGraph`].
type Step<'a, S> = Box<dyn FnMut(&Device, &mut S) -> Result<(), LaunchError> + Send + 'a>;

/// One code path for a step run many times (an LLM decode step): a graph on a GPU, the
/// step itself on the CPU executor. It owns the step's state `S` (its input and output
/// buffers, which must outlive the graph) and the step.
///
/// ```
/// use kernel_runtime::{Device, StepGraph, WaveSize};
///
/// let dev = Device::cpu(WaveSize::W32);
/// let state = (dev.upload(&[1.0f32, 2.0]).unwrap(), dev.alloc::<f32>(2).unwrap());
/// let mut step = StepGraph::new(&dev, state, |dev, (x, y)| dev.copy(x.view(..)?, y.view_mut(..)?)).unwrap();
/// dev.write(step.state_mut().0.view_mut(..).unwrap(), &[5.0, 6.0]).unwrap();
/// step.run().unwrap();
/// assert_eq!(dev.download(&step.state().1).unwrap(), vec![5.0, 6.0]);
/// ```
pub struct StepGraph<'a, S> {
    dev: Device,
    state: S,
    step: Step<'a, S>,
    graph: Option<Graph>,
}

impl<'a, S> StepGraph<'a, S> {
    /// Runs `step` once on `state` (eagerly: kernels load, layouts upload) and, where the
    /// device has graphs, records it into a graph that [`StepGraph::run`] replays.
    ///
    /// The step must queue the same work every time: per-step values live in the
    /// device buffers of `state` (written between runs), not in host values read by the
    /// step; it must not read the device back. The buffers of `state` are the graph's
    /// fixed addresses: write into them ([`Device::write`], [`Device::copy`], kernels); a
    /// buffer replaced through [`StepGraph::state_mut`] is not seen by the graph (which
    /// keeps the old block).
    pub fn new(dev: &Device, state: S, step: impl FnMut(&Device, &mut S) -> Result<(), LaunchError> + Send + 'a) -> Result<Self, LaunchError> {
        Self::build(dev, state, Box::new(step), dev.supports_graphs())
    }

    /// As [`StepGraph::new`] but never captures: the step runs eagerly on every
    /// [`StepGraph::run`] (to compare with the graph, or to turn graphs off).
    pub fn eager(dev: &Device, state: S, step: impl FnMut(&Device, &mut S) -> Result<(), LaunchError> + Send + 'a) -> Result<Self, LaunchError> {
        Self::build(dev, state, Box::new(step), false)
    }

    fn build(dev: &Device, mut state: S, mut step: Step<'a, S>, capture: bool) -> Result<Self, LaunchError> {
        step(dev, &mut state)?;
        let graph = if capture { Some(dev.capture(|d| step(d, &mut state))?.0) } else { None };
        Ok(StepGraph { dev: dev.clone(), state, step, graph })
    }

    /// Runs the step again: replays the graph, or calls the step on the CPU executor.
    pub fn run(&mut self) -> Result<(), LaunchError> {
        match &self.graph {
            Some(g) => g.replay(),
            None => (self.step)(&self.dev, &mut self.state),
        }
    }

    /// Whether [`StepGraph::run`] replays a graph (`false`: it runs the step eagerly).
    pub fn is_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// The state (read outputs from its buffers after [`StepGraph::run`]).
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The state, to write the next step's inputs into its buffers. A buffer replaced here
    /// is not seen by the graph, which keeps using (and holding) the old one.
    pub fn state_mut(&mut self) -> &mut S {
        &mut self.state
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Drops the graph (its pool goes back to the device's cache) and returns the state.
    pub fn into_state(mut self) -> S {
        drop(self.graph.take());
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WaveSize;

    /// A step that allocates temporaries, zero-fills and copies: `y[i] = x[i + 1] + 0`, the
    /// last element zero, through two temporaries.
    fn shift_step(dev: &Device, (x, y): &mut (DeviceVec<u32>, DeviceVec<u32>)) -> Result<(), LaunchError> {
        let n = x.len();
        let mut t = dev.alloc::<u32>(n)?;
        dev.copy(x.view(1..)?, t.view_mut(..n - 1)?)?;
        let mut u = dev.scratch::<u32>(n)?;
        dev.copy(t.view(..)?, u.view_mut(..)?)?;
        dev.copy(u.view(..)?, y.view_mut(..)?)
    }

    fn shifted(xs: &[u32]) -> Vec<u32> {
        xs[1..].iter().copied().chain([0]).collect()
    }

    #[test]
    fn the_cpu_executor_runs_step_graphs_eagerly_without_leaks() {
        let dev = Device::cpu(WaveSize::W32);
        assert!(!dev.supports_graphs() && !dev.is_capturing());
        let e = dev.capture(|_| Ok(())).err().expect("no graphs on the CPU executor");
        assert!(matches!(e, LaunchError::Capture { op: "capture", .. }), "{e}");
        let n = 1000;
        let xs: Vec<u32> = (0..n).map(|i| i * 7 + 1).collect();
        let state = (dev.upload(&xs).unwrap(), dev.alloc::<u32>(n as usize).unwrap());
        let mut step = StepGraph::new(&dev, state, shift_step).unwrap();
        assert!(!step.is_graph());
        assert_eq!(dev.download(&step.state().1).unwrap(), shifted(&xs), "new runs the step once");
        let warm = dev.memory_stats();
        for k in 0..200u32 {
            let xs: Vec<u32> = (0..n).map(|i| i.wrapping_mul(k + 3) ^ k).collect();
            let (x, _) = step.state_mut();
            dev.write(x.view_mut(..).unwrap(), &xs).unwrap();
            step.run().unwrap();
            assert_eq!(dev.download(&step.state().1).unwrap(), shifted(&xs), "run {k}");
        }
        let after = dev.memory_stats();
        assert_eq!(after.backend_allocations, warm.backend_allocations, "steady state: no new blocks");
        assert_eq!((after.live_blocks, after.graph_pools, after.graph_pool_bytes), (2, 0, 0), "only x and y live, no pools");
        drop(step.into_state());
        dev.empty_cache();
        let s = dev.memory_stats();
        assert_eq!((s.in_use_bytes, s.cached_bytes, s.live_blocks), (0, 0, 0));
        assert_eq!(s.backend_frees, s.backend_allocations, "every block went back");
    }

    #[test]
    fn a_failing_step_is_an_error_from_new() {
        let dev = Device::cpu(WaveSize::W64);
        let state = (dev.upload(&[1u32, 2, 3]).unwrap(), dev.alloc::<u32>(2).unwrap());
        let e = StepGraph::new(&dev, state, shift_step).err().expect("y has 2 elements, x 3");
        assert!(e.to_string().contains("3 elements"), "{e}");
    }

    /// The refusals during a capture, driven through the allocator's capture state (the CPU
    /// executor cannot capture; a GPU takes the same paths in `Device`).
    #[test]
    fn waits_reads_and_host_copies_are_typed_errors_during_a_capture_and_change_nothing() {
        let dev = Device::cpu(WaveSize::W32);
        let mut x = dev.upload(&[1u32, 2, 3, 4]).unwrap();
        let layout = dev.upload_shared(&[4, 1]).unwrap();
        let pool = dev.allocator().begin_capture().unwrap();
        dev.shared_uploads().begin_capture();
        assert!(dev.is_capturing());
        let refused = [
            ("write", dev.write(x.view_mut(..).unwrap(), &[9, 9, 9, 9]).err()),
            ("upload", dev.upload(&[5u32]).err()),
            ("download", dev.download(&x).err()),
            ("synchronize", dev.synchronize().err()),
            ("record_event", dev.record_event().err()),
            ("upload_shared", dev.upload_shared(&[8, 2]).err()),
        ];
        for (op, e) in refused {
            match e {
                Some(LaunchError::Capture { op: o, reason }) => assert!(o == op && !reason.is_empty(), "{op}: {o}: {reason}"),
                other => panic!("{op}: expected a capture error, got {other:?}"),
            }
        }
        let again = dev.upload_shared(&[4, 1]).unwrap();
        assert!(Arc::ptr_eq(&again, &layout), "a cached layout is served during a capture");
        dev.empty_cache();
        let kept = dev.shared_uploads().end_capture();
        assert_eq!(kept.len(), 1, "the graph keeps the layouts it reads");
        dev.allocator().end_capture();
        dev.allocator().retire_pool(pool);
        assert_eq!(dev.download(&x).unwrap(), vec![1, 2, 3, 4], "the refused write changed nothing");
        assert_eq!(dev.shared_uploads_len(), 1, "empty_cache did nothing during the capture");
        let s = dev.memory_stats();
        assert_eq!((s.graph_pools, s.graph_pool_bytes), (0, 0));
    }
}
