//! Host side of a launch: configuration, packed arguments, the executor interface, and the
//! embedded code objects. `#[amdgpu_kernel]` generates launchers against these types; the
//! CPU executor implements [`Executor`] here, GPU runtimes implement it in `kernels`.
mod abi;
mod args;
mod binaries;
mod cpu;
mod error;

pub use abi::{ArgSlot, KernelInstance, SlotKind};
pub use args::{ArgValue, KernelArgSlice, KernelArgSliceMut, MemLocation, ScalarArg};
pub use binaries::{CodeObject, EmbeddedKernels, KernelStats, PtxVariant};
pub use cpu_executor::{CpuExecutor, ExecError, MatrixUnit, WaveSize};
pub use error::LaunchError;

use crate::Dim3;

/// Grid and work-group sizes of one launch, plus the length of a `SharedDyn` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Work-groups in the grid.
    pub grid: Dim3,
    /// Work-items per work-group (at most 1024 in total).
    pub block: Dim3,
    /// Elements of the kernel's `SharedDyn<T>` parameter, if it has one.
    pub dynamic_shared_elems: usize,
    /// The kernel may start while the previous kernel on the stream is still running
    /// ([`LaunchConfig::overlapping_prior`]).
    pub overlap_prior: bool,
    /// Most work-groups of a grid the runtime sizes to what the device holds at once
    /// ([`LaunchConfig::resident_grid`]); 0: `grid` as given.
    pub resident_most: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }
    /// `(x, 1, 1)`.
    pub const fn x(x: u32) -> Self {
        Dim3 { x, y: 1, z: 1 }
    }
    /// `x * y * z`.
    pub const fn volume(self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }
}

impl LaunchConfig {
    /// A launch of `grid` work-groups of `block` work-items.
    pub const fn new(grid: Dim3, block: Dim3) -> Self {
        LaunchConfig { grid, block, dynamic_shared_elems: 0, overlap_prior: false, resident_most: 0 }
    }
    /// One work-item per element: `ceil(n / block)` groups of `block` work-items.
    pub fn for_elements(n: usize, block: u32) -> Self {
        let groups = n.div_ceil(block.max(1) as usize);
        LaunchConfig::new(Dim3::x(groups.min(u32::MAX as usize) as u32), Dim3::x(block))
    }
    /// Sets the length of the kernel's `SharedDyn<T>` parameter.
    pub const fn with_dynamic_shared(mut self, elems: usize) -> Self {
        self.dynamic_shared_elems = elems;
        self
    }
    /// Lets the kernel start before the previous kernel on the stream has finished, for a
    /// kernel that calls [`crate::grid::wait_prior`] before it touches memory the kernels
    /// before it may still write (or read), and reads nothing before that which the kernel
    /// two launches back may have written (it then has finished). Runtimes without the
    /// means (and the CUDA runtime for kernels not built for `sm_90` or later) launch it
    /// after the previous kernel as usual: the flag never changes results.
    pub const fn overlapping_prior(mut self) -> Self {
        self.overlap_prior = true;
        self
    }
    /// Lets the runtime set `grid.x` (one-dimensional grids) to as many work-groups as the
    /// device holds at once, at most `most`: where it can tell (CUDA: the occupancy of the
    /// code it loaded for this kernel, at this work-group size and shared memory, times the
    /// SMs). Elsewhere `grid` stays as given, so it should be the launcher's own estimate.
    /// For kernels that spread their work over `grid_dim_x()` work-groups and run best with
    /// all of them resident.
    pub const fn resident_grid(mut self, most: u32) -> Self {
        self.resident_most = most;
        self
    }
    /// Checks the limits every backend shares (block volume 1..=1024, no zero block dim,
    /// grid dims below 2^31 work-items per dimension in total).
    pub fn validate(&self) -> Result<(), LaunchError> {
        let b = self.block;
        if b.x == 0 || b.y == 0 || b.z == 0 {
            return Err(LaunchError::InvalidConfig(format!("block {:?} has a zero dimension", b)));
        }
        if b.volume() > 1024 {
            return Err(LaunchError::InvalidConfig(format!(
                "block {:?} has {} work-items; the limit is 1024",
                b,
                b.volume()
            )));
        }
        for (g, bd, axis) in [(self.grid.x, b.x, "x"), (self.grid.y, b.y, "y"), (self.grid.z, b.z, "z")] {
            if g as u64 * bd as u64 > u32::MAX as u64 {
                return Err(LaunchError::InvalidConfig(format!(
                    "grid {axis}: {g} groups of {bd} exceed 2^32 work-items"
                )));
            }
        }
        Ok(())
    }
}

