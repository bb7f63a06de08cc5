//! AMD executor: loads the embedded AMDGPU code objects through HIP (`rocm-rs` 0.4.2) and
//! launches kernels on one stream. Building type-checks without ROCm (`SKIP_BINDGEN=1`);
//! linking and running need a ROCm install (`libamdhip64`).
//!
//! The safe `rocm-rs` wrappers are used where they fit: [`Device`](hip::Device) (device
//! count, `hipSetDevice`), [`Stream`], [`Module`] (`hipModuleLoadData`, unloaded on drop),
//! [`Function`] (`hipModuleGetFunction`) and [`Event`]. The raw FFI is used where they
//! don't: `hipGetDevicePropertiesR0600` (the wrapper's `DeviceProperties` has no
//! `gcnArchName`), `hipModuleLaunchKernel` with `extra` (the wrapper only passes
//! `kernelParams`), and memory: the caching allocator owns raw `hipMalloc` blocks (the
//! wrapper's `DeviceMemory` frees on drop), uploads and memsets are `hipMemcpyHtoDAsync` / `hipMemsetD8Async`
//! and device-to-device copies `hipMemcpyAsync`, all on the stream; reads use `hipMemcpy`.
use crate::alloc::{CachingAllocator, RawMemory};
use kernel_dsl::host::{check_memory, EmbeddedKernels, Executor, Launch, LaunchError, MemLocation};
use rocm_rs::hip::{self, bindings, ffi, stream_flags, Event, Function, Module, Stream};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// `HIP_LAUNCH_PARAM_BUFFER_POINTER` (`((void*)0x01)` in `hip_runtime_api.h`): the next
/// `extra` entry points at the packed kernel-argument buffer. The HIP headers define the
/// three markers as pointer-cast macros, which bindgen does not translate, so rocm-rs 0.4.2
/// has no binding for them.
const HIP_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// `HIP_LAUNCH_PARAM_BUFFER_SIZE` (`((void*)0x02)`): the next entry points at a `size_t`
/// holding the buffer's size in bytes.
const HIP_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
/// `HIP_LAUNCH_PARAM_END` (`((void*)0x03)`): ends the `extra` array.
const HIP_LAUNCH_PARAM_END: usize = 0x03;

fn err(call: &'static str, e: hip::Error) -> LaunchError {
    LaunchError::Backend { backend: "rocm", call, message: e.to_string() }
}

/// Turns a raw `hipError_t` into a result.
fn check(call: &'static str, code: ffi::hipError_t) -> Result<(), LaunchError> {
    if code == ffi::hipError_t_hipSuccess {
        Ok(())
    } else {
        Err(err(call, hip::Error::new(code)))
    }
}

