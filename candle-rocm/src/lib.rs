//! Candle backend on this project's kernels.
//!
//! `RocmDevice` plugs into Candle through the external-backend variant our patch adds to
//! candle-core (`Device::Ext`, see `patches/`): a program changes only the line that picks
//! the device, and Candle's tensor ops, candle-nn's fused ops (softmax, RMSNorm, LayerNorm,
//! rotary embeddings, sigmoid) and `candle-transformers` models run on the kernels.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use candle_rocm::RocmDevice;
//! use kernel_dsl::host::WaveSize;
//!
//! // RocmDevice::new_rocm(0) on an AMD GPU, new_cuda(0) on an NVIDIA GPU.
//! let dev = RocmDevice::new_cpu_executor(WaveSize::W64).as_candle();
//! let x = Tensor::new(&[1f32, 2., 3.], &dev).unwrap();
//! let y = (x.exp().unwrap() + 1.0).unwrap().to_device(&Device::Cpu).unwrap();
//! assert!((y.to_vec1::<f32>().unwrap()[0] - (1f32.exp() + 1.0)).abs() < 1e-5);
//! ```
//!
//! Quantized GGUF tensors (`QTensor`, `QMatMul`, every GGML format including `Q8_1`) run
//! on the quantized kernels ([`quantized`]).
//!
//! f8e4m3 (`DType::F8E4M3`) is stored as raw bits: fills, uploads and downloads, strided
//! copies, `cat`, casts to and from every stored dtype, indexing (index_select, gather,
//! scatter, index_add), where_cond, comparisons (by value: `-0 == +0`, NaN unordered),
//! binary ops, affine, max/min/argmax/argmin and nearest upsampling run on the
//! dtype-generic kernels, bit for bit Candle's CPU results (except NaN operands of
//! `minimum`/`maximum`, NaN as for f32, and sums, accumulated in f64 and rounded once where
//! Candle rounds every partial sum to f8). Unary math, powf/elu, matmul, convolutions,
//! avg_pool2d and random numbers on f8e4m3 are Candle errors naming the op and dtype.
//!
//! Attention: [`flash_attn`] has the `candle-flash-attn` functions (`flash_attn`,
//! `flash_attn_varlen`, windows, ALiBi, softcap) on this device and on `Device::Cpu`, so a
//! model switches by changing its import; [`paged`] has `paged_attention`,
//! `reshape_and_cache` and `rope_and_cache` over a paged KV cache; [`paged_prefill`]
//! attends prompt chunks over their cached prefixes in place (no gather).
//!
//! Dtypes and ops without a kernel (f6/f4 storage, unary math on integers and f8e4m3)
//! return a Candle error naming the op and dtype; nothing falls back to the CPU silently.
pub mod blas;
pub mod buffer;
/// Tensor-parallel collectives (all-reduce, all-gather) on this backend's tensors.
pub mod collective;
pub mod device;
pub mod error;
pub mod flash_attn;
pub mod gemm;
pub mod llm_ops;
pub mod ops;
pub mod paged;
pub mod paged_prefill;
pub mod profile;
pub mod quantized;
pub mod sd_ops;
pub mod storage;
mod tensor_access;

pub use device::{cpu_executor, RocmDevice, BACKEND};
pub use profile::{OpStat, Profile};
pub use kernel_dsl::host::WaveSize;
pub use quantized::RocmQStorage;
pub use storage::RocmStorage;
