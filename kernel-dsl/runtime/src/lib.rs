//! Devices and buffers for kernels written with `kernel-dsl`: the CPU executor, an NVIDIA
//! GPU (`cuda` feature, PTX through the driver API) or an AMD GPU (`rocm` feature, code
//! objects through HIP). The same typed launchers work with all of them: pass a [`Device`]
//! as the executor and [`DeviceVec`]s, or views of them, as buffers.
//!
//! What a framework backend needs is here too: every buffer comes from a per-device
//! caching allocator ([`Device::memory_stats`], [`Device::empty_cache`]); a buffer's
//! [`view`](DeviceVec::view) passes a sub-range to a kernel without a copy;
//! [`Device::copy`] copies between views on the device; [`Device::scratch`] gives the
//! temporary buffers of multi-pass kernels; [`Device::capture`] and [`StepGraph`] record
//! a step once and replay it as one graph launch on a GPU ([`graph`]).
//!
//! ```
//! use kernel_runtime::Device;
//!
//! let dev = Device::best();
//! let x = dev.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
//! let mut y = dev.alloc::<f32>(2).unwrap();
//! dev.copy(x.view(1..3).unwrap(), y.view_mut(..).unwrap()).unwrap();
//! assert_eq!(dev.download(&y).unwrap(), vec![2.0, 3.0]);
//! ```
mod alloc;
pub mod graph;
mod shared;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "rocm")]
pub mod rocm;

pub use alloc::{size_class, CachingAllocator, MemoryStats};
pub use graph::{Graph, StepGraph};
pub use kernel_dsl::host::{CpuExecutor, LaunchError, WaveSize};

use alloc::{Block, HostMemory};
use kernel_dsl::host::{ArgValue, Executor, KernelArgSlice, KernelArgSliceMut, Launch, MemLocation};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The CPU executor with its memory.
#[derive(Clone)]
pub struct CpuDevice {
    exec: CpuExecutor,
    memory: Arc<CachingAllocator>,
    shared: Arc<shared::SharedUploads>,
    id: u64,
}

impl CpuDevice {
    /// The executor that runs the kernels.
    pub fn executor(&self) -> &CpuExecutor {
        &self.exec
    }
}

/// Where kernels run. Cheap to clone: clones share the device, its queue and its memory.
#[derive(Clone)]
pub enum Device {
    /// The CPU executor.
    Cpu(CpuDevice),
    /// An NVIDIA GPU (PTX).
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaDevice),
    /// An AMD GPU (code objects through HIP).
    #[cfg(feature = "rocm")]
    Rocm(rocm::RocmDevice),
}

/// Distinguishes CPU executor devices (GPU devices are told apart by ordinal).
static NEXT_CPU_ID: AtomicU64 = AtomicU64::new(0);

/// Whether a launch queued when `queued` operations have been queued may read the bytes
/// `reads` before its wait for the launch before it: the launch `marked` (`queued` right
/// after it, and the bytes `[start, end)` it writes) is the last operation queued and
/// writes none of them.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn reads_miss_marked(marked: Option<(u64, u64, u64)>, queued: u64, reads: std::ops::Range<u64>) -> bool {
    match marked {
        Some((at, start, end)) => at == queued && (reads.end <= start || end <= reads.start || reads.is_empty()),
        None => false,
    }
}

fn bad(op: &'static str, reason: String) -> LaunchError {
    LaunchError::InvalidArgument { kernel: op, reason }
}

fn byte_len<T>(op: &'static str, len: usize) -> Result<usize, LaunchError> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| bad(op, format!("{len} elements of {} bytes overflow usize", std::mem::size_of::<T>())))
}

impl Device {
    /// The CPU executor with waves of `wave` lanes.
    pub fn cpu(wave: WaveSize) -> Device {
        Self::cpu_with(CpuExecutor::new(wave))
    }

