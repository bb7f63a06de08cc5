//! The LLM kernels (`kernels::llm`) against f64 host references, on the CPU executor with
//! waves of 32 and 64 lanes and on any GPU this build can open.
//!
//! Tolerances:
//! - `dense_matvec`: inputs are exact in `T`; products are exact in `f32` and sums over `K`
//!   terms add at most `(K + 16) * 2^-23` times the sum of the absolute products (the
//!   recursive-sum bound with one unit in the last place per add, as a matrix unit that
//!   truncates instead of rounding may; the kernel's chains are shorter), then one rounding
//!   to `T` (`T::REL`, `T::ABS`). Run on the CPU executor with waves of 32 and 64 and with
//!   its `mma.sync` emulation (the matrix-unit path NVIDIA GPUs take).
//! - `add_rms_norm`: the new residual must be exactly `T(x + r)` (Candle's add: one `f32`
//!   add, one rounding); the normed values one rounding of `T` plus `1e-5` relative for the
//!   `f32` sum of squares and `rsqrt`.
//! - `silu_mul`: one rounding of `T` plus `4e-6` relative (`f32` `exp`, division, product).
//! - `dense_matvec_gated`: the two products' `dense_matvec` bounds carried through `SiLU(g)
//!   * u` (first order), plus `silu_mul`'s `4e-6` relative and one rounding of `T`.
//! - `sample`: argmax exact; top-k / top-p / min-p never pick a token outside the set the
//!   f64 reference keeps (top-p: with `1e-4` slack on the cumulative mass, for the kernel's
//!   `f32` sums); the same key gives the same tokens; over many keys the frequencies of a
//!   small softmax stay within 5 standard deviations (`5 sqrt(p (1 - p) / n)`) of its
//!   probabilities.
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, Executor, LaunchError, MatrixUnit, WaveSize};
use kernels::llm::ops::{self, SamplingParams};
use kernels::runtime::Device;

mod common;
use common::{executors, TestFloat};

/// Deterministic pseudo-random numbers.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn vec<T: TestFloat>(&mut self, n: usize, scale: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.unit() * scale)).collect()
    }
}

fn f64s<T: TestFloat>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Checks `got` against the f64 `want` within one rounding of `T` plus `extra[i]`.
fn check<T: TestFloat>(got: &[T], want: &[f64], extra: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        let tol = T::ABS + T::REL * w.abs() + extra[i];
        assert!((g - w).abs() <= tol, "{what}: element {i}: got {g:e}, want {w:e} (tolerance {tol:e})");
    }
}

/// `y = x W^T + b` in f64, and the error bound of an f32 evaluation of each output.
fn matvec_reference(w: &[f64], x: &[f64], b: Option<&[f64]>, rows: usize, cols: usize, batch: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; batch * rows];
    let mut bound = vec![0.0; batch * rows];
    for bi in 0..batch {
        for r in 0..rows {
            let (mut s, mut a) = (0.0, 0.0);
            for k in 0..cols {
                let p = w[r * cols + k] * x[bi * cols + k];
                s += p;
                a += p.abs();
            }
            let bias = b.map_or(0.0, |b| b[r]);
            y[bi * rows + r] = s + bias;
            bound[bi * rows + r] = (cols as f64 + 16.0) * 2f64.powi(-23) * (a + bias.abs());
        }
    }
    (y, bound)
}

/// The executors of the matrix-unit matvec: the CPU executor's `mma.sync` emulation and
/// any CUDA device.
fn mma_executors() -> Vec<Device> {
    let mut v = vec![Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync))];
    v.extend(executors().into_iter().filter(|d| d.name().starts_with("cuda")));
    v
}

fn run_matvec<T: TestFloat>(dev: &Device, rows: usize, cols: usize, batch: usize, with_bias: bool, x_offset: usize, seed: u64) {
    run_matvec_tiled::<T>(dev, rows, cols, batch, with_bias, x_offset, seed, ops::MAX_ROWS)
}

#[allow(clippy::too_many_arguments)]
fn run_matvec_tiled<T: TestFloat>(dev: &Device, rows: usize, cols: usize, batch: usize, with_bias: bool, x_offset: usize, seed: u64, tile: usize) {
    run_matvec_team::<T>(dev, rows, cols, batch, with_bias, x_offset, seed, tile, None)
}

/// One product against the f64 reference; `team`: that many work-items per row tile
/// instead of the launcher's choice.
#[allow(clippy::too_many_arguments)]
fn run_matvec_team<T: TestFloat>(dev: &Device, rows: usize, cols: usize, batch: usize, with_bias: bool, x_offset: usize, seed: u64, tile: usize, team: Option<usize>) {
    let mut rng = Rng(seed);
    let w: Vec<T> = rng.vec(rows * cols, 1.0);
    let x: Vec<T> = rng.vec(batch * cols + x_offset, 1.0);
    let b: Vec<T> = rng.vec(rows, 1.0);
    let (wd, xd, bd) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap(), dev.upload(&b).unwrap());
    let mut yd = dev.alloc::<T>(batch * rows).unwrap();
    let xv = xd.view(x_offset..).unwrap();
    let bias = if with_bias { Some(&bd as &dyn kernel_dsl::host::KernelArgSlice<T>) } else { None };
    match team {
        None => ops::dense_matvec_tiled(dev, &wd, &xv, bias, &mut yd, rows, cols, batch, tile).unwrap(),
        // tile 0: the matrix-unit kernel.
        Some(t) if tile == 0 => ops::dense_matvec_mma(dev, &wd, &xv, bias, &mut yd, rows, cols, batch, t).unwrap(),
        Some(t) => ops::dense_matvec_team(dev, &wd, &xv, bias, &mut yd, rows, cols, batch, tile, t).unwrap(),
    }
    let y = dev.download(&yd).unwrap();
    let bf = f64s(&b);
    let (want, bound) = matvec_reference(&f64s(&w), &f64s(&x[x_offset..]), with_bias.then_some(&bf[..]), rows, cols, batch);
    check(&y, &want, &bound, &format!("dense_matvec {} {rows}x{cols} batch {batch} tile {tile} team {team:?} bias {with_bias} offset {x_offset} wave {}", T::NAME, dev.wave_lanes()));
}

#[test]
fn dense_matvec_in_smaller_batch_tiles() {
    for dev in executors() {
        for batch in [3, 5, 7, 8] {
            run_matvec_tiled::<bf16>(&dev, 13, 200, batch, true, 0, batch as u64, 4);
            run_matvec_tiled::<f16>(&dev, 9, 64, batch, false, 0, batch as u64 + 2, 2);
            run_matvec_tiled::<f32>(&dev, 6, 96, batch, false, 1, batch as u64 + 1, 4);
        }
    }
}

