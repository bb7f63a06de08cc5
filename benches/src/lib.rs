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

use kernel_dsl::Float;
use kernels::runtime::{Device, DeviceVec};

kernel_dsl::embed_kernels!();

/// A bench binary's command line: `--flag` switches and `--flag VALUE` options, looked up
/// by name wherever they stand (words no bench knows are ignored).
#[derive(Clone, Debug)]
pub struct Args(Vec<String>);

impl Args {
    /// This process's arguments (the program name first, as `std::env::args` gives them).
    pub fn from_env() -> Args {
        Args(std::env::args().collect())
    }

    /// The given words, the program name first.
    pub fn new<S: Into<String>>(words: impl IntoIterator<Item = S>) -> Args {
        Args(words.into_iter().map(Into::into).collect())
    }

    /// Whether `flag` is given.
    pub fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|a| a == flag)
    }

    /// The word after the first `flag`, where both are given.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.0.iter().position(|a| a == flag).and_then(|i| self.0.get(i + 1)).map(String::as_str)
    }

    /// Every word after the first `flag`, where it is given.
    pub fn after(&self, flag: &str) -> Option<&[String]> {
        self.0.iter().position(|a| a == flag).map(|i| &self.0[i + 1..])
    }

    /// `--out DIR`: where the bench writes its JSON (`.` by default).
    pub fn out_dir(&self) -> String {
        self.value("--out").unwrap_or(".").to_string()
    }

    /// `--quick`: a few shapes only.
    pub fn quick(&self) -> bool {
        self.has("--quick")
    }
}

/// `n` deterministic values in `[-amplitude, amplitude)` as `T` (xorshift64 from `seed`),
/// the same on every run and every device.
pub fn uniform<T: Float>(n: usize, seed: u64, amplitude: f32) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            T::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * (2.0 * amplitude) - amplitude)
        })
        .collect()
}

