//! Elementwise kernels against an independent `f64` reference, for f32/f16/bf16, odd
//! sizes, strided and broadcast layouts. Every test runs on the CPU executor with waves of
//! 32 and 64 lanes, and on each GPU this build can reach (`--features cuda` / `rocm`);
//! a GPU that is not there is reported as SKIPPED with the reason.
//!
//! Tolerances: the reference is computed in f64 from the same (already rounded) inputs and
//! rounded once to the output type, so the only differences are the f32 evaluation inside
//! the kernel (a few ulp for transcendental functions; the erf approximant is within
//! 1.2e-7 absolute) plus, for half types, at most one rounding step of the output:
//! f32: 2e-6 relative + 2e-6 absolute; f16: 2^-10 relative + 2^-14 absolute (one f16 ulp);
//! bf16: 2^-7 relative + 2^-14 absolute (one bf16 ulp).
use half::{bf16, f16};
use kernel_dsl::host::{Executor, LaunchConfig, LaunchError, WaveSize};
use kernel_dsl::{CastFrom, Dim3, Element};
use kernels::elementwise::{self as ew, *};
use kernels::runtime::Device;

mod common;
use common::*;

const SIZES: [usize; 5] = [0, 1, 7, 1023, 65537];

fn reference_unary(name: &str, x: f64) -> f64 {
    let gelu = |x: f64| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh());
    match name {
        "neg" => -x,
        "exp" => x.exp(),
        "log" => x.ln(),
        "sqrt" => x.sqrt(),
        "abs" => x.abs(),
        "sqr" => x * x,
        "recip" => 1.0 / x,
        "relu" => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        "gelu" => gelu(x),
        "gelu_erf" => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        "silu" => x / (1.0 + (-x).exp()),
        "tanh" => x.tanh(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        "erf" => libm::erf(x),
        "sin" => x.sin(),
        "cos" => x.cos(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        "round" => x.round(),
        "sign" => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }
        other => panic!("no reference for {other}"),
    }
}

/// Input range per op: where the f32 kernel and the f64 reference are comparable with the
/// tolerances above (e.g. `exp` below overflow, `sin` where f32 argument reduction is exact).
fn domain(name: &str) -> (f64, f64) {
    match name {
        "exp" => (-80.0, 80.0),
        "log" | "sqrt" => (1e-3, 1e4),
        "recip" => (0.5, 100.0),
        "sin" | "cos" => (-10.0, 10.0),
        "gelu" | "gelu_erf" | "silu" | "sigmoid" | "tanh" | "erf" => (-8.0, 8.0),
        _ => (-100.0, 100.0),
    }
}

fn run_unary<T: TestFloat, Op: UnaryOp>(name: &str) {
    for exec in executors() {
        for &n in &SIZES {
            let (lo, hi) = domain(name);
            let specials = !matches!(name, "sin" | "cos");
            let x: Vec<T> = inputs(n, lo, hi, n as u64 + 1, specials).into_iter().map(T::from_f64).collect();
            let dx = exec.upload(&x).unwrap();
            let mut dy = exec.upload(&vec![T::from_f64(12345.0); n]).unwrap();
            ew::unary::launch::<T, Op>(&exec, ew::launch_config(n), &dx, &[], &mut dy).unwrap();
            let y = exec.download(&dy).unwrap();
            let want: Vec<f64> = x.iter().map(|v| reference_unary(name, v.to_f64())).collect();
            assert_close(&y, &want, &format!("{name}<{}> n={n} on {}", T::NAME, exec.name()));
        }
    }
}

macro_rules! unary_tests {
    ($($test:ident: $op:ident = $name:literal;)*) => {$(
        #[test]
        fn $test() {
            run_unary::<f32, $op>($name);
            run_unary::<f16, $op>($name);
            run_unary::<bf16, $op>($name);
        }
    )*};
}

unary_tests! {
    unary_neg: Neg = "neg";
    unary_exp: Exp = "exp";
    unary_log: Log = "log";
    unary_sqrt: Sqrt = "sqrt";
    unary_abs: Abs = "abs";
    unary_sqr: Sqr = "sqr";
    unary_recip: Recip = "recip";
    unary_relu: Relu = "relu";
    unary_gelu: Gelu = "gelu";
    unary_gelu_erf: GeluErf = "gelu_erf";
    unary_silu: Silu = "silu";
    unary_tanh: Tanh = "tanh";
    unary_sigmoid: Sigmoid = "sigmoid";
    unary_erf: Erf = "erf";
    unary_sin: Sin = "sin";
    unary_cos: Cos = "cos";
    unary_floor: Floor = "floor";
    unary_ceil: Ceil = "ceil";
    unary_round: Round = "round";
    unary_sign: Sign = "sign";
}

