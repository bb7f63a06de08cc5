//! im2col / col2im against direct convolution references in f64: conv1d/conv2d computed as
//! im2col (kernel) + a host GEMM must equal the textbook sum, and conv_transpose as a host
//! GEMM + col2im (kernel) must equal the scatter definition; im2col itself is also compared
//! bit for bit with the window definition (it only moves data). CPU executor with waves of
//! 32 and 64, odd sizes, padding/stride/dilation, output padding, empty batches, and a
//! strided (non-contiguous) input.
//!
//! Tolerances: the kernel results are data (im2col, exact) or sums of at most
//! `k_h*k_w` column entries rounded once to the element type (col2im accumulates in f32
//! or f64); the GEMM here runs in f64, so f32 results differ from the reference by the
//! rounding of the inputs (none: inputs are generated in the element type) plus one
//! final rounding: 2 ulp-scaled relative bound `4 * eps * sum |terms|`.
use half::{bf16, f16};
use kernel_dsl::host::LaunchError;
use kernels::conv::ops::{self as conv, ConvGeometry};
use kernels::dtype::host::DType;
use kernels::dtype::Real;
use kernels::runtime::Device;

mod common;
use common::{executors, matrix_executors};

trait F: Real + DType + std::fmt::Debug {
    const EPS: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn bits(self) -> u64;
}
impl F for f32 {
    const EPS: f64 = f32::EPSILON as f64;
    fn from_f64(v: f64) -> Self { v as f32 }
    fn to_f64(self) -> f64 { self as f64 }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}
impl F for f64 {
    const EPS: f64 = f64::EPSILON;
    fn from_f64(v: f64) -> Self { v }
    fn to_f64(self) -> f64 { self }
    fn bits(self) -> u64 { self.to_bits() }
}
impl F for f16 {
    const EPS: f64 = 1.0 / 1024.0;
    fn from_f64(v: f64) -> Self { f16::from_f64(v) }
    fn to_f64(self) -> f64 { self.to_f64() }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}
impl F for bf16 {
    const EPS: f64 = 1.0 / 128.0;
    fn from_f64(v: f64) -> Self { bf16::from_f64(v) }
    fn to_f64(self) -> f64 { self.to_f64() }
    fn bits(self) -> u64 { self.to_bits() as u64 }
}

fn data<T: F>(n: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15).wrapping_add(7);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            T::from_f64(((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0)
        })
        .collect()
}

fn close(got: f64, want: f64, mag: f64, eps: f64, what: &str) {
    let tol = 4.0 * eps * mag + 1e-30;
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want} (tolerance {tol})");
}

/// conv2d as im2col (kernel) + GEMM (host, f64) against the direct f64 sum. The input is
/// read through a view with padded rows (row stride w + 3) and an offset, to exercise
/// strided inputs.
#[allow(clippy::too_many_arguments)] // one convolution's whole geometry
fn conv2d_case<T: F>(dev: &Device, b: usize, c: usize, h: usize, w: usize, c_out: usize, k: (usize, usize), g: ConvGeometry) {
    let (s3, s2) = (1, w + 3);
    let (s1, s0) = (h * s2, c * h * s2);
    let offset = 5;
    let buf: Vec<T> = data(offset + b * s0 + 1, (b * 1000 + h * 10 + w) as u64);
    let weight: Vec<T> = data(c_out * c * k.0 * k.1, 77);
    let at = |bi: usize, ci: usize, y: usize, x: usize| buf[offset + bi * s0 + ci * s1 + y * s2 + x * s3];
    let h_out = conv::conv_out_len(h, k.0, g).unwrap();
    let w_out = conv::conv_out_len(w, k.1, g).unwrap();
    let cols_n = b * h_out * w_out * c * k.0 * k.1;
    let mut cols = dev.alloc::<T>(cols_n).unwrap();
    let src = dev.upload(&buf).unwrap();
    let hw = conv::im2col2d::<T>(dev, &src, [b, c, h, w], [s0, s1, s2, s3], offset, k, g, &mut cols).unwrap();
    assert_eq!(hw, (h_out, w_out));
    let cols = dev.download(&cols).unwrap();
    let what = format!("conv2d {} b{b} c{c} {h}x{w} k{k:?} {g:?}", T::NAME);
    // im2col bit for bit against the window definition.
    let mut idx = 0;
    for bi in 0..b {
        for oy in 0..h_out {
            for ox in 0..w_out {
                for ci in 0..c {
                    for ky in 0..k.0 {
                        for kx in 0..k.1 {
                            let y = (oy * g.stride + ky * g.dilation) as isize - g.padding as isize;
                            let x = (ox * g.stride + kx * g.dilation) as isize - g.padding as isize;
                            let want = if y < 0 || x < 0 || y >= h as isize || x >= w as isize { T::from_f64(0.0) } else { at(bi, ci, y as usize, x as usize) };
                            assert_eq!(cols[idx].bits(), want.bits(), "{what}: im2col element {idx}");
                            idx += 1;
                        }
                    }
                }
            }
        }
    }
    // GEMM on the host, against the direct convolution.
    let kk = c * k.0 * k.1;
    for bi in 0..b {
        for co in 0..c_out {
            for oy in 0..h_out {
                for ox in 0..w_out {
                    let row = (bi * h_out + oy) * w_out + ox;
                    let gemm: f64 = (0..kk).map(|j| cols[row * kk + j].to_f64() * weight[co * kk + j].to_f64()).sum();
                    let (mut direct, mut mag) = (0.0, 0.0);
                    for ci in 0..c {
                        for ky in 0..k.0 {
                            for kx in 0..k.1 {
                                let y = (oy * g.stride + ky * g.dilation) as isize - g.padding as isize;
                                let x = (ox * g.stride + kx * g.dilation) as isize - g.padding as isize;
                                if y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w {
                                    let t = at(bi, ci, y as usize, x as usize).to_f64() * weight[((co * c + ci) * k.0 + ky) * k.1 + kx].to_f64();
                                    direct += t;
                                    mag += t.abs();
                                }
                            }
                        }
                    }
                    close(gemm, direct, mag, f64::EPSILON, &what);
                }
            }
        }
    }
}

