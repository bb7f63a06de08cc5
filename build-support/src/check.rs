//! Comparing what the code objects declare with what the launchers pack.
use crate::metadata::{ArgValueKind, CodeObjectMetadata};
use crate::ptx::PtxModule;
use crate::BuildError;
use kernel_dsl_codegen::{KernelAbi, SlotKind};

/// Resource figures of one kernel on one architecture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Symbol.
    pub symbol: String,
    /// Architecture.
    pub arch: String,
    /// VGPRs.
    pub vgpr: u32,
    /// AGPRs.
    pub agpr: u32,
    /// SGPRs.
    pub sgpr: u32,
    /// Static LDS bytes.
    pub lds_bytes: u32,
    /// Scratch bytes per work-item.
    pub scratch_bytes: u32,
    /// VGPR spills.
    pub vgpr_spills: u32,
    /// SGPR spills.
    pub sgpr_spills: u32,
    /// Wave size.
    pub wave_size: u32,
    /// Kernarg segment bytes.
    pub kernarg_size: u32,
    /// Waves per SIMD for work-groups of [`OCCUPANCY_WORK_GROUP`] work-items, or of the
    /// kernel's launch bound where that is smaller (0 if unknown).
    pub occupancy: u32,
}

/// Work-group size of the occupancy figure in [`Stats`].
pub const OCCUPANCY_WORK_GROUP: u32 = 256;

/// Checks every launcher layout against one code object; returns the kernels' figures.
pub fn check_code_object(abis: &[KernelAbi], meta: &CodeObjectMetadata, arch: &str) -> Result<Vec<Stats>, BuildError> {
    let mut problems = Vec::new();
    let mut stats = Vec::new();
    for abi in abis {
        let Some(k) = meta.kernels.iter().find(|k| k.name == abi.symbol) else {
            problems.push(format!("{arch}: kernel `{}` is missing from the code object", abi.symbol));
            continue;
        };
        let args: Vec<_> = k.explicit_args().collect();
        if args.len() != abi.slots.len() {
            problems.push(format!(
                "{arch}: `{}` has {} argument slots in the code object but the launcher packs {}",
                abi.symbol,
                args.len(),
                abi.slots.len()
            ));
        } else {
            for (a, s) in args.iter().zip(&abi.slots) {
                let kind_ok = match s.kind {
                    SlotKind::GlobalBuffer => a.value_kind == ArgValueKind::GlobalBuffer,
                    SlotKind::ByValue => a.value_kind == ArgValueKind::ByValue,
                };
                if a.offset != s.offset || a.size != s.size || !kind_ok {
                    problems.push(format!(
                        "{arch}: `{}` argument `{}`: code object has offset {} size {} {:?}, launcher packs offset {} size {} {:?}",
                        abi.symbol, s.name, a.offset, a.size, a.value_kind, s.offset, s.size, s.kind
                    ));
                }
            }
        }
        if (k.kernarg_segment_size as u64) < abi.kernarg_size as u64 {
            problems.push(format!(
                "{arch}: `{}` kernarg segment is {} bytes, smaller than the {} the launcher packs",
                abi.symbol, k.kernarg_segment_size, abi.kernarg_size
            ));
        }
        // The launch bound given to LLVM (`compile::launch_bounds_csv`), which sets the
        // kernel's register budget; the launcher rejects larger work-groups.
        if k.max_flat_workgroup_size != abi.max_threads {
            problems.push(format!(
                "{arch}: `{}` was compiled for work-groups of up to {} work-items, but its launch bound is {}",
                abi.symbol, k.max_flat_workgroup_size, abi.max_threads
            ));
        }
        let occupancy = crate::metadata::occupancy(arch, k, OCCUPANCY_WORK_GROUP.min(abi.max_threads), 0).map(|o| o.waves_per_simd).unwrap_or(0);
        stats.push(Stats {
            symbol: abi.symbol.clone(),
            arch: arch.to_string(),
            vgpr: k.vgpr_count,
            agpr: k.agpr_count,
            sgpr: k.sgpr_count,
            lds_bytes: k.group_segment_fixed_size,
            scratch_bytes: k.private_segment_fixed_size,
            vgpr_spills: k.vgpr_spill_count,
            sgpr_spills: k.sgpr_spill_count,
            wave_size: k.wavefront_size,
            kernarg_size: k.kernarg_segment_size,
            occupancy,
        });
    }
    if problems.is_empty() {
        Ok(stats)
    } else {
        Err(BuildError::AbiMismatch(problems.join("\n")))
    }
}

