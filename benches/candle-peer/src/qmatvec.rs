//! Candle's own CUDA quantized matrix-vector products (`QMatMul::forward`, which quantizes
//! the activations to q8_1 and runs Candle's matvec kernel for batches up to 8), on the same
//! weight shapes and with the same block data as our `quantized` benchmark
//! (`benches/src/bin/quantized.rs`). Time per forward from CUDA events around a loop of
//! forwards on Candle's stream, median of 5: the figure to compare with our
//! "matvec + quantize" column. Like ours, the forwards cycle through copies of the weights
//! (256 MiB in all: each call reads them from DRAM, not from the L2 the previous call
//! filled); `us_hot` times one copy in a loop. Prints one JSON list (`candle_quantized.json`).
use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QMatMul};
use candle_core::{Device, Module, Result, Tensor};

#[path = "../../src/quant_blocks.rs"]
mod quant_blocks;

/// The same blocks as our benchmark (`benches/src/quant_blocks.rs`).
fn weights(name: &str, dtype: GgmlDType, rows: usize, cols: usize) -> Vec<u8> {
    quant_blocks::random_blocks(name, dtype.block_size(), dtype.type_size(), rows, cols)
}

fn gpu_us(device: &Device, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let stream = device.as_cuda_device()?.cuda_stream();
    let ev = |s: &std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>| {
        s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| candle_core::Error::Msg(format!("{e:?}")))
    };
    for _ in 0..3 {
        f()?;
    }
    let mut reps = Vec::new();
    for _ in 0..5 {
        let a = ev(&stream)?;
        for _ in 0..iters {
            f()?;
        }
        let b = ev(&stream)?;
        let ms = a.elapsed_ms(&b).map_err(|e| candle_core::Error::Msg(format!("{e:?}")))?;
        reps.push(ms as f64 / iters as f64 * 1e3);
    }
    reps.sort_by(|a, b| a.total_cmp(b));
    Ok(reps[2])
}

pub fn bench(device: &Device) -> Result<()> {
    let types = [
        ("q4_0", GgmlDType::Q4_0),
        ("q8_0", GgmlDType::Q8_0),
        ("q4_K", GgmlDType::Q4K),
        ("q6_K", GgmlDType::Q6K),
        ("q4_1", GgmlDType::Q4_1),
        ("q5_0", GgmlDType::Q5_0),
        ("q5_1", GgmlDType::Q5_1),
        ("q2_K", GgmlDType::Q2K),
        ("q3_K", GgmlDType::Q3K),
        ("q5_K", GgmlDType::Q5K),
    ];
    let shapes = [(4096usize, 4096usize), (14336, 4096), (4096, 14336), (128256, 4096)];
    let mut out = Vec::new();
    for (name, dtype) in types {
        for (rows, cols) in shapes {
            let w = weights(name, dtype, rows, cols);
            // As `benches::cold_copies` (256 MiB in all, at most 64 copies).
            let copies = (256usize << 20).div_ceil(w.len()).clamp(1, 64);
            let mms = (0..copies).map(|_| QMatMul::from_qtensor(qtensor_from_ggml(dtype, &w, vec![rows, cols], device)?)).collect::<Result<Vec<_>>>()?;
            for batch in [1usize, 2, 4, 8] {
                // Batches 2..8 on the two FFN shapes (as `bench-quantized`).
                if batch > 1 && (rows, cols) != (4096, 14336) && (rows, cols) != (14336, 4096) {
                    continue;
                }
                let x: Vec<f32> = (0..batch * cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
                let x = Tensor::from_vec(x, (batch, cols), device)?;
                let bytes = w.len();
                let iters = if bytes >= 64 << 20 { 10 } else if bytes >= 1 << 20 { 50 } else { 200 };
                let mut i = 0;
                let us = gpu_us(device, iters, || {
                    i += 1;
                    mms[i % copies].forward(&x).map(|_| ())
                })?;
                let hot = gpu_us(device, iters, || mms[0].forward(&x).map(|_| ()))?;
                eprintln!("candle-cuda {name:>5} {rows:>6}x{cols:<6} b{batch}: {us:8.2} us (hot {hot:8.2} us)");
                out.push(format!("{{\"dtype\":\"{name}\",\"rows\":{rows},\"cols\":{cols},\"batch\":{batch},\"us\":{us:.3},\"us_hot\":{hot:.3},\"copies\":{copies}}}"));
            }
        }
    }
    println!("[{}]", out.join(",\n"));
    Ok(())
}
