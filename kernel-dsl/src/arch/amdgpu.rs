//! AMDGPU (GCN/CDNA/RDNA) primitives.
//!
//! Work-group and grid sizes come from the HSA kernel dispatch packet (`workgroup_size_*`
//! at byte 4, `grid_size_*` in work-items at byte 12), read with scalar loads.
use core::arch::amdgpu as a;
use core::sync::atomic::{compiler_fence, Ordering};

#[cfg(not(amdgpu_gen = "gfx12"))]
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.s.waitcnt"]
    fn s_waitcnt(simm16: i32);
}

// gfx12 split the counters; LLVM 22 copies a legacy `llvm.amdgcn.s.waitcnt` immediate
// there unchanged (a gfx11-encoded `s_waitcnt`), so gfx12 uses its own wait intrinsics.
#[cfg(amdgpu_gen = "gfx12")]
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.s.wait.loadcnt"]
    fn s_wait_loadcnt(count: i16);
    #[link_name = "llvm.amdgcn.s.wait.storecnt"]
    fn s_wait_storecnt(count: i16);
    #[link_name = "llvm.amdgcn.s.wait.dscnt"]
    fn s_wait_dscnt(count: i16);
}

#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.canonicalize.f32"]
    fn canonicalize_f32(v: f32) -> f32;
}

/// Rounds an `f32` to `f16` bits (nearest-even) exactly as IEEE 754 says, signed zeros
/// included.
///
/// A plain `v as f16` lets the AMDGPU instruction selector fold a multiply feeding the
/// conversion, `fptrunc(fmul(a, b))`, into `v_fma_mix{lo,hi}_f16 a, b, 0` on every
/// generation with mix instructions (gfx9 through gfx12). Its `+0` addend turns a `-0`
/// product into `+0` (`-0 + +0 = +0`), so `f16::from_f32(-0.0 * d)` would lose its sign.
/// `llvm.canonicalize` between the two keeps the multiply out of the pattern: the code
/// is `v_mul_f32` + `v_cvt_f16_f32`, exact for every input (a NaN stays a NaN). The
/// canonicalize itself is no instruction when the value comes from arithmetic (already
/// canonical) and one `v_max_f32 v, v, v` when it comes straight from memory. Folds with
/// a real addend (an `fma` into `v_fma_mix_f32`) are untouched. The code-object tests
/// reject a mix instruction with a `+0` addend on every architecture.
#[inline(always)]
pub fn f32_to_f16_bits(v: f32) -> u16 {
    // SAFETY: `llvm.canonicalize` returns its operand, with a signalling NaN quietened
    // (which the conversion does anyway).
    (unsafe { canonicalize_f32(v) } as f16).to_bits()
}

macro_rules! id_fns {
    ($($name:ident => $e:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "` of the current work-item.")]
        #[inline(always)]
        pub fn $name() -> u32 { $e }
    )*};
}

#[inline(always)]
fn packet_u16(offset: usize) -> u32 {
    // SAFETY: the dispatch packet is valid for the whole kernel; offsets are HSA-defined.
    unsafe { *((core::intrinsics::gpu::amdgpu_dispatch_ptr() as *const u8).add(offset) as *const u16) as u32 }
}

#[inline(always)]
fn packet_u32(offset: usize) -> u32 {
    // SAFETY: as above.
    unsafe { *((core::intrinsics::gpu::amdgpu_dispatch_ptr() as *const u8).add(offset) as *const u32) }
}

id_fns! {
    thread_idx_x => a::workitem_id_x();
    thread_idx_y => a::workitem_id_y();
    thread_idx_z => a::workitem_id_z();
    block_idx_x => a::workgroup_id_x();
    block_idx_y => a::workgroup_id_y();
    block_idx_z => a::workgroup_id_z();
    block_dim_x => packet_u16(4);
    block_dim_y => packet_u16(6);
    block_dim_z => packet_u16(8);
    grid_dim_x => packet_u32(12).div_ceil(packet_u16(4));
    grid_dim_y => packet_u32(16).div_ceil(packet_u16(6));
    grid_dim_z => packet_u32(20).div_ceil(packet_u16(8));
}