fn conv1d_case<T: F>(dev: &Device, b: usize, c: usize, l: usize, k: usize, g: ConvGeometry) {
    // Input (b, c, l) transposed in memory: stored as (b, l, c).
    let buf: Vec<T> = data(b * l * c, (l * 7 + k) as u64);
    let (s0, s1, s2) = (l * c, 1, c);
    let l_out = conv::conv_out_len(l, k, g).unwrap();
    let mut cols = dev.alloc::<T>(b * l_out * c * k).unwrap();
    let src = dev.upload(&buf).unwrap();
    assert_eq!(conv::im2col1d::<T>(dev, &src, [b, c, l], [s0, s1, s2], 0, k, g, &mut cols).unwrap(), l_out);
    let cols = dev.download(&cols).unwrap();
    let mut idx = 0;
    for bi in 0..b {
        for o in 0..l_out {
            for ci in 0..c {
                for kk in 0..k {
                    let x = (o * g.stride + kk * g.dilation) as isize - g.padding as isize;
                    let want = if x < 0 || x >= l as isize { T::from_f64(0.0) } else { buf[bi * s0 + ci * s1 + x as usize * s2] };
                    assert_eq!(cols[idx].bits(), want.bits(), "im2col1d {} element {idx}", T::NAME);
                    idx += 1;
                }
            }
        }
    }
}

