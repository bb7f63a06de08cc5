//! candle-nn's fused ops on this project's kernels: softmax over the last dimension,
//! sigmoid, RMSNorm, LayerNorm, GroupNorm, and the three rotary embeddings.
use super::{alloc, contiguous, contiguous_view, float_dispatch};
use crate::buffer::Buf;
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
        FusedOp::GroupNorm { groups, eps } => {
            const OP: &str = "group_norm";
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
                    kernels::norm::group_norm_rows::<T>(dev, xs, Some(w), Some(b), &mut y, (c, spatial), groups, eps, false).map_err(at(OP))?;
                }
                Ok(crate::buffer::BufElem::wrap(y))
            })?
        }
        FusedOp::RopeI | FusedOp::Rope | FusedOp::RopeThd => {
            want(2, "rope")?;
            rope(dev, op, x, xl, rest[0], rest[1])?
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
