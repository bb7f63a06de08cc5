//! [`RocmQStorage`]: Candle's quantized tensors (`QStorage::Ext`, GGUF weights) on a
//! [`RocmDevice`], running on the `kernels::quantized` kernels.
//!
//! - The GGML block bytes stay on the device as they are in the GGUF file; `f32`, `f16`
//!   and `bf16` tensors (norm weights, unquantized files) are kept as typed buffers.
//! - `dequantize`: the `dequantize` kernel (every block format, bit-identical to Candle's
//!   CPU result), or a cast for the float formats. [`RocmQStorage::dequantize_to`] gives
//!   `f16`/`bf16` directly.
//! - `fwd` (`QMatMul::forward`, `xs @ W^T`): for 1..=64 activation rows (decode steps), the
//!   activations are quantized to q8_1 on the device once and the int8 matvec runs on the
//!   blocks, in launches of up to 8 rows that each stream the weights once and write the
//!   activations' dtype (f32 sums rounded once at the store); larger batches
//!   (and the float formats) dequantize the weight and run the backend's GEMM
//!   ([`crate::ops::matmul::gemm`]): block formats with `f32` activations as an f16 GEMM
//!   with f32 accumulation (tensor cores; the activations cast to f16 and the result back
//!   to f32), otherwise in the activations' dtype. Activations may be `f32`, `f16` or
//!   `bf16`; the result has their dtype, as on Candle's CPU.
//! - `quantize` / `quantize_onto` quantize **on the host** with Candle's CPU code (the
//!   source is copied to the host first) and upload the blocks: quantizing weights is a
//!   load-time step, not a per-token one.
//!
//! Formats: every block format of the kernels (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`,
//! `Q2K` .. `Q6K`; `Q8K` dequantizes and runs through the GEMM path, having no matvec) plus
//! `F32`/`F16`/`BF16`, and `Q8_1` (GGML's `block_q8_1`: `d: f16, s: f16, qs: [i8; 32]`).
//!
//! `Q8_1` tensors are held as `Q8_0` blocks (`d`, `qs`: GGML's `block_q8_0`) plus the block
//! sums `s` kept apart (2 bytes per block; the weights never read them): a Q8_1 weight is
//! `d * q` like a Q8_0 one, so the `Q8_0` kernels run it, dequantize (bit for bit Candle's
//! CPU result, which computes `q as f32 * d` for both) and the int8 matvec with q8_1
//! activations (no kernel of its own). The split is done on the host at upload
//! (`qstorage_from_data`, a load-time step) and undone by `data()`, which gives the
//! original bytes back. (The kernels' own q8_1 *activation* layout, packed code words and
//! `f32` `(d, s)` pairs, is a different thing: it never holds weights.)
use crate::buffer::Buf;
use crate::device::RocmDevice;
use crate::error::{at, invalid};
use crate::ops::matmul::{gemm, GemmOperand, GemmShape};
use crate::ops::{alloc, float_dispatch};
use crate::storage::RocmStorage;
use candle_core::ext_backend::{ExtBackendQStorage, ExtDevice, ExtQStorage, ExtStorage};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use half::{bf16, f16};
use kernels::quantized::ops as qops;
use kernels::quantized::GgmlDType as KDType;
use kernels::runtime::DeviceVec;
use std::sync::Arc;

/// Most activation rows that take the int8 matvec (decode steps of up to 64 sequences);
/// more (prefill) take dequantize + GEMM.
pub const MATVEC_MAX_ROWS: usize = qops::MAX_DECODE_BATCH;

/// Most activation rows whose q8_1 codes, made with the activations
/// ([`crate::llm_ops::add_rms_norm_q8`], [`crate::llm_ops::silu_mul_q8`]), a product reads
/// instead of quantizing them: one matvec launch (`kernels::quantized::ops::MAX_BATCH`).
pub const CODES_MAX_ROWS: usize = qops::MAX_BATCH;

/// Most activation rows that take the int8 matvec by default: its tiles of 8 rows read the
/// weights once per tile, so past about 32 rows dequantize + GEMM reads fewer bytes
/// (8B Q4_K decode on an H200, benches/results/h200-2026-11-27t: the tiles win at 16 and 32
/// sequences, the GEMM at 64).
pub const MATVEC_DEFAULT_ROWS: usize = 32;

