//! GGUF (GGML) quantized weights: dequantization, embedding lookup of quantized rows, and
//! matrix-vector products with int8 dot products, as Candle's `QCudaStorage` needs them.
//!
//! Formats ([`GgmlDType`], one marker type each for the kernels): `Q4_0`, `Q4_1`, `Q5_0`,
//! `Q5_1`, `Q8_0` (blocks of 32 weights) and the k-quants `Q2K`, `Q3K`, `Q4K`, `Q5K`,
//! `Q6K`, `Q8K` (super-blocks of 256). A quantized matrix of `rows x cols` is `rows`
//! rows of `cols / block_weights` blocks each, row-major, exactly the bytes of a GGUF
//! tensor (a weight matrix stored `(out_features, in_features)`).
//!
//! Kernels:
//! - [`dequantize`](fn@dequantize): every weight to `f32`/`f16`/`bf16` (all formats, `Q8K`
//!   too). The float operations are Candle's (and GGML's) in the same order, so `f32`
//!   results are bit-identical to Candle's CPU `dequantize`.
//! - [`get_rows`](fn@get_rows): the rows picked by `u32` ids, dequantized (an embedding
//!   lookup); out-of-range ids give zero rows.
//! - [`quantize_q8_1`](fn@quantize_q8_1): activations to 8-bit integers, one scale per 32
//!   values (`d = max|x| / 127`, `q = round(x / d)`) plus the block's sum `d * sum(q)`, the
//!   GGML q8_1 scheme with `f32` scales, stored as packed words (`xq`) and `(d, s)` pairs
//!   (`xds`) so the matvec loads both as aligned vectors.
//! - [`matvec`](fn@matvec): `y[b, r] = sum_k W[r, k] x[b, k]` for a batch of 1..8
//!   activation rows, with the weights' integer codes multiplied by the q8_1 codes four at
//!   a time ([`kernel_dsl::dot`]: dp4a, `v_dot4_i32_i8`). One wave per weight row; each lane
//!   takes 32-weight units (one q8_1 block each) in turn and decodes a unit once for the
//!   whole batch. What AMD GPUs and the CPU executor run.
//! - On NVIDIA: [`matvec_stream`](fn@matvec_stream) (batch 1) and
//!   [`matvec_stream_batch`](fn@matvec_stream_batch) (batches of 2..8) stream the rows
//!   through shared memory with a resident grid and hold the activations in registers;
//!   [`matvec_row`](fn@matvec_row) (a work-group per row) takes what they do not (batch 1
//!   on small matrices, rows too long for their registers).
//!
//! The checked host entry points are in [`ops`].
use kernel_dsl::each;
use kernel_dsl::prelude::*;

/// Weights per k-quant super-block.
pub const QK_K: usize = 256;

/// A GGUF block format: its size and name (host and device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlDType {
    /// 32 weights, `f16` scale, 4-bit codes minus 8 (18 bytes).
    Q4_0,
    /// 32 weights, `f16` scale and minimum, 4-bit codes (20 bytes).
    Q4_1,
    /// 32 weights, `f16` scale, 5-bit codes minus 16 (22 bytes).
    Q5_0,
    /// 32 weights, `f16` scale and minimum, 5-bit codes (24 bytes).
    Q5_1,
    /// 32 weights, `f16` scale, signed 8-bit codes (34 bytes).
    Q8_0,
    /// 256 weights, 16 groups with 4-bit scales and minimums, 2-bit codes (84 bytes).
    Q2K,
    /// 256 weights, 16 groups with 6-bit scales, 3-bit codes (110 bytes).
    Q3K,
    /// 256 weights, 8 groups with 6-bit scales and minimums, 4-bit codes (144 bytes).
    Q4K,
    /// 256 weights, 8 groups with 6-bit scales and minimums, 5-bit codes (176 bytes).
    Q5K,
    /// 256 weights, 16 groups with 8-bit scales, 6-bit codes minus 32 (210 bytes).
    Q6K,
    /// 256 weights, `f32` scale, 8-bit codes and 16 group sums (292 bytes; GGML uses it
    /// for activations, so it has no matvec here).
    Q8K,
}

impl GgmlDType {
    /// Every format.
    pub const ALL: [GgmlDType; 11] = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::Q8K,
    ];

    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlDType::Q4_0 => 18,
            GgmlDType::Q4_1 => 20,
            GgmlDType::Q5_0 => 22,
            GgmlDType::Q5_1 => 24,
            GgmlDType::Q8_0 => 34,
            GgmlDType::Q2K => 84,
            GgmlDType::Q3K => 110,
            GgmlDType::Q4K => 144,
            GgmlDType::Q5K => 176,
            GgmlDType::Q6K => 210,
            GgmlDType::Q8K => 292,
        }
    }

    /// Weights of one block.
    pub const fn block_weights(self) -> usize {
        match self {
            GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_0 => 32,
            _ => QK_K,
        }
    }

    /// GGUF's name (`"q4_0"`, `"q4_K"` ...).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlDType::Q4_0 => "q4_0",
            GgmlDType::Q4_1 => "q4_1",
            GgmlDType::Q5_0 => "q5_0",
            GgmlDType::Q5_1 => "q5_1",
            GgmlDType::Q8_0 => "q8_0",
            GgmlDType::Q2K => "q2_K",
            GgmlDType::Q3K => "q3_K",
            GgmlDType::Q4K => "q4_K",
            GgmlDType::Q5K => "q5_K",
            GgmlDType::Q6K => "q6_K",
            GgmlDType::Q8K => "q8_K",
        }
    }

    /// `true` when [`matvec`](fn@matvec) has an instance for the format (all but `Q8K`).
    pub const fn has_matvec(self) -> bool {
        !matches!(self, GgmlDType::Q8K)
    }
}

/// The decoded codes and scales of one 32-weight unit of a weight row, in the order of the
/// q8_1 block they meet: `q` holds 32 integer codes as packed bytes (signed, or unsigned
/// below 128), and the unit's contribution to a dot product with a q8_1 block
/// `(a, d_a, s_a)` is
/// `d_a * (c[0] * (q[0..16] . a[0..16]) + c[1] * (q[16..32] . a[16..32])) + m * s_a -
/// d_a * (n[0] * sum a[0..16] + n[1] * sum a[16..32])`.
#[derive(Clone, Copy)]
pub struct Unit {
    /// 32 codes, four per word.
    pub q: [u32; 8],
    /// Scales of the two halves (equal where the format has one scale per 32).
    pub c: [f32; 2],
    /// Factor of the q8_1 block sum (formats with a minimum per 32 weights).
    pub m: f32,
    /// Minimums per 16 weights (`Q2K`).
    pub n: [f32; 2],
}

/// A block format on the device: sizes, the dequantization of one weight and the decoding
/// of one 32-weight unit. Implemented by the marker types [`Q4_0`] ... [`Q8K`].
pub trait QuantFormat: 'static {
    /// The format.
    const DTYPE: GgmlDType;
    /// Bytes per block.
    const BYTES: usize;
    /// Weights per block.
    const WEIGHTS: usize;
    /// The two halves of a unit have their own scales (`Unit::c`).
    const SPLIT: bool = false;
    /// The unit uses the q8_1 block sum (`Unit::m`).
    const MIN: bool = false;
    /// The unit subtracts per-16 minimums (`Unit::n`).
    const HALF_MIN: bool = false;
    /// 16-byte words one lane loads ahead for the next LDS chunk of [`matvec`](fn@matvec)
    /// ([`LANE_UNITS`] units per lane, at most [`MAX_PREFETCH`]: the rest of a chunk is
    /// copied when it is stored). None in AMD code objects:
    /// the registers held across the compute step spilled on gfx942/gfx950.
    const PREFETCH: usize = {
        let words = (LANE_UNITS * Self::BYTES).div_ceil(Self::WEIGHTS / 32 * 16);
        if cfg!(target_arch = "amdgpu") {
            0
        } else if words > MAX_PREFETCH {
            MAX_PREFETCH
        } else {
            words
        }
    };
    /// Weight `j` of the block `b` (exactly `BYTES` long), as Candle computes it.
    fn weight(b: &[u8], j: usize) -> f32;
    /// Unit `u` (weights `32u .. 32u + 32`) of the block `b`.
    fn unit(b: &[u8], u: usize) -> Unit;
    /// Consecutive units one work-item of [`matvec_stream`](fn@matvec_stream) takes side
    /// by side (1, 2 or 4, dividing the units of a block): units that share bytes (`Q6K`:
    /// the four units of a half share its high bits and pairwise its low nibbles) are then
    /// read from shared memory once for all of them. A work-item's activations are then
    /// `RUN` consecutive q8_1 blocks, staged through shared memory where the row's codes
    /// fit a stage (loaded directly, the first loads of a wave touch a cache line per lane:
    /// about 2 us more per call on the H200). `Q4K` keeps 1: at 4 (80 registers against
    /// 96, 6 work-groups per SM) it was 0.5-11% slower at the 4096-column decode shapes and
    /// 36% at 4096x14336 (whose codes do not fit a stage), faster only on a 128256-row
    /// matrix (H200, `bench-quantized --decode`).
    const RUN: usize = 1;
    /// `matvec_stream` reads units with [`QuantFormat::unit_at`] from the whole stage
    /// (`Q8_0`, H100: 1.5-5% faster at batch 1) rather than with [`QuantFormat::unit`]
    /// from the block (the other formats: the stage-relative addressing alone cost them
    /// 2-4%, and aligned word reads cost `Q4_0` and `Q6K` 1-5% more).
    const STAGE_READS: bool = false;
    /// [`QuantFormat::unit`] of the block at byte `o` of `s`, a buffer of whole aligned
    /// words (a shared-memory stage): formats whose blocks are only 2-byte aligned may
    /// read the aligned words around their data ([`rd32s`]) instead of two 16-bit halves
    /// per word.
    ///
    /// # Safety
    /// `s` starts 4-byte aligned and its length is a multiple of 4.
    #[inline(always)]
    unsafe fn unit_at(s: &[u8], o: usize, u: usize) -> Unit {
        Self::unit(&s[o..o + Self::BYTES], u)
    }
}

// ---- little-endian reads inside one block ------------------------------------------------

/// `b[o] | b[o+1] << 8`: one 16-bit load (`o` even; blocks start on even bytes).
#[device]
#[inline(always)]
pub fn rd16(b: &[u8], o: usize) -> u32 {
    assert!(o + 2 <= b.len());
    // SAFETY: in bounds (checked above); the launchers check that weight buffers start on
    // 16 bytes and every block size is even, so `o` even is 2-byte aligned.
    unsafe { *(b.as_ptr().add(o) as *const u16) as u32 }
}

/// Four bytes at an even offset, as two 16-bit loads.
#[device]
#[inline(always)]
pub fn rd32_2(b: &[u8], o: usize) -> u32 {
    rd16(b, o) | (rd16(b, o + 2) << 16)
}

/// `N` little-endian words of `s` from the even byte offset `o` (word `i`: bytes
/// `o + 4 i .. o + 4 i + 4`): `N + 1` aligned 4-byte loads and one funnel shift per word,
/// where [`rd32_2`] takes two 16-bit loads and a merge per word (`Q8_0` in
/// `matvec_stream`: 16 -> 9 shared-memory loads per unit).
///
/// # Safety
/// `s` starts 4-byte aligned and its length is a multiple of 4.
#[device]
#[inline(always)]
pub unsafe fn rd32s<const N: usize>(s: &[u8], o: usize) -> [u32; N] {
    assert!(o + 4 * N <= s.len());
    let p = s.as_ptr() as *const u32;
    // Word `w0 + i` is the aligned word holding byte `o + 4 i`; an odd half-word `o`
    // shifts by 16. Words past `w0 + N - 1` lie inside `s` except, for an aligned `o`
    // ending `s`, word `w0 + N`: clamped (a shift of 0 takes none of its bits).
    let (w0, shift) = (o / 4, (o as u32 & 2) * 8);
    let last = s.len() / 4 - 1;
    // SAFETY: w0 <= last (o < s.len()); aligned and in bounds by the contract.
    let mut prev = unsafe { *p.add(w0) };
    let mut out = [0u32; N];
    let mut i = 0;
    while i < N {
        let j = if i + 1 == N { (w0 + N).min(last) } else { w0 + i + 1 };
        // SAFETY: j <= last (above: w0 + i + 1 <= w0 + N - 1 < s.len() / 4 for i + 1 < N).
        let next = unsafe { *p.add(j) };
        out[i] = ((((next as u64) << 32) | prev as u64) >> shift) as u32;
        prev = next;
        i += 1;
    }
    out
}

/// Four bytes at a 4-byte aligned offset (formats whose block size is a multiple of 4).
#[device]
#[inline(always)]
pub fn rd32(b: &[u8], o: usize) -> u32 {
    assert!(o + 4 <= b.len());
    // SAFETY: in bounds; 4-byte aligned as the caller's format guarantees (see `rd16`).
    unsafe { *(b.as_ptr().add(o) as *const u32) }
}

/// 16 bytes at a 16-byte aligned offset, as one vector load.
#[device]
#[inline(always)]
pub fn rd128(b: &[u8], o: usize) -> [u32; 4] {
    assert!(o + 16 <= b.len());
    // SAFETY: in bounds; 16-byte aligned as the caller's format guarantees.
    unsafe { ld4(b.as_ptr().add(o) as *const crate::indexing::Words4) }
}

/// The `f16` at an even offset, widened.
#[device]
#[inline(always)]
pub fn rdf16(b: &[u8], o: usize) -> f32 {
    f16::from_bits(rd16(b, o) as u16).to_f32()
}

