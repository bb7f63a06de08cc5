//! Fused ops of an LLM decode step on Candle tensors, one API on every device: on a
//! [`RocmDevice`] they run the `kernels::llm` kernels, on
//! `Device::Cpu` plain Candle ops (the sampler: the same kernel through the CPU executor on
//! host copies, so a key gives the same token there). Arguments are checked first; an
//! error names the argument and nothing is written.
//!
//! - [`linear`]: `x W^T + b` with the bias fused into the dense matvec for decode-sized
//!   inputs (at most 8 rows).
//! - [`add_rms_norm`]: residual add and RMSNorm in one kernel, both results returned.
//! - [`silu_mul`]: `SiLU(gate) * up` from one fused gate/up product.
//! - [`linear_silu_mul`]: the gate/up product and `SiLU(gate) * up` in one kernel for
//!   decode-sized inputs (a stacked `[gate; up]` weight).
//! - [`argmax`] and [`sample`]: a token per row of logits (greedy, or seeded with
//!   temperature, top-k, top-p, min-p and repetition penalty; [`SamplingParams`]).
use crate::buffer::{Buf, Region};
use crate::error::{at, invalid};
use crate::ops::float_dispatch;
use crate::{RocmDevice, RocmStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Module, Result, Shape, Storage, Tensor, D};
pub use kernels::llm::ops::SamplingParams;
/// Activation rows [`linear`] runs on the dense matvec (one launch); more take Candle's GEMM.
pub use kernels::llm::ops::MAX_ROWS;
use kernels::llm::SAMPLE_PARAMS;

/// Runs `f` on the buffer and layout of `t`, which must be on `dev` (a [`RocmDevice`]).
pub(crate) fn with_buf<R>(op: &'static str, arg: &str, t: &Tensor, f: impl FnOnce(&Buf, &candle_core::Layout) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Ext(e) => match e.as_any().downcast_ref::<RocmStorage>() {
            Some(r) => f(r.buf(), l),
            None => Err(invalid(op, format!("`{arg}` is not on a rocm-kernels device"))),
        },
        _ => Err(invalid(op, format!("`{arg}` is on {:?}, not on the device of the first argument", t.device().location()))),
    }
}

/// The contiguous elements of `t` (view `l` of `buf`) as a kernel argument.
pub(crate) fn region(op: &'static str, arg: &str, buf: &Buf, l: &candle_core::Layout) -> Result<Region> {
    if !l.is_contiguous() {
        return Err(invalid(op, format!("`{arg}` is not contiguous")));
    }
    buf.region(l.start_offset(), l.shape().elem_count())
}

/// A new tensor of `shape` on `dev` holding `buf`.
pub(crate) fn tensor(dev: &RocmDevice, buf: Buf, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Ext(dev.storage(buf)), shape, BackpropOp::none(), false)
}

/// Checks that `t` has `dtype` and lives on `dev`.
pub(crate) fn check_peer(op: &'static str, arg: &str, t: &Tensor, dtype: DType, dev: &Device) -> Result<()> {
    if t.dtype() != dtype {
        return Err(invalid(op, format!("`{arg}` is {:?}, expected {dtype:?}", t.dtype())));
    }
    if !t.device().same_device(dev) {
        return Err(invalid(op, format!("`{arg}` is on another device")));
    }
    Ok(())
}

/// Checks that `t` is a float type this module computes in.
pub(crate) fn check_float(op: &'static str, arg: &str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        d => Err(invalid(op, format!("`{arg}` is {d:?}; f32, f16 or bf16 expected"))),
    }
}

