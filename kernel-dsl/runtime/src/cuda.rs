//! NVIDIA executor: loads the embedded PTX through the CUDA driver API (`cudarc`, loaded
//! at run time, so building needs no CUDA install) and launches kernels on one stream.
use crate::alloc::{CachingAllocator, RawMemory};
use cudarc::driver::{result, sys};
use kernel_dsl::host::{check_memory, ArgValue, EmbeddedKernels, Executor, Launch, LaunchError, MemLocation};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

fn err(call: &'static str, e: result::DriverError) -> LaunchError {
    LaunchError::Backend { backend: "cuda", call, message: format!("{e:?}") }
}

/// One CUDA device with its primary context and a stream. Launches, memsets, uploads and
/// device copies are all queued on that stream, so they run in the order they were issued;
/// only reads ([`Device::read`](crate::Device::read)) and [`CudaDevice::synchronize`] wait.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
    memory: Arc<CachingAllocator>,
    shared: Arc<crate::shared::SharedUploads>,
    /// Values ops keep between their launches on this device ([`CudaDevice::with_state`]).
    state: Arc<Mutex<HashMap<TypeId, Box<dyn Any + Send>>>>,
}

/// The device's memory as the caching allocator sees it.
struct CudaMemory(Arc<Inner>);

impl RawMemory for CudaMemory {
    fn alloc(&self, bytes: usize) -> Result<u64, LaunchError> {
        bind(&self.0)?;
        // `cuMemAlloc` is a "potentially unsafe" call during a stream capture in the
        // thread-local mode captures use here; the caching allocator makes it safe (the
        // block joins the graph's pool), so this thread switches to the relaxed mode around
        // it and back (the push-pop use `cuThreadExchangeStreamCaptureMode` documents).
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid in/out value.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result().map_err(|e| err("cuThreadExchangeStreamCaptureMode", e))?;
        // SAFETY: plain allocation of `bytes` > 0 bytes, freed by `free`.
        let a = unsafe { result::malloc_sync(bytes) }.map_err(|e| err("cuMemAlloc", e));
        // SAFETY: as above; restores the thread's previous mode.
        let restored = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
        let a = a?;
        if let Err(e) = restored {
            // SAFETY: `a` came from `malloc_sync` just above and was never handed out.
            unsafe {
                let _ = result::free_sync(a);
            }
            return Err(err("cuThreadExchangeStreamCaptureMode", e));
        }
        Ok(a)
    }
    unsafe fn free(&self, addr: u64, _bytes: usize) {
        // SAFETY: the caller's contract: `addr` came from `alloc`, queued work has finished.
        unsafe {
            let _ = result::ctx::set_current(self.0.ctx);
            let _ = result::free_sync(addr);
        }
    }
    fn wait_idle(&self) {
        // SAFETY: valid context and stream.
        unsafe {
            let _ = result::ctx::set_current(self.0.ctx);
            let _ = result::stream::synchronize(self.0.stream);
        }
    }
}

fn bind(inner: &Inner) -> Result<(), LaunchError> {
    // SAFETY: the context lives as long as `inner`.
    unsafe { result::ctx::set_current(inner.ctx) }.map_err(|e| err("cuCtxSetCurrent", e))
}

struct Inner {
    ordinal: usize,
    name: String,
    capability: (i32, i32),
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`.
    max_shared: usize,
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
    sms: u32,
    ctx: sys::CUcontext,
    device: sys::CUdevice,
    stream: sys::CUstream,
    /// Keyed by the address of the PTX text (a crate's main PTX or one of its variants).
    modules: Mutex<HashMap<usize, sys::CUmodule>>,
    /// Kernels launched with `LaunchConfig::overlapping_prior` may overlap the kernel before
    /// them (unless `KERNEL_NO_OVERLAP` is set, which orders every launch after the last).
    overlap: bool,
    /// Loaded functions, and whether each may overlap the kernel before it (built for
    /// `sm_90` or later: `griddepcontrol` exists there). Keyed by the addresses of the
    /// binaries and of the symbol text (launchers pass the same `&'static str` every time;
    /// hashing two words instead of the mangled name keeps the lookup off the launch
    /// path's profile).
    functions: Mutex<HashMap<FunctionKey, (sys::CUfunction, bool)>>,
    /// Operations queued on the stream through this device: launches, copies, fills, and
    /// every hand-out of the raw stream (after which anything may have been queued).
    queued: AtomicU64,
    /// The last launch marked by [`CudaDevice::mark_overlappable`]: `queued` right after it
    /// and the byte range `[start, end)` it writes.
    overlappable: Mutex<Option<(u64, u64, u64)>>,
    /// Resident work-groups per (function, work-group size, shared bytes).
    resident: Mutex<HashMap<(usize, u32, usize), u32>>,
}

