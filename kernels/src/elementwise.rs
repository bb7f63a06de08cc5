//! Elementwise kernels: unary maps, binary ops with broadcasting, affine, casts, fill and
//! strided copies, for `f32`, `f16` and `bf16` (half types compute in `f32`).
//!
//! Layouts: a kernel reads its inputs either contiguously (pass an empty `layout`) or
//! through a strided view described by `layout = [dims..., strides...]` (element units,
//! row-major, the output's shape; a stride of 0 broadcasts). Outputs are contiguous.
use kernel_dsl::prelude::*;

/// Offset of logical element `i` in a strided view `layout = [dims..., strides...]`; `i`
/// itself when the layout is empty (contiguous). Divides in 32 bits while the index and
/// dimension fit (a 64-bit division is several times the instructions on every GPU), and
/// has no panicking path: a zero dimension counts as 1 (a view with one has no elements).
#[device]
#[inline(always)]
pub fn strided_offset(i: usize, layout: &[usize]) -> usize {
    let nd = layout.len() / 2;
    if nd == 0 {
        return i;
    }
    let mut rem = i;
    let mut off = 0;
    let mut d = nd;
    while d > 0 {
        d -= 1;
        // SAFETY: d < nd and nd + d < 2 * nd <= layout.len().
        let (dim, stride) = unsafe { (*layout.get_unchecked(d), *layout.get_unchecked(nd + d)) };
        let (q, r) = divmod(rem, dim);
        off += r * stride;
        rem = q;
    }
    off
}

/// `(a / b, a % b)` for `b > 0` (`b = 0` counts as 1, without a panicking path), in 32-bit
/// arithmetic when both fit.
#[device]
#[inline(always)]
pub fn divmod(a: usize, b: usize) -> (usize, usize) {
    use core::num::{NonZeroU32, NonZeroUsize};
    if (a | b) >> 32 == 0 {
        let d = NonZeroU32::new(b as u32).unwrap_or(NonZeroU32::MIN);
        ((a as u32 / d) as usize, (a as u32 % d) as usize)
    } else {
        let d = NonZeroUsize::new(b).unwrap_or(NonZeroUsize::MIN);
        (a / d, a % d)
    }
}

/// Where logical element `i` of a strided view sits: its offset and its place along the
/// innermost dimension, for views of fewer than 2^32 elements (every division in 32 bits:
/// the index and each dimension are below the element count). Runs of consecutive
/// elements step from here by the innermost stride until that dimension ends.
#[derive(Clone, Copy)]
pub struct RunStart {
    /// Offset of element `i`.
    pub off: usize,
    /// Elements from `i` to the end of the innermost dimension (`usize::MAX`: contiguous).
    pub left: usize,
    /// The innermost stride.
    pub stride: usize,
}

impl RunStart {
    /// The start of a run at element `i < 2^32` of `layout` (empty: contiguous).
    #[inline(always)]
    pub fn at(i: usize, layout: &[usize]) -> RunStart {
        let nd = layout.len() / 2;
        if nd == 0 {
            return RunStart { off: i, left: usize::MAX, stride: 1 };
        }
        let mut rem = i as u32;
        let mut off = 0;
        let mut left = 0;
        let mut d = nd;
        while d > 0 {
            d -= 1;
            // SAFETY: d < nd and nd + d < 2 * nd <= layout.len().
            let (dim, stride) = unsafe { (*layout.get_unchecked(d), *layout.get_unchecked(nd + d)) };
            let dim = core::num::NonZeroU32::new(dim as u32).unwrap_or(core::num::NonZeroU32::MIN);
            let (q, r) = (rem / dim, rem % dim);
            if d == nd - 1 {
                left = (dim.get() - r) as usize;
            }
            off += r as usize * stride;
            rem = q;
        }
        // SAFETY: nd >= 1, so 2 * nd - 1 is in the layout.
        RunStart { off, left, stride: unsafe { *layout.get_unchecked(2 * nd - 1) } }
    }
}

/// Elements one work-item moves per vector access in the contiguous fast path.
pub const VEC: usize = 8;

