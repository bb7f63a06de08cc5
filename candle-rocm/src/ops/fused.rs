//! candle-nn's fused ops on this project's kernels: softmax over the last dimension,
//! sigmoid, RMSNorm, LayerNorm, GroupNorm (with SiLU), the three rotary embeddings, and
//! non-causal attention on the flash-attention prefill kernel.
use super::{alloc, contiguous, contiguous_view, float_dispatch};
use crate::buffer::{Buf, BufElem};
use crate::error::{at, invalid};
use candle_core::{FusedOp, Layout, Result, Shape};
use kernels::rope::RopeShape;
use kernels::runtime::{Device, DeviceVec};

/// Runs `op` on `x` (view `xl`) and the other operands `rest`, in candle-nn's order.
pub fn fused(dev: &Device, op: FusedOp, x: &Buf, xl: &Layout, rest: &[(&Buf, &Layout)]) -> Result<Option<(Buf, Shape)>> {
    let shape = xl.shape().clone();
    let n = shape.elem_count();
    let cols = xl.dims().last().copied().unwrap_or(1);
    let want = |k: usize, name: &str| {
        if rest.len() == k {
            Ok(())
        } else {
            Err(invalid(name, format!("{} operands, expected {}", rest.len() + 1, k + 1)))
        }
    };
    let buf = match op {
        FusedOp::Sigmoid => super::elementwise::unary(dev, x, xl, "sigmoid")?,
        FusedOp::SoftmaxLastDim => float_dispatch!(x.dtype(), "softmax_last_dim", T => {
            let mut keep: Option<DeviceVec<T>> = None;
            let xs = contiguous::<T>(dev, x, xl, &mut keep, "softmax_last_dim")?;
            let mut y = alloc::<T>(dev, n, "softmax_last_dim")?;
            if n > 0 {
                kernels::softmax::softmax_last_dim(dev, xs, &mut y, cols).map_err(at("softmax_last_dim"))?;
            }
            Ok(crate::buffer::BufElem::wrap(y))
        })?,
        FusedOp::RmsNorm { eps } => {
            want(1, "rms_norm")?;
            let (w, wl) = rest[0];
            float_dispatch!(x.dtype(), "rms_norm", T => {
                let (mut k1, mut k2): (Option<DeviceVec<T>>, Option<DeviceVec<T>>) = (None, None);
                let xs = contiguous::<T>(dev, x, xl, &mut k1, "rms_norm")?;
                let ws = contiguous::<T>(dev, w, wl, &mut k2, "rms_norm")?;
                let mut y = alloc::<T>(dev, n, "rms_norm")?;
                if n > 0 {
                    kernels::norm::rms_norm_rows(dev, xs, Some(ws), &mut y, cols, eps).map_err(at("rms_norm"))?;
                }
                Ok(crate::buffer::BufElem::wrap(y))
            })?
        }
        FusedOp::LayerNorm { eps } => {
            want(2, "layer_norm")?;
            let ((w, wl), (b, bl)) = (rest[0], rest[1]);
            float_dispatch!(x.dtype(), "layer_norm", T => {
                let (mut k1, mut k2, mut k3) = (None::<DeviceVec<T>>, None::<DeviceVec<T>>, None::<DeviceVec<T>>);
                let xs = contiguous::<T>(dev, x, xl, &mut k1, "layer_norm")?;
                let ws = contiguous::<T>(dev, w, wl, &mut k2, "layer_norm")?;
                let bs = contiguous::<T>(dev, b, bl, &mut k3, "layer_norm")?;
                let mut y = alloc::<T>(dev, n, "layer_norm")?;
                if n > 0 {
                    kernels::norm::layer_norm_rows(dev, xs, Some(ws), Some(bs), &mut y, cols, eps).map_err(at("layer_norm"))?;
                }
                Ok(crate::buffer::BufElem::wrap(y))
            })?
        }
        FusedOp::GroupNorm { groups, eps } | FusedOp::GroupNormSilu { groups, eps } => {
            const OP: &str = "group_norm";
            let silu = matches!(op, FusedOp::GroupNormSilu { .. });
            want(2, OP)?;
            let ((w, wl), (b, bl)) = (rest[0], rest[1]);
            let dims = xl.dims();
            if dims.len() < 2 {
                return Err(invalid(OP, format!("x has shape {dims:?}; [batch, channels, ..] expected")));
            }
            let (c, spatial) = (dims[1], dims[2..].iter().product::<usize>());
            float_dispatch!(x.dtype(), OP, T => {
                let (mut k1, mut k2, mut k3) = (None::<DeviceVec<T>>, None::<DeviceVec<T>>, None::<DeviceVec<T>>);
                let xs = contiguous::<T>(dev, x, xl, &mut k1, OP)?;
                let ws = contiguous::<T>(dev, w, wl, &mut k2, OP)?;
                let bs = contiguous::<T>(dev, b, bl, &mut k3, OP)?;
                let mut y = alloc::<T>(dev, n, OP)?;
                if n > 0 {
                    let (w, b): (&dyn kernel_dsl::host::KernelArgSlice<T>, &dyn kernel_dsl::host::KernelArgSlice<T>) = (ws, bs);
                    kernels::norm::group_norm_rows::<T>(dev, xs, Some(w), Some(b), &mut y, (c, spatial), groups, eps, silu).map_err(at(OP))?;
                }
                Ok(crate::buffer::BufElem::wrap(y))
            })?
        }
        FusedOp::RopeI | FusedOp::Rope | FusedOp::RopeThd => {
            want(2, "rope")?;
            rope(dev, op, x, xl, rest[0], rest[1])?
        }
        FusedOp::Attention { scale } => {
            want(2, "attention")?;
            match attention(dev, scale, (x, xl), rest[0], rest[1])? {
                Some(b) => b,
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some((buf, shape)))
}

fn rope(dev: &Device, op: FusedOp, x: &Buf, xl: &Layout, (c, cl): (&Buf, &Layout), (s, sl): (&Buf, &Layout)) -> Result<Buf> {
    const OP: &str = "rope";
    let [d0, d1, d2, d] = *xl.dims() else {
        return Err(invalid(OP, format!("x has shape {:?}, expected 4 dims", xl.dims())));
    };
    // rope_i / rope: (b, h, t, d); rope_thd: (b, t, h, d).
    let (b, h, t) = if op == FusedOp::RopeThd { (d0, d2, d1) } else { (d0, d1, d2) };
    let mut shape = RopeShape::new(b, h, t, d);
    match (cl.dims(), sl.dims()) {
        ([ct, cd], [st, sd]) if (*ct, *cd) == (t, d / 2) && (st, sd) == (ct, cd) => {}
        ([cb, ct, cd], [sb, st, sd]) if (*cb, *ct, *cd) == (b, t, d / 2) && (sb, st, sd) == (cb, ct, cd) => {
            shape = shape.per_batch_tables();
        }
        (c, s) => return Err(invalid(OP, format!("cos {c:?} / sin {s:?} do not fit x {:?}", xl.dims()))),
    }
    float_dispatch!(x.dtype(), OP, T => {
        let (mut k1, mut k2, mut k3) = (None::<DeviceVec<T>>, None::<DeviceVec<T>>, None::<DeviceVec<T>>);
        // Views without copies where contiguous: models pass tables narrowed to the
        // positions of this step (`cos.narrow(0, pos, t)`), which start inside the table.
        let xs = contiguous_view::<T>(dev, x, xl, &mut k1, OP)?;
        let cs = contiguous_view::<T>(dev, c, cl, &mut k2, OP)?;
        let ss = contiguous_view::<T>(dev, s, sl, &mut k3, OP)?;
        let mut y = alloc::<T>(dev, xl.shape().elem_count(), OP)?;
        match op {
            FusedOp::RopeI => kernels::rope::apply_rope_i::<T>(dev, &xs, &cs, &ss, &mut y, &shape),
            FusedOp::Rope => kernels::rope::apply_rope::<T>(dev, &xs, &cs, &ss, &mut y, &shape),
            _ => kernels::rope::apply_rope_thd::<T>(dev, &xs, &cs, &ss, &mut y, &shape),
        }
        .map_err(at(OP))?;
        Ok(crate::buffer::BufElem::wrap(y))
    })
}

/// The flash kernels' head dimension for a head of `d`: the smallest built one that holds
/// it (the head is zero-padded to it), `None` above the largest.
pub fn flash_head_dim(d: usize) -> Option<usize> {
    attention::flash::HEAD_DIMS.iter().copied().find(|&hd| hd >= d)
}

/// The view `(x, l)` (last dimension `d`) as a contiguous `(rows, hd)` buffer of `T`,
/// each row zero-padded from `d` to `hd` elements: the buffer itself or a contiguous copy
/// when `d == hd`, else one `copy2d` into a zeroed buffer (after a contiguous copy for a
/// strided view).
fn padded<'a, T: BufElem>(dev: &Device, (x, l): (&'a Buf, &Layout), hd: usize, keep: &'a mut Option<DeviceVec<T>>, op: &'static str) -> Result<&'a DeviceVec<T>> {
    let d = l.dims().last().copied().unwrap_or(1);
    if d == hd {
        return contiguous::<T>(dev, x, l, keep, op);
    }
    let n = l.shape().elem_count();
    let rows = n / d.max(1);
    let copy;
    let (src, so) = if l.is_contiguous() {
        (x, l.start_offset())
    } else {
        let mut c = Buf::uninit(dev, x.dtype(), n)?;
        super::elementwise::copy_strided(dev, x, l, &mut c, 0)?;
        copy = c;
        (&copy, 0)
    };
    let mut out = Buf::zeros(dev, x.dtype(), rows * hd)?;
    if rows > 0 {
        super::elementwise::copy2d(dev, src, &mut out, rows, d, d, hd, so, 0)?;
    }
    *keep = T::take(out);
    keep.as_ref().ok_or_else(|| invalid(op, "padded copy of another dtype"))
}