#[test]
fn unary_log_and_sqrt_of_negative_and_zero_match_ieee() {
    for exec in executors() {
        let x = exec.upload(&[-1.0f32, 0.0, -0.0, f32::INFINITY, f32::NAN]).unwrap();
        let mut dy = exec.alloc::<f32>(5).unwrap();
        ew::unary::launch::<f32, Log>(&exec, ew::launch_config(5), &x, &[], &mut dy).unwrap();
        let y = exec.download(&dy).unwrap();
        let name = exec.name();
        assert!(y[0].is_nan() && y[1] == f32::NEG_INFINITY && y[2] == f32::NEG_INFINITY, "log on {name}: {y:?}");
        assert!(y[3] == f32::INFINITY && y[4].is_nan(), "log on {name}: {y:?}");
        ew::unary::launch::<f32, Sqrt>(&exec, ew::launch_config(5), &x, &[], &mut dy).unwrap();
        let y = exec.download(&dy).unwrap();
        assert!(y[0].is_nan() && y[1] == 0.0 && y[3] == f32::INFINITY && y[4].is_nan(), "sqrt on {name}: {y:?}");
    }
}

/// A transposed view: `x` is a row-major `rows x cols` matrix read as its transpose.
#[test]
fn unary_reads_strided_views() {
    let (rows, cols) = (37usize, 29usize);
    let x: Vec<f32> = inputs(rows * cols, -5.0, 5.0, 9, false).into_iter().map(|v| v as f32).collect();
    let layout = ew::strided_layout(&[cols, rows], &[1, cols], x.len()).unwrap();
    for exec in executors() {
        let (dx, dl) = (exec.upload(&x).unwrap(), exec.upload(&layout).unwrap());
        let mut dy = exec.alloc::<f32>(rows * cols).unwrap();
        // Few work-groups so every work-item loops (grid-stride path).
        let cfg = LaunchConfig::new(Dim3::x(3), Dim3::x(64));
        ew::unary::launch::<f32, Exp>(&exec, cfg, &dx, &dl, &mut dy).unwrap();
        let y = exec.download(&dy).unwrap();
        let want: Vec<f64> = (0..cols * rows).map(|i| (x[(i % rows) * cols + i / rows] as f64).exp()).collect();
        assert_close(&y, &want, "exp of transpose");
    }
}

