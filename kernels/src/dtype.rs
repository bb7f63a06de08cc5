//! Candle's element types inside kernels that are generic over element *size*: a buffer of
//! any dtype travels as raw bits (`u8`, `u16`, `u32`, `u64`), and a run-time dtype code (the
//! same for every work-item, so no divergence) says how to read and write them. One kernel
//! instance per size then serves every dtype of that size.
//!
//! Values are widened to a [`Val`]: integers to `i64` (every Candle integer type fits),
//! floats to `f64` (exact for every float type), so comparisons and integer arithmetic
//! done on a `Val` give the narrow type's results once written back with [`encode`]
//! (which truncates integers, like Rust's `as`).
//!
//! Conversions follow candle-core 0.11.1's CPU backend (`to_dtype`), which uses Rust `as`
//! and the `half`/`float8` crates:
//! * float to integer: saturating, NaN to 0 (Rust `as`); f16/bf16/f8 go through `f32`;
//! * integer to f16/bf16/f8: through `v as f32`, then rounded once more;
//! * f64 to f16: through `f32` (what `half::f16::from_f64` does on x86-64 with F16C);
//! * f64 to bf16: `half::bf16::from_f64`, which rounds to nearest-even using only the upper
//!   32 bits of the f64 (so it is not always the correctly rounded result);
//! * f8e4m3 (OCP E4M3FN, the `float8` crate's `F8E4M3`): round to nearest-even, magnitudes
//!   above 464 (and infinities) saturate to ±448, NaN becomes `0x7F` with the sign kept;
//!   decoding gives a positive quiet NaN for `0x7F`/`0xFF`.
use kernel_dsl::prelude::*;

/// Dtype code of `u8`.
pub const DT_U8: u32 = 0;
/// Dtype code of `u32`.
pub const DT_U32: u32 = 1;
/// Dtype code of `i16`.
pub const DT_I16: u32 = 2;
/// Dtype code of `i32`.
pub const DT_I32: u32 = 3;
/// Dtype code of `i64`.
pub const DT_I64: u32 = 4;
/// Dtype code of `bf16`.
pub const DT_BF16: u32 = 5;
/// Dtype code of `f16`.
pub const DT_F16: u32 = 6;
/// Dtype code of `f32`.
pub const DT_F32: u32 = 7;
/// Dtype code of `f64`.
pub const DT_F64: u32 = 8;
/// Dtype code of `f8e4m3`.
pub const DT_F8E4M3: u32 = 9;

/// Raw storage of one element: `u8`, `u16`, `u32` or `u64`.
pub trait Bits: Copy + Send + Sync + 'static {
    /// Zero-extends to 64 bits.
    fn to_u64(self) -> u64;
    /// Keeps the low bits.
    fn from_u64(v: u64) -> Self;
}

macro_rules! bits {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            #[inline(always)]
            fn to_u64(self) -> u64 { self as u64 }
            #[inline(always)]
            fn from_u64(v: u64) -> Self { v as $t }
        }
    )*};
}
bits!(u8, u16, u32, u64);

/// An element widened for computing: integers as `i64`, floats as `f64`. `Wide` marks a
/// value read from an `f64` buffer (its conversion to bf16 and f8 differs, see the module
/// docs).
#[derive(Clone, Copy)]
pub enum Val {
    /// An integer dtype's value.
    Int(i64),
    /// An f32, f16, bf16 or f8e4m3 value (exact in f64).
    Float(f64),
    /// An f64 value.
    Wide(f64),
}

/// `true` for the integer dtype codes.
#[device]
#[inline(always)]
pub fn is_int(dt: u32) -> bool {
    dt <= DT_I64
}

/// Reads an element of dtype `dt` from its raw bits.
#[device]
#[inline(always)]
pub fn decode(bits: u64, dt: u32) -> Val {
    match dt {
        DT_U8 => Val::Int(bits as u8 as i64),
        DT_U32 => Val::Int(bits as u32 as i64),
        DT_I16 => Val::Int(bits as u16 as i16 as i64),
        DT_I32 => Val::Int(bits as u32 as i32 as i64),
        DT_I64 => Val::Int(bits as i64),
        DT_BF16 => Val::Float(bf16::from_bits(bits as u16).to_f32() as f64),
        DT_F16 => Val::Float(f16::from_bits(bits as u16).to_f32() as f64),
        DT_F32 => Val::Float(f32::from_bits(bits as u32) as f64),
        DT_F64 => Val::Wide(f64::from_bits(bits)),
        _ => Val::Float(f8e4m3_to_f32(bits as u8) as f64),
    }
}