/// `VEC` elements, aligned so that a chunk of 2-byte or larger elements is one or more
/// 16-byte vector loads (`global_load_dwordx4`, `ld.global.v4.u32`).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Chunk<T>(pub [T; VEC]);

/// `true` when both slices start on 16 bytes and their elements are at least 2 bytes, so
/// [`Chunk`]s tile them exactly.
#[device]
#[inline(always)]
pub fn chunkable<A, B>(a: *const A, b: *const B) -> bool {
    core::mem::size_of::<A>() >= 2
        && core::mem::size_of::<B>() >= 2
        && (a as usize | b as usize) % 16 == 0
}

/// Runs `$body` with `$k` = 0, 1, ... for `$k < $n` (`$n` <= 8, a constant per instance),
/// as straight-line code, so 16-byte blocks stay in registers.
#[macro_export]
macro_rules! unroll8 {
    ($k:ident, $n:expr, $body:block) => {
        $crate::unroll8!(@ $k, $n, $body, 0 1 2 3 4 5 6 7)
    };
    (@ $k:ident, $n:expr, $body:block, $($i:literal)*) => {
        $(
            if $i < $n {
                let $k: usize = $i;
                $body
            }
        )*
    };
}

/// 16 bytes, aligned: one vector access whatever the element type.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Bytes16(pub [u8; 16]);

/// `out[i] = f(input[i])` over contiguous slices of equal length, in a grid-stride loop.
///
/// Fast path (both slices 16-byte aligned): elements of equal size move as one 16-byte
/// vector per work-item and iteration, so each load and store instruction of a wave covers
/// whole contiguous cache lines; a conversion between sizes (casts) moves [`VEC`] elements
/// per iteration instead. The tail and unaligned slices go element by element.
#[device]
#[inline(always)]
pub fn map1<A: Copy, B: Copy>(input: &[A], out: &mut [B], f: impl Fn(A) -> B) {
    let n = out.len();
    let input = &input[..n];
    let step = global_size_x();
    let gid = global_idx_x();
    let (sa, sb) = (core::mem::size_of::<A>(), core::mem::size_of::<B>());
    let mut done = 0;
    if sa == sb && chunkable(input.as_ptr(), out.as_ptr()) {
        let lanes = 16 / sa;
        let blocks = n / lanes;
        let mut c = gid;
        while c < blocks {
            // SAFETY: c * lanes + lanes <= n for both slices; both start 16-byte aligned and
            // `lanes` elements are exactly 16 bytes, so every block is aligned and in bounds.
            let v = unsafe { core::ptr::read(input.as_ptr().add(c * lanes) as *const Bytes16) };
            let mut r = Bytes16([0; 16]);
            let (src, dst) = (&v as *const Bytes16 as *const A, &mut r as *mut Bytes16 as *mut B);
            // Written out with constant indices (`lanes` is a constant per instance), so the
            // block stays in registers instead of a stack array indexed at run time.
            unroll8!(k, lanes, {
                // SAFETY: k < lanes elements of 16 bytes each way.
                unsafe { *dst.add(k) = f(*src.add(k)) };
            });
            // SAFETY: as above.
            unsafe { core::ptr::write(out.as_mut_ptr().add(c * lanes) as *mut Bytes16, r) };
            c += step;
        }
        done = blocks * lanes;
    } else if chunkable(input.as_ptr(), out.as_ptr()) {
        let chunks = n / VEC;
        let mut c = gid;
        while c < chunks {
            // SAFETY: c * VEC + VEC <= n for both slices; both start 16-byte aligned and
            // VEC elements of >= 2 bytes are a multiple of 16 bytes, so every chunk is aligned.
            let a = unsafe { core::ptr::read(input.as_ptr().add(c * VEC) as *const Chunk<A>) };
            let mut r = [f(a.0[0]); VEC];
            let mut k = 1;
            while k < VEC {
                r[k] = f(a.0[k]);
                k += 1;
            }
            // SAFETY: as above.
            unsafe { core::ptr::write(out.as_mut_ptr().add(c * VEC) as *mut Chunk<B>, Chunk(r)) };
            c += step;
        }
        done = chunks * VEC;
    }
    let mut i = done + gid;
    while i < n {
        out[i] = f(input[i]);
        i += step;
    }
}

