//! The dtype-generic indexing ops (index_select, gather, scatter_set, scatter_add,
//! index_add, where_cond) for every value dtype and the index dtypes u8, u32 and i64,
//! against loops written here as Candle's CPU backend runs them: ids in index order, the
//! index type's maximum meaning "no index" (zero for gathers, skipped by scatters), other
//! out-of-range ids treated the same way. Adds happen in the element type, one per
//! contribution in index order (integers wrap, f16/bf16 round after each add), so results
//! are compared bit for bit. CPU executor with waves of 32 and 64, odd shapes, empty ones.
use half::{bf16, f16};
use kernel_dsl::host::LaunchError;
use kernels::dtype::host::{DType, F8E4M3};
use kernels::indexing_any::ops::{self as ix, IdType};
use kernels::runtime::Device;
use std::fmt::Debug;

mod common;
use common::executors;

/// A value dtype for these tests: made from an i64 seed value, added like Candle does.
trait V: DType + Debug + PartialEq + Default {
    fn make(v: i64) -> Self;
    fn add(self, o: Self) -> Self;
}
macro_rules! int_v {
    ($($t:ty),*) => {$(
        impl V for $t {
            fn make(v: i64) -> Self { v as $t }
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
        }
    )*};
}
int_v!(u8, u32, i16, i32, i64);
impl V for f32 {
    fn make(v: i64) -> Self { v as f32 * 0.37 }
    fn add(self, o: Self) -> Self { self + o }
}
impl V for f64 {
    fn make(v: i64) -> Self { v as f64 * 0.37 }
    fn add(self, o: Self) -> Self { self + o }
}
impl V for f16 {
    fn make(v: i64) -> Self { f16::from_f64(v as f64 * 0.37) }
    fn add(self, o: Self) -> Self { self + o }
}
impl V for bf16 {
    fn make(v: i64) -> Self { bf16::from_f64(v as f64 * 0.37) }
    fn add(self, o: Self) -> Self { self + o }
}
impl V for F8E4M3 {
    fn make(v: i64) -> Self { F8E4M3::from_f64(v as f64 * 0.37) }
    fn add(self, o: Self) -> Self { F8E4M3::from_f64((self.to_f32() + o.to_f32()) as f64) }
}

/// An index dtype: built from a position, with Candle's marker value.
trait Id: IdType + Debug {
    fn make(v: usize) -> Self;
    fn marker() -> Self;
    fn slot(self, len: usize) -> Option<usize>;
}
impl Id for u8 {
    fn make(v: usize) -> Self { v as u8 }
    fn marker() -> Self { u8::MAX }
    fn slot(self, len: usize) -> Option<usize> { (self != u8::MAX && (self as usize) < len).then_some(self as usize) }
}
impl Id for u32 {
    fn make(v: usize) -> Self { v as u32 }
    fn marker() -> Self { u32::MAX }
    fn slot(self, len: usize) -> Option<usize> { (self != u32::MAX && (self as usize) < len).then_some(self as usize) }
}
impl Id for i64 {
    fn make(v: usize) -> Self { v as i64 }
    fn marker() -> Self { i64::MAX }
    fn slot(self, len: usize) -> Option<usize> { (self >= 0 && self != i64::MAX && (self as usize) < len).then_some(self as usize) }
}

fn vals<T: V>(n: usize, seed: i64) -> Vec<T> {
    (0..n as i64).map(|i| T::make((i * 7919 + seed * 31) % 201 - 100)).collect()
}

/// Ids in `[0, dim)` with repeats, the marker and (for wide id types) an out-of-range id.
fn ids<I: Id>(n: usize, dim: usize, seed: usize) -> Vec<I> {
    (0..n)
        .map(|i| match (i + seed) % 11 {
            3 => I::marker(),
            7 => I::make(dim + 1),
            _ => I::make((i * 5 + seed) % dim.max(1)),
        })
        .collect()
}

