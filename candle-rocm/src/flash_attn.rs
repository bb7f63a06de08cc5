//! The `candle-flash-attn` API (Candle 0.11) on this backend: the same functions, argument
//! order, tensor layouts and semantics, running [`attention::flash_attn`] and
//! [`attention::flash_attn_varlen`], so a model written for `candle-flash-attn` switches
//! by changing one import:
//!
//! ```text
//! - use candle_flash_attn::{flash_attn, flash_attn_varlen};
//! + use candle_rocm::flash_attn::{flash_attn, flash_attn_varlen};
//! ```
//!
//! - `q [batch, seq_q, heads, head_dim]`, `k`, `v [batch, seq_k, kv_heads, head_dim]`
//!   (`kv_heads` divides `heads`: grouped-query and multi-query attention), result like
//!   `q`; varlen: `q [total_q, heads, head_dim]`, `k`, `v [total_k, kv_heads, head_dim]`
//!   with the cumulative offsets `seqlens_q`, `seqlens_k` (`u32`, `batch + 1` entries).
//! - f16 or bf16 (f32 accumulation); head dims 64, 80, 96, 128, 256.
//! - `causal`: query row `i` sees keys up to `i + seq_k - seq_q` (bottom-right aligned);
//!   windows as in candle-flash-attn (`None`: unbounded; a window larger than `seq_k`
//!   (varlen: `max_seqlen_k`) is unbounded; `(None, Some(0))` is causal); ALiBi slopes
//!   f32 `[heads]` (or `[batch, heads]`); `softcap > 0` caps the scaled scores
//!   (`softcap * tanh(s / softcap)`), 0 turns it off.
//! - A query row that sees no key gets zeros (candle-flash-attn leaves such rows
//!   undefined).
//!
//! Inputs may be strided or offset views: they are gathered into contiguous buffers on
//! the device first. Shape, dtype, head-dim, device and layout errors are Candle errors
//! naming the argument; nothing is computed then.
//!
//! On `Device::Cpu` the same functions compute the same result with Candle ops (f32
//! `matmul`, masked softmax, f32 accumulation), so callers have one API on every device.
//! `candle-flash-attn` has no variant returning the log-sum-exp; [`flash_attn_lse`] and
//! [`flash_attn_varlen_lse`] are this crate's extension that does. Not provided:
//! `flash_attn_varlen_paged_windowed` (paged KV in prefill); see [`crate::paged`] for
//! decode over a paged cache.
use crate::device::RocmDevice;
use crate::error::invalid;
use crate::tensor_access::{dims_n, dtype_is, host_u32, input, output, rocm_device, same_device};
use attention::{AttentionError, FlashElem, FlashOptions, FlashShape, VarlenShape};
use candle_core::{DType, Device, Result, Tensor, D};
use half::{bf16, f16};

/// The options of one call, as candle-flash-attn's `FlashAttn` holds them.
#[derive(Clone, Copy)]
struct Params<'a> {
    scale: f32,
    alibi: Option<&'a Tensor>,
    left: Option<usize>,
    right: Option<usize>,
    softcap: Option<f32>,
}

impl<'a> Params<'a> {
    fn new(scale: f32, alibi: Option<&'a Tensor>, left: Option<usize>, right: Option<usize>, softcap: Option<f32>) -> Self {
        Params { scale, alibi, left, right, softcap }
    }
    fn causal(scale: f32, alibi: Option<&'a Tensor>, causal: bool) -> Self {
        Params::new(scale, alibi, None, causal.then_some(0), None)
    }
}

/// The window bounds candle-flash-attn hands its kernel: a window longer than `seq_k` is
/// unbounded, and a one-sided window gets `seq_k` on its other side.
fn normalised_windows(left: Option<usize>, right: Option<usize>, seq_k: usize) -> (Option<usize>, Option<usize>) {
    let (l, r) = (left.filter(|&w| w <= seq_k), right.filter(|&w| w <= seq_k));
    match (l, r) {
        (None, Some(r)) => (Some(seq_k), Some(r)),
        (Some(l), None) => (Some(l), Some(seq_k)),
        lr => lr,
    }
}

