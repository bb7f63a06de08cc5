//! The `mma` primitive in every lowering's lane layout (CPU executor, waves of 32 and 64)
//! and the GEMM built on it, against f64 references; on a GPU when one is present.
mod common;

use common::{executors, inputs, matrix_executors, TestFloat};
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, LaunchConfig, LaunchError, MatrixUnit, WaveSize};
use kernel_dsl::mma::{Lowering, MmaFloat};
use kernels::gemm::{self, Activation, Engine, Epilogue, GemmElem, GemmShape, Operand};
use kernels::runtime::Device;

fn name(dev: &Device) -> String {
    format!("{} / {:?}", kernel_dsl::host::Executor::name(dev), gemm::lowering_of(dev))
}

fn one_wave(dev: &Device) -> LaunchConfig {
    LaunchConfig::new(kernel_dsl::Dim3::x(1), kernel_dsl::Dim3::x(gemm::lowering_of(dev).wave_lanes()))
}

/// Row-major 16x16 product plus `c`, in f64.
fn ref_mma(a: &[f64], b: &[f64], c: &[f64]) -> Vec<f64> {
    let mut d = c.to_vec();
    for r in 0..16 {
        for col in 0..16 {
            for k in 0..16 {
                d[r * 16 + col] += a[r * 16 + k] * b[k * 16 + col];
            }
        }
    }
    d
}

fn round<T: TestFloat>(v: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    let back = t.iter().map(|x| x.to_f64()).collect();
    (t, back)
}

/// 16 exact products summed in f32: at most 16 roundings of partial sums.
fn close_f32(got: &[f32], want: &[f64], scale: &[f64], what: &str) {
    for i in 0..want.len() {
        let tol = 16.0 * f32::EPSILON as f64 * scale[i] + 1e-30;
        assert!((got[i] as f64 - want[i]).abs() <= tol, "{what}: element {i}: got {}, want {}", got[i], want[i]);
    }
}

fn abs_mma(a: &[f64], b: &[f64], c: &[f64]) -> Vec<f64> {
    let a: Vec<f64> = a.iter().map(|x| x.abs()).collect();
    let b: Vec<f64> = b.iter().map(|x| x.abs()).collect();
    let c: Vec<f64> = c.iter().map(|x| x.abs()).collect();
    ref_mma(&a, &b, &c)
}

fn check_mma_tile<T: TestFloat + MmaFloat>(dev: &Device) {
    let (a, a64) = round::<T>(&inputs(256, -2.0, 2.0, 1, false));
    let (b, b64) = round::<T>(&inputs(256, -2.0, 2.0, 2, false));
    let c: Vec<f32> = inputs(256, -1.0, 1.0, 3, false).iter().map(|&x| x as f32).collect();
    let c64: Vec<f64> = c.iter().map(|&x| x as f64).collect();
    let (da, db, dc) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap(), dev.upload(&c).unwrap());
    let mut dd = dev.alloc::<f32>(256).unwrap();
    gemm::mma_tile::launch::<T>(dev, one_wave(dev), &da, &db, &dc, &mut dd).unwrap();
    let d = dev.download(&dd).unwrap();
    close_f32(&d, &ref_mma(&a64, &b64, &c64), &abs_mma(&a64, &b64, &c64), &format!("mma_tile {} on {}", T::NAME, name(dev)));
}

#[test]
fn mma_tile_matches_scalar_reference_in_every_lowering() {
    for dev in matrix_executors() {
        check_mma_tile::<f16>(&dev);
        check_mma_tile::<bf16>(&dev);
        let a: Vec<i8> = (0..256).map(|i| ((i * 37 + 11) % 255) as i8).collect();
        let b: Vec<i8> = (0..256).map(|i| ((i * 91 + 5) % 251) as i8).collect();
        let c: Vec<i32> = (0..256).map(|i| i * 1000 - 128_000).collect();
        let (da, db, dc) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap(), dev.upload(&c).unwrap());
        let mut dd = dev.alloc::<i32>(256).unwrap();
        gemm::mma_tile_i8::launch(&dev, one_wave(&dev), &da, &db, &dc, &mut dd).unwrap();
        let d = dev.download(&dd).unwrap();
        for r in 0..16 {
            for col in 0..16 {
                let want: i32 = c[r * 16 + col] + (0..16).map(|k| a[r * 16 + k] as i32 * b[k * 16 + col] as i32).sum::<i32>();
                assert_eq!(d[r * 16 + col], want, "mma_tile_i8 ({r},{col}) on {}", name(&dev));
            }
        }
    }
}

