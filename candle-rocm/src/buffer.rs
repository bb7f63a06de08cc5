//! Typed device buffers of every Candle dtype this backend stores, and untyped regions of
//! them (offset + length) that kernel launchers accept as slice arguments.
use crate::error::{at, invalid, unsupported};
use candle_core::{CpuStorage, DType, Layout, Result};
use half::{bf16, f16};
use kernel_dsl::host::{ArgValue, KernelArgSlice, KernelArgSliceMut, MemLocation};
use kernels::dtype::host::F8E4M3;
use kernels::runtime::{Device, DeviceVec};

/// A buffer of one dtype on a kernels [`Device`].
pub enum Buf {
    U8(DeviceVec<u8>),
    U32(DeviceVec<u32>),
    I16(DeviceVec<i16>),
    I32(DeviceVec<i32>),
    I64(DeviceVec<i64>),
    BF16(DeviceVec<bf16>),
    F16(DeviceVec<f16>),
    F32(DeviceVec<f32>),
    F64(DeviceVec<f64>),
    /// f8e4m3 (OCP E4M3FN) as raw bits, bit-compatible with Candle's `float8::F8E4M3`.
    F8E4M3(DeviceVec<F8E4M3>),
}

/// Runs `$body` with `$v` bound to the typed buffer, whatever its dtype.
macro_rules! with_buf {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            Buf::U8($v) => $body,
            Buf::U32($v) => $body,
            Buf::I16($v) => $body,
            Buf::I32($v) => $body,
            Buf::I64($v) => $body,
            Buf::BF16($v) => $body,
            Buf::F16($v) => $body,
            Buf::F32($v) => $body,
            Buf::F64($v) => $body,
            Buf::F8E4M3($v) => $body,
        }
    };
}

