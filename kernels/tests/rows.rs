//! Row-wise kernels (softmax, log-softmax, RMSNorm, LayerNorm) against an f64 reference, on the CPU
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

/// Rows of 1 and 7 (partial chunks, unaligned rows), 1000 and 2048 (whole-chunk tiles on
/// 64 work-items, with and without the affine parameters), 300, 4096 and 12000 (register
/// tiles, the last chunk partial for some work-items), 20000 (streaming / online path for 32-bit
/// types, a 4-chunk tile for 16-bit ones) and 65537 (streaming for all).
const SHAPES: [(usize, usize); 10] = [(1, 1), (3, 7), (4, 1000), (2, 2048), (5, 300), (2, 1023), (3, 4096), (2, 12000), (1, 20000), (1, 65537)];

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
            let cfg = softmax::launch_config::<T>(rows, cols).unwrap();
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

/// Masked rows (some -inf, as a causal mask makes), rows with +inf or NaN, on both the
/// register-tile and the streaming paths: the outputs match the f64 reference, which
/// computes the same formula (a NaN or +inf makes its row NaN; -inf entries give 0 / -inf).
#[test]
fn softmax_special_values_follow_the_reference() {
    for exec in executors() {
        for cols in [33, 4096, 40000] {
            let rows = 4;
            let mut x: Vec<f32> = inputs(rows * cols, -8.0, 8.0, 3 + cols as u64, false).into_iter().map(|v| v as f32).collect();
            x[cols / 2..cols].fill(f32::NEG_INFINITY); // row 0: masked second half
            x[cols + 5] = f32::INFINITY; // row 1
            x[2 * cols + cols - 1] = f32::NAN; // row 2
            // row 3: all masked but one
            for c in 0..cols - 1 {
                x[3 * cols + c] = f32::NEG_INFINITY;
            }
            let xf: Vec<f64> = x.iter().map(|v| *v as f64).collect();
            let dx = exec.upload(&x).unwrap();
            for log in [false, true] {
                let mut dy = exec.alloc::<f32>(x.len()).unwrap();
                let cfg = softmax::launch_config::<f32>(rows, cols).unwrap();
                if log {
                    softmax::log_softmax::launch::<f32>(&exec, cfg, &dx, &mut dy, cols as u32).unwrap();
                } else {
                    softmax::softmax::launch::<f32>(&exec, cfg, &dx, &mut dy, cols as u32).unwrap();
                }
                let y = exec.download(&dy).unwrap();
                let want = reference_softmax(&xf, cols, log);
                assert_close_with(&y, &want, 3e-5, 3e-5, &format!("special softmax(log={log}) cols {cols} on {}", exec.name()));
                assert_eq!(y[3 * cols + cols - 1], if log { 0.0 } else { 1.0 }, "single unmasked element on {}", exec.name());
            }
        }
    }
}

#[test]
fn softmax_rows_sum_to_one_and_nan_poisons_only_its_row() {
    for exec in executors() {
        let cols = 513;
        let mut x: Vec<f32> = inputs(3 * cols, -5.0, 5.0, 77, false).into_iter().map(|v| v as f32).collect();
        x[cols + 17] = f32::NAN;
        let dx = exec.upload(&x).unwrap();
        let mut dy = exec.alloc::<f32>(x.len()).unwrap();
        softmax::softmax::launch::<f32>(&exec, softmax::launch_config::<f32>(3, cols).unwrap(), &dx, &mut dy, cols as u32).unwrap();
        let y = exec.download(&dy).unwrap();
        for r in [0, 2] {
            let s: f64 = y[r * cols..(r + 1) * cols].iter().map(|v| *v as f64).sum();
            assert!((s - 1.0).abs() < 1e-5, "row {r} sums to {s} on {}", exec.name());
        }
        assert!(y[cols..2 * cols].iter().all(|v| v.is_nan()), "the NaN row is NaN on {}", exec.name());
    }
}

/// f64 reference of RMSNorm (`layer = false`) or LayerNorm over rows of `cols`; `w` / `b`
/// empty mean 1 / 0.
fn reference_norm(x: &[f64], w: &[f64], b: &[f64], cols: usize, eps: f64, layer: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let mean = if layer { row.iter().sum::<f64>() / cols as f64 } else { 0.0 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
        let scale = 1.0 / (var + eps).sqrt();
        for (c, v) in row.iter().enumerate() {
            let g = if w.is_empty() { 1.0 } else { w[c] };
            let h = if b.is_empty() { 0.0 } else { b[c] };
            out.push((v - mean) * scale * g + h);
        }
    }
    out
}

