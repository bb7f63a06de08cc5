//! `candle_rocm::llm_ops` on our devices against the same functions on `Device::Cpu`
//! (plain Candle ops: `Linear`, add + candle-nn's `rms_norm`, `silu` * up, `argmax`; the
//! sampler's CPU path runs its kernel through the CPU executor), and matvec-shaped
//! `matmul`s (which now take the dense matvec) against Candle's CPU matmul.
//!
//! Tolerances: `common::tol` (one rounding of the result type plus f32 evaluation
//! differences), widened for products by the f32 accumulation bound over `k` terms
//! (`k * 2^-24` relative to the sum of absolute products, here at most `k * 9 * 2^-24`
//! relative to the typical result for inputs in [-3, 3]).
mod common;

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_rocm::llm_ops::{self, SamplingParams};
use candle_rocm::RocmDevice;
use common::{assert_close, devices, rand, tol, Tol};

/// `tol(dtype)` widened for a product over `k` terms.
fn product_tol(dtype: DType, k: usize) -> Tol {
    let t = tol(dtype);
    Tol { rtol: t.rtol + k as f64 * 9.0 * 2f64.powi(-24), atol: t.atol + k as f64 * 9.0 * 2f64.powi(-24) }
}

/// Runs `f` on the CPU and on `dev` and returns both results (the device's on the CPU).
fn both(dev: &RocmDevice, f: impl Fn(&Device) -> Result<Tensor>) -> (Tensor, Tensor) {
    let want = f(&Device::Cpu).unwrap();
    let got = f(&dev.as_candle()).unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
    assert!(matches!(got.device(), Device::Ext(_)), "the result left the device");
    (want, got.to_device(&Device::Cpu).unwrap())
}

#[test]
fn linear_matches_candle_on_cpu() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Decode shapes (1..8 rows: the fused matvec), odd widths, and 9 rows (Linear).
            for (i, (xs, n)) in [(vec![1, 64], 33), (vec![3, 1, 200], 17), (vec![8, 96], 5), (vec![2, 1, 13], 7), (vec![9, 40], 11)].into_iter().enumerate() {
                let k = *xs.last().unwrap();
                let x = rand(&xs, dtype, 10 + i as u64, false);
                let w = rand(&[n, k], dtype, 20 + i as u64, false);
                let b = rand(&[n], dtype, 30 + i as u64, false);
                for with_bias in [false, true] {
                    let what = format!("linear {dtype:?} {xs:?} x [{n}, {k}] bias {with_bias} on {}", dev.name());
                    let (want, got) = both(&dev, |d| {
                        let (x, w, b) = (x.to_device(d)?, w.to_device(d)?, b.to_device(d)?);
                        llm_ops::linear(&x, &w, with_bias.then_some(&b))
                    });
                    assert_close(&what, &want, &got, product_tol(dtype, k));
                }
            }
        }
    }
}

#[test]
fn matvec_shaped_matmuls_take_the_matvec_and_match_cpu() {
    for dev in devices() {
        let d = dev.as_candle();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let k = 136;
            let w = rand(&[24, k], dtype, 1, false);
            for (i, xs) in [vec![1, k], vec![1, 1, k], vec![2, 3, k], vec![1, 8, k]].into_iter().enumerate() {
                let x = rand(&xs, dtype, 2 + i as u64, false);
                let want = candle_nn::Linear::new(w.clone(), None).forward(&x).unwrap();
                let (xg, wg) = (x.to_device(&d).unwrap(), w.to_device(&d).unwrap());
                let got = candle_nn::Linear::new(wg.clone(), None).forward(&xg).unwrap();
                let via_gemm = candle_rocm::ops::matmul::with_gemm_for_matvecs(|| candle_nn::Linear::new(wg.clone(), None).forward(&xg)).unwrap();
                let what = format!("Linear {dtype:?} {xs:?} on {}", dev.name());
                assert_close(&what, &want, &got, product_tol(dtype, k));
                assert_close(&format!("{what} (GEMM path)"), &want, &via_gemm, product_tol(dtype, k));
            }
        }
    }
}

