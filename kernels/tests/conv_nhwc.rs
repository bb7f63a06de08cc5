//! The channels-last implicit-GEMM convolution (`conv_implicit::conv2d_nhwc`: the GEMM
//! pipeline with its A tile gathered from an NHWC input) against a direct convolution in
//! f64, on the CPU executor in every matrix-unit mode (MFMA at wave 64; WMMA, gfx12 WMMA and
//! mma.sync at wave 32; the VALU fallback, which has no matrix unit, refuses): padding, channel counts that are no multiple of the
//! tile's K step (steps that straddle filter taps), pixel and output-channel counts that
//! are no multiple of the tile, batch > 1, bias, stride, dilation, split K, an input at an
//! offset in its buffer; the same for the wgmma kernel (`conv2d_nhwc_wgmma`, emulated by the
//! mma.sync executor); and typed errors for shapes they cannot take.
//!
//! Tolerance: inputs are exact in the element type and products accumulate in f32 over K
//! terms, then round once to f16/bf16: `(K * eps_f32 + eps_T) * sum |terms|`.
use half::{bf16, f16};
use kernel_dsl::host::{LaunchError, ScalarArg};
use kernels::conv::ops::ConvGeometry;
use kernels::conv_implicit::{conv2d_channels_last, conv2d_channels_last_with, nhwc_filter_layout, nhwc_weight, wgmma_refusal, Conv2dShape, FilterLayout, NhwcKernel};
use kernels::dtype::host::DType;
use kernels::gemm::GemmElem;
use kernels::runtime::Device;

mod common;
use common::matrix_executors;