#[test]
fn dense_matvec_every_batch_odd_rows_and_widths() {
    // Every batch 1..=8 in one launch, f16 and bf16: rows not a multiple of the row tile,
    // widths of whole chunks (vector path) and odd widths (element path), a partial last
    // round of chunks; several row tiles per work-group and teams wider than a wave.
    let shapes = [(5, 8), (7, 104), (13, 1000), (37, 1001), (3, 4099), (66, 3000)];
    for dev in executors() {
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            for batch in 1..=8 {
                let seed = (i * 16 + batch) as u64 + 1000;
                run_matvec::<f16>(&dev, rows, cols, batch, batch % 2 == 0, 0, seed);
                run_matvec::<bf16>(&dev, rows, cols, batch, batch % 3 == 0, 0, seed + 1);
            }
        }
    }
}

#[test]
fn dense_matvec_every_team() {
    // Teams narrower than, as wide as and wider than a wave of 32 or 64 lanes: the
    // segmented shuffles, the shared-memory sums and the rows past the end of a tile.
    for dev in executors() {
        for team in [8, 16, 32, 64, 128, 256] {
            for batch in [1, 4, 6, 8] {
                let seed = (team + batch) as u64;
                run_matvec_team::<bf16>(&dev, 23, 1032, batch, true, 0, seed, 8, Some(team));
                run_matvec_team::<f16>(&dev, 10, 517, batch, false, 0, seed + 1, 8, Some(team));
            }
            run_matvec_team::<f32>(&dev, 9, 264, 3, true, 0, team as u64 + 7, 8, Some(team));
        }
    }
}

#[test]
fn dense_matvec_all_dtypes_and_shapes() {
    // Widths: below a chunk, odd, whole chunks, several unrolled rounds with a partial one;
    // row counts that leave the last work-group partly empty (groups of 1..8 rows).
    let shapes = [(1, 1), (3, 5), (7, 8), (5, 24), (9, 200), (33, 1030), (17, 2048), (6, 4096)];
    for dev in executors() {
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            for batch in [1, 2, 3, 5, 8] {
                let seed = (i * 16 + batch) as u64;
                run_matvec::<f32>(&dev, rows, cols, batch, batch % 2 == 1, 0, seed);
                run_matvec::<f16>(&dev, rows, cols, batch, batch == 2, 0, seed);
                run_matvec::<bf16>(&dev, rows, cols, batch, batch == 5, 0, seed);
            }
        }
    }
}

#[test]
fn dense_matvec_misaligned_activations_take_the_scalar_path() {
    for dev in executors() {
        // x starts one element past a 16-byte boundary: whole chunks, but not aligned.
        run_matvec::<f16>(&dev, 11, 64, 3, true, 1, 7);
        run_matvec::<f32>(&dev, 11, 64, 1, false, 1, 8);
        run_matvec::<bf16>(&dev, 5, 1000, 8, true, 3, 9);
    }
}

#[test]
fn dense_matvec_mma_every_batch_and_team() {
    // The matrix-unit kernel (NVIDIA's f16/bf16 path): every batch 1..=8 in one launch, row
    // counts that leave tiles of 16 and work-groups partly empty, widths of one to many
    // 64-element steps with a partial last one, every team (1 to 8 warps per 16-row tile).
    for dev in mma_executors() {
        for team in [8, 16, 32, 64, 128, 256] {
            for batch in 1..=8 {
                let seed = (team * 10 + batch) as u64;
                run_matvec_team::<bf16>(&dev, 37, 328, batch, batch % 2 == 1, 0, seed, 0, Some(team));
                run_matvec_team::<f16>(&dev, 21, 1000, batch, batch % 3 == 0, 0, seed + 1, 0, Some(team));
            }
        }
        run_matvec_team::<bf16>(&dev, 1, 8, 1, true, 0, 3, 0, Some(8));
        run_matvec_team::<f16>(&dev, 133, 2048, 8, false, 0, 4, 0, Some(8));
    }
}

#[test]
fn dense_matvec_mma_rejects_what_it_cannot_take() {
    let dev = Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync));
    let w = dev.upload(&[f16::ONE; 36]).unwrap();
    let x = dev.upload(&[f16::ONE; 24]).unwrap();
    let mut y = dev.upload(&[f16::ZERO; 6]).unwrap();
    // Width not a multiple of 8, a bad team, a bad batch.
    assert!(names(&ops::dense_matvec_mma(&dev, &w, &x, None, &mut y, 3, 12, 2, 8).unwrap_err(), "multiple of 8"));
    assert!(names(&ops::dense_matvec_mma(&dev, &w, &x, None, &mut y, 3, 12, 2, 12).unwrap_err(), "`team`"));
    assert!(names(&ops::dense_matvec_mma(&dev, &w, &x, None, &mut y, 3, 12, 9, 8).unwrap_err(), "`batch`"));
    let w64 = Device::cpu(WaveSize::W64);
    let (wd, xd) = (w64.upload(&[f16::ONE; 48]).unwrap(), w64.upload(&[f16::ONE; 16]).unwrap());
    let mut yd = w64.upload(&[f16::ZERO; 6]).unwrap();
    assert!(names(&ops::dense_matvec_mma(&w64, &wd, &xd, None, &mut yd, 3, 16, 1, 8).unwrap_err(), "waves of 32"));
    assert_eq!(dev.download(&y).unwrap(), vec![f16::ZERO; 6]);
}

#[test]
fn dense_matvec_wave_as_on_amd() {
    // The kernel AMD GPUs run: every batch 1..=8 in tiles of 4 (and 1, 2), aligned and odd
    // widths, waves of 32 and 64.
    for dev in executors() {
        for batch in 1..=8 {
            for (i, &(rows, cols, tile)) in [(13, 200, 4), (9, 1001, 4), (33, 1030, 2), (5, 64, 1)].iter().enumerate() {
                let seed = (batch * 8 + i) as u64 + 500;
                let mut rng = Rng(seed);
                let w: Vec<bf16> = rng.vec(rows * cols, 1.0);
                let x: Vec<bf16> = rng.vec(batch * cols, 1.0);
                let (wd, xd) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap());
                let mut yd = dev.alloc::<bf16>(batch * rows).unwrap();
                ops::dense_matvec_wave_tiled(&dev, &wd, &xd, None, &mut yd, rows, cols, batch, tile).unwrap();
                let (want, bound) = matvec_reference(&f64s(&w), &f64s(&x), None, rows, cols, batch);
                check(&dev.download(&yd).unwrap(), &want, &bound, &format!("dense_matvec_wave {rows}x{cols} batch {batch} tile {tile} wave {}", dev.wave_lanes()));
            }
        }
    }
}

