//! NVPTX (CUDA) primitives, used to run the same kernels on NVIDIA GPUs.
use core::arch::nvptx as n;

#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    #[link_name = "llvm.nvvm.read.ptx.sreg.laneid"]
    fn sreg_laneid() -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn shfl_idx(mask: u32, value: u32, lane: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_bfly(mask: u32, value: u32, lane_mask: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.vote.ballot.sync"]
    fn vote_ballot(mask: u32, predicate: bool) -> u32;
    #[link_name = "llvm.nvvm.match.any.sync.i32"]
    fn match_any_sync(mask: u32, value: u32) -> u32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn bar_warp_sync(mask: u32);
}

macro_rules! id_fns {
    ($($name:ident => $f:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "` of the current thread.")]
        #[inline(always)]
        pub fn $name() -> u32 {
            // SAFETY: reads a special register.
            unsafe { n::$f() }
        }
    )*};
}

id_fns! {
    thread_idx_x => _thread_idx_x;
    thread_idx_y => _thread_idx_y;
    thread_idx_z => _thread_idx_z;
    block_idx_x => _block_idx_x;
    block_idx_y => _block_idx_y;
    block_idx_z => _block_idx_z;
    block_dim_x => _block_dim_x;
    block_dim_y => _block_dim_y;
    block_dim_z => _block_dim_z;
    grid_dim_x => _grid_dim_x;
    grid_dim_y => _grid_dim_y;
    grid_dim_z => _grid_dim_z;
}

/// Block barrier (`bar.sync 0`), which also orders shared and global memory in the block.
/// `llvm.nvvm.barrier0` is a memory-touching intrinsic, so the compiler does not move
/// loads or stores across it (NVPTX also rejects single-thread fences).
#[inline(always)]
pub fn barrier() {
    // SAFETY: a barrier has no memory-safety preconditions.
    unsafe { n::_syncthreads() };
}

/// [`barrier`]: `bar.sync` already orders global memory among the block's threads.
#[inline(always)]
pub fn barrier_global() {
    barrier();
}

/// Lanes per warp.
#[inline(always)]
pub fn wave_size() -> u32 {
    32
}

/// Lane index inside the warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    // SAFETY: reads a special register.
    unsafe { sreg_laneid() }
}

/// The lanes of this warp that exist in the block: all 32, or fewer in the last warp of a
/// block whose size is not a multiple of 32. Wave operations are called in wave-uniform
/// control flow, so these are exactly the lanes that take part. Naming them (rather than
/// `activemask`, the lanes that happen to be converged here) makes `shfl.sync` and
/// `vote.sync` wait for every lane: after a lane-divergent branch (a bounds check that may
/// trap, say) the warp is not guaranteed to have reconverged, and an `activemask`
/// shuffle then silently reads from only some lanes.
#[inline(always)]
fn warp_lanes() -> u32 {
    let first = crate::index::flat_thread_idx() & !31;
    let n = crate::index::flat_block_dim() - first;
    if n >= 32 { u32::MAX } else { (1u32 << n) - 1 }
}

/// `op` with the warp's mask ([`warp_lanes`]). When every warp of the block is whole (the
/// block size is a multiple of 32, as almost every launch's is) `op` gets the constant full
/// mask in a branch of its own: with a mask known at compile time ptxas emits the bare
/// `SHFL` / `VOTE` / `MATCH`, where a computed one (even when it is all ones) makes it
/// wrap each in convergence checks (`REDUX`, `BRA.DIV`, `WARPSYNC`) on the critical path.
#[inline(always)]
fn with_warp_mask<R>(op: impl Fn(u32) -> R) -> R {
    if crate::index::flat_block_dim() % 32 == 0 { op(u32::MAX) } else { op(warp_lanes()) }
}

/// Reads `value` from lane `src` of the warp.
#[inline(always)]
pub fn shuffle_u32(value: u32, src: u32) -> u32 {
    // SAFETY: the mask names the warp's lanes, all of which execute this call (the
    // wave-uniform rule of `wave`), as shfl.sync requires.
    with_warp_mask(|mask| unsafe { shfl_idx(mask, value, src, 0x1f) })
}

/// Reads `value` from lane `lane ^ lane_mask` (`lane_mask` < 32): `shfl.sync.bfly` with the
/// partner an immediate where the mask is a constant (no lane index to compute).
#[inline(always)]
pub fn shuffle_xor_u32(value: u32, lane_mask: u32) -> u32 {
    // SAFETY: as in `shuffle_u32`.
    with_warp_mask(|mask| unsafe { shfl_bfly(mask, value, lane_mask, 0x1f) })
}

/// Butterfly reduction over the warp (`shfl.sync.bfly`, the partner lane an immediate):
/// every lane gets `op` folded over all 32 values. All five exchanges sit in one branch of
/// [`with_warp_mask`]: built from [`shuffle_u32`] (`lane ^ offset` computed, a mask branch
/// per exchange) ptxas wrapped each exchange in a convergence check (`BRA.DIV`).
#[inline(always)]
pub fn reduce_butterfly<T: crate::wave::LaneValue>(v: T, op: impl Fn(T, T) -> T) -> T {
    with_warp_mask(|mask| {
        let mut v = v;
        let mut offset = 16;
        while offset > 0 {
            // SAFETY: as in `shuffle_u32`.
            v = op(v, T::from_lane(unsafe { shfl_bfly(mask, v.to_lane(), offset, 0x1f) }));
            offset /= 2;
        }
        v
    })
}

/// [`reduce_butterfly`] of two values at once, their exchanges interleaved.
#[inline(always)]
pub fn reduce_butterfly_pair<T: crate::wave::LaneValue>(a: T, b: T, op: impl Fn(T, T) -> T) -> (T, T) {
    with_warp_mask(|mask| {
        let (mut a, mut b) = (a, b);
        let mut offset = 16;
        while offset > 0 {
            // SAFETY: as in `shuffle_u32`.
            let (oa, ob) = unsafe { (shfl_bfly(mask, a.to_lane(), offset, 0x1f), shfl_bfly(mask, b.to_lane(), offset, 0x1f)) };
            a = op(a, T::from_lane(oa));
            b = op(b, T::from_lane(ob));
            offset /= 2;
        }
        (a, b)
    })
}

/// Bit `i` set when lane `i` passes `true`.
#[inline(always)]
pub fn ballot(predicate: bool) -> u64 {
    // SAFETY: as above.
    with_warp_mask(|mask| unsafe { vote_ballot(mask, predicate) }) as u64
}

/// The lanes whose `value` equals this lane's (`match.any.sync`, sm_70+; `bits` is only a
/// hint for the other targets' emulation). Its time grows with the number of distinct
/// values in the warp, but one ballot per bit measured slower still (H100,
/// `scatter_add_slab` with 13-bit keys: 321 us with `match.any`, 331 us with ballots).
#[inline(always)]
pub fn match_any(value: u32, _bits: u32) -> u64 {
    // SAFETY: as above.
    with_warp_mask(|mask| unsafe { match_any_sync(mask, value) }) as u64
}

/// `bar.warp.sync`: the warp's lanes meet, and their memory accesses before it are ordered
/// before those after it.
#[inline(always)]
pub fn wave_sync() {
    // SAFETY: as above.
    with_warp_mask(|mask| unsafe { bar_warp_sync(mask) })
}

/// Start of the block's launch-sized shared memory.
#[inline(always)]
pub fn shared_base() -> *mut u8 {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<u128>() as *mut u8
}

pub use super::gpu_math::*;
