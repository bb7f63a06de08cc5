//! [`RocmDevice`]: a kernels device (AMD GPU through HIP, NVIDIA GPU through PTX, or the CPU
//! executor) as a Candle external-backend device.
use crate::buffer::Buf;
use crate::error::{at, invalid};
use crate::profile::{Profile, Profiler};
use crate::storage::RocmStorage;
use candle_core::ext_backend::{ExtBackendDevice, ExtQStorage, ExtStorage};
use candle_core::quantized::GgmlDType;
use candle_core::{CpuStorage, DType, DeviceLocation, Result, Shape};
use kernel_dsl::host::{Executor, WaveSize};
use kernels::runtime::Device;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// Backend name in `DeviceLocation::Ext` and in tensor display (`rocm-kernels:0`).
pub const BACKEND: &str = "rocm-kernels";

/// A device running Candle ops on this project's kernels. Cheap to clone (shared handle).
#[derive(Clone)]
pub struct RocmDevice {
    inner: Arc<Inner>,
}

struct Inner {
    dev: Device,
    ordinal: usize,
    name: String,
    /// Philox stream: seed, and the next counter block (each call takes the next blocks,
    /// so a seeded sequence of calls is reproducible on every executor).
    seed: Mutex<(u64, u64)>,
    profiler: Profiler,
}

impl RocmDevice {
    fn wrap(dev: Device, ordinal: usize, what: &str) -> Self {
        let name = format!("{BACKEND} {what}: {}", dev.name());
        let profiler = Profiler::default();
        profiler.set(std::env::var("CANDLE_ROCM_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0"));
        RocmDevice { inner: Arc::new(Inner { dev, ordinal, name, seed: Mutex::new((299792458, 0)), profiler }) }
    }

    /// AMD GPU `ordinal` through HIP (`rocm` feature; an error without ROCm or a GPU).
    pub fn new_rocm(ordinal: usize) -> Result<Self> {
        let dev = Device::rocm(ordinal).map_err(at("new_rocm"))?;
        let blas = crate::blas::describe(&dev).unwrap_or_default();
        Ok(Self::wrap(dev, ordinal, &format!("AMD GPU (HIP, {blas})")))
    }

    /// NVIDIA GPU `ordinal` running the kernels' PTX (`cuda` feature). Loads cuBLAS for
    /// matmul; the name says whether it loaded (`NVIDIA GPU (PTX, cuBLAS 13.0.2)`) or why
    /// not (`(PTX, no cuBLAS: <reason>)`, matmul then runs on the backend's kernel).
    pub fn new_cuda(ordinal: usize) -> Result<Self> {
        let dev = Device::cuda(ordinal).map_err(at("new_cuda"))?;
        let blas = crate::blas::describe(&dev).unwrap_or_default();
        Ok(Self::wrap(dev, ordinal, &format!("NVIDIA GPU (PTX, {blas})")))
    }

    /// What runs this device's matmuls when the layout allows: `Some("cuBLAS 13.0.2")`,
    /// `Some("rocBLAS")`, `Some("no cuBLAS: <reason>")`; `None` on the CPU executor (the
    /// backend's `matmul_simple` kernel). See [`crate::blas`] to force the kernel.
    pub fn gemm_library(&self) -> Option<String> {
        crate::blas::describe(&self.inner.dev)
    }

    /// The CPU executor of the GPU kernel model, with waves of `wave` lanes (for tests).
    pub fn new_cpu_executor(wave: WaveSize) -> Self {
        Self::wrap(Device::cpu(wave), 0, "CPU executor")
    }

    /// The CPU executor emulating the matrix unit `unit` (e.g. `MatrixUnit::MmaSync`, whose
    /// mode also runs the sm_90a warpgroup kernels): tests of the paths a GPU with that
    /// unit takes.
    pub fn new_cpu_executor_with(wave: WaveSize, unit: kernel_dsl::host::MatrixUnit) -> Self {
        Self::wrap(Device::cpu_with(kernel_dsl::host::CpuExecutor::new(wave).with_matrix_unit(unit)), 0, "CPU executor")
    }