#[test]
fn dense_matvec_team_sizes() {
    use kernels::llm::matvec_team;
    // Few rows: wide teams (enough work-items in flight); many rows: narrow ones.
    assert_eq!(matvec_team(2048, 2048), 256);
    assert_eq!(matvec_team(4096, 4096), 128);
    assert_eq!(matvec_team(4096, 14336), 128);
    assert_eq!(matvec_team(14336, 4096), 64);
    assert_eq!(matvec_team(128256, 4096), 8);
    assert_eq!(matvec_team(512, 2048), 256);
    // Never wider than the row has chunks (but at least the minimum).
    assert_eq!(matvec_team(512, 300), 64);
    assert_eq!(matvec_team(4, 8), 8);
}

/// `true` when `err` is an invalid-argument error whose reason names `arg`.
fn names(err: &LaunchError, arg: &str) -> bool {
    matches!(err, LaunchError::InvalidArgument { reason, .. } if reason.contains(arg))
}

#[test]
fn dense_matvec_rejects_bad_shapes_and_writes_nothing() {
    let dev = Device::cpu(WaveSize::W32);
    let w = dev.upload(&[1f32; 12]).unwrap();
    let x = dev.upload(&[1f32; 8]).unwrap();
    let b = dev.upload(&[1f32; 2]).unwrap();
    let mut y = dev.upload(&[7f32; 6]).unwrap();
    let mut y5 = dev.upload(&[7f32; 5]).unwrap();
    let cases: Vec<(Result<(), LaunchError>, &str)> = vec![
        (ops::dense_matvec(&dev, &w, &x, None, &mut y5, 3, 4, 2), "y"),
        (ops::dense_matvec(&dev, &w, &x, None, &mut y, 4, 4, 2), "w"),
        (ops::dense_matvec(&dev, &w, &x, None, &mut y, 6, 2, 3), "x"),
        (ops::dense_matvec(&dev, &w, &x, Some(&b), &mut y, 3, 4, 2), "bias"),
        (ops::dense_matvec(&dev, &w, &x, None, &mut y, 3, 4, 0), "batch"),
        (ops::dense_matvec(&dev, &w, &x, None, &mut y, 3, 4, 9), "batch"),
        (ops::dense_matvec_team(&dev, &w, &x, None, &mut y, 3, 4, 2, 8, 48), "team"),
        (ops::dense_matvec_team(&dev, &w, &x, None, &mut y, 3, 4, 2, 8, 4), "team"),
        (ops::dense_matvec_team(&dev, &w, &x, None, &mut y, 3, 4, 2, 3, 8), "tile"),
    ];
    for (r, arg) in cases {
        let e = r.expect_err(arg);
        assert!(names(&e, &format!("`{arg}`")), "{e}");
    }
    assert_eq!(dev.download(&y).unwrap(), vec![7f32; 6]);
    assert_eq!(dev.download(&y5).unwrap(), vec![7f32; 5]);
}

fn run_add_rms_norm<T: TestFloat>(dev: &Device, rows: usize, cols: usize, with_weight: bool, seed: u64) {
    let mut rng = Rng(seed);
    let x: Vec<T> = rng.vec(rows * cols, 2.0);
    let r: Vec<T> = rng.vec(rows * cols, 2.0);
    let wt: Vec<T> = rng.vec(cols, 1.5);
    let (xd, rd, wd) = (dev.upload(&x).unwrap(), dev.upload(&r).unwrap(), dev.upload(&wt).unwrap());
    let (mut hd, mut od) = (dev.alloc::<T>(rows * cols).unwrap(), dev.alloc::<T>(rows * cols).unwrap());
    let weight = if with_weight { Some(&wd as &dyn kernel_dsl::host::KernelArgSlice<T>) } else { None };
    let eps = 1e-5;
    ops::add_rms_norm(dev, &xd, &rd, weight, &mut hd, &mut od, cols, eps).unwrap();
    let (h, o) = (dev.download(&hd).unwrap(), dev.download(&od).unwrap());
    let what = format!("add_rms_norm {} {rows}x{cols} weight {with_weight} wave {}", T::NAME, dev.wave_lanes());
    let want_h: Vec<T> = x.iter().zip(&r).map(|(a, b)| T::from_f32(a.to_f32() + b.to_f32())).collect();
    assert_eq!(h, want_h, "{what}: residual");
    let mut want = vec![0.0; rows * cols];
    for i in 0..rows {
        let hr = &want_h[i * cols..(i + 1) * cols];
        let ms = hr.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / cols as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        for j in 0..cols {
            want[i * cols + j] = hr[j].to_f64() * s * if with_weight { wt[j].to_f64() } else { 1.0 };
        }
    }
    let extra: Vec<f64> = want.iter().map(|w| 1e-5 * w.abs()).collect();
    check(&o, &want, &extra, &what);
}

#[test]
fn add_rms_norm_all_dtypes() {
    for dev in executors() {
        // Decode's rows (1..64 of 2048 / 4096: the register tiles), rows of whole chunks
        // that fill part of a tile (2056), odd widths (the tile kernel's element loop),
        // and rows past the tiles (8193: the work-group-per-row kernel).
        for (i, &(rows, cols)) in [(1, 1), (3, 7), (2, 64), (5, 1000), (2, 4096), (1, 5000), (8, 2048), (2, 8192), (1, 8193), (1, 2048), (64, 2048), (33, 4096), (3, 2056), (2, 16384)].iter().enumerate() {
            run_add_rms_norm::<f32>(&dev, rows, cols, true, i as u64);
            run_add_rms_norm::<f16>(&dev, rows, cols, i % 2 == 0, i as u64 + 10);
            run_add_rms_norm::<bf16>(&dev, rows, cols, true, i as u64 + 20);
        }
    }
}

