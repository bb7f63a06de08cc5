//! Element types: `f16`/`bf16` with the same bits on host and device, and the traits
//! generic kernels are written against.

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub use half::{bf16, f16};

/// The primitive `f16`, named from a module where the `f16` struct does not shadow it.
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
mod prim {
    pub type F16 = f16;
}

#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
mod device_half {
    use super::prim::F16;
    /// IEEE 754 binary16, bit-compatible with `half::f16`.
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Default, PartialEq)]
    #[repr(transparent)]
    pub struct f16(u16);

    /// bfloat16, bit-compatible with `half::bf16`.
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Default, PartialEq)]
    #[repr(transparent)]
    pub struct bf16(u16);

    impl f16 {
        /// Widens to `f32` (exact; hardware conversion).
        #[inline(always)]
        pub fn to_f32(self) -> f32 {
            // SAFETY: same size; every bit pattern is a valid f16.
            F16::from_bits(self.0) as f32
        }
        /// Rounds an `f32` to nearest-even, keeping the sign of zero (on AMDGPU through
        /// `kernel_dsl::arch::f32_to_f16_bits`, which stops a multiply from folding into the
        /// conversion as a mix instruction with a `+0` addend).
        #[inline(always)]
        pub fn from_f32(v: f32) -> Self {
            #[cfg(target_arch = "amdgpu")]
            {
                f16(crate::arch::f32_to_f16_bits(v))
            }
            #[cfg(not(target_arch = "amdgpu"))]
            {
                f16((v as F16).to_bits())
            }
        }
        /// The raw bits.
        #[inline(always)]
        pub const fn to_bits(self) -> u16 { self.0 }
        /// From raw bits.
        #[inline(always)]
        pub const fn from_bits(b: u16) -> Self { f16(b) }
    }

    impl bf16 {
        /// Widens to `f32` (exact).
        #[inline(always)]
        pub fn to_f32(self) -> f32 {
            f32::from_bits((self.0 as u32) << 16)
        }
        /// Rounds an `f32` to nearest-even (NaN stays NaN), as `half::bf16::from_f32`.
        #[inline(always)]
        pub fn from_f32(v: f32) -> Self {
            // Round to nearest, ties to even, without branches: adding 0x7fff plus the
            // kept part's lowest bit carries into bit 16 exactly when rounding goes up.
            // NaNs stay NaN (quiet bit set), selected rather than branched to.
            let x = v.to_bits();
            let rounded = (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16;
            let nan = ((x >> 16) as u16) | 0x0040;
            bf16(if v != v { nan } else { rounded })
        }
        /// The raw bits.
        #[inline(always)]
        pub const fn to_bits(self) -> u16 { self.0 }
        /// From raw bits.
        #[inline(always)]
        pub const fn from_bits(b: u16) -> Self { bf16(b) }
    }
}
#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
pub use device_half::{bf16, f16};

/// A type that can live in a kernel buffer.
pub trait Element: Copy + Send + Sync + 'static {
    /// Short name used in kernel symbols (`f32`, `bf16`, `u32` ...).
    const NAME: &'static str;
    /// The zero value.
    const ZERO: Self;
}

/// A floating-point element computed in `f32` (f16/bf16 accumulate in f32).
pub trait Float: Element {
    /// Converts to `f32`.
    fn to_f32(self) -> f32;
    /// Converts from `f32`, rounding to nearest-even.
    fn from_f32(v: f32) -> Self;
    /// Converts two neighbouring elements to `f32` ([`Float::to_f32`] each; 16-bit types
    /// split one 32-bit word).
    #[inline(always)]
    fn to_f32x2(p: [Self; 2]) -> [f32; 2] {
        [p[0].to_f32(), p[1].to_f32()]
    }
    /// Converts two `f32` values to neighbouring elements ([`Float::from_f32`] each, with
    /// the same rounding); one packed instruction per pair where the target has one
    /// (`cvt.rn.bf16x2.f32` / `cvt.rn.f16x2.f32` on NVIDIA).
    #[inline(always)]
    fn from_f32x2(v: [f32; 2]) -> [Self; 2] {
        [Self::from_f32(v[0]), Self::from_f32(v[1])]
    }
}

