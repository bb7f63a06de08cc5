//! Host primitives: every call is served by the CPU executor running the launch.
use cpu_executor::item;

macro_rules! id_fns {
    ($($name:ident => $f:ident . $c:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "` of the current work-item (CPU executor).")]
        #[inline]
        pub fn $name() -> u32 { item::$f().$c }
    )*};
}

id_fns! {
    thread_idx_x => thread_idx.x;
    thread_idx_y => thread_idx.y;
    thread_idx_z => thread_idx.z;
    block_idx_x => block_idx.x;
    block_idx_y => block_idx.y;
    block_idx_z => block_idx.z;
    block_dim_x => block_dim.x;
    block_dim_y => block_dim.y;
    block_dim_z => block_dim.z;
    grid_dim_x => grid_dim.x;
    grid_dim_y => grid_dim.y;
    grid_dim_z => grid_dim.z;
}

/// Work-group barrier (all work-items of the group meet here).
#[inline]
#[track_caller]
pub fn barrier() {
    item::barrier()
}

/// [`barrier`]: the executor's work-items share one memory, so global writes before the
/// barrier are seen after it.
#[inline]
#[track_caller]
pub fn barrier_global() {
    item::barrier()
}

/// Lanes per wave, as configured on the executor (32 or 64).
#[inline]
pub fn wave_size() -> u32 {
    item::wave_size()
}

/// Lane index inside the wave.
#[inline]
pub fn lane_id() -> u32 {
    item::lane_id()
}

/// Reads `value` from lane `src` of the wave. An inactive or out-of-range source lane
/// yields the caller's own value (on hardware the result is unspecified).
#[inline]
#[track_caller]
pub fn shuffle_u32(value: u32, src: u32) -> u32 {
    let lanes = item::wave_exchange(value as u64);
    let src = src % lanes.lanes;
    if lanes.active & (1u64 << src) != 0 { lanes.values[src as usize] as u32 } else { value }
}

/// The lanes whose `value` agrees with this lane's in the low `bits` bits (one exchange;
/// the same answer as the GPUs' match instruction or ballot loop).
#[inline]
#[track_caller]
pub fn match_any(value: u32, bits: u32) -> u64 {
    let keep = if bits >= 32 { u32::MAX } else { (1u32 << bits) - 1 };
    let lanes = item::wave_exchange((value & keep) as u64);
    (0..lanes.lanes)
        .filter(|&l| lanes.active & (1u64 << l) != 0 && lanes.values[l as usize] == (value & keep) as u64)
        .fold(0u64, |m, l| m | (1u64 << l))
}

/// The wave's lanes meet (one exchange): shared-memory writes before it are seen after it.
#[inline]
#[track_caller]
pub fn wave_sync() {
    item::wave_exchange(0);
}

/// Bit `i` set when lane `i` passes `true`.
#[inline]
#[track_caller]
pub fn ballot(predicate: bool) -> u64 {
    let lanes = item::wave_exchange(predicate as u64);
    (0..lanes.lanes).filter(|&l| lanes.values[l as usize] != 0).fold(0u64, |m, l| m | (1u64 << l))
}

/// Start of the work-group's shared memory.
#[inline]
pub fn shared_base() -> *mut u8 {
    item::shared_ptr()
}
