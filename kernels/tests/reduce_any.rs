//! Reductions for the integer dtypes, f64 and f8e4m3 against host loops over the same
//! strided views: integer sums wrap in the element type and max/min/argmax/argmin are
//! exact, so those compare exactly; f64 sums are compared within the error of a k-term
//! f64 sum in any order, `k * 2^-53 * sum |x|`. NaN propagates (argmax/argmin: first NaN).
//! CPU executor with waves of 32 and 64; rows shorter and longer than the 256-work-item
//! group; transposed and broadcast views.
use kernel_dsl::host::LaunchError;
use kernels::dtype::host::DType;
use kernels::reduce_any::ops::{arg_reduce, reduce, ReduceOp};
use kernels::runtime::Device;

mod common;
use common::executors;

trait N: DType + Copy + PartialEq + std::fmt::Debug {
    fn make(i: usize) -> Self;
    fn zero() -> Self;
    fn sum(a: Self, b: Self) -> Self;
    /// Ordering with NaN as greater than everything (for the reference's first-NaN rule).
    fn key(self) -> f64;
    fn is_nan(self) -> bool { false }
}
macro_rules! ints {
    ($($t:ty),*) => {$(
        impl N for $t {
            fn make(i: usize) -> Self { ((i as i64 * 2654435761) % 1000 - 300) as $t }
            fn zero() -> Self { 0 }
            fn sum(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            fn key(self) -> f64 { self as f64 }
        }
    )*};
}
ints!(u8, u32, i16, i32, i64);
impl N for f64 {
    fn zero() -> Self { 0.0 }
    fn make(i: usize) -> Self { if i % 53 == 17 { f64::NAN } else { ((i as f64) * 0.618).sin() * 100.0 } }
    fn sum(a: Self, b: Self) -> Self { a + b }
    fn key(self) -> f64 { self }
    fn is_nan(self) -> bool { f64::is_nan(self) }
}

/// Row-major positions of the reduction: for each output (kept dims in order) the list of
/// buffer offsets in reduced-dims row-major order.
fn rows(dims: &[usize], strides: &[usize], red: &[usize]) -> Vec<Vec<usize>> {
    let kept: Vec<usize> = (0..dims.len()).filter(|d| !red.contains(d)).collect();
    let count = |ds: &[usize]| ds.iter().map(|&d| dims[d]).product::<usize>();
    let offs = |ds: &[usize], mut i: usize| {
        let mut o = 0;
        for &d in ds.iter().rev() {
            o += (i % dims[d]) * strides[d];
            i /= dims[d];
        }
        o
    };
    (0..count(&kept)).map(|k| (0..count(red)).map(|j| offs(&kept, k) + offs(red, j)).collect()).collect()
}

fn case<T: N>(dev: &Device, dims: &[usize], strides: &[usize], red: &[usize], len: usize) {
    let buf: Vec<T> = (0..len).map(T::make).collect();
    let what = format!("{} dims {dims:?} strides {strides:?} reduce {red:?}", T::NAME);
    let rs = rows(dims, strides, red);
    let src = dev.upload(&buf).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        let mut out = dev.alloc::<T>(rs.len()).unwrap();
        reduce::<T>(dev, &src, dims, strides, red, op, &mut out).unwrap();
        let got = dev.download(&out).unwrap();
        for (k, row) in rs.iter().enumerate() {
            let vals: Vec<T> = row.iter().map(|&o| buf[o]).collect();
            match op {
                ReduceOp::Sum if T::NAME == "f64" => {
                    let want: f64 = vals.iter().map(|v| v.key()).sum();
                    let mag: f64 = vals.iter().map(|v| v.key().abs()).sum();
                    let g = got[k].key();
                    assert!((g.is_nan() && want.is_nan()) || (g - want).abs() <= vals.len() as f64 * f64::EPSILON * mag, "{what} sum {k}: {g} vs {want}");
                }
                ReduceOp::Sum => assert_eq!(got[k], vals.iter().copied().fold(T::zero(), T::sum), "{what} sum {k}"),
                _ => {
                    let want = if vals.iter().any(|v| v.is_nan()) {
                        f64::NAN
                    } else if op == ReduceOp::Max {
                        vals.iter().map(|v| v.key()).fold(f64::NEG_INFINITY, f64::max)
                    } else {
                        vals.iter().map(|v| v.key()).fold(f64::INFINITY, f64::min)
                    };
                    let g = got[k].key();
                    assert!(g == want || (g.is_nan() && want.is_nan()), "{what} {op:?} {k}: {g} vs {want}");
                }
            }
        }
    }
    for max in [true, false] {
        let mut out = dev.alloc::<u32>(rs.len()).unwrap();
        arg_reduce::<T>(dev, &src, dims, strides, red, max, &mut out).unwrap();
        let got = dev.download(&out).unwrap();
        for (k, row) in rs.iter().enumerate() {
            let vals: Vec<f64> = row.iter().map(|&o| buf[o].key()).collect();
            let want = match vals.iter().position(|v| v.is_nan()) {
                Some(p) => p,
                None => {
                    let best = if max { vals.iter().copied().fold(f64::NEG_INFINITY, f64::max) } else { vals.iter().copied().fold(f64::INFINITY, f64::min) };
                    vals.iter().position(|&v| v == best).unwrap()
                }
            };
            assert_eq!(got[k] as usize, want, "{what} arg{} {k}", if max { "max" } else { "min" });
        }
    }
}

