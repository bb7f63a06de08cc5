//! [`mma`](super::mma) on AMD matrix units: MFMA 16x16x16 (gfx9, waves of 64) and WMMA
//! 16x16x16 (gfx11 and gfx12, waves of 32; gfx12 takes 8 items per lane), through the
//! LLVM intrinsics.
#![allow(improper_ctypes)]
use super::{cast, FragA, FragB, FragC, InputKind, MmaInput};

type Hf = f16;

macro_rules! simd {
    ($($name:ident = [$t:ty; $n:literal]),*) => {$(
        #[repr(simd)]
        #[derive(Clone, Copy)]
        #[allow(dead_code)]
        struct $name([$t; $n]);
    )*};
}
simd!(F16x4 = [Hf; 4], I16x4 = [i16; 4], F32x4 = [f32; 4], I32x4 = [i32; 4]);
simd!(F16x16 = [Hf; 16], I16x16 = [i16; 16], F32x8 = [f32; 8], I32x8 = [i32; 8]);
simd!(F16x8 = [Hf; 8], I16x8 = [i16; 8], I32x2 = [i32; 2]);

#[cfg(amdgpu_gen = "gfx9")]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.mfma.f32.16x16x16f16"]
    fn mfma_f16(a: F16x4, b: F16x4, c: F32x4, cbsz: i32, abid: i32, blgp: i32) -> F32x4;
    #[link_name = "llvm.amdgcn.mfma.f32.16x16x16bf16.1k"]
    fn mfma_bf16(a: I16x4, b: I16x4, c: F32x4, cbsz: i32, abid: i32, blgp: i32) -> F32x4;
}
// gfx90a has a 16x16x16 i8 MFMA; gfx940+ replaced it with 16x16x32, fed here with the
// upper 4 bytes of each lane zero (the k mapping of A and B stays the same bijection).
#[cfg(all(amdgpu_gen = "gfx9", not(any(amdgpu_arch = "gfx942", amdgpu_arch = "gfx950"))))]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.mfma.i32.16x16x16i8"]
    fn mfma_i8(a: i32, b: i32, c: I32x4, cbsz: i32, abid: i32, blgp: i32) -> I32x4;
}
#[cfg(all(amdgpu_gen = "gfx9", any(amdgpu_arch = "gfx942", amdgpu_arch = "gfx950")))]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.mfma.i32.16x16x32.i8"]
    fn mfma_i8_k32(a: i64, b: i64, c: I32x4, cbsz: i32, abid: i32, blgp: i32) -> I32x4;
}
#[cfg(all(amdgpu_gen = "gfx9", any(amdgpu_arch = "gfx942", amdgpu_arch = "gfx950")))]
#[inline(always)]
unsafe fn mfma_i8(a: i32, b: i32, c: I32x4, cbsz: i32, abid: i32, blgp: i32) -> I32x4 {
    // SAFETY: forwarded.
    unsafe { mfma_i8_k32(a as u32 as i64, b as u32 as i64, c, cbsz, abid, blgp) }
}

#[cfg(amdgpu_gen = "gfx11")]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.wmma.f32.16x16x16.f16"]
    fn wmma_f16(a: F16x16, b: F16x16, c: F32x8) -> F32x8;
    #[link_name = "llvm.amdgcn.wmma.f32.16x16x16.bf16"]
    fn wmma_bf16(a: I16x16, b: I16x16, c: F32x8) -> F32x8;
    #[link_name = "llvm.amdgcn.wmma.i32.16x16x16.iu8"]
    fn wmma_i8(a_signed: bool, a: I32x4, b_signed: bool, b: I32x4, c: I32x8, clamp: bool) -> I32x8;
}

// gfx950's double-rate MFMA: 16x16x32, 8 halves per lane. Fed with two 16x16x16 fragments
// side by side ([`mma_pair`]); A and B permute k the same way, so the sum is unchanged.
#[cfg(amdgpu_arch = "gfx950")]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.mfma.f32.16x16x32.f16"]
    fn mfma_f16_k32(a: F16x8, b: F16x8, c: F32x4, cbsz: i32, abid: i32, blgp: i32) -> F32x4;
    #[link_name = "llvm.amdgcn.mfma.f32.16x16x32.bf16"]
    fn mfma_bf16_k32(a: I16x8, b: I16x8, c: F32x4, cbsz: i32, abid: i32, blgp: i32) -> F32x4;
}