fn softcap_of(op: &str, c: Option<f32>) -> Result<Option<f32>> {
    match c {
        Some(c) if c.is_nan() || c < 0.0 || c.is_infinite() => Err(invalid(op, format!("argument `softcap`: {c} is not a finite number >= 0"))),
        Some(c) if c > 0.0 => Ok(Some(c)),
        _ => Ok(None),
    }
}

fn err(op: &str, e: AttentionError) -> candle_core::Error {
    match e {
        AttentionError::HeadDim(_) => invalid(op, format!("argument `q`: {e}")),
        e => invalid(op, e),
    }
}

/// The checks every entry point shares: q/k/v dtypes and devices, alibi slopes.
fn common_checks(op: &str, q: &Tensor, k: &Tensor, v: &Tensor, p: &Params<'_>, batch: usize, heads: usize) -> Result<()> {
    if !matches!(q.dtype(), DType::F16 | DType::BF16) {
        return Err(invalid(op, format!("argument `q` has dtype {:?}; expected f16 or bf16", q.dtype())));
    }
    dtype_is(op, "k", k, q.dtype())?;
    dtype_is(op, "v", v, q.dtype())?;
    same_device(op, "k", k, q.device())?;
    same_device(op, "v", v, q.device())?;
    if !matches!(q.device(), Device::Cpu) {
        rocm_device(op, "q", q)?;
    }
    if let Some(a) = p.alibi {
        dtype_is(op, "alibi_slopes", a, DType::F32)?;
        same_device(op, "alibi_slopes", a, q.device())?;
        if a.dims() != [heads] && a.dims() != [batch, heads] {
            return Err(invalid(op, format!("argument `alibi_slopes` has shape {:?}; expected [{heads}] or [{batch}, {heads}]", a.shape())));
        }
    }
    Ok(())
}

fn fixed(op: &str, q: &Tensor, k: &Tensor, v: &Tensor, p: Params<'_>) -> Result<(Tensor, Tensor)> {
    let what = "[batch, seq, heads, head_dim]";
    let (b, sq, h, d) = match dims_n(op, "q", q, 4, what)? {
        &[b, s, h, d] => (b, s, h, d),
        _ => unreachable!("rank checked"),
    };
    let kd = dims_n(op, "k", k, 4, what)?;
    let (sk, hk) = (kd[1], kd[2]);
    if kd[0] != b || kd[3] != d {
        return Err(invalid(op, format!("argument `k` has shape {:?}; q {:?} needs [{b}, seq_k, kv_heads, {d}]", k.shape(), q.shape())));
    }
    if v.dims() != kd {
        return Err(invalid(op, format!("argument `v` has shape {:?}; expected k's {:?}", v.shape(), k.shape())));
    }
    if hk == 0 || h % hk != 0 {
        return Err(invalid(op, format!("argument `k`: {hk} key/value heads do not divide {h} query heads")));
    }
    common_checks(op, q, k, v, &p, b, h)?;
    let softcap = softcap_of(op, p.softcap)?;
    let (left, right) = normalised_windows(p.left, p.right, sk);
    let p = Params { left, right, softcap, ..p };
    if matches!(q.device(), Device::Cpu) {
        return cpu_fixed(q, k, v, &p, p.alibi);
    }
    let dev = rocm_device(op, "q", q)?;
    let shape = FlashShape { batch: b, seq_q: sq, seq_k: sk, heads: h, kv_heads: hk, head_dim: d };
    dev.profiled(
        || "flash_attn".into(),
        q.dtype(),
        || match q.dtype() {
            DType::F16 => fixed_on::<f16>(op, dev, shape, q, k, v, &p),
            _ => fixed_on::<bf16>(op, dev, shape, q, k, v, &p),
        },
    )
}