    /// The device a command-line flag names: `rocm[:N]` (AMD GPU), `cuda[:N]` (NVIDIA GPU
    /// running the PTX), `cpu-executor[:32|:64]` (the CPU executor, waves of 64 unless
    /// `:32`); ordinals default to 0. An unknown name or a bad ordinal is an error that
    /// lists the choices.
    pub fn from_spec(spec: &str) -> Result<Self> {
        let (kind, n) = spec.split_once(':').unwrap_or((spec, ""));
        let bad = |why: String| candle_core::Error::Msg(format!("device {spec:?}: {why} (rocm[:N], cuda[:N], cpu-executor[:32|:64])"));
        let ordinal = || if n.is_empty() { Ok(0) } else { n.parse::<usize>().map_err(|e| bad(e.to_string())) };
        match kind {
            "rocm" => Self::new_rocm(ordinal()?),
            "cuda" => Self::new_cuda(ordinal()?),
            "cpu-executor" => match n {
                "" | "64" => Ok(Self::new_cpu_executor(WaveSize::W64)),
                "32" => Ok(Self::new_cpu_executor(WaveSize::W32)),
                _ => Err(bad("waves of 32 or 64".into())),
            },
            _ => Err(bad("unknown device".into())),
        }
    }

    /// Says which device runs the kernels (e.g. `rocm-kernels CPU executor: cpu (wave 64)`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The kernels device the ops launch on.
    pub fn kernels(&self) -> &Device {
        &self.inner.dev
    }

    /// The caching allocator's figures for this device (bytes in use, cached, peak, ...).
    pub fn memory_stats(&self) -> kernels::runtime::MemoryStats {
        self.inner.dev.memory_stats()
    }

    /// Turns the per-op profile on or off (see [`crate::profile`]; also on when the device
    /// is opened with `CANDLE_ROCM_PROFILE=1`). Calls recorded so far are kept.
    pub fn set_profiling(&self, on: bool) {
        self.inner.profiler.set(on);
    }

    /// `true` while ops are profiled.
    pub fn is_profiling(&self) -> bool {
        self.inner.profiler.is_on()
    }

    /// The per-op sums of the calls profiled since the last call (waits for the last one),
    /// and starts a new profile.
    pub fn take_profile(&self) -> Result<Profile> {
        self.inner.profiler.take()
    }

    /// Runs the backend op `f` (named by `op` only when profiling), timed when profiling.
    pub(crate) fn profiled<R>(&self, op: impl FnOnce() -> std::borrow::Cow<'static, str>, dtype: DType, f: impl FnOnce() -> Result<R>) -> Result<R> {
        if self.inner.profiler.is_on() {
            self.inner.profiler.time(&self.inner.dev, op(), dtype, f)
        } else {
            f()
        }
    }

    /// Whether this device records graphs ([`RocmDevice::capture`]): GPUs do, the CPU
    /// executor does not (run the ops eagerly there).
    pub fn supports_graphs(&self) -> bool {
        self.inner.dev.supports_graphs()
    }

    /// Records the Candle ops `f` runs on this device into a graph, *without running
    /// them*, and returns it with `f`'s result (tensors created inside `f` come from the
    /// graph's capture pool and keep their buffers for every
    /// [`replay`](kernels::runtime::Graph::replay)). One `replay` then queues all of the
    /// ops at once: for a decode step that is launch-bound op by op.
    ///
    /// What the ops may do is [`kernels::runtime::graph`]'s rule set, plus for Candle:
    /// run `f` once eagerly first (layouts get uploaded, kernels loaded); every per-step
    /// value is a tensor allocated before the capture whose contents are written between
    /// replays (`slice_set` from a new tensor, outside the capture); no host reads
    /// (`to_vec*`, `to_scalar`, `to_device(&Cpu)`) and no tensors made from host data
    /// (`Tensor::new`, `from_vec`) inside `f` (typed errors); shapes are fixed; random ops
    /// replay the numbers of the capture (the Philox counter lives on the host). Matmuls
    /// through cuBLAS/rocBLAS are recorded from the library's calls on the device's stream.
    /// An error on the CPU executor, while profiling (profiling records events), and when
    /// `f` fails (its error; the partial capture is discarded).
    pub fn capture<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(kernels::runtime::Graph, R)> {
        if self.is_profiling() {
            return Err(invalid("capture", "profiling records events on the stream, which a graph cannot hold: set_profiling(false) first"));
        }
        let mut failed = None;
        let captured = self.inner.dev.capture(|_| {
            f().map_err(|e| {
                failed = Some(e);
                kernels::runtime::LaunchError::Capture { op: "capture", reason: "the captured Candle ops failed".into() }
            })
        });
        match (captured, failed) {
            (Ok(g), _) => Ok(g),
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(crate::error::launch("capture", e)),
        }
    }

    /// This device as a Candle device (`candle_core::Device::Ext`).
    pub fn as_candle(&self) -> candle_core::Device {
        candle_core::Device::Ext(Arc::new(self.clone()))
    }

