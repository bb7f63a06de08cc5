//! [`mma`](super::mma) on NVIDIA tensor cores (sm_80+): two `mma.sync.aligned.m16n8k16`
//! per 16x16x16 tile, one per 8-column half.
use super::{cast, FragA, FragB, FragC, InputKind, MmaInput};
use core::arch::asm;

#[inline(always)]
fn pack16<T: MmaInput>(f: &[T], j: usize) -> u32 {
    f[j].bits() as u32 | (f[j + 1].bits() as u32) << 16
}

#[inline(always)]
fn pack8<T: MmaInput>(f: &[T], j: usize) -> u32 {
    f[j].bits() as u32 | (f[j + 1].bits() as u32) << 8 | (f[j + 2].bits() as u32) << 16 | (f[j + 3].bits() as u32) << 24
}

macro_rules! mma_f32 {
    ($ty:literal, $a:expr, $b0:expr, $b1:expr, $c:expr) => {
        asm!(
            concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};"),
            inout(reg32) $c[0], inout(reg32) $c[1], inout(reg32) $c[2], inout(reg32) $c[3],
            in(reg32) $a[0], in(reg32) $a[1], in(reg32) $a[2], in(reg32) $a[3],
            in(reg32) $b0, in(reg32) $b1,
            options(pure, nomem, nostack),
        )
    };
}

macro_rules! mma_s8 {
    ($a0:expr, $a1:expr, $b:expr, $c:expr) => {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {{{0}, {1}, {2}, {3}}}, {{{4}, {5}}}, {{{6}}}, {{{0}, {1}, {2}, {3}}};",
            inout(reg32) $c[0], inout(reg32) $c[1], inout(reg32) $c[2], inout(reg32) $c[3],
            in(reg32) $a0, in(reg32) $a1, in(reg32) $b,
            options(pure, nomem, nostack),
        )
    };
}

#[inline(always)]
pub(super) fn mma<T: MmaInput>(a: &FragA<T>, b: &FragB<T>, c: FragC<T::Acc>) -> FragC<T::Acc> {
    let mut out = c;
    match T::KIND {
        InputKind::F16 | InputKind::Bf16 => {
            let aw = [pack16(&a.v, 0), pack16(&a.v, 2), pack16(&a.v, 4), pack16(&a.v, 6)];
            let bw = [pack16(&b.v, 0), pack16(&b.v, 2), pack16(&b.v, 4), pack16(&b.v, 6)];
            // SAFETY: Acc is f32 for 16-bit inputs.
            let cv: [f32; 8] = unsafe { cast(c.v) };
            let (mut c0, mut c1) = ([cv[0], cv[1], cv[2], cv[3]], [cv[4], cv[5], cv[6], cv[7]]);
            // SAFETY: register-only tensor-core instructions (sm_80+ is this lowering's
            // precondition).
            unsafe {
                if T::KIND == InputKind::F16 {
                    mma_f32!("f16", aw, bw[0], bw[1], c0);
                    mma_f32!("f16", aw, bw[2], bw[3], c1);
                } else {
                    mma_f32!("bf16", aw, bw[0], bw[1], c0);
                    mma_f32!("bf16", aw, bw[2], bw[3], c1);
                }
                out.v = cast([c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]]);
            }
        }
        InputKind::I8 => {
            let (a0, a1) = (pack8(&a.v, 0), pack8(&a.v, 4));
            let (b0, b1) = (pack8(&b.v, 0), pack8(&b.v, 4));
            // SAFETY: Acc is i32 for i8 inputs.
            let cv: [i32; 8] = unsafe { cast(c.v) };
            let (mut c0, mut c1) = ([cv[0], cv[1], cv[2], cv[3]], [cv[4], cv[5], cv[6], cv[7]]);
            // SAFETY: as above.
            unsafe {
                mma_s8!(a0, a1, b0, c0);
                mma_s8!(a0, a1, b1, c1);
                out.v = cast([c0[0], c0[1], c0[2], c0[3], c1[0], c1[1], c1[2], c1[3]]);
            }
        }
    }
    out
}

/// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: four 8x8 matrices of 16-bit
/// values; each lane passes the 32-bit shared-window address of one matrix row (lanes
/// 8q..8q+7: matrix q).
///
/// # Safety
/// `row` is a 16-byte aligned shared-memory address with 16 readable bytes.
#[inline(always)]
pub(super) unsafe fn ldmatrix_x4<const TRANS: bool>(row: u32) -> [u32; 4] {
    let (mut w0, mut w1, mut w2, mut w3): (u32, u32, u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        if TRANS {
            asm!(
                "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
                out(reg32) w0, out(reg32) w1, out(reg32) w2, out(reg32) w3, in(reg32) row,
                options(readonly, nostack),
            );
        } else {
            asm!(
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
                out(reg32) w0, out(reg32) w1, out(reg32) w2, out(reg32) w3, in(reg32) row,
                options(readonly, nostack),
            );
        }
    }
    [w0, w1, w2, w3]
}
