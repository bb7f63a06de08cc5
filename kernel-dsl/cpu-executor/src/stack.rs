//! Coroutine stacks: a per-executor cache between launches and a per-thread pool during one.
//!
//! Creating a stack is an `mmap` + `mprotect` (for the guard page) and dropping it an
//! `munmap`, so stacks are recycled aggressively: a work-item that finishes without
//! suspending hands its stack straight back to its OS thread's [`StackPool`], and the next
//! work-item starts on it. Only work-items suspended at a barrier or wave operation hold a
//! stack of their own, so a kernel that never synchronises uses one stack per thread.

use std::fmt;
use std::io;
use std::mem;
use std::sync::{Mutex, PoisonError};

use corosensei::stack::DefaultStack;

/// Upper bound on the address space kept in a [`StackCache`] between launches.
const MAX_CACHED_BYTES: usize = 1 << 30;

/// Stacks of one size, kept between launches (shared by clones of an executor).
pub(crate) struct StackCache {
    size: usize,
    free: Mutex<Vec<DefaultStack>>,
}

impl StackCache {
    /// An empty cache of stacks of `size` usable bytes.
    pub(crate) fn new(size: usize) -> Self {
        Self { size, free: Mutex::new(Vec::new()) }
    }

    /// Usable bytes of each stack.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DefaultStack>> {
        // The list stays consistent even if a holder panicked: it is only pushed/popped.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Option<DefaultStack> {
        self.lock().pop()
    }

    /// Returns stacks to the cache, dropping (unmapping) those beyond the size cap.
    fn put_back(&self, stacks: Vec<DefaultStack>) {
        let cap = (MAX_CACHED_BYTES / self.size.max(1)).max(64);
        let mut free = self.lock();
        let room = cap.saturating_sub(free.len());
        free.extend(stacks.into_iter().take(room));
    }
}

impl fmt::Debug for StackCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackCache")
            .field("size", &self.size)
            .field("cached", &self.lock().len())
            .finish()
    }
}

/// The stacks one OS thread uses during a launch; returned to the cache when dropped.
pub(crate) struct StackPool<'a> {
    cache: &'a StackCache,
    local: Vec<DefaultStack>,
}

impl<'a> StackPool<'a> {
    /// An empty pool drawing on `cache`.
    pub(crate) fn new(cache: &'a StackCache) -> Self {
        Self { cache, local: Vec::new() }
    }

    /// Usable bytes of each stack.
    pub(crate) fn size(&self) -> usize {
        self.cache.size()
    }

    /// A free stack: this thread's last released one, else a cached one, else a new one.
    pub(crate) fn acquire(&mut self) -> io::Result<DefaultStack> {
        if let Some(stack) = self.local.pop() {
            return Ok(stack);
        }
        match self.cache.take() {
            Some(stack) => Ok(stack),
            None => DefaultStack::new(self.cache.size()),
        }
    }

    /// Makes `stack` (of a finished coroutine) available again.
    pub(crate) fn release(&mut self, stack: DefaultStack) {
        self.local.push(stack);
    }
}

impl Drop for StackPool<'_> {
    fn drop(&mut self) {
        self.cache.put_back(mem::take(&mut self.local));
    }
}
