//! Reductions over dimension sets (sum, mean, max, min, argmax, argmin) against an f64
//! reference that walks the strided view element by element, on the CPU executor with
//! waves of 32 and 64 lanes and on any GPU this build can open. The cases cover all three
//! kernel plans (contiguous rows, columns, strided layout).
use half::{bf16, f16};
use kernel_dsl::host::Executor;
use kernels::reduce::{self, ArgMax, ArgMin, Max, Mean, Min, ReducePlan, Sum};
use kernels::runtime::Device;

mod common;
use common::*;

/// `(dims, strides, reduced dims)`; `None` strides = contiguous.
type Case = (Vec<usize>, Option<Vec<usize>>, Vec<usize>);

fn contiguous(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

fn cases() -> Vec<Case> {
    vec![
        (vec![7], None, vec![0]),
        (vec![1], None, vec![0]),
        (vec![3, 4096], None, vec![1]),           // rows, vector loads
        (vec![2, 65537], None, vec![1]),          // long rows
        (vec![5, 7], None, vec![1]),              // rows, unaligned
        (vec![4096, 3], None, vec![0]),           // few long columns: layout rows
        (vec![64, 100, 70], None, vec![1]),       // columns
        (vec![2, 3, 5, 7], None, vec![1, 2]),     // short columns (adjacent dims)
        (vec![2, 3, 5, 7], None, vec![2, 0]),     // non-adjacent dims: layout
        (vec![4, 5, 6], None, vec![0, 1, 2]),     // everything
        (vec![4, 5, 6], None, vec![]),            // nothing
        (vec![3, 1, 4], None, vec![1]),           // only a size-1 dim
        (vec![5, 6], Some(vec![1, 5]), vec![1]),  // transposed view
        (vec![6, 40], Some(vec![0, 1]), vec![0]), // broadcast view (stride 0)
        (vec![0, 5], None, vec![1]),              // no outputs
        (vec![2048, 19], None, vec![1]),          // many rows: a wave per row
        (vec![2049, 1], None, vec![1]),           // many rows of one element
        (vec![600, 40], None, vec![0]),           // long narrow columns: rows split in 2
        (vec![3, 1500, 70], None, vec![1]),       // split in 5 (chunks of 300 rows)
        (vec![1025, 5, 40], None, vec![0, 1]),    // split in 20, a partial last chunk
        (vec![701, 136], None, vec![0]),          // vector columns: one partial tile, 10 splits
        (vec![3, 300, 264], None, vec![1]),       // vector columns: 2 tiles (8 columns in the second)
    ]
}

fn strides_of(c: &Case) -> Vec<usize> {
    c.1.clone().unwrap_or_else(|| contiguous(&c.0))
}

/// Offsets of the elements folded into each output, in output order, each list in
/// row-major order of the reduced dims.
fn groups(dims: &[usize], strides: &[usize], red: &[usize]) -> Vec<Vec<usize>> {
    let kept: Vec<usize> = (0..dims.len()).filter(|d| !red.contains(d)).collect();
    let mut cut: Vec<usize> = red.to_vec();
    cut.sort();
    let walk = |ds: &[usize]| -> Vec<usize> {
        let mut offs = vec![0usize];
        for &d in ds {
            offs = offs.iter().flat_map(|o| (0..dims[d]).map(move |i| o + i * strides[d])).collect();
        }
        offs
    };
    let inner = walk(&cut);
    walk(&kept).into_iter().map(|o| inner.iter().map(|i| o + i).collect()).collect()
}

fn input_len(dims: &[usize], strides: &[usize]) -> usize {
    if dims.contains(&0) {
        return 0;
    }
    dims.iter().zip(strides).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Sum,
    Mean,
    Max,
    Min,
}

fn reference(op: Op, v: &[f64]) -> f64 {
    match op {
        Op::Sum => v.iter().sum(),
        Op::Mean => v.iter().sum::<f64>() / v.len() as f64,
        Op::Max => v.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }),
        Op::Min => v.iter().fold(f64::INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.min(b) }),
    }
}

