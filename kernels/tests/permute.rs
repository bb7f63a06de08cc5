//! The tiled permuted copy (`permute::transpose_copy`) against the offsets of the view
//! computed here, for every element size, on the CPU executor (waves of 32 and 64, both
//! work-item orders) and each GPU this build can reach (a GPU that is not there is
//! reported as SKIPPED). Copies move bits: results must be exact.
use half::f16;
use kernel_dsl::host::{Executor, LaunchConfig, WaveSize};
use kernel_dsl::{Dim3, Element};
use kernels::permute::{self as perm, TransposeView};
use kernels::runtime::Device;

mod common;
use common::*;

/// Source offset of output element `i` of a row-major view (the test's own walk).
fn offset(i: usize, dims: &[usize], strides: &[usize]) -> usize {
    let (mut rem, mut off) = (i, 0);
    for (&d, &s) in dims.iter().zip(strides).rev() {
        off += (rem % d) * s;
        rem /= d;
    }
    off
}

/// Dims and source strides of the views tested: NCHW -> NHWC and back with sizes off the
/// tile, a filter `(c_out, c_in, 9)` rearranged as `(9, c_in, c_out)`, a plain transpose,
/// a transpose of a narrowed matrix (row stride past its width), views of whole tiles
/// beside edge tiles.
fn cases() -> Vec<(Vec<usize>, Vec<usize>)> {
    vec![
        (vec![2, 37, 19], vec![37 * 19, 1, 37]),
        (vec![2, 19, 70], vec![70 * 19, 1, 19]),
        (vec![9, 5, 40], vec![1, 9, 45]),
        (vec![50, 70], vec![1, 50]),
        (vec![33, 65], vec![1, 80]),
        (vec![3, 1, 40], vec![1, 99, 3]),
        // Whole tiles beside edge tiles, along both tiled dimensions, for y = 1 and y = 0.
        (vec![2, 130, 70], vec![130 * 70, 1, 130]),
        (vec![100, 3, 72], vec![1, 100, 300]),
    ]
}

fn run<T: Element + kernel_dsl::host::ScalarArg + PartialEq + std::fmt::Debug>(exec: &Device, make: fn(usize) -> T, groups: Option<(u32, u32)>) {
    for (dims, strides) in cases() {
        let n: usize = dims.iter().product();
        let span = dims.iter().zip(&strides).map(|(d, s)| (d - 1) * s).sum::<usize>() + 1;
        let src: Vec<T> = (0..span).map(make).collect();
        let t = TransposeView::new(&dims, &strides).unwrap_or_else(|| panic!("{dims:?} {strides:?} is a transpose"));
        let mut cfg = t.launch_config();
        if let Some((gy, gz)) = groups {
            // Fewer groups than tiles and batches: the kernel's loops cover the rest.
            cfg = LaunchConfig::new(Dim3 { x: cfg.grid.x, y: gy, z: gz }, cfg.block);
        }
        let ds = exec.upload(&src).unwrap();
        let mut dy = exec.alloc::<T>(n).unwrap();
        let ([d0, d1, d2], [s0, s1, s2]) = (t.dims, t.strides);
        perm::transpose_copy::launch::<T>(exec, cfg, &ds, &mut dy, d0, d1, d2, s0, s1, s2, t.y).unwrap();
        let got = exec.download(&dy).unwrap();
        for (i, g) in got.iter().enumerate() {
            assert_eq!(*g, src[offset(i, &dims, &strides)], "{dims:?} strides {strides:?} groups {groups:?} on {}: element {i}", exec.name());
        }
    }
}

#[test]
fn transpose_copy_matches_the_view_for_every_element_size() {
    for exec in executors_both_orders() {
        run::<u8>(&exec, |i| (i * 7 % 251) as u8, None);
        run::<f16>(&exec, |i| f16::from_bits((i * 31 % 0x7000) as u16), None);
        run::<u32>(&exec, |i| (i as u32).wrapping_mul(2654435761), None);
        run::<i64>(&exec, |i| -(i as i64) * 1_000_003, None);
        run::<f16>(&exec, |i| f16::from_bits(i as u16), Some((1, 1)));
        run::<u32>(&exec, |i| i as u32, Some((1, 2)));
    }
}

#[test]
fn transpose_views_are_chosen_only_where_the_kernel_applies() {
    assert_eq!(TransposeView::new(&[4, 8], &[8, 1]), None, "innermost stride 1: not a transpose");
    assert_eq!(TransposeView::new(&[4, 8], &[1, 0]), None, "a broadcast innermost");
    assert_eq!(TransposeView::new(&[4, 8, 6], &[2, 100, 8]), None, "no dimension of stride 1");
    assert_eq!(TransposeView::new(&[2, 2, 2, 2], &[1, 2, 4, 8]), None, "four dimensions");
    assert_eq!(TransposeView::new(&[8], &[3]), None, "one dimension");
    assert_eq!(TransposeView::new(&[0, 8], &[1, 4]), None, "no elements");
    assert_eq!(TransposeView::new(&[2, 1 << 31], &[1, 2]), None, "offsets past 2^32");
    let t = TransposeView::new(&[50, 70], &[1, 50]).unwrap();
    assert_eq!(t, TransposeView { dims: [1, 50, 70], strides: [0, 1, 50], y: 1 });
    let f = TransposeView::new(&[9, 5, 40], &[1, 9, 45]).unwrap();
    assert_eq!(f.y, 0);
    let c = f.launch_config();
    assert_eq!((c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y), (40u32.div_ceil(perm::TILE as u32), 1, 5, perm::TILE as u32, perm::ROWS as u32));
}

/// A view past the source, or a work-group of another shape, fails the launch and writes
/// nothing.
#[test]
fn transpose_copy_rejects_views_past_the_source_and_other_work_groups() {
    let exec = kernel_dsl::host::CpuExecutor::new(WaveSize::W64);
    let src = vec![1u32; 100];
    let mut y = vec![0u32; 120];
    let t = TransposeView::new(&[10, 12], &[1, 10]).unwrap();
    let r = perm::transpose_copy::launch::<u32>(&exec, t.launch_config(), &src, &mut y, 1, 10, 12, 0, 1, 10, 1);
    assert!(r.is_err(), "element 119 of a source of 100");
    let src = vec![1u32; 120];
    let bad = LaunchConfig::new(Dim3::x(1), Dim3::x(64));
    let r = perm::transpose_copy::launch::<u32>(&exec, bad, &src, &mut y, 1, 10, 12, 0, 1, 10, 1);
    assert!(r.is_err(), "a 64 x 1 work-group");
    let deep = LaunchConfig::new(Dim3::x(1), Dim3 { x: perm::TILE as u32, y: perm::ROWS as u32, z: 2 });
    let r = perm::transpose_copy::launch::<u32>(&exec, deep, &src, &mut y, 1, 10, 12, 0, 1, 10, 1);
    assert!(r.is_err(), "a work-group two deep");
    assert!(y.iter().all(|v| *v == 0), "nothing written");
}
