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

    llm_step(&exec);
    println!("demo OK");
}

/// The per-token path of an LLM decoder on 8 tokens of a 32-head x 128 model: RMSNorm,
/// rotary embedding, attention-score softmax and the argmax over logits, each checked
/// against a plain f64 computation.
fn llm_step(exec: &Device) {
    use kernels::{norm, reduce, rope, softmax};
    let (t, h, d) = (8usize, 32usize, 128usize);
    let hidden = h * d;
    let x: Vec<f32> = (0..t * hidden).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 250.0).collect();
    let w: Vec<f32> = (0..hidden).map(|i| 0.5 + (i % 13) as f32 / 13.0).collect();
    let started = Instant::now();
    let (dx, dw) = (exec.upload(&x).expect("upload"), exec.upload(&w).expect("upload"));
    let mut normed = exec.alloc::<f32>(t * hidden).expect("alloc");
    norm::rms_norm_rows(exec, &dx, Some(&dw), &mut normed, hidden, 1e-5).expect("rms_norm");
    // Rotary embedding of the normed tokens viewed as (1, t, h, d), positions 0..t.
    let half = d / 2;
    let (cos, sin): (Vec<f32>, Vec<f32>) = (0..t * half)
        .map(|k| {
            let (pos, i) = ((k / half) as f32, (k % half) as f32);
            let angle = pos / 10000f32.powf(2.0 * i / d as f32);
            (angle.cos(), angle.sin())
        })
        .unzip();
    let (dcos, dsin) = (exec.upload(&cos).expect("upload"), exec.upload(&sin).expect("upload"));
    let mut roped = exec.alloc::<f32>(t * hidden).expect("alloc");
    rope::apply_rope_thd(exec, &normed, &dcos, &dsin, &mut roped, &rope::RopeShape::new(1, h, t, d)).expect("rope");
    // Softmax over each token's 4096 values (as over a row of attention scores or logits),
    // and the argmax per token (the greedy pick over logits).
    let mut probs = exec.alloc::<f32>(t * hidden).expect("alloc");
    softmax::softmax_last_dim(exec, &roped, &mut probs, hidden).expect("softmax");
    let mut best = exec.alloc::<u32>(t).expect("alloc");
    reduce::arg_reduce::<f32, reduce::ArgMax>(exec, &roped, &[t, hidden], &[hidden, 1], &[1], &mut best).expect("argmax");
    let (probs, best, roped) = (exec.download(&probs).unwrap(), exec.download(&best).unwrap(), exec.download(&roped).unwrap());
    let secs = started.elapsed().as_secs_f64();

    // The same in f64 on the host.
    let mut err = 0.0f64;
    for tok in 0..t {
        let row = &x[tok * hidden..(tok + 1) * hidden];
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / hidden as f64;
        let n: Vec<f64> = row.iter().zip(&w).map(|(v, g)| *v as f64 / (ms + 1e-5).sqrt() * *g as f64).collect();
        let mut r = n.clone();
        for head in 0..h {
            for i in 0..half {
                let (c, s) = (cos[tok * half + i] as f64, sin[tok * half + i] as f64);
                let (a, b) = (n[head * d + i], n[head * d + i + half]);
                r[head * d + i] = a * c - b * s;
                r[head * d + i + half] = a * s + b * c;
            }
        }
        let m = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = r.iter().map(|v| (v - m).exp()).sum();
        for (k, v) in r.iter().enumerate() {
            err = err.max((roped[tok * hidden + k] as f64 - v).abs());
            err = err.max(((v - m).exp() / z - probs[tok * hidden + k] as f64).abs());
        }
        let got = best[tok] as usize;
        assert!((r[got] - m).abs() < 1e-5, "token {tok}: argmax {got} is not a maximum");
    }
    println!("LLM step (rms_norm -> rope_thd -> softmax, argmax) on {t} tokens x {h} heads x {d}: {:.1} ms, max |error| vs f64 {err:.2e}", secs * 1e3);
    assert!(err < 1e-4, "LLM step result wrong");
}
