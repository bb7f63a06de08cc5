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
//!
//! While a graph is being captured ([`Device::capture`](crate::Device::capture)) the
//! allocator serves a *capture pool*: every block handed out or freed during the capture
//! belongs to the graph from then on, because each replay writes and reads the same
//! addresses. A pool block freed later goes back to the pool, not to the shared cache, and
//! the pool's blocks return to the shared cache only when the graph drops
//! ([`CachingAllocator::retire_pool`]). Blocks allocated before the capture that the
//! graph's launches and copies use (their start addresses are recorded) are *pinned* to the
//! graph the same way: freed while the graph lives, they join its pool instead of the
//! shared cache (and pass to another live graph that uses them when it drops), so a replay
//! never touches memory handed to another buffer. Nothing during a capture waits for the
//! device: no retry after a failed allocation (that would synchronize), and
//! [`CachingAllocator::empty_cache`] does nothing until the capture ends.
use kernel_dsl::host::LaunchError;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

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
    /// Bytes in freed blocks that captured graphs keep (their capture pools): not reused by
    /// other buffers and not returned by `empty_cache`; back in `cached_bytes` when the
    /// graph drops.
    pub graph_pool_bytes: usize,
    /// Capture pools alive (one per captured graph, plus one during a capture).
    pub graph_pools: u64,
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

/// Free blocks by size class.
type FreeLists = HashMap<usize, Vec<u64>>;

#[derive(Default)]
struct State {
    free: FreeLists,
    stats: MemoryStats,
    /// The free blocks of each live capture pool, by pool id (ids start at 1).
    pools: HashMap<u64, FreeLists>,
    /// The pool being captured into and the capturing thread.
    capturing: Option<(u64, ThreadId)>,
    last_pool: u64,
    /// Addresses the capture under way used (buffer starts of its launches and copies).
    recording: Vec<u64>,
    /// Addresses used by live graphs, sorted, with their pool: a block holding one of them
    /// joins that pool when freed.
    pinned: Vec<(u64, u64)>,
}

/// A per-device cache of memory blocks over a backend's raw allocations (`RawMemory`).
pub struct CachingAllocator {
    raw: Box<dyn RawMemory>,
    state: Mutex<State>,
    /// `state.capturing.is_some()`, readable without the lock (launches check it).
    capturing: AtomicBool,
}

/// A block from a [`CachingAllocator`]; back in its cache when dropped.
pub(crate) struct Block {
    pub(crate) addr: u64,
    /// Size-class bytes (0 for an empty block, which holds no memory).
    pub(crate) class: usize,
    /// The capture pool the block belongs to (0: none).
    pool: u64,
    alloc: Arc<CachingAllocator>,
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.class > 0 {
            self.alloc.release(self.addr, self.class, self.pool);
        }
    }
}

