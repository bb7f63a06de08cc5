//! Packed 8-bit integer dot products: four byte products added to a 32-bit accumulator
//! in one instruction, the core of quantized matrix-vector kernels.
//!
//! | target | lowering |
//! |---|---|
//! | NVIDIA (sm_61+) | `dp4a.s32.s32` / `dp4a.s32.u32` (`llvm.nvvm.idp4a.*`) |
//! | AMD gfx906/908/90a/94x, gfx1011/1012/103x | `v_dot4(c)_i32_i8` (`llvm.amdgcn.sdot4`); the signed x unsigned form is scalar code |
//! | AMD gfx11/gfx12 | `v_dot4_i32_iu8` (`llvm.amdgcn.sdot4`, `llvm.amdgcn.sudot4`) |
//! | other AMD, host (CPU executor) | scalar code with the same (wrapping) result |
//!
//! The byte lanes are little-endian: byte `k` of `a` multiplies byte `k` of `b`. Sums wrap
//! on overflow (no saturation), as the hardware instructions do without their clamp bit.

/// `acc + sum_k a[k] * b[k]` over the four signed bytes `k` of `a` and `b`.
#[inline(always)]
pub fn dot4_i8(a: u32, b: u32, acc: i32) -> i32 {
    imp::dot4_i8(a, b, acc)
}

/// `acc + sum_k a[k] * b[k]` with the bytes of `a` signed and those of `b` unsigned.
#[inline(always)]
pub fn dot4_i8_u8(a: u32, b: u32, acc: i32) -> i32 {
    imp::dot4_i8_u8(a, b, acc)
}

/// Scalar definitions: the host, and AMD architectures without the instruction.
#[allow(dead_code)]
mod scalar {
    #[inline(always)]
    pub fn dot4_i8(a: u32, b: u32, acc: i32) -> i32 {
        let mut s = acc;
        let mut k = 0;
        while k < 4 {
            let x = (a >> (8 * k)) as u8 as i8 as i32;
            let y = (b >> (8 * k)) as u8 as i8 as i32;
            s = s.wrapping_add(x * y);
            k += 1;
        }
        s
    }

    #[inline(always)]
    pub fn dot4_i8_u8(a: u32, b: u32, acc: i32) -> i32 {
        let mut s = acc;
        let mut k = 0;
        while k < 4 {
            let x = (a >> (8 * k)) as u8 as i8 as i32;
            let y = (b >> (8 * k)) as u8 as i32;
            s = s.wrapping_add(x * y);
            k += 1;
        }
        s
    }
}

#[cfg(target_arch = "nvptx64")]
mod imp {
    #[allow(improper_ctypes)]
    unsafe extern "unadjusted" {
        #[link_name = "llvm.nvvm.idp4a.s.s"]
        fn idp4a_s_s(a: i32, b: i32, c: i32) -> i32;
        #[link_name = "llvm.nvvm.idp4a.s.u"]
        fn idp4a_s_u(a: i32, b: i32, c: i32) -> i32;
    }

    #[inline(always)]
    pub fn dot4_i8(a: u32, b: u32, acc: i32) -> i32 {
        // SAFETY: pure arithmetic intrinsic (dp4a, every NVPTX target this project builds).
        unsafe { idp4a_s_s(a as i32, b as i32, acc) }
    }

    #[inline(always)]
    pub fn dot4_i8_u8(a: u32, b: u32, acc: i32) -> i32 {
        // SAFETY: as above; the first operand's bytes are signed, the second's unsigned.
        unsafe { idp4a_s_u(a as i32, b as i32, acc) }
    }
}

#[cfg(all(target_arch = "amdgpu", any(amdgpu_dot = "sdot4", amdgpu_dot = "sudot4")))]
mod imp {
    #[allow(improper_ctypes)]
    unsafe extern "unadjusted" {
        #[link_name = "llvm.amdgcn.sdot4"]
        fn sdot4(a: i32, b: i32, c: i32, clamp: bool) -> i32;
        #[cfg(amdgpu_dot = "sudot4")]
        #[link_name = "llvm.amdgcn.sudot4"]
        fn sudot4(a_signed: bool, a: i32, b_signed: bool, b: i32, c: i32, clamp: bool) -> i32;
    }

    #[inline(always)]
    pub fn dot4_i8(a: u32, b: u32, acc: i32) -> i32 {
        // SAFETY: pure arithmetic intrinsic; build-support sets `amdgpu_dot` only for
        // architectures that have the instruction.
        unsafe { sdot4(a as i32, b as i32, acc, false) }
    }

    #[cfg(amdgpu_dot = "sudot4")]
    #[inline(always)]
    pub fn dot4_i8_u8(a: u32, b: u32, acc: i32) -> i32 {
        // SAFETY: as above.
        unsafe { sudot4(true, a as i32, false, b as i32, acc, false) }
    }

    #[cfg(not(amdgpu_dot = "sudot4"))]
    pub use super::scalar::dot4_i8_u8;
}

#[cfg(any(
    not(any(target_arch = "amdgpu", target_arch = "nvptx64")),
    all(target_arch = "amdgpu", not(any(amdgpu_dot = "sdot4", amdgpu_dot = "sudot4")))
))]
use scalar as imp;

#[cfg(all(test, not(any(target_arch = "amdgpu", target_arch = "nvptx64"))))]
mod tests {
    use super::*;

    fn bytes(v: [i32; 4]) -> u32 {
        v.iter().enumerate().fold(0u32, |w, (k, &x)| w | ((x as u8 as u32) << (8 * k)))
    }

    #[test]
    fn signed_and_mixed_products() {
        let a = bytes([-128, 127, -1, 5]);
        let b = bytes([-128, -128, 255, 3]); // 255 is -1 signed, 255 unsigned
        assert_eq!(dot4_i8(a, b, 7), 7 + 16384 - 16256 + 1 + 15);
        assert_eq!(dot4_i8_u8(a, b, 7), 7 + (-128 * 128) + (127 * 128) + (-255) + 15);
        assert_eq!(dot4_i8(bytes([-128; 4]), bytes([-128; 4]), i32::MAX), i32::MAX.wrapping_add(65536));
    }
}
