// Writes Candle 0.11.1's quantization of deterministic f32 data for every GGUF format:
// <dir>/<name>.q (the quantized bytes) and <dir>/<name>.f32 (Candle's CPU dequantization,
// little-endian f32), for the kernels' cross-check test.
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

fn main() -> candle_core::Result<()> {
    let dir = std::env::args().nth(1).expect("output dir");
    std::fs::create_dir_all(&dir).unwrap();
    let n = 2048usize;
    let mut s = 0x2545F4914F6CDD1Du64;
    let data: Vec<f32> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            // Blocks of very different magnitudes, a zero block, and outliers.
            let scale = [1.0f32, 1e-3, 300.0, 0.0, 1e4, 1e-6, 2.0, 0.05][(i / 256) % 8];
            if i % 61 == 7 { u * scale * 20.0 } else { u * scale }
        })
        .collect();
    let t = Tensor::from_vec(data, (8, 256), &Device::Cpu)?;
    let formats = [
        (GgmlDType::Q4_0, "q4_0"), (GgmlDType::Q4_1, "q4_1"), (GgmlDType::Q5_0, "q5_0"), (GgmlDType::Q5_1, "q5_1"),
        (GgmlDType::Q8_0, "q8_0"), (GgmlDType::Q2K, "q2_K"), (GgmlDType::Q3K, "q3_K"), (GgmlDType::Q4K, "q4_K"),
        (GgmlDType::Q5K, "q5_K"), (GgmlDType::Q6K, "q6_K"), (GgmlDType::Q8K, "q8_K"),
    ];
    for (dt, name) in formats {
        let q = QTensor::quantize(&t, dt)?;
        std::fs::write(format!("{dir}/{name}.q"), &*q.data()?).unwrap();
        let d: Vec<f32> = q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?;
        let bytes: Vec<u8> = d.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(format!("{dir}/{name}.f32"), bytes).unwrap();
        println!("{name}: {} bytes", q.data()?.len());
    }
    Ok(())
}