/// `a0 b0 + a1 b1 + c`, the two 16-deep slices in one `v_mfma_f32_16x16x32_{f16,bf16}`
/// on gfx950 (16-bit inputs); two [`mma`]s elsewhere.
#[inline(always)]
pub(super) fn mma_pair<T: MmaInput>(a0: &FragA<T>, b0: &FragB<T>, a1: &FragA<T>, b1: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    #[cfg(amdgpu_arch = "gfx950")]
    if T::KIND != InputKind::I8 {
        // Lane l's 8 items: k 4(l/16)..+4 of the first slice, then of the second. The
        // instruction reads them as k 8(l/16)..+8 of one 32-deep slice, in A and in B.
        let cat = |x: &[T], y: &[T]| -> [u16; 8] { core::array::from_fn(|j| if j < 4 { x[j].bits() } else { y[j - 4].bits() }) };
        let (a, b) = (cat(&a0.v[..], &a1.v[..]), cat(&b0.v[..], &b1.v[..]));
        let mut out = c;
        // SAFETY: 8 16-bit items as the intrinsic's 8-half vectors; the accumulator is f32.
        unsafe {
            out.v = match T::KIND {
                InputKind::F16 => cast(mfma_f16_k32(cast(a), cast(b), cast(c.v), 0, 0, 0)),
                _ => cast(mfma_bf16_k32(cast(a), cast(b), cast(c.v), 0, 0, 0)),
            };
        }
        return out;
    }
    mma(a1, b1, mma(a0, b0, c))
}

// The same intrinsics, overloaded on gfx12's operand widths: 8 halves (4 words) of A and
// B per lane, 8 bytes for i8.
#[cfg(amdgpu_gen = "gfx12")]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.wmma.f32.16x16x16.f16"]
    fn wmma12_f16(a: F16x8, b: F16x8, c: F32x8) -> F32x8;
    #[link_name = "llvm.amdgcn.wmma.f32.16x16x16.bf16"]
    fn wmma12_bf16(a: I16x8, b: I16x8, c: F32x8) -> F32x8;
    #[link_name = "llvm.amdgcn.wmma.i32.16x16x16.iu8"]
    fn wmma12_i8(a_signed: bool, a: I32x2, b_signed: bool, b: I32x2, c: I32x8, clamp: bool) -> I32x8;
}

#[inline(always)]
pub(super) fn mma<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    let mut out = c;
    // SAFETY: each arm reinterprets the fragments as the intrinsic's vectors of the same
    // size (KIND fixes T: f16/bf16 are 16-bit, i8 8-bit; Acc is f32 or i32).
    #[cfg(amdgpu_gen = "gfx9")]
    unsafe {
        out.v = match T::KIND {
            InputKind::F16 => cast(mfma_f16(cast(a.v), cast(b.v), cast(c.v), 0, 0, 0)),
            InputKind::Bf16 => cast(mfma_bf16(cast(a.v), cast(b.v), cast(c.v), 0, 0, 0)),
            InputKind::I8 => cast(mfma_i8(cast(a.v), cast(b.v), cast(c.v), 0, 0, 0)),
        };
    }
    #[cfg(amdgpu_gen = "gfx11")]
    unsafe {
        out.v = match T::KIND {
            InputKind::F16 => cast(wmma_f16(cast(a.v), cast(b.v), cast(c.v))),
            InputKind::Bf16 => cast(wmma_bf16(cast(a.v), cast(b.v), cast(c.v))),
            InputKind::I8 => cast(wmma_i8(true, cast(a.v), true, cast(b.v), cast(c.v), false)),
        };
    }
    #[cfg(amdgpu_gen = "gfx12")]
    unsafe {
        out.v = match T::KIND {
            InputKind::F16 => cast(wmma12_f16(cast(a.v), cast(b.v), cast(c.v))),
            InputKind::Bf16 => cast(wmma12_bf16(cast(a.v), cast(b.v), cast(c.v))),
            InputKind::I8 => cast(wmma12_i8(true, cast(a.v), true, cast(b.v), cast(c.v), false)),
        };
    }
    #[cfg(not(any(amdgpu_gen = "gfx9", amdgpu_gen = "gfx11", amdgpu_gen = "gfx12")))]
    {
        let _ = (a, b);
        unreachable!("no matrix unit: the VALU lowering handles this target")
    }
    out
}