/// conv_transpose2d as GEMM (host) + col2im (kernel) against the scatter definition.
#[allow(clippy::too_many_arguments)]
fn conv_t2d_case<T: F>(dev: &Device, b: usize, c_in: usize, h: usize, w: usize, c_out: usize, k: (usize, usize), g: ConvGeometry, op: usize) {
    let x: Vec<T> = data(b * c_in * h * w, 3 + h as u64);
    let wt: Vec<T> = data(c_in * c_out * k.0 * k.1, 4 + w as u64);
    let h_out = conv::conv_transpose_out_len(h, k.0, g, op).unwrap();
    let w_out = conv::conv_transpose_out_len(w, k.1, g, op).unwrap();
    // col (b, h, w, c_out, kh, kw) = x^T (b, h*w, c_in) @ W (c_in, c_out*kh*kw), rounded to T.
    let ck = c_out * k.0 * k.1;
    let mut col = vec![T::from_f64(0.0); b * h * w * ck];
    for bi in 0..b {
        for p in 0..h * w {
            for j in 0..ck {
                let s: f64 = (0..c_in).map(|ci| x[(bi * c_in + ci) * h * w + p].to_f64() * wt[ci * ck + j].to_f64()).sum();
                col[(bi * h * w + p) * ck + j] = T::from_f64(s);
            }
        }
    }
    // Reference: scatter every column entry to its output position, in f64.
    let mut want = vec![0.0f64; b * c_out * h_out * w_out];
    let mut mag = vec![0.0f64; want.len()];
    for bi in 0..b {
        for iy in 0..h {
            for ix in 0..w {
                for co in 0..c_out {
                    for ky in 0..k.0 {
                        for kx in 0..k.1 {
                            let y = (iy * g.stride + ky * g.dilation) as isize - g.padding as isize;
                            let xx = (ix * g.stride + kx * g.dilation) as isize - g.padding as isize;
                            if y < 0 || xx < 0 || y >= h_out as isize || xx >= w_out as isize {
                                continue;
                            }
                            let v = col[((((bi * h + iy) * w + ix) * c_out + co) * k.0 + ky) * k.1 + kx].to_f64();
                            let o = ((bi * c_out + co) * h_out + y as usize) * w_out + xx as usize;
                            want[o] += v;
                            mag[o] += v.abs();
                        }
                    }
                }
            }
        }
    }
    let dcol = dev.upload(&col).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    assert_eq!(conv::col2im2d::<T>(dev, &dcol, (b, h, w, c_out), k, g, op, &mut out).unwrap(), (h_out, w_out));
    let got = dev.download(&out).unwrap();
    let what = format!("col2im2d {} {h}x{w} k{k:?} {g:?} op{op}", T::NAME);
    // Sum in f32/f64 then one rounding to T: |err| <= (k_h*k_w) * eps_acc * mag + eps_T/2 * |sum|.
    let acc_eps = if T::EPS == f64::EPSILON { f64::EPSILON } else { f32::EPSILON as f64 };
    for i in 0..want.len() {
        let tol = (k.0 * k.1) as f64 * acc_eps * mag[i] + T::EPS * want[i].abs() + 1e-30;
        assert!((got[i].to_f64() - want[i]).abs() <= tol, "{what}: element {i}: got {:?}, want {}", got[i], want[i]);
    }
    // 1-D: the same with h = 1, k_h = 1: row y = 0 of the 2-D result (output padding also
    // adds rows in 2-D, which receive nothing).
    if h == 1 && k.0 == 1 && g.padding == 0 {
        let mut out1 = dev.alloc::<T>(b * c_out * w_out).unwrap();
        assert_eq!(conv::col2im1d::<T>(dev, &dcol, (b, w, c_out), k.1, g, op, &mut out1).unwrap(), w_out);
        let row0: Vec<u64> = (0..b * c_out).flat_map(|p| (0..w_out).map(move |x| (p * h_out) * w_out + x)).map(|i| got[i].bits()).collect();
        assert_eq!(dev.download(&out1).unwrap().iter().map(|v| v.bits()).collect::<Vec<_>>(), row0, "{what}: 1-D");
    }
}

fn geo(padding: usize, stride: usize, dilation: usize) -> ConvGeometry {
    ConvGeometry { padding, stride, dilation }
}

#[test]
fn conv2d_is_im2col_plus_gemm() {
    for dev in executors() {
        conv2d_case::<f32>(&dev, 2, 3, 7, 9, 4, (3, 3), geo(1, 1, 1));
        conv2d_case::<f32>(&dev, 1, 2, 11, 6, 3, (3, 2), geo(2, 2, 2));
        conv2d_case::<f64>(&dev, 1, 3, 5, 5, 2, (5, 5), geo(2, 3, 1));
        conv2d_case::<bf16>(&dev, 1, 2, 6, 7, 2, (1, 1), geo(0, 2, 1));
        conv2d_case::<f16>(&dev, 3, 1, 4, 4, 1, (4, 4), geo(0, 1, 1));
        conv2d_case::<f32>(&dev, 0, 3, 5, 5, 2, (3, 3), geo(1, 1, 1));
        conv1d_case::<f32>(&dev, 2, 3, 13, 3, geo(1, 2, 1));
        conv1d_case::<bf16>(&dev, 1, 4, 9, 2, geo(3, 1, 3));
        conv1d_case::<f64>(&dev, 3, 1, 5, 5, geo(0, 1, 1));
    }
}