/// Waits until this wave's outstanding global loads and LDS accesses are done: `s_waitcnt
/// vmcnt(0) lgkmcnt(0)` (expcnt not waited), encoded for the ISA generation that
/// build-support passes as `--cfg amdgpu_gen="gfxN"`; on gfx12 `s_wait_loadcnt 0`,
/// `s_wait_storecnt 0` and `s_wait_dscnt 0` (LLVM merges them into
/// `s_wait_storecnt 0` + `s_wait_loadcnt_dscnt 0`).
#[inline(always)]
fn wait_memory() {
    #[cfg(amdgpu_gen = "gfx11")]
    const WAIT_VM_LGKM: i32 = 0x0007; // gfx11: expcnt[2:0], lgkmcnt[9:4], vmcnt[15:10]
    #[cfg(not(any(amdgpu_gen = "gfx11", amdgpu_gen = "gfx12")))]
    const WAIT_VM_LGKM: i32 = 0x0070; // gfx9/gfx10: vmcnt[3:0]+[15:14], expcnt[6:4], lgkmcnt[11:8]
    // SAFETY: waits only stall the wave.
    #[cfg(not(amdgpu_gen = "gfx12"))]
    unsafe {
        s_waitcnt(WAIT_VM_LGKM)
    }
    // SAFETY: as above.
    #[cfg(amdgpu_gen = "gfx12")]
    unsafe {
        s_wait_loadcnt(0);
        s_wait_storecnt(0);
        s_wait_dscnt(0);
    }
}

/// Work-group barrier with work-group-scope memory ordering for LDS and global memory.
#[inline(always)]
pub fn barrier() {
    compiler_fence(Ordering::SeqCst);
    wait_memory();
    a::s_barrier();
    compiler_fence(Ordering::SeqCst);
}

/// [`barrier`] plus global-memory ordering between the work-group's work-items (see
/// `crate::sync::barrier_global`). gfx9: [`barrier`] (its `vmcnt` wait covers stores, and a
/// work-group never spans two CUs' L1). Later generations: a release fence before and an
/// acquire fence after the barrier. Rust's fences are system-scope (rustc has no
/// `syncscope` and no inline assembly on this target), so LLVM emits the store wait
/// (`s_waitcnt_vscnt` on gfx10/11) and cache invalidations (`buffer_gl0_inv` +
/// `buffer_gl1_inv`) of system scope: one more invalidation than work-group scope needs.
#[inline(always)]
pub fn barrier_global() {
    #[cfg(not(amdgpu_gen = "gfx9"))]
    core::sync::atomic::fence(Ordering::Release);
    barrier();
    #[cfg(not(amdgpu_gen = "gfx9"))]
    core::sync::atomic::fence(Ordering::Acquire);
}

/// Lanes per wave (64 on CDNA, 32 on RDNA).
#[inline(always)]
pub fn wave_size() -> u32 {
    a::wavefrontsize()
}

/// Lane index inside the wave.
#[inline(always)]
pub fn lane_id() -> u32 {
    let lo = a::mbcnt_lo(!0, 0);
    if wave_size() == 64 { a::mbcnt_hi(!0, lo) } else { lo }
}

/// Reads `value` from lane `src` of the wave.
#[inline(always)]
pub fn shuffle_u32(value: u32, src: u32) -> u32 {
    // SAFETY: ds_bpermute reads a lane of the same wave; the index wraps inside the wave.
    unsafe { a::ds_bpermute((src << 2) as u32, value) }
}

/// Bit `i` set when lane `i` passes `true`.
#[inline(always)]
pub fn ballot(predicate: bool) -> u64 {
    a::ballot(predicate)
}

/// The lanes whose `value` agrees with this lane's in the low `bits` bits: one ballot per
/// bit (AMD GPUs have no match instruction).
#[inline(always)]
pub fn match_any(value: u32, bits: u32) -> u64 {
    let mut m = a::ballot(true);
    let mut bit = 0;
    while bit < bits {
        let set = (value >> bit) & 1 != 0;
        let x = a::ballot(set);
        m &= if set { x } else { !x };
        bit += 1;
    }
    m
}

/// A wave's lanes execute together and its LDS accesses complete in order: only the
/// compiler must not move accesses across this point.
#[inline(always)]
pub fn wave_sync() {
    compiler_fence(Ordering::SeqCst);
}

/// Start of the work-group's launch-sized shared memory.
#[inline(always)]
pub fn shared_base() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<u128>() as *mut u8
}

pub use super::gpu_math::*;
