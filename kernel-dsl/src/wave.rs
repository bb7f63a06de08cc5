//! Wave (warp) operations: lanes of one wave exchanging registers without shared memory.
//!
//! A wave has 64 lanes on CDNA (gfx90a, gfx942), 32 on RDNA (gfx1030, gfx1100) and NVIDIA;
//! write kernels against [`size`] rather than a constant. Every function here must be
//! called by all active lanes of the wave together (wave-uniform control flow); the CPU
//! executor reports divergent calls as errors.
use crate::arch;

/// Lanes per wave on this device (32 or 64).
#[inline(always)]
pub fn size() -> u32 {
    arch::wave_size()
}

/// This lane's index inside its wave.
#[inline(always)]
pub fn lane_id() -> u32 {
    arch::lane_id()
}

/// Index of this wave inside the work-group.
#[inline(always)]
pub fn wave_id() -> u32 {
    crate::index::flat_thread_idx() / arch::wave_size()
}

/// A value that fits one 32-bit lane register.
pub trait LaneValue: Copy {
    /// Reinterprets as bits.
    fn to_lane(self) -> u32;
    /// Reinterprets from bits.
    fn from_lane(bits: u32) -> Self;
}
impl LaneValue for u32 {
    #[inline(always)]
    fn to_lane(self) -> u32 { self }
    #[inline(always)]
    fn from_lane(bits: u32) -> Self { bits }
}
impl LaneValue for i32 {
    #[inline(always)]
    fn to_lane(self) -> u32 { self as u32 }
    #[inline(always)]
    fn from_lane(bits: u32) -> Self { bits as i32 }
}
impl LaneValue for f32 {
    #[inline(always)]
    fn to_lane(self) -> u32 { self.to_bits() }
    #[inline(always)]
    fn from_lane(bits: u32) -> Self { f32::from_bits(bits) }
}

/// Value of `v` in lane `src` (indices wrap modulo the wave size).
#[inline(always)]
#[track_caller]
pub fn shuffle<T: LaneValue>(v: T, src: u32) -> T {
    T::from_lane(arch::shuffle_u32(v.to_lane(), src & (arch::wave_size() - 1)))
}

/// Value of `v` in lane `lane_id() ^ mask` (butterfly exchange).
#[inline(always)]
#[track_caller]
pub fn shuffle_xor<T: LaneValue>(v: T, mask: u32) -> T {
    // NVIDIA: `shfl.sync.bfly` (the same lane as the indexed shuffle of `lane ^ mask`
    // modulo 32, without computing it).
    #[cfg(target_arch = "nvptx64")]
    {
        T::from_lane(arch::shuffle_xor_u32(v.to_lane(), mask & 31))
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        shuffle(v, lane_id() ^ mask)
    }
}

/// Value of `v` in lane 0.
#[inline(always)]
#[track_caller]
pub fn broadcast_first<T: LaneValue>(v: T) -> T {
    shuffle(v, 0)
}

/// Bit `i` set when lane `i` passes `true`.
#[inline(always)]
#[track_caller]
pub fn ballot(predicate: bool) -> u64 {
    arch::ballot(predicate)
}

/// The lanes whose `value` equals this lane's in its low `bits` bits (this lane included):
/// lanes holding the same key find each other in one call. NVIDIA compares the whole
/// value (`match.any.sync`), so keys must not differ above `bits` unless they differ
/// below it as well; AMD GPUs take one ballot per bit, the CPU executor one exchange.
#[inline(always)]
#[track_caller]
pub fn match_any(value: u32, bits: u32) -> u64 {
    arch::match_any(value, bits)
}

/// The wave's lanes meet: shared-memory writes of any lane before it are seen by every
/// lane's reads after it (a warp barrier on NVIDIA; on AMD a wave runs in lockstep and
/// only the compiler is held back).
#[inline(always)]
#[track_caller]
pub fn sync() {
    arch::wave_sync()
}

/// `true` when every active lane passes `true`.
#[inline(always)]
#[track_caller]
pub fn all(predicate: bool) -> bool {
    ballot(!predicate) == 0
}

/// `true` when any active lane passes `true`.
#[inline(always)]
#[track_caller]
pub fn any(predicate: bool) -> bool {
    ballot(predicate) != 0
}

/// Butterfly reduction over the wave: every lane gets `op` folded over all lanes' values.
/// The wave must be full (all lanes active).
#[inline(always)]
#[track_caller]
pub fn reduce<T: LaneValue>(v: T, op: impl Fn(T, T) -> T) -> T {
    // NVIDIA: `shfl.sync.bfly` exchanges in one mask branch (see `arch::reduce_butterfly`).
    #[cfg(target_arch = "nvptx64")]
    {
        arch::reduce_butterfly(v, op)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let mut v = v;
        let mut offset = arch::wave_size() / 2;
        while offset > 0 {
            v = op(v, shuffle_xor(v, offset));
            offset /= 2;
        }
        v
    }
}

/// [`reduce`] of two values at once (their exchanges interleaved): `(reduce(a, op),
/// reduce(b, op))`.
#[inline(always)]
#[track_caller]
pub fn reduce_pair<T: LaneValue>(a: T, b: T, op: impl Fn(T, T) -> T) -> (T, T) {
    #[cfg(target_arch = "nvptx64")]
    {
        arch::reduce_butterfly_pair(a, b, op)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let (mut a, mut b) = (a, b);
        let mut offset = arch::wave_size() / 2;
        while offset > 0 {
            let (oa, ob) = (shuffle_xor(a, offset), shuffle_xor(b, offset));
            a = op(a, oa);
            b = op(b, ob);
            offset /= 2;
        }
        (a, b)
    }
}

/// Sum over the wave, in every lane.
#[inline(always)]
#[track_caller]
pub fn sum(v: f32) -> f32 {
    reduce(v, |a, b| a + b)
}

/// Maximum over the wave (NaN-ignoring, like `f32::max`), in every lane.
#[inline(always)]
#[track_caller]
pub fn max(v: f32) -> f32 {
    reduce(v, f32::max)
}

/// Minimum over the wave (NaN-ignoring, like `f32::min`), in every lane.
#[inline(always)]
#[track_caller]
pub fn min(v: f32) -> f32 {
    reduce(v, f32::min)
}

/// Integer sum over the wave (wrapping), in every lane.
#[inline(always)]
#[track_caller]
pub fn sum_u32(v: u32) -> u32 {
    reduce(v, u32::wrapping_add)
}
