//! The dtype-generic kernels (casts between all ten Candle dtypes, fill, strided copy,
//! comparisons, integer and f64 binary ops, affine) against references written here from
//! Candle 0.11.1's CPU rules: Rust `as`, the `half` crate and the `float8` crate (the one
//! Candle uses for f8e4m3), on the CPU executor with waves of 32 and 64 and on any GPU this
//! build can open. Results are compared bit for bit (any NaN matches any NaN).
use float8::F8E4M3 as RefF8;
use half::{bf16, f16};
use kernels::arith::ops::{self as arith, BinaryOp};
use kernels::cmp::ops::{cmp, CmpOp};
use kernels::convert::ops as conv;
use kernels::dtype::host::{DType, F8E4M3};
use kernels::runtime::Device;
use kernel_dsl::host::LaunchError;
use std::fmt::Debug;

mod common;
use common::executors;

/// A host value of one of the ten dtypes.
#[derive(Clone, Copy, Debug)]
enum H {
    U8(u8),
    U32(u32),
    I16(i16),
    I32(i32),
    I64(i64),
    Bf16(bf16),
    F16(f16),
    F32(f32),
    F64(f64),
    F8(RefF8),
}

impl H {
    /// Integer value, for integer dtypes.
    fn int(self) -> Option<i128> {
        Some(match self {
            H::U8(v) => v as i128,
            H::U32(v) => v as i128,
            H::I16(v) => v as i128,
            H::I32(v) => v as i128,
            H::I64(v) => v as i128,
            _ => return None,
        })
    }
    /// Float value as Candle reads it for float-to-int casts (`to_f32()` for the small
    /// floats; f32/f64 as they are, exactly representable in f64).
    fn float(self) -> Option<f64> {
        Some(match self {
            H::Bf16(v) => v.to_f32() as f64,
            H::F16(v) => v.to_f32() as f64,
            H::F32(v) => v as f64,
            H::F64(v) => v,
            H::F8(v) => v.to_f32() as f64,
            _ => return None,
        })
    }
    /// `v as f32` for integers, `to_f32()` for small floats, `as f32` for f64.
    fn as_f32(self) -> f32 {
        match self {
            H::U8(v) => v as f32,
            H::U32(v) => v as f32,
            H::I16(v) => v as f32,
            H::I32(v) => v as f32,
            H::I64(v) => v as f32,
            H::Bf16(v) => v.to_f32(),
            H::F16(v) => v.to_f32(),
            H::F32(v) => v,
            H::F64(v) => v as f32,
            H::F8(v) => v.to_f32(),
        }
    }
    fn as_f64(self) -> f64 {
        match self {
            H::U8(v) => v as f64,
            H::U32(v) => v as f64,
            H::I16(v) => v as f64,
            H::I32(v) => v as f64,
            H::I64(v) => v as f64,
            H::Bf16(v) => v.to_f64(),
            H::F16(v) => v.to_f64(),
            H::F32(v) => v as f64,
            H::F64(v) => v,
            H::F8(v) => v.to_f64(),
        }
    }
}

/// A dtype in the tests: conversion to and from [`H`] and raw bits for comparing.
trait T: DType + Debug + PartialEq {
    fn h(self) -> H;
    fn from_h(h: H) -> Self;
    fn bits64(self) -> u64;
    fn is_nan(self) -> bool;
    /// Test inputs: specials and a spread of ordinary values.
    fn samples(n: usize, seed: u64) -> Vec<Self>;
}

fn lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s >> 11
    }
}

const FLOAT_SPECIALS: [f64; 32] = [
    // Ties in the upper 32 bits of an f64 with more bits below: half::bf16::from_f64 rounds these to even.
    1.000_390_625_000_001, 1.003_906_250_000_000_9,
    0.0, -0.0, 1.0, -1.0, 1.5, -2.5, 0.5, 255.9, 256.0, -128.9, 65504.0, 65520.0, 448.0, 464.0, 465.0, -470.0, 1e10, -1e10, 3e38, 4e38,
    f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-3, 0.0009765625, 0.00098, 1e-40, 2147483648.0, -2147483904.0, 9.3e18,
];
const INT_SPECIALS: [i64; 18] = [
    0, 1, -1, 127, 128, 255, 256, 32767, -32768, 65535, 16777217, 2147483647, -2147483648, 4294967295, i64::MAX, i64::MIN, 9007199254740993, -3,
];

