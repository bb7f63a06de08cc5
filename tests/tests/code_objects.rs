//! The embedded code objects and PTX, read back with an independent parser and compared
//! with the launchers that the proc macro generated: every kernel instance for every
//! architecture, argument layout, wave size, launch bound, no scratch and no spills.
use build_support::metadata::{parse_code_object, ArgValueKind};
use build_support::ptx::parse_ptx;
use kernel_dsl::host::{EmbeddedKernels, KernelInstance, SlotKind};

fn skipped(b: &EmbeddedKernels) -> bool {
    if b.code_objects.is_empty() {
        eprintln!(
            "SKIPPED: {} was built with KERNEL_SKIP_GPU_BUILD or KERNEL_ARCHS empty: no code objects to inspect",
            b.crate_name
        );
        return true;
    }
    false
}

fn instances(b: &'static EmbeddedKernels) -> Vec<&'static KernelInstance> {
    b.kernels().flat_map(|r| r.instances.iter()).collect()
}

fn check_crate(b: &'static EmbeddedKernels, min_instances: usize) {
    if skipped(b) {
        return;
    }
    let insts = instances(b);
    assert!(insts.len() >= min_instances, "{}: only {} kernel instances registered", b.crate_name, insts.len());
    let archs = b.archs();
    if std::env::var("KERNEL_ARCHS").is_err() {
        for a in build_support::DEFAULT_ARCHS {
            assert!(archs.contains(a), "{}: default arch {a} missing (built {archs:?})", b.crate_name);
        }
    }
    for co in b.code_objects {
        let meta = parse_code_object(co.bytes).unwrap_or_else(|e| panic!("{} {}: {e}", b.crate_name, co.arch));
        assert_eq!(meta.arch, co.arch);
        let wave = if co.arch.starts_with("gfx9") { 64 } else { 32 };
        for inst in &insts {
            let k = meta
                .kernels
                .iter()
                .find(|k| k.name == inst.symbol)
                .unwrap_or_else(|| panic!("{}: {} missing from {}", b.crate_name, inst.symbol, co.arch));
            let args: Vec<_> = k.explicit_args().collect();
            assert_eq!(args.len(), inst.abi.len(), "{} on {}: argument count", inst.symbol, co.arch);
            for (a, s) in args.iter().zip(inst.abi) {
                assert_eq!((a.offset, a.size), (s.offset, s.size), "{} on {}: slot {}", inst.symbol, co.arch, s.name);
                let want = match s.kind {
                    SlotKind::GlobalBuffer => ArgValueKind::GlobalBuffer,
                    SlotKind::ByValue => ArgValueKind::ByValue,
                };
                assert_eq!(a.value_kind, want, "{} on {}: slot {}", inst.symbol, co.arch, s.name);
            }
            assert_eq!(k.wavefront_size, wave, "{} on {}", inst.symbol, co.arch);
            // Compiled for its own launch bound (`max_threads`, else 1024), which sets its
            // register budget; the launcher rejects larger work-groups.
            assert_eq!(k.max_flat_workgroup_size, inst.max_threads, "{} on {}: .max_flat_workgroup_size", inst.symbol, co.arch);
            assert_eq!(k.private_segment_fixed_size, 0, "{} on {} uses scratch", inst.symbol, co.arch);
            assert_eq!(k.vgpr_spill_count + k.sgpr_spill_count, 0, "{} on {} spills", inst.symbol, co.arch);
            assert!(!k.uses_dynamic_stack, "{} on {} uses a dynamic stack", inst.symbol, co.arch);
            // The figures embedded for the demo and docs are the code object's.
            let st = b.stats_for(inst.symbol, co.arch).expect("stats embedded");
            assert_eq!((st.vgpr, st.sgpr, st.lds_bytes), (k.vgpr_count, k.sgpr_count, k.group_segment_fixed_size));
            assert!(st.occupancy >= 1, "{} on {}: occupancy {}", inst.symbol, co.arch, st.occupancy);
        }
    }
    if let Some(text) = b.ptx {
        let module = parse_ptx(text).expect("PTX parses");
        // No entry keeps a stack frame in local memory (the PTX twin of "no scratch").
        let mut entry = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                entry = rest.trim_end_matches('(');
            }
            assert!(!line.contains("__local_depot"), "{}: PTX entry {entry} uses local memory", b.crate_name);
        }
        // Every entry carries its kernel's launch bound (`max_threads`, else 1024).
        let mut bounds = std::collections::HashMap::new();
        let mut current = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                current = Some(rest.trim_end_matches('(').to_string());
            } else if let (Some(name), Some(rest)) = (&current, line.trim().strip_prefix(".maxntid ")) {
                let n: u32 = rest.split(',').next().unwrap().trim().parse().expect(".maxntid value");
                bounds.insert(name.clone(), n);
                current = None;
            }
        }
        for inst in &insts {
            assert_eq!(bounds.get(inst.symbol), Some(&inst.max_threads), "PTX .maxntid of {}", inst.symbol);
            let e = module.entries.iter().find(|e| e.name == inst.symbol).unwrap_or_else(|| panic!("PTX lacks {}", inst.symbol));
            let sizes: Vec<u32> = e.params.iter().map(|p| p.size).collect();
            let want: Vec<u32> = inst.abi.iter().map(|s| s.size).collect();
            assert_eq!(sizes, want, "PTX params of {}", inst.symbol);
            for (p, s) in e.params.iter().zip(inst.abi) {
                assert_eq!(p.is_ptr, s.kind == SlotKind::GlobalBuffer, "PTX param {} of {}", s.name, inst.symbol);
            }
        }
    }
}

#[test]
fn kernels_crate_code_objects_match_launchers() {
    check_crate(&kernels::__KERNEL_BINARIES, 135);
}

#[test]
fn attention_crate_code_objects_match_launchers() {
    // flash_fwd, paged_decode and paged_decode_waves (2 types x 5 head dims each),
    // paged_merge (2), reshape_and_cache (3), rope_and_cache (3), paged_prefill (2 types
    // x 2 head dims), flash_fwd_wgmma (2 types x 2 head dims; an immediate return on AMD).
    check_crate(&attention::__KERNEL_BINARIES, 50);
}

#[test]
fn user_crate_code_objects_match_launchers() {
    check_crate(&workspace_tests::__KERNEL_BINARIES, 8);
}

#[test]
fn shared_memory_kernels_request_lds_at_launch() {
    let b = &workspace_tests::__KERNEL_BINARIES;
    if skipped(b) {
        return;
    }
    for co in b.code_objects {
        let meta = parse_code_object(co.bytes).unwrap();
        let k = meta.kernels.iter().find(|k| k.name == "block_sum").unwrap();
        // All shared memory is launch-sized (the launcher adds Shared<T, N> sizes), so the
        // static LDS figure stays 0; the launcher asks for 256 * 4 bytes.
        assert_eq!(k.group_segment_fixed_size, 0, "{}", co.arch);
    }
}
