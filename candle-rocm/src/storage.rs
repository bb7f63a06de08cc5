//! [`RocmStorage`]: a tensor buffer on a [`RocmDevice`], implementing Candle's external
//! storage trait by dispatching to [`crate::ops`].
use crate::buffer::Buf;
use crate::device::RocmDevice;
use crate::error::invalid;
use crate::ops;
use candle_core::conv::{ParamsConv1D, ParamsConv2D, ParamsConvTranspose1D, ParamsConvTranspose2D};
use candle_core::ext_backend::{ExtBackendStorage, ExtDevice, ExtStorage};
use candle_core::op::{CmpOp, ReduceOp};
use candle_core::{CpuStorage, DType, FusedOp, Layout, Result, Shape};
use kernels::runtime::DeviceVec;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

/// The q8_1 codes of a whole buffer (`kernels::quantized::ops::quantize_q8_1`'s layout:
/// `len / 4` code words, `len / 16` `(d, d * sum)` floats), written by the kernel that
/// wrote the buffer (`crate::llm_ops::add_rms_norm_q8`, `crate::llm_ops::silu_mul_q8`):
/// the int8 matvec of a GGUF product on the buffer reads them instead of quantizing it.
pub struct Q8Codes {
    pub(crate) xq: DeviceVec<u32>,
    pub(crate) xds: DeviceVec<f32>,
}

/// A buffer of one dtype on a [`RocmDevice`].
pub struct RocmStorage {
    buf: Buf,
    device: RocmDevice,
    /// The buffer's q8_1 codes, where the kernel that wrote it made them; dropped by every
    /// write to the buffer in place (they describe the values as written).
    q8: Option<Q8Codes>,
}

impl RocmStorage {
    pub(crate) fn new(buf: Buf, device: RocmDevice) -> Self {
        RocmStorage { buf, device, q8: None }
    }

    /// A storage whose buffer `buf` comes with its q8_1 codes.
    pub(crate) fn with_q8(buf: Buf, device: RocmDevice, q8: Q8Codes) -> Self {
        RocmStorage { buf, device, q8: Some(q8) }
    }

    /// The typed device buffer.
    pub fn buf(&self) -> &Buf {
        &self.buf
    }

    /// The q8_1 codes of the whole buffer, where they were made with it.
    pub fn q8_codes(&self) -> Option<&Q8Codes> {
        self.q8.as_ref()
    }

    /// The typed device buffer, for kernels that write a tensor in place (KV caches); the
    /// codes, if any, no longer hold.
    pub(crate) fn buf_mut(&mut self) -> &mut Buf {
        self.q8 = None;
        &mut self.buf
    }

    /// The device holding this buffer.
    pub fn rocm_device(&self) -> &RocmDevice {
        &self.device
    }

    fn dev(&self) -> &kernels::runtime::Device {
        self.device.kernels()
    }

    fn wrap(&self, buf: Buf) -> ExtStorage {
        self.device.storage(buf)
    }

    /// Runs the op `f` producing a new buffer, profiled as `op` on this buffer's dtype.
    fn run(&self, op: impl FnOnce() -> Cow<'static, str>, f: impl FnOnce() -> Result<Buf>) -> Result<ExtStorage> {
        Ok(self.wrap(self.device.profiled(op, self.buf.dtype(), f)?))
    }
}

/// A profile name `"{kind}.{detail}"`, built only when profiling.
fn named(kind: &str, detail: impl std::fmt::Debug) -> Cow<'static, str> {
    Cow::Owned(format!("{kind}.{detail:?}").to_lowercase())
}

/// The `RocmStorage` behind another operand of an op on this backend.
fn peer<'a>(s: &'a ExtStorage, op: &'static str) -> Result<&'a RocmStorage> {
    s.as_any().downcast_ref::<RocmStorage>().ok_or_else(|| invalid(op, "operand is not on a rocm-kernels device"))
}

/// The `RocmStorage` behind an operand written in place: its q8_1 codes no longer hold.
fn peer_mut<'a>(s: &'a mut ExtStorage, op: &'static str) -> Result<&'a mut RocmStorage> {
    let r = s.as_any_mut().downcast_mut::<RocmStorage>().ok_or_else(|| invalid(op, "operand is not on a rocm-kernels device"))?;
    r.q8 = None;
    Ok(r)
}