fn run_norm<T: TestFloat>(layer: bool) {
    for exec in executors() {
        for (i, (rows, cols)) in SHAPES.into_iter().enumerate() {
            // Shifted inputs (mean 2) so LayerNorm's centring matters.
            let x: Vec<T> = inputs(rows * cols, -1.0, 5.0, 5 + cols as u64, false).into_iter().map(T::from_f64).collect();
            let w: Vec<T> = inputs(cols, 0.5, 1.5, 6, false).into_iter().map(T::from_f64).collect();
            let b: Vec<T> = inputs(cols, -1.0, 1.0, 7, false).into_iter().map(T::from_f64).collect();
            // The shapes take turns: both affine parameters, none, the weight alone, the
            // bias alone (LayerNorm; RMSNorm has a weight or none).
            let (use_w, use_b) = [(true, true), (false, false), (true, false), (false, true)][i % 4];
            let affine = (use_w, use_b);
            let w = if use_w { w } else { vec![] };
            let b = if use_b { b } else { vec![] };
            let (dx, dw, db) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap(), exec.upload(&b).unwrap());
            let mut dy = exec.alloc::<T>(rows * cols).unwrap();
            let cfg = norm::launch_config::<T>(rows, cols).unwrap();
            if layer {
                let (w, b) = (use_w.then_some(&dw), use_b.then_some(&db));
                norm::layer_norm_rows::<T>(&exec, &dx, w, b, &mut dy, cols, 1e-5).unwrap();
            } else {
                norm::rms_norm::launch::<T>(&exec, cfg, &dx, &dw, &mut dy, cols as u32, 1e-5).unwrap();
            }
            let y = exec.download(&dy).unwrap();
            let f = |v: &Vec<T>| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            let bf = if layer { f(&b) } else { vec![] };
            let want = reference_norm(&f(&x), &f(&w), &bf, cols, 1e-5f32 as f64, layer);
            // Outputs are O(1..5): the f32 statistics (relative error ~3e-5, see the top)
            // carry into an absolute error of that order.
            assert_close_with(&y, &want, 3e-5, 1e-5, &format!("norm(layer={layer}, weight and bias={affine:?})<{}> {rows}x{cols} on {}", T::NAME, exec.name()));
        }
    }
}

#[test]
fn rms_norm_all_dtypes() {
    run_norm::<f32>(false);
    run_norm::<f16>(false);
    run_norm::<bf16>(false);
}

#[test]
fn layer_norm_all_dtypes() {
    run_norm::<f32>(true);
    run_norm::<f16>(true);
    run_norm::<bf16>(true);
}

/// A NaN in one row makes that row NaN, an inf gives what the reference gives (RMSNorm:
/// 0 for the finite entries, NaN for the inf one), and the other rows are untouched, for both norms on the tile and streaming paths.
#[test]
fn norms_contain_nan_and_inf_to_their_row() {
    for exec in executors() {
        for cols in [100, 40000] {
            let mut x: Vec<f32> = inputs(3 * cols, -2.0, 2.0, 11, false).into_iter().map(|v| v as f32).collect();
            x[7] = f32::NAN;
            x[2 * cols + 3] = f32::INFINITY;
            let xf: Vec<f64> = x.iter().map(|v| *v as f64).collect();
            let dx = exec.upload(&x).unwrap();
            for layer in [false, true] {
                let mut dy = exec.alloc::<f32>(x.len()).unwrap();
                let cfg = norm::launch_config::<f32>(3, cols).unwrap();
                let none = exec.upload::<f32>(&[]).unwrap();
                if layer {
                    norm::layer_norm_rows::<f32>(&exec, &dx, None, None, &mut dy, cols, 1e-6).unwrap();
                } else {
                    norm::rms_norm::launch::<f32>(&exec, cfg, &dx, &none, &mut dy, cols as u32, 1e-6).unwrap();
                }
                let y = exec.download(&dy).unwrap();
                let want = reference_norm(&xf, &[], &[], cols, 1e-6f32 as f64, layer);
                assert!(y[..cols].iter().all(|v| v.is_nan()), "the NaN row is NaN on {}", exec.name());
                assert!(y[cols..2 * cols].iter().all(|v| v.is_finite()), "the clean row stays finite on {}", exec.name());
                assert_close_with(&y, &want, 3e-5, 1e-5, &format!("layer={layer}, cols {cols} on {}", exec.name()));
            }
        }
    }
}