/// Rows that are not 16-byte aligned (views one element in): the tile kernel's element
/// loop, with the same results as the aligned rows' vector path.
#[test]
fn add_rms_norm_misaligned_views() {
    for dev in executors() {
        let (rows, cols) = (3, 2048);
        let mut rng = Rng(77);
        let x: Vec<bf16> = rng.vec(rows * cols + 1, 2.0);
        let r: Vec<bf16> = rng.vec(rows * cols + 1, 2.0);
        let wt: Vec<bf16> = rng.vec(cols, 1.5);
        let (xd, rd, wd) = (dev.upload(&x).unwrap(), dev.upload(&r).unwrap(), dev.upload(&wt).unwrap());
        let mut outs = Vec::new();
        for at in [0usize, 1] {
            let (mut hd, mut od) = (dev.alloc::<bf16>(rows * cols + 1).unwrap(), dev.alloc::<bf16>(rows * cols + 1).unwrap());
            let n = rows * cols;
            ops::add_rms_norm(&dev, &xd.view(at..at + n).unwrap(), &rd.view(at..at + n).unwrap(), Some(&wd), &mut hd.view_mut(at..at + n).unwrap(), &mut od.view_mut(at..at + n).unwrap(), cols, 1e-5).unwrap();
            let (h, o) = (dev.download(&hd).unwrap(), dev.download(&od).unwrap());
            outs.push((h[at..at + n].to_vec(), o[at..at + n].to_vec()));
        }
        // The rows differ by one element: compare each against its own reference.
        for (at, (h, o)) in outs.iter().enumerate() {
            let n = rows * cols;
            let want_h: Vec<bf16> = x[at..at + n].iter().zip(&r[at..at + n]).map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32())).collect();
            assert_eq!(h, &want_h, "view at {at} on {}: residual", dev.name());
            let mut want = vec![0.0; n];
            for i in 0..rows {
                let hr = &want_h[i * cols..(i + 1) * cols];
                let s = 1.0 / (hr.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / cols as f64 + 1e-5).sqrt();
                for j in 0..cols {
                    want[i * cols + j] = hr[j].to_f64() * s * wt[j].to_f64();
                }
            }
            let extra: Vec<f64> = want.iter().map(|w| 1e-5 * w.abs()).collect();
            check(o, &want, &extra, &format!("add_rms_norm view at {at} on {}", dev.name()));
        }
    }
}

#[test]
fn add_rms_norm_rejects_bad_shapes_and_writes_nothing() {
    let dev = Device::cpu(WaveSize::W64);
    let x = dev.upload(&[1f32; 8]).unwrap();
    let r7 = dev.upload(&[1f32; 7]).unwrap();
    let w3 = dev.upload(&[1f32; 3]).unwrap();
    let mut h = dev.upload(&[5f32; 8]).unwrap();
    let mut o = dev.upload(&[5f32; 8]).unwrap();
    let e = ops::add_rms_norm(&dev, &x, &r7, None, &mut h, &mut o, 4, 1e-5).unwrap_err();
    assert!(names(&e, "`residual`"), "{e}");
    let e = ops::add_rms_norm(&dev, &x, &x, Some(&w3), &mut h, &mut o, 4, 1e-5).unwrap_err();
    assert!(names(&e, "`weight`"), "{e}");
    let e = ops::add_rms_norm(&dev, &x, &x, None, &mut h, &mut o, 3, 1e-5).unwrap_err();
    assert!(names(&e, "`x`"), "{e}");
    let e = ops::add_rms_norm(&dev, &x, &x, None, &mut h, &mut o, 4, f32::NAN).unwrap_err();
    assert!(names(&e, "`eps`"), "{e}");
    assert_eq!(dev.download(&h).unwrap(), vec![5f32; 8]);
    assert_eq!(dev.download(&o).unwrap(), vec![5f32; 8]);
}

fn run_silu_mul<T: TestFloat>(dev: &Device, rows: usize, inter: usize, seed: u64) {
    let mut rng = Rng(seed);
    let gu: Vec<T> = rng.vec(rows * 2 * inter, 6.0);
    let gd = dev.upload(&gu).unwrap();
    let mut od = dev.alloc::<T>(rows * inter).unwrap();
    ops::silu_mul(dev, &gd, &mut od, inter).unwrap();
    let o = dev.download(&od).unwrap();
    let mut want = vec![0.0; rows * inter];
    for r in 0..rows {
        for j in 0..inter {
            let (g, u) = (gu[r * 2 * inter + j].to_f64(), gu[r * 2 * inter + inter + j].to_f64());
            want[r * inter + j] = g / (1.0 + (-g).exp()) * u;
        }
    }
    let extra: Vec<f64> = want.iter().map(|w| 4e-6 * w.abs()).collect();
    check(&o, &want, &extra, &format!("silu_mul {} {rows}x{inter} wave {}", T::NAME, dev.wave_lanes()));
}

#[test]
fn silu_mul_all_dtypes() {
    for dev in executors() {
        for (i, &(rows, inter)) in [(1, 1), (3, 7), (2, 300), (4, 1000)].iter().enumerate() {
            run_silu_mul::<f32>(&dev, rows, inter, i as u64);
            run_silu_mul::<f16>(&dev, rows, inter, i as u64 + 5);
            run_silu_mul::<bf16>(&dev, rows, inter, i as u64 + 9);
        }
        let g = dev.upload(&[1f32; 8]).unwrap();
        let mut o = dev.upload(&[3f32; 2]).unwrap();
        let e = ops::silu_mul(&dev, &g, &mut o, 2).unwrap_err();
        assert!(names(&e, "`out`"), "{e}");
        let e = ops::silu_mul(&dev, &g, &mut o, 3).unwrap_err();
        assert!(names(&e, "`gu`"), "{e}");
        assert_eq!(dev.download(&o).unwrap(), vec![3f32; 2]);
    }
}

/// q8_1 codes of `x` as `quantize_q8_1` writes them (the reference of the fused kernels).
fn quantize_ref<T: TestFloat>(dev: &Device, x: &kernels::runtime::DeviceVec<T>) -> (Vec<u32>, Vec<f32>) {
    let n = x.len();
    let (mut xq, mut xds) = (dev.alloc::<u32>(n / 4).unwrap(), dev.alloc::<f32>(n / 16).unwrap());
    kernels::quantized::ops::quantize_q8_1(dev, x, &mut xq, &mut xds).unwrap();
    (dev.download(&xq).unwrap(), dev.download(&xds).unwrap())
}

/// Whether `add_rms_norm_q8` takes rows of `cols` elements of `T` on the CPU executor
/// (rows that fit the tiles of 256 work-items).
fn q8_norm_fits<T>(cols: usize) -> bool {
    cols <= kernels::llm::ADD_NORM_TILE_THREADS * kernels::row::CHUNK * kernels::row::row_chunks(std::mem::size_of::<T>(), cols)
}