fn check_chain<T: TestFloat + MmaFloat>(dev: &Device) {
    let (q, q64) = round::<T>(&inputs(256, -1.0, 1.0, 4, false));
    let (kt, k64) = round::<T>(&inputs(256, -1.0, 1.0, 5, false));
    let (v, v64) = round::<T>(&inputs(256, -1.0, 1.0, 6, false));
    let (dq, dk, dv) = (dev.upload(&q).unwrap(), dev.upload(&kt).unwrap(), dev.upload(&v).unwrap());
    let (mut ds, mut dmax, mut dsum, mut dout) =
        (dev.alloc::<f32>(256).unwrap(), dev.alloc::<f32>(16).unwrap(), dev.alloc::<f32>(16).unwrap(), dev.alloc::<f32>(256).unwrap());
    gemm::mma_rows::launch::<T>(dev, one_wave(dev), &dq, &dk, &mut ds, &mut dmax, &mut dsum).unwrap();
    let what = format!("mma_rows/mma_pv {} on {}", T::NAME, name(dev));
    let s = dev.download(&ds).unwrap();
    let zero = vec![0.0; 256];
    close_f32(&s, &ref_mma(&q64, &k64, &zero), &abs_mma(&q64, &k64, &zero), &format!("{what}: S"));
    gemm::mma_pv::launch::<T>(dev, one_wave(dev), &ds, &dv, &mut dout).unwrap();
    let (mx, sm) = (dev.download(&dmax).unwrap(), dev.download(&dsum).unwrap());
    for r in 0..16 {
        let row = &s[r * 16..r * 16 + 16];
        assert_eq!(mx[r], row.iter().cloned().fold(f32::NEG_INFINITY, f32::max), "{what}: row max {r}");
        let want: f64 = row.iter().map(|&x| x as f64).sum();
        let scale: f64 = row.iter().map(|&x| (x as f64).abs()).sum();
        assert!((sm[r] as f64 - want).abs() <= 16.0 * f32::EPSILON as f64 * scale, "{what}: row sum {r}: {} vs {want}", sm[r]);
    }
    // P = S rounded to T, in registers; O = P V.
    let p64: Vec<f64> = s.iter().map(|&x| T::from_f64(x as f64).to_f64()).collect();
    let o = dev.download(&dout).unwrap();
    close_f32(&o, &ref_mma(&p64, &v64, &zero), &abs_mma(&p64, &v64, &zero), &format!("{what}: P V"));
}

#[test]
fn accumulator_to_a_and_row_reductions_in_every_lowering() {
    for dev in matrix_executors() {
        check_chain::<f16>(&dev);
        check_chain::<bf16>(&dev);
    }
}

#[test]
fn mma_rejects_a_wave_size_its_layout_does_not_have() {
    let dev = Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::Mfma));
    let x = dev.upload(&[f16::ZERO; 256]).unwrap();
    let c = dev.upload(&[0.0f32; 256]).unwrap();
    let mut d = dev.alloc::<f32>(256).unwrap();
    let cfg = LaunchConfig::new(kernel_dsl::Dim3::x(1), kernel_dsl::Dim3::x(32));
    let err = gemm::mma_tile::launch::<f16>(&dev, cfg, &x, &x, &c, &mut d).unwrap_err();
    assert!(err.to_string().contains("waves of 64"), "{err}");
}

