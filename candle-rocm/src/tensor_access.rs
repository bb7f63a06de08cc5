//! Reaching the device buffers behind Candle tensors for the attention entry points
//! ([`crate::flash_attn`], [`crate::paged`]): typed inputs (borrowed when the tensor is a
//! whole contiguous buffer, else gathered into a fresh one on the device), outputs wrapped
//! as new tensors, and write access to existing tensors (KV caches) through Candle's
//! in-place ops, which hold the tensors' write locks while a kernel runs.
use crate::buffer::{Buf, BufElem};
use crate::device::RocmDevice;
use crate::error::invalid;
use crate::storage::RocmStorage;
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Storage, Tensor};
use kernels::runtime::DeviceVec;
use std::cell::RefCell;
use std::ops::Deref;

/// The rocm-kernels device of `t`, or an error naming `arg`.
pub(crate) fn rocm_device<'a>(op: &str, arg: &str, t: &'a Tensor) -> Result<&'a RocmDevice> {
    RocmDevice::from_candle(t.device())
        .ok_or_else(|| invalid(op, format!("argument `{arg}` is on {:?}, not on a rocm-kernels device", t.device().location())))
}

/// `t` is on `dev`, or an error naming `arg`.
pub(crate) fn same_device(op: &str, arg: &str, t: &Tensor, dev: &candle_core::Device) -> Result<()> {
    if !t.device().same_device(dev) {
        return Err(invalid(op, format!("argument `{arg}` is on {:?}; the other operands on {:?}", t.device().location(), dev.location())));
    }
    Ok(())
}

/// `t` has `dtype`, or an error naming `arg`.
pub(crate) fn dtype_is(op: &str, arg: &str, t: &Tensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(invalid(op, format!("argument `{arg}` has dtype {:?}; expected {dtype:?}", t.dtype())));
    }
    Ok(())
}

/// The dims of `t` when it has rank `rank`, or an error naming `arg`.
pub(crate) fn dims_n<'a>(op: &str, arg: &str, t: &'a Tensor, rank: usize, what: &str) -> Result<&'a [usize]> {
    let d = t.dims();
    if d.len() != rank {
        return Err(invalid(op, format!("argument `{arg}` has shape {:?}; expected rank {rank} {what}", t.shape())));
    }
    Ok(d)
}

/// The `RocmStorage` behind `t` (read-locked while the guard lives).
fn storage_of<'g>(op: &str, arg: &str, s: &'g Storage) -> Result<&'g RocmStorage> {
    match s {
        Storage::Ext(e) => e.as_any().downcast_ref::<RocmStorage>(),
        _ => None,
    }
    .ok_or_else(|| invalid(op, format!("argument `{arg}` is not on a rocm-kernels device")))
}

/// A typed, contiguous device buffer holding exactly a tensor's elements.
pub(crate) enum Input<'g, T> {
    Borrowed(&'g DeviceVec<T>),
    Owned(DeviceVec<T>),
}

impl<T> Deref for Input<'_, T> {
    type Target = DeviceVec<T>;
    fn deref(&self) -> &DeviceVec<T> {
        match self {
            Input::Borrowed(v) => v,
            Input::Owned(v) => v,
        }
    }
}

/// The elements of the tensor whose storage guard is `s` and layout `l`, as a contiguous
/// `DeviceVec<T>`: the buffer itself when the view is all of it, else a device copy of
/// the view (strided or offset views included).
pub(crate) fn input<'g, T: BufElem>(op: &str, arg: &str, dev: &RocmDevice, s: &'g Storage, l: &Layout) -> Result<Input<'g, T>> {
    let st = storage_of(op, arg, s)?;
    let buf = st.buf();
    let n = l.shape().elem_count();
    let Some(v) = T::get(buf) else {
        return Err(invalid(op, format!("argument `{arg}` has dtype {:?}", buf.dtype())));
    };
    if l.is_contiguous() && l.start_offset() == 0 && v.len() == n {
        return Ok(Input::Borrowed(v));
    }
    let mut out = Buf::uninit(dev.kernels(), buf.dtype(), n)?;
    crate::ops::elementwise::copy_strided(dev.kernels(), buf, l, &mut out, 0)?;
    Ok(Input::Owned(T::take(out).ok_or_else(|| invalid(op, "copy changed the dtype"))?))
}