/// `add_rms_norm_q8` with and without a residual: the residual exactly `T(x + r)`, the
/// normed row bit for bit `add_rms_norm`'s (the same tiles, work-items and order) and
/// within one rounding of `T` plus `1e-5` relative of the f64 reference, and the codes,
/// scales and sums bit for bit what `quantize_q8_1` writes for that row.
fn run_add_rms_norm_q8<T: TestFloat>(dev: &Device, rows: usize, cols: usize, add: bool, seed: u64) {
    let mut rng = Rng(seed);
    let n = rows * cols;
    let x: Vec<T> = rng.vec(n, 2.0);
    let r: Vec<T> = rng.vec(n, 2.0);
    let wt: Vec<T> = rng.vec(cols, 1.5);
    let (xd, rd, wd) = (dev.upload(&x).unwrap(), dev.upload(&r).unwrap(), dev.upload(&wt).unwrap());
    let (mut hd, mut od) = (dev.upload(&vec![T::from_f32(9.0); n]).unwrap(), dev.alloc::<T>(n).unwrap());
    let (mut xq, mut xds) = (dev.alloc::<u32>(n / 4).unwrap(), dev.alloc::<f32>(n / 16).unwrap());
    let eps = 1e-5;
    let what = format!("add_rms_norm_q8 {} {rows}x{cols} add {add} wave {}", T::NAME, dev.wave_lanes());
    let residual = add.then_some(&rd as &dyn kernel_dsl::host::KernelArgSlice<T>);
    let res_out = if add { Some(&mut hd as &mut dyn kernel_dsl::host::KernelArgSliceMut<T>) } else { None };
    let done = ops::add_rms_norm_q8(dev, &xd, residual, Some(&wd), res_out, &mut od, &mut xq, &mut xds, cols, eps).unwrap();
    assert_eq!(done, q8_norm_fits::<T>(cols), "{what}: taken");
    if !done {
        assert_eq!(dev.download(&hd).unwrap(), vec![T::from_f32(9.0); n], "{what}: declined, yet wrote");
        return;
    }
    let (h, o) = (dev.download(&hd).unwrap(), dev.download(&od).unwrap());
    let want_h: Vec<T> = if add { x.iter().zip(&r).map(|(a, b)| T::from_f32(a.to_f32() + b.to_f32())).collect() } else { x.clone() };
    if add {
        assert_eq!(h, want_h, "{what}: residual");
        let (mut h2, mut o2) = (dev.alloc::<T>(n).unwrap(), dev.alloc::<T>(n).unwrap());
        ops::add_rms_norm(dev, &xd, &rd, Some(&wd), &mut h2, &mut o2, cols, eps).unwrap();
        assert!(o.iter().zip(&dev.download(&o2).unwrap()).all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()), "{what}: add_rms_norm's rows");
    } else {
        assert_eq!(h, vec![T::from_f32(9.0); n], "{what}: res_out written without a residual");
    }
    let mut want = vec![0.0; n];
    for i in 0..rows {
        let hr = &want_h[i * cols..(i + 1) * cols];
        let s = 1.0 / (hr.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / cols as f64 + eps as f64).sqrt();
        for j in 0..cols {
            want[i * cols + j] = hr[j].to_f64() * s * wt[j].to_f64();
        }
    }
    let extra: Vec<f64> = want.iter().map(|w| 1e-5 * w.abs()).collect();
    check(&o, &want, &extra, &what);
    let (q, ds) = quantize_ref(dev, &od);
    assert_eq!(dev.download(&xq).unwrap(), q, "{what}: codes");
    let got_ds = dev.download(&xds).unwrap();
    assert!(got_ds.iter().zip(&ds).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: scales and sums");
}

#[test]
fn add_rms_norm_q8_codes_are_quantize_q8_1s() {
    for dev in executors() {
        // Decode's rows (1..8 of 2048 / 4096), one block, rows of whole blocks that fill
        // part of a tile (2080, 96), and wide rows (8192: two chunks per work-item, taken
        // where they fit the tiles).
        for (i, &(rows, cols)) in [(1, 32), (3, 96), (1, 2048), (2, 4096), (8, 2048), (5, 4096), (3, 2080), (2, 8192), (1, 160)].iter().enumerate() {
            for add in [true, false] {
                let seed = i as u64 * 2 + add as u64;
                run_add_rms_norm_q8::<f32>(&dev, rows, cols, add, seed);
                run_add_rms_norm_q8::<f16>(&dev, rows, cols, add, seed + 100);
                run_add_rms_norm_q8::<bf16>(&dev, rows, cols, add, seed + 200);
            }
        }
    }
}

#[test]
fn add_rms_norm_q8_declines_misaligned_rows_and_rejects_bad_shapes() {
    for dev in executors() {
        let (rows, cols) = (2, 64);
        let n = rows * cols;
        let x = dev.upload(&vec![bf16::ONE; n + 1]).unwrap();
        let w = dev.upload(&vec![bf16::ONE; cols]).unwrap();
        let mut o = dev.upload(&vec![bf16::from_f32(5.0); n + 1]).unwrap();
        let (mut xq, mut xds) = (dev.upload(&vec![7u32; n / 4]).unwrap(), dev.upload(&vec![7f32; n / 16]).unwrap());
        // One element in: not on 16 bytes.
        let done = ops::add_rms_norm_q8(&dev, &x.view(1..n + 1).unwrap(), None, Some(&w), None, &mut o.view_mut(1..n + 1).unwrap(), &mut xq, &mut xds, cols, 1e-5).unwrap();
        assert!(!done, "misaligned rows taken");
        // Rows that are no whole number of q8_1 blocks.
        let e = ops::add_rms_norm_q8(&dev, &x.view(0..96).unwrap(), None, Some(&w.view(0..48).unwrap()), None, &mut o.view_mut(0..96).unwrap(), &mut xq.view_mut(0..24).unwrap(), &mut xds.view_mut(0..6).unwrap(), 48, 1e-5).unwrap_err();
        assert!(names(&e, "`cols`"), "{e}");
        let e = ops::add_rms_norm_q8(&dev, &x.view(0..n).unwrap(), None, Some(&w), None, &mut o.view_mut(0..n).unwrap(), &mut xq.view_mut(0..n / 4 - 1).unwrap(), &mut xds, cols, 1e-5).unwrap_err();
        assert!(names(&e, "`xq`"), "{e}");
        let mut h = dev.alloc::<bf16>(n).unwrap();
        let e = ops::add_rms_norm_q8(&dev, &x.view(0..n).unwrap(), None, Some(&w), Some(&mut h), &mut o.view_mut(0..n).unwrap(), &mut xq, &mut xds, cols, 1e-5).unwrap_err();
        assert!(names(&e, "`residual`"), "{e}");
        assert_eq!(dev.download(&o).unwrap(), vec![bf16::from_f32(5.0); n + 1]);
        assert_eq!(dev.download(&xq).unwrap(), vec![7u32; n / 4]);
    }
}