impl CachingAllocator {
    pub(crate) fn new(raw: Box<dyn RawMemory>) -> Arc<Self> {
        Arc::new(CachingAllocator { raw, state: Mutex::new(State::default()), capturing: AtomicBool::new(false) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block of at least `bytes` bytes (contents unspecified: old data of a reused block).
    pub(crate) fn allocate(self: &Arc<Self>, bytes: usize) -> Result<Block, LaunchError> {
        if bytes == 0 {
            return Ok(Block { addr: 0, class: 0, pool: 0, alloc: self.clone() });
        }
        let class = size_class(bytes);
        let (reused, pool) = {
            let mut st = self.lock();
            let pool = st.capturing.map_or(0, |(p, _)| p);
            // During a capture, the pool's own free blocks first (freed earlier in the
            // capture: the graph orders their uses), then the shared cache (work queued
            // before the capture runs before every replay).
            let from_pool = st.pools.get_mut(&pool).and_then(|f| f.get_mut(&class)).and_then(Vec::pop);
            if from_pool.is_some() {
                st.stats.graph_pool_bytes -= class;
            }
            let addr = from_pool.or_else(|| {
                let a = st.free.get_mut(&class).and_then(Vec::pop);
                if a.is_some() {
                    st.stats.cached_bytes -= class;
                }
                a
            });
            if addr.is_some() {
                st.stats.cache_hits += 1;
                Self::note_in_use(&mut st.stats, class);
            }
            (addr, pool)
        };
        let addr = match reused {
            Some(a) => a,
            None => {
                let a = match self.raw.alloc(class) {
                    Ok(a) => a,
                    // Out of memory with blocks cached: give them back and try once more
                    // (not during a capture: returning blocks waits for the device).
                    Err(_) if pool == 0 && self.lock().stats.cached_bytes > 0 => {
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
        Ok(Block { addr, class, pool, alloc: self.clone() })
    }

    fn note_in_use(s: &mut MemoryStats, class: usize) {
        s.in_use_bytes += class;
        s.live_blocks += 1;
        s.peak_in_use_bytes = s.peak_in_use_bytes.max(s.in_use_bytes);
    }

    fn release(&self, addr: u64, class: usize, pool: u64) {
        let mut st = self.lock();
        st.stats.in_use_bytes -= class;
        st.stats.live_blocks -= 1;
        // A block of a live pool goes back to it; any block freed during a capture joins the
        // capture's pool (a kernel of the graph may use it: it must not be handed to
        // another buffer while the graph lives).
        let owner = if st.pools.contains_key(&pool) {
            Some(pool)
        } else {
            Self::pinned_in(&st.pinned, addr, class).or(st.capturing.map(|(p, _)| p))
        };
        match owner.and_then(|p| st.pools.get_mut(&p)) {
            Some(free) => {
                free.entry(class).or_default().push(addr);
                st.stats.graph_pool_bytes += class;
            }
            None => {
                st.free.entry(class).or_default().push(addr);
                st.stats.cached_bytes += class;
            }
        }
    }

    /// The pool of a live graph that uses an address in `[addr, addr + class)`.
    fn pinned_in(pinned: &[(u64, u64)], addr: u64, class: usize) -> Option<u64> {
        let i = pinned.partition_point(|&(a, _)| a < addr);
        pinned.get(i).filter(|&&(a, _)| a < addr + class as u64).map(|&(_, p)| p)
    }

    /// Notes that the capture under way uses the buffer starting at (or holding) `addr`.
    pub(crate) fn record_use(&self, addr: u64) {
        let mut st = self.lock();
        if st.capturing.is_some() && addr != 0 {
            st.recording.push(addr);
        }
    }

    /// Starts serving allocations from a new capture pool, for a capture by this thread;
    /// its id. An error while another capture is under way.
    pub(crate) fn begin_capture(&self) -> Result<u64, LaunchError> {
        let mut st = self.lock();
        if st.capturing.is_some() {
            return Err(LaunchError::Capture { op: "capture", reason: "this device is already capturing a graph (captures do not nest)".into() });
        }
        st.last_pool += 1;
        let id = st.last_pool;
        st.pools.insert(id, FreeLists::new());
        st.stats.graph_pools += 1;
        st.capturing = Some((id, std::thread::current().id()));
        self.capturing.store(true, Ordering::SeqCst);
        Ok(id)
    }

    /// Ends the capture begun by [`CachingAllocator::begin_capture`]: allocations come from
    /// the shared cache again. The pool lives on until [`CachingAllocator::retire_pool`].
    pub(crate) fn end_capture(&self) {
        let mut st = self.lock();
        if let Some((pool, _)) = st.capturing.take() {
            let mut used = std::mem::take(&mut st.recording);
            used.sort_unstable();
            used.dedup();
            st.pinned.extend(used.into_iter().map(|a| (a, pool)));
            st.pinned.sort_unstable();
        }
        self.capturing.store(false, Ordering::SeqCst);
    }

    /// Whether a graph is being captured on this device.
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::SeqCst)
    }

    /// `Ok` unless a graph is being captured by another thread than the caller: the device
    /// has one queue, and work from another thread would land in the graph.
    pub(crate) fn check_capture_thread(&self, op: &'static str) -> Result<(), LaunchError> {
        if !self.capturing() {
            return Ok(());
        }
        match self.lock().capturing {
            Some((_, t)) if t != std::thread::current().id() => Err(LaunchError::Capture {
                op,
                reason: "another thread is capturing a graph on this device's queue; wait for its capture to end".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Gives the free blocks of pool `id` back to the shared cache (or to the pool of another
    /// live graph that uses them) and forgets the pool: its blocks still held by buffers go
    /// the same way when those drop. Called when
    /// the graph that used the pool drops (work already queued, replays included, runs
    /// before any later use of the blocks: one ordered queue).
    pub(crate) fn retire_pool(&self, id: u64) {
        let mut st = self.lock();
        if st.capturing.is_some_and(|(p, _)| p == id) {
            st.capturing = None;
            st.recording.clear();
            self.capturing.store(false, Ordering::SeqCst);
        }
        st.pinned.retain(|&(_, p)| p != id);
        let Some(free) = st.pools.remove(&id) else { return };
        st.stats.graph_pools -= 1;
        for (class, addrs) in free {
            for addr in addrs {
                match Self::pinned_in(&st.pinned, addr, class) {
                    Some(other) => st.pools.entry(other).or_default().entry(class).or_default().push(addr),
                    None => {
                        st.stats.graph_pool_bytes -= class;
                        st.stats.cached_bytes += class;
                        st.free.entry(class).or_default().push(addr);
                    }
                }
            }
        }
    }

    /// Current figures.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Returns every cached block to the backend (after queued work has finished). Blocks
    /// of capture pools stay; nothing happens while a graph is being captured (waiting for
    /// the device would break the capture).
    pub fn empty_cache(&self) {
        let free: Vec<(usize, Vec<u64>)> = {
            let mut st = self.lock();
            if st.capturing.is_some() {
                return;
            }
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

    #[test]
    fn capture_pools_keep_their_blocks_until_retired() {
        let a = CachingAllocator::new(Box::new(HostMemory));
        let before = a.allocate(1000).unwrap(); // allocated before the capture, freed during it
        let cached = a.allocate(4096).unwrap();
        let cached_addr = cached.addr;
        drop(cached); // in the shared cache: a capture may take it
        let pool = a.begin_capture().unwrap();
        assert!(a.capturing());
        assert!(a.begin_capture().is_err(), "captures do not nest");
        let t1 = a.allocate(4096).unwrap();
        assert_eq!((t1.addr, t1.pool), (cached_addr, pool), "the shared cache serves a capture");
        let t1_addr = t1.addr;
        drop(t1);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes, s.graph_pools), (4096, 0, 1), "freed during the capture: kept by the pool");
        let t2 = a.allocate(4000).unwrap();
        assert_eq!(t2.addr, t1_addr, "the pool reuses its own blocks during the capture");
        drop(before);
        assert_eq!(a.stats().graph_pool_bytes, 1024, "a block freed during a capture joins the pool");
        let out = a.allocate(10_000).unwrap(); // outlives the capture (a graph's output)
        a.end_capture();
        assert!(!a.capturing());
        drop(t2);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes), (4096 + 1024, 0), "pool blocks go back to the pool after the capture");
        let fresh = a.allocate(4096).unwrap();
        assert_ne!(fresh.addr, t1_addr, "the pool's blocks are not handed to other buffers");
        drop(fresh);
        a.empty_cache();
        assert_eq!(a.stats().graph_pool_bytes, 4096 + 1024, "empty_cache leaves pools alone");
        a.retire_pool(pool);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.graph_pools, s.cached_bytes), (0, 0, 4096 + 1024));
        drop(out); // its pool is gone: to the shared cache
        let s = a.stats();
        assert_eq!((s.in_use_bytes, s.live_blocks, s.cached_bytes), (0, 0, 4096 + 1024 + size_class(10_000)));
        a.empty_cache();
        let s = a.stats();
        assert_eq!(s.backend_frees, s.backend_allocations, "every block went back");
    }

    #[test]
    fn blocks_a_graph_uses_stay_with_it_until_it_drops() {
        let a = CachingAllocator::new(Box::new(HostMemory));
        let input = a.allocate(2000).unwrap(); // allocated before the capture, used by the graph
        let unused = a.allocate(2000).unwrap();
        let pool = a.begin_capture().unwrap();
        a.record_use(input.addr + 64); // a view into it
        a.end_capture();
        let (in_addr, class) = (input.addr, input.class);
        drop(input);
        drop(unused);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes), (class, class), "the used block joins the graph's pool, the other the cache");
        let again = a.allocate(2000).unwrap();
        assert_ne!(again.addr, in_addr, "a block the graph uses is not handed out while it lives");
        drop(again);
        a.retire_pool(pool);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes), (0, 2 * class));
        let b = a.allocate(2000).unwrap();
        let c = a.allocate(2000).unwrap();
        assert!([b.addr, c.addr].contains(&in_addr), "back in the shared cache after the graph drops");
    }

    #[test]
    fn a_block_two_graphs_use_stays_until_both_drop() {
        let a = CachingAllocator::new(Box::new(HostMemory));
        let shared = a.allocate(3000).unwrap();
        let (addr, class) = (shared.addr, shared.class);
        let g1 = a.begin_capture().unwrap();
        a.record_use(addr);
        a.end_capture();
        let g2 = a.begin_capture().unwrap();
        a.record_use(addr + 8);
        a.end_capture();
        drop(shared);
        a.retire_pool(g1);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes, s.graph_pools), (class, 0, 1), "the second graph still uses it");
        let other = a.allocate(3000).unwrap();
        assert_ne!(other.addr, addr);
        drop(other);
        a.retire_pool(g2);
        let s = a.stats();
        assert_eq!((s.graph_pool_bytes, s.cached_bytes, s.graph_pools), (0, 2 * class, 0));
    }

    #[test]
    fn empty_cache_waits_for_the_capture_to_end() {
        let a = CachingAllocator::new(Box::new(HostMemory));
        drop(a.allocate(512).unwrap());
        let pool = a.begin_capture().unwrap();
        a.empty_cache();
        assert_eq!(a.stats().cached_bytes, 512, "no backend free during a capture");
        assert!(a.check_capture_thread("launch").is_ok(), "the capturing thread may queue work");
        let other = std::thread::scope(|s| s.spawn(|| a.check_capture_thread("launch")).join().unwrap());
        assert!(matches!(other, Err(LaunchError::Capture { op: "launch", .. })), "{other:?}");
        a.retire_pool(pool);
        assert!(!a.capturing(), "retiring the capturing pool ends the capture");
        a.empty_cache();
        assert_eq!(a.stats().cached_bytes, 0);
    }
}
