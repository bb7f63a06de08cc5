//! Code objects and PTX embedded by `build-support`, with their resource figures.

/// One AMDGPU code object (ELF) for one architecture.
#[derive(Clone, Copy, Debug)]
pub struct CodeObject {
    /// Architecture (`gfx90a`).
    pub arch: &'static str,
    /// The ELF bytes, ready for `hipModuleLoadData`.
    pub bytes: &'static [u8],
}

/// Resource use of one kernel symbol on one architecture, read from the code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelStats {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// Architecture.
    pub arch: &'static str,
    /// Vector registers per lane.
    pub vgpr: u32,
    /// Accumulation registers per lane (CDNA).
    pub agpr: u32,
    /// Scalar registers per wave.
    pub sgpr: u32,
    /// Static LDS bytes (launch-sized shared memory is extra).
    pub lds_bytes: u32,
    /// Scratch (private) bytes per work-item.
    pub scratch_bytes: u32,
    /// VGPRs spilled to scratch.
    pub vgpr_spills: u32,
    /// SGPRs spilled.
    pub sgpr_spills: u32,
    /// Wave size the code was built for.
    pub wave_size: u32,
    /// Kernel-argument segment bytes.
    pub kernarg_size: u32,
    /// Estimated waves per SIMD for a 256-work-item group without dynamic LDS.
    pub occupancy: u32,
}

/// Everything `build-support` embedded for one crate.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddedKernels {
    /// Crate that owns the kernels.
    pub crate_name: &'static str,
    /// One code object per AMD architecture.
    pub code_objects: &'static [CodeObject],
    /// PTX module for NVIDIA GPUs, when built.
    pub ptx: Option<&'static str>,
    /// PTX target (`sm_80`).
    pub ptx_target: &'static str,
    /// Per-kernel, per-architecture resource figures.
    pub stats: &'static [KernelStats],
}

impl EmbeddedKernels {
    /// The code object for `arch` (features after `:` are ignored: `gfx90a:sramecc+:xnack-`).
    pub fn code_object(&self, arch: &str) -> Option<&'static CodeObject> {
        let base = arch.split(':').next().unwrap_or(arch);
        self.code_objects.iter().find(|c| c.arch == base)
    }
    /// Architectures built.
    pub fn archs(&self) -> Vec<&'static str> {
        self.code_objects.iter().map(|c| c.arch).collect()
    }
    /// Figures for `symbol` on `arch`.
    pub fn stats_for(&self, symbol: &str, arch: &str) -> Option<&'static KernelStats> {
        self.stats.iter().find(|s| s.symbol == symbol && s.arch == arch)
    }
}