/// Byte `o`.
#[device]
#[inline(always)]
pub fn rd8(b: &[u8], o: usize) -> u32 {
    b[o] as u32
}

/// Per-byte `v - k` for bytes `v + 128 - k < 256` (no carries), as signed bytes: adding
/// `128 - k` and flipping the top bit reinterprets `v - k` in two's complement.
#[device]
#[inline(always)]
pub fn sub_bytes(v: u32, k: u32) -> u32 {
    v.wrapping_add((128 - k) * 0x0101_0101) ^ 0x8080_8080
}

/// Bits `0..4` of `t` moved to bit 4 of bytes 0..3 (the fifth bit of 5-bit codes).
#[device]
#[inline(always)]
pub fn spread4(t: u32) -> u32 {
    ((t & 1) << 4) | ((t & 2) << 11) | ((t & 4) << 18) | ((t & 8) << 25)
}

/// Scale and minimum `j` (0..8) of the 6-bit packed `Q4K`/`Q5K` scales at byte 4.
#[device]
#[inline(always)]
pub fn scale_min_k4(b: &[u8], j: usize) -> (u32, u32) {
    if j < 4 {
        (rd8(b, 4 + j) & 63, rd8(b, 8 + j) & 63)
    } else {
        ((rd8(b, 8 + j) & 0xf) | ((rd8(b, j) >> 6) << 4), (rd8(b, 8 + j) >> 4) | ((rd8(b, 4 + j) >> 6) << 4))
    }
}

/// Scale `i` (0..16) of the 6-bit packed `Q3K` scales at byte 96, as stored (0..63).
#[device]
#[inline(always)]
pub fn scale_q3k(b: &[u8], i: usize) -> u32 {
    let (k, q) = (i % 4, i / 4);
    let lo = (rd8(b, 96 + (q % 2) * 4 + k) >> (4 * (q / 2))) & 0xf;
    let hi = (rd8(b, 104 + k) >> (2 * q)) & 3;
    lo | (hi << 4)
}

macro_rules! marker {
    ($($name:ident),*) => {$(
        #[doc = concat!("Marker type of [`GgmlDType::", stringify!($name), "`] for the kernels.")]
        #[allow(non_camel_case_types)]
        pub struct $name;
    )*};
}
marker!(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K);

/// A unit with one scale.
#[device]
#[inline(always)]
pub fn unit1(q: [u32; 8], c: f32, m: f32) -> Unit {
    Unit { q, c: [c, c], m, n: [0.0, 0.0] }
}

impl QuantFormat for Q4_0 {
    const DTYPE: GgmlDType = GgmlDType::Q4_0;
    const BYTES: usize = 18;
    const WEIGHTS: usize = 32;
    // The codes stay unsigned (0..16) and the offset of 8 goes through the q8_1 block sum
    // (`m = -8 d`): two integer operations fewer per code word than subtracting it.
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let x = (rd8(b, 2 + j % 16) >> (4 * (j / 16))) & 0xf;
        (x as i32 - 8) as f32 * rdf16(b, 0)
    }
    #[inline(always)]
    fn unit(b: &[u8], _u: usize) -> Unit {
        let mut q = [0u32; 8];
        for i in 0..4 {
            let w = rd32_2(b, 2 + 4 * i);
            q[i] = w & 0x0f0f_0f0f;
            q[4 + i] = (w >> 4) & 0x0f0f_0f0f;
        }
        let d = rdf16(b, 0);
        unit1(q, d, -8.0 * d)
    }
}

impl QuantFormat for Q4_1 {
    const DTYPE: GgmlDType = GgmlDType::Q4_1;
    const BYTES: usize = 20;
    const WEIGHTS: usize = 32;
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let x = (rd8(b, 4 + j % 16) >> (4 * (j / 16))) & 0xf;
        x as f32 * rdf16(b, 0) + rdf16(b, 2)
    }
    #[inline(always)]
    fn unit(b: &[u8], _u: usize) -> Unit {
        let mut q = [0u32; 8];
        for i in 0..4 {
            let w = rd32(b, 4 + 4 * i);
            q[i] = w & 0x0f0f_0f0f;
            q[4 + i] = (w >> 4) & 0x0f0f_0f0f;
        }
        unit1(q, rdf16(b, 0), rdf16(b, 2))
    }
}

/// The 5-bit codes of a `Q5_0`/`Q5_1` block: high bits `qh`, nibbles at byte `qs`.
#[device]
#[inline(always)]
pub fn q5_codes(b: &[u8], qh: u32, qs: usize, aligned: bool) -> [u32; 8] {
    let mut q = [0u32; 8];
    for i in 0..4 {
        let w = if aligned { rd32(b, qs + 4 * i) } else { rd32_2(b, qs + 4 * i) };
        q[i] = (w & 0x0f0f_0f0f) | spread4((qh >> (4 * i)) & 0xf);
        q[4 + i] = ((w >> 4) & 0x0f0f_0f0f) | spread4((qh >> (16 + 4 * i)) & 0xf);
    }
    q
}

/// The fifth bit (as 16) of weight `j` of a `Q5_0`/`Q5_1` block with high bits `qh`.
#[device]
#[inline(always)]
pub fn q5_high(qh: u32, j: usize) -> u32 {
    if j < 16 { ((qh >> j) << 4) & 0x10 } else { (qh >> (j - 16 + 12)) & 0x10 }
}

impl QuantFormat for Q5_0 {
    const DTYPE: GgmlDType = GgmlDType::Q5_0;
    const BYTES: usize = 22;
    const WEIGHTS: usize = 32;
    // Unsigned codes, the offset of 16 through the q8_1 block sum (as `Q4_0`).
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let x = ((rd8(b, 6 + j % 16) >> (4 * (j / 16))) & 0xf) | q5_high(rd32_2(b, 2), j);
        (x as i32 - 16) as f32 * rdf16(b, 0)
    }
    #[inline(always)]
    fn unit(b: &[u8], _u: usize) -> Unit {
        let d = rdf16(b, 0);
        unit1(q5_codes(b, rd32_2(b, 2), 6, false), d, -16.0 * d)
    }
}

impl QuantFormat for Q5_1 {
    const DTYPE: GgmlDType = GgmlDType::Q5_1;
    const BYTES: usize = 24;
    const WEIGHTS: usize = 32;
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let x = ((rd8(b, 8 + j % 16) >> (4 * (j / 16))) & 0xf) | q5_high(rd32(b, 4), j);
        x as f32 * rdf16(b, 0) + rdf16(b, 2)
    }
    #[inline(always)]
    fn unit(b: &[u8], _u: usize) -> Unit {
        unit1(q5_codes(b, rd32(b, 4), 8, true), rdf16(b, 0), rdf16(b, 2))
    }
}

impl QuantFormat for Q8_0 {
    const DTYPE: GgmlDType = GgmlDType::Q8_0;
    const BYTES: usize = 34;
    const WEIGHTS: usize = 32;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        rd8(b, 2 + j) as u8 as i8 as f32 * rdf16(b, 0)
    }
    #[inline(always)]
    fn unit(b: &[u8], _u: usize) -> Unit {
        let mut q = [0u32; 8];
        for i in 0..8 {
            q[i] = rd32_2(b, 2 + 4 * i);
        }
        unit1(q, rdf16(b, 0), 0.0)
    }
    const STAGE_READS: bool = true;
    #[inline(always)]
    unsafe fn unit_at(s: &[u8], o: usize, _u: usize) -> Unit {
        // SAFETY: `s` as the contract says.
        let q = unsafe { rd32s::<8>(s, o + 2) };
        unit1(q, rdf16(&s[o..o + Self::BYTES], 0), 0.0)
    }
}

impl QuantFormat for Q2K {
    const DTYPE: GgmlDType = GgmlDType::Q2K;
    const BYTES: usize = 84;
    const WEIGHTS: usize = QK_K;
    const SPLIT: bool = true;
    const HALF_MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let (n, shift, i) = (j / 128, (j % 128) / 32, j % 32);
        let sc = rd8(b, 8 * n + 2 * shift + i / 16);
        let q = (rd8(b, 16 + 32 * n + i) >> (2 * shift)) & 3;
        let dl = rdf16(b, 80) * (sc & 0xf) as f32;
        let ml = rdf16(b, 82) * (sc >> 4) as f32;
        dl * q as f32 - ml
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let (n, shift) = (u / 4, u % 4);
        let mut q = [0u32; 8];
        for i in 0..8 {
            q[i] = (rd32(b, 16 + 32 * n + 4 * i) >> (2 * shift)) & 0x0303_0303;
        }
        let (d, dmin) = (rdf16(b, 80), rdf16(b, 82));
        let (s0, s1) = (rd8(b, 8 * n + 2 * shift), rd8(b, 8 * n + 2 * shift + 1));
        Unit { q, c: [d * (s0 & 0xf) as f32, d * (s1 & 0xf) as f32], m: 0.0, n: [dmin * (s0 >> 4) as f32, dmin * (s1 >> 4) as f32] }
    }
}

impl QuantFormat for Q3K {
    const DTYPE: GgmlDType = GgmlDType::Q3K;
    const BYTES: usize = 110;
    const WEIGHTS: usize = QK_K;
    const SPLIT: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let (n, shift, i) = (j / 128, (j % 128) / 32, j % 32);
        let q2 = (rd8(b, 32 + 32 * n + i) >> (2 * shift)) & 3;
        let high = rd8(b, i) & (1 << (4 * n + shift));
        let dl = rdf16(b, 108) * (scale_q3k(b, 8 * n + 2 * shift + i / 16) as f32 - 32.0);
        dl * (q2 as i32 - if high == 0 { 4 } else { 0 }) as f32
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let (n, shift) = (u / 4, u % 4);
        let mut q = [0u32; 8];
        for i in 0..8 {
            let lo = (rd32_2(b, 32 + 32 * n + 4 * i) >> (2 * shift)) & 0x0303_0303;
            let hi = ((rd32_2(b, 4 * i) >> (4 * n + shift)) & 0x0101_0101) << 2;
            q[i] = sub_bytes(lo | hi, 4);
        }
        let d = rdf16(b, 108);
        let is = 8 * n + 2 * shift;
        let c0 = d * (scale_q3k(b, is) as f32 - 32.0);
        let c1 = d * (scale_q3k(b, is + 1) as f32 - 32.0);
        Unit { q, c: [c0, c1], m: 0.0, n: [0.0, 0.0] }
    }
}

impl QuantFormat for Q4K {
    const DTYPE: GgmlDType = GgmlDType::Q4K;
    const BYTES: usize = 144;
    const WEIGHTS: usize = QK_K;
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let (g, r) = (j / 64, j % 64);
        let (sc, m) = scale_min_k4(b, 2 * g + r / 32);
        let q = (rd8(b, 16 + 32 * g + r % 32) >> (4 * (r / 32))) & 0xf;
        rdf16(b, 0) * sc as f32 * q as f32 - rdf16(b, 2) * m as f32
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let (g, hi) = (u / 2, u % 2);
        let mut q = [0u32; 8];
        for i in 0..2 {
            let v = rd128(b, 16 + 32 * g + 16 * i);
            for k in 0..4 {
                q[4 * i + k] = (v[k] >> (4 * hi)) & 0x0f0f_0f0f;
            }
        }
        // The header (d, dmin, 12 bytes of scales) as one 16-byte load, the scales picked
        // with selects: no byte loads, and no branch on the unit (lanes of a wave take
        // different units).
        let h = rd128(b, 0);
        let (sc, m) = scale_min_k4_words(h, u);
        unit1(q, f16_of(h[0], false) * sc as f32, -(f16_of(h[0], true) * m as f32))
    }
}

impl QuantFormat for Q5K {
    const DTYPE: GgmlDType = GgmlDType::Q5K;
    const BYTES: usize = 176;
    const WEIGHTS: usize = QK_K;
    const MIN: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let (g, r) = (j / 64, j % 64);
        let (sc, m) = scale_min_k4(b, 2 * g + r / 32);
        let ql = (rd8(b, 48 + 32 * g + r % 32) >> (4 * (r / 32))) & 0xf;
        let add = if rd8(b, 16 + r % 32) & (1 << (2 * g + r / 32)) != 0 { 16.0 } else { 0.0 };
        rdf16(b, 0) * sc as f32 * (ql as f32 + add) - rdf16(b, 2) * m as f32
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let (g, hi) = (u / 2, u % 2);
        let mut q = [0u32; 8];
        for i in 0..2 {
            let v = rd128(b, 48 + 32 * g + 16 * i);
            let h = rd128(b, 16 + 16 * i);
            for k in 0..4 {
                q[4 * i + k] = ((v[k] >> (4 * hi)) & 0x0f0f_0f0f) | (((h[k] >> u) & 0x0101_0101) << 4);
            }
        }
        let (sc, m) = scale_min_k4(b, u);
        unit1(q, rdf16(b, 0) * sc as f32, -(rdf16(b, 2) * m as f32))
    }
}