trait F: GemmElem + ScalarArg + DType + std::fmt::Debug {
    const EPS: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
impl F for f16 {
    const EPS: f64 = 1.0 / 1024.0;
    fn from_f64(v: f64) -> Self { f16::from_f64(v) }
    fn to_f64(self) -> f64 { f16::to_f64(self) }
}
impl F for bf16 {
    const EPS: f64 = 1.0 / 128.0;
    fn from_f64(v: f64) -> Self { bf16::from_f64(v) }
    fn to_f64(self) -> f64 { bf16::to_f64(self) }
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

/// One convolution: `x` NHWC at element `offset` of its buffer, weights made in PyTorch's
/// layout and rearranged by `nhwc_weight` into the layout the kernel takes, compared
/// element by element with the f64 sum.
#[allow(clippy::too_many_arguments)] // one convolution's whole geometry
fn case<T: F>(dev: &Device, kernel: NhwcKernel, b: usize, c: usize, (h, w): (usize, usize), c_out: usize, k: (usize, usize), g: ConvGeometry, bias: bool, offset: usize, splits: Option<usize>) {
    use kernels::gemm::lowering_of;
    use kernel_dsl::mma::Lowering;
    let buf: Vec<T> = data(offset + b * h * w * c + 3, (b * 1000 + h * 10 + w + c) as u64);
    let weight: Vec<T> = data(c_out * c * k.0 * k.1, 77 + c_out as u64);
    let bias_v: Vec<T> = data(c_out, 5);
    let at = |bi: usize, ci: usize, y: usize, x: usize| buf[offset + ((bi * h + y) * w + x) * c + ci];
    let shape = Conv2dShape { batch: b, c_in: c, h, w, c_out, k_h: k.0, k_w: k.1, groups: 1 };
    let (oh, ow) = shape.out_hw(g).unwrap();
    let layout = nhwc_filter_layout::<T>(dev, &shape, g, kernel);
    let packed = nhwc_weight(&weight, [c_out, c, k.0, k.1], layout).unwrap();
    let (src, dw, db) = (dev.upload(&buf).unwrap(), dev.upload(&packed).unwrap(), dev.upload(&bias_v).unwrap());
    let mut out = dev.alloc::<T>(b * oh * ow * c_out).unwrap();
    let bias_arg: Option<&dyn kernel_dsl::host::KernelArgSlice<T>> = if bias { Some(&db) } else { None };
    let r = conv2d_channels_last_with::<T>(dev, &src, offset, &dw, layout, bias_arg, shape, g, &mut out, splits, kernel);
    if lowering_of(dev) == Lowering::Valu {
        // No matrix unit: refused with a typed error, nothing written.
        assert!(matches!(&r, Err(LaunchError::InvalidArgument { reason, .. }) if reason.contains("matrix unit")), "VALU lowering: {r:?}");
        assert!(dev.download(&out).unwrap().iter().all(|v| v.to_f64() == 0.0));
        return;
    }
    let hw = r.unwrap();
    assert_eq!(hw, (oh, ow));
    let got = dev.download(&out).unwrap();
    let what = format!(
        "conv2d_nhwc ({kernel:?}) {} on {} / {:?}: b{b} c{c} {h}x{w} -> {c_out} k{k:?} {g:?} bias {bias} offset {offset} splits {splits:?}",
        <T as DType>::NAME,
        kernel_dsl::host::Executor::name(dev),
        kernels::gemm::lowering_of(dev)
    );
    let eps = (c * k.0 * k.1) as f64 * f32::EPSILON as f64 + T::EPS;
    for bi in 0..b {
        for oy in 0..oh {
            for ox in 0..ow {
                for co in 0..c_out {
                    let bv = if bias { bias_v[co].to_f64() } else { 0.0 };
                    let (mut direct, mut mag) = (bv, bv.abs());
                    for ky in 0..k.0 {
                        for kx in 0..k.1 {
                            let y = (oy * g.stride + ky * g.dilation) as isize - g.padding as isize;
                            let x = (ox * g.stride + kx * g.dilation) as isize - g.padding as isize;
                            if y >= 0 && x >= 0 && (y as usize) < h && (x as usize) < w {
                                for ci in 0..c {
                                    let t = at(bi, ci, y as usize, x as usize).to_f64() * weight[((co * c + ci) * k.0 + ky) * k.1 + kx].to_f64();
                                    direct += t;
                                    mag += t.abs();
                                }
                            }
                        }
                    }
                    let v = got[((bi * oh + oy) * ow + ox) * c_out + co].to_f64();
                    let tol = eps * mag + 1e-30;
                    assert!((v - direct).abs() <= tol, "{what}: output ({bi}, {oy}, {ox}, {co}): got {v}, want {direct} (tolerance {tol})");
                }
            }
        }
    }
}

fn cases<T: F>() {
    let geo = |padding, stride, dilation| ConvGeometry { padding, stride, dilation };
    for dev in matrix_executors() {
        let tiled = |b, c, hw, c_out, k, g, bias, offset, splits| case::<T>(&dev, NhwcKernel::Tiled, b, c, hw, c_out, k, g, bias, offset, splits);
        // 3x3, padding 1, batch 2, bias; 8 channels: every K step spans several taps, and
        // K = 72 ends inside a step.
        tiled(2, 8, (5, 7), 6, (3, 3), geo(1, 1, 1), true, 0, None);
        // 24 channels (no multiple of any K step), 99 pixels, no bias, input at an offset.
        tiled(1, 24, (9, 11), 20, (3, 3), geo(1, 1, 1), false, 16, None);
        // More pixels than one M tile of every lowering (2 x 144 > 256) and more output
        // channels than one N tile (130 > 128).
        tiled(2, 16, (12, 12), 130, (3, 3), geo(1, 1, 1), true, 8, None);
        // 64 channels: whole K steps of one tap (the SD layers' case).
        tiled(1, 64, (6, 5), 9, (3, 3), geo(1, 1, 1), true, 0, None);
        // Stride 2, dilation 2 with padding 2, 1x1, a non-square filter.
        tiled(1, 16, (9, 8), 7, (3, 3), geo(1, 2, 1), true, 0, None);
        tiled(1, 8, (8, 7), 5, (3, 3), geo(2, 1, 2), true, 0, None);
        tiled(2, 40, (3, 5), 12, (1, 1), geo(0, 1, 1), true, 0, None);
        tiled(1, 8, (5, 6), 3, (2, 3), geo(0, 1, 1), false, 0, None);
        // Split K: K = 32 * 9 = 288 in 3 splits (partial sums, then the bias), and more
        // splits than steps.
        tiled(1, 32, (6, 6), 5, (3, 3), geo(1, 1, 1), true, 0, Some(3));
        tiled(2, 8, (4, 4), 3, (3, 3), geo(1, 1, 1), true, 0, Some(50));
        if let Some(why) = wgmma_refusal::<T>(&dev, &Conv2dShape { batch: 1, c_in: 8, h: 1, w: 1, c_out: 8, k_h: 1, k_w: 1, groups: 1 }) {
            if dev.is_gpu() {
                eprintln!("conv2d_nhwc_wgmma: skipped on {}: {why}", kernel_dsl::host::Executor::name(&dev));
            }
            continue;
        }
        // The wgmma kernel (the mma.sync executor emulates it): 288 pixels in three
        // 128-row tiles (the last partial), 136 output channels in two 128-column tiles
        // (the second 8 wide), K = 144 ending inside its third step, input at an offset.
        let wg = |b, c, hw, c_out, k, g, bias, offset, splits| case::<T>(&dev, NhwcKernel::Wgmma, b, c, hw, c_out, k, g, bias, offset, splits);
        wg(2, 16, (12, 12), 136, (3, 3), geo(1, 1, 1), true, 8, None);
        // 64 channels: nine whole K steps, around the three-stage ring three times.
        wg(1, 64, (6, 5), 16, (3, 3), geo(1, 1, 1), true, 0, None);
        // Steps that straddle taps, stride, dilation, 1x1, no bias.
        wg(2, 8, (5, 7), 8, (3, 3), geo(1, 1, 1), false, 0, None);
        wg(1, 16, (9, 8), 8, (3, 3), geo(1, 2, 1), true, 0, None);
        wg(1, 8, (8, 7), 8, (3, 3), geo(2, 1, 2), true, 0, None);
        wg(2, 40, (3, 5), 16, (1, 1), geo(0, 1, 1), true, 0, None);
        // Split K (3 splits of two steps; more splits than steps: empty splits add zeros).
        wg(1, 64, (6, 6), 8, (3, 3), geo(1, 1, 1), true, 0, Some(3));
        wg(2, 8, (4, 4), 8, (3, 3), geo(1, 1, 1), true, 0, Some(50));
        // The other rings (4 and 6 stages): nine steps around each, a partial tile, split K.
        let with = |stages, tile_n| NhwcKernel::WgmmaWith { stages, tile_n };
        for stages in [4, 6] {
            case::<T>(&dev, with(stages, None), 1, 64, (6, 5), 136, (3, 3), geo(1, 1, 1), true, 0, None);
            case::<T>(&dev, with(stages, None), 1, 64, (6, 6), 8, (3, 3), geo(1, 1, 1), false, 0, Some(2));
        }
        // Tiles 160 channels wide (m64n160k16, K-major filter) on every ring: 168 channels
        // in a whole tile and one 8 wide; stride 2 with 136 channels (one partial tile);
        // 320 in two whole ones, batch 2, split K. Each width forced (128 too: the
        // launcher may pick either on its own).
        for stages in [3, 4, 6] {
            case::<T>(&dev, with(stages, Some(160)), 1, 64, (6, 5), 168, (3, 3), geo(1, 1, 1), true, 8, None);
            case::<T>(&dev, with(stages, Some(160)), 1, 16, (9, 8), 136, (3, 3), geo(1, 2, 1), false, 0, None);
            case::<T>(&dev, with(stages, Some(128)), 1, 64, (6, 5), 136, (3, 3), geo(1, 1, 1), true, 8, None);
        }
        case::<T>(&dev, with(3, Some(160)), 2, 32, (5, 6), 320, (3, 3), geo(1, 1, 1), true, 0, Some(2));
        case::<T>(&dev, with(3, Some(128)), 2, 32, (5, 6), 320, (3, 3), geo(1, 1, 1), true, 0, None);
        // The launcher's own choice (`nhwc_filter_layout` asks its plan for the width).
        case::<T>(&dev, NhwcKernel::Auto, 2, 16, (12, 12), 320, (3, 3), geo(1, 1, 1), true, 0, None);
    }
}

#[test]
fn conv2d_nhwc_f16_matches_direct_sum_in_every_lowering() {
    cases::<f16>();
}

#[test]
fn conv2d_nhwc_bf16_matches_direct_sum_in_every_lowering() {
    cases::<bf16>();
}

#[test]
fn nhwc_weight_moves_each_element_to_its_layouts_order() {
    // w[co][ci][ky][kx] = 1000 co + 100 ci + 10 ky + kx.
    let (co_n, ci_n, kh, kw) = (3, 2, 2, 3);
    let w: Vec<u32> = (0..co_n * ci_n * kh * kw).map(|i| {
        let (co, r) = (i / (ci_n * kh * kw), i % (ci_n * kh * kw));
        let (ci, r) = (r / (kh * kw), r % (kh * kw));
        (1000 * co + 100 * ci + 10 * (r / kw) + r % kw) as u32
    }).collect();
    let hwio = nhwc_weight(&w, [co_n, ci_n, kh, kw], FilterLayout::Hwio).unwrap();
    let ohwi = nhwc_weight(&w, [co_n, ci_n, kh, kw], FilterLayout::Ohwi).unwrap();
    for ky in 0..kh {
        for kx in 0..kw {
            for ci in 0..ci_n {
                for co in 0..co_n {
                    let want = 1000 * co + 100 * ci + 10 * ky + kx;
                    assert_eq!(hwio[((ky * kw + kx) * ci_n + ci) * co_n + co] as usize, want);
                    assert_eq!(ohwi[((co * kh + ky) * kw + kx) * ci_n + ci] as usize, want);
                }
            }
        }
    }
    assert!(nhwc_weight(&w[1..], [co_n, ci_n, kh, kw], FilterLayout::Hwio).is_err());
    assert!(nhwc_weight(&w[1..], [co_n, ci_n, kh, kw], FilterLayout::Ohwi).is_err());
}

#[test]
fn conv2d_nhwc_rejects_bad_shapes_and_writes_nothing() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let g = ConvGeometry { padding: 1, stride: 1, dilation: 1 };
    let s = Conv2dShape { batch: 1, c_in: 8, h: 5, w: 5, c_out: 2, k_h: 3, k_w: 3, groups: 1 };
    let x = dev.upload(&[f16::ONE; 5 * 5 * 8 + 8]).unwrap();
    let w = dev.upload(&[f16::ONE; 9 * 8 * 2]).unwrap();
    let b3 = dev.upload(&[f16::ZERO; 3]).unwrap();
    let sentinel = vec![f16::from_f32(7.0); 50];
    let mut y = dev.upload(&sentinel).unwrap();
    let err = |r: Result<(usize, usize), LaunchError>| match r {
        Err(LaunchError::InvalidArgument { reason, .. }) => reason,
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    // Channels no multiple of 8, groups, too many taps.
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, Conv2dShape { c_in: 12, ..s }, g, &mut y)).contains("multiples of 8"));
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, Conv2dShape { groups: 2, ..s }, g, &mut y)).contains("groups"));
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, Conv2dShape { k_h: 7, k_w: 7, ..s }, g, &mut y)).contains("taps"));
    // Wrong weight, output and bias sizes; an input too short for its offset; an offset
    // that is not 16-byte aligned; a filter larger than the padded input.
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, Conv2dShape { c_out: 3, ..s }, g, &mut y)).contains("weight"));
    let mut y_short = dev.upload(&sentinel[..49]).unwrap();
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, s, g, &mut y_short)).contains("output"));
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, Some(&b3), s, g, &mut y)).contains("bias"));
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 16, &w, FilterLayout::Hwio, None, s, g, &mut y)).contains("elements"));
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 3, &w, FilterLayout::Hwio, None, s, g, &mut y)).contains("aligned"));
    assert!(matches!(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Hwio, None, s, ConvGeometry { padding: 0, stride: 1, dilation: 3 }, &mut y), Err(LaunchError::InvalidArgument { .. })));
    // f32 is not taken.
    let (xf, wf) = (dev.upload(&[1f32; 5 * 5 * 8]).unwrap(), dev.upload(&[1f32; 9 * 8 * 2]).unwrap());
    let mut yf = dev.alloc::<f32>(50).unwrap();
    assert!(err(conv2d_channels_last::<f32>(&dev, &xf, 0, &wf, FilterLayout::Hwio, None, s, g, &mut yf)).contains("f16 and bf16"));
    // The wgmma kernel: not on this executor (MFMA), nor for output channels that are no
    // multiple of 8 where it runs (the mma.sync executor).
    let wg = |dev: &Device, y: &mut kernels::runtime::DeviceVec<f16>| conv2d_channels_last_with::<f16>(dev, &x, 0, &w, FilterLayout::Ohwi, None, s, g, y, None, NhwcKernel::Wgmma);
    assert!(err(wg(&dev, &mut y)).contains("sm_90"));
    // A filter in the other kernel's layout.
    assert!(err(conv2d_channels_last::<f16>(&dev, &x, 0, &w, FilterLayout::Ohwi, None, s, g, &mut y)).contains("sm_90"));
    assert!(err(conv2d_channels_last_with::<f16>(&dev, &x, 0, &w, FilterLayout::Ohwi, None, s, g, &mut y, None, NhwcKernel::Tiled)).contains("FilterLayout::Hwio"));
    let mma = Device::cpu_with(kernel_dsl::host::CpuExecutor::new(kernel_dsl::host::WaveSize::W32).with_matrix_unit(kernel_dsl::host::MatrixUnit::MmaSync));
    let (x, w) = (mma.upload(&[f16::ONE; 5 * 5 * 8 + 8]).unwrap(), mma.upload(&[f16::ONE; 9 * 8 * 2]).unwrap());
    let mut y_mma = mma.upload(&sentinel).unwrap();
    let r = conv2d_channels_last_with::<f16>(&mma, &x, 0, &w, FilterLayout::Ohwi, None, s, g, &mut y_mma, None, NhwcKernel::Wgmma);
    assert!(err(r).contains("multiples of 8"));
    let s8 = Conv2dShape { c_out: 8, ..s };
    let w8 = mma.upload(&[f16::ONE; 9 * 8 * 8]).unwrap();
    let r = conv2d_channels_last_with::<f16>(&mma, &x, 0, &w8, FilterLayout::Ohwi, None, s8, g, &mut y_mma, None, NhwcKernel::WgmmaWith { stages: 5, tile_n: None });
    assert!(err(r).contains("stages"));
    let r = conv2d_channels_last_with::<f16>(&mma, &x, 0, &w8, FilterLayout::Ohwi, None, s8, g, &mut y_mma, None, NhwcKernel::WgmmaWith { stages: 3, tile_n: Some(96) });
    assert!(err(r).contains("channels wide"));
    let r = conv2d_channels_last_with::<f16>(&mma, &x, 0, &w8, FilterLayout::Hwio, None, s8, g, &mut y_mma, None, NhwcKernel::WgmmaWith { stages: 3, tile_n: Some(160) });
    assert!(err(r).contains("take the filter as Ohwi"));
    assert_eq!(dev.download(&y).unwrap(), sentinel);
    assert_eq!(dev.download(&y_short).unwrap(), sentinel[..49]);
    assert_eq!(mma.download(&y_mma).unwrap(), sentinel);
}
