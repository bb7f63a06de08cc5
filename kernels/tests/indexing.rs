//! Indexing kernels (index_select, gather, scatter_add, index_add, where_cond, copy2d, cat)
//! against plain Rust references written here, for every element type and both index
//! types, on the CPU executor with waves of 32 and 64 lanes and on any GPU this build can
//! open.
//!
//! Pure data movement is compared bit for bit (NaN, infinities and -0.0 must pass through
//! unchanged; out-of-range ids must give exactly zero). The adds (`scatter_add`,
//! `index_add`) are compared with an f64 reference within the rounding-error bound of
//! their evaluation order: the kernel adds the k contributions of an element one by one,
//! rounding each partial sum to the element type (unit roundoff u = 2^-24, 2^-11, 2^-8 for
//! f32, f16, bf16), so |got - exact| <= (k + 1) * u * (|dst0| + sum |src|) (k roundings of
//! partial sums bounded by that magnitude, plus the rounding of the inputs themselves is
//! already in the reference) plus a subnormal term. Dropping or repeating one contribution
//! is far outside that bound.
use half::{bf16, f16};
use kernel_dsl::host::{Executor, LaunchConfig, LaunchError};
use kernel_dsl::{Dim3, Element};
use kernels::indexing::{self as ix, ops, ops::View, CondType, IndexType, Pod};
use kernels::runtime::DeviceVec;
use std::fmt::Debug;

mod common;
use common::*;

/// Element types of the data-movement tests: built from f64 test values, compared by bits.
trait Data: Pod + Debug {
    fn from_f64(v: f64) -> Self;
    fn bits(self) -> u64;
}
impl Data for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}
impl Data for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}
impl Data for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}
impl Data for u8 {
    fn from_f64(v: f64) -> Self {
        (v * 1000.0) as i64 as u8
    }
    fn bits(self) -> u64 {
        self as u64
    }
}
impl Data for u32 {
    fn from_f64(v: f64) -> Self {
        (v * 1e7) as i64 as u32
    }
    fn bits(self) -> u64 {
        self as u64
    }
}

/// Index types, with the reference's own reading of an index.
trait Ix: IndexType + Debug {
    fn from_i64(v: i64) -> Self;
    /// The row an index selects among `len`, or `None` (out of range or negative).
    fn row(self, len: usize) -> Option<usize>;
}
impl Ix for u32 {
    fn from_i64(v: i64) -> Self {
        v as u32
    }
    fn row(self, len: usize) -> Option<usize> {
        ((self as u64) < len as u64).then_some(self as usize)
    }
}
impl Ix for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
    fn row(self, len: usize) -> Option<usize> {
        (self >= 0 && (self as u64) < len as u64).then_some(self as usize)
    }
}

fn data<T: Data>(n: usize, seed: u64, specials: bool) -> Vec<T> {
    inputs(n, -100.0, 100.0, seed, specials).into_iter().map(T::from_f64).collect()
}

/// `n` ids in `0..dim`, and with `oob` every fifth one out of range: `dim`, `dim + 3`,
/// `-1`, `i64::MIN`, `2^32 + 1` (which a kernel truncating i64 to 32 bits would read as 1).
fn ids<I: Ix>(n: usize, dim: usize, seed: u64, oob: bool) -> Vec<I> {
    let bad = [dim as i64, dim as i64 + 3, -1, i64::MIN, (1i64 << 32) + 1];
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if oob && i % 5 == 2 {
                I::from_i64(bad[(i / 5) % bad.len()])
            } else {
                I::from_i64(((s >> 33) % dim.max(1) as u64) as i64)
            }
        })
        .collect()
}

fn assert_same<T: Data>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.bits() == w.bits(), "{what}: element {i}: got {g:?}, want {w:?}");
    }
}

fn name<T: Element, I: Element>() -> String {
    format!("<{}, {}>", T::NAME, I::NAME)
}

// ---------------------------------------------------------------------------------------
// index_select

fn ref_index_select<T: Data, I: Ix>(src: impl Fn(usize, usize, usize) -> T, ids: &[I], left: usize, src_dim: usize, right: usize) -> Vec<T> {
    let mut out = Vec::new();
    for l in 0..left {
        for id in ids {
            for r in 0..right {
                out.push(match id.row(src_dim) {
                    Some(d) => src(l, d, r),
                    None => T::ZERO,
                });
            }
        }
    }
    out
}

/// (left, src_dim, right, n): unit sizes, odd sizes, rows of 16 bytes and more (vector path).
const SELECT_SHAPES: [(usize, usize, usize, usize); 7] =
    [(1, 1, 1, 1), (1, 7, 1, 7), (7, 7, 7, 7), (3, 5, 16, 9), (2, 33, 8, 4), (1, 10, 64, 13), (5, 3, 1, 11)];

fn run_index_select<T: Data, I: Ix>() {
    for exec in executors() {
        for (k, &(left, src_dim, right, n)) in SELECT_SHAPES.iter().enumerate() {
            let what = format!("index_select{} {left}x{src_dim}x{right} n={n} on {}", name::<T, I>(), exec.name());
            let src: Vec<T> = data(left * src_dim * right, k as u64, true);
            let id: Vec<I> = ids(n, src_dim, 10 + k as u64, true);
            let want = ref_index_select(|l, d, r| src[(l * src_dim + d) * right + r], &id, left, src_dim, right);
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dout = exec.upload(&vec![T::from_f64(0.007); want.len()]).unwrap();
            ops::index_select(&exec, &ds, None, &di, &mut dout, left, src_dim, right).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &what);

            // The same logical source stored transposed, (right, left, src_dim), read
            // through a view.
            let phys: Vec<T> = data(left * src_dim * right, 50 + k as u64, true);
            let view = View::new(&exec, &[left, src_dim, right], &[src_dim, 1, left * src_dim]).unwrap();
            let want = ref_index_select(|l, d, r| phys[r * left * src_dim + l * src_dim + d], &id, left, src_dim, right);
            let dp = exec.upload(&phys).unwrap();
            ops::index_select(&exec, &dp, Some(&view), &di, &mut dout, left, src_dim, right).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("{what}, transposed view"));

            // One (src_dim, right) table broadcast over `left` (stride 0).
            let table: Vec<T> = data(src_dim * right, 70 + k as u64, true);
            let view = View::new(&exec, &[left, src_dim, right], &[0, right, 1]).unwrap();
            let want = ref_index_select(|_, d, r| table[d * right + r], &id, left, src_dim, right);
            let dt = exec.upload(&table).unwrap();
            ops::index_select(&exec, &dt, Some(&view), &di, &mut dout, left, src_dim, right).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("{what}, broadcast view"));
        }
    }
}

#[test]
fn index_select_all_types() {
    run_index_select::<f32, u32>();
    run_index_select::<f32, i64>();
    run_index_select::<f16, u32>();
    run_index_select::<f16, i64>();
    run_index_select::<bf16, u32>();
    run_index_select::<bf16, i64>();
    run_index_select::<u8, u32>();
    run_index_select::<u8, i64>();
    run_index_select::<u32, u32>();
    run_index_select::<u32, i64>();
}

/// An embedding lookup: 64 token ids (first and last rows, repeats) into a 32000 x 4096
/// bf16 table.
#[test]
fn index_select_embedding_table() {
    const ROWS: usize = 32000;
    const HIDDEN: usize = 4096;
    let table: Vec<bf16> = (0..ROWS * HIDDEN)
        .map(|k| bf16::from_bits(((k as u32).wrapping_mul(2654435761) >> 16) as u16))
        .collect();
    let mut tokens: Vec<i64> = ids::<i64>(64, ROWS, 99, false);
    tokens[0] = 0;
    tokens[1] = ROWS as i64 - 1;
    tokens[2] = tokens[5];
    let want = ref_index_select(|_, d, r| table[d * HIDDEN + r], &tokens, 1, ROWS, HIDDEN);
    for exec in executors() {
        let dt = exec.upload(&table).unwrap();
        for wide in [false, true] {
            let mut dout = exec.alloc::<bf16>(64 * HIDDEN).unwrap();
            if wide {
                let di = exec.upload(&tokens).unwrap();
                ops::index_select(&exec, &dt, None, &di, &mut dout, 1, ROWS, HIDDEN).unwrap();
            } else {
                let t32: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
                let di = exec.upload(&t32).unwrap();
                ops::index_select(&exec, &dt, None, &di, &mut dout, 1, ROWS, HIDDEN).unwrap();
            }
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("embedding (i64 ids: {wide}) on {}", exec.name()));
        }
    }
}

