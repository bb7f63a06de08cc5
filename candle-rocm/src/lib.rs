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
//! Quantized GGUF tensors (`QTensor`, `QMatMul`) run on the quantized kernels
//! ([`quantized`]). Dtypes and ops without a kernel (f8e4m3/f6/f4 storage, unary math on
//! integers) return a Candle error naming the op and dtype; nothing falls back
//! to the CPU silently.
pub mod blas;
pub mod buffer;
pub mod device;
pub mod error;
pub mod ops;
pub mod profile;
pub mod quantized;
pub mod storage;

pub use device::{cpu_executor, RocmDevice, BACKEND};
pub use profile::{OpStat, Profile};
pub use kernel_dsl::host::WaveSize;
pub use quantized::RocmQStorage;
pub use storage::RocmStorage;