/// [`decode`] for a dtype stored in `B`: only the dtypes of `B`'s size are considered, so
/// each kernel instance carries the code of its own size only.
#[device]
#[inline(always)]
pub fn decode_as<B: Bits>(b: B, dt: u32) -> Val {
    let bits = b.to_u64();
    match core::mem::size_of::<B>() {
        1 => {
            if dt == DT_U8 {
                Val::Int(bits as u8 as i64)
            } else {
                Val::Float(f8e4m3_to_f32(bits as u8) as f64)
            }
        }
        2 => match dt {
            DT_I16 => Val::Int(bits as u16 as i16 as i64),
            DT_BF16 => Val::Float(bf16::from_bits(bits as u16).to_f32() as f64),
            _ => Val::Float(f16::from_bits(bits as u16).to_f32() as f64),
        },
        4 => match dt {
            DT_U32 => Val::Int(bits as u32 as i64),
            DT_I32 => Val::Int(bits as u32 as i32 as i64),
            _ => Val::Float(f32::from_bits(bits as u32) as f64),
        },
        _ => {
            if dt == DT_I64 {
                Val::Int(bits as i64)
            } else {
                Val::Wide(f64::from_bits(bits))
            }
        }
    }
}

/// [`encode`] into a dtype stored in `B` (only the dtypes of `B`'s size are considered).
#[device]
#[inline(always)]
pub fn encode_as<B: Bits>(v: Val, dt: u32) -> B {
    let bits = match core::mem::size_of::<B>() {
        1 => {
            if dt == DT_U8 {
                encode(v, DT_U8)
            } else {
                encode(v, DT_F8E4M3)
            }
        }
        2 => match dt {
            DT_I16 => encode(v, DT_I16),
            DT_BF16 => encode(v, DT_BF16),
            _ => encode(v, DT_F16),
        },
        4 => match dt {
            DT_U32 => encode(v, DT_U32),
            DT_I32 => encode(v, DT_I32),
            _ => encode(v, DT_F32),
        },
        _ => {
            if dt == DT_I64 {
                encode(v, DT_I64)
            } else {
                encode(v, DT_F64)
            }
        }
    };
    B::from_u64(bits)
}

/// This work-item's index in a 2-D grid of 1-D work-groups launched by
/// [`host::grid_2d`]: `(block_y * grid_x + block_x) * block_size + thread`.
#[device]
#[inline(always)]
pub fn flat_global_idx() -> usize {
    ((block_idx_y() as usize * grid_dim_x() as usize + block_idx_x() as usize) * block_dim_x() as usize) + thread_idx_x() as usize
}

/// `(a / b, a % b)` in 32 bits; `b = 0` counts as 1 (no panicking path).
#[device]
#[inline(always)]
pub fn divmod32(a: u32, b: u32) -> (u32, u32) {
    let d = core::num::NonZeroU32::new(b).unwrap_or(core::num::NonZeroU32::MIN);
    (a / d, a % d)
}

/// Offset of element `i` of a strided view `layout = [dims..., strides...]` (`i` for an
/// empty layout), with 32-bit divisions: for views of fewer than 2^31 elements.
#[device]
#[inline(always)]
pub fn view_offset32(i: u32, layout: &[usize]) -> usize {
    let nd = layout.len() / 2;
    if nd == 0 {
        return i as usize;
    }
    let mut rem = i;
    let mut off = 0usize;
    let mut d = nd;
    while d > 0 {
        d -= 1;
        // SAFETY: d < nd and nd + d < 2 * nd <= layout.len().
        let (dim, stride) = unsafe { (*layout.get_unchecked(d), *layout.get_unchecked(nd + d)) };
        let (q, r) = divmod32(rem, dim as u32);
        off += r as usize * stride;
        rem = q;
    }
    off
}

/// The value as `f32`: integers with `as f32` (one rounding), floats rounded once.
#[device]
#[inline(always)]
pub fn val_to_f32(v: Val) -> f32 {
    match v {
        Val::Int(i) => i as f32,
        Val::Float(f) | Val::Wide(f) => f as f32,
    }
}

/// The value as `f64`: integers with `as f64`.
#[device]
#[inline(always)]
pub fn val_to_f64(v: Val) -> f64 {
    match v {
        Val::Int(i) => i as f64,
        Val::Float(f) | Val::Wide(f) => f,
    }
}