impl QuantFormat for Q6K {
    const DTYPE: GgmlDType = GgmlDType::Q6K;
    const BYTES: usize = 210;
    const WEIGHTS: usize = QK_K;
    const SPLIT: bool = true;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        let (h, grp, l) = (j / 128, (j % 128) / 32, j % 32);
        let ql = (rd8(b, 64 * h + l + 32 * (grp % 2)) >> (4 * (grp / 2))) & 0xf;
        let qh = (rd8(b, 128 + 32 * h + l) >> (2 * grp)) & 3;
        let q = (ql | (qh << 4)) as i32 - 32;
        let sc = rd8(b, 192 + 8 * h + l / 16 + 2 * grp) as u8 as i8;
        rdf16(b, 208) * sc as f32 * q as f32
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let (h, grp) = (u / 4, u % 4);
        let mut q = [0u32; 8];
        for i in 0..8 {
            let ql = (rd32_2(b, 64 * h + 32 * (grp % 2) + 4 * i) >> (4 * (grp / 2))) & 0x0f0f_0f0f;
            let qh = (rd32_2(b, 128 + 32 * h + 4 * i) >> (2 * grp)) & 0x0303_0303;
            q[i] = sub_bytes(ql | (qh << 4), 32);
        }
        let d = rdf16(b, 208);
        let s0 = rd8(b, 192 + 8 * h + 2 * grp) as u8 as i8;
        let s1 = rd8(b, 192 + 8 * h + 2 * grp + 1) as u8 as i8;
        Unit { q, c: [d * s0 as f32, d * s1 as f32], m: 0.0, n: [0.0, 0.0] }
    }
    const RUN: usize = 4;
}

impl QuantFormat for Q8K {
    const DTYPE: GgmlDType = GgmlDType::Q8K;
    const BYTES: usize = 292;
    const WEIGHTS: usize = QK_K;
    #[inline(always)]
    fn weight(b: &[u8], j: usize) -> f32 {
        f32::from_bits(rd32(b, 0)) * rd8(b, 4 + j) as u8 as i8 as f32
    }
    #[inline(always)]
    fn unit(b: &[u8], u: usize) -> Unit {
        let mut q = [0u32; 8];
        for i in 0..8 {
            q[i] = rd32(b, 4 + 32 * u + 4 * i);
        }
        unit1(q, f32::from_bits(rd32(b, 0)), 0.0)
    }
}

/// The unit's dot product with one q8_1 block (codes `a`, scale `da`, sum `sa`).
#[device]
#[inline(always)]
pub fn unit_dot<Q: QuantFormat>(u: &Unit, a: &[u32; 8], da: f32, sa: f32) -> f32 {
    let mut s0 = 0i32;
    let mut s1 = 0i32;
    for i in 0..4 {
        s0 = dot4_i8(u.q[i], a[i], s0);
        s1 = dot4_i8(u.q[4 + i], a[4 + i], s1);
    }
    let mut r = if Q::SPLIT { da * (u.c[0] * s0 as f32 + u.c[1] * s1 as f32) } else { u.c[0] * da * (s0 + s1) as f32 };
    if Q::MIN {
        r += u.m * sa;
    }
    if Q::HALF_MIN {
        let (mut t0, mut t1) = (0i32, 0i32);
        for i in 0..4 {
            t0 = dot4_i8(0x0101_0101, a[i], t0);
            t1 = dot4_i8(0x0101_0101, a[4 + i], t1);
        }
        r -= da * (u.n[0] * t0 as f32 + u.n[1] * t1 as f32);
    }
    r
}

/// Dequantizes a whole quantized buffer (`w.len() / BYTES` blocks) into `out`
/// (`blocks * WEIGHTS` elements), one weight per work-item and step.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K], T = [f32, f16, bf16])]
pub fn dequantize<Q: QuantFormat, T: Float>(w: &[u8], out: &mut [T]) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let (blk, j) = (i / Q::WEIGHTS, i % Q::WEIGHTS);
        out[i] = T::from_f32(Q::weight(&w[blk * Q::BYTES..(blk + 1) * Q::BYTES], j));
        i += step;
    }
}

// ---- dequantization in pieces of 8 consecutive weights -----------------------------------

/// Consecutive weights one work-item of [`dequantize_pieces`](fn@dequantize_pieces) and
/// [`get_rows_pieces`](fn@get_rows_pieces) produces per step: one 16-byte store of
/// `f16`/`bf16` (two of `f32`), so consecutive work-items write consecutive 16 bytes.
pub const PIECE: usize = 8;

/// Byte `k` of the little-endian words `w` (`k` a constant after unrolling).
#[device]
#[inline(always)]
pub fn byte_of(w: [u32; 2], k: usize) -> u32 {
    (w[k / 4] >> (8 * (k % 4))) & 0xff
}

/// `w` shifted right by `s` (both words): byte `k` of the result masked to at most `8 - s`
/// bits is that field of byte `k` of `w` (one shift per word, not one per byte, where `s`
/// is not a constant).
#[device]
#[inline(always)]
pub fn shr2(w: [u32; 2], s: u32) -> [u32; 2] {
    [w[0] >> s, w[1] >> s]
}

/// Eight bytes of the block `b` from the even offset `o`: two aligned words where the format
/// keeps its blocks 4-byte aligned (`aligned`), else four 16-bit loads.
#[device]
#[inline(always)]
pub fn rd64(b: &[u8], o: usize, aligned: bool) -> [u32; 2] {
    if aligned { [rd32(b, o), rd32(b, o + 4)] } else { [rd32_2(b, o), rd32_2(b, o + 4)] }
}

/// Scale and minimum `j` (0..8) of the `Q4K`/`Q5K` header `h` (its first 16 bytes as words:
/// `d`, `dmin`, then the 12 bytes of 6-bit scales): [`scale_min_k4`] from registers, with
/// selects instead of an indexed array.
#[device]
#[inline(always)]
pub fn scale_min_k4_words(h: [u32; 4], j: usize) -> (u32, u32) {
    let s = 8 * (j as u32 % 4);
    let (a, c, e) = ((h[1] >> s) & 0xff, (h[2] >> s) & 0xff, (h[3] >> s) & 0xff);
    if j < 4 { (a & 63, c & 63) } else { ((e & 0xf) | ((a >> 6) << 4), (e >> 4) | ((c >> 6) << 4)) }
}

/// The `f16` in the low (`hi = false`) or high half of `w`, widened (as [`rdf16`]).
#[device]
#[inline(always)]
pub fn f16_of(w: u32, hi: bool) -> f32 {
    f16::from_bits((if hi { w >> 16 } else { w & 0xffff }) as u16).to_f32()
}

/// A block format dequantized [`PIECE`] weights at a time.
pub trait Pieces: QuantFormat {
    /// Weights `PIECE p .. PIECE (p + 1)` of the block `b` (exactly `BYTES` long), each
    /// the value [`QuantFormat::weight`] gives (the same float operations in the same order,
    /// so the same bits), with the piece's scales decoded once and its code bytes read as
    /// words.
    fn piece(b: &[u8], p: usize) -> [f32; PIECE];
}

impl Pieces for Q4_0 {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let (q, d) = (shr2(rd64(b, 2 + 8 * (p % 2), false), 4 * (p / 2) as u32), rdf16(b, 0));
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = ((byte_of(q, k) & 0xf) as i32 - 8) as f32 * d;
        }
        v
    }
}

impl Pieces for Q4_1 {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let q = shr2(rd64(b, 4 + 8 * (p % 2), true), 4 * (p / 2) as u32);
        let dm = rd32(b, 0);
        let (d, m) = (f16_of(dm, false), f16_of(dm, true));
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = (byte_of(q, k) & 0xf) as f32 * d + m;
        }
        v
    }
}

/// The 5-bit codes `8p .. 8p + 8` of a `Q5_0`/`Q5_1` block: high bits `qh`, nibbles at byte
/// `qs` ([`q5_high`] per weight: bit `j` of `qh` as 16).
#[device]
#[inline(always)]
pub fn q5_piece(b: &[u8], qh: u32, qs: usize, aligned: bool, p: usize) -> [u32; PIECE] {
    let (q, h) = (shr2(rd64(b, qs + 8 * (p % 2), aligned), 4 * (p / 2) as u32), qh >> (8 * p as u32));
    let mut x = [0u32; PIECE];
    for k in 0..PIECE {
        x[k] = (byte_of(q, k) & 0xf) | (((h >> k) & 1) << 4);
    }
    x
}

impl Pieces for Q5_0 {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let x = q5_piece(b, rd32_2(b, 2), 6, false, p);
        let d = rdf16(b, 0);
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = (x[k] as i32 - 16) as f32 * d;
        }
        v
    }
}

impl Pieces for Q5_1 {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let x = q5_piece(b, rd32(b, 4), 8, true, p);
        let dm = rd32(b, 0);
        let (d, m) = (f16_of(dm, false), f16_of(dm, true));
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = x[k] as f32 * d + m;
        }
        v
    }
}

impl Pieces for Q8_0 {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let (q, d) = (rd64(b, 2 + 8 * p, false), rdf16(b, 0));
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = byte_of(q, k) as u8 as i8 as f32 * d;
        }
        v
    }
}

impl Pieces for Q2K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        // Weight j = 8p + k: n = j / 128, shift = (j % 128) / 32, i = j % 32 (i / 16 fixed).
        let (n, shift, i0) = (p / 16, (p % 16) / 4, 8 * (p % 4));
        let sc = rd8(b, 8 * n + 2 * shift + i0 / 16);
        let q = shr2(rd64(b, 16 + 32 * n + i0, true), 2 * shift as u32);
        let dm = rd32(b, 80);
        let dl = f16_of(dm, false) * (sc & 0xf) as f32;
        let ml = f16_of(dm, true) * (sc >> 4) as f32;
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = dl * (byte_of(q, k) & 3) as f32 - ml;
        }
        v
    }
}

impl Pieces for Q3K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let (n, shift, i0) = (p / 16, (p % 16) / 4, 8 * (p % 4));
        let q = shr2(rd64(b, 32 + 32 * n + i0, false), 2 * shift as u32);
        let hm = shr2(rd64(b, i0, false), (4 * n + shift) as u32);
        let dl = rdf16(b, 108) * (scale_q3k(b, 8 * n + 2 * shift + i0 / 16) as f32 - 32.0);
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            let q2 = byte_of(q, k) & 3;
            let high = byte_of(hm, k) & 1;
            v[k] = dl * (q2 as i32 - if high == 0 { 4 } else { 0 }) as f32;
        }
        v
    }
}

/// `d * sc` and `dmin * m` of sub-block `j` of a `Q4K`/`Q5K` block (its 16-byte header).
#[device]
#[inline(always)]
pub fn k4_factors(b: &[u8], j: usize) -> (f32, f32) {
    let h = rd128(b, 0);
    let (sc, m) = scale_min_k4_words(h, j);
    (f16_of(h[0], false) * sc as f32, f16_of(h[0], true) * m as f32)
}

impl Pieces for Q4K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        // Weight j = 8p + k: g = j / 64, r = j % 64 (r / 32 fixed).
        let (g, r0) = (p / 8, 8 * (p % 8));
        let (d1, m1) = k4_factors(b, 2 * g + r0 / 32);
        let q = shr2(rd64(b, 16 + 32 * g + r0 % 32, true), 4 * (r0 / 32) as u32);
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = d1 * (byte_of(q, k) & 0xf) as f32 - m1;
        }
        v
    }
}

impl Pieces for Q5K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let (g, r0) = (p / 8, 8 * (p % 8));
        let j = 2 * g + r0 / 32;
        let (d1, m1) = k4_factors(b, j);
        let q = shr2(rd64(b, 48 + 32 * g + r0 % 32, true), 4 * (r0 / 32) as u32);
        let qh = shr2(rd64(b, 16 + r0 % 32, true), j as u32);
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            // `ql as f32 + 16.0` is exact, so one conversion of `ql + 16` gives its bits.
            let x = (byte_of(q, k) & 0xf) + ((byte_of(qh, k) & 1) << 4);
            v[k] = d1 * x as f32 - m1;
        }
        v
    }
}

impl Pieces for Q6K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        // Weight j = 8p + k: h = j / 128, grp = (j % 128) / 32, l = j % 32 (l / 16 fixed).
        let (h, grp, l0) = (p / 16, (p % 16) / 4, 8 * (p % 4));
        let ql = shr2(rd64(b, 64 * h + l0 + 32 * (grp % 2), false), 4 * (grp / 2) as u32);
        let qh = shr2(rd64(b, 128 + 32 * h + l0, false), 2 * grp as u32);
        let sc = rd8(b, 192 + 8 * h + l0 / 16 + 2 * grp) as u8 as i8;
        let d1 = rdf16(b, 208) * sc as f32;
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            let q = ((byte_of(ql, k) & 0xf) | ((byte_of(qh, k) & 3) << 4)) as i32 - 32;
            v[k] = d1 * q as f32;
        }
        v
    }
}

impl Pieces for Q8K {
    #[inline(always)]
    fn piece(b: &[u8], p: usize) -> [f32; PIECE] {
        let (q, d) = (rd64(b, 4 + 8 * p, true), f32::from_bits(rd32(b, 0)));
        let mut v = [0.0; PIECE];
        for k in 0..PIECE {
            v[k] = d * byte_of(q, k) as u8 as i8 as f32;
        }
        v
    }
}

/// Writes `v` converted to `T` at `out[o .. o + PIECE]` as one (`f16`/`bf16`) or two (`f32`)
/// 16-byte stores.
///
/// # Safety
/// `out[o .. o + PIECE]` is writable and starts on 16 bytes; `T` is `f32`, `f16` or `bf16`.
#[device]
#[inline(always)]
pub unsafe fn store_piece<T: Float>(out: *mut T, o: usize, v: [f32; PIECE]) {
    let p = unsafe { out.add(o) } as *mut crate::indexing::Words4;
    if core::mem::size_of::<T>() == 4 {
        let mut w = [0u32; PIECE];
        for k in 0..PIECE {
            // SAFETY: a 4-byte T (f32) is its bits.
            w[k] = unsafe { core::mem::transmute_copy::<T, u32>(&T::from_f32(v[k])) };
        }
        // SAFETY: the caller's contract (32 bytes from a 16-byte boundary).
        unsafe {
            st4(p, [w[0], w[1], w[2], w[3]]);
            st4(p.add(1), [w[4], w[5], w[6], w[7]]);
        }
    } else {
        let mut w = [0u32; 4];
        for k in 0..4 {
            let h = T::from_f32x2([v[2 * k], v[2 * k + 1]]);
            // SAFETY: a 2-byte T (f16, bf16) is its bits.
            let (lo, hi) = unsafe { (core::mem::transmute_copy::<T, u16>(&h[0]), core::mem::transmute_copy::<T, u16>(&h[1])) };
            w[k] = lo as u32 | ((hi as u32) << 16);
        }
        // SAFETY: the caller's contract.
        unsafe { st4(p, w) };
    }
}