/// Locks a cache; a panic elsewhere cannot leave a half-inserted entry, so poison is ignored.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A NUL-terminated `char[N]` field of `hipDeviceProp_t`, read without running past its end.
fn c_chars(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One HIP device with a stream. Cheap to clone (clones share the device).
#[derive(Clone)]
pub struct RocmDevice {
    inner: Arc<Inner>,
    memory: Arc<CachingAllocator>,
    shared: Arc<crate::shared::SharedUploads>,
}

/// The device's memory as the caching allocator sees it (`hipMalloc` / `hipFree`).
struct RocmMemory(Arc<Inner>);

impl RawMemory for RocmMemory {
    fn alloc(&self, bytes: usize) -> Result<u64, LaunchError> {
        self.0.device.set_current().map_err(|e| err("hipSetDevice", e))?;
        // `hipMalloc` is a "potentially unsafe" call during a thread-local stream capture;
        // the caching allocator makes it safe (the block joins the graph's pool), so the
        // thread switches to the relaxed mode around it and back.
        let mut mode: bindings::hipStreamCaptureMode = bindings::hipStreamCaptureMode_hipStreamCaptureModeRelaxed;
        // SAFETY: `mode` is a valid in/out value.
        check("hipThreadExchangeStreamCaptureMode", unsafe { bindings::hipThreadExchangeStreamCaptureMode(&mut mode) })?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; `bytes` > 0.
        let allocated = check("hipMalloc", unsafe { ffi::hipMalloc(&mut p, bytes) });
        // SAFETY: as above; restores the thread's previous mode.
        let restored = check("hipThreadExchangeStreamCaptureMode", unsafe { bindings::hipThreadExchangeStreamCaptureMode(&mut mode) });
        allocated?;
        if let Err(e) = restored {
            // SAFETY: `p` came from `hipMalloc` just above and was never handed out.
            let _ = unsafe { ffi::hipFree(p) };
            return Err(e);
        }
        Ok(p as usize as u64)
    }
    unsafe fn free(&self, addr: u64, _bytes: usize) {
        let _ = self.0.device.set_current();
        // SAFETY: the caller's contract: `addr` came from `hipMalloc`, queued work finished.
        let _ = unsafe { ffi::hipFree(addr as usize as *mut c_void) };
    }
    fn wait_idle(&self) {
        let _ = self.0.device.set_current();
        let _ = self.0.stream.synchronize();
    }
}

/// A loaded code object, with the aligned copy of its ELF bytes when one was needed.
struct LoadedModule {
    /// Declared first so that it is unloaded (`hipModuleUnload`) before `_image` is freed.
    module: Module,
    _image: Option<Vec<u64>>,
}

struct Inner {
    ordinal: usize,
    device: hip::Device,
    name: String,
    /// Full `gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`.
    arch: String,
    /// `multiProcessorCount`: compute units.
    cus: u32,
    stream: Stream,
    modules: Mutex<HashMap<usize, LoadedModule>>,
    functions: Mutex<HashMap<(usize, &'static str), Function>>,
}

// SAFETY: HIP handles (stream, modules, functions) are process-wide objects and the HIP
// runtime API is thread-safe. The only per-thread state is the current device, and every
// entry point calls `hipSetDevice` (`bind`) before using a handle. The caches are behind
// mutexes; `Function` is a plain handle without drop glue, valid while its module is loaded.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`: shared use goes through `&self` methods that bind the device first.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the handles are released regardless.
        let _ = self.device.set_current();
        let _ = self.stream.synchronize();
        lock(&self.functions).clear();
        // `Module::drop` calls `hipModuleUnload`; `Stream::drop` (a field) `hipStreamDestroy`.
        lock(&self.modules).clear();
    }
}

// Compile-time check that the public types can be shared across threads.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RocmDevice>();
    send_sync::<RocmEvent>();
    send_sync::<RocmGraph>();
};

impl RocmDevice {
    /// Opens device `ordinal`. Without the HIP runtime or an AMD GPU this is a
    /// [`LaunchError::NoDevice`] with the reason.
    pub fn new(ordinal: usize) -> Result<Self, LaunchError> {
        // Both calls report `hipErrorNoDevice` on a machine without an AMD GPU.
        let no_device = |call: &str, e: hip::Error| {
            if e.code() == bindings::hipError_t_hipErrorNoDevice {
                LaunchError::NoDevice(format!("no AMD GPU: {call} reported {e}"))
            } else {
                LaunchError::NoDevice(format!("the HIP runtime could not be initialised: {call} failed: {e}"))
            }
        };
        hip::init().map_err(|e| no_device("hipInit", e))?;
        let count = hip::get_device_count().map_err(|e| no_device("hipGetDeviceCount", e))?;
        if count <= 0 {
            return Err(LaunchError::NoDevice(format!("no AMD GPU: hipGetDeviceCount returned {count}")));
        }
        let id = i32::try_from(ordinal)
            .ok()
            .filter(|&id| id < count)
            .ok_or_else(|| LaunchError::NoDevice(format!("HIP device {ordinal} requested, {count} present")))?;
        let device = hip::Device::new(id).map_err(|e| err("hipGetDeviceCount", e))?;
        device.set_current().map_err(|e| err("hipSetDevice", e))?;

        // SAFETY: `hipDeviceProp_tR0600` is plain C data for which all-zero bytes are valid;
        // `hipGetDevicePropertiesR0600` fills it for a device id checked above.
        let mut props: ffi::hipDeviceProp_tR0600 = unsafe { std::mem::zeroed() };
        // SAFETY: `props` is a live, writable `hipDeviceProp_tR0600`.
        check("hipGetDeviceProperties", unsafe { ffi::hipGetDevicePropertiesR0600(&mut props, id) })?;
        let name = c_chars(&props.name);
        let arch = c_chars(&props.gcnArchName);
        if arch.is_empty() {
            return Err(LaunchError::Backend {
                backend: "rocm",
                call: "hipGetDeviceProperties",
                message: format!("device {ordinal} ({name}) reports no gcnArchName"),
            });
        }

        // Launches, memsets, uploads and device copies are all queued on this stream; only
        // reads (`hipMemcpy` device-to-host on the NULL stream, after a stream synchronize)
        // wait. Non-blocking: no implicit ordering with the NULL stream, which nothing here
        // relies on (reads wait for this stream explicitly); a blocking stream would make
        // NULL-stream calls elsewhere in the process fail while this stream captures a
        // graph. Created on the current device, set above.
        let stream = device.get_stream_with_flags(stream_flags::NON_BLOCKING).map_err(|e| err("hipStreamCreateWithFlags", e))?;
        let inner = Arc::new(Inner {
            ordinal,
            device,
            name,
            arch,
            cus: props.multiProcessorCount.max(1) as u32,
            stream,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        });
        Ok(RocmDevice { memory: CachingAllocator::new(Box::new(RocmMemory(inner.clone()))), shared: Default::default(), inner })
    }

