//! Reductions (sum, max, min, argmax, argmin) over any set of dimensions of any strided
//! view for the dtypes the typed f32/f16/bf16 kernels of [`reduce`](crate::reduce) do not
//! cover: u8, u32, i16, i32, i64, f64 (and f8e4m3). One instance per element size (see
//! [`dtype`](crate::dtype)); one work-group of [`BLOCK`] work-items per output, partial
//! results combined through shared memory.
//!
//! Semantics: integer sums wrap in the element type (Candle's CPU sum in a release build);
//! float sums accumulate in f64 (exact order unspecified: a tree); max/min propagate NaN
//! and argmax/argmin return the first NaN, else the first extreme element (lowest index on
//! ties), as the f32 kernels do. Arg results are `u32` indices into the reduced
//! dimensions, row-major.
use crate::dtype::{decode, encode, is_int, Bits, Val, DT_F64};
use crate::elementwise::strided_offset;
use kernel_dsl::prelude::*;

/// Work-items per work-group.
pub const BLOCK: usize = 256;

/// Op code of sum.
pub const RED_SUM: u32 = 0;
/// Op code of max.
pub const RED_MAX: u32 = 1;
/// Op code of min.
pub const RED_MIN: u32 = 2;

/// A widened value as shared-memory bits (i64 or f64 bits by the dtype).
#[device]
#[inline(always)]
pub fn to_slot(v: Val) -> u64 {
    match v {
        Val::Int(i) => i as u64,
        Val::Float(f) | Val::Wide(f) => f.to_bits(),
    }
}

/// Inverse of [`to_slot`] for dtype `dt`.
#[device]
#[inline(always)]
pub fn from_slot(b: u64, dt: u32) -> Val {
    if is_int(dt) { Val::Int(b as i64) } else { Val::Wide(f64::from_bits(b)) }
}

/// `true` for a float NaN.
#[device]
#[inline(always)]
pub fn is_nan(v: Val) -> bool {
    match v {
        Val::Int(_) => false,
        Val::Float(f) | Val::Wide(f) => f != f,
    }
}

/// Combines two partial results of `op` (NaN-propagating max/min, wrapping integer sums).
#[device]
#[inline(always)]
pub fn combine(a: Val, b: Val, op: u32) -> Val {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Val::Int(match op {
            RED_SUM => x.wrapping_add(y),
            RED_MAX => if y > x { y } else { x },
            _ => if y < x { y } else { x },
        }),
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => Val::Wide(match op {
            RED_SUM => x + y,
            _ if x != x || y != y => f64::NAN,
            RED_MAX => if y > x { y } else { x },
            _ => if y < x { y } else { x },
        }),
        _ => a,
    }
}

/// `true` when `(b, ib)` should replace `(a, ia)` for an arg-reduction (`max`: larger
/// wins; NaN beats everything; ties and NaN-vs-NaN go to the lower index).
#[device]
#[inline(always)]
pub fn arg_better(a: Val, ia: usize, b: Val, ib: usize, max: bool) -> bool {
    let (na, nb) = (is_nan(a), is_nan(b));
    if na || nb {
        return nb && (!na || ib < ia);
    }
    let (gt, lt) = match (a, b) {
        (Val::Int(x), Val::Int(y)) => (y > x, y < x),
        (Val::Float(x) | Val::Wide(x), Val::Float(y) | Val::Wide(y)) => (y > x, y < x),
        _ => (false, false),
    };
    if max { gt || (!lt && ib < ia) } else { lt || (!gt && ib < ia) }
}

/// The element type's value of a finished reduction (small floats rounded once from f64).
#[device]
#[inline(always)]
pub fn finish(v: Val, dt: u32) -> u64 {
    match v {
        Val::Wide(f) if dt != DT_F64 => encode(Val::Float(f), dt),
        _ => encode(v, dt),
    }
}

