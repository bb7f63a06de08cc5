//! Attention kernels on the matrix units (`kernel_dsl::mma`), one Rust source for MFMA
//! (CDNA), WMMA (RDNA3), `mma.sync` (NVIDIA sm_80+) and the VALU fallback:
//!
//! - [`flash`]: flash-attention prefill forward (online softmax, f16/bf16 in, f32
//!   accumulation, head dims 64/80/96/128/256, causal bottom-right aligned, sliding
//!   window, softcap, ALiBi, grouped-query heads, variable-length batches, log-sum-exp
//!   out). Entry points: [`flash::host::flash_attn`], [`flash::host::flash_attn_varlen`].
//!
//! - [`paged`]: decode over a paged KV cache (block tables, any block size, GQA heads
//!   sharing each KV read, sequences of different lengths, split-KV with a merge pass) and
//!   `reshape_and_cache`. Entry points: [`paged::host::paged_attention`],
//!   [`paged::host::reshape_and_cache_rows`].
//!
//! The Candle entry points and the Hopper `wgmma` kernel are still to come (issue 29).
pub mod flash;
pub mod paged;

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