/// `silu_mul_q8`: the activation bit for bit `silu_mul`'s, its codes bit for bit
/// `quantize_q8_1`'s; `at` = 1 reads `gu` one element in (unaligned: scalar loads).
fn run_silu_mul_q8<T: TestFloat>(dev: &Device, rows: usize, inter: usize, at: usize, seed: u64) {
    let mut rng = Rng(seed);
    let n = rows * inter;
    let gu: Vec<T> = rng.vec(2 * n + at, 6.0);
    let gd = dev.upload(&gu).unwrap();
    let gv = gd.view(at..at + 2 * n).unwrap();
    let (mut od, mut o2) = (dev.alloc::<T>(n).unwrap(), dev.alloc::<T>(n).unwrap());
    let (mut xq, mut xds) = (dev.alloc::<u32>(n / 4).unwrap(), dev.alloc::<f32>(n / 16).unwrap());
    ops::silu_mul_q8(dev, &gv, &mut od, &mut xq, &mut xds, inter).unwrap();
    ops::silu_mul(dev, &gv, &mut o2, inter).unwrap();
    let what = format!("silu_mul_q8 {} {rows}x{inter} at {at} wave {}", T::NAME, dev.wave_lanes());
    let (o, want) = (dev.download(&od).unwrap(), dev.download(&o2).unwrap());
    assert!(o.iter().zip(&want).all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()), "{what}: silu_mul's values");
    let (q, ds) = quantize_ref(dev, &od);
    assert_eq!(dev.download(&xq).unwrap(), q, "{what}: codes");
    assert!(dev.download(&xds).unwrap().iter().zip(&ds).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: scales and sums");
}

#[test]
fn silu_mul_q8_codes_are_quantize_q8_1s() {
    for dev in executors() {
        for (i, &(rows, inter)) in [(1, 32), (3, 96), (1, 4096), (4, 2048), (8, 160), (2, 14336)].iter().enumerate() {
            for at in [0, 1] {
                let seed = i as u64 * 2 + at as u64;
                run_silu_mul_q8::<f32>(&dev, rows, inter, at, seed);
                run_silu_mul_q8::<f16>(&dev, rows, inter, at, seed + 100);
                run_silu_mul_q8::<bf16>(&dev, rows, inter, at, seed + 200);
            }
        }
        let g = dev.upload(&[1f32; 96]).unwrap();
        let (mut o, mut xq, mut xds) = (dev.upload(&[3f32; 48]).unwrap(), dev.alloc::<u32>(12).unwrap(), dev.alloc::<f32>(3).unwrap());
        let e = ops::silu_mul_q8(&dev, &g, &mut o, &mut xq, &mut xds, 48).unwrap_err();
        assert!(names(&e, "`gu`"), "{e}");
        assert_eq!(dev.download(&o).unwrap(), vec![3f32; 48]);
    }
}

/// The gated matvec (`[gate; up]` weight of `2 inter x cols`) against the f64 reference
/// `SiLU(g) * u` of the two exact products. The products carry `matvec_reference`'s
/// bounds `eg`, `eu`; `SiLU'` is at most 1.1 in magnitude, so the activation's error is
/// at most `1.1 |u| eg + |SiLU(g)| eu`, plus `4e-6` relative for the `f32` `exp`, division
/// and product (as `silu_mul`), plus one rounding of `T` (`check`).
#[allow(clippy::too_many_arguments)]
fn run_gated<T: TestFloat>(dev: &Device, inter: usize, cols: usize, batch: usize, with_bias: bool, x_offset: usize, seed: u64, tile: usize) {
    let mut rng = Rng(seed);
    let w: Vec<T> = rng.vec(2 * inter * cols, 1.0);
    let x: Vec<T> = rng.vec(batch * cols + x_offset, 1.0);
    let b: Vec<T> = rng.vec(2 * inter, 1.0);
    let (wd, xd, bd) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap(), dev.upload(&b).unwrap());
    let mut yd = dev.alloc::<T>(batch * inter).unwrap();
    let xv = xd.view(x_offset..).unwrap();
    let bias = if with_bias { Some(&bd as &dyn kernel_dsl::host::KernelArgSlice<T>) } else { None };
    ops::dense_matvec_gated_tiled(dev, &wd, &xv, bias, &mut yd, inter, cols, batch, tile).unwrap();
    let y = dev.download(&yd).unwrap();
    let bf = f64s(&b);
    let (gu, bound) = matvec_reference(&f64s(&w), &f64s(&x[x_offset..]), with_bias.then_some(&bf[..]), 2 * inter, cols, batch);
    let (mut want, mut extra) = (vec![0.0; batch * inter], vec![0.0; batch * inter]);
    for bi in 0..batch {
        for r in 0..inter {
            let (i, j) = (bi * 2 * inter + r, bi * 2 * inter + inter + r);
            let (g, u) = (gu[i], gu[j]);
            let silu = g / (1.0 + (-g).exp());
            want[bi * inter + r] = silu * u;
            extra[bi * inter + r] = 1.1 * u.abs() * bound[i] + silu.abs() * bound[j] + 4e-6 * (silu * u).abs();
        }
    }
    check(&y, &want, &extra, &format!("dense_matvec_gated {} {inter}x{cols} batch {batch} tile {tile} bias {with_bias} offset {x_offset} wave {}", T::NAME, dev.wave_lanes()));
}

#[test]
fn dense_matvec_gated_every_batch_dtype_and_shape() {
    // Widths below a chunk, odd (element path), whole chunks with a partial last round,
    // rows spanning one wave and several (2048 and 4104 columns: teams of 64..128 work-
    // items); output counts that leave the last work-group partly empty; every batch
    // 1..=8 in tiles of 4 (what the launcher takes), 2 and 1.
    let shapes = [(1, 1), (3, 5), (7, 8), (5, 24), (9, 200), (6, 1001), (5, 2048), (3, 4104)];
    for dev in executors() {
        for (i, &(inter, cols)) in shapes.iter().enumerate() {
            for batch in 1..=8 {
                let seed = (i * 16 + batch) as u64 + 3000;
                let tile = [4, 2, 1][batch % 3];
                run_gated::<bf16>(&dev, inter, cols, batch, batch % 2 == 1, 0, seed, 4);
                run_gated::<f16>(&dev, inter, cols, batch, batch % 3 == 0, 0, seed + 1, tile);
                run_gated::<f32>(&dev, inter, cols, batch, batch % 2 == 0, 0, seed + 2, tile);
            }
        }
    }
}

#[test]
fn dense_matvec_gated_misaligned_activations_take_the_scalar_path() {
    for dev in executors() {
        run_gated::<bf16>(&dev, 7, 64, 3, true, 1, 31, 4);
        run_gated::<f16>(&dev, 4, 1000, 8, false, 3, 32, 4);
        run_gated::<f32>(&dev, 5, 64, 1, true, 1, 33, 1);
    }
}