/// Everything an executor needs to run one kernel launch.
pub struct Launch<'a> {
    /// The kernel instance (GPU symbol and argument layout).
    pub kernel: &'static KernelInstance,
    /// Grid and work-group sizes.
    pub config: LaunchConfig,
    /// Shared-memory bytes per work-group the launch needs.
    pub shared_bytes: usize,
    /// Arguments, in [`KernelInstance::abi`] order (slices as one value each).
    pub args: &'a [ArgValue],
    /// Runs the kernel body for the current work-item (CPU executor only).
    pub cpu_entry: &'a (dyn Fn(&[ArgValue]) + Sync),
    /// Code objects and PTX of the crate that defines the kernel.
    pub binaries: &'static EmbeddedKernels,
}

/// Something that can run kernel launches: the CPU executor, a HIP device, a CUDA device.
pub trait Executor {
    /// Short name for messages (`"cpu"`, `"rocm:gfx90a"`, `"cuda:sm_90"`).
    fn name(&self) -> String;
    /// Where slices must live for this executor.
    fn memory(&self) -> MemLocation;
    /// Runs (or enqueues) one launch.
    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError>;
    /// Lanes per wave (32 or 64): for launchers that give each wave its own work.
    fn wave_lanes(&self) -> u32;
    /// The most shared memory (LDS) one work-group may take, in bytes: 64 KiB unless the
    /// device is known to allow more (NVIDIA's opt-in limit, 227 KiB on sm_90).
    fn max_shared_bytes(&self) -> usize {
        64 * 1024
    }
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD) of the device, for
    /// launchers that size a grid to stay resident; `None` where there is no such number
    /// (the CPU executor).
    fn compute_units(&self) -> Option<u32> {
        None
    }
}

/// Checks that every slice argument lives where `exec` can read it.
pub fn check_memory(exec: &(impl Executor + ?Sized), launch: &Launch<'_>) -> Result<(), LaunchError> {
    let want = exec.memory();
    for (i, a) in launch.args.iter().enumerate() {
        if let ArgValue::Slice { location, len, .. } = a {
            // An empty slice is never dereferenced, so it may live anywhere (`&[]`).
            if *location != want && *len > 0 {
                return Err(LaunchError::WrongMemory {
                    kernel: launch.kernel.symbol,
                    arg: i,
                    expected: want,
                    found: *location,
                });
            }
        }
    }
    Ok(())
}

/// One `#[amdgpu_kernel]` function, registered by its launcher module at link time.
#[derive(Debug)]
pub struct KernelRegistration {
    /// `module_path!()` of the kernel.
    pub module: &'static str,
    /// Its GPU symbols and layouts.
    pub instances: &'static [KernelInstance],
    /// The embedded binaries of the crate that defines it.
    pub binaries: &'static EmbeddedKernels,
}

inventory::collect!(KernelRegistration);

/// Every kernel linked into this program.
pub fn registered_kernels() -> impl Iterator<Item = &'static KernelRegistration> {
    inventory::iter::<KernelRegistration>.into_iter()
}

impl EmbeddedKernels {
    /// The kernels registered by the crate these binaries belong to.
    pub fn kernels(&'static self) -> impl Iterator<Item = &'static KernelRegistration> {
        registered_kernels().filter(move |r| core::ptr::eq(r.binaries, self))
    }
}

/// The short, snake-case name of a type used in kernel symbols: `half::binary16::f16` ->
/// `f16`, `my::ops::GeluErf` -> `gelu_erf`.
pub fn symbol_part<T: ?Sized>() -> String {
    let full = core::any::type_name::<T>();
    let last = full.rsplit("::").next().unwrap_or(full);
    crate::host::abi::snake_case(last)
}

/// Picks the instance whose symbol is `base` followed by the generic arguments' names.
pub fn find_instance(
    kernel: &'static str,
    instances: &'static [KernelInstance],
    parts: &[String],
) -> Result<&'static KernelInstance, LaunchError> {
    let mut symbol = kernel.to_string();
    for p in parts {
        symbol.push('_');
        symbol.push_str(p);
    }
    instances.iter().find(|i| i.symbol == symbol).ok_or_else(|| LaunchError::NotInstantiated {
        kernel,
        requested: symbol,
        available: instances.iter().map(|i| i.symbol).collect(),
    })
}