/// [`dequantize`](fn@dequantize) with [`PIECE`] consecutive weights per work-item and step:
/// the piece's scales decoded once, its code bytes read as words, its outputs written as
/// 16-byte stores (a wave writes `64 x 16` or `32 x 16` consecutive bytes). `out` starts on 16
/// bytes (checked: a misaligned `out` traps) and its length is a multiple of [`PIECE`] (every
/// block is).
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K], T = [f32, f16, bf16])]
pub fn dequantize_pieces<Q: Pieces, T: Float>(w: &[u8], out: &mut [T]) {
    assert!(out.as_ptr() as usize % 16 == 0);
    let pieces = out.len() / PIECE;
    let per_block = Q::WEIGHTS / PIECE;
    let step = global_size_x();
    let mut p = global_idx_x();
    while p < pieces {
        let blk = p / per_block;
        let v = Q::piece(&w[blk * Q::BYTES..(blk + 1) * Q::BYTES], p % per_block);
        // SAFETY: (p + 1) * PIECE <= out.len(); out starts on 16 bytes (checked above) and a
        // piece is 16 or 32 bytes.
        unsafe { store_piece(out.as_mut_ptr(), p * PIECE, v) };
        p += step;
    }
}

/// [`get_rows`](fn@get_rows) in [`PIECE`]s as [`dequantize_pieces`](fn@dequantize_pieces)
/// writes them (`out` on 16 bytes, checked).
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K], T = [f32, f16, bf16])]
pub fn get_rows_pieces<Q: Pieces, T: Float>(w: &[u8], ids: &[u32], out: &mut [T], rows: usize, cols: usize) {
    assert!(out.as_ptr() as usize % 16 == 0 && cols % Q::WEIGHTS == 0);
    let pieces = out.len() / PIECE;
    let (row_pieces, per_block) = (cols / PIECE, Q::WEIGHTS / PIECE);
    let row_bytes = cols / Q::WEIGHTS * Q::BYTES;
    let step = global_size_x();
    let mut p = global_idx_x();
    while p < pieces {
        let (r, k) = (p / row_pieces, p % row_pieces);
        let id = ids[r] as usize;
        let v = if id < rows {
            let o = id * row_bytes + k / per_block * Q::BYTES;
            Q::piece(&w[o..o + Q::BYTES], k % per_block)
        } else {
            [0.0; PIECE]
        };
        // SAFETY: as in `dequantize_pieces` (rows of `cols`, a multiple of PIECE, elements).
        unsafe { store_piece(out.as_mut_ptr(), p * PIECE, v) };
        p += step;
    }
}

/// `out[i, k] = W[ids[i], k]` dequantized (`W` has `rows` rows of `cols` weights; zero rows
/// for ids `>= rows`); `out` holds `ids.len() * cols` elements.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K], T = [f32, f16, bf16])]
pub fn get_rows<Q: QuantFormat, T: Float>(w: &[u8], ids: &[u32], out: &mut [T], rows: usize, cols: usize) {
    let n = out.len();
    let step = global_size_x();
    let row_bytes = cols / Q::WEIGHTS * Q::BYTES;
    let mut i = global_idx_x();
    while i < n {
        let (r, k) = (i / cols, i % cols);
        let id = ids[r] as usize;
        out[i] = if id < rows {
            let (blk, j) = (k / Q::WEIGHTS, k % Q::WEIGHTS);
            let o = id * row_bytes + blk * Q::BYTES;
            T::from_f32(Q::weight(&w[o..o + Q::BYTES], j))
        } else {
            T::from_f32(0.0)
        };
        i += step;
    }
}

/// q8_1 quantization of `x` (a multiple of 32 values): block `k` gets
/// `d = max|x| / 127`, codes `round(x / d)` (0 when `d = 0`) packed four per word into
/// `xq[8k .. 8k + 8]`, and `xds[2k] = d`, `xds[2k + 1] = d * sum(codes)`. One lane per
/// value; the 32 lanes of a block meet through shuffles (wave-uniform loop). It waits for
/// the kernels before it first (`kernel_dsl::grid::wait_prior`), so it may be launched to
/// overlap them, and then lets the kernel after it start.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn quantize_q8_1<T: Float>(x: &[T], xq: &mut [u32], xds: &mut [f32]) {
    // Launched to overlap the kernel before it (which may write `x`): wait for it before
    // any access, then let the matvec after this start its weight copies.
    kernel_dsl::grid::wait_prior();
    kernel_dsl::grid::release_next();
    let n = x.len();
    assert!(n % 32 == 0 && xq.len() >= n / 4 && xds.len() >= n / 16);
    let ws = wave::size() as usize;
    let lane = wave::lane_id() as usize;
    let waves = global_size_x() / ws;
    let mut base = (global_idx_x() / ws) * ws;
    while base < n {
        let i = base + lane;
        let v = if i < n { x[i].to_f32() } else { 0.0 };
        let mut amax = v.abs();
        let mut off = 16;
        while off > 0 {
            amax = amax.max(wave::shuffle_xor(amax, off));
            off /= 2;
        }
        let d = amax / 127.0;
        let q = if d > 0.0 { (v / d).round() as i32 } else { 0 };
        let mut sum = q;
        let mut word = (q as u32) & 0xff;
        let mut off = 16;
        while off > 0 {
            sum += wave::shuffle_xor(sum, off);
            off /= 2;
        }
        word |= (wave::shuffle_xor(word, 1)) << 8;
        word = (word & 0xffff) | (wave::shuffle_xor(word, 2) << 16);
        // No bounds-check branches between this iteration's shuffles and the next: the
        // lengths were checked once above (a trap edge here could keep the lanes of an
        // NVIDIA warp apart at the next shuffle).
        // SAFETY: i < n, n / 4 <= xq.len() and n / 16 <= xds.len() (asserted), and `i` is
        // a multiple of 32 where the scales are written.
        unsafe {
            if i < n && lane % 4 == 0 {
                *xq.as_mut_ptr().add(i / 4) = word;
            }
            if i < n && lane % 32 == 0 {
                *xds.as_mut_ptr().add(i / 16) = d;
                *xds.as_mut_ptr().add(i / 16 + 1) = d * sum as f32;
            }
        }
        base += waves * ws;
    }
}

/// Batch tiles of [`matvec`](fn@matvec): at most `N` activation rows per launch.
pub trait BatchTile: 'static {
    /// Most activation rows.
    const N: usize;
}
/// One activation row (decode).
pub struct Batch1;
impl BatchTile for Batch1 {
    const N: usize = 1;
}
/// Up to 2 activation rows.
pub struct Batch2;
impl BatchTile for Batch2 {
    const N: usize = 2;
}
/// Up to 4 activation rows.
pub struct Batch4;
impl BatchTile for Batch4 {
    const N: usize = 4;
}
/// Up to 8 activation rows, every batch of the matvec in one launch that reads the weights
/// once, on NVIDIA and the CPU executor. In AMD code objects it is a 4-row tile (8-row
/// tiles needed more than gfx9's 102 scalar registers): the launcher runs AMD batches in
/// tiles of at most 4 ([`batch_tile`]).
pub struct Batch8;
impl BatchTile for Batch8 {
    const N: usize = if cfg!(target_arch = "amdgpu") { 4 } else { 8 };
}

/// Most activation rows one [`matvec`](fn@matvec) launch takes: 2 for `Q2K`, `Q3K` and
/// `Q5K` (their wider tiles needed more than gfx9's 102 scalar registers), 4 for the
/// others on AMD GPUs, 8 elsewhere.
pub const fn batch_tile(dtype: GgmlDType, amd: bool) -> usize {
    match dtype {
        GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K => 2,
        _ if amd => 4,
        _ => 8,
    }
}

/// Work-items per work-group of [`matvec`](fn@matvec) on AMD GPUs: 2 or 4 waves, one
/// weight row each.
pub const MATVEC_BLOCK: u32 = 128;

/// Work-items per work-group of [`matvec`](fn@matvec): [`MATVEC_BLOCK`] on AMD GPUs, one
/// wave elsewhere (NVIDIA: a work-group barrier then waits for one warp only, so warps of
/// different rows do not wait for each other between chunks; the CPU executor runs the
/// same shape).
pub const fn matvec_block(amd: bool, wave_lanes: u32) -> u32 {
    if amd { MATVEC_BLOCK } else { wave_lanes }
}

/// 32-weight units per lane in one LDS chunk of [`matvec`](fn@matvec) on AMD GPUs: up to
/// 17 KiB of LDS per work-group would cap a gfx9 compute unit's 64 KiB at a few work-groups.
pub const LANE_UNITS_AMD: usize = 1;
/// 32-weight units per lane in one LDS chunk on NVIDIA and the CPU executor (LDS is
/// plentiful: more bytes in flight per barrier).
pub const LANE_UNITS_OTHER: usize = 4;
/// The most units per lane per chunk the device code of this target handles.
pub const LANE_UNITS: usize = if cfg!(target_arch = "amdgpu") { LANE_UNITS_AMD } else { LANE_UNITS_OTHER };
/// Units per lane decoded and multiplied together (their activation loads in flight at
/// once); a chunk's [`LANE_UNITS`] take `LANE_UNITS / PASS_UNITS` passes.
pub const PASS_UNITS: usize = if LANE_UNITS < 2 { LANE_UNITS } else { 2 };
/// [`matvec`](fn@matvec) loads the activations before decoding the units (batch 1 only:
/// with 8 rows `Q8_0` spilled on sm_90).
pub const HOIST_ACTS: bool = !cfg!(target_arch = "amdgpu");
/// Capacity of the prefetch registers, 16-byte words per lane (`Q8_0` needs 9 for a whole
/// chunk; with 9, its 2- and 8-row tiles spilled on sm_90).
pub const MAX_PREFETCH: usize = 8;

/// 16-byte LDS words [`matvec`](fn@matvec) needs for chunks of `chunk_units` 32-weight
/// units per wave (a multiple of the wave size): one chunk per wave of a work-group of
/// `waves` waves.
pub const fn matvec_lds_words(dtype: GgmlDType, chunk_units: usize, waves: usize) -> usize {
    (waves * chunk_units / (dtype.block_weights() / 32) * dtype.block_bytes()).div_ceil(16)
}

pub use crate::indexing::{ld4, st4};

/// Copies `src` (a chunk of a weight row) to `dst` in LDS with the widest loads both
/// allow: the lanes of a wave take consecutive 16-, 4- or 2-byte words, so each load
/// instruction covers whole cache lines (blocks of 18 or 34 bytes read lane by lane would
/// touch a cache line per lane).
#[device]
#[inline(always)]
pub fn copy_chunk(src: &[u8], dst: *mut u8, lane: usize, step: usize) {
    let n = src.len();
    let sp = src.as_ptr();
    let align = sp as usize | dst as usize | n;
    // SAFETY: every access is inside `src` (i * size + size <= n) and inside `dst`, which
    // the caller sized for `n` bytes; the alignment test covers both pointers and `n`.
    unsafe {
        if align % 16 == 0 {
            let (m, s16, d16) = (n / 16, sp as *const crate::indexing::Words4, dst as *mut crate::indexing::Words4);
            let mut i = lane;
            // Four loads in flight per lane before the stores, word by word through the
            // aligned block type (whole-struct copies went through local memory on NVPTX).
            while i + 3 * step < m {
                let (a, b, c, d) = (ld4(s16.add(i)), ld4(s16.add(i + step)), ld4(s16.add(i + 2 * step)), ld4(s16.add(i + 3 * step)));
                st4(d16.add(i), a);
                st4(d16.add(i + step), b);
                st4(d16.add(i + 2 * step), c);
                st4(d16.add(i + 3 * step), d);
                i += 4 * step;
            }
            while i < m {
                st4(d16.add(i), ld4(s16.add(i)));
                i += step;
            }
        } else if align % 4 == 0 {
            let (m, s4, d4) = (n / 4, sp as *const u32, dst as *mut u32);
            let mut i = lane;
            while i + 3 * step < m {
                let (a, b, c, d) = (*s4.add(i), *s4.add(i + step), *s4.add(i + 2 * step), *s4.add(i + 3 * step));
                *d4.add(i) = a;
                *d4.add(i + step) = b;
                *d4.add(i + 2 * step) = c;
                *d4.add(i + 3 * step) = d;
                i += 4 * step;
            }
            while i < m {
                *d4.add(i) = *s4.add(i);
                i += step;
            }
        } else {
            let mut i = lane;
            while i < n / 2 {
                *(dst.add(2 * i) as *mut u16) = *(sp.add(2 * i) as *const u16);
                i += step;
            }
        }
    }
}

/// `true` when `src` (a chunk of a weight row) and its LDS destination `dst` allow the
/// 16-byte copy of [`chunk_load`] / [`chunk_store`].
#[device]
#[inline(always)]
pub fn chunk_aligned16(src: &[u8], dst: *mut u8) -> bool {
    (src.as_ptr() as usize | dst as usize | src.len()) % 16 == 0
}

