//! Quantized tensors (`QStorage::Ext`, `RocmQStorage`) against Candle's CPU backend and an
//! f64 reference, for every GGML format, on the CPU executor (waves 32 and 64) and the GPU
//! when there is one.
//!
//! Tolerances. `dequantize` is exact: the kernels do Candle's float operations in Candle's
//! order. `QMatMul::forward` is not: both sides quantize the activations before the integer
//! dot products (ours: q8_1, `d = amax / 127` per 32 values, f32 scale; Candle's CPU: q8_0
//! or q8_1 with an f16 scale per 32 values, or q8_K with `d = amax / 127` per 256 values).
//! Rounding `x` to a step `d` moves it by at most `d / 2`, and the f16 rounding of the
//! scale adds at most `127 * d * 2^-11 < 0.07 d`, so for an output `y = sum_i w_i x_i` with
//! the dequantized weights `w` (exact, checked separately) the error of either side is at
//! most `sum_i |w_i| * 0.57 * amax(block of x_i) / 127` plus f32 accumulation
//! (`k * 2^-24 * sum |w_i x_i|`, with room). Each side is checked against that bound around
//! the f64 product of the dequantized weights (ours with 32-value blocks, Candle's with
//! the 256-value block, which bounds every scheme it uses); past the matvec (batch 17, and
//! Q8K) ours runs an f16 GEMM with f32 accumulation: weights and activations rounded to
//! f16 (relative 2^-11 each, so `2 * 2^-11 * sum |w_i x_i|`) and the result rounded to f16
//! once (`2^-11 |y|`). On top of the worst-case
//! bound, the RMS error of our matvec must stay within twice the RMS of independent
//! uniform roundings (`d^2 / 12` per term): a systematic error (a wrong scale, a lost
//! block) fails this even where the worst-case bound is loose.
mod common;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use candle_rocm::quantized::MATVEC_MAX_ROWS;
use common::{devices, values};

/// Every GGML format (Q8_1 is held as Q8_0 blocks plus its block sums).
const FORMATS: [GgmlDType; 15] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q8_1,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8K,
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
];

const ROWS: usize = 16;
const COLS: usize = 256;