/// The elements of a tensor `[rows, ..]` whose rows are each contiguous (`width` = the
/// product of the other dims) and evenly spaced, such as a column slice (`narrow` of the
/// inner dims) of a larger matrix, as `(buffer, first row's offset, row stride)`: read in
/// place, no copy. Any other layout (rows overlapping, transposed inner dims) is gathered
/// into a contiguous copy (offset 0, stride `width`), as [`input`] does.
pub(crate) fn row_strided<'g, T: BufElem>(op: &str, arg: &str, dev: &RocmDevice, s: &'g Storage, l: &Layout) -> Result<(Input<'g, T>, usize, usize)> {
    let (dims, strides) = (l.dims(), l.stride());
    let width: usize = dims.iter().skip(1).product();
    let rows = dims.first().copied().unwrap_or(1);
    let mut expect = 1;
    let mut inner = true;
    for i in (1..dims.len()).rev() {
        inner &= dims[i] == 1 || strides[i] == expect;
        expect *= dims[i];
    }
    let stride = if rows > 1 { strides[0] } else { width };
    if inner && !dims.is_empty() && stride >= width {
        let st = storage_of(op, arg, s)?;
        let Some(v) = T::get(st.buf()) else {
            return Err(invalid(op, format!("argument `{arg}` has dtype {:?}", st.buf().dtype())));
        };
        return Ok((Input::Borrowed(v), l.start_offset(), stride));
    }
    Ok((input::<T>(op, arg, dev, s, l)?, 0, width))
}

/// A tensor of `shape` on `dev` owning `v`.
pub(crate) fn output<T: BufElem>(dev: &RocmDevice, v: DeviceVec<T>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Ext(dev.storage(T::wrap(v))), shape, BackpropOp::none(), false)
}

/// The host values of a small integer tensor (block tables, lengths, slots, positions) of
/// dtype u32, i32 or i64 on any device, as i64; an error naming `arg` for other dtypes.
pub(crate) fn host_ints(op: &str, arg: &str, t: &Tensor) -> Result<Vec<i64>> {
    let t = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => t.to_vec1::<i64>()?,
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        d => return Err(invalid(op, format!("argument `{arg}` has dtype {d:?}; expected u32, i32 or i64"))),
    })
}

/// `host_ints` as u32, each in `0..=u32::MAX`.
pub(crate) fn host_u32(op: &str, arg: &str, t: &Tensor) -> Result<Vec<u32>> {
    host_ints(op, arg, t)?
        .into_iter()
        .enumerate()
        .map(|(i, x)| u32::try_from(x).map_err(|_| invalid(op, format!("argument `{arg}`: element {i} = {x} is negative or too large"))))
        .collect()
}

/// The address of the storage behind `t`: equal for tensors sharing one allocation.
fn storage_key(t: &Tensor) -> usize {
    let (s, _) = t.storage_and_layout();
    std::ptr::from_ref::<Storage>(&*s) as usize
}

/// Tensors written in place must not share storage with each other or with any tensor
/// read in the same call (Candle's locks would deadlock, and the kernel would race).
pub(crate) fn distinct_storage(op: &str, dsts: &[(&str, &Tensor)], srcs: &[(&str, &Tensor)]) -> Result<()> {
    for (i, (a, ta)) in dsts.iter().enumerate() {
        let ka = storage_key(ta);
        for (b, tb) in dsts[i + 1..].iter().chain(srcs) {
            if storage_key(tb) == ka {
                return Err(invalid(op, format!("arguments `{a}` and `{b}` share one buffer; `{a}` is written")));
            }
        }
    }
    Ok(())
}

/// A written tensor must be contiguous and span its whole buffer (a KV cache as
/// allocated), so its buffer is the kernel's output argument.
pub(crate) fn whole_buffer(op: &str, arg: &str, t: &Tensor) -> Result<()> {
    let (s, l) = t.storage_and_layout();
    let len = storage_of(op, arg, &s)?.buf().len();
    if !l.is_contiguous() || l.start_offset() != 0 || len != l.shape().elem_count() {
        return Err(invalid(op, format!("argument `{arg}` is written in place: it must be a contiguous tensor spanning its whole buffer (not a view)")));
    }
    Ok(())
}

/// What runs while a storage is write-locked.
type Writer<'f> = &'f mut dyn FnMut(&mut RocmStorage) -> Result<()>;

/// An in-place op handing the caller's closure the storage it write-locks.
struct Locked<'f> {
    f: RefCell<Writer<'f>>,
}

impl candle_core::InplaceOp1 for Locked<'_> {
    fn name(&self) -> &'static str {
        "rocm-kernels attention write"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        candle_core::bail!("rocm-kernels attention: written tensor is on the CPU")
    }

    fn ext_fwd(&self, s: &mut candle_core::ExtStorage, _: &Layout) -> Result<()> {
        let s = s.as_any_mut().downcast_mut::<RocmStorage>().ok_or_else(|| invalid(self.name(), "tensor is not on a rocm-kernels device"))?;
        (self.f.borrow_mut())(s)
    }
}

/// Runs `f` with `t`'s storage write-locked.
pub(crate) fn with_mut(t: &Tensor, mut f: impl FnMut(&mut RocmStorage) -> Result<()>) -> Result<()> {
    let op = Locked { f: RefCell::new(&mut f) };
    t.inplace_op1(&op)
}

/// `T`'s typed buffer inside `s`, mutable.
pub(crate) fn buf_mut<'s, T: BufElem>(op: &str, arg: &str, s: &'s mut RocmStorage) -> Result<&'s mut DeviceVec<T>> {
    let dtype = s.buf().dtype();
    T::get_mut(s.buf_mut()).ok_or_else(|| invalid(op, format!("argument `{arg}` has dtype {dtype:?}")))
}