// ---------------------------------------------------------------------------------------
// gather

/// (left, src_dim, n, right).
const GATHER_SHAPES: [(usize, usize, usize, usize); 6] = [(1, 1, 1, 1), (1, 7, 7, 1), (7, 7, 7, 7), (3, 4, 9, 16), (2, 9, 3, 33), (4, 1, 5, 3)];

fn run_gather<T: Data, I: Ix>() {
    for exec in executors() {
        for (k, &(left, src_dim, n, right)) in GATHER_SHAPES.iter().enumerate() {
            let what = format!("gather{} {left}x{src_dim}x{right} n={n} on {}", name::<T, I>(), exec.name());
            let src: Vec<T> = data(left * src_dim * right, 20 + k as u64, true);
            let id: Vec<I> = ids(left * n * right, src_dim, 30 + k as u64, true);
            let mut want = Vec::new();
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        want.push(match id[(l * n + i) * right + r].row(src_dim) {
                            Some(d) => src[(l * src_dim + d) * right + r],
                            None => T::ZERO,
                        });
                    }
                }
            }
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dout = exec.upload(&vec![T::from_f64(0.007); want.len()]).unwrap();
            ops::gather(&exec, &ds, &di, &mut dout, left, src_dim, n, right).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &what);
        }
    }
}

#[test]
fn gather_all_types() {
    run_gather::<f32, u32>();
    run_gather::<f32, i64>();
    run_gather::<f16, u32>();
    run_gather::<f16, i64>();
    run_gather::<bf16, u32>();
    run_gather::<bf16, i64>();
    run_gather::<u8, u32>();
    run_gather::<u8, i64>();
    run_gather::<u32, u32>();
    run_gather::<u32, i64>();
}

// ---------------------------------------------------------------------------------------
// scatter_add and index_add

/// Unit roundoff of the element type.
fn unit_roundoff<T: Element>() -> f64 {
    match T::NAME {
        "f32" => 2f64.powi(-24),
        "f16" => 2f64.powi(-11),
        "bf16" => 2f64.powi(-8),
        other => panic!("no roundoff for {other}"),
    }
}

/// Checks `got` against `dst0 + contributions` (per element: the list of added values),
/// within the evaluation-order bound of the header comment.
fn assert_sums<T: TestFloat>(got: &[T], dst0: &[T], adds: &[Vec<f64>], what: &str) {
    let u = unit_roundoff::<T>();
    for (i, g) in got.iter().enumerate() {
        let d0 = dst0[i].to_f64();
        let exact: f64 = d0 + adds[i].iter().sum::<f64>();
        let mag: f64 = d0.abs() + adds[i].iter().map(|v| v.abs()).sum::<f64>();
        let k = adds[i].len() as f64;
        let g = g.to_f64();
        let ok = if exact.is_nan() || mag.is_nan() {
            g.is_nan()
        } else if exact.is_infinite() {
            g == exact
        } else if mag.is_infinite() {
            // inf - inf among the terms: NaN in every order.
            g.is_nan()
        } else {
            (g - exact).abs() <= (k + 1.0) * (u * mag + 2f64.powi(-24))
        };
        assert!(ok, "{what}: element {i}: got {g:e}, want {exact:e} ({} adds)", adds[i].len());
    }
}

/// (left, n, dst_dim, right): few destination rows, so ids repeat a lot.
const ADD_SHAPES: [(usize, usize, usize, usize); 6] = [(1, 1, 1, 1), (1, 7, 3, 1), (7, 7, 7, 7), (3, 40, 4, 16), (2, 9, 1, 5), (4, 13, 6, 3)];

fn run_scatter_add<T: TestFloat, I: Ix>() {
    for exec in executors() {
        for (k, &(left, n, dst_dim, right)) in ADD_SHAPES.iter().enumerate() {
            let what = format!("scatter_add{} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let specials = k == 2;
            let src: Vec<T> = inputs(left * n * right, -1.0, 1.0, 40 + k as u64, specials).into_iter().map(T::from_f64).collect();
            let dst0: Vec<T> = inputs(left * dst_dim * right, -1.0, 1.0, 60 + k as u64, false).into_iter().map(T::from_f64).collect();
            let id: Vec<I> = ids(left * n * right, dst_dim, 80 + k as u64, true);
            let mut adds = vec![Vec::new(); dst0.len()];
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        let s = (l * n + i) * right + r;
                        if let Some(d) = id[s].row(dst_dim) {
                            adds[(l * dst_dim + d) * right + r].push(src[s].to_f64());
                        }
                    }
                }
            }
            assert!(adds.iter().any(|a| a.len() > 1) || n < 2, "{what}: the ids repeat");
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dd = exec.upload(&dst0).unwrap();
            ops::scatter_add(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
            assert_sums(&exec.download(&dd).unwrap(), &dst0, &adds, &what);
        }
    }
}

#[test]
fn scatter_add_all_types() {
    run_scatter_add::<f32, u32>();
    run_scatter_add::<f32, i64>();
    run_scatter_add::<f16, u32>();
    run_scatter_add::<f16, i64>();
    run_scatter_add::<bf16, u32>();
    run_scatter_add::<bf16, i64>();
}

/// The atomic f32 `scatter_add_unordered`: same shapes, ids (repeated, out of range) and
/// reference as `scatter_add`; the bound of `assert_sums` holds for any order of the adds.
fn run_scatter_add_unordered<I: Ix>() {
    for exec in executors() {
        for (k, &(left, n, dst_dim, right)) in ADD_SHAPES.iter().enumerate() {
            let what = format!("scatter_add_unordered{} {left}x{n}x{right} into dim {dst_dim} on {}", name::<f32, I>(), exec.name());
            let src: Vec<f32> = inputs(left * n * right, -1.0, 1.0, 240 + k as u64, k == 2).into_iter().map(|v| v as f32).collect();
            let dst0: Vec<f32> = inputs(left * dst_dim * right, -1.0, 1.0, 260 + k as u64, false).into_iter().map(|v| v as f32).collect();
            let id: Vec<I> = ids(left * n * right, dst_dim, 280 + k as u64, true);
            let mut adds = vec![Vec::new(); dst0.len()];
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        let s = (l * n + i) * right + r;
                        if let Some(d) = id[s].row(dst_dim) {
                            adds[(l * dst_dim + d) * right + r].push(src[s] as f64);
                        }
                    }
                }
            }
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dd = exec.upload(&dst0).unwrap();
            ops::scatter_add_unordered(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
            assert_sums(&exec.download(&dd).unwrap(), &dst0, &adds, &what);
        }
        // Bad shapes change nothing.
        let (ds, di) = (exec.upload(&[1.0f32; 6]).unwrap(), exec.upload(&[0u32; 5]).unwrap());
        let mut dd = exec.upload(&[2.0f32; 3]).unwrap();
        assert!(ops::scatter_add_unordered(&exec, &ds, &di, &mut dd, 1, 6, 3, 1).is_err());
        assert_eq!(exec.download(&dd).unwrap(), vec![2.0; 3]);
    }
}

#[test]
fn scatter_add_unordered_f32() {
    run_scatter_add_unordered::<u32>();
    run_scatter_add_unordered::<i64>();
}