// SAFETY: CUDA handles are usable from any thread once the context is made current,
// which every entry point does first.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: handles created by `CudaDevice::new`, released once.
        unsafe {
            let _ = result::ctx::set_current(self.ctx);
            let _ = result::stream::synchronize(self.stream);
            for (_, m) in self.modules.lock().unwrap().drain() {
                let _ = result::module::unload(m);
            }
            let _ = result::stream::destroy(self.stream);
            let _ = result::primary_ctx::release(self.device);
        }
    }
}

impl CudaDevice {
    /// Opens device `ordinal`. Without an NVIDIA driver or GPU this is a clear error.
    pub fn new(ordinal: usize) -> Result<Self, LaunchError> {
        // SAFETY: only checks whether libcuda can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(LaunchError::NoDevice("the CUDA driver library (libcuda.so) is not installed".into()));
        }
        result::init().map_err(|e| err("cuInit", e))?;
        let count = result::device::get_count().map_err(|e| err("cuDeviceGetCount", e))?;
        if ordinal >= count as usize {
            return Err(LaunchError::NoDevice(format!("CUDA device {ordinal} requested, {count} present")));
        }
        let device = result::device::get(ordinal as i32).map_err(|e| err("cuDeviceGet", e))?;
        let name = result::device::get_name(device).map_err(|e| err("cuDeviceGetName", e))?;
        // SAFETY: valid device handle from above.
        unsafe {
            let major = result::device::get_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
                .map_err(|e| err("cuDeviceGetAttribute", e))?;
            let minor = result::device::get_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
                .map_err(|e| err("cuDeviceGetAttribute", e))?;
            let max_shared = result::device::get_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .map_err(|e| err("cuDeviceGetAttribute", e))?;
            let sms = result::device::get_attribute(device, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| err("cuDeviceGetAttribute", e))?;
            let ctx = result::primary_ctx::retain(device).map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
            result::ctx::set_current(ctx).map_err(|e| err("cuCtxSetCurrent", e))?;
            // Non-blocking: no implicit ordering with the legacy NULL stream, which nothing
            // here relies on (reads wait for this stream explicitly). A blocking stream
            // would make any legacy-stream call in the process (another device handle's
            // read, a library) fail while this stream captures a graph, and break the capture.
            let stream = result::stream::create(result::stream::StreamKind::NonBlocking).map_err(|e| err("cuStreamCreate", e))?;
            let inner = Arc::new(Inner {
                ordinal,
                name,
                capability: (major, minor),
                max_shared: max_shared.max(0) as usize,
                sms: sms.max(1) as u32,
                ctx,
                device,
                stream,
                modules: Mutex::new(HashMap::new()),
                overlap: std::env::var_os("KERNEL_NO_OVERLAP").is_none(),
                queued: AtomicU64::new(0),
                overlappable: Mutex::new(None),
                resident: Mutex::new(HashMap::new()),
                functions: Mutex::new(HashMap::new()),
            });
            Ok(CudaDevice { memory: CachingAllocator::new(Box::new(CudaMemory(inner.clone()))), shared: Default::default(), state: Default::default(), inner })
        }
    }

    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn device_name(&self) -> &str {
        &self.inner.name
    }

    /// Compute capability `(major, minor)`.
    pub fn capability(&self) -> (i32, i32) {
        self.inner.capability
    }

    fn bind(&self) -> Result<(), LaunchError> {
        bind(&self.inner)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// Makes this device's (primary) context current on the calling thread, as every
    /// method here does first; for libraries (cuBLAS) called directly on its memory.
    pub fn bind_context(&self) -> Result<(), LaunchError> {
        self.bind()
    }

    /// The stream all launches and device copies of this device are queued on. Work a
    /// library queues on it stays ordered with the kernels; the handle is valid while this
    /// device (or a clone) lives. Buffer addresses are the kernel arguments' `addr`s.
    pub fn raw_stream(&self) -> sys::CUstream {
        self.queued();
        self.inner.stream
    }

    /// Work-groups of `block` work-items and `shared` bytes of shared memory that the
    /// device holds at once running `f` (its occupancy per SM times the SMs), remembered per
    /// function and shape.
    fn resident_groups(&self, f: sys::CUfunction, block: u32, shared: usize) -> Result<u32, LaunchError> {
        let key = (f as usize, block, shared);
        if let Some(n) = self.inner.resident.lock().unwrap().get(&key) {
            return Ok(*n);
        }
        let mut per_sm: std::ffi::c_int = 0;
        // SAFETY: `f` is a loaded function of this context (bound by the caller).
        unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, f, block as std::ffi::c_int, shared) }
            .result()
            .map_err(|e| err("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        let n = per_sm.max(1) as u32 * self.inner.sms;
        self.inner.resident.lock().unwrap().insert(key, n);
        Ok(n)
    }

    /// Counts one operation queued on the stream; returns the count after it.
    fn queued(&self) -> u64 {
        self.inner.queued.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Operations queued on this device's stream so far (launches, copies, fills and
    /// hand-outs of the raw stream): equal at two points when nothing was queued between.
    pub fn queued_ops(&self) -> u64 {
        self.inner.queued.load(Ordering::SeqCst)
    }

    /// Runs `f` on this device's value of type `T` (`T::default()` at first use), which
    /// lives as long as the device: state an op keeps between its launches (buffers, what
    /// they hold). Calls for the same `T` run one at a time.
    pub fn with_state<T: Any + Send + Default, R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut map = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let slot = map.entry(TypeId::of::<T>()).or_insert_with(|| Box::new(T::default()));
        f(slot.downcast_mut::<T>().expect("state keyed by its type"))
    }

    /// Records that the launch queued last on this device writes nothing outside the bytes
    /// `writes` (device addresses) and lets the kernel after it start only once it has
    /// waited for the kernel before it (`kernel_dsl::grid::wait_prior`, then
    /// `release_next`): until then everything queued before it has finished.
    pub fn mark_overlappable(&self, writes: std::ops::Range<u64>) {
        let n = self.inner.queued.load(Ordering::SeqCst);
        *self.inner.overlappable.lock().unwrap() = Some((n, writes.start, writes.end));
    }

    /// Whether a kernel queued next may read the bytes `reads` before its wait for the
    /// kernel before it ([`kernel_dsl::host::LaunchConfig::overlapping_prior`]): the last
    /// operation queued is a launch marked by [`CudaDevice::mark_overlappable`] that writes
    /// none of them (everything queued before that launch has finished by then).
    pub fn may_read_during_prior(&self, reads: std::ops::Range<u64>) -> bool {
        let n = self.inner.queued.load(Ordering::SeqCst);
        crate::reads_miss_marked(*self.inner.overlappable.lock().unwrap(), n, reads)
    }

    /// Tells a graph capture under way that work queued on the raw stream by a library
    /// (cuBLAS, rocBLAS, MIOpen) uses the buffer holding `addr`: the buffer then stays
    /// reserved for the graph like those of kernel arguments. A no-op outside a capture.
    pub fn note_graph_use(&self, addr: u64) {
        if self.memory.capturing() {
            self.memory.record_use(addr);
        }
    }

    pub(crate) fn allocator(&self) -> &Arc<CachingAllocator> {
        &self.memory
    }

    pub(crate) fn shared_uploads(&self) -> &crate::shared::SharedUploads {
        &self.shared
    }

    /// Waits for all work queued on the stream. Refused during a graph capture.
    pub fn synchronize(&self) -> Result<(), LaunchError> {
        crate::graph::refuse_in_capture(&self.memory, "synchronize", crate::graph::NO_WAIT)?;
        self.bind()?;
        // SAFETY: valid stream.
        unsafe { result::stream::synchronize(self.inner.stream) }.map_err(|e| err("cuStreamSynchronize", e))
    }

    /// Zeroes `bytes` bytes at `addr`, queued on the stream (`cuMemsetD8Async`): the host
    /// does not wait, kernels queued later see zeros, kernels queued earlier do not.
    pub(crate) fn memset_zero(&self, addr: u64, bytes: usize) -> Result<(), LaunchError> {
        self.bind()?;
        self.queued();
        // SAFETY: `addr` is a live block of at least `bytes` bytes of this device, kept alive
        // for the queued memset by the stream-ordered caching allocator.
        unsafe { result::memset_d8_async(addr, 0, bytes, self.inner.stream) }.map_err(|e| err("cuMemsetD8Async", e))
    }

    /// Host-to-device copy of `data` to `addr`, queued on the stream after the work queued
    /// before it (`cuMemcpyHtoDAsync`); `data` may be reused or freed once this returns.
    ///
    /// Why not `cuMemcpyHtoD`: for pageable memory "a stream sync is performed before the
    /// copy is initiated" (CUDA Driver API, "API synchronization behavior", Memcpy,
    /// Synchronous), which drains the GPU on every layout or geometry upload of an op.
    /// The asynchronous form from pageable memory is, per the same page (Asynchronous):
    /// "might be synchronous with respect to host" and "If pageable memory must first be
    /// staged to pinned memory, the driver may synchronize with the stream and stage the copy
    /// into pinned memory": the driver stages the pageable source before returning (it holds
    /// no reference to `data` afterwards), at worst after waiting for the stream, never
    /// before work queued earlier on it. `kernels/tests/runtime.rs` checks both properties
    /// (source reused right after the call; a kernel queued before the write reads the old data).
    pub(crate) fn write_raw<T: Copy>(&self, addr: u64, data: &[T]) -> Result<(), LaunchError> {
        crate::graph::refuse_in_capture(&self.memory, "write", crate::graph::NO_UPLOAD)?;
        self.bind()?;
        self.queued();
        // SAFETY: `addr` is a live range of `size_of_val(data)` bytes of this device, kept
        // alive for the queued copy by the stream-ordered caching allocator; the source is
        // staged by the driver before the call returns (see above).
        unsafe { result::memcpy_htod_async(addr, data, self.inner.stream) }.map_err(|e| err("cuMemcpyHtoDAsync", e))
    }

    /// Device-to-host copy from `addr` into `out` (waits for queued work first).
    pub(crate) fn read_raw<T: Copy>(&self, addr: u64, out: &mut [std::mem::MaybeUninit<T>]) -> Result<(), LaunchError> {
        self.synchronize()?;
        // SAFETY: `addr` holds `out.len()` elements; `MaybeUninit<T>` has `T`'s layout and
        // the copy writes every byte of `out`.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<T>(), out.len());
            result::memcpy_dtoh_sync(dst, addr)
        }
        .map_err(|e| err("cuMemcpyDtoH", e))
    }

    /// Device-to-device copy of `bytes` bytes, queued on the stream.
    pub(crate) fn copy_raw(&self, src: u64, dst: u64, bytes: usize) -> Result<(), LaunchError> {
        self.bind()?;
        self.queued();
        // SAFETY: both are live ranges of `bytes` bytes of this device, kept alive for the
        // queued copy by the stream-ordered caching allocator.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.inner.stream) }.map_err(|e| err("cuMemcpyDtoDAsync", e))
    }

    /// Records an event on the stream (for timing).
    pub fn record_event(&self) -> Result<CudaEvent, LaunchError> {
        crate::graph::refuse_in_capture(&self.memory, "record_event", crate::graph::NO_WAIT)?;
        self.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(|e| err("cuEventCreate", e))?;
        // SAFETY: fresh event, valid stream.
        unsafe { result::event::record(ev, self.inner.stream) }.map_err(|e| err("cuEventRecord", e))?;
        Ok(CudaEvent { ev })
    }

    /// Starts capturing the stream into a graph (`cuStreamBeginCapture_v2`, thread-local
    /// mode: this thread may not make calls that would break the capture, other threads may
    /// work on other streams). Called by [`Device::capture`](crate::Device::capture), which
    /// routes allocations to the graph's pool.
    pub(crate) fn begin_capture(&self) -> Result<(), LaunchError> {
        self.bind()?;
        self.queued();
        // SAFETY: valid stream of the bound context.
        unsafe { result::stream::begin_capture(self.inner.stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .map_err(|e| err("cuStreamBeginCapture", e))
    }

    /// Ends the capture (`cuStreamEndCapture`) and instantiates the graph
    /// (`cuGraphInstantiateWithFlags`).
    pub(crate) fn end_capture(&self) -> Result<CudaGraph, LaunchError> {
        self.bind()?;
        // Ops that remember what they queued last (`with_state`, `queued_ops`) must not take
        // work that was only recorded for work that ran.
        self.queued();
        // SAFETY: valid stream, capturing since `begin_capture`.
        let graph = unsafe { result::stream::end_capture(self.inner.stream) }.map_err(|e| err("cuStreamEndCapture", e))?;
        if graph.is_null() {
            return Err(LaunchError::Capture { op: "capture", reason: "cuStreamEndCapture returned no graph".into() });
        }
        // SAFETY: `graph` is the valid graph just captured.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(CudaGraph { graph, exec, dev: self.clone() }),
            Err(e) => {
                // SAFETY: `graph` is ours and not used afterwards.
                unsafe {
                    let _ = result::graph::destroy(graph);
                }
                Err(err("cuGraphInstantiateWithFlags", e))
            }
        }
    }

    fn function(&self, binaries: &'static EmbeddedKernels, symbol: &'static str) -> Result<(sys::CUfunction, bool), LaunchError> {
        let key = (binaries as *const EmbeddedKernels as usize, symbol.as_ptr() as usize, symbol.len());
        if let Some(f) = self.inner.functions.lock().unwrap().get(&key) {
            return Ok(*f);
        }
        // The crate's PTX, or the variant built for this kernel's instructions (`sm_90a`):
        // the only code of the kernel, or its preferred code on the variant's architecture.
        let cap = self.inner.capability;
        let (ptx, overlaps) = match (binaries.preferred_variant(symbol, cap), binaries.variant_for(symbol)) {
            (Some(v), _) => (v.ptx, cap.0 >= 9),
            (None, Some(v)) if v.runs_on(cap) => (v.ptx, cap.0 >= 9),
            (None, Some(v)) => {
                let (ma, mi) = cap;
                return Err(LaunchError::ArchNotBuilt { arch: format!("{symbol} on sm_{ma}{mi}"), built: vec![v.target] });
            }
            (None, None) => (binaries.ptx.ok_or_else(|| LaunchError::NoDevice(format!("{} was built without PTX (KERNEL_PTX=0)", binaries.crate_name)))?, false),
        };
        let module = {
            let mut modules = self.inner.modules.lock().unwrap();
            match modules.get(&(ptx.as_ptr() as usize)) {
                Some(m) => *m,
                None => {
                    let image = CString::new(ptx).expect("PTX has no NUL bytes");
                    // SAFETY: NUL-terminated PTX text.
                    let m = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| err("cuModuleLoadData", e))?;
                    modules.insert(ptx.as_ptr() as usize, m);
                    m
                }
            }
        };
        let name = CString::new(symbol).expect("symbol");
        // SAFETY: valid module, NUL-terminated name.
        let f = unsafe { result::module::get_function(module, name) }.map_err(|e| err("cuModuleGetFunction", e))?;
        self.inner.functions.lock().unwrap().insert(key, (f, overlaps));
        Ok((f, overlaps))
    }
}