    /// A device over a configured CPU executor.
    pub fn cpu_with(exec: CpuExecutor) -> Device {
        Device::Cpu(CpuDevice {
            exec,
            memory: CachingAllocator::new(Box::new(HostMemory)),
            shared: Default::default(),
            id: NEXT_CPU_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// CUDA device `ordinal`; an error without the `cuda` feature, driver or GPU.
    pub fn cuda(ordinal: usize) -> Result<Device, LaunchError> {
        #[cfg(feature = "cuda")]
        {
            cuda::CudaDevice::new(ordinal).map(Device::Cuda)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err(LaunchError::NoDevice("built without the `cuda` feature (cargo ... --features cuda)".into()))
        }
    }

    /// HIP device `ordinal`; an error without the `rocm` feature, ROCm runtime or GPU.
    pub fn rocm(ordinal: usize) -> Result<Device, LaunchError> {
        #[cfg(feature = "rocm")]
        {
            rocm::RocmDevice::new(ordinal).map(Device::Rocm)
        }
        #[cfg(not(feature = "rocm"))]
        {
            let _ = ordinal;
            Err(LaunchError::NoDevice("built without the `rocm` feature (cargo ... --features rocm)".into()))
        }
    }

    /// The best available: an AMD GPU, else an NVIDIA GPU, else the CPU executor (wave 64).
    pub fn best() -> Device {
        Self::rocm(0).or_else(|_| Self::cuda(0)).unwrap_or_else(|_| Self::cpu(WaveSize::W64))
    }

    /// `true` for a GPU.
    pub fn is_gpu(&self) -> bool {
        !matches!(self, Device::Cpu(_))
    }

    /// `true` when `self` and `other` are the same device (clones of one handle, or the
    /// same GPU ordinal of the same backend).
    pub fn same_device(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu(a), Device::Cpu(b)) => a.id == b.id,
            #[allow(unreachable_patterns)]
            _ => self.memory() == other.memory() && self.is_gpu(),
        }
    }

    /// Lanes per wave on this device: the CPU executor's setting, 32 on NVIDIA, 64 on
    /// CDNA (gfx9) and 32 on RDNA AMD GPUs. Launch shapes that give each wave its own work
    /// use it.
    pub fn wave_lanes(&self) -> u32 {
        match self {
            Device::Cpu(c) => c.exec.wave_lanes(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.wave_lanes(),
            #[cfg(feature = "rocm")]
            Device::Rocm(r) => r.wave_lanes(),
        }
    }

    pub(crate) fn allocator(&self) -> &Arc<CachingAllocator> {
        match self {
            Device::Cpu(c) => &c.memory,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.allocator(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.allocator(),
        }
    }

    /// A buffer of `len` elements whose contents are unspecified (a reused block keeps old
    /// data): for outputs a kernel writes in full.
    pub fn alloc_uninit<T: Copy>(&self, len: usize) -> Result<DeviceVec<T>, LaunchError> {
        let block = self.allocator().allocate(byte_len::<T>("alloc", len)?)?;
        Ok(DeviceVec { block, len, location: self.memory(), _t: PhantomData })
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc<T: Copy>(&self, len: usize) -> Result<DeviceVec<T>, LaunchError> {
        let v = self.alloc_uninit::<T>(len)?;
        let bytes = len * std::mem::size_of::<T>();
        if bytes > 0 {
            match self {
                // SAFETY: the block holds at least `bytes` bytes of host memory.
                Device::Cpu(_) => unsafe { std::ptr::write_bytes(v.block.addr as usize as *mut u8, 0, bytes) },
                #[cfg(feature = "cuda")]
                Device::Cuda(d) => d.memset_zero(v.block.addr, bytes)?,
                #[cfg(feature = "rocm")]
                Device::Rocm(d) => d.memset_zero(v.block.addr, bytes)?,
            }
        }
        Ok(v)
    }

    /// A temporary buffer for a multi-pass kernel (partial results of split rows, ...):
    /// [`alloc_uninit`](Device::alloc_uninit) from the cache, so repeated launches reuse
    /// one block. Drop it after queueing the last kernel that uses it.
    pub fn scratch<T: Copy>(&self, len: usize) -> Result<DeviceVec<T>, LaunchError> {
        self.alloc_uninit(len)
    }

    /// Copies `data` to a new buffer. Refused during a graph capture ([`graph`]).
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DeviceVec<T>, LaunchError> {
        self.refuse_in_capture("upload", graph::NO_UPLOAD)?;
        let mut v = self.alloc_uninit::<T>(data.len())?;
        self.write(v.view_mut(..)?, data)?;
        Ok(v)
    }

    /// A read-only device copy of `data` (a layout, launch geometry), shared with every
    /// other call on this device (and its clones) with the same contents: the first call
    /// uploads, later ones return the same buffer. Bounded: the cache starts over after a
    /// few thousand distinct arrays. During a graph capture only arrays already cached are
    /// served (the graph keeps them alive): run the step once before capturing it.
    pub fn upload_shared(&self, data: &[usize]) -> Result<Arc<DeviceVec<usize>>, LaunchError> {
        let cache = self.shared_uploads();
        if let Some(v) = cache.get(data) {
            return Ok(v);
        }
        self.refuse_in_capture(
            "upload_shared",
            "this layout array was not uploaded before the capture (a host copy cannot be recorded); run the step once eagerly before capturing it",
        )?;
        let v = Arc::new(self.upload(data)?);
        cache.insert(data, v.clone());
        Ok(v)
    }

    /// Distinct arrays held by [`Device::upload_shared`]'s cache.
    pub fn shared_uploads_len(&self) -> usize {
        self.shared_uploads().len()
    }

    pub(crate) fn shared_uploads(&self) -> &shared::SharedUploads {
        match self {
            Device::Cpu(c) => &c.shared,
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.shared_uploads(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.shared_uploads(),
        }
    }

    /// Copies `data` into `dst` (same length), after the work queued before it. Refused
    /// during a graph capture ([`graph`]): write a step's inputs before replaying it.
    pub fn write<T: Copy>(&self, dst: DeviceViewMut<'_, T>, data: &[T]) -> Result<(), LaunchError> {
        self.refuse_in_capture("write", graph::NO_UPLOAD)?;
        self.check_here("write", dst.location)?;
        if dst.len != data.len() {
            return Err(bad("write", format!("{} elements into a view of {}", data.len(), dst.len)));
        }
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            return Ok(());
        }
        match self {
            // SAFETY: `dst` is a live view of `bytes` bytes of host memory, `data` another allocation.
            Device::Cpu(_) => unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), dst.addr as usize as *mut u8, bytes) },
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.write_raw(dst.addr, data)?,
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.write_raw(dst.addr, data)?,
        }
        Ok(())
    }

    /// Copies a buffer back to the host (after the work queued before it).
    pub fn download<T: Copy>(&self, v: &DeviceVec<T>) -> Result<Vec<T>, LaunchError> {
        self.read(v.view(..)?)
    }

    /// Copies a view back to the host (after the work queued before it). Refused during a
    /// graph capture.
    pub fn read<T: Copy>(&self, src: DeviceView<'_, T>) -> Result<Vec<T>, LaunchError> {
        self.refuse_in_capture("download", graph::NO_WAIT)?;
        self.check_here("download", src.location)?;
        let mut out = Vec::<T>::with_capacity(src.len);
        let bytes = src.len * std::mem::size_of::<T>();
        if bytes > 0 {
            match self {
                // SAFETY: `src` is a live view of `bytes` bytes of host memory; `out` has room.
                Device::Cpu(_) => unsafe { std::ptr::copy_nonoverlapping(src.addr as usize as *const u8, out.as_mut_ptr().cast::<u8>(), bytes) },
                #[cfg(feature = "cuda")]
                Device::Cuda(d) => d.read_raw(src.addr, out.spare_capacity_mut())?,
                #[cfg(feature = "rocm")]
                Device::Rocm(d) => d.read_raw(src.addr, out.spare_capacity_mut())?,
            }
        }
        // SAFETY: all `len` elements were written above (or `T` has no bytes / len is 0).
        unsafe { out.set_len(src.len) };
        Ok(out)
    }

    /// Device-to-device copy between views of equal length (queued; the views may belong
    /// to one buffer, overlapping ranges copy as if through a temporary only on the CPU).
    pub fn copy<T: Copy>(&self, src: DeviceView<'_, T>, dst: DeviceViewMut<'_, T>) -> Result<(), LaunchError> {
        if self.is_capturing() {
            self.allocator().check_capture_thread("copy")?;
            self.allocator().record_use(src.addr);
            self.allocator().record_use(dst.addr);
        }
        self.check_here("copy", src.location)?;
        self.check_here("copy", dst.location)?;
        if src.len != dst.len {
            return Err(bad("copy", format!("source has {} elements, destination {}", src.len, dst.len)));
        }
        let bytes = src.len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        match self {
            // SAFETY: both views are live host ranges of `bytes` bytes; `copy` allows overlap.
            Device::Cpu(_) => unsafe { std::ptr::copy(src.addr as usize as *const u8, dst.addr as usize as *mut u8, bytes) },
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.copy_raw(src.addr, dst.addr, bytes)?,
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.copy_raw(src.addr, dst.addr, bytes)?,
        }
        Ok(())
    }

    fn check_here(&self, op: &'static str, loc: MemLocation) -> Result<(), LaunchError> {
        if loc == self.memory() {
            Ok(())
        } else {
            Err(bad(op, format!("buffer lives in {loc:?}, this device is {}", self.name())))
        }
    }

    /// Allocation figures of this device's caching allocator.
    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator().stats()
    }

