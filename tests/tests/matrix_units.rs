//! The `mma` kernels really use the matrix units: the gfx9 code objects (gfx90a, gfx942,
//! gfx950) contain `v_mfma`, the gfx11 ones (gfx1100, gfx1101, gfx1151) `v_wmma`, the gfx12
//! ones neither (their VALU lowering, until gfx12 WMMA is lowered), and the PTX `mma.sync`
//! (plus `ldmatrix` and `cp.async` in the GEMM). Every work-group barrier waits for the
//! wave's loads and LDS accesses first, with the wait encoding of its generation (split
//! `s_wait_*` counters on gfx12). Code objects are disassembled with the newest
//! `llvm-objdump` found; an architecture that disassembler cannot decode is skipped with
//! the reason printed.
use std::process::Command;

/// Kernels that must contain matrix instructions on every architecture with a matrix unit.
const MMA_KERNELS: &[&str] = &["gemm_tiled_f16", "gemm_tiled_bf16", "gemm_tiled_f32", "mma_tile_f16", "mma_tile_bf16", "mma_tile_i8", "mma_pv_f16"];

fn objdump_candidates() -> Vec<String> {
    let mut v: Vec<String> = (14..=30).rev().map(|n| format!("/usr/lib/llvm-{n}/bin/llvm-objdump")).collect();
    v.push("llvm-objdump".into());
    v
}

/// Disassembly of `bytes` for `arch`, or why there is none.
fn disassemble(arch: &str, bytes: &[u8]) -> Result<String, String> {
    // One file per call: the tests run in parallel and disassemble the same architectures.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("matrix_units_{}_{call}_{arch}.co", std::process::id()));
    std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    let mut why = Vec::new();
    for tool in objdump_candidates() {
        let out = match Command::new(&tool).arg("-d").arg(format!("--mcpu={arch}")).arg(&path).output() {
            Ok(o) => o,
            Err(_) => continue,
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() && !err.contains("not yet supported") && text.contains("s_endpgm") {
            let _ = std::fs::remove_file(&path);
            return Ok(text);
        }
        why.push(format!("{tool}: {}", err.lines().next().unwrap_or("no disassembly")));
    }
    let _ = std::fs::remove_file(&path);
    Err(if why.is_empty() { "no llvm-objdump installed".into() } else { why.join("; ") })
}

/// The instructions of function `name` in an `llvm-objdump -d` listing.
fn function<'a>(listing: &'a str, name: &str) -> &'a str {
    let head = format!("<{name}>:");
    let start = listing.find(&head).unwrap_or_else(|| panic!("{name} not in the disassembly"));
    let body = &listing[start + head.len()..];
    let end = body.find(">:\n").and_then(|e| body[..e].rfind('\n')).unwrap_or(body.len());
    &body[..end]
}

/// The disassembly of every AMD code object `kernels` embeds, by architecture; those the
/// installed `llvm-objdump` cannot decode are left out with a SKIPPED line saying why.
fn amd_listings() -> Vec<(&'static str, String)> {
    let b = &kernels::__KERNEL_BINARIES;
    if b.code_objects.is_empty() {
        eprintln!("SKIPPED: kernels was built without AMD code objects (KERNEL_ARCHS / KERNEL_SKIP_GPU_BUILD)");
    }
    b.code_objects
        .iter()
        .filter_map(|co| match disassemble(co.arch, co.bytes) {
            Ok(l) => Some((co.arch, l)),
            Err(why) => {
                eprintln!("SKIPPED {}: cannot disassemble ({why}); apt-get install llvm-22 to check it", co.arch);
                None
            }
        })
        .collect()
}

#[test]
fn amd_code_objects_use_the_matrix_units() {
    let mut checked = 0;
    for (arch, listing) in amd_listings() {
        if arch.starts_with("gfx12") {
            // The VALU lowering: gfx12 WMMA (other operand widths than gfx11) is not lowered yet.
            for k in MMA_KERNELS {
                let f = function(&listing, k);
                assert!(!f.contains("v_wmma") && !f.contains("v_mfma"), "{k} on {}: unexpected matrix instruction", arch);
            }
            continue;
        }
        let want = if arch.starts_with("gfx9") {
            "v_mfma"
        } else if arch.starts_with("gfx11") {
            "v_wmma"
        } else {
            continue; // no matrix unit: the VALU lowering
        };
        for k in MMA_KERNELS {
            assert!(function(&listing, k).contains(want), "{k} on {} has no {want}", arch);
        }
        checked += 1;
    }
    eprintln!("checked matrix instructions in {checked} code objects");
}