/// One 2-D convolution layer: `(layer, batch, c_in, h, w, c_out, kernel, stride, padding)`.
pub type ConvLayer = (&'static str, usize, usize, usize, usize, usize, usize, usize, usize);

/// A line of a convolution layer table that does not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerTableError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for LayerTableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer table line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for LayerTableError {}

/// The distinct convolutions of SD 1.5's UNet (latent 64x64, batch 2 for classifier-free
/// guidance) and VAE decoder (latent 64x64 to 512x512, batch 1), in the order of
/// `python/sd_conv_layers.csv`: the one table the `conv` bench and `python/torch_conv.py`
/// both read, so that the two time the same shapes.
pub fn sd_conv_layers() -> Vec<ConvLayer> {
    parse_conv_layers(include_str!("../python/sd_conv_layers.csv")).unwrap_or_else(|e| panic!("python/sd_conv_layers.csv: {e}"))
}

/// Parses a layer table: a header line, then `layer,batch,c_in,h,w,c_out,kernel,stride,padding`
/// a line (whole numbers, all but padding at least 1; blank lines passed over).
pub fn parse_conv_layers(text: &'static str) -> Result<Vec<ConvLayer>, LayerTableError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let err = |reason: String| LayerTableError { line: i + 1, reason };
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&'static str> = line.split(',').collect();
        if f.len() != 9 {
            return Err(err(format!("{} fields, want 9", f.len())));
        }
        let mut v = [0usize; 8];
        for (k, (x, name)) in f[1..].iter().zip(["batch", "c_in", "h", "w", "c_out", "kernel", "stride", "padding"]).enumerate() {
            v[k] = x.trim().parse().map_err(|_| err(format!("{name} {x:?} is not a whole number")))?;
            if v[k] == 0 && name != "padding" {
                return Err(err(format!("{name} is 0")));
            }
        }
        out.push((f[0], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
    }
    Ok(out)
}

/// Writes `rows` (JSON objects) as a JSON array, one object a line, to `out_dir/name`,
/// creating `out_dir`; returns the file's path.
pub fn write_json_array(out_dir: &str, name: &str, rows: &[String]) -> String {
    use std::io::Write;
    std::fs::create_dir_all(out_dir).unwrap();
    let path = format!("{out_dir}/{name}");
    std::fs::File::create(&path).unwrap().write_all(format!("[\n{}\n]\n", rows.join(",\n")).as_bytes()).unwrap();
    path
}

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
        gbps(self.moved, self.us)
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

/// GB/s (10^9 bytes per second) of `moved` bytes in `us` microseconds.
pub fn gbps(moved: usize, us: f64) -> f64 {
    moved as f64 / (us * 1e-6) / 1e9
}

/// Microseconds of one device-to-device copy of `bytes` (two fresh buffers, freed after),
/// as `timer` measures a call of the closure it is given.
pub fn copy_us_with(dev: &Device, bytes: usize, timer: impl FnOnce(&mut dyn FnMut()) -> f64) -> f64 {
    let src: DeviceVec<u8> = dev.alloc(bytes).unwrap();
    let mut dst: DeviceVec<u8> = dev.alloc(bytes).unwrap();
    timer(&mut || copy(dev, &src, &mut dst))
}

/// Microseconds of one device-to-device copy of `bytes`, timed by [`time`].
pub fn copy_us(dev: &Device, bytes: usize) -> f64 {
    copy_us_with(dev, bytes, |f| time(dev, bytes, f))
}

/// The copy bandwidth the memory-bound benches measure themselves against: a 1 GiB
/// device-to-device copy, bytes read + written over [`time`]'s median, in GB/s. Printed as
/// `copy 1 GiB: <us> us, <GB/s> GB/s` (`python/report_engine.py` reads that line back).
pub fn copy_gbps_1gib(dev: &Device) -> f64 {
    let gib = 1usize << 30;
    let us = copy_us(dev, gib);
    let gbps = gbps(2 * gib, us);
    eprintln!("copy 1 GiB: {us:.1} us, {gbps:.0} GB/s");
    gbps
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_find_switches_and_values_wherever_they_stand() {
        let a = Args::new(["bench", "--quick", "--out", "dir", "--sweep-stages", "q4_0", "q8_0"]);
        assert!(a.quick() && a.has("--sweep-stages") && !a.has("--profile"));
        assert_eq!(a.out_dir(), "dir");
        assert_eq!(a.value("--sweep-stages"), Some("q4_0"));
        assert_eq!(a.after("--sweep-stages").unwrap(), ["q4_0", "q8_0"]);
        assert_eq!(a.after("--host"), None);
        // A flag at the end has no value; no `--out` means the working directory.
        let b = Args::new(["bench", "--dtype"]);
        assert_eq!(b.value("--dtype"), None);
        assert_eq!(b.out_dir(), ".");
        assert!(!b.quick());
    }

    #[test]
    fn uniform_values_lie_in_range_and_repeat_per_seed() {
        let a: Vec<f32> = uniform(4096, 1, 4.0);
        assert!(a.iter().all(|&v| (-4.0..4.0).contains(&v)));
        // Spread over the whole range, not stuck (an xorshift state of 0 would be).
        let (lo, hi) = a.iter().fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(lo < -3.9 && hi > 3.9, "{lo} {hi}");
        assert_eq!(a, uniform::<f32>(4096, 1, 4.0));
        assert_ne!(a, uniform::<f32>(4096, 2, 4.0));
        // The same draws at another amplitude are the same fractions of it.
        let b: Vec<f32> = uniform(4096, 1, 1.0);
        assert!(a.iter().zip(&b).all(|(x, y)| (x / 4.0 - y).abs() < 1e-6));
    }

    #[test]
    fn layer_table_parses_and_rejects_bad_lines_by_number() {
        let t = parse_conv_layers("layer,batch,c_in,h,w,c_out,kernel,stride,padding\nunet a,2,4,64,64,320,3,1,1\n\nvae b,1,8,16,16,8,1,2,0\n").unwrap();
        assert_eq!(t, [("unet a", 2, 4, 64, 64, 320, 3, 1, 1), ("vae b", 1, 8, 16, 16, 8, 1, 2, 0)]);
        let e = parse_conv_layers("header\nx,1,2,3,4,5,6,7\n").unwrap_err();
        assert_eq!(e, LayerTableError { line: 2, reason: "8 fields, want 9".into() });
        let e = parse_conv_layers("header\nx,1,2,3,4,5,6,7,1\ny,1,2,3,4,5,six,7,1\n").unwrap_err();
        assert_eq!((e.line, e.reason.starts_with("kernel")), (3, true));
        assert_eq!(parse_conv_layers("header\nx,1,0,3,4,5,6,7,1\n").unwrap_err().reason, "c_in is 0");
    }

    #[test]
    fn sd_table_has_every_unet_and_vae_layer_once() {
        let t = sd_conv_layers();
        assert_eq!(t.len(), 27);
        let names: std::collections::HashSet<_> = t.iter().map(|l| l.0).collect();
        assert_eq!(names.len(), t.len(), "a layer named twice");
        // UNet layers at batch 2 (classifier-free guidance), VAE decoder layers at batch 1.
        assert!(t.iter().all(|l| (l.0.starts_with("unet") && l.1 == 2) || (l.0.starts_with("vae") && l.1 == 1)));
        // The quick run (`--quick`) still has layers to time.
        assert!(t.iter().any(|l| l.0.starts_with("unet 320")));
    }

    #[test]
    fn gbps_counts_bytes_over_microseconds() {
        assert_eq!(gbps(2_000_000_000, 1e6), 2.0);
        assert_eq!(gbps(3_000, 1.0), 3.0);
    }
}