/// `out[i] = f(a[i], b[i])` over contiguous slices of equal length and element size (see
/// [`map1`]'s 16-byte path).
#[device]
#[inline(always)]
pub fn map2<A: Copy>(a: &[A], b: &[A], out: &mut [A], f: impl Fn(A, A) -> A) {
    let n = out.len();
    let (a, b) = (&a[..n], &b[..n]);
    let step = global_size_x();
    let gid = global_idx_x();
    let mut done = 0;
    if chunkable(a.as_ptr(), out.as_ptr()) && chunkable(b.as_ptr(), out.as_ptr()) {
        let lanes = 16 / core::mem::size_of::<A>();
        let blocks = n / lanes;
        let mut c = gid;
        while c < blocks {
            // SAFETY: as in `map1`, for all three slices.
            let (x, y) = unsafe {
                (
                    core::ptr::read(a.as_ptr().add(c * lanes) as *const Bytes16),
                    core::ptr::read(b.as_ptr().add(c * lanes) as *const Bytes16),
                )
            };
            let mut r = Bytes16([0; 16]);
            let (xs, ys) = (&x as *const Bytes16 as *const A, &y as *const Bytes16 as *const A);
            let dst = &mut r as *mut Bytes16 as *mut A;
            unroll8!(k, lanes, {
                // SAFETY: k < lanes elements of 16 bytes.
                unsafe { *dst.add(k) = f(*xs.add(k), *ys.add(k)) };
            });
            // SAFETY: as above.
            unsafe { core::ptr::write(out.as_mut_ptr().add(c * lanes) as *mut Bytes16, r) };
            c += step;
        }
        done = blocks * lanes;
    }
    let mut i = done + gid;
    while i < n {
        out[i] = f(a[i], b[i]);
        i += step;
    }
}

/// Innermost dimension of a view (`usize::MAX` for a contiguous one, an empty layout).
#[device]
#[inline(always)]
pub fn innermost(layout: &[usize]) -> usize {
    let nd = layout.len() / 2;
    if nd == 0 {
        usize::MAX
    } else {
        layout[nd - 1]
    }
}

/// Elements `base .. base + VEC` of the view `layout` of `src` (all in bounds), for views
/// of fewer than 2^32 elements whose innermost dimension is at least `VEC` ([`innermost`]),
/// so a run wraps it at most once. A run inside the innermost dimension is one load for a
/// broadcast value (stride 0) or an aligned 16-byte vector (stride 1; contiguous views are
/// this case), else `VEC` loads stepping by the stride; a run across its end finds the
/// start of the part after with one more [`RunStart`]. Indices are constants (the run stays
/// in registers, no stack array).
#[device]
#[inline(always)]
pub fn gather_run<A: Copy>(src: &[A], layout: &[usize], base: usize) -> [A; VEC] {
    let c = RunStart::at(base, layout);
    let len = src.len();
    if c.left >= VEC {
        if c.stride == 0 {
            return [src[c.off]; VEC];
        }
        if c.stride == 1 && c.off + VEC <= len {
            let s = &src[c.off..c.off + VEC];
            if chunkable(s.as_ptr(), s.as_ptr()) {
                // SAFETY: VEC elements in bounds, starting 16-byte aligned; VEC elements of
                // >= 2 bytes are a whole number of 16-byte blocks.
                return unsafe { core::ptr::read(s.as_ptr() as *const Chunk<A>) }.0;
            }
        }
    }
    let after = if c.left < VEC { RunStart::at(base + c.left, layout) } else { c };
    // Offsets chosen without branches and checked once: a bounds check per element would
    // be a divergent branch each, and on the AMD archs every one saves an execution mask
    // in scalar registers (they spill).
    let first = src[c.off];
    let mut r = [first; VEC];
    let mut inside = true;
    unroll8!(k, VEC, {
        let idx = if k < c.left {
            c.off.wrapping_add(k.wrapping_mul(c.stride))
        } else {
            after.off.wrapping_add(k.wrapping_sub(c.left).wrapping_mul(after.stride))
        };
        inside &= idx < len;
        // SAFETY: `idx` is replaced by `c.off` (read above, so in bounds) when outside.
        r[k] = unsafe { *src.get_unchecked(if idx < len { idx } else { c.off }) };
    });
    assert!(inside, "strided view reads past its buffer");
    r
}

