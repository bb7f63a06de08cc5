//! Quantized (GGUF) kernels against a host reference written here from the GGUF block
//! layouts, on the CPU executor with waves of 32 and 64 lanes and on any GPU this build
//! can open.
//!
//! - `dequantize` / `get_rows`: every format, random blocks whose scales include the f16
//!   extremes (±65504, zero, -0, subnormals). The reference evaluates GGML's float
//!   expressions in GGML's order, so f32 results must match bit for bit on the CPU
//!   executor (f16/bf16: the f32 result rounded once). GPUs may contract a multiply and an
//!   add into an fma, so there the check allows one f32 rounding of the largest term.
//! - Candle 0.11.1's own quantization and CPU dequantization of every format
//!   (`tests/data/candle-0.11.1`): our reference and our kernel give Candle's f32 bits.
//! - `quantize_q8_1`: codes, scales and sums bit for bit against the host quantization.
//! - `matvec`: against f64 sums over the exactly dequantized weights and the q8_1
//!   activations `q * d` (the integer dot products are exact; the f32 scale products and
//!   the accumulation over units and lanes add at most `(units + 16) * 2^-23` times the sum
//!   of the absolute terms, the scale and minimum parts of every weight times `|q d|`), so
//!   one wrong code, scale or block is far outside the tolerance; and against the f32
//!   activations within the q8_1 rounding bound `sum_k |w_k| d_k / 2` (`|x - q d| <= d / 2`:
//!   round to nearest, `d = max|x| / 127`).
use half::{bf16, f16};
use kernel_dsl::host::{Executor, LaunchError};
use kernels::quantized::{ops, GgmlDType};
use kernels::runtime::Device;

mod common;
use common::{executors, executors_both_orders};

/// Deterministic pseudo-random bytes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 17
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() % (1 << 24)) as f32 / (1 << 23) as f32 - 1.0
    }
}

/// Scales the blocks use: ordinary values and the f16 extremes.
fn scale(rng: &mut Rng, extremes: bool) -> f16 {
    let special = [f16::MAX, f16::MIN, f16::ZERO, f16::NEG_ZERO, f16::from_bits(1), f16::from_bits(0x83ff), f16::MIN_POSITIVE];
    if extremes && rng.next().is_multiple_of(4) {
        special[(rng.next() % special.len() as u64) as usize]
    } else {
        f16::from_f32(rng.unit() * 0.05)
    }
}