impl Buf {
    pub fn dtype(&self) -> DType {
        match self {
            Buf::U8(_) => DType::U8,
            Buf::U32(_) => DType::U32,
            Buf::I16(_) => DType::I16,
            Buf::I32(_) => DType::I32,
            Buf::I64(_) => DType::I64,
            Buf::BF16(_) => DType::BF16,
            Buf::F16(_) => DType::F16,
            Buf::F32(_) => DType::F32,
            Buf::F64(_) => DType::F64,
            Buf::F8E4M3(_) => DType::F8E4M3,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        with_buf!(self, v => v.len())
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole buffer as a kernel argument.
    pub fn arg(&self) -> ArgValue {
        with_buf!(self, v => v.kernel_arg())
    }

    /// `len` zero elements of `dtype`.
    pub fn zeros(dev: &Device, dtype: DType, len: usize) -> Result<Buf> {
        let op = "zeros";
        Ok(match dtype {
            DType::U8 => Buf::U8(dev.alloc(len).map_err(at(op))?),
            DType::U32 => Buf::U32(dev.alloc(len).map_err(at(op))?),
            DType::I16 => Buf::I16(dev.alloc(len).map_err(at(op))?),
            DType::I32 => Buf::I32(dev.alloc(len).map_err(at(op))?),
            DType::I64 => Buf::I64(dev.alloc(len).map_err(at(op))?),
            DType::BF16 => Buf::BF16(dev.alloc(len).map_err(at(op))?),
            DType::F16 => Buf::F16(dev.alloc(len).map_err(at(op))?),
            DType::F32 => Buf::F32(dev.alloc(len).map_err(at(op))?),
            DType::F64 => Buf::F64(dev.alloc(len).map_err(at(op))?),
            DType::F8E4M3 => Buf::F8E4M3(dev.alloc(len).map_err(at(op))?),
            d => return Err(unsupported("storage", d)),
        })
    }

    /// `len` elements of `dtype` with unspecified contents (a reused block keeps old data),
    /// for outputs that are written in full before they are read.
    pub fn uninit(dev: &Device, dtype: DType, len: usize) -> Result<Buf> {
        let op = "alloc_uninit";
        Ok(match dtype {
            DType::U8 => Buf::U8(dev.alloc_uninit(len).map_err(at(op))?),
            DType::U32 => Buf::U32(dev.alloc_uninit(len).map_err(at(op))?),
            DType::I16 => Buf::I16(dev.alloc_uninit(len).map_err(at(op))?),
            DType::I32 => Buf::I32(dev.alloc_uninit(len).map_err(at(op))?),
            DType::I64 => Buf::I64(dev.alloc_uninit(len).map_err(at(op))?),
            DType::BF16 => Buf::BF16(dev.alloc_uninit(len).map_err(at(op))?),
            DType::F16 => Buf::F16(dev.alloc_uninit(len).map_err(at(op))?),
            DType::F32 => Buf::F32(dev.alloc_uninit(len).map_err(at(op))?),
            DType::F64 => Buf::F64(dev.alloc_uninit(len).map_err(at(op))?),
            DType::F8E4M3 => Buf::F8E4M3(dev.alloc_uninit(len).map_err(at(op))?),
            d => return Err(unsupported("storage", d)),
        })
    }

    /// A copy of host data on `dev`.
    pub fn upload(dev: &Device, s: &CpuStorage) -> Result<Buf> {
        let op = "upload";
        Ok(match s {
            CpuStorage::U8(v) => Buf::U8(dev.upload(v).map_err(at(op))?),
            CpuStorage::U32(v) => Buf::U32(dev.upload(v).map_err(at(op))?),
            CpuStorage::I16(v) => Buf::I16(dev.upload(v).map_err(at(op))?),
            CpuStorage::I32(v) => Buf::I32(dev.upload(v).map_err(at(op))?),
            CpuStorage::I64(v) => Buf::I64(dev.upload(v).map_err(at(op))?),
            CpuStorage::BF16(v) => Buf::BF16(dev.upload(v).map_err(at(op))?),
            CpuStorage::F16(v) => Buf::F16(dev.upload(v).map_err(at(op))?),
            CpuStorage::F32(v) => Buf::F32(dev.upload(v).map_err(at(op))?),
            CpuStorage::F64(v) => Buf::F64(dev.upload(v).map_err(at(op))?),
            CpuStorage::F8E4M3(v) => {
                let bits: Vec<F8E4M3> = v.iter().map(|x| F8E4M3(x.to_bits())).collect();
                Buf::F8E4M3(dev.upload(&bits).map_err(at(op))?)
            }
            other => return Err(unsupported("storage", candle_core::backend::BackendStorage::dtype(other))),
        })
    }

    /// The whole buffer, copied to the host.
    pub fn download(&self, dev: &Device) -> Result<CpuStorage> {
        let op = "download";
        Ok(match self {
            Buf::U8(v) => CpuStorage::U8(dev.download(v).map_err(at(op))?),
            Buf::U32(v) => CpuStorage::U32(dev.download(v).map_err(at(op))?),
            Buf::I16(v) => CpuStorage::I16(dev.download(v).map_err(at(op))?),
            Buf::I32(v) => CpuStorage::I32(dev.download(v).map_err(at(op))?),
            Buf::I64(v) => CpuStorage::I64(dev.download(v).map_err(at(op))?),
            Buf::BF16(v) => CpuStorage::BF16(dev.download(v).map_err(at(op))?),
            Buf::F16(v) => CpuStorage::F16(dev.download(v).map_err(at(op))?),
            Buf::F32(v) => CpuStorage::F32(dev.download(v).map_err(at(op))?),
            Buf::F64(v) => CpuStorage::F64(dev.download(v).map_err(at(op))?),
            Buf::F8E4M3(v) => {
                let bits = dev.download(v).map_err(at(op))?;
                CpuStorage::F8E4M3(bits.iter().map(|x| float8::F8E4M3::from_bits(x.0)).collect())
            }
        })
    }

    /// `len` elements from element `offset`, checked against the buffer.
    pub fn region(&self, offset: usize, len: usize) -> Result<Region> {
        Region::new(self.arg(), self.dtype().size_in_bytes(), offset, len, self.len())
    }

    /// As [`Buf::region`], for an output: borrowing the buffer mutably keeps writes honest.
    pub fn region_mut(&mut self, offset: usize, len: usize) -> Result<Region> {
        self.region(offset, len)
    }

    /// The view `l` reads: from its start offset to the end of the buffer.
    pub fn from_offset(&self, l: &Layout) -> Result<Region> {
        let start = l.start_offset();
        self.region(start, self.len().saturating_sub(start))
    }
}

/// A part of a buffer (offset + length) as a kernel argument of any element type of the
/// buffer's size: the launchers take it for `&[T]` and `&mut [T]` parameters.
#[derive(Clone, Copy)]
pub struct Region {
    arg: ArgValue,
    /// Bytes per element.
    elem: usize,
}

impl Region {
    fn new(base: ArgValue, elem: usize, offset: usize, len: usize, buf_len: usize) -> Result<Region> {
        if offset.checked_add(len).is_none_or(|end| end > buf_len) {
            return Err(invalid("region", format!("{len} elements at {offset} exceed a buffer of {buf_len}")));
        }
        match base {
            ArgValue::Slice { addr, location, .. } => {
                Ok(Region { arg: ArgValue::Slice { addr: addr + (offset * elem) as u64, len, location }, elem })
            }
            _ => Err(invalid("region", "not a buffer")),
        }
    }

    /// A whole typed buffer.
    pub fn of<T>(v: &impl KernelArgSlice<T>) -> Region {
        Region { arg: v.kernel_arg(), elem: std::mem::size_of::<T>() }
    }

    /// `len` elements from element `offset` of this region.
    pub fn sub(&self, offset: usize, len: usize) -> Result<Region> {
        Region::new(self.arg, self.elem, offset, len, self.len())
    }

    /// The same memory as elements `k` times smaller (`k` times as many).
    pub fn split_elems(&self, k: usize) -> Region {
        match self.arg {
            ArgValue::Slice { addr, len, location } => {
                Region { arg: ArgValue::Slice { addr, len: len * k, location }, elem: self.elem / k }
            }
            _ => *self,
        }
    }

    /// An empty argument (a contiguous layout, an absent parameter).
    pub fn empty() -> Region {
        // A dangling, aligned, non-null address: never read (length 0).
        let addr = std::ptr::NonNull::<u64>::dangling().as_ptr() as u64;
        Region { arg: ArgValue::Slice { addr, len: 0, location: MemLocation::Host }, elem: 8 }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match self.arg {
            ArgValue::Slice { len, .. } => len,
            _ => 0,
        }
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the first element in the memory of its device (a device pointer on a
    /// GPU), for libraries such as cuBLAS that take raw pointers.
    pub fn addr(&self) -> u64 {
        match self.arg {
            ArgValue::Slice { addr, .. } => addr,
            _ => 0,
        }
    }
}

impl<T> KernelArgSlice<T> for Region {
    fn kernel_arg(&self) -> ArgValue {
        self.arg
    }
}
impl<T> KernelArgSliceMut<T> for Region {}

/// The input of an elementwise kernel for the view `l` of `buf`: its data from the start
/// offset and the `[dims..., strides...]` layout (empty when contiguous).
pub struct StridedInput {
    pub data: Region,
    pub layout: Region,
    _layout_buf: Option<std::sync::Arc<DeviceVec<usize>>>,
}

impl StridedInput {
    pub fn new(dev: &Device, buf: &Buf, l: &Layout) -> Result<StridedInput> {
        if l.is_contiguous() {
            let data = buf.region(l.start_offset(), l.shape().elem_count())?;
            return Ok(StridedInput { data, layout: Region::empty(), _layout_buf: None });
        }
        let data = buf.from_offset(l)?;
        let host: Vec<usize> = l.dims().iter().chain(l.stride()).copied().collect();
        // Shared with every op on the same layout: uploaded once, not per op.
        let lb = dev.upload_shared(&host).map_err(at("layout"))?;
        let layout = Region::of::<usize>(&*lb);
        Ok(StridedInput { data, layout, _layout_buf: Some(lb) })
    }
}

/// The views `a` and `b` of one shape, rewritten over the fewest dimensions that address
/// the same elements for both: size-1 dimensions dropped, and neighbours merged where both
/// views step through them as one (outer stride = inner stride x inner size). A broadcast
/// bias over `[batch, channels, height, width]` becomes `[batch, channels, height*width]`;
/// a contiguous operand stays contiguous. Elementwise kernels then divide over fewer
/// dimensions per element.
pub fn coalesce_pair(a: &Layout, b: &Layout) -> (Layout, Layout) {
    debug_assert_eq!(a.dims(), b.dims());
    // (size, stride in a, stride in b), innermost first.
    let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(a.dims().len());
    for ((&d, &sa), &sb) in a.dims().iter().zip(a.stride()).zip(b.stride()).rev() {
        if d == 1 {
            continue;
        }
        match merged.last_mut() {
            Some((md, msa, msb)) if sa == *msa * *md && sb == *msb * *md => *md *= d,
            _ => merged.push((d, sa, sb)),
        }
    }
    if merged.is_empty() {
        // One element (or a shape of size-1 dimensions): keep the views as they are.
        return (a.clone(), b.clone());
    }
    merged.reverse();
    let dims: Vec<usize> = merged.iter().map(|m| m.0).collect();
    let view = |stride: Vec<usize>, start| Layout::new(dims.clone().into(), stride, start);
    (
        view(merged.iter().map(|m| m.1).collect(), a.start_offset()),
        view(merged.iter().map(|m| m.2).collect(), b.start_offset()),
    )
}

/// Element types a [`Buf`] holds: wrapping and unwrapping typed buffers.
pub trait BufElem: Copy + Send + Sync + 'static {
    fn wrap(v: DeviceVec<Self>) -> Buf;
    fn get(b: &Buf) -> Option<&DeviceVec<Self>>;
    fn get_mut(b: &mut Buf) -> Option<&mut DeviceVec<Self>>;
    fn take(b: Buf) -> Option<DeviceVec<Self>>;
}

macro_rules! buf_elem {
    ($($T:ty => $V:ident),*) => {$(
        impl BufElem for $T {
            fn wrap(v: DeviceVec<Self>) -> Buf {
                Buf::$V(v)
            }
            fn get(b: &Buf) -> Option<&DeviceVec<Self>> {
                match b {
                    Buf::$V(v) => Some(v),
                    _ => None,
                }
            }
            fn get_mut(b: &mut Buf) -> Option<&mut DeviceVec<Self>> {
                match b {
                    Buf::$V(v) => Some(v),
                    _ => None,
                }
            }
            fn take(b: Buf) -> Option<DeviceVec<Self>> {
                match b {
                    Buf::$V(v) => Some(v),
                    _ => None,
                }
            }
        }
    )*};
}
buf_elem!(u8 => U8, u32 => U32, i16 => I16, i32 => I32, i64 => I64, bf16 => BF16, f16 => F16, f32 => F32, f64 => F64, F8E4M3 => F8E4M3);

#[cfg(test)]
mod tests {
    use super::coalesce_pair;
    use candle_core::Layout;

    /// Offset of each logical element of the view, in order.
    fn offsets(l: &Layout) -> Vec<usize> {
        let n = l.shape().elem_count();
        (0..n)
            .map(|i| {
                let (mut rem, mut off) = (i, l.start_offset());
                for (&d, &s) in l.dims().iter().zip(l.stride()).rev() {
                    off += (rem % d) * s;
                    rem /= d;
                }
                off
            })
            .collect()
    }

    fn view(dims: &[usize], stride: &[usize], start: usize) -> Layout {
        Layout::new(dims.to_vec().into(), stride.to_vec(), start)
    }

    #[test]
    fn a_channel_bias_over_an_image_batch_needs_three_dimensions() {
        let x = Layout::contiguous_with_offset((2, 1280, 32, 32), 0);
        let bias = view(&[2, 1280, 32, 32], &[0, 1, 0, 0], 5);
        let (cx, cb) = coalesce_pair(&x, &bias);
        assert_eq!(cx.dims(), [2, 1280, 1024]);
        assert!(cx.is_contiguous(), "the contiguous operand stays contiguous: {cx:?}");
        assert_eq!((cb.stride(), cb.start_offset()), (&[0, 1, 0][..], 5));
        let (ct, _) = coalesce_pair(&x.transpose(1, 2).unwrap(), &view(&[2, 32, 1280, 32], &[0, 0, 1, 0], 0));
        assert_eq!(ct.dims(), [2, 32, 1280, 32], "a transpose merges nothing");
    }

    /// Every element keeps its offset in both views, over shapes with size-1 dimensions,
    /// broadcasts, transposes and narrowed views.
    #[test]
    fn coalesced_views_address_the_same_elements() {
        let cases: [(&[usize], &[usize], &[usize]); 7] = [
            (&[3, 1, 4, 5], &[20, 20, 5, 1], &[0, 0, 1, 4]),
            (&[1, 1], &[1, 1], &[0, 0]),
            (&[2, 3, 4], &[1, 2, 6], &[12, 4, 1]),
            (&[4, 6], &[10, 1], &[6, 1]),
            (&[5, 1, 1, 7], &[7, 3, 9, 1], &[0, 0, 0, 0]),
            (&[2, 2, 2, 2], &[8, 4, 2, 1], &[0, 4, 2, 1]),
            (&[3, 0, 2], &[0, 2, 1], &[2, 2, 1]),
        ];
        for (dims, sa, sb) in cases {
            let (a, b) = (view(dims, sa, 3), view(dims, sb, 1));
            let (ca, cb) = coalesce_pair(&a, &b);
            assert_eq!(ca.dims(), cb.dims());
            assert!(ca.dims().len() <= dims.len().max(1));
            assert_eq!(offsets(&ca), offsets(&a), "{dims:?} {sa:?}");
            assert_eq!(offsets(&cb), offsets(&b), "{dims:?} {sb:?}");
            if a.is_contiguous() {
                assert!(ca.is_contiguous(), "{dims:?}");
            }
        }
    }
}