#[test]
fn matvec_plan_takes_decode_products_only() {
    use candle_rocm::buffer::Buf;
    use candle_rocm::gemm::{matvec_plan, GemmOperand, GemmShape};
    let dev = kernels::runtime::Device::cpu(kernel_dsl::host::WaveSize::W32);
    let buf = Buf::zeros(&dev, DType::F32, 4096).unwrap();
    let r = buf.region(0, 4096).unwrap();
    let op = |batch, row, col| GemmOperand { data: r, batch, row, col };
    let s = |batch, m, n, k| GemmShape { batch, m, n, k };
    // x [1, 64] times a [32, 64] weight read transposed: a matvec.
    assert!(matvec_plan(&op(0, 64, 1), &op(0, 1, 64), s(1, 1, 32, 64)).is_some());
    // Batches of contiguous rows sharing the weight (Linear on [b, t, k]).
    assert!(matvec_plan(&op(128, 64, 1), &op(0, 1, 64), s(4, 2, 32, 64)).is_some());
    // Too many rows, a row-major weight, a per-batch weight, strided activations: no.
    assert!(matvec_plan(&op(0, 64, 1), &op(0, 1, 64), s(1, 9, 32, 64)).is_none());
    assert!(matvec_plan(&op(0, 64, 1), &op(0, 32, 1), s(1, 1, 32, 64)).is_none());
    assert!(matvec_plan(&op(64, 64, 1), &op(2048, 1, 64), s(2, 1, 32, 64)).is_none());
    assert!(matvec_plan(&op(0, 128, 1), &op(0, 1, 64), s(1, 2, 32, 64)).is_none());
}

#[test]
fn add_rms_norm_matches_candle_on_cpu() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (i, shape) in [vec![1, 64], vec![2, 3, 100], vec![4, 4096]].into_iter().enumerate() {
                let x = rand(&shape, dtype, 40 + i as u64, false);
                let r = rand(&shape, dtype, 50 + i as u64, false);
                let w = rand(&[*shape.last().unwrap()], dtype, 60 + i as u64, false);
                let run = |d: &Device| llm_ops::add_rms_norm(&x.to_device(d)?, &r.to_device(d)?, &w.to_device(d)?, 1e-6);
                let (h0, n0) = run(&Device::Cpu).unwrap();
                let (h1, n1) = run(&dev.as_candle()).unwrap();
                let what = format!("add_rms_norm {dtype:?} {shape:?} on {}", dev.name());
                // The residual is one add and one rounding on both: exact.
                assert_close(&format!("{what}: residual"), &h0, &h1, common::EXACT);
                assert_close(&format!("{what}: normed"), &n0, &n1, tol(dtype));
            }
        }
    }
}

#[test]
fn silu_mul_matches_candle_on_cpu() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (i, shape) in [vec![1, 2], vec![3, 1, 200], vec![2, 2 * 999]].into_iter().enumerate() {
                let gu = rand(&shape, dtype, 70 + i as u64, false);
                let (want, got) = both(&dev, |d| llm_ops::silu_mul(&gu.to_device(d)?));
                // Candle rounds silu(gate) to the dtype before the product: two roundings.
                let t = tol(dtype);
                assert_close(&format!("silu_mul {dtype:?} {shape:?} on {}", dev.name()), &want, &got, Tol { rtol: 2.0 * t.rtol, atol: 2.0 * t.atol });
            }
        }
    }
}

/// `SiLU(x Wg^T + bg) * (x Wu^T + bu)` in f64 on the CPU (Candle's ops), rounded to
/// `dtype`: the independent reference of `linear_silu_mul`; also the largest `|g| + |u|`.
fn gated_reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>, dtype: DType) -> (Tensor, f64) {
    let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let (x, w) = (f(x), f(w));
    let k = *x.dims().last().unwrap();
    let n = w.dim(0).unwrap();
    let mut y = x.reshape(((), k)).unwrap().matmul(&w.t().unwrap()).unwrap();
    if let Some(b) = b {
        y = y.broadcast_add(&f(b)).unwrap();
    }
    let (g, u) = (y.narrow(1, 0, n / 2).unwrap(), y.narrow(1, n / 2, n / 2).unwrap());
    let scale = (g.abs().unwrap() + u.abs().unwrap()).unwrap().max_all().unwrap().to_scalar::<f64>().unwrap_or(0.0);
    let mut dims = x.dims().to_vec();
    *dims.last_mut().unwrap() = n / 2;
    let out = (candle_nn::ops::silu(&g).unwrap() * u).unwrap().reshape(dims).unwrap().to_dtype(dtype).unwrap();
    (out, scale)
}

