//! The main job: shows what the build produced (kernels per architecture with their
//! register and LDS figures) and runs kernels on the best available executor, checking
//! the results against a CPU reference.
//!
//! `cargo run --release -p kernels --example demo [-- --all]`
use kernel_dsl::host::Executor;
use kernels::elementwise::{self as ew, Add, GeluErf};
use kernels::runtime::Device;
use std::time::Instant;

fn main() {
    let all = std::env::args().any(|a| a == "--all");
    let b = &kernels::__KERNEL_BINARIES;
    println!("== kernels built by build-support for crate `{}` ==", b.crate_name);
    if b.code_objects.is_empty() {
        println!("no GPU code objects (KERNEL_SKIP_GPU_BUILD set?)");
    }
    for co in b.code_objects {
        println!("  {:<8} code object {:>8} bytes", co.arch, co.bytes.len());
    }
    if let Some(ptx) = b.ptx {
        println!("  {:<8} PTX         {:>8} bytes", b.ptx_target, ptx.len());
    }
    let archs = b.archs();
    let mut symbols: Vec<&str> = Vec::new();
    for s in b.stats {
        if !symbols.contains(&s.symbol) {
            symbols.push(s.symbol);
        }
    }
    println!("\n{} kernel symbols x {} architectures; per arch: VGPR/SGPR, LDS bytes, waves per SIMD (256-item groups)", symbols.len(), archs.len());
    print!("{:<28}", "symbol");
    for a in &archs {
        print!(" {:>22}", a);
    }
    println!();
    let shown = if all { symbols.len() } else { symbols.len().min(24) };
    for sym in &symbols[..shown] {
        print!("{sym:<28}");
        for a in &archs {
            match b.stats_for(sym, a) {
                Some(s) => print!(" {:>22}", format!("{}/{} lds {} occ {}", s.vgpr, s.sgpr, s.lds_bytes, s.occupancy)),
                None => print!(" {:>22}", "-"),
            }
        }
        println!();
    }
    if shown < symbols.len() {
        println!("... {} more (run with --all)", symbols.len() - shown);
    }
    let spills: u32 = b.stats.iter().map(|s| s.vgpr_spills + s.sgpr_spills).sum();
    let scratch: u32 = b.stats.iter().map(|s| s.scratch_bytes).sum();
    println!("total spills: {spills}, total scratch bytes: {scratch}");

    // The best executor this build can reach: an AMD GPU (`rocm` feature), an NVIDIA GPU
    // (`cuda` feature), else the CPU executor.
    let exec = Device::best();
    println!("\n== running on {} ==", exec.name());
    if !exec.is_gpu() {
        println!("(no GPU runtime in this build or no GPU present: build with --features rocm or cuda to use one)");
    }
    let n = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| ((i % 2001) as f32 - 1000.0) / 250.0).collect();
    let dx = exec.upload(&x).expect("upload");
    let mut dy = exec.alloc::<f32>(n).expect("alloc");
    let t = Instant::now();
    ew::unary::launch::<f32, GeluErf>(&exec, ew::launch_config(n), &dx, &[], &mut dy).expect("gelu_erf launch");
    exec.synchronize().expect("synchronize");
    let secs = t.elapsed().as_secs_f64();
    let y = exec.download(&dy).expect("download");
    let max_err = x
        .iter()
        .zip(&y)
        .map(|(&v, &g)| (0.5 * v as f64 * (1.0 + libm::erf(v as f64 / std::f64::consts::SQRT_2)) - g as f64).abs())
        .fold(0.0, f64::max);
    println!("gelu_erf<f32> over {n} elements: {:.1} ms, max |error| vs f64 reference {max_err:.2e}", secs * 1e3);
    assert!(max_err < 1e-5, "gelu_erf result wrong");

    let z: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let dz = exec.upload(&z).expect("upload");
    let t = Instant::now();
    ew::binary::launch::<f32, Add>(&exec, ew::launch_config(n), &dx, &[], &dz, &[], &mut dy).expect("add launch");
    exec.synchronize().expect("synchronize");
    let secs = t.elapsed().as_secs_f64();
    let y = exec.download(&dy).expect("download");
    let wrong = (0..n).filter(|&i| y[i] != x[i] + z[i]).count();
    println!("add<f32> over {n} elements: {:.1} ms, {wrong} mismatches", secs * 1e3);
    assert_eq!(wrong, 0);
    println!("demo OK");
}