/// The run loop of the strided maps: with `runs` (and `out` 16-byte aligned), each
/// work-item takes whole runs of [`VEC`] consecutive outputs, grid-strided, computed by
/// `run` and stored as one vector; the outputs past the last whole run, or all of them
/// without `runs`, go one at a time through `one(i)` in a grid-stride loop (whose run-time
/// step keeps the compiler from unrolling `one`'s divisions into many copies).
#[device]
#[inline(always)]
fn for_each_run<C: Copy>(out: &mut [C], runs: bool, run: impl Fn(usize) -> [C; VEC], one: impl Fn(usize) -> C) {
    let n = out.len();
    let (gid, size) = (global_idx_x(), global_size_x());
    let full = if runs && chunkable(out.as_ptr(), out.as_ptr()) { n / VEC * VEC } else { 0 };
    let mut base = gid * VEC;
    while base < full {
        let r = run(base);
        let dst = &mut out[base..base + VEC];
        // SAFETY: VEC elements in bounds; `out` starts 16-byte aligned and `base` is a
        // multiple of VEC elements of >= 2 bytes, so the chunk is aligned.
        unsafe { core::ptr::write(dst.as_mut_ptr() as *mut Chunk<C>, Chunk(r)) };
        base += size * VEC;
    }
    let mut i = full + gid;
    while i < n {
        out[i] = one(i);
        i += size;
    }
}

/// `out[i] = f(input[layout(i)])` for a strided view: each work-item takes runs of [`VEC`]
/// consecutive outputs (one vector store), reading the view with [`gather_run`], so the
/// index divisions are paid once per run rather than once per element.
#[device]
#[inline(always)]
pub fn map_strided1<A: Copy, B: Copy>(input: &[A], layout: &[usize], out: &mut [B], f: impl Fn(A) -> B) {
    for_each_run(
        out,
        out.len() >> 32 == 0 && innermost(layout) >= VEC,
        |base| {
            let x = gather_run(input, layout, base);
            let mut r = [f(x[0]); VEC];
            unroll8!(k, VEC, {
                r[k] = f(x[k]);
            });
            r
        },
        |i| f(input[strided_offset(i, layout)]),
    );
}

/// `out[i] = f(a[a_layout(i)], b[b_layout(i)])` (see [`map_strided1`]); an empty layout is a
/// contiguous operand, read with vector loads.
#[device]
#[inline(always)]
pub fn map_strided2<A: Copy, B: Copy, C: Copy>(
    a: &[A],
    a_layout: &[usize],
    b: &[B],
    b_layout: &[usize],
    out: &mut [C],
    f: impl Fn(A, B) -> C,
) {
    for_each_run(
        out,
        out.len() >> 32 == 0 && innermost(a_layout) >= VEC && innermost(b_layout) >= VEC,
        |base| {
            let (x, y) = (gather_run(a, a_layout, base), gather_run(b, b_layout, base));
            let mut r = [f(x[0], y[0]); VEC];
            unroll8!(k, VEC, {
                r[k] = f(x[k], y[k]);
            });
            r
        },
        |i| f(a[strided_offset(i, a_layout)], b[strided_offset(i, b_layout)]),
    );
}

/// A scalar function applied elementwise (computed in `f32`).
pub trait UnaryOp: 'static {
    /// The function.
    fn apply(x: f32) -> f32;
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl UnaryOp for $name {
            #[inline(always)]
            fn apply($x: f32) -> f32 { $body }
        }
    )*};
}

/// `sqrt(2/pi)`, used by the tanh form of GELU.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