    /// Returns the cached (free) blocks to the backend, after dropping the arrays kept by
    /// [`Device::upload_shared`]. Does nothing during a graph capture (it would wait for
    /// the device); blocks kept by graphs stay until the graphs drop.
    pub fn empty_cache(&self) {
        if self.is_capturing() {
            return;
        }
        self.shared_uploads().clear();
        self.allocator().empty_cache()
    }

    /// Waits for queued work. Refused during a graph capture.
    pub fn synchronize(&self) -> Result<(), LaunchError> {
        self.refuse_in_capture("synchronize", graph::NO_WAIT)?;
        match self {
            Device::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.synchronize(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.synchronize(),
        }
    }
}

/// A point on a device's queue, for timing work between two of them
/// ([`Device::record_event`]).
pub enum DeviceEvent {
    /// The CPU executor runs each launch before returning: the host clock.
    Cpu(std::time::Instant),
    /// A CUDA event recorded on the device's stream.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaEvent),
    /// A HIP event recorded on the device's stream.
    #[cfg(feature = "rocm")]
    Rocm(rocm::RocmEvent),
}

impl DeviceEvent {
    /// Milliseconds of queue time from `self` to `end` (waits for `end` on a GPU). An error
    /// when the two events come from different kinds of device.
    pub fn elapsed_ms(&self, end: &DeviceEvent) -> Result<f64, LaunchError> {
        match (self, end) {
            (DeviceEvent::Cpu(a), DeviceEvent::Cpu(b)) => Ok(b.saturating_duration_since(*a).as_secs_f64() * 1e3),
            #[cfg(feature = "cuda")]
            (DeviceEvent::Cuda(a), DeviceEvent::Cuda(b)) => a.elapsed_ms(b).map(f64::from),
            #[cfg(feature = "rocm")]
            (DeviceEvent::Rocm(a), DeviceEvent::Rocm(b)) => a.elapsed_ms(b).map(f64::from),
            #[allow(unreachable_patterns)]
            _ => Err(bad("elapsed_ms", "events of different devices".into())),
        }
    }
}

impl Device {
    /// Records that the launch queued last on this device writes nothing outside the bytes
    /// `writes` (the arguments' `addr`s) and releases the kernel after it only after its
    /// own wait for the kernel before it (`kernel_dsl::grid`). A no-op off CUDA.
    pub fn mark_overlappable(&self, writes: std::ops::Range<u64>) {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(d) = self {
            d.mark_overlappable(writes);
        }
        #[cfg(not(feature = "cuda"))]
        let _ = writes;
    }