impl Executor for CudaDevice {
    fn name(&self) -> String {
        let (ma, mi) = self.inner.capability;
        format!("cuda:{} ({}, sm_{ma}{mi})", self.inner.ordinal, self.inner.name)
    }

    fn memory(&self) -> MemLocation {
        MemLocation::Device { backend: "cuda", ordinal: self.inner.ordinal }
    }

    fn wave_lanes(&self) -> u32 {
        32
    }

    fn max_shared_bytes(&self) -> usize {
        self.inner.max_shared
    }

    fn compute_units(&self) -> Option<u32> {
        Some(self.inner.sms)
    }

    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError> {
        launch.config.validate()?;
        check_memory(self, launch)?;
        let mut c = launch.config;
        if c.grid.volume() == 0 {
            return Ok(());
        }
        self.bind()?;
        let (f, overlaps) = self.function(launch.binaries, launch.kernel.symbol)?;
        self.queued();
        if launch.shared_bytes > 48 * 1024 {
            // SAFETY: valid function handle.
            unsafe {
                result::function::set_function_attribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes as i32,
                )
            }
            .map_err(|e| err("cuFuncSetAttribute", e))?;
        }
        if c.resident_most > 0 && c.grid.y == 1 && c.grid.z == 1 {
            c.grid.x = self.resident_groups(f, c.block.volume() as u32, launch.shared_bytes)?.min(c.resident_most).max(1);
        }
        // One 8-byte cell per slot; CUDA reads each parameter's size from the cell start.
        // On the stack for every kernel of this project (a few dozen slots at most): no heap
        // allocation per launch.
        const STACK_SLOTS: usize = 48;
        let slots: usize = launch.args.iter().map(|a| if matches!(a, ArgValue::Slice { .. }) { 2 } else { 1 }).sum();
        let (mut cell_stack, mut cell_heap) = ([0u64; STACK_SLOTS], Vec::new());
        let cells: &mut [u64] = if slots <= STACK_SLOTS {
            &mut cell_stack[..slots]
        } else {
            cell_heap.resize(slots, 0);
            &mut cell_heap
        };
        let mut n = 0;
        for a in launch.args {
            match *a {
                ArgValue::Slice { addr, len, .. } => {
                    // Empty host slices (`&[]`) are never read: pass a null pointer.
                    cells[n] = if len == 0 { 0 } else { addr };
                    cells[n + 1] = len as u64;
                    n += 2;
                    continue;
                }
                ArgValue::U8(v) => cells[n] = v as u64,
                ArgValue::U16(v) => cells[n] = v as u64,
                ArgValue::U32(v) => cells[n] = v as u64,
                ArgValue::U64(v) => cells[n] = v,
            }
            n += 1;
        }
        let (mut param_stack, mut param_heap) = ([std::ptr::null_mut::<c_void>(); STACK_SLOTS], Vec::new());
        let params: &mut [*mut c_void] = if slots <= STACK_SLOTS {
            &mut param_stack[..slots]
        } else {
            param_heap.resize(slots, std::ptr::null_mut());
            &mut param_heap
        };
        for (p, c) in params.iter_mut().zip(cells.iter_mut()) {
            *p = c as *mut u64 as *mut c_void;
        }
        // Not while capturing a graph: a plain launch captures on every driver (a graph's
        // launches leave no host gaps to hide), and `griddepcontrol.wait` is then a no-op.
        if c.overlap_prior && overlaps && self.inner.overlap && !self.memory.capturing() {
            // Programmatic dependent launch: the kernel may start before the previous one
            // ends; it waits for it in `griddepcontrol.wait` (`kernel_dsl::grid`).
            // SAFETY: the attribute value is plain data.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: c.grid.x,
                gridDimY: c.grid.y,
                gridDimZ: c.grid.z,
                blockDimX: c.block.x,
                blockDimY: c.block.y,
                blockDimZ: c.block.z,
                sharedMemBytes: launch.shared_bytes as u32,
                hStream: self.inner.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below; `config` and `attr` outlive the call.
            return unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }.result().map_err(|e| err("cuLaunchKernelEx", e));
        }
        // SAFETY: parameters match the entry's layout (checked at build time against the PTX).
        unsafe {
            result::launch_kernel(
                f,
                (c.grid.x, c.grid.y, c.grid.z),
                (c.block.x, c.block.y, c.block.z),
                launch.shared_bytes as u32,
                self.inner.stream,
                params,
            )
        }
        .map_err(|e| err("cuLaunchKernel", e))
    }
}