fn weights(seed: u64) -> Tensor {
    Tensor::from_vec(values(ROWS * COLS, seed, -1.0, 1.0, false), (ROWS, COLS), &Device::Cpu).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Per output `(b, r)`: the f64 product, and the activation-rounding bounds with blocks of
/// 32 and of 256 values (see the module doc), plus `sum |w x|`.
struct Reference {
    exact: Vec<f64>,
    bound32: Vec<f64>,
    bound256: Vec<f64>,
    rms32: f64,
    abs: Vec<f64>,
}

fn reference(w: &[f32], x: &[f32], batch: usize) -> Reference {
    let amax = |b: usize, i: usize, blk: usize| -> f64 {
        let s = b * COLS + i / blk * blk;
        x[s..s + blk].iter().fold(0f64, |m, v| m.max(v.abs() as f64))
    };
    let (mut exact, mut bound32, mut bound256, mut abs) = (vec![], vec![], vec![], vec![]);
    let mut var = 0f64;
    for b in 0..batch {
        for r in 0..ROWS {
            let (mut e, mut b32, mut b256, mut a) = (0f64, 0f64, 0f64, 0f64);
            for i in 0..COLS {
                let (wi, xi) = (w[r * COLS + i] as f64, x[b * COLS + i] as f64);
                e += wi * xi;
                a += (wi * xi).abs();
                let (d32, d256) = (amax(b, i, 32) / 127.0, amax(b, i, 256) / 127.0);
                b32 += wi.abs() * 0.57 * d32;
                b256 += wi.abs() * 0.57 * d256;
                var += wi * wi * d32 * d32 / 12.0;
            }
            exact.push(e);
            bound32.push(b32);
            bound256.push(b256);
            abs.push(a);
        }
    }
    Reference { exact, bound32, bound256, rms32: (var / (batch * ROWS) as f64).sqrt(), abs }
}

/// f32 accumulation over `COLS` terms, with room (different summation orders).
fn f32_slack(abs: f64) -> f64 {
    4.0 * COLS as f64 * f32::EPSILON as f64 * abs + 1e-6
}

fn check_within(what: &str, got: &[f32], r: &Reference, bound: impl Fn(usize) -> f64) {
    for (i, g) in got.iter().enumerate() {
        let err = (*g as f64 - r.exact[i]).abs();
        assert!(err <= bound(i), "{what}: output {i}: {g} vs f64 {} (error {err:.3e} > bound {:.3e})", r.exact[i], bound(i));
    }
}

#[test]
fn quantize_dequantize_every_format() {
    for dev in devices() {
        let d = dev.as_candle();
        for (fi, dtype) in FORMATS.iter().copied().enumerate() {
            let w = weights(100 + fi as u64);
            let cpu = QTensor::quantize(&w, dtype).unwrap();
            // Quantizing a tensor on our device (host quantization, uploaded) gives Candle's bytes.
            let ours = QTensor::quantize(&w.to_device(&d).unwrap(), dtype).unwrap_or_else(|e| panic!("{dtype:?} on {}: {e}", dev.name()));
            assert!(matches!(ours.device(), Device::Ext(_)), "{dtype:?}: quantized tensor left the device");
            assert_eq!(ours.data().unwrap().as_ref(), cpu.data().unwrap().as_ref(), "{dtype:?} on {}: block bytes", dev.name());
            assert_eq!(ours.storage_size_in_bytes(), cpu.storage_size_in_bytes());
            // Dequantize: bit for bit Candle's CPU result.
            let (want, got) = (f32s(&cpu.dequantize(&Device::Cpu).unwrap()), ours.dequantize(&d).unwrap());
            assert!(matches!(got.device(), Device::Ext(_)));
            let got = f32s(&got);
            assert_eq!(want.len(), got.len());
            let bad = want.iter().zip(&got).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(bad, 0, "{dtype:?} on {}: {bad} dequantized values differ from Candle's CPU", dev.name());
        }
    }
}

#[test]
fn qmatmul_every_format_and_batch() {
    for dev in devices() {
        let d = dev.as_candle();
        for (fi, dtype) in FORMATS.iter().copied().enumerate() {
            let cpu_q = QTensor::quantize(&weights(200 + fi as u64), dtype).unwrap();
            let wq = f32s(&cpu_q.dequantize(&Device::Cpu).unwrap());
            let ours_q = QTensor::quantize(&weights(200 + fi as u64).to_device(&d).unwrap(), dtype).unwrap();
            let (cpu_mm, ours_mm) = (QMatMul::from_qtensor(cpu_q).unwrap(), QMatMul::from_qtensor(ours_q).unwrap());
            let float_format = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
            // 17: the matvec in two tiles of 8 rows and one of 1 (a decode step of many
            // sequences; the kernels test takes 9..=17, 63 and 64);
            // 65: dequantize + GEMM.
            for batch in [1usize, 3, 8, 17, 65] {
                let x = values(batch * COLS, 300 + batch as u64, -2.0, 2.0, false);
                let xt = Tensor::from_vec(x.clone(), (1, batch, COLS), &Device::Cpu).unwrap();
                let what = format!("{dtype:?} batch {batch} on {}", dev.name());
                let got = ours_mm.forward(&xt.to_device(&d).unwrap()).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(matches!(got.device(), Device::Ext(_)), "{what}: result left the device");
                assert_eq!(got.dims(), &[1, batch, ROWS], "{what}: shape");
                let got = f32s(&got);
                let want = f32s(&cpu_mm.forward(&xt).unwrap());
                let r = reference(&wq, &x, batch);
                // Float formats are plain matmuls on both sides (QMatMul dequantizes them).
                let quantized_acts = !float_format && batch <= MATVEC_MAX_ROWS && dtype != GgmlDType::Q8K;
                // Block formats past the matvec: an f16 GEMM (weights and activations
                // rounded to f16, relative 2^-11 each, f32 accumulation, the result rounded
                // to f16 once).
                let f16_gemm = !float_format && !quantized_acts;
                let half = 2f64.powi(-11);
                check_within(&format!("{what}: ours"), &got, &r, |i| {
                    f32_slack(r.abs[i])
                        + if quantized_acts { r.bound32[i] } else { 0.0 }
                        + if f16_gemm { 2.0 * half * r.abs[i] + half * r.exact[i].abs() * 1.01 } else { 0.0 }
                });
                check_within(&format!("{what}: Candle CPU"), &want, &r, |i| f32_slack(r.abs[i]) + if float_format { 0.0 } else { r.bound256[i] });
                if quantized_acts {
                    let mse = got.iter().zip(&r.exact).map(|(g, e)| (*g as f64 - e).powi(2)).sum::<f64>() / got.len() as f64;
                    assert!(mse.sqrt() <= 2.0 * r.rms32 + 1e-6, "{what}: RMS error {:.3e} vs {:.3e} expected of q8_1 rounding", mse.sqrt(), r.rms32);
                }
            }
        }
    }
}

/// With the per-op profile on, each `QMatMul::forward` is one `qmatmul.<format>` call with
/// the activations' dtype, whichever path it takes (matvec at batch 2, GEMM at batch 65).
#[test]
fn qmatmul_is_in_the_op_profile() {
    for dev in devices() {
        let d = dev.as_candle();
        let mm = QMatMul::from_qtensor(QTensor::quantize(&weights(401).to_device(&d).unwrap(), GgmlDType::Q4_0).unwrap()).unwrap();
        dev.set_profiling(true);
        dev.take_profile().unwrap();
        for batch in [2usize, 65] {
            let x = Tensor::from_vec(values(batch * COLS, 600 + batch as u64, -1.0, 1.0, false), (batch, COLS), &d).unwrap();
            mm.forward(&x).unwrap();
        }
        let p = dev.take_profile().unwrap();
        dev.set_profiling(false);
        assert_eq!(p.calls_of("qmatmul.q4_0"), 2, "on {}: {}", dev.name(), p.table());
    }
}

#[test]
fn qmatmul_half_activations() {
    // f16/bf16 activations: q8_1 from the half values (batch 1, 3, and 17: two tiles of the
    // matvec; its output is the f32 product rounded once), dequantize to the half type + GEMM (batch 65); the reference uses the half-rounded inputs, and the result is
    // rounded once to the half type (relative 2^-11 / 2^-8 of |y|, on top of the bounds).
    for dev in devices() {
        let d = dev.as_candle();
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4K] {
            let cpu_q = QTensor::quantize(&weights(400), dtype).unwrap();
            let wq = f32s(&cpu_q.dequantize(&Device::Cpu).unwrap());
            let mm = QMatMul::from_qtensor(QTensor::quantize(&weights(400).to_device(&d).unwrap(), dtype).unwrap()).unwrap();
            for (act, half_ulp) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
                for batch in [1usize, 3, 17, 65] {
                    let xt = Tensor::from_vec(values(batch * COLS, 500 + batch as u64, -2.0, 2.0, false), (batch, COLS), &Device::Cpu).unwrap().to_dtype(act).unwrap();
                    let x = f32s(&xt);
                    let what = format!("{dtype:?} {act:?} batch {batch} on {}", dev.name());
                    let y = mm.forward(&xt.to_device(&d).unwrap()).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(y.dtype(), act, "{what}: dtype");
                    if batch <= MATVEC_MAX_ROWS {
                        // The matvec writes the half type itself: its f32 sums (the same
                        // values as f32 activations, hence the same q8_1 codes) rounded once.
                        let y32 = f32s(&mm.forward(&xt.to_dtype(DType::F32).unwrap().to_device(&d).unwrap()).unwrap());
                        let rounded: Vec<f32> = f32s(&Tensor::new(y32, &Device::Cpu).unwrap().to_dtype(act).unwrap());
                        assert_eq!(f32s(&y), rounded, "{what}: the f32 product rounded once");
                    }
                    let r = reference(&wq, &x, batch);
                    // The GEMM path multiplies half weights: their rounding is at most half_ulp relative.
                    check_within(&what, &f32s(&y), &r, |i| {
                        half_ulp * (r.exact[i].abs() + 1e-3) + f32_slack(r.abs[i]) + if batch <= MATVEC_MAX_ROWS { r.bound32[i] } else { half_ulp * r.abs[i] }
                    });
                }
            }
        }
    }
}