/// First NaN, else first extreme.
fn reference_arg(max: bool, v: &[f64]) -> u32 {
    if let Some(i) = v.iter().position(|x| x.is_nan()) {
        return i as u32;
    }
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if (max && x > v[best]) || (!max && x < v[best]) {
            best = i;
        }
    }
    best as u32
}

fn run_value<T: TestFloat>(exec: &Device, op: Op, c: &Case, specials: bool) {
    let (dims, red) = (&c.0, &c.2);
    let strides = strides_of(c);
    let n = input_len(dims, &strides);
    // Positive inputs for sums, so that the relative tolerance means something.
    let (lo, hi) = if matches!(op, Op::Sum | Op::Mean) && !specials { (0.5, 1.5) } else { (-4.0, 4.0) };
    let x: Vec<T> = inputs(n, lo, hi, n as u64 + 1, specials).into_iter().map(T::from_f64).collect();
    let gs = groups(dims, &strides, red);
    let want: Vec<f64> = gs.iter().map(|g| reference(op, &g.iter().map(|&o| x[o].to_f64()).collect::<Vec<_>>())).collect();
    let dx = exec.upload(&x).unwrap();
    let mut dy = exec.alloc::<T>(gs.len()).unwrap();
    let r = match op {
        Op::Sum => reduce::reduce::<T, Sum>(exec, &dx, dims, &strides, red, &mut dy),
        Op::Mean => reduce::reduce::<T, Mean>(exec, &dx, dims, &strides, red, &mut dy),
        Op::Max => reduce::reduce::<T, Max>(exec, &dx, dims, &strides, red, &mut dy),
        Op::Min => reduce::reduce::<T, Min>(exec, &dx, dims, &strides, red, &mut dy),
    };
    r.unwrap_or_else(|e| panic!("{op:?} {c:?}: {e}"));
    let y = exec.download(&dy).unwrap();
    // Sums: the column kernel adds up to `r` terms one after another in f32 (relative error
    // below r * 2^-24 for positive terms), the row kernel r/threads terms and a tree.
    let r = gs.first().map_or(0, |g| g.len());
    let rel = r as f64 * 6e-8 + 3e-5;
    // Mixed signs (specials): the error is relative to sum |x| <= 4 r, not to the result.
    let abs = if specials { rel * 4.0 * r as f64 } else { 0.0 };
    assert_close_with(&y, &want, rel, abs, &format!("{op:?}<{}> {c:?} specials={specials} on {}", T::NAME, exec.name()));
}

fn run_arg<T: TestFloat>(exec: &Device, max: bool, c: &Case, specials: bool) {
    let (dims, red) = (&c.0, &c.2);
    let strides = strides_of(c);
    let n = input_len(dims, &strides);
    // Few distinct values, so that ties (first index wins) happen often.
    let x: Vec<T> = inputs(n, -4.0, 4.0, n as u64 + 2, specials).into_iter().map(|v| T::from_f64((v * 4.0).round() / 4.0)).collect();
    let gs = groups(dims, &strides, red);
    let want: Vec<u32> = gs.iter().map(|g| reference_arg(max, &g.iter().map(|&o| x[o].to_f64()).collect::<Vec<_>>())).collect();
    let dx = exec.upload(&x).unwrap();
    let mut dy = exec.alloc::<u32>(gs.len()).unwrap();
    let r = if max {
        reduce::arg_reduce::<T, ArgMax>(exec, &dx, dims, &strides, red, &mut dy)
    } else {
        reduce::arg_reduce::<T, ArgMin>(exec, &dx, dims, &strides, red, &mut dy)
    };
    r.unwrap_or_else(|e| panic!("arg(max={max}) {c:?}: {e}"));
    assert_eq!(exec.download(&dy).unwrap(), want, "arg(max={max})<{}> {c:?} specials={specials} on {}", T::NAME, exec.name());
}

fn run_all<T: TestFloat>() {
    for exec in executors() {
        for c in cases() {
            for op in [Op::Sum, Op::Mean, Op::Max, Op::Min] {
                run_value::<T>(&exec, op, &c, false);
            }
            run_arg::<T>(&exec, true, &c, false);
            run_arg::<T>(&exec, false, &c, false);
        }
    }
}