fn fixed_on<T: FlashElem + crate::buffer::BufElem>(
    op: &str,
    dev: &RocmDevice,
    shape: FlashShape,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &Params<'_>,
) -> Result<(Tensor, Tensor)> {
    let FlashShape { batch, seq_q, heads, head_dim, .. } = shape;
    let ((qs, ql), (ks, kl), (vs, vl)) = (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout());
    let (qi, ki, vi) = (input::<T>(op, "q", dev, &qs, ql)?, input::<T>(op, "k", dev, &ks, kl)?, input::<T>(op, "v", dev, &vs, vl)?);
    let alibi_guard = p.alibi.map(|a| a.storage_and_layout());
    let alibi = match &alibi_guard {
        Some((s, l)) => Some(input::<f32>(op, "alibi_slopes", dev, s, l)?),
        None => None,
    };
    let opts = options(p, alibi.as_deref());
    let kd = dev.kernels();
    let n = batch * seq_q * heads * head_dim;
    let mut out = kd.alloc_uninit::<T>(n).map_err(crate::error::at("flash_attn"))?;
    let mut lse = kd.alloc_uninit::<f32>(batch * heads * seq_q).map_err(crate::error::at("flash_attn"))?;
    attention::flash_attn(kd, shape, &qi, &ki, &vi, &mut out, &mut lse, &opts).map_err(|e| err(op, e))?;
    Ok((output(dev, out, (batch, seq_q, heads, head_dim)), output(dev, lse, (batch, heads, seq_q))))
}

fn options<'a>(p: &Params<'_>, alibi: Option<&'a kernels::runtime::DeviceVec<f32>>) -> FlashOptions<'a> {
    FlashOptions { scale: p.scale, causal: false, window_left: p.left, window_right: p.right, softcap: p.softcap, alibi_slopes: alibi }
}

struct Lens<'a> {
    offsets: Offsets<'a>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
}

/// The cumulative offsets of a varlen call: `u32` tensors (candle-flash-attn's API; read
/// back to the host, a device sync) or host values the caller already has.
enum Offsets<'a> {
    Tensors(&'a Tensor, &'a Tensor),
    Host(&'a [u32], &'a [u32]),
}

fn varlen(op: &str, q: &Tensor, k: &Tensor, v: &Tensor, lens: Lens<'_>, p: Params<'_>) -> Result<(Tensor, Tensor)> {
    let what = "[total, heads, head_dim]";
    let (tq, h, d) = match dims_n(op, "q", q, 3, what)? {
        &[t, h, d] => (t, h, d),
        _ => unreachable!("rank checked"),
    };
    let kd = dims_n(op, "k", k, 3, what)?;
    let (tk, hk) = (kd[0], kd[1]);
    if kd[2] != d {
        return Err(invalid(op, format!("argument `k` has shape {:?}; q {:?} needs [total_k, kv_heads, {d}]", k.shape(), q.shape())));
    }
    if v.dims() != kd {
        return Err(invalid(op, format!("argument `v` has shape {:?}; expected k's {:?}", v.shape(), k.shape())));
    }
    if hk == 0 || h % hk != 0 {
        return Err(invalid(op, format!("argument `k`: {hk} key/value heads do not divide {h} query heads")));
    }
    let (cq, ck) = match lens.offsets {
        Offsets::Tensors(sq, sk) => {
            for (name, s) in [("seqlens_q", sq), ("seqlens_k", sk)] {
                dims_n(op, name, s, 1, "[batch + 1]")?;
                dtype_is(op, name, s, DType::U32)?;
            }
            (host_u32(op, "seqlens_q", sq)?, host_u32(op, "seqlens_k", sk)?)
        }
        Offsets::Host(sq, sk) => (sq.to_vec(), sk.to_vec()),
    };
    if cq.len() < 2 || ck.len() != cq.len() {
        return Err(invalid(op, format!("arguments `seqlens_q`, `seqlens_k` have {} and {} offsets; expected batch + 1 >= 2 each", cq.len(), ck.len())));
    }
    let batch = cq.len() - 1;
    let sides = [("seqlens_q", "max_seqlen_q", &cq, tq, lens.max_seqlen_q), ("seqlens_k", "max_seqlen_k", &ck, tk, lens.max_seqlen_k)];
    for (name, max_name, cu, total, max) in sides {
        if cu[0] != 0 || cu.windows(2).any(|w| w[1] < w[0]) || cu[batch] as usize != total {
            return Err(invalid(op, format!("argument `{name}` = {cu:?} is not non-decreasing offsets from 0 to {total}")));
        }
        if let Some(l) = cu.windows(2).map(|w| (w[1] - w[0]) as usize).find(|&l| l > max) {
            return Err(invalid(op, format!("argument `{max_name}` = {max} is less than a sequence of {l}")));
        }
    }
    common_checks(op, q, k, v, &p, batch, h)?;
    let softcap = softcap_of(op, p.softcap)?;
    let (left, right) = normalised_windows(p.left, p.right, lens.max_seqlen_k);
    let p = Params { left, right, softcap, ..p };
    if matches!(q.device(), Device::Cpu) {
        return cpu_varlen(q, k, v, &cq, &ck, &p);
    }
    let dev = rocm_device(op, "q", q)?;
    let shape = VarlenShape { heads: h, kv_heads: hk, head_dim: d };
    dev.profiled(
        || "flash_attn_varlen".into(),
        q.dtype(),
        || match q.dtype() {
            DType::F16 => varlen_on::<f16>(op, dev, shape, q, k, v, &cq, &ck, &p),
            _ => varlen_on::<bf16>(op, dev, shape, q, k, v, &cq, &ck, &p),
        },
    )
}