fn put16(b: &mut [u8], o: usize, v: f16) {
    b[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
}

/// `n` random blocks of `dtype`: random codes and packed scales, chosen f16 scales.
fn random_blocks(dtype: GgmlDType, n: usize, seed: u64, extremes: bool) -> Vec<u8> {
    let mut rng = Rng(seed);
    let bb = dtype.block_bytes();
    let mut v: Vec<u8> = (0..n * bb).map(|_| rng.byte()).collect();
    for b in v.chunks_mut(bb) {
        let mut s = || scale(&mut rng, extremes);
        match dtype {
            GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q8_0 => put16(b, 0, s()),
            GgmlDType::Q4_1 | GgmlDType::Q5_1 | GgmlDType::Q4K | GgmlDType::Q5K => {
                put16(b, 0, s());
                put16(b, 2, s());
            }
            GgmlDType::Q2K => {
                put16(b, 80, s());
                put16(b, 82, s());
            }
            GgmlDType::Q3K => put16(b, 108, s()),
            GgmlDType::Q6K => put16(b, 208, s()),
            GgmlDType::Q8K => {
                let d = s().to_f32() * if extremes { 1e30 } else { 1.0 };
                b[0..4].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
    v
}

fn f16at(b: &[u8], o: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// GGML's 6-bit scale/min pairs of Q4_K/Q5_K (`s` = the 12 scale bytes).
fn k4_scales(s: &[u8]) -> [(f32, f32); 8] {
    let mut r = [(0.0, 0.0); 8];
    for (j, e) in r.iter_mut().enumerate() {
        let (sc, m) = if j < 4 { (s[j] & 63, s[j + 4] & 63) } else { ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)) };
        *e = (sc as f32, m as f32);
    }
    r
}

/// Q3_K's 16 six-bit scales, unpacked through GGML's word shuffles.
fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    let (m1, m2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let aux = [(a0 & m2) | ((tmp & m1) << 4), (a1 & m2) | (((tmp >> 2) & m1) << 4), ((a0 >> 4) & m2) | (((tmp >> 4) & m1) << 4), ((a1 >> 4) & m2) | (((tmp >> 6) & m1) << 4)];
    let mut r = [0i8; 16];
    for i in 0..16 {
        r[i] = (aux[i / 4] >> (8 * (i % 4))) as u8 as i8;
    }
    r
}

/// Reference dequantization of one block: `(weight, magnitude)` per weight, where the
/// magnitude is the sum of the absolute values of the weight's scale and minimum terms.
fn ref_block(dtype: GgmlDType, b: &[u8]) -> Vec<(f32, f32)> {
    let mut out = Vec::new();
    let sym = |w: f32| (w, w.abs());
    match dtype {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            let (d, m, qs) = if dtype == GgmlDType::Q4_0 { (f16at(b, 0), None, &b[2..18]) } else { (f16at(b, 0), Some(f16at(b, 2)), &b[4..20]) };
            let mut y = vec![(0.0, 0.0); 32];
            for (j, &q) in qs.iter().enumerate() {
                for (k, x) in [(j, q & 0xf), (j + 16, q >> 4)] {
                    y[k] = match m {
                        // The matvec adds the unsigned codes' products and `-8 d` times the
                        // activations' sum: both terms count.
                        None => ((x as i16 - 8) as f32 * d, (x as f32 * d).abs() + 8.0 * d.abs()),
                        Some(m) => ((x as f32) * d + m, (x as f32 * d).abs() + m.abs()),
                    };
                }
            }
            out = y;
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => {
            let one = dtype == GgmlDType::Q5_1;
            let (d, m) = (f16at(b, 0), if one { f16at(b, 2) } else { 0.0 });
            let o = if one { 4 } else { 2 };
            let qh = u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            let qs = &b[o + 4..o + 20];
            let mut y = vec![(0.0, 0.0); 32];
            for (j, &q) in qs.iter().enumerate() {
                let lo = (q & 0xf) as u32 | (((qh >> j) & 1) << 4);
                let hi = (q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                for (k, x) in [(j, lo), (j + 16, hi)] {
                    // Q5_0: the matvec adds the unsigned codes' products and `-16 d` times
                    // the activations' sum.
                    y[k] = if one { (x as f32 * d + m, (x as f32 * d).abs() + m.abs()) } else { ((x as i32 - 16) as f32 * d, (x as f32 * d).abs() + 16.0 * d.abs()) };
                }
            }
            out = y;
        }
        GgmlDType::Q8_0 => out = b[2..34].iter().map(|&q| sym(q as i8 as f32 * f16at(b, 0))).collect(),
        GgmlDType::Q8K => {
            let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            out = b[4..260].iter().map(|&q| sym(d * q as i8 as f32)).collect();
        }
        GgmlDType::Q2K => {
            let (d, dmin) = (f16at(b, 80), f16at(b, 82));
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let mut is = 0;
            for half in 0..2 {
                for shift in [0, 2, 4, 6] {
                    for part in 0..2 {
                        let sc = scales[is];
                        is += 1;
                        let (dl, ml) = (d * (sc & 0xf) as f32, dmin * (sc >> 4) as f32);
                        for l in 0..16 {
                            let q = (qs[32 * half + 16 * part + l] >> shift) & 3;
                            out.push((dl * q as f32 - ml, (dl * q as f32).abs() + ml.abs()));
                        }
                    }
                }
            }
        }
        GgmlDType::Q3K => {
            let d = f16at(b, 108);
            let (hmask, qs, sc) = (&b[0..32], &b[32..96], q3k_scales(&b[96..108]));
            let mut is = 0;
            let mut m = 1u8;
            for half in 0..2 {
                for shift in [0, 2, 4, 6] {
                    for part in 0..2 {
                        let dl = d * (sc[is] as f32 - 32.0);
                        is += 1;
                        for l in 16 * part..16 * part + 16 {
                            let q = ((qs[32 * half + l] >> shift) & 3) as i8 - if hmask[l] & m == 0 { 4 } else { 0 };
                            out.push(sym(dl * q as f32));
                        }
                    }
                    m <<= 1;
                }
            }
        }
        GgmlDType::Q4K | GgmlDType::Q5K => {
            let five = dtype == GgmlDType::Q5K;
            let (d, dmin) = (f16at(b, 0), f16at(b, 2));
            let sm = k4_scales(&b[4..16]);
            let (qh, qs) = if five { (&b[16..48], &b[48..176]) } else { (&b[0..0], &b[16..144]) };
            for g in 0..4 {
                for nib in 0..2 {
                    let (sc, mn) = sm[2 * g + nib];
                    let (d1, m1) = (d * sc, dmin * mn);
                    for l in 0..32 {
                        let q = (qs[32 * g + l] >> (4 * nib)) & 0xf;
                        let w = if five {
                            let add = if qh[l] & (1 << (2 * g + nib)) != 0 { 16.0 } else { 0.0 };
                            d1 * (q as f32 + add) - m1
                        } else {
                            d1 * q as f32 - m1
                        };
                        out.push((w, (w + m1).abs() + m1.abs()));
                    }
                }
            }
        }
        GgmlDType::Q6K => {
            let d = f16at(b, 208);
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let mut y = vec![(0.0, 0.0); 256];
            for h in 0..2 {
                let (ql, qh, sc) = (&ql[64 * h..], &qh[32 * h..], &sc[8 * h..]);
                for l in 0..32 {
                    let is = l / 16;
                    let q = [
                        ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32,
                        ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32,
                        ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32,
                        ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32,
                    ];
                    for k in 0..4 {
                        y[128 * h + l + 32 * k] = sym(d * sc[is + 2 * k] as i8 as f32 * q[k] as f32);
                    }
                }
            }
            out = y;
        }
    }
    assert_eq!(out.len(), dtype.block_weights());
    out
}

fn ref_dequant(dtype: GgmlDType, w: &[u8]) -> Vec<(f32, f32)> {
    w.chunks(dtype.block_bytes()).flat_map(|b| ref_block(dtype, b)).collect()
}

/// `got` (f32 bits) equals `want` exactly on the CPU executor; on a GPU within one f32
/// rounding of the magnitude (a contracted fma).
fn check_f32(dev: &Device, got: &[f32], want: &[(f32, f32)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, (w, mag))) in got.iter().zip(want).enumerate() {
        let ok = if dev.is_gpu() { (g - w).abs() <= mag * 1.2e-7 || g.to_bits() == w.to_bits() } else { g.to_bits() == w.to_bits() };
        assert!(ok, "{what}: element {i}: got {g:e} ({:#x}), want {w:e} ({:#x})", g.to_bits(), w.to_bits());
    }
}

#[test]
fn dequantize_every_format_matches_the_reference() {
    for dev in executors() {
        for dtype in GgmlDType::ALL {
            let w = random_blocks(dtype, 37, 11 + dtype as u64, true);
            let want = ref_dequant(dtype, &w);
            let n = want.len();
            let wd = dev.upload(&w).unwrap();
            let what = format!("{} dequantize on {}", dtype.name(), dev.name());
            let mut out = dev.alloc::<f32>(n).unwrap();
            ops::dequantize(&dev, dtype, &wd, &mut out).unwrap();
            check_f32(&dev, &dev.download(&out).unwrap(), &want, &what);
            if dev.is_gpu() {
                continue;
            }
            let mut oh = dev.alloc::<f16>(n).unwrap();
            ops::dequantize(&dev, dtype, &wd, &mut oh).unwrap();
            let mut ob = dev.alloc::<bf16>(n).unwrap();
            ops::dequantize(&dev, dtype, &wd, &mut ob).unwrap();
            for (i, ((h, b), (w, _))) in dev.download(&oh).unwrap().iter().zip(dev.download(&ob).unwrap()).zip(&want).enumerate() {
                assert_eq!(h.to_bits(), f16::from_f32(*w).to_bits(), "{what} f16 element {i}");
                assert_eq!(b.to_bits(), bf16::from_f32(*w).to_bits(), "{what} bf16 element {i}");
            }
        }
    }
}

#[test]
fn get_rows_picks_and_dequantizes_rows() {
    for dev in executors() {
        for dtype in GgmlDType::ALL {
            let (rows, cols) = (7, 2 * dtype.block_weights());
            let w = random_blocks(dtype, rows * 2, 5 + dtype as u64, true);
            let full = ref_dequant(dtype, &w);
            let ids = [6u32, 0, 3, 7, 3, u32::MAX];
            let mut want = Vec::new();
            for &id in &ids {
                match full.get(id as usize * cols..(id as usize + 1) * cols) {
                    Some(r) if (id as usize) < rows => want.extend_from_slice(r),
                    _ => want.extend(std::iter::repeat_n((0.0f32, 0.0f32), cols)),
                }
            }
            let (wd, idd) = (dev.upload(&w).unwrap(), dev.upload(&ids).unwrap());
            let mut out = dev.alloc::<f32>(ids.len() * cols).unwrap();
            ops::get_rows(&dev, dtype, &wd, &idd, &mut out, rows, cols).unwrap();
            check_f32(&dev, &dev.download(&out).unwrap(), &want, &format!("{} get_rows on {}", dtype.name(), dev.name()));
            let mut ob = dev.alloc::<bf16>(ids.len() * cols).unwrap();
            ops::get_rows(&dev, dtype, &wd, &idd, &mut ob, rows, cols).unwrap();
            for (i, (g, (w, mag))) in dev.download(&ob).unwrap().iter().zip(&want).enumerate() {
                let ok = g.to_bits() == bf16::from_f32(*w).to_bits() || (dev.is_gpu() && (g.to_f32() - w).abs() <= mag / 128.0);
                assert!(ok, "{} get_rows bf16 element {i}: {g} vs {w}", dtype.name());
            }
        }
    }
}

/// Host q8_1: codes, `(d, d * sum)` per 32 values.
fn ref_q8_1(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::new();
    let mut ds = Vec::new();
    for blk in x.chunks(32) {
        let amax = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let codes: Vec<i32> = blk.iter().map(|v| if d > 0.0 { (v / d).round() as i32 } else { 0 }).collect();
        ds.push(d);
        ds.push(d * codes.iter().sum::<i32>() as f32);
        q.extend(codes.iter().map(|&c| c as i8));
    }
    (q, ds)
}

fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|i| match i % 97 {
            5 => 0.0,
            7 => 40.0 * rng.unit(), // a large value: the other 31 of its block get coarse codes
            _ => rng.unit(),
        })
        .collect()
}

#[test]
fn quantize_q8_1_matches_host_quantization() {
    for dev in executors() {
        let mut x = activations(3 * 96, 3);
        x[32..64].iter_mut().for_each(|v| *v = 0.0); // an all-zero block: d = 0, codes 0
        let (q, ds) = ref_q8_1(&x);
        let xd = dev.upload(&x).unwrap();
        let (mut xq, mut xds) = (dev.alloc::<u32>(x.len() / 4).unwrap(), dev.alloc::<f32>(x.len() / 16).unwrap());
        ops::quantize_q8_1(&dev, &xd, &mut xq, &mut xds).unwrap();
        let got_q: Vec<i8> = dev.download(&xq).unwrap().iter().flat_map(|w| w.to_le_bytes().map(|b| b as i8)).collect();
        assert_eq!(got_q, q, "codes on {}", dev.name());
        let got_ds = dev.download(&xds).unwrap();
        for (i, (g, w)) in got_ds.iter().zip(&ds).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "xds[{i}] on {}: {g} vs {w}", dev.name());
        }
    }
}