#[test]
fn strided_layout_rejects_views_past_the_buffer() {
    let err = ew::strided_layout(&[4, 5], &[5, 1], 19).unwrap_err();
    assert!(matches!(err, LaunchError::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("reaches element 19"), "{err}");
    assert!(ew::strided_layout(&[4, 5], &[5, 1], 20).is_ok());
    assert!(ew::strided_layout(&[2], &[1, 1], 20).is_err());
}

fn run_binary<T: TestFloat, Op: BinaryOp>(f: fn(f64, f64) -> f64, name: &str) {
    for exec in executors() {
        for &n in &SIZES {
            let a: Vec<T> = inputs(n, -50.0, 50.0, 3 + n as u64, true).into_iter().map(T::from_f64).collect();
            let b: Vec<T> = inputs(n, 0.5, 50.0, 7 + n as u64, false).into_iter().map(T::from_f64).collect();
            let (da, db) = (exec.upload(&a).unwrap(), exec.upload(&b).unwrap());
            let mut dy = exec.alloc::<T>(n).unwrap();
            ew::binary::launch::<T, Op>(&exec, ew::launch_config(n), &da, &[], &db, &[], &mut dy).unwrap();
            let y = exec.download(&dy).unwrap();
            let want: Vec<f64> = a.iter().zip(&b).map(|(x, z)| f(x.to_f64(), z.to_f64())).collect();
            assert_close(&y, &want, &format!("{name}<{}> n={n} on {}", T::NAME, exec.name()));
        }
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

macro_rules! binary_tests {
    ($($test:ident: $op:ident = $f:expr;)*) => {$(
        #[test]
        fn $test() {
            run_binary::<f32, $op>($f, stringify!($op));
            run_binary::<f16, $op>($f, stringify!($op));
            run_binary::<bf16, $op>($f, stringify!($op));
        }
    )*};
}

binary_tests! {
    binary_add: Add = |a, b| a + b;
    binary_sub: Sub = |a, b| a - b;
    binary_mul: Mul = |a, b| a * b;
    binary_div: Div = |a, b| a / b;
    binary_minimum: Minimum = nan_min;
    binary_maximum: Maximum = nan_max;
}

/// `(b, t, d) + (1, t, 1)`-style broadcasting: the rhs has zero strides.
#[test]
fn binary_broadcasts_through_zero_strides() {
    let (b, t, d) = (3usize, 5usize, 7usize);
    let lhs: Vec<bf16> = inputs(b * t * d, -4.0, 4.0, 11, false).into_iter().map(bf16::from_f64).collect();
    let rhs: Vec<bf16> = inputs(t, -4.0, 4.0, 12, false).into_iter().map(bf16::from_f64).collect();
    let rhs_layout = ew::strided_layout(&[b, t, d], &[0, 1, 0], rhs.len()).unwrap();
    for exec in executors() {
        let (dl, dr, drl) = (exec.upload(&lhs).unwrap(), exec.upload(&rhs).unwrap(), exec.upload(&rhs_layout).unwrap());
        let mut dy = exec.alloc::<bf16>(b * t * d).unwrap();
        ew::binary::launch::<bf16, Mul>(&exec, ew::launch_config(b * t * d), &dl, &[], &dr, &drl, &mut dy).unwrap();
        let y = exec.download(&dy).unwrap();
        let want: Vec<f64> = (0..b * t * d).map(|i| lhs[i].to_f64() * rhs[(i / d) % t].to_f64()).collect();
        assert_close(&y, &want, "broadcast mul");
    }
}

#[test]
fn affine_all_dtypes() {
    fn run<T: TestFloat>() {
        for exec in executors() {
            for &n in &SIZES {
                let x: Vec<T> = inputs(n, -10.0, 10.0, n as u64, true).into_iter().map(T::from_f64).collect();
                let dx = exec.upload(&x).unwrap();
                let mut dy = exec.alloc::<T>(n).unwrap();
                ew::affine::launch::<T>(&exec, ew::launch_config(n), &dx, &[], &mut dy, 1.5, -0.25).unwrap();
                let y = exec.download(&dy).unwrap();
                // f32 fma then one rounding: the f64 reference is exact for these inputs.
                let want: Vec<f64> = x.iter().map(|v| v.to_f64() * 1.5 - 0.25).collect();
                assert_close(&y, &want, &format!("affine<{}> n={n}", T::NAME));
            }
        }
    }
    run::<f32>();
    run::<f16>();
    run::<bf16>();
}

#[test]
fn unary_param_elu_and_powf() {
  for exec in executors() {
    let run = |x: &[f32], op: &str, p: f32| -> Vec<f32> {
        let dx = exec.upload(x).unwrap();
        let mut dy = exec.alloc::<f32>(x.len()).unwrap();
        match op {
            "elu" => ew::unary_param::launch::<f32, Elu>(&exec, ew::launch_config(x.len()), &dx, &[], &mut dy, p).unwrap(),
            _ => ew::unary_param::launch::<f32, Powf>(&exec, ew::launch_config(x.len()), &dx, &[], &mut dy, p).unwrap(),
        }
        exec.download(&dy).unwrap()
    };
    let x: Vec<f32> = inputs(1023, -5.0, 5.0, 5, false).into_iter().map(|v| v as f32).collect();
    let y = run(&x, "elu", 0.7);
    let want: Vec<f64> = x.iter().map(|&v| if v >= 0.0 { v as f64 } else { 0.7f32 as f64 * ((v as f64).exp() - 1.0) }).collect();
    assert_close(&y, &want, "elu");
    let pos: Vec<f32> = x.iter().map(|v| v.abs() + 0.01).collect();
    let y = run(&pos, "powf", 2.5);
    let want: Vec<f64> = pos.iter().map(|&v| (v as f64).powf(2.5)).collect();
    // powf = exp2(y log2 x): the f32 log2 error is scaled by y*ln(x) (< 3e-6 relative here).
    for (g, w) in y.iter().zip(&want) {
        assert!(((*g as f64) - w).abs() <= 1e-5 * w.abs() + 1e-6, "powf: {g} vs {w}");
    }
    for (p, want) in [(3.0f32, -8.0f32), (2.0, 4.0)] {
        let out = run(&[-2.0], "powf", p);
        assert!((out[0] - want).abs() < 1e-5, "(-2)^{p} = {}", out[0]);
    }
    assert!(run(&[-8.0], "powf", 0.5)[0].is_nan(), "(-8)^0.5 must be NaN");
  }
}

fn cast_case<S, D>(values: &[f64], from: fn(f64) -> S, want: fn(S) -> D)
where
    S: Element + std::fmt::Debug,
    D: Element + CastFrom<S> + std::fmt::Debug + PartialEq,
{
    let x: Vec<S> = values.iter().map(|&v| from(v)).collect();
    for exec in executors() {
        let dx = exec.upload(&x).unwrap();
        let mut dy = exec.alloc::<D>(x.len()).unwrap();
        ew::cast::launch::<S, D>(&exec, ew::launch_config(x.len()), &dx, &[], &mut dy).unwrap();
        let y = exec.download(&dy).unwrap();
        for (i, (s, g)) in x.iter().zip(&y).enumerate() {
            let w = want(*s);
            let same = g == &w || (format!("{g:?}").contains("NaN") && format!("{w:?}").contains("NaN"));
            assert!(same, "cast {} -> {} element {i}: {s:?} gave {g:?}, want {w:?}", S::NAME, D::NAME);
        }
    }
}

#[test]
fn cast_between_all_types() {
    let vals: Vec<f64> = [0.0, 1.0, 2.5, -3.75, 255.0, 256.0, 1e6, -1e6, 65504.0, 1e-3]
        .into_iter()
        .chain(inputs(1021, -300.0, 300.0, 4, false))
        .collect();
    let ints: Vec<f64> = vals.iter().map(|v| v.abs().round()).collect();
    // Independent expectations: Rust `as` and the `half` crate's conversions.
    cast_case::<f32, f16>(&vals, |v| v as f32, f16::from_f32);
    cast_case::<f32, bf16>(&vals, |v| v as f32, bf16::from_f32);
    cast_case::<f16, f32>(&vals, f16::from_f64, f16::to_f32);
    cast_case::<bf16, f32>(&vals, bf16::from_f64, bf16::to_f32);
    cast_case::<f16, bf16>(&vals, f16::from_f64, |v| bf16::from_f32(v.to_f32()));
    cast_case::<bf16, f16>(&vals, bf16::from_f64, |v| f16::from_f32(v.to_f32()));
    cast_case::<f32, u8>(&vals, |v| v as f32, |v| v as u8);
    cast_case::<f32, u32>(&vals, |v| v as f32, |v| v as u32);
    cast_case::<f32, i64>(&vals, |v| v as f32, |v| v as i64);
    cast_case::<bf16, i64>(&vals, bf16::from_f64, |v| v.to_f32() as i64);
    cast_case::<u8, f32>(&ints, |v| v as u8, |v| v as f32);
    cast_case::<u32, bf16>(&ints, |v| v as u32, |v| bf16::from_f32(v as f32));
    cast_case::<i64, f16>(&vals, |v| v as i64, |v| f16::from_f32(v as f32));
    cast_case::<i64, u32>(&vals, |v| v as i64, |v| v as u32);
    cast_case::<u32, u8>(&ints, |v| v as u32, |v| v as u8);
    cast_case::<u8, i64>(&ints, |v| v as u8, |v| v as i64);
    cast_case::<f32, f32>(&vals, |v| v as f32, |v| v);
}

#[test]
fn fill_and_copy_strided_all_types() {
    fn run<T: Element + kernel_dsl::host::ScalarArg + PartialEq + std::fmt::Debug>(v: T, w: T) {
        for exec in executors() {
            for &n in &SIZES {
                let mut dy = exec.upload(&vec![w; n]).unwrap();
                ew::fill::launch::<T>(&exec, ew::launch_config(n), &mut dy, v).unwrap();
                let y = exec.download(&dy).unwrap();
                assert!(y.iter().all(|x| *x == v), "fill<{}> n={n} on {}", T::NAME, exec.name());
            }
            // Every other element of a 2 x 9 matrix, transposed.
            let src: Vec<T> = (0..18).map(|i| if i % 2 == 0 { v } else { w }).collect();
            let layout = ew::strided_layout(&[9, 2], &[1, 9], src.len()).unwrap();
            let (ds, dl) = (exec.upload(&src).unwrap(), exec.upload(&layout).unwrap());
            let mut dy = exec.upload(&[v; 18]).unwrap();
            ew::copy_strided::launch::<T>(&exec, ew::launch_config(18), &ds, &dl, &mut dy).unwrap();
            let y = exec.download(&dy).unwrap();
            for i in 0..18 {
                assert_eq!(y[i], src[(i % 2) * 9 + i / 2], "copy_strided<{}> element {i}", T::NAME);
            }
        }
    }
    run::<f32>(1.5, -2.0);
    run::<f16>(f16::from_f32(1.5), f16::from_f32(-2.0));
    run::<bf16>(bf16::from_f32(1.5), bf16::from_f32(-2.0));
    run::<u8>(7, 200);
    run::<u32>(7, 4_000_000_000);
    run::<i64>(-7, i64::MAX);
}

#[test]
fn generic_launcher_rejects_types_that_were_not_instantiated() {
    let exec = Device::cpu(WaveSize::W64);
    let x = vec![1.0f64; 4];
    let mut y = vec![0.0f64; 4];
    let err = ew::copy_strided::launch::<f64>(&exec, ew::launch_config(4), &x, &[], &mut y).unwrap_err();
    match err {
        LaunchError::NotInstantiated { requested, available, .. } => {
            assert_eq!(requested, "copy_strided_f64");
            assert!(available.contains(&"copy_strided_f32"));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(y.iter().all(|v| *v == 0.0), "a rejected launch writes nothing");
}

#[test]
fn short_input_is_reported_as_out_of_bounds_not_memory_corruption() {
    let exec = Device::cpu(WaveSize::W64);
    let x = vec![1.0f32; 10];
    let mut y = vec![0.0f32; 16];
    let err = ew::unary::launch::<f32, Exp>(&exec, ew::launch_config(16), &x, &[], &mut y).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("out-of-bounds") || msg.contains("out of bounds"), "{msg}");
}

#[test]
fn invalid_launch_configs_are_rejected_before_running() {
  for exec in executors() {
    let x = exec.upload(&[1.0f32; 8]).unwrap();
    let mut dy = exec.alloc::<f32>(8).unwrap();
    for block in [Dim3::x(0), Dim3::x(2048), Dim3::new(64, 32, 1)] {
        let cfg = LaunchConfig::new(Dim3::x(1), block);
        let err = ew::unary::launch::<f32, Neg>(&exec, cfg, &x, &[], &mut dy).unwrap_err();
        assert!(matches!(err, LaunchError::InvalidConfig(_)), "{block:?}: {err}");
    }
    assert!(exec.download(&dy).unwrap().iter().all(|v| *v == 0.0), "a rejected launch writes nothing");
  }
}

/// Buffers of one device passed to another executor are rejected, not dereferenced.
#[test]
fn host_buffers_are_rejected_by_gpu_executors() {
    for exec in executors().into_iter().filter(|d| d.is_gpu()) {
        let x = vec![1.0f32; 8];
        let mut dy = exec.alloc::<f32>(8).unwrap();
        let err = ew::unary::launch::<f32, Neg>(&exec, ew::launch_config(8), &x, &[], &mut dy).unwrap_err();
        assert!(matches!(err, LaunchError::WrongMemory { .. }), "{err}");
    }
}

/// Slices that do not start on 16 bytes (views at an odd offset) take the element-wise
/// path instead of the vector path; both give the same results.
#[test]
fn unaligned_views_match_aligned_ones() {
    let x: Vec<f32> = inputs(4099, -3.0, 3.0, 21, false).into_iter().map(|v| v as f32).collect();
    for wave in [WaveSize::W32, WaveSize::W64] {
        let exec = kernel_dsl::host::CpuExecutor::new(wave);
        for offset in 0..4 {
            let src = &x[offset..];
            let mut y = vec![0.0f32; src.len() + 1];
            let out = &mut y[1..];
            ew::unary::launch::<f32, Silu>(&exec, ew::launch_config(src.len()), src, &[], out).unwrap();
            let want: Vec<f64> = src.iter().map(|&v| reference_unary("silu", v as f64)).collect();
            assert_close(out, &want, &format!("silu at offset {offset}"));
            let mut z = vec![0.0f32; src.len()];
            ew::binary::launch::<f32, Mul>(&exec, ew::launch_config(src.len()), src, &[], &x[..src.len()], &[], &mut z).unwrap();
            for i in 0..src.len() {
                assert_eq!(z[i], src[i] * x[i], "mul at offset {offset}, element {i}");
            }
        }
    }
}

/// Offset of logical element `i` of a row-major view with `dims` and `strides` (the test's
/// own reference: digit by digit from the innermost dimension, in u128).
fn reference_offset(i: usize, dims: &[usize], strides: &[usize]) -> usize {
    let (mut rem, mut off) = (i as u128, 0u128);
    for (&d, &s) in dims.iter().zip(strides).rev() {
        off += (rem % d as u128) * s as u128;
        rem /= d as u128;
    }
    off as usize
}

/// The strided path against the reference offsets: innermost sizes below, at and above 8,
/// broadcasts, transposes, narrowed rows, both operands strided, unaligned operands and
/// outputs, lengths that are no multiple of 8, and few work-groups (every work-item loops).
#[test]
fn strided_runs_cross_dimension_boundaries() {
    /// Dims, lhs strides (`None`: contiguous), rhs strides.
    type Case = (Vec<usize>, Option<Vec<usize>>, Vec<usize>);
    let cases: Vec<Case> = vec![
        (vec![5, 3], None, vec![1, 0]),
        (vec![4, 1], None, vec![0, 0]),
        (vec![2, 7, 9], None, vec![0, 1, 0]),
        (vec![3, 8], Some(vec![1, 3]), vec![8, 1]),
        (vec![2, 3, 1, 5], Some(vec![15, 1, 99, 3]), vec![0, 5, 0, 1]),
        (vec![6, 17], Some(vec![1, 6]), vec![17, 1]),
        (vec![1, 130], None, vec![0, 2]),
        (vec![33, 1], Some(vec![2, 7]), vec![1, 1]),
        (vec![3, 40], Some(vec![48, 1]), vec![0, 1]),
        (vec![4, 12], Some(vec![16, 1]), vec![0, 1]),
        (vec![5, 16], None, vec![1, 0]),
    ];
    for (dims, ls, rs) in &cases {
        let n: usize = dims.iter().product();
        let span = |s: &[usize]| dims.iter().zip(s).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
        let (na, nb) = (ls.as_ref().map_or(n, |s| span(s)), span(rs));
        let a: Vec<f32> = inputs(na + 3, -9.0, 9.0, 31 + n as u64, false).into_iter().map(|v| v as f32).collect();
        let b: Vec<f32> = inputs(nb, -9.0, 9.0, 37 + n as u64, false).into_iter().map(|v| v as f32).collect();
        let rl = ew::strided_layout(dims, rs, nb).unwrap();
        for wave in [WaveSize::W32, WaveSize::W64] {
            let exec = kernel_dsl::host::CpuExecutor::new(wave);
            for (shift, groups) in [(0usize, 0u32), (1, 1), (0, 1), (2, 2)] {
                let src = &a[shift..shift + na];
                let ll = ls.as_ref().map(|s| ew::strided_layout(dims, s, na).unwrap()).unwrap_or_default();
                let mut y = vec![0.0f32; n + shift];
                let out = &mut y[shift..];
                let cfg = if groups == 0 { ew::launch_config(n) } else { LaunchConfig::new(Dim3::x(groups), Dim3::x(4)) };
                let what = format!("{dims:?} lhs {ls:?} rhs {rs:?} shift {shift} groups {groups} wave {wave:?}");
                ew::binary::launch::<f32, Sub>(&exec, cfg, src, &ll, &b, &rl, out).unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let x = match ls {
                            Some(s) => src[reference_offset(i, dims, s)],
                            None => src[i],
                        };
                        x as f64 - b[reference_offset(i, dims, rs)] as f64
                    })
                    .collect();
                assert_close(out, &want, &format!("sub {what}"));
                // The one-operand walk: a copy of the rhs view and an affine map of it.
                let mut c = vec![0.0f32; n + shift];
                ew::copy_strided::launch::<f32>(&exec, cfg, &b, &rl, &mut c[shift..]).unwrap();
                let mut z = vec![0.0f32; n];
                ew::affine::launch::<f32>(&exec, cfg, &b, &rl, &mut z, 2.0, 1.0).unwrap();
                for i in 0..n {
                    let v = b[reference_offset(i, dims, rs)];
                    assert_eq!(c[shift + i], v, "copy {what} element {i}");
                    assert_eq!(z[i], v.mul_add(2.0, 1.0), "affine {what} element {i}");
                }
            }
        }
    }
}

/// `binary_runs` against the reference offsets, on every executor: broadcast biases over
/// image and token shapes, group statistics, a scalar, operands with inner strides other
/// than 0 and 1 (element loads), rows not 16-byte aligned (element loads), both operands
/// broadcast innermost; f32 `Sub` and half-type `Mul`. Then, on the CPU executor, operands
/// and outputs that start off 16 bytes, and few work-groups (every work-item loops).
#[test]
fn binary_runs_match_reference_offsets() {
    /// Dims, lhs strides, rhs strides.
    type Case = (Vec<usize>, Vec<usize>, Vec<usize>);
    let cases: Vec<Case> = vec![
        (vec![2, 40, 64], vec![2560, 64, 1], vec![0, 1, 0]),
        (vec![16, 24], vec![24, 1], vec![0, 1]),
        (vec![6, 48], vec![48, 1], vec![1, 0]),
        (vec![3, 5, 16], vec![5, 1, 15], vec![80, 16, 1]),
        (vec![8], vec![1], vec![0]),
        (vec![4, 8], vec![8, 1], vec![9, 1]),
        (vec![2, 3, 8], vec![3, 1, 0], vec![0, 1, 0]),
        (vec![5, 2, 32], vec![1, 5, 10], vec![64, 32, 1]),
    ];
    fn run<T: TestFloat, Op: BinaryOp>(exec: &Device, case: &Case, f: fn(f64, f64) -> f64, seed: u64) {
        let (dims, ls, rs) = case;
        let n: usize = dims.iter().product();
        let span = |s: &[usize]| dims.iter().zip(s).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
        let a: Vec<T> = inputs(span(ls), -9.0, 9.0, seed, false).into_iter().map(T::from_f64).collect();
        let b: Vec<T> = inputs(span(rs), 0.5, 9.0, seed + 1, false).into_iter().map(T::from_f64).collect();
        let v = RunView::new(dims, [ls, rs]).expect("a view binary_runs takes");
        let (da, db) = (exec.upload(&a).unwrap(), exec.upload(&b).unwrap());
        let mut dy = exec.alloc::<T>(n).unwrap();
        let [[l0, l1, l2], [r0, r1, r2]] = v.strides;
        ew::binary_runs::launch::<T, Op>(exec, ew::launch_config(n), &da, &db, &mut dy, v.d1, v.d2, l0, l1, l2, r0, r1, r2).unwrap();
        let want: Vec<f64> = (0..n)
            .map(|i| f(a[reference_offset(i, dims, ls)].to_f64(), b[reference_offset(i, dims, rs)].to_f64()))
            .collect();
        assert_close(&exec.download(&dy).unwrap(), &want, &format!("binary_runs {dims:?} lhs {ls:?} rhs {rs:?}"));
    }
    for exec in executors() {
        for (k, case) in cases.iter().enumerate() {
            run::<f32, Sub>(&exec, case, |a, b| a - b, 40 + k as u64);
            run::<f16, Mul>(&exec, case, |a, b| a * b, 50 + k as u64);
            run::<bf16, Div>(&exec, case, |a, b| a / b, 60 + k as u64);
        }
    }
    for wave in [WaveSize::W32, WaveSize::W64] {
        let exec = kernel_dsl::host::CpuExecutor::new(wave);
        for (dims, ls, rs) in &cases {
            let n: usize = dims.iter().product();
            let span = |s: &[usize]| dims.iter().zip(s).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
            let a: Vec<f32> = inputs(span(ls) + 3, -9.0, 9.0, 71, false).into_iter().map(|v| v as f32).collect();
            let b: Vec<f32> = inputs(span(rs) + 3, -9.0, 9.0, 72, false).into_iter().map(|v| v as f32).collect();
            let v = RunView::new(dims, [ls, rs]).unwrap();
            let [[l0, l1, l2], [r0, r1, r2]] = v.strides;
            for (shift, groups) in [(1usize, 0u32), (3, 1), (2, 2), (0, 1)] {
                let (src, rsrc) = (&a[shift..], &b[3 - shift..]);
                let mut y = vec![0.0f32; n + shift];
                let out = &mut y[shift..];
                let cfg = if groups == 0 { ew::launch_config(n) } else { LaunchConfig::new(Dim3::x(groups), Dim3::x(4)) };
                ew::binary_runs::launch::<f32, Add>(&exec, cfg, src, rsrc, out, v.d1, v.d2, l0, l1, l2, r0, r1, r2).unwrap();
                for i in 0..n {
                    let want = src[reference_offset(i, dims, ls)] + rsrc[reference_offset(i, dims, rs)];
                    assert_eq!(out[i], want, "add {dims:?} lhs {ls:?} rhs {rs:?} shift {shift} groups {groups} element {i}");
                }
            }
        }
    }
}

/// `RunView` takes only what `binary_runs` can: at most three dimensions, the innermost a
/// multiple of 8, offsets below 2^32; and it pads fewer dimensions with leading ones.
#[test]
fn run_views_are_chosen_only_where_binary_runs_applies() {
    let none: Option<RunView<2>> = None;
    assert_eq!(RunView::new(&[5, 3], [&[3, 1], &[0, 1]]), none, "innermost 3");
    assert_eq!(RunView::new(&[2, 2, 2, 8], [&[32, 16, 8, 1], &[0; 4]]), none, "four dimensions");
    assert_eq!(RunView::new(&[], [&[], &[]]), none, "a scalar");
    assert_eq!(RunView::new(&[0, 8], [&[8, 1], &[0, 1]]), none, "no elements");
    assert_eq!(RunView::new(&[2, 8], [&[1 << 32, 1], &[0, 1]]), none, "a stride of 2^32");
    assert_eq!(RunView::new(&[3, 8], [&[(1 << 31) + 5, 1], &[0, 1]]), none, "offsets past 2^32");
    assert_eq!(RunView::new(&[3, 8], [&[8, 1], &[0, 1, 2]]), none, "strides of another rank");
    let v = RunView::new(&[16, 24], [&[24, 1], &[0, 1]]).unwrap();
    assert_eq!(v, RunView { d1: 16, d2: 24, strides: [[0, 24, 1], [0, 0, 1]] });
    let u = RunView::new(&[4, 2, 16], [&[64, 16, 1]]).unwrap();
    assert_eq!(u, RunView { d1: 2, d2: 16, strides: [[64, 16, 1]] });
}

/// `unary_runs` against the reference offsets on every executor: a GEGLU half (rows twice
/// as long as the view's), a transpose (element loads), a narrowed 3-D view; then on the
/// CPU executor off 16 bytes and with few work-groups.
#[test]
fn unary_runs_match_reference_offsets() {
    let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![6, 40], vec![80, 1]),
        (vec![16, 8], vec![1, 16]),
        (vec![3, 5, 24], vec![160, 32, 1]),
        (vec![8], vec![3]),
    ];
    fn run<T: TestFloat, Op: UnaryOp>(exec: &Device, dims: &[usize], st: &[usize], name: &str, seed: u64) {
        let n: usize = dims.iter().product();
        let span = dims.iter().zip(st).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
        let (lo, hi) = domain(name);
        let a: Vec<T> = inputs(span, lo, hi, seed, false).into_iter().map(T::from_f64).collect();
        let v = RunView::new(dims, [st]).expect("a view unary_runs takes");
        let da = exec.upload(&a).unwrap();
        let mut dy = exec.alloc::<T>(n).unwrap();
        let [[s0, s1, s2]] = v.strides;
        ew::unary_runs::launch::<T, Op>(exec, ew::launch_config(n), &da, &mut dy, v.d1, v.d2, s0, s1, s2).unwrap();
        let want: Vec<f64> = (0..n).map(|i| reference_unary(name, a[reference_offset(i, dims, st)].to_f64())).collect();
        assert_close(&exec.download(&dy).unwrap(), &want, &format!("unary_runs {name} {dims:?} strides {st:?}"));
    }
    for exec in executors() {
        for (k, (dims, st)) in cases.iter().enumerate() {
            run::<f32, Gelu>(&exec, dims, st, "gelu", 80 + k as u64);
            run::<f16, Silu>(&exec, dims, st, "silu", 90 + k as u64);
            run::<bf16, Neg>(&exec, dims, st, "neg", 100 + k as u64);
        }
    }
    for wave in [WaveSize::W32, WaveSize::W64] {
        let exec = kernel_dsl::host::CpuExecutor::new(wave);
        for (dims, st) in &cases {
            let n: usize = dims.iter().product();
            let span = dims.iter().zip(st).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
            let a: Vec<f32> = inputs(span + 3, -5.0, 5.0, 110, false).into_iter().map(|v| v as f32).collect();
            let v = RunView::new(dims, [st]).unwrap();
            let [[s0, s1, s2]] = v.strides;
            for (shift, groups) in [(1usize, 0u32), (3, 1), (2, 2)] {
                let src = &a[shift..];
                let mut y = vec![0.0f32; n + shift];
                let out = &mut y[shift..];
                let cfg = if groups == 0 { ew::launch_config(n) } else { LaunchConfig::new(Dim3::x(groups), Dim3::x(4)) };
                ew::unary_runs::launch::<f32, Sqr>(&exec, cfg, src, out, v.d1, v.d2, s0, s1, s2).unwrap();
                for i in 0..n {
                    let x = src[reference_offset(i, dims, st)];
                    assert_eq!(out[i], x * x, "sqr {dims:?} strides {st:?} shift {shift} groups {groups} element {i}");
                }
            }
        }
    }
}

