//! Row-wise kernels (softmax, log-softmax, RMSNorm) against an f64 reference, on the CPU
//! executor with waves of 32 and 64 lanes and on any GPU this build can open.
//!
//! Extra tolerance over one output rounding: each work-item accumulates cols/256 terms in
//! f32, then a tree of 256; the relative error of the sum is below (cols/256 + 8) * 2^-24,
//! 3e-5 for 65536 columns. Softmax outputs are at most 1, so that also bounds the
//! absolute error.
use half::{bf16, f16};
use kernel_dsl::host::Executor;
use kernels::{norm, softmax};

mod common;
use common::*;

const SHAPES: [(usize, usize); 6] = [(1, 1), (3, 7), (2, 1023), (2, 4096), (1, 65537), (5, 300)];

fn reference_softmax(x: &[f64], cols: usize, log: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, |a, b| if b.is_nan() || a.is_nan() { f64::NAN } else { a.max(b) });
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        out.extend(row.iter().map(|v| if log { v - m - s.ln() } else { (v - m).exp() / s }));
    }
    out
}

fn run_softmax<T: TestFloat>(log: bool) {
    for exec in executors() {
        for (rows, cols) in SHAPES {
            let x: Vec<T> = inputs(rows * cols, -20.0, 20.0, cols as u64, false).into_iter().map(T::from_f64).collect();
            let dx = exec.upload(&x).unwrap();
            let mut dy = exec.alloc::<T>(rows * cols).unwrap();
            let cfg = softmax::launch_config(rows).unwrap();
            if log {
                softmax::log_softmax::launch::<T>(&exec, cfg, &dx, &mut dy, cols as u32).unwrap();
            } else {
                softmax::softmax::launch::<T>(&exec, cfg, &dx, &mut dy, cols as u32).unwrap();
            }
            let y = exec.download(&dy).unwrap();
            let xf: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
            let want = reference_softmax(&xf, cols, log);
            // log-softmax values reach about -40 here; their error is absolute (from the
            // f32 log-sum-exp), scaled by the magnitude of the result.
            let (rel, abs) = if log { (3e-5, 3e-5) } else { (3e-5, 1e-7) };
            assert_close_with(&y, &want, rel, abs, &format!("softmax(log={log})<{}> {rows}x{cols} on {}", T::NAME, exec.name()));
        }
    }
}

#[test]
fn softmax_all_dtypes() {
    run_softmax::<f32>(false);
    run_softmax::<f16>(false);
    run_softmax::<bf16>(false);
}

#[test]
fn log_softmax_all_dtypes() {
    run_softmax::<f32>(true);
    run_softmax::<f16>(true);
    run_softmax::<bf16>(true);
}

#[test]
fn softmax_rows_sum_to_one_and_nan_poisons_only_its_row() {
    for exec in executors() {
        let cols = 513;
        let mut x: Vec<f32> = inputs(3 * cols, -5.0, 5.0, 77, false).into_iter().map(|v| v as f32).collect();
        x[cols + 17] = f32::NAN;
        let dx = exec.upload(&x).unwrap();
        let mut dy = exec.alloc::<f32>(x.len()).unwrap();
        softmax::softmax::launch::<f32>(&exec, softmax::launch_config(3).unwrap(), &dx, &mut dy, cols as u32).unwrap();
        let y = exec.download(&dy).unwrap();
        for r in [0, 2] {
            let s: f64 = y[r * cols..(r + 1) * cols].iter().map(|v| *v as f64).sum();
            assert!((s - 1.0).abs() < 1e-5, "row {r} sums to {s} on {}", exec.name());
        }
        assert!(y[cols..2 * cols].iter().all(|v| v.is_nan()), "the NaN row is NaN on {}", exec.name());
    }
}

fn run_rms_norm<T: TestFloat>() {
    for exec in executors() {
        for (rows, cols) in SHAPES {
            let x: Vec<T> = inputs(rows * cols, -3.0, 3.0, 5 + cols as u64, false).into_iter().map(T::from_f64).collect();
            let w: Vec<T> = inputs(cols, 0.5, 1.5, 6, false).into_iter().map(T::from_f64).collect();
            let (dx, dw) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap());
            let mut dy = exec.alloc::<T>(rows * cols).unwrap();
            norm::rms_norm::launch::<T>(&exec, softmax::launch_config(rows).unwrap(), &dx, &dw, &mut dy, cols as u32, 1e-5).unwrap();
            let y = exec.download(&dy).unwrap();
            let mut want = Vec::new();
            for row in x.chunks(cols) {
                let ms: f64 = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / cols as f64;
                let scale = 1.0 / (ms + 1e-5f32 as f64).sqrt();
                want.extend(row.iter().zip(&w).map(|(v, g)| v.to_f64() * scale * g.to_f64()));
            }
            assert_close_with(&y, &want, 3e-5, 1e-6, &format!("rms_norm<{}> {rows}x{cols} on {}", T::NAME, exec.name()));
        }
    }
}

#[test]
fn rms_norm_all_dtypes() {
    run_rms_norm::<f32>();
    run_rms_norm::<f16>();
    run_rms_norm::<bf16>();
}

#[test]
fn row_kernels_reject_short_buffers() {
    let exec = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W64);
    let x = exec.upload(&[1.0f32; 10]).unwrap();
    let mut y = exec.alloc::<f32>(12).unwrap();
    let err = softmax::softmax::launch::<f32>(&exec, softmax::launch_config(2).unwrap(), &x, &mut y, 6).unwrap_err();
    assert!(err.to_string().contains("out of"), "{err}");
}
