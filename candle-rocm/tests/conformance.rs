//! Op conformance: every op the backend wires, against Candle's own CPU backend, on the
//! CPU executor with waves of 32 and 64 (and the GPUs the build can reach), over random
//! inputs with NaN/inf, contiguous, transposed, offset (narrowed), broadcast and empty
//! layouts, for each dtype the op supports. Tolerances: see `common::tol`.
mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor, D};
use common::*;

const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The same base tensor under several layouts, on `dev`.
fn views(x: &Tensor, dev: &Device) -> Vec<(&'static str, Tensor)> {
    let x = x.to_device(dev).unwrap();
    vec![
        ("contiguous", x.clone()),
        ("transposed", x.transpose(0, 2).unwrap()),
        ("offset", x.narrow(1, 2, 3).unwrap()),
        ("offset+strided", x.narrow(2, 1, 3).unwrap().transpose(0, 1).unwrap()),
        ("empty", x.narrow(1, 0, 0).unwrap()),
    ]
}

const UNARY: [&str; 20] = [
    "neg", "exp", "log", "sqrt", "abs", "sqr", "recip", "relu", "gelu", "gelu_erf", "silu", "tanh", "erf", "sin",
    "cos", "floor", "ceil", "round", "sign", "sigmoid",
];

fn apply_unary(name: &str, x: &Tensor) -> Result<Tensor> {
    match name {
        "neg" => x.neg(),
        "exp" => x.exp(),
        "log" => x.log(),
        "sqrt" => x.sqrt(),
        "abs" => x.abs(),
        "sqr" => x.sqr(),
        "recip" => x.recip(),
        "relu" => x.relu(),
        "gelu" => x.gelu(),
        "gelu_erf" => x.gelu_erf(),
        "silu" => x.silu(),
        "tanh" => x.tanh(),
        "erf" => x.erf(),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        "round" => x.round(),
        "sign" => x.sign(),
        "sigmoid" => candle_nn::ops::sigmoid(x),
        _ => unreachable!(),
    }
}

#[test]
fn unary_ops() {
    for dev in devices() {
        for dtype in FLOATS {
            let base = rand(&[4, 6, 5], dtype, 1, true);
            let finite = rand(&[4, 6, 5], dtype, 1, false);
            for op in UNARY {
                // relu(NaN) and sign(NaN): Candle's CPU gives 0, our kernels keep NaN (as
                // torch.relu / torch.sign): these two are compared on inputs without NaN.
                let base = if op == "relu" || op == "sign" { &finite } else { &base };
                // Reference: Candle's CPU op on f32 copies, rounded once to the dtype (Candle's
                // CPU evaluates some half-type ops, e.g. gelu, in half arithmetic).
                for (layout, _) in views(base, &Device::Cpu) {
                    let pick = |d: &Device| views(base, d).into_iter().find(|(n, _)| *n == layout).unwrap().1;
                    check_ref(&format!("{op} {dtype:?} {layout}"), &dev, tol(dtype),
                        |d| ref_f32(dtype, &[&pick(d)], |v| apply_unary(op, &v[0])),
                        |d| apply_unary(op, &pick(d)));
                }
            }
        }
    }
}

#[test]
fn affine_powf_elu() {
    for dev in devices() {
        for dtype in FLOATS {
            let base = rand(&[4, 6, 5], dtype, 2, true);
            let pos = rand(&[4, 6, 5], dtype, 3, false).abs().unwrap();
            for (layout, _) in views(&base, &Device::Cpu) {
                let pick = |t: &Tensor, d: &Device| views(t, d).into_iter().find(|(n, _)| *n == layout).unwrap().1;
                let what = |op: &str| format!("{op} {dtype:?} {layout}");
                check(&what("affine"), &dev, tol(dtype), |d| pick(&base, d).affine(1.5, -0.25));
                check(&what("elu"), &dev, tol(dtype), |d| pick(&base, d).elu(0.7));
                // powf of non-negative inputs (negative bases are NaN in both, unhelpfully).
                check(&what("powf"), &dev, tol(dtype), |d| pick(&pos, d).powf(1.7));
            }
        }
    }
}

#[test]
fn binary_ops_with_broadcast_and_strides() {
    for dev in devices() {
        for dtype in FLOATS {
            let a = rand(&[4, 6, 5], dtype, 4, true);
            let b = rand(&[4, 6, 5], dtype, 5, true);
            let row = rand(&[1, 1, 5], dtype, 6, false);
            let col = rand(&[4, 1, 1], dtype, 7, false);
            // min/max: Candle's CPU keeps the first operand when the second is NaN, our
            // kernels propagate NaN (as torch.minimum does): compared on finite inputs.
            let (af, bf) = (rand(&[4, 6, 5], dtype, 8, false), rand(&[4, 6, 5], dtype, 9, false));
            for op in ["add", "sub", "mul", "div", "minimum", "maximum"] {
                let finite = op == "minimum" || op == "maximum";
                let (a, b) = if finite { (&af, &bf) } else { (&a, &b) };
                let f = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
                    match op {
                        "add" => x.broadcast_add(y),
                        "sub" => x.broadcast_sub(y),
                        "mul" => x.broadcast_mul(y),
                        "div" => x.broadcast_div(y),
                        "minimum" => x.broadcast_minimum(y),
                        _ => x.broadcast_maximum(y),
                    }
                };
                let t = tol(dtype);
                let w = |l: &str| format!("{op} {dtype:?} {l}");
                check(&w("same shape"), &dev, t, |d| f(&a.to_device(d)?, &b.to_device(d)?));
                check(&w("rhs transposed"), &dev, t, |d| {
                    f(&a.to_device(d)?.transpose(0, 1)?, &b.to_device(d)?.transpose(0, 1)?.contiguous()?.transpose(1, 2)?.transpose(1, 2)?)
                });
                check(&w("lhs transposed, rhs offset"), &dev, t, |d| {
                    f(&a.to_device(d)?.narrow(1, 1, 4)?.transpose(0, 2)?, &b.to_device(d)?.narrow(1, 2, 4)?.transpose(0, 2)?)
                });
                check(&w("broadcast row"), &dev, t, |d| f(&a.to_device(d)?, &row.to_device(d)?));
                check(&w("broadcast col (lhs)"), &dev, t, |d| f(&col.to_device(d)?, &b.to_device(d)?));
                check(&w("empty"), &dev, t, |d| f(&a.to_device(d)?.narrow(1, 0, 0)?, &b.to_device(d)?.narrow(1, 0, 0)?));
            }
        }
    }
}

/// The shapes a diffusion UNet and a transformer broadcast over (a bias over tokens, a
/// per-channel value over pixels, the two halves of a GEGLU projection, a time embedding
/// over pixels), which coalesce to two or three dimensions with rows that are whole runs of
/// 8 or not, and a four-dimension broadcast that coalesces to nothing shorter.
#[test]
fn binary_ops_on_image_and_token_shapes() {
    for dev in devices() {
        for dtype in FLOATS {
            let t = tol(dtype);
            let x = rand(&[2, 3, 70], dtype, 21, false);
            let bias = rand(&[70], dtype, 22, false);
            let img = rand(&[2, 4, 9, 8], dtype, 23, false);
            let chan = rand(&[4, 1, 1], dtype, 24, false);
            let emb = rand(&[2, 4], dtype, 25, false);
            let proj = rand(&[2, 3, 160], dtype, 26, false);
            let wide = rand(&[2, 3, 4, 70], dtype, 27, false);
            let row = rand(&[1, 3, 1, 70], dtype, 28, false);
            let w = |l: &str| format!("{dtype:?} {l}");
            check(&w("bias over tokens"), &dev, t, |d| x.to_device(d)?.broadcast_add(&bias.to_device(d)?));
            check(&w("per-channel over pixels"), &dev, t, |d| img.to_device(d)?.broadcast_mul(&chan.to_device(d)?));
            check(&w("embedding over pixels"), &dev, t, |d| {
                img.to_device(d)?.broadcast_sub(&emb.to_device(d)?.unsqueeze(2)?.unsqueeze(3)?)
            });
            check(&w("GEGLU halves"), &dev, t, |d| {
                let p = proj.to_device(d)?;
                let (h, g) = (p.narrow(2, 0, 80)?, p.narrow(2, 80, 80)?);
                h.mul(&g)
            });
            // Candle's CPU backend evaluates gelu and silu of half types in half arithmetic;
            // the reference takes them in f32 (as our kernels do) and rounds once.
            let f32_then = |x: &Tensor, f: fn(&Tensor) -> Result<Tensor>| f(&x.to_dtype(DType::F32)?)?.to_dtype(dtype);
            check_ref(
                &w("GEGLU with gelu on a half"),
                &dev,
                t,
                |d| {
                    let p = proj.to_device(d)?;
                    p.narrow(2, 0, 80)?.mul(&f32_then(&p.narrow(2, 80, 80)?, |x| x.gelu())?)
                },
                |d| {
                    let p = proj.to_device(d)?;
                    p.narrow(2, 0, 80)?.mul(&p.narrow(2, 80, 80)?.gelu()?)
                },
            );
            let tview = |d: &Device| img.to_device(d)?.reshape((2, 4, 8, 9))?.narrow(3, 0, 8)?.transpose(2, 3);
            check_ref(
                &w("silu of a transpose, plus a transposed operand"),
                &dev,
                t,
                |d| {
                    let v = tview(d)?;
                    f32_then(&v, |x| x.silu())?.add(&v)
                },
                |d| {
                    let v = tview(d)?;
                    v.silu()?.add(&v)
                },
            );
            check(&w("four-dimension broadcast"), &dev, t, |d| wide.to_device(d)?.broadcast_div(&row.to_device(d)?.affine(1.0, 2.0)?));
        }
    }
}

