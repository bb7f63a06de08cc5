//! Elementwise kernels: unary maps, binary ops with broadcasting, affine, casts, fill and
//! strided copies, for `f32`, `f16` and `bf16` (half types compute in `f32`).
//!
//! Layouts: a kernel reads its inputs either contiguously (pass an empty `layout`) or
//! through a strided view described by `layout = [dims..., strides...]` (element units,
//! row-major, the output's shape; a stride of 0 broadcasts). Outputs are contiguous.
use kernel_dsl::prelude::*;

/// Offset of logical element `i` in a strided view `layout = [dims..., strides...]`;
/// `i` itself when the layout is empty (contiguous).
#[device]
#[inline(always)]
pub fn strided_offset(i: usize, layout: &[usize]) -> usize {
    let nd = layout.len() / 2;
    if nd == 0 {
        return i;
    }
    let (dims, strides) = layout.split_at(nd);
    let mut rem = i;
    let mut off = 0;
    let mut d = nd;
    while d > 0 {
        d -= 1;
        let dim = dims[d];
        off += (rem % dim) * strides[d];
        rem /= dim;
    }
    off
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
    /// GELU, tanh approximation: `0.5x(1 + tanh(u))`, `u = sqrt(2/pi)(x + 0.044715x^3)`,
    /// evaluated as the identical `x / (1 + e^(-2u))`: one exponential and one reciprocal,
    /// no branch (the tanh form is compute-bound on GEGLU-sized tensors), and no
    /// cancellation in `1 + tanh u` for negative `x`.
    Gelu => |x| FloatMath::fast_div(x, 1.0 + FloatMath::exp(-2.0 * SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)));
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
        let n = out.len();
        let step = global_size_x();
        let mut i = global_idx_x();
        while i < n {
            out[i] = T::from_f32(Op::apply(input[strided_offset(i, layout)].to_f32()));
            i += step;
        }
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
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = T::from_f32(Op::apply(input[strided_offset(i, layout)].to_f32(), param));
        i += step;
    }
}

/// `out[i] = input[layout(i)] * mul + add`, computed in `f32`.
#[amdgpu_kernel(T = [f32, f16, bf16])]
pub fn affine<T: Float>(input: &[T], layout: &[usize], out: &mut [T], mul: f32, add: f32) {
    if layout.is_empty() {
        map1(input, out, |x: T| T::from_f32(x.to_f32().mul_add(mul, add)));
    } else {
        let n = out.len();
        let step = global_size_x();
        let mut i = global_idx_x();
        while i < n {
            out[i] = T::from_f32(input[strided_offset(i, layout)].to_f32().mul_add(mul, add));
            i += step;
        }
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
        let n = out.len();
        let step = global_size_x();
        let mut i = global_idx_x();
        while i < n {
            let a = lhs[strided_offset(i, lhs_layout)].to_f32();
            let b = rhs[strided_offset(i, rhs_layout)].to_f32();
            out[i] = T::from_f32(Op::apply(a, b));
            i += step;
        }
    }
}

/// One operand's run of [`VEC`] consecutive outputs in a `*_runs` kernel, starting at
/// element `off`: the broadcast value (`inner` = 0), one aligned vector (`vector`), or `VEC`
/// loads `inner` apart.
#[device]
#[inline(always)]
fn load_run<T: Copy>(src: &[T], off: u32, inner: u32, vector: bool) -> Chunk<T> {
    let p = src.as_ptr();
    let off = off as usize;
    // SAFETY: the kernel checked once (`RunGrid::view`) that the view's last offset is
    // inside `src`, and every offset of a run is at most that; `vector` only where
    // `p + off` is 16-byte aligned (`RunGrid::vector`).
    unsafe {
        if inner == 0 {
            Chunk([*p.add(off); VEC])
        } else if vector {
            core::ptr::read(p.add(off) as *const Chunk<T>)
        } else {
            let mut c = Chunk([*p.add(off); VEC]);
            unroll8!(k, VEC, {
                c.0[k] = *p.add(off + k * inner as usize);
            });
            c
        }
    }
}

/// The walk of the `*_runs` kernels over an output of `n` elements viewed as `[d0, d1,
/// d2]` (`d2` a multiple of [`VEC`]): runs of `VEC` consecutive outputs, which never cross a
/// row, handed out grid-stride with two 32-bit divisions per run.
#[derive(Clone, Copy)]
struct RunGrid {
    d0: usize,
    d1: u32,
    d2: u32,
    runs: u32,
}