#[test]
fn conv_transpose_is_gemm_plus_col2im() {
    for dev in executors() {
        conv_t2d_case::<f32>(&dev, 2, 3, 4, 5, 2, (3, 3), geo(0, 1, 1), 0);
        conv_t2d_case::<f32>(&dev, 1, 2, 5, 3, 3, (3, 2), geo(1, 2, 1), 1);
        conv_t2d_case::<f32>(&dev, 1, 2, 3, 4, 2, (2, 3), geo(2, 3, 2), 2);
        conv_t2d_case::<f64>(&dev, 1, 3, 4, 4, 2, (4, 4), geo(1, 2, 1), 1);
        conv_t2d_case::<bf16>(&dev, 2, 2, 3, 3, 2, (3, 3), geo(1, 2, 1), 0);
        conv_t2d_case::<f16>(&dev, 1, 2, 1, 7, 3, (1, 3), geo(0, 2, 1), 1);
        conv_t2d_case::<f32>(&dev, 2, 2, 1, 9, 2, (1, 4), geo(0, 3, 2), 2);
        conv_t2d_case::<f32>(&dev, 0, 2, 3, 3, 2, (3, 3), geo(0, 1, 1), 0);
    }
}

#[test]
fn bad_conv_shapes_are_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let x = dev.upload(&[1.0f32; 2 * 3 * 4 * 4]).unwrap();
    let mut out = dev.upload(&[7.0f32; 2 * 3 * 4 * 4 * 9]).unwrap();
    let bad = |r: Result<(usize, usize), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    // Kernel larger than the padded input, zero stride, wrong output length, view outside the buffer.
    assert!(bad(conv::im2col2d::<f32>(&dev, &x, [2, 3, 4, 4], [48, 16, 4, 1], 0, (7, 7), geo(1, 1, 1), &mut out)));
    assert!(bad(conv::im2col2d::<f32>(&dev, &x, [2, 3, 4, 4], [48, 16, 4, 1], 0, (3, 3), geo(1, 0, 1), &mut out)));
    assert!(bad(conv::im2col2d::<f32>(&dev, &x, [2, 3, 4, 4], [48, 16, 4, 1], 0, (3, 3), geo(0, 1, 1), &mut out)));
    assert!(bad(conv::im2col2d::<f32>(&dev, &x, [2, 3, 4, 4], [48, 16, 4, 1], 1, (3, 3), geo(1, 1, 1), &mut out)));
    assert!(bad(conv::col2im2d::<f32>(&dev, &x, (2, 4, 4, 3), (3, 3), geo(0, 1, 1), 0, &mut out)));
    assert!(bad(conv::col2im2d::<f32>(&dev, &x, (2, 1, 1, 3), (1, 1), geo(1, 1, 1), 0, &mut out)));
    assert!(dev.download(&out).unwrap().iter().all(|&v| v == 7.0));
}

/// One implicit-GEMM convolution against the direct f64 sum (with groups and bias), the
/// input read through a strided view (rows padded by 3, an offset of 5).
///
/// Tolerance: the inputs are exact in `T`; 16-bit products are exact in f32 and summed in
/// f32 (at most `K` roundings of partial sums: `K * eps_f32 * sum |terms|`), then rounded
/// once to `T` (`eps_T * sum |terms|`, with `sum |terms|` including the bias). f32 inputs
/// multiply as three bf16 products (about 16 significant bits each: `2^-14 * sum |terms|`).
#[allow(clippy::too_many_arguments)] // one convolution's whole geometry
fn implicit_case<T: F + kernels::gemm::GemmElem + kernel_dsl::host::ScalarArg>(dev: &Device, b: usize, c: usize, hw: (usize, usize), c_out: usize, k: (usize, usize), g: ConvGeometry, groups: usize) {
    implicit_case_split::<T>(dev, b, c, hw, c_out, k, g, groups, None)
}