/// Checks `matvec` of a `rows x cols` matrix with `batch` activation rows against the f64
/// sum over the exactly dequantized weights and the q8_1 activations (`q * d`, which
/// `quantize_q8_1_matches_host_quantization` pins bit for bit): what is left is the f32
/// rounding of the kernel's scale products and sums, bounded by `(units + 16) * 2^-23`
/// times the sum of the absolute terms. A single wrong code, scale or block moves a result
/// far beyond that. The result is also checked against the unquantized activations
/// within the q8_1 rounding bound `sum_k |w_k| d_k / 2`.
fn check_matvec(dev: &Device, dtype: GgmlDType, rows: usize, cols: usize, batch: usize, seed: u64, extremes: bool) {
    check_matvec_on(dev, dtype, rows, cols, batch, seed, extremes, Path::Auto)
}

/// Which matvec kernel [`check_matvec_on`] runs, whatever the device.
#[derive(Clone, Copy)]
enum Path {
    /// `ops::matvec`: the kernel the device's launcher picks.
    Auto,
    /// `ops::matvec_rows` (a work-group per row; NVIDIA's kernel for batches of 2..=8).
    Row,
    /// `ops::matvec_stream` with this many work-groups (`None`: the launcher's); NVIDIA's
    /// kernels for batch 1 (`matvec_stream`) and for 2..=8 (`matvec_stream_batch`).
    Stream(Option<usize>),
    /// `ops::matvec_stream` for batch 1 with this many work-groups and shared stages.
    Staged(usize, usize),
}

/// [`check_matvec`] through the kernel `path` names.
#[allow(clippy::too_many_arguments)]
fn check_matvec_on(dev: &Device, dtype: GgmlDType, rows: usize, cols: usize, batch: usize, seed: u64, extremes: bool, path: Path) {
    let bw = dtype.block_weights();
    let w = random_blocks(dtype, rows * cols / bw, seed, extremes);
    let wr = ref_dequant(dtype, &w);
    let x = activations(batch * cols, seed + 1);
    let (wd, xd) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap());
    let mut y = dev.alloc::<f32>(batch * rows).unwrap();
    if let Path::Auto = path {
        ops::matvec(dev, dtype, &wd, &xd, &mut y, rows, cols, batch).unwrap();
    } else {
        let (mut xq, mut xds) = (dev.alloc::<u32>(batch * cols / 4).unwrap(), dev.alloc::<f32>(batch * cols / 16).unwrap());
        ops::quantize_q8_1(dev, &xd, &mut xq, &mut xds).unwrap();
        match path {
            Path::Stream(groups) => ops::matvec_stream(dev, dev.wave_lanes(), dtype, &wd, &xq, &xds, &mut y, rows, cols, batch, groups).unwrap(),
            Path::Staged(groups, stages) => {
                let tuning = ops::StreamTuning { groups: Some(groups), stages: Some(stages) };
                ops::matvec_stream(dev, dev.wave_lanes(), dtype, &wd, &xq, &xds, &mut y, rows, cols, batch, tuning).unwrap()
            }
            _ => ops::matvec_rows(dev, dtype, &wd, &xq, &xds, &mut y, rows, cols, batch).unwrap(),
        }
    }
    let got = dev.download(&y).unwrap();
    verify_matvec(dev, dtype, &got, &wr, &x, rows, cols, batch);
}

/// [`check_matvec`]'s comparison of `got` (`batch x rows`) with the sums over the
/// dequantized weights `wr` and the activations `x`, their q8_1 quantization and as given.
#[allow(clippy::too_many_arguments)]
fn verify_matvec(dev: &Device, dtype: GgmlDType, got: &[f32], wr: &[(f32, f32)], x: &[f32], rows: usize, cols: usize, batch: usize) {
    let (q, ds) = ref_q8_1(x);
    let gamma = (cols / 32 + 16) as f64 * 2f64.powi(-23);
    for b in 0..batch {
        for r in 0..rows {
            let (mut want, mut want_x, mut act_err, mut mag) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for k in 0..cols {
                let (wk, mk) = wr[r * cols + k];
                let i = b * cols + k;
                let d = ds[2 * (i / 32)] as f64;
                let xh = q[i] as f64 * d;
                want += wk as f64 * xh;
                want_x += wk as f64 * x[i] as f64;
                act_err += (wk as f64).abs() * 0.5 * d * (1.0 + 1e-6);
                mag += mk as f64 * xh.abs();
            }
            let g = got[b * rows + r] as f64;
            let tol = gamma * mag + 1e-30;
            let what = format!("{} matvec {rows}x{cols} batch {batch} on {}: y[{b}, {r}] = {g:e}", dtype.name(), dev.name());
            assert!((g - want).abs() <= tol, "{what}, want {want:e} over the q8_1 activations (tolerance {tol:e})");
            assert!((g - want_x).abs() <= tol + act_err, "{what}, want {want_x:e} over the f32 activations (tolerance {:e})", tol + act_err);
        }
    }
}

/// One matvec through `path` into an output of `O` (the launchers take `f32`, `f16` and
/// `bf16`), as `f32` values.
#[allow(clippy::too_many_arguments)]
fn matvec_into<O: kernel_dsl::Float + Into<f32>>(dev: &Device, dtype: GgmlDType, wd: &kernels::runtime::DeviceVec<u8>, xd: &kernels::runtime::DeviceVec<f32>, rows: usize, cols: usize, batch: usize, path: Path) -> Vec<f32> {
    let mut y = dev.alloc::<O>(batch * rows).unwrap();
    let (mut xq, mut xds) = (dev.alloc::<u32>(batch * cols / 4).unwrap(), dev.alloc::<f32>(batch * cols / 16).unwrap());
    if !matches!(path, Path::Auto) {
        ops::quantize_q8_1(dev, xd, &mut xq, &mut xds).unwrap();
    }
    match path {
        Path::Auto => ops::matvec(dev, dtype, wd, xd, &mut y, rows, cols, batch).unwrap(),
        Path::Row => ops::matvec_rows(dev, dtype, wd, &xq, &xds, &mut y, rows, cols, batch).unwrap(),
        Path::Stream(groups) => ops::matvec_stream(dev, dev.wave_lanes(), dtype, wd, &xq, &xds, &mut y, rows, cols, batch, groups).unwrap(),
        Path::Staged(groups, stages) => ops::matvec_stream(dev, dev.wave_lanes(), dtype, wd, &xq, &xds, &mut y, rows, cols, batch, ops::StreamTuning { groups: Some(groups), stages: Some(stages) }).unwrap(),
    }
    dev.download(&y).unwrap().into_iter().map(Into::into).collect()
}