fn run_index_add<T: TestFloat, I: Ix>() {
    for exec in executors() {
        for (k, &(left, n, dst_dim, right)) in ADD_SHAPES.iter().enumerate() {
            let what = format!("index_add{} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let specials = k == 2;
            let src: Vec<T> = inputs(left * n * right, -1.0, 1.0, 140 + k as u64, specials).into_iter().map(T::from_f64).collect();
            let dst0: Vec<T> = inputs(left * dst_dim * right, -1.0, 1.0, 160 + k as u64, false).into_iter().map(T::from_f64).collect();
            let id: Vec<I> = ids(n, dst_dim, 180 + k as u64, true);
            let mut adds = vec![Vec::new(); dst0.len()];
            for l in 0..left {
                for (i, idv) in id.iter().enumerate() {
                    if let Some(d) = idv.row(dst_dim) {
                        for r in 0..right {
                            adds[(l * dst_dim + d) * right + r].push(src[(l * n + i) * right + r].to_f64());
                        }
                    }
                }
            }
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dd = exec.upload(&dst0).unwrap();
            ops::index_add(&exec, &ds, &di, &mut dd, left, dst_dim, right).unwrap();
            assert_sums(&exec.download(&dd).unwrap(), &dst0, &adds, &what);
        }
    }
}

#[test]
fn index_add_all_types() {
    run_index_add::<f32, u32>();
    run_index_add::<f32, i64>();
    run_index_add::<f16, u32>();
    run_index_add::<f16, i64>();
    run_index_add::<bf16, u32>();
    run_index_add::<bf16, i64>();
}

/// `scatter_add` gives exactly the one-add-at-a-time result (same order, same rounding
/// after each add) for every type, with destinations repeated inside and across the
/// kernel's batches of sources, out-of-range ids, and a partial last batch.
fn run_scatter_add_sequential_bits<T: TestFloat + Data, I: Ix>() {
    for exec in executors_both_orders() {
        for &(left, n, dst_dim, right) in &[(1usize, 16usize, 3usize, 5usize), (2, 53, 4, 33), (1, 100, 1, 2), (3, 40, 37, 7)] {
            let what = format!("scatter_add{} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let src: Vec<T> = inputs(left * n * right, -3.0, 3.0, 90 + n as u64, false).into_iter().map(<T as TestFloat>::from_f64).collect();
            let dst0: Vec<T> = inputs(left * dst_dim * right, -1.0, 1.0, 91 + n as u64, false).into_iter().map(<T as TestFloat>::from_f64).collect();
            let id: Vec<I> = ids(left * n * right, dst_dim, 92 + n as u64, true);
            let mut want = dst0.clone();
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        let k = (l * n + i) * right + r;
                        if let Some(d) = id[k].row(dst_dim) {
                            let o = &mut want[(l * dst_dim + d) * right + r];
                            *o = <T as kernel_dsl::Float>::from_f32(kernel_dsl::Float::to_f32(*o) + kernel_dsl::Float::to_f32(src[k]));
                        }
                    }
                }
            }
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dd = exec.upload(&dst0).unwrap();
            ops::scatter_add(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
            assert_same(&exec.download(&dd).unwrap(), &want, &what);
        }
    }
}

#[test]
fn scatter_add_matches_the_sequential_order_bit_for_bit() {
    run_scatter_add_sequential_bits::<f32, u32>();
    run_scatter_add_sequential_bits::<f32, i64>();
    run_scatter_add_sequential_bits::<f16, u32>();
    run_scatter_add_sequential_bits::<bf16, i64>();
}

/// The sequential loop `dst[l, ids[l, i, r], r] += src[l, i, r]` in `T` (one rounding per add).
fn scatter_add_sequential<T: TestFloat + Data, I: Ix>(src: &[T], id: &[I], dst0: &[T], [left, n, dst_dim, right]: [usize; 4]) -> Vec<T> {
    let mut want = dst0.to_vec();
    for l in 0..left {
        for i in 0..n {
            for r in 0..right {
                let k = (l * n + i) * right + r;
                if let Some(d) = id[k].row(dst_dim) {
                    let o = &mut want[(l * dst_dim + d) * right + r];
                    *o = <T as kernel_dsl::Float>::from_f32(kernel_dsl::Float::to_f32(*o) + kernel_dsl::Float::to_f32(src[k]));
                }
            }
        }
    }
    want
}

/// A scatter case's inputs and the sequential result: sources in [-3, 3) (inf/NaN mixed in
/// with `specials`), destinations in [-1, 1), ids `id_of(l, i, r)` (seeds from `seed`).
#[allow(clippy::type_complexity)]
fn scatter_case<T: TestFloat + Data, I: Ix>(shape: [usize; 4], id_of: fn(usize, usize, usize) -> i64, seed: u64, specials: bool) -> (Vec<T>, Vec<T>, Vec<I>, Vec<T>) {
    let [left, n, dst_dim, right] = shape;
    let src: Vec<T> = inputs(left * n * right, -3.0, 3.0, seed, specials).into_iter().map(<T as TestFloat>::from_f64).collect();
    let dst0: Vec<T> = inputs(left * dst_dim * right, -1.0, 1.0, seed + 10, false).into_iter().map(<T as TestFloat>::from_f64).collect();
    let mut id = Vec::with_capacity(left * n * right);
    for l in 0..left {
        for i in 0..n {
            for r in 0..right {
                id.push(I::from_i64(id_of(l, i, r)));
            }
        }
    }
    let want = scatter_add_sequential(&src, &id, &dst0, shape);
    (src, dst0, id, want)
}

/// `got == want` bit for bit, any NaN matching any NaN (GPUs give their canonical NaN).
fn assert_same_or_nan<T: TestFloat + Data>(got: &[T], want: &[T], what: &str) {
    for (e, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.bits() == w.bits() || (g.to_f64().is_nan() && w.to_f64().is_nan());
        assert!(same, "{what}: element {e}: got {g:?}, want {w:?}");
    }
}

