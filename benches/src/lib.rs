//! Benchmark harness: measures kernels with GPU events and compares them with a
//! device-to-device copy of the same bytes and with PyTorch on the same GPU, in one run.
//!
//! * `elementwise` (binary): bandwidth of elementwise kernels for 4 KiB .. 1 GiB buffers,
//!   copy bandwidth, and launch overhead of an empty kernel; writes `rust_elementwise.json`.
//! * `python/torch_elementwise.py`: the same ops and sizes in PyTorch; `torch_elementwise.json`.
//! * `python/report.py`: merges both into a Markdown table and a PNG plot.
//!
//! Run on an NVIDIA GPU with `tests/gpu/nvidia.sh` (see README).
pub mod bench_kernels;

kernel_dsl::embed_kernels!();

/// One measurement.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Operation (`copy`, `unary_exp`, `binary_add` ...).
    pub op: String,
    /// Element type.
    pub dtype: &'static str,
    /// Bytes of one buffer.
    pub bytes: usize,
    /// Bytes read + written per call.
    pub moved: usize,
    /// Median time per call, microseconds.
    pub us: f64,
}

impl Sample {
    /// Effective bandwidth in GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.moved as f64 / (self.us * 1e-6) / 1e9
    }

    /// JSON object for this sample.
    pub fn json(&self) -> String {
        format!(
            "{{\"op\":\"{}\",\"dtype\":\"{}\",\"bytes\":{},\"moved\":{},\"us\":{:.3},\"gbps\":{:.2}}}",
            self.op,
            self.dtype,
            self.bytes,
            self.moved,
            self.us,
            self.gbps()
        )
    }
}

/// Median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
