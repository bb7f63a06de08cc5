//! Counter-based random numbers: `rand_uniform(lo, up)` and `rand_normal(mean, std)` for
//! f32, f16, bf16 and f64 from Philox4x32-10 (Salmon et al., "Parallel random numbers: as
//! easy as 1, 2, 3", SC'11).
//!
//! Element `i` of a call with `(seed, offset)` is a pure function of `(seed, offset + i / 2,
//! i % 2)`: Philox block `offset + i/2` (the 64-bit counter in words 0-1, words 2-3 zero;
//! the key is the seed's two halves) gives four 32-bit words, and each element uses two of
//! them. So the numbers do not depend on the launch shape, the wave size or the device,
//! and a caller continues a stream by advancing `offset` by `ceil(n / 2)` blocks.
//!
//! * uniform: `u = (w_hi * 2^32 + w_lo) >> 11` scaled by `2^-53` (53 random bits in
//!   `[0, 1)`), value `lo + (up - lo) * u` in f64, rounded once to the element type
//!   (so a value can round up to `up` itself in f32/f16/bf16).
//! * normal: Box-Muller on the block's two 53-bit uniforms, `u1` taken in `(0, 1]`:
//!   `r = sqrt(-2 ln u1)`, even elements `mean + std * r cos(2 pi u2)`, odd elements
//!   `... sin(2 pi u2)`. The logarithm, square root, sine and cosine are evaluated here with
//!   f64 additions, multiplications and divisions only (no hardware approximations, no
//!   fused multiply-adds), so every executor computes bit-identical numbers; their
//!   relative error is below 1e-14.
use kernel_dsl::prelude::*;

/// Philox4x32-10: ten rounds of the Philox S-box on counter `ctr` with key `key`.
#[device]
#[inline(always)]
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    let mut round = 0;
    while round < 10 {
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
        k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
        round += 1;
    }
    c
}

