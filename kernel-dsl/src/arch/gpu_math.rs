//! Math primitives shared by the GPU backends (`f32`).
use core::intrinsics as i;

#[cfg(target_arch = "nvptx64")]
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.nvvm.ex2.approx.f"]
    fn ex2_approx(x: f32) -> f32;
    #[link_name = "llvm.nvvm.sin.approx.f"]
    fn sin_approx(x: f32) -> f32;
    #[link_name = "llvm.nvvm.cos.approx.f"]
    fn cos_approx(x: f32) -> f32;
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
        // Range reduction x = n*ln2 + r keeps the error of ex2.approx near 2 ulp for all x.
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        // Outside [-104, 89] the result is 0 or +inf (and NaN stays NaN); inside, the
        // reduction below stays finite.
        if !(x < 89.0) {
            return if x != x { x } else { f32::INFINITY };
        }
        if x < -104.0 {
            return 0.0;
        }
        let n = i::round_ties_even_f32(x * core::f32::consts::LOG2_E);
        let r = i::fmaf32(-n, LN2_LO, i::fmaf32(-n, LN2_HI, x));
        let half = i::truncf32(n * 0.5);
        // SAFETY: pure arithmetic intrinsics.
        unsafe { ex2_approx(r * core::f32::consts::LOG2_E) * ex2_approx(half) * ex2_approx(n - half) }
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