#[allow(clippy::too_many_arguments)]
fn varlen_on<T: FlashElem + crate::buffer::BufElem>(
    op: &str,
    dev: &RocmDevice,
    shape: VarlenShape,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cq: &[u32],
    ck: &[u32],
    p: &Params<'_>,
) -> Result<(Tensor, Tensor)> {
    let VarlenShape { heads, head_dim, .. } = shape;
    let total_q = q.dims()[0];
    let ((qs, ql), (ks, kl), (vs, vl)) = (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout());
    let (qi, ki, vi) = (input::<T>(op, "q", dev, &qs, ql)?, input::<T>(op, "k", dev, &ks, kl)?, input::<T>(op, "v", dev, &vs, vl)?);
    let alibi_guard = p.alibi.map(|a| a.storage_and_layout());
    let alibi = match &alibi_guard {
        Some((s, l)) => Some(input::<f32>(op, "alibi_slopes", dev, s, l)?),
        None => None,
    };
    let opts = options(p, alibi.as_deref());
    let kd = dev.kernels();
    let mut out = kd.alloc_uninit::<T>(total_q * heads * head_dim).map_err(crate::error::at("flash_attn_varlen"))?;
    let mut lse = kd.alloc_uninit::<f32>(heads * total_q).map_err(crate::error::at("flash_attn_varlen"))?;
    attention::flash_attn_varlen(kd, shape, &qi, &ki, &vi, &mut out, &mut lse, cq, ck, &opts).map_err(|e| err(op, e))?;
    Ok((output(dev, out, (total_q, heads, head_dim)), output(dev, lse, (heads, total_q))))
}

/// The reference computation on `Device::Cpu`: f32 scores by `matmul`, softcap, ALiBi
/// bias and mask, a softmax whose fully masked rows give zeros, f32 `P V`. Returns the
/// output (q's dtype) and the log-sum-exp `[batch, heads, seq_q]`.
fn cpu_fixed(q: &Tensor, k: &Tensor, v: &Tensor, p: &Params<'_>, alibi: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    let (b, sq, h, d) = q.dims4()?;
    let (_, sk, hk, _) = k.dims4()?;
    if b * sq * h == 0 {
        return Ok((q.zeros_like()?, Tensor::zeros((b, h, sq), DType::F32, q.device())?));
    }
    if sk == 0 {
        return Ok((q.zeros_like()?, Tensor::full(f32::NEG_INFINITY, (b, h, sq), q.device())?));
    }
    let g = h / hk;
    let heads_of = |t: &Tensor| -> Result<Tensor> {
        // [b, sk, hk, d] -> [b, h, sk, d], query head `i` reading kv head `i / g`.
        t.to_dtype(DType::F32)?.transpose(1, 2)?.unsqueeze(2)?.expand((b, hk, g, sk, d))?.reshape((b, h, sk, d))
    };
    let qf = q.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let (kf, vf) = (heads_of(k)?, heads_of(v)?);
    let mut s = (qf.matmul(&kf.t()?.contiguous()?)? * p.scale as f64)?;
    if let Some(c) = p.softcap {
        s = ((s / c as f64)?.tanh()? * c as f64)?;
    }
    let slopes: Option<Vec<f32>> = alibi.map(|a| a.flatten_all()?.to_vec1::<f32>()).transpose()?;
    let off = sk as i64 - sq as i64;
    let mut bias = vec![0f32; b * h * sq * sk];
    for (e, x) in bias.iter_mut().enumerate() {
        let (j, i, hh, bb) = ((e % sk) as i64, (e / sk % sq) as i64, e / (sk * sq) % h, e / (sk * sq * h));
        let seen = p.left.is_none_or(|w| j + w as i64 >= i + off) && p.right.is_none_or(|w| j <= i + off + w as i64);
        *x = if !seen {
            f32::NEG_INFINITY
        } else if let Some(sl) = &slopes {
            let slope = if sl.len() == h { sl[hh] } else { sl[bb * h + hh] };
            -slope * (i + off - j).abs() as f32
        } else {
            0.0
        };
    }
    let s = (s + Tensor::from_vec(bias, (b, h, sq, sk), q.device())?)?;
    let m = s.max_keepdim(D::Minus1)?.maximum(-1e30f64)?;
    let e = s.broadcast_sub(&m)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let pm = e.broadcast_div(&sum.maximum(1e-30f64)?)?;
    let out = pm.matmul(&vf.contiguous()?)?.transpose(1, 2)?.to_dtype(q.dtype())?.contiguous()?;
    let lse = (m + sum.log()?)?.squeeze(D::Minus1)?;
    Ok((out, lse))
}