fn case<T: V, I: Id>(dev: &Device) {
    let what = format!("{} ids {}", T::NAME, I::NAME);
    let (left, src_dim, n, right) = (3, 5, 7, 4);
    // index_select
    let src: Vec<T> = vals(left * src_dim * right, 1);
    let id: Vec<I> = ids(n, src_dim, 2);
    let mut want = vec![T::default(); left * n * right];
    for l in 0..left {
        for i in 0..n {
            for r in 0..right {
                want[(l * n + i) * right + r] = id[i].slot(src_dim).map_or(T::make(0) , |s| src[(l * src_dim + s) * right + r]);
            }
        }
    }
    // Zero rows are all-zero bits whatever the dtype.
    for l in 0..left { for i in 0..n { if id[i].slot(src_dim).is_none() { for r in 0..right { want[(l * n + i) * right + r] = T::default(); } } } }
    let (ds, di) = (dev.upload(&src).unwrap(), dev.upload(&id).unwrap());
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    ix::index_select::<T, I>(dev, &ds, &di, &mut out, left, src_dim, right).unwrap();
    assert_eq!(dev.download(&out).unwrap(), want, "index_select {what}");
    // gather
    let gid: Vec<I> = ids(left * n * right, src_dim, 5);
    let mut want = vec![T::default(); left * n * right];
    for l in 0..left {
        for i in 0..n {
            for r in 0..right {
                let e = (l * n + i) * right + r;
                if let Some(s) = gid[e].slot(src_dim) {
                    want[e] = src[(l * src_dim + s) * right + r];
                }
            }
        }
    }
    let dg = dev.upload(&gid).unwrap();
    let mut out = dev.alloc::<T>(want.len()).unwrap();
    ix::gather::<T, I>(dev, &ds, &dg, &mut out, left, src_dim, n, right).unwrap();
    assert_eq!(dev.download(&out).unwrap(), want, "gather {what}");
    // scatter_set and scatter_add into dst (left, src_dim, right) from (left, n, right).
    let upd: Vec<T> = vals(left * n * right, 9);
    let dst0: Vec<T> = vals(left * src_dim * right, 4);
    let (mut set_want, mut add_want) = (dst0.clone(), dst0.clone());
    for l in 0..left {
        for i in 0..n {
            for r in 0..right {
                let e = (l * n + i) * right + r;
                if let Some(s) = gid[e].slot(src_dim) {
                    let o = (l * src_dim + s) * right + r;
                    set_want[o] = upd[e];
                    add_want[o] = add_want[o].add(upd[e]);
                }
            }
        }
    }
    let du = dev.upload(&upd).unwrap();
    let mut dst = dev.upload(&dst0).unwrap();
    ix::scatter_set::<T, I>(dev, &du, &dg, &mut dst, left, n, src_dim, right).unwrap();
    assert_eq!(dev.download(&dst).unwrap(), set_want, "scatter_set {what}");
    let mut dst = dev.upload(&dst0).unwrap();
    ix::scatter_add::<T, I>(dev, &du, &dg, &mut dst, left, n, src_dim, right).unwrap();
    assert_eq!(dev.download(&dst).unwrap(), add_want, "scatter_add {what}");
    // index_add: dst[l, id[i], r] += upd[l, i, r].
    let mut want = dst0.clone();
    for l in 0..left {
        for i in 0..n {
            if let Some(s) = id[i].slot(src_dim) {
                for r in 0..right {
                    let o = (l * src_dim + s) * right + r;
                    want[o] = want[o].add(upd[(l * n + i) * right + r]);
                }
            }
        }
    }
    let mut dst = dev.upload(&dst0).unwrap();
    ix::index_add::<T, I>(dev, &du, &di, &mut dst, left, src_dim, right).unwrap();
    assert_eq!(dev.download(&dst).unwrap(), want, "index_add {what}");
    // Empty shapes are no-ops.
    let mut none = dev.alloc::<T>(0).unwrap();
    ix::index_select::<T, I>(dev, &ds, &dev.alloc::<I>(0).unwrap(), &mut none, left, src_dim, right).unwrap();
}

fn where_case<T: V, C: V>(dev: &Device) {
    // cond (4, 1) broadcast over 9 columns; on_true contiguous; on_false a row broadcast.
    let cond: Vec<C> = (0..4).map(|i| C::make((i % 2) as i64 * (i as i64 + 1))).collect();
    let t: Vec<T> = vals(36, 2);
    let f: Vec<T> = vals(9, 3);
    let want: Vec<T> = (0..36).map(|i| if cond[i / 9] != C::make(0) { t[i] } else { f[i % 9] }).collect();
    let (dc, dt, df) = (dev.upload(&cond).unwrap(), dev.upload(&t).unwrap(), dev.upload(&f).unwrap());
    let mut out = dev.alloc::<T>(36).unwrap();
    ix::where_cond::<T, C>(dev, (&dc, Some((&[4, 9], &[1, 0]))), (&dt, None), (&df, Some((&[4, 9], &[0, 1]))), &mut out).unwrap();
    assert_eq!(dev.download(&out).unwrap(), want, "where_cond {} cond {}", T::NAME, C::NAME);
    // All contiguous (the typed fast path where it applies).
    let c2: Vec<C> = (0..36).map(|i| C::make((i % 3 == 0) as i64)).collect();
    let f2: Vec<T> = vals(36, 8);
    let want: Vec<T> = (0..36).map(|i| if i % 3 == 0 { t[i] } else { f2[i] }).collect();
    let mut out = dev.alloc::<T>(36).unwrap();
    ix::where_cond::<T, C>(dev, (&dev.upload(&c2).unwrap(), None), (&dt, None), (&dev.upload(&f2).unwrap(), None), &mut out).unwrap();
    assert_eq!(dev.download(&out).unwrap(), want, "where_cond contiguous {} cond {}", T::NAME, C::NAME);
}