#[test]
fn unsupported_format_and_bad_input_are_errors() {
    for dev in devices() {
        let d = dev.as_candle();
        let w = weights(7).to_device(&d).unwrap();
        // Data that is not whole blocks.
        let bad = candle_core::quantized::QStorage::from_data(std::borrow::Cow::Borrowed(&[0u8; 19][..]), &d, GgmlDType::Q4_0);
        assert!(bad.is_err(), "19 bytes are not Q4_0 blocks");
        let bad = candle_core::quantized::QStorage::from_data(std::borrow::Cow::Borrowed(&[0u8; 34][..]), &d, GgmlDType::Q8_1);
        let e = bad.err().expect("34 bytes are not a Q8_1 block (36)").to_string();
        assert!(e.contains("Q8_1"), "error names the format: {e}");
        // Q8_1 quantization of a non-f32-like source, and a dequantize of the wrong size.
        let q = candle_rocm::RocmQStorage::from_data(&dev, &[0u8; 72], GgmlDType::Q8_1).unwrap();
        assert_eq!(q.elem_count(), 64);
        assert!(q.dequantize_to(63, DType::F32).is_err());
        assert!(q.dequantize_to(64, DType::U8).is_err());
        // An input whose last dim is not the weights' columns.
        let mm = QMatMul::from_qtensor(QTensor::quantize(&w, GgmlDType::Q4_0).unwrap()).unwrap();
        let x = Tensor::zeros((2, COLS / 2), DType::F32, &d).unwrap();
        assert!(mm.forward(&x).is_err(), "mismatched input must be an error");
    }
}

