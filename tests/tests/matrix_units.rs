//! The `mma` kernels really use the matrix units: the gfx9 code objects contain `v_mfma`,
//! the gfx11 ones `v_wmma`, and the PTX `mma.sync` (plus `ldmatrix` and `cp.async` in the
//! GEMM). Code objects are disassembled with the newest `llvm-objdump` found; an
//! architecture that disassembler cannot decode is skipped with the reason printed.
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
    let path = std::env::temp_dir().join(format!("matrix_units_{}_{arch}.co", std::process::id()));
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

#[test]
fn amd_code_objects_use_the_matrix_units() {
    let b = &kernels::__KERNEL_BINARIES;
    if b.code_objects.is_empty() {
        eprintln!("SKIPPED: kernels was built without AMD code objects (KERNEL_ARCHS / KERNEL_SKIP_GPU_BUILD)");
        return;
    }
    let mut checked = 0;
    for co in b.code_objects {
        let want = if co.arch.starts_with("gfx9") {
            "v_mfma"
        } else if co.arch.starts_with("gfx11") {
            "v_wmma"
        } else {
            continue; // no matrix unit: the VALU lowering
        };
        let listing = match disassemble(co.arch, co.bytes) {
            Ok(l) => l,
            Err(why) => {
                eprintln!("SKIPPED {}: cannot disassemble ({why}); apt-get install llvm-22 to check it", co.arch);
                continue;
            }
        };
        for k in MMA_KERNELS {
            assert!(function(&listing, k).contains(want), "{k} on {} has no {want}", co.arch);
        }
        checked += 1;
    }
    eprintln!("checked matrix instructions in {checked} code objects");
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