unary_ops! {
    /// `-x`
    Neg => |x| -x;
    /// `e^x`
    Exp => |x| FloatMath::exp(x);
    /// `ln x`
    Log => |x| FloatMath::ln(x);
    /// `sqrt x`
    Sqrt => |x| FloatMath::sqrt(x);
    /// `|x|`
    Abs => |x| x.abs();
    /// `x^2`
    Sqr => |x| x * x;
    /// `1/x`
    Recip => |x| 1.0 / x;
    /// `max(x, 0)` (NaN stays NaN)
    Relu => |x| if x < 0.0 { 0.0 } else { x };
    /// GELU, tanh approximation: `0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`
    Gelu => |x| 0.5 * x * (1.0 + FloatMath::tanh(SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)));
    /// GELU, exact: `0.5x(1 + erf(x/sqrt 2))`
    GeluErf => |x| 0.5 * x * (1.0 + FloatMath::erf(x * core::f32::consts::FRAC_1_SQRT_2));
    /// SiLU / swish: `x * sigmoid(x)`
    Silu => |x| FloatMath::fast_div(x, 1.0 + FloatMath::exp(-x));
    /// `tanh x`
    Tanh => |x| FloatMath::tanh(x);
    /// `1 / (1 + e^-x)`
    Sigmoid => |x| FloatMath::sigmoid(x);
    /// `erf x`
    Erf => |x| FloatMath::erf(x);
    /// `sin x`
    Sin => |x| FloatMath::sin(x);
    /// `cos x`
    Cos => |x| FloatMath::cos(x);
    /// Round toward negative infinity.
    Floor => |x| FloatMath::floor(x);
    /// Round toward positive infinity.
    Ceil => |x| FloatMath::ceil(x);
    /// Round half away from zero.
    Round => |x| FloatMath::round(x);
    /// `-1`, `0` or `1` (NaN stays NaN)
    Sign => |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x };
}

/// `out[i] = Op(input[layout(i)])`.
#[amdgpu_kernel(
    T = [f32, f16, bf16],
    Op = [Neg, Exp, Log, Sqrt, Abs, Sqr, Recip, Relu, Gelu, GeluErf, Silu, Tanh, Sigmoid, Erf, Sin, Cos, Floor, Ceil, Round, Sign]
)]
pub fn unary<T: Float, Op: UnaryOp>(input: &[T], layout: &[usize], out: &mut [T]) {
    if layout.is_empty() {
        map1(input, out, |x: T| T::from_f32(Op::apply(x.to_f32())));
    } else {
        map_strided1(input, layout, out, |x: T| T::from_f32(Op::apply(x.to_f32())));
    }
}

/// A scalar function with one parameter.
pub trait UnaryParamOp: 'static {
    /// The function.
    fn apply(x: f32, p: f32) -> f32;
}

/// ELU: `x` for `x >= 0`, else `alpha (e^x - 1)`.
pub struct Elu;
impl UnaryParamOp for Elu {
    #[inline(always)]
    fn apply(x: f32, alpha: f32) -> f32 {
        if x >= 0.0 { x } else { alpha * (FloatMath::exp(x) - 1.0) }
    }
}

/// `x^p`.
pub struct Powf;
impl UnaryParamOp for Powf {
    #[inline(always)]
    fn apply(x: f32, p: f32) -> f32 {
        FloatMath::powf(x, p)
    }
}

/// `out[i] = Op(input[layout(i)], param)`.
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Elu, Powf])]
pub fn unary_param<T: Float, Op: UnaryParamOp>(input: &[T], layout: &[usize], out: &mut [T], param: f32) {
    if layout.is_empty() {
        map1(input, out, |x: T| T::from_f32(Op::apply(x.to_f32(), param)));
        return;
    }
    map_strided1(input, layout, out, |x: T| T::from_f32(Op::apply(x.to_f32(), param)));
}

/// `out[i] = input[layout(i)] * mul + add`, computed in `f32`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn affine<T: Float>(input: &[T], layout: &[usize], out: &mut [T], mul: f32, add: f32) {
    if layout.is_empty() {
        map1(input, out, |x: T| T::from_f32(x.to_f32().mul_add(mul, add)));
    } else {
        map_strided1(input, layout, out, |x: T| T::from_f32(x.to_f32().mul_add(mul, add)));
    }
}

/// A binary function (computed in `f32`).
pub trait BinaryOp: 'static {
    /// The function.
    fn apply(a: f32, b: f32) -> f32;
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => |$a:ident, $b:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl BinaryOp for $name {
            #[inline(always)]
            fn apply($a: f32, $b: f32) -> f32 { $body }
        }
    )*};
}