/// First half of a chunk copy: this lane's 16-byte words `lane + t * step` (`t < p`, inside
/// `src`) loaded into `pre`, so the loads are in flight while the previous chunk is
/// computed. Only for chunks where [`chunk_aligned16`] holds.
#[device]
#[inline(always)]
pub fn chunk_load(src: &[u8], lane: usize, step: usize, p: usize, pre: &mut [[u32; 4]; MAX_PREFETCH]) {
    let m = src.len() / 16;
    let s16 = src.as_ptr() as *const crate::indexing::Words4;
    each!(t in [0, 1, 2, 3, 4, 5, 6, 7] {
        let i = lane + t * step;
        if t < p && i < m {
            // SAFETY: word i < m lies inside `src`, which starts on 16 bytes (chunk_aligned16).
            pre[t] = unsafe { ld4(s16.add(i)) };
        }
    });
}

/// Second half of a chunk copy: stores what [`chunk_load`] loaded (`aligned`: the chunk is
/// 16-byte aligned and `pre` holds its first `p` words per lane) and copies the rest of
/// `src` directly; unaligned chunks (and every chunk when `p = 0`) are copied whole by
/// [`copy_chunk`].
#[device]
#[inline(always)]
pub fn chunk_store(src: &[u8], dst: *mut u8, lane: usize, step: usize, p: usize, pre: &[[u32; 4]; MAX_PREFETCH], aligned: bool) {
    if !aligned || p == 0 {
        copy_chunk(src, dst, lane, step);
        return;
    }
    let m = src.len() / 16;
    let (s16, d16) = (src.as_ptr() as *const crate::indexing::Words4, dst as *mut crate::indexing::Words4);
    // SAFETY: every word index is below m, inside `src` and inside `dst` (sized by the
    // caller for the chunk); both start on 16 bytes (`aligned`).
    unsafe {
        each!(t in [0, 1, 2, 3, 4, 5, 6, 7] {
            let i = lane + t * step;
            if t < p && i < m {
                st4(d16.add(i), pre[t]);
            }
        });
        let mut i = lane + p * step;
        while i < m {
            st4(d16.add(i), ld4(s16.add(i)));
            i += step;
        }
    }
}

/// The q8_1 block of unit `u` of the activation row whose codes start at word `xq0` of
/// `xq` and whose (scale, sum) pairs start at float `xds0` of `xds`: its 8 code words
/// (two 16-byte loads), scale and sum.
///
/// # Safety
/// Words `xq0 + 8u .. + 8` and floats `xds0 + 2u .. + 2` are inside `xq` / `xds`; `xq`
/// starts on 16 bytes and `xq0` is a multiple of 4 (the launchers check both).
#[device]
#[inline(always)]
pub unsafe fn q8_1_block(xq: &[u32], xds: &[f32], xq0: usize, xds0: usize, u: usize) -> ([u32; 8], f32, f32) {
    // SAFETY: the caller's contract.
    unsafe {
        let p = xq.as_ptr().add(xq0 + 8 * u) as *const crate::indexing::Words4;
        let f = xds.as_ptr().add(xds0 + 2 * u);
        let (lo, hi) = (ld4(p), ld4(p.add(1)));
        ([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]], *f, *f.add(1))
    }
}

/// Codes of a matvec's output element type, the kernels' `out` argument: the kernels sum
/// in `f32` and round once at the store, so a product of `f16`/`bf16` activations needs no
/// cast after it. One code object serves all three (a type parameter would triple the
/// matvec instances); `y` is passed as bytes. Codes other than these store `f32`.
pub const OUT_F32: u32 = 0;
/// `f16` output (rounded to nearest-even), see [`OUT_F32`].
pub const OUT_F16: u32 = 1;
/// `bf16` output (rounded to nearest-even), see [`OUT_F32`].
pub const OUT_BF16: u32 = 2;

/// Bytes of one output element of code `out` ([`OUT_F32`]).
pub const fn out_bytes(out: u32) -> usize {
    if out == OUT_F16 || out == OUT_BF16 {
        2
    } else {
        4
    }
}

/// Stores `v` as element `i` of the output `y` of element code `out` ([`OUT_F32`]).
///
/// # Safety
/// `y` holds at least `(i + 1) * out_bytes(out)` bytes, aligned for the element type.
#[device]
#[inline(always)]
pub unsafe fn store_out(y: *mut u8, i: usize, v: f32, out: u32) {
    if out == OUT_BF16 {
        *(y as *mut bf16).add(i) = bf16::from_f32(v);
    } else if out == OUT_F16 {
        *(y as *mut f16).add(i) = f16::from_f32(v);
    } else {
        *(y as *mut f32).add(i) = v;
    }
}

/// The matvec kernels' body: `y[b * rows + r] = sum_k W[r, k] x[b, k]` for
/// `b < batch <= B::N`, with `x` given as q8_1 (`xq`: `batch * cols / 4` words, `xds`:
/// `batch * cols / 16` floats) and `y` bytes of elements of code `out` ([`OUT_F32`]). Wave `r` of the grid computes row `r`, a chunk of
/// `chunk_units` 32-weight units (a multiple of the wave size, at most [`LANE_UNITS`] per
/// lane) at a time: the wave stores the chunk's blocks to its part of `lds` (loaded into
/// registers with coalesced 16-byte loads while the previous chunk was computed), then each
/// lane decodes its units from LDS once, loads the q8_1 blocks of all its units for one
/// batch row at a time (independent loads, one latency per batch row) and multiplies them
/// with every unit. The weights are read once for the whole batch. All waves of a
/// work-group run the same number of chunks (rows past the end copy and compute nothing)
/// so they can meet at the barriers.
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn matvec_body<Q: QuantFormat, B: BatchTile>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    chunk_units: usize,
    lds: *mut u8,
    lds_bytes: usize,
) {
    let ws = wave::size() as usize;
    let row = global_idx_x() / ws;
    let (xw, xb) = (cols / 4, cols / 16);
    let upb = Q::WEIGHTS / 32;
    let chunk_blocks = chunk_units / upb;
    let chunk_bytes = chunk_blocks * Q::BYTES;
    let region_off = wave::wave_id() as usize * chunk_bytes;
    // Uniform checks that make the unchecked accesses below in bounds: activations for
    // `batch` rows of `cols / 32` units, this wave's LDS region, the lane units.
    assert!(batch <= B::N && B::N <= 8 && xq.len() >= batch * xw && xds.len() >= batch * xb && cols % 32 == 0);
    assert!(LANE_UNITS <= 4 && chunk_units % ws == 0 && chunk_units <= LANE_UNITS * ws && chunk_blocks > 0 && region_off + chunk_bytes <= lds_bytes);
    assert!(Q::PREFETCH <= MAX_PREFETCH);
    assert!(rows.checked_mul(batch).is_some_and(|n| n * out_bytes(out) <= y.len()));
    let active = row < rows;
    let lane = wave::lane_id() as usize;
    let blocks = cols / Q::WEIGHTS;
    let row_bytes = blocks * Q::BYTES;
    let wrow = if active { &w[row * row_bytes..(row + 1) * row_bytes] } else { &w[0..0] };
    // SAFETY: inside the LDS buffer (asserted above).
    let region = unsafe { lds.add(region_off) };
    let chunk_of = |blk0: usize| {
        let nblk = if blocks - blk0 < chunk_blocks { blocks - blk0 } else { chunk_blocks };
        &wrow[blk0 * Q::BYTES..(blk0 + nblk) * Q::BYTES]
    };
    let mut acc = [0f32; 8];
    let mut pre = [[0u32; 4]; MAX_PREFETCH];
    let mut pre_ok = false;
    if Q::PREFETCH > 0 && active {
        let first = chunk_of(0);
        pre_ok = chunk_aligned16(first, region);
        if pre_ok {
            chunk_load(first, lane, ws, Q::PREFETCH, &mut pre);
        }
    }
    let mut blk0 = 0;
    while blk0 < blocks {
        let nblk = if blocks - blk0 < chunk_blocks { blocks - blk0 } else { chunk_blocks };
        if active {
            chunk_store(chunk_of(blk0), region, lane, ws, Q::PREFETCH, &pre, pre_ok);
        }
        barrier();
        let next = blk0 + chunk_blocks;
        if Q::PREFETCH > 0 && active && next < blocks {
            let src = chunk_of(next);
            pre_ok = chunk_aligned16(src, region);
            if pre_ok {
                chunk_load(src, lane, ws, Q::PREFETCH, &mut pre);
            }
        }
        if active {
            // SAFETY: the region holds the chunk's nblk * BYTES bytes (<= chunk_bytes).
            let chunk = unsafe { core::slice::from_raw_parts(region as *const u8, nblk * Q::BYTES) };
            let n_units = nblk * upb;
            let u0 = blk0 * upb;
            // Explicitly unrolled (constant indices keep the units, activations and sums in
            // registers; LLVM left the larger loops rolled, with the arrays in local memory).
            for pass in 0..LANE_UNITS / PASS_UNITS {
                // The q8_1 blocks of batch row `b` for this pass's units (independent loads;
                // units past the chunk load nothing).
                let acts = |b: usize| {
                    let mut a = [[0u32; 8]; 4];
                    let mut ds = [[0f32; 2]; 4];
                    each!(jj in [0, 1, 2, 3] {
                        let k = lane + (pass * PASS_UNITS + jj) * ws;
                        if jj < PASS_UNITS && k < n_units {
                            // SAFETY: b < batch and u0 + k < cols / 32, inside the lengths
                            // asserted above.
                            let (q, d, m) = unsafe { q8_1_block(xq, xds, b * xw, b * xb, u0 + k) };
                            (a[jj], ds[jj]) = (q, [d, m]);
                        }
                    });
                    (a, ds)
                };
                // Batch 1: the activation loads go out before the units are decoded from LDS,
                // so their latency overlaps the decoding ([`HOIST_ACTS`]).
                let hoist = HOIST_ACTS && B::N == 1;
                let first = if hoist { acts(0) } else { ([[0u32; 8]; 4], [[0f32; 2]; 4]) };
                let mut units = [unit1([0; 8], 0.0, 0.0); 4];
                each!(jj in [0, 1, 2, 3] {
                    let k = lane + (pass * PASS_UNITS + jj) * ws;
                    if jj < PASS_UNITS && k < n_units {
                        let blk = k / upb;
                        units[jj] = Q::unit(&chunk[blk * Q::BYTES..(blk + 1) * Q::BYTES], k % upb);
                    }
                });
                each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if b < B::N && b < batch {
                        let (a, ds) = if b == 0 && hoist { first } else { acts(b) };
                        each!(jj in [0, 1, 2, 3] {
                            let k = lane + (pass * PASS_UNITS + jj) * ws;
                            if jj < PASS_UNITS && k < n_units {
                                acc[b] += unit_dot::<Q>(&units[jj], &a[jj], ds[jj][0], ds[jj][1]);
                            }
                        });
                    }
                });
            }
        }
        barrier();
        blk0 = next;
    }
    if active {
        // Every wave sum before any lane-divergent store: on NVIDIA a shuffle after a
        // divergent branch may see only the lanes that reconverged.
        // Unrolled by `each!` (with the two-branch wave operations of NVIDIA, a `for` loop
        // over 8 rows stayed rolled and put the sums in local memory).
        let mut sums = [0f32; 8];
        each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
            if b < B::N && b < batch {
                sums[b] = wave::sum(acc[b]);
            }
        });
        if lane == 0 {
            let yp = y.as_mut_ptr();
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < B::N && b < batch {
                    // SAFETY: b < batch and row < rows: inside `y` (asserted above).
                    unsafe { store_out(yp, b * rows + row, sums[b], out) };
                }
            });
        }
    }
}

/// `y[b * rows + r] = sum_k W[r, k] x[b, k]` for up to `B::N` q8_1 activation rows (see
/// [`matvec_body`]; `y` in the element type of code `out`); `lds` holds
/// [`matvec_lds_words`] words.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q6K], B = [Batch1, Batch2, Batch4, Batch8], max_threads = 128)]
pub fn matvec<Q: QuantFormat, B: BatchTile>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    chunk_units: usize,
    lds: SharedDyn<crate::indexing::Words4>,
) {
    matvec_body::<Q, B>(w, xq, xds, y, out, rows, cols, batch, chunk_units, lds.as_ptr() as *mut u8, lds.len() * 16);
}

/// [`matvec`](fn@matvec) for `Q2K`, `Q3K` and `Q5K`, in tiles of at most 2 activation rows
/// (their 4-row tiles needed more than gfx9's 102 scalar registers).
#[amdgpu_kernel(Q = [Q2K, Q3K, Q5K], B = [Batch1, Batch2], max_threads = 128)]
pub fn matvec_tile2<Q: QuantFormat, B: BatchTile>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    chunk_units: usize,
    lds: SharedDyn<crate::indexing::Words4>,
) {
    matvec_body::<Q, B>(w, xq, xds, y, out, rows, cols, batch, chunk_units, lds.as_ptr() as *mut u8, lds.len() * 16);
}

/// Work-items of one [`matvec_row`](fn@matvec_row) work-group.
pub const ROW_BLOCK: u32 = 128;

/// Most weight bytes one [`matvec_row`](fn@matvec_row) work-group stages in shared memory
/// (its rows; Llama-3-8B's longest row, `Q8_0` with 14336 columns, is 15232 bytes).
pub const ROW_STAGE_BYTES: usize = 16 * 1024;

