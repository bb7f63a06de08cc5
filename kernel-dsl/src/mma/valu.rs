//! [`mma`](super::mma) without a matrix unit: lane shuffles and FMAs in the `MmaSync`
//! layout (g = lane / 4, t = lane % 4), waves of 32.
use super::{FragA, FragB, FragC, InputKind, MmaInput};
use crate::wave;

#[cfg(target_arch = "amdgpu")]
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.sched.barrier"]
    fn sched_barrier_raw(mask: i32);
}

/// Keeps the scheduler from hoisting the next round's shuffles above this point, which
/// would keep all 48 shuffled words of a product live at once (spills at 128 VGPRs).
#[inline(always)]
pub(super) fn sched_barrier() {
    #[cfg(target_arch = "amdgpu")]
    // SAFETY: a scheduling hint; no effect on memory or registers.
    unsafe {
        sched_barrier_raw(0)
    }
}

#[inline(always)]
fn word<T: MmaInput>(f: &[T], lo: usize, hi: usize) -> u32 {
    f[lo].bits() as u32 | (f[hi].bits() as u32) << 16
}

#[inline(always)]
fn half<T: MmaInput>(bits: u32) -> f32 {
    let b = bits as u16;
    match T::KIND {
        InputKind::F16 => crate::types::f16::from_bits(b).to_f32(),
        InputKind::Bf16 => crate::types::bf16::from_bits(b).to_f32(),
        InputKind::I8 => b as u8 as i8 as f32,
    }
}

#[inline(always)]
pub(super) fn mma<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    if T::KIND == InputKind::I8 {
        return mma_i8(a, b, c);
    }
    let lane = wave::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    // A[row][k]: lane 4 (row % 8) + (k % 8) / 2, item k % 2 + 2 (row / 8) + 4 (k / 8);
    // the pair (k, k + 1) for even k is one 32-bit word of the source lane.
    // B[k][col]: lane 4 (col % 8) + (k % 8) / 2, item k % 2 + 2 (k / 8) + 4 (col / 8).
    // This lane's C items: rows g, g + 8; columns 2t, 2t + 1, 2t + 8, 2t + 9.
    let mut acc = [0.0f32; 8];
    // SAFETY: Acc is f32 for 16-bit inputs.
    let cv: [f32; 8] = unsafe { super::cast(c.v) };
    let (aw, bw) = (
        [word(&a.v, 0, 1), word(&a.v, 2, 3), word(&a.v, 4, 5), word(&a.v, 6, 7)],
        [word(&b.v, 0, 1), word(&b.v, 2, 3), word(&b.v, 4, 5), word(&b.v, 6, 7)],
    );
    each!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
        acc[q] = cv[q];
    });
    each!(kp in [0, 1, 2, 3, 4, 5, 6, 7] {
        // k = 2 kp, 2 kp + 1: source lane offset kp % 4, word (kp / 4) * 2 (+1 for row + 8).
        let src_a = 4 * g + (kp as u32 % 4);
        let a_lo = wave::shuffle(aw[2 * (kp / 4)], src_a); // row g
        let a_hi = wave::shuffle(aw[2 * (kp / 4) + 1], src_a); // row g + 8
        each!(cc in [0, 1] {
            // columns 2t + cc (tile 0) and 2t + cc + 8 (tile 1): lane 4 (2t + cc) + kp % 4.
            let src_b = 4 * (2 * t + cc as u32) + (kp as u32 % 4);
            let b0 = wave::shuffle(bw[kp / 4], src_b);
            let b1 = wave::shuffle(bw[2 + kp / 4], src_b);
            each!(h in [0, 1] {
                let (al, ah) = (half::<T>(a_lo >> (16 * h)), half::<T>(a_hi >> (16 * h)));
                let (bv0, bv1) = (half::<T>(b0 >> (16 * h)), half::<T>(b1 >> (16 * h)));
                acc[cc] = crate::arch::mul_add(al, bv0, acc[cc]);
                acc[2 + cc] = crate::arch::mul_add(ah, bv0, acc[2 + cc]);
                acc[4 + cc] = crate::arch::mul_add(al, bv1, acc[4 + cc]);
                acc[6 + cc] = crate::arch::mul_add(ah, bv1, acc[6 + cc]);
            });
        });
        sched_barrier();
    });
    let mut out = c;
    // SAFETY: as above.
    out.v = unsafe { super::cast(acc) };
    out
}

#[inline(always)]
fn mma_i8<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    let lane = wave::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    // i8: A[row][k] at lane 4 (row % 8) + k / 4, byte k % 4 of word row / 8;
    // B[k][col] at lane 4 (col % 8) + k / 4, byte k % 4 of word col / 8.
    let pack = |f: &[T], w: usize| -> u32 {
        (0..4).fold(0u32, |acc, i| acc | (f[4 * w + i].bits() as u32) << (8 * i))
    };
    let aw = [pack(&a.v, 0), pack(&a.v, 1)];
    let bw = [pack(&b.v, 0), pack(&b.v, 1)];
    // SAFETY: Acc is i32 for i8 inputs.
    let mut acc: [i32; 8] = unsafe { super::cast(c.v) };
    let byte = |w: u32, i: u32| (w >> (8 * i)) as u8 as i8 as i32;
    each!(kq in [0, 1, 2, 3] {
        let src_a = 4 * g + kq as u32;
        let a_lo = wave::shuffle(aw[0], src_a);
        let a_hi = wave::shuffle(aw[1], src_a);
        each!(cc in [0, 1] {
            let src_b = 4 * (2 * t + cc as u32) + kq as u32;
            let b0 = wave::shuffle(bw[0], src_b);
            let b1 = wave::shuffle(bw[1], src_b);
            for i in 0..4 {
                let (al, ah, bv0, bv1) = (byte(a_lo, i), byte(a_hi, i), byte(b0, i), byte(b1, i));
                acc[cc] = acc[cc].wrapping_add(al * bv0);
                acc[2 + cc] = acc[2 + cc].wrapping_add(ah * bv0);
                acc[4 + cc] = acc[4 + cc].wrapping_add(al * bv1);
                acc[6 + cc] = acc[6 + cc].wrapping_add(ah * bv1);
            }
        });
        sched_barrier();
    });
    let mut out = c;
    // SAFETY: as above.
    out.v = unsafe { super::cast(acc) };
    out
}