binary_ops! {
    /// `a + b`
    Add => |a, b| a + b;
    /// `a - b`
    Sub => |a, b| a - b;
    /// `a * b`
    Mul => |a, b| a * b;
    /// `a / b`
    Div => |a, b| a / b;
    /// Smaller of the two; NaN if either is NaN (like `torch.minimum`).
    Minimum => |a, b| if a != a || b != b { f32::NAN } else if a < b { a } else { b };
    /// Larger of the two; NaN if either is NaN (like `torch.maximum`).
    Maximum => |a, b| if a != a || b != b { f32::NAN } else if a > b { a } else { b };
}

/// `out[i] = Op(lhs[lhs_layout(i)], rhs[rhs_layout(i)])`; broadcasting through zero
/// strides.
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Add, Sub, Mul, Div, Minimum, Maximum])]
pub fn binary<T: Float, Op: BinaryOp>(lhs: &[T], lhs_layout: &[usize], rhs: &[T], rhs_layout: &[usize], out: &mut [T]) {
    if lhs_layout.is_empty() && rhs_layout.is_empty() {
        map2(lhs, rhs, out, |a: T, b: T| T::from_f32(Op::apply(a.to_f32(), b.to_f32())));
    } else {
        map_strided2(lhs, lhs_layout, rhs, rhs_layout, out, |a: T, b: T| T::from_f32(Op::apply(a.to_f32(), b.to_f32())));
    }
}

/// `out[i] = input[layout(i)] as D` (Rust `as` semantics; half types through `f32`).
#[amdgpu_kernel(S = [f32, f16, bf16, u8, u32, i64], D = [f32, f16, bf16, u8, u32, i64])]
pub fn cast<S: Element, D: Element + CastFrom<S>>(input: &[S], layout: &[usize], out: &mut [D]) {
    if layout.is_empty() {
        map1(input, out, |x: S| D::cast_from(x));
        return;
    }
    map_strided1(input, layout, out, |x: S| D::cast_from(x));
}

/// `out[i] = value`.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32, i64])]
pub fn fill<T: Element>(out: &mut [T], value: T) {
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = value;
        i += step;
    }
}

/// `out[i] = input[layout(i)]`: makes a strided view contiguous.
#[amdgpu_kernel(T = [f32, f16, bf16, u8, u32, i64])]
pub fn copy_strided<T: Element>(input: &[T], layout: &[usize], out: &mut [T]) {
    map_strided1(input, layout, out, |x: T| x);
}

/// Work-group size the elementwise launch helpers use.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub const BLOCK: u32 = 256;

/// Launch shape for `n` elements: one work-item per [`VEC`] elements (the contiguous fast
/// path's chunk), capped at 65536 work-groups; larger sizes and strided views loop inside
/// the kernel (grid-stride), so any shape is correct.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn launch_config(n: usize) -> kernel_dsl::host::LaunchConfig {
    let groups = n.div_ceil(BLOCK as usize * VEC).clamp(1, 65536) as u32;
    kernel_dsl::host::LaunchConfig::new(kernel_dsl::Dim3::x(groups), kernel_dsl::Dim3::x(BLOCK))
}

/// A strided view for [`unary`](fn@unary), [`binary`](fn@binary) and friends: `[dims..., strides...]`, checked
/// against the buffer it reads.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn strided_layout(dims: &[usize], strides: &[usize], buffer_len: usize) -> Result<Vec<usize>, kernel_dsl::host::LaunchError> {
    let invalid = |reason: String| kernel_dsl::host::LaunchError::InvalidArgument { kernel: "elementwise", reason };
    if dims.len() != strides.len() {
        return Err(invalid(format!("{} dims but {} strides", dims.len(), strides.len())));
    }
    let elems: usize = dims.iter().product();
    if elems > 0 {
        let last: usize = dims.iter().zip(strides).map(|(d, s)| (d - 1) * s).sum();
        if last >= buffer_len {
            return Err(invalid(format!(
                "view dims {dims:?} strides {strides:?} reaches element {last} of a buffer of {buffer_len}"
            )));
        }
    }
    Ok(dims.iter().chain(strides).copied().collect())
}