/// Permuted and narrowed views made contiguous (the tiled transpose and the run copy):
/// NCHW -> NHWC and back, a filter as `(k_h, k_w, c_in, c_out)`, a transposed matrix,
/// a narrowed row block; every element size, exact.
#[test]
fn permuted_copies_of_image_and_filter_shapes() {
    let kinds = [DType::F32, DType::F16, DType::BF16, DType::U8, DType::U32, DType::I64, DType::F64];
    let img = Tensor::from_vec(values(2 * 12 * 9 * 7, 31, 0.0, 200.0, false), (2, 12, 9, 7), &Device::Cpu).unwrap();
    let filt = Tensor::from_vec(values(40 * 12 * 9, 32, 0.0, 200.0, false), (40, 12, 3, 3), &Device::Cpu).unwrap();
    let mat = Tensor::from_vec(values(37 * 80, 33, 0.0, 200.0, false), (37, 80), &Device::Cpu).unwrap();
    for dev in devices() {
        for dt in kinds {
            let (img, filt, mat) = (img.to_dtype(dt).unwrap(), filt.to_dtype(dt).unwrap(), mat.to_dtype(dt).unwrap());
            let w = |l: &str| format!("{dt:?} {l}");
            check(&w("NCHW -> NHWC"), &dev, EXACT, |d| img.to_device(d)?.permute((0, 2, 3, 1))?.contiguous());
            check(&w("NHWC -> NCHW"), &dev, EXACT, |d| {
                img.to_device(d)?.permute((0, 2, 3, 1))?.contiguous()?.permute((0, 3, 1, 2))?.contiguous()
            });
            check(&w("filter as (k, k, c_in, c_out)"), &dev, EXACT, |d| filt.to_device(d)?.permute((2, 3, 1, 0))?.contiguous());
            check(&w("transposed matrix"), &dev, EXACT, |d| mat.to_device(d)?.t()?.contiguous());
            check(&w("narrowed columns"), &dev, EXACT, |d| mat.to_device(d)?.narrow(1, 8, 64)?.contiguous());
            check(&w("narrowed then transposed"), &dev, EXACT, |d| mat.to_device(d)?.narrow(1, 3, 70)?.t()?.contiguous());
        }
    }
}

#[test]
fn casts_between_dtypes() {
    let kinds = [DType::F32, DType::F16, DType::BF16, DType::U8, DType::U32, DType::I64];
    for dev in devices() {
        for src in kinds {
            // Integers: 0..200 (fit every type); floats: fractional values with NaN/inf,
            // except when casting to integers (NaN/inf/negative to int differ by language).
            for dst in kinds {
                let to_int = matches!(dst, DType::U8 | DType::U32 | DType::I64);
                let base = if matches!(src, DType::U8 | DType::U32 | DType::I64) || to_int {
                    Tensor::from_vec(values(120, 11, 0.0, 200.0, false), (4, 6, 5), &Device::Cpu).unwrap().to_dtype(src).unwrap()
                } else {
                    rand(&[4, 6, 5], src, 12, true)
                };
                for (layout, _) in views(&base, &Device::Cpu) {
                    check(&format!("cast {src:?} -> {dst:?} {layout}"), &dev, EXACT, |d| {
                        views(&base, d).into_iter().find(|(n, _)| *n == layout).unwrap().1.to_dtype(dst)
                    });
                }
            }
        }
    }
}

/// The tensor in f32 (references computed with one final rounding).
fn up(x: &Tensor) -> Result<Tensor> {
    x.to_dtype(DType::F32)
}

#[test]
fn reductions() {
    for dev in devices() {
        for dtype in FLOATS {
            // Sums: Candle's CPU adds half types in the half type (one rounding per element),
            // ours in f32 with one rounding at the end; the reference is Candle's CPU sum of
            // the f32 values rounded once to the dtype, so one ulp of the dtype (plus f32
            // ordering error) is the bound.
            let t = tol(dtype);
            let base = rand(&[4, 6, 5], dtype, 13, false);
            let nan = rand(&[4, 6, 5], dtype, 14, true);
            for (layout, _) in views(&base, &Device::Cpu).into_iter().filter(|(n, _)| *n != "empty") {
                let pick = |x: &Tensor, d: &Device| views(x, d).into_iter().find(|(n, _)| *n == layout).unwrap().1;
                for dim in 0..3 {
                    let w = |op: &str| format!("{op} dim {dim} {dtype:?} {layout}");
                    check_ref(&w("sum"), &dev, t, |d| up(&pick(&base, d))?.sum_keepdim(dim)?.to_dtype(dtype), |d| pick(&base, d).sum_keepdim(dim));
                    check(&w("max"), &dev, EXACT, |d| pick(&base, d).max_keepdim(dim));
                    check(&w("min"), &dev, EXACT, |d| pick(&base, d).min_keepdim(dim));
                    check(&w("argmax"), &dev, EXACT, |d| pick(&base, d).argmax_keepdim(dim));
                    check(&w("argmin"), &dev, EXACT, |d| pick(&base, d).argmin_keepdim(dim));
                    // NaN and inf propagate through sums alike.
                    check_ref(&w("sum with NaN/inf"), &dev, t, |d| up(&pick(&nan, d))?.sum_keepdim(dim)?.to_dtype(dtype), |d| pick(&nan, d).sum_keepdim(dim));
                }
                check_ref(&format!("sum over dims 0,2 {dtype:?} {layout}"), &dev, t, |d| up(&pick(&base, d))?.sum_keepdim((0, 2))?.to_dtype(dtype), |d| pick(&base, d).sum_keepdim((0, 2)));
                check_ref(&format!("sum_all {dtype:?} {layout}"), &dev, t, |d| up(&pick(&base, d))?.sum_all()?.to_dtype(dtype), |d| pick(&base, d).sum_all());
            }
            check(&format!("sum of empty {dtype:?}"), &dev, t, |d| base.to_device(d)?.narrow(1, 0, 0)?.sum_keepdim(2));
        }
    }
}

#[test]
fn where_cond_with_broadcast() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::U8, DType::U32] {
            let on_true = rand(&[4, 6, 5], DType::F32, 15, false).abs().unwrap().to_dtype(dtype).unwrap();
            let on_false = rand(&[4, 6, 5], DType::F32, 16, false).abs().unwrap().to_dtype(dtype).unwrap();
            for cdt in [DType::U8, DType::U32] {
                let cond = ids(&[4, 6, 5], 2, cdt, 17);
                let crow = ids(&[1, 6, 1], 2, cdt, 18);
                let w = |l: &str| format!("where_cond {dtype:?} cond {cdt:?} {l}");
                check(&w("contiguous"), &dev, EXACT, |d| cond.to_device(d)?.where_cond(&on_true.to_device(d)?, &on_false.to_device(d)?));
                check(&w("broadcast cond, transposed branch"), &dev, EXACT, |d| {
                    let c = crow.to_device(d)?.broadcast_as((4, 6, 5))?;
                    let t = on_true.to_device(d)?.transpose(0, 1)?.contiguous()?.transpose(0, 1)?;
                    c.where_cond(&t, &on_false.to_device(d)?.narrow(0, 0, 4)?)
                });
            }
        }
    }
}