/// The matvecs write `f16` and `bf16` outputs directly (no cast launch after a product of
/// half-precision activations): every kernel (the launcher's choice on every format with
/// batches of 1, 3, 8 and 17, the 17 in tiles; the row kernel; the streaming kernels at
/// batch 1 and 5) gives exactly its `f32` output rounded once to nearest-even
/// (`half`'s conversion), and that `f32` output is checked against the f64 reference
/// ([`verify_matvec`]). Rows of 9 and 13 (partial work-groups) and several chunks.
#[test]
fn matvec_half_outputs_are_the_f32_sums_rounded() {
    for dev in executors() {
        for dtype in matvec_formats() {
            let staged = !matches!(dtype, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K);
            let cols = if dtype.block_weights() == 32 { 300 * 32 } else { 40 * 256 };
            let mut cases = vec![(9, 1, Path::Auto), (9, 3, Path::Auto), (13, 8, Path::Auto), (9, 17, Path::Auto)];
            if staged {
                cases.extend([(13, 1, Path::Row), (13, 3, Path::Row), (9, 1, Path::Stream(Some(2))), (13, 5, Path::Stream(Some(2))), (13, 1, Path::Staged(2, 3))]);
            }
            for (rows, batch, path) in cases {
                let seed = 7000 + 100 * rows as u64 + batch as u64 + dtype as u64;
                let w = random_blocks(dtype, rows * cols / dtype.block_weights(), seed, false);
                let x = activations(batch * cols, seed + 1);
                let (wd, xd) = (dev.upload(&w).unwrap(), dev.upload(&x).unwrap());
                let want = matvec_into::<f32>(&dev, dtype, &wd, &xd, rows, cols, batch, path);
                verify_matvec(&dev, dtype, &want, &ref_dequant(dtype, &w), &x, rows, cols, batch);
                let got16 = matvec_into::<f16>(&dev, dtype, &wd, &xd, rows, cols, batch, path);
                let gotb = matvec_into::<bf16>(&dev, dtype, &wd, &xd, rows, cols, batch, path);
                for (i, &v) in want.iter().enumerate() {
                    let what = format!("{} {rows}x{cols} batch {batch} on {}: y[{i}] = {v:e}", dtype.name(), dev.name());
                    assert_eq!(f32::from(f16::from_f32(v)), got16[i], "{what}: f16");
                    assert_eq!(f32::from(bf16::from_f32(v)), gotb[i], "{what}: bf16");
                }
            }
        }
    }
}

fn matvec_formats() -> impl Iterator<Item = GgmlDType> {
    GgmlDType::ALL.into_iter().filter(|d| d.has_matvec())
}

#[test]
fn matvec_every_format_and_batch() {
    for dev in executors() {
        for dtype in matvec_formats() {
            let bw = dtype.block_weights();
            for (rows, cols) in [(1, bw), (7, 4 * bw.max(64))] {
                for batch in 1..=8 {
                    check_matvec(&dev, dtype, rows, cols, batch, 100 * rows as u64 + batch as u64 + dtype as u64, false);
                }
            }
        }
    }
}

/// Rows longer than one LDS chunk (128 or 256 blocks of 32, 16 or 32 k-quant blocks per
/// wave step), with a partial last chunk.
#[test]
fn matvec_long_rows() {
    for dev in executors() {
        for dtype in matvec_formats() {
            let cols = if dtype.block_weights() == 32 { 300 * 32 } else { 40 * 256 };
            for batch in [1, 3, 8] {
                check_matvec(&dev, dtype, 3, cols, batch, 900 + batch as u64 + dtype as u64, false);
            }
        }
    }
}

/// Rows whose byte length is a multiple of 16 (every chunk goes through the register
/// prefetch of the next chunk) over several chunks with a partial last one, every batch
/// size in one launch.
#[test]
fn matvec_aligned_rows_every_batch() {
    for dev in executors() {
        for dtype in matvec_formats() {
            // 200 blocks of 32 or 40 super-blocks: a multiple of 16 bytes for every format.
            let cols = if dtype.block_weights() == 32 { 200 * 32 } else { 40 * 256 };
            assert_eq!(cols / dtype.block_weights() * dtype.block_bytes() % 16, 0);
            for batch in 1..=8 {
                check_matvec(&dev, dtype, 5, cols, batch, 1300 + batch as u64 + dtype as u64, false);
            }
        }
    }
}

/// The work-group-per-row kernel (`matvec_row`, what NVIDIA GPUs run) on every executor:
/// every format it has and batch 1..=8, work-groups of 1, 2 and 4 rows (on waves of 32 a row of
/// a 2-row work-group spans two waves), rows whose start is not 16-byte aligned (300 blocks of
/// 32), a row near the largest it stages (`Q8_0` with 15360 columns), and the
/// f16 scale extremes in 301 rows of one block each (four rows per work-group, a partial
/// last group).
#[test]
fn matvec_row_kernel_every_format_and_batch() {
    for dev in executors() {
        for dtype in matvec_formats().filter(|d| !matches!(d, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K)) {
            let bw = dtype.block_weights();
            // Rows of 1, 2 and 4 per step (300, 200 and 8 units per row).
            for (rows, cols) in [(1, bw), (7, 4 * bw.max(64)), (3, if bw == 32 { 300 * 32 } else { 40 * 256 }), (5, 200 * 32 /* = 25 * 256: 200 units of 32 or 25 of 256 */)] {
                for batch in 1..=8 {
                    check_matvec_on(&dev, dtype, rows, cols, batch, 3000 + 100 * rows as u64 + batch as u64 + dtype as u64, false, Path::Row);
                }
            }
            check_matvec_on(&dev, dtype, 301, bw, 2, 4077 + dtype as u64, true, Path::Row);
        }
        check_matvec_on(&dev, GgmlDType::Q8_0, 2, 15360, 2, 4100, false, Path::Row);
    }
}