/// [`implicit_case`] with the K splits given (`conv2d_split`): the f32 partial sums and
/// the second pass that adds them with the bias.
#[allow(clippy::too_many_arguments)] // one convolution's whole geometry
fn implicit_case_split<T: F + kernels::gemm::GemmElem + kernel_dsl::host::ScalarArg>(dev: &Device, b: usize, c: usize, (h, w): (usize, usize), c_out: usize, k: (usize, usize), g: ConvGeometry, groups: usize, splits: Option<usize>) {
    use kernels::conv_implicit::{conv2d_split, Conv2dShape};
    let (s3, s2) = (1, w + 3);
    let (s1, s0) = (h * s2, c * h * s2);
    let offset = 5;
    let buf: Vec<T> = data(offset + b * s0 + 1, (b * 1000 + h * 10 + w + c) as u64);
    let cg = c / groups;
    let weight: Vec<T> = data(c_out * cg * k.0 * k.1, 77 + c_out as u64);
    let bias: Vec<T> = data(c_out, 5);
    let at = |bi: usize, ci: usize, y: usize, x: usize| buf[offset + bi * s0 + ci * s1 + y * s2 + x * s3];
    let shape = Conv2dShape { batch: b, c_in: c, h, w, c_out, k_h: k.0, k_w: k.1, groups };
    let (oh, ow) = shape.out_hw(g).unwrap();
    let (src, dw, db) = (dev.upload(&buf).unwrap(), dev.upload(&weight).unwrap(), dev.upload(&bias).unwrap());
    let mut out = dev.alloc::<T>(b * c_out * oh * ow).unwrap();
    let hw = conv2d_split::<T>(dev, &src, [s0, s1, s2, s3], offset, &dw, Some(&db), shape, g, &mut out, splits).unwrap();
    assert_eq!(hw, (oh, ow));
    let got = dev.download(&out).unwrap();
    let what = format!("implicit conv2d {} on {} / {:?}: b{b} c{c} {h}x{w} -> {c_out} k{k:?} {g:?} groups {groups} splits {splits:?}", <T as DType>::NAME, kernel_dsl::host::Executor::name(dev), kernels::gemm::lowering_of(dev));
    let kk = (cg * k.0 * k.1) as f64;
    let eps = if T::EPS < 1e-6 { 2f64.powi(-14) } else { kk * f32::EPSILON as f64 + T::EPS };
    let cog = c_out / groups;
    for bi in 0..b {
        for co in 0..c_out {
            let gi = co / cog;
            for oy in 0..oh {
                for ox in 0..ow {
                    let bv = bias[co].to_f64();
                    let (mut direct, mut mag) = (bv, bv.abs());
                    for ci in 0..cg {
                        for ky in 0..k.0 {
                            for kx in 0..k.1 {
                                let y = (oy * g.stride + ky * g.dilation) as isize - g.padding as isize;
                                let x = (ox * g.stride + kx * g.dilation) as isize - g.padding as isize;
                                if y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w {
                                    let t = at(bi, gi * cg + ci, y as usize, x as usize).to_f64() * weight[((co * cg + ci) * k.0 + ky) * k.1 + kx].to_f64();
                                    direct += t;
                                    mag += t.abs();
                                }
                            }
                        }
                    }
                    let i = ((bi * c_out + co) * oh + oy) * ow + ox;
                    let tol = eps * mag + 1e-30;
                    let v = got[i].to_f64();
                    assert!((v - direct).abs() <= tol, "{what}: output ({bi}, {co}, {oy}, {ox}): got {v}, want {direct} (tolerance {tol})");
                }
            }
        }
    }
}

fn implicit_cases<T: F + kernels::gemm::GemmElem + kernel_dsl::host::ScalarArg>() {
    let geo = |padding, stride, dilation| ConvGeometry { padding, stride, dilation };
    for dev in matrix_executors() {
        // 3x3, padding 1; K = 72 (16-byte rows of weights: the chunked A copies).
        implicit_case::<T>(&dev, 2, 8, (5, 7), 6, (3, 3), geo(1, 1, 1), 1);
        // K = 45: weight rows not 16-byte multiples (element copies), partial K steps.
        implicit_case::<T>(&dev, 1, 5, (6, 5), 3, (3, 3), geo(1, 1, 1), 1);
        // Stride 2.
        implicit_case::<T>(&dev, 1, 3, (9, 8), 4, (3, 3), geo(1, 2, 1), 1);
        // Dilation 2, padding 2.
        implicit_case::<T>(&dev, 1, 4, (8, 7), 3, (3, 3), geo(2, 1, 2), 1);
        // Groups 2.
        implicit_case::<T>(&dev, 2, 6, (6, 5), 4, (3, 3), geo(1, 1, 1), 2);
        // 1x1 with more output channels than one M tile of the small lowerings, and a
        // non-square kernel with no padding.
        implicit_case::<T>(&dev, 1, 4, (3, 4), 70, (1, 1), geo(0, 1, 1), 1);
        implicit_case::<T>(&dev, 1, 3, (5, 6), 2, (2, 3), geo(0, 1, 1), 1);
        // More output positions than one N tile of every lowering (144 > 128).
        implicit_case::<T>(&dev, 1, 2, (12, 12), 3, (3, 3), geo(1, 1, 1), 1);
        // Split K: K = 16 * 9 = 144 (5 steps of 32, 3 of 64, 9 of 16) in 3 and in 2 splits,
        // with groups (each group's partial tiles), stride 2, and more splits than steps.
        implicit_case_split::<T>(&dev, 2, 16, (6, 7), 5, (3, 3), geo(1, 1, 1), 1, Some(3));
        implicit_case_split::<T>(&dev, 1, 32, (5, 5), 6, (3, 3), geo(1, 2, 1), 2, Some(2));
        implicit_case_split::<T>(&dev, 1, 4, (4, 4), 3, (1, 1), geo(0, 1, 1), 1, Some(9));
    }
}

