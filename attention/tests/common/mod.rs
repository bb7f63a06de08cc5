//! Executors shared by the attention tests.
use kernel_dsl::host::{CpuExecutor, MatrixUnit, WaveSize};
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