/// Writes `v` as dtype `dt`, with Candle's conversion rules (module docs); integers
/// truncate to the narrow type (two's complement wrap).
#[device]
#[inline(always)]
pub fn encode(v: Val, dt: u32) -> u64 {
    match dt {
        DT_U8 => (match v { Val::Int(i) => i as u8, Val::Float(f) | Val::Wide(f) => f as u8 }) as u64,
        DT_U32 => (match v { Val::Int(i) => i as u32, Val::Float(f) | Val::Wide(f) => f as u32 }) as u64,
        DT_I16 => (match v { Val::Int(i) => i as i16, Val::Float(f) | Val::Wide(f) => f as i16 }) as u16 as u64,
        DT_I32 => (match v { Val::Int(i) => i as i32, Val::Float(f) | Val::Wide(f) => f as i32 }) as u32 as u64,
        DT_I64 => (match v { Val::Int(i) => i, Val::Float(f) | Val::Wide(f) => f as i64 }) as u64,
        DT_BF16 => match v {
            Val::Wide(f) => bf16_from_f64_upper(f) as u64,
            _ => bf16::from_f32(val_to_f32(v)).to_bits() as u64,
        },
        DT_F16 => f16::from_f32(val_to_f32(v)).to_bits() as u64,
        DT_F32 => val_to_f32(v).to_bits() as u64,
        DT_F64 => val_to_f64(v).to_bits(),
        _ => match v {
            Val::Wide(f) => f8e4m3_from_f64(f) as u64,
            _ => f8e4m3_from_f64(val_to_f32(v) as f64) as u64,
        },
    }
}

/// f8e4m3 (E4M3FN) bits to `f32` (exact); `0x7F`/`0xFF` give a positive quiet NaN.
#[device]
#[inline(always)]
pub fn f8e4m3_to_f32(b: u8) -> f32 {
    if b & 0x7f == 0x7f {
        return f32::from_bits(0x7fc0_0000);
    }
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as u32;
    // Subnormal: m * 2^-9; normal: (8 + m) * 2^(e - 10). Both products are exact in f32.
    let (sig, exp) = if e == 0 { (m, -9) } else { (8 + m, e - 10) };
    let mag = sig as f32 * f32::from_bits(((127 + exp) as u32) << 23);
    if b & 0x80 != 0 { -mag } else { mag }
}

/// `f64` to f8e4m3 (E4M3FN) bits: round to nearest-even on the full f64, magnitudes
/// above 464 and infinities saturate to ±448, NaN gives `0x7F` with the sign bit kept.
#[device]
#[inline(always)]
pub fn f8e4m3_from_f64(x: f64) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 63) as u8) << 7;
    let a = f64::from_bits(bits & !(1u64 << 63));
    if a != a {
        return 0x7f | sign;
    }
    if a > 464.0 {
        return 0x7e | sign;
    }
    // With e = max(exponent of a, -6), the representable numbers near `a` are k * 2^(e-3)
    // and the encoding is (e + 6) * 8 + k (k in 8..=16 for normals, 0..=8 below 2^-6,
    // where k = 16 or 8 carries into the next exponent field exactly).
    let e = (((bits >> 52) & 0x7ff) as i32 - 1023).max(-6);
    let scaled = a * f64::from_bits(((1023 + 3 - e) as u64) << 52);
    let k = scaled as u64;
    let frac = scaled - k as f64;
    let k = if frac > 0.5 || (frac == 0.5 && k & 1 == 1) { k + 1 } else { k };
    ((e + 6) as u64 * 8 + k) as u8 | sign
}

/// `f64` to bf16 bits as `half::bf16::from_f64` computes them: round to nearest-even, but
/// looking only at the upper 32 bits of the f64 (sign, exponent, 20 mantissa bits).
#[device]
#[inline(always)]
pub fn bf16_from_f64_upper(x: f64) -> u16 {
    let bits = x.to_bits();
    let hi = (bits >> 32) as u32;
    let sign = (hi >> 16) & 0x8000;
    let exp = ((hi >> 20) & 0x7ff) as i32;
    let man = hi & 0x000f_ffff;
    if exp == 0x7ff {
        let nan = if man != 0 || bits as u32 != 0 { 0x40 } else { 0 };
        return (sign | 0x7f80 | nan | (man >> 13)) as u16;
    }
    let e = exp - 1023 + 127;
    if e >= 0xff {
        return (sign | 0x7f80) as u16;
    }
    // Keep `keep` mantissa bits (with the hidden bit for subnormal results); round on the
    // dropped ones: up when above half, or at half with an odd kept part.
    let (m, shift, base) = if e <= 0 {
        if 14 - e > 31 {
            return sign as u16;
        }
        (man | 0x0010_0000, (14 - e) as u32, 0)
    } else {
        (man, 13, (e as u32) << 7)
    };
    let kept = m >> shift;
    let half = 1u32 << (shift - 1);
    let dropped = m & ((1u32 << shift) - 1);
    let up = dropped > half || (dropped == half && kept & 1 == 1);
    (sign | base | kept) as u16 + up as u16
}