/// `C = act(alpha A B + bias)` in f64 from the inputs as stored.
#[allow(clippy::too_many_arguments)]
fn reference<T: TestFloat>(
    s: GemmShape,
    a: &[T],
    ao: Operand,
    b: &[T],
    bo: Operand,
    epi: (f32, Option<&[T]>, Activation),
) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut mag) = (vec![0.0; s.batch * s.m * s.n], vec![0.0; s.batch * s.m * s.n]);
    let at = |z: usize, i: usize, k: usize| {
        a[z * ao.batch_stride + if ao.transposed { k * ao.ld + i } else { i * ao.ld + k }].to_f64()
    };
    let bt = |z: usize, k: usize, j: usize| {
        b[z * bo.batch_stride + if bo.transposed { j * bo.ld + k } else { k * bo.ld + j }].to_f64()
    };
    for z in 0..s.batch {
        for i in 0..s.m {
            for j in 0..s.n {
                let (mut acc, mut m) = (0.0, 0.0);
                for k in 0..s.k {
                    let p = at(z, i, k) * bt(z, k, j);
                    acc += p;
                    m += p.abs();
                }
                let mut x = acc * epi.0 as f64;
                if let Some(bias) = epi.1 {
                    x += bias[j].to_f64();
                    m += bias[j].to_f64().abs();
                }
                let x = match epi.2 {
                    Activation::Identity => x,
                    Activation::Relu => x.max(0.0),
                    Activation::Gelu => 0.5 * x * (1.0 + libm_erf(x / std::f64::consts::SQRT_2)),
                    Activation::Silu => x / (1.0 + (-x).exp()),
                };
                out[(z * s.m + i) * s.n + j] = x;
                mag[(z * s.m + i) * s.n + j] = m * (epi.0 as f64).abs().max(1.0);
            }
        }
    }
    (out, mag)
}

/// erf in f64 (Abramowitz-Stegun 7.1.26 is too coarse; this is the series/continued
/// fraction pair, accurate to ~1e-15).
fn libm_erf(x: f64) -> f64 {
    if x.abs() < 2.0 {
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..60 {
            term *= -x2 / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction.
        let ax = x.abs();
        let mut f = 0.0;
        for n in (1..80).rev() {
            f = n as f64 / 2.0 / (ax + f);
        }
        let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f);
        (1.0 - erfc).copysign(x)
    }
}

/// Tolerance: f32 accumulation over `k` terms, the bf16 split of f32 inputs (about 2^-16
/// per product), and one rounding of the result to `T`.
fn check_gemm<T: TestFloat + GemmElem>(dev: &Device, s: GemmShape, ta: bool, tb: bool, batch_gap: usize, epi_kind: usize) {
    check_gemm_on::<T>(Engine::Auto, dev, s, (ta, tb), batch_gap, (epi_kind % 2) * 3, epi_kind);
}

/// [`check_gemm`] on `engine`, A's rows `a_pad` elements apart beyond its columns.
fn check_gemm_on<T: TestFloat + GemmElem>(engine: Engine, dev: &Device, s: GemmShape, (ta, tb): (bool, bool), batch_gap: usize, a_pad: usize, epi_kind: usize) {
    let what = format!("{} {s:?} ta={ta} tb={tb} epi={epi_kind} {engine:?} on {}", T::NAME, name(dev));
    // Operands stored with a gap after each row and each batch entry (strided views).
    let (ar, ac) = if ta { (s.k, s.m) } else { (s.m, s.k) };
    let (br, bc) = if tb { (s.n, s.k) } else { (s.k, s.n) };
    let ao = Operand { transposed: ta, ld: ac + a_pad, batch_stride: 0 };
    let ao = Operand { batch_stride: ar * ao.ld + batch_gap, ..ao };
    let bo = Operand { transposed: tb, ld: bc, batch_stride: br * bc + batch_gap };
    let a: Vec<T> = inputs(s.batch * ao.batch_stride, -1.0, 1.0, 7 + s.m as u64, false).iter().map(|&x| T::from_f64(x)).collect();
    let b: Vec<T> = inputs(s.batch * bo.batch_stride, -1.0, 1.0, 8 + s.n as u64, false).iter().map(|&x| T::from_f64(x)).collect();
    let bias: Vec<T> = inputs(s.n, -1.0, 1.0, 9, false).iter().map(|&x| T::from_f64(x)).collect();
    let (alpha, act) = match epi_kind {
        0 => (1.0, Activation::Identity),
        1 => (0.5, Activation::Relu),
        2 => (1.0, Activation::Gelu),
        _ => (2.0, Activation::Silu),
    };
    let use_bias = epi_kind > 0;
    let (want, mag) = reference(s, &a, ao, &b, bo, (alpha, use_bias.then_some(&bias[..]), act));
    let (da, db, dbias) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap(), dev.upload(&bias).unwrap());
    let mut dc = dev.upload(&vec![T::from_f64(-7.0); s.batch * s.m * s.n]).unwrap();
    let epi = Epilogue { alpha, bias: use_bias.then_some(&dbias), act };
    gemm::matmul_with(engine, dev, s, &da, ao, &db, bo, &mut dc, s.n, s.m * s.n, &epi).unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = dev.download(&dc).unwrap();
    let split = if T::SPLIT { 2f64.powi(-14) } else { 0.0 };
    for i in 0..want.len() {
        let w = want[i];
        let tol = T::ABS + T::REL * w.abs() + (s.k as f64 * f32::EPSILON as f64 + split) * mag[i] * 2.0;
        let g = got[i].to_f64();
        assert!((g - w).abs() <= tol, "{what}: element {i} (row {}, col {}): got {g}, want {w} (tol {tol:e})", i / s.n % s.m, i % s.n);
    }
}