impl RunGrid {
    /// Checks the shape once (traps when `d2` is no multiple of `VEC`, `d1 d2` does not
    /// divide `n`, or `n >= 2^32`).
    #[inline(always)]
    fn new(n: usize, d1: u32, d2: u32) -> RunGrid {
        let plane = d1 as usize * d2 as usize;
        assert!(d2 as usize % VEC == 0 && plane > 0 && n % plane == 0 && n <= u32::MAX as usize);
        RunGrid { d0: n / plane, d1, d2, runs: (n / VEC) as u32 }
    }

    /// Checks that the view with strides `s` stays inside `len` elements and below 2^32
    /// (traps otherwise): the one bounds check of the kernel.
    #[inline(always)]
    fn view(self, s: [u32; 3], len: usize) {
        let last = ((self.d0 - 1) * s[0] as usize)
            .saturating_add((self.d1 as usize - 1) * s[1] as usize)
            .saturating_add((self.d2 as usize - 1) * s[2] as usize);
        assert!(last < len && last <= u32::MAX as usize);
    }

    /// Whether the view with strides `s` of the slice at `p` reads each run as one aligned
    /// vector: inner stride 1, a 16-byte aligned start, rows that are multiples of `VEC`,
    /// elements of 2 bytes or more (so a run is a whole number of 16-byte blocks).
    #[inline(always)]
    fn vector<T>(s: [u32; 3], p: *const T) -> bool {
        s[2] == 1 && Self::out_vector(p) && (s[0] | s[1]) as usize % VEC == 0
    }

    /// Whether a contiguous output at `p` takes each run as one aligned vector store.
    #[inline(always)]
    fn out_vector<T>(p: *const T) -> bool {
        core::mem::size_of::<T>() >= 2 && p as usize % 16 == 0
    }

    /// Calls `f(run, offset of each view)` for this work-item's runs; `run * VEC` is the
    /// first output of the run.
    #[inline(always)]
    fn for_each<const K: usize>(self, s: [[u32; 3]; K], mut f: impl FnMut(u32, [u32; K])) {
        let row_runs = self.d2 / VEC as u32;
        let step = global_size_x() as u32;
        let mut q = global_idx_x() as u32;
        while q < self.runs {
            let (t, c) = (q / row_runs, q % row_runs);
            let (i0, i1, i2) = (t / self.d1, t % self.d1, c * VEC as u32);
            // At most the view's checked last offset: no wrap-around.
            let off = s.map(|s| i0.wrapping_mul(s[0]).wrapping_add(i1.wrapping_mul(s[1])).wrapping_add(i2.wrapping_mul(s[2])));
            f(q, off);
            q += step;
        }
    }
}

/// Writes run `q` of a `*_runs` kernel's contiguous output: one vector store per 16 bytes
/// where `VECTOR` (the output passed [`RunGrid::out_vector`]), else element by element.
/// Only for `q < out.len() / VEC` (what [`RunGrid::for_each`] hands out). The kernels pick
/// `VECTOR` once, outside their run loop: a choice per run lets the compiler merge the two
/// stores into element stores.
#[device]
#[inline(always)]
fn store_run<T: Copy, const VECTOR: bool>(out: &mut [T], q: u32, r: Chunk<T>) {
    let o = q as usize * VEC;
    // SAFETY: o + VEC <= out.len() (q < runs = out.len() / VEC); the vector stores only
    // where `out` starts on 16 bytes and elements are >= 2 bytes (o * size: a multiple of 16).
    unsafe {
        let dst = out.as_mut_ptr().add(o);
        if VECTOR {
            let (from, to) = (&r as *const Chunk<T> as *const Bytes16, dst as *mut Bytes16);
            unroll8!(w, core::mem::size_of::<Chunk<T>>() / 16, {
                core::ptr::write(to.add(w), *from.add(w));
            });
        } else {
            unroll8!(k, VEC, {
                *dst.add(k) = r.0[k];
            });
        }
    }
}

