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
pub mod quant_blocks;

use kernels::runtime::{Device, DeviceVec};

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

/// The GPU to benchmark (CUDA, else ROCm), its name printed; `None` after saying why
/// when there is none.
pub fn gpu() -> Option<Device> {
    use kernel_dsl::host::Executor;
    match Device::cuda(0).or_else(|_| Device::rocm(0)) {
        Ok(d) => {
            println!("device: {}", d.name());
            Some(d)
        }
        Err(e) => {
            eprintln!("SKIPPED: the benchmark needs a GPU ({e}); build with --features cuda or rocm");
            None
        }
    }
}

/// Median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Times `f` (one call per iteration) with GPU events; median over repetitions, in us.
pub fn time(dev: &Device, bytes: usize, mut f: impl FnMut()) -> f64 {
    let iters = if bytes >= 64 << 20 { 10 } else if bytes >= 1 << 20 { 50 } else { 200 };
    for _ in 0..3 {
        f();
    }
    let mut reps = Vec::new();
    for _ in 0..5 {
        let ms = gpu_ms(dev, || {
            for _ in 0..iters {
                f();
            }
        });
        reps.push(ms / iters as f64 * 1e3);
    }
    median(&mut reps)
}

/// Milliseconds the work `body` queued took on the GPU (between two events).
pub fn gpu_ms(dev: &Device, body: impl FnOnce()) -> f64 {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let a = d.record_event().unwrap();
            body();
            let b = d.record_event().unwrap();
            a.elapsed_ms(&b).unwrap() as f64
        }
        #[cfg(feature = "rocm")]
        Device::Rocm(d) => {
            let a = d.record_event().unwrap();
            body();
            let b = d.record_event().unwrap();
            a.elapsed_ms(&b).unwrap() as f64
        }
        _ => {
            let t = std::time::Instant::now();
            body();
            dev.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        }
    }
}

/// Device-to-device copy of a whole buffer (the bandwidth reference).
pub fn copy(dev: &Device, src: &DeviceVec<u8>, dst: &mut DeviceVec<u8>) {
    dev.copy(src.view(..).unwrap(), dst.view_mut(..).unwrap()).unwrap();
}

/// Bytes a benchmark cycles through so that each call reads its operand from DRAM rather
/// than from the L2 cache the previous calls filled (H100: 50 MB of L2). A decode step reads
/// every weight matrix once; timing one 33 MB matrix in a loop would find part of it in L2.
pub const COLD_BYTES: usize = 256 << 20;

/// Copies of a `bytes`-long operand to cycle through for cold-cache timings
/// ([`COLD_BYTES`] in all; 1 for operands at least that large).
pub fn cold_copies(bytes: usize) -> usize {
    COLD_BYTES.div_ceil(bytes.max(1)).clamp(1, 64)
}

/// A weight buffer and `cold_copies(len) - 1` device copies of it, handed out in turn
/// ([`ColdSet::next`]) so that each timed call reads its weights from DRAM.
pub struct ColdSet {
    bufs: Vec<DeviceVec<u8>>,
    turn: std::cell::Cell<usize>,
}

impl ColdSet {
    /// `w` and its copies.
    pub fn new(dev: &Device, w: DeviceVec<u8>) -> ColdSet {
        let n = cold_copies(w.len());
        let mut bufs = Vec::with_capacity(n);
        for _ in 1..n {
            let mut c: DeviceVec<u8> = dev.alloc(w.len()).unwrap();
            copy(dev, &w, &mut c);
            bufs.push(c);
        }
        bufs.push(w);
        ColdSet { bufs, turn: std::cell::Cell::new(0) }
    }
    /// The next buffer in turn.
    pub fn next(&self) -> &DeviceVec<u8> {
        let i = self.turn.get() + 1;
        self.turn.set(i);
        &self.bufs[i % self.bufs.len()]
    }
    /// One buffer, always the same (for timings with the weights partly in L2).
    pub fn first(&self) -> &DeviceVec<u8> {
        &self.bufs[0]
    }
    /// Bytes of one buffer.
    pub fn bytes(&self) -> usize {
        self.bufs[0].len()
    }
    /// Buffers in the set.
    pub fn copies(&self) -> usize {
        self.bufs.len()
    }
}