/// Sides 1, 7, 63, 65 and 1000 in each dimension, and a grid of several partial tiles in
/// both dimensions.
const SHAPES: [(usize, usize, usize); 10] =
    [(1, 1, 1), (7, 63, 65), (65, 7, 63), (63, 65, 7), (65, 65, 65), (1, 1000, 7), (1000, 7, 1), (7, 1, 1000), (129, 130, 40), (700, 300, 24)];

fn gemm_all_shapes<T: TestFloat + GemmElem>() {
    for dev in matrix_executors() {
        for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
            let (ta, tb) = (i % 2 == 1, i / 2 % 2 == 1);
            check_gemm::<T>(&dev, GemmShape { batch: 1, m, n, k }, ta, tb, 0, i % 4);
        }
        // Tiles wholly in range (the chunked copies' fast path)
        // next to partial ones in every direction, batched, and one full K step plus a
        // partial one.
        check_gemm::<T>(&dev, GemmShape { batch: 2, m: 130, n: 136, k: 72 }, false, false, 8, 0);
        // The steady-state loop of work-groups wholly in range (256 x 128 tiles on
        // mma.sync: several whole K steps after the pipeline's first ones, then a partial
        // one), with bias and activation in the staged epilogue.
        check_gemm::<T>(&dev, GemmShape { batch: 1, m: 260, n: 136, k: 200 }, false, false, 0, 2);
        // More tile rows than one band of `GROUP_M` and not a multiple of it: the
        // work-groups' tile order (`tile_of_group`) with a narrower last band, partial
        // tiles at the bottom and right, batched.
        let (bm, bn, _) = gemm::block_tile::<T>(gemm::lowering_of(&dev));
        let m = (gemm::GROUP_M as usize + 3) * bm - 5;
        check_gemm::<T>(&dev, GemmShape { batch: 2, m, n: bn + 3, k: 24 }, false, false, 8, 1);
        // Split-K (few output tiles, long K): partial sums in a workspace, added in order
        // by the second pass with bias and activation; batched, B transposed or not.
        let s = GemmShape { batch: 2, m: 33, n: 40, k: 600 };
        let low = gemm::lowering_of(&dev);
        assert_eq!(gemm::splits_for::<T>(low, s) > 1, low != Lowering::Valu, "{}: split-K taken where it should not be, or not taken", name(&dev));
        check_gemm::<T>(&dev, s, false, true, 8, 3);
        check_gemm::<T>(&dev, GemmShape { batch: 1, m: 5, n: 300, k: 700 }, false, false, 0, 2);
        // Every transpose combination, batched, with gaps between batch entries.
        for t in 0..4 {
            check_gemm::<T>(&dev, GemmShape { batch: 3, m: 33, n: 40, k: 48 }, t % 2 == 1, t / 2 == 1, 8, t);
        }
    }
}

