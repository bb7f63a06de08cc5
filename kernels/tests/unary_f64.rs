//! The f64 unary ops against Rust's `std` f64 functions (libm's `erf` for erf/GELU): each
//! result within a few ulp of the reference (relative `4 * 2^-52`), plus an absolute
//! allowance where the function's own conditioning or its cancellation is the limit:
//! `erf` and GELU-erf `2e-15`; `sin`/`cos` `|x| * 2^-52` (the argument's own rounding is
//! amplified by the reduction); `powf` `|p ln x| * 2^-50` relative (the exp(p ln x)
//! formulation). Specials (NaN, +-inf, +-0, subnormals) must match exactly. CPU executor
//! with waves of 32 and 64, a strided view.
use kernels::unary_f64::{self as u, ops::unary_f64};
use kernels::runtime::Device;

mod common;
use common::executors;

fn inputs() -> Vec<f64> {
    let mut v = vec![0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e-310, -1e-310, 700.0, 709.7, 710.0, -745.0, -746.0, 1e-20, 30.0, -30.0, 5.999, 6.001, 2.4999, 2.5001, 0.3499, 0.3501, 4503599627370497.0, -4503599627370495.5, 1e5, -123456.789];
    let mut s = 12345u64;
    for i in 0..3000 {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = (s >> 11) as f64 / (1u64 << 53) as f64;
        let scale = [1.0, 4.0, 20.0, 100.0, 1e-3][i % 5];
        v.push((u * 2.0 - 1.0) * scale);
    }
    v
}

fn reference(op: u32, x: f64, p: f64) -> f64 {
    const C: f64 = 0.797_884_560_802_865_4;
    match op {
        u::U_NEG => -x,
        u::U_EXP => x.exp(),
        u::U_LOG => x.ln(),
        u::U_SQRT => x.sqrt(),
        u::U_ABS => x.abs(),
        u::U_SQR => x * x,
        u::U_RECIP => 1.0 / x,
        u::U_RELU => if x < 0.0 { 0.0 } else { x },
        u::U_GELU => 0.5 * x * (1.0 + (C * x * (1.0 + 0.044715 * x * x)).tanh()),
        u::U_GELU_ERF => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        u::U_SILU => x / (1.0 + (-x).exp()),
        u::U_TANH => x.tanh(),
        u::U_SIGMOID => 1.0 / (1.0 + (-x).exp()),
        u::U_ERF => libm::erf(x),
        u::U_SIN => x.sin(),
        u::U_COS => x.cos(),
        u::U_FLOOR => x.floor(),
        u::U_CEIL => x.ceil(),
        u::U_ROUND => x.round(),
        u::U_SIGN => if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x },
        u::U_ELU => if x >= 0.0 { x } else { p * x.exp_m1() },
        _ => x.powf(p),
    }
}

fn allowance(op: u32, x: f64, p: f64) -> f64 {
    let e = f64::EPSILON;
    match op {
        u::U_ERF | u::U_GELU_ERF => 2e-15 * x.abs().max(1.0),
        u::U_SIN | u::U_COS => x.abs() * e + 4.0 * e,
        // GELU/SiLU near their zeros: cancellation in 1 + tanh(..) / the formula itself.
        u::U_GELU | u::U_SILU | u::U_SIGMOID | u::U_ELU => 4.0 * e * x.abs().max(1.0),
        u::U_POWF => 0.0,
        _ => 0.0,
    }
    .max(if op == u::U_POWF { ((p * x.abs().ln()).abs() + 8.0) * 4.0 * e * reference(op, x, p).abs() } else { 0.0 })
}

#[test]
fn f64_unary_ops_match_std() {
    let xs = inputs();
    let names = ["neg", "exp", "log", "sqrt", "abs", "sqr", "recip", "relu", "gelu", "gelu_erf", "silu", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round", "sign", "elu", "powf"];
    for dev in executors() {
        let src = dev.upload(&xs).unwrap();
        for op in 0..=u::U_POWF {
            for p in if op == u::U_ELU { vec![1.0, 0.3] } else if op == u::U_POWF { vec![2.0, 0.5, -1.5, 3.0, 7.25] } else { vec![0.0] } {
                let mut out = dev.alloc::<f64>(xs.len()).unwrap();
                unary_f64(&dev, op, p, &src, None, &mut out).unwrap();
                let got = dev.download(&out).unwrap();
                for (i, (&x, &g)) in xs.iter().zip(&got).enumerate() {
                    let w = reference(op, x, p);
                    let ok = if w.is_nan() || g.is_nan() {
                        w.is_nan() && g.is_nan()
                    } else if w.is_infinite() || w == 0.0 {
                        g == w || (g - w).abs() <= allowance(op, x, p)
                    } else {
                        (g - w).abs() <= 4.0 * f64::EPSILON * w.abs() + allowance(op, x, p) + if w.abs() < 1e-290 { 1e-300 } else { 0.0 }
                    };
                    assert!(ok, "{} p={p} x[{i}]={x:e}: got {g:e}, want {w:e}", names[op as usize]);
                }
            }
        }
        // A strided view: every third element, backwards via a reversed copy.
        let rev: Vec<f64> = xs.iter().rev().copied().collect();
        let n = xs.len() / 3;
        let mut out = dev.alloc::<f64>(n).unwrap();
        unary_f64(&dev, u::U_SQR, 0.0, &dev.upload(&rev).unwrap(), Some((&[n], &[3])), &mut out).unwrap();
        let got = dev.download(&out).unwrap();
        for k in 0..n {
            let x = rev[3 * k];
            assert!(got[k] == x * x || (x.is_nan() && got[k].is_nan()));
        }
    }
}

#[test]
fn bad_op_code_is_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let mut out = dev.upload(&[3.0f64; 2]).unwrap();
    let r = unary_f64(&dev, 99, 0.0, &dev.upload(&[1.0f64; 2]).unwrap(), None, &mut out);
    assert!(matches!(r, Err(kernel_dsl::host::LaunchError::InvalidArgument { .. })));
    assert_eq!(dev.download(&out).unwrap(), [3.0; 2]);
}