/// Most activation rows that take the int8 matvec in this process: [`MATVEC_DEFAULT_ROWS`],
/// or `CANDLE_ROCM_QMATVEC_ROWS` (1..=[`MATVEC_MAX_ROWS`], read once; to time the matvec
/// tiles against dequantize + GEMM on a device; other values are ignored).
pub fn matvec_max_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("CANDLE_ROCM_QMATVEC_ROWS").ok().and_then(|v| v.parse().ok()).filter(|r| (1..=MATVEC_MAX_ROWS).contains(r)).unwrap_or(MATVEC_DEFAULT_ROWS))
}

/// The kernels' format for a Candle block format (`None`: a float format or `Q8_1`).
pub fn kernel_format(dtype: GgmlDType) -> Option<KDType> {
    Some(match dtype {
        GgmlDType::Q4_0 => KDType::Q4_0,
        GgmlDType::Q4_1 => KDType::Q4_1,
        GgmlDType::Q5_0 => KDType::Q5_0,
        GgmlDType::Q5_1 => KDType::Q5_1,
        GgmlDType::Q8_0 => KDType::Q8_0,
        GgmlDType::Q2K => KDType::Q2K,
        GgmlDType::Q3K => KDType::Q3K,
        GgmlDType::Q4K => KDType::Q4K,
        GgmlDType::Q5K => KDType::Q5K,
        GgmlDType::Q6K => KDType::Q6K,
        GgmlDType::Q8K => KDType::Q8K,
        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 | GgmlDType::Q8_1 => return None,
    })
}

/// The data of a quantized tensor on the device.
enum Data {
    /// GGML blocks of a kernels format, as raw bytes.
    Blocks(KDType, DeviceVec<u8>),
    /// An `f32`/`f16`/`bf16` tensor.
    Float(Buf),
}

/// A quantized (GGUF) tensor on a [`RocmDevice`]: Candle's `QStorage::Ext`.
pub struct RocmQStorage {
    dtype: GgmlDType,
    data: Data,
    /// `Q8_1` only: the blocks' `s` fields (f16 bits, little-endian, 2 bytes per block),
    /// the blocks themselves being held as `Q8_0` in `data`.
    q8_1_sums: Option<DeviceVec<u8>>,
    device: RocmDevice,
}

/// Bytes of a GGML `block_q8_1` (`d: f16, s: f16, qs: [i8; 32]`) and of a `block_q8_0`
/// (`d: f16, qs: [i8; 32]`).
const Q8_1_BYTES: usize = 36;
const Q8_0_BYTES: usize = 34;

/// `Q8_1` blocks split into `Q8_0` blocks (`d`, `qs`) and the sums `s` (whole blocks:
/// checked by the caller).
fn split_q8_1(data: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let n = data.len() / Q8_1_BYTES;
    let (mut blocks, mut sums) = (Vec::with_capacity(n * Q8_0_BYTES), Vec::with_capacity(n * 2));
    for b in data.chunks_exact(Q8_1_BYTES) {
        blocks.extend_from_slice(&b[0..2]);
        blocks.extend_from_slice(&b[4..]);
        sums.extend_from_slice(&b[2..4]);
    }
    (blocks, sums)
}

/// The inverse of [`split_q8_1`].
fn join_q8_1(blocks: &[u8], sums: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks.len() / Q8_0_BYTES * Q8_1_BYTES);
    for (b, s) in blocks.chunks_exact(Q8_0_BYTES).zip(sums.chunks_exact(2)) {
        out.extend_from_slice(&b[0..2]);
        out.extend_from_slice(s);
        out.extend_from_slice(&b[2..]);
    }
    out
}

/// Elements of `T` from little-endian bytes (`bytes.len()` a multiple of the size: checked).
fn from_le<T, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    bytes.chunks_exact(N).map(|c| f(c.try_into().expect("chunks of N bytes"))).collect()
}