fn float_samples(n: usize, seed: u64) -> Vec<f64> {
    let mut r = lcg(seed);
    (0..n)
        .map(|i| {
            if i < FLOAT_SPECIALS.len() {
                return FLOAT_SPECIALS[i];
            }
            let u = r() as f64 / (1u64 << 53) as f64;
            let e = (r() % 40) as i32 - 20;
            (u * 2.0 - 1.0) * 2f64.powi(e)
        })
        .collect()
}

fn int_samples(n: usize, seed: u64) -> Vec<i64> {
    let mut r = lcg(seed);
    (0..n)
        .map(|i| if i < INT_SPECIALS.len() { INT_SPECIALS[i] } else { (r() as i64) >> (r() % 60) })
        .collect()
}

macro_rules! int_t {
    ($($t:ty => $v:ident),*) => {$(
        impl T for $t {
            fn h(self) -> H { H::$v(self) }
            fn from_h(h: H) -> Self { match h { H::$v(v) => v, _ => panic!("{h:?}") } }
            fn bits64(self) -> u64 { self as u64 }
            fn is_nan(self) -> bool { false }
            fn samples(n: usize, seed: u64) -> Vec<Self> { int_samples(n, seed).into_iter().map(|v| v as $t).collect() }
        }
    )*};
}
int_t!(u8 => U8, u32 => U32, i16 => I16, i32 => I32, i64 => I64);

macro_rules! float_t {
    ($($t:ty => $v:ident, |$x:ident| $from:expr, |$y:ident| $bits:expr, |$z:ident| $nan:expr);* $(;)?) => {$(
        impl T for $t {
            fn h(self) -> H { H::$v(self) }
            fn from_h(h: H) -> Self { match h { H::$v(v) => v, _ => panic!("{h:?}") } }
            fn bits64(self) -> u64 { let $y = self; $bits }
            fn is_nan(self) -> bool { let $z = self; $nan }
            fn samples(n: usize, seed: u64) -> Vec<Self> { float_samples(n, seed).into_iter().map(|$x| $from).collect() }
        }
    )*};
}
float_t! {
    bf16 => Bf16, |x| bf16::from_f64(x), |v| v.to_bits() as u64, |v| v.is_nan();
    f16 => F16, |x| f16::from_f64(x), |v| v.to_bits() as u64, |v| v.is_nan();
    f32 => F32, |x| x as f32, |v| v.to_bits() as u64, |v| v.is_nan();
    f64 => F64, |x| x, |v| v.to_bits(), |v| v.is_nan();
}

impl T for F8E4M3 {
    fn h(self) -> H {
        H::F8(RefF8::from_bits(self.0))
    }
    fn from_h(h: H) -> Self {
        match h {
            H::F8(v) => F8E4M3(v.to_bits()),
            _ => panic!("{h:?}"),
        }
    }
    fn bits64(self) -> u64 {
        self.0 as u64
    }
    fn is_nan(self) -> bool {
        self.0 & 0x7f == 0x7f
    }
    fn samples(n: usize, seed: u64) -> Vec<Self> {
        if n < 256 {
            // A spread of bit patterns with a NaN, zeros and a subnormal.
            let mut v: Vec<F8E4M3> = (0..n).map(|i| F8E4M3(((i * 97 + seed as usize * 13) % 256) as u8)).collect();
            for (k, b) in [0x7fu8, 0x00, 0x80, 0x03].into_iter().enumerate().take(n) {
                v[k] = F8E4M3(b);
            }
            return v;
        }
        // Every bit pattern, then values rounded from f64.
        (0..=255u8).map(F8E4M3).chain(float_samples(n, seed).into_iter().map(|x| F8E4M3(RefF8::from_f64(x).to_bits()))).collect()
    }
}

