//! 2-D convolution at the distinct layer shapes of Stable Diffusion 1.5 (UNet at 512x512,
//! batch 2 for classifier-free guidance; VAE decoder, batch 1), f16 by default, timed with
//! GPU events, in TFLOP/s: the implicit-GEMM kernel (`kernels::conv_implicit::conv2d`,
//! op `conv_implicit`) against the im2col path it replaces in candle-rocm (`im2col2d` into
//! a `(b, oh*ow, c_in*k*k)` buffer, then `kernels::gemm::matmul_strided` with the columns
//! read transposed; op `conv_im2col`; candle-rocm runs that GEMM on cuBLAS where it
//! loads, this bench on our GEMM kernels). 1x1 layers also as the plain GEMM candle-rocm
//! takes for them (op `conv_1x1_gemm`). Layers it takes also run channels-last on
//! `kernels::conv_implicit::conv2d_channels_last` (op `conv_nhwc`: NHWC input, the filter
//! rearranged once, the GEMM pipeline gathering input patches, or on Hopper the wgmma
//! kernel; there the GEMM pipeline's kernel also runs as op `conv_nhwc_tiled`, the wgmma
//! kernel with 128- and 160-channel tiles forced as `conv_nhwc_n128` / `conv_nhwc_n160`,
//! each also without split K as `..._nosplit`),
//! and as candle-rocm runs it for an NCHW tensor (op `conv_nhwc_route`: input to NHWC,
//! filter rearranged, the kernel, result back to NCHW; the copies on
//! `permute::transpose_copy`).
//! A spot check of a few outputs of each shape
//! against f64.
//!
//! The shapes are [`benches::sd_conv_layers`] (`python/sd_conv_layers.csv`, which
//! `python/torch_conv.py` reads too).
//!
//! `conv [--out DIR] [--quick] [--dtype f16|bf16]`: writes `DIR/rust_conv.json`;
//! `python/torch_conv.py` times `torch.nn.functional.conv2d` (cuDNN, NCHW and channels-last)
//! on the same shapes and `python/report_conv.py` merges both.
use benches::{sd_conv_layers, time, uniform, Args, ConvLayer};
use half::{bf16, f16};
use kernel_dsl::host::ScalarArg;
use kernels::conv::ops::{im2col2d, ConvGeometry};
use kernels::convert::ops::copy_strided;
use kernels::conv_implicit::{conv2d, conv2d_channels_last, conv2d_channels_last_with, nhwc_filter_layout, nhwc_refusal, nhwc_weight, wgmma_refusal, Conv2dShape, FilterLayout, NhwcKernel};
use kernels::gemm::{self, Epilogue, GemmElem, GemmShape, Strides};
use kernels::elementwise::{copy_runs, launch_config, RunView};
use kernels::permute::{transpose_copy, TransposeView};
use kernels::runtime::{Device, DeviceVec};

struct Row {
    op: &'static str,
    layer: &'static str,
    dtype: &'static str,
    shape: [usize; 8],
    us: f64,
}