/// `scatter_add` against the sequential loop, bit for bit (NaN matches any NaN: GPUs give
/// their canonical NaN), on id patterns that stress the work-group kernel's rounds (two
/// sources per lane and column per round, 8 or 4 columns per work-group): runs of one
/// destination longer than a round and crossing rounds, one destination for all sources
/// (every round two chains of a wave's length) with inf/NaN sources, a permutation of
/// destination rows shared by all columns (the benchmark's pattern), short patterns
/// with out-of-range ids, and a lane's two sources of a round (`i`, `i + wave size`)
/// with one destination; column counts that leave partial work-groups, `n` that leaves
/// a partial last round.
fn run_scatter_add_rounds<T: TestFloat + Data, I: Ix>() {
    type Case = (&'static str, [usize; 4], fn(usize, usize, usize) -> i64);
    let cases: [Case; 7] = [
        ("3 destinations, long runs", [1, 300, 3, 19], |_l, i, r| ((i / 37 + r) % 3) as i64),
        ("one destination", [2, 130, 4, 11], |_l, _i, _r| 2),
        ("row permutation", [2, 150, 150, 37], |_l, i, _r| ((i * 97 + 5) % 150) as i64),
        ("i mod 7, out of range", [3, 97, 7, 10], |l, i, r| if (i + r) % 5 == 2 { -1 - l as i64 } else if (i + r) % 11 == 3 { 7 } else { ((i + l) % 7) as i64 }),
        ("single column", [1, 1000, 9, 1], |_l, i, _r| ((i * i) % 9) as i64),
        // A round's two sources of one lane (i and i + wave size) hit the same destination.
        ("i mod 32", [1, 200, 40, 13], |_l, i, _r| (i % 32) as i64),
        ("i mod 64", [2, 300, 64, 5], |_l, i, r| ((i + r / 3) % 64) as i64),
    ];
    for exec in executors_both_orders() {
        for (k, (label, shape, id_of)) in cases.iter().enumerate() {
            let [left, n, dst_dim, right] = *shape;
            let what = format!("scatter_add{} {label} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let (src, dst0, id, want) = scatter_case::<T, I>(*shape, *id_of, 300 + k as u64, k == 1);
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            // The checked launcher (two sources per lane and round), then the raw launch
            // with one (`halves` = 1: what AMD code objects always run).
            for halves in [2u32, 1] {
                let mut dd = exec.upload(&dst0).unwrap();
                if halves == 2 {
                    ops::scatter_add(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
                } else {
                    let cfg = kernels::indexing::scatter_config(left, right);
                    kernels::indexing::scatter_add::launch::<T, I>(&exec, cfg, &ds, &di, &mut dd, left, n, dst_dim, right, 1, &[] as &[u32; 0]).unwrap();
                }
                assert_same_or_nan(&exec.download(&dd).unwrap(), &want, &format!("{what} (halves {halves})"));
            }
        }
    }
}

#[test]
fn scatter_add_rounds_match_the_sequential_order() {
    run_scatter_add_rounds::<f32, u32>();
    run_scatter_add_rounds::<f32, i64>();
    run_scatter_add_rounds::<f16, u32>();
    run_scatter_add_rounds::<bf16, u32>();
    run_scatter_add_rounds::<bf16, i64>();
}

/// The shared-memory slab kernel (`scatter_add_slab`, what `ops::scatter_add` runs when
/// the columns come in whole 16-byte chunks) against the sequential loop, bit for bit, both
/// through `ops` and launched directly: rounds of one wave of sources, a ring of
/// `SLAB_STAGES` rounds wrapped several times (`n` past `8 x 64`), one destination for a
/// whole round (chains a wave long) with inf/NaN sources, a permutation shared by all
/// columns (the benchmark's pattern), ids that differ per column, out-of-range ids,
/// `left > 1`, several work-groups per row of columns and a partial last round.
fn run_scatter_add_slab<T: TestFloat + Data, I: Ix>() {
    type Case = (&'static str, [usize; 4], fn(usize, usize, usize) -> i64);
    let cols = kernels::indexing::slab_cols(std::mem::size_of::<T>());
    let cases: [Case; 8] = [
        ("one destination", [2, 150, 3, 1], |_l, _i, _r| 1),
        ("row permutation", [1, 1100, 1100, 2], |_l, i, _r| ((i * 97 + 5) % 1100) as i64),
        ("per-column ids", [3, 700, 40, 2], |l, i, r| ((i * 7 + r * 13 + l) % 40) as i64),
        ("out of range", [2, 301, 17, 1], |l, i, r| if (i + r) % 5 == 2 { -1 - l as i64 } else if (i + r) % 11 == 3 { 17 } else { ((i / 3 + r) % 17) as i64 }),
        ("runs across rounds", [1, 520, 6, 3], |_l, i, r| ((i / 45 + r) % 6) as i64),
        ("few sources", [1, 5, 40, 1], |_l, i, _r| (i * 9 % 40) as i64),
        // Destinations shared by rows 3 apart, and 4 apart, with different ones between.
        ("rows 3 apart", [1, 260, 9, 2], |_l, i, r| ((i % 3) + 3 * ((i / 40 + r) % 3)) as i64),
        ("rows 4 apart", [2, 200, 16, 1], |l, i, _r| ((i % 4) * 4 + (i / 8 + l) % 4) as i64),
    ];
    for exec in executors_both_orders() {
        for (k, (label, shape, id_of)) in cases.iter().enumerate() {
            // Right in units of the work-group's column count.
            let [left, n, dst_dim, chunks] = *shape;
            let right = chunks * cols;
            let shape = [left, n, dst_dim, right];
            let what = format!("scatter_add_slab{} {label} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let (src, dst0, id, want) = scatter_case::<T, I>(shape, *id_of, 400 + k as u64, k == 0);
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            // Through `ops`, then launched directly with every wave count (1, 2, 4, 8
            // dividing the columns, within the work-group bound).
            for waves in [0u32, 1, 2, 4, 8].into_iter().filter(|&w| w == 0 || (cols.is_multiple_of(w as usize) && w <= kernels::indexing::slab_max_waves(exec.wave_lanes()))) {
                let mut dd = exec.upload(&dst0).unwrap();
                if waves > 0 {
                    let cfg = kernels::indexing::slab_config::<T, I>(left, dst_dim, right, exec.wave_lanes(), waves).expect("a slab shape");
                    kernels::indexing::scatter_add_slab::launch::<T, I>(&exec, cfg, &ds, &di, &mut dd, left, n, dst_dim, right, &[] as &[u32; 0]).unwrap();
                } else {
                    ops::scatter_add(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
                }
                assert_same_or_nan(&exec.download(&dd).unwrap(), &want, &format!("{what} (waves {waves}, 0: through ops)"));
            }
        }
    }
}

#[test]
fn scatter_add_slab_matches_the_sequential_order() {
    run_scatter_add_slab::<f32, u32>();
    run_scatter_add_slab::<f32, i64>();
    run_scatter_add_slab::<f16, i64>();
    run_scatter_add_slab::<bf16, u32>();
    run_scatter_add_slab::<bf16, i64>();
}

/// The claim path of the ordered `scatter_add` (`scatter_claim` then `scatter_add_claimed`,
/// what `ops::scatter_add` runs first when `n <= dst_dim` and rows have 32 columns or more),
/// launched directly with one work-group looping over everything, small 2-D grids and the
/// checked launchers' shapes: the flag must say exactly whether two sources share a
/// destination, and where none do the result must be the sequential loop's bit for bit
/// (and the bitset hold exactly the claimed destinations); where some do, the claimed
/// pass must leave `dst` untouched (the gated ordered kernel then runs it, checked through
/// `ops`). Cases: ids shared along rows (chunks of one id, rows of 37 leaving a cut chunk
/// per row), ids that differ along a row, out-of-range ids, a single column, a row of
/// one source, one shared destination as the very last source, sources shared early and
/// within one chunk, a chunk whose last columns have other ids, chunks whose work-items
/// each have one id (the first column differs).
fn run_scatter_claim<T: TestFloat + Data, I: Ix>() {
    type Case = (&'static str, [usize; 4], fn(usize, usize, usize) -> i64);
    let cases: [Case; 12] = [
        ("row permutation, rows of 64", [2, 150, 160, 64], |_l, i, _r| ((i * 97 + 5) % 160) as i64),
        ("row permutation, rows of 37", [1, 300, 300, 37], |_l, i, _r| ((i * 7 + 3) % 300) as i64),
        ("per-column permutation", [3, 40, 40, 33], |l, i, r| ((i + 3 * r + l) % 40) as i64),
        ("out of range", [2, 90, 100, 40], |l, i, r| if (i + r) % 7 == 3 { -1 - l as i64 } else if i % 11 == 4 { 100 } else { i as i64 }),
        ("single column, row + 5", [1, 200, 210, 1], |_l, i, _r| i as i64 + 5),
        ("row - 1, rows of 64", [2, 100, 100, 64], |_l, i, _r| ((i + 99) % 100) as i64),
        ("one source", [3, 1, 5, 70], |l, _i, r| ((l + r) % 5) as i64),
        ("last source shared", [1, 130, 130, 40], |_l, i, r| if i == 129 && r == 17 { 0 } else { i as i64 }),
        ("first rows shared", [2, 64, 64, 32], |_l, i, _r| (i / 2) as i64),
        ("shared within a chunk", [1, 64, 64, 3], |_l, i, r| if i == 10 && r == 1 { 11 } else { i as i64 }),
        ("one column differs", [2, 50, 60, 64], |_l, i, r| if r == 61 { ((i + 7) % 60) as i64 } else { i as i64 }),
        // Mixed chunks whose work-items each have one id, destinations across bitset words.
        ("first column differs, rows of 44", [1, 40, 40, 44], |_l, i, r| if r == 0 { ((i + 3) % 40) as i64 } else { i as i64 }),
    ];
    for exec in executors_both_orders() {
        let lanes = exec.wave_lanes();
        for (k, (label, shape, id_of)) in cases.iter().enumerate() {
            let [left, n, dst_dim, right] = *shape;
            let what = format!("scatter_claim{} {label} {left}x{n}x{right} into dim {dst_dim} on {}", name::<T, I>(), exec.name());
            let (src, dst0, id, want) = scatter_case::<T, I>(*shape, *id_of, 500 + k as u64, k == 2);
            // Whether two in-range sources of one column share a destination.
            let mut seen = std::collections::HashSet::new();
            let mut shared = false;
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        if let Some(d) = id[(l * n + i) * right + r].row(dst_dim) {
                            shared |= !seen.insert((l, d, r));
                        }
                    }
                }
            }
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            // (claim launch, add launch): single work-groups looping over everything, small
            // 2-D grids, the checked launchers' shapes.
            let rows = left * n;
            let words = (left * dst_dim * right).div_ceil(32);
            let codes = rows * right.div_ceil(ix::CLAIM_CHUNK);
            let launches = [
                (LaunchConfig::new(Dim3::x(1), Dim3::x(lanes)), LaunchConfig::new(Dim3::x(1), Dim3::x(32))),
                (LaunchConfig::new(Dim3::new(2, 3, 1), Dim3::new(64, 2, 1)), LaunchConfig::new(Dim3::new(3, 2, 1), Dim3::new(4, 8, 1))),
                (ix::claim_config(rows, right), ix::claimed_config(rows, right)),
            ];
            for (cfg, cfg2) in launches {
                let (groups, block) = (cfg.grid, cfg.block);
                let seen_bits = exec.alloc::<u32>(words).unwrap();
                let flag = exec.alloc::<u32>(1).unwrap();
                // Eight guard words past the codes must stay as they are.
                let mut code = exec.upload(&vec![7u32; codes + 8]).unwrap();
                let mut dd = exec.upload(&dst0).unwrap();
                ix::scatter_claim::launch::<I>(&exec, cfg, &di, &AtomicView(&seen_bits), &mut code, &AtomicView(&flag), left, n, dst_dim, right).unwrap();
                ix::scatter_add_claimed::launch::<T, I>(&exec, cfg2, &ds, &di, &mut dd, &code, &AtomicView(&flag), left, n, dst_dim, right).unwrap();
                let got_flag = exec.download(&flag).unwrap()[0];
                let how = format!("{what}, {groups:?} work-groups of {block:?}");
                assert_eq!(exec.download(&code).unwrap()[codes..], [7; 8], "{how}: past the codes");
                assert_eq!(got_flag != 0, shared, "{how}: the flag");
                if shared {
                    assert_same(&exec.download(&dd).unwrap(), &dst0, &format!("{how}: dst untouched"));
                } else {
                    assert_same_or_nan(&exec.download(&dd).unwrap(), &want, &how);
                    // Every in-range source's bit set, no other.
                    let bits = exec.download(&seen_bits).unwrap();
                    let mut expect = vec![0u32; words];
                    for (l, d, r) in &seen {
                        let q = (l * dst_dim + d) * right + r;
                        expect[q / 32] |= 1 << (q % 32);
                    }
                    assert_eq!(bits, expect, "{how}: the claimed bits");
                }
            }
            // Work-groups whose rows are not whole waves: the claim declines (flag set), the
            // add leaves dst alone.
            {
                let cfg = LaunchConfig::new(Dim3::x(2), Dim3::new(16, 4, 1));
                let seen_bits = exec.alloc::<u32>(words).unwrap();
                let flag = exec.alloc::<u32>(1).unwrap();
                let mut code = exec.alloc::<u32>(codes).unwrap();
                let mut dd = exec.upload(&dst0).unwrap();
                ix::scatter_claim::launch::<I>(&exec, cfg, &di, &AtomicView(&seen_bits), &mut code, &AtomicView(&flag), left, n, dst_dim, right).unwrap();
                ix::scatter_add_claimed::launch::<T, I>(&exec, cfg, &ds, &di, &mut dd, &code, &AtomicView(&flag), left, n, dst_dim, right).unwrap();
                assert_eq!(exec.download(&flag).unwrap()[0], 1, "{what}: a claim launch of 16-wide rows declines");
                assert_same(&exec.download(&dd).unwrap(), &dst0, &format!("{what}: declined, dst untouched"));
            }
            // Through ops: the claim path, or the gated ordered kernel where sources share.
            let mut dd = exec.upload(&dst0).unwrap();
            ops::scatter_add(&exec, &ds, &di, &mut dd, left, n, dst_dim, right).unwrap();
            assert_same_or_nan(&exec.download(&dd).unwrap(), &want, &format!("{what} through ops"));
        }
    }
}

/// A `u32` buffer offered to a kernel as `&[AtomicU32]` (same layout).
struct AtomicView<'a>(&'a DeviceVec<u32>);
impl kernel_dsl::host::KernelArgSlice<kernel_dsl::prelude::AtomicU32> for AtomicView<'_> {
    fn kernel_arg(&self) -> kernel_dsl::host::ArgValue {
        kernel_dsl::host::KernelArgSlice::<u32>::kernel_arg(self.0)
    }
}

#[test]
fn scatter_claim_finds_shared_destinations_and_adds_the_rest() {
    run_scatter_claim::<f32, u32>();
    run_scatter_claim::<f32, i64>();
    run_scatter_claim::<f16, u32>();
    run_scatter_claim::<bf16, i64>();
}

/// 1000 adds of 1.0 into one f32 element: exact, so the count of adds is checked exactly.
#[test]
fn scatter_add_counts_every_repeated_index() {
    for exec in executors() {
        let n = 1000;
        let src = exec.upload(&vec![1.0f32; n * 2]).unwrap();
        // Two columns (right = 2): column 0 all to row 1, column 1 alternating rows 0/2.
        let id: Vec<u32> = (0..n).flat_map(|i| [1u32, (i % 2) as u32 * 2]).collect();
        let di = exec.upload(&id).unwrap();
        let mut dd = exec.alloc::<f32>(3 * 2).unwrap();
        ops::scatter_add(&exec, &src, &di, &mut dd, 1, n, 3, 2).unwrap();
        assert_eq!(exec.download(&dd).unwrap(), vec![0.0, 500.0, 1000.0, 0.0, 0.0, 500.0], "on {}", exec.name());
        let mut dd = exec.alloc::<f32>(3 * 2).unwrap();
        let id: Vec<i64> = (0..n as i64).map(|i| i % 3 - (i % 7 == 0) as i64 * 10).collect();
        let di = exec.upload(&id).unwrap();
        ops::index_add(&exec, &src, &di, &mut dd, 1, 3, 2).unwrap();
        let count = |row: i64| id.iter().filter(|&&v| v == row).count() as f32;
        let want: Vec<f32> = (0..3).flat_map(|r| [count(r), count(r)]).collect();
        assert_eq!(exec.download(&dd).unwrap(), want, "index_add on {}", exec.name());
    }
}

// ---------------------------------------------------------------------------------------
// where_cond

trait Cond: CondType + Debug {
    fn from_u64(v: u64) -> Self;
    fn truth(self) -> bool;
}
impl Cond for u8 {
    fn from_u64(v: u64) -> Self {
        v as u8
    }
    fn truth(self) -> bool {
        self != 0
    }
}
impl Cond for u32 {
    fn from_u64(v: u64) -> Self {
        v as u32
    }
    fn truth(self) -> bool {
        self != 0
    }
}

/// Conditions: zero, one, and values whose low byte is zero (256, 2^31) or all ones.
fn conds<C: Cond>(n: usize, seed: u64) -> Vec<C> {
    let vals = [0u64, 1, 256, 1 << 31, u32::MAX as u64, 2, 255, 0];
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            C::from_u64(vals[(s >> 40) as usize % vals.len()])
        })
        .collect()
}

