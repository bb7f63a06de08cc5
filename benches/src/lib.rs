//! Benchmark harness (bandwidth vs device copy and PyTorch on the same GPU).
//!
//! Not implemented yet: the GPU-run issue adds it. It reserves its place in the workspace.