#[test]
fn linear_silu_mul_matches_f64_silu_of_the_separate_products() {
    for dev in devices() {
        let d = dev.as_candle();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            // Decode shapes (1..8 rows: the gated kernel), an odd width (element path), and
            // 9 rows (the product then silu_mul).
            for (i, (xs, inter)) in [(vec![1, 64], 33), (vec![3, 1, 200], 17), (vec![8, 96], 5), (vec![2, 1, 13], 7), (vec![5, 1024], 6), (vec![9, 40], 11)].into_iter().enumerate() {
                let k = *xs.last().unwrap();
                let x = rand(&xs, dtype, 110 + i as u64, false);
                let w = rand(&[2 * inter, k], dtype, 120 + i as u64, false);
                let b = rand(&[2 * inter], dtype, 130 + i as u64, false);
                for with_bias in [false, true] {
                    let what = format!("linear_silu_mul {dtype:?} {xs:?} x [{}, {k}] bias {with_bias} on {}", 2 * inter, dev.name());
                    let (want, scale) = gated_reference(&x, &w, with_bias.then_some(&b), dtype);
                    let got = llm_ops::linear_silu_mul(&x.to_device(&d).unwrap(), &w.to_device(&d).unwrap(), with_bias.then(|| b.to_device(&d).unwrap()).as_ref()).unwrap();
                    assert!(matches!(got.device(), Device::Ext(_)), "{what}: the result left the device");
                    // The reference rounds once, the kernel once (two roundings apart), plus
                    // the products' f32 error carried through SiLU(g) * u (|SiLU'| <= 1.1):
                    // at most 2.1 * k * 9 * 2^-24 * (|g| + |u|) for inputs in [-3, 3]. Nine
                    // rows round the products to the dtype before the activation too.
                    let t = tol(dtype);
                    let rounds = if xs[0] == 9 { 3.0 } else { 2.0 };
                    let prod = 2.1 * product_tol(DType::F32, k).atol * scale;
                    assert_close(&what, &want, &got.to_device(&Device::Cpu).unwrap(), Tol { rtol: rounds * t.rtol, atol: t.atol + prod + (rounds - 2.0) * t.rtol * scale * scale });
                }
            }
        }
        // Bad shapes: a clear error.
        let x = Tensor::zeros((2, 8), DType::F32, &d).unwrap();
        let odd = Tensor::zeros((7, 8), DType::F32, &d).unwrap();
        let e = llm_ops::linear_silu_mul(&x, &odd, None).unwrap_err().to_string();
        assert!(e.contains("`w`"), "{e}");
        let w = Tensor::zeros((6, 8), DType::F32, &d).unwrap();
        let bias = Tensor::zeros(5, DType::F32, &d).unwrap();
        let e = llm_ops::linear_silu_mul(&x, &w, Some(&bias)).unwrap_err().to_string();
        assert!(e.contains("`bias`"), "{e}");
    }
}