fn run_where_cond<T: Data, C: Cond>() {
    for exec in executors() {
        for (k, n) in [1usize, 7, 1023, 4097].into_iter().enumerate() {
            let c: Vec<C> = conds(n, k as u64);
            let t: Vec<T> = data(n, 200 + k as u64, true);
            let f: Vec<T> = data(n, 300 + k as u64, true);
            let want: Vec<T> = (0..n).map(|i| if c[i].truth() { t[i] } else { f[i] }).collect();
            let (dc, dt, df) = (exec.upload(&c).unwrap(), exec.upload(&t).unwrap(), exec.upload(&f).unwrap());
            let mut dout = exec.alloc::<T>(n).unwrap();
            ops::where_cond(&exec, (&dc, None), (&dt, None), (&df, None), &mut dout).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("where_cond{} n={n} on {}", name::<T, C>(), exec.name()));
        }

        // Shape (b, t, d): cond (b, t) broadcast over d, on_true stored transposed as
        // (d, t, b), on_false one scalar broadcast everywhere.
        let (b, t, d) = (3, 5, 7);
        let c: Vec<C> = conds(b * t, 9);
        let tv: Vec<T> = data(d * t * b, 400, true);
        let fv: Vec<T> = data(1, 401, false);
        let cv = View::new(&exec, &[b, t, d], &[t, 1, 0]).unwrap();
        let tvv = View::new(&exec, &[b, t, d], &[1, b, t * b]).unwrap();
        let fvv = View::new(&exec, &[b, t, d], &[0, 0, 0]).unwrap();
        let mut want = Vec::new();
        for i in 0..b {
            for j in 0..t {
                for l in 0..d {
                    want.push(if c[i * t + j].truth() { tv[l * t * b + j * b + i] } else { fv[0] });
                }
            }
        }
        let (dc, dt, df) = (exec.upload(&c).unwrap(), exec.upload(&tv).unwrap(), exec.upload(&fv).unwrap());
        let mut dout = exec.alloc::<T>(b * t * d).unwrap();
        ops::where_cond(&exec, (&dc, Some(&cv)), (&dt, Some(&tvv)), (&df, Some(&fvv)), &mut dout).unwrap();
        assert_same(&exec.download(&dout).unwrap(), &want, &format!("where_cond{} broadcast on {}", name::<T, C>(), exec.name()));

        // Only the condition strided; both values contiguous.
        let tc: Vec<T> = data(b * t * d, 402, true);
        let fc: Vec<T> = data(b * t * d, 403, true);
        let want: Vec<T> = (0..b * t * d).map(|i| if c[i / d].truth() { tc[i] } else { fc[i] }).collect();
        let (dt, df) = (exec.upload(&tc).unwrap(), exec.upload(&fc).unwrap());
        ops::where_cond(&exec, (&dc, Some(&cv)), (&dt, None), (&df, None), &mut dout).unwrap();
        assert_same(&exec.download(&dout).unwrap(), &want, &format!("where_cond{} mixed on {}", name::<T, C>(), exec.name()));

        // Views of different dims (same element count): the condition as (b * t, d) rows,
        // on_true as (b, t, d) with a padded row stride; each view decomposes on its own.
        let cv2 = View::new(&exec, &[b * t, d], &[1, 0]).unwrap();
        let pitch = d + 2;
        let tp: Vec<T> = data(b * t * pitch, 404, true);
        let tv2 = View::new(&exec, &[b, t, d], &[t * pitch, pitch, 1]).unwrap();
        let want: Vec<T> = (0..b * t * d).map(|i| if c[i / d].truth() { tp[(i / d) * pitch + i % d] } else { fc[i] }).collect();
        let dt = exec.upload(&tp).unwrap();
        ops::where_cond(&exec, (&dc, Some(&cv2)), (&dt, Some(&tv2)), (&df, None), &mut dout).unwrap();
        assert_same(&exec.download(&dout).unwrap(), &want, &format!("where_cond{} unequal dims on {}", name::<T, C>(), exec.name()));
    }
}