fn run<T: GemmElem + ScalarArg + kernels::dtype::host::DType>(dev: &Device, l: ConvLayer, out: &mut Vec<Row>) {
    let (layer, b, c_in, h, w, c_out, k, stride, padding) = l;
    let g = ConvGeometry { padding, stride, dilation: 1 };
    let s = Conv2dShape { batch: b, c_in, h, w, c_out, k_h: k, k_w: k, groups: 1 };
    let (oh, ow) = s.out_hw(g).unwrap();
    let (x, wt) = (uniform::<T>(b * c_in * h * w, 1, 1.0), uniform::<T>(c_out * c_in * k * k, 2, 1.0));
    let (dx, dw) = (dev.upload(&x).unwrap(), dev.upload(&wt).unwrap());
    let mut dy: DeviceVec<T> = dev.alloc(b * c_out * oh * ow).unwrap();
    let flops = 2 * b * c_out * oh * ow * c_in * k * k;
    let strides = [c_in * h * w, h * w, w, 1];
    let kk = c_in * k * k;
    let hw = oh * ow;
    let shape = [b, c_in, h, w, c_out, k, stride, padding];
    let mut record = |op: &'static str, us: f64, y: &[T]| {
        // Spot check: three outputs against f64.
        for (bi, co, p) in [(0, 0, 0), (b - 1, c_out - 1, hw - 1), (b / 2, c_out / 3, hw / 2)] {
            let (oy, ox) = (p / ow, p % ow);
            let (mut want, mut mag) = (0f64, 0f64);
            for ci in 0..c_in {
                for ky in 0..k {
                    for kx in 0..k {
                        let (iy, ix) = ((oy * stride + ky) as isize - padding as isize, (ox * stride + kx) as isize - padding as isize);
                        if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                            let t = x[((bi * c_in + ci) * h + iy as usize) * w + ix as usize].to_f32() as f64 * wt[((co * c_in + ci) * k + ky) * k + kx].to_f32() as f64;
                            want += t;
                            mag += t.abs();
                        }
                    }
                }
            }
            let got = y[(bi * c_out + co) * hw + p].to_f32() as f64;
            assert!((got - want).abs() <= 1e-2 * want.abs() + 1e-3 * mag + 1e-3, "{op} {layer} {}: y[{bi}, {co}, {p}] = {got}, want {want}", <T as kernels::dtype::host::DType>::NAME);
        }
        let tflops = flops as f64 / (us * 1e-6) / 1e12;
        eprintln!("{op:<14} {:<5} {layer:<26} {us:>10.1} us {tflops:>7.1} TFLOP/s", <T as kernels::dtype::host::DType>::NAME);
        out.push(Row { op, layer, dtype: <T as kernels::dtype::host::DType>::NAME, shape, us });
    };
    let mut implicit = || {
        conv2d::<T>(dev, &dx, strides, 0, &dw, None, s, g, &mut dy).unwrap();
    };
    let us = time(dev, flops, &mut implicit);
    record("conv_implicit", us, &dev.download(&dy).unwrap());

    // Channels-last: the same input as NHWC, the filter in the layout the launcher's
    // kernel takes ((c_out, k, k, c_in) for wgmma, else (k, k, c_in, c_out)); the result
    // goes back to NCHW for the spot check.
    if nhwc_refusal::<T>(dev, &s).is_none() {
        let mut xn = vec![x[0]; x.len()];
        for (i, v) in x.iter().enumerate() {
            let (bc, p) = (i / (h * w), i % (h * w));
            let (bi, ci) = (bc / c_in, bc % c_in);
            xn[(bi * h * w + p) * c_in + ci] = *v;
        }
        let layout = nhwc_filter_layout::<T>(dev, &s, g, NhwcKernel::Auto);
        let wn = nhwc_weight(&wt, [c_out, c_in, k, k], layout).unwrap();
        let (dxn, dwn) = (dev.upload(&xn).unwrap(), dev.upload(&wn).unwrap());
        let mut dyn_out: DeviceVec<T> = dev.alloc(b * hw * c_out).unwrap();
        let mut nhwc = || {
            conv2d_channels_last::<T>(dev, &dxn, 0, &dwn, layout, None, s, g, &mut dyn_out).unwrap();
        };
        let us = time(dev, flops, &mut nhwc);
        // An NHWC result as NCHW, for the spot check.
        let nchw = |yn: &[T]| -> Vec<T> {
            (0..yn.len()).map(|i| {
                let (bi, r) = (i / (c_out * hw), i % (c_out * hw));
                yn[(bi * hw + r % hw) * c_out + r / hw]
            }).collect()
        };
        record("conv_nhwc", us, &nchw(&dev.download(&dyn_out).unwrap()));
        // Where `conv_nhwc` ran the wgmma kernel: the GEMM pipeline's kernel (op
        // `conv_nhwc_tiled`, its own filter layout), the wgmma kernel with tiles 128 and
        // 160 channels wide forced (`conv_nhwc_n128`, `conv_nhwc_n160`), each also
        // unsplit (`_nosplit`).
        if wgmma_refusal::<T>(dev, &s).is_none() {
            let [hwio, ohwi] = [FilterLayout::Hwio, FilterLayout::Ohwi].map(|l| dev.upload(&nhwc_weight(&wt, [c_out, c_in, k, k], l).unwrap()).unwrap());
            let with = |stages, tile_n| NhwcKernel::WgmmaWith { stages, tile_n };
            let variants = [
                (NhwcKernel::Tiled, None, "conv_nhwc_tiled"),
                (with(3, Some(128)), None, "conv_nhwc_n128"),
                (with(3, Some(160)), None, "conv_nhwc_n160"),
                (with(3, Some(128)), Some(1), "conv_nhwc_n128_nosplit"),
                (with(3, Some(160)), Some(1), "conv_nhwc_n160_nosplit"),
            ];
            for (kernel, splits, op) in variants {
                let kl = nhwc_filter_layout::<T>(dev, &s, g, kernel);
                let weight = if kl == FilterLayout::Hwio { &hwio } else { &ohwi };
                let mut run = || {
                    conv2d_channels_last_with::<T>(dev, &dxn, 0, weight, kl, None, s, g, &mut dyn_out, splits, kernel).unwrap();
                };
                let us = time(dev, flops, &mut run);
                record(op, us, &nchw(&dev.download(&dyn_out).unwrap()));
            }
        }

        // The route candle-rocm takes for an NCHW tensor (op `conv_nhwc_route`): the input
        // copied to NHWC, the filter rearranged (every call: Candle hands it over as
        // `(c_out, c_in, k, k)`), the kernel, and the result copied back to NCHW.
        let mut wr: DeviceVec<T> = dev.alloc(wn.len()).unwrap();
        let mut xr: DeviceVec<T> = dev.alloc(xn.len()).unwrap();
        let mut yr: DeviceVec<T> = dev.alloc(b * c_out * hw).unwrap();
        // The three copies as candle-rocm makes them: `permute::transpose_copy` (tiles
        // through shared memory) on the coalesced views.
        let tr = |src: &DeviceVec<T>, dims: &[usize], strides: &[usize], out: &mut DeviceVec<T>| {
            let t = TransposeView::new(dims, strides).expect("a transpose");
            let ([d0, d1, d2], [s0, s1, s2]) = (t.dims, t.strides);
            transpose_copy::launch::<T>(dev, t.launch_config(), src, out, d0, d1, d2, s0, s1, s2, t.y).unwrap();
        };
        // The filter as candle-rocm rearranges it: (c_out, c_in k k) transposed whole,
        // then for (c_out, k k, c_in) (the 160-wide wgmma kernel's) transposed again per
        // tap, for (k k, c_in, c_out) its rows of c_out reordered from (c_in, k k) to
        // (k k, c_in) (a run copy); a 1x1 filter already is (c_out, c_in).
        let mut wt: DeviceVec<T> = dev.alloc(wn.len()).unwrap();
        let (row_dims, row_strides) = ([k * k, c_in, c_out], [c_out, k * k * c_out, 1]);
        let rows = RunView::new(&row_dims, [&row_strides]);
        let mut route = || {
            tr(&dx, &[b, h * w, c_in], &[c_in * h * w, 1, h * w], &mut xr);
            let weight = match layout {
                FilterLayout::Ohwi if k == 1 => &dw,
                FilterLayout::Ohwi => {
                    tr(&dw, &[c_in * k * k, c_out], &[1, c_in * k * k], &mut wt);
                    tr(&wt, &[c_out, k * k, c_in], &[1, c_out, k * k * c_out], &mut wr);
                    &wr
                }
                FilterLayout::Hwio => {
                    tr(&dw, &[c_in * k * k, c_out], &[1, c_in * k * k], &mut wt);
                    match rows {
                        Some(v) => {
                            let [[r0, r1, r2]] = v.strides;
                            copy_runs::launch::<T>(dev, launch_config(wn.len()), &wt, &mut wr, v.d1, v.d2, r0, r1, r2).unwrap();
                        }
                        // c_out no multiple of 8 (conv_out): the element-by-element copy, as in candle-rocm.
                        None => copy_strided::<T>(dev, &wt, Some((&row_dims, &row_strides)), &mut wr).unwrap(),
                    }
                    &wr
                }
            };
            conv2d_channels_last::<T>(dev, &xr, 0, weight, layout, None, s, g, &mut dyn_out).unwrap();
            tr(&dyn_out, &[b, c_out, hw], &[hw * c_out, 1, c_out], &mut yr);
        };
        let us = time(dev, flops, &mut route);
        record("conv_nhwc_route", us, &dev.download(&yr).unwrap());
    }

    let mut cols: DeviceVec<T> = dev.alloc(b * hw * kk).unwrap();
    let epi = Epilogue::default();
    let mut im2col = || {
        im2col2d::<T>(dev, &dx, [b, c_in, h, w], strides, 0, (k, k), g, &mut cols).unwrap();
        let a_s = Strides { batch: 0, row: kk, col: 1 };
        let b_s = Strides { batch: hw * kk, row: 1, col: kk };
        gemm::matmul_strided::<T>(dev, GemmShape { batch: b, m: c_out, n: hw, k: kk }, &dw, a_s, &cols, b_s, &mut dy, hw, c_out * hw, &epi).unwrap();
    };
    let us = time(dev, flops, &mut im2col);
    record("conv_im2col", us, &dev.download(&dy).unwrap());
    drop(cols);

    if k == 1 && stride == 1 && padding == 0 {
        let mut pointwise = || {
            let a_s = Strides { batch: 0, row: c_in, col: 1 };
            let b_s = Strides { batch: c_in * hw, row: hw, col: 1 };
            gemm::matmul_strided::<T>(dev, GemmShape { batch: b, m: c_out, n: hw, k: c_in }, &dw, a_s, &dx, b_s, &mut dy, hw, c_out * hw, &epi).unwrap();
        };
        let us = time(dev, flops, &mut pointwise);
        record("conv_1x1_gemm", us, &dev.download(&dy).unwrap());
    }
}

fn main() {
    let args = Args::from_env();
    let quick = args.quick();
    let dtype = args.value("--dtype").unwrap_or("f16");
    let Some(dev) = benches::gpu() else { return };
    let mut rows = Vec::new();
    let layers: Vec<ConvLayer> = sd_conv_layers().into_iter().filter(|l| !quick || l.0.starts_with("unet 320")).collect();
    for l in layers {
        match dtype {
            "bf16" => run::<bf16>(&dev, l, &mut rows),
            _ => run::<f16>(&dev, l, &mut rows),
        }
    }
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            let [b, c_in, h, w, c_out, k, stride, padding] = r.shape;
            format!(
                "{{\"op\":\"{}\",\"layer\":\"{}\",\"dtype\":\"{}\",\"batch\":{b},\"c_in\":{c_in},\"h\":{h},\"w\":{w},\"c_out\":{c_out},\"k\":{k},\"stride\":{stride},\"padding\":{padding},\"us\":{:.3}}}",
                r.op, r.layer, r.dtype, r.us
            )
        })
        .collect();
    let path = benches::write_json_array(&args.out_dir(), "rust_conv.json", &json);
    println!("wrote {path}");
}