    /// Whether a kernel queued next may read the bytes `reads` before its wait for the
    /// kernel before it: the last operation queued on the device is a launch
    /// [`Device::mark_overlappable`] marked, and it writes none of them. Always `false` off
    /// CUDA (no other runtime overlaps launches).
    pub fn may_read_during_prior(&self, reads: std::ops::Range<u64>) -> bool {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.may_read_during_prior(reads),
            _ => {
                let _ = reads;
                false
            }
        }
    }

    /// Operations queued on this device's stream so far (CUDA; `None` elsewhere): equal at
    /// two points when nothing was queued between them.
    pub fn queued_ops(&self) -> Option<u64> {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Some(d.queued_ops()),
            _ => None,
        }
    }

    /// Runs `f` on this device's value of type `T` (`T::default()` at first use, kept as
    /// long as the device): state an op keeps between its launches. CUDA only (`None`
    /// elsewhere, and `f` does not run).
    pub fn with_state<T: std::any::Any + Send + Default, R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        match self {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => Some(d.with_state(f)),
            _ => {
                let _ = f;
                None
            }
        }
    }

    /// Records an event after the work queued so far (the host clock on the CPU executor,
    /// whose launches finish before they return). Two events time the work between them.
    /// Refused during a graph capture (time the replays instead).
    pub fn record_event(&self) -> Result<DeviceEvent, LaunchError> {
        self.refuse_in_capture("record_event", graph::NO_WAIT)?;
        match self {
            Device::Cpu(_) => Ok(DeviceEvent::Cpu(std::time::Instant::now())),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.record_event().map(DeviceEvent::Cuda),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.record_event().map(DeviceEvent::Rocm),
        }
    }
}

