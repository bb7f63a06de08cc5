//! The weight blocks of the quantized matvec benchmarks, shared (by `#[path]`) with the
//! Candle peer (`benches/candle-peer`) so both sides multiply the same bytes.

/// Byte offsets of the f16 scales in one block of the GGML format `name` (`"q4_0"`,
/// `"q4_K"`, ...); none for formats without f16 scales.
pub fn scale_offsets(name: &str) -> &'static [usize] {
    match name {
        "q4_0" | "q5_0" | "q8_0" => &[0],
        "q4_1" | "q5_1" | "q4_K" | "q5_K" => &[0, 2],
        "q2_K" => &[80, 82],
        "q3_K" => &[108],
        "q6_K" => &[208],
        _ => &[],
    }
}

/// `rows x cols` weights of format `name` (blocks of `block_weights` weights in
/// `block_bytes` bytes): xorshift bytes with every block's f16 scales set to 0.01 (finite,
/// non-saturating).
pub fn random_blocks(name: &str, block_weights: usize, block_bytes: usize, rows: usize, cols: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ rows as u64;
    let n = rows * cols / block_weights * block_bytes;
    let mut v: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let scale = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    let offsets = scale_offsets(name);
    for b in v.chunks_mut(block_bytes) {
        for &o in offsets {
            b[o..o + 2].copy_from_slice(&scale);
        }
    }
    v
}
