//! Helpers shared by the kernel test files: the executors to run on, deterministic inputs,
//! and dtype-aware comparison with an f64 reference.
#![allow(dead_code)]
use half::{bf16, f16};
use kernel_dsl::host::WaveSize;
use kernel_dsl::Float;
use kernels::runtime::Device;

/// The CPU executor with both wave sizes, plus every GPU this build can open. With
/// `CPU_EXECUTOR_REVERSED=1` the CPU executors run work-items in descending order between
/// synchronisation points (a whole-suite check for races between lanes).
pub fn executors() -> Vec<Device> {
    let reversed = reversed_by_env();
    let mut v = vec![cpu(WaveSize::W32, reversed), cpu(WaveSize::W64, reversed)];
    static SAID: [std::sync::Once; 2] = [std::sync::Once::new(), std::sync::Once::new()];
    for (k, (name, dev)) in [("cuda", Device::cuda(0)), ("rocm", Device::rocm(0))].into_iter().enumerate() {
        match dev {
            Ok(d) => v.push(d),
            // Written past the test harness's output capture, once per run, so a GPU run
            // that did not happen is visible in the log.
            Err(e) => SAID[k].call_once(|| {
                use std::io::Write;
                let _ = writeln!(std::io::stderr().lock(), "SKIPPED on {name}: {e} (the CPU executor ran these tests)");
            }),
        }
    }
    v
}

/// The CPU executor in every matrix-unit mode (MFMA at wave 64; gfx11 WMMA, gfx12 WMMA,
/// mma.sync and VALU at wave 32), plus the GPUs of this build: for the kernels on the
/// matrix units (GEMM, implicit-GEMM convolution).
pub fn matrix_executors() -> Vec<Device> {
    use kernel_dsl::host::{CpuExecutor, MatrixUnit};
    let mut v = vec![
        Device::cpu_with(CpuExecutor::new(WaveSize::W64)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::Wmma12)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::Valu)),
    ];
    v.extend(executors().into_iter().filter(|d| d.is_gpu()));
    v
}

/// Whether `CPU_EXECUTOR_REVERSED=1` asks for work-items in descending order.
fn reversed_by_env() -> bool {
    std::env::var("CPU_EXECUTOR_REVERSED").is_ok_and(|v| v == "1")
}

/// The CPU executor with `wave` lanes, work-items in descending order when `reversed`.
fn cpu(wave: WaveSize, reversed: bool) -> Device {
    Device::cpu_with(kernel_dsl::host::CpuExecutor::new(wave).with_reversed_items(reversed))
}

/// [`executors`] plus the CPU executor in both wave sizes running work-items in the other
/// order: for kernels whose lanes share memory between synchronisation points (a race
/// gives a different result in one of the two orders).
pub fn executors_both_orders() -> Vec<Device> {
    let mut v = executors();
    let other = !reversed_by_env();
    v.extend([cpu(WaveSize::W32, other), cpu(WaveSize::W64, other)]);
    v
}

/// Deterministic inputs in `[lo, hi)` with special values mixed in.
pub fn inputs(n: usize, lo: f64, hi: f64, seed: u64, specials: bool) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let sp = [0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1.0, -1.0];
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if specials && i % 97 == 3 {
                return sp[(i / 97) % sp.len()];
            }
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

pub trait TestFloat: Float + kernel_dsl::host::ScalarArg + std::fmt::Debug + PartialEq {
    const REL: f64;
    const ABS: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
}
impl TestFloat for f32 {
    const REL: f64 = 2e-6;
    const ABS: f64 = 2e-6;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl TestFloat for f16 {
    const REL: f64 = 1.0 / 1024.0;
    const ABS: f64 = 1.0 / 16384.0;
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl TestFloat for bf16 {
    const REL: f64 = 1.0 / 128.0;
    const ABS: f64 = 1.0 / 16384.0;
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// Compares with the f64 reference rounded once to `T`, within `T`'s one-rounding tolerance.
pub fn assert_close<T: TestFloat>(got: &[T], want: &[f64], what: &str) {
    assert_close_with(got, want, 0.0, 0.0, what)
}

/// As [`assert_close`], with extra tolerance for results of long f32 reductions: `rel` and
/// `abs` are added to the dtype's own one-rounding tolerance.
pub fn assert_close_with<T: TestFloat>(got: &[T], want: &[f64], rel: f64, abs: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = T::from_f64(*w).to_f64();
        let g = g.to_f64();
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= T::ABS + abs + (T::REL + rel) * w.abs()
        };
        assert!(ok, "{what}: element {i}: got {g:e}, want {w:e}");
    }
}