macro_rules! element {
    ($($t:ident = $zero:expr),*) => {$(
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
            const ZERO: Self = $zero;
        }
    )*};
}
element!(f32 = 0.0, f64 = 0.0, u8 = 0, i8 = 0, u32 = 0, i32 = 0, i64 = 0, u64 = 0);
element!(f16 = f16::from_bits(0), bf16 = bf16::from_bits(0));

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 { self }
    #[inline(always)]
    fn from_f32(v: f32) -> Self { v }
}
impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 { f16::to_f32(self) }
    #[inline(always)]
    fn from_f32(v: f32) -> Self { f16::from_f32(v) }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn from_f32x2(v: [f32; 2]) -> [Self; 2] {
        let [lo, hi] = packed::f32x2_to_16x2::<false>(v);
        [f16::from_bits(lo), f16::from_bits(hi)]
    }
}
impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 { bf16::to_f32(self) }
    #[inline(always)]
    fn from_f32(v: f32) -> Self { bf16::from_f32(v) }
    #[inline(always)]
    fn to_f32x2(p: [Self; 2]) -> [f32; 2] {
        // The pair as one little-endian word: the low element's bits shifted up, the high
        // element's bits masked in place (two instructions, no 16-bit extracts).
        let w = (p[0].to_bits() as u32) | ((p[1].to_bits() as u32) << 16);
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    fn from_f32x2(v: [f32; 2]) -> [Self; 2] {
        let [lo, hi] = packed::f32x2_to_16x2::<true>(v);
        [bf16::from_bits(lo), bf16::from_bits(hi)]
    }
}

/// Packed `f32` -> 16-bit conversions of NVIDIA GPUs (sm_80+, PTX 7.0+).
#[cfg(target_arch = "nvptx64")]
mod packed {
    /// `[v0, v1]` rounded to nearest-even as bf16 (`BF16`) or f16 bits, in one
    /// `cvt.rn.{bf16x2,f16x2}.f32` (its first source goes to the upper half). NaN stays NaN
    /// (as the canonical NaN); subnormals are kept.
    #[inline(always)]
    pub fn f32x2_to_16x2<const BF16: bool>(v: [f32; 2]) -> [u16; 2] {
        let r: u32;
        // SAFETY: a pure register-to-register conversion.
        unsafe {
            if BF16 {
                core::arch::asm!("cvt.rn.bf16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) v[1], lo = in(reg32) v[0], options(pure, nomem, nostack));
            } else {
                core::arch::asm!("cvt.rn.f16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) v[1], lo = in(reg32) v[0], options(pure, nomem, nostack));
            }
        }
        [r as u16, (r >> 16) as u16]
    }
}

/// Value conversion between element types, with Rust `as` semantics (float to int
/// saturates, NaN becomes 0); f16/bf16 convert through `f32`.
pub trait CastFrom<S>: Sized {
    /// Converts `s` to `Self`.
    fn cast_from(s: S) -> Self;
}

macro_rules! cast_plain {
    ($($s:ty => [$($d:ty),*]);* $(;)?) => {$($(
        impl CastFrom<$s> for $d {
            #[inline(always)]
            fn cast_from(s: $s) -> $d { s as $d }
        }
    )*)*};
}
cast_plain! {
    f32 => [f32, f64, u8, u32, i32, i64, u64];
    f64 => [f32, f64, u8, u32, i32, i64, u64];
    u8 => [f32, f64, u8, u32, i32, i64, u64];
    u32 => [f32, f64, u8, u32, i32, i64, u64];
    i32 => [f32, f64, u8, u32, i32, i64, u64];
    i64 => [f32, f64, u8, u32, i32, i64, u64];
    u64 => [f32, f64, u8, u32, i32, i64, u64];
}

macro_rules! cast_half {
    ($($h:ident),*) => {$(
        impl CastFrom<$h> for $h {
            #[inline(always)]
            fn cast_from(s: $h) -> $h { s }
        }
        cast_half!(@from $h => f32, f64, u8, u32, i32, i64, u64);
    )*};
    (@from $h:ident => $($p:ty),*) => {$(
        impl CastFrom<$h> for $p {
            #[inline(always)]
            fn cast_from(s: $h) -> $p { <$h as Float>::to_f32(s) as $p }
        }
        impl CastFrom<$p> for $h {
            #[inline(always)]
            fn cast_from(s: $p) -> $h { <$h as Float>::from_f32(s as f32) }
        }
    )*};
}
cast_half!(f16, bf16);

impl CastFrom<f16> for bf16 {
    #[inline(always)]
    fn cast_from(s: f16) -> bf16 { bf16::from_f32(s.to_f32()) }
}
impl CastFrom<bf16> for f16 {
    #[inline(always)]
    fn cast_from(s: bf16) -> f16 { f16::from_f32(s.to_f32()) }
}
