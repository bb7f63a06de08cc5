//! Helpers shared by the attention test files: the executors to run on, deterministic
//! inputs and the element types with their rounding.
// Each test file uses part of this module.
#![allow(dead_code)]
use half::{bf16, f16};
use kernel_dsl::host::{CpuExecutor, MatrixUnit, WaveSize};
use kernel_dsl::Float;
use kernel_runtime::Device;

/// The CPU executor in every matrix-unit mode (MFMA at wave 64; gfx11 WMMA, gfx12 WMMA,
/// `mma.sync` and VALU at wave 32), plus the GPUs of this build; a GPU that could not be
/// opened is reported once per run on stderr (past the output capture) with the reason.
pub fn executors() -> Vec<Device> {
    let mut v = vec![
        Device::cpu_with(CpuExecutor::new(WaveSize::W64)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::Wmma12)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::MmaSync)),
        Device::cpu_with(CpuExecutor::new(WaveSize::W32).with_matrix_unit(MatrixUnit::Valu)),
    ];
    static SAID: [std::sync::Once; 2] = [std::sync::Once::new(), std::sync::Once::new()];
    for (k, (name, dev)) in [("cuda", Device::cuda(0)), ("rocm", Device::rocm(0))].into_iter().enumerate() {
        use std::io::Write;
        match dev {
            Ok(d) => {
                SAID[k].call_once(|| {
                    let _ = writeln!(std::io::stderr().lock(), "attention tests also run on {name}: {}", kernel_dsl::host::Executor::name(&d));
                });
                v.push(d)
            }
            Err(e) => SAID[k].call_once(|| {
                let _ = writeln!(std::io::stderr().lock(), "SKIPPED on {name}: {e} (the CPU executor ran these tests)");
            }),
        }
    }
    v
}

/// The executor and the lowering its kernels take, for messages.
pub fn name(dev: &Device) -> String {
    format!("{} / {:?}", kernel_dsl::host::Executor::name(dev), attention::lowering_of(dev))
}

/// Deterministic values (a 64-bit LCG) and permutations.
pub struct Rng(pub u64);
impl Rng {
    /// The next 53 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    /// A value in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() as f64 / (1u64 << 53) as f64)
    }
    /// Shuffles `v` (Fisher-Yates).
    pub fn shuffle<X>(&mut self, v: &mut [X]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

/// `n` deterministic values in `[lo, hi)` from `seed`.
pub fn inputs(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut rng = Rng(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
    (0..n).map(|_| rng.uniform(lo, hi)).collect()
}

/// An element type of the tests: its unit roundoff and the rounding from f64.
pub trait Elem: Float + std::fmt::Debug + PartialEq + 'static {
    /// Unit roundoff: the relative error of one rounding (half an ulp at 1).
    const U: f64;
    /// `v` rounded to the nearest value of the type.
    fn from_f64(v: f64) -> Self;
}
impl Elem for f16 {
    const U: f64 = 1.0 / 2048.0;
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Elem for bf16 {
    const U: f64 = 1.0 / 256.0;
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}
impl Elem for f32 {
    const U: f64 = 1.0 / (1u64 << 24) as f64;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