#[test]
fn dense_matvec_gated_rejects_bad_shapes_and_writes_nothing() {
    let dev = Device::cpu(WaveSize::W32);
    // inter 3, cols 4: w 24, x (batch 2) 8, y 6, bias 6.
    let w = dev.upload(&[1f32; 24]).unwrap();
    let x = dev.upload(&[1f32; 8]).unwrap();
    let b = dev.upload(&[1f32; 3]).unwrap();
    let mut y = dev.upload(&[7f32; 6]).unwrap();
    let mut y5 = dev.upload(&[7f32; 5]).unwrap();
    let cases: Vec<(Result<(), LaunchError>, &str)> = vec![
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y5, 3, 4, 2), "y"),
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y, 6, 4, 1), "w"),
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y, 2, 6, 3), "x"),
        (ops::dense_matvec_gated(&dev, &w, &x, Some(&b), &mut y, 3, 4, 2), "bias"),
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y, 3, 4, 0), "batch"),
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y, 3, 4, 9), "batch"),
        (ops::dense_matvec_gated(&dev, &w, &x, None, &mut y, usize::MAX, 4, 2), "inter"),
        (ops::dense_matvec_gated_tiled(&dev, &w, &x, None, &mut y, 3, 4, 2, 8), "tile"),
    ];
    for (r, arg) in cases {
        let e = r.expect_err(arg);
        assert!(names(&e, &format!("`{arg}`")), "{e}");
    }
    assert_eq!(dev.download(&y).unwrap(), vec![7f32; 6]);
    assert_eq!(dev.download(&y5).unwrap(), vec![7f32; 5]);
    // Where the engine takes it: every decode batch on the CPU executor, nothing else.
    assert!((1..=8).all(|b| ops::gated_matvec_preferred(&dev, b)));
    assert!(!ops::gated_matvec_preferred(&dev, 0) && !ops::gated_matvec_preferred(&dev, 9));
}

/// Runs the sampler on `rows` rows of `logits` with one parameter set, `penalized` ids per
/// row (`n_pen` each) and key `(seed, row)` for row `row`.
fn draw<T: TestFloat>(dev: &Device, logits: &[T], vocab: usize, p: &[SamplingParams], penalized: &[u32], seed: u32) -> Vec<u32> {
    let rows = logits.len() / vocab;
    assert_eq!(p.len(), rows);
    let packed = ops::check_sampling_params(p).unwrap();
    let keys: Vec<u32> = (0..rows as u32).flat_map(|r| [seed, r]).collect();
    let (ld, pd, kd) = (dev.upload(logits).unwrap(), dev.upload(&packed).unwrap(), dev.upload(&keys).unwrap());
    let pen = dev.upload(penalized).unwrap();
    let mut out = dev.alloc::<u32>(rows).unwrap();
    let mut work = dev.alloc::<f32>(rows * vocab).unwrap();
    ops::sample_packed(dev, &ld, &pd, &pen, &kd, &mut out, &mut work, vocab).unwrap();
    dev.download(&out).unwrap()
}