    /// Device name, e.g. `AMD Instinct MI250X`.
    pub fn device_name(&self) -> &str {
        &self.inner.name
    }

    /// The device's `gcnArchName` with its target features, e.g. `gfx90a:sramecc+:xnack-`.
    pub fn arch(&self) -> &str {
        &self.inner.arch
    }

    /// The architecture without target features (`gfx90a`), as code objects are keyed.
    fn base_arch(&self) -> &str {
        self.inner.arch.split(':').next().unwrap_or(&self.inner.arch)
    }

    fn bind(&self) -> Result<(), LaunchError> {
        self.inner.device.set_current().map_err(|e| err("hipSetDevice", e))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// Makes this device current on the calling thread (`hipSetDevice`), as every method
    /// here does first; for libraries (rocBLAS, MIOpen) called directly on its memory.
    pub fn bind_device(&self) -> Result<(), LaunchError> {
        self.bind()
    }

    /// The stream all launches and device copies of this device are queued on. Work a
    /// library queues on it stays ordered with the kernels; it lives as long as this device
    /// (or a clone). Buffer addresses are the kernel arguments' `addr`s.
    pub fn stream(&self) -> &Stream {
        &self.inner.stream
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
        self.inner.stream.synchronize().map_err(|e| err("hipStreamSynchronize", e))
    }

    /// Zeroes `bytes` bytes at `addr`, queued on the stream (`hipMemsetD8Async`): the host
    /// does not wait, kernels queued later see zeros, kernels queued earlier do not.
    pub(crate) fn memset_zero(&self, addr: u64, bytes: usize) -> Result<(), LaunchError> {
        self.bind()?;
        // SAFETY: `addr` is a live block of at least `bytes` bytes of this device, kept alive
        // for the queued memset by the stream-ordered caching allocator.
        check("hipMemsetD8Async", unsafe { bindings::hipMemsetD8Async(addr as usize as bindings::hipDeviceptr_t, 0, bytes, self.inner.stream.as_raw()) })
    }

    /// Host-to-device copy of `data` to `addr`, queued on the stream after the work queued
    /// before it (`hipMemcpyHtoDAsync`); `data` may be reused or freed once this returns.
    ///
    /// `hipMemcpy` runs on the NULL stream, not ordered with this (non-blocking) stream:
    /// it would need a wait for all queued work on every layout upload of an op. The HIP API reference
    /// (`hip_runtime_api.h`, `hipMemcpyAsync`) warns: "If host or dest are not pinned, the
    /// memory copy will be performed synchronously": from pageable memory the call consumes
    /// `data` before returning (at worst after the stream's earlier work), so `data` may be
    /// freed afterwards. Not run here (no AMD GPU): `kernels/tests/runtime.rs` checks the
    /// ordering and the reuse of the source on a GPU.
    pub(crate) fn write_raw<T: Copy>(&self, addr: u64, data: &[T]) -> Result<(), LaunchError> {
        crate::graph::refuse_in_capture(&self.memory, "write", crate::graph::NO_UPLOAD)?;
        self.bind()?;
        // SAFETY: `addr` is a live range of `size_of_val(data)` bytes of this device, kept
        // alive by the stream-ordered caching allocator; HIP only reads through the source
        // pointer (the binding's `*mut` is a C signature artefact).
        check("hipMemcpyHtoDAsync", unsafe {
            bindings::hipMemcpyHtoDAsync(
                addr as usize as bindings::hipDeviceptr_t,
                data.as_ptr().cast_mut().cast::<c_void>(),
                std::mem::size_of_val(data),
                self.inner.stream.as_raw(),
            )
        })
    }

    /// Device-to-host copy from `addr` into `out` (waits for queued work first).
    pub(crate) fn read_raw<T: Copy>(&self, addr: u64, out: &mut [std::mem::MaybeUninit<T>]) -> Result<(), LaunchError> {
        self.synchronize()?;
        // SAFETY: `addr` holds `out.len()` elements; `hipMemcpy` device-to-host is
        // synchronous and writes every byte of `out`.
        check("hipMemcpy", unsafe {
            ffi::hipMemcpy(out.as_mut_ptr().cast::<c_void>(), addr as usize as *const c_void, std::mem::size_of_val(out), ffi::hipMemcpyKind_hipMemcpyDeviceToHost)
        })
    }

    /// Device-to-device copy of `bytes` bytes, queued on the stream.
    pub(crate) fn copy_raw(&self, src: u64, dst: u64, bytes: usize) -> Result<(), LaunchError> {
        self.bind()?;
        // SAFETY: both are live ranges of `bytes` bytes of this device, kept alive for the
        // queued copy by the stream-ordered caching allocator.
        check("hipMemcpyAsync", unsafe {
            ffi::hipMemcpyAsync(dst as usize as *mut c_void, src as usize as *const c_void, bytes, ffi::hipMemcpyKind_hipMemcpyDeviceToDevice, self.inner.stream.as_raw())
        })
    }

    /// Records an event on the stream (for timing).
    pub fn record_event(&self) -> Result<RocmEvent, LaunchError> {
        crate::graph::refuse_in_capture(&self.memory, "record_event", crate::graph::NO_WAIT)?;
        self.bind()?;
        // `hipEventCreate` (timing enabled), then `hipEventRecord` on the stream.
        let ev = Event::new().map_err(|e| err("hipEventCreate", e))?;
        ev.record(&self.inner.stream).map_err(|e| err("hipEventRecord", e))?;
        Ok(RocmEvent { ev })
    }

    /// Starts capturing the stream into a graph (`hipStreamBeginCapture`, thread-local
    /// mode). Called by [`Device::capture`](crate::Device::capture), which routes
    /// allocations to the graph's pool.
    pub(crate) fn begin_capture(&self) -> Result<(), LaunchError> {
        self.bind()?;
        // SAFETY: valid stream of the bound device.
        check("hipStreamBeginCapture", unsafe {
            bindings::hipStreamBeginCapture(self.inner.stream.as_raw(), bindings::hipStreamCaptureMode_hipStreamCaptureModeThreadLocal)
        })
    }

    /// Ends the capture (`hipStreamEndCapture`) and instantiates the graph
    /// (`hipGraphInstantiate`).
    pub(crate) fn end_capture(&self) -> Result<RocmGraph, LaunchError> {
        self.bind()?;
        let mut graph: bindings::hipGraph_t = ptr::null_mut();
        // SAFETY: valid stream, capturing since `begin_capture`; `graph` is a valid out-pointer.
        check("hipStreamEndCapture", unsafe { bindings::hipStreamEndCapture(self.inner.stream.as_raw(), &mut graph) })?;
        if graph.is_null() {
            return Err(LaunchError::Capture { op: "capture", reason: "hipStreamEndCapture returned no graph".into() });
        }
        let mut exec: bindings::hipGraphExec_t = ptr::null_mut();
        // SAFETY: `graph` is the valid graph just captured; no error node or log requested.
        let made = check("hipGraphInstantiate", unsafe { bindings::hipGraphInstantiate(&mut exec, graph, ptr::null_mut(), ptr::null_mut(), 0) });
        if let Err(e) = made {
            // SAFETY: `graph` is ours and not used afterwards.
            let _ = unsafe { bindings::hipGraphDestroy(graph) };
            return Err(e);
        }
        Ok(RocmGraph { graph, exec, dev: self.clone() })
    }

    /// Loads the code object of `binaries` for this device's architecture
    /// (`hipModuleLoadData`). The device must be bound.
    fn load_module(&self, binaries: &'static EmbeddedKernels) -> Result<LoadedModule, LaunchError> {
        let code = binaries
            .code_object(&self.inner.arch)
            .ok_or_else(|| LaunchError::ArchNotBuilt { arch: self.base_arch().to_string(), built: binaries.archs() })?;
        // ELF readers may read headers in place; `include_bytes!` data has no alignment
        // guarantee, so hand over 8-byte-aligned storage when needed and keep it as long as
        // the module.
        if code.bytes.as_ptr().align_offset(8) == 0 {
            let module = Module::load_data(code.bytes).map_err(|e| err("hipModuleLoadData", e))?;
            return Ok(LoadedModule { module, _image: None });
        }
        let mut words = vec![0u64; code.bytes.len().div_ceil(8)];
        // SAFETY: `words` has at least `code.bytes.len()` bytes; the regions are distinct
        // allocations.
        unsafe { ptr::copy_nonoverlapping(code.bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), code.bytes.len()) };
        // SAFETY: the first `code.bytes.len()` bytes of `words` are initialised (copied above).
        let image = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), code.bytes.len()) };
        let module = Module::load_data(image).map_err(|e| err("hipModuleLoadData", e))?;
        Ok(LoadedModule { module, _image: Some(words) })
    }

    /// The kernel `symbol` of `binaries` on this device: loads the code object for the
    /// device's architecture once per `binaries`, looks the symbol up once. The device must
    /// be bound.
    fn function(&self, binaries: &'static EmbeddedKernels, symbol: &'static str) -> Result<ffi::hipFunction_t, LaunchError> {
        let key = (binaries as *const EmbeddedKernels as usize, symbol);
        if let Some(f) = lock(&self.inner.functions).get(&key) {
            return Ok(f.as_raw());
        }
        let f = {
            let mut modules = lock(&self.inner.modules);
            let loaded = match modules.entry(key.0) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => v.insert(self.load_module(binaries)?),
            };
            // `hipModuleGetFunction`; the handle is valid while the module stays loaded,
            // which is until `Inner` drops.
            loaded.module.get_function(symbol).map_err(|e| err("hipModuleGetFunction", e))?
        };
        let raw = f.as_raw();
        lock(&self.inner.functions).insert(key, f);
        Ok(raw)
    }
}

