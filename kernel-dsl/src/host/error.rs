//! Launch errors.
use super::MemLocation;

/// Why a launch did not run. A failed launch changes no buffer, except when a kernel
/// faulted while running (`Exec`), where outputs may be partly written.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Grid or work-group sizes outside what every backend supports.
    #[error("invalid launch configuration: {0}")]
    InvalidConfig(String),
    /// The work-group is larger than the kernel's launch bound
    /// (`#[amdgpu_kernel(max_threads = N)]`).
    #[error("`{kernel}` is compiled for work-groups of at most {max} work-items; the launch has {work_items}")]
    BlockTooLarge {
        /// Kernel symbol.
        kernel: &'static str,
        /// Work-items per work-group of the launch.
        work_items: u64,
        /// The kernel's bound.
        max: u32,
    },
    /// A buffer is shorter than the operation needs.
    #[error("argument `{arg}` of `{kernel}` has {actual} elements but {expected} are required")]
    Length {
        /// Kernel.
        kernel: &'static str,
        /// Argument name.
        arg: &'static str,
        /// Elements needed.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// An argument has a value the operation cannot use (bad shape, stride, dtype).
    #[error("invalid argument to `{kernel}`: {reason}")]
    InvalidArgument {
        /// Kernel or operation.
        kernel: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A buffer lives in memory this executor cannot read.
    #[error("argument {arg} of `{kernel}` lives in {found:?} but this executor needs {expected:?}")]
    WrongMemory {
        /// Kernel symbol.
        kernel: &'static str,
        /// Argument index.
        arg: usize,
        /// Memory the executor reads.
        expected: MemLocation,
        /// Memory the buffer is in.
        found: MemLocation,
    },
    /// The generic arguments asked for were not instantiated by the kernel's attribute.
    #[error("kernel `{kernel}` has no instance `{requested}`; instances: {available:?} (add the type to #[amdgpu_kernel(...)])")]
    NotInstantiated {
        /// Kernel.
        kernel: &'static str,
        /// Symbol requested.
        requested: String,
        /// Symbols built.
        available: Vec<&'static str>,
    },
    /// The device's architecture has no code object in this build.
    #[error("no code object for {arch}: this build has {built:?}; add it with KERNEL_ARCHS=\"{arch},...\" (or the `archs` list in build.rs) and rebuild")]
    ArchNotBuilt {
        /// Device architecture.
        arch: String,
        /// Architectures embedded.
        built: Vec<&'static str>,
    },
    /// No GPU (or no runtime library) is available.
    #[error("no device: {0}")]
    NoDevice(String),
    /// The kernel faulted while running on the CPU executor.
    #[error("kernel `{kernel}` failed on the CPU executor: {source}")]
    Exec {
        /// Kernel symbol.
        kernel: &'static str,
        /// What the executor saw.
        #[source]
        source: cpu_executor::ExecError,
    },
    /// Graph capture: the operation cannot be recorded into a graph and was refused while
    /// the device is capturing one (a host read, a wait, a host-to-device copy, a launch
    /// from another thread): nothing was queued. Also a capture that cannot start (a
    /// device without graphs, a capture already under way) or end.
    #[error("`{op}` is not allowed while the device is capturing a graph: {reason}")]
    Capture {
        /// The operation refused.
        op: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A GPU runtime call failed.
    #[error("{backend} error in {call}: {message}")]
    Backend {
        /// `"rocm"` or `"cuda"`.
        backend: &'static str,
        /// The runtime call.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
}