#[test]
fn where_cond_all_types() {
    run_where_cond::<f32, u8>();
    run_where_cond::<f32, u32>();
    run_where_cond::<f16, u8>();
    run_where_cond::<f16, u32>();
    run_where_cond::<bf16, u8>();
    run_where_cond::<bf16, u32>();
    run_where_cond::<u8, u8>();
    run_where_cond::<u8, u32>();
    run_where_cond::<u32, u8>();
    run_where_cond::<u32, u32>();
}

// ---------------------------------------------------------------------------------------
// copy2d and cat

fn run_copy2d<T: Data>() {
    for exec in executors() {
        // (d1, d2, src_stride, dst_stride, src_off, dst_off): unaligned offsets, rows of 16
        // bytes and more with aligned offsets (vector path), a single long row.
        for (k, (d1, d2, ss, ds, so, dof)) in
            [(4, 5, 7, 9, 3, 2), (1, 1, 1, 1, 0, 0), (3, 16, 32, 48, 0, 16), (2, 64, 64, 64, 0, 0), (1, 1000, 1000, 1000, 1, 5), (7, 7, 7, 8, 0, 1)]
                .into_iter()
                .enumerate()
        {
            let src: Vec<T> = data(so + (d1 - 1) * ss + d2 + 3, 500 + k as u64, true);
            let dst0: Vec<T> = data(dof + (d1 - 1) * ds + d2 + 2, 600 + k as u64, true);
            let mut want = dst0.clone();
            for i in 0..d1 {
                for j in 0..d2 {
                    want[dof + i * ds + j] = src[so + i * ss + j];
                }
            }
            let dsrc = exec.upload(&src).unwrap();
            let mut dd = exec.upload(&dst0).unwrap();
            ops::copy2d(&exec, &dsrc, &mut dd, d1, d2, ss, ds, so, dof).unwrap();
            let what = format!("copy2d<{}> {d1}x{d2} strides {ss}/{ds} offsets {so}/{dof} on {}", T::NAME, exec.name());
            assert_same(&exec.download(&dd).unwrap(), &want, &what);
        }
    }
}

#[test]
fn copy2d_all_types() {
    run_copy2d::<f32>();
    run_copy2d::<f16>();
    run_copy2d::<bf16>();
    run_copy2d::<u8>();
    run_copy2d::<u32>();
}

/// Reference concatenation of row-major tensors along `dim`.
fn ref_cat<T: Copy>(parts: &[(Vec<T>, Vec<usize>)], dim: usize) -> Vec<T> {
    let outer: usize = parts[0].1[..dim].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for (v, shape) in parts {
            let block: usize = shape[dim..].iter().product();
            out.extend_from_slice(&v[o * block..(o + 1) * block]);
        }
    }
    out
}

fn run_cat<T: Data>() {
    for exec in executors() {
        for (dim, shapes) in [
            (0, vec![vec![2, 3, 4], vec![1, 3, 4], vec![3, 3, 4]]),
            (1, vec![vec![2, 1, 4], vec![2, 3, 4], vec![2, 2, 4]]),
            (1, vec![vec![3, 5, 7], vec![3, 0, 7], vec![3, 2, 7]]),
            (2, vec![vec![2, 3, 1], vec![2, 3, 5], vec![2, 3, 8]]),
            (1, vec![vec![4, 16, 2], vec![4, 8, 2], vec![4, 24, 2]]),
            // More inputs than one cat_rows launch takes (two launches), aligned and not.
            (1, vec![vec![3, 8], vec![3, 16], vec![3, 5], vec![3, 0], vec![3, 8], vec![3, 3]]),
            (0, vec![vec![1, 9]; 9]),
            (2, vec![vec![2, 2, 4], vec![2, 2, 8], vec![2, 2, 4], vec![2, 2, 12], vec![2, 2, 4]]),
            // Wide aligned rows: the kernel's work-items take two rows a grid apart (and a
            // last odd one).
            (1, vec![vec![5, 512], vec![5, 1024], vec![5, 8]]),
        ] {
            let parts: Vec<(Vec<T>, Vec<usize>)> =
                shapes.iter().enumerate().map(|(k, s)| (data(s.iter().product(), 700 + k as u64, true), s.clone())).collect();
            let want = ref_cat(&parts, dim);
            let bufs: Vec<DeviceVec<T>> = parts.iter().map(|(v, _)| exec.upload(v).unwrap()).collect();
            let inputs: Vec<(&DeviceVec<T>, &[usize])> = bufs.iter().zip(&shapes).map(|(b, s)| (b, s.as_slice())).collect();
            let shape_refs: Vec<&[usize]> = shapes.iter().map(|s| s.as_slice()).collect();
            let out_shape = ops::cat_shape(&shape_refs, dim).unwrap();
            let mut want_shape = shapes[0].clone();
            want_shape[dim] = shapes.iter().map(|s| s[dim]).sum();
            assert_eq!(out_shape, want_shape);
            let mut dout = exec.upload(&vec![T::from_f64(0.007); want.len()]).unwrap();
            ops::cat(&exec, &inputs, dim, &mut dout).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("cat<{}> dim {dim} of {shapes:?} on {}", T::NAME, exec.name()));
        }
    }
}

