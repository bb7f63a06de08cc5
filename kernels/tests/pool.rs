//! Pooling and resizing against references written here from Candle 0.11.1's CPU
//! formulas (f64 index and weight arithmetic, `from_f64` write-back through the `half`
//! crate), on the CPU executor with waves of 32 and 64: max pool, nearest and bilinear
//! resizes bit for bit (they compute the same f64 expressions), average pool within the
//! rounding of a k-term f32 sum (`k * 2^-24` relative to the sum of magnitudes, plus one
//! rounding to the element type). Inputs are strided views with an offset; NaN, inf and
//! odd sizes are included.
use half::{bf16, f16};
use kernel_dsl::host::LaunchError;
use kernels::dtype::host::DType;
use kernels::pool::ops::{self as pool, Nchw};
use kernels::runtime::Device;

mod common;
use common::executors;

trait E: DType + std::fmt::Debug + PartialEq {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn bits(self) -> u64;
}
impl E for f32 {
    fn from_f64(v: f64) -> Self { v as f32 }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}
impl E for f64 {
    fn from_f64(v: f64) -> Self { v }
    fn to_f64(self) -> f64 { self }
    fn bits(self) -> u64 { self.to_bits() }
}
impl E for f16 {
    fn from_f64(v: f64) -> Self { f16::from_f64(v) }
    fn to_f64(self) -> f64 { self.to_f64() }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}
impl E for bf16 {
    fn from_f64(v: f64) -> Self { bf16::from_f64(v) }
    fn to_f64(self) -> f64 { self.to_f64() }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}
impl E for u8 {
    fn from_f64(v: f64) -> Self { v as u8 }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self as u64 }
}
impl E for i64 {
    fn from_f64(v: f64) -> Self { v as i64 }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self as u64 }
}

/// A strided NCHW view over a larger buffer: rows padded by 2, offset 3, values in
/// [-50, 200) with NaN/inf sprinkled in for floats.
fn image<T: E>(dims: [usize; 4], seed: u64, specials: bool) -> (Vec<T>, Nchw) {
    let [b, c, h, w] = dims;
    let s2 = w + 2;
    let strides = [c * h * s2, h * s2, s2, 1];
    let len = 3 + b * c * h * s2 + 1;
    let mut s = seed.wrapping_add(99);
    let buf = (0..len)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let v = ((s >> 11) as f64 / (1u64 << 53) as f64) * 250.0 - 50.0;
            let v = if specials && i % 23 == 5 { [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][i % 3] } else { v };
            T::from_f64(v)
        })
        .collect();
    (buf, Nchw { dims, strides, offset: 3 })
}

fn at<T: E>(buf: &[T], x: &Nchw, b: usize, c: usize, y: usize, xx: usize) -> T {
    buf[x.offset + b * x.strides[0] + c * x.strides[1] + y * x.strides[2] + xx * x.strides[3]]
}

fn same<T: E>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let nan = g.to_f64().is_nan() && w.to_f64().is_nan();
        assert!(g.bits() == w.bits() || nan, "{what}: element {i}: got {g:?}, want {w:?}");
    }
}

fn max_pool_case<T: E>(dev: &Device, dims: [usize; 4], k: (usize, usize), s: (usize, usize)) {
    let (buf, x) = image::<T>(dims, dims.iter().sum::<usize>() as u64, true);
    let [b, c, h, w] = dims;
    let (ho, wo) = ((h - k.0) / s.0 + 1, (w - k.1) / s.1 + 1);
    let mut want = Vec::new();
    for bi in 0..b {
        for ci in 0..c {
            for oy in 0..ho {
                for ox in 0..wo {
                    // Candle: start from the window's first element, replace when larger.
                    let mut best = at(&buf, &x, bi, ci, oy * s.0, ox * s.1);
                    for m in 0..k.0 {
                        for n in 0..k.1 {
                            let v = at(&buf, &x, bi, ci, oy * s.0 + m, ox * s.1 + n);
                            if best.to_f64() < v.to_f64() {
                                best = v;
                            }
                        }
                    }
                    want.push(best);
                }
            }
        }
    }
    let src = dev.upload(&buf).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    assert_eq!(pool::max_pool2d::<T>(dev, &src, x, k, s, &mut out).unwrap(), (ho, wo));
    same(&dev.download(&out).unwrap(), &want, &format!("max_pool2d {} {dims:?} k{k:?} s{s:?}", T::NAME));
}