#[test]
fn row_kernels_reject_short_buffers() {
    let exec = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W64);
    let x = exec.upload(&[1.0f32; 10]).unwrap();
    let mut y = exec.alloc::<f32>(12).unwrap();
    let err = softmax::softmax::launch::<f32>(&exec, softmax::launch_config::<f32>(2, 6).unwrap(), &x, &mut y, 6).unwrap_err();
    assert!(err.to_string().contains("out of"), "{err}");
}

#[test]
fn checked_row_launchers_reject_bad_shapes_and_write_nothing() {
    let exec = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W32);
    let x = exec.upload(&[1.0f32; 12]).unwrap();
    let w = exec.upload(&[1.0f32; 4]).unwrap();
    let w5 = exec.upload(&[1.0f32; 5]).unwrap();
    let mut y = exec.upload(&[7.0f32; 12]).unwrap();
    let mut y10 = exec.upload(&[7.0f32; 10]).unwrap();
    let e = |r: Result<(), kernel_dsl::host::LaunchError>| r.unwrap_err().to_string();
    assert!(e(softmax::softmax_last_dim(&exec, &x, &mut y, 5)).contains("whole number of rows"));
    assert!(e(softmax::log_softmax_last_dim(&exec, &x, &mut y10, 4)).contains("output has 10"));
    assert!(e(softmax::softmax_last_dim(&exec, &x, &mut y, 0)).contains("0 columns"));
    assert!(e(norm::rms_norm_rows(&exec, &x, Some(&w5), &mut y, 4, 1e-5)).contains("weight has 5"));
    assert!(e(norm::layer_norm_rows(&exec, &x, Some(&w), Some(&w5), &mut y, 4, 1e-5)).contains("bias has 5"));
    assert!(e(norm::layer_norm_rows(&exec, &x, None, None, &mut y, 4, f32::NAN)).contains("eps"));
    assert_eq!(exec.download(&y).unwrap(), vec![7.0; 12], "nothing written");
    // The same calls with good shapes run: 3 rows of 4 ones.
    softmax::softmax_last_dim(&exec, &x, &mut y, 4).unwrap();
    assert_eq!(exec.download(&y).unwrap(), vec![0.25; 12]);
    norm::layer_norm_rows(&exec, &x, Some(&w), None, &mut y, 4, 1e-5).unwrap();
    assert_eq!(exec.download(&y).unwrap(), vec![0.0; 12]);
    // Empty tensors are a no-op.
    let (ex, mut ey) = (exec.upload::<f32>(&[]).unwrap(), exec.alloc::<f32>(0).unwrap());
    softmax::softmax_last_dim(&exec, &ex, &mut ey, 4).unwrap();
    norm::rms_norm_rows(&exec, &ex, None, &mut ey, 4, 1e-5).unwrap();
}

#[test]
fn layer_norm_tile_kernel_refuses_rows_longer_than_its_tiles() {
    let exec = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W64);
    // f32 rows past row::F32_WIDE_TILE_COLS hold 4 chunks of 8 per work-item: 32768 fit.
    let cols = 40000;
    let x = exec.upload(&vec![1.0f32; cols]).unwrap();
    let mut y = exec.alloc::<f32>(cols).unwrap();
    let none = exec.upload::<f32>(&[]).unwrap();
    let r = norm::layer_norm::launch::<f32>(&exec, norm::layer_norm_launch_config::<f32>(1, cols).unwrap(), &x, &none, &none, &mut y, cols as u32, 1e-5);
    assert!(r.is_err(), "a 40000-element row does not fit 1024 work-items x 32");
    // The checked launcher picks the streaming kernel for it.
    norm::layer_norm_rows::<f32>(&exec, &x, None, None, &mut y, cols, 1e-5).unwrap();
    assert!(exec.download(&y).unwrap().iter().all(|v| *v == 0.0));
}

