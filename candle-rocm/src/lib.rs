//! Candle backend for AMD GPUs built on the `kernels` crate.
//!
//! Not implemented yet: this crate reserves its place in the workspace. Its own issue
//! will add the `candle_core::backend::BackendStorage` implementation.