/// The streaming batch-1 kernel (`matvec_stream`, what NVIDIA GPUs run for decode) on every
/// executor, work-items in both orders: every format it has; rows of 1, 2 and 4 per step
/// (on waves of 64 at most 2); rows whose start is not 16-byte aligned (300 blocks of 32);
/// units per work-item from 1 to 4 with a partial last one (448 units: 14336 columns);
/// one and several steps per work-group (grids of 1, 2, 3 and 5 work-groups: uneven
/// shares, more than three steps so the stages wrap around) with a partial last step;
/// the f16 scale extremes in rows of one block; the largest `Q8_0` row a stage holds.
#[test]
fn matvec_stream_kernel_every_format() {
    for dev in executors_both_orders() {
        for dtype in matvec_formats().filter(|d| !matches!(d, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K)) {
            let bw = dtype.block_weights();
            let long = if bw == 32 { 300 * 32 } else { 40 * 256 };
            for (rows, cols, groups) in [(1, bw, None), (7, 4 * bw.max(64), None), (9, 4 * bw.max(64), Some(1)), (3, long, Some(2)), (11, long, Some(3)), (5, 448 * 32, Some(2)), (13, 4096, Some(2))] {
                check_matvec_on(&dev, dtype, rows, cols, 1, 5000 + 100 * rows as u64 + dtype as u64, false, Path::Stream(groups));
            }
            check_matvec_on(&dev, dtype, 301, bw, 1, 5077 + dtype as u64, true, Path::Stream(Some(5)));
            // Two and four stages (one and three steps in flight): grids whose work-groups
            // take 1 to 7 steps, so the ring wraps around at every length.
            for (stages, rows, groups) in [(2, 11, 2), (2, 7, 7), (4, 13, 2), (4, 6, 3), (3, 14, 2)] {
                check_matvec_on(&dev, dtype, rows, long, 1, 5200 + 10 * rows as u64 + dtype as u64, false, Path::Staged(groups, stages));
            }
        }
        check_matvec_on(&dev, GgmlDType::Q8_0, 3, 15360, 1, 5100, false, Path::Stream(Some(1)));
    }
}

/// The streaming batch-1 kernel on the Llama-3-8B decode shapes scaled down, for `Q6K`
/// (runs of 4 consecutive units per work-item, `QuantFormat::RUN`) beside `Q4K`, `Q4_0` and
/// `Q8_0` (one unit): rows of 4096 columns (q|k|v, o, gate|up: 128 units, 4 rows per step;
/// `Q6K`'s activations staged through the last stage) and 14336 (down: 448 units, `Q6K`'s
/// 112 runs over 128 work-items, the last 16 idle, its activations loaded directly: they do
/// not fit a stage), rows of 1024 and 2048 columns (most work-items idle), row counts that
/// are no multiple of the rows per step, grids whose work-groups take 1 to 4 steps, three
/// stages, on waves of 32 and 64 in both work-item orders, against the f64 reference.
#[test]
fn matvec_stream_unit_runs_on_decode_shapes() {
    for dev in executors_both_orders() {
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q4_0, GgmlDType::Q8_0] {
            for (rows, cols, groups) in [(6, 4096, Some(2)), (15, 4096, Some(3)), (3, 14336, Some(2)), (5, 14336, Some(4)), (9, 1024, Some(2)), (7, 2048, None)] {
                check_matvec_on(&dev, dtype, rows, cols, 1, 7000 + 10 * rows as u64 + cols as u64 + dtype as u64, false, Path::Stream(groups));
            }
            check_matvec_on(&dev, dtype, 10, 4096, 1, 7500 + dtype as u64, false, Path::Staged(3, 3));
        }
    }
}

/// The streaming kernel for batches of 2..=8 (`matvec_stream_batch`, what NVIDIA GPUs run
/// for them) on every executor, work-items in both orders: every format it has; tiles of
/// 2, 4 and 8 activation rows, full and partial (batches 2, 3, 4, 5, 8); 8, 4, 2 and 1 rows
/// per step (teams of 64 to 512 work-items: rows of 1 to 16 waves, whose sums meet in
/// `partials`); 1 or 2 units per work-item with a partial last one (448 units: 14336
/// columns); rows whose start is not 16-byte aligned (300 blocks of 32); grids of 1, 2
/// and 3 work-groups (more than four steps each, so the stages wrap around) with a partial
/// last step; the f16 scale extremes in rows of one block.
#[test]
fn matvec_stream_batch_kernel_every_format() {
    for dev in executors_both_orders() {
        for dtype in matvec_formats().filter(|d| !matches!(d, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K)) {
            let bw = dtype.block_weights();
            let long = if bw == 32 { 300 * 32 } else { 40 * 256 };
            for (rows, cols, groups, batches) in [
                (9, 4 * bw.max(64), Some(1), &[2, 3, 8][..]),
                (19, 4 * bw.max(64), None, &[4][..]),
                (11, long, Some(2), &[2, 5][..]),
                (7, 448 * 32, Some(1), &[3, 8][..]),
                (5, 448 * 32, Some(3), &[2][..]),
                (6, 4096, Some(2), &[8][..]),
            ] {
                for &batch in batches {
                    check_matvec_on(&dev, dtype, rows, cols, batch, 6000 + 100 * rows as u64 + 10 * batch as u64 + dtype as u64, false, Path::Stream(groups));
                }
            }
            check_matvec_on(&dev, dtype, 301, bw, 8, 6077 + dtype as u64, true, Path::Stream(Some(5)));
        }
    }
}

/// `matvec_stream` refuses what it cannot take (rows too long for a stage or for the
/// work-items' activation registers, an empty grid, shapes and lengths `matvec` refuses)
/// with an error and writes nothing.
#[test]
fn matvec_stream_rejects_what_it_cannot_take() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let dtype = GgmlDType::Q4_0;
    let cols = 128 * 32;
    let w = dev.upload(&random_blocks(dtype, 4 * cols / 32, 3, false)).unwrap();
    let (xq, xds) = (dev.alloc::<u32>(cols / 4).unwrap(), dev.alloc::<f32>(cols / 16).unwrap());
    let mut y = dev.upload(&[-3.0f32; 4]).unwrap();
    let invalid = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq, &xds, &mut y, 4, cols, 1, Some(0))), "no work-groups");
    assert!(invalid(ops::matvec_stream(&dev, 48, dtype, &w, &xq, &xds, &mut y, 4, cols, 1, None)), "wave size");
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq, &xds, &mut y, 3, cols, 1, None)), "weights of 4 rows for 3");
    for stages in [1, 5] {
        let tuning = ops::StreamTuning { groups: None, stages: Some(stages) };
        assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq, &xds, &mut y, 4, cols, 1, tuning)), "{stages} stages");
    }
    // 513 units: more than 128 work-items hold at 4 each.
    let wide = dev.upload(&random_blocks(dtype, 513, 4, false)).unwrap();
    let (xq2, xds2) = (dev.alloc::<u32>(513 * 8).unwrap(), dev.alloc::<f32>(513 * 2).unwrap());
    let mut y1 = dev.upload(&[-3.0f32]).unwrap();
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &wide, &xq2, &xds2, &mut y1, 1, 513 * 32, 1, None)), "row too long");
    // Batches: 513 units need more than 512 work-items at 1 unit each (batch 8), and a
    // batch tile has no empty grid either.
    let (xq8, xds8) = (dev.alloc::<u32>(8 * 513 * 8).unwrap(), dev.alloc::<f32>(8 * 513 * 2).unwrap());
    let mut y8 = dev.upload(&[-3.0f32; 8]).unwrap();
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &wide, &xq8, &xds8, &mut y8, 1, 513 * 32, 8, None)), "row too long for batch 8");
    let (xq4, xds4) = (dev.alloc::<u32>(4 * cols / 4).unwrap(), dev.alloc::<f32>(4 * cols / 16).unwrap());
    let mut y4 = dev.upload(&[-3.0f32; 16]).unwrap();
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq4, &xds4, &mut y4, 4, cols, 4, Some(0))), "no work-groups (batch)");
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq4, &xds4, &mut y4, 4, cols, 9, None)), "batch 9");
    let tuning = ops::StreamTuning { groups: None, stages: Some(3) };
    assert!(invalid(ops::matvec_stream(&dev, 64, dtype, &w, &xq4, &xds4, &mut y4, 4, cols, 4, tuning)), "stages of a batch");
    assert_eq!(dev.download(&y).unwrap(), vec![-3.0f32; 4]);
    assert_eq!(dev.download(&y1).unwrap(), vec![-3.0f32]);
    assert_eq!(dev.download(&y8).unwrap(), vec![-3.0f32; 8]);
    assert_eq!(dev.download(&y4).unwrap(), vec![-3.0f32; 16]);
}