impl Executor for RocmDevice {
    fn name(&self) -> String {
        format!("rocm:{} ({}, {})", self.inner.ordinal, self.inner.name, self.inner.arch)
    }

    fn memory(&self) -> MemLocation {
        MemLocation::Device { backend: "rocm", ordinal: self.inner.ordinal }
    }

    fn wave_lanes(&self) -> u32 {
        if self.inner.arch.starts_with("gfx9") { 64 } else { 32 }
    }

    fn compute_units(&self) -> Option<u32> {
        Some(self.inner.cus)
    }

    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError> {
        launch.config.validate()?;
        check_memory(self, launch)?;
        let c = launch.config;
        if c.grid.volume() == 0 {
            return Ok(());
        }
        let shared_bytes = u32::try_from(launch.shared_bytes).map_err(|_| {
            LaunchError::InvalidConfig(format!("{} bytes of shared memory exceed u32", launch.shared_bytes))
        })?;
        self.bind()?;
        let f = self.function(launch.binaries, launch.kernel.symbol)?;

        // The kernel-argument segment exactly as the code object's metadata lays it out
        // (checked at build time), in 8-byte-aligned storage. HIP copies each explicit
        // parameter from its metadata offset and fills the hidden arguments itself, so the
        // size handed over ends at the last explicit slot: recent HIP runtimes skip
        // parameters lying past BUFFER_SIZE and reject a non-zero size for a kernel
        // without parameters.
        let packed = launch.kernel.pack(launch.args);
        let explicit_end = launch.kernel.abi.iter().map(|s| (s.offset + s.size) as usize).max().unwrap_or(0);
        let mut segment_size: usize = explicit_end.min(packed.len());
        let mut segment = vec![0u64; segment_size.div_ceil(8).max(1)];
        // SAFETY: `segment` has at least `segment_size <= packed.len()` bytes; distinct
        // allocations.
        unsafe { ptr::copy_nonoverlapping(packed.as_ptr(), segment.as_mut_ptr().cast::<u8>(), segment_size) };
        let mut extra: [*mut c_void; 5] = [
            ptr::without_provenance_mut(HIP_LAUNCH_PARAM_BUFFER_POINTER),
            segment.as_mut_ptr().cast::<c_void>(),
            ptr::without_provenance_mut(HIP_LAUNCH_PARAM_BUFFER_SIZE),
            ptr::from_mut(&mut segment_size).cast::<c_void>(),
            ptr::without_provenance_mut(HIP_LAUNCH_PARAM_END),
        ];
        // SAFETY: `f` is a function of a module loaded on this (bound) device; `extra` is the
        // { BUFFER_POINTER, buf, BUFFER_SIZE, &size, END } array HIP expects, with `buf`
        // holding `segment_size` bytes laid out as the kernel's metadata requires; HIP copies
        // the arguments before returning, so the locals may go away afterwards. Slices live
        // in this device's memory (`check_memory`) and stay alive until the kernel has run
        // because the caching allocator reuses memory in stream order.
        check("hipModuleLaunchKernel", unsafe {
            ffi::hipModuleLaunchKernel(
                f,
                c.grid.x,
                c.grid.y,
                c.grid.z,
                c.block.x,
                c.block.y,
                c.block.z,
                shared_bytes,
                self.inner.stream.as_raw(),
                ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })
    }
}

/// A captured and instantiated HIP graph of this device's stream.
pub struct RocmGraph {
    graph: bindings::hipGraph_t,
    exec: bindings::hipGraphExec_t,
    dev: RocmDevice,
}

// SAFETY: HIP graph handles are process-wide objects and the HIP runtime API is
// thread-safe; `launch` and `drop` bind the device first. Destroyed once, by the owner.
unsafe impl Send for RocmGraph {}
// SAFETY: as for `Send`: `&RocmGraph` only launches the executable graph.
unsafe impl Sync for RocmGraph {}

impl RocmGraph {
    /// Queues the graph on the device's stream (`hipGraphLaunch`).
    pub(crate) fn launch(&self) -> Result<(), LaunchError> {
        self.dev.bind()?;
        // SAFETY: valid executable graph and stream of the bound device.
        check("hipGraphLaunch", unsafe { bindings::hipGraphLaunch(self.exec, self.dev.inner.stream.as_raw()) })
    }
}

impl Drop for RocmGraph {
    fn drop(&mut self) {
        // HIP does not document destroying an executable graph still in flight: wait for
        // the stream first (errors cannot be reported from drop), unless another graph is
        // being captured on it (a wait would break that capture).
        let _ = self.dev.inner.device.set_current();
        if !self.dev.memory.capturing() {
            let _ = self.dev.inner.stream.synchronize();
        }
        // SAFETY: handles created by `end_capture`, destroyed once, after their last use.
        unsafe {
            let _ = bindings::hipGraphExecDestroy(self.exec);
            let _ = bindings::hipGraphDestroy(self.graph);
        }
    }
}

/// A recorded HIP event.
pub struct RocmEvent {
    ev: Event,
}

impl RocmEvent {
    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &RocmEvent) -> Result<f32, LaunchError> {
        end.ev.synchronize().map_err(|e| err("hipEventSynchronize", e))?;
        self.ev.elapsed_time(&end.ev).map_err(|e| err("hipEventElapsedTime", e))
    }
}