/// A float element summed in a wider accumulator: f32, f16 and bf16 in `f32`, f64 in
/// `f64` (convolution gathers, average pooling).
pub trait Real: Copy + Send + Sync + 'static {
    /// The accumulator type.
    type Acc: Copy + core::ops::Add<Output = Self::Acc> + core::ops::Mul<Output = Self::Acc>;
    /// Zero.
    const ACC_ZERO: Self::Acc;
    /// Widens (exact).
    fn widen(self) -> Self::Acc;
    /// Rounds back to the element type (nearest-even).
    fn narrow(a: Self::Acc) -> Self;
    /// An `f64` constant as an accumulator value.
    fn acc(x: f64) -> Self::Acc;
}

macro_rules! real_half {
    ($($t:ident),*) => {$(
        impl Real for $t {
            type Acc = f32;
            const ACC_ZERO: f32 = 0.0;
            #[inline(always)]
            fn widen(self) -> f32 { self.to_f32() }
            #[inline(always)]
            fn narrow(a: f32) -> Self { $t::from_f32(a) }
            #[inline(always)]
            fn acc(x: f64) -> f32 { x as f32 }
        }
    )*};
}
real_half!(f16, bf16);

impl Real for f32 {
    type Acc = f32;
    const ACC_ZERO: f32 = 0.0;
    #[inline(always)]
    fn widen(self) -> f32 { self }
    #[inline(always)]
    fn narrow(a: f32) -> Self { a }
    #[inline(always)]
    fn acc(x: f64) -> f32 { x as f32 }
}

impl Real for f64 {
    type Acc = f64;
    const ACC_ZERO: f64 = 0.0;
    #[inline(always)]
    fn widen(self) -> f64 { self }
    #[inline(always)]
    fn narrow(a: f64) -> Self { a }
    #[inline(always)]
    fn acc(x: f64) -> f64 { x }
}