/// [`cpu_fixed`] per sequence of a packed batch; log-sum-exp `[heads, total_q]`.
fn cpu_varlen(q: &Tensor, k: &Tensor, v: &Tensor, cq: &[u32], ck: &[u32], p: &Params<'_>) -> Result<(Tensor, Tensor)> {
    let (outs, lses): (Vec<Tensor>, Vec<Tensor>) = (0..cq.len() - 1)
        .filter(|&b| cq[b + 1] > cq[b])
        .map(|b| {
            let (q0, lq) = (cq[b] as usize, (cq[b + 1] - cq[b]) as usize);
            let (k0, lk) = (ck[b] as usize, (ck[b + 1] - ck[b]) as usize);
            let alibi = match p.alibi {
                Some(a) if a.rank() == 2 => Some(a.get(b)?),
                a => a.cloned(),
            };
            let (o, l) = cpu_fixed(
                &q.narrow(0, q0, lq)?.unsqueeze(0)?,
                &k.narrow(0, k0, lk)?.unsqueeze(0)?,
                &v.narrow(0, k0, lk)?.unsqueeze(0)?,
                p,
                alibi.as_ref(),
            )?;
            Ok((o.squeeze(0)?, l.squeeze(0)?))
        })
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    if outs.is_empty() {
        return Ok((q.zeros_like()?, Tensor::zeros((q.dim(1)?, 0), DType::F32, q.device())?));
    }
    Ok((Tensor::cat(&outs, 0)?, Tensor::cat(&lses, 1)?))
}

/// `softmax(q k^T * softmax_scale) v` (candle-flash-attn's `flash_attn`): `q [batch,
/// seq_q, heads, head_dim]`, `k`, `v [batch, seq_k, kv_heads, head_dim]`; causal masks
/// align the last query with the last key.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    Ok(fixed("flash_attn", q, k, v, Params::causal(softmax_scale, None, causal))?.0)
}

/// [`flash_attn`] with a sliding window: row `i` sees keys `i + seq_k - seq_q -
/// window_size_left ..= i + seq_k - seq_q + window_size_right` (`None`: unbounded;
/// `(None, Some(0))` is causal).
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    Ok(fixed("flash_attn_windowed", q, k, v, Params::new(softmax_scale, None, window_size_left, window_size_right, None))?.0)
}

/// [`flash_attn`] with ALiBi: the score of row `i`, key `j` loses `slope[h] * |i + seq_k -
/// seq_q - j|`; `alibi_slopes` f32 `[heads]` (or `[batch, heads]`).
pub fn flash_attn_alibi(q: &Tensor, k: &Tensor, v: &Tensor, alibi_slopes: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    Ok(fixed("flash_attn_alibi", q, k, v, Params::causal(softmax_scale, Some(alibi_slopes), causal))?.0)
}

/// [`flash_attn_alibi`] with a sliding window (as [`flash_attn_windowed`]).
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let p = Params::new(softmax_scale, Some(alibi_slopes), window_size_left, window_size_right, None);
    Ok(fixed("flash_attn_alibi_windowed", q, k, v, p)?.0)
}