impl Executor for Device {
    fn name(&self) -> String {
        match self {
            Device::Cpu(c) => c.exec.name(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.name(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.name(),
        }
    }
    fn memory(&self) -> MemLocation {
        match self {
            // CPU executors share host memory: any host buffer is readable by any of them.
            Device::Cpu(c) => c.exec.memory(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.memory(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.memory(),
        }
    }
    fn wave_lanes(&self) -> u32 {
        Device::wave_lanes(self)
    }
    fn max_shared_bytes(&self) -> usize {
        match self {
            Device::Cpu(c) => c.exec.max_shared_bytes(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.max_shared_bytes(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.max_shared_bytes(),
        }
    }
    fn compute_units(&self) -> Option<u32> {
        match self {
            Device::Cpu(c) => c.exec.compute_units(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.compute_units(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.compute_units(),
        }
    }
    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError> {
        if self.is_capturing() {
            let alloc = self.allocator();
            alloc.check_capture_thread(launch.kernel.symbol)?;
            for a in launch.args {
                if let ArgValue::Slice { addr, len, .. } = *a {
                    if len > 0 {
                        alloc.record_use(addr);
                    }
                }
            }
        }
        match self {
            Device::Cpu(c) => c.exec.launch(launch),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.launch(launch),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.launch(launch),
        }
    }
}

/// A buffer of `T`s on a [`Device`], from the device's caching allocator (its block goes
/// back to the cache on drop).
pub struct DeviceVec<T> {
    block: Block,
    len: usize,
    location: MemLocation,
    _t: PhantomData<T>,
}

// SAFETY: a `DeviceVec` owns its block like a `Vec<T>` owns its heap memory.
unsafe impl<T: Send> Send for DeviceVec<T> {}
// SAFETY: shared access only reads (views for kernels are made from `&self` as read-only).
unsafe impl<T: Sync> Sync for DeviceVec<T> {}

/// Resolves a range against `len`.
fn range_of(op: &'static str, r: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), LaunchError> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(bad(op, format!("range {start}..{end} outside a buffer of {len} elements")));
    }
    Ok((start, end - start))
}

impl<T> DeviceVec<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Where the buffer lives.
    pub fn location(&self) -> MemLocation {
        self.location
    }
    fn addr_of(&self, start: usize) -> u64 {
        self.block.addr + (start * std::mem::size_of::<T>()) as u64
    }
    /// Elements `range` as a read-only kernel argument (no copy).
    pub fn view(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>, LaunchError> {
        let (start, len) = range_of("view", range, self.len)?;
        Ok(DeviceView { addr: self.addr_of(start), len, location: self.location, _p: PhantomData })
    }
    /// Elements `range` as a writable kernel argument (no copy).
    pub fn view_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>, LaunchError> {
        let (start, len) = range_of("view_mut", range, self.len)?;
        Ok(DeviceViewMut { addr: self.addr_of(start), len, location: self.location, _p: PhantomData })
    }
    /// Reinterprets the buffer as elements of `U` (same total bytes; e.g. `u16` bits of
    /// `bf16` values). An error when the byte length is not a multiple of `U`'s size.
    pub fn reinterpret<U>(self) -> Result<DeviceVec<U>, LaunchError> {
        let bytes = self.len * std::mem::size_of::<T>();
        let us = std::mem::size_of::<U>();
        if us == 0 || !bytes.is_multiple_of(us) {
            return Err(bad("reinterpret", format!("{bytes} bytes are not whole elements of {us} bytes")));
        }
        Ok(DeviceVec { block: self.block, len: bytes / us, location: self.location, _t: PhantomData })
    }
}

/// A read-only range of a [`DeviceVec`], passed to a kernel's `&[T]` parameter.
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T> {
    addr: u64,
    len: usize,
    location: MemLocation,
    _p: PhantomData<&'a T>,
}

/// A writable range of a [`DeviceVec`], passed to a kernel's `&mut [T]` parameter.
pub struct DeviceViewMut<'a, T> {
    addr: u64,
    len: usize,
    location: MemLocation,
    _p: PhantomData<&'a mut T>,
}

impl<T> DeviceView<'_, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'a, T> DeviceViewMut<'a, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A shorter-lived writable view of the same range (to pass it twice).
    pub fn reborrow(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut { addr: self.addr, len: self.len, location: self.location, _p: PhantomData }
    }
}

fn slice_arg(addr: u64, len: usize, location: MemLocation) -> ArgValue {
    ArgValue::Slice { addr, len, location }
}

impl<T> KernelArgSlice<T> for DeviceVec<T> {
    fn kernel_arg(&self) -> ArgValue {
        slice_arg(self.block.addr, self.len, self.location)
    }
}
impl<T> KernelArgSliceMut<T> for DeviceVec<T> {}
impl<T> KernelArgSlice<T> for DeviceView<'_, T> {
    fn kernel_arg(&self) -> ArgValue {
        slice_arg(self.addr, self.len, self.location)
    }
}
impl<T> KernelArgSlice<T> for DeviceViewMut<'_, T> {
    fn kernel_arg(&self) -> ArgValue {
        slice_arg(self.addr, self.len, self.location)
    }
}
impl<T> KernelArgSliceMut<T> for DeviceViewMut<'_, T> {}

#[cfg(test)]
mod overlap_tests {
    use super::reads_miss_marked;

    #[test]
    fn reads_may_overlap_only_the_marked_launch_and_only_outside_its_writes() {
        let marked = Some((7, 1000, 2000));
        assert!(reads_miss_marked(marked, 7, 0..1000), "just below the writes");
        assert!(reads_miss_marked(marked, 7, 2000..4096), "just above");
        assert!(!reads_miss_marked(marked, 7, 1999..2001), "last written byte");
        assert!(!reads_miss_marked(marked, 7, 0..1001), "first written byte");
        assert!(!reads_miss_marked(marked, 7, 1200..1300), "inside");
        assert!(!reads_miss_marked(marked, 7, 0..8000), "around");
        assert!(!reads_miss_marked(marked, 8, 0..1000), "something was queued after the marked launch");
        assert!(!reads_miss_marked(None, 0, 0..1000), "nothing marked");
    }
}
