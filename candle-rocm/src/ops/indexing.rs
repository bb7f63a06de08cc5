//! Indexing ops: where_cond, index_select, gather, scatter_add, index_add.
use super::any::{any_dispatch, input};
use super::{contiguous, float_dispatch};
use crate::buffer::{Buf, Region};
use crate::error::{at, invalid, unsupported};
use candle_core::{DType, Layout, Result};
use kernels::indexing::ops::{self as ix, View};
use kernels::runtime::{Device, DeviceVec};

/// A read-only operand: its data from the start offset and, when not contiguous, a [`View`].
struct Operand {
    data: Region,
    view: Option<View>,
}

fn operand(dev: &Device, buf: &Buf, l: &Layout, op: &'static str) -> Result<Operand> {
    if l.is_contiguous() {
        return Ok(Operand { data: buf.region(l.start_offset(), l.shape().elem_count())?, view: None });
    }
    let view = View::new(dev, l.dims(), l.stride()).map_err(at(op))?;
    Ok(Operand { data: buf.from_offset(l)?, view: Some(view) })
}

/// Index buffers as `u32` or `i64` (u8 ids are widened to u32 first), contiguous.
enum Ids {
    U32(DeviceVec<u32>),
    I64(DeviceVec<i64>),
}

fn ids(dev: &Device, buf: &Buf, l: &Layout, op: &'static str) -> Result<Ids> {
    let n = l.shape().elem_count();
    match buf.dtype() {
        DType::U8 => match super::elementwise::to_dtype(dev, buf, l, DType::U32)? {
            Buf::U32(v) => Ok(Ids::U32(v)),
            _ => Err(invalid(op, "u8 ids did not widen to u32")),
        },
        DType::U32 | DType::I64 => {
            let mut copy = Buf::uninit(dev, buf.dtype(), n)?;
            super::elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
            match copy {
                Buf::U32(v) => Ok(Ids::U32(v)),
                Buf::I64(v) => Ok(Ids::I64(v)),
                _ => Err(invalid(op, "ids copy of another dtype")),
            }
        }
        d => Err(unsupported(op, d)),
    }
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// Runs `$body` with `$B` a kernel element type of the size of `$dtype` (these ops move
/// bits): 1, 2 or 4 bytes.
macro_rules! by_size {
    ($dtype:expr, $op:expr, $B:ident => $body:expr) => {
        match $dtype.size_in_bytes() {
            1 => {
                type $B = u8;
                $body
            }
            2 => {
                type $B = half::f16;
                $body
            }
            4 => {
                type $B = u32;
                $body
            }
            _ => Err(unsupported($op, $dtype)),
        }
    };
}

/// `cond ? on_true : on_false`, all three views of the output's shape.
pub fn where_cond(dev: &Device, c: &Buf, cl: &Layout, t: &Buf, tl: &Layout, f: &Buf, fl: &Layout) -> Result<Buf> {
    const OP: &str = "where_cond";
    if t.dtype() != f.dtype() {
        return Err(invalid(OP, format!("branches of {:?} and {:?}", t.dtype(), f.dtype())));
    }
    let n = cl.shape().elem_count();
    if t.dtype().size_in_bytes() == 8 || !matches!(c.dtype(), DType::U8 | DType::U32) {
        return where_cond_any(dev, c, cl, t, tl, f, fl);
    }
    let (co, to, fo) = (operand(dev, c, cl, OP)?, operand(dev, t, tl, OP)?, operand(dev, f, fl, OP)?);
    let mut out = Buf::zeros(dev, t.dtype(), n)?;
    let mut y = out.region_mut(0, n)?;
    by_size!(t.dtype(), OP, B => {
        let (tv, fv) = ((&to.data, to.view.as_ref()), (&fo.data, fo.view.as_ref()));
        match c.dtype() {
            DType::U8 => ix::where_cond::<B, u8>(dev, (&co.data, co.view.as_ref()), tv, fv, &mut y),
            DType::U32 => ix::where_cond::<B, u32>(dev, (&co.data, co.view.as_ref()), tv, fv, &mut y),
            d => return Err(unsupported("where_cond (condition)", d)),
        }
        .map_err(at(OP))
    })?;
    Ok(out)
}

/// Rows of `src` (view `l`) along `dim` picked by the ids.
pub fn index_select(dev: &Device, src: &Buf, l: &Layout, id: &Buf, il: &Layout, dim: usize) -> Result<Buf> {
    const OP: &str = "index_select";
    let dims = l.dims();
    if dim >= dims.len() {
        return Err(invalid(OP, format!("dim {dim} out of range for {dims:?}")));
    }
    let ids = ids(dev, id, il, OP)?;
    let n = il.shape().elem_count();
    let (left, right) = (prod(&dims[..dim]), prod(&dims[dim + 1..]));
    if src.dtype().size_in_bytes() == 8 {
        let mut keep = None;
        let s = contiguous_bits(dev, src, l, &mut keep, OP)?;
        let mut out = Buf::zeros(dev, src.dtype(), left * n * right)?;
        let mut y = out.region_mut(0, left * n * right)?;
        any_dispatch!(src.dtype(), OP, T => match &ids {
            Ids::U32(i) => kernels::indexing_any::ops::index_select::<T, u32>(dev, &s, i, &mut y, left, dims[dim], right),
            Ids::I64(i) => kernels::indexing_any::ops::index_select::<T, i64>(dev, &s, i, &mut y, left, dims[dim], right),
        }
        .map_err(at(OP)))?;
        return Ok(out);
    }
    let s = operand(dev, src, l, OP)?;
    let mut out = Buf::zeros(dev, src.dtype(), left * n * right)?;
    let mut y = out.region_mut(0, left * n * right)?;
    by_size!(src.dtype(), OP, B => match &ids {
        Ids::U32(i) => ix::index_select::<B, u32>(dev, &s.data, s.view.as_ref(), i, &mut y, left, dims[dim], right),
        Ids::I64(i) => ix::index_select::<B, i64>(dev, &s.data, s.view.as_ref(), i, &mut y, left, dims[dim], right),
    }
    .map_err(at(OP)))?;
    Ok(out)
}

/// `out[.., i, ..] = src[.., ids[.., i, ..], ..]` along `dim`; the output has the ids' shape.
pub fn gather(dev: &Device, src: &Buf, l: &Layout, id: &Buf, il: &Layout, dim: usize) -> Result<Buf> {
    const OP: &str = "gather";
    let (sd, idd) = (l.dims(), il.dims());
    if dim >= sd.len() || sd.len() != idd.len() || (0..sd.len()).any(|d| d != dim && sd[d] != idd[d]) {
        return Err(invalid(OP, format!("ids {idd:?} do not match source {sd:?} outside dim {dim}")));
    }
    let ids = ids(dev, id, il, OP)?;
    let (left, right, n) = (prod(&sd[..dim]), prod(&sd[dim + 1..]), idd[dim]);
    let mut keep = None;
    let mut out = Buf::zeros(dev, src.dtype(), left * n * right)?;
    let mut y = out.region_mut(0, left * n * right)?;
    if src.dtype().size_in_bytes() == 8 {
        let s = contiguous_bits(dev, src, l, &mut keep, OP)?;
        any_dispatch!(src.dtype(), OP, T => match &ids {
            Ids::U32(i) => kernels::indexing_any::ops::gather::<T, u32>(dev, &s, i, &mut y, left, sd[dim], n, right),
            Ids::I64(i) => kernels::indexing_any::ops::gather::<T, i64>(dev, &s, i, &mut y, left, sd[dim], n, right),
        }
        .map_err(at(OP)))?;
        return Ok(out);
    }
    by_size!(src.dtype(), OP, B => {
        let s = contiguous_bits(dev, src, l, &mut keep, OP)?;
        match &ids {
            Ids::U32(i) => ix::gather::<B, u32>(dev, &s, i, &mut y, left, sd[dim], n, right),
            Ids::I64(i) => ix::gather::<B, i64>(dev, &s, i, &mut y, left, sd[dim], n, right),
        }
        .map_err(at(OP))
    })?;
    Ok(out)
}

/// The view as an exactly-sized contiguous region (a copy when needed, kept in `keep`).
fn contiguous_bits(dev: &Device, buf: &Buf, l: &Layout, keep: &mut Option<Buf>, _op: &'static str) -> Result<Region> {
    let n = l.shape().elem_count();
    if l.is_contiguous() {
        return buf.region(l.start_offset(), n);
    }
    let mut copy = Buf::uninit(dev, buf.dtype(), n)?;
    super::elementwise::copy_strided(dev, buf, l, &mut copy, 0)?;
    let r = copy.region(0, n)?;
    *keep = Some(copy);
    Ok(r)
}

/// `dst[.., ids[.., i, ..], ..] (+)= src[.., i, ..]` along `dim`, in place (dst contiguous):
/// Candle's `scatter_add_set` (`add`) and `scatter_set`.
#[allow(clippy::too_many_arguments)]
pub fn scatter(dev: &Device, dst: &mut Buf, l: &Layout, id: &Buf, il: &Layout, src: &Buf, sl: &Layout, dim: usize, add: bool) -> Result<()> {
    let op = if add { "scatter_add" } else { "scatter_set" };
    let (dd, idd) = (l.dims(), il.dims());
    if !l.is_contiguous() {
        return Err(invalid(op, "the destination must be contiguous"));
    }
    if src.dtype() != dst.dtype() {
        return Err(invalid(op, format!("source {:?} into {:?}", src.dtype(), dst.dtype())));
    }
    if dim >= dd.len() || dd.len() != idd.len() || sl.dims() != idd || (0..dd.len()).any(|d| d != dim && dd[d] != idd[d]) {
        return Err(invalid(op, format!("ids {idd:?} / source {:?} do not match destination {dd:?} along dim {dim}", sl.dims())));
    }
    let ids = ids(dev, id, il, op)?;
    let (left, right, n) = (prod(&dd[..dim]), prod(&dd[dim + 1..]), idd[dim]);
    let dtype = dst.dtype();
    let mut d = dst.region_mut(l.start_offset(), l.shape().elem_count())?;
    if add && matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return float_dispatch!(dtype, op, T => {
            let mut keep: Option<DeviceVec<T>> = None;
            let s = contiguous::<T>(dev, src, sl, &mut keep, op)?;
            match &ids {
                Ids::U32(i) => ix::scatter_add::<T, u32>(dev, s, i, &mut d, left, n, dd[dim], right),
                Ids::I64(i) => ix::scatter_add::<T, i64>(dev, s, i, &mut d, left, n, dd[dim], right),
            }
            .map_err(at(op))
        });
    }
    let mut keep = None;
    let s = contiguous_bits(dev, src, sl, &mut keep, op)?;
    use kernels::indexing_any::ops as ia;
    any_dispatch!(dtype, op, T => match (&ids, add) {
        (Ids::U32(i), true) => ia::scatter_add::<T, u32>(dev, &s, i, &mut d, left, n, dd[dim], right),
        (Ids::I64(i), true) => ia::scatter_add::<T, i64>(dev, &s, i, &mut d, left, n, dd[dim], right),
        (Ids::U32(i), false) => ia::scatter_set::<T, u32>(dev, &s, i, &mut d, left, n, dd[dim], right),
        (Ids::I64(i), false) => ia::scatter_set::<T, i64>(dev, &s, i, &mut d, left, n, dd[dim], right),
    }
    .map_err(at(op)))
}