/// Weight rows one [`matvec_row`](fn@matvec_row) work-group takes for rows of `units`
/// 32-weight units and `row_bytes` bytes: 4, 2 or 1 (each row then has 32, 64 or 128
/// work-items, at least about 4 units each where the row allows), fewer when the rows
/// would not fit [`ROW_STAGE_BYTES`].
pub const fn matvec_row_group(units: usize, row_bytes: usize) -> usize {
    let mut r = if units <= 128 { 4 } else if units <= 256 { 2 } else { 1 };
    while r > 1 && r * row_bytes > ROW_STAGE_BYTES {
        r /= 2;
    }
    r
}

/// 16-byte words of shared memory [`matvec_row`](fn@matvec_row) takes for `group` rows of
/// `row_bytes` (the rows may start anywhere in their first word, and one word is spare).
pub const fn matvec_row_words(row_bytes: usize, group: usize) -> usize {
    (group * row_bytes).div_ceil(16) + 2
}

/// `y[b * rows + r] = sum_k W[r, k] x[b, k]` for `b < batch <= B::N`, with `x` in q8_1 (as
/// [`matvec`](fn@matvec)): work-group `g` takes the `group` adjacent weight rows
/// `g * group ..` ([`matvec_row_group`]). It copies their bytes (contiguous) into shared
/// memory with 16-byte asynchronous copies (`cp.async` on NVIDIA; from the 16-byte
/// boundary at or before their start), so all of them are in flight at once and no
/// registers hold them; then `ROW_BLOCK / group` work-items per row each decode every
/// so-many-th 32-weight unit from shared memory and multiply it with the unit's q8_1
/// activations of each batch row, and the row's work-items sum their products (shuffles,
/// then shared memory across the waves of a row that spans several). Rows of up to
/// [`ROW_STAGE_BYTES`] per work-group; `w` starts on 16 bytes; `lds` holds
/// [`matvec_row_words`] words. Launch with [`ROW_BLOCK`] work-items per work-group and
/// `rows.div_ceil(group)` work-groups. Where launched to overlap the kernel before it
/// (`kernel_dsl::grid`), it issues its copies, then waits for that kernel.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q6K], B = [Batch1, Batch2, Batch4, Batch8], max_threads = 128)]
pub fn matvec_row<Q: QuantFormat, B: BatchTile>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    group: usize,
    lds: SharedDyn<crate::indexing::Words4>,
    mut partials: Shared<f32, 64>,
) {
    let (xw, xb) = (cols / 4, cols / 16);
    let upb = Q::WEIGHTS / 32;
    let blocks = cols / Q::WEIGHTS;
    let row_bytes = blocks * Q::BYTES;
    let n_units = blocks * upb;
    let (tid, threads) = (flat_thread_idx() as usize, flat_block_dim() as usize);
    let lanes = wave::size() as usize;
    let r0 = block_idx_x() as usize * group;
    // Uniform checks that make the unchecked accesses below in bounds.
    let fits = rows.checked_mul(row_bytes).is_some_and(|n| n <= w.len()) && matvec_row_words(row_bytes, group) <= lds.len() && rows.checked_mul(batch).is_some_and(|n| n * out_bytes(out) <= y.len());
    if threads != ROW_BLOCK as usize || !(group == 1 || group == 2 || group == 4) || cols % Q::WEIGHTS != 0 || B::N > 8 || batch > B::N {
        return;
    }
    if !fits || r0 >= rows || xq.len() < batch * xw || xds.len() < batch * xb || w.as_ptr() as usize % 16 != 0 || lanes > threads {
        return;
    }
    // 1. The rows into shared memory; the last word may reach past them (into the next
    // row, or zero-filled past the end of `w`).
    let start = r0 * row_bytes;
    let end = if r0 + group < rows { (r0 + group) * row_bytes } else { rows * row_bytes };
    let first = start & !15;
    let words = (end - first).div_ceil(16);
    let base = kernel_dsl::mma::copy::SharedAddr::new(lds.as_ptr());
    let mut c = tid;
    while c < words {
        let at = first + 16 * c;
        let valid = if w.len() - at < 16 { w.len() - at } else { 16 };
        // SAFETY: word c < words <= matvec_row_words - 1 lies inside `lds`; `at` is 16-byte
        // aligned inside `w` (at < end <= w.len()) with `valid` bytes.
        unsafe { kernel_dsl::mma::copy::copy_16_at(base.add(16 * c), w.as_ptr().add(at), valid as u32) };
        c += threads;
    }
    kernel_dsl::mma::copy::commit();
    // The copies above read only `w`; where launched to overlap the kernel before it
    // (`ops::matvec`: a quantization or a matvec that writes nothing in `w`), wait for it
    // before reading the activations or writing `y`.
    kernel_dsl::grid::wait_prior();
    kernel_dsl::grid::release_next();
    kernel_dsl::mma::copy::wait_groups(0);
    barrier();
    // 2. This work-item's row and its units: part, part + tpr, ... (several per work-item
    // in one loop: their activation loads overlap; computing parts of a row as they land,
    // one unit per work-item each, measured 1.8x slower on the H100).
    let tpr = threads / group;
    let (sub, part) = (tid / tpr, tid % tpr);
    let row = r0 + sub;
    let mut acc = [0f32; 8];
    if row < rows {
        // SAFETY: the rows start at offset start - first of the staged words; row `row`'s
        // row_bytes bytes follow at (row - r0) * row_bytes.
        let staged = unsafe { core::slice::from_raw_parts((lds.as_ptr() as *const u8).add(row * row_bytes - first), row_bytes) };
        let mut k = part;
        while k < n_units {
            let blk = k / upb;
            let unit = Q::unit(&staged[blk * Q::BYTES..(blk + 1) * Q::BYTES], k % upb);
            each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                if b < B::N && b < batch {
                    // SAFETY: b < batch and k < cols / 32, inside the lengths checked above.
                    let (a, da, sa) = unsafe { q8_1_block(xq, xds, b * xw, b * xb, k) };
                    acc[b] += unit_dot::<Q>(&unit, &a, da, sa);
                }
            });
            k += tpr;
        }
    }
    // 3. The row's sums: butterflies inside segments of a row's work-items (or a whole
    // wave), then across the waves of a row that spans several.
    let seg = if tpr < lanes { tpr } else { lanes };
    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
        if b < B::N && b < batch {
            let mut v = acc[b];
            let mut off = seg / 2;
            while off > 0 {
                v += wave::shuffle_xor(v, off as u32);
                off /= 2;
            }
            acc[b] = v;
        }
    });
    if tpr <= lanes {
        if part == 0 && row < rows {
            for b in 0..B::N {
                if b < batch {
                    // SAFETY: b < batch, row < rows: inside y (checked above).
                    unsafe { store_out(y.as_mut_ptr(), b * rows + row, acc[b], out) };
                }
            }
        }
    } else {
        // Rows of several waves: each wave's sums, then work-item `b` of the row adds its
        // waves' in order for batch row `b`.
        let (wv, nw, wpr) = (tid / lanes, threads / lanes, tpr / lanes);
        if tid % lanes == 0 {
            for b in 0..B::N {
                if b < batch {
                    partials[(b * nw + wv) % 64] = acc[b];
                }
            }
        }
        barrier();
        if part < batch && row < rows {
            let mut t = 0.0f32;
            for v in 0..wpr {
                t += partials[(part * nw + sub * wpr + v) % 64];
            }
            // SAFETY: part < batch, row < rows: inside y (checked above).
            unsafe { store_out(y.as_mut_ptr(), part * rows + row, t, out) };
        }
    }
}

/// Work-items of one [`matvec_stream`](fn@matvec_stream) work-group.
pub const STREAM_BLOCK: u32 = 128;
/// Shared-memory stages the [`matvec_stream`](fn@matvec_stream) launcher gives every
/// format: one being computed, one in flight. H100, weights read from DRAM
/// (`bench-quantized --sweep-stages`): faster than 3 stages on all 16 Llama-3-8B shapes of
/// `Q4_0`, `Q8_0`, `Q4K` and `Q6K` (by 0.7-2% on the 128256-row head, 2-10% on the FFN
/// shapes, 4-16% at 4096x4096) and than 4.
pub const STREAM_STAGES: usize = 2;
/// Fewest stages [`matvec_stream`](fn@matvec_stream) takes (one in flight).
pub const MIN_STREAM_STAGES: usize = 2;
/// Most stages [`matvec_stream`](fn@matvec_stream) takes (three in flight).
pub const MAX_STREAM_STAGES: usize = 4;
/// Activation units (32 weights each) a work-item of [`matvec_stream`](fn@matvec_stream)
/// holds in registers: rows of up to `4 * STREAM_BLOCK` units (16384 columns).
pub const STREAM_UNITS: usize = 4;
/// Most bytes of one [`matvec_stream`](fn@matvec_stream) stage (its rows of one step).
pub const STREAM_STAGE_BYTES: usize = 16 * 1024;
/// Work-groups per compute unit (SM) the [`matvec_stream`](fn@matvec_stream) launcher
/// starts for `dtype` with stages of `lds_bytes` in all (a matvec chained after another on
/// CUDA takes instead as many as the driver says the loaded code keeps resident:
/// `LaunchConfig::resident_grid`), so that all of them are resident at once, from the
/// registers ptxas gives each instance of the sm_80 PTX on sm_90 (64K per SM): 6 at up to
/// 80 per work-item (`Q4_0`, `Q4_1`, `Q8_0`), 5 at up to 96 (`Q5_0`, `Q5_1`, `Q4K`); `Q6K`
/// (80 registers since it reads runs of 4 units, [`QuantFormat::RUN`]; 127 before) at 4:
/// on the H200 (`bench-quantized --sweep-stages`) within 1-3% of its best grid at every
/// Llama-3-8B decode shape, 6 as fast only on the largest (the activations every
/// work-group loads first cost the small shapes more at more work-groups). `Q4K` at 5
/// rather than 4: on the H100, matvecs chained on the same activations (`ops::matvec`)
/// 6-9% faster at the FFN shapes (`bench-quantized --sweep-chain`). Fewer where 228 KiB of
/// shared memory per SM holds fewer (none of the Llama-3-8B shapes with [`STREAM_STAGES`]
/// stages). A grid that is not all resident is still correct, only slower (a second
/// partial round of work-groups).
pub const fn stream_groups_per_cu(dtype: GgmlDType, lds_bytes: usize) -> usize {
    let by_regs = match dtype {
        GgmlDType::Q6K => 4,
        GgmlDType::Q4K | GgmlDType::Q5_0 | GgmlDType::Q5_1 => 5,
        _ => 6,
    };
    let by_lds = 228 * 1024 / (lds_bytes + 1024);
    let n = if by_lds < by_regs { by_lds } else { by_regs };
    if n < 1 {
        1
    } else {
        n
    }
}

/// Weight rows [`matvec_stream`](fn@matvec_stream) computes side by side in one step
/// (1, 2 or 4), for rows of `units` 32-weight units and `row_bytes` bytes on waves of
/// `lanes`: as many as keep each row's share of the work-group (`STREAM_BLOCK / per_step`
/// work-items, a whole number of waves) at most [`STREAM_UNITS`] units per work-item and
/// the step's rows within [`STREAM_STAGE_BYTES`]; 0 when one row does not fit.
pub const fn stream_per_step(units: usize, row_bytes: usize, lanes: usize) -> usize {
    let mut p = 4;
    while p >= 1 {
        let team = STREAM_BLOCK as usize / p;
        if team >= lanes && units <= STREAM_UNITS * team && p * row_bytes <= STREAM_STAGE_BYTES {
            return p;
        }
        p /= 2;
    }
    0
}

/// 16-byte words of one [`matvec_stream`](fn@matvec_stream) stage: `per_step` rows of
/// `row_bytes` from the 16-byte boundary at or before their start.
pub const fn stream_stage_words(row_bytes: usize, per_step: usize) -> usize {
    (per_step * row_bytes).div_ceil(16) + 1
}

/// Row geometry of the streaming matvecs ([`matvec_stream`](fn@matvec_stream),
/// [`matvec_stream_batch`](fn@matvec_stream_batch)) for format `Q`.
#[derive(Clone, Copy)]
struct StreamRows {
    /// 32-weight units per block.
    upb: usize,
    /// Bytes of one weight row.
    row_bytes: usize,
    /// 32-weight units of one row.
    units: u32,
    /// Work-items per row (`team`, a power of two) as a shift: `tid >> team_shift` is a
    /// work-item's row within a step.
    team_shift: u32,
    /// Waves per row.
    waves_per_row: usize,
    /// 16-byte words of one stage.
    stage_words: usize,
}

/// [`StreamRows`] for rows of `cols` columns in steps of `per_step` rows (a power of two,
/// checked by the kernels) in work-groups of `1 << block_shift` work-items on waves of
/// `lanes`.
#[device]
#[inline(always)]
fn stream_rows<Q: QuantFormat>(cols: usize, per_step: usize, block_shift: u32, lanes: u32) -> StreamRows {
    let upb = Q::WEIGHTS / 32;
    let blocks = cols / Q::WEIGHTS;
    let row_bytes = blocks * Q::BYTES;
    let steps_shift = if per_step == 0 { 0 } else { per_step.trailing_zeros().min(block_shift - 5) };
    let team_shift = block_shift - steps_shift;
    StreamRows {
        upb,
        row_bytes,
        units: (blocks * upb) as u32,
        team_shift,
        waves_per_row: ((1u32 << team_shift) / lanes.max(1)) as usize,
        stage_words: stream_stage_words(row_bytes, per_step),
    }
}