/// Candle 0.11.1's `to_dtype` for one value (its CPU backend's table, written per target).
fn candle_cast(h: H, dst: u32) -> H {
    use kernels::dtype::*;
    let int_target = |w: i128| -> H {
        match dst {
            DT_U8 => H::U8(w as u8),
            DT_U32 => H::U32(w as u32),
            DT_I16 => H::I16(w as i16),
            DT_I32 => H::I32(w as i32),
            _ => H::I64(w as i64),
        }
    };
    match dst {
        DT_U8 | DT_U32 | DT_I16 | DT_I32 | DT_I64 => match (h.int(), h.float()) {
            (Some(i), _) => int_target(i),
            (_, Some(f)) => match dst {
                DT_U8 => H::U8(f as u8),
                DT_U32 => H::U32(f as u32),
                DT_I16 => H::I16(f as i16),
                DT_I32 => H::I32(f as i32),
                _ => H::I64(f as i64),
            },
            _ => unreachable!(),
        },
        DT_F32 => H::F32(h.as_f32()),
        DT_F64 => H::F64(h.as_f64()),
        DT_F16 => H::F16(match h {
            H::F64(v) => f16::from_f64(v),
            _ => f16::from_f32(h.as_f32()),
        }),
        DT_BF16 => H::Bf16(match h {
            H::F64(v) => bf16::from_f64(v),
            _ => bf16::from_f32(h.as_f32()),
        }),
        _ => H::F8(match h {
            H::F64(v) => RefF8::from_f64(v),
            _ => RefF8::from_f32(h.as_f32()),
        }),
    }
}

fn assert_bits<D: T>(got: &[D], want: &[D], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.bits64() == w.bits64() || (g.is_nan() && w.is_nan());
        assert!(same, "{what}: element {i}: got {g:?} ({:#x}), want {w:?} ({:#x})", g.bits64(), w.bits64());
    }
}

fn check_cast<S: T, D: T>(dev: &Device) {
    let what = format!("cast {} -> {} on {}", S::NAME, D::NAME, kernel_dsl::host::Executor::name(dev));
    if S::CODE == kernels::dtype::DT_F64 && D::CODE == kernels::dtype::DT_F16 && !std::is_x86_feature_detected!("f16c") {
        eprintln!("SKIPPED {what}: half's f64 -> f16 reference is the F16C path (through f32) only on x86-64 with F16C");
        return;
    }
    let xs = S::samples(301, S::CODE as u64 * 31 + D::CODE as u64);
    let want: Vec<D> = xs.iter().map(|&x| D::from_h(candle_cast(x.h(), D::CODE))).collect();
    let src = dev.upload(&xs).unwrap();
    let mut out = dev.alloc::<D>(xs.len()).unwrap();
    conv::cast::<S, D>(dev, &src, None, &mut out).unwrap();
    assert_bits(&dev.download(&out).unwrap(), &want, &what);
    // Strided: every other element, backwards.
    let n = xs.len() / 2;
    let want: Vec<D> = (0..n).map(|i| D::from_h(candle_cast(xs[xs.len() - 1 - 2 * i].h(), D::CODE))).collect();
    let mut out = dev.alloc::<D>(n).unwrap();
    // A view with a negative step is expressed from the far end: use the reversed copy.
    let rev: Vec<S> = xs.iter().rev().copied().collect();
    let src = dev.upload(&rev).unwrap();
    conv::cast::<S, D>(dev, &src, Some((&[n], &[2])), &mut out).unwrap();
    assert_bits(&dev.download(&out).unwrap(), &want, &format!("{what}, strided"));
}

/// Calls `$f::<X>(args)` for each of the ten element types the copy kernels take, in one
/// order: u8, u32, i16, i32, i64, bf16, f16, f32, f64, F8E4M3.
macro_rules! every_dtype {
    ($f:ident($($arg:expr),*)) => {{
        $f::<u8>($($arg),*);
        $f::<u32>($($arg),*);
        $f::<i16>($($arg),*);
        $f::<i32>($($arg),*);
        $f::<i64>($($arg),*);
        $f::<bf16>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<f32>($($arg),*);
        $f::<f64>($($arg),*);
        $f::<F8E4M3>($($arg),*);
    }};
}

macro_rules! cast_all {
    ($dev:expr; $($s:ty),*) => {$(
        cast_all!(@one $dev; $s; u8, u32, i16, i32, i64, bf16, f16, f32, f64, F8E4M3);
    )*};
    (@one $dev:expr; $s:ty; $($d:ty),*) => {$( check_cast::<$s, $d>($dev); )*};
}

#[test]
fn cast_every_pair_matches_candle_rules() {
    for dev in executors() {
        cast_all!(&dev; u8, u32, i16, i32, i64, bf16, f16, f32, f64, F8E4M3);
    }
}

#[test]
fn f8e4m3_host_conversion_matches_float8() {
    // Every f8 bit pattern decodes as float8 does; rounding from f64 matches on ties,
    // saturation and underflow.
    for b in 0..=255u8 {
        let (a, r) = (F8E4M3(b).to_f32(), RefF8::from_bits(b).to_f32());
        assert!(a.to_bits() == r.to_bits() || (a.is_nan() && r.is_nan()), "bits {b:#x}: {a} vs {r}");
    }
    for x in float_samples(5000, 7).into_iter().chain((0..2000).map(|i| i as f64 * 0.25 - 250.0)).chain((0..600).map(|i| (i as f64 - 300.0) / 256.0 / 64.0)) {
        assert_eq!(F8E4M3::from_f64(x).0, RefF8::from_f64(x).to_bits(), "{x}");
    }
}