/// Q8_1 weights (GGML `block_q8_1`: `d: f16, s: f16, qs: [i8; 32]`): the bytes of any file
/// come back unchanged (the sums `s` are kept apart, even where they disagree with the
/// codes), `dequantize_to` f32/f16/bf16 is bit for bit Candle's CPU dequantize (rounded
/// once to the half type), and `QMatMul::forward` is within the sum of the two sides'
/// activation-rounding bounds of Candle's CPU result (both quantize the activations, ours
/// to q8_1 with f32 scales per 32 values, Candle's to q8_1 with f16 scales per 32 values;
/// each is within its bound of the f64 product, see the module doc, plus f32 accumulation
/// in different orders).
#[test]
fn q8_1_weights_round_trip_dequantize_and_matmul_like_candle_cpu() {
    for dev in devices() {
        let d = dev.as_candle();
        // Blocks from Candle's quantizer, then the sums overwritten with arbitrary bytes.
        let cpu = QTensor::quantize(&weights(700), GgmlDType::Q8_1).unwrap();
        let mut bytes = cpu.data().unwrap().to_vec();
        assert_eq!(bytes.len(), ROWS * COLS / 32 * 36);
        for (i, b) in bytes.chunks_exact_mut(36).enumerate() {
            if i % 3 == 0 {
                b[2] = i as u8;
                b[3] = 0x5a;
            }
        }
        let ours = candle_rocm::RocmQStorage::from_data(&dev, &bytes, GgmlDType::Q8_1).unwrap();
        use candle_core::ext_backend::ExtBackendQStorage;
        assert_eq!(ours.data().unwrap(), bytes, "on {}: Q8_1 bytes back", dev.name());
        assert_eq!(ours.storage_size_in_bytes(), bytes.len());
        assert_eq!(ours.dtype(), GgmlDType::Q8_1);
        let cpu_q = candle_core::quantized::QTensor::new(
            candle_core::quantized::QStorage::from_data(std::borrow::Cow::Borrowed(&bytes[..]), &Device::Cpu, GgmlDType::Q8_1).unwrap(),
            (ROWS, COLS),
        )
        .unwrap();
        let want = cpu_q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let b: Vec<f32> = match ours.dequantize_to(ROWS * COLS, dtype).unwrap().download(dev.kernels()).unwrap() {
                candle_core::CpuStorage::F32(v) => v,
                candle_core::CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                candle_core::CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
                _ => panic!("dequantize_to({dtype:?}) gave another dtype"),
            };
            let a = want.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            let bad = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(bad, 0, "on {}: Q8_1 dequantize to {dtype:?}: {bad} values differ from Candle's CPU", dev.name());
        }
        // QMatMul on a tensor quantized on our device: matvec (1, 3 rows) and GEMM (17).
        let wq = f32s(&cpu.dequantize(&Device::Cpu).unwrap());
        let ours_mm = QMatMul::from_qtensor(QTensor::quantize(&weights(700).to_device(&d).unwrap(), GgmlDType::Q8_1).unwrap()).unwrap();
        let cpu_mm = QMatMul::from_qtensor(cpu).unwrap();
        for batch in [1usize, 3, 17] {
            let x = values(batch * COLS, 710 + batch as u64, -2.0, 2.0, false);
            let xt = Tensor::from_vec(x.clone(), (batch, COLS), &Device::Cpu).unwrap();
            let what = format!("Q8_1 batch {batch} on {}", dev.name());
            let got = ours_mm.forward(&xt.to_device(&d).unwrap()).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(matches!(got.device(), Device::Ext(_)), "{what}: result left the device");
            let (got, want) = (f32s(&got), f32s(&cpu_mm.forward(&xt).unwrap()));
            let r = reference(&wq, &x, batch);
            let half = 2f64.powi(-11);
            for i in 0..got.len() {
                let ours_bound = if batch <= 8 { r.bound32[i] } else { 2.0 * half * r.abs[i] + half * r.exact[i].abs() * 1.01 };
                let bound = ours_bound + r.bound32[i] + 2.0 * f32_slack(r.abs[i]);
                let err = (got[i] as f64 - want[i] as f64).abs();
                assert!(err <= bound, "{what}: output {i}: ours {} vs Candle CPU {} (|diff| {err:.3e} > {bound:.3e})", got[i], want[i]);
            }
        }
    }
}