macro_rules! all_ids {
    ($dev:expr; $($t:ty),*) => {$(
        case::<$t, u8>($dev);
        case::<$t, u32>($dev);
        case::<$t, i64>($dev);
        where_case::<$t, u8>($dev);
        where_case::<$t, u32>($dev);
        where_case::<$t, i64>($dev);
    )*};
}

#[test]
fn every_dtype_and_index_type() {
    for dev in executors() {
        all_ids!(&dev; u8, u32, i16, i32, i64, bf16, f16, f32, f64, F8E4M3);
    }
}

#[test]
fn scatter_set_last_write_wins() {
    for dev in executors() {
        // All updates of a column go to row 1: the last (in index order) stays.
        let src: Vec<i32> = (0..12).collect(); // (1, 4, 3)
        let ids = vec![1u32; 12];
        let mut dst = dev.upload(&[-1i32; 6]).unwrap(); // (1, 2, 3)
        ix::scatter_set::<i32, u32>(&dev, &dev.upload(&src).unwrap(), &dev.upload(&ids).unwrap(), &mut dst, 1, 4, 2, 3).unwrap();
        assert_eq!(dev.download(&dst).unwrap(), [-1, -1, -1, 9, 10, 11]);
    }
}

#[test]
fn bad_index_shapes_are_rejected() {
    let dev = Device::cpu(kernel_dsl::host::WaveSize::W64);
    let src = dev.upload(&[1.0f64; 12]).unwrap();
    let ids = dev.upload(&[0u8; 6]).unwrap();
    let mut out = dev.upload(&[5.0f64; 12]).unwrap();
    let bad = |r: Result<(), LaunchError>| matches!(r, Err(LaunchError::InvalidArgument { .. }));
    assert!(bad(ix::index_select::<f64, u8>(&dev, &src, &ids, &mut out, 2, 3, 2)));
    assert!(bad(ix::gather::<f64, u8>(&dev, &src, &ids, &mut out, 2, 3, 2, 2)));
    assert!(bad(ix::scatter_set::<f64, u8>(&dev, &src, &ids, &mut out, 1, 12, 12, 1)));
    assert!(bad(ix::scatter_add::<f64, u8>(&dev, &src, &ids, &mut out, 2, 3, 3, 2)));
    assert!(bad(ix::index_add::<f64, u8>(&dev, &src, &ids, &mut out, 1, 11, 2)));
    let c16 = dev.upload(&[1i16; 12]).unwrap();
    assert!(bad(ix::where_cond::<f64, i16>(&dev, (&c16, None), (&src, None), (&src, None), &mut out)));
    assert!(dev.download(&out).unwrap().iter().all(|&v| v == 5.0));
}

#[test]
fn u8_max_is_the_no_index_marker_even_when_in_range() {
    for dev in executors() {
        let src: Vec<f32> = (0..300).map(|v| v as f32 + 0.5).collect(); // (1, 300, 1)
        let ids = dev.upload(&[255u8, 254, 0]).unwrap();
        let mut out = dev.alloc::<f32>(3).unwrap();
        ix::index_select::<f32, u8>(&dev, &dev.upload(&src).unwrap(), &ids, &mut out, 1, 300, 1).unwrap();
        assert_eq!(dev.download(&out).unwrap(), [0.0, 254.5, 0.5]);
        let mut dst = dev.upload(&src).unwrap();
        ix::index_add::<f32, u8>(&dev, &dev.upload(&[1.0f32, 2.0, 4.0]).unwrap(), &ids, &mut dst, 1, 300, 1).unwrap();
        let got = dev.download(&dst).unwrap();
        assert_eq!((got[255], got[254], got[0]), (255.5, 256.5, 4.5));
    }
}