/// Issues the copies of step `s` of a streaming matvec ([`matvec_stream`](fn@matvec_stream),
/// [`matvec_stream_batch`](fn@matvec_stream_batch)) into stage `stage`: the step's rows
/// (`per_step` adjacent rows from `rows_at.0 + s * rows_at.1`, fewer at the end) from their
/// 16-byte boundary, the last word possibly reaching past them (into the next row, or
/// zero-filled past the end of `w`); then closes a copy group (empty past the last of
/// `steps` steps). `team` is (this work-item, work-items of the work-group).
#[device]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn stream_issue(w: &[u8], rows: usize, row_bytes: usize, per_step: usize, steps: usize, rows_at: (u32, u32), base: kernel_dsl::mma::copy::SharedAddr, stage_bytes: u32, team: (u32, u32), s: u32, stage: u32) {
    let (tid, threads) = team;
    if (s as usize) < steps {
        let ra = rows_at.0 + s * rows_at.1;
        let n = if rows as u32 - ra < per_step as u32 {
            rows as u32 - ra
        } else {
            per_step as u32
        };
        let start = ra as usize * row_bytes;
        let (first, lead) = (start & !15, (start & 15) as u32);
        let words = (n * row_bytes as u32 + lead).div_ceil(16);
        let room = w.len() - first;
        let tail = if room < 16 * words as usize {
            room as u32
        } else {
            16 * words
        };
        // `first + tail <= w.len()` and `first` is 16-byte aligned inside `w`; word
        // c < words < stage_words lies inside this stage of `lds`. Whole words first
        // (no size operand), then the few at the end of `w` (zero-filled). The pointers
        // advance with wrapping arithmetic and are dereferenced only below those bounds.
        let mut src = w.as_ptr().wrapping_add(first + 16 * tid as usize);
        let mut dst = base.add((stage * stage_bytes + 16 * tid) as usize);
        let mut c = tid;
        while c < tail / 16 {
            // SAFETY: 16 bytes of `w` at `src` (c < tail / 16), into the stage (above).
            unsafe { kernel_dsl::mma::copy::copy_16_whole_at(dst, src) };
            c += threads;
            src = src.wrapping_add(16 * threads as usize);
            dst = dst.add(16 * threads as usize);
        }
        while c < words {
            let left = tail.saturating_sub(16 * c);
            // SAFETY: `left` (at most 16) bytes of `w` at `src`, zero-filled to 16.
            unsafe { kernel_dsl::mma::copy::copy_16_at(dst, src, if left < 16 { left } else { 16 }) };
            c += threads;
            src = src.wrapping_add(16 * threads as usize);
            dst = dst.add(16 * threads as usize);
        }
    }
    kernel_dsl::mma::copy::commit();
}

/// `y[r] = sum_k W[r, k] x[k]` for one q8_1 activation row (decode), streaming the weight
/// rows through shared memory. The rows go in steps of `per_step` adjacent rows
/// ([`stream_per_step`]); work-group `g` of `G` takes steps `g, g + G, g + 2G, ...` (a grid
/// that stays resident: every work-group starts at once and they end together). Each
/// step's rows are copied (contiguous, 16-byte asynchronous copies: `cp.async` on NVIDIA)
/// into one of `stages` shared stages (2..=4) `stages - 1` steps ahead, so weight bytes
/// stay in flight while a step is computed; one barrier per step. Each row is shared by
/// `team = STREAM_BLOCK / per_step` work-items, and work-item `j` of a row always takes the
/// runs of [`QuantFormat::RUN`] consecutive units `j, j + team, ...` (at most
/// [`STREAM_UNITS`] units), so it loads their q8_1 activations into registers once for all
/// its rows (runs of several units through the last stage, where the row's codes fit). A row's products are summed per wave (shuffles); a row
/// of one wave is written by it, the waves' sums of a wider row go through `partials` and
/// are added in a fixed order after the next barrier. `lds` holds
/// `stages * stream_stage_words(row_bytes, per_step)` words; `w` starts on 16 bytes.
/// Launch with [`STREAM_BLOCK`] work-items per work-group. Where launched to overlap the
/// kernel before it (`kernel_dsl::grid`), it issues its first steps' copies, then waits for
/// that kernel before it reads the activations.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q6K], max_threads = 128)]
pub fn matvec_stream<Q: QuantFormat>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    per_step: usize,
    stages: usize,
    lds: SharedDyn<crate::indexing::Words4>,
    mut partials: Shared<f32, 8>,
) {
    let tid = flat_thread_idx();
    let lanes = wave::size();
    let threads = STREAM_BLOCK;
    let StreamRows { upb, row_bytes, units, team_shift, waves_per_row, stage_words } = stream_rows::<Q>(cols, per_step, STREAM_BLOCK.trailing_zeros(), lanes);
    let team = 1u32 << team_shift;
    // Uniform checks that make the unchecked accesses below in bounds.
    let shape_ok = flat_block_dim() == threads
        && (per_step == 1 || per_step == 2 || per_step == 4)
        && (MIN_STREAM_STAGES..=MAX_STREAM_STAGES).contains(&stages)
        && team >= lanes
        && cols % Q::WEIGHTS == 0;
    let sizes_ok = units <= STREAM_UNITS as u32 * team
        && per_step * waves_per_row <= 4
        && stages * stage_words <= lds.len();
    let data_ok = rows.checked_mul(row_bytes).is_some_and(|n| n <= w.len())
        && rows <= (u32::MAX - 256) as usize
        && rows * out_bytes(out) <= y.len()
        && xq.len() >= cols / 4
        && xds.len() >= cols / 16
        && w.as_ptr() as usize % 16 == 0;
    let (g, groups) = (block_idx_x() as usize, grid_dim_x() as usize);
    let total = rows.div_ceil(per_step);
    if !(shape_ok && sizes_ok && data_ok) || g >= total {
        return;
    }
    // This work-group's steps: g, g + groups, ... (row indices fit 32 bits: launcher).
    let steps = (total - 1 - g) / groups + 1;
    let (g32, stride) = ((g * per_step) as u32, (groups * per_step) as u32);
    let row_of = |s: u32| g32 + s * stride;
    let row_bytes32 = row_bytes as u32;
    let stage_bytes = (stage_words * 16) as u32;
    let base = kernel_dsl::mma::copy::SharedAddr::new(lds.as_ptr());
    // Byte offset in `w` of the 16-byte boundary at or before row `r`, and the row's
    // distance from it.
    let first_of = |r: u32| {
        let start = r as usize * row_bytes;
        (start & !15, (start & 15) as u32)
    };
    let issue = |s: u32, stage: u32| stream_issue(w, rows, row_bytes, per_step, steps, (g32, stride), base, stage_bytes, (tid, threads), s, stage);
    // Steps 0 .. stages - 1 in flight before the first is computed.
    let stages32 = stages as u32;
    let mut p = 0u32;
    while p + 1 < stages32 {
        issue(p, p);
        p += 1;
    }
    // The copies above read only `w`. `ops::matvec` lets this kernel overlap only the
    // activations' quantization, which starts it after its own wait for every kernel
    // before it: no running kernel writes `w`, but the quantization may still be writing
    // the activations (`LaunchConfig::overlapping_prior`).
    kernel_dsl::grid::wait_prior();
    kernel_dsl::grid::release_next();
    // This work-item's units of every row, and their activations (loaded once).
    let (sub, j) = ((tid >> team_shift) as usize, tid & (team - 1));
    // Unit `i` (< STREAM_UNITS) of this work-item: runs of `Q::RUN` consecutive units,
    // run `i / RUN` the `(j + (i / RUN) team)`-th of the row.
    let run = Q::RUN as u32;
    let unit_of = |i: usize| run * (j + (i as u32 / run) * team) + i as u32 % run;
    let mut act = [[0u32; 8]; STREAM_UNITS];
    let mut ds = [[0f32; 2]; STREAM_UNITS];
    // Runs (RUN > 1) loaded from `xq` directly would touch a cache line per lane (a run's
    // codes are RUN * 32 consecutive bytes): where they fit, the work-group first copies
    // the row's codes, coalesced, to the stage no copy is in flight to yet (the last; its
    // first copy is issued after the loop's first barrier), in 16-byte chunks swizzled
    // (chunk `c` of each 128 bytes at `c ^ segment % 8`) so that the lanes' reads of their
    // runs meet no bank conflicts.
    let via_lds = Q::RUN > 1 && units % 4 == 0 && 32 * units <= stage_bytes;
    let acts_at = ((stages32 - 1) * stage_bytes) as usize;
    let swizzle = |c: u32| (c ^ ((c >> 3) & 7)) as usize;
    if via_lds {
        let mut c = tid;
        while c < 2 * units {
            // SAFETY: chunk c < 2 units = cols / 16: words 4c .. 4c + 4 of `xq` (checked
            // above; `xq` starts on 16 bytes: launcher). The swizzle stays inside the
            // chunk's 128 bytes (2 units is a multiple of 8 chunks), inside the last stage
            // (32 units <= its bytes), which starts on 16 bytes.
            unsafe {
                let v = ld4(xq.as_ptr().add(4 * c as usize) as *const crate::indexing::Words4);
                st4((lds.as_ptr() as *mut u8).add(acts_at + 16 * swizzle(c)) as *mut crate::indexing::Words4, v);
            }
            c += threads;
        }
        barrier();
    }
    each!(i in [0, 1, 2, 3] {
        let k = unit_of(i);
        if i < STREAM_UNITS && k < units {
            if via_lds {
                // SAFETY: chunks 2k, 2k + 1 written above (k < units); floats 2k, 2k + 1
                // of `xds` (checked above).
                unsafe {
                    let p = (lds.as_ptr() as *const u8).add(acts_at);
                    let lo = ld4(p.add(16 * swizzle(2 * k)) as *const crate::indexing::Words4);
                    let hi = ld4(p.add(16 * swizzle(2 * k + 1)) as *const crate::indexing::Words4);
                    act[i] = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
                    let f = xds.as_ptr().add(2 * k as usize);
                    ds[i] = [*f, *f.add(1)];
                }
            } else {
                // SAFETY: k < cols / 32, inside the lengths checked above.
                let (q, d, m) = unsafe { q8_1_block(xq, xds, 0, 0, k as usize) };
                (act[i], ds[i]) = (q, [d, m]);
            }
        }
    });
    let wave_in_row = (j / lanes) as usize;
    let yp = y.as_mut_ptr();
    // Rows of several waves: work-item `r < per_step` adds the waves' sums of row `r` of
    // step `s` (written to partial slots `s % 2` before the barrier that precedes this).
    let flush = |s: u32, partials: &Shared<f32, 8>| {
        let r = row_of(s) + tid;
        if waves_per_row > 1 && (tid as usize) < per_step && (r as usize) < rows {
            let mut v = 0f32;
            for q in 0..waves_per_row {
                v += partials[((s as usize % 2) * 4 + tid as usize * waves_per_row + q) % 8];
            }
            // SAFETY: r < rows: inside y (checked above).
            unsafe { store_out(yp, r as usize, v, out) };
        }
    };
    // Stage of the step being computed, and of the step `stages - 1` ahead.
    let (mut stage, mut ahead) = (0u32, stages32 - 1);
    let mut s = 0u32;
    while (s as usize) < steps {
        kernel_dsl::mma::copy::wait_groups(stages32 - 2);
        barrier();
        if s > 0 {
            flush(s - 1, &partials);
        }
        issue(s + stages32 - 1, ahead);
        let row = row_of(s) + sub as u32;
        let mut acc = 0f32;
        if (row as usize) < rows {
            let lead = first_of(row_of(s)).1 + sub as u32 * row_bytes32;
            let off = (stage * stage_bytes + lead) as usize;
            // SAFETY: the stage holds the step's rows from their 16-byte boundary on
            // (copied and waited for above); row `row`'s row_bytes bytes lie inside it
            // from `lead` on. A stage is whole 16-byte words of `lds`.
            let (whole, staged) = unsafe {
                let p = lds.as_ptr() as *const u8;
                (core::slice::from_raw_parts(p.add((stage * stage_bytes) as usize), stage_bytes as usize), core::slice::from_raw_parts(p.add(off), row_bytes))
            };
            // A run's units lie in one block (RUN divides the units of a block) and are all
            // inside the row or all past it (so are whole blocks): one branch per run, and
            // the bytes its units share are loaded once.
            each!(i in [0, 1, 2, 3] {
                let k0 = unit_of(i);
                if i < STREAM_UNITS && i % Q::RUN == 0 && k0 < units {
                    let blk = k0 as usize / upb;
                    each!(r in [0, 1, 2, 3] {
                        if r < Q::RUN && i + r < STREAM_UNITS {
                            // i + r < STREAM_UNITS: the modulo only keeps the constant index
                            // of the instances this branch removes in bounds.
                            let ir = (i + r) % STREAM_UNITS;
                            let u = k0 as usize % upb + r;
                            let unit = if Q::STAGE_READS {
                                // SAFETY: `whole` starts on 16 bytes and holds whole words.
                                unsafe { Q::unit_at(whole, lead as usize + blk * Q::BYTES, u) }
                            } else {
                                Q::unit(&staged[blk * Q::BYTES..(blk + 1) * Q::BYTES], u)
                            };
                            acc += unit_dot::<Q>(&unit, &act[ir], ds[ir][0], ds[ir][1]);
                        }
                    });
                }
            });
        }
        let total = wave::sum(acc);
        if wave::lane_id() == 0 && (row as usize) < rows {
            if waves_per_row == 1 {
                // SAFETY: row < rows: inside y (checked above).
                unsafe { store_out(yp, row as usize, total, out) };
            } else {
                partials[((s as usize % 2) * 4 + sub * waves_per_row + wave_in_row) % 8] = total;
            }
        }
        let last = stages32 - 1;
        stage = if stage == last { 0 } else { stage + 1 };
        ahead = if ahead == last { 0 } else { ahead + 1 };
        s += 1;
    }
    barrier();
    flush(steps as u32 - 1, &partials);
}

