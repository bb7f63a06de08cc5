//! Paged KV block manager (skeleton).

use thiserror::Error;

/// Hash of a full block's tokens chained with its parent block's hash.
pub type BlockHash = u64;

/// Misuse of the block manager.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BlockManagerError {
    #[error("out of KV blocks: need {need}, {free} free")]
    OutOfBlocks { need: usize, free: usize },
}

/// Allocates KV blocks with reference counts, copy-on-write and prefix caching.
#[derive(Debug)]
pub struct BlockManager {
    _private: (),
}

impl BlockManager {
    /// A manager of `num_blocks` blocks of `block_size` tokens; `prefix_caching` keeps freed
    /// full blocks reusable by hash until evicted (LRU).
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let _ = (num_blocks, block_size, prefix_caching);
        todo!()
    }
}
