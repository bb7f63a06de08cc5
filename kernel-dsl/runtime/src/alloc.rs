//! The caching allocator every device's buffers come from.
//!
//! Freed blocks are kept in per-size-class free lists and handed out again, so a loop that
//! allocates the same shapes over and over (a framework running a model) reaches a steady
//! state with no backend allocations at all. Sizes are rounded up to a class: multiples of
//! 512 bytes up to 64 KiB, four classes per power of two above (at most 25% slack), so a
//! buffer that grows a little every step (an LLM's KV cache: 4 KiB per token and layer
//! for Llama-3-8B) reaches a new class every few steps, not at every one.
//!
//! Reuse without waiting is safe because each device runs all its work on one ordered
//! stream: a block freed after queueing a kernel that reads it can only be written by work
//! queued later on the same stream. Blocks go back to the backend only in
//! [`CachingAllocator::empty_cache`], after an allocation failed, and when the allocator drops;
//! the backend waits for queued work before that.
use kernel_dsl::host::LaunchError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Memory a backend hands out in whole blocks.
pub(crate) trait RawMemory: Send + Sync {
    /// A new block of `bytes` (> 0) bytes; its address.
    fn alloc(&self, bytes: usize) -> Result<u64, LaunchError>;
    /// Frees a block from [`RawMemory::alloc`] of `bytes` bytes. Queued work has finished.
    ///
    /// # Safety
    /// `addr` came from `alloc(bytes)` of this object and is not used afterwards.
    unsafe fn free(&self, addr: u64, bytes: usize);
    /// Waits for all queued work that may use blocks of this memory.
    fn wait_idle(&self);
}

/// Allocation figures of one device (bytes are size-class bytes, as reserved).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in blocks held by live buffers.
    pub in_use_bytes: usize,
    /// Bytes in freed blocks kept for reuse.
    pub cached_bytes: usize,
    /// Highest `in_use_bytes` so far.
    pub peak_in_use_bytes: usize,
    /// Blocks obtained from the backend (`hipMalloc`, `cuMemAlloc`, the host allocator).
    pub backend_allocations: u64,
    /// Blocks returned to the backend.
    pub backend_frees: u64,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Live buffers (of non-zero size).
    pub live_blocks: u64,
}

/// Rounds a request up to its size class.
pub fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 64 << 10;
    if bytes <= SMALL {
        return bytes.div_ceil(512).max(1) * 512;
    }
    // Four classes per octave: 2^k * {1, 1.25, 1.5, 1.75}.
    let k = usize::BITS - 1 - bytes.leading_zeros();
    let base = 1usize << k;
    let step = base / 4;
    bytes.div_ceil(step).saturating_mul(step)
}

#[derive(Default)]
struct State {
    free: HashMap<usize, Vec<u64>>,
    stats: MemoryStats,
}

/// A per-device cache of memory blocks over a backend's raw allocations (`RawMemory`).
pub struct CachingAllocator {
    raw: Box<dyn RawMemory>,
    state: Mutex<State>,
}

/// A block from a [`CachingAllocator`]; back in its cache when dropped.
pub(crate) struct Block {
    pub(crate) addr: u64,
    /// Size-class bytes (0 for an empty block, which holds no memory).
    pub(crate) class: usize,
    alloc: Arc<CachingAllocator>,
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.class > 0 {
            self.alloc.release(self.addr, self.class);
        }
    }
}