/// The automatic K split: none where the grid fills the device or the unit count is
/// unknown; enough splits for one work-group per unit, at least 4 K steps each, every
/// split non-empty.
#[test]
fn implicit_conv2d_split_k_choice() {
    use kernels::conv_implicit::split_k;
    assert_eq!(split_k(None, 10, 100), 1);
    assert_eq!(split_k(Some(132), 132, 100), 1);
    assert_eq!(split_k(Some(132), 200, 100), 1);
    // SD 1.5's 1280-channel 3x3 at 16x16, batch 2, on an H100: 20 tiles, 180 steps of 64.
    assert_eq!(split_k(Some(132), 20, 180), 7);
    // Few steps: at least 4 per split.
    assert_eq!(split_k(Some(132), 10, 9), 2);
    assert_eq!(split_k(Some(132), 10, 3), 1);
    // 12 steps in 3 splits of 4.
    assert_eq!(split_k(Some(30), 10, 12), 3);
    for (cus, blocks, steps) in [(132u32, 7usize, 37usize), (304, 3, 500), (80, 40, 9)] {
        let s = split_k(Some(cus), blocks, steps);
        let per = steps.div_ceil(s);
        assert!((s - 1) * per < steps, "{cus} {blocks} {steps}: {s} splits of {per} leave one empty");
        assert!(s == 1 || per >= 4);
    }
}

#[test]
fn implicit_conv2d_f16_matches_direct_sum_in_every_lowering() {
    implicit_cases::<f16>();
}

#[test]
fn implicit_conv2d_bf16_matches_direct_sum_in_every_lowering() {
    implicit_cases::<bf16>();
}

#[test]
fn implicit_conv2d_f32_matches_direct_sum_in_every_lowering() {
    implicit_cases::<f32>();
}

#[test]
fn implicit_conv2d_rejects_bad_shapes_and_writes_nothing() {
    use kernels::conv_implicit::{conv2d, Conv2dShape};
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let g = ConvGeometry { padding: 1, stride: 1, dilation: 1 };
    let s = Conv2dShape { batch: 1, c_in: 4, h: 5, w: 5, c_out: 2, k_h: 3, k_w: 3, groups: 1 };
    let x = dev.upload(&[1.0f32; 100]).unwrap();
    let w = dev.upload(&[1.0f32; 2 * 4 * 9]).unwrap();
    let b3 = dev.upload(&[0.0f32; 3]).unwrap();
    let strides = [100, 25, 5, 1];
    let sentinel = vec![7.0f32; 50];
    let mut y = dev.upload(&sentinel).unwrap();
    let err = |r: Result<(usize, usize), LaunchError>| match r {
        Err(LaunchError::InvalidArgument { reason, .. }) => reason,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, None, Conv2dShape { groups: 3, ..s }, g, &mut y)).contains("groups"));
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, None, Conv2dShape { c_out: 3, ..s }, g, &mut y)).contains("weight has"));
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, Some(&b3), s, g, &mut y)).contains("bias has 3"));
    assert!(err(conv2d::<f32>(&dev, &x, strides, 1, &w, None, s, g, &mut y)).contains("input view"));
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, None, s, ConvGeometry { stride: 0, ..g }, &mut y)).contains("stride"));
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, None, Conv2dShape { k_h: 9, ..s }, ConvGeometry { padding: 0, ..g }, &mut y)).contains("shorter"));
    let mut y_short = dev.upload(&[7.0f32; 49]).unwrap();
    assert!(err(conv2d::<f32>(&dev, &x, strides, 0, &w, None, s, g, &mut y_short)).contains("output has 49"));
    assert_eq!(dev.download(&y).unwrap(), sentinel);
    assert_eq!(dev.download(&y_short).unwrap(), vec![7.0f32; 49]);
    // The same arguments, corrected, run.
    conv2d::<f32>(&dev, &x, strides, 0, &w, None, s, g, &mut y).unwrap();
    // Centre output: all 36 taps of ones.
    assert_eq!(dev.download(&y).unwrap()[12], 36.0);
}