/// `out[o] = op(row o)`, row `o` = elements `strided_offset(o*r + j, layout)` for `j < r`
/// (`layout` = the view's dims and strides permuted so the reduced dims come last). One
/// work-group of [`BLOCK`] per output, `grid.x` groups looping over the outputs.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn reduce_any<B: Bits>(input: &[B], layout: &[usize], out: &mut [B], r: usize, dt: u32, op: u32, mut vals: Shared<u64, BLOCK>) {
    let tid = flat_thread_idx() as usize;
    let mut o = block_idx_x() as usize;
    while o < out.len() {
        let mut acc = Val::Int(0);
        let mut first = true;
        let mut j = tid;
        while j < r {
            let v = decode(input[strided_offset(o * r + j, layout)].to_u64(), dt);
            acc = if first { v } else { combine(acc, v, op) };
            first = false;
            j += BLOCK;
        }
        if first {
            // No element for this work-item: the identity of a sum; for max/min a copy of
            // the row's first element (rows are never empty then), which changes nothing.
            acc = if op != RED_SUM {
                decode(input[strided_offset(o * r, layout)].to_u64(), dt)
            } else if is_int(dt) {
                Val::Int(0)
            } else {
                Val::Wide(0.0)
            };
        }
        vals[tid] = to_slot(acc);
        barrier();
        let mut s = BLOCK / 2;
        while s > 0 {
            if tid < s {
                let a = from_slot(vals[tid], dt);
                vals[tid] = to_slot(combine(a, from_slot(vals[tid + s], dt), op));
            }
            barrier();
            s /= 2;
        }
        if tid == 0 {
            out[o] = B::from_u64(finish(from_slot(vals[0], dt), dt));
        }
        barrier();
        o += grid_dim_x() as usize;
    }
}

/// Index of the extreme element of each row (rows as in [`reduce_any`](fn@reduce_any));
/// `max != 0` for argmax.
#[amdgpu_kernel(B = [u8, u16, u32, u64])]
pub fn argreduce_any<B: Bits>(input: &[B], layout: &[usize], out: &mut [u32], r: usize, dt: u32, max: u32, mut vals: Shared<u64, BLOCK>, mut idx: Shared<u64, BLOCK>) {
    let tid = flat_thread_idx() as usize;
    let is_max = max != 0;
    let mut o = block_idx_x() as usize;
    while o < out.len() {
        // Work-items without an element start from element 0 (a valid candidate).
        let mut best = decode(input[strided_offset(o * r, layout)].to_u64(), dt);
        let mut bi = 0usize;
        let mut j = tid;
        while j < r {
            let v = decode(input[strided_offset(o * r + j, layout)].to_u64(), dt);
            if arg_better(best, bi, v, j, is_max) {
                best = v;
                bi = j;
            }
            j += BLOCK;
        }
        vals[tid] = to_slot(best);
        idx[tid] = bi as u64;
        barrier();
        let mut s = BLOCK / 2;
        while s > 0 {
            if tid < s {
                let (a, ia) = (from_slot(vals[tid], dt), idx[tid] as usize);
                let (b, ib) = (from_slot(vals[tid + s], dt), idx[tid + s] as usize);
                if arg_better(a, ia, b, ib, is_max) {
                    vals[tid] = to_slot(b);
                    idx[tid] = ib as u64;
                }
            }
            barrier();
            s /= 2;
        }
        if tid == 0 {
            out[o] = idx[0] as u32;
        }
        barrier();
        o += grid_dim_x() as usize;
    }
}