impl CachingAllocator {
    pub(crate) fn new(raw: Box<dyn RawMemory>) -> Arc<Self> {
        Arc::new(CachingAllocator { raw, state: Mutex::new(State::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block of at least `bytes` bytes (contents unspecified: old data of a reused block).
    pub(crate) fn allocate(self: &Arc<Self>, bytes: usize) -> Result<Block, LaunchError> {
        if bytes == 0 {
            return Ok(Block { addr: 0, class: 0, alloc: self.clone() });
        }
        let class = size_class(bytes);
        let reused = {
            let mut st = self.lock();
            let addr = st.free.get_mut(&class).and_then(Vec::pop);
            if addr.is_some() {
                st.stats.cache_hits += 1;
                st.stats.cached_bytes -= class;
                Self::note_in_use(&mut st.stats, class);
            }
            addr
        };
        let addr = match reused {
            Some(a) => a,
            None => {
                let a = match self.raw.alloc(class) {
                    Ok(a) => a,
                    // Out of memory with blocks cached: give them back and try once more.
                    Err(_) if self.lock().stats.cached_bytes > 0 => {
                        self.empty_cache();
                        self.raw.alloc(class)?
                    }
                    Err(e) => return Err(e),
                };
                let mut st = self.lock();
                st.stats.backend_allocations += 1;
                Self::note_in_use(&mut st.stats, class);
                a
            }
        };
        Ok(Block { addr, class, alloc: self.clone() })
    }

    fn note_in_use(s: &mut MemoryStats, class: usize) {
        s.in_use_bytes += class;
        s.live_blocks += 1;
        s.peak_in_use_bytes = s.peak_in_use_bytes.max(s.in_use_bytes);
    }

    fn release(&self, addr: u64, class: usize) {
        let mut st = self.lock();
        st.stats.in_use_bytes -= class;
        st.stats.live_blocks -= 1;
        st.stats.cached_bytes += class;
        st.free.entry(class).or_default().push(addr);
    }

    /// Current figures.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Returns every cached block to the backend (after queued work has finished).
    pub fn empty_cache(&self) {
        let free: Vec<(usize, Vec<u64>)> = {
            let mut st = self.lock();
            st.stats.cached_bytes = 0;
            st.free.drain().collect()
        };
        if free.is_empty() {
            return;
        }
        self.raw.wait_idle();
        let mut n = 0;
        for (class, addrs) in free {
            for a in addrs {
                // SAFETY: every cached block came from `raw.alloc(class)` and no buffer holds it.
                unsafe { self.raw.free(a, class) };
                n += 1;
            }
        }
        self.lock().stats.backend_frees += n;
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // Every block is cached by now: live blocks hold an `Arc` to the allocator.
        self.empty_cache();
    }
}

/// Host memory for the CPU executor: 256-byte aligned, zeroed when first allocated (so a
/// reused block always holds initialised bytes).
pub(crate) struct HostMemory;

/// Alignment of host blocks: enough for every vector type a kernel may load.
const HOST_ALIGN: usize = 256;

impl RawMemory for HostMemory {
    fn alloc(&self, bytes: usize) -> Result<u64, LaunchError> {
        let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN)
            .map_err(|e| LaunchError::InvalidArgument { kernel: "alloc", reason: format!("{bytes} bytes: {e}") })?;
        // SAFETY: `bytes` > 0 (the allocator never asks for 0).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(LaunchError::Backend { backend: "cpu", call: "alloc", message: format!("out of host memory for {bytes} bytes") });
        }
        Ok(p as usize as u64)
    }

    unsafe fn free(&self, addr: u64, bytes: usize) {
        // SAFETY: allocated above with this layout (the caller's contract).
        unsafe { std::alloc::dealloc(addr as usize as *mut u8, std::alloc::Layout::from_size_align_unchecked(bytes, HOST_ALIGN)) }
    }

    fn wait_idle(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_with_bounded_slack() {
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 18));
        assert_eq!(size_class(64 << 10), 64 << 10);
        assert_eq!(size_class((64 << 10) + 1), 80 << 10);
        // A KV cache of 4 KiB per token from 64 to 128 KiB: 4 classes, not 16.
        let classes: std::collections::BTreeSet<usize> = (16..=32).map(|t| size_class(t * 4096)).collect();
        assert_eq!(classes.len(), 5, "{classes:?}");
        for bytes in [3_000_001usize, 1 << 30, (1 << 30) + 12345, 77_777_777, 100_000, 300_000] {
            let c = size_class(bytes);
            assert!(c >= bytes && (c - bytes) * 4 <= bytes, "{bytes} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }

    #[test]
    fn blocks_are_reused_and_released() {
        let a = CachingAllocator::new(Box::new(HostMemory));
        let b1 = a.allocate(1000).unwrap();
        let addr = b1.addr;
        assert_eq!(a.stats().in_use_bytes, 1024);
        drop(b1);
        assert_eq!(a.stats().cached_bytes, 1024);
        let b2 = a.allocate(900).unwrap();
        assert_eq!(b2.addr, addr, "same class: the cached block comes back");
        let s = a.stats();
        assert_eq!((s.backend_allocations, s.cache_hits, s.live_blocks), (1, 1, 1));
        drop(b2);
        a.empty_cache();
        let s = a.stats();
        assert_eq!((s.cached_bytes, s.in_use_bytes, s.backend_frees), (0, 0, 1));
        assert_eq!(s.peak_in_use_bytes, 1024);
        let empty = a.allocate(0).unwrap();
        assert_eq!((empty.class, a.stats().live_blocks), (0, 0));
    }
}