#[test]
fn index_select_gather_scatter_index_add() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::U32, DType::U8] {
            let src = rand(&[5, 7, 3], DType::F32, 19, false).abs().unwrap().to_dtype(dtype).unwrap();
            for idt in [DType::U8, DType::U32, DType::I64] {
                let w = |op: &str| format!("{op} {dtype:?} ids {idt:?}");
                for dim in 0..3 {
                    let bound = src.dims()[dim];
                    let ix = ids(&[9], bound, idt, 20 + dim as u64);
                    check(&w(&format!("index_select dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.index_select(&ix.to_device(d)?, dim));
                    // Candle's CPU index_select takes contiguous sources only.
                    let st = |d: &Device| src.to_device(d)?.transpose(0, 2)?.contiguous()?.transpose(0, 2);
                    check_ref(&w(&format!("index_select dim {dim} strided src")), &dev, EXACT,
                        |d| st(d)?.contiguous()?.index_select(&ix.to_device(d)?, dim),
                        |d| st(d)?.index_select(&ix.to_device(d)?, dim));
                    let mut gshape = src.dims().to_vec();
                    gshape[dim] = 4;
                    let gx = ids(&gshape, bound, idt, 30 + dim as u64);
                    check(&w(&format!("gather dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.gather(&gx.to_device(d)?, dim));
                    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
                        let upd = rand(&gshape, dtype, 40 + dim as u64, false);
                        let t = tol(dtype);
                        check(&w(&format!("scatter_add dim {dim}")), &dev, t, |d| {
                            src.to_device(d)?.scatter_add(&gx.to_device(d)?, &upd.to_device(d)?, dim)
                        });
                        let mut ashape = src.dims().to_vec();
                        ashape[dim] = 9;
                        let add = rand(&ashape, dtype, 50 + dim as u64, false);
                        check(&w(&format!("index_add dim {dim}")), &dev, t, |d| {
                            src.to_device(d)?.index_add(&ix.to_device(d)?, &add.to_device(d)?, dim)
                        });
                    }
                }
            }
            check(&format!("embedding-style index_select of empty ids {dtype:?}"), &dev, EXACT, |d| {
                src.to_device(d)?.index_select(&Tensor::zeros(0, DType::U32, d)?, 0)
            });
        }
    }
}

#[test]
fn copies_cat_and_fills() {
    for dev in devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::U8, DType::U32, DType::I64, DType::F64, DType::I32, DType::I16] {
            let a = rand(&[4, 6, 5], DType::F32, 60, false).abs().unwrap().to_dtype(dtype).unwrap();
            let b = rand(&[4, 2, 5], DType::F32, 61, false).abs().unwrap().to_dtype(dtype).unwrap();
            let w = |op: &str| format!("{op} {dtype:?}");
            for (layout, _) in views(&a, &Device::Cpu) {
                check(&w(&format!("contiguous() of {layout}")), &dev, EXACT, |d| {
                    views(&a, d).into_iter().find(|(n, _)| *n == layout).unwrap().1.contiguous()
                });
            }
            check(&w("cat dim 1"), &dev, EXACT, |d| Tensor::cat(&[a.to_device(d)?, b.to_device(d)?], 1));
            check(&w("cat dim 0"), &dev, EXACT, |d| Tensor::cat(&[a.to_device(d)?, a.to_device(d)?], 0));
            check(&w("cat dim 2 of transposed"), &dev, EXACT, |d| {
                Tensor::cat(&[a.to_device(d)?.transpose(0, 1)?, b.to_device(d)?.transpose(0, 1)?], 0)
            });
            check(&w("ones"), &dev, EXACT, |d| Tensor::ones((3, 4), dtype, d));
            check(&w("zeros"), &dev, EXACT, |d| Tensor::zeros((3, 4), dtype, d));
            check(&w("zero_set of a strided view"), &dev, EXACT, |d| {
                let t = a.to_device(d)?.copy()?;
                t.i((.., 1..4, 2..))?.zero_set()?;
                Ok(t)
            });
            check(&w("one_set of a transposed view"), &dev, EXACT, |d| {
                let t = a.to_device(d)?.copy()?;
                t.transpose(0, 2)?.one_set()?;
                Ok(t)
            });
            check(&w("slice_set"), &dev, EXACT, |d| {
                let t = a.to_device(d)?.copy()?;
                t.slice_set(&b.to_device(d)?, 1, 3)?;
                Ok(t)
            });
        }
    }
}

#[test]
fn matmul_layouts() {
    for dev in devices() {
        for dtype in FLOATS {
            matmul_layout_cases(&dev, dtype);
        }
    }
}

/// The f16/bf16 GEMMs of GPUs without a vendor BLAS (`kernels::gemm`, matrix units), run
/// on the CPU executor's emulation of each lowering (waves of 32 and 64), on every layout.
#[test]
fn matmul_layouts_on_the_matrix_unit_kernel() {
    for dev in devices() {
        for dtype in [DType::F16, DType::BF16] {
            candle_rocm::ops::matmul::with_mma_gemm_on_cpu(|| matmul_layout_cases(&dev, dtype));
        }
    }
}

fn matmul_layout_cases(dev: &candle_rocm::RocmDevice, dtype: DType) {
    let dev = dev.clone();
    // Sums of k = 17 products: f32 accumulation in both, different order.
    let t = match dtype {
        DType::F32 => Tol { rtol: 1e-5, atol: 1e-5 },
        DType::F16 => Tol { rtol: 2e-3, atol: 4e-3 },
        _ => Tol { rtol: 1.6e-2, atol: 3e-2 },
    };
    let a = rand(&[3, 19, 17], dtype, 70, false);
    let b = rand(&[3, 17, 21], dtype, 71, false);
    let w = |l: &str| format!("matmul {dtype:?} {l}");
    check(&w("batched"), &dev, t, |d| a.to_device(d)?.matmul(&b.to_device(d)?));
    check(&w("lhs transposed"), &dev, t, |d| {
        a.to_device(d)?.transpose(1, 2)?.contiguous()?.transpose(1, 2)?.matmul(&b.to_device(d)?)
    });
    check(&w("rhs transposed"), &dev, t, |d| {
        a.to_device(d)?.matmul(&b.to_device(d)?.transpose(1, 2)?.contiguous()?.transpose(1, 2)?)
    });
    check(&w("2d with offset"), &dev, t, |d| a.to_device(d)?.i(1)?.matmul(&b.to_device(d)?.i(2)?));
    check(&w("broadcast batch"), &dev, t, |d| a.to_device(d)?.broadcast_matmul(&b.to_device(d)?.i(0)?));
    // Batch dims that do not fold into one stride (Candle's CPU rejects them; ours copies).
    let a4 = |d: &Device| a.to_device(d)?.reshape((3, 1, 19, 17))?.broadcast_as((3, 2, 19, 17))?.transpose(0, 1);
    let b4 = |d: &Device| b.to_device(d)?.reshape((1, 3, 17, 21))?.broadcast_as((2, 3, 17, 21));
    check_ref(&w("4d, batch dims transposed"), &dev, t,
        |d| a4(d)?.contiguous()?.matmul(&b4(d)?.contiguous()?),
        |d| a4(d)?.matmul(&b4(d)?));
    check(&w("k = 0"), &dev, t, |d| a.to_device(d)?.narrow(2, 0, 0)?.matmul(&b.to_device(d)?.narrow(1, 0, 0)?));
}

/// Tolerance of a product with inner size `k` of values in [-3, 3], against a reference
/// computed in f32 and rounded once to `dtype`: f32 accumulation in another order differs
/// by at most `k * 2^-24 * sum |a||b| <= 9 k^2 2^-24` (both sides: twice that), and the
/// final rounding to a half type by one unit in the last place of the result.
fn product_tol(dtype: DType, k: usize) -> Tol {
    let acc = 2.0 * 9.0 * (k * k) as f64 * f64::powi(2.0, -24);
    match dtype {
        DType::F16 => Tol {
            rtol: f64::powi(2.0, -10),
            atol: acc + 1e-4,
        },
        DType::BF16 => Tol {
            rtol: f64::powi(2.0, -7),
            atol: acc + 1e-3,
        },
        DType::F64 => Tol {
            rtol: 0.0,
            atol: 2.0 * 9.0 * (k * k) as f64 * f64::powi(2.0, -53),
        },
        _ => Tol {
            rtol: 0.0,
            atol: acc,
        },
    }
}

/// The product in f32 (f64 for f64) on `d`, rounded once to the inputs' dtype.
fn matmul_ref(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let up = if a.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    a.to_dtype(up)?
        .matmul(&b.to_dtype(up)?)?
        .to_dtype(a.dtype())
}

#[test]
fn matmul_odd_shapes() {
    // (batch, m, k, n): single rows and columns (decode's m = 1), k = 1, sizes that are
    // not multiples of any tile, and a larger k.
    let shapes = [
        (1, 1, 33, 1),
        (2, 1, 64, 37),
        (1, 37, 5, 1),
        (5, 7, 1, 3),
        (2, 33, 129, 65),
    ];
    for dev in devices() {
        for dtype in FLOATS {
            for (si, &(bs, m, k, n)) in shapes.iter().enumerate() {
                let t = product_tol(dtype, k);
                let a = rand(&[bs, m, k], dtype, 80 + si as u64, false);
                let b = rand(&[bs, k, n], dtype, 90 + si as u64, false);
                let w = |l: &str| format!("matmul {dtype:?} {bs}x{m}x{k}x{n} {l}");
                check_ref(
                    &w("contiguous"),
                    &dev,
                    t,
                    |d| matmul_ref(&a.to_device(d)?, &b.to_device(d)?),
                    |d| a.to_device(d)?.matmul(&b.to_device(d)?),
                );
                let bt = |d: &Device| {
                    b.to_device(d)?
                        .transpose(1, 2)?
                        .contiguous()?
                        .transpose(1, 2)
                };
                let at = |d: &Device| {
                    a.to_device(d)?
                        .transpose(1, 2)?
                        .contiguous()?
                        .transpose(1, 2)
                };
                check_ref(
                    &w("both transposed"),
                    &dev,
                    t,
                    |d| matmul_ref(&at(d)?, &bt(d)?),
                    |d| at(d)?.matmul(&bt(d)?),
                );
            }
        }
    }
}

/// f64 matmul runs on a vendor BLAS (dgemm) only: on a GPU whose BLAS loaded it matches
/// Candle's CPU in every layout; elsewhere it is a clear error.
#[test]
fn matmul_f64_needs_a_vendor_blas() {
    let a = rand(&[3, 19, 17], DType::F64, 70, false);
    let b = rand(&[3, 17, 21], DType::F64, 71, false);
    for dev in devices() {
        let t = product_tol(DType::F64, 17);
        if dev.gemm_library().is_some_and(|l| !l.starts_with("no ")) {
            check("matmul F64 batched", &dev, t, |d| {
                a.to_device(d)?.matmul(&b.to_device(d)?)
            });
            check("matmul F64 rhs transposed", &dev, t, |d| {
                a.to_device(d)?.matmul(
                    &b.to_device(d)?
                        .transpose(1, 2)?
                        .contiguous()?
                        .transpose(1, 2)?,
                )
            });
            // Every other column of a wider matrix: no BLAS layout, copied first.
            let wide = |d: &Device| {
                Tensor::cat(&[&b, &b], 2)?
                    .to_device(d)?
                    .reshape((3, 17, 21, 2))?
                    .narrow(3, 0, 1)?
                    .squeeze(3)
            };
            check_ref(
                "matmul F64 strided columns",
                &dev,
                t,
                |d| a.to_device(d)?.matmul(&wide(d)?.contiguous()?),
                |d| a.to_device(d)?.matmul(&wide(d)?),
            );
            let e = candle_rocm::blas::with_kernel_gemm(|| {
                a.to_device(&dev.as_candle())?
                    .matmul(&b.to_device(&dev.as_candle())?)
            });
            assert!(
                e.is_err_and(|e| e.to_string().contains("switched off")),
                "f64 with the BLAS switched off must fail"
            );
        } else {
            let e = a
                .to_device(&dev.as_candle())
                .unwrap()
                .matmul(&b.to_device(&dev.as_candle()).unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains("F64 matmul needs a vendor BLAS"), "{e}");
        }
    }
}

/// More than 65535 products in one batch (the launch grid's and some BLAS kernels' limit):
/// split into several calls. GPUs only (on the CPU executor 65537 work-groups take minutes).
#[test]
fn matmul_batch_beyond_65535() {
    let a = rand(&[65537, 2, 3], DType::F32, 75, false);
    let b = rand(&[65537, 3, 2], DType::F32, 76, false);
    for dev in devices() {
        if !dev.kernels().is_gpu() {
            eprintln!("SKIPPED on {}: 65537 work-groups are for GPUs", dev.name());
            continue;
        }
        let t = product_tol(DType::F32, 3);
        check("matmul batch 65537", &dev, t, |d| {
            a.to_device(d)?.matmul(&b.to_device(d)?)
        });
        candle_rocm::blas::with_kernel_gemm(|| {
            check("matmul batch 65537 (kernel)", &dev, t, |d| {
                a.to_device(d)?.matmul(&b.to_device(d)?)
            })
        });
    }
}

/// Runs `f` on f32 copies of `xs` and rounds the result once to `dtype`: the reference for
/// fused ops (Candle's CPU evaluates half types with a rounding per step, which is further
/// from the exact value than one final rounding).
fn ref_f32(dtype: DType, xs: &[&Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) -> Result<Tensor> {
    let up = xs.iter().map(|x| x.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?;
    f(&up)?.to_dtype(dtype)
}

#[test]
fn candle_nn_fused_ops() {
    use candle_nn::ops::{layer_norm, rms_norm, softmax_last_dim};
    for dev in devices() {
        for dtype in FLOATS {
            let t = tol(dtype);
            let x = rand(&[2, 3, 4, 16], dtype, 80, false);
            let w16 = rand(&[16], dtype, 81, false);
            let b16 = rand(&[16], dtype, 82, false);
            let nan = rand(&[6, 16], dtype, 83, true);
            let w = |op: &str| format!("{op} {dtype:?}");
            // `fused(d, inputs)` runs with inputs on `d`; the reference on f32 copies.
            let fused = |name: &str, inputs: &[&Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>| {
                check_ref(&w(name), &dev, t,
                    |d| ref_f32(dtype, &inputs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?.iter().collect::<Vec<_>>(), f),
                    |d| f(&inputs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?));
            };
            fused("softmax_last_dim", &[&x], &|v| softmax_last_dim(&v[0]));
            fused("softmax with NaN/inf rows", &[&nan], &|v| softmax_last_dim(&v[0]));
            // Candle's CPU op takes contiguous input only; ours also takes strided views.
            check_ref(&w("softmax_last_dim of a strided view"), &dev, t,
                |d| ref_f32(dtype, &[&x.to_device(d)?], |v| softmax_last_dim(&v[0])),
                |d| softmax_last_dim(&x.to_device(d)?.transpose(2, 3)?.contiguous()?.transpose(2, 3)?));
            fused("rms_norm", &[&x, &w16], &|v| rms_norm(&v[0], &v[1], 1e-5));
            fused("layer_norm", &[&x, &w16, &b16], &|v| layer_norm(&v[0], &v[1], &v[2], 1e-5));
            // Rotary embeddings: x (b, h, t, d) = (2, 3, 4, 16); tables (t, d/2) and (b, t, d/2).
            let cos = rand(&[4, 8], dtype, 84, false);
            let sin = rand(&[4, 8], dtype, 85, false);
            let cos_b = rand(&[2, 4, 8], dtype, 86, false);
            let sin_b = rand(&[2, 4, 8], dtype, 87, false);
            let xthd = x.transpose(1, 2).unwrap().contiguous().unwrap();
            use candle_nn::rotary_emb::{rope, rope_i, rope_thd};
            fused("rope_i", &[&x, &cos, &sin], &|v| rope_i(&v[0], &v[1], &v[2]));
            fused("rope_i per-batch tables", &[&x, &cos_b, &sin_b], &|v| rope_i(&v[0], &v[1], &v[2]));
            fused("rope", &[&x, &cos, &sin], &|v| rope(&v[0], &v[1], &v[2]));
            fused("rope per-batch tables", &[&x, &cos_b, &sin_b], &|v| rope(&v[0], &v[1], &v[2]));
            fused("rope_thd", &[&xthd, &cos, &sin], &|v| rope_thd(&v[0], &v[1], &v[2]));
            // Tables narrowed to positions 3..7 of longer ones, as LLMs pass them at a KV-cache
            // offset (our backend reads them in place, without a copy).
            let cos_l = rand(&[9, 8], dtype, 88, false);
            let sin_l = rand(&[9, 8], dtype, 89, false);
            check_ref(&w("rope_i of tables narrowed in place"), &dev, t,
                |d| ref_f32(dtype, &[&x.to_device(d)?, &cos_l.to_device(d)?, &sin_l.to_device(d)?], |v| rope_i(&v[0], &v[1].narrow(0, 3, 4)?.contiguous()?, &v[2].narrow(0, 3, 4)?.contiguous()?)),
                |d| rope_i(&x.to_device(d)?, &cos_l.to_device(d)?.narrow(0, 3, 4)?, &sin_l.to_device(d)?.narrow(0, 3, 4)?));
        }
    }
}

#[test]
fn missing_kernels_are_clear_errors() {
    let dev = candle_rocm::cpu_executor(candle_rocm::WaveSize::W64);
    let e = Tensor::zeros(4, DType::F6E2M3, &dev).unwrap_err().to_string();
    assert!(e.contains("F6E2M3"), "{e}");
    let e = Tensor::zeros(4, DType::F8E4M3, &dev).unwrap().exp().unwrap_err().to_string();
    assert!(e.contains("exp") && e.contains("F8E4M3"), "{e}");
    let e = Tensor::new(&[1u32, 2], &dev).unwrap().exp().unwrap_err().to_string();
    assert!(e.contains("exp") && e.contains("U32"), "{e}");
    // Quantized tensors: every GGML format is supported (tests/quantized.rs).
    // Bad input is an error and leaves the device usable.
    let y = Tensor::new(&[1f32, 2.0], &dev).unwrap();
    assert!(y.matmul(&y).is_err());
    assert_eq!(y.exp().unwrap().to_vec1::<f32>().unwrap()[0], 1f32.exp());
}

const INTS: [DType; 5] = [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64];

/// Small non-negative integers (valid in every integer dtype), or values of a float dtype.
fn ints(shape: &[usize], dtype: DType, seed: u64, hi: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = values(n, seed, 0.0, hi, false).iter().map(|x| x.floor()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

#[test]
fn cmp_all_dtypes() {
    for dev in devices() {
        for dtype in FLOATS.into_iter().chain([DType::F64]).chain(INTS) {
            let float = dtype.is_float();
            let a = if float { rand(&[4, 6, 5], dtype, 90, true) } else { ints(&[4, 6, 5], dtype, 90, 5.0) };
            let b = if float { rand(&[4, 6, 5], dtype, 91, true) } else { ints(&[4, 6, 5], dtype, 91, 5.0) };
            let row = if float { rand(&[1, 6, 1], dtype, 92, false) } else { ints(&[1, 6, 1], dtype, 92, 5.0) };
            for op in ["eq", "ne", "lt", "le", "gt", "ge"] {
                let f = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
                    match op {
                        "eq" => x.broadcast_eq(y),
                        "ne" => x.broadcast_ne(y),
                        "lt" => x.broadcast_lt(y),
                        "le" => x.broadcast_le(y),
                        "gt" => x.broadcast_gt(y),
                        _ => x.broadcast_ge(y),
                    }
                };
                let w = |l: &str| format!("cmp {op} {dtype:?} {l}");
                check(&w("same shape (NaN/inf)"), &dev, EXACT, |d| f(&a.to_device(d)?, &b.to_device(d)?));
                check(&w("with itself"), &dev, EXACT, |d| f(&a.to_device(d)?, &a.to_device(d)?));
                check(&w("broadcast, transposed"), &dev, EXACT, |d| f(&a.to_device(d)?.transpose(0, 2)?, &row.to_device(d)?.transpose(0, 2)?));
                check(&w("offset"), &dev, EXACT, |d| f(&a.to_device(d)?.narrow(1, 1, 3)?, &b.to_device(d)?.narrow(1, 2, 3)?));
            }
        }
    }
}

#[test]
fn f64_and_integer_arithmetic() {
    for dev in devices() {
        // f64: computed in f64 by our kernels (exp/log/tanh/erf/... series), a few ulp from std.
        let t64 = Tol { rtol: 1e-13, atol: 1e-14 };
        let base = rand(&[4, 6, 5], DType::F64, 93, true);
        let finite = rand(&[4, 6, 5], DType::F64, 93, false);
        for op in UNARY {
            let base = if op == "relu" || op == "sign" { &finite } else { &base };
            for (layout, _) in views(base, &Device::Cpu) {
                check(&format!("{op} F64 {layout}"), &dev, t64, |d| {
                    apply_unary(op, &views(base, d).into_iter().find(|(n, _)| *n == layout).unwrap().1)
                });
            }
        }
        let pos = finite.abs().unwrap();
        check("powf F64", &dev, t64, |d| pos.to_device(d)?.powf(1.7));
        check("elu F64", &dev, t64, |d| base.to_device(d)?.elu(0.7));
        for dtype in [DType::F64].into_iter().chain(INTS) {
            let float = dtype == DType::F64;
            let a = if float { rand(&[4, 6, 5], dtype, 94, false) } else { ints(&[4, 6, 5], dtype, 94, 10.0) };
            // Integer division by zero is undefined in Candle: divisors are 1..10.
            let b = if float { rand(&[4, 6, 5], dtype, 95, false) } else { (ints(&[4, 6, 5], DType::F32, 95, 9.0) + 1.0).unwrap().to_dtype(dtype).unwrap() };
            let row = if float { rand(&[1, 1, 5], dtype, 96, false) } else { (ints(&[1, 1, 5], DType::F32, 96, 9.0) + 1.0).unwrap().to_dtype(dtype).unwrap() };
            let t = if float { t64 } else { EXACT };
            for op in ["add", "sub", "mul", "div", "minimum", "maximum"] {
                // u8/u32 subtraction wraps in Candle's CPU backend: compare a >= b only.
                if op == "sub" && matches!(dtype, DType::U8 | DType::U32) {
                    continue;
                }
                let f = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
                    match op {
                        "add" => x.broadcast_add(y),
                        "sub" => x.broadcast_sub(y),
                        "mul" => x.broadcast_mul(y),
                        "div" => x.broadcast_div(y),
                        "minimum" => x.broadcast_minimum(y),
                        _ => x.broadcast_maximum(y),
                    }
                };
                let w = |l: &str| format!("{op} {dtype:?} {l}");
                check(&w("same shape"), &dev, t, |d| f(&a.to_device(d)?, &b.to_device(d)?));
                check(&w("broadcast, transposed lhs"), &dev, t, |d| f(&a.to_device(d)?.transpose(0, 1)?, &row.to_device(d)?));
            }
            check(&format!("affine {dtype:?}"), &dev, t, |d| a.to_device(d)?.transpose(0, 2)?.affine(2.0, 1.0));
            // (two layouts: the any-dtype reduction kernel runs a 256-wide work-group per
            // output, slow on the CPU executor)
            for (layout, _) in views(&a, &Device::Cpu).into_iter().filter(|(n, _)| *n == "contiguous" || *n == "offset+strided") {
                let pick = |d: &Device| views(&a, d).into_iter().find(|(n, _)| *n == layout).unwrap().1;
                for dim in 0..3 {
                    let w = |op: &str| format!("{op} dim {dim} {dtype:?} {layout}");
                    check(&w("sum"), &dev, t, |d| pick(d).sum_keepdim(dim));
                    check(&w("max"), &dev, EXACT, |d| pick(d).max_keepdim(dim));
                    check(&w("min"), &dev, EXACT, |d| pick(d).min_keepdim(dim));
                    check(&w("argmax"), &dev, EXACT, |d| pick(d).argmax_keepdim(dim));
                    check(&w("argmin"), &dev, EXACT, |d| pick(d).argmin_keepdim(dim));
                }
            }
        }
    }
}

#[test]
fn casts_between_all_stored_dtypes() {
    let all = [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::BF16, DType::F16, DType::F32, DType::F64];
    for dev in devices() {
        for src in all {
            for dst in all {
                // Values valid in both (0..100, integral when either side is an integer).
                let base = ints(&[4, 6, 5], DType::F32, 97, 100.0);
                let base = if src.is_float() && dst.is_float() { (base / 7.0).unwrap() } else { base };
                let base = base.to_dtype(src).unwrap();
                for (layout, _) in views(&base, &Device::Cpu) {
                    check(&format!("cast {src:?} -> {dst:?} {layout}"), &dev, EXACT, |d| {
                        views(&base, d).into_iter().find(|(n, _)| *n == layout).unwrap().1.to_dtype(dst)
                    });
                }
            }
        }
        // Float specials through float casts.
        for (src, dst) in [(DType::F32, DType::BF16), (DType::F64, DType::F16), (DType::BF16, DType::F64)] {
            let x = rand(&[4, 6, 5], src, 98, true);
            check(&format!("cast {src:?} -> {dst:?} with NaN/inf"), &dev, EXACT, |d| x.to_device(d)?.to_dtype(dst));
        }
    }
}

#[test]
fn indexing_of_eight_byte_dtypes_and_scatter_set() {
    for dev in devices() {
        for dtype in [DType::I64, DType::F64, DType::F32, DType::U8, DType::BF16] {
            let src = ints(&[5, 7, 3], dtype, 100, 50.0);
            for idt in [DType::U32, DType::I64] {
                let w = |op: &str| format!("{op} {dtype:?} ids {idt:?}");
                for dim in 0..3 {
                    let bound = src.dims()[dim];
                    let ix = ids(&[9], bound, idt, 101 + dim as u64);
                    check(&w(&format!("index_select dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.index_select(&ix.to_device(d)?, dim));
                    let mut gshape = src.dims().to_vec();
                    gshape[dim] = 4;
                    let gx = ids(&gshape, bound, idt, 110 + dim as u64);
                    check(&w(&format!("gather dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.gather(&gx.to_device(d)?, dim));
                    let upd = ints(&gshape, dtype, 120 + dim as u64, 50.0);
                    check(&w(&format!("scatter_add dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.scatter_add(&gx.to_device(d)?, &upd.to_device(d)?, dim));
                    // scatter (set): a permutation along `dim` so each destination is written once.
                    let perm: Vec<u32> = (0..bound as u32).rev().collect();
                    let mut pshape = src.dims().to_vec();
                    pshape[dim] = 1;
                    let px = Tensor::new(perm.as_slice(), &Device::Cpu).unwrap();
                    let mut view = vec![1usize; 3];
                    view[dim] = bound;
                    let px = px.reshape(view).unwrap().broadcast_as(src.dims()).unwrap().contiguous().unwrap().to_dtype(idt).unwrap();
                    let vals = ints(src.dims(), dtype, 130 + dim as u64, 50.0);
                    check(&w(&format!("scatter (set) dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.scatter(&px.to_device(d)?, &vals.to_device(d)?, dim));
                    let mut ashape = src.dims().to_vec();
                    ashape[dim] = 9;
                    let add = ints(&ashape, dtype, 140 + dim as u64, 50.0);
                    check(&w(&format!("index_add dim {dim}")), &dev, EXACT, |d| src.to_device(d)?.index_add(&ix.to_device(d)?, &add.to_device(d)?, dim));
                }
            }
            let cond = ids(&[5, 7, 3], 2, DType::I64, 150);
            let other = ints(&[5, 7, 3], dtype, 151, 50.0);
            check(&format!("where_cond {dtype:?} cond I64, transposed"), &dev, EXACT, |d| {
                cond.to_device(d)?.transpose(0, 2)?.where_cond(&src.to_device(d)?.transpose(0, 2)?, &other.to_device(d)?.transpose(0, 2)?)
            });
        }
    }
}

#[test]
fn random_numbers_are_seeded_reproducible_and_plausible() {
    let devs = devices();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let mut runs = Vec::new();
        for dev in &devs {
            let d = dev.as_candle();
            d.set_seed(42).unwrap();
            let u = Tensor::rand(-1f32, 3f32, 20_000, &d).unwrap().to_dtype(dtype).unwrap();
            let u2 = Tensor::rand(-1f32, 3f32, 20_000, &d).unwrap();
            let n = Tensor::randn(0f32, 1f32, 20_000, &d).unwrap();
            let to = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
            let (u, u2, n) = (to(&u), to(&u2), to(&n));
            assert!(u.iter().all(|&v| (-1.0..3.0).contains(&v) || (dtype != DType::F32 && v == 3.0)), "uniform out of range on {}", dev.name());
            assert_ne!(u, u2, "consecutive draws must differ");
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let var = |v: &[f64]| { let m = mean(v); v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64 };
            // 20,000 draws: mean within ~5 standard errors.
            assert!((mean(&u) - 1.0).abs() < 0.05, "uniform mean {}", mean(&u));
            assert!((var(&u) - 16.0 / 12.0).abs() < 0.06, "uniform variance {}", var(&u));
            assert!(mean(&n).abs() < 0.04 && (var(&n) - 1.0).abs() < 0.05, "normal mean {} variance {}", mean(&n), var(&n));
            d.set_seed(42).unwrap();
            let again = to(&Tensor::rand(-1f32, 3f32, 20_000, &d).unwrap().to_dtype(dtype).unwrap());
            assert_eq!(u, again, "same seed, same numbers on {}", dev.name());
            runs.push(u);
        }
        // Every executor (wave 32, wave 64, GPUs) gives the same bits.
        assert!(runs.windows(2).all(|w| w[0] == w[1]), "{dtype:?}: executors disagree");
    }
}

#[test]
fn device_identity_and_name() {
    let a = candle_rocm::RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W32);
    let b = candle_rocm::RocmDevice::new_cpu_executor(candle_rocm::WaveSize::W32);
    assert!(a.as_candle().same_device(&a.as_candle()));
    assert!(!a.as_candle().same_device(&b.as_candle()));
    assert!(a.name().contains("CPU executor"), "{}", a.name());
    let x = Tensor::new(&[1f32], &a.as_candle()).unwrap();
    let y = Tensor::new(&[1f32], &b.as_candle()).unwrap();
    assert!((&x + &y).is_err(), "ops across two devices must fail");
    assert!(format!("{x}").contains("rocm-kernels:0"));
    let _ = D::Minus1;
}

#[test]
fn convolutions_pools_upsampling() {
    for dev in devices() {
        for dtype in FLOATS {
            // Sums of c_in * taps products: the reference is Candle's CPU on f32 copies,
            // rounded once (as for the fused ops); the GEMM accumulates in f32 too.
            let t = match dtype {
                DType::F32 => Tol { rtol: 1e-5, atol: 1e-5 },
                d => tol(d),
            };
            let x = rand(&[2, 3, 9, 8], dtype, 160, false);
            let k = rand(&[4, 3, 3, 2], dtype, 161, false);
            let x1 = rand(&[2, 3, 11], dtype, 162, false);
            let k1 = rand(&[4, 3, 3], dtype, 163, false);
            let kt = rand(&[3, 4, 3, 2], dtype, 164, false);
            let kt1 = rand(&[3, 4, 3], dtype, 165, false);
            let w = |op: &str| format!("{op} {dtype:?}");
            let refd = |d: &Device, xs: &[&Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>| -> Result<Tensor> {
                let up = xs.iter().map(|x| x.to_device(d)?.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?;
                f(&up)?.to_dtype(dtype)
            };
            let ours = |d: &Device, xs: &[&Tensor], f: &dyn Fn(&[Tensor]) -> Result<Tensor>| -> Result<Tensor> {
                f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?)
            };
            let cases: Vec<(&str, Vec<&Tensor>, Box<TensorFn>)> = vec![
                ("conv2d", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d stride 2 dilation 2", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 0, 2, 2, 1))),
                ("conv2d of a transposed input", vec![&x, &k], Box::new(|v| v[0].transpose(2, 3)?.conv2d(&v[1], 1, 1, 1, 1))),
                ("conv1d", vec![&x1, &k1], Box::new(|v| v[0].conv1d(&v[1], 1, 2, 1, 1))),
                ("conv_transpose2d", vec![&x, &kt], Box::new(|v| v[0].conv_transpose2d(&v[1], 1, 1, 2, 1))),
                ("conv_transpose1d", vec![&x1, &kt1], Box::new(|v| v[0].conv_transpose1d(&v[1], 0, 1, 2, 1, 1))),
                ("avg_pool2d", vec![&x], Box::new(|v| v[0].avg_pool2d_with_stride((3, 2), (2, 2)))),
                ("max_pool2d", vec![&x], Box::new(|v| v[0].max_pool2d_with_stride((3, 2), (2, 1)))),
                ("max_pool2d of a strided view", vec![&x], Box::new(|v| v[0].transpose(2, 3)?.max_pool2d(2))),
                ("upsample_nearest2d", vec![&x], Box::new(|v| v[0].upsample_nearest2d(13, 17))),
                ("upsample_nearest1d", vec![&x1], Box::new(|v| v[0].upsample_nearest1d(23))),
                ("upsample_bilinear2d", vec![&x], Box::new(|v| v[0].upsample_bilinear2d(13, 17, false))),
                ("upsample_bilinear2d align_corners", vec![&x], Box::new(|v| v[0].upsample_bilinear2d(13, 17, true))),
            ];
            for (name, xs, f) in &cases {
                check_ref(&w(name), &dev, t, |d| refd(d, xs, f.as_ref()), |d| ours(d, xs, f.as_ref()));
            }
        }
    }
}

/// f16/bf16 conv2d as GPUs run it: on the implicit-GEMM kernel (`kernels::conv_implicit`,
/// the CPU executor emulating its matrix unit at waves of 32 and 64) and 1x1 convolutions
/// as one GEMM on the input in place, against Candle's CPU conv2d on f32 copies rounded
/// once. Odd channel counts, padding, stride 2, dilation 2, groups 2 (Candle splits
/// them), a transposed input view.
#[test]
fn conv2d_on_the_implicit_gemm_kernel() {
    for dev in devices() {
        for dtype in [DType::F16, DType::BF16] {
            // At most 5 * 9 = 45 products per output.
            let t = product_tol(dtype, 45);
            let x = rand(&[2, 5, 9, 7], dtype, 170, false);
            let k = rand(&[6, 5, 3, 3], dtype, 171, false);
            let xg = rand(&[2, 6, 7, 6], dtype, 172, false);
            let kg = rand(&[4, 3, 3, 3], dtype, 173, false);
            let k1 = rand(&[7, 5, 1, 1], dtype, 174, false);
            let w = |op: &str| format!("implicit-GEMM {op} {dtype:?}");
            let cases: Vec<(&str, Vec<&Tensor>, Box<TensorFn>)> = vec![
                ("conv2d 3x3 padding 1", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d stride 2", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 2, 1, 1))),
                ("conv2d dilation 2 padding 2", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 2, 1, 2, 1))),
                ("conv2d groups 2", vec![&xg, &kg], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 2))),
                ("conv2d 1x1", vec![&x, &k1], Box::new(|v| v[0].conv2d(&v[1], 0, 1, 1, 1))),
                ("conv2d 1x1 of a narrowed batch", vec![&x, &k1], Box::new(|v| v[0].narrow(0, 1, 1)?.conv2d(&v[1], 0, 1, 1, 1))),
                ("conv2d 1x1 stride 2", vec![&x, &k1], Box::new(|v| v[0].conv2d(&v[1], 0, 2, 1, 1))),
                ("conv2d of a transposed input", vec![&x, &k], Box::new(|v| v[0].transpose(2, 3)?.conv2d(&v[1], 1, 1, 1, 1))),
            ];
            for (name, xs, f) in &cases {
                candle_rocm::ops::conv::with_implicit_conv_on_cpu(|| {
                    check_ref(
                        &w(name),
                        &dev,
                        t,
                        |d| f(&xs.iter().map(|x| x.to_device(d)?.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?)?.to_dtype(dtype),
                        |d| f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?),
                    )
                });
            }
        }
    }
}

/// f32 conv2d on im2col + GEMM with the column buffer capped (`with_im2col_cap`), as
/// convolutions whose im2col buffer would pass 32-bit indexing run (SDXL's VAE at
/// 1024x1024 in f32): the input channels in groups, each group's product added to the
/// output. Caps of 3 channels' and of one channel's columns (groups 3, 3, 2 and 8 of
/// one), a narrowed channel view, a stride; against Candle's CPU conv2d. A cap below one
/// channel's columns is an error that says so.
#[test]
fn conv2d_im2col_in_channel_groups() {
    for dev in devices() {
        // At most 8 * 9 = 72 products per output, accumulated in f32 over the groups.
        let t = product_tol(DType::F32, 72);
        let x = rand(&[2, 8, 9, 7], DType::F32, 180, false);
        let k = rand(&[5, 8, 3, 3], DType::F32, 181, false);
        let k6 = rand(&[5, 6, 3, 3], DType::F32, 182, false);
        // One channel's columns at stride 1, padding 1: 2 * 9 * 7 output pixels x 9 taps.
        let one = 2 * 9 * 7 * 9;
        let cases: Vec<(&str, usize, Vec<&Tensor>, Box<TensorFn>)> = vec![
            ("groups of 3 channels", 3 * one, vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
            ("groups of 1 channel", one, vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
            ("groups of a narrowed channel view", 4 * one, vec![&x, &k6], Box::new(|v| v[0].narrow(1, 1, 6)?.conv2d(&v[1], 1, 1, 1, 1))),
            ("groups at stride 2", one, vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 2, 1, 1))),
        ];
        for (name, cap, xs, f) in &cases {
            candle_rocm::ops::conv::with_im2col_cap(*cap, || {
                check_ref(&format!("im2col conv2d {name}"), &dev, t, |d| f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?), |d| {
                    f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?)
                })
            });
        }
        let d = dev.as_candle();
        let err = candle_rocm::ops::conv::with_im2col_cap(one - 1, || x.to_device(&d).unwrap().conv2d(&k.to_device(&d).unwrap(), 1, 1, 1, 1)).unwrap_err();
        assert!(err.to_string().contains("exceed the"), "{err}");
    }
}

/// f16/bf16 conv2d on the channels-last implicit GEMM (`kernels::conv_implicit::
/// conv2d_channels_last`, the CPU executor emulating its matrix unit at waves of 32 and
/// 64) against Candle's CPU conv2d on f32 copies rounded once: NCHW inputs (copied to
/// NHWC), channels-last views taken in place (one at an offset: a narrowed batch),
/// padding, stride 2, dilation 2, a transposed input, channels that are no multiple of
/// the K step. Also on the executor emulating NVIDIA's units, where the route takes the
/// wgmma kernel for output channels in multiples of 8: 160-channel tiles with the filter
/// rearranged K-major (`FilterLayout::Ohwi`) for 320 channels, 128-channel tiles for 16.
#[test]
fn conv2d_on_the_channels_last_kernel() {
    let mut devs = devices();
    devs.push(candle_rocm::RocmDevice::new_cpu_executor_with(candle_rocm::WaveSize::W32, kernel_dsl::host::MatrixUnit::MmaSync));
    for dev in devs {
        for dtype in [DType::F16, DType::BF16] {
            // At most 24 * 9 = 216 products per output.
            let t = product_tol(dtype, 216);
            let x = rand(&[2, 8, 9, 7], dtype, 190, false);
            let k = rand(&[6, 8, 3, 3], dtype, 191, false);
            let x24 = rand(&[1, 24, 6, 5], dtype, 192, false);
            let k24 = rand(&[20, 24, 3, 3], dtype, 193, false);
            // Channels-last in memory: (b, h, w, c) seen as (b, c, h, w).
            let xcl = rand(&[3, 9, 7, 8], dtype, 194, false);
            let k16 = rand(&[16, 8, 3, 3], dtype, 195, false);
            let k320 = rand(&[320, 8, 3, 3], dtype, 196, false);
            let w = |op: &str| format!("channels-last {op} {dtype:?}");
            let cases: Vec<(&str, Vec<&Tensor>, Box<TensorFn>)> = vec![
                ("conv2d 3x3 padding 1", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d 24 channels", vec![&x24, &k24], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d stride 2", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 1, 2, 1, 1))),
                ("conv2d dilation 2 padding 2", vec![&x, &k], Box::new(|v| v[0].conv2d(&v[1], 2, 1, 2, 1))),
                ("conv2d of a transposed input", vec![&x, &k], Box::new(|v| v[0].transpose(2, 3)?.conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d of a channels-last view", vec![&xcl, &k], Box::new(|v| v[0].permute((0, 3, 1, 2))?.conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d of a narrowed channels-last view", vec![&xcl, &k], Box::new(|v| v[0].narrow(0, 1, 2)?.permute((0, 3, 1, 2))?.conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d to 16 channels", vec![&x, &k16], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
                ("conv2d to 320 channels", vec![&x, &k320], Box::new(|v| v[0].conv2d(&v[1], 1, 1, 1, 1))),
            ];
            for (name, xs, f) in &cases {
                candle_rocm::ops::conv::with_channels_last_conv_on_cpu(|| {
                    check_ref(
                        &w(name),
                        &dev,
                        t,
                        |d| f(&xs.iter().map(|x| x.to_device(d)?.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?)?.to_dtype(dtype),
                        |d| f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?),
                    )
                });
            }
        }
    }
}

/// `sd_ops::group_norm` (one kernel) against candle-nn's `GroupNorm` on the CPU (and
/// Candle's `silu`), with and without the affine parameters and the SiLU, on 4-d and 3-d
/// inputs and a transposed view; then its argument errors.
#[test]
fn group_norm_matches_candle_nn() {
    use candle_rocm::sd_ops::group_norm;
    for dev in devices() {
        for dtype in FLOATS {
            // The reference: candle-nn on f32 copies, rounded once (candle-nn itself rounds a
            // half-type result after normalising, after the weight and after the bias; we
            // round once): one rounding plus f32 evaluation differences.
            let t = match dtype {
                DType::F32 => Tol { rtol: 1e-4, atol: 1e-5 },
                d => tol(d),
            };
            let x = rand(&[2, 6, 5, 7], dtype, 180, false);
            let x3 = rand(&[3, 8, 33], dtype, 181, false);
            let w = rand(&[6], dtype, 182, false);
            let b = rand(&[6], dtype, 183, false);
            let w8 = rand(&[8], dtype, 184, false);
            let name = |s: &str| format!("group_norm {s} {dtype:?}");
            type Gn = dyn Fn(&[Tensor]) -> Result<Tensor>;
            let cases: Vec<(&str, Vec<&Tensor>, Box<Gn>)> = vec![
                ("affine + silu", vec![&x, &w, &b], Box::new(|v| group_norm(&v[0], 3, Some(&v[1]), Some(&v[2]), 1e-5, true))),
                ("affine", vec![&x, &w, &b], Box::new(|v| group_norm(&v[0], 2, Some(&v[1]), Some(&v[2]), 1e-6, false))),
                ("plain, 3-d", vec![&x3], Box::new(|v| group_norm(&v[0], 4, None, None, 1e-5, false))),
                ("weight only + silu, 3-d", vec![&x3, &w8], Box::new(|v| group_norm(&v[0], 8, Some(&v[1]), None, 1e-5, true))),
                ("of a transposed view", vec![&x, &b], Box::new(|v| group_norm(&v[0].transpose(2, 3)?, 6, None, Some(&v[1]), 1e-5, false))),
                // candle-nn's own GroupNorm, which the Candle patch routes to the kernel.
                ("candle_nn::GroupNorm", vec![&x, &w, &b], Box::new(|v| {
                    use candle_core::Module;
                    candle_nn::GroupNorm::new(v[1].clone(), v[2].clone(), 6, 3, 1e-5)?.forward(&v[0])
                })),
            ];
            for (what, xs, f) in &cases {
                check_ref(
                    &name(what),
                    &dev,
                    t,
                    |d| f(&xs.iter().map(|x| x.to_device(d)?.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?)?.to_dtype(dtype),
                    |d| f(&xs.iter().map(|x| x.to_device(d)).collect::<Result<Vec<_>>>()?),
                );
            }
        }
        let d = dev.as_candle();
        // candle-nn's GroupNorm is one backend op (the patch's `FusedOp::GroupNorm`), not
        // the ten or so of its composed form.
        {
            use candle_core::Module;
            let x = rand(&[2, 6, 5, 7], DType::F16, 187, false).to_device(&d).unwrap();
            let (w, b) = (Tensor::ones(6, DType::F16, &d).unwrap(), Tensor::zeros(6, DType::F16, &d).unwrap());
            let gn = candle_nn::GroupNorm::new(w, b, 6, 3, 1e-5).unwrap();
            dev.set_profiling(true);
            gn.forward(&x).unwrap();
            let p = dev.take_profile().unwrap();
            dev.set_profiling(false);
            let ops: Vec<&str> = p.ops.iter().map(|o| o.op.as_str()).collect();
            assert_eq!(ops, ["fused.group_norm"], "{}: backend ops of candle-nn's GroupNorm", dev.name());
        }
        let x = rand(&[2, 6, 4], DType::F32, 185, false).to_device(&d).unwrap();
        let w5 = rand(&[5], DType::F32, 186, false).to_device(&d).unwrap();
        let w16 = rand(&[6], DType::F16, 186, false).to_device(&d).unwrap();
        let e = |r: Result<Tensor>| r.unwrap_err().to_string();
        assert!(e(group_norm(&x, 4, None, None, 1e-5, false)).contains("groups"));
        assert!(e(group_norm(&x, 3, Some(&w5), None, 1e-5, false)).contains("`weight` has shape"));
        assert!(e(group_norm(&x, 3, None, Some(&w16), 1e-5, false)).contains("`bias` is F16"));
        assert!(e(group_norm(&x, 3, None, None, f64::NAN, false)).contains("eps"));
        assert!(e(group_norm(&x.flatten_all().unwrap(), 3, None, None, 1e-5, false)).contains("[batch, channels, ..]"));
    }
}

/// f8e4m3 values as their bits (NaN sign and payload, -0 included).
fn f8_bits(t: &Tensor) -> Vec<u8> {
    let v = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<float8::F8E4M3>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// As [`check`], bit for bit when the result is f8e4m3 (f8 storage and data movement are
/// exact; f8 arithmetic rounds once, as Candle's `float8` ops do), else `EXACT`.
fn check_f8(what: &str, dev: &candle_rocm::RocmDevice, f: impl Fn(&Device) -> Result<Tensor>) {
    let want = f(&Device::Cpu).unwrap_or_else(|e| panic!("{what}: cpu reference failed: {e}"));
    let got = f(&dev.as_candle()).unwrap_or_else(|e| panic!("{what} on {}: {e}", dev.name()));
    assert!(matches!(got.device(), Device::Ext(_)), "{what}: result left the device");
    assert_eq!((want.dims(), want.dtype()), (got.dims(), got.dtype()), "{what}: shape and dtype");
    if want.dtype() == DType::F8E4M3 {
        assert_eq!(f8_bits(&want), f8_bits(&got), "{what} on {}: f8e4m3 bits", dev.name());
    } else {
        assert_close(&format!("{what} on {}", dev.name()), &want, &got, EXACT);
    }
}

#[test]
fn f8e4m3_storage_casts_indexing_and_comparisons() {
    use float8::F8E4M3 as F8;
    let f8 = DType::F8E4M3;
    // Every f8e4m3 bit pattern (NaN 0x7F/0xFF, -0, +-448), and rounded values with NaN/inf.
    let all = Tensor::from_vec((0..=255u8).map(F8::from_bits).collect::<Vec<_>>(), (4, 8, 8), &Device::Cpu).unwrap();
    let rounded = rand(&[4, 6, 5], DType::F32, 160, true).to_dtype(f8).unwrap();
    let finite = rand(&[4, 6, 5], DType::F32, 161, false).to_dtype(f8).unwrap();
    let finite2 = rand(&[4, 6, 5], DType::F32, 162, false).to_dtype(f8).unwrap();
    let reversed = Tensor::from_vec((0..=255u8).rev().map(F8::from_bits).collect::<Vec<_>>(), (4, 8, 8), &Device::Cpu).unwrap();
    for dev in devices() {
        let w = |s: &str| format!("f8e4m3 {s}");
        // Storage: fills, uploads and downloads.
        check_f8(&w("zeros"), &dev, |d| Tensor::zeros((2, 3), f8, d));
        check_f8(&w("ones"), &dev, |d| Tensor::ones((2, 3), f8, d));
        check_f8(&w("full"), &dev, |d| Tensor::full(F8::from_f32(-1.5), (3, 5), d));
        check_f8(&w("arange to_dtype"), &dev, |d| Tensor::arange(0f32, 24., d)?.to_dtype(f8)?.reshape((2, 3, 4)));
        check_f8(&w("to_device round trip"), &dev, |d| all.to_device(d));
        check_f8(&w("zeros_like/ones_like"), &dev, |d| all.to_device(d)?.ones_like()?.add(&all.to_device(d)?.zeros_like()?));
        // Copies: strided views made contiguous, cat (copy2d), set ops.
        for (layout, _) in views(&all, &Device::Cpu) {
            check_f8(&w(&format!("contiguous() of {layout}")), &dev, |d| views(&all, d).into_iter().find(|(n, _)| *n == layout).unwrap().1.contiguous());
        }
        check_f8(&w("cat dim 0"), &dev, |d| Tensor::cat(&[all.to_device(d)?, reversed.to_device(d)?], 0));
        check_f8(&w("cat dim 1"), &dev, |d| Tensor::cat(&[all.to_device(d)?, reversed.to_device(d)?.narrow(1, 0, 3)?], 1));
        check_f8(&w("cat dim 2 of transposed"), &dev, |d| Tensor::cat(&[all.to_device(d)?.transpose(0, 1)?, reversed.to_device(d)?.transpose(0, 1)?], 2));
        check_f8(&w("zero_set/one_set of views"), &dev, |d| {
            let t = all.to_device(d)?.copy()?;
            t.i((.., 1..4, 2..))?.zero_set()?;
            t.transpose(0, 2)?.i(1..2)?.one_set()?;
            Ok(t)
        });
        check_f8(&w("slice_set"), &dev, |d| {
            let t = all.to_device(d)?.copy()?;
            t.slice_set(&reversed.to_device(d)?.narrow(1, 0, 2)?.contiguous()?, 1, 3)?;
            Ok(t)
        });
        // Casts both ways, every stored dtype, every layout.
        for dt in [DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::BF16, DType::F16, DType::F32, DType::F64] {
            for (layout, _) in views(&all, &Device::Cpu) {
                // Float -> int casts of NaN and out-of-range values: Rust `as` on both sides.
                let pick = |d: &Device| views(&all, d).into_iter().find(|(n, _)| *n == layout).unwrap().1;
                if dt == DType::F64 {
                    // Candle's CPU f8e4m3 -> f64 (`float8` 0.7 `to_f64`) overflows the stack:
                    // the reference goes through f32 (exact for every f8e4m3 value).
                    check_ref(&w(&format!("-> {dt:?} {layout}")), &dev, EXACT, |d| pick(d).to_dtype(DType::F32)?.to_dtype(dt), |d| pick(d).to_dtype(dt));
                } else {
                    check_f8(&w(&format!("-> {dt:?} {layout}")), &dev, |d| pick(d).to_dtype(dt));
                }
            }
            let src = if dt.is_float() { rand(&[4, 6, 5], dt, 163, true) } else { ints(&[4, 6, 5], dt, 163, 100.0) };
            check_f8(&w(&format!("{dt:?} -> f8e4m3")), &dev, |d| src.to_device(d)?.transpose(0, 2)?.to_dtype(f8));
        }
        // Indexing (bits move): index_select, gather, scatter (set), index_add of distinct
        // ids, where_cond with u8 and i64 conditions.
        for idt in [DType::U8, DType::U32, DType::I64] {
            for dim in 0..3 {
                let bound = all.dims()[dim];
                let ix = ids(&[9], bound, idt, 170 + dim as u64);
                check_f8(&w(&format!("index_select dim {dim} ids {idt:?}")), &dev, |d| all.to_device(d)?.index_select(&ix.to_device(d)?, dim));
                let mut gshape = all.dims().to_vec();
                gshape[dim] = 3;
                let gx = ids(&gshape, bound, idt, 180 + dim as u64);
                check_f8(&w(&format!("gather dim {dim} ids {idt:?}")), &dev, |d| all.to_device(d)?.gather(&gx.to_device(d)?, dim));
                // A permutation along `dim`: every destination written once.
                let perm: Vec<u32> = (0..bound as u32).rev().collect();
                let mut view = vec![1usize; 3];
                view[dim] = bound;
                let px = Tensor::new(perm.as_slice(), &Device::Cpu).unwrap().reshape(view).unwrap().broadcast_as(all.dims()).unwrap().contiguous().unwrap().to_dtype(idt).unwrap();
                check_f8(&w(&format!("scatter (set) dim {dim} ids {idt:?}")), &dev, |d| all.to_device(d)?.scatter(&px.to_device(d)?, &reversed.to_device(d)?, dim));
                let distinct = Tensor::new(&[2u32, 0, 3], &Device::Cpu).unwrap().to_dtype(idt).unwrap();
                let mut ashape = all.dims().to_vec();
                ashape[dim] = 3;
                let add = rand(&ashape, DType::F32, 165 + dim as u64, false).to_dtype(f8).unwrap();
                let base = rand(&[4, 8, 8], DType::F32, 164, false).to_dtype(f8).unwrap();
                check_f8(&w(&format!("index_add dim {dim} ids {idt:?}")), &dev, |d| base.to_device(d)?.index_add(&distinct.to_device(d)?, &add.to_device(d)?, dim));
            }
        }
        for cdt in [DType::U8, DType::I64] {
            let cond = ids(&[4, 8, 8], 2, cdt, 190);
            check_f8(&w(&format!("where_cond cond {cdt:?}")), &dev, |d| cond.to_device(d)?.where_cond(&all.to_device(d)?, &reversed.to_device(d)?));
            check_f8(&w(&format!("where_cond cond {cdt:?}, transposed branches")), &dev, |d| {
                cond.to_device(d)?.transpose(0, 2)?.where_cond(&all.to_device(d)?.transpose(0, 2)?, &reversed.to_device(d)?.transpose(0, 2)?)
            });
        }
        // Comparisons by value (u8 out): -0 == +0, NaN compares false (ne true).
        for op in ["eq", "ne", "lt", "le", "gt", "ge"] {
            let f = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
                match op {
                    "eq" => x.broadcast_eq(y),
                    "ne" => x.broadcast_ne(y),
                    "lt" => x.broadcast_lt(y),
                    "le" => x.broadcast_le(y),
                    "gt" => x.broadcast_gt(y),
                    _ => x.broadcast_ge(y),
                }
            };
            check_f8(&w(&format!("cmp {op} every pattern vs reversed")), &dev, |d| f(&all.to_device(d)?, &reversed.to_device(d)?));
            check_f8(&w(&format!("cmp {op} with itself")), &dev, |d| f(&all.to_device(d)?, &all.to_device(d)?));
            check_f8(&w(&format!("cmp {op} broadcast row, transposed")), &dev, |d| f(&rounded.to_device(d)?.transpose(0, 2)?, &finite.to_device(d)?.i((.., 2..3, ..))?.transpose(0, 2)?));
        }
        let zeros = Tensor::from_vec(vec![F8::from_bits(0x00), F8::from_bits(0x80), F8::from_bits(0x7F)], 3, &Device::Cpu).unwrap();
        let signed = Tensor::from_vec(vec![F8::from_bits(0x80), F8::from_bits(0x00), F8::from_bits(0x7F)], 3, &Device::Cpu).unwrap();
        let eq = zeros.to_device(&dev.as_candle()).unwrap().eq(&signed.to_device(&dev.as_candle()).unwrap()).unwrap();
        assert_eq!(eq.to_vec1::<u8>().unwrap(), [1, 1, 0], "f8e4m3: -0 == +0, NaN != NaN on {}", dev.name());
        // Arithmetic on finite values (one rounding to f8, as Candle's `float8` ops; NaN
        // results of minimum/maximum differ from Candle's, see the module docs of
        // kernels::arith), affine, max/min/argmax/argmin.
        for op in ["add", "sub", "mul", "div", "minimum", "maximum"] {
            check_f8(&w(op), &dev, |d| {
                let (x, y) = (finite.to_device(d)?, finite2.to_device(d)?.transpose(1, 2)?.contiguous()?.transpose(1, 2)?);
                match op {
                    "add" => x.add(&y),
                    "sub" => x.sub(&y),
                    "mul" => x.mul(&y),
                    "div" => x.div(&y),
                    "minimum" => x.minimum(&y),
                    _ => x.maximum(&y),
                }
            });
        }
        check_f8(&w("affine"), &dev, |d| finite.to_device(d)?.transpose(0, 2)?.affine(1.5, -0.25));
        for dim in 0..3 {
            check_f8(&w(&format!("max dim {dim}")), &dev, |d| finite.to_device(d)?.max_keepdim(dim));
            check_f8(&w(&format!("min dim {dim}")), &dev, |d| finite.to_device(d)?.min_keepdim(dim));
            check_f8(&w(&format!("argmax dim {dim}")), &dev, |d| finite.to_device(d)?.argmax_keepdim(dim));
            check_f8(&w(&format!("argmin dim {dim}")), &dev, |d| finite.to_device(d)?.argmin_keepdim(dim));
        }
        check_f8(&w("upsample_nearest2d"), &dev, |d| finite.to_device(d)?.unsqueeze(0)?.upsample_nearest2d(12, 10));
        // Ops without an f8e4m3 kernel are typed errors, and the device stays usable.
        let x = all.to_device(&dev.as_candle()).unwrap();
        let e = x.exp().unwrap_err().to_string();
        assert!(e.contains("F8E4M3") && e.contains("exp"), "{e}");
        assert!(x.matmul(&x.transpose(1, 2).unwrap()).is_err());
        assert_eq!(f8_bits(&x.contiguous().unwrap()), f8_bits(&all));
    }
}

/// An op applied to a list of input tensors.
type TensorFn = dyn Fn(&[Tensor]) -> Result<Tensor>;