/// `dequantize_to` f32/f16/bf16 of every block format at 1, 3 and 9 rows of 256 weights (1,
/// 3 and 9 k-quant blocks; 8, 24 and 72 blocks of 32: tails of the kernels' work-groups and
/// pieces): bit for bit Candle's CPU dequantize, rounded once to the half types.
#[test]
fn dequantize_to_every_format_and_odd_block_counts_like_candle_cpu() {
    for dev in devices() {
        for (fi, dtype) in FORMATS.iter().copied().enumerate().filter(|(_, d)| !matches!(d, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)) {
            for rows in [1usize, 3, 9] {
                let w = Tensor::from_vec(values(rows * COLS, 900 + 10 * fi as u64 + rows as u64, -1.0, 1.0, false), (rows, COLS), &Device::Cpu).unwrap();
                let cpu = QTensor::quantize(&w, dtype).unwrap();
                let bytes = cpu.data().unwrap().to_vec();
                let ours = candle_rocm::RocmQStorage::from_data(&dev, &bytes, dtype).unwrap();
                let want = cpu.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
                for out in [DType::F32, DType::F16, DType::BF16] {
                    let what = format!("{dtype:?} x{rows} rows to {out:?} on {}", dev.name());
                    let got: Vec<f32> = match ours.dequantize_to(rows * COLS, out).unwrap().download(dev.kernels()).unwrap() {
                        candle_core::CpuStorage::F32(v) => v,
                        candle_core::CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                        candle_core::CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
                        _ => panic!("{what}: another dtype"),
                    };
                    let a = want.to_dtype(out).unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(a.len(), got.len(), "{what}: length");
                    let bad = a.iter().zip(&got).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    assert_eq!(bad, 0, "{what}: {bad} values differ from Candle's CPU");
                }
            }
        }
    }
}