/// `x W^T (+ bias)` for `x` of shape `[.., k]`, a weight `w` of `[n, k]` (as `nn.Linear`
/// stores it) and an optional `bias` of `[n]`; the result has shape `[.., n]`. On a
/// [`RocmDevice`], inputs of at most 8 rows run the dense matvec with the bias added in
/// its epilogue (one kernel); larger inputs, and `Device::Cpu`, run Candle's `Linear`.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear";
    check_float(OP, "x", x)?;
    let dims = x.dims();
    let Some(&k) = dims.last() else {
        return Err(invalid(OP, "`x` is a scalar; [.., k] expected"));
    };
    check_peer(OP, "w", w, x.dtype(), x.device())?;
    let [n, wk] = *w.dims() else {
        return Err(invalid(OP, format!("`w` has shape {:?}; [n, k] expected", w.dims())));
    };
    if wk != k {
        return Err(invalid(OP, format!("`w` has shape {:?}; `x` has {k} features", w.dims())));
    }
    if let Some(b) = bias {
        check_peer(OP, "bias", b, x.dtype(), x.device())?;
        if b.dims() != [n] {
            return Err(invalid(OP, format!("`bias` has shape {:?}; [{n}] expected", b.dims())));
        }
    }
    let rows = x.elem_count().checked_div(k).unwrap_or(0);
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("x has a last dimension") = n;
    let Some(dev) = RocmDevice::from_candle(x.device()) else {
        return candle_nn::Linear::new(w.clone(), bias.cloned()).forward(x);
    };
    if rows == 0 || rows > kernels::llm::ops::MAX_ROWS || k == 0 || n == 0 {
        return candle_nn::Linear::new(w.clone(), bias.cloned()).forward(x);
    }
    let buf = matvec_on(OP, dev, (x, w, bias), (rows, n, k), false)?;
    Ok(tensor(dev, buf, out_dims))
}

/// `true` unless `CANDLE_ROCM_GATED_MATVEC=0` is in the environment (read once; the whole
/// process): whether [`linear_silu_mul`] may take the gated matvec (the switch of an A/B
/// against the separate product and `silu_mul`).
pub fn gated_matvec_allowed() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var("CANDLE_ROCM_GATED_MATVEC").is_ok_and(|v| v == "0"))
}

/// `SiLU(x Wg^T + bg) * (x Wu^T + bu)` for `x` of shape `[.., k]` and a stacked `[gate;
/// up]` weight `w` of `[2 I, k]` (gate rows first) with an optional `bias` of `[2 I]`;
/// the result is `[.., I]`. On a [`RocmDevice`], inputs of at most 8 rows where the
/// gated kernel is the faster form (`kernels::llm::ops::gated_matvec_preferred`: AMD GPUs,
/// one row on CUDA devices, the CPU executor) and [`gated_matvec_allowed`] run one kernel
/// (both products and the activation in `f32`, one rounding, no `[.., 2 I]` intermediate);
/// otherwise [`linear`] then [`silu_mul`] (which round the products first), and on
/// `Device::Cpu` Candle's ops.
pub fn linear_silu_mul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_silu_mul";
    check_float(OP, "x", x)?;
    let dims = x.dims();
    let Some(&k) = dims.last() else {
        return Err(invalid(OP, "`x` is a scalar; [.., k] expected"));
    };
    check_peer(OP, "w", w, x.dtype(), x.device())?;
    let [n, wk] = *w.dims() else {
        return Err(invalid(OP, format!("`w` has shape {:?}; [2 I, k] expected", w.dims())));
    };
    if wk != k || n % 2 != 0 || n == 0 {
        return Err(invalid(OP, format!("`w` has shape {:?}; [2 I, {k}] (a positive even row count) expected", w.dims())));
    }
    if let Some(b) = bias {
        check_peer(OP, "bias", b, x.dtype(), x.device())?;
        if b.dims() != [n] {
            return Err(invalid(OP, format!("`bias` has shape {:?}; [{n}] expected", b.dims())));
        }
    }
    let (rows, inter) = (x.elem_count().checked_div(k).unwrap_or(0), n / 2);
    let gated = |d: &RocmDevice| rows > 0 && k > 0 && gated_matvec_allowed() && kernels::llm::ops::gated_matvec_preferred(d.kernels(), rows);
    let Some(dev) = RocmDevice::from_candle(x.device()).filter(|d| gated(d)) else {
        return silu_mul(&linear(x, w, bias)?);
    };
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("x has a last dimension") = inter;
    let buf = matvec_on(OP, dev, (x, w, bias), (rows, inter, k), true)?;
    Ok(tensor(dev, buf, out_dims))
}