fn avg_pool_case<T: E + kernels::dtype::Real>(dev: &Device, dims: [usize; 4], k: (usize, usize), s: (usize, usize), eps: f64) {
    let (buf, x) = image::<T>(dims, 5, false);
    let [b, c, h, w] = dims;
    let (ho, wo) = ((h - k.0) / s.0 + 1, (w - k.1) / s.1 + 1);
    let mut want = Vec::new();
    let mut mags = Vec::new();
    for bi in 0..b {
        for ci in 0..c {
            for oy in 0..ho {
                for ox in 0..wo {
                    let (mut sum, mut mag) = (0.0, 0.0);
                    for m in 0..k.0 {
                        for n in 0..k.1 {
                            let v = at(&buf, &x, bi, ci, oy * s.0 + m, ox * s.1 + n).to_f64();
                            sum += v;
                            mag += v.abs();
                        }
                    }
                    want.push(sum / (k.0 * k.1) as f64);
                    mags.push(mag / (k.0 * k.1) as f64);
                }
            }
        }
    }
    let src = dev.upload(&buf).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    pool::avg_pool2d::<T>(dev, &src, x, k, s, &mut out).unwrap();
    let got = dev.download(&out).unwrap();
    let acc = if T::NAME == "f64" { f64::EPSILON } else { f32::EPSILON as f64 };
    for i in 0..want.len() {
        let tol = (k.0 * k.1 + 2) as f64 * acc * mags[i] + eps * want[i].abs();
        assert!((got[i].to_f64() - want[i]).abs() <= tol, "avg_pool2d {} element {i}: got {:?}, want {}", T::NAME, got[i], want[i]);
    }
}