/// For many short rows (`row::use_wave_rows`) the checked launchers run a wave per row: the same
/// references hold there, with a masked row, a NaN row and unaligned rows (cols 100 for
/// bf16 is 200 bytes, not a multiple of 16). Rows of 100 and 512 fit the lanes' register
/// tiles; 1000 streams on waves of 32 and fits on waves of 64. Rows of at most
/// `8 * wave size` (37, 100, 256; 512 on waves of 64) run several rows per wave for
/// softmax (`softmax_short`): 3 rows more than the minimum leave the last wave partial.
fn run_wave_rows<T: TestFloat>() {
    for cols in [37, 100, 256, 512, 1000] {
        run_wave_rows_of::<T>(cols);
    }
}

fn run_wave_rows_of<T: TestFloat>(cols: usize) {
    let rows = kernels::row::WAVE_ROWS_MIN + 3;
    for exec in executors() {
        let mut x: Vec<T> = inputs(rows * cols, -3.0, 3.0, 21, false).into_iter().map(T::from_f64).collect();
        for c in 50..cols {
            x[cols + c] = T::from_f64(f64::NEG_INFINITY);
        }
        x[5 * cols + 7] = T::from_f64(f64::NAN);
        let w: Vec<T> = inputs(cols, 0.5, 1.5, 22, false).into_iter().map(T::from_f64).collect();
        let b: Vec<T> = inputs(cols, -1.0, 1.0, 23, false).into_iter().map(T::from_f64).collect();
        let f = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
        let (xf, wf, bf) = (f(&x), f(&w), f(&b));
        let (dx, dw, db) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap(), exec.upload(&b).unwrap());
        let mut dy = exec.alloc::<T>(x.len()).unwrap();
        let what = |op: &str| format!("{op}<{}> wave rows {rows}x{cols} on {}", T::NAME, exec.name());
        softmax::softmax_last_dim(&exec, &dx, &mut dy, cols).unwrap();
        assert_close_with(&exec.download(&dy).unwrap(), &reference_softmax(&xf, cols, false), 3e-5, 1e-7, &what("softmax"));
        softmax::log_softmax_last_dim(&exec, &dx, &mut dy, cols).unwrap();
        assert_close_with(&exec.download(&dy).unwrap(), &reference_softmax(&xf, cols, true), 3e-5, 3e-5, &what("log_softmax"));
        // The masked row (-inf) poisons the norms of that row, as in the reference.
        norm::rms_norm_rows(&exec, &dx, Some(&dw), &mut dy, cols, 1e-5).unwrap();
        assert_close_with(&exec.download(&dy).unwrap(), &reference_norm(&xf, &wf, &[], cols, 1e-5f32 as f64, false), 3e-5, 1e-5, &what("rms_norm"));
        norm::layer_norm_rows(&exec, &dx, Some(&dw), Some(&db), &mut dy, cols, 1e-5).unwrap();
        assert_close_with(&exec.download(&dy).unwrap(), &reference_norm(&xf, &wf, &bf, cols, 1e-5f32 as f64, true), 3e-5, 1e-5, &what("layer_norm"));
    }
}

#[test]
fn wave_per_row_kernels_f32() {
    run_wave_rows::<f32>();
}

#[test]
fn wave_per_row_kernels_bf16() {
    run_wave_rows::<bf16>();
}

