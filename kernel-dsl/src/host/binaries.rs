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
    /// Estimated waves per SIMD for a 256-work-item group (or one of the kernel's launch
    /// bound where that is smaller) without dynamic LDS.
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
    /// PTX built for further targets, for the kernels that need their instructions.
    pub ptx_variants: &'static [PtxVariant],
    /// Per-kernel, per-architecture resource figures.
    pub stats: &'static [KernelStats],
}

/// PTX of the whole crate for one more target (`sm_90a`), from which the kernels it names
/// launch on devices of that architecture.
#[derive(Clone, Copy, Debug)]
pub struct PtxVariant {
    /// The PTX target (`sm_90a`).
    pub target: &'static str,
    /// The module.
    pub ptx: &'static str,
    /// Base names of the kernels launched from it (`gemm_wgmma` covers `gemm_wgmma_bf16`):
    /// their code exists only here.
    pub kernels: &'static [&'static str],
    /// Exact names of kernels launched from it on the devices it runs on, and from the
    /// main PTX elsewhere.
    pub preferred: &'static [&'static str],
}

impl PtxVariant {
    /// Whether a device of compute capability `(major, minor)` runs this PTX: an `a`
    /// (architecture-specific) target only on that exact architecture.
    pub fn runs_on(&self, (major, minor): (i32, i32)) -> bool {
        let digits = self.target.trim_start_matches("sm_");
        let (num, exact) = match digits.strip_suffix('a') {
            Some(n) => (n, true),
            None => (digits, false),
        };
        let Ok(v) = num.parse::<i32>() else { return false };
        let (vmaj, vmin) = (v / 10, v % 10);
        if exact {
            (major, minor) == (vmaj, vmin)
        } else {
            (major, minor) >= (vmaj, vmin)
        }
    }
    /// Whether `symbol` is one of this variant's kernels (`base` or `base_<types>`).
    pub fn covers(&self, symbol: &str) -> bool {
        self.kernels.iter().any(|k| symbol == *k || symbol.strip_prefix(k).is_some_and(|r| r.starts_with('_')))
    }
    /// Whether `symbol` is one of this variant's [`PtxVariant::preferred`] kernels.
    pub fn prefers(&self, symbol: &str) -> bool {
        self.preferred.contains(&symbol)
    }
}

impl EmbeddedKernels {
    /// The variant `symbol` must launch from, if any.
    pub fn variant_for(&self, symbol: &str) -> Option<&'static PtxVariant> {
        self.ptx_variants.iter().find(|v| v.covers(symbol))
    }
    /// The variant `symbol` launches from on a device of compute capability `capability`
    /// by preference ([`PtxVariant::preferred`]), if one runs there.
    pub fn preferred_variant(&self, symbol: &str, capability: (i32, i32)) -> Option<&'static PtxVariant> {
        self.ptx_variants.iter().find(|v| v.prefers(symbol) && v.runs_on(capability))
    }
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

#[cfg(test)]
mod tests {
    use super::PtxVariant;

    #[test]
    fn variants_run_on_their_architecture_and_cover_their_kernels() {
        let v = PtxVariant { target: "sm_90a", ptx: "", kernels: &["gemm_wgmma"], preferred: &["matvec_stream_q4_0"] };
        assert!(v.runs_on((9, 0)));
        assert!(!v.runs_on((8, 0)) && !v.runs_on((10, 0)) && !v.runs_on((12, 0)), "sm_90a code runs on sm_90 only");
        let portable = PtxVariant { target: "sm_89", ..v };
        assert!(portable.runs_on((8, 9)) && portable.runs_on((9, 0)) && !portable.runs_on((8, 6)));
        assert!(v.covers("gemm_wgmma_bf16") && v.covers("gemm_wgmma"));
        assert!(!v.covers("gemm_wgmmax_bf16") && !v.covers("gemm_tiled_bf16"));
        assert!(v.prefers("matvec_stream_q4_0") && !v.covers("matvec_stream_q4_0"));
        assert!(!v.prefers("matvec_stream_q4_0_x") && !v.prefers("matvec_stream") && !v.prefers("gemm_wgmma_bf16"));
        static VARIANTS: [PtxVariant; 1] = [PtxVariant { target: "sm_90a", ptx: "", kernels: &["gemm_wgmma"], preferred: &["matvec_stream_q4_0"] }];
        let binaries = super::EmbeddedKernels { crate_name: "k", code_objects: &[], ptx: None, ptx_target: "sm_80", ptx_variants: &VARIANTS, stats: &[] };
        assert!(binaries.preferred_variant("matvec_stream_q4_0", (9, 0)).is_some());
        assert!(binaries.preferred_variant("matvec_stream_q4_0", (8, 0)).is_none(), "elsewhere the main PTX");
        assert!(binaries.preferred_variant("gemm_wgmma_bf16", (9, 0)).is_none());
    }
}
