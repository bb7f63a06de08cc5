//! Fast math for kernels: `use kernel_dsl::prelude::*` and write `x.exp()`, `x.rsqrt()`.
//!
//! On the host, methods that `std` already has (`exp`, `ln`, `sqrt` ...) resolve to `std`'s
//! inherent methods; on GPUs they lower to the hardware instructions (AMDGPU `v_exp_f32`,
//! `v_sqrt_f32` ...; NVPTX `ex2.approx` with an error correction). Methods `std` lacks (`rsqrt`,
//! `erf`, `sigmoid`) share one portable implementation everywhere.

/// Math methods on `f32` available in kernels on every target.
pub trait FloatMath: Sized {
    /// `e^self`.
    fn exp(self) -> Self;
    /// `2^self`.
    fn exp2(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Base-2 logarithm.
    fn log2(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// `1 / sqrt(self)`.
    fn rsqrt(self) -> Self;
    /// `1 / self`.
    fn recip(self) -> Self;
    /// Sine (radians).
    fn sin(self) -> Self;
    /// Cosine (radians).
    fn cos(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Error function.
    fn erf(self) -> Self;
    /// Logistic sigmoid `1 / (1 + e^-self)`.
    fn sigmoid(self) -> Self;
    /// `self^y` (real power; negative bases only for integral `y`).
    fn powf(self, y: Self) -> Self;
    /// Round toward negative infinity.
    fn floor(self) -> Self;
    /// Round toward positive infinity.
    fn ceil(self) -> Self;
    /// Round toward zero.
    fn trunc(self) -> Self;
    /// Round half away from zero.
    fn round(self) -> Self;
    /// Fused `self * a + b`.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// `self / d`, allowing the hardware reciprocal approximation on GPUs (about 2 ulp;
    /// infinities and NaN as in IEEE division). Exact division on the host.
    fn fast_div(self, d: Self) -> Self;
}

#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
use crate::arch as m;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod m {
    //! Host math: `std`'s implementations.
    pub fn exp(x: f32) -> f32 { f32::exp(x) }
    pub fn exp2(x: f32) -> f32 { f32::exp2(x) }
    pub fn exp2_approx(x: f32) -> f32 { f32::exp2(x) }
    pub fn ln(x: f32) -> f32 { f32::ln(x) }
    pub fn log2(x: f32) -> f32 { f32::log2(x) }
    pub fn sqrt(x: f32) -> f32 { f32::sqrt(x) }
    pub fn sin(x: f32) -> f32 { f32::sin(x) }
    pub fn cos(x: f32) -> f32 { f32::cos(x) }
    pub fn floor(x: f32) -> f32 { f32::floor(x) }
    pub fn ceil(x: f32) -> f32 { f32::ceil(x) }
    pub fn trunc(x: f32) -> f32 { f32::trunc(x) }
    pub fn round(x: f32) -> f32 { f32::round(x) }
    pub fn mul_add(a: f32, b: f32, c: f32) -> f32 { f32::mul_add(a, b, c) }
    pub fn fast_div(a: f32, b: f32) -> f32 { a / b }
}

impl FloatMath for f32 {
    #[inline(always)]
    fn exp(self) -> f32 { m::exp(self) }
    #[inline(always)]
    fn exp2(self) -> f32 { m::exp2(self) }
    #[inline(always)]
    fn ln(self) -> f32 { m::ln(self) }
    #[inline(always)]
    fn log2(self) -> f32 { m::log2(self) }
    #[inline(always)]
    fn sqrt(self) -> f32 { m::sqrt(self) }
    #[inline(always)]
    fn rsqrt(self) -> f32 { 1.0 / m::sqrt(self) }
    #[inline(always)]
    fn recip(self) -> f32 { 1.0 / self }
    #[inline(always)]
    fn sin(self) -> f32 { m::sin(self) }
    #[inline(always)]
    fn cos(self) -> f32 { m::cos(self) }
    #[inline(always)]
    fn tanh(self) -> f32 { tanh(self) }
    #[inline(always)]
    fn erf(self) -> f32 { erf(self) }
    #[inline(always)]
    fn sigmoid(self) -> f32 { m::fast_div(1.0, 1.0 + m::exp(-self)) }
    #[inline(always)]
    fn powf(self, y: f32) -> f32 { powf(self, y) }
    #[inline(always)]
    fn floor(self) -> f32 { m::floor(self) }
    #[inline(always)]
    fn ceil(self) -> f32 { m::ceil(self) }
    #[inline(always)]
    fn trunc(self) -> f32 { m::trunc(self) }
    #[inline(always)]
    fn round(self) -> f32 { m::round(self) }
    #[inline(always)]
    fn mul_add(self, a: f32, b: f32) -> f32 { m::mul_add(self, a, b) }
    #[inline(always)]
    fn fast_div(self, d: f32) -> f32 { m::fast_div(self, d) }
}

/// Hyperbolic tangent: odd polynomial near zero, `1 - 2/(e^2x + 1)` elsewhere
/// (absolute error below 1e-7, exact saturation to ±1).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.0625 {
        let x2 = x * x;
        // tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315
        x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    } else {
        let t = 1.0 - m::fast_div(2.0, m::exp(2.0 * a) + 1.0);
        if x < 0.0 { -t } else { t }
    }
}

/// Error function: Taylor series for |x| < 0.5, otherwise `1 - erfc(x)` with the
/// Chebyshev-fitted `erfc` of Numerical Recipes (fractional error < 1.2e-7).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.5 {
        let x2 = x * x;
        // 2/sqrt(pi) * (x - x^3/3 + x^5/10 - x^7/42 + x^9/216 - x^11/1320)
        let p = 1.0 + x2 * (-1.0 / 3.0 + x2 * (1.0 / 10.0 + x2 * (-1.0 / 42.0 + x2 * (1.0 / 216.0 + x2 * (-1.0 / 1320.0)))));
        return core::f32::consts::FRAC_2_SQRT_PI * x * p;
    }
    if a.is_nan() {
        return x;
    }
    let t = m::fast_div(1.0, 1.0 + 0.5 * a);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * m::exp(-a * a + poly);
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

/// `2^x` for hot loops that tolerate the GPU's approximation (softmax weights): NVIDIA's
/// bare `ex2.approx.ftz` (2 ulp, subnormal results flushed to 0; [`FloatMath::exp2`] adds a
/// correction step and costs about 9 instructions there), AMD's `exp2`, `std` on the host.
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    m::exp2_approx(x)
}

/// `x^y` through `exp2(y * log2|x|)`, with the sign rules of C `powf` for integral `y`.
#[inline(always)]
pub fn powf(x: f32, y: f32) -> f32 {
    if y == 0.0 {
        return 1.0;
    }
    if x == 1.0 {
        return 1.0;
    }
    let r = m::exp2(y * m::log2(x.abs()));
    if x < 0.0 {
        let yi = m::trunc(y);
        if yi != y {
            return f32::NAN;
        }
        // Odd integral exponent keeps the sign.
        if m::trunc(yi * 0.5) * 2.0 != yi {
            return -r;
        }
    }
    r
}