/// The first index of the largest non-NaN value.
fn argmax(v: &[f64]) -> u32 {
    let mut best = None::<(usize, f64)>;
    for (i, &x) in v.iter().enumerate() {
        if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map_or(u32::MAX, |(i, _)| i as u32)
}

fn greedy(n: usize) -> Vec<SamplingParams> {
    vec![SamplingParams::default(); n]
}

#[test]
fn sample_greedy_is_argmax() {
    for dev in executors() {
        let mut rng = Rng(3);
        for vocab in [1, 5, 64, 1000, 5003] {
            let rows = 3;
            let mut l: Vec<bf16> = rng.vec(rows * vocab, 8.0);
            // Ties (first index wins) and NaN (never picked) in row 1.
            if vocab >= 5 {
                l[vocab + 2] = bf16::from_f32(100.0);
                l[vocab + 4] = bf16::from_f32(100.0);
                l[vocab] = bf16::NAN;
            }
            let got = draw(&dev, &l, vocab, &greedy(rows), &[], 1);
            let want: Vec<u32> = (0..rows).map(|r| argmax(&f64s(&l[r * vocab..(r + 1) * vocab]))).collect();
            assert_eq!(got, want, "vocab {vocab} wave {}", dev.wave_lanes());
        }
        let f: Vec<f32> = vec![f32::NAN; 4];
        assert_eq!(draw(&dev, &f, 4, &greedy(1), &[], 0), vec![u32::MAX]);
    }
}

#[test]
fn sample_repetition_penalty_applies_once_per_id() {
    for dev in executors() {
        let l = [5.0f32, 4.0, -1.0, 3.0, -0.5];
        let p = SamplingParams { repetition_penalty: 1.2, ..Default::default() };
        // 5 / 1.2 = 4.17 still wins once; three times (4.17 -> 2.89) it would not.
        assert_eq!(draw(&dev, &l, 5, &[p], &[0, 0, 0], 0), vec![0]);
        let p2 = SamplingParams { repetition_penalty: 1.3, ..Default::default() };
        // 5 / 1.3 = 3.85 < 4.
        assert_eq!(draw(&dev, &l, 5, &[p2], &[0, 7, 99], 0), vec![1]);
        // Negative logits are multiplied: -0.5 * 10 < -1, so with 0, 1, 3 penalized
        // heavily (to 0.5, 0.4, 0.3) the largest stays 0; ids past the vocabulary are ignored.
        let p3 = SamplingParams { repetition_penalty: 10.0, ..Default::default() };
        assert_eq!(draw(&dev, &l, 5, &[p3], &[0, 1, 3, 4], 0), vec![0]);
        let l2 = [-2.0f32, -0.5, -1.0];
        assert_eq!(draw(&dev, &l2, 3, &[p3], &[1, 1, 5], 0), vec![2]);
    }
}

/// Softmax of `z` (f64).
fn softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// The tokens HF's warpers keep (top-k, then top-p on the renormalized rest with `slack`
/// added to `top_p`, then min-p) for scaled logits `z`.
fn kept(z: &[f64], p: &SamplingParams, slack: f64) -> Vec<bool> {
    let mut keep = vec![true; z.len()];
    let mut sorted: Vec<f64> = z.to_vec();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    if p.top_k > 0 && (p.top_k as usize) < z.len() {
        let t = sorted[p.top_k as usize - 1];
        for (k, v) in keep.iter_mut().zip(z) {
            *k &= *v >= t;
        }
    }
    if p.top_p < 1.0 {
        let masked: Vec<f64> = z.iter().zip(&keep).map(|(v, k)| if *k { *v } else { f64::NEG_INFINITY }).collect();
        let pr = softmax(&masked);
        let mut order: Vec<usize> = (0..z.len()).collect();
        order.sort_by(|&a, &b| z[b].partial_cmp(&z[a]).unwrap());
        // The smallest value threshold whose mass at or above reaches top_p (+ slack).
        let (mut cum, mut t) = (0.0, f64::NEG_INFINITY);
        for &i in &order {
            cum += pr[i];
            t = z[i];
            if cum >= (p.top_p as f64 + slack).min(1.0) - 1e-12 {
                break;
            }
        }
        for (k, v) in keep.iter_mut().zip(z) {
            *k &= *v >= t;
        }
    }
    if p.min_p > 0.0 {
        let t = sorted[0] + (p.min_p as f64).ln() - 1e-4;
        for (k, v) in keep.iter_mut().zip(z) {
            *k &= *v >= t;
        }
    }
    keep
}

#[test]
fn sample_filters_never_pick_excluded_tokens() {
    let vocab = 300;
    let configs = [
        SamplingParams { temperature: 1.0, top_k: 5, ..Default::default() },
        SamplingParams { temperature: 0.8, top_p: 0.6, ..Default::default() },
        SamplingParams { temperature: 1.3, min_p: 0.2, ..Default::default() },
        SamplingParams { temperature: 1.0, top_k: 40, top_p: 0.9, min_p: 0.05, ..Default::default() },
        SamplingParams { temperature: 2.0, top_k: 1, ..Default::default() },
    ];
    for dev in executors() {
        let mut rng = Rng(11);
        let rows = 40;
        let l: Vec<f32> = rng.vec(rows * vocab, 4.0);
        for p in &configs {
            let got = draw(&dev, &l, vocab, &vec![*p; rows], &[], 17);
            let mut distinct = std::collections::BTreeSet::new();
            for (r, &t) in got.iter().enumerate() {
                let z: Vec<f64> = l[r * vocab..(r + 1) * vocab].iter().map(|v| *v as f64 / p.temperature as f64).collect();
                let keep = kept(&z, p, 1e-4);
                assert!((t as usize) < vocab && keep[t as usize], "{p:?}: row {r} picked {t}, outside the kept set (wave {})", dev.wave_lanes());
                distinct.insert(t);
            }
            // The draws are draws: with more than one kept token they vary across rows.
            if p.top_k != 1 {
                assert!(distinct.len() > 1, "{p:?}: every row picked the same token");
            }
        }
    }
}

#[test]
fn sample_same_key_same_tokens() {
    let vocab = 500;
    let mut rng = Rng(5);
    let l: Vec<f16> = rng.vec(8 * vocab, 3.0);
    let p = vec![SamplingParams { temperature: 1.0, top_p: 0.95, ..Default::default() }; 8];
    let mut runs = Vec::new();
    for dev in executors() {
        let a = draw(&dev, &l, vocab, &p, &[], 42);
        assert_eq!(a, draw(&dev, &l, vocab, &p, &[], 42), "wave {}", dev.wave_lanes());
        assert_ne!(a, draw(&dev, &l, vocab, &p, &[], 43), "another key, the same 8 tokens");
        runs.push(a);
    }
    // The CPU executors of both wave sizes compute the same tokens (launch-shape free).
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn sample_frequencies_follow_the_softmax() {
    let logits = [1.0f32, 0.5, -0.3, 2.0, 0.0, -1.5];
    let vocab = logits.len();
    // Draws with filters run 64 bisection rounds each on the CPU executor: fewer of them.
    let cases = [
        (SamplingParams { temperature: 0.7, ..Default::default() }, 6000),
        (SamplingParams { temperature: 1.0, top_k: 3, ..Default::default() }, 1000),
        (SamplingParams { temperature: 1.0, top_p: 0.8, ..Default::default() }, 1000),
    ];
    let dev = Device::cpu(WaveSize::W32);
    for (p, n) in &cases {
        let (p, n) = (p, *n);
        let all: Vec<f32> = (0..n).flat_map(|_| logits).collect();
        let got = draw(&dev, &all, vocab, &vec![*p; n], &[], 9);
        let z: Vec<f64> = logits.iter().map(|v| *v as f64 / p.temperature as f64).collect();
        let keep = kept(&z, p, 0.0);
        let masked: Vec<f64> = z.iter().zip(&keep).map(|(v, k)| if *k { *v } else { f64::NEG_INFINITY }).collect();
        let prob = softmax(&masked);
        for (t, &pt) in prob.iter().enumerate() {
            let f = got.iter().filter(|&&g| g as usize == t).count() as f64 / n as f64;
            let bound = 5.0 * (pt * (1.0 - pt) / n as f64).sqrt();
            if pt == 0.0 {
                assert_eq!(f, 0.0, "{p:?}: token {t} is excluded but was drawn");
            }
            assert!((f - pt).abs() <= bound, "{p:?}: token {t}: frequency {f}, probability {pt}, bound {bound}");
        }
    }
}

#[test]
fn sample_rejects_bad_arguments_and_writes_nothing() {
    let dev = Device::cpu(WaveSize::W32);
    let bad = [
        SamplingParams { top_p: 0.0, ..Default::default() },
        SamplingParams { min_p: 1.5, ..Default::default() },
        SamplingParams { repetition_penalty: 0.0, ..Default::default() },
        SamplingParams { temperature: f32::INFINITY, ..Default::default() },
    ];
    for p in bad {
        let e = ops::check_sampling_params(&[SamplingParams::default(), p]).unwrap_err();
        assert!(names(&e, "`params[1]`"), "{e}");
    }
    let l = dev.upload(&[0f32; 10]).unwrap();
    let p = dev.upload(&ops::check_sampling_params(&greedy(2)).unwrap()).unwrap();
    let k = dev.upload(&[0u32; 4]).unwrap();
    let pen = dev.upload(&[0u32; 3]).unwrap();
    let mut out = dev.upload(&[9u32; 2]).unwrap();
    let mut work = dev.alloc::<f32>(10).unwrap();
    let e = ops::sample_packed(&dev, &l, &p, &pen, &k, &mut out, &mut work, 5).unwrap_err();
    assert!(names(&e, "`penalized`"), "{e}");
    let e = ops::sample_packed(&dev, &l, &p, &k, &k, &mut out, &mut work, 4).unwrap_err();
    assert!(names(&e, "`logits`"), "{e}");
    let short = dev.upload(&[1f32; 9]).unwrap();
    let e = ops::sample_packed(&dev, &l, &short, &k, &k, &mut out, &mut work, 5).unwrap_err();
    assert!(names(&e, "`params`"), "{e}");
    assert_eq!(dev.download(&out).unwrap(), vec![9u32; 2]);
}
