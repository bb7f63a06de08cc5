//! Elementwise bandwidth and launch overhead on a GPU, timed with GPU events.
//!
//! `elementwise [--out DIR] [--max-bytes N] [--quick]`: writes `DIR/rust_elementwise.json`.
use benches::{median, time, Args, Sample};
use half::bf16;
use kernel_dsl::host::{Executor, LaunchConfig};
use kernel_dsl::Dim3;
use kernels::elementwise::{self as ew, Add, Exp, GeluErf, Silu};
use kernels::runtime::Device;
use std::io::Write;

fn main() {
    let args = Args::from_env();
    let out_dir = args.out_dir();
    let max_bytes: usize = args.value("--max-bytes").and_then(|s| s.parse().ok()).unwrap_or(1 << 30);
    let quick = args.quick();
    let Some(dev) = benches::gpu() else { return };
    let mut samples = Vec::new();
    let mut bytes = 4096usize;
    while bytes <= max_bytes {
        samples.extend(bench_size(&dev, bytes, quick));
        bytes *= if quick { 16 } else { 4 };
    }
    let launch = launch_overhead(&dev);
    println!("\nlaunch overhead (empty kernel, back-to-back, per launch): {launch:.2} us");

    print_table(&samples);
    let path = format!("{out_dir}/rust_elementwise.json");
    let mut f = std::fs::File::create(&path).expect("create json");
    writeln!(f, "{{\"device\":\"{}\",\"launch_us\":{launch:.3},\"samples\":[", dev.name()).unwrap();
    for (i, s) in samples.iter().enumerate() {
        writeln!(f, "{}{}", s.json(), if i + 1 < samples.len() { "," } else { "" }).unwrap();
    }
    writeln!(f, "]}}").unwrap();
    println!("wrote {path}");
}

fn bench_size(dev: &Device, bytes: usize, quick: bool) -> Vec<Sample> {
    let mut out = Vec::new();
    let us = benches::copy_us(dev, bytes);
    out.push(Sample { op: "copy".into(), dtype: "u8", bytes, moved: 2 * bytes, us });

    macro_rules! unary {
        ($t:ty, $name:literal, $op:ty) => {{
            let n = bytes / std::mem::size_of::<$t>();
            let x = dev.alloc::<$t>(n).unwrap();
            let mut y = dev.alloc::<$t>(n).unwrap();
            let cfg = ew::launch_config(n);
            let us = time(dev, bytes, || ew::unary::launch::<$t, $op>(dev, cfg, &x, &[], &mut y).unwrap());
            out.push(Sample { op: $name.into(), dtype: <$t as kernel_dsl::Element>::NAME, bytes, moved: 2 * bytes, us });
        }};
    }
    macro_rules! binary {
        ($t:ty) => {{
            let n = bytes / std::mem::size_of::<$t>();
            let a = dev.alloc::<$t>(n).unwrap();
            let b = dev.alloc::<$t>(n).unwrap();
            let mut y = dev.alloc::<$t>(n).unwrap();
            let cfg = ew::launch_config(n);
            let us = time(dev, bytes, || ew::binary::launch::<$t, Add>(dev, cfg, &a, &[], &b, &[], &mut y).unwrap());
            out.push(Sample { op: "binary_add".into(), dtype: <$t as kernel_dsl::Element>::NAME, bytes, moved: 3 * bytes, us });
        }};
    }
    macro_rules! affine {
        ($t:ty) => {{
            let n = bytes / std::mem::size_of::<$t>();
            let x = dev.alloc::<$t>(n).unwrap();
            let mut y = dev.alloc::<$t>(n).unwrap();
            let cfg = ew::launch_config(n);
            let us = time(dev, bytes, || ew::affine::launch::<$t>(dev, cfg, &x, &[], &mut y, 1.5, 0.5).unwrap());
            out.push(Sample { op: "affine".into(), dtype: <$t as kernel_dsl::Element>::NAME, bytes, moved: 2 * bytes, us });
        }};
    }
    affine!(f32);
    affine!(bf16);
    binary!(f32);
    binary!(bf16);
    unary!(f32, "unary_exp", Exp);
    unary!(bf16, "unary_exp", Exp);
    if !quick {
        unary!(f32, "unary_gelu_erf", GeluErf);
        unary!(bf16, "unary_silu", Silu);
    }
    for s in &out[out.len().saturating_sub(8)..] {
        eprintln!("{:>12} {:<5} {:>11} B {:>10.2} us {:>8.1} GB/s", s.op, s.dtype, s.bytes, s.us, s.gbps());
    }
    out
}

fn launch_overhead(dev: &Device) -> f64 {
    let mut out = dev.alloc::<u32>(1).unwrap();
    let cfg = LaunchConfig::new(Dim3::x(1), Dim3::x(32));
    let iters = 2000;
    for _ in 0..100 {
        benches::bench_kernels::empty::launch(dev, cfg, &mut out).unwrap();
    }
    let mut reps = Vec::new();
    for _ in 0..5 {
        let ms = benches::gpu_ms(dev, || {
            for _ in 0..iters {
                benches::bench_kernels::empty::launch(dev, cfg, &mut out).unwrap();
            }
        });
        reps.push(ms * 1e3 / iters as f64);
    }
    median(&mut reps)
}

fn print_table(samples: &[Sample]) {
    println!("\n{:>14} {:<5} {:>12} {:>10} {:>9} {:>8}", "op", "dtype", "bytes", "us", "GB/s", "% copy");
    for s in samples {
        let copy = samples.iter().find(|c| c.op == "copy" && c.bytes == s.bytes).map(|c| c.gbps()).unwrap_or(f64::NAN);
        println!("{:>14} {:<5} {:>12} {:>10.2} {:>9.1} {:>7.1}%", s.op, s.dtype, s.bytes, s.us, s.gbps(), 100.0 * s.gbps() / copy);
    }
}