/// `layer_norm`'s bias stage (16-bit rows of whole chunks: the bias copied into shared
/// memory before the reduction, read back after it) against its absence and a stage too
/// small to use (both: bias loads from global memory after the reduction): every launch
/// must match the reference, with both parameters, the weight alone and the bias alone,
/// for rows that fill the tiles (4096 on 128 work-items, 2048 on 64) and rows that leave
/// padding chunks (136).
fn run_layer_norm_bias_stage<T: TestFloat>() {
    let rows = 3;
    for exec in executors() {
        for cols in [4096usize, 136, 2048] {
            let x: Vec<T> = inputs(rows * cols, -1.0, 5.0, 41 + cols as u64, false).into_iter().map(T::from_f64).collect();
            let w: Vec<T> = inputs(cols, 0.5, 1.5, 42, false).into_iter().map(T::from_f64).collect();
            let b: Vec<T> = inputs(cols, -1.0, 1.0, 43, false).into_iter().map(T::from_f64).collect();
            let f = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            let (dx, dw, db) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap(), exec.upload(&b).unwrap());
            let none = exec.upload::<T>(&[]).unwrap();
            let cfg = norm::layer_norm_launch_config::<T>(rows, cols).unwrap();
            let chunks = kernels::row::row_chunks_on(&exec, std::mem::size_of::<T>(), cols);
            let words = norm::bias_stage_words(&exec, true, cols, std::mem::size_of::<T>(), chunks, cfg.block.x);
            // AMD code objects keep 16-bit rows unpacked, without the stage.
            let amd = exec.name().starts_with("rocm");
            assert_eq!(words, if amd { 0 } else { chunks * cfg.block.x as usize }, "{cols} columns of {} on {}", T::NAME, exec.name());
            for (pw, pb) in [(true, true), (true, false), (false, true)] {
                let want = reference_norm(&f(&x), &if pw { f(&w) } else { vec![] }, &if pb { f(&b) } else { vec![] }, cols, 1e-5f32 as f64, true);
                for stage in [words, words.saturating_sub(1), 0] {
                    let mut dy = exec.upload(&vec![T::from_f64(f64::NAN); rows * cols]).unwrap();
                    let (w, b) = (if pw { &dw } else { &none }, if pb { &db } else { &none });
                    norm::layer_norm::launch::<T>(&exec, cfg.with_dynamic_shared(stage), &dx, w, b, &mut dy, cols as u32, 1e-5).unwrap();
                    let what = format!("layer_norm<{}> {rows}x{cols}, weight {pw} bias {pb}, stage of {stage} words, on {}", T::NAME, exec.name());
                    assert_close_with(&exec.download(&dy).unwrap(), &want, 3e-5, 1e-5, &what);
                }
            }
        }
    }
}

/// LayerNorm of 16-bit rows whose mean is large against their spread (the packed path's
/// two-multiply-add form applies only where rounding `mean / std` costs nothing a 16-bit
/// output can show): a constant row (its output is the bias exactly, as `x - mean` is 0),
/// a row of 1000 +- 8 and one of 200 +- 1, at 4096 columns (whole tiles) and 136 (padding).
fn run_layer_norm_large_mean<T: TestFloat>() {
    for exec in executors() {
        for cols in [4096usize, 136] {
            let spread = |centre: f64, half: f64, seed: u64| inputs(cols, centre - half, centre + half, seed, false);
            let rows: Vec<Vec<f64>> = vec![vec![1000.0; cols], spread(1000.0, 8.0, 51), spread(200.0, 1.0, 52), vec![-384.0; cols]];
            let x: Vec<T> = rows.concat().into_iter().map(T::from_f64).collect();
            let w: Vec<T> = inputs(cols, 0.5, 1.5, 53, false).into_iter().map(T::from_f64).collect();
            let b: Vec<T> = inputs(cols, -1.0, 1.0, 54, false).into_iter().map(T::from_f64).collect();
            let f = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            let (dx, dw, db) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap(), exec.upload(&b).unwrap());
            let mut dy = exec.alloc::<T>(x.len()).unwrap();
            norm::layer_norm_rows(&exec, &dx, Some(&dw), Some(&db), &mut dy, cols, 1e-5).unwrap();
            let want = reference_norm(&f(&x), &f(&w), &f(&b), cols, 1e-5f32 as f64, true);
            let what = format!("layer_norm<{}> of rows with a large mean, {cols} columns, on {}", T::NAME, exec.name());
            assert_close_with(&exec.download(&dy).unwrap(), &want, 3e-5, 1e-5, &what);
        }
    }
}

#[test]
fn layer_norm_of_rows_with_a_large_mean() {
    run_layer_norm_large_mean::<f16>();
    run_layer_norm_large_mean::<bf16>();
}

#[test]
fn layer_norm_bias_stage_matches_global_bias_loads() {
    run_layer_norm_bias_stage::<f16>();
    run_layer_norm_bias_stage::<bf16>();
}