/// Checked launches.
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod ops {
    use crate::convert::ops::LayoutArg;
    use crate::dtype::host::{arg_len, expect_len, invalid, product, DType, Raw};
    use crate::runtime::Device;
    use kernel_dsl::host::{KernelArgSlice, KernelArgSliceMut, LaunchConfig, LaunchError};
    use kernel_dsl::Dim3;

    /// A reduction.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ReduceOp {
        /// Sum (integers wrap).
        Sum,
        /// Maximum (NaN propagates).
        Max,
        /// Minimum (NaN propagates).
        Min,
    }

    /// The view permuted so the reduced dims come last: `(dims, strides, outputs, r)`.
    fn plan(k: &'static str, dims: &[usize], strides: &[usize], reduce: &[usize], len: usize) -> Result<(Vec<usize>, Vec<usize>, usize, usize), LaunchError> {
        if dims.len() != strides.len() {
            return Err(invalid(k, format!("{} dims but {} strides", dims.len(), strides.len())));
        }
        let mut seen = vec![false; dims.len()];
        for &d in reduce {
            if d >= dims.len() || std::mem::replace(&mut seen[d], true) {
                return Err(invalid(k, format!("reduce dims {reduce:?} must be distinct dims of a rank-{} view", dims.len())));
            }
        }
        let order: Vec<usize> = (0..dims.len()).filter(|&d| !seen[d]).chain((0..dims.len()).filter(|&d| seen[d])).collect();
        let pd: Vec<usize> = order.iter().map(|&d| dims[d]).collect();
        let ps: Vec<usize> = order.iter().map(|&d| strides[d]).collect();
        let total = product(k, dims)?;
        let r = product(k, &reduce.iter().map(|&d| dims[d]).collect::<Vec<_>>())?;
        let outputs = product(k, &(0..dims.len()).filter(|&d| !seen[d]).map(|d| dims[d]).collect::<Vec<_>>())?;
        crate::dtype::host::view_layout(k, "input", dims, strides, total, len)?;
        Ok((pd, ps, outputs, r))
    }

    fn config(outputs: usize) -> LaunchConfig {
        LaunchConfig::new(Dim3::x(outputs.clamp(1, 65535) as u32), Dim3::x(super::BLOCK as u32))
    }

    /// `out` = `op` over dims `reduce` of the view `(dims, strides)` of `input`; `out` holds
    /// the kept dims in order (contiguous). Any dtype (meant for the integers, f64 and
    /// f8e4m3; f32/f16/bf16 have [`reduce::reduce`](crate::reduce)). Max/min of an empty
    /// set is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        dims: &[usize],
        strides: &[usize],
        reduce: &[usize],
        op: ReduceOp,
        out: &mut (impl KernelArgSliceMut<T> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "reduce_any";
        let (pd, ps, outputs, r) = plan(K, dims, strides, reduce, arg_len(input))?;
        expect_len(K, "out", arg_len(out), outputs)?;
        if r == 0 && op != ReduceOp::Sum && outputs > 0 {
            return Err(invalid(K, format!("{op:?} over an empty set of elements")));
        }
        if outputs == 0 {
            return Ok(());
        }
        let opc = match op {
            ReduceOp::Sum => super::RED_SUM,
            ReduceOp::Max => super::RED_MAX,
            ReduceOp::Min => super::RED_MIN,
        };
        let layout: Vec<usize> = pd.into_iter().chain(ps).collect();
        let l = LayoutArg::new(dev, K, "input", Some((&layout[..layout.len() / 2], &layout[layout.len() / 2..])), outputs * r, usize::MAX)?;
        let (i, o, la) = (Raw(input.kernel_arg()), out.kernel_arg(), l.arg());
        let cfg = config(outputs);
        match std::mem::size_of::<T::Bits>() {
            1 => super::reduce_any::launch::<u8>(dev, cfg, &i, &la, &mut Raw(o), r, T::CODE, opc),
            2 => super::reduce_any::launch::<u16>(dev, cfg, &i, &la, &mut Raw(o), r, T::CODE, opc),
            4 => super::reduce_any::launch::<u32>(dev, cfg, &i, &la, &mut Raw(o), r, T::CODE, opc),
            _ => super::reduce_any::launch::<u64>(dev, cfg, &i, &la, &mut Raw(o), r, T::CODE, opc),
        }
    }

    /// argmax (`max = true`) or argmin over dims `reduce` (as `u32` row-major indices into
    /// the reduced dims); an empty set is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn arg_reduce<T: DType>(
        dev: &Device,
        input: &(impl KernelArgSlice<T> + ?Sized),
        dims: &[usize],
        strides: &[usize],
        reduce: &[usize],
        max: bool,
        out: &mut (impl KernelArgSliceMut<u32> + ?Sized),
    ) -> Result<(), LaunchError> {
        const K: &str = "argreduce_any";
        let (pd, ps, outputs, r) = plan(K, dims, strides, reduce, arg_len(input))?;
        expect_len(K, "out", arg_len(out), outputs)?;
        if r == 0 && outputs > 0 {
            return Err(invalid(K, "arg-reduction over an empty set of elements".into()));
        }
        if r > u32::MAX as usize {
            return Err(invalid(K, format!("{r} reduced elements do not fit u32 indices")));
        }
        if outputs == 0 {
            return Ok(());
        }
        let layout: Vec<usize> = pd.into_iter().chain(ps).collect();
        let l = LayoutArg::new(dev, K, "input", Some((&layout[..layout.len() / 2], &layout[layout.len() / 2..])), outputs * r, usize::MAX)?;
        let (i, la) = (Raw(input.kernel_arg()), l.arg());
        let cfg = config(outputs);
        let m = max as u32;
        match std::mem::size_of::<T::Bits>() {
            1 => super::argreduce_any::launch::<u8>(dev, cfg, &i, &la, out, r, T::CODE, m),
            2 => super::argreduce_any::launch::<u16>(dev, cfg, &i, &la, out, r, T::CODE, m),
            4 => super::argreduce_any::launch::<u32>(dev, cfg, &i, &la, out, r, T::CODE, m),
            _ => super::argreduce_any::launch::<u64>(dev, cfg, &i, &la, out, r, T::CODE, m),
        }
    }
}
