//! Quantized (GGUF) matrix-vector products on LLM weight shapes (Llama-3-8B: 4096x4096,
//! 14336x4096, 4096x14336, the 128256x4096 output head; batches 2, 4 and 8 on the two FFN
//! shapes), timed with GPU events against a device-to-device copy in the same run.
//!
//! `quantized [--out DIR] [--quick] [--profile]`: writes `DIR/rust_quantized.json`.
//! `quantized --decode [FORMAT...]`: the Llama-3-8B decode step's products as the engine runs
//! them (q|k|v 6144x4096, o 4096x4096, gate|up 28672x4096, down 4096x14336, the head
//! 128256x4096) at batch 1, and 2, 4, 8 on gate|up and down; `Q4K` and `Q6K` unless named.
//! `quantized --host`: host time per call (enqueue only, no waiting) of the quantization,
//! the matvec and both, against the GPU time of the same calls (printed only).
//! `quantized --sweep`: batches 1, 2, 4 and 8 through `matvec_rows` against the streaming
//! kernels with grids of several work-groups per SM (printed only).
//! `quantized --sweep-stages [FORMAT...]`: the batch-1 streaming kernel with 2, 3 and 4
//! shared stages and several grids (printed only).
//! `quantized --dequant [FORMAT...]`: `ops::dequantize` to bf16 (the dequantize + GEMM path
//! of prompts and batches over 32 rows) on the Llama-3-8B shapes, the piece kernel against
//! the generic one (one weight per work-item), as GB/s of the block bytes read plus the bf16
//! bytes written; also `DIR/rust_dequantize.json`.
//! `quantized --sweep-chain [FORMAT...]`: `ops::matvec` with several grids, each call
//! quantizing and chained on the same activations (printed only).
//! Bandwidth counts the bytes an ideal kernel moves once: the quantized weights, the q8_1
//! activations (`cols` codes + 8 bytes per 32) and the f32 output; `matvec+quantize` adds
//! the f32 activations read by the quantization. Timings cycle through copies of the
//! weights ([`benches::ColdSet`], 256 MiB in all) so that every call reads them from DRAM,
//! as a decode step does; `us_hot` times one copy in a loop (part of it then comes from L2). `python/torch_quantized.py` times the bf16
//! matvec of the same logical shapes in PyTorch (a different workload: 2 bytes per weight)
//! and `python/report_quantized.py` merges both (plus Candle's quantized CUDA kernels from
//! `candle_quantized.json` when that file exists).
use benches::{copy, time, Args, ColdSet};
use kernels::quantized::{ops, GgmlDType};
use kernels::runtime::DeviceVec;

fn weights(dtype: GgmlDType, rows: usize, cols: usize) -> Vec<u8> {
    benches::quant_blocks::random_blocks(dtype.name(), dtype.block_weights(), dtype.block_bytes(), rows, cols)
}

/// `n` activations in [-1, 1), the same in every timing.
fn activations(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect()
}

/// Bytes an ideal matvec moves once: `wbytes` of weights, `batch` q8_1 activation rows of
/// `cols` (a code per value, 8 bytes of scale and sum per 32) and the f32 output.
fn moved_bytes(wbytes: usize, rows: usize, cols: usize, batch: usize) -> usize {
    wbytes + batch * (cols + cols / 32 * 8 + rows * 4)
}

