//! Candle's unary ops, `elu` and `powf` for f64 tensors, computed in f64. GPUs have no
//! f64 transcendental instructions, so `exp`, `ln`, `sin`/`cos`, `tanh`, `erf` and friends
//! are evaluated here from additions, multiplications and divisions (range reduction plus
//! series), identical on every executor. Three kernels (arithmetic, exponential family,
//! trigonometric/erf); the op is a run-time code (uniform).
//!
//! Accuracy (tested against Rust's `std` f64 functions): a few ulp for `exp`, `ln`,
//! `sqrt`, `tanh`, `sigmoid`; `sin`/`cos` likewise for `|x| < 1e6` (Cody-Waite reduction
//! with a three-part pi/2; larger arguments lose accuracy progressively); `erf` within
//! 2e-15 absolute; `powf` by repeated squaring for integral `|p| <= 64`, otherwise as
//! `exp(p ln x)` (relative error about `|p ln x| * 2^-52`).
use crate::dtype::flat_global_idx;
use crate::indexing::view_offset;
use crate::random::{ln_f64, sincos_octant, sqrt_f64};
use kernel_dsl::prelude::*;

macro_rules! codes {
    ($($(#[$d:meta])* $name:ident = $v:expr;)*) => {$( $(#[$d])* pub const $name: u32 = $v; )*};
}
codes! {
    /// `-x`
    U_NEG = 0;
    /// `e^x`
    U_EXP = 1;
    /// `ln x`
    U_LOG = 2;
    /// `sqrt x`
    U_SQRT = 3;
    /// `|x|`
    U_ABS = 4;
    /// `x^2`
    U_SQR = 5;
    /// `1/x`
    U_RECIP = 6;
    /// `max(x, 0)`
    U_RELU = 7;
    /// GELU, tanh form (Candle's constants)
    U_GELU = 8;
    /// GELU, erf form
    U_GELU_ERF = 9;
    /// `x / (1 + e^-x)`
    U_SILU = 10;
    /// `tanh x`
    U_TANH = 11;
    /// `1 / (1 + e^-x)`
    U_SIGMOID = 12;
    /// `erf x`
    U_ERF = 13;
    /// `sin x`
    U_SIN = 14;
    /// `cos x`
    U_COS = 15;
    /// floor
    U_FLOOR = 16;
    /// ceil
    U_CEIL = 17;
    /// round half away from zero
    U_ROUND = 18;
    /// sign (NaN stays NaN, zero stays zero)
    U_SIGN = 19;
    /// ELU with `alpha = param`
    U_ELU = 20;
    /// `x^param`
    U_POWF = 21;
}

const LN2_HI: f64 = 6.931_471_803_691_238_164_9e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_700_0e-10;

/// `2^k` for `k` in the normal range.
#[device]
#[inline(always)]
pub fn pow2(k: i64) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `e^x`: `x = k ln 2 + r` (Cody-Waite), Taylor series of `e^r` for `|r| <= 0.35` to
/// `r^14`, then the scaling in two steps (so subnormal results are right).
#[device]
#[inline(always)]
pub fn exp_f64(x: f64) -> f64 {
    if x != x {
        return x;
    }
    if x > 709.782_712_893_384 {
        return f64::INFINITY;
    }
    if x < -745.2 {
        return 0.0;
    }
    let kf = x * core::f64::consts::LOG2_E;
    let k = if kf >= 0.0 { (kf + 0.5) as i64 } else { (kf - 0.5) as i64 };
    let r = (x - k as f64 * LN2_HI) - k as f64 * LN2_LO;
    let mut p = 1.0;
    let mut n = 14;
    while n >= 1 {
        p = 1.0 + r * p * RECIP[n];
        n -= 1;
    }
    let k1 = k / 2;
    p * pow2(k1) * pow2(k - k1)
}

/// `e^x - 1` for `|x| < 0.35` by its Taylor series (to `x^17`).
#[device]
#[inline(always)]
pub fn expm1_series(x: f64) -> f64 {
    let mut p = 1.0;
    let mut n = 17;
    while n >= 2 {
        p = 1.0 + x * p * RECIP[n];
        n -= 1;
    }
    x * p
}

/// `1/n` for `n < 20` (multiplying by these keeps divisions out of the series loops).
const RECIP: [f64; 20] = [
    0.0, 1.0, 0.5, 1.0 / 3.0, 0.25, 0.2, 1.0 / 6.0, 1.0 / 7.0, 0.125, 1.0 / 9.0, 0.1, 1.0 / 11.0, 1.0 / 12.0, 1.0 / 13.0, 1.0 / 14.0,
    1.0 / 15.0, 0.0625, 1.0 / 17.0, 1.0 / 18.0, 1.0 / 19.0,
];

/// `e^x - 1`, accurate near 0 (Taylor series for `|x| < 0.35`).
#[device]
#[inline(always)]
pub fn expm1_f64(x: f64) -> f64 {
    if x.abs() < 0.35 {
        return expm1_series(x);
    }
    exp_f64(x) - 1.0
}

/// `ln x` with the special cases: NaN/negative give NaN, 0 gives -inf, inf gives inf,
/// subnormals are scaled first.
#[device]
#[inline(always)]
pub fn log_f64(x: f64) -> f64 {
    if x != x || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x == f64::INFINITY {
        return x;
    }
    if x < f64::MIN_POSITIVE {
        return ln_f64(x * pow2(54)) - 54.0 * core::f64::consts::LN_2;
    }
    ln_f64(x)
}

/// `sqrt x` with the special cases (NaN/negative give NaN, inf stays inf; subnormals
/// scaled first).
#[device]
#[inline(always)]
pub fn sqrt_full(x: f64) -> f64 {
    if x != x || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x == f64::INFINITY {
        return x;
    }
    if x < f64::MIN_POSITIVE {
        return sqrt_f64(x * pow2(108)) * pow2(-54);
    }
    sqrt_f64(x)
}

// pi/2 in three parts of 33 bits (fdlibm's split), for Cody-Waite reduction.
const PIO2_1: f64 = 1.570_796_326_734_125_614_17;
const PIO2_2: f64 = 6.077_100_506_303_965_976_60e-11;
const PIO2_3: f64 = 2.022_266_248_711_166_455_80e-21;
const PIO2_3T: f64 = 8.478_427_660_368_899_569_97e-32;

/// `(sin x, cos x)`: `x = k pi/2 + r`, `|r| <= pi/4`, series on `|r|`, quadrant signs.
#[device]
#[inline(always)]
pub fn sincos_f64(x: f64) -> (f64, f64) {
    if x != x || x.abs() == f64::INFINITY {
        return (f64::NAN, f64::NAN);
    }
    let kf = x * core::f64::consts::FRAC_2_PI;
    let k = if kf >= 0.0 { (kf + 0.5) as i64 } else { (kf - 0.5) as i64 };
    let kd = k as f64;
    let r = ((x - kd * PIO2_1) - kd * PIO2_2) - kd * PIO2_3 - kd * PIO2_3T;
    let (s, c) = sincos_octant(r.abs());
    let s = if r < 0.0 { -s } else { s };
    match k & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// `tanh x`.
#[device]
#[inline(always)]
pub fn tanh_f64(x: f64) -> f64 {
    let a = x.abs();
    if a != a {
        return x;
    }
    let t = if a > 22.0 {
        1.0
    } else if a < 0.35 {
        let e = expm1_f64(2.0 * a);
        e / (e + 2.0)
    } else {
        1.0 - 2.0 / (exp_f64(2.0 * a) + 1.0)
    };
    if x < 0.0 { -t } else { t }
}

/// `erf x`: Taylor series for `|x| < 2.5`; otherwise `1 - erfc`, with `erfc` from its
/// continued fraction (Laplace), evaluated backwards over 120 terms.
#[device]
#[inline(always)]
pub fn erf_f64(x: f64) -> f64 {
    let a = x.abs();
    if a != a {
        return x;
    }
    let r = if a < 2.5 {
        // 2/sqrt(pi) * sum_n (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = a * a;
        let (mut term, mut sum) = (a, a);
        let mut n = 1;
        while n < 60 {
            term = -term * x2 / n as f64;
            sum += term / (2 * n + 1) as f64;
            n += 1;
        }
        sum * core::f64::consts::FRAC_2_SQRT_PI
    } else if a > 6.0 {
        1.0
    } else {
        // erfc(a) = e^(-a^2) / sqrt(pi) * 1 / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...))))
        let mut t = a;
        let mut n = 120;
        while n >= 1 {
            t = a + (n as f64 * 0.5) / t;
            n -= 1;
        }
        1.0 - exp_f64(-a * a) * (0.5 * core::f64::consts::FRAC_2_SQRT_PI) / t
    };
    if x < 0.0 { -r } else { r }
}

/// Round toward zero (`|x| < 2^52`; larger values are integers already).
#[device]
#[inline(always)]
pub fn trunc_f64(x: f64) -> f64 {
    if !(x.abs() < 4_503_599_627_370_496.0) {
        return x;
    }
    let t = (x as i64) as f64;
    // Keep the sign of zero (-0.3 truncates to -0.0).
    f64::from_bits(t.to_bits() | (x.to_bits() & (1 << 63)))
}

/// `x^p` when it needs no logarithm: `p = 0`, `x = 1`, NaN, zero or infinite `x`, and
/// small integral `p` (repeated squaring); `None` otherwise.
#[device]
#[inline(always)]
pub fn powf_special(x: f64, p: f64) -> Option<f64> {
    if p == 0.0 || x == 1.0 {
        return Some(1.0);
    }
    if x != x || p != p {
        return Some(f64::NAN);
    }
    let odd = trunc_f64(p) == p && trunc_f64(p * 0.5) * 2.0 != p;
    if x == 0.0 || x.abs() == f64::INFINITY {
        let big = (x != 0.0) == (p > 0.0);
        let r = if big { f64::INFINITY } else { 0.0 };
        return Some(if x.is_sign_negative() && odd { -r } else { r });
    }
    if trunc_f64(p) == p && p.abs() <= 64.0 {
        let (mut base, mut e, mut r) = (x, p.abs() as u32, 1.0);
        while e > 0 {
            if e & 1 == 1 {
                r *= base;
            }
            base *= base;
            e >>= 1;
        }
        return Some(if p < 0.0 { 1.0 / r } else { r });
    }
    None
}

/// `x^p` with C `pow`'s sign rules for integral `p`.
#[device]
#[inline(always)]
pub fn powf_f64(x: f64, p: f64) -> f64 {
    if let Some(r) = powf_special(x, p) {
        return r;
    }
    let r = exp_f64(p * log_f64(x.abs()));
    if x < 0.0 {
        if trunc_f64(p) != p {
            return f64::NAN;
        }
        if trunc_f64(p * 0.5) * 2.0 != p {
            return -r;
        }
    }
    r
}

/// Candle's GELU constant `sqrt(2/pi)`.
const SQRT_TWO_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// The op `op` (codes `U_*`) on `x`, with `param` for ELU and powf.
#[device]
#[inline(always)]
pub fn apply_f64(x: f64, op: u32, param: f64) -> f64 {
    match family(op) {
        0 => apply_basic(x, op),
        1 => apply_exp(x, op, param),
        _ => apply_trig(x, op),
    }
}

/// Which kernel serves `op`: 0 arithmetic and rounding, 1 the exponential family, 2
/// trigonometric and erf (one kernel per family keeps each within the register budget).
#[device]
#[inline(always)]
pub fn family(op: u32) -> u32 {
    match op {
        U_NEG | U_ABS | U_SQR | U_RECIP | U_RELU | U_FLOOR | U_CEIL | U_ROUND | U_SIGN | U_SQRT => 0,
        U_SIN | U_COS | U_ERF | U_GELU_ERF => 2,
        _ => 1,
    }
}

/// Arithmetic and rounding ops.
#[device]
#[inline(always)]
pub fn apply_basic(x: f64, op: u32) -> f64 {
    match op {
        U_NEG => -x,
        U_SQRT => sqrt_full(x),
        U_ABS => x.abs(),
        U_SQR => x * x,
        U_RECIP => 1.0 / x,
        U_RELU => if x < 0.0 { 0.0 } else { x },
        U_FLOOR => {
            let t = trunc_f64(x);
            if t > x { t - 1.0 } else { t }
        }
        U_CEIL => {
            let t = trunc_f64(x);
            if t < x { t + 1.0 } else { t }
        }
        U_ROUND => {
            let t = trunc_f64(x);
            let d = x - t;
            if d >= 0.5 { t + 1.0 } else if d <= -0.5 { t - 1.0 } else { t }
        }
        _ => if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x },
    }
}

/// The exponential family, written so that one `exp`, one `expm1` series and one `ln`
/// serve every op (each inlined copy costs registers).
#[device]
#[inline(always)]
pub fn apply_exp(x: f64, op: u32, param: f64) -> f64 {
    if op == U_POWF {
        if let Some(r) = powf_special(x, param) {
            return r;
        }
    }
    let l = if op == U_LOG || op == U_POWF { log_f64(if op == U_POWF { x.abs() } else { x }) } else { 0.0 };
    if op == U_LOG {
        return l;
    }
    // tanh's argument (GELU: Candle's tanh form).
    let z = if op == U_GELU { SQRT_TWO_OVER_PI * x * (1.0 + 0.044715 * x * x) } else { x };
    let za = z.abs();
    let arg = match op {
        U_EXP | U_ELU => x,
        U_SILU | U_SIGMOID => -x,
        U_TANH | U_GELU => 2.0 * za,
        _ => param * l,
    };
    // expm1 by its series near 0 (tanh of small arguments, ELU), e^arg otherwise.
    let series = match op {
        U_TANH | U_GELU => za < 0.35,
        U_ELU => x.abs() < 0.35,
        _ => false,
    };
    let e = if series { expm1_series(arg) } else if (op == U_TANH || op == U_GELU) && za > 22.0 { 0.0 } else { exp_f64(arg) };
    match op {
        U_EXP => e,
        U_SILU => x / (1.0 + e),
        U_SIGMOID => 1.0 / (1.0 + e),
        U_ELU => {
            if x >= 0.0 {
                x
            } else {
                param * if series { e } else { e - 1.0 }
            }
        }
        U_TANH | U_GELU => {
            let t = if za != za {
                za
            } else if za > 22.0 {
                1.0
            } else if series {
                e / (e + 2.0)
            } else {
                1.0 - 2.0 / (e + 1.0)
            };
            let t = if z < 0.0 { -t } else { t };
            if op == U_TANH { t } else { 0.5 * x * (1.0 + t) }
        }
        _ => {
            // powf: the sign for negative bases (integral exponents were handled exactly).
            if x < 0.0 {
                if trunc_f64(param) != param {
                    f64::NAN
                } else if trunc_f64(param * 0.5) * 2.0 != param {
                    -e
                } else {
                    e
                }
            } else {
                e
            }
        }
    }
}

/// Trigonometric ops and erf.
#[device]
#[inline(always)]
pub fn apply_trig(x: f64, op: u32) -> f64 {
    match op {
        U_SIN => sincos_f64(x).0,
        U_COS => sincos_f64(x).1,
        U_ERF => erf_f64(x),
        _ => 0.5 * x * (1.0 + erf_f64(x * core::f64::consts::FRAC_1_SQRT_2)),
    }
}

/// `out[i] = op(input[layout(i)])` for the arithmetic and rounding ops.
#[amdgpu_kernel]
pub fn unary_f64_basic(input: &[f64], layout: &[usize], out: &mut [f64], op: u32) {
    // One element per work-item, no loop: a grid-stride loop would let the compiler hoist
    // every series constant into scalar registers for the whole loop.
    let i = flat_global_idx();
    if i < out.len() {
        out[i] = apply_basic(input[view_offset(i, layout)], op);
    }
}

/// `out[i] = op(input[layout(i)], param)` for the exponential family.
#[amdgpu_kernel]
pub fn unary_f64_exp(input: &[f64], layout: &[usize], out: &mut [f64], op: u32, param: f64) {
    // One element per work-item, no loop: a grid-stride loop would let the compiler hoist
    // every series constant into scalar registers for the whole loop.
    let i = flat_global_idx();
    if i < out.len() {
        out[i] = apply_exp(input[view_offset(i, layout)], op, param);
    }
}

/// `out[i] = op(input[layout(i)])` for sin, cos, erf and GELU-erf.
#[amdgpu_kernel]
pub fn unary_f64_trig(input: &[f64], layout: &[usize], out: &mut [f64], op: u32) {
    // One element per work-item, no loop: a grid-stride loop would let the compiler hoist
    // every series constant into scalar registers for the whole loop.
    let i = flat_global_idx();
    if i < out.len() {
        out[i] = apply_trig(input[view_offset(i, layout)], op);
    }
}

/// Checked launch.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::{LayoutArg, Strided};
    use crate::dtype::host::{arg_len, grid_2d, invalid};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchError};

    /// `out[i] = op(input[i], param)` over `out.len()` elements (`op` one of the `U_*`
    /// codes; `param` is ELU's alpha or powf's exponent, ignored otherwise); `input`
    /// contiguous of that length or read through `view`.
    pub fn unary_f64(
        dev: &Device,
        op: u32,
        param: f64,
        input: &(impl KernelArgSlice<f64> + ?Sized),
        view: Strided<'_>,
        out: &mut (impl KernelArgSliceMut<f64> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "unary_f64";
        if op > super::U_POWF {
            return Err(invalid(K, format!("unknown op code {op}")));
        }
        let n = arg_len(out);
        let l = LayoutArg::new(dev, K, "input", view, n, arg_len(input))?;
        if n == 0 {
            return Ok(());
        }
        match super::family(op) {
            0 => super::unary_f64_basic::launch(dev, grid_2d(n), input, &l.arg(), out, op),
            1 => super::unary_f64_exp::launch(dev, grid_2d(n), input, &l.arg(), out, op, param),
            _ => super::unary_f64_trig::launch(dev, grid_2d(n), input, &l.arg(), out, op),
        }
    }
}