/// `cat_rows` launched with a grid far smaller than its rows (work-items loop over several
/// pairs of rows) on aligned rows, and on misaligned ones (the row-by-row path).
#[test]
fn cat_rows_small_grids_cover_every_row() {
    for exec in executors() {
        for (w0, w1) in [(64usize, 32usize), (5, 3)] {
            let rows = 23;
            let a: Vec<f32> = data(rows * w0, 1, true);
            let b: Vec<f32> = data(rows * w1, 2, true);
            let parts = vec![(a.clone(), vec![rows, w0]), (b.clone(), vec![rows, w1])];
            let want = ref_cat(&parts, 1);
            let (da, db) = (exec.upload(&a).unwrap(), exec.upload(&b).unwrap());
            let none = exec.alloc::<f32>(0).unwrap();
            let mut out = exec.upload(&vec![0.5f32; want.len()]).unwrap();
            let cfg = LaunchConfig::new(Dim3::new(1, 2, 2), Dim3::new(4, 2, 1));
            ix::cat_rows::launch::<f32>(&exec, cfg, &da, &db, &none, &none, &mut out, rows, w0 + w1, 0, w0, w1, 0, 0).unwrap();
            assert_same(&exec.download(&out).unwrap(), &want, &format!("cat_rows of widths {w0}, {w1} on {}", exec.name()));
        }
    }
}

#[test]
fn cat_along_first_middle_and_last_dims() {
    run_cat::<f32>();
    run_cat::<f16>();
    run_cat::<bf16>();
    run_cat::<u8>();
    run_cat::<u32>();
}

// ---------------------------------------------------------------------------------------
// Launch shapes, empty tensors, bad input

/// The raw launchers loop over rows (y) and along rows (x), so a grid far smaller than the
/// tensor, with blocks of odd shapes, still gives every element.
#[test]
fn tiny_grids_cover_every_element() {
    for exec in executors() {
        for block in [Dim3::new(3, 2, 1), Dim3::new(1, 1, 1), Dim3::new(64, 1, 1), Dim3::new(1, 5, 1)] {
            let cfg = LaunchConfig::new(Dim3::new(2, 1, 1), block);
            let (left, src_dim, right) = (3, 6, 37);
            let src: Vec<f32> = data(left * src_dim * right, 1, true);
            let id: Vec<i64> = ids(11, src_dim, 2, true);
            let want = ref_index_select(|l, d, r| src[(l * src_dim + d) * right + r], &id, left, src_dim, right);
            let (ds, di) = (exec.upload(&src).unwrap(), exec.upload(&id).unwrap());
            let mut dout = exec.upload(&vec![0.5f32; want.len()]).unwrap();
            ix::index_select::launch::<f32, i64>(&exec, cfg, &ds, &[], &di, &mut dout, left, src_dim, right).unwrap();
            assert_same(&exec.download(&dout).unwrap(), &want, &format!("index_select, block {block:?} on {}", exec.name()));

            let (d1, d2) = (9, 40);
            let s: Vec<u8> = data(d1 * d2, 3, false);
            let ds = exec.upload(&s).unwrap();
            let mut dd = exec.alloc::<u8>(d1 * 48).unwrap();
            ix::copy2d::launch::<u8>(&exec, cfg, &ds, &mut dd, d1, d2, d2, 48, 0, 0).unwrap();
            let d = exec.download(&dd).unwrap();
            for i in 0..d1 {
                assert_eq!(&d[i * 48..i * 48 + d2], &s[i * d2..(i + 1) * d2], "copy2d row {i}, block {block:?}");
                assert!(d[i * 48 + d2..(i + 1) * 48].iter().all(|v| *v == 0));
            }

            let (left, n, dst_dim, right) = (5, 4, 3, 9);
            let s = exec.upload(&vec![1.0f32; left * n * right]).unwrap();
            let id: Vec<u32> = ids(left * n * right, dst_dim, 4, false);
            let di = exec.upload(&id).unwrap();
            let mut dd = exec.alloc::<f32>(left * dst_dim * right).unwrap();
            // scatter_add's work-groups cooperate over a tile (8 or 4 columns of
            // SCATTER_TILE work-items): it takes its own launch shape, any block elsewhere.
            ix::scatter_add::launch::<f32, u32>(&exec, ix::scatter_config(left, right), &s, &di, &mut dd, left, n, dst_dim, right, 2, &[] as &[u32; 0]).unwrap();
            let mut want = vec![0.0f32; left * dst_dim * right];
            for l in 0..left {
                for i in 0..n {
                    for r in 0..right {
                        want[(l * dst_dim + id[(l * n + i) * right + r] as usize) * right + r] += 1.0;
                    }
                }
            }
            assert_eq!(exec.download(&dd).unwrap(), want, "scatter_add, block {block:?} on {}", exec.name());
        }
    }
}

#[test]
fn launch_shapes_stay_within_backend_limits() {
    for (rows, units) in [(0, 0), (1, 1), (1, 3), (7, 300), (1 << 40, 1 << 40), (100_000, 1)] {
        let cfg = ix::rows_config(rows, units);
        cfg.validate().unwrap();
        assert!(cfg.grid.y <= 65535 && cfg.grid.x <= 65535 && cfg.block.volume() == ix::BLOCK as u64, "{cfg:?}");
        assert!(cfg.block.x as usize <= units.max(1).next_power_of_two(), "x block no wider than the row: {cfg:?}");
    }
    for n in [0, 1, 1 << 40] {
        ix::elements_config(n).validate().unwrap();
    }
}

#[test]
fn empty_tensors_are_a_no_op() {
    for exec in executors() {
        let none = exec.upload::<f32>(&[]).unwrap();
        let sentinel = vec![3.0f32; 12];
        let s12 = exec.upload(&sentinel).unwrap();
        let ids0 = exec.upload::<u32>(&[]).unwrap();
        let ids2 = exec.upload(&[1u32, 2]).unwrap();
        let ids2w = exec.upload(&[1i64, 2]).unwrap();
        // index_select: n = 0, left = 0, right = 0.
        let mut out = exec.upload::<f32>(&[]).unwrap();
        ops::index_select(&exec, &s12, None, &ids0, &mut out, 2, 6, 1).unwrap();
        ops::index_select(&exec, &none, None, &ids2, &mut out, 0, 6, 4).unwrap();
        ops::index_select(&exec, &none, None, &ids2w, &mut out, 3, 6, 0).unwrap();
        // gather with left = 0 and n = 0.
        ops::gather(&exec, &none, &ids0, &mut out, 0, 4, 3, 2).unwrap();
        ops::gather(&exec, &s12, &ids0, &mut out, 2, 3, 0, 2).unwrap();
        // scatter_add / index_add with nothing to add: dst unchanged.
        let mut dst = exec.upload(&sentinel).unwrap();
        ops::scatter_add(&exec, &none, &ids0, &mut dst, 2, 0, 3, 2).unwrap();
        ops::index_add(&exec, &none, &ids0, &mut dst, 2, 3, 2).unwrap();
        ops::scatter_add(&exec, &none, &ids0, &mut out, 0, 5, 3, 2).unwrap();
        // where_cond, copy2d, cat of empties.
        let c0 = exec.upload::<u8>(&[]).unwrap();
        ops::where_cond(&exec, (&c0, None), (&none, None), (&none, None), &mut out).unwrap();
        ops::copy2d(&exec, &none, &mut dst, 0, 5, 5, 5, 0, 0).unwrap();
        ops::copy2d(&exec, &s12, &mut dst, 4, 0, 3, 3, 100, 100).unwrap();
        assert_eq!(exec.download(&dst).unwrap(), sentinel, "on {}", exec.name());
        let shape: &[usize] = &[0, 4];
        ops::cat(&exec, &[(&none, shape), (&none, shape)], 1, &mut out).unwrap();
        // A dimension of size 0 indexed by ids: every id is out of range.
        let ids3 = exec.upload(&[0u32, 5, 1]).unwrap();
        let mut out2 = exec.upload(&[9.0f32; 6]).unwrap();
        ops::index_select(&exec, &none, None, &ids3, &mut out2, 2, 0, 1).unwrap();
        assert_eq!(exec.download(&out2).unwrap(), vec![0.0; 6], "ids into an empty dimension select zeros on {}", exec.name());
    }
}