/// The matvec of [`linear`] (`gated`: false; `outputs` = n) or [`linear_silu_mul`]
/// (true; `outputs` = I) on `dev`, for checked operands: `rows` activation rows of `k`.
fn matvec_on(op: &'static str, dev: &RocmDevice, (x, w, bias): (&Tensor, &Tensor, Option<&Tensor>), (rows, outputs, k): (usize, usize, usize), gated: bool) -> Result<Buf> {
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    let bias = bias.map(|b| b.contiguous()).transpose()?;
    let kd = dev.kernels();
    with_buf(op, "x", &x, |xb, xl| {
        with_buf(op, "w", &w, |wb, wl| {
            let (xr, wr) = (region(op, "x", xb, xl)?, region(op, "w", wb, wl)?);
            let run = |br: Option<Region>| -> Result<Buf> {
                float_dispatch!(x.dtype(), op, T => {
                    let mut y = crate::ops::alloc::<T>(kd, rows * outputs, op)?;
                    let b = br.as_ref().map(|r| r as &dyn kernel_dsl::host::KernelArgSlice<T>);
                    let launched = if gated {
                        kernels::llm::ops::dense_matvec_gated::<T>(kd, &wr, &xr, b, &mut y, outputs, k, rows)
                    } else {
                        kernels::llm::ops::dense_matvec::<T>(kd, &wr, &xr, b, &mut y, outputs, k, rows)
                    };
                    launched.map_err(at(op))?;
                    Ok(crate::buffer::BufElem::wrap(y))
                })
            };
            match &bias {
                Some(b) => with_buf(op, "bias", b, |bb, bl| run(Some(region(op, "bias", bb, bl)?))),
                None => run(None),
            }
        })
    })
}

/// Residual add and RMSNorm: `h = x + residual`, `normed = h / sqrt(mean(h^2) + eps) *
/// weight` over the last dimension; returns `(h, normed)` (the new residual stream and the
/// next block's input). `x` and `residual` have the same shape and dtype, `weight` is
/// `[hidden]`. One kernel on a [`RocmDevice`]; `Device::Cpu`: Candle's add and candle-nn's
/// `rms_norm`.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    const OP: &str = "add_rms_norm";
    check_float(OP, "x", x)?;
    check_peer(OP, "residual", residual, x.dtype(), x.device())?;
    check_peer(OP, "weight", weight, x.dtype(), x.device())?;
    if residual.dims() != x.dims() {
        return Err(invalid(OP, format!("`residual` has shape {:?}, `x` {:?}", residual.dims(), x.dims())));
    }
    let Some(&cols) = x.dims().last() else {
        return Err(invalid(OP, "`x` is a scalar; [.., hidden] expected"));
    };
    if weight.dims() != [cols] {
        return Err(invalid(OP, format!("`weight` has shape {:?}; [{cols}] expected", weight.dims())));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(invalid(OP, format!("`eps` must be finite and >= 0, got {eps}")));
    }
    let Some(dev) = RocmDevice::from_candle(x.device()) else {
        let h = (x + residual)?;
        let normed = candle_nn::ops::rms_norm(&h, weight, eps as f32)?;
        return Ok((h, normed));
    };
    let (x, residual, weight) = (x.contiguous()?, residual.contiguous()?, weight.contiguous()?);
    let (kd, n, shape) = (dev.kernels(), x.elem_count(), x.shape().clone());
    let (h, o) = with_buf(OP, "x", &x, |xb, xl| {
        with_buf(OP, "residual", &residual, |rb, rl| {
            with_buf(OP, "weight", &weight, |wb, wl| {
                let (xr, rr, wr) = (region(OP, "x", xb, xl)?, region(OP, "residual", rb, rl)?, region(OP, "weight", wb, wl)?);
                float_dispatch!(x.dtype(), OP, T => {
                    let mut h = crate::ops::alloc::<T>(kd, n, OP)?;
                    let mut o = crate::ops::alloc::<T>(kd, n, OP)?;
                    if n > 0 {
                        kernels::llm::ops::add_rms_norm::<T>(kd, &xr, &rr, Some(&wr), &mut h, &mut o, cols, eps as f32).map_err(at(OP))?;
                    }
                    Ok((crate::buffer::BufElem::wrap(h), crate::buffer::BufElem::wrap(o)))
                })
            })
        })
    })?;
    Ok((tensor(dev, h, shape.clone()), tensor(dev, o, shape)))
}