/// Work-items of one [`matvec_stream_batch`](fn@matvec_stream_batch) work-group.
pub const BATCH_BLOCK: u32 = 512;
/// Shared-memory stages [`matvec_stream_batch`](fn@matvec_stream_batch) cycles through: one
/// being computed, three in flight (one work-group per SM has to keep enough bytes moving).
pub const BATCH_STAGES: usize = 4;
/// Most bytes of one [`matvec_stream_batch`](fn@matvec_stream_batch) stage: twice
/// [`STREAM_STAGE_BYTES`] (its single work-group per SM has the shared memory), so steps of
/// short rows keep every work-item busy (`Q8_0` rows of 4096 columns: 4 per step); less
/// where a work-group gets less shared memory ([`batch_stage_bytes`]).
pub const BATCH_STAGE_BYTES: usize = 32 * 1024;

/// Stage bytes [`matvec_stream_batch`](fn@matvec_stream_batch) uses on a device that gives
/// a work-group `max_shared` bytes of shared memory: [`BATCH_STAGE_BYTES`], or what
/// [`BATCH_STAGES`] stages leave of it beside 2 KiB (static shared memory and a row's lead).
pub const fn batch_stage_bytes(max_shared: usize) -> usize {
    let fit = max_shared.saturating_sub(2048) / BATCH_STAGES;
    if fit < BATCH_STAGE_BYTES {
        fit
    } else {
        BATCH_STAGE_BYTES
    }
}

/// Most unit-rows (a 32-weight unit's q8_1 activations of one activation row, 10
/// registers) a work-item of [`matvec_stream_batch`](fn@matvec_stream_batch) holds.
pub const BATCH_UNIT_ROWS: usize = 8;

/// Units a work-item of [`matvec_stream_batch`](fn@matvec_stream_batch) holds for a batch
/// tile of `n` rows of `dtype` in the code objects of an AMD GPU (`amd`) or another target:
/// 2 for tiles of 2 and, except on AMD GPUs (gfx90a then used scratch), for `Q4_0` tiles
/// of 4; else 1. H100 (`bench-quantized --sweep`): `Q4_0` at batch 4 took 0.80-0.91 of the time with 2 units
/// than with 1. More units elsewhere (4 at batch 2, 2 at batch 4 for `Q8_0`) gained up to
/// 18% at 4096x14336 but lost 3-9% on rows of 4096 columns, and `Q4K`/`Q6K` then spilled
/// on sm_90 under the 128 registers of 512 work-items.
pub const fn batch_held(dtype: GgmlDType, n: usize, amd: bool) -> usize {
    if n <= 2 || (n <= 4 && !amd && matches!(dtype, GgmlDType::Q4_0)) {
        2
    } else {
        1
    }
}

/// Weight rows [`matvec_stream_batch`](fn@matvec_stream_batch) computes side by side for a
/// batch tile of `n` (2, 4 or 8) activation rows of `dtype` on an AMD GPU (`amd`) or
/// another target: as [`stream_per_step`] with
/// [`BATCH_BLOCK`] work-items, [`batch_held`] units per work-item and stages of at most
/// `stage_bytes` (1, 2, 4 or 8 rows per step); 0 when one row does not fit.
pub const fn stream_batch_per_step(dtype: GgmlDType, units: usize, row_bytes: usize, lanes: usize, n: usize, stage_bytes: usize, amd: bool) -> usize {
    let held = batch_held(dtype, n, amd);
    let mut p = 8;
    while p >= 1 {
        let team = BATCH_BLOCK as usize / p;
        if team >= lanes && units <= held * team && p * row_bytes <= stage_bytes {
            return p;
        }
        p /= 2;
    }
    0
}

/// [`matvec_stream`](fn@matvec_stream) for `batch` (2..=`B::N`) q8_1 activation rows:
/// `y[b * rows + r] = sum_k W[r, k] x[b, k]`. Work-groups of [`BATCH_BLOCK`] work-items (one
/// per SM) stream the weight rows through [`BATCH_STAGES`] shared stages in steps of
/// `per_step` rows ([`stream_batch_per_step`]), so every weight byte is read once for the
/// whole batch. Work-item `j` of a row's team always takes units `j, j + team, ...` and
/// holds their activations of every batch row in registers (`B::N` times [`batch_held`]
/// unit-rows). Each wave sums its `B::N` products per row in one
/// transposed butterfly (each exchange halves the values a lane holds, so lane `l` ends
/// with batch row `l / (lanes / B::N)`'s sum: `log2(lanes)` exchanges plus `B::N - 1`, not
/// `B::N log2(lanes)`); a row of one wave is written by it, the waves' sums of a wider row go
/// through `partials` and are added in a fixed order after the next barrier. `lds` holds
/// `BATCH_STAGES * stream_stage_words(row_bytes, per_step)` words; `w` starts on 16 bytes.
/// Launch with [`BATCH_BLOCK`] work-items per work-group.
#[amdgpu_kernel(Q = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q6K], B = [Batch2, Batch4, Batch8], max_threads = 512)]
pub fn matvec_stream_batch<Q: QuantFormat, B: BatchTile>(
    w: &[u8],
    xq: &[u32],
    xds: &[f32],
    y: &mut [u8],
    out: u32,
    rows: usize,
    cols: usize,
    batch: usize,
    per_step: usize,
    lds: SharedDyn<crate::indexing::Words4>,
    mut partials: Shared<f32, 256>,
) {
    let n = B::N;
    let held = batch_held(Q::DTYPE, n, cfg!(target_arch = "amdgpu"));
    let (xw, xb) = (cols / 4, cols / 16);
    let tid = flat_thread_idx();
    let lanes = wave::size();
    let threads = BATCH_BLOCK;
    let StreamRows { upb, row_bytes, units, team_shift, waves_per_row, stage_words } = stream_rows::<Q>(cols, per_step, BATCH_BLOCK.trailing_zeros(), lanes);
    let team = 1u32 << team_shift;
    // Uniform checks that make the unchecked accesses below in bounds.
    let shape_ok = flat_block_dim() == threads
        && (per_step == 1 || per_step == 2 || per_step == 4 || per_step == 8)
        && team >= lanes
        && lanes >= 8
        && cols % Q::WEIGHTS == 0
        && (2..=n).contains(&batch)
        && n <= 8;
    let sizes_ok = units <= held as u32 * team
        && per_step * waves_per_row * n <= 128
        && BATCH_STAGES * stage_words <= lds.len();
    let data_ok = rows.checked_mul(row_bytes).is_some_and(|n| n <= w.len())
        && rows <= (u32::MAX - 1024) as usize
        && rows.checked_mul(batch).is_some_and(|n| n * out_bytes(out) <= y.len())
        && xq.len() >= batch * xw
        && xds.len() >= batch * xb
        && w.as_ptr() as usize % 16 == 0;
    let (g, groups) = (block_idx_x() as usize, grid_dim_x() as usize);
    let total = rows.div_ceil(per_step);
    if !(shape_ok && sizes_ok && data_ok) || g >= total {
        return;
    }
    // This work-group's steps: g, g + groups, ... (row indices fit 32 bits: launcher).
    let steps = (total - 1 - g) / groups + 1;
    let (g32, stride) = ((g * per_step) as u32, (groups * per_step) as u32);
    let row_of = |s: u32| g32 + s * stride;
    let stage_bytes = (stage_words * 16) as u32;
    let base = kernel_dsl::mma::copy::SharedAddr::new(lds.as_ptr());
    let issue = |s: u32, stage: u32| stream_issue(w, rows, row_bytes, per_step, steps, (g32, stride), base, stage_bytes, (tid, threads), s, stage);
    issue(0, 0);
    issue(1, 1);
    issue(2, 2);
    // As in `matvec_stream`: the copies read only `w`; the activations may still be being
    // written by the quantization this kernel overlaps (`ops::matvec`).
    kernel_dsl::grid::wait_prior();
    kernel_dsl::grid::release_next();
    // This work-item's units of every row, and their activations of every batch row
    // (unit-row `i`: unit `i / n`, batch row `i % n`), loaded once.
    let (sub, j) = ((tid >> team_shift) as usize, tid & (team - 1));
    let mut act = [[0u32; 8]; BATCH_UNIT_ROWS];
    let mut ds = [[0f32; 2]; BATCH_UNIT_ROWS];
    each!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
        let k = j + (i / n) as u32 * team;
        if i < BATCH_UNIT_ROWS && i / n < held && i % n < batch && k < units {
            // SAFETY: batch row i % n < batch and k < cols / 32: inside the lengths checked above.
            let (q, d, m) = unsafe { q8_1_block(xq, xds, (i % n) * xw, (i % n) * xb, k as usize) };
            (act[i], ds[i]) = (q, [d, m]);
        }
    });
    let lane = wave::lane_id();
    let wave_in_row = (j / lanes) as usize;
    // After the butterfly, lanes `l` with `l % span == 0` hold batch row `l / span`'s sum.
    let span = lanes / n as u32;
    let yp = y.as_mut_ptr();
    // Rows of several waves: slot `t = (r * n + b) * waves_per_row + q` of step `s` holds
    // wave `q`'s sum of row `r`, batch row `b` (partial slots `s % 2`, written before the
    // barrier that precedes this). Work-item `t` loads slot `t`, and each segment of
    // `waves_per_row` lanes adds its slots in a fixed butterfly; its first lane writes.
    let cells = per_step * n * waves_per_row;
    let flush = |s: u32, partials: &Shared<f32, 256>| {
        let t = tid as usize;
        if waves_per_row > 1 && (t - t % lanes as usize) < cells {
            let mut v = if t < cells { partials[((s as usize % 2) * 128 + t) % 256] } else { 0.0 };
            let mut off = waves_per_row as u32 / 2;
            while off > 0 {
                v += wave::shuffle_xor(v, off);
                off /= 2;
            }
            let (r, b) = ((t / waves_per_row) / n, (t / waves_per_row) % n);
            let row = row_of(s) as usize + r;
            if t < cells && t % waves_per_row == 0 && b < batch && row < rows {
                // SAFETY: b < batch, row < rows: inside y (checked above).
                unsafe { store_out(yp, b * rows + row, v, out) };
            }
        }
    };
    let (mut stage, mut ahead) = (0u32, 3u32);
    let mut s = 0u32;
    while (s as usize) < steps {
        kernel_dsl::mma::copy::wait_groups(2);
        barrier();
        if s > 0 {
            flush(s - 1, &partials);
        }
        issue(s + 3, ahead);
        let row = row_of(s) + sub as u32;
        let mut acc = [0f32; 8];
        if (row as usize) < rows {
            let off = (stage * stage_bytes + ((row_of(s) as usize * row_bytes) & 15) as u32) as usize + sub * row_bytes;
            // SAFETY: the stage holds the step's rows from their 16-byte boundary on
            // (copied and waited for above); row `row`'s row_bytes bytes lie inside it.
            let staged = unsafe { core::slice::from_raw_parts((lds.as_ptr() as *const u8).add(off), row_bytes) };
            each!(u in [0, 1, 2, 3, 4, 5, 6, 7] {
                let k = j + u as u32 * team;
                if u < held && k < units {
                    let blk = k as usize / upb;
                    // SAFETY: k < units, so block blk < blocks lies inside the row's
                    // row_bytes = blocks * BYTES staged bytes.
                    let unit = Q::unit(unsafe { staged.get_unchecked(blk * Q::BYTES..(blk + 1) * Q::BYTES) }, k as usize % upb);
                    // Every row of the tile, without a branch per row: the activations of
                    // rows past `batch` are zeros and their sums are not written.
                    each!(b in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if b < n && u * n + b < BATCH_UNIT_ROWS {
                            let i = u * n + b;
                            acc[b] += unit_dot::<Q>(&unit, &act[i], ds[i][0], ds[i][1]);
                        }
                    });
                }
            });
        }
        // The transposed butterfly: exchange `h` (across `lanes >> (h + 1)` lanes) keeps
        // the lower or upper half of the values a lane holds.
        let mut off = lanes / 2;
        each!(h in [0, 1, 2] {
            if (1 << h) < n {
                let half = n >> (h + 1);
                let upper = lane & off != 0;
                each!(i in [0, 1, 2, 3] {
                    if i < half {
                        let (lo, hi) = (acc[i], acc[i + half]);
                        let (keep, send) = if upper { (hi, lo) } else { (lo, hi) };
                        acc[i] = keep + wave::shuffle_xor(send, off);
                    }
                });
                off /= 2;
            }
        });
        let mut total = acc[0];
        while off > 0 {
            total += wave::shuffle_xor(total, off);
            off /= 2;
        }
        let b = (lane / span) as usize;
        if lane % span == 0 && b < batch && (row as usize) < rows {
            if waves_per_row == 1 {
                // SAFETY: b < batch, row < rows: inside y (checked above).
                unsafe { store_out(yp, b * rows + row as usize, total, out) };
            } else {
                partials[((s as usize % 2) * 128 + (sub * n + b) * waves_per_row + wave_in_row) % 256] = total;
            }
        }
        stage = if stage == BATCH_STAGES as u32 - 1 { 0 } else { stage + 1 };
        ahead = if ahead == BATCH_STAGES as u32 - 1 { 0 } else { ahead + 1 };
        s += 1;
    }
    barrier();
    flush(steps as u32 - 1, &partials);
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops;
