//! GEMM on the matrix units (`kernels::gemm::matmul_with`) timed with GPU events: square
//! f16/bf16 products 1024..8192 and LLM projection shapes (M tokens x K against a K x N
//! weight), plus a correctness spot check of each shape class. Each shape runs on
//! `gemm_tiled` (`mma.sync` on NVIDIA; op `matmul`) and, where it can take the product
//! (NVIDIA sm_90, whole 128 x 256 tiles), on `gemm_wgmma` (op `matmul_wgmma`).
//!
//! `gemm [--out DIR] [--quick] [--shape MxNxK --dtype bf16|f16|f32 [--engine tiled|wgmma]]`:
//! writes `DIR/rust_gemm.json`; `python/torch_gemm.py` times `torch.matmul` on the same
//! shapes and `python/report_gemm.py` merges both. `--shape` times that one product only
//! (for `ncu`).
use benches::{time, uniform, Args};
use half::{bf16, f16};
use kernel_dsl::host::ScalarArg;
use kernels::gemm::{self, Engine, Epilogue, GemmElem, GemmShape, Operand};
use kernels::runtime::{Device, DeviceVec};

struct Row {
    op: &'static str,
    dtype: &'static str,
    m: usize,
    n: usize,
    k: usize,
    us: f64,
}

/// Times `C = A B` (row-major, no epilogue) on `gemm_tiled` and, where it takes the
/// product, `gemm_wgmma`, and checks a few entries of each against f64.
fn run<T: GemmElem + ScalarArg>(dev: &Device, m: usize, n: usize, k: usize, out: &mut Vec<Row>) {
    run_on::<T>(&[Engine::Tiled, Engine::Wgmma], dev, m, n, k, out);
}

/// Times the product on each of `engines` (one set of inputs; an engine that refuses the
/// product is skipped, only `Wgmma` may).
fn run_on<T: GemmElem + ScalarArg>(engines: &[Engine], dev: &Device, m: usize, n: usize, k: usize, out: &mut Vec<Row>) {
    let (a, b) = (uniform::<T>(m * k, 1, 1.0), uniform::<T>(k * n, 2, 1.0));
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let mut dc: DeviceVec<T> = dev.alloc(m * n).unwrap();
    let shape = GemmShape { batch: 1, m, n, k };
    let epi = Epilogue::default();
    for &engine in engines {
        let mut call = || gemm::matmul_with(engine, dev, shape, &da, Operand::row_major(m, k), &db, Operand::row_major(k, n), &mut dc, n, m * n, &epi);
        if let Err(e) = call() {
            assert!(engine == Engine::Wgmma, "{e}");
            continue;
        }
        let mut call = || call().unwrap();
        let us = time(dev, 2 * m * n * k, &mut call);
        let c = dev.download(&dc).unwrap();
        for (i, j) in [(0, 0), (m - 1, n - 1), (m / 2, n / 3)] {
            let want: f64 = (0..k).map(|q| a[i * k + q].to_f32() as f64 * b[q * n + j].to_f32() as f64).sum();
            let got = c[i * n + j].to_f32() as f64;
            let scale: f64 = (0..k).map(|q| (a[i * k + q].to_f32() as f64 * b[q * n + j].to_f32() as f64).abs()).sum();
            assert!((got - want).abs() <= 1e-2 * want.abs() + 1e-4 * scale + 1e-3, "{} {m}x{n}x{k} C[{i}][{j}] = {got}, want {want}", T::NAME);
        }
        let tflops = 2.0 * (m * n * k) as f64 / (us * 1e-6) / 1e12;
        let op = if engine == Engine::Wgmma { "matmul_wgmma" } else { "matmul" };
        eprintln!("{op:<13} {:<5} {m:>5} x {n:>5} x {k:>5} {us:>10.1} us {tflops:>7.1} TFLOP/s", T::NAME);
        out.push(Row { op, dtype: T::NAME, m, n, k, us });
    }
}

fn main() {
    let args = Args::from_env();
    let quick = args.quick();
    let Some(dev) = benches::gpu() else { return };
    let mut rows = Vec::new();
    if let Some(shape) = args.value("--shape") {
        let d: Vec<usize> = shape.split('x').map(|v| v.parse().expect("--shape MxNxK")).collect();
        let [m, n, k] = d[..] else { panic!("--shape MxNxK") };
        let engine = if args.value("--engine") == Some("wgmma") { Engine::Wgmma } else { Engine::Tiled };
        match args.value("--dtype").unwrap_or("bf16") {
            "f16" => run_on::<f16>(&[engine], &dev, m, n, k, &mut rows),
            "f32" => run_on::<f32>(&[engine], &dev, m, n, k, &mut rows),
            _ => run_on::<bf16>(&[engine], &dev, m, n, k, &mut rows),
        }
        return;
    }
    let squares: &[usize] = if quick { &[1024, 4096] } else { &[1024, 2048, 4096, 8192] };
    let tokens: &[usize] = if quick { &[1, 4096] } else { &[1, 16, 64, 256, 1024, 4096] };
    let weights = [(4096, 4096), (4096, 14336), (14336, 4096)]; // (K, N)
    macro_rules! all {
        ($t:ty) => {
            for &s in squares {
                run::<$t>(&dev, s, s, s, &mut rows);
            }
            for &(k, n) in &weights {
                for &m in tokens {
                    run::<$t>(&dev, m, n, k, &mut rows);
                }
            }
        };
    }
    all!(bf16);
    all!(f16);
    run::<f32>(&dev, 4096, 4096, 4096, &mut rows);
    let json: Vec<String> = rows
        .iter()
        .map(|r| format!("{{\"op\":\"{}\",\"dtype\":\"{}\",\"m\":{},\"n\":{},\"k\":{},\"us\":{:.3}}}", r.op, r.dtype, r.m, r.n, r.k, r.us))
        .collect();
    let path = benches::write_json_array(&args.out_dir(), "rust_gemm.json", &json);
    println!("wrote {path}");
}