/// A tensor holding `buf` whose storage carries the buffer's q8_1 codes.
fn tensor_q8(dev: &RocmDevice, buf: Buf, q8: crate::storage::Q8Codes, shape: impl Into<Shape>) -> Tensor {
    let s: candle_core::ExtStorage = Box::new(RocmStorage::with_q8(buf, dev.clone(), q8));
    Tensor::from_storage(Storage::Ext(s), shape, BackpropOp::none(), false)
}

/// [`add_rms_norm`] (`residual` given) or an RMSNorm of `x` (`residual` `None`) whose
/// normed output also carries its q8_1 codes, made by the same kernel
/// (`kernels::llm::ops::add_rms_norm_q8`): a GGUF product of up to
/// `kernels::quantized::ops::MAX_BATCH` rows on it (`QMatMul::forward`) runs the int8
/// matvec on them with no quantization launch of its own. Returns `(h, normed)` (`h` is `x`
/// without a residual). Where the fused kernel does not apply (another device, a width
/// that is no multiple of 32, rows too long for its tiles, unaligned views) the result is
/// the plain ops' and carries no codes.
pub fn add_rms_norm_q8(x: &Tensor, residual: Option<&Tensor>, weight: &Tensor, eps: f64) -> Result<(Tensor, Tensor)> {
    const OP: &str = "add_rms_norm_q8";
    let plain = |x: &Tensor| -> Result<(Tensor, Tensor)> {
        match residual {
            Some(r) => add_rms_norm(x, r, weight, eps),
            None => Ok((x.clone(), candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32)?)),
        }
    };
    let cols = x.dims().last().copied().unwrap_or(0);
    let Some(dev) = RocmDevice::from_candle(x.device()) else { return plain(x) };
    if cols == 0 || cols % 32 != 0 || weight.dims() != [cols] || residual.is_some_and(|r| r.dims() != x.dims()) || !(eps.is_finite() && eps >= 0.0) {
        return plain(x);
    }
    check_float(OP, "x", x)?;
    if let Some(r) = residual {
        check_peer(OP, "residual", r, x.dtype(), x.device())?;
    }
    check_peer(OP, "weight", weight, x.dtype(), x.device())?;
    let (x, weight) = (x.contiguous()?, weight.contiguous()?);
    let residual = residual.map(|r| r.contiguous()).transpose()?;
    let (kd, n, shape) = (dev.kernels(), x.elem_count(), x.shape().clone());
    if n == 0 {
        return plain(&x);
    }
    type Made = Option<(Option<Buf>, Buf, crate::storage::Q8Codes)>;
    let made: Made = with_buf(OP, "x", &x, |xb, xl| {
        with_buf(OP, "weight", &weight, |wb, wl| {
            let (xr, wr) = (region(OP, "x", xb, xl)?, region(OP, "weight", wb, wl)?);
            let run = |rr: Option<&Region>| -> Result<Made> {
                float_dispatch!(x.dtype(), OP, T => {
                    let mut h = match rr {
                        Some(_) => Some(crate::ops::alloc::<T>(kd, n, OP)?),
                        None => None,
                    };
                    let mut o = crate::ops::alloc::<T>(kd, n, OP)?;
                    let (mut xq, mut xds) = (crate::ops::alloc::<u32>(kd, n / 4, OP)?, crate::ops::alloc::<f32>(kd, n / 16, OP)?);
                    let rr = rr.map(|r| r as &dyn kernel_dsl::host::KernelArgSlice<T>);
                    let hm = h.as_mut().map(|h| h as &mut dyn kernel_dsl::host::KernelArgSliceMut<T>);
                    let done = kernels::llm::ops::add_rms_norm_q8::<T>(kd, &xr, rr, Some(&wr), hm, &mut o, &mut xq, &mut xds, cols, eps as f32).map_err(at(OP))?;
                    Ok(done.then(|| (h.map(crate::buffer::BufElem::wrap), crate::buffer::BufElem::wrap(o), crate::storage::Q8Codes { xq, xds })))
                })
            };
            match &residual {
                Some(r) => with_buf(OP, "residual", r, |rb, rl| run(Some(&region(OP, "residual", rb, rl)?))),
                None => run(None),
            }
        })
    })?;
    let Some((h, o, q8)) = made else { return plain(&x) };
    let h = match h {
        Some(h) => tensor(dev, h, shape.clone()),
        None => x,
    };
    Ok((h, tensor_q8(dev, o, q8, shape)))
}

