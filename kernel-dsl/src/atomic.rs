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
    /// Adds `v`, returning the previous value (compare-and-swap loop).
    #[inline(always)]
    pub fn fetch_add(&self, v: f32, order: Ordering) -> f32 {
        self.fetch_update(order, |x| x + v)
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