#[test]
fn tile_order_is_a_bijection_in_bands_of_group_m() {
    let g = gemm::GROUP_M;
    for gx in 1..=20u32 {
        for gy in 1..=3 * g + 2 {
            let mut seen = vec![false; (gx * gy) as usize];
            for id in 0..gx * gy {
                let (tm, tn) = gemm::tile_of_group(id % gx, id / gx, gx, gy);
                assert!(tm < gy && tn < gx, "grid {gx}x{gy}: id {id} -> tile ({tm}, {tn}) out of range");
                assert!(!std::mem::replace(&mut seen[(tm * gx + tn) as usize], true), "grid {gx}x{gy}: tile ({tm}, {tn}) twice");
                // Work-group `id` lies in band `id / (g gx)` of tile rows; a band starts at
                // its top-left tile and its ids go down a column of the band before moving
                // one tile along N.
                let band = id / (g * gx);
                assert_eq!(tm / g, band, "grid {gx}x{gy}: id {id} outside its band");
                if id % (g * gx) == 0 {
                    assert_eq!((tm, tn), (band * g, 0), "grid {gx}x{gy}: band {band} does not start at its top-left tile");
                } else {
                    let (pm, pn) = gemm::tile_of_group((id - 1) % gx, (id - 1) / gx, gx, gy);
                    let last_row = (band * g + g).min(gy) - 1;
                    let want = if pm == last_row { (band * g, pn + 1) } else { (pm + 1, pn) };
                    assert_eq!((tm, tn), want, "grid {gx}x{gy}: id {id} does not follow id {} at ({pm}, {pn})", id - 1);
                }
            }
        }
    }
}

/// The warpgroup kernel (`wgmma`, NVIDIA sm_90 only): B row-major (MN-major tiles) and
/// transposed (K-major), batched with gaps, A's rows padded, every epilogue, several K
/// steps (more than the ring's 4 stages), several tile rows and columns (the banded tile
/// order), M ending inside a tile and inside a warpgroup's rows; on the CPU executor's
/// emulation (mma.sync mode) a smaller product per B layout. Elsewhere the launcher must
/// refuse it by name and leave C as it was.
fn gemm_wgmma_whole_tiles<T: TestFloat + GemmElem>() {
    let s = GemmShape { batch: 2, m: 256, n: 512, k: 384 };
    let mut ran = 0;
    // The CPU executor emulates wgmma in its mma.sync mode: one shape per B layout (M
    // ending inside the second warpgroup's rows, 5 K steps around the 4-stage ring).
    let emulated = Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync));
    for (i, tb) in [false, true].into_iter().enumerate() {
        check_gemm_on::<T>(Engine::Wgmma, &emulated, GemmShape { batch: 1, m: 70, n: 256, k: 320 }, (false, tb), 0, 8, 2 * i + 1);
    }
    // A shape it cannot take is refused by name, and C left as it was.
    let bad = GemmShape { batch: 1, m: 64, n: 200, k: 64 };
    let (a, b) = (emulated.upload(&[T::from_f64(1.0); 64 * 64]).unwrap(), emulated.upload(&[T::from_f64(1.0); 64 * 200]).unwrap());
    let mut c = emulated.upload(&[T::from_f64(-7.0); 64 * 200]).unwrap();
    let e = gemm::matmul_with(Engine::Wgmma, &emulated, bad, &a, Operand::row_major(64, 64), &b, Operand::row_major(64, 200), &mut c, 200, 64 * 200, &Epilogue::default()).unwrap_err();
    assert!(e.to_string().contains("whole tiles of 256"), "{e}");
    assert!(emulated.download(&c).unwrap().iter().all(|x| x.to_f64() == -7.0), "a refused product wrote C");
    for dev in executors() {
        let a = dev.upload(&vec![T::from_f64(1.0); s.m * s.k * s.batch]).unwrap();
        let b = dev.upload(&vec![T::from_f64(1.0); s.k * s.n * s.batch]).unwrap();
        let mut c = dev.upload(&vec![T::from_f64(-7.0); s.m * s.n * s.batch]).unwrap();
        let r = gemm::matmul_with(Engine::Wgmma, &dev, s, &a, Operand::row_major(s.m, s.k), &b, Operand::row_major(s.k, s.n), &mut c, s.n, s.m * s.n, &Epilogue::default());
        match r {
            Err(e) => {
                assert!(e.to_string().contains("sm_90"), "{}: {e}", name(&dev));
                assert!(dev.download(&c).unwrap().iter().all(|x| x.to_f64() == -7.0), "{}: a refused product wrote C", name(&dev));
                eprintln!("gemm_wgmma: skipped on {}: {e}", name(&dev));
            }
            Ok(()) => {
                ran += 1;
                for (i, tb) in [false, true].into_iter().enumerate() {
                    for epi in 0..4 {
                        check_gemm_on::<T>(Engine::Wgmma, &dev, s, (false, tb), 8 * (i + 1), 8 * (epi % 2), epi);
                    }
                    // Rows that end inside a warpgroup's 64 (zero-filled, not stored).
                    check_gemm_on::<T>(Engine::Wgmma, &dev, GemmShape { batch: 1, m: 203, n: 256, k: 320 }, (false, tb), 0, 8, 2 * i + 1);
                }
                // A shape the kernel cannot take is refused, not cut.
                let bad = GemmShape { n: 200, ..s };
                let e = gemm::matmul_with(Engine::Wgmma, &dev, bad, &a, Operand::row_major(s.m, s.k), &b, Operand::row_major(s.k, bad.n), &mut c, bad.n, s.m * bad.n, &Epilogue::default()).unwrap_err();
                assert!(e.to_string().contains("whole tiles of 256"), "{e}");
            }
        }
    }
    if ran == 0 {
        eprintln!("gemm_wgmma: no NVIDIA sm_90 device in this build/run: the wgmma kernel ran on the CPU executor's emulation only");
    }
}