/// Decode's order of work on one stream (and a batch of 3): eight `ops::matvec` calls
/// queued back to back (each a quantization and a matvec) with different activations and
/// the same scratch buffers, behind a long copy so that the host has queued them all
/// before the GPU gets to the first. On the H100 each quantization and streaming matvec may then start before
/// the kernel ahead of it ends (`kernel_dsl::grid`) and waits for it inside: a matvec that
/// read its q8_1 activations before the quantization ahead of it wrote them would give
/// the previous call's products (the matrix is large enough for the streaming kernel).
#[test]
fn matvec_back_to_back_uses_each_calls_activations() {
    for dev in executors() {
        let on_gpu = matches!(dev.memory(), kernel_dsl::host::MemLocation::Device { .. });
        // Batch 1 (`matvec_stream`) and 3 (`matvec_stream_batch`, a tile of 4).
        for (dtype, batch) in [(GgmlDType::Q4_0, 1), (GgmlDType::Q6K, 1), (GgmlDType::Q4_0, 3)] {
            let (rows, cols, busy) = if on_gpu { (4096, 8192, 512 << 20) } else { (48, 512, 1024) };
            let w = random_blocks(dtype, rows * cols / dtype.block_weights(), 950 + dtype as u64, false);
            let wr = ref_dequant(dtype, &w);
            let wd = dev.upload(&w).unwrap();
            let xs: Vec<Vec<f32>> = (0..8).map(|i| activations(batch * cols, 960 + i)).collect();
            let xds: Vec<_> = xs.iter().map(|x| dev.upload(x).unwrap()).collect();
            let mut ys: Vec<_> = xs.iter().map(|_| dev.alloc::<f32>(batch * rows).unwrap()).collect();
            // The first launches load the kernels' modules (seconds on a GPU): before the
            // timed sequence.
            ops::matvec(&dev, dtype, &wd, &xds[0], &mut ys[0], rows, cols, batch).unwrap();
            let (src, mut dst) = (dev.alloc::<u8>(busy).unwrap(), dev.alloc::<u8>(busy).unwrap());
            dev.synchronize().unwrap();
            dev.copy(src.view(..).unwrap(), dst.view_mut(..).unwrap()).unwrap();
            for (xd, y) in xds.iter().zip(ys.iter_mut()) {
                ops::matvec(&dev, dtype, &wd, xd, y, rows, cols, batch).unwrap();
            }
            for (x, y) in xs.iter().zip(&ys) {
                verify_matvec(&dev, dtype, &dev.download(y).unwrap(), &wr, x, rows, cols, batch);
            }
        }
    }
}

/// Another view of a buffer's memory as a kernel argument of element type `T` (`len`
/// elements from `addr`): a matvec whose output is another's weights or its own input.
struct Raw(kernel_dsl::host::ArgValue);
impl<T> kernel_dsl::host::KernelArgSlice<T> for Raw {
    fn kernel_arg(&self) -> kernel_dsl::host::ArgValue {
        self.0
    }
}
impl<T> kernel_dsl::host::KernelArgSliceMut<T> for Raw {}

/// `len` elements (of the type the launcher takes) from the start of `v`'s memory.
fn raw<S>(v: &impl kernel_dsl::host::KernelArgSlice<S>, len: usize) -> Raw {
    match v.kernel_arg() {
        kernel_dsl::host::ArgValue::Slice { addr, location, .. } => Raw(kernel_dsl::host::ArgValue::Slice { addr, len, location }),
        other => Raw(other),
    }
}

/// `ops::matvec` keeps the q8_1 codes of the activations it quantized last and reuses them
/// for the next call on the same activations (on CUDA); here the activations change in
/// between, twice: the host writes new values into them, and a matvec writes its output
/// over them (in place). Each call must see the activations as they are then.
#[test]
fn matvec_requantizes_activations_that_changed() {
    for dev in executors() {
        let on_gpu = matches!(dev.memory(), kernel_dsl::host::MemLocation::Device { .. });
        let dtype = GgmlDType::Q4_0;
        // Square, and on a GPU large enough for the streaming kernel.
        let n = if on_gpu { 4096 } else { 256 };
        let w: Vec<Vec<u8>> = (0..2).map(|i| random_blocks(dtype, n * n / 32, 1500 + i, false)).collect();
        let wr: Vec<_> = w.iter().map(|w| ref_dequant(dtype, w)).collect();
        let wd: Vec<_> = w.iter().map(|w| dev.upload(w).unwrap()).collect();
        let (x0, x1) = (activations(n, 1510), activations(n, 1511));
        let mut xd = dev.upload(&x0).unwrap();
        let (mut ya, mut yb) = (dev.alloc::<f32>(n).unwrap(), dev.alloc::<f32>(n).unwrap());
        ops::matvec(&dev, dtype, &wd[0], &xd, &mut ya, n, n, 1).unwrap();
        // Same activations, other weights: may reuse the codes.
        ops::matvec(&dev, dtype, &wd[1], &xd, &mut yb, n, n, 1).unwrap();
        verify_matvec(&dev, dtype, &dev.download(&ya).unwrap(), &wr[0], &x0, n, n, 1);
        verify_matvec(&dev, dtype, &dev.download(&yb).unwrap(), &wr[1], &x0, n, n, 1);
        // The host writes new activations into the same buffer.
        dev.write(xd.view_mut(..).unwrap(), &x1).unwrap();
        ops::matvec(&dev, dtype, &wd[0], &xd, &mut ya, n, n, 1).unwrap();
        verify_matvec(&dev, dtype, &dev.download(&ya).unwrap(), &wr[0], &x1, n, n, 1);
        // In place: y = W1 x written over x, then W0 of the new x.
        let (xin, mut xout) = (raw::<f32>(&xd, n), raw::<f32>(&xd, n));
        ops::matvec::<f32, f32>(&dev, dtype, &wd[1], &xin, &mut xout, n, n, 1).unwrap();
        ops::matvec(&dev, dtype, &wd[0], &xd, &mut yb, n, n, 1).unwrap();
        let x2 = dev.download(&xd).unwrap();
        verify_matvec(&dev, dtype, &x2, &wr[1], &x1, n, n, 1);
        verify_matvec(&dev, dtype, &dev.download(&yb).unwrap(), &wr[0], &x2, n, n, 1);
    }
}

