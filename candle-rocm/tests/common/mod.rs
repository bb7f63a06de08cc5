//! Shared test helpers: the devices under test, deterministic inputs, and comparison with
//! Candle's own CPU backend.
#![allow(dead_code)]
use candle_core::{DType, Device, Result, Tensor};
use candle_rocm::{RocmDevice, WaveSize};

pub mod models;

/// The devices every check runs on: the CPU executor with waves of 32 and of 64 and, with
/// the `cuda` feature and a GPU, the NVIDIA GPU (PTX). A GPU that cannot be opened is
/// reported once, loudly.
/// `CANDLE_ROCM_GPU_ONLY=1` (GPU runs) leaves the CPU executors out and requires a GPU.
pub fn devices() -> Vec<RocmDevice> {
    let gpu_only = std::env::var("CANDLE_ROCM_GPU_ONLY").is_ok_and(|v| v == "1");
    let mut v = if gpu_only {
        vec![]
    } else {
        vec![RocmDevice::new_cpu_executor(WaveSize::W32), RocmDevice::new_cpu_executor(WaveSize::W64)]
    };
    if cfg!(feature = "cuda") {
        match RocmDevice::new_cuda(0) {
            Ok(d) => v.push(d),
            Err(e) => eprintln!("SKIPPED on cuda: {e}"),
        }
    }
    if cfg!(feature = "rocm") {
        match RocmDevice::new_rocm(0) {
            Ok(d) => v.push(d),
            Err(e) => eprintln!("SKIPPED on rocm: {e}"),
        }
    }
    assert!(!v.is_empty(), "CANDLE_ROCM_GPU_ONLY=1 but no GPU could be opened");
    v
}

/// Deterministic values in [-lo, hi] (xorshift), with NaN, +-inf, +-0 mixed in when
/// `specials` (every 7th element from position 3).
pub fn values(n: usize, seed: u64, lo: f32, hi: f32, specials: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if specials && i % 7 == 3 {
                return [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0][(i / 7) % 5];
            }
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64) as f32
        })
        .collect()
}

/// A CPU tensor of `shape` and `dtype` from [`values`].
pub fn rand(shape: &[usize], dtype: DType, seed: u64, specials: bool) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, -3.0, 3.0, specials), shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// Integer indices in `0..bound`, as a CPU tensor of `dtype` (u8, u32 or i64).
pub fn ids(shape: &[usize], bound: usize, dtype: DType, seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<u32> = values(n, seed, 0.0, bound as f32 - 0.001, false).iter().map(|x| *x as u32).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// Allowed error: `|a - b| <= atol + rtol * |a|` (NaN must meet NaN, inf the same inf).
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
}

pub const EXACT: Tol = Tol { rtol: 0.0, atol: 0.0 };

/// Tolerance for one rounding of the result type plus `f32` evaluation differences: f32
/// results differ by a few ulp (different but correct exp/tanh/erf implementations), f16
/// and bf16 ones by one ulp of the half type (2^-10, 2^-7 at worst relative) because our
/// kernels compute in f32 and round once where Candle may round intermediate values.
pub fn tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol { rtol: 1e-5, atol: 1e-6 },
        DType::F16 => Tol { rtol: 2e-3, atol: 1e-4 },
        DType::BF16 => Tol { rtol: 1.6e-2, atol: 1e-3 },
        _ => EXACT,
    }
}

/// Compares `got` (any device) with `want` (CPU): same shape, dtype and values within `t`.
pub fn assert_close(what: &str, want: &Tensor, got: &Tensor, t: Tol) {
    assert_eq!(want.dims(), got.dims(), "{what}: shape");
    assert_eq!(want.dtype(), got.dtype(), "{what}: dtype");
    let f = |x: &Tensor| x.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let (w, g) = (f(want), f(got));
    let mut bad = 0;
    let mut first = None;
    for (i, (a, b)) in w.iter().zip(&g).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= t.atol + t.rtol * a.abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, *a, *b));
        }
    }
    if let Some((i, a, b)) = first {
        panic!("{what}: {bad} of {} elements differ; first at {i}: cpu {a} vs ours {b} (tol {t:?})", w.len());
    }
}

/// Runs `f` on Candle's CPU device and on `dev` (inputs are moved by `f` itself) and
/// compares the results.
pub fn check(what: &str, dev: &RocmDevice, t: Tol, f: impl Fn(&Device) -> Result<Tensor>) {
    let want = f(&Device::Cpu).unwrap_or_else(|e| panic!("{what}: cpu reference failed: {e}"));
    let got = f(&dev.as_candle()).unwrap_or_else(|e| panic!("{what} on {}: {e}", dev.name()));
    assert!(matches!(got.device(), Device::Ext(_)), "{what}: result left the device");
    assert_close(&format!("{what} on {}", dev.name()), &want, &got, t);
}

/// As [`check`], with a separate reference computation on the CPU (for layouts Candle's CPU
/// backend rejects, or a more exact reference such as an f32 sum of half values).
pub fn check_ref(
    what: &str,
    dev: &RocmDevice,
    t: Tol,
    reference: impl Fn(&Device) -> Result<Tensor>,
    f: impl Fn(&Device) -> Result<Tensor>,
) {
    let want = reference(&Device::Cpu).unwrap_or_else(|e| panic!("{what}: cpu reference failed: {e}"));
    let got = f(&dev.as_candle()).unwrap_or_else(|e| panic!("{what} on {}: {e}", dev.name()));
    assert!(matches!(got.device(), Device::Ext(_)), "{what}: result left the device");
    assert_close(&format!("{what} on {}", dev.name()), &want, &got, t);
}
