//! Paged KV block manager: which physical KV blocks each sequence's positions live in.
//!
//! Blocks carry reference counts, so sequences can share blocks (a fork shares its parent's
//! blocks; prefix caching shares full blocks between requests with the same token prefix).
//! A write into a shared block first copies it ([`BlockManager::cow`]). With prefix caching,
//! a full block is registered under the hash of its tokens chained with its parent block's
//! hash; when its last user frees it, it joins the free queue but stays findable by hash
//! until the allocator reuses it (least recently freed first).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use thiserror::Error;

/// Hash of a full block's tokens chained with its parent block's hash.
pub type BlockHash = u64;

/// Misuse of the block manager.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BlockManagerError {
    /// Not enough free (or evictable cached) blocks.
    #[error("out of KV blocks: need {need}, {free} free")]
    OutOfBlocks { need: usize, free: usize },
}

/// What a cached block holds, so a hash hit is verified exactly (no false sharing on a
/// 64-bit collision).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CacheKey {
    hash: BlockHash,
    parent: Option<BlockHash>,
    tokens: Box<[u32]>,
}

#[derive(Debug, Clone, Default)]
struct Meta {
    refs: u32,
    /// Pending copy-on-write reads of this block (see [`BlockManager::cow`]): while any is
    /// pending, the block stays off the free queue even without references.
    pins: u32,
    /// Position in the free queue while `refs == 0` and `pins == 0`.
    free_tick: u64,
    cached: Option<CacheKey>,
}

/// Allocates KV blocks with reference counts, copy-on-write and prefix caching.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    prefix_caching: bool,
    meta: Vec<Meta>,
    /// Free blocks by the tick they were freed at: the first is the least recently freed.
    free: BTreeMap<u64, u32>,
    next_tick: u64,
    by_hash: HashMap<BlockHash, u32>,
    /// Free blocks holding a cached prefix (kept up to date for cheap stats).
    cached_free: usize,
    /// Blocks handed out fresh (not as cache hits) since the last [`BlockManager::take_fresh`].
    fresh: Vec<u32>,
    /// Sources of copy-on-write copies not yet handed to the runner.
    pinned: Vec<u32>,
}