/// `FusedOp::Attention` on the flash-attention prefill kernel (non-causal): f16/bf16, head
/// dims up to the largest built one, a head between built sizes zero-padded to the next
/// (zero columns of `q` and `k` add nothing to the scores; those of `v` give output
/// columns that are dropped). `None` (the caller's host fallback) for other dtypes and
/// wider heads.
fn attention(dev: &Device, scale: f32, (q, ql): (&Buf, &Layout), (k, kl): (&Buf, &Layout), (v, vl): (&Buf, &Layout)) -> Result<Option<Buf>> {
    const OP: &str = "attention";
    let (&[b, sq, h, d], &[kb, sk, kh, kd]) = (ql.dims(), kl.dims()) else {
        return Err(invalid(OP, format!("q {:?} and k {:?} are not (b, seq, heads, head_dim)", ql.dims(), kl.dims())));
    };
    if (kb, kh, kd) != (b, h, d) || vl.dims() != kl.dims() {
        return Err(invalid(OP, format!("q {:?}, k {:?}, v {:?}: k and v must be (b, seq_k, heads, head_dim) of q's b, heads, head_dim", ql.dims(), kl.dims(), vl.dims())));
    }
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        return Err(invalid(OP, format!("dtypes {:?}, {:?}, {:?} differ", q.dtype(), k.dtype(), v.dtype())));
    }
    let Some(hd) = flash_head_dim(d) else { return Ok(None) };
    if !matches!(q.dtype(), candle_core::DType::F16 | candle_core::DType::BF16) || sk == 0 {
        return Ok(None);
    }
    fn run<T: BufElem + attention::FlashElem>(dev: &Device, scale: f32, ops: [(&Buf, &Layout); 3], shape: attention::FlashShape, d: usize) -> Result<Buf> {
        let hd = shape.head_dim;
        let (mut k1, mut k2, mut k3) = (None::<DeviceVec<T>>, None::<DeviceVec<T>>, None::<DeviceVec<T>>);
        let qs = padded::<T>(dev, ops[0], hd, &mut k1, OP)?;
        let ks = padded::<T>(dev, ops[1], hd, &mut k2, OP)?;
        let vs = padded::<T>(dev, ops[2], hd, &mut k3, OP)?;
        let rows = shape.batch * shape.seq_q * shape.heads;
        let mut out = alloc::<T>(dev, rows * hd, OP)?;
        let mut lse = alloc::<f32>(dev, shape.batch * shape.heads * shape.seq_q, OP)?;
        if rows > 0 {
            attention::flash_attn::<T>(dev, shape, qs, ks, vs, &mut out, &mut lse, &attention::FlashOptions::new(scale)).map_err(|e| invalid(OP, e))?;
        }
        let out = T::wrap(out);
        if hd == d {
            return Ok(out);
        }
        let mut y = Buf::uninit(dev, out.dtype(), rows * d)?;
        if rows > 0 {
            super::elementwise::copy2d(dev, &out, &mut y, rows, d, hd, d, 0, 0)?;
        }
        Ok(y)
    }
    let shape = attention::FlashShape { batch: b, seq_q: sq, seq_k: sk, heads: h, kv_heads: h, head_dim: hd };
    let ops = [(q, ql), (k, kl), (v, vl)];
    Ok(Some(match q.dtype() {
        candle_core::DType::F16 => run::<half::f16>(dev, scale, ops, shape, d)?,
        _ => run::<half::bf16>(dev, scale, ops, shape, d)?,
    }))
}