/// Every option at once, with Gemma-style `softcap * tanh(score / softcap)` on the scaled
/// scores (`softcap = 0`: off).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let p = Params::new(softmax_scale, alibi_slopes, window_size_left, window_size_right, Some(softcap));
    Ok(fixed("flash_attn_alibi_windowed_softcap", q, k, v, p)?.0)
}

/// [`flash_attn_alibi_windowed_softcap`] that also returns the natural log-sum-exp of each
/// row's masked, scaled scores, f32 `[batch, heads, seq_q]` (`-inf` for a row that sees no
/// key). An extension: candle-flash-attn 0.11 returns no log-sum-exp.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<(Tensor, Tensor)> {
    let p = Params::new(softmax_scale, alibi_slopes, window_size_left, window_size_right, Some(softcap));
    fixed("flash_attn_lse", q, k, v, p)
}

/// [`flash_attn`] over sequences of different lengths packed one after another:
/// `q [total_q, heads, head_dim]`, `k`, `v [total_k, kv_heads, head_dim]`; sequence `b`
/// has rows `seqlens_q[b]..seqlens_q[b + 1]` of `q` and `seqlens_k[b]..seqlens_k[b + 1]`
/// of `k`, `v` (u32 cumulative offsets, `batch + 1` each, read back to the host);
/// `max_seqlen_q`, `max_seqlen_k` bound the sequence lengths (an error if one is longer).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    Ok(varlen("flash_attn_varlen", q, k, v, lens, Params::causal(softmax_scale, None, causal))?.0)
}

/// [`flash_attn_varlen`] with a sliding window (as [`flash_attn_windowed`], windows
/// longer than `max_seqlen_k` unbounded).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    let p = Params::new(softmax_scale, None, window_size_left, window_size_right, None);
    Ok(varlen("flash_attn_varlen_windowed", q, k, v, lens, p)?.0)
}

/// [`flash_attn_varlen_windowed`] (`causal`: `window_size_right = Some(0)`) with the
/// cumulative offsets as host values: for callers that built them on the host, such as an
/// engine's step, so nothing is read back from the device (no sync per call).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_host_offsets(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &[u32],
    seqlens_k: &[u32],
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Host(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    let p = Params::new(softmax_scale, None, window_size_left, window_size_right, None);
    Ok(varlen("flash_attn_varlen_host_offsets", q, k, v, lens, p)?.0)
}

/// [`flash_attn_varlen`] with ALiBi slopes (f32 `[heads]` or `[batch, heads]`).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    Ok(varlen("flash_attn_varlen_alibi", q, k, v, lens, Params::causal(softmax_scale, Some(alibi_slopes), causal))?.0)
}

/// [`flash_attn_varlen_alibi`] with a sliding window.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    let p = Params::new(softmax_scale, Some(alibi_slopes), window_size_left, window_size_right, None);
    Ok(varlen("flash_attn_varlen_alibi_windowed", q, k, v, lens, p)?.0)
}

/// Every varlen option at once, with the softcap (`0`: off).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    let p = Params::new(softmax_scale, alibi_slopes, window_size_left, window_size_right, Some(softcap));
    Ok(varlen("flash_attn_varlen_alibi_windowed_softcap", q, k, v, lens, p)?.0)
}

/// [`flash_attn_varlen_alibi_windowed_softcap`] that also returns the log-sum-exp, f32
/// `[heads, total_q]` (an extension, as [`flash_attn_lse`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_lse(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<(Tensor, Tensor)> {
    let lens = Lens { offsets: Offsets::Tensors(seqlens_q, seqlens_k), max_seqlen_q, max_seqlen_k };
    let p = Params::new(softmax_scale, alibi_slopes, window_size_left, window_size_right, Some(softcap));
    varlen("flash_attn_varlen_lse", q, k, v, lens, p)
}

#[cfg(test)]
mod tests {
    use super::normalised_windows;

    #[test]
    fn windows_follow_candle_flash_attn() {
        assert_eq!(normalised_windows(None, None, 10), (None, None));
        assert_eq!(normalised_windows(None, Some(0), 10), (Some(10), Some(0)));
        assert_eq!(normalised_windows(Some(3), None, 10), (Some(3), Some(10)));
        assert_eq!(normalised_windows(Some(11), Some(2), 10), (Some(10), Some(2)));
        assert_eq!(normalised_windows(Some(11), Some(12), 10), (None, None));
    }
}