impl BlockManager {
    /// A manager of `num_blocks` blocks of `block_size` tokens; `prefix_caching` keeps freed
    /// full blocks reusable by hash until evicted (LRU).
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        assert!(block_size > 0, "block_size must be > 0");
        assert!(num_blocks <= u32::MAX as usize, "block ids are u32");
        Self {
            block_size,
            prefix_caching,
            meta: (0..num_blocks as u64).map(|t| Meta { free_tick: t, ..Meta::default() }).collect(),
            free: (0..num_blocks as u32).map(|b| (b as u64, b)).collect(),
            next_tick: num_blocks as u64,
            by_hash: HashMap::new(),
            fresh: Vec::new(),
            pinned: Vec::new(),
            cached_free: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// All blocks.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }
    /// Blocks that can be allocated now (unused ones, cached or not).
    pub fn num_free(&self) -> usize {
        self.free.len()
    }
    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.meta.len() - self.free.len()
    }
    /// Free blocks that still hold a reusable cached prefix.
    pub fn num_cached_free(&self) -> usize {
        self.cached_free
    }
    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }
    /// Reference count of `block`.
    pub fn ref_count(&self, block: u32) -> u32 {
        self.meta[block as usize].refs
    }
    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Allocates one block (reference count 1): the least recently freed one, which drops its
    /// cached prefix if it held one (LRU eviction).
    pub fn allocate(&mut self) -> Result<u32, BlockManagerError> {
        let (_, block) = self.free.pop_first().ok_or(BlockManagerError::OutOfBlocks { need: 1, free: 0 })?;
        let m = &mut self.meta[block as usize];
        if let Some(key) = m.cached.take() {
            self.cached_free -= 1;
            if self.by_hash.get(&key.hash) == Some(&block) {
                self.by_hash.remove(&key.hash);
            }
        }
        m.refs = 1;
        self.fresh.push(block);
        Ok(block)
    }

    /// Grows `table` until it covers `tokens` positions; all or nothing.
    pub fn grow(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<(), BlockManagerError> {
        let need = self.blocks_for(tokens).saturating_sub(table.len());
        if need > self.num_free() {
            return Err(BlockManagerError::OutOfBlocks { need, free: self.num_free() });
        }
        for _ in 0..need {
            table.push(self.allocate()?);
        }
        Ok(())
    }

    /// Adds a reference to each block of `table` (a fork shares them).
    pub fn share(&mut self, table: &[u32]) {
        for &b in table {
            let m = &mut self.meta[b as usize];
            assert!(m.refs > 0, "sharing free block {b}");
            m.refs += 1;
        }
    }

    /// Drops one reference to `block`; at zero it joins the free queue (staying findable by
    /// hash while prefix caching keeps it).
    pub fn free(&mut self, block: u32) {
        let m = &mut self.meta[block as usize];
        assert!(m.refs > 0, "double free of block {block}");
        m.refs -= 1;
        self.queue_if_unused(block);
    }

    /// Puts `block` on the free queue if nothing references or pins it.
    fn queue_if_unused(&mut self, block: u32) {
        let m = &mut self.meta[block as usize];
        if m.refs == 0 && m.pins == 0 {
            self.cached_free += m.cached.is_some() as usize;
            m.free_tick = self.next_tick;
            self.free.insert(self.next_tick, block);
            self.next_tick += 1;
        }
    }

    /// Frees a sequence's table, last block first so a shared prefix outlives its tails in
    /// the cache.
    pub fn free_table(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..).rev() {
            self.free(b);
        }
    }

    /// Copy-on-write: before writing into `table[idx]`, if that block is shared, replaces it
    /// with a fresh block and returns `(src, dst)` for the runner to copy.
    ///
    /// `src` stays pinned (never reallocated, even if its other holders free it in the
    /// meantime) until [`BlockManager::copies_issued`]: otherwise a preemption later in the
    /// same schedule could hand `src` to another sequence, or make it the destination of
    /// another copy, before the runner has read it.
    pub fn cow(&mut self, table: &mut [u32], idx: usize) -> Result<Option<(u32, u32)>, BlockManagerError> {
        let src = table[idx];
        if self.meta[src as usize].refs <= 1 {
            return Ok(None);
        }
        let dst = self.allocate()?;
        self.meta[src as usize].pins += 1;
        self.pinned.push(src);
        self.free(src);
        table[idx] = dst;
        Ok(Some((src, dst)))
    }

    /// The runner has been handed the pending copies (its later work is ordered after them):
    /// their sources may be reused.
    pub fn copies_issued(&mut self) {
        for b in std::mem::take(&mut self.pinned) {
            self.meta[b as usize].pins -= 1;
            self.queue_if_unused(b);
        }
    }

    /// The hash of a full block of `tokens` after a block hashed `parent` (`None` = first).
    pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        // `DefaultHasher::new()` has fixed keys: the same hash in every engine of a process.
        let mut h = std::hash::DefaultHasher::new();
        parent.hash(&mut h);
        tokens.hash(&mut h);
        h.finish()
    }

    /// Looks up a cached block holding `tokens` after `parent`; on a hit takes a reference
    /// (taking it off the free queue if unused) and returns it.
    pub fn lookup(&mut self, parent: Option<BlockHash>, tokens: &[u32]) -> Option<(u32, BlockHash)> {
        if !self.prefix_caching {
            return None;
        }
        let hash = Self::hash_block(parent, tokens);
        let &block = self.by_hash.get(&hash)?;
        let m = &mut self.meta[block as usize];
        let key = m.cached.as_ref()?;
        if key.parent != parent || *key.tokens != *tokens {
            return None;
        }
        if m.refs == 0 && m.pins == 0 {
            self.free.remove(&m.free_tick);
            self.cached_free -= 1;
        }
        m.refs += 1;
        Some((block, hash))
    }

    /// Registers `block` (a full, computed block in use, holding `tokens` after `parent`) in
    /// the prefix cache and returns its hash. A block whose hash is already cached stays
    /// unregistered.
    pub fn register(&mut self, block: u32, parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        debug_assert_eq!(tokens.len(), self.block_size);
        let hash = Self::hash_block(parent, tokens);
        let m = &self.meta[block as usize];
        if self.prefix_caching && m.refs > 0 && m.cached.is_none() {
            self.by_hash.entry(hash).or_insert_with(|| {
                self.meta[block as usize].cached = Some(CacheKey { hash, parent, tokens: tokens.into() });
                block
            });
        }
        hash
    }

    /// Drains the blocks allocated fresh since the last call (their old contents are dead).
    pub fn take_fresh(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.fresh)
    }

    /// Checks internal consistency (tests): free queue == unreferenced blocks, cache map ==
    /// blocks holding a key.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (b, m) in self.meta.iter().enumerate() {
            let queued = m.refs == 0 && self.free.get(&m.free_tick) == Some(&(b as u32));
            if (m.refs == 0 && m.pins == 0) != queued {
                return Err(format!("block {b}: refs {} pins {} but queued {queued}", m.refs, m.pins));
            }
            if let Some(k) = &m.cached {
                if self.by_hash.get(&k.hash) != Some(&(b as u32)) {
                    return Err(format!("block {b} holds a key not in the cache map"));
                }
            }
        }
        let cached_free = self.free.values().filter(|&&b| self.meta[b as usize].cached.is_some()).count();
        if cached_free != self.cached_free {
            return Err(format!("cached_free is {} but {cached_free} free blocks are cached", self.cached_free));
        }
        if self.free.len() != self.meta.iter().filter(|m| m.refs == 0 && m.pins == 0).count() {
            return Err("free queue holds a block twice or a used block".into());
        }
        for (h, &b) in &self.by_hash {
            if self.meta[b as usize].cached.as_ref().map(|k| k.hash) != Some(*h) {
                return Err(format!("cache map entry {h:x} -> {b} without key"));
            }
        }
        Ok(())
    }
}