#[test]
fn reductions_match_host_loops() {
    for dev in executors() {
        for_all(&dev);
    }
}

fn for_all(dev: &Device) {
    macro_rules! each {
        ($($t:ty),*) => {$(
            case::<$t>(dev, &[3, 5, 7], &[35, 7, 1], &[2], 105);
            case::<$t>(dev, &[3, 5, 7], &[35, 7, 1], &[0], 105);
            case::<$t>(dev, &[3, 5, 7], &[35, 7, 1], &[0, 2], 105);
            case::<$t>(dev, &[2, 300], &[1, 2], &[1], 600);
            case::<$t>(dev, &[4, 3, 2], &[0, 1, 3], &[0, 1, 2], 6);
            case::<$t>(dev, &[5, 1000], &[1000, 1], &[1], 5000);
            case::<$t>(dev, &[3, 4], &[4, 1], &[], 12);
        )*};
    }
    each!(u8, u32, i16, i32, i64, f64);
}

#[test]
fn bad_reductions_are_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let x = dev.upload(&[1i64; 6]).unwrap();
    let mut out = dev.upload(&[9i64; 3]).unwrap();
    let mut idx = dev.upload(&[9u32; 3]).unwrap();
    let bad = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(bad(reduce::<i64>(&dev, &x, &[3, 2], &[2, 1], &[2], ReduceOp::Sum, &mut out)));
    assert!(bad(reduce::<i64>(&dev, &x, &[3, 2], &[2, 1], &[1, 1], ReduceOp::Sum, &mut out)));
    assert!(bad(reduce::<i64>(&dev, &x, &[3, 2], &[3, 1], &[1], ReduceOp::Sum, &mut out)));
    assert!(bad(reduce::<i64>(&dev, &x, &[3, 0], &[2, 1], &[1], ReduceOp::Max, &mut out)));
    assert!(bad(arg_reduce::<i64>(&dev, &x, &[3, 0], &[2, 1], &[1], true, &mut idx)));
    assert_eq!(dev.download(&out).unwrap(), [9; 3]);
    assert_eq!(dev.download(&idx).unwrap(), [9; 3]);
    // A sum over nothing is zero.
    reduce::<i64>(&dev, &x, &[3, 0], &[2, 1], &[1], ReduceOp::Sum, &mut out).unwrap();
    assert_eq!(dev.download(&out).unwrap(), [0; 3]);
}