/// [`silu_mul`] whose result also carries its q8_1 codes, made by the same kernel
/// (`kernels::llm::ops::silu_mul_q8`), for the down product's int8 matvec (see
/// [`add_rms_norm_q8`]). Elsewhere, or where `I` is no multiple of 32, [`silu_mul`].
pub fn silu_mul_q8(gate_up: &Tensor) -> Result<Tensor> {
    const OP: &str = "silu_mul_q8";
    let two_i = gate_up.dims().last().copied().unwrap_or(0);
    let Some(dev) = RocmDevice::from_candle(gate_up.device()) else { return silu_mul(gate_up) };
    if two_i == 0 || two_i % 64 != 0 || gate_up.elem_count() == 0 {
        return silu_mul(gate_up);
    }
    check_float(OP, "gate_up", gate_up)?;
    let inter = two_i / 2;
    let mut out_dims = gate_up.dims().to_vec();
    *out_dims.last_mut().expect("checked non-empty") = inter;
    let gu = gate_up.contiguous()?;
    let (kd, n) = (dev.kernels(), gu.elem_count() / 2);
    let (buf, q8) = with_buf(OP, "gate_up", &gu, |gb, gl| {
        let gr = region(OP, "gate_up", gb, gl)?;
        float_dispatch!(gu.dtype(), OP, T => {
            let mut o = crate::ops::alloc::<T>(kd, n, OP)?;
            let (mut xq, mut xds) = (crate::ops::alloc::<u32>(kd, n / 4, OP)?, crate::ops::alloc::<f32>(kd, n / 16, OP)?);
            kernels::llm::ops::silu_mul_q8::<T>(kd, &gr, &mut o, &mut xq, &mut xds, inter).map_err(at(OP))?;
            Ok((crate::buffer::BufElem::wrap(o), crate::storage::Q8Codes { xq, xds }))
        })
    })?;
    Ok(tensor_q8(dev, buf, q8, out_dims))
}