fn main() {
    let args = Args::from_env();
    let quick = args.quick();
    let profile = args.has("--profile");
    let Some(dev) = benches::gpu() else { return };

    // Copy bandwidth (bytes read + written) on a 1 GiB buffer.
    let copy_gbps = benches::copy_gbps_1gib(&dev);

    if args.has("--sweep") {
        sweep(&dev, copy_gbps);
        return;
    }
    if let Some(rest) = args.after("--sweep-stages") {
        let named: Vec<GgmlDType> = rest.iter().filter_map(|a| GgmlDType::ALL.into_iter().find(|d| d.name() == a)).collect();
        sweep_stages(&dev, copy_gbps, if named.is_empty() { &[GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] } else { &named });
        return;
    }
    if let Some(rest) = args.after("--sweep-chain") {
        let named: Vec<GgmlDType> = rest.iter().filter_map(|a| GgmlDType::ALL.into_iter().find(|d| d.name() == a)).collect();
        sweep_chain(&dev, copy_gbps, if named.is_empty() { &[GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] } else { &named });
        return;
    }
    if args.has("--host") {
        host(&dev);
        return;
    }
    if let Some(rest) = args.after("--dequant") {
        let named: Vec<GgmlDType> = rest.iter().filter_map(|a| GgmlDType::ALL.into_iter().find(|d| d.name() == a)).collect();
        dequant(&dev, copy_gbps, if named.is_empty() { &GgmlDType::ALL } else { &named }, &args.out_dir());
        return;
    }
    let decode = args.after("--decode");
    let decode_formats: Vec<GgmlDType> = decode.unwrap_or_default().iter().filter_map(|a| GgmlDType::ALL.into_iter().find(|d| d.name() == a)).collect();
    let shapes: &[(usize, usize)] = if decode.is_some() {
        &[(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
    } else if quick || profile {
        &[(4096, 14336)]
    } else {
        &[(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
    };
    // Batches over 1 on the FFN shapes only.
    let ffn = |rows: usize, cols: usize| matches!((rows, cols), (4096, 14336) | (14336, 4096) | (28672, 4096));
    let formats: &[GgmlDType] = if decode.is_some() {
        if decode_formats.is_empty() {
            &[GgmlDType::Q4K, GgmlDType::Q6K]
        } else {
            &decode_formats
        }
    } else if profile {
        &[GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K]
    } else {
        &[GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q5K, GgmlDType::Q2K, GgmlDType::Q3K]
    };
    let mut lines = Vec::new();
    for &dtype in formats {
        for &(rows, cols) in shapes {
            let ws = ColdSet::new(&dev, dev.upload(&weights(dtype, rows, cols)).unwrap());
            let (w, wbytes) = (ws.first(), ws.bytes());
            for batch in [1usize, 2, 4, 8] {
                // Batches 2..8 on the FFN shapes.
                if batch > 1 && !ffn(rows, cols) {
                    continue;
                }
                let x = activations(batch * cols);
                // Two copies of the activations, used in turn where every call must quantize
                // its own (ops::matvec reuses the q8_1 codes of the activations it had last).
                let xs = [dev.upload(&x).unwrap(), dev.upload(&x).unwrap()];
                let x = &xs[0];
                let mut y: DeviceVec<f32> = dev.alloc(batch * rows).unwrap();
                let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.alloc(batch * cols / 4).unwrap(), dev.alloc(batch * cols / 16).unwrap());
                ops::quantize_q8_1(&dev, x, &mut xq, &mut xds).unwrap();
                if profile {
                    ops::matvec_q8_1(&dev, dev.wave_lanes(), dtype, w, &xq, &xds, &mut y, rows, cols, batch).unwrap();
                    dev.synchronize().unwrap();
                    continue;
                }
                let moved = moved_bytes(wbytes, rows, cols, batch);
                let us = time(&dev, wbytes, || ops::matvec_q8_1(&dev, dev.wave_lanes(), dtype, ws.next(), &xq, &xds, &mut y, rows, cols, batch).unwrap());
                let mut turn = 0;
                let full = time(&dev, wbytes, || {
                    turn += 1;
                    ops::matvec(&dev, dtype, ws.next(), &xs[turn % 2], &mut y, rows, cols, batch).unwrap()
                });
                // The same activations every call (one input's projections: q, k, v; gate,
                // up): quantized once, each matvec overlapping the end of the one before.
                let chained = time(&dev, wbytes, || ops::matvec(&dev, dtype, ws.next(), x, &mut y, rows, cols, batch).unwrap());
                let hot = time(&dev, wbytes, || ops::matvec_q8_1(&dev, dev.wave_lanes(), dtype, w, &xq, &xds, &mut y, rows, cols, batch).unwrap());
                let gbps = benches::gbps(moved, us);
                let gbps_full = benches::gbps(moved + batch * cols * 4, full);
                eprintln!(
                    "{:>5} {rows:>6}x{cols:<6} b{batch}: matvec {us:8.2} us {gbps:6.0} GB/s ({:5.1}% of copy) | with quantize {full:8.2} us ({:5.1}%) | chained {chained:8.2} us ({:5.1}%) | hot {hot:8.2} us",
                    dtype.name(),
                    100.0 * gbps / copy_gbps,
                    100.0 * gbps_full / copy_gbps,
                    100.0 * gbps * us / chained / copy_gbps
                );
                lines.push(format!(
                    "{{\"dtype\":\"{}\",\"rows\":{rows},\"cols\":{cols},\"batch\":{batch},\"weight_bytes\":{wbytes},\"moved\":{moved},\"us\":{us:.3},\"gbps\":{gbps:.1},\"us_with_quantize\":{full:.3},\"us_chained\":{chained:.3},\"us_hot\":{hot:.3},\"copies\":{},\"copy_gbps\":{copy_gbps:.1}}}",
                    dtype.name(),
                    ws.copies()
                ));
            }
        }
    }
    if profile {
        return;
    }
    benches::write_json_array(&args.out_dir(), "rust_quantized.json", &lines);
}

/// Batch 1 on the Llama-3-8B shapes: the work-group-per-row kernel against the streaming
/// kernel with the launcher's grid and with 2, 3, 4, 6 and 8 work-groups per SM; then
/// batches 2, 4 and 8 the same way (the batch kernel at 1 and 2 work-groups per SM).
fn sweep(dev: &kernels::runtime::Device, copy_gbps: f64) {
    let cus = kernel_dsl::host::Executor::compute_units(dev).unwrap_or(1) as usize;
    for batch in [1usize, 2, 4, 8] {
        let grids: &[Option<usize>] = if batch == 1 { &[None, Some(2), Some(3), Some(4), Some(6), Some(8)] } else { &[None, Some(2)] };
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K] {
            for (rows, cols) in [(4096, 14336), (14336, 4096), (4096, 4096), (128256, 4096)] {
                if batch > 1 && rows > 14336 {
                    continue;
                }
                let ws = ColdSet::new(dev, dev.upload(&weights(dtype, rows, cols)).unwrap());
                let x = activations(batch * cols);
                let x = dev.upload(&x).unwrap();
                let mut y: DeviceVec<f32> = dev.alloc(batch * rows).unwrap();
                let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.alloc(batch * cols / 4).unwrap(), dev.alloc(batch * cols / 16).unwrap());
                ops::quantize_q8_1(dev, &x, &mut xq, &mut xds).unwrap();
                let wbytes = ws.bytes();
                let moved = moved_bytes(wbytes, rows, cols, batch);
                let pct = |us: f64| 100.0 * moved as f64 / (us * 1e-6) / 1e9 / copy_gbps;
                let row_us = time(dev, wbytes, || ops::matvec_rows(dev, dtype, ws.next(), &xq, &xds, &mut y, rows, cols, batch).unwrap());
                let mut line = format!("{:>5} {rows:>6}x{cols:<6} b{batch} rows {row_us:7.2} us ({:4.1}%) | stream", dtype.name(), pct(row_us));
                for &per_cu in grids {
                    let mut call = || ops::matvec_stream(dev, dev.wave_lanes(), dtype, ws.next(), &xq, &xds, &mut y, rows, cols, batch, per_cu.map(|k| k * cus));
                    if call().is_err() {
                        continue;
                    }
                    let us = time(dev, wbytes, || call().unwrap());
                    let name = per_cu.map_or("auto".to_string(), |k| format!("{k}/SM"));
                    line += &format!(" {name}:{us:.2}us({:.1}%)", pct(us));
                }
                eprintln!("{line}");
            }
        }
    }
}

/// Batch 1 through the streaming kernel on the Llama-3-8B decode shapes (as `--decode`) with 2, 3 and 4 shared
/// stages, each with the launcher's grid and 3, 4, 5, 6 and 8 work-groups per SM (weights
/// cycled as in the main benchmark).
fn sweep_stages(dev: &kernels::runtime::Device, copy_gbps: f64, formats: &[GgmlDType]) {
    let cus = kernel_dsl::host::Executor::compute_units(dev).unwrap_or(1) as usize;
    for &dtype in formats {
        for (rows, cols) in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)] {
            let ws = ColdSet::new(dev, dev.upload(&weights(dtype, rows, cols)).unwrap());
            let x = activations(cols);
            let x = dev.upload(&x).unwrap();
            let mut y: DeviceVec<f32> = dev.alloc(rows).unwrap();
            let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.alloc(cols / 4).unwrap(), dev.alloc(cols / 16).unwrap());
            ops::quantize_q8_1(dev, &x, &mut xq, &mut xds).unwrap();
            let moved = moved_bytes(ws.bytes(), rows, cols, 1);
            let pct = |us: f64| 100.0 * moved as f64 / (us * 1e-6) / 1e9 / copy_gbps;
            {
                let mut dst: DeviceVec<u8> = dev.alloc(ws.bytes()).unwrap();
                let us = time(dev, ws.bytes(), || copy(dev, ws.next(), &mut dst));
                let gbps = benches::gbps(2 * ws.bytes(), us);
                eprintln!("{:>5} {rows:>6}x{cols:<6} copy of the weights (cold): {us:.2} us, {gbps:.0} GB/s ({:.1}% of the 1 GiB copy)", dtype.name(), 100.0 * gbps / copy_gbps);
            }
            for stages in [2, 3, 4] {
                let mut line = format!("{:>5} {rows:>6}x{cols:<6} stages {stages}:", dtype.name());
                for per_cu in [None, Some(3), Some(4), Some(5), Some(6), Some(8)] {
                    let tuning = ops::StreamTuning { groups: per_cu.map(|k| k * cus), stages: Some(stages) };
                    let mut call = || ops::matvec_stream(dev, dev.wave_lanes(), dtype, ws.next(), &xq, &xds, &mut y, rows, cols, 1, tuning);
                    if call().is_err() {
                        continue;
                    }
                    let us = time(dev, ws.bytes(), || call().unwrap());
                    let name = per_cu.map_or("auto".to_string(), |k| format!("{k}/SM"));
                    line += &format!(" {name}:{us:.2}us({:.1}%)", pct(us));
                }
                eprintln!("{line}");
            }
        }
    }
}