/// A captured and instantiated CUDA graph of this device's stream.
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    dev: CudaDevice,
}

// SAFETY: graph handles may be used from any thread of the process (the driver API is
// thread-safe) once the context is current, which `launch` and `drop` make it; the handles
// are destroyed once, by their owner.
unsafe impl Send for CudaGraph {}
// SAFETY: as for `Send`: `&CudaGraph` only launches the executable graph.
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// Queues the graph on the device's stream (`cuGraphLaunch`).
    pub(crate) fn launch(&self) -> Result<(), LaunchError> {
        self.dev.bind()?;
        self.dev.queued();
        // SAFETY: valid executable graph and stream of the bound context.
        unsafe { result::graph::launch(self.exec, self.dev.inner.stream) }.map_err(|e| err("cuGraphLaunch", e))
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // "If the executable graph is in-flight, it will not be terminated, but rather freed
        // asynchronously on completion" (cuGraphExecDestroy): no wait needed.
        // SAFETY: handles created by `end_capture`, destroyed once.
        unsafe {
            let _ = result::ctx::set_current(self.dev.inner.ctx);
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// A recorded CUDA event.
pub struct CudaEvent {
    ev: sys::CUevent,
}

// SAFETY: a CUDA event handle may be used from any thread of the process (the driver API
// is thread-safe); the event is destroyed once, by its owner.
unsafe impl Send for CudaEvent {}
// SAFETY: as for `Send`: `&CudaEvent` only synchronizes on the event and reads its time.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &CudaEvent) -> Result<f32, LaunchError> {
        // SAFETY: both events were recorded.
        unsafe {
            result::event::synchronize(end.ev).map_err(|e| err("cuEventSynchronize", e))?;
            result::event::elapsed(self.ev, end.ev).map_err(|e| err("cuEventElapsedTime", e))
        }
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by `record_event`.
        unsafe {
            let _ = result::event::destroy(self.ev);
        }
    }
}

/// Addresses of the binaries, the symbol text and its length: a loaded function's key.
type FunctionKey = (usize, usize, usize);
