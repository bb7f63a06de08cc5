//! Per-op time breakdown of a [`RocmDevice`](crate::RocmDevice): with profiling on
//! ([`RocmDevice::set_profiling`](crate::RocmDevice::set_profiling) or the environment
//! variable `CANDLE_ROCM_PROFILE=1` when the device is opened), every backend op records its
//! name, dtype, host time and device time; [`RocmDevice::take_profile`](crate::RocmDevice::take_profile)
//! sums them per (op, dtype).
//!
//! How the device time is measured, and its bias:
//! - On a GPU, an event is recorded on the device's stream before and after each op
//!   (`cuEventRecord` / `hipEventRecord`); the op's time is the time between them
//!   (`cuEventElapsedTime` / `hipEventElapsedTime`, about 0.5 µs resolution). Nothing waits
//!   while the model runs: events are read in `take_profile`, which synchronizes once. The
//!   interval covers the op's kernels, copies and memsets, and also any time the GPU sat idle
//!   inside it waiting for the host to issue the op's next launch: when the host is the
//!   bottleneck (small decode steps) an op's time tends to its host launch time rather than
//!   its kernel time. Time between ops (Candle's own host work) belongs to no op, so the sum
//!   of the ops is at most the phase's wall time. Each event adds a few µs of host time.
//! - On the CPU executor, launches run to completion before returning: the device time is
//!   the wall time of the op (identical to its host time up to the clock reads).
//! - Host time is the wall time of the backend call on the host (argument checks,
//!   allocation, layout uploads, launches; plus the wait in `download`).
use candle_core::{DType, Result};
use kernels::runtime::{Device, DeviceEvent};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One op call whose device time is not read yet.
struct Pending {
    op: Cow<'static, str>,
    dtype: DType,
    start: DeviceEvent,
    end: DeviceEvent,
    host: Duration,
}

/// The recorder a device holds: off by default, one atomic load per op when off.
#[derive(Default)]
pub(crate) struct Profiler {
    on: AtomicBool,
    pending: Mutex<Vec<Pending>>,
}

impl Profiler {
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Runs `f` between two events of `dev` and keeps the call for the next [`Profiler::take`].
    pub(crate) fn time<R>(&self, dev: &Device, op: Cow<'static, str>, dtype: DType, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let start = dev.record_event().map_err(crate::error::at("profile"))?;
        let t = Instant::now();
        let r = f()?;
        let host = t.elapsed();
        let end = dev.record_event().map_err(crate::error::at("profile"))?;
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).push(Pending { op, dtype, start, end, host });
        Ok(r)
    }

    /// Sums the calls recorded since the last take (reads their events: waits for the last).
    pub(crate) fn take(&self) -> Result<Profile> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        let mut sums: HashMap<(Cow<'static, str>, DType), OpStat> = HashMap::new();
        for p in pending {
            let ms = p.start.elapsed_ms(&p.end).map_err(crate::error::at("profile"))?;
            let s = sums.entry((p.op.clone(), p.dtype)).or_insert_with(|| OpStat {
                op: p.op.into_owned(),
                dtype: p.dtype,
                calls: 0,
                device_ms: 0.0,
                host_ms: 0.0,
            });
            s.calls += 1;
            s.device_ms += ms;
            s.host_ms += p.host.as_secs_f64() * 1e3;
        }
        let mut ops: Vec<OpStat> = sums.into_values().collect();
        ops.sort_by(|a, b| b.device_ms.total_cmp(&a.device_ms).then_with(|| (&a.op, a.dtype.as_str()).cmp(&(&b.op, b.dtype.as_str()))));
        Ok(Profile { ops })
    }
}

/// Calls and time of one (op, dtype).
#[derive(Clone, Debug, PartialEq)]
pub struct OpStat {
    /// Backend op, e.g. `matmul`, `unary.exp`, `fused.rms_norm`, `copy_strided`.
    pub op: String,
    /// The dtype of the op's first operand.
    pub dtype: DType,
    pub calls: u64,
    /// Device (queue) time over all calls, in ms (see the module docs for its bias).
    pub device_ms: f64,
    /// Host wall time of the backend calls, in ms.
    pub host_ms: f64,
}

impl OpStat {
    /// Mean device time per call in µs.
    pub fn mean_us(&self) -> f64 {
        self.device_ms * 1e3 / self.calls.max(1) as f64
    }
    /// Mean host time per call in µs.
    pub fn host_mean_us(&self) -> f64 {
        self.host_ms * 1e3 / self.calls.max(1) as f64
    }
}

/// The per-op sums of a profiled stretch of work, sorted by device time (largest first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    pub ops: Vec<OpStat>,
}

impl Profile {
    /// Device time over all ops, in ms.
    pub fn total_ms(&self) -> f64 {
        self.ops.iter().map(|o| o.device_ms).sum()
    }

    /// Op calls recorded.
    pub fn calls(&self) -> u64 {
        self.ops.iter().map(|o| o.calls).sum()
    }

    /// Calls of `op` (all dtypes).
    pub fn calls_of(&self, op: &str) -> u64 {
        self.ops.iter().filter(|o| o.op == op).map(|o| o.calls).sum()
    }

    fn percent(&self, o: &OpStat) -> f64 {
        let t = self.total_ms();
        if t > 0.0 { 100.0 * o.device_ms / t } else { 0.0 }
    }

    /// A text table: op, dtype, calls, total ms, % of total, mean µs, host mean µs.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<28} {:<6} {:>8} {:>11} {:>7} {:>10} {:>12}\n",
            "op", "dtype", "calls", "total ms", "%", "mean µs", "host mean µs"
        );
        for o in &self.ops {
            s += &format!(
                "{:<28} {:<6} {:>8} {:>11.3} {:>7.2} {:>10.2} {:>12.2}\n",
                o.op,
                o.dtype.as_str(),
                o.calls,
                o.device_ms,
                self.percent(o),
                o.mean_us(),
                o.host_mean_us()
            );
        }
        s += &format!("{:<28} {:<6} {:>8} {:>11.3} {:>7.2}\n", "total", "", self.calls(), self.total_ms(), 100.0);
        s
    }

    /// CSV with a header row (`op,dtype,calls,total_ms,percent,mean_us,host_total_ms,host_mean_us`).
    pub fn to_csv(&self) -> String {
        let mut s = String::from("op,dtype,calls,total_ms,percent,mean_us,host_total_ms,host_mean_us\n");
        for o in &self.ops {
            s += &format!(
                "{},{},{},{:.6},{:.4},{:.3},{:.6},{:.3}\n",
                o.op,
                o.dtype.as_str(),
                o.calls,
                o.device_ms,
                self.percent(o),
                o.mean_us(),
                o.host_ms,
                o.host_mean_us()
            );
        }
        s
    }

    /// A JSON array of objects with the CSV's fields.
    pub fn to_json(&self) -> String {
        let rows: Vec<String> = self
            .ops
            .iter()
            .map(|o| {
                format!(
                    "{{\"op\":\"{}\",\"dtype\":\"{}\",\"calls\":{},\"total_ms\":{:.6},\"percent\":{:.4},\"mean_us\":{:.3},\"host_total_ms\":{:.6},\"host_mean_us\":{:.3}}}",
                    o.op.escape_default(),
                    o.dtype.as_str(),
                    o.calls,
                    o.device_ms,
                    self.percent(o),
                    o.mean_us(),
                    o.host_ms,
                    o.host_mean_us()
                )
            })
            .collect();
        format!("[{}]", rows.join(",\n "))
    }
}