/// Counters that the wait instructions on `lines` drain to zero: `vm`/`lgkm` from gfx9-11
/// `s_waitcnt vmcnt(0) lgkmcnt(0)`, `load`/`store`/`ds`/... from gfx12 `s_wait_loadcnt 0x0`
/// and the combined `s_wait_loadcnt_dscnt` / `s_wait_storecnt_dscnt`, whose immediate holds
/// the first counter in bits 13:8 and `dscnt` in bits 5:0 (LLVM's
/// `getLoadcntStorecntBitShift`): `s_wait_loadcnt_dscnt 0x1` drains the loads and leaves one
/// LDS access, which a later `s_wait_dscnt 0x0` may drain.
fn drained(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for l in lines {
        let mut words = l.split_whitespace();
        let Some(op) = words.next() else { continue };
        if op == "s_waitcnt" {
            for w in words.take_while(|w| !w.starts_with("//")) {
                if let Some(c) = w.strip_suffix("cnt(0)") {
                    out.push(c.to_string());
                }
            }
        } else if let Some(counters) = op.strip_prefix("s_wait_") {
            let Some(imm) = words.next().and_then(|w| u32::from_str_radix(w.trim_start_matches("0x"), if w.starts_with("0x") { 16 } else { 10 }).ok()) else { continue };
            let names: Vec<&str> = counters.split('_').filter_map(|c| c.strip_suffix("cnt")).collect();
            match names.as_slice() {
                [first, "ds"] => {
                    if (imm >> 8) & 0x3f == 0 {
                        out.push(first.to_string());
                    }
                    if imm & 0x3f == 0 {
                        out.push("ds".to_string());
                    }
                }
                _ if imm == 0 => out.extend(names.iter().map(|c| c.to_string())),
                _ => {}
            }
        }
    }
    out
}

/// Every barrier of every kernel on every AMD architecture is preceded, after the last
/// memory instruction, by waits that drain global loads and LDS (and, on gfx12, stores):
/// `kernel_dsl::barrier`'s `wait_memory`, in the generation's own encoding.
#[test]
fn amd_barriers_wait_for_memory_first() {
    let mut checked = 0;
    for (arch, listing) in amd_listings() {
        let gfx12 = arch.starts_with("gfx12");
        let (barrier, need): (&str, &[&str]) = if gfx12 { ("s_barrier_signal", &["load", "store", "ds"]) } else { ("s_barrier", &["vm", "lgkm"]) };
        if gfx12 {
            assert!(!listing.lines().any(|l| l.trim_start().starts_with("s_waitcnt ")), "{}: legacy s_waitcnt in a gfx12 code object", arch);
        }
        let lines: Vec<&str> = listing.lines().map(str::trim_start).collect();
        let mut barriers = 0;
        for (i, l) in lines.iter().enumerate() {
            if l.split_whitespace().next() != Some(barrier) {
                continue;
            }
            // Lane shuffles (`ds_bpermute`, ...) use the LDS unit but no LDS memory, so the
            // compiler may move them between the wait and the barrier.
            let shuffle = |s: &str| ["ds_bpermute", "ds_permute", "ds_swizzle"].iter().any(|p| s.starts_with(p));
            let is_memory = |s: &&str| {
                (["global_", "buffer_", "flat_", "ds_", "scratch_", "s_load", "s_buffer_load"].iter().any(|p| s.starts_with(p)) && !shuffle(s))
                    || s.ends_with(">:")
            };
            let start = lines[..i].iter().rposition(is_memory).map_or(0, |p| p + 1);
            let got = drained(&lines[start..i]);
            for c in need {
                assert!(got.iter().any(|g| g == c), "{}: barrier at line {i} not preceded by a {c}cnt(0) wait: {:?}", arch, &lines[start..=i]);
            }
            barriers += 1;
        }
        assert!(barriers > 0, "{}: no {barrier} found", arch);
        checked += 1;
        eprintln!("{}: {barriers} barriers wait for memory first", arch);
    }
    eprintln!("checked barriers in {checked} code objects");
}

#[test]
fn ptx_uses_mma_sync_ldmatrix_and_cp_async() {
    let Some(ptx) = kernels::__KERNEL_BINARIES.ptx else {
        eprintln!("SKIPPED: kernels was built without PTX");
        return;
    };
    let entry = |name: &str| {
        let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} not in the PTX"));
        let body = &ptx[start..];
        &body[..body[1..].find(".entry ").map_or(body.len(), |e| e + 1)]
    };
    for k in MMA_KERNELS {
        assert!(entry(k).contains("mma.sync.aligned.m16n8k16"), "{k}: no mma.sync in the PTX");
    }
    for k in ["gemm_tiled_f16", "gemm_tiled_bf16"] {
        assert!(entry(k).contains("ldmatrix.sync.aligned.m8n8.x4"), "{k}: no ldmatrix");
        assert!(entry(k).contains("cp.async.cg.shared.global"), "{k}: no cp.async");
    }
}