/// The Philox block of element `i`: its four words.
#[device]
#[inline(always)]
pub fn block(seed: u64, offset: u64, i: usize) -> [u32; 4] {
    let b = offset.wrapping_add((i / 2) as u64);
    philox4x32_10([b as u32, (b >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

/// A uniform in `[0, 1)` from two words (53 bits).
#[device]
#[inline(always)]
pub fn unit(hi: u32, lo: u32) -> f64 {
    (((hi as u64) << 32 | lo as u64) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// Natural logarithm of a positive, finite, normal `x` (f64 arithmetic only): `x = m 2^e`
/// with `m` in `[sqrt(1/2), sqrt 2)`, `ln m = 2 atanh(s)`, `s = (m - 1)/(m + 1)`, by its
/// odd series to `s^21` (`|s| <= 0.172`: truncation below 1e-17).
#[device]
#[inline(always)]
pub fn ln_f64(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 1.0 / 21.0;
    let mut k = 19;
    while k >= 1 {
        p = p * s2 + 1.0 / k as f64;
        k -= 2;
    }
    2.0 * s * p + e as f64 * core::f64::consts::LN_2
}

/// Square root of a non-negative finite `x` (f64 arithmetic only): an exponent-halving
/// first guess, then Newton steps to full precision.
#[device]
#[inline(always)]
pub fn sqrt_f64(x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    // Halve the exponent: the guess is within a factor 1.5 of the root.
    let mut y = f64::from_bits(((x.to_bits() >> 1) + (0x3ff0_0000_0000_0000 >> 1)) & 0x7fff_ffff_ffff_ffff);
    let mut k = 0;
    while k < 6 {
        y = 0.5 * (y + x / y);
        k += 1;
    }
    y
}

/// `(sin, cos)` of `phi` in `[0, pi/4]` by Taylor series (to `phi^17` and `phi^16`:
/// truncation below 1e-16).
#[device]
#[inline(always)]
pub fn sincos_octant(phi: f64) -> (f64, f64) {
    let p2 = phi * phi;
    let (mut s, mut c) = (1.0, 1.0);
    // sin: phi (1 - p2/(2*3) (1 - p2/(4*5) (1 - ...))); cos likewise with (1*2), (3*4) ...
    let mut k = 16;
    while k >= 2 {
        s = 1.0 - p2 / ((k * (k + 1)) as f64) * s;
        c = 1.0 - p2 / (((k - 1) * k) as f64) * c;
        k -= 2;
    }
    (phi * s, c)
}

/// `(sin, cos)` of `2 pi u` for `u` in `[0, 1)`: octant reduction on `u` (exact), a
/// reflection for odd octants, then the quadrant's signs.
#[device]
#[inline(always)]
pub fn sincos_turns(u: f64) -> (f64, f64) {
    let v = u * 8.0;
    let o = v as u32;
    let f = v - o as f64;
    // Angle inside the quadrant: psi = (o & 1) pi/4 + f pi/4.
    let (sp, cp) = if o & 1 == 0 {
        sincos_octant(f * core::f64::consts::FRAC_PI_4)
    } else {
        let (s, c) = sincos_octant((1.0 - f) * core::f64::consts::FRAC_PI_4);
        (c, s)
    };
    match (o >> 1) & 3 {
        0 => (sp, cp),
        1 => (cp, -sp),
        2 => (-sp, -cp),
        _ => (-cp, sp),
    }
}

/// Element `i` of a standard normal stream.
#[device]
#[inline(always)]
pub fn normal_at(seed: u64, offset: u64, i: usize) -> f64 {
    let w = block(seed, offset, i);
    let u1 = 1.0 - unit(w[0], w[1]);
    let u2 = unit(w[2], w[3]);
    let r = sqrt_f64(-2.0 * ln_f64(u1));
    let (s, c) = sincos_turns(u2);
    if i % 2 == 0 { r * c } else { r * s }
}

/// A float element written from an f64 (rounded once, nearest-even).
pub trait RandFloat: Copy + Send + Sync + 'static {
    /// Rounds `v`.
    fn from_f64(v: f64) -> Self;
}
impl RandFloat for f32 {
    #[inline(always)]
    fn from_f64(v: f64) -> Self { v as f32 }
}
impl RandFloat for f64 {
    #[inline(always)]
    fn from_f64(v: f64) -> Self { v }
}
impl RandFloat for f16 {
    // Through f32: the f64 -> f32 step cannot create a tie for f16 except for values
    // already within 2^-29 relative of one, far below the generator's resolution here.
    #[inline(always)]
    fn from_f64(v: f64) -> Self { f16::from_f32(v as f32) }
}
impl RandFloat for bf16 {
    #[inline(always)]
    fn from_f64(v: f64) -> Self { bf16::from_f32(v as f32) }
}

/// `out[i] = lo + (up - lo) * u_i` for the stream `(seed, offset)`.
#[amdgpu_kernel(T = [f32, f16, bf16, f64])]
pub fn rand_uniform<T: RandFloat>(out: &mut [T], seed: u64, offset: u64, lo: f64, up: f64) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        let w = block(seed, offset, i);
        let u = if i % 2 == 0 { unit(w[0], w[1]) } else { unit(w[2], w[3]) };
        out[i] = T::from_f64(lo + (up - lo) * u);
        i += step;
    }
}

/// `out[i] = mean + std * z_i` for the stream `(seed, offset)`.
#[amdgpu_kernel(T = [f32, f16, bf16, f64])]
pub fn rand_normal<T: RandFloat>(out: &mut [T], seed: u64, offset: u64, mean: f64, std: f64) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = T::from_f64(mean + std * normal_at(seed, offset, i));
        i += step;
    }
}

/// Checked launches.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use super::RandFloat;
    use crate::convert::ops::grid;
    use crate::dtype::host::{arg_len, invalid};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSliceMut, LaunchError};

    /// Philox blocks a call of `n` elements consumes: advance `offset` by this for the
    /// next call of the same stream.
    pub fn blocks_used(n: usize) -> u64 {
        n.div_ceil(2) as u64
    }

    /// Fills `out` with uniforms in `[lo, up)` (see the module docs); `lo <= up`, finite.
    pub fn rand_uniform<T: RandFloat>(dev: &Device, out: &mut (impl KernelArgSliceMut<T> + ?Sized), seed: u64, offset: u64, lo: f64, up: f64) -> Result<(), LaunchError> {
        if !(lo.is_finite() && up.is_finite() && lo <= up) {
            return Err(invalid("rand_uniform", format!("bounds [{lo}, {up}) must be finite with lo <= up")));
        }
        let n = arg_len(out);
        if n == 0 {
            return Ok(());
        }
        super::rand_uniform::launch::<T>(dev, grid(n), out, seed, offset, lo, up)
    }

    /// Fills `out` with normals of `mean` and `std` (see the module docs); finite, `std >= 0`.
    pub fn rand_normal<T: RandFloat>(dev: &Device, out: &mut (impl KernelArgSliceMut<T> + ?Sized), seed: u64, offset: u64, mean: f64, std: f64) -> Result<(), LaunchError> {
        if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
            return Err(invalid("rand_normal", format!("mean {mean} and std {std} must be finite, std >= 0")));
        }
        let n = arg_len(out);
        if n == 0 {
            return Ok(());
        }
        super::rand_normal::launch::<T>(dev, grid(n), out, seed, offset, mean, std)
    }
}