impl RocmQStorage {
    /// The tensor whose GGML data (as in a GGUF file) is `data`, uploaded to `device`.
    pub fn from_data(device: &RocmDevice, data: &[u8], dtype: GgmlDType) -> Result<Self> {
        const OP: &str = "qstorage_from_data";
        let dev = device.kernels();
        let block = dtype.type_size();
        if !data.len().is_multiple_of(block) {
            return Err(invalid(OP, format!("{} bytes are not whole {dtype:?} blocks of {block} bytes", data.len())));
        }
        let mut q8_1_sums = None;
        let data = match (dtype, kernel_format(dtype)) {
            (_, Some(k)) => Data::Blocks(k, dev.upload(data).map_err(at(OP))?),
            (GgmlDType::Q8_1, None) => {
                let (blocks, sums) = split_q8_1(data);
                q8_1_sums = Some(dev.upload(&sums).map_err(at(OP))?);
                Data::Blocks(KDType::Q8_0, dev.upload(&blocks).map_err(at(OP))?)
            }
            (GgmlDType::F32, None) => Data::Float(Buf::upload(dev, &CpuStorage::F32(from_le(data, f32::from_le_bytes)))?),
            (GgmlDType::F16, None) => Data::Float(Buf::upload(dev, &CpuStorage::F16(from_le(data, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b)))))?),
            (GgmlDType::BF16, None) => Data::Float(Buf::upload(dev, &CpuStorage::BF16(from_le(data, |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b)))))?),
            _ => return Err(invalid(OP, format!("{dtype:?} tensors are not supported"))),
        };
        Ok(RocmQStorage { dtype, data, q8_1_sums, device: device.clone() })
    }

    /// Weights held (block weights times blocks).
    pub fn elem_count(&self) -> usize {
        match &self.data {
            Data::Blocks(k, b) => b.len() / k.block_bytes() * k.block_weights(),
            Data::Float(b) => b.len(),
        }
    }

    /// Every weight dequantized to `dtype` (`f32`, `f16` or `bf16`), as a flat buffer of
    /// `elem_count` elements.
    pub fn dequantize_to(&self, elem_count: usize, dtype: DType) -> Result<Buf> {
        const OP: &str = "dequantize";
        if elem_count != self.elem_count() {
            return Err(invalid(OP, format!("{elem_count} elements asked of a {:?} tensor of {}", self.dtype, self.elem_count())));
        }
        let dev = self.device.kernels();
        match &self.data {
            Data::Blocks(k, w) => float_dispatch!(dtype, OP, T => {
                let mut out = alloc::<T>(dev, elem_count, OP)?;
                qops::dequantize::<T>(dev, *k, w, &mut out).map_err(at(OP))?;
                Ok(<T as crate::buffer::BufElem>::wrap(out))
            }),
            Data::Float(b) => crate::ops::elementwise::to_dtype(dev, b, &Layout::contiguous(b.len()), dtype),
        }
    }

    /// Whether a product of `m` activation rows of `k` columns runs the int8 matvec on
    /// codes made with the activations ([`RocmQStorage::matmul_t_q8`]): a block format with
    /// a matvec, `m` within one matvec launch (`qops::MAX_BATCH`) and the matvec's rows.
    fn takes_codes(&self, m: usize, k: usize) -> bool {
        let Data::Blocks(kd, _) = &self.data else { return false };
        kd.has_matvec() && (1..=qops::MAX_BATCH.min(matvec_max_rows())).contains(&m) && k.is_multiple_of(32)
    }

    /// [`RocmQStorage::matmul_t`]'s matvec on the q8_1 codes `q8` of `x` (made with it): no
    /// quantization launch. The caller checked [`RocmQStorage::takes_codes`].
    fn matmul_t_q8(&self, x: &Buf, q8: &crate::storage::Q8Codes, m: usize, n: usize, k: usize) -> Result<Buf> {
        const OP: &str = "qmatmul";
        let dev = self.device.kernels();
        let Data::Blocks(kd, w) = &self.data else { return Err(invalid(OP, "codes for a float tensor")) };
        if q8.xq.len() != m * k / 4 || q8.xds.len() != m * k / 16 {
            return Err(invalid(OP, format!("codes of {} words for {m} x {k} activations", q8.xq.len())));
        }
        float_dispatch!(x.dtype(), OP, T => {
            let mut y = alloc::<T>(dev, m * n, OP)?;
            qops::matvec_q8_1_prequantized::<T>(dev, dev.wave_lanes(), *kd, w, &q8.xq, &q8.xds, &mut y, n, k, m).map_err(at(OP))?;
            Ok(<T as crate::buffer::BufElem>::wrap(y))
        })
    }

    /// `xs (m x k) @ W^T` with `W` `(n, k)`: `xs` is the contiguous buffer `x` of dtype
    /// `T`; the result is `m x n` of `T`.
    fn matmul_t(&self, x: &Buf, m: usize, n: usize, k: usize) -> Result<Buf> {
        const OP: &str = "qmatmul";
        let dev = self.device.kernels();
        if let Data::Blocks(kd, w) = &self.data {
            if (1..=matvec_max_rows()).contains(&m) && kd.has_matvec() {
                // The matvec writes the activations' dtype itself (f32 sums rounded once at
                // the store): no cast launch after it.
                let xr = x.region(0, m * k)?;
                return float_dispatch!(x.dtype(), OP, T => {
                    let mut y = alloc::<T>(dev, m * n, OP)?;
                    qops::matvec::<T, T>(dev, *kd, w, &xr, &mut y, n, k, m).map_err(at(OP))?;
                    Ok(<T as crate::buffer::BufElem>::wrap(y))
                });
            }
        }
        if matches!(self.data, Data::Blocks(..)) && x.dtype() == DType::F32 {
            // Block formats at more than MATVEC_MAX_ROWS rows (prefill): f16 weights and
            // activations, f32 accumulation, on the tensor cores (cuBLAS/rocBLAS GemmEx or
            // kernels::gemm) instead of an f32 GEMM. The weights' 4..8-bit codes times f16
            // scales are exact or nearly so in f16; activations keep 11 bits (Candle's CUDA
            // backend quantizes them to 8 bits, q8_1, on this path).
            let f16_layout = Layout::contiguous(m * k);
            let x16 = crate::ops::elementwise::to_dtype(dev, x, &f16_layout, DType::F16)?;
            let y16 = self.matmul_t(&x16, m, n, k)?;
            return crate::ops::elementwise::to_dtype(dev, &y16, &Layout::contiguous(m * n), DType::F32);
        }
        let wt = self.dequantize_to(n * k, x.dtype())?;
        float_dispatch!(x.dtype(), OP, T => {
            let mut c = alloc::<T>(dev, m * n, OP)?;
            // a = xs (m x k, row-major); b = W^T (k x n): element (i, j) = W[j, i].
            let a = GemmOperand { data: x.region(0, m * k)?, batch: 0, row: k, col: 1 };
            let b = GemmOperand { data: wt.region(0, n * k)?, batch: 0, row: 1, col: k };
            gemm::<T>(dev, &a, &b, &mut c, GemmShape { batch: 1, m, n, k })?;
            Ok(<T as crate::buffer::BufElem>::wrap(c))
        })
    }
}