#[test]
fn gemm_wgmma_bf16_whole_tiles_on_sm90() {
    gemm_wgmma_whole_tiles::<bf16>();
}

#[test]
fn gemm_wgmma_f16_whole_tiles_on_sm90() {
    gemm_wgmma_whole_tiles::<f16>();
}

#[test]
fn gemm_f16_odd_shapes_transposes_batches_epilogues() {
    gemm_all_shapes::<f16>();
}

#[test]
fn gemm_bf16_odd_shapes_transposes_batches_epilogues() {
    gemm_all_shapes::<bf16>();
}

#[test]
fn gemm_f32_odd_shapes_transposes_batches_epilogues() {
    gemm_all_shapes::<f32>();
}

#[test]
fn gemm_rejects_bad_shapes_and_writes_nothing() {
    let dev = Device::cpu(WaveSize::W64);
    let s = GemmShape { batch: 1, m: 4, n: 5, k: 6 };
    let a = dev.upload(&[f16::ONE; 24]).unwrap();
    let b = dev.upload(&[f16::ONE; 30]).unwrap();
    let mut c = dev.upload(&[f16::ZERO; 20]).unwrap();
    let run = |s: GemmShape, ao: Operand, bo: Operand, ldc: usize, c: &mut kernels::runtime::DeviceVec<f16>| {
        gemm::matmul(&dev, s, &a, ao, &b, bo, c, ldc, 20, &Epilogue::default())
    };
    let bad = [
        run(GemmShape { m: 5, ..s }, Operand::row_major(5, 6), Operand::row_major(6, 5), 5, &mut c),
        run(s, Operand { ld: 3, ..Operand::row_major(4, 6) }, Operand::row_major(6, 5), 5, &mut c),
        run(s, Operand::row_major(4, 6), Operand::row_major(6, 5), 4, &mut c),
        run(GemmShape { k: 7, ..s }, Operand::row_major(4, 6), Operand::row_major(6, 5), 5, &mut c),
    ];
    for r in bad {
        assert!(matches!(r, Err(LaunchError::InvalidArgument { .. })), "{r:?}");
    }
    let bias = dev.upload(&[f16::ONE; 4]).unwrap();
    let r = gemm::matmul(&dev, s, &a, Operand::row_major(4, 6), &b, Operand::row_major(6, 5), &mut c, 5, 20,
        &Epilogue { bias: Some(&bias), ..Epilogue::default() });
    assert!(matches!(r, Err(LaunchError::InvalidArgument { .. })), "{r:?}");
    assert!(dev.download(&c).unwrap().iter().all(|x| *x == f16::ZERO), "nothing written");
    // The good call works.
    run(s, Operand::row_major(4, 6), Operand::row_major(6, 5), 5, &mut c).unwrap();
    assert!(dev.download(&c).unwrap().iter().all(|x| *x == f16::from_f32(6.0)));
    let _ = Lowering::Mfma;
}