/// Zeros keep their sign through RMSNorm and LayerNorm without a bias, as in Candle's
/// `x * rstd * w`: `-0` in gives `-0` out (a bias-less affine map adds `-0`, the additive
/// identity; adding `+0` turned `-0` products into `+0`), `+0` stays `+0`, on the tile and
/// streaming paths, with and without a weight.
#[test]
fn norms_keep_the_sign_of_zero() {
    fn check<T: TestFloat>() {
        for exec in executors() {
            for cols in [64, 4096, 40000] {
                let mut x: Vec<T> = inputs(2 * cols, -2.0, 2.0, 13, false).into_iter().map(T::from_f64).collect();
                let zeros = [0, 5, cols + 1, 2 * cols - 1];
                for (n, &i) in zeros.iter().enumerate() {
                    x[i] = T::from_f64(if n % 2 == 0 { -0.0 } else { 0.0 });
                }
                let w: Vec<T> = inputs(cols, 0.5, 1.5, 14, false).into_iter().map(T::from_f64).collect();
                let dx = exec.upload(&x).unwrap();
                for (use_w, layer) in [(false, false), (true, false), (false, true)] {
                    if layer && cols != 64 {
                        continue;
                    }
                    // LayerNorm: a row whose mean is 0 exactly keeps x - mean = x.
                    let x_layer: Vec<T> = if layer {
                        let mut v = vec![T::from_f64(1.0); 2 * cols];
                        for r in 0..2 {
                            for c in 0..cols / 2 {
                                v[r * cols + cols / 2 + c] = T::from_f64(-1.0);
                            }
                        }
                        v[0] = T::from_f64(-0.0);
                        v[cols / 2] = T::from_f64(-0.0);
                        v[cols + 1] = T::from_f64(0.0);
                        v[cols + cols / 2 + 1] = T::from_f64(-0.0);
                        v
                    } else {
                        x.clone()
                    };
                    let dxl = exec.upload(&x_layer).unwrap();
                    let dw = exec.upload(if use_w { &w[..] } else { &[] }).unwrap();
                    let mut dy = exec.alloc::<T>(2 * cols).unwrap();
                    if layer {
                        norm::layer_norm_rows::<T>(&exec, &dxl, None, None, &mut dy, cols, 1e-5).unwrap();
                    } else {
                        let cfg = norm::launch_config::<T>(2, cols).unwrap();
                        norm::rms_norm::launch::<T>(&exec, cfg, &dx, &dw, &mut dy, cols as u32, 1e-5).unwrap();
                    }
                    let y = exec.download(&dy).unwrap();
                    let src = if layer { &x_layer } else { &x };
                    for (i, (xi, yi)) in src.iter().zip(&y).enumerate() {
                        if xi.to_f64() == 0.0 {
                            assert_eq!(
                                yi.to_f64().is_sign_negative(),
                                xi.to_f64().is_sign_negative(),
                                "{} of {:?} at {i} gave {:?} (layer={layer}, weight={use_w}, cols {cols}) on {}",
                                if layer { "LayerNorm" } else { "RMSNorm" },
                                xi,
                                yi,
                                exec.name()
                            );
                        }
                    }
                }
            }
        }
    }
    check::<f32>();
    check::<f16>();
    check::<bf16>();
}

/// GroupNorm over `(b, c, spatial)` in f64, SiLU after the affine map when `silu`.
#[allow(clippy::too_many_arguments)]
fn reference_group_norm(x: &[f64], w: &[f64], b: &[f64], (c, spatial): (usize, usize), groups: usize, eps: f64, silu: bool) -> Vec<f64> {
    let len = c / groups * spatial;
    let mut out = Vec::with_capacity(x.len());
    for (bg, grp) in x.chunks(len).enumerate() {
        let mean = grp.iter().sum::<f64>() / len as f64;
        let var = grp.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (e, v) in grp.iter().enumerate() {
            let ch = (bg % groups) * (c / groups) + e / spatial;
            let g = if w.is_empty() { 1.0 } else { w[ch] };
            let h = if b.is_empty() { 0.0 } else { b[ch] };
            let y = (v - mean) * rstd * g + h;
            out.push(if silu { y / (1.0 + (-y).exp()) } else { y });
        }
    }
    out
}