#[test]
fn reductions_f32() {
    run_all::<f32>();
}

#[test]
fn reductions_f16() {
    run_all::<f16>();
}

#[test]
fn reductions_bf16() {
    run_all::<bf16>();
}

/// NaN, +-inf, +-0 mixed in: sums and means become NaN or inf as in f64, max and min
/// propagate NaN, argmax and argmin point at the first NaN.
#[test]
fn reductions_with_special_values() {
    for exec in executors() {
        for c in cases() {
            for op in [Op::Sum, Op::Mean, Op::Max, Op::Min] {
                run_value::<f32>(&exec, op, &c, true);
            }
            run_arg::<f32>(&exec, true, &c, true);
            run_arg::<bf16>(&exec, false, &c, true);
        }
    }
}

#[test]
fn plans_pick_the_kernel_the_shape_wants() {
    let p = |d: &[usize], r: &[usize]| reduce::plan(d, &contiguous(d), r).unwrap();
    assert_eq!(p(&[3, 4096], &[1]), ReducePlan::Rows { rows: 3, cols: 4096, layout: vec![] });
    assert_eq!(p(&[4096, 4096], &[1]), ReducePlan::WaveRows { rows: 4096, cols: 4096 });
    assert_eq!(p(&[64, 100, 70], &[1]), ReducePlan::Cols { outer: 64, r: 100, inner: 70 });
    assert_eq!(p(&[2, 3, 5, 7], &[1, 2]), ReducePlan::Cols { outer: 2, r: 15, inner: 7 });
    assert!(matches!(p(&[2, 3, 5, 7], &[0, 2]), ReducePlan::Rows { rows: 21, cols: 10, ref layout } if !layout.is_empty()));
    assert_eq!(p(&[8, 1, 16], &[0, 1]), ReducePlan::Cols { outer: 1, r: 8, inner: 16 });
    // Column reductions with few work-groups split their rows (about 1024 groups, at
    // least 256 rows each): bf16 4096 x 4096 over dim 0 is 128 groups of 32 columns.
    assert_eq!(reduce::col_splits(128, 4096), 8);
    assert_eq!(reduce::col_splits(2, 600), 2);
    assert_eq!(reduce::col_splits(1, 5125), 20);
    assert_eq!(reduce::col_splits(1000, 64), 1);
    assert_eq!(reduce::col_splits(512, 1 << 20), 1);
    assert_eq!(reduce::col_splits(4, 300), 1);
    // Long columns in whole chunks take the vector kernel: 4096 x 4096 over dim 0 is 16
    // tiles of 256 columns, split 8 ways (128 groups of 512 rows).
    assert!(reduce::vec_cols(4096, 4096) && !reduce::vec_cols(4096, 4100) && !reduce::vec_cols(100, 4096) && !reduce::vec_cols(4096, 64));
    assert_eq!(reduce::vec_col_splits(16, 4096), 8);
    assert_eq!(reduce::vec_col_splits(1, 701), 2);
    assert_eq!(reduce::vec_col_splits(1, 1 << 20), 128);
    assert_eq!(reduce::vec_col_splits(128, 4096), 1);
}

