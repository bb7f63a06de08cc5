//! Attention kernels on the matrix units (`kernel_dsl::mma`), one Rust source for MFMA
//! (CDNA), WMMA (RDNA3, RDNA4), `mma.sync` (NVIDIA sm_80+) and the VALU fallback:
//!
//! - [`flash`]: flash-attention prefill forward (online softmax, f16/bf16 in, f32
//!   accumulation, head dims 64/80/96/128/256, causal bottom-right aligned, sliding
//!   window, softcap, ALiBi, grouped-query heads, variable-length batches, log-sum-exp
//!   out). Entry points: [`flash::host::flash_attn`], [`flash::host::flash_attn_varlen`].
//!   On Hopper (sm_90a) head dims 64 and 128 run on the warpgroup matrix units
//!   ([`flash_wgmma`]).
//!
//! - [`paged`]: decode over a paged KV cache (block tables, any block size, GQA heads
//!   sharing each KV read, sequences of different lengths, split-KV with a merge pass) and
//!   `reshape_and_cache`. Entry points: [`paged::host::paged_attention`],
//!   [`paged::host::reshape_and_cache_rows`].
//!
//! - [`prefill`]: flash prefill of prompt chunks reading their keys and values (cached
//!   prefix included) from the paged cache through the block tables, varlen batches of
//!   several sequences' chunks in one launch. Entry point: [`prefill::host::paged_prefill`].
//!
//! - [`cache`]: `rope_and_cache`, the cache write with the rotary embedding applied to the
//!   keys (and, in the same launch, the queries) on the way. Entry point:
//!   [`cache::host::rope_and_cache_rows`].
//!
//! The Candle entry points are `candle_rocm::flash_attn` (candle-flash-attn's functions:
//! `flash_attn`, `flash_attn_windowed`, `flash_attn_alibi`, `flash_attn_varlen`, ...) and
//! `candle_rocm::paged` (`paged_attention`, `reshape_and_cache`, `rope_and_cache`).
//!
//! ```
//! use attention::{flash_attn, FlashOptions, FlashShape};
//! use attention::runtime::Device;
//! use half::f16;
//! use kernel_dsl::host::WaveSize;
//!
//! // The CPU executor (MFMA lane layout at wave 64); `Device::cuda(0)` / `Device::rocm(0)`
//! // run the same call on a GPU.
//! let dev = Device::cpu(WaveSize::W64);
//! let shape = FlashShape { batch: 1, seq_q: 3, seq_k: 5, heads: 2, kv_heads: 1, head_dim: 64 };
//! let q = dev.upload(&vec![f16::from_f32(0.1); 3 * 2 * 64]).unwrap();
//! let k = dev.upload(&vec![f16::from_f32(0.2); 5 * 64]).unwrap();
//! let v = dev.upload(&vec![f16::from_f32(0.5); 5 * 64]).unwrap();
//! let mut out = dev.alloc::<f16>(3 * 2 * 64).unwrap();
//! let mut lse = dev.alloc::<f32>(2 * 3).unwrap();
//! flash_attn(&dev, shape, &q, &k, &v, &mut out, &mut lse, &FlashOptions::causal(0.125)).unwrap();
//! // Every value row is 0.5, so every output is 0.5.
//! assert!(dev.download(&out).unwrap().iter().all(|x| (x.to_f32() - 0.5).abs() < 1e-3));
//! ```
pub mod cache;
pub mod flash;
pub mod flash_wgmma;
pub mod paged;
pub mod prefill;

kernel_dsl::embed_kernels!();

pub use flash::host::{flash_attn, flash_attn_varlen, FlashElem, FlashOptions, FlashShape, VarlenShape};
pub use kernel_runtime as runtime;
pub use kernels::gemm::lowering_of;

/// Why an attention launcher refused its arguments (nothing was written) or the launch
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum AttentionError {
    /// An argument (named as in the launcher's signature) does not fit the shape.
    #[error("argument `{arg}`: {reason}")]
    Argument {
        /// The argument.
        arg: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A head dimension the kernels are not built for.
    #[error("head dimension {0} is not supported (64, 80, 96, 128 or 256)")]
    HeadDim(usize),
    /// The launch itself failed.
    #[error(transparent)]
    Launch(#[from] kernel_dsl::host::LaunchError),
}