#[test]
fn argmax_and_sample_agree_with_the_cpu_path() {
    let (rows, vocab) = (6, 1000);
    let configs = [
        SamplingParams::default(),
        SamplingParams { temperature: 0.9, top_k: 50, top_p: 0.9, min_p: 0.02, repetition_penalty: 1.1 },
        SamplingParams { temperature: 1.5, ..Default::default() },
    ];
    for dev in devices() {
        let d = dev.as_candle();
        for dtype in [DType::F32, DType::BF16] {
            let logits = rand(&[rows, vocab], dtype, 80, false);
            let (want, got) = both(&dev, |d| llm_ops::argmax(&logits.to_device(d)?));
            assert_eq!(want.to_vec1::<u32>().unwrap(), got.to_vec1::<u32>().unwrap(), "argmax {dtype:?}");
            let pen = Tensor::from_vec((0..rows as u32 * 4).map(|i| (i * 37) % vocab as u32).collect::<Vec<u32>>(), (rows, 4), &Device::Cpu).unwrap();
            for p in &configs {
                let keys = llm_ops::sampling_keys(&[7; 6], &[0, 1, 2, 3, 4, 5], &Device::Cpu).unwrap();
                let run = |d: &Device| {
                    let params = llm_ops::sampling_params(&[*p; 6], d)?;
                    llm_ops::sample(&logits.to_device(d)?, &params, Some(&pen.to_device(d)?), &keys.to_device(d)?)
                };
                let (want, got) = both(&dev, run);
                let (w, g) = (want.to_vec1::<u32>().unwrap(), got.to_vec1::<u32>().unwrap());
                assert_eq!(w, g, "sample {dtype:?} {p:?} on {}: the CPU path and the device differ", dev.name());
                if p.temperature == 0.0 {
                    // Greedy with no penalty is argmax.
                    assert_eq!(g, llm_ops::argmax(&logits).unwrap().to_vec1::<u32>().unwrap());
                }
            }
        }
        // Errors name the argument.
        let logits = Tensor::zeros((2, 10), DType::F32, &d).unwrap();
        let params = llm_ops::sampling_params(&[SamplingParams::default(); 2], &d).unwrap();
        let keys = Tensor::zeros((3, 2), DType::U32, &d).unwrap();
        let e = llm_ops::sample(&logits, &params, None, &keys).unwrap_err().to_string();
        assert!(e.contains("`keys`"), "{e}");
        let e = llm_ops::sampling_params(&[SamplingParams { top_p: 2.0, ..Default::default() }], &d).unwrap_err().to_string();
        assert!(e.contains("`params[0]`"), "{e}");
    }
}

#[test]
fn errors_name_the_argument() {
    for dev in devices() {
        let d = dev.as_candle();
        let x = Tensor::zeros((2, 8), DType::F32, &d).unwrap();
        let w = Tensor::zeros((4, 7), DType::F32, &d).unwrap();
        let e = llm_ops::linear(&x, &w, None).unwrap_err().to_string();
        assert!(e.contains("`w`"), "{e}");
        let w = Tensor::zeros((4, 8), DType::F32, &d).unwrap();
        let b = Tensor::zeros(5, DType::F32, &d).unwrap();
        let e = llm_ops::linear(&x, &w, Some(&b)).unwrap_err().to_string();
        assert!(e.contains("`bias`"), "{e}");
        let wh = Tensor::zeros((4, 8), DType::F16, &d).unwrap();
        let e = llm_ops::linear(&x, &wh, None).unwrap_err().to_string();
        assert!(e.contains("`w`"), "{e}");
        let r = Tensor::zeros((2, 7), DType::F32, &d).unwrap();
        let nw = Tensor::zeros(8, DType::F32, &d).unwrap();
        let e = llm_ops::add_rms_norm(&x, &r, &nw, 1e-5).unwrap_err().to_string();
        assert!(e.contains("`residual`"), "{e}");
        let e = llm_ops::add_rms_norm(&x, &x, &b, 1e-5).unwrap_err().to_string();
        assert!(e.contains("`weight`"), "{e}");
        let odd = Tensor::zeros((2, 7), DType::F32, &d).unwrap();
        let e = llm_ops::silu_mul(&odd).unwrap_err().to_string();
        assert!(e.contains("`gate_up`"), "{e}");
        let cpu = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(llm_ops::linear(&x, &cpu, None).is_err());
    }
    // The same checks on Device::Cpu.
    let x = Tensor::zeros((2, 8), DType::F32, &Device::Cpu).unwrap();
    let e = llm_ops::silu_mul(&x.narrow(D::Minus1, 0, 7).unwrap()).unwrap_err().to_string();
    assert!(e.contains("`gate_up`"), "{e}");
}