#[test]
fn bad_reductions_are_typed_errors_and_write_nothing() {
    let exec = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let x = exec.upload(&[1.0f32; 12]).unwrap();
    let mut y = exec.upload(&[7.0f32; 3]).unwrap();
    let s = contiguous(&[3, 4]);
    let msg = |r: Result<(), kernel_dsl::host::LaunchError>| r.unwrap_err().to_string();
    assert!(msg(reduce::reduce::<f32, Sum>(&exec, &x, &[3, 4], &s, &[2], &mut y)).contains("out of range"));
    assert!(msg(reduce::reduce::<f32, Sum>(&exec, &x, &[3, 4], &s, &[1, 1], &mut y)).contains("twice"));
    assert!(msg(reduce::reduce::<f32, Sum>(&exec, &x, &[3, 4], &s, &[0], &mut y)).contains("output has 3"));
    assert!(msg(reduce::reduce::<f32, Sum>(&exec, &x, &[3, 5], &contiguous(&[3, 5]), &[1], &mut y)).contains("reaches element 14"));
    let e = exec.upload::<f32>(&[]).unwrap();
    assert!(msg(reduce::reduce::<f32, Max>(&exec, &e, &[3, 0], &[0, 1], &[1], &mut y)).contains("empty dimension"));
    let mut yi = exec.upload(&[9u32; 3]).unwrap();
    assert!(msg(reduce::arg_reduce::<f32, ArgMax>(&exec, &e, &[3, 0], &[0, 1], &[1], &mut yi)).contains("empty dimension"));
    assert_eq!(exec.download(&y).unwrap(), vec![7.0; 3], "nothing written");
    assert_eq!(exec.download(&yi).unwrap(), vec![9; 3], "nothing written");
    // Sum and mean of an empty dimension have values: 0 and NaN.
    reduce::reduce::<f32, Sum>(&exec, &e, &[3, 0], &[0, 1], &[1], &mut y).unwrap();
    assert_eq!(exec.download(&y).unwrap(), vec![0.0; 3]);
    reduce::reduce::<f32, Mean>(&exec, &e, &[3, 0], &[0, 1], &[1], &mut y).unwrap();
    assert!(exec.download(&y).unwrap().iter().all(|v| v.is_nan()));
}

/// The vector column kernel itself, one pass and split, against f64: every op, a partial
/// tile, a partial last split, and its typed errors.
#[test]
fn vector_columns_in_one_pass_and_split() {
    for exec in executors() {
        let (outer, r, inner) = (2, 45, 272);
        let x: Vec<f32> = inputs(outer * r * inner, 0.5, 1.5, 7, false).into_iter().map(|v| v as f32).collect();
        let dx = exec.upload(&x).unwrap();
        for splits in [1, 4, 45] {
            for op in [Op::Sum, Op::Mean, Op::Max, Op::Min] {
                let mut dy = exec.alloc::<f32>(outer * inner).unwrap();
                let shape = (outer, r, inner);
                match op {
                    Op::Sum => reduce::reduce_long_columns::<f32, Sum>(&exec, &dx, shape, splits, &mut dy),
                    Op::Mean => reduce::reduce_long_columns::<f32, Mean>(&exec, &dx, shape, splits, &mut dy),
                    Op::Max => reduce::reduce_long_columns::<f32, Max>(&exec, &dx, shape, splits, &mut dy),
                    Op::Min => reduce::reduce_long_columns::<f32, Min>(&exec, &dx, shape, splits, &mut dy),
                }
                .unwrap();
                let want: Vec<f64> = (0..outer * inner)
                    .map(|o| reference(op, &(0..r).map(|k| x[(o / inner * r + k) * inner + o % inner] as f64).collect::<Vec<_>>()))
                    .collect();
                assert_close_with(&exec.download(&dy).unwrap(), &want, r as f64 * 6e-8 + 3e-6, 0.0, &format!("{op:?} splits={splits} on {}", exec.name()));
            }
        }
        let mut dy = exec.alloc::<f32>(outer * inner).unwrap();
        let msg = |e: Result<(), kernel_dsl::host::LaunchError>| e.unwrap_err().to_string();
        assert!(msg(reduce::reduce_long_columns::<f32, Sum>(&exec, &dx, (outer, r, 270), 1, &mut dy)).contains("multiple of 8"));
        assert!(msg(reduce::reduce_long_columns::<f32, Sum>(&exec, &dx, (outer, r + 1, inner), 1, &mut dy)).contains("do not hold"));
        assert!(msg(reduce::reduce_long_columns::<f32, Sum>(&exec, &dx, (outer, r, inner), 0, &mut dy)).contains("splits 0"));
        assert!(exec.download(&dy).unwrap().iter().all(|&v| v == 0.0), "a rejected call wrote");
    }
}
