//! Math primitives shared by the GPU backends (`f32`).
use core::intrinsics as i;

#[cfg(target_arch = "nvptx64")]
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn ex2_approx(x: f32) -> f32;
    #[link_name = "llvm.nvvm.sin.approx.f"]
    fn sin_approx(x: f32) -> f32;
    #[link_name = "llvm.nvvm.cos.approx.f"]
    fn cos_approx(x: f32) -> f32;
    #[link_name = "llvm.nvvm.div.approx.ftz.f"]
    fn div_approx(a: f32, b: f32) -> f32;
}

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::expf32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        // e^x = 2^(x log2 e) = 2^hi * 2^lo with hi = round(x log2 e) in f32 and lo its
        // rounding error (exact through fma): one ex2.approx (2 ulp) and a first-order
        // correction, so the error does not grow with |x|. Overflow gives +inf, NaN stays
        // NaN; results below 2^-126 flush to 0 (the `.ftz` form is the bare MUFU.EX2
        // instruction, the IEEE-subnormal form costs extra scaling instructions).
        let hi = x * core::f32::consts::LOG2_E;
        let lo = i::fmaf32(x, core::f32::consts::LOG2_E, -hi) + x * LOG2_E_LO;
        // SAFETY: pure arithmetic intrinsic.
        let p = unsafe { ex2_approx(hi) };
        // For x = ±inf the correction is NaN (inf - inf); p alone is then exact.
        let c = i::fmaf32(lo, core::f32::consts::LN_2, 1.0);
        if c != c { p } else { p * c }
    }
}

/// `log2(e) - f32(log2(e))`: the part of log2(e) an f32 cannot hold.
#[cfg(target_arch = "nvptx64")]
const LOG2_E_LO: f32 = 1.925_963e-8;

/// `a / b` allowing a reciprocal approximation (AMDGPU `v_rcp_f32`, NVPTX
/// `div.approx.ftz`, about 2 ulp; subnormal results flush to 0 on NVPTX); infinities and
/// NaN behave as in IEEE division.
#[inline(always)]
pub fn fast_div(a: f32, b: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::fdiv_algebraic(a, b)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: pure arithmetic intrinsic.
        unsafe { div_approx(a, b) }
    }
}

/// `2^x` by the hardware's approximation alone: `ex2.approx.ftz` on NVIDIA (one
/// `MUFU.EX2`, 2 ulp, results below 2^-126 flushed to 0, `-inf` gives 0), [`exp2`] on AMD.
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::exp2f32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: pure arithmetic intrinsic.
        unsafe { ex2_approx(x) }
    }
}

/// `2^x`.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::exp2f32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        exp(x * core::f32::consts::LN_2)
    }
}

/// Natural logarithm.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::logf32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        portable_ln(x)
    }
}

/// `log2(x)`.
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::log2f32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        portable_ln(x) * core::f32::consts::LOG2_E
    }
}

/// `ln(x)` from exponent/mantissa split and an atanh series (|error| < 2 ulp), for targets
/// whose hardware logarithm is only an approximation.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn portable_ln(x: f32) -> f32 {
    if !(x > 0.0) || x == f32::INFINITY {
        return if x == 0.0 { f32::NEG_INFINITY } else if x == f32::INFINITY { x } else { f32::NAN };
    }
    let (mut bits, mut e) = (x.to_bits(), 0i32);
    if bits < 0x0080_0000 {
        // Subnormal: scale into the normal range first.
        bits = (x * 8_388_608.0).to_bits();
        e = -23;
    }
    e += ((bits >> 23) as i32) - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > core::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let poly = s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0))));
    let ln_m = 2.0 * i::fmaf32(s, poly, s);
    i::fmaf32(e as f32, core::f32::consts::LN_2, ln_m)
}

/// Square root (correctly rounded).
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    i::sqrtf32(x)
}

/// Sine.
#[inline(always)]
pub fn sin(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::sinf32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: pure arithmetic intrinsic.
        unsafe { sin_approx(x) }
    }
}

/// Cosine.
#[inline(always)]
pub fn cos(x: f32) -> f32 {
    #[cfg(target_arch = "amdgpu")]
    {
        i::cosf32(x)
    }
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: pure arithmetic intrinsic.
        unsafe { cos_approx(x) }
    }
}

/// Round toward negative infinity.
#[inline(always)]
pub fn floor(x: f32) -> f32 {
    i::floorf32(x)
}

/// Round toward positive infinity.
#[inline(always)]
pub fn ceil(x: f32) -> f32 {
    i::ceilf32(x)
}

/// Round toward zero.
#[inline(always)]
pub fn trunc(x: f32) -> f32 {
    i::truncf32(x)
}

/// Round half away from zero.
#[inline(always)]
pub fn round(x: f32) -> f32 {
    i::roundf32(x)
}

/// Fused multiply-add `a*b + c`.
#[inline(always)]
pub fn mul_add(a: f32, b: f32, c: f32) -> f32 {
    i::fmaf32(a, b, c)
}