fn assert_invalid(r: Result<(), LaunchError>, what: &str) {
    match r {
        Err(LaunchError::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

/// Wrong lengths and shapes are rejected before launching, and change nothing.
#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    for exec in executors() {
        let src: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let src = exec.upload(&src).unwrap();
        let id2 = exec.upload(&[1u32, 0]).unwrap();
        let sentinel = vec![-5.0f32; 8];
        let mut out = exec.upload(&sentinel).unwrap();
        let mut out_short = exec.upload(&sentinel[..7]).unwrap();

        // index_select: src (2, 3, 4) = 24; ids 2 -> out 2*2*4 = 16.
        let mut out16 = exec.upload(&[-5.0f32; 16]).unwrap();
        assert_invalid(ops::index_select(&exec, &src, None, &id2, &mut out, 2, 3, 4), "index_select short out");
        assert_invalid(ops::index_select(&exec, &src, None, &id2, &mut out16, 2, 4, 4), "index_select short src");
        assert_invalid(ops::index_select(&exec, &src, None, &id2, &mut out16, 2, 2, 4), "index_select long src");
        assert_invalid(ops::index_select(&exec, &src, None, &id2, &mut out16, usize::MAX, 3, 4), "index_select overflow");
        let past = View::new(&exec, &[2, 3, 4], &[12, 4, 2]).unwrap();
        assert_invalid(ops::index_select(&exec, &src, Some(&past), &id2, &mut out16, 2, 3, 4), "index_select view past the buffer");
        let small = View::new(&exec, &[2, 3, 3], &[9, 3, 1]).unwrap();
        assert_invalid(ops::index_select(&exec, &src, Some(&small), &id2, &mut out16, 2, 3, 4), "index_select view of other size");
        assert!(exec.download(&out16).unwrap().iter().all(|v| *v == -5.0));

        // gather: ids must have the output's length.
        let id8 = exec.upload(&[0u32; 8]).unwrap();
        assert_invalid(ops::gather(&exec, &src, &id2, &mut out, 2, 3, 1, 4), "gather short ids");
        assert_invalid(ops::gather(&exec, &src, &id8, &mut out_short, 2, 3, 1, 4), "gather short out");
        assert_invalid(ops::gather(&exec, &src, &id8, &mut out, 2, 2, 1, 4), "gather wrong src");

        // scatter_add / index_add: dst (2, 3, 4) = 24 (src) ; src (2, 1, 4) = 8.
        let mut dst = exec.upload(&[1.0f32; 24]).unwrap();
        let s8 = exec.upload(&[1.0f32; 8]).unwrap();
        assert_invalid(ops::scatter_add(&exec, &s8, &id2, &mut dst, 2, 1, 3, 4), "scatter_add short ids");
        assert_invalid(ops::scatter_add(&exec, &s8, &id8, &mut dst, 2, 1, 2, 4), "scatter_add wrong dst");
        assert_invalid(ops::scatter_add(&exec, &s8, &id8, &mut dst, 2, 2, 3, 4), "scatter_add short src");
        assert_invalid(ops::index_add(&exec, &s8, &id2, &mut dst, 2, 3, 4), "index_add src for 2 ids");
        assert_invalid(ops::index_add(&exec, &src, &id2, &mut dst, 2, 4, 3), "index_add wrong dst");
        assert!(exec.download(&dst).unwrap().iter().all(|v| *v == 1.0));

        // where_cond: every input of out's length, or a view of that many elements inside
        // its buffer.
        let c8 = exec.upload(&[1u8; 8]).unwrap();
        let c7 = exec.upload(&[1u8; 7]).unwrap();
        assert_invalid(ops::where_cond(&exec, (&c7, None), (&s8, None), (&s8, None), &mut out), "where_cond short cond");
        assert_invalid(ops::where_cond(&exec, (&c8, None), (&s8, None), (&src, None), &mut out), "where_cond long on_false");
        let bcast = View::new(&exec, &[2, 4], &[0, 1]).unwrap();
        let bad_bcast = View::new(&exec, &[2, 4], &[0, 2]).unwrap();
        let c4 = exec.upload(&[1u8; 4]).unwrap();
        assert_invalid(ops::where_cond(&exec, (&c4, Some(&bad_bcast)), (&s8, None), (&s8, None), &mut out), "where_cond view past cond");
        assert_invalid(ops::where_cond(&exec, (&c4, Some(&bcast)), (&s8, None), (&s8, None), &mut out_short), "where_cond view of other size");
        assert!(exec.download(&out).unwrap().iter().all(|v| *v == -5.0));
        assert!(exec.download(&out_short).unwrap().iter().all(|v| *v == -5.0));

        // copy2d: regions outside the buffers, overlapping destination rows.
        assert_invalid(ops::copy2d(&exec, &src, &mut out, 2, 4, 4, 4, 17, 0), "copy2d src region past the end");
        assert_invalid(ops::copy2d(&exec, &src, &mut out, 2, 4, 4, 4, 0, 1), "copy2d dst region past the end");
        assert_invalid(ops::copy2d(&exec, &src, &mut out, 2, 4, 4, 3, 0, 0), "copy2d overlapping rows");
        assert_invalid(ops::copy2d(&exec, &src, &mut out, 2, 4, usize::MAX, 4, 0, 0), "copy2d overflow");
        assert!(exec.download(&out).unwrap().iter().all(|v| *v == -5.0));

        // cat: mismatched shapes, bad dim, short input, wrong out; nothing copied.
        let a = exec.upload(&[1.0f32; 6]).unwrap();
        let (s23, s32, s22): (&[usize], &[usize], &[usize]) = (&[2, 3], &[3, 2], &[2, 2]);
        let mut o = exec.upload(&[-5.0f32; 12]).unwrap();
        assert_invalid(ops::cat(&exec, &[(&a, s23), (&a, s32)], 0, &mut o), "cat mismatched shapes");
        assert_invalid(ops::cat(&exec, &[(&a, s23), (&a, s23)], 2, &mut o), "cat dim out of range");
        assert_invalid(ops::cat(&exec, &[(&a, s23), (&a, s22)], 1, &mut o), "cat short input");
        assert_invalid(ops::cat(&exec, &[(&a, s23), (&a, s23), (&a, s23)], 0, &mut o), "cat wrong out");
        assert_invalid(ops::cat::<f32, DeviceVec<f32>>(&exec, &[], 0, &mut o), "cat of nothing");
        assert!(exec.download(&o).unwrap().iter().all(|v| *v == -5.0));

        // View construction.
        assert!(matches!(View::new(&exec, &[2, 3], &[1]), Err(LaunchError::InvalidArgument { .. })));
        assert!(matches!(View::new(&exec, &[usize::MAX, 3], &[1, 1]), Err(LaunchError::InvalidArgument { .. })));
    }
}

/// The checked wrappers hand buffers through unchanged, so a host buffer given to a GPU
/// executor is still refused by the launcher (and nothing runs).
#[test]
fn host_buffers_are_rejected_by_gpu_executors() {
    for exec in executors().into_iter().filter(|d| d.is_gpu()) {
        let src = vec![1.0f32; 8];
        let mut dout = exec.alloc::<f32>(8).unwrap();
        let err = ops::copy2d(&exec, &src, &mut dout, 1, 8, 8, 8, 0, 0).unwrap_err();
        assert!(matches!(err, LaunchError::WrongMemory { .. }), "{err}");
        // cat: the device input would be copied first, but the host one is refused up front.
        let dsrc = exec.upload(&[2.0f32; 8]).unwrap();
        let shape: &[usize] = &[8];
        let inputs: [(&dyn kernel_dsl::host::KernelArgSlice<f32>, &[usize]); 2] = [(&dsrc, shape), (&src, shape)];
        let mut dcat = exec.alloc::<f32>(16).unwrap();
        let err = ops::cat(&exec, &inputs, 0, &mut dcat).unwrap_err();
        assert!(matches!(err, LaunchError::WrongMemory { arg: 1, .. }), "{err}");
        assert!(exec.download(&dcat).unwrap().iter().all(|v| *v == 0.0), "nothing copied");
    }
}