#[test]
fn fill_and_copy_every_dtype() {
    fn one<X: T>(dev: &Device) {
        let xs = X::samples(77, 3);
        for n in [0usize, 1, 33, 77] {
            let mut out = dev.alloc::<X>(n).unwrap();
            conv::fill::<X>(dev, &mut out, xs[2]).unwrap();
            assert_bits(&dev.download(&out).unwrap(), &vec![xs[2]; n], &format!("fill {} n={n}", X::NAME));
        }
        // A (7, 11) buffer read transposed: (11, 7) with strides (1, 11).
        let src = dev.upload(&xs).unwrap();
        let mut out = dev.alloc::<X>(77).unwrap();
        conv::copy_strided::<X>(dev, &src, Some((&[11, 7], &[1, 11])), &mut out).unwrap();
        let want: Vec<X> = (0..77).map(|i| xs[(i % 7) * 11 + i / 7]).collect();
        assert_bits(&dev.download(&out).unwrap(), &want, &format!("copy_strided {}", X::NAME));
        // Broadcast a row of 7 to (5, 7).
        let mut out = dev.alloc::<X>(35).unwrap();
        conv::copy_strided::<X>(dev, &src, Some((&[5, 7], &[0, 1])), &mut out).unwrap();
        let want: Vec<X> = (0..35).map(|i| xs[i % 7]).collect();
        assert_bits(&dev.download(&out).unwrap(), &want, &format!("copy_strided broadcast {}", X::NAME));
    }
    for dev in executors() {
        every_dtype!(one(&dev));
    }
}

/// Candle's comparison of two values of one dtype (floats by IEEE rules).
fn ref_cmp(a: H, b: H, op: CmpOp) -> bool {
    fn go<V: PartialOrd>(a: V, b: V, op: CmpOp) -> bool {
        match op {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
    match (a, b) {
        (H::U8(x), H::U8(y)) => go(x, y, op),
        (H::U32(x), H::U32(y)) => go(x, y, op),
        (H::I16(x), H::I16(y)) => go(x, y, op),
        (H::I32(x), H::I32(y)) => go(x, y, op),
        (H::I64(x), H::I64(y)) => go(x, y, op),
        (H::Bf16(x), H::Bf16(y)) => go(x, y, op),
        (H::F16(x), H::F16(y)) => go(x, y, op),
        (H::F32(x), H::F32(y)) => go(x, y, op),
        (H::F64(x), H::F64(y)) => go(x, y, op),
        (H::F8(x), H::F8(y)) => go(x.to_f32(), y.to_f32(), op),
        _ => unreachable!(),
    }
}

const OPS: [CmpOp; 6] = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge];

#[test]
fn cmp_every_dtype_with_broadcast() {
    fn one<X: T>(dev: &Device) {
        // lhs (6, 9) contiguous; rhs a row of 9 broadcast over the 6 rows; a second pass
        // with rhs a column of 6 broadcast over 9 columns. Samples repeat so that equal
        // pairs occur.
        let mut a = X::samples(54, 11);
        let b = X::samples(9, 11);
        for k in 0..6 {
            a[k * 9 + k] = b[k];
        }
        let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        for op in OPS {
            let mut out = dev.alloc::<u8>(54).unwrap();
            cmp::<X>(dev, op, (&da, None), (&db, Some((&[6, 9], &[0, 1]))), &mut out).unwrap();
            let want: Vec<u8> = (0..54).map(|i| ref_cmp(a[i].h(), b[i % 9].h(), op) as u8).collect();
            assert_eq!(dev.download(&out).unwrap(), want, "cmp {op:?} {} row broadcast", X::NAME);
            let mut out = dev.alloc::<u8>(54).unwrap();
            cmp::<X>(dev, op, (&db, Some((&[6, 9], &[1, 0]))), (&da, None), &mut out).unwrap();
            let want: Vec<u8> = (0..54).map(|i| ref_cmp(b[i / 9].h(), a[i].h(), op) as u8).collect();
            assert_eq!(dev.download(&out).unwrap(), want, "cmp {op:?} {} column broadcast", X::NAME);
        }
        let mut empty = dev.alloc::<u8>(0).unwrap();
        cmp::<X>(dev, CmpOp::Eq, (&da, Some((&[0, 9], &[9, 1]))), (&db, Some((&[0, 9], &[0, 1]))), &mut empty).unwrap();
    }
    for dev in executors() {
        every_dtype!(one(&dev));
    }
}

/// Integers: the op in the narrow type with wrapping; x / 0 = 0 (documented choice).
macro_rules! int_ref {
    ($($t:ty),*) => {$(
        impl IntRef for $t {
            fn op(a: Self, b: Self, op: BinaryOp) -> Self {
                match op {
                    BinaryOp::Add => a.wrapping_add(b),
                    BinaryOp::Sub => a.wrapping_sub(b),
                    BinaryOp::Mul => a.wrapping_mul(b),
                    BinaryOp::Div => if b == 0 { 0 } else { a.wrapping_div(b) },
                    BinaryOp::Maximum => a.max(b),
                    BinaryOp::Minimum => a.min(b),
                }
            }
            fn affine(v: Self, mul: f64, add: f64) -> Self {
                v.wrapping_mul(mul as $t).wrapping_add(add as $t)
            }
        }
    )*};
}
trait IntRef: T {
    fn op(a: Self, b: Self, op: BinaryOp) -> Self;
    fn affine(v: Self, mul: f64, add: f64) -> Self;
    fn from_f64(v: f64) -> Self {
        let _ = v;
        unimplemented!()
    }
}
int_ref!(u8, u32, i16, i32, i64);
impl IntRef for f64 {
    fn op(a: f64, b: f64, op: BinaryOp) -> f64 {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Maximum => if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) },
            BinaryOp::Minimum => if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) },
        }
    }
    fn affine(v: f64, mul: f64, add: f64) -> f64 {
        v * mul + add
    }
}