/// `where_cond` for 8-byte values or conditions other than u8/u32 (dtype-generic kernel).
fn where_cond_any(dev: &Device, c: &Buf, cl: &Layout, t: &Buf, tl: &Layout, f: &Buf, fl: &Layout) -> Result<Buf> {
    const OP: &str = "where_cond";
    let n = cl.shape().elem_count();
    let (ci, ti, fi) = (input(c, cl)?, input(t, tl)?, input(f, fl)?);
    any_dispatch!(t.dtype(), OP, T => {
        let mut out = super::alloc::<T>(dev, n, OP)?;
        any_dispatch!(c.dtype(), OP, C => {
            kernels::indexing_any::ops::where_cond::<T, C>(dev, (&ci.data, ci.view), (&ti.data, ti.view), (&fi.data, fi.view), &mut out)
                .map_err(at(OP))
        })?;
        Ok(crate::buffer::BufElem::wrap(out))
    })
}

/// A copy of the view `l` of `dst` with `src` rows added at the ids along `dim`.
#[allow(clippy::too_many_arguments)]
pub fn index_add(dev: &Device, dst: &Buf, l: &Layout, id: &Buf, il: &Layout, src: &Buf, sl: &Layout, dim: usize) -> Result<Buf> {
    const OP: &str = "index_add";
    let dd = l.dims();
    if dim >= dd.len() || il.dims().len() != 1 {
        return Err(invalid(OP, format!("dim {dim} of {dd:?} with ids of shape {:?}", il.dims())));
    }
    let ids = ids(dev, id, il, OP)?;
    let (left, right) = (prod(&dd[..dim]), prod(&dd[dim + 1..]));
    let mut out = Buf::uninit(dev, dst.dtype(), l.shape().elem_count())?;
    super::elementwise::copy_strided(dev, dst, l, &mut out, 0)?;
    let n_out = out.len();
    let mut o = out.region_mut(0, n_out)?;
    if !matches!(dst.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        let mut keep = None;
        let s = contiguous_bits(dev, src, sl, &mut keep, OP)?;
        any_dispatch!(dst.dtype(), OP, T => match &ids {
            Ids::U32(i) => kernels::indexing_any::ops::index_add::<T, u32>(dev, &s, i, &mut o, left, dd[dim], right),
            Ids::I64(i) => kernels::indexing_any::ops::index_add::<T, i64>(dev, &s, i, &mut o, left, dd[dim], right),
        }
        .map_err(at(OP)))?;
        return Ok(out);
    }
    float_dispatch!(dst.dtype(), OP, T => {
        let mut keep: Option<DeviceVec<T>> = None;
        let s = contiguous::<T>(dev, src, sl, &mut keep, OP)?;
        match &ids {
            Ids::U32(i) => ix::index_add::<T, u32>(dev, s, i, &mut o, left, dd[dim], right),
            Ids::I64(i) => ix::index_add::<T, i64>(dev, s, i, &mut o, left, dd[dim], right),
        }
        .map_err(at(OP))
    })?;
    Ok(out)
}