impl ExtBackendQStorage for RocmQStorage {
    fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    fn device(&self) -> ExtDevice {
        Arc::new(self.device.clone())
    }

    fn storage_size_in_bytes(&self) -> usize {
        let sums = self.q8_1_sums.as_ref().map_or(0, |s| s.len());
        sums + match &self.data {
            Data::Blocks(_, b) => b.len(),
            Data::Float(b) => b.len() * b.dtype().size_in_bytes(),
        }
    }

    fn data(&self) -> Result<Vec<u8>> {
        let dev = self.device.kernels();
        Ok(match &self.data {
            Data::Blocks(_, b) => {
                let blocks = dev.download(b).map_err(at("qdata"))?;
                match &self.q8_1_sums {
                    Some(s) => join_q8_1(&blocks, &dev.download(s).map_err(at("qdata"))?),
                    None => blocks,
                }
            }
            Data::Float(b) => match b.download(dev)? {
                CpuStorage::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                CpuStorage::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                CpuStorage::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
                other => return Err(invalid("qdata", format!("float tensor of {:?}", candle_core::backend::BackendStorage::dtype(&other)))),
            },
        })
    }

    /// Quantizes on the host (Candle's CPU code), then uploads.
    fn quantize(&mut self, src: &ExtStorage) -> Result<()> {
        self.quantize_onto(&src.to_cpu_storage()?)
    }