/// `ops::matvec` with the launcher's grid and stages, 3 and 4 stages, and 3 to 7
/// work-groups per SM (where resident),
/// each on alternating activations (every call quantizes) and chained on the same
/// activations (quantized once, each matvec overlapping the end of the one before); the
/// Llama-3-8B batch-1 shapes and its k/v projection (1024x4096, the row kernel).
fn sweep_chain(dev: &kernels::runtime::Device, copy_gbps: f64, formats: &[GgmlDType]) {
    let cus = kernel_dsl::host::Executor::compute_units(dev).unwrap_or(1) as usize;
    for &dtype in formats {
        for (rows, cols) in [(4096, 14336), (14336, 4096), (4096, 4096), (1024, 4096), (128256, 4096)] {
            let ws = ColdSet::new(dev, dev.upload(&weights(dtype, rows, cols)).unwrap());
            let x = activations(cols);
            let xs = [dev.upload(&x).unwrap(), dev.upload(&x).unwrap()];
            let mut y: DeviceVec<f32> = dev.alloc(rows).unwrap();
            let moved = moved_bytes(ws.bytes(), rows, cols, 1);
            let pct = |us: f64| 100.0 * moved as f64 / (us * 1e-6) / 1e9 / copy_gbps;
            let mut line = format!("{:>5} {rows:>6}x{cols:<6} each quantizes / chained:", dtype.name());
            let mut tunings: Vec<(String, ops::StreamTuning)> = vec![("auto".into(), ops::StreamTuning::default())];
            for stages in [3, 4] {
                tunings.push((format!("{stages} stages"), ops::StreamTuning { groups: None, stages: Some(stages) }));
            }
            for per_cu in 3..=7 {
                tunings.push((format!("{per_cu}/SM"), ops::StreamTuning { groups: Some(per_cu * cus), stages: None }));
            }
            for (name, tuning) in tunings {
                let mut turn = 0;
                let each = time(dev, ws.bytes(), || {
                    turn += 1;
                    ops::matvec_tuned(dev, dtype, ws.next(), &xs[turn % 2], &mut y, rows, cols, 1, tuning).unwrap()
                });
                let chained = time(dev, ws.bytes(), || ops::matvec_tuned(dev, dtype, ws.next(), &xs[0], &mut y, rows, cols, 1, tuning).unwrap());
                line += &format!(" {name}:{each:.2}/{chained:.2}us({:.1}/{:.1}%)", pct(each), pct(chained));
            }
            eprintln!("{line}");
        }
    }
}