/// Checks every launcher layout against the PTX entries (parameter count, sizes, pointers),
/// and that the module calls no function it does not define (the driver's JIT would
/// reject it at load time).
pub fn check_ptx(abis: &[KernelAbi], module: &PtxModule, text: &str) -> Result<(), BuildError> {
    let mut problems = Vec::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with(".extern .func")) {
        problems.push(format!("PTX calls an undefined function: `{}`", line.trim()));
    }
    for abi in abis {
        let Some(e) = module.entries.iter().find(|e| e.name == abi.symbol) else {
            problems.push(format!("PTX: entry `{}` is missing", abi.symbol));
            continue;
        };
        if e.params.len() != abi.slots.len() {
            problems.push(format!("PTX: `{}` has {} params, launcher packs {}", abi.symbol, e.params.len(), abi.slots.len()));
            continue;
        }
        for (p, s) in e.params.iter().zip(&abi.slots) {
            // Sub-word scalars are widened to 32-bit registers in PTX parameter space only
            // for .reg; .param keeps their size, so sizes must match exactly.
            if p.size != s.size {
                problems.push(format!("PTX: `{}` param `{}` is {} bytes, launcher packs {}", abi.symbol, s.name, p.size, s.size));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BuildError::AbiMismatch(problems.join("\n")))
    }
}

#[cfg(test)]
mod launch_bound_tests {
    use super::check_code_object;
    use crate::metadata::parse_code_object;
    use kernel_dsl_codegen::{AbiSlot, KernelAbi, SlotKind};

    /// `scale_add` of the fixture, compiled without a bound (`.max_flat_workgroup_size`
    /// 1024), as a launcher bounded at `max_threads` would describe it.
    fn scale_add(max_threads: u32) -> KernelAbi {
        let meta = parse_code_object(include_bytes!("../tests/fixtures/fixture.gfx1100.co")).unwrap();
        let k = meta.kernel("scale_add").unwrap();
        let slots = k
            .explicit_args()
            .enumerate()
            .map(|(i, a)| AbiSlot {
                name: format!("a{i}"),
                offset: a.offset,
                size: a.size,
                kind: if a.value_kind == crate::metadata::ArgValueKind::GlobalBuffer { SlotKind::GlobalBuffer } else { SlotKind::ByValue },
            })
            .collect();
        KernelAbi { kernel: "scale_add".into(), symbol: "scale_add".into(), slots, kernarg_size: k.kernarg_segment_size, max_threads }
    }

    #[test]
    fn code_object_must_state_the_launch_bound() {
        let meta = parse_code_object(include_bytes!("../tests/fixtures/fixture.gfx1100.co")).unwrap();
        assert_eq!(meta.kernel("scale_add").unwrap().max_flat_workgroup_size, 1024);
        let stats = check_code_object(&[scale_add(1024)], &meta, "gfx1100").expect("bound 1024 matches");
        assert_eq!(stats.len(), 1);
        assert!(stats[0].occupancy >= 1);
        let err = check_code_object(&[scale_add(256)], &meta, "gfx1100").unwrap_err().to_string();
        assert!(err.contains("`scale_add` was compiled for work-groups of up to 1024 work-items, but its launch bound is 256"), "{err}");
    }
}