impl std::fmt::Debug for RocmStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocmStorage({:?}, {} elements, {})", self.buf.dtype(), self.buf.len(), self.device.name())
    }
}

impl ExtBackendStorage for RocmStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        // A mutable view may write the buffer: its codes no longer hold.
        self.q8 = None;
        self
    }

    fn try_clone(&self, l: &Layout) -> Result<ExtStorage> {
        // The whole buffer, as Candle's backends do (the layout keeps addressing it).
        let _ = l;
        self.run(
            || "try_clone".into(),
            || {
                let mut copy = Buf::uninit(self.dev(), self.buf.dtype(), self.buf.len())?;
                let all = Layout::contiguous(self.buf.len());
                ops::elementwise::copy_strided(self.dev(), &self.buf, &all, &mut copy, 0)?;
                Ok(copy)
            },
        )
    }

    fn dtype(&self) -> DType {
        self.buf.dtype()
    }

    fn device(&self) -> ExtDevice {
        Arc::new(self.device.clone())
    }

    fn to_cpu_storage(&self) -> Result<CpuStorage> {
        self.device.profiled(|| "download".into(), self.buf.dtype(), || self.buf.download(self.dev()))
    }

    fn affine(&self, l: &Layout, mul: f64, add: f64) -> Result<ExtStorage> {
        self.run(|| "affine".into(), || ops::elementwise::affine(self.dev(), &self.buf, l, mul, add))
    }

    fn powf(&self, l: &Layout, e: f64) -> Result<ExtStorage> {
        self.run(|| "powf".into(), || ops::elementwise::unary_param(self.dev(), &self.buf, l, e, "powf"))
    }

    fn elu(&self, l: &Layout, alpha: f64) -> Result<ExtStorage> {
        self.run(|| "elu".into(), || ops::elementwise::unary_param(self.dev(), &self.buf, l, alpha, "elu"))
    }

    fn reduce_op(&self, op: ReduceOp, l: &Layout, dims: &[usize]) -> Result<ExtStorage> {
        self.run(|| named("reduce", op), || ops::reduce::reduce(self.dev(), &self.buf, l, op, dims))
    }

    fn cmp(&self, op: CmpOp, rhs: &ExtStorage, l: &Layout, rl: &Layout) -> Result<ExtStorage> {
        let rhs = peer(rhs, "cmp")?;
        self.run(
            || {
                Cow::Borrowed(match op {
                    CmpOp::Eq => "cmp.eq",
                    CmpOp::Ne => "cmp.ne",
                    CmpOp::Le => "cmp.le",
                    CmpOp::Ge => "cmp.ge",
                    CmpOp::Lt => "cmp.lt",
                    CmpOp::Gt => "cmp.gt",
                })
            },
            || ops::any::cmp(self.dev(), op, &self.buf, l, &rhs.buf, rl))
    }

    fn to_dtype(&self, l: &Layout, dtype: DType) -> Result<ExtStorage> {
        self.run(|| named("to_dtype", dtype), || ops::elementwise::to_dtype(self.dev(), &self.buf, l, dtype))
    }

    fn unary(&self, op: &'static str, l: &Layout) -> Result<ExtStorage> {
        self.run(|| Cow::Owned(format!("unary.{op}")), || ops::elementwise::unary(self.dev(), &self.buf, l, op))
    }

    fn binary(&self, op: &'static str, rhs: &ExtStorage, l: &Layout, rl: &Layout) -> Result<ExtStorage> {
        let rhs = peer(rhs, op)?;
        self.run(|| Cow::Owned(format!("binary.{op}")), || ops::elementwise::binary(self.dev(), &self.buf, l, &rhs.buf, rl, op))
    }

    fn where_cond(&self, l: &Layout, t: &ExtStorage, tl: &Layout, f: &ExtStorage, fl: &Layout) -> Result<ExtStorage> {
        let (t, f) = (peer(t, "where_cond")?, peer(f, "where_cond")?);
        self.run(|| "where_cond".into(), || ops::indexing::where_cond(self.dev(), &self.buf, l, &t.buf, tl, &f.buf, fl))
    }

    fn conv1d(&self, l: &Layout, k: &ExtStorage, kl: &Layout, p: &ParamsConv1D) -> Result<ExtStorage> {
        let k = peer(k, "conv1d")?;
        self.run(|| "conv1d".into(), || ops::conv::conv1d(self.dev(), &self.buf, l, &k.buf, kl, p))
    }

    fn conv_transpose1d(&self, l: &Layout, k: &ExtStorage, kl: &Layout, p: &ParamsConvTranspose1D) -> Result<ExtStorage> {
        let k = peer(k, "conv_transpose1d")?;
        self.run(|| "conv_transpose1d".into(), || ops::conv::conv_transpose1d(self.dev(), &self.buf, l, &k.buf, kl, p))
    }

    fn conv2d(&self, l: &Layout, k: &ExtStorage, kl: &Layout, p: &ParamsConv2D) -> Result<ExtStorage> {
        let k = peer(k, "conv2d")?;
        // Profiled per shape: `conv2d.{k_h}x{k_w}s{stride}.{c_in}->{c_out}@{h}x{w}`, `.nc`
        // for an input that is not contiguous (a channels-last view).
        let name = || -> Cow<'static, str> {
            let nc = if l.is_contiguous() { "" } else { ".nc" };
            format!("conv2d.{}x{}s{}.{}->{}@{}x{}{nc}", p.k_h, p.k_w, p.stride, p.c_in, p.c_out, p.i_h, p.i_w).into()
        };
        self.run(name, || ops::conv::conv2d(self.dev(), &self.buf, l, &k.buf, kl, p))
    }

    fn conv_transpose2d(&self, l: &Layout, k: &ExtStorage, kl: &Layout, p: &ParamsConvTranspose2D) -> Result<ExtStorage> {
        let k = peer(k, "conv_transpose2d")?;
        self.run(|| "conv_transpose2d".into(), || ops::conv::conv_transpose2d(self.dev(), &self.buf, l, &k.buf, kl, p))
    }

    fn avg_pool2d(&self, l: &Layout, k: (usize, usize), s: (usize, usize)) -> Result<ExtStorage> {
        self.run(|| "avg_pool2d".into(), || ops::conv::avg_pool2d(self.dev(), &self.buf, l, k, s))
    }

    fn max_pool2d(&self, l: &Layout, k: (usize, usize), s: (usize, usize)) -> Result<ExtStorage> {
        self.run(|| "max_pool2d".into(), || ops::conv::max_pool2d(self.dev(), &self.buf, l, k, s))
    }

    fn upsample_nearest1d(&self, l: &Layout, sz: usize) -> Result<ExtStorage> {
        self.run(|| "upsample_nearest1d".into(), || ops::conv::upsample_nearest1d(self.dev(), &self.buf, l, sz))
    }

    fn upsample_nearest2d(&self, l: &Layout, h: usize, w: usize) -> Result<ExtStorage> {
        self.run(|| "upsample_nearest2d".into(), || ops::conv::upsample_nearest2d(self.dev(), &self.buf, l, h, w))
    }

    fn upsample_bilinear2d(&self, l: &Layout, h: usize, w: usize, align: bool, sh: Option<f64>, sw: Option<f64>) -> Result<ExtStorage> {
        self.run(|| "upsample_bilinear2d".into(), || ops::conv::upsample_bilinear2d(self.dev(), &self.buf, l, h, w, align, sh, sw))
    }

    fn gather(&self, l: &Layout, ids: &ExtStorage, il: &Layout, dim: usize) -> Result<ExtStorage> {
        let ids = peer(ids, "gather")?;
        self.run(|| "gather".into(), || ops::indexing::gather(self.dev(), &self.buf, l, &ids.buf, il, dim))
    }

    fn scatter_set(&mut self, l: &Layout, ids: &ExtStorage, il: &Layout, src: &ExtStorage, sl: &Layout, dim: usize) -> Result<()> {
        let (ids, src) = (peer(ids, "scatter_set")?, peer(src, "scatter_set")?);
        self.q8 = None;
        let (dev, dtype) = (self.device.clone(), self.buf.dtype());
        dev.profiled(|| "scatter_set".into(), dtype, || ops::indexing::scatter(dev.kernels(), &mut self.buf, l, &ids.buf, il, &src.buf, sl, dim, false))
    }

    fn scatter_add_set(&mut self, l: &Layout, ids: &ExtStorage, il: &Layout, src: &ExtStorage, sl: &Layout, dim: usize) -> Result<()> {
        let (ids, src) = (peer(ids, "scatter_add")?, peer(src, "scatter_add")?);
        self.q8 = None;
        let (dev, dtype) = (self.device.clone(), self.buf.dtype());
        dev.profiled(|| "scatter_add_set".into(), dtype, || ops::indexing::scatter(dev.kernels(), &mut self.buf, l, &ids.buf, il, &src.buf, sl, dim, true))
    }

    fn index_select(&self, ids: &ExtStorage, l: &Layout, il: &Layout, dim: usize) -> Result<ExtStorage> {
        let ids = peer(ids, "index_select")?;
        self.run(|| "index_select".into(), || ops::indexing::index_select(self.dev(), &self.buf, l, &ids.buf, il, dim))
    }

    fn index_add(&self, l: &Layout, ids: &ExtStorage, il: &Layout, src: &ExtStorage, sl: &Layout, dim: usize) -> Result<ExtStorage> {
        let (ids, src) = (peer(ids, "index_add")?, peer(src, "index_add")?);
        self.run(|| "index_add".into(), || ops::indexing::index_add(self.dev(), &self.buf, l, &ids.buf, il, &src.buf, sl, dim))
    }

    fn matmul(&self, rhs: &ExtStorage, bmnk: (usize, usize, usize, usize), l: &Layout, rl: &Layout) -> Result<ExtStorage> {
        let rhs = peer(rhs, "matmul")?;
        self.run(|| "matmul".into(), || ops::matmul::matmul(self.dev(), &self.buf, l, &rhs.buf, rl, bmnk))
    }

    fn copy_strided_src(&self, dst: &mut ExtStorage, dst_offset: usize, l: &Layout) -> Result<()> {
        let dst = peer_mut(dst, "copy_strided_src")?;
        self.device.profiled(|| "copy_strided".into(), self.buf.dtype(), || ops::elementwise::copy_strided(self.dev(), &self.buf, l, &mut dst.buf, dst_offset))
    }

    fn copy2d(&self, dst: &mut ExtStorage, d1: usize, d2: usize, ss: usize, ds: usize, so: usize, dso: usize) -> Result<()> {
        let dst = peer_mut(dst, "copy2d")?;
        self.device.profiled(|| "copy2d".into(), self.buf.dtype(), || ops::elementwise::copy2d(self.dev(), &self.buf, &mut dst.buf, d1, d2, ss, ds, so, dso))
    }

    fn const_set(&mut self, v: candle_core::scalar::Scalar, l: &Layout) -> Result<()> {
        self.q8 = None;
        let (dev, dtype) = (self.device.clone(), self.buf.dtype());
        dev.profiled(|| "const_set".into(), dtype, || ops::elementwise::const_set(dev.kernels(), &mut self.buf, l, v))
    }

    fn fused(&self, op: FusedOp, l: &Layout, rest: &[(&ExtStorage, &Layout)]) -> Result<Option<(ExtStorage, Shape)>> {
        let rest = rest.iter().map(|(s, l)| Ok((&peer(s, "fused op")?.buf, *l))).collect::<Result<Vec<_>>>()?;
        let name = || -> Cow<'static, str> {
            match op {
                FusedOp::SoftmaxLastDim => "fused.softmax_last_dim",
                FusedOp::Sigmoid => "fused.sigmoid",
                FusedOp::RmsNorm { .. } => "fused.rms_norm",
                FusedOp::LayerNorm { .. } => "fused.layer_norm",
                FusedOp::RopeI => "fused.rope_i",
                FusedOp::Rope => "fused.rope",
                FusedOp::RopeThd => "fused.rope_thd",
                FusedOp::GroupNorm { .. } => "fused.group_norm",
                FusedOp::GroupNormSilu { .. } => "fused.group_norm_silu",
                FusedOp::Attention { .. } => "fused.attention",
                _ => "fused.other",
            }
            .into()
        };
        let r = self.device.profiled(name, self.buf.dtype(), || ops::fused::fused(self.dev(), op, &self.buf, l, &rest))?;
        Ok(r.map(|(b, s)| (self.wrap(b), s)))
    }
}