/// Host side: the dtypes as Rust types, and argument helpers shared by the dtype-generic
/// launchers.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod host {
    use super::*;
    use kernel_dsl::host::{ArgValue, KernelArgSlice, LaunchError};

    /// An f8e4m3 element (OCP E4M3FN) as raw bits, bit-compatible with `float8::F8E4M3`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[repr(transparent)]
    pub struct F8E4M3(pub u8);

    impl F8E4M3 {
        /// Rounds an `f64` (see the module docs).
        pub fn from_f64(x: f64) -> Self {
            F8E4M3(f8e4m3_from_f64(x))
        }
        /// The exact `f32` value.
        pub fn to_f32(self) -> f32 {
            f8e4m3_to_f32(self.0)
        }
    }

    /// One of Candle's dtypes as a Rust type: its code and its raw storage type.
    pub trait DType: Copy + Send + Sync + 'static {
        /// The run-time dtype code the kernels read.
        const CODE: u32;
        /// Raw storage of the same size.
        type Bits: Bits;
        /// Candle's name of the dtype.
        const NAME: &'static str;
        /// The raw bits.
        fn to_bits(self) -> Self::Bits;
    }

    macro_rules! dtype {
        ($($t:ty => $code:ident, $bits:ty, $name:literal, |$v:ident| $to:expr;)*) => {$(
            impl DType for $t {
                const CODE: u32 = super::$code;
                type Bits = $bits;
                const NAME: &'static str = $name;
                #[inline]
                fn to_bits(self) -> $bits { let $v = self; $to }
            }
        )*};
    }
    dtype! {
        u8 => DT_U8, u8, "u8", |v| v;
        u32 => DT_U32, u32, "u32", |v| v;
        i16 => DT_I16, u16, "i16", |v| v as u16;
        i32 => DT_I32, u32, "i32", |v| v as u32;
        i64 => DT_I64, u64, "i64", |v| v as u64;
        bf16 => DT_BF16, u16, "bf16", |v| v.to_bits();
        f16 => DT_F16, u16, "f16", |v| v.to_bits();
        f32 => DT_F32, u32, "f32", |v| v.to_bits();
        f64 => DT_F64, u64, "f64", |v| v.to_bits();
        F8E4M3 => DT_F8E4M3, u8, "f8e4m3", |v| v.0;
    }

    /// A buffer argument passed through as is, offered as a buffer of any element type
    /// (used to hand a dtype's buffer to the kernel instance of the same element size).
    pub struct Raw(pub ArgValue);

    impl<T> KernelArgSlice<T> for Raw {
        fn kernel_arg(&self) -> ArgValue {
            self.0
        }
    }
    impl<T> kernel_dsl::host::KernelArgSliceMut<T> for Raw {}

    /// Elements of a buffer argument.
    pub fn arg_len<T>(b: &(impl KernelArgSlice<T> + ?Sized)) -> usize {
        match b.kernel_arg() {
            ArgValue::Slice { len, .. } => len,
            _ => 0,
        }
    }

    /// A typed `InvalidArgument`.
    pub fn invalid(kernel: &'static str, reason: String) -> LaunchError {
        LaunchError::InvalidArgument { kernel, reason }
    }

    /// The product of `dims`, or an error when it overflows.
    pub fn product(kernel: &'static str, dims: &[usize]) -> Result<usize, LaunchError> {
        dims.iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| invalid(kernel, format!("shape {dims:?} overflows usize")))
    }

    /// A launch of at least `n` work-items in work-groups of 256, as a 2-D grid (x up to
    /// 65535 groups, then y) for kernels that handle one element per work-item
    /// ([`flat_global_idx`]); `n` up to 2^32.
    pub fn grid_2d(n: usize) -> kernel_dsl::host::LaunchConfig {
        let blocks = n.div_ceil(256).max(1);
        let gx = blocks.min(65535);
        let gy = blocks.div_ceil(gx).min(65535);
        kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::new(gx as u32, gy as u32, 1), kernel_dsl::Dim3::x(256))
    }

    /// Errors unless every count is below 2^31 (the kernels with 32-bit index arithmetic).
    pub fn fits_i32(kernel: &'static str, counts: &[usize]) -> Result<(), LaunchError> {
        match counts.iter().find(|&&c| c >= 1 << 31) {
            Some(c) => Err(invalid(kernel, format!("{c} elements: this kernel indexes with 32 bits (at most 2^31 - 1 elements per tensor and dimension)"))),
            None => Ok(()),
        }
    }

    /// Errors unless `actual == expected`.
    pub fn expect_len(kernel: &'static str, arg: &str, actual: usize, expected: usize) -> Result<(), LaunchError> {
        if actual != expected {
            return Err(invalid(kernel, format!("`{arg}` has {actual} elements; the shape needs {expected}")));
        }
        Ok(())
    }

    /// A strided view `(dims, strides)` in element units (a stride of 0 broadcasts): checks
    /// that it has `elems` elements and stays inside a buffer of `len`, and returns the
    /// kernels' `layout` vector `[dims..., strides...]` (empty when the view is the
    /// contiguous buffer itself).
    pub fn view_layout(kernel: &'static str, arg: &str, dims: &[usize], strides: &[usize], elems: usize, len: usize) -> Result<Vec<usize>, LaunchError> {
        if dims.len() != strides.len() {
            return Err(invalid(kernel, format!("view of `{arg}`: {} dims but {} strides", dims.len(), strides.len())));
        }
        let n = product(kernel, dims)?;
        if n != elems {
            return Err(invalid(kernel, format!("view of `{arg}` has {n} elements (dims {dims:?}), the op needs {elems}")));
        }
        if n > 0 {
            let last = dims
                .iter()
                .zip(strides)
                .try_fold(0usize, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|o| a.checked_add(o)))
                .ok_or_else(|| invalid(kernel, format!("view of `{arg}`: offsets overflow usize")))?;
            if last >= len {
                return Err(invalid(kernel, format!("view of `{arg}` (dims {dims:?}, strides {strides:?}) reaches element {last} of a buffer of {len}")));
            }
        }
        let mut contiguous = len == n;
        let mut expect = 1;
        for (&d, &s) in dims.iter().zip(strides).rev() {
            if d != 1 && s != expect {
                contiguous = false;
            }
            expect *= d;
        }
        Ok(if contiguous { Vec::new() } else { dims.iter().chain(strides).copied().collect() })
    }
}