/// Runs `$walk` (a run loop storing with `store_run::<_, $v>`) with `$v` = whether the
/// output at `$out` takes vector stores, decided once per launch.
macro_rules! with_store {
    ($out:expr, $v:ident => $walk:expr) => {
        if RunGrid::out_vector($out.as_ptr()) {
            const $v: bool = true;
            $walk
        } else {
            const $v: bool = false;
            $walk
        }
    };
}

/// The one-operand run kernels' body: `out = f(input)` run by run over the `[d0, d1, d2]`
/// view of `input` with strides `s` (one check of the shape and the view, then the walk).
#[device]
#[inline(always)]
fn map_runs<T: Copy>(input: &[T], out: &mut [T], d1: u32, d2: u32, s: [u32; 3], f: impl Fn(Chunk<T>) -> Chunk<T>) {
    if out.is_empty() {
        return;
    }
    let g = RunGrid::new(out.len(), d1, d2);
    g.view(s, input.len());
    let v = RunGrid::vector(s, input.as_ptr());
    with_store!(out, OV => g.for_each([s], |q, [o]| store_run::<T, OV>(out, q, f(load_run(input, o, s[2], v)))));
}

/// `out = Op(input)` over a view of three dimensions `[d0, d1, d2]` with element strides
/// `[s0, s1, s2]` (`d0 = out.len() / (d1 d2)`, `d2` a multiple of [`VEC`]): the run walk of
/// [`binary_runs`](fn@binary_runs) for one operand (a GEGLU half, a narrowed or transposed
/// activation). Traps when the shape is not such a view or it reaches past `input`.
#[allow(clippy::too_many_arguments)]
#[amdgpu_kernel(
    T = [f32, f16, bf16],
    Op = [Neg, Exp, Log, Sqrt, Abs, Sqr, Recip, Relu, Gelu, GeluErf, Silu, Tanh, Sigmoid, Erf, Sin, Cos, Floor, Ceil, Round, Sign]
)]
pub fn unary_runs<T: Float, Op: UnaryOp>(input: &[T], out: &mut [T], d1: u32, d2: u32, s0: u32, s1: u32, s2: u32) {
    map_runs(input, out, d1, d2, [s0, s1, s2], |a: Chunk<T>| {
        let mut r = a;
        unroll8!(k, VEC, {
            r.0[k] = T::from_f32(Op::apply(a.0[k].to_f32()));
        });
        r
    });
}

/// `out = input` over a view of three dimensions `[d0, d1, d2]` with element strides
/// `[s0, s1, s2]` (`d2` a multiple of [`VEC`]): [`unary_runs`](fn@unary_runs)'s walk moving
/// bits (a narrowed, sliced or concatenated view made contiguous). Views whose innermost
/// dimension is strided are better served by `permute::transpose_copy`. Traps as
/// `unary_runs` does.
#[allow(clippy::too_many_arguments)]
#[amdgpu_kernel(T = [u8, f16, bf16, u32, i64])]
pub fn copy_runs<T: Element>(input: &[T], out: &mut [T], d1: u32, d2: u32, s0: u32, s1: u32, s2: u32) {
    map_runs(input, out, d1, d2, [s0, s1, s2], |a: Chunk<T>| a);
}

/// `out = Op(lhs, rhs)` over a view of three dimensions `[d0, d1, d2]` (`d0 = out.len() /
/// (d1 d2)`; `d2` a multiple of [`VEC`]), each operand with its own element strides
/// `[s0, s1, s2]` (0 broadcasts). Every work-item takes runs of `VEC` consecutive outputs,
/// which never cross a row: each operand's run is one broadcast load, one aligned vector
/// (inner stride 1) or `VEC` strided loads, and the output one vector store. Two 32-bit
/// divisions per run and none per element; each view is bounds-checked once, not per load.
/// Broadcast biases and residuals of image and token shapes are this case once the views
/// are coalesced; the host picks it with [`RunView`].
///
/// Traps when `d2` is no multiple of `VEC`, `d1 d2` does not divide `out.len()`, the output
/// has 2^32 elements or more, or a view reaches past its operand or past element 2^32.
#[allow(clippy::too_many_arguments)]
#[amdgpu_kernel(T = [f32, f16, bf16], Op = [Add, Sub, Mul, Div, Minimum, Maximum])]
pub fn binary_runs<T: Float, Op: BinaryOp>(
    lhs: &[T],
    rhs: &[T],
    out: &mut [T],
    d1: u32,
    d2: u32,
    ls0: u32,
    ls1: u32,
    ls2: u32,
    rs0: u32,
    rs1: u32,
    rs2: u32,
) {
    if out.is_empty() {
        return;
    }
    let g = RunGrid::new(out.len(), d1, d2);
    let (ls, rs) = ([ls0, ls1, ls2], [rs0, rs1, rs2]);
    g.view(ls, lhs.len());
    g.view(rs, rhs.len());
    let (lv, rv) = (RunGrid::vector(ls, lhs.as_ptr()), RunGrid::vector(rs, rhs.as_ptr()));
    with_store!(out, OV => g.for_each([ls, rs], |q, [lo, ro]| {
        let a = load_run(lhs, lo, ls2, lv);
        let b = load_run(rhs, ro, rs2, rv);
        let mut r = a;
        unroll8!(k, VEC, {
            r.0[k] = T::from_f32(Op::apply(a.0[k].to_f32(), b.0[k].to_f32()));
        });
        store_run::<T, OV>(out, q, r);
    }));
}