macro_rules! float_ref {
    ($($t:ty => |$x:ident| $to:expr, |$y:ident| $from:expr);*) => {$(
        impl IntRef for $t {
            fn op(a: Self, b: Self, op: BinaryOp) -> Self {
                let (x, y) = ({ let $x = a; $to }, { let $x = b; $to });
                let r: f32 = match op {
                    BinaryOp::Add => x + y,
                    BinaryOp::Sub => x - y,
                    BinaryOp::Mul => x * y,
                    BinaryOp::Div => x / y,
                    BinaryOp::Maximum => if x.is_nan() || y.is_nan() { f32::NAN } else { x.max(y) },
                    BinaryOp::Minimum => if x.is_nan() || y.is_nan() { f32::NAN } else { x.min(y) },
                };
                let $y = r;
                $from
            }
            fn affine(v: Self, mul: f64, add: f64) -> Self {
                // Candle: T::from_f64(mul), T::from_f64(add), then v * mul + add in T.
                let m = { let $x = <$t as IntRef>::from_f64(mul); $to };
                let a = { let $x = <$t as IntRef>::from_f64(add); $to };
                let p = { let $y = { let $x = v; $to } * m; $from };
                let $y = { let $x = p; $to } + a;
                $from
            }
            fn from_f64(v: f64) -> Self {
                let $y = v as f32;
                let _ = $y;
                <$t as T>::from_h(candle_cast(H::F64(v), <$t as DType>::CODE))
            }
        }
    )*};
}
float_ref! {
    f32 => |x| x, |y| y;
    f16 => |x| x.to_f32(), |y| f16::from_f32(y);
    bf16 => |x| x.to_f32(), |y| bf16::from_f32(y)
}

const BOPS: [BinaryOp; 6] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum];