/// A chain of `ops::matvec` calls on the same activations, where the first writes its
/// output into the memory the second takes as its weights. On the H100 a matvec after a
/// matvec may start copying its weights before that one ends, but not where that one
/// writes them: the second call must see the weights with the first call's output in
/// them, as it does with the host waiting between the calls. Two shapes: the streaming
/// kernel (4096 rows) and the row kernel (1024 rows of 4096, under 8 MiB).
#[test]
fn matvec_chain_waits_for_weights_the_matvec_before_writes() {
    for dev in executors() {
        let on_gpu = matches!(dev.memory(), kernel_dsl::host::MemLocation::Device { .. });
        let dtype = GgmlDType::Q8_0;
        for rows in [4096, 1024] {
            let (rows, cols) = if on_gpu { (rows, 4096) } else { (rows / 16, 256) };
            let w1 = random_blocks(dtype, rows * cols / 32, 1600 + rows as u64, false);
            let w2 = random_blocks(dtype, rows * cols / 32, 1601 + rows as u64, false);
            assert_eq!(w2.len() % 4, 0);
            let x = activations(cols, 1602);
            let (w1d, xd) = (dev.upload(&w1).unwrap(), dev.upload(&x).unwrap());
            let w2f: Vec<f32> = w2.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            let mut outs = Vec::new();
            for wait in [false, true] {
                // `b` holds the second matrix; the first call writes its outputs over the
                // first 4 * rows bytes of it.
                let mut b = dev.upload(&w2f).unwrap();
                let mut y2 = dev.alloc::<f32>(rows).unwrap();
                // A long copy ahead, so that the host has queued both calls before the GPU
                // starts the first.
                let busy = if on_gpu { 256 << 20 } else { 1024 };
                let (src, mut dst) = (dev.alloc::<u8>(busy).unwrap(), dev.alloc::<u8>(busy).unwrap());
                ops::matvec(&dev, dtype, &w1d, &xd, &mut y2, rows, cols, 1).unwrap();
                dev.synchronize().unwrap();
                dev.copy(src.view(..).unwrap(), dst.view_mut(..).unwrap()).unwrap();
                ops::matvec(&dev, dtype, &w1d, &xd, &mut b.view_mut(..rows).unwrap(), rows, cols, 1).unwrap();
                if wait {
                    dev.synchronize().unwrap();
                }
                ops::matvec(&dev, dtype, &raw::<f32>(&b, 4 * w2f.len()), &xd, &mut y2, rows, cols, 1).unwrap();
                let y1 = dev.download(&b).unwrap()[..rows].to_vec();
                verify_matvec(&dev, dtype, &y1, &ref_dequant(dtype, &w1), &x, rows, cols, 1);
                outs.push(dev.download(&y2).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            }
            assert!(outs[0] == outs[1], "{} {rows}x{cols}: the second matvec of the chain differs from the one after a wait", dev.name());
        }
    }
}

/// Decode batches over one launch's 8 rows (`ops::matvec` up to 64 rows: the activations
/// quantized once, then tiles of 8 rows on views of the codes and the output): `Q4K` and
/// `Q8_0` (the common GGUF formats) and `Q6K`, `Q5K` (a 2-row tile on AMD), odd row counts,
/// full and partial last tiles, every batch of 9..=17 and 63, 64.
#[test]
fn matvec_decode_batches_in_tiles() {
    for dev in executors() {
        for dtype in [GgmlDType::Q4K, GgmlDType::Q8_0, GgmlDType::Q6K, GgmlDType::Q5K] {
            let cols = 2 * dtype.block_weights().max(256);
            for batch in (9..=17).chain([63, 64]) {
                check_matvec(&dev, dtype, 7, cols, batch, 5000 + batch as u64 + dtype as u64, false);
            }
            check_matvec(&dev, dtype, 3, dtype.block_weights(), 33, 5100 + dtype as u64, true);
        }
    }
}

#[test]
fn matvec_many_rows() {
    for dev in executors() {
        for dtype in matvec_formats() {
            // One block per row: the f16 extremes (±65504, subnormal, zero scales) each in
            // rows of their own.
            check_matvec(&dev, dtype, 4097, dtype.block_weights(), 1, 77 + dtype as u64, true);
        }
    }
}

#[test]
fn bad_inputs_are_rejected_and_nothing_is_written() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let dtype = GgmlDType::Q4K;
    let w = dev.upload(&random_blocks(dtype, 4, 1, false)).unwrap(); // 2 rows x 512
    let x = dev.upload(&activations(512, 2)).unwrap();
    let sentinel = vec![-7.0f32; 2];
    let mut y = dev.upload(&sentinel).unwrap();
    let invalid = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x, &mut y, 2, 500, 1)), "cols not a multiple of 256");
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x, &mut y, 3, 512, 1)), "byte length");
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x, &mut y, 2, 512, 0)), "batch 0");
    let x65 = dev.upload(&activations(65 * 512, 3)).unwrap();
    let mut y65 = dev.upload(&vec![-7.0f32; 2 * 65]).unwrap();
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x65, &mut y65, 2, 512, 65)), "batch 65");
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x65.view(0..17 * 512).unwrap(), &mut y65.view_mut(0..2 * 16).unwrap(), 2, 512, 17)), "y length, batch 17");
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x65.view(0..17 * 512).unwrap(), &mut y65.view_mut(0..2 * 17).unwrap(), 3, 512, 17)), "byte length, batch 17");
    assert_eq!(dev.download(&y65).unwrap(), vec![-7.0f32; 2 * 65]);
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x, &mut y, 2, 256, 2)), "x length");
    assert!(invalid(ops::matvec(&dev, GgmlDType::Q8K, &w, &x, &mut y, 2, 512, 1)), "q8_K matvec");
    let mut y3 = dev.alloc::<f32>(3).unwrap();
    assert!(invalid(ops::matvec(&dev, dtype, &w, &x, &mut y3, 2, 512, 1)), "y length");
    assert_eq!(dev.download(&y).unwrap(), sentinel);
    // Misaligned weights: a view starting one block-size byte in.
    let wv = w.view(2..576 - 142).unwrap();
    let mut out = dev.alloc::<f32>(0).unwrap();
    assert!(invalid(ops::dequantize(&dev, GgmlDType::Q4_0, &wv, &mut out)), "misaligned/odd length");
    let mut o2 = dev.upload(&vec![5.0f32; 512]).unwrap();
    assert!(invalid(ops::dequantize(&dev, dtype, &w.view(0..143).unwrap(), &mut o2)), "partial block");
    assert!(invalid(ops::dequantize(&dev, dtype, &w, &mut o2)), "out length");
    let ids = dev.upload(&[0u32, 1]).unwrap();
    assert!(invalid(ops::get_rows(&dev, dtype, &w, &ids, &mut o2, 2, 512)), "get_rows out length");
    assert_eq!(dev.download(&o2).unwrap(), vec![5.0f32; 512]);
    let (mut xq, mut xds) = (dev.alloc::<u32>(128).unwrap(), dev.alloc::<f32>(31).unwrap());
    assert!(invalid(ops::quantize_q8_1(&dev, &x, &mut xq, &mut xds)), "xds length");
    assert_eq!(dev.download(&xq).unwrap(), vec![0u32; 128]);
}

