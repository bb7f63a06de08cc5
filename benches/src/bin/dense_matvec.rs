//! Dense f16/bf16 matrix-vector products (`kernels::llm::ops::dense_matvec`, decode's
//! `x W^T` against a `Linear` weight) on the Llama 3.2 1B and Llama 3 8B weight shapes,
//! timed with GPU events against a device-to-device copy in the same run.
//!
//! `dense_matvec [--out DIR] [--quick]`: writes `DIR/rust_dense_matvec.json`.
//! Shapes are `rows x cols` = `out_features x in_features` (the weight `[N, K]`): Llama 3.2
//! 1B's q/o 2048x2048, down 2048x8192, gate/up 8192x2048, k/v 512x2048; Llama 3 8B's q/o
//! 4096x4096, down 4096x14336, gate/up 14336x4096, k/v 1024x4096 and the 128256x4096 output
//! head; every batch (activation rows) 1..=8 on each (f16: the 8B shapes but the head), and
//! a table of % of copy per shape and batch at the end of the log. Bandwidth
//! counts the bytes an ideal kernel moves once: the weights, the activations and the
//! output. Timings cycle through copies of the weights (256 MiB in all, as
//! [`benches::ColdSet`]) so that every call reads them from DRAM, as a decode step does.
//! `python/torch_dense_matvec.py` times PyTorch's `F.linear` (cuBLAS) on the same shapes
//! the same way and `python/report_dense_matvec.py` merges both into a CSV.
use benches::{cold_copies, time, Args};
use half::{bf16, f16};
use kernel_dsl::host::{Executor, ScalarArg};
use kernel_dsl::Float;
use kernels::llm::ops;
use kernels::runtime::{Device, DeviceVec};

/// The shapes (rows = out features, cols = in features).
const SHAPES: [(usize, usize); 9] = [(2048, 2048), (2048, 8192), (8192, 2048), (512, 2048), (4096, 4096), (4096, 14336), (14336, 4096), (1024, 4096), (128256, 4096)];

/// The 8B shapes f16 runs on (all but the head).
const F16_SHAPES: [(usize, usize); 4] = [(4096, 4096), (4096, 14336), (14336, 4096), (1024, 4096)];

/// Activation rows timed on every shape.
const BATCHES: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// Deterministic values in [-1, 1) as `T`.
fn values<T: Float>(n: usize, seed: usize) -> Vec<T> {
    (0..n).map(|i| T::from_f32(((i * 7919 + seed * 104729) % 2000) as f32 / 1000.0 - 1.0)).collect()
}

/// One line of the closing table: dtype, shape, then % of copy per batch.
type TableRow = (String, usize, usize, Vec<f64>);

fn run<T: Float + ScalarArg>(dev: &Device, name: &str, shapes: &[(usize, usize)], batches: &[usize], copy_gbps: f64, lines: &mut Vec<String>, table: &mut Vec<TableRow>) {
    let size = std::mem::size_of::<T>();
    for &(rows, cols) in shapes {
        let wbytes = rows * cols * size;
        let w = dev.upload(&values::<T>(rows * cols, 1)).unwrap();
        let mut ws: Vec<DeviceVec<T>> = Vec::new();
        for _ in 1..cold_copies(wbytes) {
            let mut c = dev.alloc::<T>(rows * cols).unwrap();
            dev.copy(w.view(..).unwrap(), c.view_mut(..).unwrap()).unwrap();
            ws.push(c);
        }
        ws.push(w);
        let mut pcts = Vec::new();
        for &batch in batches {
            let x = dev.upload(&values::<T>(batch * cols, 2)).unwrap();
            let mut y = dev.alloc::<T>(batch * rows).unwrap();
            let moved = wbytes + batch * (cols + rows) * size;
            let mut turn = 0;
            let us = time(dev, wbytes, || {
                turn += 1;
                ops::dense_matvec(dev, &ws[turn % ws.len()], &x, None, &mut y, rows, cols, batch).unwrap()
            });
            let hot = time(dev, wbytes, || ops::dense_matvec(dev, &ws[0], &x, None, &mut y, rows, cols, batch).unwrap());
            let gbps = benches::gbps(moved, us);
            // The tensor-core kernel that `dense_matvec` takes on NVIDIA for 2..8 rows, at
            // this batch too (one row takes the wave kernel): the routing's evidence.
            if batch == 1 && cols % 8 == 0 && dev.name().starts_with("cuda") {
                let team = kernels::llm::matvec_team(rows, cols);
                let mut turn = 0;
                let mma = time(dev, wbytes, || {
                    turn += 1;
                    ops::dense_matvec_mma(dev, &ws[turn % ws.len()], &x, None, &mut y, rows, cols, batch, team).unwrap()
                });
                let g = benches::gbps(moved, mma);
                eprintln!("{name:>4} {rows:>6}x{cols:<6} b{batch}: tensor-core path {mma:8.2} us {g:6.0} GB/s ({:5.1}% of copy)", 100.0 * g / copy_gbps);
            }
            eprintln!("{name:>4} {rows:>6}x{cols:<6} b{batch}: {us:8.2} us {gbps:6.0} GB/s ({:5.1}% of copy) | hot {hot:8.2} us", 100.0 * gbps / copy_gbps);
            lines.push(format!(
                "{{\"dtype\":\"{name}\",\"rows\":{rows},\"cols\":{cols},\"batch\":{batch},\"weight_bytes\":{wbytes},\"moved\":{moved},\"us\":{us:.3},\"gbps\":{gbps:.1},\"pct_of_copy\":{:.2},\"us_hot\":{hot:.3},\"copies\":{},\"copy_gbps\":{copy_gbps:.1}}}",
                100.0 * gbps / copy_gbps,
                ws.len()
            ));
            pcts.push(100.0 * gbps / copy_gbps);
        }
        table.push((name.to_string(), rows, cols, pcts));
    }
}

fn main() {
    let args = Args::from_env();
    let quick = args.quick();
    let Some(dev) = benches::gpu() else { return };

    // Copy bandwidth (bytes read + written) on a 1 GiB buffer.
    let copy_gbps = benches::copy_gbps_1gib(&dev);

    let shapes: &[(usize, usize)] = if quick { &[(4096, 14336)] } else { &SHAPES };
    let batches: &[usize] = if quick { &[1, 8] } else { &BATCHES };
    let mut lines = Vec::new();
    let mut table = Vec::new();
    run::<bf16>(&dev, "bf16", shapes, batches, copy_gbps, &mut lines, &mut table);
    run::<f16>(&dev, "f16", if quick { shapes } else { &F16_SHAPES }, batches, copy_gbps, &mut lines, &mut table);
    eprintln!("\n% of copy ({copy_gbps:.0} GB/s), weights cold:");
    let head: Vec<String> = batches.iter().map(|b| format!("{:>6}", format!("M={b}"))).collect();
    eprintln!("dtype        shape {}", head.join(""));
    for (name, rows, cols, pcts) in &table {
        let cells: Vec<String> = pcts.iter().map(|p| format!("{p:6.1}")).collect();
        eprintln!("{name:>5} {:>12} {}", format!("{rows}x{cols}"), cells.join(""));
    }
    benches::write_json_array(&args.out_dir(), "rust_dense_matvec.json", &lines);
}