/// `out[i] = input[layout(i)] as D` (Rust `as` semantics; half types through `f32`).
#[amdgpu_kernel(S = [f32, f16, bf16, u8, u32, i64], D = [f32, f16, bf16, u8, u32, i64])]
pub fn cast<S: Element, D: Element + CastFrom<S>>(input: &[S], layout: &[usize], out: &mut [D]) {
    if layout.is_empty() {
        map1(input, out, |x: S| D::cast_from(x));
        return;
    }
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = D::cast_from(input[strided_offset(i, layout)]);
        i += step;
    }
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
    let n = out.len();
    let step = global_size_x();
    let mut i = global_idx_x();
    while i < n {
        out[i] = input[strided_offset(i, layout)];
        i += step;
    }
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

/// The shape arguments of [`unary_runs`](fn@unary_runs) (`K` = 1) and
/// [`binary_runs`](fn@binary_runs) (`K` = 2) for an op over `dims` with the element strides of
/// each operand (each of `dims`'s length; coalesce them first), when those kernels apply:
/// at most three dimensions, the innermost a multiple of [`VEC`], fewer than 2^32 outputs
/// and offsets. `None` otherwise (the general strided kernels take those).
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunView<const K: usize> {
    /// Middle dimension.
    pub d1: u32,
    /// Innermost dimension (a multiple of `VEC`).
    pub d2: u32,
    /// Each operand's strides `[s0, s1, s2]`.
    pub strides: [[u32; 3]; K],
}

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
impl<const K: usize> RunView<K> {
    /// See [`RunView`].
    pub fn new(dims: &[usize], strides: [&[usize]; K]) -> Option<RunView<K>> {
        if dims.is_empty() || dims.contains(&0) || dims[dims.len() - 1] % VEC != 0 {
            return None;
        }
        let (mut shape, mut out) = (None, [[0u32; 3]; K]);
        for (o, s) in out.iter_mut().zip(strides) {
            let (d, st) = view3(dims, s)?;
            (shape, *o) = (Some(d), st);
        }
        let [_, d1, d2] = shape?;
        Some(RunView { d1, d2, strides: out })
    }
}

/// A view of at most three dimensions as exactly three, in 32 bits: leading dimensions of
/// size 1 (stride 0) added, then `(dims, strides)`. `None` when there are more than three
/// dimensions, the two lengths differ, or a size, a stride, the element count or the last
/// offset reaches 2^32. The shape check [`RunView`] and `permute::TransposeView` share.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub fn view3(dims: &[usize], strides: &[usize]) -> Option<([u32; 3], [u32; 3])> {
    if dims.len() > 3 || strides.len() != dims.len() {
        return None;
    }
    let pad = 3 - dims.len();
    let (mut d, mut s) = ([1u32; 3], [0u32; 3]);
    for k in 0..dims.len() {
        d[pad + k] = u32::try_from(dims[k]).ok()?;
        s[pad + k] = u32::try_from(strides[k]).ok()?;
    }
    let n: u128 = d.iter().map(|&v| v as u128).product();
    let last: u128 = d.iter().zip(&s).map(|(&d, &s)| (d as u128).saturating_sub(1) * s as u128).sum();
    (n <= u32::MAX as u128 && last <= u32::MAX as u128).then_some((d, s))
}
