//! The `mma` kernels really use the matrix units: the gfx9 code objects (gfx90a, gfx942,
//! gfx950; there the GEMM and the attention kernels use the double-rate
//! `v_mfma_f32_16x16x32_*`) contain `v_mfma`, the gfx11 ones (gfx1100, gfx1101, gfx1151) and the gfx12 ones
//! (gfx1200, gfx1201: RDNA4 operand widths) `v_wmma`, gfx1030 neither (no matrix unit: the
//! VALU lowering), and the PTX `mma.sync`
//! (plus `ldmatrix` and `cp.async` in the GEMM). Every work-group barrier waits for the
//! wave's loads and LDS accesses first, with the wait encoding of its generation (split
//! `s_wait_*` counters on gfx12). No mix instruction rounding to f16 (`v_fma_mixlo_f16`,
//! ...) adds a `+0`: that is how a multiply folded into an f16 conversion loses the sign
//! of a zero product. Code objects are disassembled with the newest
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
    amd_listings_of(&kernels::__KERNEL_BINARIES)
}

/// [`amd_listings`] for any crate's embedded kernels.
fn amd_listings_of(b: &'static kernel_dsl::host::EmbeddedKernels) -> Vec<(&'static str, String)> {
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
        let want = if arch.starts_with("gfx9") {
            "v_mfma"
        } else if arch.starts_with("gfx11") || arch.starts_with("gfx12") {
            "v_wmma"
        } else {
            // No matrix unit (gfx1030): the VALU lowering.
            for k in MMA_KERNELS {
                let f = function(&listing, k);
                assert!(!f.contains("v_wmma") && !f.contains("v_mfma"), "{k} on {}: unexpected matrix instruction", arch);
            }
            continue;
        };
        for k in MMA_KERNELS {
            assert!(function(&listing, k).contains(want), "{k} on {} has no {want}", arch);
        }
        if arch == "gfx950" {
            // The GEMM multiplies slice pairs on the double-rate 16x16x32 forms.
            for (k, form) in [("gemm_tiled_f16", "v_mfma_f32_16x16x32_f16"), ("gemm_tiled_bf16", "v_mfma_f32_16x16x32_bf16")] {
                assert!(function(&listing, k).contains(form), "{k} on gfx950 has no {form}");
            }
        }
        checked += 1;
    }
    eprintln!("checked matrix instructions in {checked} code objects");
}

/// The attention kernels (prefill, paged decode, paged prefill) run on each architecture's
/// matrix unit: gfx950 on its double-rate `v_mfma_f32_16x16x32_*` (slice pairs,
/// `mma::mma_pair`), gfx90a/gfx942 on `v_mfma`, gfx11 and gfx12 (its own lowering) on
/// `v_wmma`.
#[test]
fn attention_kernels_use_the_matrix_units() {
    const ATTENTION: &[&str] = &["flash_fwd_f16_hd64", "flash_fwd_bf16_hd128", "flash_fwd_bf16_hd80", "paged_decode_bf16_hd128", "paged_prefill_bf16_hd128"];
    let mut checked = 0;
    for (arch, listing) in amd_listings_of(&attention::__KERNEL_BINARIES) {
        let want = if arch == "gfx950" {
            "v_mfma_f32_16x16x32"
        } else if arch.starts_with("gfx9") {
            "v_mfma"
        } else if arch.starts_with("gfx11") || arch.starts_with("gfx12") {
            "v_wmma"
        } else {
            continue;
        };
        for k in ATTENTION {
            assert!(function(&listing, k).contains(want), "{k} on {arch} has no {want}");
        }
        checked += 1;
    }
    eprintln!("checked attention matrix instructions in {checked} code objects");
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

/// The mix instructions with an f16 result in `listing` (`v_fma_mixlo_f16`,
/// `v_mad_mixhi_f16`, ...) whose addend is `+0`, as `(kernel, instruction)`. `a * b + 0` is
/// not `a * b` when the product is `-0`: such an instruction is a multiply rounded to f16
/// that lost the sign of zero (LLVM selects `fptrunc(fmul(a, b))` so). Mixes with an f32
/// result are left alone: they come from a source-level `fma(a, b, 0.0)`, such as a
/// product accumulated onto a zero accumulator, which means what it says.
fn plus_zero_mixes(listing: &str) -> Vec<(String, String)> {
    let mut kernel = String::new();
    let mut found = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_suffix(">:").and_then(|l| l.split('<').nth(1)) {
            kernel = name.to_string();
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut words = code.split_whitespace();
        let Some(op) = words.next() else { continue };
        if !["v_fma_mixlo", "v_fma_mixhi", "v_mad_mixlo", "v_mad_mixhi"].iter().any(|p| op.starts_with(p)) {
            continue;
        }
        let rest: Vec<&str> = words.collect();
        // dst, src0, src1, src2, then modifiers such as `op_sel_hi:[1,0,0]`.
        let src2 = rest.get(3).map(|w| w.trim_end_matches(','));
        // `neg_lo:[_,_,1]` negates the addend: `-0` keeps the product's sign.
        let negated = rest.iter().any(|w| w.strip_prefix("neg_lo:[").is_some_and(|m| m.trim_end_matches(']').split(',').nth(2) == Some("1")));
        if matches!(src2, Some("0" | "0.0")) && !negated {
            found.push((kernel.clone(), code.trim().to_string()));
        }
    }
    found
}

#[test]
fn plus_zero_mix_detector_reads_the_disassembly() {
    let listing = "0000000000001600 <deq>:\n\tv_fma_mixlo_f16 v1, v2, v1, 0 op_sel_hi:[1,0,0]   // 000000001648: CC210001\n\
                   0000000000001700 <ok>:\n\tv_fma_mix_f32 v0, v2, v3, v4\n\tv_fma_mix_f32 v5, v2, v3, 0\n\tv_fma_mixlo_f16 v1, v2, v1, 0 neg_lo:[0,0,1]\n\tv_mul_f32_e32 v1, v2, v1\n";
    assert_eq!(plus_zero_mixes(listing), vec![("deq".to_string(), "v_fma_mixlo_f16 v1, v2, v1, 0 op_sel_hi:[1,0,0]".to_string())]);
}

/// No kernel of any crate, on any AMD architecture, multiplies through a mix instruction
/// with a `+0` addend (`kernel_dsl`'s `f16::from_f32` keeps products out of the conversion):
/// on gfx9-gfx12 LLVM selects `fptrunc(fmul(fpext(h), x))` as `v_fma_mixlo_f16 h, x, 0`, and
/// dequantizing `(q - 8) * d` with `q = 8`, `d < 0` to f16 then gives `+0` for `-0`.
#[test]
fn amd_code_objects_keep_the_sign_of_zero_products() {
    let mut checked = 0;
    for b in [&kernels::__KERNEL_BINARIES, &attention::__KERNEL_BINARIES, &workspace_tests::__KERNEL_BINARIES] {
        for (arch, listing) in amd_listings_of(b) {
            let bad = plus_zero_mixes(&listing);
            assert!(bad.is_empty(), "{arch}: {} mix instructions with a +0 addend, first ones: {:?}", bad.len(), &bad[..bad.len().min(8)]);
            checked += 1;
        }
    }
    eprintln!("checked {checked} code objects for +0-addend mix instructions");
}