/// Host time per call: `n` calls queued back to back (the host does not wait), divided by
/// `n`, beside the GPU time per call of the same loop; where the host time is the larger,
/// the GPU idles between launches and the op is launch-bound.
fn host(dev: &kernels::runtime::Device) {
    let n = 2000;
    // The runtime makes its context current before every launch (`cuCtxSetCurrent`).
    #[cfg(feature = "cuda")]
    if let kernels::runtime::Device::Cuda(d) = dev {
        let t = std::time::Instant::now();
        for _ in 0..20 * n {
            d.bind_context().unwrap();
        }
        eprintln!("cuCtxSetCurrent: {:.3} us/call", t.elapsed().as_secs_f64() * 1e6 / (20 * n) as f64);
    }
    for (dtype, rows, cols) in [(GgmlDType::Q4_0, 4096, 4096), (GgmlDType::Q4_0, 4096, 14336)] {
        let w = dev.upload(&weights(dtype, rows, cols)).unwrap();
        let x = dev.upload(&vec![0.5f32; cols]).unwrap();
        let mut y: DeviceVec<f32> = dev.alloc(rows).unwrap();
        let (mut xq, mut xds): (DeviceVec<u32>, DeviceVec<f32>) = (dev.alloc(cols / 4).unwrap(), dev.alloc(cols / 16).unwrap());
        let (xq2, xds2): (DeviceVec<u32>, DeviceVec<f32>) = (dev.alloc(cols / 4).unwrap(), dev.alloc(cols / 16).unwrap());
        let mut y2: DeviceVec<f32> = dev.alloc(rows).unwrap();
        let mut calls: Vec<NamedCall<'_>> = Vec::new();
        calls.push(("quantize_q8_1", Box::new(|| ops::quantize_q8_1(dev, &x, &mut xq, &mut xds).unwrap())));
        calls.push(("matvec_q8_1", Box::new(|| ops::matvec_q8_1(dev, dev.wave_lanes(), dtype, &w, &xq2, &xds2, &mut y2, rows, cols, 1).unwrap())));
        calls.push(("matvec (both)", Box::new(|| ops::matvec(dev, dtype, &w, &x, &mut y, rows, cols, 1).unwrap())));
        for (name, f) in calls.iter_mut() {
            for _ in 0..50 {
                f();
            }
            dev.synchronize().unwrap();
            let mut host_us = 0.0;
            let gpu = benches::gpu_ms(dev, || {
                let t = std::time::Instant::now();
                for _ in 0..n {
                    f();
                }
                host_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            });
            eprintln!("{:>5} {rows:>6}x{cols:<6} {name:<14} host {host_us:6.2} us/call, GPU {:6.2} us/call", dtype.name(), gpu * 1e3 / n as f64);
        }
    }
}

