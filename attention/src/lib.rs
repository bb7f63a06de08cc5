//! Attention kernels (flash-attention prefill, paged-KV decode).
//!
//! Not implemented yet: this crate reserves its place in the workspace for its own issue.
