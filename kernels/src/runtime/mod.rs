//! Run-time choice of where kernels run: the CPU executor, a CUDA device (`cuda`
//! feature), or an AMD GPU through HIP (`rocm` feature). The same typed launchers work with
//! all of them: pass a [`Device`] as the executor and [`DeviceVec`]s as buffers.
//!
//! ```
//! use kernels::runtime::Device;
//! use kernels::elementwise::{self as ew, Exp};
//!
//! let dev = Device::best();
//! let x = dev.upload(&[0.0f32, 1.0, 2.0]).unwrap();
//! let mut y = dev.alloc::<f32>(3).unwrap();
//! ew::unary::launch::<f32, Exp>(&dev, ew::launch_config(3), &x, &[], &mut y).unwrap();
//! assert!((dev.download(&y).unwrap()[1] - 1.0f32.exp()).abs() < 1e-6);
//! ```
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "rocm")]
pub mod rocm;

use kernel_dsl::host::{ArgValue, CpuExecutor, Executor, KernelArgSlice, KernelArgSliceMut, Launch, LaunchError, MemLocation, WaveSize};

/// Errors of buffer handling.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) struct MemError;

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl MemError {
    pub(crate) fn length(src: usize, dst: usize) -> LaunchError {
        LaunchError::InvalidArgument { kernel: "copy", reason: format!("source has {src} elements, destination {dst}") }
    }
}

/// Where kernels run.
pub enum Device {
    /// The CPU executor.
    Cpu(CpuExecutor),
    /// An NVIDIA GPU (PTX).
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaDevice),
    /// An AMD GPU (code objects through HIP).
    #[cfg(feature = "rocm")]
    Rocm(rocm::RocmDevice),
}

/// A buffer on a [`Device`].
pub enum DeviceVec<T> {
    /// Host memory (CPU executor).
    Host(Vec<T>),
    /// CUDA device memory.
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaBuffer<T>),
    /// HIP device memory.
    #[cfg(feature = "rocm")]
    Rocm(rocm::RocmBuffer<T>),
}

impl Device {
    /// Lanes per wave on this device: the CPU executor's setting, 32 on NVIDIA, 64 on
    /// CDNA (gfx9) and 32 on RDNA AMD GPUs. Launch shapes that give each wave its own work
    /// use it.
    pub fn wave_lanes(&self) -> u32 {
        match self {
            Device::Cpu(c) => c.wave_size().lanes(),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => 32,
            #[cfg(feature = "rocm")]
            Device::Rocm(r) => {
                if r.arch().starts_with("gfx9") {
                    64
                } else {
                    32
                }
            }
        }
    }

    /// The CPU executor with waves of `wave` lanes.
    pub fn cpu(wave: WaveSize) -> Device {
        Device::Cpu(CpuExecutor::new(wave))
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

    /// Copies `data` to the device.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DeviceVec<T>, LaunchError> {
        match self {
            Device::Cpu(_) => Ok(DeviceVec::Host(data.to_vec())),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.upload(data).map(DeviceVec::Cuda),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.upload(data).map(DeviceVec::Rocm),
        }
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc<T: Copy>(&self, len: usize) -> Result<DeviceVec<T>, LaunchError> {
        match self {
            // SAFETY: kernel element types are plain data for which all-zero bytes are valid.
            Device::Cpu(_) => Ok(DeviceVec::Host(vec![unsafe { std::mem::zeroed() }; len])),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.alloc(len).map(DeviceVec::Cuda),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.alloc(len).map(DeviceVec::Rocm),
        }
    }

    /// Copies a buffer back to the host (after the work queued before it).
    pub fn download<T: Copy>(&self, v: &DeviceVec<T>) -> Result<Vec<T>, LaunchError> {
        match (self, v) {
            (Device::Cpu(_), DeviceVec::Host(h)) => Ok(h.clone()),
            #[cfg(feature = "cuda")]
            (Device::Cuda(d), DeviceVec::Cuda(b)) => d.download(b),
            #[cfg(feature = "rocm")]
            (Device::Rocm(d), DeviceVec::Rocm(b)) => d.download(b),
            #[allow(unreachable_patterns)]
            _ => Err(LaunchError::InvalidArgument { kernel: "download", reason: "buffer belongs to another device".into() }),
        }
    }

    /// Waits for queued work.
    pub fn synchronize(&self) -> Result<(), LaunchError> {
        match self {
            Device::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.synchronize(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.synchronize(),
        }
    }
}

impl Executor for Device {
    fn name(&self) -> String {
        match self {
            Device::Cpu(e) => e.name(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.name(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.name(),
        }
    }
    fn memory(&self) -> MemLocation {
        match self {
            Device::Cpu(e) => e.memory(),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.memory(),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.memory(),
        }
    }
    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError> {
        match self {
            Device::Cpu(e) => e.launch(launch),
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => d.launch(launch),
            #[cfg(feature = "rocm")]
            Device::Rocm(d) => d.launch(launch),
        }
    }
}

impl<T> DeviceVec<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceVec::Host(h) => h.len(),
            #[cfg(feature = "cuda")]
            DeviceVec::Cuda(b) => b.len(),
            #[cfg(feature = "rocm")]
            DeviceVec::Rocm(b) => b.len(),
        }
    }
    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> KernelArgSlice<T> for DeviceVec<T> {
    fn kernel_arg(&self) -> ArgValue {
        match self {
            DeviceVec::Host(h) => h.kernel_arg(),
            #[cfg(feature = "cuda")]
            DeviceVec::Cuda(b) => b.arg(),
            #[cfg(feature = "rocm")]
            DeviceVec::Rocm(b) => b.arg(),
        }
    }
}
impl<T> KernelArgSliceMut<T> for DeviceVec<T> {}