/// A timed call and its name.
type NamedCall<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// `ops::dequantize_with` to bf16 on the Llama-3-8B shapes, [`ops::DequantKernel::Pieces`]
/// against [`ops::DequantKernel::Generic`], weights cycled as in the main benchmark (the
/// output, 32 to 117 MB, is one buffer): bytes moved = the blocks read + 2 bytes per weight.
fn dequant(dev: &kernels::runtime::Device, copy_gbps: f64, formats: &[GgmlDType], out_dir: &str) {
    let mut lines = Vec::new();
    for &dtype in formats {
        for (rows, cols) in [(4096, 4096), (14336, 4096), (4096, 14336)] {
            let ws = ColdSet::new(dev, dev.upload(&weights(dtype, rows, cols)).unwrap());
            let mut out: DeviceVec<half::bf16> = dev.alloc(rows * cols).unwrap();
            let moved = ws.bytes() + 2 * rows * cols;
            let mut line = format!("{:>5} {rows:>6}x{cols:<6} dequantize bf16:", dtype.name());
            let mut json = format!("{{\"dtype\":\"{}\",\"rows\":{rows},\"cols\":{cols},\"weight_bytes\":{},\"moved\":{moved}", dtype.name(), ws.bytes());
            for (name, kernel) in [("generic", ops::DequantKernel::Generic), ("pieces", ops::DequantKernel::Pieces)] {
                let us = time(dev, moved, || ops::dequantize_with(dev, dtype, ws.next(), &mut out, kernel).unwrap());
                let gbps = benches::gbps(moved, us);
                line += &format!(" {name} {us:8.2} us {gbps:6.0} GB/s ({:5.1}% of copy) |", 100.0 * gbps / copy_gbps);
                json += &format!(",\"us_{name}\":{us:.3},\"gbps_{name}\":{gbps:.1}");
            }
            eprintln!("{line}");
            lines.push(json + &format!(",\"copy_gbps\":{copy_gbps:.1}}}"));
        }
    }
    benches::write_json_array(out_dir, "rust_dequantize.json", &lines);
}