/// A view that reaches past its operand, or an innermost size that is no multiple of 8,
/// stops the launch before anything is written (the kernel's one check, not per load).
#[test]
fn binary_runs_rejects_views_past_the_operand() {
    let exec = kernel_dsl::host::CpuExecutor::new(WaveSize::W64);
    let (a, b) = (vec![1.0f32; 64], vec![2.0f32; 8]);
    let mut y = vec![0.0f32; 64];
    // rhs rows 8 apart over 8 rows: 64 elements needed, 8 given.
    let r = ew::binary_runs::launch::<f32, Add>(&exec, ew::launch_config(64), &a, &b, &mut y, 8, 8, 0, 8, 1, 0, 8, 1);
    assert!(r.is_err(), "a view past the rhs must fail");
    let r = ew::binary_runs::launch::<f32, Add>(&exec, ew::launch_config(64), &a, &b, &mut y, 16, 4, 0, 4, 1, 0, 0, 1);
    assert!(r.is_err(), "an innermost size of 4 must fail");
    assert!(y.iter().all(|v| *v == 0.0), "nothing written");
}

/// `copy_runs` moves the bits of a view exactly, for every element size: 1-byte elements
/// (element stores, never the vector path), 2- and 8-byte ones with aligned vectors, a
/// broadcast row, a strided innermost dimension; off 16 bytes on the CPU executor.
#[test]
fn copy_runs_move_every_element_size_exactly() {
    let cases: Vec<(Vec<usize>, Vec<usize>)> =
        vec![(vec![6, 40], vec![48, 1]), (vec![3, 4, 16], vec![0, 16, 1]), (vec![5, 8], vec![1, 5]), (vec![2, 2, 8], vec![40, 8, 1])];
    fn run<T: Element + kernel_dsl::host::ScalarArg + PartialEq + std::fmt::Debug>(exec: &Device, make: fn(usize) -> T) {
        for (dims, st) in [(vec![6usize, 40usize], vec![48usize, 1usize]), (vec![3, 4, 16], vec![0, 16, 1]), (vec![5, 8], vec![1, 5])] {
            let n: usize = dims.iter().product();
            let span = dims.iter().zip(&st).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
            let src: Vec<T> = (0..span).map(make).collect();
            let v = RunView::new(&dims, [&st]).unwrap();
            let [[s0, s1, s2]] = v.strides;
            let ds = exec.upload(&src).unwrap();
            let mut dy = exec.alloc::<T>(n).unwrap();
            ew::copy_runs::launch::<T>(exec, ew::launch_config(n), &ds, &mut dy, v.d1, v.d2, s0, s1, s2).unwrap();
            let got = exec.download(&dy).unwrap();
            for (i, g) in got.iter().enumerate() {
                assert_eq!(*g, src[reference_offset(i, &dims, &st)], "{dims:?} {st:?} on {}: element {i}", exec.name());
            }
        }
    }
    for exec in executors() {
        run::<u8>(&exec, |i| (i * 13 % 253) as u8);
        run::<f16>(&exec, |i| f16::from_bits((i * 29 % 0x7000) as u16));
        run::<u32>(&exec, |i| i as u32 ^ 0xdead_beef);
        run::<i64>(&exec, |i| i as i64 * -77);
    }
    for wave in [WaveSize::W32, WaveSize::W64] {
        let exec = kernel_dsl::host::CpuExecutor::new(wave);
        for (dims, st) in &cases {
            let n: usize = dims.iter().product();
            let span = dims.iter().zip(st).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
            let src: Vec<u16> = (0..span + 3).map(|i| i as u16 * 3).collect();
            let v = RunView::new(dims, [st]).unwrap();
            let [[s0, s1, s2]] = v.strides;
            for shift in [1usize, 3] {
                let mut y = vec![0u16; n + shift];
                ew::copy_runs::launch::<f16>(
                    &exec,
                    LaunchConfig::new(Dim3::x(1), Dim3::x(4)),
                    // SAFETY: u16 and f16 have one size and alignment; any bits are an f16.
                    unsafe { std::slice::from_raw_parts(src[shift..].as_ptr() as *const f16, span) },
                    unsafe { std::slice::from_raw_parts_mut(y[shift..].as_mut_ptr() as *mut f16, n) },
                    v.d1,
                    v.d2,
                    s0,
                    s1,
                    s2,
                )
                .unwrap();
                for i in 0..n {
                    assert_eq!(y[shift + i], src[shift + reference_offset(i, dims, st)], "{dims:?} {st:?} shift {shift} element {i}");
                }
            }
        }
    }
}