    /// Quantizes on the host (Candle's CPU code), then uploads.
    fn quantize_onto(&mut self, src: &CpuStorage) -> Result<()> {
        const OP: &str = "quantize";
        let x: Vec<f32> = match src {
            CpuStorage::F32(v) => v.clone(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::F64(v) => v.iter().map(|x| *x as f32).collect(),
            other => return Err(invalid(OP, format!("source of dtype {:?}", candle_core::backend::BackendStorage::dtype(other)))),
        };
        if x.len() != self.elem_count() {
            return Err(invalid(OP, format!("{} source values for a {:?} tensor of {}", x.len(), self.dtype, self.elem_count())));
        }
        let n = x.len();
        let q = QTensor::quantize(&Tensor::from_vec(x, n, &candle_core::Device::Cpu)?, self.dtype)?;
        *self = RocmQStorage::from_data(&self.device, &q.data()?, self.dtype)?;
        Ok(())
    }

    fn dequantize(&self, elem_count: usize) -> Result<ExtStorage> {
        Ok(self.device.storage(self.dequantize_to(elem_count, DType::F32)?))
    }

    fn fwd(&self, self_shape: &Shape, xs: &ExtStorage, l: &Layout) -> Result<(ExtStorage, Shape)> {
        const OP: &str = "qmatmul";
        let (n, k) = self_shape.dims2()?;
        if n * k != self.elem_count() {
            return Err(invalid(OP, format!("shape {self_shape:?} for a tensor of {} weights", self.elem_count())));
        }
        let dims = l.dims();
        if dims.len() < 2 || dims[dims.len() - 1] != k {
            return Err(invalid(OP, format!("input of shape {dims:?} for weights {self_shape:?} (rank >= 2, last dim {k})")));
        }
        let x = xs.as_any().downcast_ref::<RocmStorage>().ok_or_else(|| invalid(OP, "input is not on a rocm-kernels device"))?;
        let dev = self.device.kernels();
        let m = l.shape().elem_count() / k;
        let xb = x.buf();
        let copy;
        let xc = if l.is_contiguous() && l.start_offset() == 0 && xb.len() == m * k {
            xb
        } else {
            let mut c = Buf::zeros(dev, xb.dtype(), m * k)?;
            crate::ops::elementwise::copy_strided(dev, xb, l, &mut c, 0)?;
            copy = c;
            &copy
        };
        // In the per-op profile as `qmatmul.<format>` with the activations' dtype (the
        // activation quantization and matvec, or the dequantize and GEMM, inside it).
        let name = || -> std::borrow::Cow<'static, str> { format!("qmatmul.{:?}", self.dtype).to_lowercase().into() };
        // Codes that came with the activations (`crate::llm_ops::add_rms_norm_q8`,
        // `silu_mul_q8`): they hold for the whole buffer, which is the activations here.
        let codes = if std::ptr::eq(xc, xb) { x.q8_codes() } else { None };
        let y = self.device.profiled(name, xb.dtype(), || match codes {
            Some(q8) if self.takes_codes(m, k) => self.matmul_t_q8(xc, q8, m, n, k),
            _ => self.matmul_t(xc, m, n, k),
        })?;
        let mut out = dims.to_vec();
        *out.last_mut().expect("rank >= 2") = n;
        Ok((self.device.storage(y), Shape::from(out)))
    }
}

/// `qstorage_from_data` of [`RocmDevice`].
pub(crate) fn qstorage(device: &RocmDevice, data: &[u8], dtype: GgmlDType) -> Result<ExtQStorage> {
    Ok(Box::new(RocmQStorage::from_data(device, data, dtype)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Q8Codes;
    use candle_core::quantized::QMatMul;
    use candle_core::{Module, Storage};

    /// A product reads the codes an activation carries instead of quantizing it: zero
    /// codes (scales 0) give a zero product for activations whose own codes would not.
    #[test]
    fn products_read_the_codes_an_activation_carries() {
        let dev = RocmDevice::new_cpu_executor(kernel_dsl::host::WaveSize::W32);
        let d = dev.as_candle();
        let (rows, cols, batch) = (8usize, 64usize, 2usize);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect();
        let mm = QMatMul::from_qtensor(QTensor::quantize(&Tensor::from_vec(w, (rows, cols), &d).unwrap(), GgmlDType::Q8_0).unwrap()).unwrap();
        let x: Vec<f32> = (0..batch * cols).map(|i| 1.0 + (i % 5) as f32).collect();
        let kd = dev.kernels();
        let buf = Buf::F32(kd.upload(&x).unwrap());
        let codes = Q8Codes { xq: kd.upload(&vec![0u32; batch * cols / 4]).unwrap(), xds: kd.upload(&vec![0f32; batch * cols / 16]).unwrap() };
        let s: candle_core::ExtStorage = Box::new(RocmStorage::with_q8(buf, dev.clone(), codes));
        let with = Tensor::from_storage(Storage::Ext(s), (batch, cols), candle_core::op::BackpropOp::none(), false);
        let y = mm.forward(&with).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "codes not read: {y:?}");
        let plain = mm.forward(&with.copy().unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(plain.iter().any(|v| *v != 0.0), "the product of the values themselves is not zero");
        // A write in place drops the codes: the product then quantizes the values.
        let with2 = with.clone();
        with2.slice_set(&Tensor::ones((1, cols), DType::F32, &d).unwrap(), 0, 0).unwrap();
        let after = mm.forward(&with2).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(after.iter().any(|v| *v != 0.0), "stale codes read after a write");
    }
}