/// Activations that carry their q8_1 codes (`llm_ops::add_rms_norm_q8` with and without a
/// residual, `llm_ops::silu_mul_q8`) give products bit for bit those of the same values
/// without codes (a copy: the product quantizes it itself), for block formats of both
/// kinds and every batch one matvec launch takes: the fused kernels' codes are
/// `quantize_q8_1`'s. The outputs themselves are the plain ops' within their tolerance.
#[test]
fn activations_with_codes_give_the_quantizing_products_bits() {
    for dev in devices() {
        let d = dev.as_candle();
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for (fi, fmt) in [GgmlDType::Q4K, GgmlDType::Q8_0, GgmlDType::Q6K, GgmlDType::Q4_0].into_iter().enumerate() {
                let mm = QMatMul::from_qtensor(QTensor::quantize(&weights(900 + fi as u64).to_device(&d).unwrap(), fmt).unwrap()).unwrap();
                let w = Tensor::from_vec(values(COLS, 950, 0.5, 1.5, false), COLS, &Device::Cpu).unwrap().to_dtype(dtype).unwrap().to_device(&d).unwrap();
                for batch in [1usize, 3, 8] {
                    let what = format!("{fmt:?} {dtype:?} batch {batch} on {}", dev.name());
                    let seed = 960 + batch as u64 * 10 + fi as u64;
                    let x = Tensor::from_vec(values(batch * COLS, seed, -2.0, 2.0, false), (batch, COLS), &Device::Cpu).unwrap().to_dtype(dtype).unwrap().to_device(&d).unwrap();
                    let r = Tensor::from_vec(values(batch * COLS, seed + 1, -2.0, 2.0, false), (batch, COLS), &Device::Cpu).unwrap().to_dtype(dtype).unwrap().to_device(&d).unwrap();
                    let gu = Tensor::from_vec(values(batch * 2 * COLS, seed + 2, -4.0, 4.0, false), (batch, 2 * COLS), &Device::Cpu).unwrap().to_dtype(dtype).unwrap().to_device(&d).unwrap();
                    let (h, normed) = candle_rocm::llm_ops::add_rms_norm_q8(&x, Some(&r), &w, 1e-6).unwrap();
                    let (_, plain) = candle_rocm::llm_ops::add_rms_norm(&x, &r, &w, 1e-6).unwrap();
                    assert_eq!(f32s(&h), f32s(&(&x + &r).unwrap()), "{what}: residual");
                    assert_eq!(f32s(&normed), f32s(&plain), "{what}: add_rms_norm_q8 against add_rms_norm");
                    let (_, first) = candle_rocm::llm_ops::add_rms_norm_q8(&x, None, &w, 1e-6).unwrap();
                    let want_first = candle_nn::ops::rms_norm(&x.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap(), &w.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap(), 1e-6).unwrap();
                    let tol = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
                    for (a, b) in f32s(&first).iter().zip(f32s(&want_first)) {
                        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}: rms_norm {a} against {b}");
                    }
                    let act = candle_rocm::llm_ops::silu_mul_q8(&gu).unwrap();
                    assert_eq!(f32s(&act), f32s(&candle_rocm::llm_ops::silu_mul(&gu).unwrap()), "{what}: silu_mul_q8 against silu_mul");
                    for (name, a) in [("add_rms_norm_q8", &normed), ("rms_norm", &first)] {
                        let (with, without) = (mm.forward(a).unwrap(), mm.forward(&a.copy().unwrap()).unwrap());
                        assert_eq!(f32s(&with), f32s(&without), "{what}: product on {name}'s codes");
                    }
                    let down = QMatMul::from_qtensor(QTensor::quantize(&weights(980 + fi as u64).to_device(&d).unwrap(), fmt).unwrap()).unwrap();
                    let (with, without) = (down.forward(&act).unwrap(), down.forward(&act.copy().unwrap()).unwrap());
                    assert_eq!(f32s(&with), f32s(&without), "{what}: product on silu_mul_q8's codes");
                }
            }
        }
    }
}