/// `SiLU(gate) * up` for `gate_up` of shape `[.., 2 I]` holding `gate` in its first `I`
/// columns and `up` in the last `I` (one fused gate/up product); the result is `[.., I]`.
/// One kernel on a [`RocmDevice`]; `Device::Cpu`: Candle's `silu` and `mul`.
pub fn silu_mul(gate_up: &Tensor) -> Result<Tensor> {
    const OP: &str = "silu_mul";
    check_float(OP, "gate_up", gate_up)?;
    let dims = gate_up.dims();
    let two_i = dims.last().copied().unwrap_or(0);
    if dims.is_empty() || two_i % 2 != 0 || two_i == 0 {
        return Err(invalid(OP, format!("`gate_up` has shape {dims:?}; a positive even last dimension expected")));
    }
    let inter = two_i / 2;
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("checked non-empty") = inter;
    let Some(dev) = RocmDevice::from_candle(gate_up.device()) else {
        let gate = gate_up.narrow(D::Minus1, 0, inter)?;
        let up = gate_up.narrow(D::Minus1, inter, inter)?;
        return gate.silu()? * up;
    };
    let gu = gate_up.contiguous()?;
    let (kd, n) = (dev.kernels(), gu.elem_count() / 2);
    let buf = with_buf(OP, "gate_up", &gu, |gb, gl| {
        let gr = region(OP, "gate_up", gb, gl)?;
        float_dispatch!(gu.dtype(), OP, T => {
            let mut o = crate::ops::alloc::<T>(kd, n, OP)?;
            if n > 0 {
                kernels::llm::ops::silu_mul::<T>(kd, &gr, &mut o, inter).map_err(at(OP))?;
            }
            Ok(crate::buffer::BufElem::wrap(o))
        })
    })?;
    Ok(tensor(dev, buf, out_dims))
}

/// The index of the largest value in each row of `logits` (`[.., vocab]`; the first of
/// equal ones), as `u32` of shape `[..]`: Candle's `argmax` over the last dimension (the
/// backend's reduction kernel on a [`RocmDevice`]).
pub fn argmax(logits: &Tensor) -> Result<Tensor> {
    if logits.dims().is_empty() {
        return Err(invalid("argmax", "`logits` is a scalar; [.., vocab] expected"));
    }
    logits.argmax(D::Minus1)
}

/// The per-row parameters of [`sample`] as a tensor on `device` (`f32`, `[rows, 5]`),
/// each row checked ([`SamplingParams::check`]; an error names the row). Keep it across
/// steps where the parameters do not change.
pub fn sampling_params(params: &[SamplingParams], device: &Device) -> Result<Tensor> {
    let packed = kernels::llm::ops::check_sampling_params(params).map_err(at("sampling_params"))?;
    Tensor::from_vec(packed, (params.len(), SAMPLE_PARAMS), device)
}

/// Philox keys of [`sample`] (`u32`, `[rows, 2]`): row `r` gets `(seeds[r], steps[r])`, so
/// a request's seed and its step give each draw its own stream.
pub fn sampling_keys(seeds: &[u32], steps: &[u32], device: &Device) -> Result<Tensor> {
    if seeds.len() != steps.len() {
        return Err(invalid("sampling_keys", format!("`steps` has {} values, `seeds` {}", steps.len(), seeds.len())));
    }
    let keys: Vec<u32> = seeds.iter().zip(steps).flat_map(|(a, b)| [*a, *b]).collect();
    Tensor::from_vec(keys, (seeds.len(), 2), device)
}

