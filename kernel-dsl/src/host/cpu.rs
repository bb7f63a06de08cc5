//! The CPU executor as an [`Executor`](super::Executor).
use super::{check_memory, Executor, Launch, LaunchError, MemLocation};
use cpu_executor::{CpuExecutor, Dim3, Geometry};

fn dim(d: crate::Dim3) -> Dim3 {
    Dim3::new(d.x, d.y, d.z)
}

impl Executor for CpuExecutor {
    fn name(&self) -> String {
        let order = if self.reversed_items() { ", items in reverse" } else { "" };
        format!("cpu (wave {}{order})", self.wave_size().lanes())
    }

    fn memory(&self) -> MemLocation {
        MemLocation::Host
    }

    fn wave_lanes(&self) -> u32 {
        self.wave_size().lanes()
    }

    fn launch(&self, launch: &Launch<'_>) -> Result<(), LaunchError> {
        launch.config.validate()?;
        check_memory(self, launch)?;
        let geometry = Geometry { grid: dim(launch.config.grid), block: dim(launch.config.block) };
        let entry = launch.cpu_entry;
        let args = launch.args;
        self.run(geometry, launch.shared_bytes, &|| entry(args))
            .map(|_| ())
            .map_err(|source| LaunchError::Exec { kernel: launch.kernel.symbol, source })
    }
}