#[test]
fn binary_and_affine_integers_and_f64() {
    fn one<X: IntRef>(dev: &Device) {
        // lhs (5, 13) read transposed from a (13, 5) buffer; rhs a row of 13 broadcast; zeros
        // and MIN / -1 included through the samples.
        let a = X::samples(65, 5);
        let mut b = X::samples(13, 6);
        b[4] = X::from_h(candle_cast(H::I64(0), X::CODE));
        b[5] = X::from_h(candle_cast(H::I64(-1), X::CODE));
        let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        for op in BOPS {
            let mut out = dev.alloc::<X>(65).unwrap();
            arith::binary::<X>(dev, op, (&da, Some((&[5, 13], &[1, 5]))), (&db, Some((&[5, 13], &[0, 1]))), &mut out).unwrap();
            let want: Vec<X> = (0..65).map(|i| X::op(a[(i % 13) * 5 + i / 13], b[i % 13], op)).collect();
            assert_bits(&dev.download(&out).unwrap(), &want, &format!("binary {op:?} {}", X::NAME));
            // Contiguous both sides, odd length.
            let mut out = dev.alloc::<X>(13).unwrap();
            arith::binary::<X>(dev, op, (&dev.upload(&a[..13]).unwrap(), None), (&db, None), &mut out).unwrap();
            let want: Vec<X> = (0..13).map(|i| X::op(a[i], b[i], op)).collect();
            assert_bits(&dev.download(&out).unwrap(), &want, &format!("binary {op:?} {} contiguous", X::NAME));
        }
        for (mul, add) in [(3.0, -7.0), (-1.5, 0.25), (1e20, 2.0)] {
            let mut out = dev.alloc::<X>(65).unwrap();
            arith::affine::<X>(dev, &da, None, &mut out, mul, add).unwrap();
            let want: Vec<X> = a.iter().map(|&v| X::affine(v, mul, add)).collect();
            assert_bits(&dev.download(&out).unwrap(), &want, &format!("affine {mul} {add} {}", X::NAME));
        }
    }
    for dev in executors() {
        one::<u8>(&dev);
        one::<u32>(&dev);
        one::<i16>(&dev);
        one::<i32>(&dev);
        one::<i64>(&dev);
        one::<f64>(&dev);
        one::<f32>(&dev);
        one::<f16>(&dev);
        one::<bf16>(&dev);
    }
}

#[test]
fn bad_shapes_are_rejected_and_write_nothing() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W32);
    let a = dev.upload(&[1i32, 2, 3, 4, 5, 6]).unwrap();
    let mut out = dev.upload(&[9i32; 6]).unwrap();
    let is_invalid = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    // Wrong length, a view outside its buffer, rank mismatch.
    assert!(is_invalid(arith::binary::<i32>(&dev, BinaryOp::Add, (&a, None), (&dev.upload(&[1i32; 5]).unwrap(), None), &mut out)));
    assert!(is_invalid(arith::binary::<i32>(&dev, BinaryOp::Add, (&a, Some((&[2, 3], &[3, 2]))), (&a, None), &mut out)));
    assert!(is_invalid(conv::copy_strided::<i32>(&dev, &a, Some((&[6], &[1, 1])), &mut out)));
    let mut out8 = dev.upload(&[9u8; 6]).unwrap();
    assert!(is_invalid(cmp::<i32>(&dev, CmpOp::Lt, (&a, None), (&a, Some((&[6], &[2]))), &mut out8)));
    let mut f = dev.upload(&[9.0f32; 5]).unwrap();
    assert!(is_invalid(conv::cast::<i32, f32>(&dev, &a, None, &mut f)));
    assert!(is_invalid(arith::affine::<i32>(&dev, &a, Some((&[3], &[3])), &mut out, 1.0, 0.0)));
    assert_eq!(dev.download(&out).unwrap(), [9; 6]);
    assert_eq!(dev.download(&out8).unwrap(), [9; 6]);
    assert_eq!(dev.download(&f).unwrap(), [9.0; 5]);
}

#[test]
fn copy2d_every_dtype() {
    fn one<X: T>(dev: &Device) {
        // 5 rows of 3 from a (5, 7) source at column 2 into a (5, 4) destination at column 1.
        let src = X::samples(35, 8);
        let dst0 = X::samples(20, 9);
        let mut want = dst0.clone();
        for i in 0..5 {
            for j in 0..3 {
                want[1 + i * 4 + j] = src[2 + i * 7 + j];
            }
        }
        let mut dst = dev.upload(&dst0).unwrap();
        conv::copy2d::<X>(dev, &dev.upload(&src).unwrap(), &mut dst, 5, 3, 7, 4, 2, 1).unwrap();
        assert_bits(&dev.download(&dst).unwrap(), &want, &format!("copy2d {}", X::NAME));
        // Out of bounds: rejected, nothing written.
        let r = conv::copy2d::<X>(dev, &dev.upload(&src).unwrap(), &mut dst, 5, 3, 7, 4, 2, 2);
        assert!(matches!(r, Err(LaunchError::InvalidArgument { .. })));
        assert_bits(&dev.download(&dst).unwrap(), &want, &format!("copy2d {} after a rejected call", X::NAME));
    }
    for dev in executors() {
        every_dtype!(one(&dev));
    }
}
