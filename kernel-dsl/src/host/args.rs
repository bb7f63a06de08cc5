//! Kernel arguments as the launcher collects them.

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemLocation {
    /// Host memory (the CPU executor).
    Host,
    /// Memory of a GPU: backend name and device ordinal.
    Device {
        /// `"rocm"` or `"cuda"`.
        backend: &'static str,
        /// Device ordinal.
        ordinal: usize,
    },
}

/// One launcher argument: a slice (address and length) or a scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArgValue {
    /// A buffer: occupies a pointer slot and a `usize` length slot.
    Slice {
        /// Address of the first element (host or device).
        addr: u64,
        /// Number of elements.
        len: usize,
        /// Where it lives.
        location: MemLocation,
    },
    /// 1-byte scalar.
    U8(u8),
    /// 2-byte scalar (`f16`/`bf16` bits, `u16`).
    U16(u16),
    /// 4-byte scalar (`u32`, `i32`, `f32` bits).
    U32(u32),
    /// 8-byte scalar (`u64`, `i64`, `usize`, `f64` bits).
    U64(u64),
}

impl ArgValue {
    /// The little-endian bytes of each slot this argument fills.
    pub fn slot_bytes(&self) -> Vec<([u8; 8], usize)> {
        let b8 = |v: u64| v.to_le_bytes();
        match *self {
            ArgValue::Slice { addr, len, .. } => vec![(b8(addr), 8), (b8(len as u64), 8)],
            ArgValue::U8(v) => vec![(b8(v as u64), 1)],
            ArgValue::U16(v) => vec![(b8(v as u64), 2)],
            ArgValue::U32(v) => vec![(b8(v as u64), 4)],
            ArgValue::U64(v) => vec![(b8(v), 8)],
        }
    }

    /// The slice this argument describes, for the CPU executor.
    ///
    /// # Safety
    /// The argument must have been made from a live host `[T]` by a launcher.
    #[doc(hidden)]
    pub unsafe fn host_slice<'a, T>(&self) -> &'a [T] {
        match *self {
            ArgValue::Slice { addr, len, location: MemLocation::Host } if len > 0 => {
                core::slice::from_raw_parts(addr as usize as *const T, len)
            }
            ArgValue::Slice { location: MemLocation::Host, .. } => &[],
            _ => panic!("kernel argument is not a host slice: {self:?}"),
        }
    }

    /// The mutable slice this argument describes, for the CPU executor.
    ///
    /// # Safety
    /// As [`ArgValue::host_slice`], from a `&mut [T]`; work-items may write disjoint
    /// elements concurrently only as the kernel model allows.
    #[doc(hidden)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn host_slice_mut<'a, T>(&self) -> &'a mut [T] {
        match *self {
            ArgValue::Slice { addr, len, location: MemLocation::Host } if len > 0 => {
                core::slice::from_raw_parts_mut(addr as usize as *mut T, len)
            }
            ArgValue::Slice { location: MemLocation::Host, .. } => &mut [],
            _ => panic!("kernel argument is not a host slice: {self:?}"),
        }
    }

    /// The scalar this argument holds.
    #[doc(hidden)]
    pub fn scalar<T: ScalarArg>(&self) -> T {
        T::from_arg(*self)
    }
}

/// A buffer a launcher accepts for a `&[T]` parameter: host slices and vectors here, device
/// buffers in the GPU runtimes.
pub trait KernelArgSlice<T> {
    /// Address, length and location.
    fn kernel_arg(&self) -> ArgValue;
}

/// A buffer a launcher accepts for a `&mut [T]` parameter.
pub trait KernelArgSliceMut<T>: KernelArgSlice<T> {}

impl<T> KernelArgSlice<T> for [T] {
    fn kernel_arg(&self) -> ArgValue {
        ArgValue::Slice { addr: self.as_ptr() as usize as u64, len: self.len(), location: MemLocation::Host }
    }
}
impl<T> KernelArgSliceMut<T> for [T] {}
impl<T> KernelArgSlice<T> for Vec<T> {
    fn kernel_arg(&self) -> ArgValue {
        self.as_slice().kernel_arg()
    }
}
impl<T> KernelArgSliceMut<T> for Vec<T> {}
impl<T, const N: usize> KernelArgSlice<T> for [T; N] {
    fn kernel_arg(&self) -> ArgValue {
        self.as_slice().kernel_arg()
    }
}
impl<T, const N: usize> KernelArgSliceMut<T> for [T; N] {}

/// A scalar a kernel takes by value.
pub trait ScalarArg: Copy {
    /// Packs the value.
    fn to_arg(self) -> ArgValue;
    /// Unpacks the value.
    fn from_arg(a: ArgValue) -> Self;
}

macro_rules! scalar {
    ($($t:ty => $v:ident($to:expr, $from:expr)),* $(,)?) => {$(
        impl ScalarArg for $t {
            #[inline]
            fn to_arg(self) -> ArgValue { ArgValue::$v(($to)(self)) }
            #[inline]
            fn from_arg(a: ArgValue) -> Self {
                match a {
                    ArgValue::$v(v) => ($from)(v),
                    other => panic!("expected a {} argument, got {:?}", stringify!($t), other),
                }
            }
        }
    )*};
}
scalar! {
    u8 => U8(|v| v, |v| v),
    u16 => U16(|v| v, |v| v),
    half::f16 => U16(|v: half::f16| v.to_bits(), half::f16::from_bits),
    half::bf16 => U16(|v: half::bf16| v.to_bits(), half::bf16::from_bits),
    u32 => U32(|v| v, |v| v),
    i32 => U32(|v: i32| v as u32, |v: u32| v as i32),
    f32 => U32(f32::to_bits, f32::from_bits),
    u64 => U64(|v| v, |v| v),
    i64 => U64(|v: i64| v as u64, |v: u64| v as i64),
    usize => U64(|v: usize| v as u64, |v: u64| v as usize),
    f64 => U64(f64::to_bits, f64::from_bits),
}