fn run_group_norm<T: TestFloat>() {
    // (batch, channels, spatial, groups): groups shorter than the work-group, spatial
    // extents shorter than it (a work-item crosses several channels per step) and longer.
    let shapes = [(2, 6, 35, 3), (1, 4, 300, 2), (2, 80, 16, 2), (1, 32, 1, 32), (3, 10, 64, 1)];
    for exec in executors() {
        for (i, &(b, c, spatial, groups)) in shapes.iter().enumerate() {
            // Shifted inputs (mean 4, spread 1) so the centring matters.
            let x: Vec<T> = inputs(b * c * spatial, 3.5, 4.5, 11 + i as u64, false).into_iter().map(T::from_f64).collect();
            let w: Vec<T> = inputs(c, 0.5, 1.5, 12, false).into_iter().map(T::from_f64).collect();
            let bias: Vec<T> = inputs(c, -1.0, 1.0, 13, false).into_iter().map(T::from_f64).collect();
            let affine = i % 2 == 0;
            let silu = i % 3 != 1;
            let (dx, dw, db) = (exec.upload(&x).unwrap(), exec.upload(&w).unwrap(), exec.upload(&bias).unwrap());
            let mut dy = exec.alloc::<T>(x.len()).unwrap();
            let (pw, pb): (Option<&dyn kernel_dsl::host::KernelArgSlice<T>>, Option<&dyn kernel_dsl::host::KernelArgSlice<T>>) = if affine { (Some(&dw), Some(&db)) } else { (None, None) };
            norm::group_norm_rows::<T>(&exec, &dx, pw, pb, &mut dy, (c, spatial), groups, 1e-5, silu).unwrap();
            let y = exec.download(&dy).unwrap();
            let f = |v: &Vec<T>| v.iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            let (fw, fb) = if affine { (f(&w), f(&bias)) } else { (vec![], vec![]) };
            let want = reference_group_norm(&f(&x), &fw, &fb, (c, spatial), groups, 1e-5f32 as f64, silu);
            // Outputs are O(1..3): the f32 statistics of the shifted sums (groups of up to
            // 800 elements, relative error well below 1e-5) carry into the absolute error.
            assert_close_with(&y, &want, 3e-5, 2e-5, &format!("group_norm<{}> b{b} c{c} s{spatial} g{groups} affine {affine} silu {silu} on {}", T::NAME, exec.name()));
        }
    }
}

#[test]
fn group_norm_all_dtypes_with_and_without_silu() {
    run_group_norm::<f32>();
    run_group_norm::<f16>();
    run_group_norm::<bf16>();
}

#[test]
fn group_norm_rejects_bad_shapes_and_writes_nothing() {
    let exec = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W32);
    let x = exec.upload(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]).unwrap();
    let w3 = exec.upload(&[1.0f32; 3]).unwrap();
    let mut y = exec.upload(&[7.0f32; 12]).unwrap();
    let mut y10 = exec.upload(&[7.0f32; 10]).unwrap();
    let e = |r: Result<(), kernel_dsl::host::LaunchError>| r.unwrap_err().to_string();
    assert!(e(norm::group_norm_rows::<f32>(&exec, &x, None, None, &mut y, (4, 3), 3, 1e-5, false)).contains("groups"));
    assert!(e(norm::group_norm_rows::<f32>(&exec, &x, Some(&w3), None, &mut y, (4, 3), 2, 1e-5, false)).contains("weight has 3"));
    assert!(e(norm::group_norm_rows::<f32>(&exec, &x, None, None, &mut y, (5, 2), 1, 1e-5, false)).contains("whole number"));
    assert!(e(norm::group_norm_rows::<f32>(&exec, &x, None, None, &mut y10, (4, 3), 2, 1e-5, false)).contains("output has 10"));
    assert!(e(norm::group_norm_rows::<f32>(&exec, &x, None, None, &mut y, (4, 3), 2, -1.0, false)).contains("eps"));
    assert_eq!(exec.download(&y).unwrap(), vec![7.0; 12], "nothing written");
    assert_eq!(exec.download(&y10).unwrap(), vec![7.0; 10], "nothing written");
    // Good shapes run: two groups of 1..6 and 7..12, each normalised to the same values.
    norm::group_norm_rows::<f32>(&exec, &x, None, None, &mut y, (4, 3), 2, 0.0, false).unwrap();
    let y = exec.download(&y).unwrap();
    let sd = (35.0f64 / 12.0).sqrt();
    for (i, v) in y.iter().enumerate() {
        let want = ((i % 6) as f64 - 2.5) / sd;
        assert!((*v as f64 - want).abs() < 1e-5, "element {i}: {v} vs {want}");
    }
}