    /// The `RocmDevice` inside a Candle device, if it is one.
    pub fn from_candle(d: &candle_core::Device) -> Option<&RocmDevice> {
        match d {
            candle_core::Device::Ext(e) => e.as_any().downcast_ref(),
            _ => None,
        }
    }

    fn rand(&self, shape: &Shape, dtype: DType, normal: bool, a: f64, b: f64) -> Result<ExtStorage> {
        let n = shape.elem_count();
        let (seed, offset) = {
            let mut s = self.inner.seed.lock().map_err(|_| invalid("rand", "poisoned lock"))?;
            let cur = *s;
            s.1 += kernels::random::ops::blocks_used(n);
            cur
        };
        Ok(self.storage(crate::ops::any::rand(&self.inner.dev, dtype, n, seed, offset, normal, a, b)?))
    }

    pub(crate) fn storage(&self, buf: Buf) -> ExtStorage {
        Box::new(RocmStorage::new(buf, self.clone()))
    }
}

impl std::fmt::Debug for RocmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocmDevice({})", self.inner.name)
    }
}

impl ExtBackendDevice for RocmDevice {
    fn location(&self) -> DeviceLocation {
        DeviceLocation::Ext { backend: BACKEND, gpu_id: self.inner.ordinal }
    }

    fn same_device(&self, other: &dyn ExtBackendDevice) -> bool {
        other.as_any().downcast_ref::<RocmDevice>().is_some_and(|o| Arc::ptr_eq(&self.inner, &o.inner))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn zeros(&self, shape: &Shape, dtype: DType) -> Result<ExtStorage> {
        let buf = self.profiled(|| "zeros".into(), dtype, || Buf::zeros(&self.inner.dev, dtype, shape.elem_count()))?;
        Ok(self.storage(buf))
    }

    unsafe fn alloc_uninit(&self, shape: &Shape, dtype: DType) -> Result<ExtStorage> {
        // No fill: the caller writes every element before reading (the trait's contract).
        let buf = self.profiled(|| "alloc_uninit".into(), dtype, || Buf::uninit(&self.inner.dev, dtype, shape.elem_count()))?;
        Ok(self.storage(buf))
    }

    fn storage_from_cpu_storage(&self, s: &CpuStorage) -> Result<ExtStorage> {
        use candle_core::backend::BackendStorage;
        let buf = self.profiled(|| "upload".into(), s.dtype(), || Buf::upload(&self.inner.dev, s))?;
        Ok(self.storage(buf))
    }

    fn rand_uniform(&self, shape: &Shape, dtype: DType, lo: f64, up: f64) -> Result<ExtStorage> {
        self.rand(shape, dtype, false, lo, up)
    }

    fn rand_normal(&self, shape: &Shape, dtype: DType, mean: f64, std: f64) -> Result<ExtStorage> {
        self.rand(shape, dtype, true, mean, std)
    }

    fn set_seed(&self, seed: u64) -> Result<()> {
        *self.inner.seed.lock().map_err(|_| invalid("set_seed", "poisoned lock"))? = (seed, 0);
        Ok(())
    }

    fn get_current_seed(&self) -> Result<u64> {
        Ok(self.inner.seed.lock().map_err(|_| invalid("get_current_seed", "poisoned lock"))?.0)
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.dev.synchronize().map_err(at("synchronize"))
    }

    /// GGUF tensor data kept on the device ([`crate::quantized::RocmQStorage`]).
    fn qstorage_from_data(&self, data: &[u8], dtype: GgmlDType) -> Result<ExtQStorage> {
        crate::quantized::qstorage(self, data, dtype)
    }
}

/// Shorthand: the CPU executor with waves of `wave` lanes, as a Candle device.
pub fn cpu_executor(wave: WaveSize) -> candle_core::Device {
    RocmDevice::new_cpu_executor(wave).as_candle()
}

#[cfg(test)]
mod tests {
    use super::RocmDevice;

    #[test]
    fn device_specs_parse_or_name_the_choices() {
        assert!(RocmDevice::from_spec("cpu-executor").unwrap().name().contains("wave 64"));
        assert!(RocmDevice::from_spec("cpu-executor:32").unwrap().name().contains("wave 32"));
        for bad in ["gpu", "cpu-executor:16", "cuda:x", "rocm:-1"] {
            let e = RocmDevice::from_spec(bad).err().unwrap_or_else(|| panic!("{bad} parsed")).to_string();
            assert!(e.contains(bad) && e.contains("rocm[:N], cuda[:N], cpu-executor[:32|:64]"), "{bad}: {e}");
        }
    }
}