/// One token per row of `logits` (`[rows, vocab]`, f32/f16/bf16) as `u32` `[rows]`:
/// repetition penalty on `penalized` (`u32` `[rows, n]` token ids; ids `>= vocab` are
/// padding; `None`: no ids), temperature, top-k, top-p, min-p (`params` from
/// [`sampling_params`]), then a draw keyed by `keys` (`u32` `[rows, 2]`, e.g.
/// [`sampling_keys`]): the same logits and key give the same token. A temperature of 0 is
/// greedy. The semantics are those of `kernels::llm::sample` (Hugging Face's order of the
/// filters, Gumbel-max draws from Philox4x32-10); every device runs that kernel (the CPU
/// through the CPU executor on host copies).
pub fn sample(logits: &Tensor, params: &Tensor, penalized: Option<&Tensor>, keys: &Tensor) -> Result<Tensor> {
    const OP: &str = "sample";
    check_float(OP, "logits", logits)?;
    let [rows, vocab] = *logits.dims() else {
        return Err(invalid(OP, format!("`logits` has shape {:?}; [rows, vocab] expected", logits.dims())));
    };
    let dev = logits.device();
    check_peer(OP, "params", params, DType::F32, dev)?;
    if params.dims() != [rows, SAMPLE_PARAMS] {
        return Err(invalid(OP, format!("`params` has shape {:?}; [{rows}, {SAMPLE_PARAMS}] expected", params.dims())));
    }
    check_peer(OP, "keys", keys, DType::U32, dev)?;
    if keys.dims() != [rows, 2] {
        return Err(invalid(OP, format!("`keys` has shape {:?}; [{rows}, 2] expected", keys.dims())));
    }
    let empty = Tensor::zeros((rows, 0), DType::U32, dev)?;
    let pen = penalized.unwrap_or(&empty);
    check_peer(OP, "penalized", pen, DType::U32, dev)?;
    if pen.rank() != 2 || pen.dims()[0] != rows {
        return Err(invalid(OP, format!("`penalized` has shape {:?}; [{rows}, n] expected", pen.dims())));
    }
    if vocab == 0 {
        return Err(invalid(OP, "`logits` has a vocabulary of 0"));
    }
    let Some(rd) = RocmDevice::from_candle(dev) else {
        return sample_on_host(logits, params, pen, keys, vocab);
    };
    let (logits, params, pen, keys) = (logits.contiguous()?, params.contiguous()?, pen.contiguous()?, keys.contiguous()?);
    let kd = rd.kernels();
    let buf = with_buf(OP, "logits", &logits, |lb, ll| {
        with_buf(OP, "params", &params, |pb, pl| {
            with_buf(OP, "penalized", &pen, |nb, nl| {
                with_buf(OP, "keys", &keys, |kb, kl| {
                    let (lr, pr) = (region(OP, "logits", lb, ll)?, region(OP, "params", pb, pl)?);
                    let (nr, kr) = (region(OP, "penalized", nb, nl)?, region(OP, "keys", kb, kl)?);
                    let mut out = crate::ops::alloc::<u32>(kd, rows, OP)?;
                    let mut work = crate::ops::alloc::<f32>(kd, rows * vocab, OP)?;
                    float_dispatch!(logits.dtype(), OP, T => {
                        kernels::llm::ops::sample_packed::<T>(kd, &lr, &pr, &nr, &kr, &mut out, &mut work, vocab).map_err(at(OP))
                    })?;
                    Ok(Buf::U32(out))
                })
            })
        })
    })?;
    Ok(tensor(rd, buf, rows))
}

/// [`sample`] on host tensors: the same kernel through the CPU executor on host copies.
fn sample_on_host(logits: &Tensor, params: &Tensor, pen: &Tensor, keys: &Tensor, vocab: usize) -> Result<Tensor> {
    const OP: &str = "sample";
    let rows = logits.dims()[0];
    let p: Vec<f32> = params.flatten_all()?.to_vec1()?;
    kernels::llm::ops::check_packed_params(&p).map_err(at(OP))?;
    let n: Vec<u32> = pen.flatten_all()?.to_vec1()?;
    let k: Vec<u32> = keys.flatten_all()?.to_vec1()?;
    let exec = kernel_dsl::host::CpuExecutor::new(kernel_dsl::host::WaveSize::W32);
    let mut out = vec![0u32; rows];
    let mut work = vec![0f32; rows * vocab];
    let flat = logits.flatten_all()?;
    match logits.dtype() {
        DType::F32 => kernels::llm::ops::sample_packed(&exec, &flat.to_vec1::<f32>()?, &p, &n, &k, &mut out, &mut work, vocab),
        DType::F16 => kernels::llm::ops::sample_packed(&exec, &flat.to_vec1::<half::f16>()?, &p, &n, &k, &mut out, &mut work, vocab),
        DType::BF16 => kernels::llm::ops::sample_packed(&exec, &flat.to_vec1::<half::bf16>()?, &p, &n, &k, &mut out, &mut work, vocab),
        d => return Err(crate::error::unsupported(OP, d)),
    }
    .map_err(at(OP))?;
    Tensor::from_vec(out, rows, logits.device())
}