fn nearest_case<T: E>(dev: &Device, dims: [usize; 4], ho: usize, wo: usize) {
    let (buf, x) = image::<T>(dims, 9, true);
    let [b, c, h, w] = dims;
    let mut want = Vec::new();
    for bi in 0..b {
        for ci in 0..c {
            for oy in 0..ho {
                for ox in 0..wo {
                    let y = ((oy as f64 * (h as f64 / ho as f64)) as usize).min(h - 1);
                    let xx = ((ox as f64 * (w as f64 / wo as f64)) as usize).min(w - 1);
                    want.push(at(&buf, &x, bi, ci, y, xx));
                }
            }
        }
    }
    let src = dev.upload(&buf).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    pool::upsample_nearest2d::<T>(dev, &src, x, (ho, wo), &mut out).unwrap();
    same(&dev.download(&out).unwrap(), &want, &format!("upsample_nearest2d {} {dims:?} -> {ho}x{wo}", T::NAME));
    if h == 1 {
        let mut out1 = dev.alloc::<T>(want.len()).unwrap();
        pool::upsample_nearest1d::<T>(dev, &src, [b, c, w], [x.strides[0], x.strides[1], 1], x.offset, wo, &mut out1).unwrap();
        if ho == 1 {
            same(&dev.download(&out1).unwrap(), &want, &format!("upsample_nearest1d {} {dims:?}", T::NAME));
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn bilinear_case<T: E>(dev: &Device, dims: [usize; 4], ho: usize, wo: usize, align: bool, sh: Option<f64>, sw: Option<f64>, specials: bool) {
    let (buf, x) = image::<T>(dims, 13, specials);
    let [b, c, h, w] = dims;
    // PyTorch's source index per output index, as Candle writes it.
    let axis = |o: usize, n_in: usize, n_out: usize, f: Option<f64>| -> (usize, usize, f64) {
        let scale = if align {
            if n_out > 1 { (n_in - 1) as f64 / (n_out - 1) as f64 } else { 0.0 }
        } else {
            f.map(|f| 1.0 / f).unwrap_or(n_in as f64 / n_out as f64)
        };
        let src = if align { scale * o as f64 } else { scale * (o as f64 + 0.5) - 0.5 };
        let src = src.max(0.0);
        let i0 = (src.floor() as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        (i0, i1, (src - i0 as f64).clamp(0.0, 1.0))
    };
    let mut want = Vec::new();
    for bi in 0..b {
        for ci in 0..c {
            for oy in 0..ho {
                for ox in 0..wo {
                    if h == ho && w == wo {
                        want.push(at(&buf, &x, bi, ci, oy, ox));
                        continue;
                    }
                    let (h0, h1, wh) = axis(oy, h, ho, sh);
                    let (w0, w1, ww) = axis(ox, w, wo, sw);
                    let v = |y, xx| at(&buf, &x, bi, ci, y, xx).to_f64();
                    let top = v(h0, w0) * (1.0 - ww) + v(h0, w1) * ww;
                    let bottom = v(h1, w0) * (1.0 - ww) + v(h1, w1) * ww;
                    want.push(T::from_f64(top * (1.0 - wh) + bottom * wh));
                }
            }
        }
    }
    let src = dev.upload(&buf).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    pool::upsample_bilinear2d::<T>(dev, &src, x, (ho, wo), align, sh, sw, &mut out).unwrap();
    same(&dev.download(&out).unwrap(), &want, &format!("upsample_bilinear2d {} {dims:?} -> {ho}x{wo} align {align} {sh:?} {sw:?}", T::NAME));
}

#[test]
fn max_pool_matches_candle() {
    for dev in executors() {
        max_pool_case::<f32>(&dev, [2, 3, 7, 9], (2, 2), (2, 2));
        max_pool_case::<f32>(&dev, [1, 2, 9, 8], (3, 3), (2, 1));
        max_pool_case::<bf16>(&dev, [1, 3, 5, 5], (3, 2), (1, 3));
        max_pool_case::<f16>(&dev, [2, 1, 4, 6], (1, 1), (1, 1));
        max_pool_case::<f64>(&dev, [1, 2, 6, 6], (2, 3), (2, 2));
        max_pool_case::<u8>(&dev, [1, 2, 6, 7], (2, 2), (2, 2));
        max_pool_case::<i64>(&dev, [1, 1, 5, 5], (5, 5), (1, 1));
        max_pool_case::<f32>(&dev, [0, 3, 4, 4], (2, 2), (2, 2));
    }
}

#[test]
fn avg_pool_within_rounding() {
    for dev in executors() {
        avg_pool_case::<f32>(&dev, [2, 3, 7, 9], (2, 2), (2, 2), f32::EPSILON as f64);
        avg_pool_case::<f32>(&dev, [1, 2, 9, 8], (3, 3), (2, 1), f32::EPSILON as f64);
        avg_pool_case::<f64>(&dev, [1, 2, 6, 6], (2, 3), (2, 2), f64::EPSILON);
        avg_pool_case::<bf16>(&dev, [1, 3, 5, 5], (3, 2), (1, 3), 1.0 / 256.0);
        avg_pool_case::<f16>(&dev, [2, 1, 5, 7], (2, 2), (1, 1), 1.0 / 2048.0);
    }
}

#[test]
fn nearest_resizes_match_candle() {
    for dev in executors() {
        nearest_case::<f32>(&dev, [2, 3, 4, 5], 8, 10);
        nearest_case::<f32>(&dev, [1, 2, 7, 5], 3, 11);
        nearest_case::<bf16>(&dev, [1, 1, 5, 3], 5, 7);
        nearest_case::<u8>(&dev, [1, 2, 3, 3], 7, 2);
        nearest_case::<f64>(&dev, [1, 2, 1, 9], 1, 20);
        nearest_case::<f16>(&dev, [2, 2, 1, 6], 1, 4);
        nearest_case::<f32>(&dev, [0, 2, 4, 4], 8, 8);
    }
}

#[test]
fn bilinear_resizes_match_candle() {
    for dev in executors() {
        for align in [false, true] {
            bilinear_case::<f32>(&dev, [2, 3, 4, 5], 8, 10, align, None, None, false);
            bilinear_case::<f32>(&dev, [1, 2, 7, 5], 3, 11, align, None, None, false);
            bilinear_case::<f64>(&dev, [1, 2, 5, 6], 9, 4, align, None, None, false);
            bilinear_case::<bf16>(&dev, [1, 2, 5, 6], 10, 12, align, None, None, false);
            bilinear_case::<f16>(&dev, [1, 1, 3, 3], 7, 5, align, None, None, false);
            bilinear_case::<u8>(&dev, [1, 2, 4, 4], 9, 9, align, None, None, false);
            bilinear_case::<f32>(&dev, [1, 1, 1, 4], 1, 9, align, None, None, false);
        }
        // Scale factors (used only without align_corners), NaN/inf inputs, identity.
        bilinear_case::<f32>(&dev, [1, 2, 4, 6], 8, 9, false, Some(2.0), Some(1.5), false);
        bilinear_case::<bf16>(&dev, [1, 2, 4, 6], 9, 13, false, Some(2.3), None, false);
        bilinear_case::<f32>(&dev, [1, 3, 6, 6], 12, 12, false, None, None, true);
        bilinear_case::<f32>(&dev, [1, 3, 6, 5], 6, 5, false, None, None, true);
    }
}

#[test]
fn bad_pool_shapes_are_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let x = Nchw::contiguous([1, 2, 4, 4]);
    let src = dev.upload(&[1.0f32; 32]).unwrap();
    let mut out = dev.upload(&[5.0f32; 8]).unwrap();
    let bad = |r: Result<(usize, usize), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(bad(pool::max_pool2d::<f32>(&dev, &src, x, (5, 1), (1, 1), &mut out)));
    assert!(bad(pool::max_pool2d::<f32>(&dev, &src, x, (2, 2), (0, 1), &mut out)));
    assert!(bad(pool::avg_pool2d::<f32>(&dev, &src, x, (4, 4), (1, 1), &mut out)));
    assert!(bad(pool::avg_pool2d::<f32>(&dev, &src, Nchw { offset: 1, ..x }, (2, 2), (2, 2), &mut out)));
    let badr = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(badr(pool::upsample_nearest2d::<f32>(&dev, &src, x, (3, 3), &mut out)));
    assert!(badr(pool::upsample_bilinear2d::<f32>(&dev, &src, x, (2, 2), false, Some(-1.0), None, &mut out)));
    assert!(badr(pool::upsample_bilinear2d::<f32>(&dev, &src, Nchw::contiguous([1, 2, 0, 4]), (2, 2), false, None, None, &mut out)));
    assert!(dev.download(&out).unwrap().iter().all(|&v| v == 5.0));
}
