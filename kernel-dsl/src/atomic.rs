//! Atomics on global or shared memory. Integer atomics are `core`'s; pass buffers of them
//! as kernel parameters (`counts: &[AtomicU32]`) — shared references, so no `&mut` aliasing.
pub use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// An `f32` with atomic read-modify-write, stored as its bits (same layout as `f32`).
#[repr(transparent)]
pub struct AtomicF32(AtomicU32);

impl AtomicF32 {
    /// A new atomic holding `v`.
    pub const fn new(v: f32) -> Self {
        AtomicF32(AtomicU32::new(v.to_bits()))
    }
    /// Loads the value.
    #[inline(always)]
    pub fn load(&self, order: Ordering) -> f32 {
        f32::from_bits(self.0.load(order))
    }
    /// Stores `v`.
    #[inline(always)]
    pub fn store(&self, v: f32, order: Ordering) {
        self.0.store(v.to_bits(), order)
    }
    /// Adds `v`, returning the previous value: one `atom.add.f32` on NVIDIA for
    /// `Relaxed` (global memory: subnormal inputs and results flush to zero), else a
    /// compare-and-swap loop.
    #[inline(always)]
    pub fn fetch_add(&self, v: f32, order: Ordering) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        if matches!(order, Ordering::Relaxed) {
            let prev: u32;
            // SAFETY: `self` is a valid, aligned f32 in global or shared memory (generic
            // address); relaxed atomic add at GPU scope, as `Relaxed` asks.
            unsafe {
                core::arch::asm!(
                    "atom.relaxed.gpu.add.f32 {0}, [{1}], {2};",
                    out(reg32) prev,
                    in(reg64) self as *const Self as u64,
                    in(reg32) v.to_bits(),
                    options(nostack),
                );
            }
            return f32::from_bits(prev);
        }
        self.fetch_update(order, |x| x + v)
    }

    /// Adds `v` and discards the previous value: one `red.add.f32` (no round trip;
    /// subnormals flush to zero in global memory) on NVIDIA, else
    /// [`AtomicF32::fetch_add`]. Relaxed order.
    #[inline(always)]
    pub fn add(&self, v: f32) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: as in `fetch_add`.
        unsafe {
            core::arch::asm!(
                "red.relaxed.gpu.add.f32 [{0}], {1};",
                in(reg64) self as *const Self as u64,
                in(reg32) v.to_bits(),
                options(nostack),
            );
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.fetch_add(v, Ordering::Relaxed);
    }
    /// Stores the maximum of the current value and `v`, returning the previous value.
    #[inline(always)]
    pub fn fetch_max(&self, v: f32, order: Ordering) -> f32 {
        self.fetch_update(order, |x| x.max(v))
    }
    /// Stores the minimum of the current value and `v`, returning the previous value.
    #[inline(always)]
    pub fn fetch_min(&self, v: f32, order: Ordering) -> f32 {
        self.fetch_update(order, |x| x.min(v))
    }
    #[inline(always)]
    fn fetch_update(&self, order: Ordering, f: impl Fn(f32) -> f32) -> f32 {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let new = f(f32::from_bits(cur)).to_bits();
            match self.0.compare_exchange_weak(cur, new, order, Ordering::Relaxed) {
                Ok(prev) => return f32::from_bits(prev),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// A memory fence of device (agent) scope: orders this work-item's global-memory accesses
/// before it against those after it as seen by every work-item of the launch (the
/// "last work-group to finish" patterns: each writer fences with `Release` before a
/// counter bump, the one that sees the final count fences with `Acquire` before reading).
/// NVIDIA: `fence.acq_rel.gpu` (`fence.sc.gpu` for `SeqCst`), no system-wide wait. AMD
/// and the CPU executor: `core`'s fence, which is system scope on AMD (rustc has no
/// `syncscope` and no inline assembly there): stronger than device scope, so correct,
/// with the cache write-back and invalidation of system scope. `Relaxed` does nothing.
#[inline(always)]
pub fn fence_device(order: Ordering) {
    if matches!(order, Ordering::Relaxed) {
        return;
    }
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands; the missing `nomem` option keeps the compiler from moving
    // memory accesses across it.
    unsafe {
        if matches!(order, Ordering::SeqCst) {
            core::arch::asm!("fence.sc.gpu;", options(nostack))
        } else {
            core::arch::asm!("fence.acq_rel.gpu;", options(nostack))
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    core::sync::atomic::fence(order);
}