fn fixture(name: &str) -> Vec<u8> {
    // KERNELS_TEST_DATA: the `tests/data` folder when the test binary runs elsewhere (GPU bundles).
    let dir = std::env::var("KERNELS_TEST_DATA").unwrap_or_else(|_| format!("{}/tests/data", env!("CARGO_MANIFEST_DIR")));
    let p = format!("{dir}/candle-0.11.1/{name}");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn dequantize_matches_candle_bit_for_bit() {
    let devs = executors();
    for dtype in GgmlDType::ALL {
        let q = fixture(&format!("{}.q", dtype.name()));
        let candle: Vec<f32> = fixture(&format!("{}.f32", dtype.name())).chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(q.len() / dtype.block_bytes() * dtype.block_weights(), candle.len(), "{} fixture sizes", dtype.name());
        let want = ref_dequant(dtype, &q);
        for (i, ((w, _), c)) in want.iter().zip(&candle).enumerate() {
            assert_eq!(w.to_bits(), c.to_bits(), "{} reference vs Candle, element {i}: {w:e} vs {c:e}", dtype.name());
        }
        for dev in &devs {
            let qd = dev.upload(&q).unwrap();
            let mut out = dev.alloc::<f32>(candle.len()).unwrap();
            ops::dequantize(dev, dtype, &qd, &mut out).unwrap();
            check_f32(dev, &dev.download(&out).unwrap(), &want, &format!("{} dequantize vs Candle on {}", dtype.name(), dev.name()));
        }
    }
}

/// The address of a buffer argument.
fn addr_of<S>(v: &impl kernel_dsl::host::KernelArgSlice<S>) -> u64 {
    match v.kernel_arg() {
        kernel_dsl::host::ArgValue::Slice { addr, .. } => addr,
        _ => panic!("not a buffer"),
    }
}

/// `ops::dequantize_with` of `w` into `T` through `kernel`, into a view of a larger buffer
/// that starts `skip` elements in (so `skip = 1` misaligns it); the elements around the view
/// must stay as they were (NaN bits).
fn dequant_view<T: kernel_dsl::Float + kernel_dsl::host::ScalarArg + Copy>(
    dev: &Device,
    dtype: GgmlDType,
    w: &[u8],
    kernel: ops::DequantKernel,
    skip: usize,
    nan: T,
) -> Vec<T> {
    let n = w.len() / dtype.block_bytes() * dtype.block_weights();
    let wd = dev.upload(w).unwrap();
    let buf = dev.upload(&vec![nan; n + 8]).unwrap();
    let base = addr_of(&buf);
    assert_eq!(base % 16, 0, "allocations start on 16 bytes (else the piece kernel is not what runs)");
    let mut view = raw(&buf, n);
    if let kernel_dsl::host::ArgValue::Slice { addr, .. } = &mut view.0 {
        *addr += (skip * std::mem::size_of::<T>()) as u64;
    }
    ops::dequantize_with::<T>(dev, dtype, &wd, &mut view, kernel).unwrap();
    let all = dev.download(&buf).unwrap();
    // SAFETY: reads the `size_of::<T>()` bytes of a live value.
    let bits = |x: &T| unsafe { std::slice::from_raw_parts(x as *const T as *const u8, std::mem::size_of::<T>()) }.to_vec();
    for (i, x) in all.iter().enumerate().filter(|(i, _)| *i < skip || *i >= skip + n) {
        assert_eq!(bits(x), bits(&nan), "{} {kernel:?}: element {i} outside the output was written", dtype.name());
    }
    all[skip..skip + n].to_vec()
}

/// The piece kernel (eight weights per work-item) and the generic one give the reference's
/// bits in f32, f16 and bf16 for every format at block counts around the piece, wave and
/// work-group boundaries (a work-group of 256 work-items covers 64 small blocks or 8
/// k-quant blocks), and a misaligned `out` (the generic kernel then) as well; nothing
/// outside `out` is written. On a GPU: within one fma rounding of the reference, and the
/// two kernels' f16/bf16 agree with the f32 result rounded once.
#[test]
fn dequantize_pieces_every_format_count_and_dtype() {
    use ops::DequantKernel::{Generic, Pieces};
    for dev in executors() {
        for dtype in GgmlDType::ALL {
            let counts: &[usize] = if dtype.block_weights() == 32 { &[1, 2, 3, 63, 64, 65, 131] } else { &[1, 7, 8, 9, 17] };
            for &blocks in counts {
                let w = random_blocks(dtype, blocks, 1000 + 17 * dtype as u64 + blocks as u64, true);
                let want = ref_dequant(dtype, &w);
                for (kernel, skip) in [(Pieces, 0), (Generic, 0), (Pieces, 1)] {
                    let what = format!("{} x{blocks} {kernel:?} skip {skip} on {}", dtype.name(), dev.name());
                    let got = dequant_view::<f32>(&dev, dtype, &w, kernel, skip, f32::from_bits(0x7fc0_1234));
                    check_f32(&dev, &got, &want, &what);
                    let h = dequant_view::<f16>(&dev, dtype, &w, kernel, skip, f16::from_bits(0x7e55));
                    let b = dequant_view::<bf16>(&dev, dtype, &w, kernel, skip, bf16::from_bits(0x7fd5));
                    for (i, ((h, b), g)) in h.iter().zip(&b).zip(&got).enumerate() {
                        // The f32 result rounded once (on a GPU: the f32 this kernel computed).
                        assert_eq!(h.to_bits(), f16::from_f32(*g).to_bits(), "{what} f16 element {i}");
                        assert_eq!(b.to_bits(), bf16::from_f32(*g).to_bits(), "{what} bf16 element {i}");
                    }
                }
            }
        }
    }
}

/// `get_rows` through both kernels: rows of one and of several blocks (a row that ends
/// inside a work-item's stride, ids repeated, out of range at the start and the end), f32 and
/// bf16, bit for bit against the reference rows (GPU: within one fma rounding).
#[test]
fn get_rows_pieces_match_the_reference() {
    for dev in executors() {
        for dtype in GgmlDType::ALL {
            for row_blocks in [1, 3] {
                let (rows, cols) = (5, row_blocks * dtype.block_weights());
                let w = random_blocks(dtype, rows * row_blocks, 77 + dtype as u64, true);
                let full = ref_dequant(dtype, &w);
                let ids = [9u32, 4, 0, 4, 2, 1, 3, 5];
                let mut want = Vec::new();
                for &id in &ids {
                    match full.get(id as usize * cols..(id as usize + 1) * cols) {
                        Some(r) if (id as usize) < rows => want.extend_from_slice(r),
                        _ => want.extend(std::iter::repeat_n((0.0f32, 0.0f32), cols)),
                    }
                }
                let (wd, idd) = (dev.upload(&w).unwrap(), dev.upload(&ids).unwrap());
                for kernel in [ops::DequantKernel::Pieces, ops::DequantKernel::Generic] {
                    let what = format!("{} get_rows {rows}x{cols} {kernel:?} on {}", dtype.name(), dev.name());
                    let mut out = dev.upload(&vec![f32::NAN; ids.len() * cols]).unwrap();
                    assert_eq!(addr_of(&out) % 16, 0);
                    ops::get_rows_with(&dev, dtype, &wd, &idd, &mut out, rows, cols, kernel).unwrap();
                    let got = dev.download(&out).unwrap();
                    check_f32(&dev, &got, &want, &what);
                    let mut ob = dev.upload(&vec![bf16::NAN; ids.len() * cols]).unwrap();
                    ops::get_rows_with(&dev, dtype, &wd, &idd, &mut ob, rows, cols, kernel).unwrap();
                    for (i, (b, g)) in dev.download(&ob).unwrap().iter().zip(&got).enumerate() {
                        assert_eq!(b.to_bits(), bf16::from_f32(*g).to_bits(), "{what} bf16 element {i}");
                    }
                }
            }
        }
    }
}
